"""The key-move lock of each partitioned element: its key moves and scales go one at a time.

Below the orchestrator's other modules: the key moves and scales hold it throughout, the
reconciler tells by it whether one of this process runs, and a stop waits for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from fogshift.exceptions import Conflict

#: One lock per partitioned element: its key moves go one at a time.
_LOCKS: dict[tuple[str, str], threading.Lock] = {}
#: How long a key move or scale waits for the one of its element under way: queued behind
#: it, then refused (the request's thread, and the client, waited without end before).
LOCK_WAIT_S = 600.0


def element_lock_of(pipeline: str, element_id: str) -> threading.Lock:
    """The key-move lock of ``element_id`` (held by :func:`element_lock`)."""
    return _LOCKS.setdefault((pipeline, element_id), threading.Lock())


@contextlib.contextmanager
def element_lock(
    pipeline: str, element_id: str, refusal: str, wait_s: float = LOCK_WAIT_S
) -> Iterator[None]:
    """Hold the key-move lock of ``element_id`` (see :data:`_LOCKS`).

    Raises:
        Conflict: (starting with ``refusal``) another key move or scale of the element did
            not end within ``wait_s``; nothing was done.
    """
    lock = element_lock_of(pipeline, element_id)
    if not lock.acquire(timeout=wait_s):
        raise Conflict(
            f"{refusal}: a key move or scale of {pipeline}/{element_id} has run for "
            f"{wait_s:.0f} s more and still runs",
            expected=f"no key move or scale of {element_id} under way",
            received="one still running",
            hint="its own command reports when it ends (`fogshift status` shows the "
            "partitions meanwhile); then send this one again",
        )
    try:
        yield
    finally:
        lock.release()
