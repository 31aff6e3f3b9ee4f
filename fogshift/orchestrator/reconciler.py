"""Keeping the cluster as specified: resolving operations a dead orchestrator left unfinished,
restarting missing PEs, restoring those of lost nodes, removing strays."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from nats.js.errors import NotFoundError

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.client import ensure_subjects, pipeline_streams
from fogshift.broker.exceptions import BrokerError, BrokerUnavailable
from fogshift.broker.naming import stream_name
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.common.text import one_line
from fogshift.contracts import (
    LEFT_REPORTED,
    CheckpointManifest,
    ElementProgress,
    MigrationMode,
    MigrationPhase,
    OperationKind,
    PEState,
    PipelineState,
    PipelineStatus,
    RestoreAttempt,
    RestoreReport,
)
from fogshift.exceptions import Conflict, FogshiftError, Unavailable
from fogshift.migration.exceptions import MigrationInProgress
from fogshift.migration.procedure import roll_back as run_rollback
from fogshift.orchestrator.coordination import Coordination
from fogshift.orchestrator.locks import element_lock_of
from fogshift.orchestrator.registry import (
    GroupEntry,
    NodeRecord,
    Operation,
    PipelineRecord,
    ScaleEntry,
)
from fogshift.orchestrator.scaling import stale_inputs
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.spec.exceptions import InvalidSpec
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.orchestrator")

#: How long a scale carried on after its orchestrator died waits before it is tried again
#: when a node or the broker was away, doubling up to the second.
SCALE_RETRY_S, SCALE_RETRY_MAX_S = 5.0, 120.0
#: What holds up a scale carried on for a while, not for good: a node or the broker away,
#: its element or a PE of it held by another operation or round (``Conflict``, which
#: ``MigrationInProgress`` is).
SCALE_HELD_UP = (Unavailable, BrokerError, Conflict)

#: An instance of a stopped pipeline counts as left running only in a heartbeat that came
#: this long after the stop (one sent before the stop's removal may arrive after it).
STOPPED_HEARD_S = 2.0
#: An instance in one of these states never writes again by itself: placed, under the PE's
#: newest epoch, with no operation under way, it is started again (:meth:`Reconciler._mend`).
HALTED = (PEState.FENCED, PEState.STOPPED)
#: A PE whose restart failed is tried again after twice as many reconcile rounds each time,
#: at most this long apart: each try fences anew (a new epoch, a fence marker in its
#: stream), and a node that refuses the start every round grew the stream and the epochs
#: by one every round, for as long as it refused.
RESTART_BACKOFF_MAX_S = 60.0
#: The decision a restore's journal entry ends with when the recovery restarts it (the
#: restart's own entry follows it, unless the restart failed or this process died first).
RESTARTED = "restarted: the attempt's leftovers on the target were discarded"


def _carry(
    carry: Callable[[Any], list[str]], entry: Any, background: bool, name: str, what: str
) -> list[str]:
    """``carry(entry)`` here (its decisions), or in a thread called ``name`` (that ``what``
    is carried on): an operation a dead orchestrator left, taken up by a reconcile round."""
    if not background:
        return carry(entry)
    threading.Thread(target=carry, args=(entry,), name=name, daemon=True).start()
    return [f"{what}: carried on"]


def _try_again_later(
    retries: dict[str, tuple[float, float]], key: str, what: str, exc: FogshiftError
) -> None:
    """Put off the entry ``key`` held up by ``exc``: its next try after a pause doubling
    from :data:`SCALE_RETRY_S` up to :data:`SCALE_RETRY_MAX_S` (in ``retries``)."""
    retry = retries.get(key)
    wait = min(2 * retry[1], SCALE_RETRY_MAX_S) if retry else SCALE_RETRY_S
    retries[key] = (time.monotonic() + wait, wait)
    log.warning("recovery: %s is tried again in %.0f s: %s", what, wait, exc.render())


class Reconciler(Coordination):
    """Recovery of unfinished operations and the reconcile loop."""

    def recover_operations(self, background: bool = False) -> list[str]:
        """Resolve every migration and restore left unfinished by an orchestrator that died.

        An entry is unfinished and nobody runs it when its PE's exclusive section is free
        (an operation of this process holds it from its first journal entry to its outcome).
        Each is resolved by the phase it had reached:

        * a migration before its routing change is rolled back: the target instance is
          discarded and the origin resumed (fenced under a new epoch and restarted if the
          target cannot be discarded);
        * a migration after it is completed: the target's gate is opened, the origin removed;
        * a restore whose target runs under the entry's epoch (and nothing newer exists) is
          carried on: the target's gate opens and the placement moves to it (a standby's
          promotion, whose epoch is above the PE's until then, fences the stream first);
        * any other restore is restarted (what its attempt left on the target is discarded):
          the PE ends up running under a newer epoch — if no node takes it and its own node
          is alive, it is started again there (see :meth:`restore`). A restart that fails
          is tried again, after a growing pause, while the PE's node is away
          (:meth:`restores_owed`).

        Each decision is logged. An entry whose resolution fails is retried next round.

        Args:
            background: Restart each restore in a thread of its own (as
                :meth:`reconcile_once`'s lost PEs): a restore waits minutes for a target to
                catch up, and the round, done one after the other, noticed no lost node
                meanwhile.

        Returns:
            The decisions taken, one line each.
        """
        decisions: list[str] = []
        left = self.registry.unfinished()
        if not left:
            return decisions
        try:
            # The broker's rights first: each entry's target may write the PE's records
            # (a standby's node may not, until its promotion gives it the PE), and what
            # a resolution opens must find them.
            self.permissions.sync(self.registry)
        except FogshiftError as exc:
            log.warning("recovery waits for the broker's rights: %s", exc.render())
            return decisions
        for op in left:
            restart = False
            try:
                with self._exclusive(op.pipeline, op.element, "recovery"):
                    current = self.registry.operation(op.id)
                    if current is None or current.outcome is not None:
                        continue  # resolved meanwhile
                    decision, restart = self._recover(current)
                    self.registry.finish(op.id, f"recovered: {decision}")
                    # The PE's kept report is an earlier operation's: shown, it would pass
                    # for this one's outcome (which the journal holds: `GET .../operation`).
                    kept = (self.last_migration if op.kind == OperationKind.MIGRATION
                            else self.last_restore)  # fmt: skip
                    kept.pop((op.pipeline, op.element), None)
            except MigrationInProgress:
                continue  # an operation of this process runs: it owns the entry
            except FogshiftError:
                continue  # logged by _exclusive; the entry stays for the next round
            except Exception:
                # One entry's unforeseen trouble must not end the round before the PEs
                # are reconciled: it stays for the next round.
                log.exception("recovery of %s %s of %s/%s failed", op.kind, op.id,
                              op.pipeline, op.element)  # fmt: skip
                continue
            line = (f"{op.kind} {op.id} of {op.pipeline}/{op.element} {op.origin} -> "
                    f"{op.target} (epoch {op.epoch}), left at {op.phase!r} by orchestrator "
                    f"{op.owner}: {decision}")  # fmt: skip
            log.warning("recovery: %s", line)
            decisions.append(line)
            if restart:
                self._restart_restore(op.pipeline, op.element, background=background)
        return decisions

    def _restart_restore(
        self,
        pipeline: str,
        element_id: str,
        pause: float = 0.0,
        stranded: str | None = None,
        background: bool = False,
    ) -> None:
        """Restart the restore of ``pipeline/element_id`` a dead orchestrator left; if it
        fails, owe it (:meth:`restores_owed`): tried again after twice ``pause``, or next
        round if another operation held the PE (a round's hold is brief), as long as the PE
        stays placed on ``stranded`` (default: where it is placed now). Only away from
        there: an operation that placed it elsewhere since the restart was decided (a
        user's, waiting for the PE's section) is not undone. ``background``: in a thread
        of its own, as one of the orchestrator's rounds."""
        key = (pipeline, element_id)
        if stranded is None:
            record = self.registry.get_pipeline(pipeline)
            stranded = None if record is None else record.placement.get(element_id)
        if background:
            self._restoring_in_thread(key, f"restore {pipeline}/{element_id}",
                                      self._restart_restore_threaded, pipeline, element_id,
                                      pause, stranded)  # fmt: skip
            return
        try:
            self.restore(pipeline, element_id, lost=stranded)
        except Exception as exc:
            record = self.registry.get_pipeline(pipeline)
            if stranded is None or record is None or record.placement.get(element_id) != stranded:
                self._restores_owed.pop(key, None)  # (placed elsewhere since: nothing owed)
                return
            if isinstance(exc, MigrationInProgress):
                self._restores_owed[key] = (time.monotonic(), pause, stranded)
                return
            pause = min(RESTART_BACKOFF_MAX_S, max(2 * pause, self.config.reconcile_s))
            self._restores_owed[key] = (time.monotonic() + pause, pause, stranded)
            if isinstance(exc, FogshiftError):
                log.warning("recovery: restarting the restore of %s/%s failed (again in "
                            "%.0f s while %s is away): %s", pipeline, element_id, pause,
                            stranded, exc.render())  # fmt: skip
            else:
                log.exception("recovery: restarting the restore of %s/%s failed (again in "
                              "%.0f s while %s is away)", pipeline, element_id, pause,
                              stranded)  # fmt: skip
        else:
            self._restores_owed.pop(key, None)

    def _restart_restore_threaded(
        self, pipeline: str, element_id: str, pause: float, stranded: str | None
    ) -> None:
        """:meth:`_restart_restore` in a thread of its own (what it raises is logged)."""
        try:
            with self._as_round():
                self._restart_restore(pipeline, element_id, pause, stranded)
        except Exception:
            log.exception("recovery: restarting the restore of %s/%s failed", pipeline,
                          element_id)  # fmt: skip
        finally:
            with self._lock:
                self._auto_restoring.discard((pipeline, element_id))

    def restores_owed(self, background: bool = False) -> None:
        """Restart again each restore a dead orchestrator left whose restart failed
        (:meth:`_restart_restore`), once its pause is over.

        The journal entry is resolved once the restart is decided, so a restart that failed
        (no healthy node yet after the whole cluster came back, say) was only logged, and
        the PE stayed on its dead node unless its recovery is automatic. One is owed no more
        once its PE is placed elsewhere (someone restored or moved it), its node is heard
        from again (the reconciler starts it there if it does not run), its pipeline no
        longer runs, or its recovery is automatic or its node was removed (the reconciler
        restores it).

        The debt is this process's memory: at its first call, each restore the journal
        says the recovery restarted, and that has not succeeded since, is owed again
        (:meth:`_owed_by_journal`). ``background``: as :meth:`recover_operations`'."""
        if not self._owed_read:
            self._owed_read = True
            self._owed_by_journal()
        for key, (due, pause, stranded) in list(self._restores_owed.items()):
            if time.monotonic() < due:
                continue
            pipeline, element_id = key
            record = self.registry.get_pipeline(pipeline)
            node = None if record is None else record.placement.get(element_id)
            here = None if node is None else self.registry.node(node)
            if (
                record is None
                or record.status != PipelineState.RUNNING
                or record.spec.recovery.auto
                or node != stranded
                or self.removed(node)  # (the reconciler restores it, as an automatic one)
                or (here is not None and self.healthy(here) and self.broken(here) is None)
            ):
                # (pop: a restart in a thread may have dropped it meanwhile)
                self._restores_owed.pop(key, None)
                continue
            self._restart_restore(pipeline, element_id, pause, stranded, background)

    def _owed_by_journal(self) -> None:
        """Owe each restore the recovery restarted whose restart never succeeded: the PE's
        newest journal entries are that restart, then only failed restores (its tries
        while it was owed), and nothing moved it since — it is placed where that restore
        began, under the newest entry's epoch, its pipeline's status unchanged since (a
        stop, a start or a deploy adds no entry). An orchestrator that died between deciding
        the restart and its entry, or while it was owed, left the PE on its dead node for
        good if its recovery is not automatic. Due once a node's silence can be judged (a
        node that came back is heard by then: owed nothing)."""
        journal: dict[tuple[str, str], list[Operation]] = {}
        for op in self.registry.operations():
            journal.setdefault((op.pipeline, op.element), []).append(op)
        due = time.monotonic() + self.config.node_timeout_s
        for key, ops in journal.items():
            if key in self._restores_owed:
                continue
            newest = ops[-1]
            tries = list(itertools.takewhile(
                lambda op: op.kind == OperationKind.RESTORE and op.outcome == "failed",
                reversed(ops),
            ))  # fmt: skip
            restarted = ops[-1 - len(tries)] if len(tries) < len(ops) else None
            if (
                restarted is None
                or restarted.kind != OperationKind.RESTORE
                or restarted.outcome != f"recovered: {RESTARTED}"
            ):
                continue
            record = self.registry.get_pipeline(newest.pipeline)
            if (
                record is None
                or record.placement.get(newest.element) != restarted.origin
                or self.registry.epoch(*key) != newest.epoch
                or record.status_since > newest.updated
            ):
                continue
            log.info("recovery: the restore of %s/%s an earlier orchestrator restarted did "
                     "not succeed: owed (its node %s)", *key, restarted.origin)  # fmt: skip
            self._restores_owed[key] = (due, 0.0, restarted.origin)

    def recover_pipelines(self) -> list[str]:
        """Finish what an orchestrator that died left of a deploy or a stop.

        A pipeline is ``deploying`` or ``stopping`` only while a deploy or stop of this
        process holds its lock (both run under :meth:`pipeline_lock`): found so with the
        lock free, it was left by an orchestrator that died mid-way, its PEs supervised by
        nobody, and every deploy under its name refused as "already deploying" until a
        ``stop``. A stop is completed (every node asked again: stopping is idempotent). A
        deploy ends as one that fails does: the PEs it may have started are removed and
        the pipeline is ``failed`` (deploy it again: its streams are made anew).

        A node that is not healthy is not asked (a partitioned one would hold the round for
        the request's timeout per PE); it and one that does not answer keep their instances
        until they are heard again: :meth:`_remove_strays` then stops them, as it does every
        instance of a stopped or failed pipeline.

        Returns:
            The decisions taken, one line each.
        """
        decisions: list[str] = []
        for record in self.registry.pipelines():
            if record.status not in (PipelineState.DEPLOYING, PipelineState.STOPPING):
                continue
            lock = self.pipeline_lock(record.name)
            if not lock.acquire(blocking=False):
                continue  # this process's deploy or stop of it runs
            try:
                current = self.registry.get_pipeline(record.name)
                if current is None or current.status != record.status:
                    continue  # ended meanwhile
                if current.status == PipelineState.STOPPING:
                    # "stopped" with a node away too (as a stop then is).
                    away = self._stop_pipeline(current.name, heard_only=True).unreachable_nodes
                    decision = "stopped"
                else:
                    away = sorted({
                        e.node for e in current.spec.elements
                        if not (self._heard(e.node) and self._remove_quietly(current.name, e))
                    })  # fmt: skip
                    self.registry.set_status(
                        current.name,
                        PipelineState.FAILED,
                        "its deploy was left half-way (the orchestrator running it stopped)",
                    )
                    self.permissions.sync_quietly(self.registry)
                    decision = "failed, the PEs it had started removed; deploy it again"
                if away:
                    decision += f" (not reached: {', '.join(away)}; their instances are "
                    decision += "stopped once they are heard again)"
            except Exception:
                # One pipeline's unforeseen trouble must not end the round before the PEs
                # are reconciled: it is tried again next round.
                log.exception("recovery of pipeline %s (%s) failed", record.name, record.status)
                continue
            finally:
                lock.release()
            line = (f"pipeline {record.name} left {record.status} by an orchestrator that "
                    f"died: {decision}")  # fmt: skip
            log.warning("recovery: %s", line)
            decisions.append(line)
        return decisions

    def recover_scales(self, background: bool = False) -> list[str]:
        """Carry on every scale an orchestrator that died left unfinished.

        A scale holds its element's key-move lock from its journal entry to its end, so an
        entry found with that lock free was left by a process that died. The same scale
        again completes it, whatever step it had reached (added partitions placed or not,
        the rescale record stored or not, retiring partitions removed or not): each step
        does only what is missing. An entry of a stopped pipeline waits for it to run again
        (``start``); one of a pipeline that no longer runs otherwise, or of an element no
        longer partitioned, is abandoned (a failed or fresh deploy ends the pipeline's
        entries as well). One refused, or ``pending`` after its wait, ends with
        that outcome (logged; `fogshift scale` again sees to it) — but a scale-in whose
        rescale stands and whose partitions are not retired yet, which stays open. One a
        node or the broker was away for, or whose element or PEs something else held (a key
        move, a standby's start, an operation not yet resolved), stays, and is tried again
        after a pause that grows.

        Args:
            background: Carry each on in a thread of its own (the reconciler's rounds: a
                scale's steps wait for commits, up to ``timeout_s`` each, which must not
                hold up restoring lost nodes' PEs); else here, one after the other.

        Returns:
            One line per entry: its decision, or (``background``) that it is carried on.
        """
        decisions: list[str] = []
        unfinished = self.registry.unfinished_scales()
        for gone in set(self._scale_retries) - {e.id for e in unfinished}:
            # Ended by someone else meanwhile (its carry-on thread may drop it too).
            self._scale_retries.pop(gone, None)
        stopped = {r.name for r in self.registry.pipelines()
                   if r.status in (PipelineState.STOPPING, PipelineState.STOPPED)}  # fmt: skip
        for entry in unfinished:
            if entry.pipeline in stopped:
                continue  # carried on once it runs again (`fogshift start`)
            retry = self._scale_retries.get(entry.id)
            if retry is not None and time.monotonic() < retry[0]:
                continue  # held or away at the last try
            with self._scales_lock:
                if entry.id in self._scales_carried:
                    continue  # a thread of this process carries it on
                lock = element_lock_of(entry.pipeline, entry.element)
                if not lock.acquire(blocking=False):
                    continue  # this process's scale or key move of the element runs
                lock.release()
                self._scales_carried.add(entry.id)
            what = f"scale {entry.id} of {entry.pipeline}/{entry.element}"
            decisions += _carry(self._carry_on_scale, entry, background, f"scale {entry.id}", what)
        return decisions

    def recover_groups(self, background: bool = False) -> list[str]:
        """Carry on every group migration an orchestrator that died left unfinished: the
        same group again, which leaves its PEs already on the target and moves the rest
        (the move the orchestrator died in is resolved first, by :meth:`recover_operations`:
        rolled back or completed). Before 2026-12-01's tenth session the group stayed split
        between its nodes until someone asked again.

        An entry of this process is its own (running). One whose PEs all run on the target
        is done; one refused (its pipeline stopped, a PE gone) ends with that outcome, as
        does one that moved, rolled back or failed. One a node or the broker was away for,
        or whose PE something else held, stays and is tried again after a pause that grows
        (as a scale's: :data:`SCALE_RETRY_S` to :data:`SCALE_RETRY_MAX_S`).

        Args:
            background: Carry each on in a thread of its own (its moves take seconds each);
                else here, one after the other.

        Returns:
            One line per entry: its decision, or (``background``) that it is carried on.
        """
        decisions: list[str] = []
        unfinished = [g for g in self.registry.unfinished_groups() if g.owner != self.run_id]
        for gone in set(self._group_retries) - {g.id for g in unfinished}:
            self._group_retries.pop(gone, None)  # (its carry-on thread may drop it too)
        for entry in unfinished:
            retry = self._group_retries.get(entry.id)
            if retry is not None and time.monotonic() < retry[0]:
                continue
            with self._scales_lock:
                if entry.id in self._groups_carried:
                    continue  # a thread of this process carries it on
                now = self.registry.group(entry.id)
                if now is None or now.outcome is not None:
                    continue  # ended since it was read (a thread's end, a superseding group)
                self._groups_carried.add(entry.id)
            decisions += _carry(self._carry_on_group, entry, background, f"group {entry.id}",
                                f"group migration {entry.id} of {entry.pipeline}")  # fmt: skip
        return decisions

    def _carry_on_group(self, entry: GroupEntry) -> list[str]:
        """Carry on ``entry`` (see :meth:`recover_groups`); its decision, if it ended."""
        what = (
            f"group migration {entry.id} of {entry.pipeline}/{','.join(entry.elements)} to "
            f"{entry.target}, left by orchestrator {entry.owner}"
        )
        try:
            try:
                record = self.registry.get_pipeline(entry.pipeline)
                placement = record.placement if record is not None else {}
                if all(placement.get(e) == entry.target for e in entry.elements):
                    decision = f"done: every PE runs on {entry.target}"
                else:
                    mode = MigrationMode(entry.mode)
                    report = self.migrate_group(
                        entry.pipeline, list(entry.elements), entry.target, mode, resume=entry.id
                    )
                    decision = f"carried on: {report.status}" + (
                        f" ({one_line(report.error)})" if report.error else ""
                    )
            except SCALE_HELD_UP as exc:
                _try_again_later(self._group_retries, entry.id, what, exc)
                return []
            except FogshiftError as exc:
                decision = f"refused: {one_line(exc.message)}"
            except Exception:
                log.exception("recovery of %s failed", what)
                decision = "failed"
            # (Ended before it is let go: the next round must not take it up again.)
            self.registry.end_group(entry.id, decision)
            self._group_retries.pop(entry.id, None)
        finally:
            with self._scales_lock:
                self._groups_carried.discard(entry.id)
        log.warning("recovery: %s: %s", what, decision)
        return [f"{what}: {decision}"]

    def _carry_on_scale(self, entry: ScaleEntry) -> list[str]:
        """Carry on ``entry`` (see :meth:`recover_scales`); its decision, if it ended."""
        what = (
            f"scale {entry.id} of {entry.pipeline}/{entry.element} to {entry.partitions} "
            f"partitions, left by orchestrator {entry.owner}"
        )
        try:
            record = self.registry.get_pipeline(entry.pipeline)
            if record is not None and record.status in (
                PipelineState.STOPPING,
                PipelineState.STOPPED,
            ):
                return []  # carried on once it runs again (`fogshift start`)
            if (
                record is None
                or record.status != PipelineState.RUNNING
                or not record.spec.partitions_of(entry.element)
            ):
                decision = "abandoned: the element does not run any more"
                self.registry.end_scale(entry.id, decision)
            else:
                # (No wait for the element's locks: held by another, it is tried later.)
                report = self.scale(entry.pipeline, entry.element, entry.partitions,
                                    list(entry.nodes) or None, waves=entry.waves,
                                    resume=entry, lock_wait_s=0)  # fmt: skip
                decision = f"carried on: {report.status}" + (
                    f" ({report.error})" if report.error else ""
                )
                left = self.registry.scale(entry.id)
                if left is not None and left.outcome is None:
                    # Still open (its rescale stands, a partition to retire has not
                    # processed it yet): tried again after a pause, as one held up.
                    _try_again_later(self._scale_retries, entry.id, what,
                                     Unavailable(report.error or decision))  # fmt: skip
                    return []
        except SCALE_HELD_UP as exc:
            _try_again_later(self._scale_retries, entry.id, what, exc)
            return []
        except FogshiftError as exc:
            # (Refused before it reached its journal entry, too: ended here.)
            self.registry.end_scale(entry.id, f"refused: {one_line(exc.message)}")
            decision = f"refused: {exc.render()}"
        except Exception:
            log.exception("recovery of %s failed", what)
            with contextlib.suppress(Exception):
                self.registry.end_scale(entry.id, "failed")
            return []
        finally:
            with self._scales_lock:
                self._scales_carried.discard(entry.id)
        self._scale_retries.pop(entry.id, None)
        line = f"{what}: {decision}"
        log.warning("recovery: %s", line)
        return [line]

    def _recover(self, op: Operation) -> tuple[str, bool]:
        """Resolve one unfinished entry (inside its PE's exclusive section).

        Returns:
            The decision, and whether the restore must be started again.
        """
        record = self.registry.get_pipeline(op.pipeline)
        here = f"/pipelines/{op.pipeline}/elements/{op.element}"
        if (
            record is None
            or record.status != PipelineState.RUNNING
            or op.element not in record.placement
        ):
            self._discard_quietly(op.target, here, record, op)
            return "abandoned: the PE does not run any more; the target was discarded", False
        placed = self.registry.placed_at(op.pipeline, op.element)
        if op.phase != "routed" and placed is not None and placed > op.started:
            # Placed since the entry began, not by its own routing: the pipeline was stopped
            # and deployed anew before a round resolved it (other operations on the PE wait
            # for the entry). Its rollback would discard the fresh instance's node, its
            # restore move a healthy fresh PE. What it left elsewhere goes (never the
            # placed instance).
            self._discard_quietly(op.target, here, record, op)
            return "abandoned: the pipeline was deployed anew since", False
        element = record.spec.element(op.element)
        if op.kind == OperationKind.MIGRATION:
            if op.phase != "routed":
                taken = self._taken_over(op, here)
                if taken is not None:
                    self._discard_quietly(op.origin, here, self.registry.get_pipeline(
                        op.pipeline), op)  # fmt: skip
                    return taken, False
                # A handover's target ran under the entry's epoch, above the origin's: it
                # may have written (or the stream been fenced) under it, so the origin is
                # restarted under a newer epoch, fenced first — resumed under its own, it
                # was refused at its next append, and the decision named an epoch it did
                # not run under.
                origin = self.registry.node(op.origin)
                reported = origin.report.element(op.pipeline, op.element) if origin else None
                behind = reported is not None and reported.epoch < op.epoch
                # Left while switching, the target's start (a literal migration's, under the
                # origin's epoch) may have been sent and still be queued at its agent behind
                # the discard: resumed under that epoch, the origin would write beside a
                # target started from nothing. The dead orchestrator knew whether it had
                # sent it (its rollback fences then); the journal does not: fenced anew.
                sent = op.phase == MigrationPhase.SWITCHING
                undone = run_rollback(
                    op.pipeline, element, (op.origin, self.agent(op.origin)),
                    (op.target, self.agent(op.target)), op.epoch, partial(self._fence_for, op),
                    unanswered=behind or sent,
                )  # fmt: skip
                notes = "; ".join(undone.notes)
                if undone.resumed:
                    return f"rolled back: {op.origin} runs under epoch {undone.epoch}" + (
                        f" ({notes})" if notes else ""
                    ), False
                return f"rolled back, but the origin does not run again ({notes})", False
            self._open_gate_quietly(op.target, here)
            self._discard_quietly(op.origin, here, record, op)
            return f"completed: {op.target} is the PE, the origin was removed", False
        if op.phase == "routed":
            self._open_gate_quietly(op.target, here)
            return f"completed: {op.target} runs it under epoch {op.epoch}", False
        # A restore's epoch is the PE's newest; a standby's promotion runs under the standby's,
        # above it until the routing change. Anything newer since supersedes the entry.
        newest = self.registry.epoch(op.pipeline, op.element)
        if op.phase in ("fencing", "starting", "live") and newest <= op.epoch:
            info: ElementProgress | None
            try:
                info = self.agent(op.target).call(ElementProgress, "GET", here + "/progress")
            except FogshiftError as exc:
                log.info("recovery: %s on %s does not answer: %s", here, op.target, exc.message)
                info = None
            if (
                info is not None
                and info.epoch == op.epoch
                and info.state in (PEState.RUNNING, PEState.STARTING, PEState.PAUSED)
            ):
                if newest < op.epoch:  # a standby's promotion: it may not have fenced yet
                    self._mark(op.pipeline, op.element, op.epoch)
                self.agent(op.target).put(here + "/gate", json={"gate": None})
                self.registry.route(op.id, op.target)
                return f"carried on: {op.target} runs it under epoch {op.epoch}, now live", False
        self._discard_quietly(op.target, here, record, op)
        return RESTARTED, True

    def _taken_over(self, op: Operation, here: str) -> str | None:
        """Complete an unfinished migration on its target when that is the one instance
        left: the origin does not answer, and the target runs under the entry's epoch, newer
        than the one the origin ran under (a handover's: fenced with it, the origin can never
        append again), as the live procedure does when its origin stops answering once the
        target is live. ``None``: roll back as usual (a precopy's target shares the
        origin's epoch, and a zombie origin could not be fenced out).

        Before, the live target was discarded and the PE, running nowhere, left to a
        restore from an older central checkpoint (or to nobody, with recovery off).
        """
        origin = self.registry.node(op.origin)
        reported = origin.report.element(op.pipeline, op.element) if origin else None
        if reported is None or reported.epoch >= op.epoch:
            return None
        if self.registry.epoch(op.pipeline, op.element) != op.epoch:
            return None  # something newer since
        try:
            now = self.agent(op.origin).call(ElementProgress, "GET", here + "/progress",
                                             timeout=10.0)  # fmt: skip
            if now.state in (PEState.RUNNING, PEState.PAUSED, PEState.STARTING):
                return None  # it runs: rolled back to it
        except FogshiftError as exc:
            log.info("recovery: %s on %s does not answer: %s", here, op.origin, exc.message)
        try:
            info = self.agent(op.target).call(ElementProgress, "GET", here + "/progress")
        except FogshiftError:
            return None
        if info.epoch != op.epoch or info.state not in (PEState.RUNNING, PEState.PAUSED):
            return None
        self._mark(op.pipeline, op.element, op.epoch)
        self.agent(op.target).put(here + "/gate", json={"gate": None})
        self.registry.route(op.id, op.target)
        return (
            f"completed: the origin on {op.origin} does not run, so {op.target} (live under "
            f"epoch {op.epoch}, the origin fenced out) took over"
        )

    def reconcile_once(self, background: bool = False) -> None:
        """Keep running pipelines as placed.

        * a PE missing from its healthy node is started there (from its local checkpoint);
        * a PE whose node has been silent longer than the pipeline's ``detect_after_s`` is
          restored on a healthy node, if its recovery is automatic; one placed on a node
          removed from the cluster (a stopped pipeline's, started again), whatever its
          recovery;
        * an instance on a node that is not the PE's placement (a fenced zombie, a leftover)
          is removed;
        * a PE on its node under an epoch older than its newest (fenced, or about to be) is
          started again there under the newest; one held at its gate with no operation under
          way is resumed.

        Standbys are kept by a loop of their own (:meth:`run_standby_keeper`): starting one
        takes seconds, which must not delay noticing a lost node.

        First, every operation an orchestrator left unfinished is resolved
        (:meth:`recover_operations`); a PE whose entry could not be resolved is left alone
        until it is. Then a deploy or a stop it left half-way is ended
        (:meth:`recover_pipelines`). Last, a scale it left is carried on
        (:meth:`recover_scales`).

        Args:
            background: Restore each lost PE in a thread of its own (the reconciler's
                rounds): one restore waiting on a target that went silent held up every
                other one, a warm standby's promotion too (promoted after 28 s of silence
                where the pipeline asked for 5); else here, one after the other.
        """
        self.check_paused()  # (before any silence is judged: see Core.check_paused)
        with self._as_round():
            self.recover_operations(background)
            try:
                self.restores_owed(background)
            except Exception:  # (the round goes on: PEs to restore, strays to remove)
                log.exception("restarting the restores owed failed")
            self.recover_pipelines()
            self.permissions.sync_quietly(self.registry)
            records = self.registry.pipelines()
            pending = {(op.pipeline, op.element) for op in self.registry.unfinished()}
            for record in records:
                for element in record.spec.elements:
                    if (record.name, element.id) in pending:
                        continue
                    try:
                        self._reconcile_element(record.name, element.id, background)
                    except Exception:
                        # One PE's trouble (an auto-restore that raised something
                        # unforeseen) must not leave the PEs after it unrestored, nor the
                        # strays in place: it is tried again next round.
                        log.exception("reconciling %s/%s failed", record.name, element.id)
            self._remove_strays(pending)
            self._discard_left(pending)
            # A scale carried on restarts consumers and waits for commits (seconds): in
            # threads of their own, not to delay the PEs' restarts and restores.
            self.recover_scales(background=True)
            self.recover_groups(background=True)

    def streams_upkeep(self) -> None:
        records = self.registry.pipelines()
        self._streams_current(records)
        self.complete_key_moves(records)

    def _streams_current(self, records: list[PipelineRecord]) -> None:
        """Once per pipeline and orchestrator: give each of its PEs' streams every subject
        and the direct gets this fogshift uses. A stream an older fogshift made lacks some
        subjects (``.keys.*`` since 2026-11-29: a partition's state for a move stored before
        the upgrade could not be sent, its batch failing for good), or direct gets, the only
        way a node may read its inputs (since 2026-11-29); a fresh deploy makes its streams
        anew, with them all."""
        for record in records:
            if record.status != PipelineState.RUNNING or record.name in self._streams_checked:
                continue
            ids = sorted(e.id for e in record.spec.elements)

            async def current(js: Any, pipeline: str = record.name, ids: list[str] = ids) -> None:
                for element in ids:
                    with contextlib.suppress(NotFoundError):  # none: made anew, with them all
                        await ensure_subjects(js, pipeline, element)

            try:
                self.broker.run(current, timeout=30)
            except BrokerUnavailable as exc:
                # Next round; the PEs after it wait no longer for a broker that is away.
                log.warning("cannot bring %s's streams up to date: %s", record.name, exc.message)
                return
            except Exception as exc:
                log.warning("cannot bring %s's streams up to date: %r", record.name, exc)
                continue
            self._streams_checked.add(record.name)

    def _reconcile_element(
        self, pipeline: str, element_id: str, background: bool = False, live: bool = False
    ) -> None:
        """One PE's part of :meth:`reconcile_once` (``background``: as there; ``live``: an
        instance its node's last heartbeat lists is asked for, see :meth:`_keep_running`).

        Its placement is read afresh, and a restart happens inside the PE's exclusive
        section: a migration or restore (this round's, or one from the REST API) may have
        moved it since the round began, and a stale view would start a second instance on
        the node it left.
        """
        record = self.registry.get_pipeline(pipeline)
        if (
            record is None
            or record.status != PipelineState.RUNNING
            or (pipeline, element_id) in self._migrating
        ):
            return  # a migration or restore owns the PE's instances until it ends
        placed = record.placement[element_id]
        node = self.registry.node(placed)
        key = (pipeline, element_id)
        if node is None:
            if not self.removed(placed):
                return  # (added again, not heard yet: started there once it is)
            # Placed on a node taken out of the cluster (a stopped pipeline's PE, which a
            # removal does not refuse, started again): it can never run there, nor write
            # (a removed node's tokens open nothing), so it is restored elsewhere whatever
            # ``recovery.auto`` says — which waits for a user's word on a silence that may
            # be a partition; the removal is that word.
            lost = f"node {placed} was removed from the cluster"
        else:
            # Silence counts from this process's start: after a restart of the whole
            # cluster, nodes that have not re-registered yet are not lost.
            silent = time.time() - max(node.last_seen, self.started_at)
            broken = self.broken(node)
            detect = record.spec.recovery.detect_after_s
            if not record.spec.recovery.auto or (silent <= detect and broken is None):
                if self.healthy(node) and node.report.ready:
                    self._keep_running(record, pipeline, element_id, node, key, background, live)
                return
            # A node whose Spark session failed to start heartbeats on (to say why) but can
            # run nothing: its PEs ran nowhere for good. Restored elsewhere as a silent
            # node's are (automatic recovery; else `fogshift restore`, and `status` says so).
            lost = (f"node {placed} silent for {silent:.1f} s" if silent > detect
                    else f"node {placed} cannot run PEs: {broken}")  # fmt: skip
        with self._lock:
            if key in self._auto_restoring:
                return  # a thread of this process restores it
        newest = self.registry.epoch(pipeline, element_id)
        failed = self._backed_off(key, newest, placed, away=True)
        if failed is None:
            return  # its last restore failed: not every round either
        log.warning("%s: restoring %s/%s", lost, pipeline, element_id)
        if not background:
            self._auto_restore(pipeline, element_id, placed, failed, newest)
            return
        self._restoring_in_thread(key, f"restore {pipeline}/{element_id}", self._auto_restore,
                                  pipeline, element_id, placed, failed, newest, True,
                                  time.monotonic())  # fmt: skip

    def _restoring_in_thread(
        self, key: tuple[str, str], name: str, target: Callable[..., None], *args: Any
    ) -> bool:
        """Run ``target(*args)``, a restore of PE ``key`` that ends by dropping ``key`` from
        ``_auto_restoring``, in a thread of its own; False if one of this process's runs
        (the PE is not restored twice at once). No thread started: ``key`` is dropped and
        the next round tries again."""
        with self._lock:
            if key in self._auto_restoring:
                return False
            self._auto_restoring.add(key)
        try:
            threading.Thread(target=target, args=args, name=name, daemon=True).start()
        except BaseException:
            with self._lock:
                self._auto_restoring.discard(key)
            raise
        return True

    def _auto_restore(
        self, pipeline: str, element_id: str, lost: str, failed: int, newest: int,
        threaded: bool = False, decided: float | None = None,
    ) -> None:  # fmt: skip
        """The automatic restore of PE ``pipeline/element_id``, whose node ``lost`` is
        silent (its ``failed`` tries before, at epoch ``newest``): a failure is logged (in
        full once while it stays the same) and puts the next try off. ``threaded``: in a
        thread of its own, which logs what else it raises (tried again next round), and
        runs as one of the orchestrator's rounds: a PE someone holds is refused at once,
        not waited for (a wait of up to a minute acted on a silence seen before it).
        ``decided``: when the silence was judged (monotonic): a node heard since, its PEs
        runnable, is not restored away from (fenced and moved for nothing)."""
        key = (pipeline, element_id)
        try:
            with self._as_round() if threaded else contextlib.nullcontext():
                if decided is not None and self._back_since(lost, decided):
                    log.warning("node %s was heard again since its silence was judged: "
                                "%s/%s is not restored", lost, pipeline, element_id)  # fmt: skip
                    return
                self._try_restore(pipeline, element_id, lost, failed, newest)
        except Exception:
            if not threaded:
                raise  # (reconcile_once logs it, and goes on with the next PE)
            log.exception("auto-restore of %s/%s failed", pipeline, element_id)
        finally:
            with self._lock:
                self._auto_restoring.discard(key)

    def _back_since(self, name: str, decided: float) -> bool:
        """Whether node ``name`` sent a heartbeat after ``decided`` (monotonic) and can run
        PEs (its Spark session up)."""
        node = self.registry.node(name)
        return (
            node is not None
            and self._beats.get(name, -math.inf) > decided
            and self.broken(node) is None
        )

    def _try_restore(
        self, pipeline: str, element_id: str, lost: str, failed: int, newest: int
    ) -> None:
        """:meth:`_auto_restore`'s restore, and what its outcome changes."""
        key = (pipeline, element_id)
        try:
            self.restore(pipeline, element_id, lost=lost)
        except FogshiftError as exc:
            said = str(exc)
            if self._restore_failures.get(key) == said:
                # (The same lines of reason every try, for as long as the node was away.)
                log.warning("auto-restore of %s/%s failed again, as before (try %d)",
                            pipeline, element_id, failed + 1)  # fmt: skip
            else:
                log.warning("auto-restore of %s/%s: %s", pipeline, element_id, said)
                self._restore_failures[key] = said
            # Each failed try fenced anew on every candidate (a new epoch, a marker in
            # the PE's stream, a journal entry, a copy), and the whole round waited for
            # it, every round, for as long as the node stayed away.
            self._back_off(key, failed, newest, lost, away=True)
            return
        self._restart_backoff.pop(key, None)
        self._restore_failures.pop(key, None)

    def _keep_running(
        self, record: PipelineRecord, pipeline: str, element_id: str, node: NodeRecord,
        key: tuple[str, str], background: bool = False, live: bool = False,
    ) -> None:  # fmt: skip
        """The rest of :meth:`_reconcile_element` for a PE whose node is heard: start it
        again there if it is missing, fenced, halted or behind its newest epoch; restore it
        there from its central checkpoint if the node lost its checkpoint, holds it torn, or
        its query cannot read it (``background``: that restore in a thread of its own, see
        :meth:`_in_place_later`). ``live``: an instance the node's last heartbeat lists is
        asked for first (one sent before a stop still lists the instance the stop removed:
        a start just after it took it for running until the next round)."""
        reported = node.report.element(pipeline, element_id)
        if live and reported is not None:
            placed = record.spec.element(element_id).model_copy(update={"node": node.name})
            try:
                if not self._hosts(placed, pipeline):
                    reported = None
            except FogshiftError as exc:  # (not answering: the next round looks again)
                log.warning("%s/%s on %s not asked: %s", pipeline, element_id, node.name,
                            exc.message)  # fmt: skip
                return
        newest = self.registry.epoch(pipeline, element_id)
        stale = stale_inputs(reported, record.spec.element(element_id))
        halted = reported is not None and reported.state in HALTED
        unreadable = reported is not None and reported.unreadable is not None
        if reported is not None and not (
            reported.gated or reported.epoch < newest or stale or halted or unreadable
        ):
            self._restart_backoff.pop(key, None)
            return
        with self._lock:
            if key in self._auto_restoring:
                return  # a thread of this process restores it
        failed = self._backed_off(key, newest, node.name)
        if failed is None:
            return  # its last restart failed: not every round (see RESTART_BACKOFF_MAX_S)
        #: A restore in place decided on (called with the PE's element as placed).
        in_place: Callable[[ElementSpec], None] | None = None
        try:
            with self._exclusive(pipeline, element_id, "restart"):
                now = self.registry.get_pipeline(pipeline)
                if (
                    now is None
                    or now.status != PipelineState.RUNNING
                    or now.placement.get(element_id) != node.name
                ):
                    return  # moved or stopped meanwhile
                here = now.spec.element(element_id).model_copy(update={"node": node.name})
                if reported is None and not self._hosts(here, pipeline):
                    if self._lost(here, pipeline, node):
                        gone = ("has had no instance of it since restoring it there failed"
                                if self._in_place_failed.get(key) == node.name
                                else "came back without the checkpoints")  # fmt: skip
                        in_place = partial(self._restore_lost, pipeline, why=gone)
                    else:
                        # Under an epoch above every one given, fenced first: the newest may
                        # be another instance's (a restore's target whose last step and
                        # discard got no answer), which would share it.
                        log.info("reconcile: starting %s/%s on %s under a new epoch",
                                 pipeline, element_id, node.name)  # fmt: skip
                        try:
                            self._restart_fenced(pipeline, here, node.name)
                        except TornCheckpoint as exc:
                            # (A node back from a power loss: every start from it failed,
                            # the agent retrying for good.)
                            torn = f"holds a torn checkpoint ({exc.received})"
                            in_place = partial(self._restore_lost, pipeline, why=torn)
                elif unreadable:
                    in_place = partial(self._restore_unreadable, pipeline)
                else:
                    self._mend(pipeline, here)
                if in_place is not None and not background:
                    in_place(here)
        except MigrationInProgress:
            return  # the operation under way owns the PE
        except FogshiftError:
            # A failed start, logged by _exclusive.
            self._back_off(key, failed, newest, node.name)
            return
        if in_place is not None and background:
            self._in_place_later(key, failed, newest, here, in_place)
            return
        self._restart_backoff.pop(key, None)

    def _in_place_later(
        self, key: tuple[str, str], failed: int, newest: int, element: ElementSpec,
        restore: Callable[[ElementSpec], None],
    ) -> None:  # fmt: skip
        """Run ``restore`` of PE ``key`` on its node (``element.node``) in a thread of its
        own, as one of the orchestrator's rounds, in the PE's exclusive section taken anew
        (its placement checked again); :meth:`_keep_running` decided on it (``failed``
        restarts before, at epoch ``newest``). A restore waits until the PE caught up —
        seconds, minutes after a long outage — and in the round it held up every other PE's
        turn: a silent node went unnoticed, a standby unpromoted, meanwhile. A failure puts
        the next try off as a failed restart does."""
        pipeline, element_id = key
        decided = self.registry.epoch(pipeline, element_id)

        def run() -> None:
            try:
                with self._as_round(), self._exclusive(pipeline, element_id, "restart"):
                    now = self.registry.get_pipeline(pipeline)
                    if (
                        now is None
                        or now.status != PipelineState.RUNNING
                        or now.placement.get(element_id) != element.node
                        or self.registry.epoch(pipeline, element_id) != decided
                    ):
                        # Moved, stopped, or restored or moved back by an operation in the
                        # gap between the round's section and this one (its new epoch): it
                        # runs, and a restore now would fence it for nothing.
                        return
                    restore(element)
                self._restart_backoff.pop(key, None)
            except MigrationInProgress:
                pass  # the operation under way owns the PE
            except FogshiftError:
                try:
                    self._back_off(key, failed, newest, element.node or "")
                except Exception:  # (a registry closed under it: the next round tries)
                    log.exception("backing off the restore of %s/%s", pipeline, element_id)
            except Exception:  # (tried again next round)
                log.exception("restoring %s/%s on %s failed", pipeline, element_id, element.node)
            finally:
                with self._lock:
                    self._auto_restoring.discard(key)

        self._restoring_in_thread(key, f"restore {pipeline}/{element_id} in place", run)

    def _restore_unreadable(self, pipeline: str, element: ElementSpec) -> None:
        """The PE's instance on its node (``element.node``) failed in a row on a checkpoint
        its query cannot read there (a state file torn or gone: every start fails on it, the
        agent retrying for good), as the node's last report said. Judged again by what the
        agent says now; the instance, failed, writes nothing: discarded with that checkpoint,
        and the PE restored there from its central checkpoint (:meth:`_restore_lost`), its
        standby promoted if one stands. Inside the exclusive section.

        Raises:
            FogshiftError: The discard or the restore failed (the caller backs off).
        """
        here = f"/pipelines/{pipeline}/elements/{element.id}"
        info = self.agent(element.node).call(ElementProgress, "GET", here + "/progress")
        if info.state != PEState.FAILED or info.unreadable is None:
            log.info("reconcile: %s/%s on %s is %s now: not restored", pipeline, element.id,
                     element.node, info.state)  # fmt: skip
            return
        self.agent(element.node).delete(here, params={"discard": True})
        log.warning("reconcile: discarded the failed instance of %s/%s on %s with the "
                    "checkpoint its query cannot read", pipeline, element.id,
                    element.node)  # fmt: skip
        self._restore_lost(pipeline, element, f"holds a checkpoint its query cannot read "
                                              f"({info.unreadable})")  # fmt: skip

    def _backed_off(
        self, key: tuple[str, str], newest: int, node: str, away: bool = False
    ) -> int | None:
        """How many restarts (or restores) of PE ``key`` on ``node`` failed in a row, or
        ``None`` while the back-off after the last one runs (see :meth:`_back_off`).
        ``away``: of the restores away from a silent ``node``, which a failure on the node
        itself (a restart, a restore in place, as the node froze) puts off no more: the PE
        waited up to :data:`RESTART_BACKOFF_MAX_S` past its ``detect_after_s``."""
        failed, after, at_epoch, at_node, was_away = self._restart_backoff.get(
            key, (0, 0.0, 0, "", away)
        )
        if (at_epoch, at_node, was_away) != (newest, node, away):
            return 0  # placed or fenced anew since by someone else, or tried otherwise
        return None if time.monotonic() < after else failed

    def _back_off(
        self, key: tuple[str, str], failed: int, newest: int, node: str, away: bool = False
    ) -> None:
        """After a failed restart or restore of PE ``key`` placed on ``node`` (``away``: a
        restore away from it, silent): once it fenced anew (its epoch passed ``newest``),
        the next try waits twice as many rounds as the last, at most
        :data:`RESTART_BACKOFF_MAX_S` (a failure before, a request, is tried again next
        round)."""
        epoch = self.registry.epoch(*key)
        if epoch > newest:
            wait = min(RESTART_BACKOFF_MAX_S, self.config.reconcile_s * 2 ** min(failed, 16))
            self._restart_backoff[key] = (failed + 1, time.monotonic() + wait, epoch, node, away)

    def _hosts(self, element: ElementSpec, pipeline: str) -> bool:
        """Whether ``element.node`` runs an instance of the PE now (its last report lags a
        heartbeat: the PE may have been started since)."""
        try:
            self.agent(element.node).call(
                ElementProgress, "GET", f"/pipelines/{pipeline}/elements/{element.id}/progress"
            )
        except UnknownElement:
            return False
        return True

    def _restore_lost(
        self, pipeline: str, element: ElementSpec, why: str = "came back without the checkpoints"
    ) -> None:
        """Bring back a PE whose node (``element.node``, its placement) came back without
        its checkpoints (a wiped or new disk): started from nothing, it would read its
        input from the start, past records trimmed since (recovery.history_s), or all
        again; or with a checkpoint its agent refuses to start from (its logs torn, or a
        file not matching Spark's checksums) or its query cannot read; or with no instance
        since its last restore there failed (``why`` says which). Its hot standby, if one
        stands, is promoted; else (or if that fails) it is restored there as on any node:
        fenced, from the newest central checkpoint its query can read, reprocessing without
        emitting; if that fails, on the best other node. Inside the PE's exclusive section;
        a failure notes the node (``_in_place_failed``) for the next round's ``why``.

        Raises:
            FogshiftError: The restore failed (the caller backs off).
        """
        node = element.node
        assert node is not None
        attempts: list[RestoreAttempt] = []  # (a failed promotion: in the report, as restore's)
        standby = self.registry.standby(pipeline, element.id)
        if standby is not None and self._may_keep(self.registry.node(standby.node)):
            log.warning("reconcile: %s %s of %s/%s: its standby on %s takes over", node, why,
                        pipeline, element.id, standby.node)  # fmt: skip
            try:
                self.promote_standby(element, pipeline, node, standby)
                self._in_place_failed.pop((pipeline, element.id), None)
                return
            except RestoreFailed as exc:  # (dropped: restored in place instead)
                log.warning("reconcile: promoting the standby of %s/%s failed: %s", pipeline,
                            element.id, exc.message)  # fmt: skip
                fenced = exc.report.epoch if isinstance(exc.report, RestoreReport) else 0
                attempts.append(RestoreAttempt(node=standby.node, epoch=fenced or None,
                                               error=exc.message))  # fmt: skip
        log.warning("reconcile: %s %s of %s/%s: restoring it there from its central "
                    "checkpoint", node, why, pipeline, element.id)  # fmt: skip
        key = (pipeline, element.id)
        try:
            try:
                self._restore_on(element, pipeline, node, [node], attempts)
            except RestoreFailed as exc:
                # (Its node's disk may be what fails, full or failing: every round restored
                # it there again, for good.) On the best other node then, as a silent node's.
                with self._choosing(pipeline, element.id, {node}) as (candidates, trying):
                    if not candidates:
                        raise
                    log.warning("reconcile: restoring %s/%s on %s failed (%s): restoring it "
                                "on %s", pipeline, element.id, node, exc.message,
                                " or ".join(candidates))  # fmt: skip
                    self._restore_on(element, pipeline, node, candidates, attempts, trying)
        except FogshiftError:
            self._in_place_failed[key] = node
            raise
        self._in_place_failed.pop(key, None)

    def _lost(self, element: ElementSpec, pipeline: str, node: NodeRecord) -> bool:
        """Whether ``node`` (``element.node``) lost the PE's checkpoints: the central store
        holds one (pulled from a node-level one: the PE had one where it ran), while the
        node's heartbeat lists no checkpoint of it left there (``left``: its checkpoint or
        node-level snapshots; an install deletes the snapshots, and a node restarted before
        its next one still has the installed checkpoint) and it answers no node-level one."""
        if self.central.newest(pipeline, element.id) is None:
            return False
        left = node.report.left
        if len(left) >= LEFT_REPORTED or any(
            (c.pipeline, c.element) == (pipeline, element.id) and not c.partial for c in left
        ):
            return False  # (a full list does not tell)
        try:
            self.agent(element.node).call(
                CheckpointManifest,
                "GET",
                f"/pipelines/{pipeline}/elements/{element.id}/snapshots/latest",
            )
        except UnknownElement:
            return True
        return False

    def _mend(self, pipeline: str, element: ElementSpec) -> None:
        """The PE's instance on its node (``element.node``) looked stale in the node's last
        report — reading other inputs than its element, under an older epoch than the PE's
        newest, or held at its gate. Judged again by what the agent says now (a report lags
        a heartbeat: a scale may have just started it again); inside the exclusive section,
        so no operation is under way.

        An older epoch means a newer one was given (a restore that failed everywhere, a
        rollback that had to fence) and this instance is, or will be at its next write,
        fenced: it is started again from its own checkpoint under an epoch above every one
        given, fenced first (an instance elsewhere may hold the newest). A gate held
        with no operation under way was left by one that ended without opening it.
        """
        here = f"/pipelines/{pipeline}/elements/{element.id}"
        info = self.agent(element.node).call(ElementProgress, "GET", here + "/progress")
        newest = self.registry.epoch(pipeline, element.id)
        if stale_inputs(info, element):
            # A scale that failed between giving the element its new inputs and starting
            # its instance with them (its added partitions' output would reach nobody):
            # started again with them, under a new epoch fenced first, as scale does.
            log.warning("reconcile: %s/%s on %s reads %s, its element %s: starting it "
                        "again", pipeline, element.id, element.node, info.inputs,
                        list(element.inputs))  # fmt: skip
            self.drop_standby(self.registry.standby(pipeline, element.id))
            self._restart_fenced(pipeline, element, element.node)
        elif info.state in HALTED and info.epoch >= newest:
            # Fenced, or stopped, under the PE's newest epoch where it is placed, with no
            # operation under way: nobody writes. A promotion that fenced under its
            # standby's epoch (above the PE's own), then failed with no node to restore on,
            # leaves it fenced; a stop on the node whose clean-up raised (a disk error in
            # the agent's home) leaves it stopped, still hosted. Started again under an
            # epoch above every one given, fenced first.
            log.warning("reconcile: %s/%s on %s is %s with no operation under way: "
                        "starting it again under a new epoch", pipeline, element.id,
                        element.node, info.state)  # fmt: skip
            self._restart_fenced(pipeline, element, element.node)
        elif info.epoch < newest:
            # The newest epoch was given to an instance elsewhere (a restore whose target
            # started, then whose last step and discard got no answer): that one may still
            # write under it. Started again under an epoch above every one given, fenced
            # first, as a fenced instance is (under the newest, the two would share it).
            log.warning("reconcile: %s/%s on %s runs under epoch %s, older than its newest %d: "
                        "starting it again under a new epoch", pipeline, element.id,
                        element.node, info.epoch, newest)  # fmt: skip
            self._restart_fenced(pipeline, element, element.node)
        elif info.gated:
            log.warning("reconcile: %s/%s on %s is held at its gate with no operation under "
                        "way: resuming it", pipeline, element.id, element.node)  # fmt: skip
            self.agent(element.node).post(here + "/resume")

    def _remove_strays(self, pending: set[tuple[str, str]] | None = None) -> None:
        """Remove instances running on a node that is not their PE's placement.

        The placement is read afresh for every instance, inside the PE's exclusive section:
        a restore or migration that ended a moment ago has moved the placement to the very
        instance a stale view would call superseded (and removing it discards its checkpoint).

        Args:
            pending: PEs with an unfinished journal entry: their instances are left to its
                resolution.
        """
        for node in self.registry.nodes():
            if not self.healthy(node):
                continue
            for hosted in node.report.elements:
                key = (hosted.pipeline, hosted.element)
                if key in (pending or set()):
                    continue
                try:
                    with self._exclusive(*key, "removal of a superseded instance"):
                        record = self.registry.get_pipeline(key[0])
                        standby = self.registry.standby(*key)
                        placed = record.placement.get(key[1]) if record else None
                        retired = (
                            record is not None
                            and placed is None
                            and not any(e.id == key[1] for e in record.spec.elements)
                        )  # a partition `scale` removed: its instance is a stray too
                        # A stopped pipeline runs nowhere: an instance a restore or migration
                        # started while `stop` ran is stopped too (its checkpoint kept), and so
                        # is one a failed deploy could not remove (its node away then). Told
                        # by a heartbeat that came after the stop (an earlier one still lists
                        # what `stop` removed).
                        stopped = (
                            record is not None
                            and record.status in (PipelineState.STOPPED, PipelineState.FAILED)
                            and node.last_seen > record.status_since + STOPPED_HEARD_S
                        )
                        # A deleted pipeline's, on a node away at the delete: discarded.
                        deleted = self.registry.deleted(key[0]) if record is None else None
                        if deleted is not None and node.last_seen > deleted + STOPPED_HEARD_S:
                            self._discard_deleted(node.name, *key, "instance")
                            continue
                        if not stopped and (
                            record is None
                            or record.status != PipelineState.RUNNING
                            or (placed in (None, node.name) and not retired)
                            or (standby is not None and standby.node == node.name)
                        ):
                            continue
                        what = (f"the {record.status} pipeline's" if stopped and record
                                else "superseded")  # fmt: skip
                        try:
                            said = self.agent(node.name).delete(
                                f"/pipelines/{key[0]}/elements/{key[1]}",
                                params={} if stopped else {"discard": True},
                            )
                        except FogshiftError as exc:
                            # Gone meanwhile (a heartbeat sent before a migration removed its
                            # origin lists it still), or its node stopped answering: the next
                            # round sees what its heartbeats then report. Said only when
                            # something was removed: a warning for nothing misled.
                            log.info("%s %s/%s on %s not removed: %s", what, *key, node.name,
                                     exc.message)  # fmt: skip
                        else:
                            if isinstance(said, dict) and said.get("state") == PEState.DISCARDED:
                                # Only its checkpoint was there (a handover's origin, a
                                # dropped standby's copy): no instance ran, nothing to warn of.
                                log.info("discarded the checkpoint %s held of %s %s/%s",
                                         node.name, what, *key)  # fmt: skip
                            else:
                                log.warning("removed %s %s/%s from %s", what, *key, node.name)
                except MigrationInProgress:
                    continue  # the operation under way owns the PE's instances
                except Exception:  # as in reconcile_once: the other instances go on
                    log.exception("removing a superseded %s/%s from %s failed", *key, node.name)

    def _discard_deleted(self, node: str, pipeline: str, element: str, what: str) -> None:
        """Discard the ``what`` (an instance, a checkpoint) node ``node`` holds of PE
        ``pipeline/element``, of a deleted pipeline. Under the pipeline's lock, taken only if
        free, and with the deletion read again there: a deploy of the name again holds it
        from its registry entry to its PEs' starts, and its fresh PE on that node must not
        be discarded as the deleted run's."""
        lock = self.pipeline_lock(pipeline)
        if not lock.acquire(blocking=False):
            return  # a deploy or delete of the name runs: the next round judges again
        try:
            if self.registry.get_pipeline(pipeline) is not None:
                return  # deployed again meanwhile
            if self.registry.deleted(pipeline) is None:
                return
            log.warning("discarding the %s of %s/%s of the deleted pipeline on %s", what,
                        pipeline, element, node)  # fmt: skip
            self.agent(node).delete(
                f"/pipelines/{pipeline}/elements/{element}", params={"discard": True}
            )
        except FogshiftError as exc:  # (gone meanwhile, or its node away again)
            log.info("%s/%s of the deleted pipeline on %s not discarded: %s", pipeline,
                     element, node, exc.message)  # fmt: skip
        finally:
            lock.release()

    def _discard_left(self, pending: set[tuple[str, str]]) -> None:
        """Discard the checkpoints nodes hold of PEs of known pipelines that are neither
        placed nor standing by there (``Heartbeat.left``), and of deleted pipelines: an
        instance removed while its agent was down left them, on disk for good. Decided
        inside the PE's exclusive section, with the placement read afresh: an operation
        under way (a migration's target being set up) owns them, and one that just ended
        may have placed the PE there."""
        for node in self.registry.nodes():
            if not self.healthy(node):
                continue
            for left in node.report.left:
                key = (left.pipeline, left.element)
                if key in pending:
                    continue
                try:
                    with self._exclusive(*key, "discarding a checkpoint left on a node"):
                        record = self.registry.get_pipeline(key[0])
                        standby = self.registry.standby(*key)
                        if record is None and self.registry.deleted(key[0]) is not None:
                            # Of a pipeline deleted while this node was away.
                            self._discard_deleted(node.name, *key, "checkpoint")
                            continue
                        if (
                            record is None  # (not ours to judge)
                            or record.placement.get(key[1]) == node.name
                            or (standby is not None and standby.node == node.name)
                            or (key[0], key[1]) in {(e.pipeline, e.element)
                                                    for e in node.report.elements}
                        ):  # fmt: skip
                            continue
                        log.info("discarding the checkpoint %s/%s left on %s (placed on %s)",
                                 *key, node.name, record.placement.get(key[1]))  # fmt: skip
                        self.agent(node.name).delete(
                            f"/pipelines/{key[0]}/elements/{key[1]}", params={"discard": True}
                        )
                except MigrationInProgress:
                    continue
                except FogshiftError as exc:
                    log.info("the checkpoint %s/%s left on %s was not discarded: %s", *key,
                             node.name, exc.message)  # fmt: skip
                except Exception:
                    log.exception("discarding %s/%s left on %s failed", *key, node.name)

    def start(self, name: str) -> PipelineStatus:
        """Start stopped pipeline ``name`` again where it stopped: its streams as they are
        (what was appended to its inputs meanwhile is read, once), each PE as the reconciler
        starts a PE missing from its node — there, from its own checkpoint, under a new epoch
        fenced first; from its central checkpoint if its node lost its own; a PE of a node
        not heard is restored elsewhere once its pipeline counts the node lost, if its
        recovery is automatic (``recovery``), as any; a PE of a node removed from the
        cluster meanwhile is restored on the best other node (:meth:`restore`), whatever
        its recovery. Downstream first, as a deploy. A scale a dead orchestrator left
        unfinished is carried on by the next round, as in a running pipeline.

        A PE whose start fails here is started again by the reconciler's rounds, as one
        whose node restarted (``status`` says how it stands).

        Raises:
            UnknownPipeline: No pipeline of that name.
            Conflict: Nothing changed: it is not stopped (running, deploying, stopping, or
                failed), or its deploy never completed before it was stopped
                (:meth:`Registry.ran`: its PEs hold no checkpoint of its streams); the
                broker no longer holds its streams; a PE's node was removed from the
                cluster and no healthy node can take the PE; an operation an orchestrator
                left unfinished still holds a PE (the next round resolves it).
        """
        with self.pipeline_lock(name):
            record = self.pipeline(name)
            refusal = f"cannot start pipeline {name!r}"
            # (Stopped after a deploy that failed, or was left half-way, its PEs hold the
            # checkpoints of the run before, whose streams the deploy made anew: started,
            # they would read from positions those streams do not hold.)
            never = record.status == PipelineState.STOPPED and not self.registry.ran(name)
            if record.status != PipelineState.STOPPED or never:
                hint = {
                    PipelineState.RUNNING: f"it runs already: `fogshift status {name}`",
                    PipelineState.STOPPED: "nothing to go on from: `fogshift deploy SPEC` "
                    "starts it afresh",
                    PipelineState.FAILED: "its deploy failed, so there is nothing to go on "
                    "from: `fogshift deploy SPEC` starts it afresh",
                }.get(record.status, "wait until that has ended, then see `fogshift status`")
                said = "stopped, and its deploy never completed" if never else record.status
                raise Conflict(
                    f"{refusal}: it is {said}",
                    expected="a stopped pipeline (`fogshift stop`) whose deploy had completed",
                    received=str(said),
                    hint=hint,
                )
            # A PE placed on a node taken out of the cluster while the pipeline was stopped
            # is restored on another (below, as a lost node's: from its newest central
            # checkpoint, fenced, reprocessing without emitting): refused if none can take
            # it now, rather than left running without it.
            homeless = [
                pe
                for pe, node in sorted(record.placement.items())
                if self.removed(node) and not self.restore_candidates(name, pe, set())
            ]
            if homeless:
                healthy = [n.name for n in self.registry.nodes() if self.healthy(n)]
                raise Conflict(
                    f"{refusal}: no healthy node can take {', '.join(homeless)}, placed on a "
                    "node removed from the cluster while it was stopped",
                    expected="a healthy, ready node, not being removed or drained, to restore "
                    "them on from their central checkpoints",
                    received=", ".join(f"{pe} on removed {record.placement[pe]}"
                                       for pe in homeless)
                    + f"; healthy nodes: {', '.join(healthy) or 'none'}",
                    hint="start a node (`fogshift up --nodes ...`) or wait until one is healthy "
                    "(`fogshift nodes`), then start it again",
                )  # fmt: skip
            held = sorted({op.element for op in self.registry.unfinished()
                           if op.pipeline == name})  # fmt: skip
            if held:
                raise Conflict(
                    f"{refusal}: an operation an orchestrator left unfinished holds "
                    f"{', '.join(held)}",
                    expected="no unfinished migration or restore of its PEs",
                    received=", ".join(held),
                    hint="the reconciler's next round ends it (seconds): start it again then",
                )
            # Every stream a PE reads (a retired partition's too, still among its readers'
            # inputs) and writes: started on a stream made anew, a PE would read from
            # positions its checkpoint names that the stream does not hold.
            wanted = {stream_name(name, pe) for e in record.spec.elements
                      for pe in (e.id, *e.inputs)}  # fmt: skip
            streams = set(
                self.broker.run(partial(pipeline_streams, pipeline=name), again_if_closed=True)
            )
            if not wanted <= streams:
                raise Conflict(
                    f"{refusal}: the broker no longer holds its streams "
                    f"{', '.join(sorted(wanted - streams))}",
                    expected="every stream of its PEs, as the stop left them",
                    received=", ".join(sorted(streams)) or "none of them",
                    hint=f"`fogshift delete {name}`, then `fogshift deploy SPEC` starts it afresh",
                )
            try:
                # Another pipeline deployed meanwhile that writes or reads one of its files
                # (a registry older than the deploy's refusal of stopped pipelines' files):
                # its sink's file is the other's now, refused at every write.
                self._refuse_shared_outputs(record.spec, stopped=False)
            except InvalidSpec as exc:
                # (Not the deploy's hint: a start changes no path, and a stop of the other
                # only lets this start, its sink then refused as not the file's writer.)
                raise Conflict(
                    f"{refusal}: {exc.message}",
                    expected=exc.expected,
                    received=exc.received,
                    hint=f"the file is the other pipeline's now: `fogshift delete {name}` and "
                    "deploy its spec with other paths, or delete the other pipeline and "
                    f"`fogshift deploy SPEC --fresh` for {name!r}",
                ) from exc
            self.registry.set_status(name, PipelineState.RUNNING)
            try:
                self.permissions.sync(self.registry)  # (the stop took its nodes' rights)
            except Exception:
                self.registry.set_status(name, PipelineState.STOPPED)
                raise
            log.info("starting pipeline %s again where it stopped", name)
            self._streams_current([self.pipeline(name)])  # (as the rounds do: before any PE)
            # (A back-off of the run before the stop would put its first start off, or its
            # scale's carry-on.)
            for entry in self.registry.unfinished_scales():
                if entry.pipeline == name:
                    self._scale_retries.pop(entry.id, None)
            for element in reversed(record.spec.topological_order()):
                self._restart_backoff.pop((name, element.id), None)
                if element.id not in self.pipeline(name).placement:
                    continue  # (retired meanwhile by a scale a round carried on)
                try:
                    self._reconcile_element(name, element.id, live=True)
                except Exception:  # (the reconciler's rounds try it again)
                    log.exception("starting %s/%s again failed", name, element.id)
        try:
            return self.status(name)[0]
        except Unavailable as exc:  # (started: a broker away now must not make it look failed)
            log.warning("started %s; its stream counts cannot be read now: %s", name,
                        exc.message)  # fmt: skip
            return self.status(name, counts=False)[0]

    def run_reconciler(self) -> None:
        """Loop :meth:`reconcile_once` until :meth:`close`."""
        self._every(self.config.reconcile_s, partial(self.reconcile_once, background=True),
                    "reconcile")  # fmt: skip
