"""fogshift: stateful stream pipelines across fog nodes on PySpark + NATS JetStream."""

__version__ = "0.1.0"
