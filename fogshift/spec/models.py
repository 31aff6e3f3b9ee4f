"""The pipeline spec models (frozen, validated)."""

from __future__ import annotations

from graphlib import TopologicalSorter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fogshift.common.names import NAME_RE

_NAME = NAME_RE


class ElementSpec(BaseModel):
    """One pipeline element (PE).

    Attributes:
        id: Unique in the pipeline; letters, digits, ``_`` and ``-``.
        kind: A kind from :data:`fogshift.runtime.kinds.KINDS`.
        node: The node that hosts it.
        inputs: The ids of the elements feeding it, in order.
        options: The kind's options.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=_NAME)
    kind: str
    node: str = Field(pattern=_NAME)
    inputs: tuple[str, ...] = ()
    options: dict[str, Any] = Field(default_factory=dict)


class RecoverySpec(BaseModel):
    """What happens when a node hosting the pipeline goes silent.

    Attributes:
        auto: Restore its PEs elsewhere automatically.
        detect_after_s: How long a node may stay silent before it is declared lost.
        latency_ms: How long moving a PE's checkpoint to its redeploy node may take (the
            planner's latency requirement ``l_τ``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    auto: bool = True
    detect_after_s: float = Field(default=10.0, gt=0)
    latency_ms: float = Field(default=30_000.0, gt=0)


class PipelineSpec(BaseModel):
    """A pipeline: a DAG of elements placed on nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pipeline: str = Field(pattern=_NAME)
    elements: tuple[ElementSpec, ...] = Field(min_length=1)
    recovery: RecoverySpec = RecoverySpec()

    def element(self, element_id: str) -> ElementSpec:
        """The element with id ``element_id`` (KeyError if none)."""
        for element in self.elements:
            if element.id == element_id:
                return element
        raise KeyError(element_id)

    def topological_order(self) -> list[ElementSpec]:
        """Elements with every element after its inputs, level by level, each level in spec
        order (so the order is the same on every call and every Python).

        Raises:
            graphlib.CycleError: The elements form a cycle; ``args[1]`` lists it, in the
                direction events flow, its first element repeated at its end.
        """
        index = {e.id: i for i, e in enumerate(self.elements)}
        sorter = TopologicalSorter({e.id: e.inputs for e in self.elements})
        sorter.prepare()
        order: list[ElementSpec] = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready(), key=lambda i: index.get(i, len(index)))
            # An input naming no element is the loader's to refuse; it has no place here.
            order.extend(self.elements[index[i]] for i in ready if i in index)
            sorter.done(*ready)
        return order
