"""Runtime errors: PE construction and execution."""

from __future__ import annotations

from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, Unavailable


class DeadLetter(Exception):
    """Raised by a processor for an input event it cannot process.

    The event goes to the pipeline's dead letter with ``reason``; the processor's state must
    be left as it was before the event (raise before changing state).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class ElementError(FogshiftError):
    """A PE could not be built or run."""

    code = "element_error"


class BadState(InvalidInput):
    """A snapshot that does not match the PE's declared state."""

    code = "bad_state"


class NoState(Conflict):
    """A PE whose state was asked for holds none: a source, a sink or a stateless processor."""

    code = "no_state"


class SinkBusy(Unavailable):
    """A sink's output file stays locked by another writer (an earlier instance, stuck)."""

    code = "sink_busy"
