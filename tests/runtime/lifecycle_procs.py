"""Processors that log their construction and lifecycle hooks, for tests in real Spark queries.

Imported by the Python workers through the ``custom`` kind's ``path`` option. Each line of the
log file named by the ``log`` option is ``<what> <pid>``: the process tells the driver's probe
build (``check_processor``) from the workers' builds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from fogshift.events import Event
from fogshift.runtime.api import Processor, state


class _Logging(Processor):
    """Appends a line per construction and hook to ``options["log"]``."""

    def __init__(self, options: dict[str, Any], element_id: str = "") -> None:
        super().__init__(options, element_id)
        self._note("build")

    def _note(self, what: str) -> None:
        with open(self.options["log"], "a") as log:
            log.write(f"{what} {os.getpid()}\n")

    def on_assign(self) -> None:
        self._note("assign")

    def on_pause(self) -> None:
        self._note("pause")

    def on_resume(self) -> None:
        self._note("resume")

    def on_revoke(self) -> None:
        self._note("revoke")

    def close(self) -> None:
        self._note("close")


class CountingStats(_Logging):
    """Count and running total of ``value``; an event with ``bad`` fails after changing the
    state (so per-event isolation must undo it); an event with ``crash`` ends its Python
    worker (``os._exit``: ``sys.exit()`` is one event's failure, a dead letter) the first
    time it is seen (a marker beside the log), so Spark retries the task."""

    count: int = state(0)
    total: float = state(0.0)

    def process(self, event: Event) -> dict[str, float]:
        self.count += 1
        self.total += event.body["value"]
        if event.body.get("bad"):
            raise ValueError("bad event, after changing the state")
        if event.body.get("crash"):
            marker = Path(f"{self.options['log']}.crashed")
            if not marker.exists():
                marker.write_text("once")
                os._exit(3)
        return {"count": self.count, "total": self.total}


class Holding(_Logging):
    """Stateless: doubles ``value``; an event with ``hold`` notes ``held`` and keeps its
    batch running until the file ``<log>.release`` exists (at most a minute)."""

    def process(self, event: Event) -> dict[str, float]:
        if event.body.get("hold"):
            self._note("held")
            release = Path(f"{self.options['log']}.release")
            for _ in range(600):
                if release.exists():
                    break
                time.sleep(0.1)
        return {"value": 2 * event.body["value"]}


class Doubling(_Logging):
    """Stateless: doubles ``value``."""

    def process(self, event: Event) -> dict[str, float]:
        return {"value": 2 * event.body["value"]}


class Ballasted(CountingStats):
    """:class:`CountingStats` with ``ballast``: a large text set by the first event and
    changed only by an event with ``grow`` (the shape of a PE with a big, rarely changed
    state field, such as a model)."""

    ballast: str = state("")

    def process(self, event: Event) -> dict[str, float]:
        if not self.ballast:
            self.ballast = "b" * int(self.options.get("ballast_bytes", 1_000_000))
        if event.body.get("grow"):
            self.ballast += "g"
        return super().process(event)


class CountingLater(CountingStats):
    """:class:`CountingStats` as a later version of it: ``last`` (the key's previous
    ``value``) added since, declared so (a state stored before lacks it)."""

    last: float | None = state(None, added=True)

    def process(self, event: Event) -> dict[str, float]:
        out: dict[str, Any] = {**super().process(event), "before": self.last}
        self.last = event.body["value"]
        return out
