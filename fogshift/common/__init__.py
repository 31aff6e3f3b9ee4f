"""Pieces shared by the REST services and their clients."""
