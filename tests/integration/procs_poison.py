"""A user-written stateful processor that misbehaves on some events (integration tests).

It changes its state *before* misbehaving, so an event that is not undone shows in every
later output.
"""

from __future__ import annotations

import time
from typing import Any

from fogshift.events import Event
from fogshift.runtime.api import Processor, state


class Poisoned(Processor):
    """Running count and total of ``value``, with ``sensor`` passed through.

    ``boom-index`` raises IndexError, ``boom-runtime`` RuntimeError; ``hang-loop`` never
    returns (a loop), ``hang-sleep`` not for an hour; a value that is not a finite number
    (``1e999`` stays text, ``float()`` makes it infinity) makes the output non-finite.
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
        if sensor == "hang-loop":
            while True:
                pass
        if sensor == "hang-sleep":
            time.sleep(3600)
        self.total += float(event.body["value"])
        return {"count": self.count, "total": self.total, "sensor": sensor}
