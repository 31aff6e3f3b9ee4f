"""A user-written stateful processor, loaded by the `custom` kind in integration tests."""

from __future__ import annotations

from fogshift.events import Event, is_finite_number
from fogshift.runtime.api import Processor, state
from fogshift.runtime.exceptions import DeadLetter


class RunningStats(Processor):
    """Count and running total of `value`, with declared state and nothing else."""

    count: int = state(0)
    total: float = state(0.0)

    def process(self, event: Event) -> dict[str, float]:
        value = event.body.get("value")
        if not is_finite_number(value):
            raise DeadLetter(f"value {value!r} is not a finite number")
        self.count += 1
        self.total += value
        return {"count": self.count, "total": self.total}
