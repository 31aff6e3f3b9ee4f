"""Events that kill the Python worker processing them: found, then dead-lettered.

Per-event isolation (:mod:`fogshift.runtime.batch`) catches whatever ``process()`` raises,
but an event can also end the worker itself: ``os._exit()`` in user or library code, a
crash in native code (a C extension given a value it does not expect), the kernel's OOM
killer. Spark then fails the task ("Python worker exited unexpectedly (crashed)"), the
query fails, and its restart replays the same batch, which crashes again: one event would
stop the PE for good. This module finds that event and has it dead-lettered instead.

- **Marks.** While anything of one event runs in a worker (``process()``, iterating and
  encoding its outputs), the worker's *mark* (a small file named by its pid,
  memory-mapped: a few bytes written per event, no system call) names the event: its
  ``origin``, ``seq``, a CRC of its body's head and length, since when, and the worker's
  start time. Between events the mark is cleared. A replay that undoes a failed event
  (:mod:`fogshift.runtime.batch`) is marked with that event: the events replayed ran once
  already, so a worker that dies in the replay is blamed on the failure it undoes.
- **Blame.** When the PE's query fails with a crashed Python worker, the agent
  (:func:`blame`) reads the marks of the workers that are gone: a mark still set names the
  event its worker died in. Each such event is a *suspect*, counted in ``suspects.json``.
- **Condemned.** A suspect counted :data:`CRASHES_TO_CONDEMN` times (its batch retried
  after each crash) is *condemned* (``condemned.json``). Workers read that list before each
  batch, and a condemned event becomes a dead letter without ``process()`` being called:
  the PE goes on, with its state as before that event (the crashed batches were never
  committed, so their state changes were never kept).
- **Stuck in native code.** The time limit per event (:mod:`fogshift.runtime.batch`) is a
  signal, which code that never returns to the interpreter (a C extension's loop) never
  sees, and a processor that catches ``BaseException`` every time ignores. The agent
  therefore looks at the marks every second (:func:`stop_overrunning`): a worker whose mark
  is set for longer than :func:`kill_after` of the element's ``event_timeout_s`` is killed
  (SIGKILL through a pidfd, after checking its start time: never a process the pid was
  given to since, and its mark again: never a worker back from that event), which Spark
  reports as a crashed worker, and the event is blamed as above.

Why twice: a worker can die in an innocent event (the OOM killer chose it for another
process's memory; a kill from outside). Once is bad luck, the same event twice is not. A
worker Spark kills itself (a stopped query) is not blamed: only a query that failed with a
crashed worker is looked at, and every mark is dropped at each start of the query
(:func:`prepare`; a worker Spark reuses makes its mark anew at its next batch of the new
run, never one still finishing a batch of the stopped run). A gone worker's clear mark is
removed by the agent's next look.

Not covered: a crash outside one event (the state's ``snapshot()`` or ``restore()``,
Arrow's conversion, the broker writer) names no event and restarts the PE with backoff as
before; a batch whose memory grows until the OOM killer strikes condemns the event it
strikes in. The marks are on the node: with a Spark cluster master the workers run
elsewhere and mark nothing.

An event is named by ``origin:seq:crc``: an origin alone can come again after a fresh
deploy (the folder is then cleared too, :func:`reset`). Everything lives in
``<gate>.crashes/`` beside the PE's gate (:mod:`fogshift.runtime.gate`), on the node: a
move to another node starts with nothing condemned there (the event, if replayed there, is
found again the same way).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import shutil
import signal
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from fogshift.runtime.gate import current_run

__all__ = [
    "CRASHED",
    "CRASHES_TO_CONDEMN",
    "NO_WATCH",
    "Watch",
    "blame",
    "condemned_events",
    "folder_of",
    "kill_after",
    "prepare",
    "reset",
    "stop_overrunning",
    "watch_for",
]

#: What Spark's error says when a Python worker died in a task (any cause).
CRASHED = "Python worker exited unexpectedly"
#: Crashes on the same event after which it is condemned (a dead letter from then on).
CRASHES_TO_CONDEMN = 2

#: A mark: set (1) or clear (0), origin, seq, CRC-32 of the body's head and length, since
#: (monotonic clock, the same in every process of the host), the worker's start time (in
#: clock ticks since boot, as ``/proc/<pid>/stat`` gives it: a pid given again to another
#: process, or a thread's id, is not taken for the worker).
_MARK = struct.Struct("<Bqqidq")
#: A mark's flag: clear, in the event, in a replay that undoes the event's changes.
_CLEAR, _IN_EVENT, _UNDOING = 0, 1, 2
#: How much of a body its CRC covers (with the body's length): a fixed cost per event.
_CRC_HEAD = 256
_SUSPECTS = "suspects.json"
_CONDEMNED = "condemned.json"
#: Workers the agent killed for overrunning: pid -> the limit they were over.
_KILLED = "killed.json"


def kill_after(event_timeout_s: float) -> float:
    """How long a worker may stay in one event's ``process()`` before the agent kills it:
    twice the element's time limit, plus 2 s (the limit's own alarm ends any event that
    returns to the interpreter well before; this is for the ones that never do)."""
    return 2 * event_timeout_s + 2.0


_TYPE = "fogshift.condemned/1"


def folder_of(gate: str | Path) -> Path:
    """The folder of the marks and lists of the PE whose gate is ``gate``."""
    return Path(f"{gate}.crashes")


def _event_id(origin: int, seq: int, crc: int) -> str:
    return f"{origin}:{seq}:{crc}"


def _crc(body: str) -> int:
    # (A body holding a lone surrogate, which a broken input can carry, still has a CRC.)
    head = body[:_CRC_HEAD].encode("utf-8", "surrogatepass")
    return zlib.crc32(head, len(body) & 0xFFFFFFFF) - (1 << 31)


def _started(pid: int) -> int | None:
    """The start time of live process ``pid`` (clock ticks since boot); ``None`` if there is
    none, or it is a zombie not yet reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # ``pid (comm) S ...``: the fields after the last ')' (comm may hold one); the state is
    # the first of them, the start time the 20th.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


