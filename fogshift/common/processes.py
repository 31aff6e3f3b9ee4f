"""Liveness of processes and process groups (a node = one process group), via psutil.

A zombie — exited, not yet reaped by its parent — counts as gone everywhere here: it runs
nothing and holds no port.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in clock ticks since the machine booted (the kernel's
    ``starttime``, ``/proc/<pid>/stat``), or ``None`` if it is gone.

    Ticks since boot, not a time of day: psutil's ``create_time`` adds the boot time, which
    it reads again each call and which moves when the wall clock is stepped (NTP, a resumed
    VM), so every process would have looked like another after a step.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The fields after the command's name (in parentheses, and which may hold anything);
    # starttime is the stat file's 22nd field, the 20th after the name.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return float(fields[19])
    except (IndexError, ValueError):
        return None


def leads(pid: int, pgid: int, started: float | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie), is still in process group ``pgid`` and, if
    ``started`` is given, is the process that started then.

    What a process recorded by pid and group is judged by: a pid is given again once the
    process that had it is gone (here after 32,768 of them, a few minutes of a busy test
    suite), and the new process is, but for a coincidence, in another group — unless it
    leads a session of its own, as every service ``fogshift up`` starts does: then only
    its start time tells it from the one recorded.
    """
    return _in_group(pid, pgid) and (started is None or started_at(pid) == started)


def foreign(pid: int, pgid: int, started: float | None) -> bool:
    """Whether process group ``pgid`` (once led by ``pid``, started at ``started``) is
    another's now: ``pid`` was given again, to a process that leads that group.

    A group's number is not given again while the group has a member, so if ``pid`` is gone
    (or in another group) whatever is left of group ``pgid`` is what the recorded process
    left; if ``pid`` leads ``pgid`` but started at another time, the group is the new one's.
    """
    if started is None or not _in_group(pid, pgid):
        return False
    return started_at(pid) not in (None, started)


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, SIGTSTP, a debugger): it keeps its sockets, so
    the kernel still takes connections to it, which nobody answers until it is continued."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


class StoppedWatch:
    """Why a service's process is to be taken as not answering: stopped for ``for_s`` in a
    row (a :class:`~fogshift.common.http.ServiceClient`'s ``silent``); ``None`` otherwise.

    A request to a stopped service waits its client's whole timeout (two minutes for the
    CLI's reads, 15 or 30 for its operations); one stopped only for a moment (a debugger's
    step) is waited for. A client asks every half second while a request waits: after a
    longer pause between two asks (between two requests) the process may have been continued
    meanwhile, so its stop is counted from then.
    """

    def __init__(self, pid: int, pgid: int, started: float | None, for_s: float = 2.0) -> None:
        self.pid, self.pgid, self.started, self.for_s = pid, pgid, started, for_s
        self._since: float | None = None
        self._asked: float | None = None

    def __call__(self) -> str | None:
        now = time.monotonic()
        if self._asked is None or now - self._asked > self.for_s + 1:
            self._since = None  # (unwatched meanwhile: it may have run)
        self._asked = now
        if not (stopped(self.pid) and leads(self.pid, self.pgid, self.started)):
            self._since = None
            return None
        if self._since is None:
            self._since = now
        if now - self._since < self.for_s:
            return None
        return (
            f"its process (pid {self.pid}) is stopped (SIGSTOP or a debugger; "
            f"`kill -CONT -- -{self.pgid}` continues its group)"
        )


def _in_group(pid: int, pgid: int) -> bool:
    """Whether ``pid`` runs (not a zombie) in process group ``pgid``."""
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
