"""Migration errors."""

from __future__ import annotations

from pydantic import BaseModel

from fogshift.exceptions import Conflict, FogshiftError


class MigrationFailed(FogshiftError):
    """The migration did not complete; the origin runs again.

    Attributes:
        report: The migration's report (a ``fogshift.contracts.MigrationReport``: whether the
            origin runs again, under which epoch), sent with the error and rebuilt from it
            by ``common.http.raise_for_error``. Typed by its base class: errors import
            nothing but errors and pydantic, so every layer can raise and catch them.
    """

    code = "migration_failed"
    http_status = 502
    report: BaseModel | None = None


class MigrationInProgress(Conflict):
    """Another migration of the same PE is under way."""

    code = "migration_in_progress"


class MigrationRouted(FogshiftError):
    """Something failed after the migration's routing change committed: the target is the
    PE, and nothing undoes that. Raised by the caller's ``route`` step for what fails once
    its change is in place; the migration passes it on without a rollback (its journal
    entry, left at ``routed``, is completed by the next recovery round)."""

    code = "migration_routed"
    http_status = 503
