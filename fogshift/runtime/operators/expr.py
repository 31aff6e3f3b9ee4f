"""``map`` and ``filter``: stateless PEs driven by safe expressions over the body fields.

Expressions are evaluated by ``simpleeval`` (no attribute access, no imports, no calls but
the few listed in :data:`fogshift.spec.expressions.FUNCTIONS`), with the body's fields and
``seq`` as names. Their options (:mod:`fogshift.spec.kinds`) were checked when the spec loaded.
"""

from __future__ import annotations

from typing import Any

from simpleeval import EvalWithCompoundTypes

from fogshift.events import Event
from fogshift.runtime.api import Processor
from fogshift.runtime.exceptions import DeadLetter
from fogshift.spec.expressions import FUNCTIONS
from fogshift.spec.kinds import FilterOptions, MapOptions


def evaluate(expression: str, event: Event) -> Any:
    """Evaluate ``expression`` over ``event``; any failure is a :class:`DeadLetter`."""
    names = {"seq": event.seq, **event.body}
    try:
        return EvalWithCompoundTypes(functions=FUNCTIONS, names=names).eval(expression)
    except Exception as exc:  # every evaluation error is a property of this event
        raise DeadLetter(f"expression {expression!r} failed: {type(exc).__name__}: {exc}") from exc


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
