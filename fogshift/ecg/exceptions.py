"""Errors of the Case 2 signal processing."""

from __future__ import annotations

from fogshift.exceptions import InvalidInput


class BadSignal(InvalidInput):
    """A window of samples that cannot be processed (empty, not numbers, wrong rate)."""

    code = "bad_signal"
