"""Node-agent errors."""

from __future__ import annotations

from fogshift.exceptions import Conflict, InvalidInput, NotFound, Unavailable


class UnknownElement(NotFound):
    """The node does not host that PE."""

    code = "unknown_element"


class NodeNotReady(Unavailable):
    """The node's Spark session is still starting."""

    code = "node_not_ready"


class ElementBusy(Conflict):
    """Another operation on the same PE is under way."""

    code = "element_busy"


class UnknownSource(InvalidInput):
    """A checkpoint source URL that is neither the orchestrator nor a node it knows."""

    code = "unknown_source"


class CannotBuild(InvalidInput):
    """A PE asked to start fresh that cannot be built here (its class does not import, has
    no ``process()``, refuses its options): refused, not hosted as a failed PE."""

    code = "cannot_build"
