"""The ``fogshift`` command line (Typer + Rich)."""
