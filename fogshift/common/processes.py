"""Liveness of processes and process groups (a node = one process group), via psutil.

A zombie — exited, not yet reaped by its parent — counts as gone everywhere here: it runs
nothing and holds no port.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import psutil


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def leads(pid: int, pgid: int) -> bool:
    """Whether ``pid`` runs (not a zombie) and is still in process group ``pgid``.

    What a process recorded by pid and group is judged by: a pid is given again once the
    process that had it is gone (here after 32,768 of them, a few minutes of a busy test
    suite), and the new process is, but for a coincidence, in another group.
    """
    try:
        return alive(pid) and os.getpgid(pid) == pgid
    except ProcessLookupError:  # it ended while we looked
        return False


def group_members(pgids: Iterable[int]) -> Iterator[tuple[int, psutil.Process]]:
    """Every process (zombies included) whose process group is one of ``pgids``, with its
    group, in one pass over the process table."""
    wanted = set(pgids)
    for proc in psutil.process_iter():
        try:
            pgid = os.getpgid(proc.pid)
        except OSError:  # it ended while we looked
            continue
        if pgid in wanted:
            yield pgid, proc


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie."""
    try:
        os.killpg(pgid, 0)  # cheap first answer: no member at all
    except (ProcessLookupError, PermissionError):
        return False
    for _, proc in group_members([pgid]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            return True
    return False
