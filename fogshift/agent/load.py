"""The CPU a node uses: its agent's whole process group (agent, JVM, Python workers)."""

from __future__ import annotations

import os
import time

from fogshift.common.cpu import group_cpu_seconds


class CpuMeter:
    """CPU use of a process group, in percent of one core, between two readings.

    Not thread-safe: one reader (the heartbeat loop) calls :meth:`percent`.
    """

    def __init__(self, pgid: int | None = None) -> None:
        self.pgid = os.getpgid(0) if pgid is None else pgid
        self._last = (time.monotonic(), self._seconds())

    def _seconds(self) -> float:
        return group_cpu_seconds([self.pgid])[self.pgid]

    def percent(self) -> float:
        """Percent of one core used since the previous call (or since construction).

        Processes that ended in between drop out of the sum; the result is then clamped at 0
        rather than reported negative.
        """
        now, used = time.monotonic(), self._seconds()
        then, before = self._last
        self._last = (now, used)
        if now <= then:
            return 0.0
        return max(0.0, round(100.0 * (used - before) / (now - then), 1))
