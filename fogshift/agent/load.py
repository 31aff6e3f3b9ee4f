"""The CPU a node uses: its agent's whole process group (agent, JVM, Python workers)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in group ``pgid`` (from /proc)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        # After the command: state, ppid, pgrp, ..., utime (14th field), stime (15th).
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / _TICKS


class CpuMeter:
    """CPU use of a process group, in percent of one core, between two readings.

    Not thread-safe: one reader (the heartbeat loop) calls :meth:`percent`.
    """

    def __init__(self, pgid: int | None = None) -> None:
        self.pgid = os.getpgid(0) if pgid is None else pgid
        self._last = (time.monotonic(), group_cpu_seconds(self.pgid))

    def percent(self) -> float:
        """Percent of one core used since the previous call (or since construction).

        Processes that ended in between drop out of the sum; the result is then clamped at 0
        rather than reported negative.
        """
        now, used = time.monotonic(), group_cpu_seconds(self.pgid)
        then, before = self._last
        self._last = (now, used)
        if now <= then:
            return 0.0
        return max(0.0, round(100.0 * (used - before) / (now - then), 1))
