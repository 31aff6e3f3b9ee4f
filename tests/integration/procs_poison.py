"""A user-written stateful processor that misbehaves on some events (integration tests).

It changes its state *before* misbehaving, so an event that is not undone shows in every
later output.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import time
from pathlib import Path
from typing import Any

from fogshift.events import Event
from fogshift.runtime.api import Processor, state


class Poisoned(Processor):
    """Running count and total of ``value``, with ``sensor`` passed through.

    ``boom-index`` raises IndexError, ``boom-runtime`` RuntimeError; ``hang-loop`` never
    returns (a loop), ``hang-sleep`` not for an hour; ``crash-segv`` kills its Python worker
    (a segmentation fault, as a C extension's bug would), ``hang-stubborn`` never returns and
    swallows the time limit's alarm every time; a value that is not a finite number
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
        if sensor == "hang-stubborn":
            while True:
                with contextlib.suppress(BaseException):  # the time limit's alarm too
                    time.sleep(3600)
        if sensor == "crash-segv":
            faulthandler.disable()  # (its dump would only fill the node's log)
            ctypes.string_at(0)
        self.total += float(event.body["value"])
        return {"count": self.count, "total": self.total, "sensor": sensor}


class StallsOnce(Processor):
    """Running count of its events; its ``snapshot()`` (once per batch, after the batch's
    events: outside any one event, so outside the event time limit) blocks for an hour the
    first time it finds the file its option ``stall`` names, which it removes first: a batch
    held up outside any event, as a worker that never answers holds one."""

    count: int = state(0)

    def process(self, event: Event) -> dict[str, Any]:
        self.count += 1
        return {"count": self.count, "value": event.body["value"]}

    def snapshot(self) -> dict[str, Any]:
        flag = Path(str(self.options["stall"]))
        with contextlib.suppress(FileNotFoundError):
            flag.unlink()
            time.sleep(3600)
        return {"count": self.count}
