"""Keeping a service's log files bounded: copied aside and emptied once they grow too large.

A service `fogshift up` starts writes its log through its standard output and error, opened
for appending, as do its children (a node's JVM and Spark's Python workers) and the broker
its own. Nothing rotated them: a failure logged every round (a pull that keeps failing, a
PE restarted with back-off, a zombie's refused writes in the broker's log) grew a node's
log until its disk was full. Each service keeps its own: a file past ``max_bytes`` is copied
to ``FILE.1`` (``FILE.1`` moved to ``FILE.2``, up to :data:`LOG_KEEP` copies) and emptied in
place. Every writer appends (``O_APPEND``), so its next line lands at the new end of the
file — no writer is told, and none leaves a hole of the old size before it (a writer at
its own offset would: such a file is left alone). Lines written while the file is copied
(well under a second) are lost; that happens only at a rotation.
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

log = logging.getLogger(__name__)

#: How large a log file grows before it is copied aside and emptied (the services'
#: ``log_max_bytes`` setting; 0: never). With :data:`LOG_KEEP` copies, a service's log takes
#: at most three times this.
LOG_MAX_BYTES = 64 * 2**20
#: How many copies of a log file are kept (``FILE.1`` the newest).
LOG_KEEP = 2
#: How often a service looks at its log files' sizes.
LOG_CHECK_INTERVAL_S = 30.0


def copy_name(path: Path, number: int) -> Path:
    """The ``number``-th newest copy of log ``path`` (``FILE.1``, ``FILE.2``, ...)."""
    return path.with_name(f"{path.name}.{number}")


def rotate(path: Path, keep: int = LOG_KEEP) -> None:
    """Copy ``path`` to its first copy (the older ones moved up, the oldest dropped) and
    empty it in place; the copies take the file's mode (a log may say what a secret is not,
    but not who may read it)."""
    for number in range(keep - 1, 0, -1):
        older = copy_name(path, number)
        if older.exists():
            os.replace(older, copy_name(path, number + 1))
    mode = stat.S_IMODE(path.stat().st_mode)
    first = copy_name(path, 1)
    # Written under a temporary name, then renamed: a crash mid-copy leaves no half copy
    # under the name of a whole one.
    partial = path.with_name(f".{path.name}.1.partial")
    with open(path, "rb") as source, open(partial, "wb") as copy:
        os.fchmod(copy.fileno(), mode)
        shutil.copyfileobj(source, copy, 2**20)
    os.replace(partial, first)
    os.truncate(path, 0)


def rotate_if_large(path: Path, max_bytes: int, keep: int = LOG_KEEP) -> bool:
    """:func:`rotate` ``path`` if it holds more than ``max_bytes`` (0: never); whether it did.
    A file that is not there is left alone."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if max_bytes <= 0 or size <= max_bytes:
        return False
    rotate(path, keep)
    return True


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
        self._thread = threading.Thread(target=self._run, name="log-keeper", daemon=True)

    def start(self) -> LogKeeper:
        if self._max_bytes > 0:
            self._thread.start()
        return self

    def check(self) -> list[Path]:
        """One look at every file: the ones rotated. A file that cannot be rotated (its
        disk full, its folder gone) is logged and tried again at the next look."""
        rotated = []
        for path in self._paths():
            try:
                if rotate_if_large(path, self._max_bytes):
                    rotated.append(path)
            except OSError as exc:
                log.warning("log %s could not be rotated: %s", path, exc)
        return rotated

    def _run(self) -> None:
        # A look at once too: a service started again after a crash loop finds its log as
        # the loop left it.
        while True:
            for path in self.check():
                log.info("log %s was over %d bytes: copied to %s", path, self._max_bytes,
                         copy_name(path, 1).name)  # fmt: skip
            if self._stop.wait(self._interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval_s + 5)
