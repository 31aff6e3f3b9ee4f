"""Orchestrator errors."""

from __future__ import annotations

from fogshift.exceptions import Conflict, InvalidInput, NotFound


class UnknownPipeline(NotFound):
    """No pipeline of that name was deployed."""

    code = "unknown_pipeline"


class UnknownNode(NotFound):
    """No node of that name has registered."""

    code = "unknown_node"


class PipelineExists(Conflict):
    """A pipeline of that name is already running."""

    code = "pipeline_exists"


class NotKeyed(InvalidInput):
    """A key was asked of a PE that is not keyed (no ``key_by``)."""

    code = "not_keyed"
