"""Checks of the command line's options that refuse as fogshift refuses (what was expected, what
was received, a hint), not in the words of the library that parses them. In ``common``
because the CLI's commands and the benchmarks' (``bench``, below the CLI) both use them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from fogshift.exceptions import InvalidInput

N = TypeVar("N", int, float)


def bounded(option: str, low: float, high: float | None = None) -> Callable[[N], N]:
    """A typer option callback refusing a value of ``option`` below ``low`` or above
    ``high`` (and a float that is not finite). Typer's own ``min``/``max`` said pydantic's
    "Invalid value for '--limit': Input should be greater than or equal to 1" in a usage
    box, with neither what was received nor a hint; a ``nan`` passed both. The option's
    help ends with :func:`in_range` (where typer showed the range)."""

    def check(value: N) -> N:
        if value is None:  # (an option left out whose default is None)
            return value
        finite = not isinstance(value, float) or math.isfinite(value)
        if not finite or not (low <= value and (high is None or value <= high)):
            shown = _number(low) if high is None else f"{_number(low)} to {_number(high)}"
            raise InvalidInput(
                f"{option} {value!r} is " + ("out of range" if finite else "not a finite number"),
                expected=f"a number of at least {shown}"
                if high is None
                else f"a number from {shown}",
                received=repr(value),
                hint=f"give {option} a number from {shown}"
                if high is not None
                else f"give {option} {shown} or more",
            )
        return value

    return check


def in_range(low: float, high: float | None = None) -> str:
    """The range :func:`bounded` takes, as an option's help ends with it (typer's own
    ``min``/``max`` showed it there)."""
    return f" [{_number(low)} to {_number(high)}]" if high is not None else f" [>= {_number(low)}]"


def _number(value: float) -> str:
    """``value`` as written: a whole one without a fraction or an exponent (1000000, not
    1e+06)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def ranged(option: str, help: str, low: float, high: float | None = None, *names: str) -> Any:
    """A typer option checked by :func:`bounded`, its help ending with its range.

    Args:
        option: The option as refusals name it (``--limit``).
        names: Its names, if not the one typer derives from the parameter's."""
    return typer.Option(
        *names, callback=bounded(option, low, high), help=help + in_range(low, high)
    )
