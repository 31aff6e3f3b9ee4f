"""Checkpoints: reading, copying and shipping Spark checkpoint directories."""
