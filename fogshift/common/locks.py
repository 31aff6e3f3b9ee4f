"""Exclusive claims on a folder: one orchestrator per cluster home, one agent per node
folder, one `up` or `down` of a cluster at a time.

Two orchestrators on one home would both write its registry (two PEs given one epoch,
fencing undone); two agents of one node would run each PE twice into one checkpoint
folder; an `up` beside another would write new tokens under a running cluster and start a
second broker on its store. A claim is an ``flock`` on a file in the folder (filelock), so
the kernel lets go when its holder exits however it exits, a SIGKILL too: a node killed and
started again finds its folder free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from fogshift.common.exceptions import AlreadyRunning
from fogshift.common.files import PRIVATE_MODE

#: In a cluster home: held by an `up` or `down` of it while it runs, and by its
#: orchestrator for the orchestrator's life.
CLUSTER_LOCK, ORCHESTRATOR_LOCK = "cluster.lock", "orchestrator.lock"
#: In a node's folder (``<home>/nodes/<name>``): held by its agent for the agent's life.
AGENT_LOCK = "agent.lock"

#: The claims this process took (a lock no longer referenced lets go when it is collected).
_HELD: dict[Path, FileLock] = {}


def _lock(path: Path) -> FileLock:
    # One object per path in a process, re-entrant within a thread (a command holding a
    # home's claim may call another that takes it too; another thread is refused as another
    # process is), never a soft lock (a file left behind by a SIGKILL would keep the claim),
    # and the file kept (deleting it lets a third process lock a new file while the second
    # still holds the old one).
    return FileLock(
        path, timeout=0, mode=PRIVATE_MODE, thread_local=True, is_singleton=True,
        fallback_to_soft=False, preserve_lock_file=True,
    )  # fmt: skip


@contextlib.contextmanager
def exclusive(path: Path, what: str, hint: str) -> Iterator[None]:
    """Hold the claim on ``path`` while the block runs.

    Args:
        what: What the claim is for, as the refusal's message starts ("a fogshift up of
            /home/x").
        hint: What to do when another process holds it.

    Raises:
        AlreadyRunning: Another process holds it.
    """
    lock = claim(path, what, hint)
    try:
        yield
    finally:
        lock.release()
        if not lock.is_locked:
            _HELD.pop(path, None)


def claim(path: Path, what: str, hint: str, wait_s: float = 0.0) -> FileLock:
    """Take the claim on ``path`` (in a folder that exists) until the returned lock is
    released or this process ends (a service holds it for its life).

    Args:
        wait_s: How long to wait for another holder to let go (a service started again
            while its predecessor's last thread still exits).

    Raises:
        AlreadyRunning: Another process holds it (still, after ``wait_s``).
    """
    lock = _lock(path)
    try:
        lock.acquire(timeout=wait_s)
    except Timeout:
        # (Which process: "another process" left the user to hunt for it, e.g. the `up`
        # still waiting on a frozen node that refused a `remove-node`.)
        holder = holder_of(path)
        said = f" (pid {holder[0]}: {holder[1]})" if holder else ""
        raise AlreadyRunning(
            f"{what}: another process holds {str(path)!r}{said}",
            expected="no other process of this kind on this folder",
            received=f"{path.name} locked" + (f" by pid {holder[0]}" if holder else ""),
            hint=hint,
        ) from None
    _HELD[path] = lock
    return lock


def holder_of(path: Path) -> tuple[int, str] | None:
    """The pid and command line of the process holding the claim on ``path``, as the
    kernel's table of locks (``/proc/locks``) says; ``None`` if it cannot tell (not Linux,
    the holder gone meanwhile, or no right to read its command line)."""
    try:
        stat = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:6963372 0 EOF" (a waiter's line has "->")
    file_id = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if (
            len(fields) >= 6
            and "->" not in fields
            and (fields[1], fields[5]) == ("FLOCK", file_id)
            and fields[4].isdigit()
        ):
            pid = int(fields[4])
            try:
                args = psutil.Process(pid).cmdline()
            except psutil.Error:
                return None
            return pid, _command(args)
    return None


def _command(args: list[str]) -> str:
    """A command line as a user would have typed it: ``fogshift up ...`` for a fogshift
    CLI or service run through its module, at most 200 characters."""
    for i, arg in enumerate(args):
        if arg.startswith("fogshift.") and i > 0 and args[i - 1] == "-m":
            args = ["fogshift", *args[i + 1 :]]
            break
    else:
        args = [Path(args[0]).name, *args[1:]] if args else ["?"]
    text = " ".join(" ".join(args).split())  # (one line: a `-c` program has several)
    return text if len(text) <= 200 else text[:199] + "…"


__all__ = ["AGENT_LOCK", "CLUSTER_LOCK", "ORCHESTRATOR_LOCK", "claim", "exclusive", "holder_of"]
