"""Migration errors."""

from __future__ import annotations

from fogshift.exceptions import Conflict, FogshiftError


class MigrationFailed(FogshiftError):
    """The migration did not complete; the origin runs again."""

    code = "migration_failed"
    http_status = 502


class MigrationInProgress(Conflict):
    """Another migration of the same PE is under way."""

    code = "migration_in_progress"
