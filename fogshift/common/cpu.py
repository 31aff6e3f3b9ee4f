"""CPU time of whole process groups, read from ``/proc`` (a node = one process group)."""

from __future__ import annotations

import os
from collections.abc import Iterable

#: Clock ticks per second of ``/proc/<pid>/stat`` times.
TICKS = os.sysconf("SC_CLK_TCK")


def group_ticks(pgids: Iterable[int]) -> dict[int, int]:
    """CPU ticks (user + system, with reaped children) of every live process, per group.

    One scan of ``/proc`` serves all the groups asked for; a group with no live process
    counts 0.
    """
    ticks = dict.fromkeys(pgids, 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended while we looked
            continue
        # After the command: state, ppid, pgrp, ...; utime, stime, cutime, cstime are 11-14.
        pgid = int(fields[2])
        if pgid in ticks:
            ticks[pgid] += sum(int(f) for f in fields[11:15])
    return ticks