class Watch:
    """One worker's mark for one PE, and that PE's condemned events.

    Use :meth:`refresh` before a batch, :meth:`condemned` before an event, :meth:`enter`
    and :meth:`leave` around its ``process()``. A watch whose folder cannot be used (it
    does not exist: a test or a tool running a batch outside an agent) marks nothing and
    condemns nothing.
    """

    def __init__(self, folder: Path | None, gate: str = "") -> None:
        self.folder = folder
        self.gate = gate
        #: The run of the query this worker last ran a batch of (``""``: not known).
        self.run = ""
        self._map: mmap.mmap | None = None
        self._inode: int | None = None
        self._seen: int | None = None
        self._condemned: dict[str, str] = {}
        self._start = 0  # (this process's start time, read once it has a mark)
        self._open()

    def _open(self) -> None:
        """Map this process's mark file, made anew (none if the folder is not there)."""
        self._map, self._inode = None, None
        if self.folder is None or not self.folder.is_dir():
            return
        self._start = self._start or _started(os.getpid()) or 0
        try:
            fd = os.open(self.folder / str(os.getpid()), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, _MARK.size)
                self._map = mmap.mmap(fd, _MARK.size)
                self._inode = os.fstat(fd).st_ino
                # Clear, with the start time: the agent removes it once this worker is gone.
                _MARK.pack_into(self._map, 0, _CLEAR, 0, 0, 0, 0.0, self._start)
            finally:
                os.close(fd)
        except OSError:  # a full or read-only disk: no marks, the batch still runs
            self._map = None

    def _stale(self) -> bool:
        """Whether this worker's run is no longer the query's current one."""
        return bool(self.run and self.gate and current_run(self.gate) != self.run)

    def enter(self, row: tuple[Any, ...], undoing: bool = False) -> None:
        """Mark the event of input row ``row`` (``(origin, seq, timestamp, creator, body)``)
        as run now (``undoing``: the worker replays earlier events to undo its changes)."""
        if self._map is not None:
            origin, seq, crc = int(row[0]), int(row[1]), _crc(str(row[4]))
            # The fields first, the flag last: a mark read meanwhile is clear, never set
            # with the previous event's time (which could have its worker killed).
            _MARK.pack_into(self._map, 0, _CLEAR, origin, seq, crc, time.monotonic(), self._start)
            self._map[0] = _UNDOING if undoing else _IN_EVENT

    def leave(self) -> None:
        """Clear the mark: ``process()`` returned (or raised) for the marked event."""
        if self._map is not None:
            self._map[0] = _CLEAR

    def condemned(self, row: tuple[Any, ...]) -> str | None:
        """Why the event of ``row`` is a dead letter without being processed (``None``: it
        is not condemned), as of the last :meth:`refresh`."""
        if not self._condemned:
            return None
        return self._condemned.get(_event_id(int(row[0]), int(row[1]), _crc(str(row[4]))))

    def refresh(self) -> None:
        """Before a batch: map the mark file anew if it is gone or was replaced (a start of
        the query drops every mark, a fresh deploy the whole folder, and a worker Spark
        reuses outlives both), and read the PE's condemned events again if their file
        changed (once per batch: a crash always ends the batch, and its retry is the next
        one)."""
        if self.folder is None:
            return
        try:
            inode: int | None = (self.folder / str(os.getpid())).stat().st_ino
        except OSError:
            inode = None
        if inode is None or inode != self._inode:
            self._open()
            if self._map is not None and self._stale():
                # A worker still running a batch of a run stopped since (Spark kills it
                # soon): marks of the current run's start (:func:`prepare`) were dropped,
                # and one made again would blame its event for a crash of the next run.
                # (Checked once the file is made: checked before, the new token and its
                # drop of the marks could come in between.)
                (self.folder / str(os.getpid())).unlink(missing_ok=True)
                self._map, self._inode = None, None
        try:
            seen = (self.folder / _CONDEMNED).stat().st_mtime_ns
        except OSError:
            seen = None
        if seen != self._seen:
            self._seen = seen
            self._condemned = condemned_events(self.folder) if seen is not None else {}


