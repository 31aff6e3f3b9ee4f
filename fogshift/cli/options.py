"""Checks of the commands' options that refuse as fogshift refuses (what was expected, what
was received, a hint), not in the words of the library that parses them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from fogshift.exceptions import InvalidInput

N = TypeVar("N", int, float)


def bounded(option: str, low: float, high: float | None = None) -> Callable[[N], N]:
    """A typer option callback refusing a value of ``option`` below ``low`` or above
    ``high`` (and a float that is not finite). Typer's own ``min``/``max`` said pydantic's
    "Invalid value for '--limit': Input should be greater than or equal to 1" in a usage
    box, with neither what was received nor a hint; a ``nan`` passed both."""

    def check(value: N) -> N:
        if value is None:  # (an option left out whose default is None)
            return value
        if (isinstance(value, float) and not math.isfinite(value)) or not (
            low <= value and (high is None or value <= high)
        ):
            shown = f"{low:g}" if high is None else f"{low:g} to {high:g}"
            raise InvalidInput(
                f"{option} {value!r} is out of range",
                expected=f"a number of at least {low:g}"
                if high is None
                else f"a number from {shown}",
                received=repr(value),
                hint=f"give {option} a number from {shown}"
                if high is not None
                else f"give {option} {low:g} or more",
            )
        return value

    return check
