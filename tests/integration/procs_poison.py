"""A user-written stateful processor that misbehaves on some events (integration tests).

It changes its state *before* misbehaving, so an event that is not undone shows in every
later output.
"""

from __future__ import annotations

from typing import Any

from fogshift.events import Event
from fogshift.runtime.api import Processor, state


class Poisoned(Processor):
    """Running count and total of ``value``, with ``sensor`` passed through.

    ``boom-index`` raises IndexError, ``boom-runtime`` RuntimeError; a value that is not a
    finite number (``1e999`` stays text, ``float()`` makes it infinity) makes the output
    non-finite.
    """

    count: int = state(0)
    total: float = state(0.0)

    def process(self, event: Event) -> dict[str, Any]:
        self.count += 1
        sensor = str(event.body["sensor"])
        if sensor == "boom-index":
            return {"never": [][self.count]}
        if sensor == "boom-runtime":
            raise RuntimeError(f"sensor {sensor} is cursed")
        self.total += float(event.body["value"])
        return {"count": self.count, "total": self.total, "sensor": sensor}
