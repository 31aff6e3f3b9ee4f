"""Checkpoint errors."""

from __future__ import annotations

from fogshift.exceptions import FogshiftError, InvariantViolation


class CheckpointError(FogshiftError):
    """A checkpoint cannot be read, copied or installed."""

    code = "checkpoint_error"


class TornCheckpoint(InvariantViolation):
    """A checkpoint archive that is incomplete or does not match its digest."""

    code = "torn_checkpoint"
