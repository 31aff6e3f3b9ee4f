"""Consistency checks: pipeline output against an independently computed reference."""
