"""Migration and restore coordination: the orchestrator's side of the thesis's procedures
(:mod:`fogshift.migration`, :mod:`fogshift.restoration`), journaled step by step."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from fogshift.broker.client import last_seq
from fogshift.broker.exceptions import BrokerError
from fogshift.broker.naming import stream_name
from fogshift.common.text import one_line
from fogshift.contracts import (
    CheckpointManifest,
    GroupMigrationReport,
    GroupMigrationStatus,
    MigrationMode,
    MigrationReport,
    Offset,
    OperationKind,
    PipelineState,
    RestoreAttempt,
    RestorePhase,
    RestoreReport,
)
from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, Unavailable
from fogshift.migration.exceptions import MigrationFailed
from fogshift.migration.procedure import MigrationSteps
from fogshift.migration.procedure import migrate as run_migration
from fogshift.orchestrator.deployment import shared_node_warnings
from fogshift.orchestrator.exceptions import UnknownNode
from fogshift.orchestrator.planning import (
    nearest_first,
)
from fogshift.orchestrator.registry import PipelineRecord
from fogshift.orchestrator.scaling import Scaling
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.restoration.procedure import Copy, RestoreSteps
from fogshift.restoration.procedure import restore as run_restore
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.orchestrator")


#: A node's silence from which a refusal to restore a PE onto its own node says how long
#: the node has been silent (heartbeats come every second).
SILENT_SAID_S = 2.5


class Coordination(Scaling):
    """Live migration and restoration of a PE."""

    def _input_pending(self, pipeline: str, offset: Offset | None) -> bool:
        """Whether a PE's inputs hold anything beyond ``offset`` (stream sequences by input,
        as a JetStream reader's offset gives them); ``True`` where that cannot be told (a
        source's own input, no offset yet, a stream or the broker that does not answer)."""
        positions = (offset or {}).get("positions")
        if not positions:
            return True

        async def ends(js: Any) -> dict[str, int]:
            return {name: await last_seq(js, stream_name(pipeline, name)) for name in positions}

        try:
            last = self.broker.run(ends, timeout=10, again_if_closed=True)
        except Exception:  # (after the switch: unknown is waited for, never raised)
            return True
        return any(last[name] > int(at) for name, at in positions.items())

    def migrate(
        self,
        pipeline: str,
        element_id: str,
        target: str,
        mode: MigrationMode = MigrationMode.PRECOPY,
        *,
        group: str | None = None,
    ) -> MigrationReport:
        """Live-migrate a running PE to ``target`` (see :mod:`fogshift.migration.procedure`).

        ``group``: the group migration this move is part of (or moves back); ``None``: a
        single migration, asked of this PE, which supersedes the unfinished group
        migrations holding it that another orchestrator left (see
        :meth:`Registry.supersede_groups`) once it begins.

        Raises:
            UnknownPipeline / UnknownElement / UnknownNode: A name does not exist.
            InvalidInput: The PE already runs on ``target``.
            Conflict: The pipeline is not running.
            MigrationInProgress: Another migration of this PE is under way.
            Unavailable: ``target`` is not healthy.
            MigrationFailed: The procedure failed before its routing change and was rolled
                back (its report says whether the origin runs again, and under which epoch).
        """
        record = self.pipeline(pipeline)
        element = self._element(record, element_id)
        _refuse_stopped(record)
        self._refuse_current_node(record, element_id, target, "migrate")
        if mode == MigrationMode.HANDOVER:
            _refuse_handover(pipeline, element)
        self._usable_node(
            target, f"migrate {pipeline}/{element_id} to", record.placement[element_id]
        )
        with self._exclusive(pipeline, element_id, "migration"):
            # Afresh: a restore or migration that just ended may have moved the PE, a stop
            # that just ended stopped it.
            record = self.pipeline(pipeline)
            _refuse_stopped(record)
            self._refuse_current_node(record, element_id, target, "migrate")
            origin = record.placement[element_id]
            # (Again: the target's removal may have begun while this waited for the section.)
            self._usable_node(target, f"migrate {pipeline}/{element_id} to", origin)
            # The PE itself goes there: an instance cannot stand by for itself.
            self.drop_standby_on(pipeline, element_id, target)
            log.info("migrating %s/%s: %s -> %s (%s)", pipeline, element_id, origin, target, mode)
            op = self.registry.begin_operation(
                OperationKind.MIGRATION, pipeline, element_id, origin, target, self.run_id,
                "preparing",
            )  # fmt: skip
            if group is None:
                self._supersede_groups(
                    pipeline, element_id, f"a migration of {element_id} to {target}"
                )
            try:
                self.permissions.sync(self.registry)  # the target may read and, later, write
            except BrokerError as exc:
                # Nothing was asked of a node yet: ended here, not left unfinished (which
                # would refuse every operation on the PE until a recovery round, needing
                # the same broker, rolled back a migration that never began).
                self.registry.finish(op.id, "failed")
                raise Unavailable(
                    f"cannot migrate {pipeline}/{element_id} to {target}: the broker could "
                    f"not give {target} the PE's rights: {exc.message}",
                    hint=f"the PE runs on {origin} as before: try again once the broker answers",
                ) from exc
            steps = MigrationSteps(
                phase=partial(self._enter, op),
                route=partial(self._route, op),
                fence=partial(self._fence_for, op),
                bump=partial(self.registry.next_epoch, pipeline, element_id, operation=op.id),
                mark=partial(self._mark, pipeline, element_id),
                pending=partial(self._input_pending, pipeline),
            )
            try:
                report = run_migration(
                    pipeline, element, (origin, self.agent(origin)),
                    (target, self.agent(target)), mode=mode, steps=steps, epoch=op.epoch,
                    known=self.central.known_blobs(pipeline, element_id),
                    held=self.held_by(target, pipeline, element_id),
                )  # fmt: skip
            except MigrationFailed as exc:
                failed = exc.report
                rolled_back = isinstance(failed, MigrationReport) and failed.rolled_back
                if isinstance(failed, MigrationReport):
                    self.last_migration[(pipeline, element_id)] = failed
                self.registry.finish(op.id, "rolled_back" if rolled_back else "failed")
                raise
            # Anything else escaping the procedure leaves the entry unfinished: the next
            # reconcile round resolves it by its phase (see recover_operations).
            self.registry.finish(op.id, "migrated")
            if element.partition is not None:
                report.warnings += shared_node_warnings(
                    self.pipeline(pipeline), element.partition.of, target, element_id
                )
            self.last_migration[(pipeline, element_id)] = report
            self.plan_soon.set()
            # The origin's rights go now, not at the next reconcile round ("origin and
            # target until the handover").
            self.permissions.sync_quietly(self.registry)
        log.info("migrated %s/%s: %s, prepare %s", pipeline, element_id, report.phases_ms,
                 report.prepare_ms)  # fmt: skip
        return report

    def migrate_group(
        self,
        pipeline: str,
        element_ids: list[str],
        target: str,
        mode: MigrationMode = MigrationMode.PRECOPY,
        resume: str | None = None,
    ) -> GroupMigrationReport:
        """Move several PEs of a pipeline to ``target`` as one operation: one after another
        (each a live migration, exactly once), and if one fails, move back the ones that
        had moved, so that the pipeline runs as before. PEs on ``target`` already stay
        (``already_there``): the same group asked again after an orchestrator died in it
        moves the rest.

        Everything that can be checked before a PE moves is (names, duplicates, current
        nodes, the target's health): a refusal changes nothing.

        Args:
            resume: The journal entry of a group a dead orchestrator left, carried on here
                (:meth:`Reconciler.recover_groups`, which ends it, or keeps it to try again);
                ``None``: a new entry, which supersedes the unfinished ones of the pipeline
                that share a PE with it (what the user asks now is what stands).

        Raises:
            InvalidInput / UnknownElement / Unavailable: Refused before anything moved.
            Conflict: The pipeline is not running; nothing moved.
        """
        record = self.pipeline(pipeline)
        self.refuse_unless_running(
            record, f"cannot migrate elements {', '.join(element_ids)} of {pipeline!r}"
        )
        if not element_ids or len(set(element_ids)) != len(element_ids):
            raise InvalidInput(
                f"cannot migrate elements {element_ids} of pipeline {pipeline!r} together",
                expected="one or more distinct element ids",
                received=", ".join(element_ids) or "(none)",
                hint="e.g. --elements amplify,bandpass,classify",
            )
        for element_id in element_ids:
            element = self._element(record, element_id)
            if mode == MigrationMode.HANDOVER and record.placement[element_id] != target:
                _refuse_handover(pipeline, element)  # (one that stays is not handed over)
        there = [e for e in element_ids if record.placement[e] == target]
        if len(there) == len(element_ids):  # nothing to move (it named only the first)
            raise InvalidInput(
                f"every PE of {pipeline}/{{{','.join(element_ids)}}} already runs on node "
                f"{target!r}: nothing to migrate",
                expected=f"at least one PE not on {target!r}",
                received=", ".join(f"{e} on {target}" for e in element_ids),
                hint="choose another node (`fogshift nodes` lists them)",
            )
        self._usable_node(target, f"migrate {pipeline}/{','.join(element_ids)} to")
        # Journaled: one an orchestrator dies in is carried on by the next one's rounds
        # (``Reconciler.recover_groups``), as the same group asked again would be.
        if resume is None:
            group_id = self.registry.begin_group(
                pipeline, element_ids, target, mode, self.run_id,
                origins={e: record.placement[e] for e in element_ids},
            )  # fmt: skip
            earlier: dict[str, str] = {}
        else:  # (the PEs on the target that the dead orchestrator had moved there)
            group_id = resume
            began = self.registry.group_origins(resume)
            earlier = {e: began[e] for e in there if began.get(e, target) != target}
        outcome = "failed"
        try:
            report = self._move_pes(pipeline, element_ids, target, mode, there, group_id, earlier)
            outcome = report.status
            return report
        except FogshiftError as exc:
            outcome = f"refused: {one_line(exc.message)}"
            raise
        finally:
            if resume is None:  # (a carried-on entry is ended, or kept, by its carrier)
                self.registry.end_group(group_id, outcome)

    def _move_pes(
        self,
        pipeline: str,
        element_ids: list[str],
        target: str,
        mode: MigrationMode,
        there: list[str],
        group: str,
        earlier: dict[str, str],
    ) -> GroupMigrationReport:
        """:meth:`migrate_group`'s moves once it is checked and journaled as ``group``.

        Args:
            earlier: PEs of ``there`` the group had moved before (carried on for a dead
                orchestrator), each with the node it ran on as the group began: a failure
                moves them back there too, so that "rolled back" means the pipeline runs as
                before the group (they stayed on the target while the report said so)."""
        moved: list[MigrationReport] = []
        try:
            for element_id in (e for e in element_ids if e not in there):
                moved.append(self.migrate(pipeline, element_id, target, mode, group=group))
        except FogshiftError as exc:
            failed = getattr(exc, "report", None)
            if not moved and not isinstance(failed, MigrationReport):
                # Nothing was tried (another operation holds the first PE, its node went
                # away): the refusal as it is, as for one PE (a 200 "rolled back" said every
                # PE ran where it ran before while another migration moved it).
                raise
            forward = [*moved, failed] if isinstance(failed, MigrationReport) else moved
            undone, problems, already_back = [], [f"{exc.message}"], 0
            back = [(r.element, r.origin) for r in reversed(moved)]  # latest first
            back += [(e, earlier[e]) for e in reversed(element_ids) if e in earlier]
            for element_id, origin in back:
                if self.pipeline(pipeline).placement.get(element_id) == origin:
                    # Back already (its target's node was lost and the reconciler restored
                    # it there): "moving it back failed: already runs there" read as a
                    # failure of a group whose every PE ran where it ran before.
                    already_back += 1
                    continue
                try:
                    undone.append(self.migrate(pipeline, element_id, origin, mode, group=group))
                except FogshiftError as refused:
                    problems.append(f"moving {element_id} back failed: {refused.message}")
            # Rolled back only if the PE that failed runs where it ran too (its own
            # rollback may not have resumed it), not just the PEs moved before it.
            itself = not isinstance(failed, MigrationReport) or failed.rolled_back
            status = (
                GroupMigrationStatus.ROLLED_BACK
                if len(undone) + already_back == len(back) and itself
                else GroupMigrationStatus.FAILED
            )
            return self._group_report(
                pipeline, element_ids, target, mode, status, forward, undone, "; ".join(problems),
                there, self._stranded_hint(pipeline, element_ids, exc.hint),
            )  # fmt: skip
        return self._group_report(
            pipeline, element_ids, target, mode, GroupMigrationStatus.MIGRATED, moved, [], None,
            there,
        )  # fmt: skip

    def _stranded_hint(self, pipeline: str, element_ids: list[str], hint: str | None) -> str | None:
        """``hint`` (the failed move's), with what becomes of the group's PEs left on a node
        that is not up (a target lost mid-group): the failed move's hint spoke of its own PE
        only, and a PE moved before it, stranded there, went unsaid (it is restored once its
        node has been silent long enough)."""
        placement = self.pipeline(pipeline).placement
        stranded = []
        for element_id in element_ids:
            node = placement.get(element_id)
            record = self.registry.node(node) if node is not None else None
            if node is not None and (record is None or not self.healthy(record)):
                stranded.append(f"{element_id} on {node}")
        if not stranded:
            return hint
        said = (
            f"{', '.join(stranded)}, not up: restored elsewhere once silent for the "
            f"pipeline's recovery.detect_after_s (`fogshift restore {pipeline} ELEMENT` now)"
        )
        return f"{hint}; {said}" if hint else said

    def _group_report(
        self,
        pipeline: str,
        element_ids: list[str],
        target: str,
        mode: MigrationMode,
        status: GroupMigrationStatus,
        migrations: list[MigrationReport],
        undone: list[MigrationReport],
        error: str | None,
        already_there: list[str],
        hint: str | None = None,
    ) -> GroupMigrationReport:
        placement = self.pipeline(pipeline).placement
        return GroupMigrationReport(
            pipeline=pipeline,
            elements=element_ids,
            target=target,
            mode=mode,
            status=status,
            migrations=migrations,
            undone=undone,
            error=error,
            placement={e: placement[e] for e in element_ids},
            already_there=already_there,
            hint=hint,
        )

    def _supersede_groups(self, pipeline: str, element_id: str, by: str) -> None:
        """End the unfinished group migrations other orchestrators left that hold the PE:
        a migration or restore the user asks of it now is what stands (a carry-on of such
        a group moved the PE back to the group's target)."""
        for group_id in self.registry.supersede_groups(pipeline, element_id, by, self.run_id):
            log.warning("group migration %s of %s is not carried on: superseded by %s",
                        group_id, pipeline, by)  # fmt: skip

    def _refuse_current_node(
        self, record: PipelineRecord, element_id: str, node: str, what: str
    ) -> None:
        """Refuse to ``what`` (migrate, restore) a PE onto the node it is placed on.

        Raises:
            InvalidInput: ``node`` is the PE's placement; nothing was changed.
        """
        if record.placement[element_id] != node:
            return
        found = self.registry.node(node)
        if found is not None and self.healthy(found):
            message = f"{record.name}/{element_id} already runs on node {node!r}"
            also = "; a PE missing from its healthy node is started there again by the reconciler"
            silent = time.time() - found.last_seen
            if silent >= SILENT_SAID_S:
                # (Just killed, a node is healthy until its timeout: "already runs" read as
                # wrong, and the hint as if nothing were to be done.)
                message += f" (last heard {silent:.1f} s ago)"
                also = (f"; if {node!r} is down, its PEs are restored elsewhere once it has "
                        "been silent for the pipeline's recovery.detect_after_s (`fogshift "
                        "nodes` shows it), or restore it now without --to")  # fmt: skip
        else:  # (it does not run: its node is silent, or gone)
            message = f"{record.name}/{element_id} is placed on node {node!r}, which is not up"
            also = "; a node that comes back starts its PEs there again by itself"
        raise InvalidInput(
            f"{message}: cannot {what} it there",
            expected="a node other than " + repr(node),
            received=repr(node),
            hint=(
                "choose another node (`fogshift nodes` lists them)"
                if what == "migrate"
                else "restore it on another node, or leave --to out" + also
            ),
        )

    def restore_candidates(self, pipeline: str, element_id: str, exclude: set[str]) -> list[str]:
        """Healthy, ready nodes outside ``exclude`` and not being removed, none silent for
        longer than the pipeline declares a node lost after, best first
        (:meth:`best_nodes`: room on disk, the PE's planned redeploy node, fewest instances).

        (A pipeline may declare nodes lost sooner than the orchestrator calls them
        unhealthy: ``recovery.detect_after_s`` from 2 s, ``node_timeout_s`` 5 s. A node
        lost to the pipeline but still "healthy" was a candidate: a PE restored there was
        restored away from it the next round, fenced at every move.)"""
        record = self.registry.get_pipeline(pipeline)
        lost_after = record.spec.recovery.detect_after_s if record is not None else math.inf
        now = time.time()
        exclude = exclude | self.leaving_nodes()  # (see Standbys.remove_node)
        candidates = [
            n
            for n in self.registry.nodes()
            if n.name not in exclude
            and self.healthy(n)
            and n.report.ready
            and now - n.last_seen <= lost_after
        ]
        return self.best_nodes(candidates, pipeline, element_id)

    @contextmanager
    def _choosing(
        self, pipeline: str, element_id: str, exclude: set[str]
    ) -> Iterator[tuple[list[str], Callable[[str], None]]]:
        """:meth:`restore_candidates`, and the node being tried counted by :meth:`load`
        while the block runs (the restore's attempts, its placement written): restores
        running at once (the reconciler's, one thread each) are spread as one after the
        other were. The first candidate is counted from the start; the block's function
        moves the count to the candidate it tries next."""

        def trying(name: str) -> None:
            with self._lock:
                self._restoring_pe[(pipeline, element_id)] = name

        with self._lock:  # (ranked and reserved at once: the next one sees it)
            candidates = self.restore_candidates(pipeline, element_id, exclude)
            if candidates:
                trying(candidates[0])
        try:
            yield candidates, trying
        finally:
            if candidates:  # (tried one, its own entry: none else of this PE runs at once)
                with self._lock:
                    self._restoring_pe.pop((pipeline, element_id), None)

    def checkpoint_copies(
        self, pipeline: str, element_id: str, target: str
    ) -> Callable[[CheckpointManifest], list[Copy]]:
        """Where ``target`` can copy a checkpoint of the PE from, nearest first (by the fog
        topology's route bandwidth): replicas on healthy nodes, then the central store."""

        def copies(manifest: CheckpointManifest) -> list[Copy]:
            holders: dict[str, str] = {}
            for n in self.registry.nodes():
                held = {
                    r.checkpoint
                    for r in n.report.replicas
                    if (r.pipeline, r.element) == (pipeline, element_id)
                }
                # Another node helps only with this very checkpoint; the target's own copy,
                # even an older one, saves every file the two have in common.
                this = (manifest.id, manifest.created) in held
                if self.healthy(n) and (this or (held and n.name == target)):
                    holders[n.name] = n.url
            if self._topology is None:
                order = [*sorted(holders, key=lambda n: n != target), "central"]
            else:
                order = nearest_first(self._topology, target, sorted(holders), self._central)
            # The target's own copy needs no source of its own: what it lacks comes from
            # the central store.
            return [
                ("central", None)
                if name == "central"
                else (f"replica@{name}", None if name == target else holders[name])
                for name in order
            ]

        return copies

    def restore(
        self, pipeline: str, element_id: str, target: str | None = None, *,
        lost: str | None = None,
    ) -> RestoreReport:  # fmt: skip
        """Restore a PE from its central checkpoint on ``target``, or on the best healthy node.

        ``lost``: restore only if the PE is still placed on that node (the reconciler's
        automatic restore, which saw the node silent before it took the PE's exclusive
        section: an operation that moved the PE meanwhile would otherwise be undone, its
        healthy instance fenced).

        Without ``target`` a failed attempt (the chosen node died or failed during the
        restore) is retried on the next candidate; every attempt fences the previous ones
        with a new epoch. The report's ``attempts`` lists the failed attempts. Each attempt
        is journaled (see :meth:`recover_operations`).

        ``target`` may not be the node the PE is placed on: that is refused before anything
        changes (nothing is fenced or discarded).

        A PE with a hot standby on a healthy node (and no ``target``, or the standby's node as
        ``target``) is taken over by it: fence, lift its cap (see
        :mod:`fogshift.restoration.standby`); if that fails, the standby is dropped and the
        PE restored from its checkpoint as below.

        A restore naming its ``target`` (the user's) supersedes the unfinished group
        migrations holding the PE that another orchestrator left, as a single migration
        does (see :meth:`migrate`).

        If every attempt fails while the PE's own node is healthy, the PE is started again
        there — from its own checkpoint, under a newer epoch than every attempt's — so it
        never stays fenced with nobody writing; the error says so.

        Raises:
            UnknownPipeline / UnknownElement / UnknownNode: A name does not exist.
            InvalidInput: ``target`` is the node the PE is placed on.
            Unavailable: The target (or, without one, every candidate) is not healthy.
            MigrationInProgress: Another migration or restore of this PE is under way.
            RestoreFailed: Every attempt failed; the report lists them. Retry elsewhere.
        """
        record = self.pipeline(pipeline)
        element = self._element(record, element_id)
        if target is not None:
            self._refuse_current_node(record, element_id, target, "restore")
            self._usable_node(
                target, f"restore {pipeline}/{element_id} on", record.placement[element_id]
            )
        with self._exclusive(pipeline, element_id, "restore"):
            # Afresh: a migration or restore that just ended may have moved the PE, a
            # scale changed its inputs.
            record = self.pipeline(pipeline)
            element = self._element(record, element_id)
            if record.status != PipelineState.RUNNING:
                raise Conflict(  # (a state that forbids it: exit 1, as a stop's or delete's)
                    f"pipeline {pipeline!r} is {record.status}, not running",
                    expected="a running pipeline",
                    received=f"pipeline {pipeline!r} {record.status}",
                    hint="only a running pipeline's PEs are restored; `fogshift start "
                    f"{pipeline}` starts a stopped one again where it stopped",
                )
            current = record.placement[element_id]
            if lost is not None and current != lost:
                raise Conflict(
                    f"{pipeline}/{element_id} is not restored from node {lost!r}: it was "
                    f"moved to {current!r} meanwhile",
                    expected=f"{pipeline}/{element_id} placed on {lost!r}",
                    received=f"placed on {current!r}",
                    hint="nothing to do: another operation moved it",
                )
            if target is not None:  # (the user's, naming where: the reconciler's name none)
                self._supersede_groups(
                    pipeline, element_id, f"a restore of {element_id} on {target}"
                )
            attempts: list[RestoreAttempt] = []
            standby = self.registry.standby(pipeline, element_id)
            if (
                standby is not None
                and standby.node != current
                and target in (None, standby.node)
                and self._may_keep(self.registry.node(standby.node))
            ):
                try:
                    return self.promote_standby(element, pipeline, current, standby)
                except RestoreFailed as exc:
                    log.warning("restore of %s/%s: %s; restoring from its checkpoint",
                                pipeline, element_id, exc.message)  # fmt: skip
                    # Failed once it fenced (the report keeps the epoch then), the primary
                    # may be fenced: with no other node, it must run again in place.
                    fenced = exc.report.epoch if isinstance(exc.report, RestoreReport) else 0
                    attempts.append(RestoreAttempt(node=standby.node, epoch=fenced or None,
                                                   error=exc.message))  # fmt: skip
            try:
                # (In the try: refused after a standby's promotion that fenced the primary
                # and failed, the PE must still run again in place, its rights given back.)
                if target is not None:
                    self._refuse_current_node(record, element_id, target, "restore")
                    # (Again: its removal may have begun while this waited for the section.)
                    self._usable_node(target, f"restore {pipeline}/{element_id} on", current)
                    return self._restore_on(element, pipeline, current, [target], attempts)
                with self._choosing(pipeline, element_id, {current}) as (candidates, trying):
                    if not candidates:
                        raise Unavailable(
                            f"no healthy node to restore {pipeline}/{element_id} on "
                            f"(it was on {current!r})",
                            hint="`fogshift nodes` shows node health; start a node or wait",
                        )
                    return self._restore_on(
                        element, pipeline, current, candidates, attempts, trying
                    )
            except FogshiftError as exc:
                # The attempts are finished: the node the PE stays on may use its streams
                # again (each attempt took its rights; it waited for the next round).
                self.permissions.sync_quietly(self.registry)
                if not any(a.epoch is not None for a in attempts):
                    raise  # nothing was fenced: the PE runs as it did
                epoch = self._restart_in_place(pipeline, element, current)
                if epoch is None:
                    raise
                failed = exc.report if isinstance(exc, RestoreFailed) else None
                if isinstance(failed, RestoreReport):
                    failed.fallback = f"restarted on {current} under epoch {epoch}"
                    self.last_restore[(pipeline, element_id)] = failed
                again = type(exc)(
                    f"{exc.message}; {pipeline}/{element_id} runs again on {current} (its own "
                    f"node, from its own checkpoint) under epoch {epoch}",
                    expected=exc.expected,
                    received=exc.received,
                    hint=exc.hint,
                )
                if isinstance(again, RestoreFailed):
                    again.report = failed
                raise again from exc

    def _restore_on(
        self,
        element: ElementSpec,
        pipeline: str,
        current: str,
        candidates: list[str],
        attempts: list[RestoreAttempt],
        trying: Callable[[str], None] | None = None,
    ) -> RestoreReport:
        """The attempts of :meth:`restore`, in its exclusive section; failed ones are added
        to ``attempts`` (with the epoch they fenced with). ``trying`` is told each node as
        it is tried (:meth:`_choosing`)."""
        element_id = element.id
        for name in candidates:
            if trying is not None:
                trying(name)
            node = self.registry.node(name)
            if node is None:  # (removed from the cluster since it was chosen)
                attempts.append(RestoreAttempt(node=name, error="not in the cluster: skipped"))
                continue
            if attempts and not self.healthy(node):
                attempts.append(RestoreAttempt(node=name, error="not healthy any more: skipped"))
                continue
            # Before the attempt takes a new epoch and fences: an instance left on the node
            # (a migration's origin it could not remove, an attempt's it could not discard)
            # refused the install only after the PE was fenced, and a healthy PE was
            # restarted for nothing.
            leftover = self._leftover_on(name, pipeline, element_id)
            if leftover is not None:
                attempts.append(RestoreAttempt(node=name, error=leftover))
                if name == candidates[-1]:
                    raise Conflict(
                        f"cannot restore {pipeline}/{element_id} on {name!r}: {leftover}",
                        expected=f"a node that runs no instance of {pipeline}/{element_id}",
                        received="; ".join(f"{a.node}: {a.error}" for a in attempts),
                        hint="the reconciler removes an instance from a node it is not "
                        "placed on: retry in a few seconds, or restore on another node",
                    )
                continue
            try:
                op = self.registry.begin_operation(
                    OperationKind.RESTORE, pipeline, element_id, current, name, self.run_id,
                    RestorePhase.FENCING, new_epoch=True,
                )  # fmt: skip
            except UnknownNode as exc:  # removed from the cluster just now: the next one
                attempts.append(RestoreAttempt(node=name, error=exc.message))
                continue
            self.permissions.sync_quietly(self.registry)  # the target may write, nobody else
            log.info("restoring %s/%s on %s (epoch %d)", pipeline, element_id, name, op.epoch)
            try:
                self._test_pause("restore:fencing")
                report = run_restore(
                    pipeline, element, op.epoch, (name, self.agent(name)), self.central,
                    self.broker, copies=self.checkpoint_copies(pipeline, element_id, name),
                    steps=RestoreSteps(phase=partial(self._enter, op)),
                )  # fmt: skip
            except RestoreFailed as exc:
                self.registry.finish(op.id, "failed")
                failed = exc.report
                attempts.append(RestoreAttempt(node=name, epoch=op.epoch, error=exc.message))
                if isinstance(failed, RestoreReport):
                    failed.attempts = list(attempts)
                    self.last_restore[(pipeline, element_id)] = failed
                if name == candidates[-1]:
                    raise
                tried = (pipeline, element_id, name)
                if self._attempts_said.get(tried) == exc.message:
                    # (The same reason each round of an automatic restore's back-off.)
                    log.info("restore of %s/%s on %s failed again, as before; trying the "
                             "next node", *tried)  # fmt: skip
                else:
                    log.warning("restore of %s/%s on %s failed; trying the next node: %s",
                                *tried, exc.message)  # fmt: skip
                    self._attempts_said[tried] = exc.message
                continue
            for tried in list(self._attempts_said):  # (a copy: other PEs' restores run)
                if tried[:2] == (pipeline, element_id):
                    self._attempts_said.pop(tried, None)
            report.attempts = attempts
            self.registry.route(op.id, name)
            self.registry.finish(op.id, "restored")
            self.last_restore[(pipeline, element_id)] = report
            self.plan_soon.set()
            log.info("restored %s/%s: %s", pipeline, element_id, report.model_dump(mode="json"))
            return report
        raise Unavailable(  # every candidate became unhealthy before its turn
            f"no healthy node left to restore {pipeline}/{element_id} on",
            received="; ".join(f"{a.node}: {a.error}" for a in attempts),
            hint="`fogshift nodes` shows node health",
        )

    def _leftover_on(self, node: str, pipeline: str, element_id: str) -> str | None:
        """Why ``node`` cannot take a restore of the PE: it runs an instance of it (its
        agent refuses to install a checkpoint under it); ``None`` if it runs none, or its
        agent does not answer (the attempt then finds out for itself)."""
        try:
            hosted = self.agent(node).get("/elements")
        except FogshiftError:
            return None
        for info in hosted if isinstance(hosted, list) else []:
            if (info.get("pipeline"), info.get("element")) == (pipeline, element_id):
                return f"it still runs an instance of the PE ({info.get('state', 'in some state')})"
        return None

    def _restart_in_place(self, pipeline: str, element: ElementSpec, node: str) -> int | None:
        """Start ``element`` again on ``node``, its placement, under a new epoch.

        After failed restore attempts its instance there was fenced (and an attempt's
        instance elsewhere may still write under the epoch it got): a new epoch above all of
        them, a fence marker for it, then the instance is stopped and started again from its
        own checkpoint under it. Inside the PE's exclusive section.

        Returns:
            The new epoch, or ``None`` if ``node`` is not healthy or did not take it (logged;
            the reconciler starts it under the newest epoch once the node can).
        """
        record = self.registry.node(node)
        if record is None or not self.healthy(record) or not record.report.ready:
            log.warning("restore of %s/%s failed everywhere and its node %s is not healthy: "
                        "left to the reconciler", pipeline, element.id, node)  # fmt: skip
            return None
        try:
            epoch = self._restart_fenced(pipeline, element, node)
        except FogshiftError as exc:
            log.warning("restore of %s/%s failed everywhere; restarting it on %s failed too "
                        "(left to the reconciler): %s", pipeline, element.id, node,
                        exc.message)  # fmt: skip
            return None
        log.warning("restore of %s/%s failed everywhere: restarted on its node %s under "
                    "epoch %d", pipeline, element.id, node, epoch)  # fmt: skip
        return epoch


def _refuse_handover(pipeline: str, element: ElementSpec) -> None:
    """A handover runs two instances side by side: only for a PE whose every output the
    broker holds, idempotent by input position (with several inputs, by logged cut).

    Raises:
        InvalidInput: A sink (it writes outside the broker: two instances would both write).
    """
    if element.role == "sink":
        raise InvalidInput(
            f"{pipeline}/{element.id} cannot be handed over: a sink writes outside the broker",
            expected="a source or a processor for --mode handover",
            received=f"{element.kind} with inputs {list(element.inputs)}",
            hint="use --mode precopy (the default) for it",
        )


def _refuse_stopped(record: PipelineRecord) -> None:
    """Refuse to migrate a PE of a pipeline that is not running.

    Raises:
        Conflict: It is not (a state that forbids it, not a bad request).
    """
    if record.status != PipelineState.RUNNING:
        raise Conflict(
            f"pipeline {record.name!r} is {record.status}, not running",
            expected="a running pipeline",
            received=f"pipeline {record.name!r} {record.status}",
            hint=f"only running pipelines can be migrated; `fogshift start {record.name}` "
            "starts a stopped one again where it stopped (`fogshift deploy SPEC --fresh`: "
            "over, its state and its sinks' files empty)",
        )
