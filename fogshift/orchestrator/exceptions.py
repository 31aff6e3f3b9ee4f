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


def stale_generation(node: str, of: int, now: int) -> NodeRemoved:
    """The refusal of node ``node``'s token of generation ``of`` while the node is in
    generation ``now`` (``common.http.node_token``): the machine taken out before the name
    was added again."""
    return NodeRemoved(
        f"this token is of node {node!r} in its generation {of}, and the node is in its "
        f"generation {now}: it was removed from the cluster and added again since, and "
        "the tokens of before open nothing on the orchestrator",
        expected=f"the token of node {node!r} of generation {now}",
        received=f"its token of generation {of}",
        hint=f"the node's agent reads its token from <home>/nodes/{node}/token, which "
        "`fogshift up --nodes` wrote when it added the node again",
    )


class PipelineExists(Conflict):
    """A pipeline of that name is already running, or stopped with what it ran kept."""

    code = "pipeline_exists"


class NotKeyed(InvalidInput):
    """A key was asked of a PE that is not keyed (no ``key_by``)."""

    code = "not_keyed"
