"""Spec errors."""

from __future__ import annotations

from fogshift.exceptions import InvalidInput, NotFound


class InvalidSpec(InvalidInput):
    """A pipeline spec that cannot be deployed as written."""

    code = "invalid_spec"


class ExampleNotFound(NotFound):
    """An example spec or data file that is neither in the checkout nor installed."""

    code = "example_not_found"
