"""Waiting for a PE on a node agent to reach an input position (migration, restoration)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.http import ServiceClient
from fogshift.common.waiting import wait_until
from fogshift.exceptions import FogshiftError


def wait_for_progress(
    agent: ServiceClient,
    element_path: str,
    at_least: int,
    timeout_s: float,
    error: type[FogshiftError],
    what: str,
    observe: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Poll ``<element_path>/progress`` until the committed input progress reaches ``at_least``.

    Args:
        error: Raised (with ``what`` in its message) if the PE's query failed or was fenced,
            or the position is not reached within ``timeout_s``.
        observe: Called with every answer (e.g. to record a trace).

    Returns:
        The last progress answer.
    """
    info: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        nonlocal info
        info = agent.get(element_path + "/progress")
        if observe is not None:
            observe(info)
        if info["state"] in ("failed", "fenced"):
            raise error(f"{what}: the PE's query {info['state']}: {info['error']}")
        if info["committed_batch"] is not None and info["progress"] >= at_least:
            return info
        return None

    try:
        return wait_until(
            reached, timeout_s, interval_s=0.02, describe=f"{what}: input position {at_least}"
        )
    except WaitTimedOut:
        raise error(
            f"{what}: the PE did not reach input position {at_least} in {timeout_s:.0f} s "
            f"(at {info.get('progress')}, state {info.get('state')})"
        ) from None
