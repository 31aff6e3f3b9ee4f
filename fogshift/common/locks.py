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
from collections.abc import Iterator
from pathlib import Path

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
        raise AlreadyRunning(
            f"{what}: another process holds {str(path)!r}",
            expected="no other process of this kind on this folder",
            received=f"{path.name} locked",
            hint=hint,
        ) from None
    _HELD[path] = lock
    return lock


__all__ = ["AGENT_LOCK", "CLUSTER_LOCK", "ORCHESTRATOR_LOCK", "claim", "exclusive"]
