"""The pipeline spec models (frozen, validated)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fogshift.broker.naming import NAME_PATTERN

_NAME = NAME_PATTERN.pattern


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
        """Elements with every element after its inputs (the spec must be validated)."""
        done: set[str] = set()
        order: list[ElementSpec] = []
        pending = list(self.elements)
        while pending:
            ready = [e for e in pending if all(i in done for i in e.inputs)]
            for element in ready:
                order.append(element)
                done.add(element.id)
            pending = [e for e in pending if e.id not in done]
            if not ready:
                raise ValueError("cycle")
        return order
