"""``fogshift logs``: the tail of the services' log files under ``<home>/logs``, optionally
followed like ``tail -f``.

Every process ``fogshift up`` starts writes one file there: ``node-<NODE>.log`` per node
agent, ``orchestrator.log``, and for isolated nodes ``relay-<NODE>.log``. A log is named by
its node (``fog-a``), ``orchestrator``, or its file's stem for the others.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fogshift.common.logfile import copy_name
from fogshift.exceptions import NotFound
from fogshift.spec.loader import did_you_mean

#: How much of a file is read at a time when looking for its last lines from the end.
_BLOCK = 64 * 1024
#: How many bytes before a followed offset are compared to tell a rotated file.
_MARK = 256


def log_files(home: Path) -> dict[str, Path]:
    """Every log under ``home``: the orchestrator's first, then the nodes', then the rest.

    Raises:
        NotFound: ``home`` has no logs folder (no cluster was ever started there).
    """
    folder = home / "logs"
    files = sorted(folder.glob("*.log")) if folder.is_dir() else []
    if not files:
        raise NotFound(
            f"no logs under {str(folder)!r}",
            expected="the logs `fogshift up` writes in its home's logs folder",
            received=f"{str(folder)!r}, " + ("with no log" if folder.is_dir() else "not a folder"),
            hint="`fogshift up` writes them there (pass the --home it was started with)",
        )
    named: dict[str, Path] = {}
    for path in files:
        named.setdefault(path.stem.removeprefix("node-"), path)
    rank = {p: (0 if p.stem == "orchestrator" else 1 if p.stem.startswith("node-") else 2)
            for p in files}  # fmt: skip
    return dict(sorted(named.items(), key=lambda item: (rank[item[1]], item[0])))


def select_logs(home: Path, name: str | None) -> dict[str, Path]:
    """The log of ``name`` (a node, ``orchestrator``, ...), or every log if ``None``.

    Raises:
        NotFound: No logs under ``home``, or none of that name (the refusal names the
            ones that exist).
    """
    files = log_files(home)
    if name is None:
        return files
    if name not in files:
        guess = did_you_mean(name, files)
        raise NotFound(  # (a node or service that is not there: exit 1, not a bad request)
            f"no log named {name!r} under {str(home / 'logs')!r}",
            expected="one of " + ", ".join(files),
            received=repr(name),
            hint=f"did you mean {guess!r}?" if guess else "`fogshift nodes` lists the nodes",
        )
    return {name: files[name]}


def tail(path: Path, lines: int, end: int | None = None, copies: bool = True) -> list[str]:
    """The last ``lines`` lines of ``path`` (without their line ends), reading it from the end
    so that a large log costs no more than its tail; with ``copies``, those of a log just
    rotated (:mod:`fogshift.common.logfile`) go on into its newest copy.

    Args:
        end: Read the file only up to this offset (default: its end now). ``logs -f`` passes
            the offset it then follows from, so a line appended meanwhile is followed, not
            lost between the tail and the follow.
    """
    if lines <= 0:
        return []
    found = _tail(path, lines, end)
    older = copy_name(path, 1)
    if copies and len(found) < lines and older.is_file():
        return tail(older, lines - len(found), copies=False) + found
    return found


def _tail(path: Path, lines: int, end: int | None) -> list[str]:
    """:func:`tail` of one file."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        end = size if end is None else min(end, size)
        data = b""
        position = end
        # lines + 1 line ends: the text after the one before the first wanted line.
        while position > 0 and data.count(b"\n") <= lines:
            step = min(_BLOCK, position)
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
    text = data.decode("utf-8", errors="replace")
    return text.splitlines()[-lines:]


@dataclass(frozen=True)
class Position:
    """Where a follow of a log file stands: its ``offset``, and the (up to :data:`_MARK`)
    bytes ``before`` it, by which a rotation since is told (they change)."""

    offset: int
    before: bytes = b""


def positions(files: dict[str, Path]) -> dict[str, Position]:
    """Each file's end now: where a follow that starts now begins."""
    return {name: _end(path) for name, path in files.items()}


def _end(path: Path) -> Position:
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _MARK))
            return Position(size, handle.read(min(size, _MARK)))
    except FileNotFoundError:  # between a rotation's removal and its new file
        return Position(0)


def follow(
    files: dict[str, Path],
    write: Callable[[str], None],
    *,
    prefix: bool,
    interval_s: float = 0.2,
    keep_going: Callable[[], bool] = lambda: True,
    start: dict[str, Position] | None = None,
) -> None:
    """Write every line appended to ``files`` after ``start`` (default: now), as ``tail -f``
    does, while ``keep_going()`` (the CLI stops on Ctrl-C).

    A partly written last line waits for its line end. A file rotated since the last look
    (:mod:`fogshift.common.logfile`: copied to ``FILE.1``, then emptied in place; told by
    the bytes before the followed offset, which changed, or by the file shrinking) is read
    on in its copy from that offset — the lines written between the last look and the
    rotation — and then from its start; one replaced otherwise is read from its start.

    Args:
        prefix: Start each line with its log's name (when following several).
        start: Where to follow each file from (:func:`positions`, taken before its tail was
            printed).
    """
    begun = start if start is not None else positions(files)
    offsets = {name: begun[name].offset for name in files}
    seen = {name: begun[name].before for name in files}
    pending = dict.fromkeys(files, b"")

    def emit(name: str, chunk: bytes) -> None:
        *complete, pending[name] = (pending[name] + chunk).split(b"\n")
        for raw in complete:
            line = raw.decode("utf-8", errors="replace")
            write(f"{name} | {line}" if prefix else line)
        seen[name] = (seen[name] + chunk)[-_MARK:]

    while keep_going():
        for name, path in files.items():
            at = offsets[name]
            chunk = _read_after(path, at, seen[name])
            if chunk is None:  # rotated or replaced since the last look
                rest = _read_after(copy_name(path, 1), at, seen[name], search=True)
                if rest is None:
                    pending[name] = b""  # (no copy of what was followed: from the start)
                else:
                    emit(name, rest)  # (a line it ends unfinished goes on in the file)
                offsets[name], seen[name] = 0, b""
                chunk = _read_after(path, 0, b"") or b""
            offsets[name] += len(chunk)
            if chunk:
                emit(name, chunk)
        time.sleep(interval_s)


def _read_after(path: Path, at: int, before: bytes, *, search: bool = False) -> bytes | None:
    """What ``path`` holds from offset ``at`` on, if the bytes before ``at`` are ``before``
    (the ones read last); ``None`` if they are not (or the file is shorter than ``at``): it
    is not the file that was read. With ``search``, a file holding ``before`` elsewhere is
    read on after its last occurrence (a rotation's copy of an oversized log holds only its
    newest part, at other offsets). A file not there holds nothing yet (between a
    rotation's removal and its new file)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(at - len(before))
            if handle.read(len(before)) == before:
                return handle.read()
            if not search or not before:
                return None
            handle.seek(0)
            data = handle.read()
    except FileNotFoundError:
        return b"" if at == 0 else None
    found = data.rfind(before)
    return None if found < 0 else data[found + len(before) :]
