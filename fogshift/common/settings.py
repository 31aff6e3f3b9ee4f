"""Checks of the services' settings read from the environment (``FOGSHIFT_*``).

A service validates its settings when it starts (:mod:`pydantic_settings`); this lets the CLI
refuse a bad variable before ``fogshift up`` starts anything, instead of leaving a service that
died at start-up to a health timeout.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource

from fogshift.common.validation import expected_of, message_of
from fogshift.exceptions import InvalidInput

#: The longest period or timeout a service takes (a day): a wait on ``1e300`` seconds
#: overflowed, and the loop that waited (the reconciler's) ended for good.
MAX_SECONDS = 86_400.0
#: A service's period or timeout in seconds: positive, finite, at most :data:`MAX_SECONDS`.
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


def check_environment(settings: type[BaseSettings]) -> None:
    """Validate each of ``settings``' fields that the environment sets, alone.

    Raises:
        InvalidInput: A variable the field refuses, named with pydantic's reason.
    """
    prefix = str(settings.model_config.get("env_prefix", ""))
    for name, value in EnvSettingsSource(settings)().items():
        variable = (prefix + name).upper()
        check_value(settings, name, value, f"environment variable {variable}", f"unset {variable}")


def check_value(
    settings: type[BaseSettings], name: str, value: Any, given_as: str, other_way: str
) -> None:
    """Validate ``value`` for ``settings``' field ``name`` alone.

    Args:
        given_as: Where the value came from, for the message (``option --trigger-ms``).
        other_way: The hint's way out besides fixing it (``leave it out``).

    Raises:
        InvalidInput: The field refuses ``value``, with pydantic's reason.
    """
    field = settings.model_fields[name]
    constrained: Any = (
        Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    )
    try:
        TypeAdapter(constrained).validate_python(value)
    except ValidationError as exc:
        raise InvalidInput(
            f"{given_as} is not a valid {name}",
            # (pydantic's "Input should be greater than or equal to 0" was the expected.)
            expected="; ".join(
                expected_of(e) or message_of(e).removeprefix("should be ") for e in exc.errors()
            ),
            received=repr(value),
            hint=f"fix it or {other_way}",
        ) from None
