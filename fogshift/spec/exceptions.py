"""Spec errors."""

from __future__ import annotations

from fogshift.exceptions import InvalidInput


class InvalidSpec(InvalidInput):
    """A pipeline spec that cannot be deployed as written."""

    code = "invalid_spec"
