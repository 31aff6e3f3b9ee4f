"""Orchestrator errors."""

from __future__ import annotations

from fogshift.exceptions import Conflict, NotFound


class UnknownPipeline(NotFound):
    """No pipeline of that name was deployed."""

    code = "unknown_pipeline"


class UnknownNode(NotFound):
    """No node of that name has registered."""

    code = "unknown_node"


class PipelineExists(Conflict):
    """A pipeline of that name is already running."""

    code = "pipeline_exists"
