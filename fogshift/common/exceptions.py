"""Errors of the shared REST and naming plumbing."""

from __future__ import annotations

from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, Unavailable


class NoAnswer(Unavailable):
    """A request sent that got no answer (the connection broke or timed out after it was
    sent): the service may still carry it out.

    A code of its own: a client (the dashboard, a script) tells "may still be under way"
    from a refusal of a service that cannot be reached, before anything was started."""

    code = "no_answer"
    #: The service that did not answer, as the client that sent the request names it ("the
    #: orchestrator"); ``None`` for one passed on by a service in its own answer.
    service: str | None = None


class InvalidName(InvalidInput):
    """A pipeline, element, node or snapshot name, or a checkpoint file path, that could
    not safely become part of a path on disk."""

    code = "invalid_name"


class PathEscape(InvalidInput):
    """A path that, once resolved (``..``, symbolic links), lies outside its intended root."""

    code = "path_escape"


class AlreadyRunning(Conflict):
    """A process that must be the only one of its kind on a folder (an orchestrator on a
    cluster home, an agent on its node's folder, an `up` or `down` of a cluster) found
    another holding it (:mod:`fogshift.common.locks`)."""

    code = "already_running"


class Forbidden(FogshiftError):
    """A valid token that does not allow this request (e.g. a node's token on an operator
    endpoint)."""

    code = "forbidden"
    http_status = 403


class WaitTimedOut(FogshiftError):
    """A condition awaited with :func:`fogshift.common.waiting.wait_until` did not hold
    before its deadline.

    Attributes:
        what: What was awaited.
        last: The condition's last answer (or the last error it raised that counts as "not
            yet"), for the caller's own message.
    """

    code = "timeout"
    http_status = 504

    def __init__(self, message: str, *, what: str, last: object, hint: str | None = None) -> None:
        self.what = what
        self.last = last
        super().__init__(message, received=f"last seen: {last!r}", hint=hint)
