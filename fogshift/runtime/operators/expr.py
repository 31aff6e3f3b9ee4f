"""``map`` and ``filter``: stateless PEs driven by safe expressions over the body fields.

Expressions are evaluated by ``simpleeval`` (no attribute access, no imports, no calls but
the few listed in :data:`fogshift.spec.expressions.FUNCTIONS`), with the body's fields and
``seq`` as names. Their options (:mod:`fogshift.spec.kinds`) were checked when the spec loaded.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from fogshift.events import Event
from fogshift.runtime.api import Processor
from fogshift.runtime.exceptions import DeadLetter
from fogshift.spec.expressions import evaluator
from fogshift.spec.kinds import FilterOptions, MapOptions


class Expressions:
    """Expressions parsed once and evaluated over event after event.

    Parsing and building the evaluator cost about six times what evaluating a small
    expression does, so a processor keeps one of these for its life instead of paying them
    per event. Not thread-safe (the evaluator holds the current names): one per processor.
    """

    def __init__(self, expressions: Mapping[str, str]) -> None:
        self._evaluator = evaluator()
        self._parsed: dict[str, tuple[str, ast.AST]] = {
            name: (text, self._evaluator.parse(text)) for name, text in expressions.items()
        }

    def evaluate(self, name: str, event: Event) -> Any:
        """Evaluate expression ``name`` over ``event``; any failure is a :class:`DeadLetter`."""
        text, parsed = self._parsed[name]
        self._evaluator.names = {"seq": event.seq, **event.body}
        try:
            return self._evaluator.eval(text, previously_parsed=parsed)
        except Exception as exc:  # every evaluation error is a property of this event
            raise DeadLetter(f"expression {text!r} failed: {type(exc).__name__}: {exc}") from exc


class Map(Processor):
    """Computes new fields from each event's body."""

    options_model = MapOptions

    def __init__(self, options: Mapping[str, Any], element_id: str = "") -> None:
        super().__init__(options, element_id)
        self._expressions = Expressions(self.config.set)

    def process(self, event: Event) -> dict[str, Any]:
        opts: MapOptions = self.config
        computed = {name: self._expressions.evaluate(name, event) for name in opts.set}
        return {**event.body, **computed} if opts.keep else computed


class Filter(Processor):
    """Passes the events for which ``where`` is true."""

    options_model = FilterOptions

    def __init__(self, options: Mapping[str, Any], element_id: str = "") -> None:
        super().__init__(options, element_id)
        self._expressions = Expressions({"where": self.config.where})

    def process(self, event: Event) -> dict[str, Any] | None:
        return dict(event.body) if self._expressions.evaluate("where", event) else None
