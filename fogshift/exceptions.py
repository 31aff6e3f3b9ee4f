"""The root of every error fogshift raises on purpose.

Each error carries a machine-readable ``code`` and the HTTP status the REST layer maps it
to, so an agent's refusal reaches the CLI user unchanged. Messages name the object (which
pipeline, element, node) and, where useful, what was expected, what was received and a hint.
"""

from __future__ import annotations

from typing import Any


class FogshiftError(Exception):
    """Base class of all fogshift errors.

    Args:
        message: What went wrong, naming the object concerned.
        expected: What a valid input would have been, if the error is about input.
        received: What was actually received.
        hint: What the user can do about it.
    """

    code = "error"
    http_status = 500
    #: The hint of an error raised without one (a family of refusals whose remedy is one).
    default_hint: str | None = None

    def __init__(
        self,
        message: str,
        *,
        expected: str | None = None,
        received: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.expected = expected
        self.received = received
        self.hint = hint if hint is not None else self.default_hint
        super().__init__(self.render())

    def render(self) -> str:
        """The message with expected/received/hint on lines of their own."""
        parts = [self.message]
        if self.expected is not None:
            parts.append(f"expected: {self.expected}")
        if self.received is not None:
            parts.append(f"received: {self.received}")
        if self.hint is not None:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The JSON body the REST layer sends for this error."""
        return {
            "code": self.code,
            "message": self.message,
            "expected": self.expected,
            "received": self.received,
            "hint": self.hint,
        }


class InvalidInput(FogshiftError):
    """A spec, command or request that cannot be accepted as given."""

    code = "invalid"
    http_status = 422


class NotFound(FogshiftError):
    """A named pipeline, element or node does not exist."""

    code = "not_found"
    http_status = 404


class Conflict(FogshiftError):
    """The request clashes with what is already running."""

    code = "conflict"
    http_status = 409


class Unauthorized(FogshiftError):
    """A missing or wrong token."""

    code = "unauthorized"
    http_status = 401


class Unavailable(FogshiftError):
    """A service the request needs (node agent, broker) cannot be reached."""

    code = "unavailable"
    http_status = 503


class InvariantViolation(FogshiftError):
    """Something that must never happen did (an offset went backwards, a torn checkpoint)."""

    code = "invariant"
    http_status = 500
