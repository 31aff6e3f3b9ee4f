"""Waiting for a PE on a node agent to reach an input position (migration, restoration)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.http import ServiceClient
from fogshift.common.waiting import wait_until
from fogshift.contracts import ElementProgress, PEState
from fogshift.exceptions import FogshiftError

log = logging.getLogger("fogshift.progress")

#: How long one progress request may wait at the agent for the PE to move on (a long poll,
#: well under :data:`~fogshift.common.service.PROGRESS_WAIT_MAX_S`): the answer comes when
#: the PE commits a batch or changes state; an agent of a version without long polls
#: answers at once and is asked again every 20 ms.
LONG_POLL_S = 1.0


def progress_params(last: ElementProgress | None, wait_s: float) -> dict[str, Any]:
    """The query of a ``GET .../progress`` that waits (at most ``wait_s``) until the PE's
    progress or state differs from ``last`` (none: answered at once)."""
    if last is None or wait_s <= 0:
        return {}
    return {"wait_s": round(wait_s, 3), "seen": last.progress, "state": last.state.value}


@dataclass
class PositionWatch:
    """A caller's long poll of one PE's progress across requests: the last answer and the
    node it came from (an answer from another node is no base to wait on), and how long the
    next request may wait at the agent."""

    node: str | None = None
    last: ElementProgress | None = None
    wait_s: float = 0.0


def wait_for_progress(
    agent: ServiceClient,
    element_path: str,
    at_least: int,
    timeout_s: float,
    error: type[FogshiftError],
    what: str,
    observe: Callable[[ElementProgress], None] | None = None,
    while_moving: bool = False,
    unreadable_error: type[FogshiftError] | None = None,
) -> ElementProgress:
    """Ask ``<element_path>/progress`` until the committed input progress reaches ``at_least``
    (each request after the first waits at the agent until the answer would differ).

    Args:
        while_moving: Wait on as long as the progress grows, ``timeout_s`` at a time: only a
            PE that made no progress for ``timeout_s`` fails the wait (a restore after a long
            outage has a backlog no fixed time fits).
        error: Raised (with ``what`` in its message) if the PE was fenced, or its query
            failed and the agent will not start it again or reports its checkpoint
            unreadable, or the position is not reached within ``timeout_s`` (a failed query
            the agent restarts is waited for).
        observe: Called with every answer (e.g. to record a trace).
        unreadable_error: Raised instead of ``error`` when the PE reports the checkpoint it
            was given unreadable (default: ``error``).

    Returns:
        The last progress answer.
    """
    info: ElementProgress | None = None
    began: int | None = None  # the progress at the first answer of this stretch of waiting
    deadline = 0.0  # of the present stretch: no request waits at the agent beyond it

    def reached() -> ElementProgress | None:
        nonlocal info, began
        wait_s = min(LONG_POLL_S, deadline - time.monotonic())
        info = agent.call(ElementProgress, "GET", element_path + "/progress",
                          params=progress_params(info, wait_s))  # fmt: skip
        if began is None:
            began = info.progress
        if observe is not None:
            observe(info)
        # A failed query the agent starts again (a Python worker that could not start on a
        # loaded node, broker trouble) may still get there in time: only a fenced PE or one
        # the agent gave up on ends the wait early.
        if info.state == PEState.FENCED or (
            info.state == PEState.FAILED and info.retry_in_s is None
        ):
            raise error(f"{what}: the PE's query {info.state}: {info.error}")
        if info.state == PEState.FAILED and info.unreadable is not None:
            # (Every start fails on the checkpoint it was given: waited for to the end of
            # the timeout, a restore from a central checkpoint torn alike took minutes a try.)
            raise (unreadable_error or error)(
                f"{what}: the PE's query cannot read the checkpoint it was given "
                f"({info.unreadable})"
            )
        # Only a query that runs is there: an installed checkpoint's position is on disk
        # before its query starts, and stays there when it fails to (a restore or a move
        # reported done with nobody running the PE). Position 0 is reached with nothing
        # committed: a PE that never emitted, restored or moved with nothing to re-derive,
        # commits no batch behind a cap at 0 (a sink waiting for its first alarm would
        # otherwise never be restored).
        started = info.state in (PEState.RUNNING, PEState.PAUSED)
        if (
            started
            and (info.committed_batch is not None or at_least <= 0)
            and info.progress >= at_least
        ):
            return info
        return None

    while True:
        deadline = time.monotonic() + timeout_s
        try:
            return wait_until(
                reached, timeout_s, interval_s=0.02, describe=f"{what}: input position {at_least}"
            )
        except WaitTimedOut:
            at = (info.progress, info.state) if info is not None else (None, None)
            moved = at[0] is not None and began is not None and at[0] > began
            if while_moving and at[1] == PEState.RUNNING and moved:
                log.info("%s: at input position %s of %s after %.0f s more, still catching up",
                         what, at[0], at_least, timeout_s)  # fmt: skip
                began = None
                continue
            raise error(
                f"{what}: the PE did not reach input position {at_least} in {timeout_s:.0f} s "
                + ("without progress " if while_moving else "")
                + f"(at {at[0]}, state {at[1]})"
            ) from None
