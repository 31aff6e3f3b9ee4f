"""Supervisor errors: a cluster that is, or is not, up under a home."""

from __future__ import annotations

from fogshift.exceptions import Conflict, FogshiftError


class NotUp(FogshiftError):
    """No cluster is running under the given home."""

    code = "not_up"
    http_status = 503


class AlreadyUp(Conflict):
    """A cluster already runs under the given home."""

    code = "already_up"
