"""``window-aggregate``: an aggregate over the last N valid values of one field."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

from fogshift.events import Event, is_finite_number
from fogshift.runtime.api import Processor, state
from fogshift.runtime.exceptions import DeadLetter
from fogshift.spec.kinds import AggregateName, WindowAggregateOptions


def _average(values: Sequence[float]) -> float:
    """The mean, exactly rounded; of values whose sum is beyond a float's range (two of
    1e308) too, where the sum overflows and the mean does not."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


AGGREGATES: dict[AggregateName, Callable[[Sequence[float]], float | int]] = {
    "avg": _average,
    "sum": math.fsum,
    "min": min,
    "max": max,
    "count": len,
}


class WindowAggregate(Processor):
    """Emits, for every valid input event, ``{field: aggregate of the last window values}``.

    An event whose field is missing or not a finite number raises :class:`DeadLetter` before
    touching the window. Until ``window`` values have been seen the aggregate covers all.
    Keyed (``key_by``), it keeps one window per key and its outputs carry the key field too.
    """

    options_model = WindowAggregateOptions
    dead_letters_change_nothing = True  # process() checks the value before the window
    values: list[float] = state(default_factory=list)

    def process(self, event: Event) -> dict[str, object]:
        opts: WindowAggregateOptions = self.config
        if opts.field not in event.body:
            raise DeadLetter(f"field {opts.field!r} is missing (fields: {sorted(event.body)})")
        value = event.body[opts.field]
        if not is_finite_number(value):
            raise DeadLetter(f"field {opts.field!r} is {value!r}, not a finite number")
        if isinstance(value, int) and abs(value) > sys.float_info.max:
            # (No aggregate of it is a number JSON readers and Spark agree on: sum and avg
            # overflowed, min and max emitted 300-digit integers.)
            raise DeadLetter(
                f"field {opts.field!r} is an integer of {len(str(abs(value)))} digits, beyond "
                "a float's range"
            )
        self.values.append(value)
        if len(self.values) > opts.window:
            del self.values[: len(self.values) - opts.window]
        aggregate = AGGREGATES[opts.function](self.values)
        if self.key_by is not None:
            return {self.key_by: event.body.get(self.key_by), opts.field: aggregate}
        return {opts.field: aggregate}
