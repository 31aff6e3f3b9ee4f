"""``map`` and ``filter``: stateless PEs driven by safe expressions over the body fields.

Expressions are evaluated by ``simpleeval`` (no attribute access, no imports, no calls but
the few listed in :data:`FUNCTIONS`), with the body's fields and ``seq`` as names.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from simpleeval import EvalWithCompoundTypes, InvalidExpression

from fogshift.events import Event
from fogshift.runtime.api import Processor
from fogshift.runtime.exceptions import DeadLetter

FUNCTIONS: dict[str, Any] = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "int": int,
    "float": float,
    "str": str,
    "len": len,
    "sqrt": math.sqrt,
    "isfinite": lambda v: isinstance(v, (int, float)) and math.isfinite(v),
}


def _check(expression: str) -> str:
    try:
        EvalWithCompoundTypes(functions=FUNCTIONS).parse(expression)
    except (SyntaxError, InvalidExpression) as exc:
        raise ValueError(f"{expression!r} is not a valid expression: {exc}") from exc
    return expression


def evaluate(expression: str, event: Event) -> Any:
    """Evaluate ``expression`` over ``event``; any failure is a :class:`DeadLetter`."""
    names = {"seq": event.seq, **event.body}
    try:
        return EvalWithCompoundTypes(functions=FUNCTIONS, names=names).eval(expression)
    except Exception as exc:  # every evaluation error is a property of this event
        raise DeadLetter(f"expression {expression!r} failed: {type(exc).__name__}: {exc}") from exc


class MapOptions(BaseModel):
    """Options of ``map``.

    Attributes:
        set: Field name → expression; the results are written into the body.
        keep: Keep the input's other fields (default) or emit only the ``set`` fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    set: dict[str, str] = Field(min_length=1)
    keep: bool = True

    @field_validator("set")
    @classmethod
    def _valid(cls, value: dict[str, str]) -> dict[str, str]:
        for expression in value.values():
            _check(expression)
        return value


class FilterOptions(BaseModel):
    """Options of ``filter``.

    Attributes:
        where: An expression; events for which it is true pass unchanged.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    where: str = Field(min_length=1)

    @field_validator("where")
    @classmethod
    def _valid(cls, value: str) -> str:
        return _check(value)


class Map(Processor):
    """Computes new fields from each event's body."""

    options_model = MapOptions

    def process(self, event: Event) -> dict[str, Any]:
        opts: MapOptions = self.config
        computed = {name: evaluate(expr, event) for name, expr in opts.set.items()}
        return {**event.body, **computed} if opts.keep else computed


class Filter(Processor):
    """Passes the events for which ``where`` is true."""

    options_model = FilterOptions

    def process(self, event: Event) -> dict[str, Any] | None:
        opts: FilterOptions = self.config
        return dict(event.body) if evaluate(opts.where, event) else None
