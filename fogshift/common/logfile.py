"""Keeping a service's log files bounded: copied aside and emptied once they grow too large.

A service `fogshift up` starts writes its log through its standard output and error, opened
for appending, as do its children (a node's JVM and Spark's Python workers) and the broker
its own. Nothing rotated them: a failure logged every round (a pull that keeps failing, a
PE restarted with back-off, a zombie's refused writes in the broker's log) grew a node's
log until its disk was full. Each service keeps its own: a file past ``max_bytes`` is copied
to ``FILE.1`` (``FILE.1`` moved to ``FILE.2``, up to :data:`LOG_KEEP` copies) and emptied in
place. Every writer appends (``O_APPEND``), so its next line lands at the new end of the
file — no writer is told, and none leaves a hole of the old size before it (a writer at
its own offset would: such a file is left alone). A file more than twice the limit when
first seen (an upgrade's) has only its newest ``max_bytes`` copied.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

#: How large a log file grows before it is copied aside and emptied (the services'
#: ``log_max_bytes`` setting; 0: never). With :data:`LOG_KEEP` copies, a service's log takes
#: about three times this (what it logs in a check's interval more).
LOG_MAX_BYTES = 64 * 2**20
#: How many copies of a log file are kept (``FILE.1`` the newest).
LOG_KEEP = 2
#: How often a service looks at its log files' sizes.
LOG_CHECK_INTERVAL_S = 30.0
#: Free space a copy leaves on its disk at least.
DISK_MARGIN_BYTES = 16 * 2**20
#: How many times a copy reads on what was appended while it read (each round shorter).
CATCH_UP_ROUNDS = 4


def copy_name(path: Path, number: int) -> Path:
    """The ``number``-th newest copy of log ``path`` (``FILE.1``, ``FILE.2``, ...)."""
    return path.with_name(f"{path.name}.{number}")


def rotate(path: Path, keep: int = LOG_KEEP, max_bytes: int = 0) -> bool:
    """Copy ``path`` — only its newest ``max_bytes`` from a line's start if it holds more
    than twice that (0: all of it) — to its first copy (the older ones moved up, the oldest
    dropped) and empty it in place; whether the copy was made.

    Lines appended while it is copied are copied after it, before the file is emptied: a
    line can be lost only in the moment between the last read and the emptying (a copy of
    64 MiB takes seconds on an SD card). Copies take the file's mode. A copy the disk has
    no room for is not made, and the file is emptied all the same: a log filling its disk
    is what this is for (the caller says so in the new log).
    """
    size = path.stat().st_size
    # (A file checked at every interval is a little past the limit: copied whole.)
    begin = _line_start(path, size - max_bytes) if 0 < 2 * max_bytes < size else 0
    if shutil.disk_usage(path.parent).free < size - begin + DISK_MARGIN_BYTES:
        os.truncate(path, 0)
        return False
    # Written under a temporary name first: a crash or a failure mid-copy (its disk full)
    # leaves no half copy, and the copies as they were.
    partial = path.with_name(f".{path.name}.1.partial")
    try:
        with open(path, "rb") as source, open(partial, "wb") as copy:
            os.fchmod(copy.fileno(), stat.S_IMODE(os.fstat(source.fileno()).st_mode))
            source.seek(begin)
            for _ in range(CATCH_UP_ROUNDS):
                if not _copy_to_end(source, copy):
                    break
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    for number in range(keep - 1, 0, -1):
        older = copy_name(path, number)
        if older.exists():
            os.replace(older, copy_name(path, number + 1))
    os.replace(partial, copy_name(path, 1))
    os.truncate(path, 0)
    return True


def _copy_to_end(source: BinaryIO, copy: BinaryIO) -> int:
    """Copy ``source`` from where it is read to its end now; the bytes copied."""
    copied = 0
    while chunk := source.read(2**20):
        copy.write(chunk)
        copied += len(chunk)
    return copied


def _line_start(path: Path, at: int) -> int:
    """The offset of the first line that starts at or after ``at`` in ``path`` (``at`` if
    none does within 64 KiB: a line that long is cut)."""
    with open(path, "rb") as handle:
        handle.seek(max(0, at - 1))
        head = handle.read(2**16)
    found = head.find(b"\n")
    return at if found < 0 else max(0, at - 1) + found + 1


def rotate_if_large(path: Path, max_bytes: int, keep: int = LOG_KEEP) -> bool | None:
    """:func:`rotate` ``path`` if it holds more than ``max_bytes`` (0: never): ``None`` if not,
    else whether its copy was made. A file that is not there is left alone."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if max_bytes <= 0 or size <= max_bytes:
        return None
    return rotate(path, keep, max_bytes)


def output_file(fd: int = 1) -> Path | None:
    """The regular file this process's ``fd`` (standard output) appends to, or ``None``: a
    terminal, a pipe, a file written at an offset of its own (emptying it would leave a
    hole), or one not found under its name (deleted, renamed)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
            return None
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        found = path.stat()
    except OSError:
        return None
    if (found.st_dev, found.st_ino) != (info.st_dev, info.st_ino):
        return None
    return path


class LogKeeper:
    """A daemon thread that keeps log files under ``max_bytes`` (:func:`rotate_if_large`),
    looking at its start and every ``interval_s``.

    Args:
        paths: The files (a callable: looked up at each check, a file may appear later).
        max_bytes: The size past which a file is rotated; 0 starts no thread.
        interval_s: Seconds between checks.
    """

    def __init__(
        self,
        paths: Callable[[], Iterable[Path]],
        max_bytes: int,
        interval_s: float = LOG_CHECK_INTERVAL_S,
    ) -> None:
        self._paths = paths
        self._max_bytes = max_bytes
        self._interval_s = interval_s
        self._stop = threading.Event()
        # One look at a time: two at once would both copy a file to the same partial copy
        # and one of them fail (a caller's own look beside the thread's).
        self._checking = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="log-keeper", daemon=True)

    def start(self) -> LogKeeper:
        if self._max_bytes > 0:
            self._thread.start()
        return self

    def check(self) -> list[Path]:
        """One look at every file: the ones rotated, each told in the log it starts anew.
        A file that cannot be rotated (its folder gone) is logged and tried again at the
        next look; nothing ends the thread. Looks from two threads take turns."""
        with self._checking:
            return self._check()

    def _check(self) -> list[Path]:
        rotated = []
        for path in self._paths():
            try:
                copied = rotate_if_large(path, self._max_bytes)
            except Exception as exc:  # (the keeper's thread must outlive any one failure)
                log.warning("log %s could not be rotated: %r", path, exc)
                continue
            if copied is None:
                continue
            rotated.append(path)
            if copied:
                log.info("log %s was over %d bytes: copied to %s", path, self._max_bytes,
                         copy_name(path, 1).name)  # fmt: skip
            else:
                log.warning("log %s was over %d bytes and its disk has no room for a copy: "
                            "emptied without one", path, self._max_bytes)  # fmt: skip
        return rotated

    def _run(self) -> None:
        # A look at once too: a service started again after a crash loop finds its log as
        # the loop left it.
        while True:
            self.check()
            if self._stop.wait(self._interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval_s + 5)


def keep_logs(max_bytes: int, *more: Path) -> LogKeeper:
    """Keep this service's log — its standard output, when that appends to a file (as `up`
    starts every service) — and ``more`` under ``max_bytes``, from a daemon thread."""
    own = output_file()
    kept = [*([own] if own is not None else []), *more]
    return LogKeeper(lambda: kept, max_bytes).start()
