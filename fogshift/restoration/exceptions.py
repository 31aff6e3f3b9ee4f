"""Restoration errors."""

from __future__ import annotations

from fogshift.exceptions import FogshiftError


class RestoreFailed(FogshiftError):
    """A restore did not complete; the target instance was discarded."""

    code = "restore_failed"
    http_status = 502