#: A watch that marks and condemns nothing.
NO_WATCH = Watch(None)

_watches: dict[tuple[int, str], Watch] = {}


def watch_for(gate: str, run: str = "") -> Watch:
    """This worker's watch for the PE behind ``gate`` (one per process and PE, kept), in
    the query's run ``run`` (its token, :func:`~fogshift.runtime.gate.start_run`; ``""``:
    any): a worker of a run no longer the current one makes no mark anew."""
    if not gate:
        return NO_WATCH
    key = (os.getpid(), gate)  # a forked child makes its own mark
    watch = _watches.get(key)
    if watch is None:
        watch = _watches[key] = Watch(folder_of(gate), gate)
    watch.run = run
    return watch


def condemned_events(folder: Path) -> dict[str, str]:
    """The condemned events of a PE's folder: event id -> the reason its dead letter gives."""
    try:
        data = json.loads((folder / _CONDEMNED).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("type") != _TYPE:
        return {}
    events = data.get("events")
    return {str(k): str(v) for k, v in events.items()} if isinstance(events, dict) else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def _marks(folder: Path) -> list[tuple[Path, int]]:
    """The mark files in ``folder`` and their workers' pids."""
    out = []
    try:
        paths = list(folder.iterdir())
    except OSError:  # (not there: a PE whose query has not started here)
        return []
    for path in paths:
        if path.name.isdigit():
            out.append((path, int(path.name)))
    return out


def _read_mark(path: Path) -> tuple[int, str, float, int] | None:
    """``(flag, event id, since, worker start time)`` of a mark (``None``: unreadable)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < _MARK.size:
        return None
    flag, origin, seq, crc, since, start = _MARK.unpack_from(raw)
    return flag, _event_id(origin, seq, crc), since, start


def _alive(pid: int, start: int) -> bool:
    """Whether the worker that started at ``start`` as ``pid`` still runs."""
    return _started(pid) == start


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _still(path: Path, pid: int, mark: tuple[int, str, float, int]) -> bool:
    """Whether worker ``pid`` still runs and is still in the event of ``mark``, read just
    now: the mark as read first can be a moment old, and the worker may have returned
    from that event meanwhile (its next one is not to be blamed)."""
    return _alive(pid, mark[3]) and _read_mark(path) == mark


def stop_overrunning(
    folder: Path, event_timeout_s: float, now: float | None = None
) -> dict[int, str]:
    """Kill the PE's workers that have been in one event's ``process()`` for longer than
    :func:`kill_after` of ``event_timeout_s``; called by the agent every second.

    Args:
        now: The monotonic clock's time to judge by (``None``: now).

    Returns:
        The workers killed, pid -> the event id they were in.
    """
    limit = kill_after(event_timeout_s)
    now = time.monotonic() if now is None else now
    killed: dict[int, str] = {}
    for path, pid in _marks(folder):
        mark = _read_mark(path)
        if mark is not None and mark[0] == _CLEAR:
            if mark[3] and not _alive(pid, mark[3]):
                # A worker gone between events (Spark ended it): its mark would be read
                # every second for the PE's life, and names no event to blame.
                path.unlink(missing_ok=True)
            continue
        if mark is None or now - mark[2] <= limit:
            continue
        try:
            # Through a pidfd, checked once it is held: the signal reaches that worker or
            # no one (never a process given its pid since, nor a thread: no pidfd for one).
            handle = os.pidfd_open(pid)
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM) and _still(path, pid, mark):
                # No pidfds here (a kernel before 5.3, a container's filter): by its pid,
                # checked just before — skipped, the worker stuck in native code was never
                # stopped, and its event held the PE for good.
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed[pid] = mark[1]
            continue
        try:
            if _still(path, pid, mark):
                signal.pidfd_send_signal(handle, signal.SIGKILL)
                killed[pid] = mark[1]
        except OSError:  # gone meanwhile: nothing to stop
            pass
        finally:
            os.close(handle)
    if killed:
        noted = _load(folder / _KILLED)
        noted.update({str(pid): event_timeout_s for pid in killed})
        _write(folder / _KILLED, noted)
    return killed


def prepare(folder: Path) -> None:
    """Make the folder (0700) and drop every mark: called before each start of the PE's
    query, when no worker runs its events, so no mark of a worker Spark killed (or is still
    to kill) for an earlier run is blamed, or stopped, later. A worker Spark reuses makes
    its mark anew at its next batch (:meth:`Watch.refresh`)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path, _ in _marks(folder):
        path.unlink(missing_ok=True)
    (folder / _KILLED).unlink(missing_ok=True)


def reset(folder: Path) -> None:
    """Forget everything of the PE (a fresh deploy: origins start again at 0)."""
    shutil.rmtree(folder, ignore_errors=True)


def blame(folder: Path, error: str, pe: str) -> dict[str, int]:
    """After the PE's query failed with ``error``: count the events its crashed workers died in.

    Only an error saying a Python worker crashed (:data:`CRASHED`) is looked at (``pe``, the
    element's id, is named in the dead letters' reason). Each mark
    still set by a worker that is gone names a suspect; its count goes up by one, and one
    at :data:`CRASHES_TO_CONDEMN` is condemned. The gone workers' marks are removed.

    Returns:
        The suspects of this failure, event id (``origin:seq:crc``) -> its count now.
    """
    if CRASHED not in error or not folder.is_dir():
        return {}
    killed = _load(folder / _KILLED)
    # event id -> (the limit it overran, None: it crashed; whether in a replay undoing it)
    found: dict[str, tuple[float | None, bool]] = {}
    for path, pid in _marks(folder):
        mark = _read_mark(path)
        if mark is not None and _alive(pid, mark[3]):
            continue
        path.unlink(missing_ok=True)
        if mark is not None and mark[0] != _CLEAR:
            over = killed.get(str(pid))
            found[mark[1]] = (float(over) if over is not None else None, mark[0] == _UNDOING)
    if killed:
        (folder / _KILLED).unlink(missing_ok=True)
    if not found:
        return {}
    counts = _load(folder / _SUSPECTS)
    now = {}
    for event in found:
        now[event] = counts[event] = int(counts.get(event, 0)) + 1
    _write(folder / _SUSPECTS, counts)
    guilty = {e: n for e, n in now.items() if n >= CRASHES_TO_CONDEMN}
    if guilty:
        events = condemned_events(folder)
        for event, n in guilty.items():
            over, undoing = found[event]
            where = (
                "died undoing this event's changes (replaying the events before it)"
                if undoing
                else "died in this event"
            )
            how = (
                "os._exit(), a crash in native code, or the OOM killer"
                if over is None
                else f"killed by its node after {kill_after(over):g} s in process(), its "
                f"event_timeout_s being {over:g} s: it never returned to Python (native "
                "code), or caught the time limit's alarm"
            )
            events[event] = (
                f"the Python worker running processor {pe!r} crashed {n} times on this event, "
                f"its batch retried in between; the last time it {where} ({how})"
            )
        _write(folder / _CONDEMNED, {"type": _TYPE, "events": events})
    return now
