"""Orchestrator errors."""

from __future__ import annotations

from fogshift.common.exceptions import Forbidden
from fogshift.exceptions import Conflict, InvalidInput, NotFound


class UnknownPipeline(NotFound):
    """No pipeline of that name was deployed."""

    code = "unknown_pipeline"


class UnknownNode(NotFound):
    """No node of that name has registered."""

    code = "unknown_node"


class NodeInUse(Conflict):
    """A node to remove still hosts a PE or standby, or an unfinished operation names it."""

    code = "node_in_use"


class NodeRemoved(Forbidden):
    """The node was removed from the cluster: its token opens nothing until it is added
    again."""

    code = "node_removed"


class PipelineExists(Conflict):
    """A pipeline of that name is already running."""

    code = "pipeline_exists"


class NotKeyed(InvalidInput):
    """A key was asked of a PE that is not keyed (no ``key_by``)."""

    code = "not_keyed"
