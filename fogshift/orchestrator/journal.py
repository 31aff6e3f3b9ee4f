"""The operations journal and what every operation needs: exclusive access to a PE, phases
recorded before their side effects, fencing epochs, usable target nodes."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.publish import fence
from fogshift.exceptions import Conflict, FogshiftError, Unavailable
from fogshift.migration.exceptions import MigrationInProgress, MigrationRouted
from fogshift.orchestrator.core import unknown_node
from fogshift.orchestrator.registry import NodeRecord, Operation, PipelineRecord
from fogshift.orchestrator.replication import Replication
from fogshift.spec.loader import did_you_mean
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.orchestrator")


#: What the section of a PE whose stream's old records are being trimmed is held as
#: (``orchestrator.history``).
TRIMMING = "trimming"
#: A node's removal dropping the standby the keeper had put there (``Standbys.remove_node``).
NODE_REMOVAL = "node removal"
#: The standby keeper's round holding a PE only to see whether it needs a standby.
STANDBY_LOOK = "standby look"
#: The orchestrator's own rounds that take a PE's exclusive section (see
#: :meth:`Journal._exclusive`): they skip a PE someone holds, and are waited for.
BACKGROUND = frozenset(
    {"standby", STANDBY_LOOK, "standby follow", "restart", "recovery",
     "removal of a superseded instance", "discarding a checkpoint left on a node", TRIMMING}
)  # fmt: skip
#: How long an operation someone asked for waits for such a round to let the PE go (a
#: standby's start copies a checkpoint and starts a query: seconds, more over slow links).
BACKGROUND_WAIT_S = 60.0
#: How long a stop waits for the operations under way on its pipeline's PEs (a migration,
#: restore or scale, which start instances) before it is refused.
STOP_WAIT_S = 120.0
#: What each holder is, in the refusal.
BUSY = {
    "stopping": "a stop of its pipeline",
    "migration": "a migration", "restore": "a restore", "scaling": "a scale or key move",
    "standby": "the start of its standby", "standby follow": "its standby's follow-up",
    STANDBY_LOOK: "the standby keeper's look at it (a moment)",
    "restart": "a restart by the reconciler", "recovery": "the recovery of an interrupted "
    "operation", "removal of a superseded instance": "the removal of a superseded instance",
    "discarding a checkpoint left on a node": "the removal of a checkpoint left on a node",
    TRIMMING: "the trimming of its stream's old records",
    NODE_REMOVAL: "the removal of its standby's node",
}  # fmt: skip


class Journal(Replication):
    """Journal entries, exclusivity and the steps migrations and restores share."""

    def _test_pause(self, point: str) -> None:
        """The test hooks :attr:`OrchestratorConfig.test_pause_at` and
        :attr:`OrchestratorConfig.test_pause_file`: block at ``point``."""
        wanted, file = self.config.test_pause_at, self.config.test_pause_file
        if wanted is None and file is not None:
            try:
                wanted = file.read_text().strip()
            except (OSError, ValueError):  # absent, unreadable or not text: no stop asked for
                return
        if point != wanted:
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
        try:
            self._test_pause(f"{op.kind}:routed")
        except FogshiftError as exc:  # committed: not to be rolled back (see MigrationSteps)
            raise MigrationRouted(
                f"{op.kind} of {op.pipeline}/{op.element} to {op.target} stopped after its "
                f"routing change: {exc.message}",
                hint="the journal's next recovery round completes it",
            ) from exc

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

    def _usable_node(self, name: str, what: str, leaving: str | None = None) -> NodeRecord:
        """Node ``name``, known, healthy and ready, to ``what`` (e.g. "restore p/e on");
        ``leaving``: the node the PE leaves, not offered instead.

        Raises:
            UnknownNode: It never registered.
            Unavailable: It is not healthy (silent, or its Spark session is not ready), or
                it is being removed from the cluster (``fogshift remove-node``).
        """
        node = self.registry.node(name)
        if node is None:
            raise unknown_node(f"cannot {what} unknown node {name!r}", name, self.node_names(),
                               "`fogshift nodes` lists the nodes and their health")  # fmt: skip
        removing = self.leaving_nodes()
        if name in removing:
            # (Placed there, it would keep the node the user is removing: the removal,
            # its standbys dropped already, would be refused.)
            others = [n.name for n in self.registry.nodes() if self.healthy(n)
                      and n.report.ready and n.name not in removing | {name, leaving}]  # fmt: skip
            raise Unavailable(
                f"cannot {what} node {name!r}: it is being removed from the cluster",
                expected="a node that stays in the cluster",
                received=f"{name!r}, whose removal (`fogshift remove-node`) is under way",
                hint=f"choose another node ({', '.join(others)} healthy now)"
                if others
                else "no other node is healthy now: `fogshift nodes` shows why",
            )
        if not self.healthy(node) or not node.report.ready:
            silent = time.time() - node.last_seen
            usable = [
                n.name
                for n in self.registry.nodes()
                if n.name not in (name, leaving) and self.healthy(n) and n.report.ready
            ]
            raise Unavailable(
                f"cannot {what} node {name!r}: it is not healthy",
                expected=f"a node heard within {self.config.node_timeout_s:g} s, its Spark "
                "session ready",
                received=f"{name!r} last heard {silent:.0f} s ago"
                if not self.healthy(node)
                else f"{name!r} heard, its Spark session not ready yet (starting)",
                # (The node the PE leaves is no choice: said, not left out unsaid.)
                hint=f"choose another node ({', '.join(usable)} healthy now"
                + (f"; it is on {leaving!r} now" if leaving else "")
                + ")"
                if usable
                else "no other node is healthy now: `fogshift nodes` shows why",
            )
        return node

    @contextlib.contextmanager
    def _as_round(self) -> Iterator[None]:
        """Mark this thread as running one of the orchestrator's own rounds meanwhile (see
        :meth:`_exclusive`)."""
        before = getattr(self._in_round, "active", False)
        self._in_round.active = True
        try:
            yield
        finally:
            self._in_round.active = before

    @contextlib.contextmanager
    def _exclusive(
        self,
        pipeline: str,
        element_id: str,
        what: str,
        wait_s: float | None = None,
        *,
        log_failure: bool = True,
    ) -> Iterator[None]:
        """Run one operation on a PE's instances at a time; log its failure (unless
        ``log_failure`` is false: a caller holding many PEs' sections at once, such as a
        node's removal, says its failure once itself).

        An operation someone asked for (a migration, restore, scale) waits, up to ``wait_s``
        (``None``: :data:`BACKGROUND_WAIT_S`), for one of the orchestrator's own rounds that
        holds the PE (:data:`BACKGROUND`: a standby's cap raised, a standby started, the
        reconciler's repairs), which keep it for a few requests at a time: refused, a user's
        migration of a PE with a standby failed whenever the follower's round held it (most
        of the time over a slow link). The rounds themselves never wait: they skip the PE.

        Raises:
            MigrationInProgress: Another one is under way (or a round still is, after the
                wait).
        """
        key = (pipeline, element_id)
        # (Nor an operation a round itself starts, such as the reconciler's auto-restore: a
        # round that waited would hold up every other PE's turn.)
        waits = what not in BACKGROUND and not getattr(self._in_round, "active", False)
        wait_s = BACKGROUND_WAIT_S if wait_s is None else max(0.0, wait_s)
        deadline = time.monotonic() + (wait_s if waits else 0.0)
        with self._lock:
            while key in self._migrating:
                holder = self._migrating[key]
                left = deadline - time.monotonic()
                if holder not in BACKGROUND or left <= 0:
                    raise MigrationInProgress(
                        f"{pipeline}/{element_id} is already being migrated, restored or "
                        f"cleaned up: {BUSY.get(holder, holder)} is under way",
                        expected=f"no other operation on {pipeline}/{element_id}",
                        received=f"{what} while {BUSY.get(holder, holder)} is under way",
                        hint="wait for that operation to finish (`fogshift status "
                        f"{pipeline}` shows it), then try again",
                    )
                self._released.wait(left)
            self._migrating[key] = what
        try:
            # (A stop is not: an entry a dead orchestrator left is abandoned once its
            # pipeline stopped, and one whose resolution kept failing made it unstoppable.)
            if what not in BACKGROUND and what != "stopping":
                self._refuse_unresolved(pipeline, element_id)
            yield
        except FogshiftError as exc:
            if log_failure:
                log.warning("%s of %s/%s failed: %s", what, pipeline, element_id, exc.render())
            raise
        finally:
            with self._lock:
                self._migrating.pop(key, None)
                self._released.notify_all()

    @contextlib.contextmanager
    def _stopping(
        self, pipeline: str, pes: list[str], wait_s: float | None = None
    ) -> Iterator[None]:
        """Hold the exclusive sections of ``pes`` for a stop of ``pipeline``: once the
        operations under way on them end (within ``wait_s``), none runs until the stop
        did. A migration, restore or scale running beside a stop started its instances
        after the stop had removed the pipeline's: they ran on, for a stopped pipeline.

        Raises:
            Conflict: An operation still ran after ``wait_s`` (:data:`STOP_WAIT_S`);
                nothing was stopped.
        """
        wait_s = STOP_WAIT_S if wait_s is None else wait_s
        deadline = time.monotonic() + wait_s
        while True:
            with contextlib.ExitStack() as held:
                try:
                    for pe in pes:
                        # (A round of the orchestrator's own is waited for only until the
                        # stop's deadline too, not BACKGROUND_WAIT_S per PE.)
                        left = deadline - time.monotonic()
                        held.enter_context(self._exclusive(pipeline, pe, "stopping", left))
                except MigrationInProgress as exc:
                    if time.monotonic() >= deadline:
                        raise Conflict(
                            f"cannot stop pipeline {pipeline!r}: {exc.message}",
                            expected="no migration, restore or scale of its PEs under way",
                            received=f"one still running after {wait_s:.0f} s",
                            hint="its own command reports when it ends; then stop again",
                        ) from exc
                else:
                    yield
                    return
            time.sleep(0.1)

    def _unresolved(self, pipeline: str, element_id: str) -> list[Operation]:
        """The PE's unfinished journal entries, oldest first (left to their resolution)."""
        return [op for op in self.registry.unfinished()
                if (op.pipeline, op.element) == (pipeline, element_id)]  # fmt: skip

    def _refuse_unresolved(self, pipeline: str, element_id: str) -> None:
        """Refuse an operation on a PE whose journal holds an operation nobody runs (left by
        an orchestrator that died, until the reconciler's next round resolves it): run
        first, it acted on instances that resolution then undid or completed (a migration
        from an origin whose target a dead orchestrator had already made live: two writers
        under one epoch).

        Raises:
            MigrationInProgress: Such an entry exists.
        """
        left = self._unresolved(pipeline, element_id)
        if left:
            op = left[0]
            raise MigrationInProgress(
                f"{pipeline}/{element_id} has an unfinished {op.kind} ({op.origin} -> "
                f"{op.target}, phase {op.phase}) that an orchestrator left: it is resolved "
                "first",
                expected=f"no unfinished operation on {pipeline}/{element_id}",
                received=f"the {op.kind} {op.id}, left in phase {op.phase}",
                hint="the reconciler resolves it within a round or two; try again then",
            )

    def _element(self, record: PipelineRecord, element_id: str) -> ElementSpec:
        try:
            return record.spec.element(element_id)
        except KeyError:
            parts = [e.id for e in record.spec.partitions_of(element_id)]
            ids = [e.id for e in record.spec.elements]
            # The partitioned elements by their own names too (`state`, `events` and key
            # moves take them): "classfy" was guessed to be "classify-p1".
            partitioned = sorted({e.partition.of for e in record.spec.elements if e.partition})
            guess = did_you_mean(element_id, [*ids, *partitioned])
            raise UnknownElement(
                f"pipeline {record.name!r} has no element {element_id!r}"
                + (" (it is partitioned)" if parts else ""),
                expected="one of "
                + ", ".join(ids)
                + (f" (partitions of {', '.join(partitioned)})" if partitioned else ""),
                received=repr(element_id),
                hint=f"name one of its partitions: {', '.join(parts)}"
                if parts
                else f"did you mean {guess!r}?"
                if guess
                else f"`fogshift status {record.name}` lists its elements",
            ) from None
