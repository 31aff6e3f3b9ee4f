"""CPU time of whole process groups (a node = one process group), via psutil."""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil

from fogshift.common.processes import group_members

#: Clock ticks per second: the unit of :func:`group_ticks`.
TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgids: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system, with reaped children) of every live process, per group.

    One pass over the process table serves all the groups asked for; a group with no live
    process counts 0. Processes that ended since drop out of the sum, so a group's total can
    go down between two calls.
    """
    seconds = dict.fromkeys(pgids, 0.0)
    for pgid, proc in group_members(seconds):
        try:
            times = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended while we looked
            continue
        seconds[pgid] += times.user + times.system + times.children_user + times.children_system
    return seconds


def group_ticks(pgids: Iterable[int]) -> dict[int, int]:
    """:func:`group_cpu_seconds` in clock ticks (``TICKS`` per second)."""
    return {pgid: round(s * TICKS) for pgid, s in group_cpu_seconds(pgids).items()}
