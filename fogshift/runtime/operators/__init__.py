"""Built-in PE kinds."""
