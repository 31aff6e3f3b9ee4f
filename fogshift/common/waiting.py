"""Waiting for a condition, not for seconds: the one polling loop of fogshift."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from fogshift.common.exceptions import WaitTimedOut

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    describe: str,
    retry_on: tuple[type[BaseException], ...] = (),
    hint: str | None = None,
) -> T:
    """Call ``condition`` every ``interval_s`` until it returns something truthy.

    The condition is called at least once, and once more at the deadline if the interval
    would overshoot it, so a condition that holds just in time is not missed. Any exception
    it raises ends the wait at once (a failure is not something to wait out), except those
    in ``retry_on``, which count as "not yet" (e.g. a service that does not answer while it
    starts).

    Args:
        condition: Returns the awaited value once it holds, something falsy before.
        timeout_s: How long to wait in total.
        interval_s: Pause between two calls.
        describe: What is awaited, for the error (e.g. "node fog-a healthy").
        retry_on: Exceptions of ``condition`` that mean "not yet".
        hint: The error's hint.

    Returns:
        The condition's first truthy value.

    Raises:
        WaitTimedOut: The condition did not hold within ``timeout_s``; it names ``describe``
            and carries the last value (or ``retry_on`` error) seen as ``last``.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = condition()
        except retry_on as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimedOut(
                f"timed out after {timeout_s:g} s waiting for {describe}",
                what=describe,
                last=last,
                hint=hint,
            )
        time.sleep(min(interval_s, remaining))
