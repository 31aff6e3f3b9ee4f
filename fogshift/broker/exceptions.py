"""Broker errors."""

from __future__ import annotations

from fogshift.exceptions import FogshiftError, InvariantViolation, Unavailable


class BrokerUnavailable(Unavailable):
    """The NATS server cannot be reached or refused the credentials."""

    code = "broker_unavailable"


class BrokerError(FogshiftError):
    """JetStream refused an operation."""

    code = "broker_error"


class WriterConflict(InvariantViolation):
    """Another writer appended to a PE's output stream: this instance must not write on."""

    code = "writer_conflict"
    http_status = 409


class Fenced(WriterConflict):
    """This PE instance runs under an epoch that was superseded: it must never write again.

    The message starts with :data:`FENCED_TOKEN` so that an agent recognises it in the text
    of a Spark query's failure.
    """

    code = "fenced"


FENCED_TOKEN = "FOGSHIFT_FENCED"
