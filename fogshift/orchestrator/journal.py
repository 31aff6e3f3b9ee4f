"""The operations journal and what every operation needs: exclusive access to a PE, phases
recorded before their side effects, fencing epochs, usable target nodes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.publish import fence
from fogshift.exceptions import FogshiftError, Unavailable
from fogshift.migration.exceptions import MigrationInProgress
from fogshift.orchestrator.exceptions import UnknownNode
from fogshift.orchestrator.registry import NodeRecord, Operation, PipelineRecord
from fogshift.orchestrator.replication import Replication
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.orchestrator")


class Journal(Replication):
    """Journal entries, exclusivity and the steps migrations and restores share."""

    def _test_pause(self, point: str) -> None:
        """The test hook of :attr:`OrchestratorConfig.test_pause_at`: block at ``point``."""
        if point != self.config.test_pause_at:
            return
        log.warning("test pause at %s: waiting to be killed", point)
        self._stop.wait()
        raise Unavailable(f"the orchestrator stopped while held at {point} (test hook)")

    def _enter(self, op: Operation, phase: str) -> None:
        """Journal that ``op`` enters ``phase`` (before the phase's side effect)."""
        self.registry.advance(op.id, phase)
        self._test_pause(f"{op.kind}:{phase}")

    def _route(self, op: Operation) -> None:
        """The routing change of ``op``: placement and journal move to the target at once."""
        self.registry.route(op.id, op.target)
        log.info("%s of %s/%s: routed to %s", op.kind, op.pipeline, op.element, op.target)
        self._test_pause(f"{op.kind}:routed")

    def _fence_for(self, op: Operation) -> int:
        """Give ``op``'s PE a new epoch and fence its output stream with it; return it."""
        epoch = self.registry.next_epoch(op.pipeline, op.element, operation=op.id)
        self.broker.run(lambda js: fence(js, op.pipeline, op.element, epoch))
        log.warning("%s of %s/%s: fenced under epoch %d", op.kind, op.pipeline, op.element,
                    epoch)  # fmt: skip
        return epoch

    def _mark(self, pipeline: str, element: str, epoch: int) -> None:
        """Fence ``pipeline/element``'s output stream with ``epoch`` (already the PE's newest:
        a handover's target writes under it); an instance under an older one is refused."""
        self.broker.run(lambda js: fence(js, pipeline, element, epoch))
        log.info("%s/%s: output fenced with epoch %d", pipeline, element, epoch)

    def _discard_quietly(
        self, node: str, here: str, record: PipelineRecord | None, op: Operation
    ) -> None:
        """Discard what ``op`` left on ``node`` — never the PE's placed instance."""
        if record is not None and record.placement.get(op.element) == node:
            return
        try:
            self.agent(node).delete(here, params={"discard": True})
        except FogshiftError as exc:
            # Not placed there: the reconciler removes it once the node answers.
            log.warning("recovery: %s on %s not removed: %s", here, node, exc.message)

    def _open_gate_quietly(self, node: str, here: str) -> None:
        try:
            self.agent(node).put(here + "/gate", json={"gate": None})
        except FogshiftError as exc:
            # Not there or its node is silent: the reconciler restarts or restores it.
            log.warning("recovery: the gate of %s on %s not opened: %s", here, node, exc.message)

    def _usable_node(self, name: str, what: str) -> NodeRecord:
        """Node ``name``, known, healthy and ready, to ``what`` (e.g. "restore p/e on").

        Raises:
            UnknownNode: It never registered.
            Unavailable: It is not healthy (silent, or its Spark session is not ready).
        """
        node = self.registry.node(name)
        if node is None:
            raise UnknownNode(
                f"cannot {what} unknown node {name!r}",
                expected="one of " + ", ".join(self.node_names()),
                received=repr(name),
            )
        if not self.healthy(node) or not node.report.ready:
            raise Unavailable(
                f"cannot {what} node {name!r}: it is not healthy",
                hint="choose another node; `fogshift nodes` shows node health",
            )
        return node

    @contextlib.contextmanager
    def _exclusive(self, pipeline: str, element_id: str, what: str) -> Iterator[None]:
        """Run one migration or restore of a PE at a time; log its failure.

        Raises:
            MigrationInProgress: Another one is under way.
        """
        key = (pipeline, element_id)
        with self._lock:
            if key in self._migrating:
                raise MigrationInProgress(
                    f"{pipeline}/{element_id} is already being migrated, restored or cleaned up",
                    hint="wait for that operation to finish",
                )
            self._migrating.add(key)
        try:
            yield
        except FogshiftError as exc:
            log.warning("%s of %s/%s failed: %s", what, pipeline, element_id, exc.render())
            raise
        finally:
            with self._lock:
                self._migrating.discard(key)

    def _element(self, record: PipelineRecord, element_id: str) -> ElementSpec:
        try:
            return record.spec.element(element_id)
        except KeyError:
            parts = [e.id for e in record.spec.partitions_of(element_id)]
            raise UnknownElement(
                f"pipeline {record.name!r} has no element {element_id!r}"
                + (" (it is partitioned)" if parts else ""),
                expected="one of " + ", ".join(e.id for e in record.spec.elements),
                hint=f"name one of its partitions: {', '.join(parts)}" if parts else None,
            ) from None
