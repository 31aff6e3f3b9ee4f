"""Restoration errors."""

from __future__ import annotations

from pydantic import BaseModel

from fogshift.exceptions import FogshiftError


class RestoreFailed(FogshiftError):
    """A restore did not complete; the target instance was discarded.

    Attributes:
        report: The restore's report (a ``fogshift.contracts.RestoreReport``, with the failed
            attempts), sent with the error and rebuilt from it by
            ``common.http.raise_for_error``. Typed by its base class: errors import nothing
            but errors and pydantic, so every layer can raise and catch them.
    """

    code = "restore_failed"
    http_status = 502
    report: BaseModel | None = None


class CheckpointUnreadable(RestoreFailed):
    """The restored PE's query cannot read the checkpoint it was given: every start of it
    fails on it (a file torn alike in every copy). The restore tries an older one."""

    code = "checkpoint_unreadable"
