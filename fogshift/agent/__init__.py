"""The node agent: one REST service per fog node, owning the node's SparkSession."""
