"""Hot standbys (``recovery.standby``): choosing each PE's standby node, starting the standby,
raising its cap as the primary commits, and promoting it when the primary's node is lost.

The procedures are :mod:`fogshift.restoration.standby`'s; this is the orchestrator's side:
the registry keeps each standby's node and epoch, a loop starts missing ones
(:meth:`Standbys.keep_standbys`, a loop beside the reconciler's), another raises their caps
(:meth:`Standbys.follow_standbys`), and a restore promotes the standby when there is one
(:meth:`Standbys.promote_standby`). Each touches a PE only inside its exclusive section, so a
migration or restore never races with a cap being raised (the copy of a primary's checkpoint
for its new standby, a read, is taken outside it and used only if the PE did not change).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.exceptions import BrokerError
from fogshift.contracts import (
    ElementProgress,
    NodeHold,
    OperationKind,
    PEState,
    PipelineState,
    RestorePhase,
    RestoreReport,
)
from fogshift.exceptions import FogshiftError
from fogshift.migration.exceptions import MigrationInProgress
from fogshift.orchestrator.core import Followed
from fogshift.orchestrator.deployment import Deployment
from fogshift.orchestrator.exceptions import NodeInUse
from fogshift.orchestrator.journal import BACKGROUND_WAIT_S, NODE_REMOVAL, STANDBY_LOOK
from fogshift.orchestrator.registry import (
    NodeRecord,
    PipelineRecord,
    StandbyRecord,
    node_in_use,
)
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.restoration.procedure import RestoreSteps
from fogshift.restoration.standby import (
    WarmCopy,
    first_follow,
    follow,
    promote,
    start_standby,
    warm_copy,
    warm_up,
)
from fogshift.spec.models import PLANNED_STANDBY, ElementSpec, wants_standby

log = logging.getLogger("fogshift.orchestrator")

#: How long a standby just started may be missing from its node's heartbeats.
REPORT_GRACE_S = 10.0
#: How long discarding a dropped standby may take before it is left to the reconciler.
DROP_TIMEOUT_S = 10.0
#: How many times a node's removal drops the keeper's standbys there and tries again: a
#: standby the keeper chose there just before the node was marked leaving may land after the
#: first pass; none chosen after it does (:meth:`Standbys.remove_node`).
REMOVAL_PASSES = 3


@dataclass(frozen=True)
class WantedStandby:
    """Where a PE's missing standby should start, and the PE as it was when that was
    decided: a copy of its primary taken then serves only if this is still so."""

    primary: str
    target: str
    epoch: int  # the PE's (a migration or restore since raised it)
    deployed: float  # its pipeline's status change (a fresh deploy since is another history)


#: How long the standby keeper, back from a standby's warm-up, waits for the PE's exclusive
#: section while other rounds hold it (the follower's holds it for two 5-s requests at most).
STANDBY_TURN_WAIT_S = 15.0


def _here(pipeline: str, element: str) -> str:
    return f"/pipelines/{pipeline}/elements/{element}"


class Standbys(Deployment):
    """The orchestrator's hot standbys."""

    # -- where ------------------------------------------------------------------------------

    def _ready(self, node: NodeRecord | None) -> bool:
        return node is not None and self.healthy(node) and node.report.ready

    def _may_keep(self, node: NodeRecord | None) -> bool:
        """Whether a standby may be started, stay or be promoted on ``node``: ready, and
        not being taken out of the cluster."""
        return self._ready(node) and node is not None and node.name not in self.leaving_nodes()

    def standby_node(self, record: PipelineRecord, element: ElementSpec) -> str | None:
        """Where the PE's standby should be started now (``None``: none wanted, or no node
        can take it): the spec's node, or with ``planned`` the planner's redeploy node, else
        the healthy node the registry places the fewest PEs and standbys on (one whose disk is
        nearly full last: :meth:`short_of_disk`) — never the PE's own node. While the PE runs
        on the spec's node (its standby there was promoted), as with ``planned``: it had no
        standby at all after its first promotion."""
        wanted = record.spec.recovery.standby
        current = record.placement[element.id]
        if wanted is None or not wants_standby(element):
            return None
        if wanted not in (PLANNED_STANDBY, current):
            return wanted if self._may_keep(self.registry.node(wanted)) else None
        candidates = [n for n in self.registry.nodes() if n.name != current and self._may_keep(n)]
        ranked = self.best_nodes(candidates, record.name, element.id)
        return ranked[0] if ranked else None

    def standby_missing(self, record: PipelineRecord, element: ElementSpec) -> str | None:
        """Why the PE has no standby though its spec asks for one (``status``: its
        protection gone while its node is down was shown as no standby at all)."""
        wanted = record.spec.recovery.standby
        if (
            wanted is None
            or not wants_standby(element)
            or record.status != PipelineState.RUNNING
            or self.registry.standby(record.name, element.id) is not None
        ):
            return None
        current = record.placement[element.id]
        if wanted not in (PLANNED_STANDBY, current) and not self._may_keep(
            self.registry.node(wanted)
        ):
            leaving = wanted in self.leaving_nodes()
            return f"its node {wanted} is {'leaving' if leaving else 'not up'}"
        target = self.standby_node(record, element)
        if target is None:
            return "no other node can take it"
        return f"being started on {target}"

    # -- keeping them -----------------------------------------------------------------------

    def keep_standbys(self) -> None:
        """Give every running PE that should have a standby one: start it where missing,
        start it again where its node lost it or it broke, drop one no longer wanted. A PE
        with an unfinished journal entry is left to its resolution."""
        pending = {(op.pipeline, op.element) for op in self.registry.unfinished()}
        for record in self.registry.pipelines():
            if record.status != PipelineState.RUNNING:
                continue
            for element in record.spec.elements:
                key = (record.name, element.id)
                if key in pending or key in self._migrating:
                    continue
                try:
                    self._keep_standby(record.name, element.id)
                except FogshiftError:
                    continue  # logged by _exclusive; tried again next round
                except Exception:  # one PE's trouble must not stop the others' standbys
                    log.exception("keeping the standby of %s/%s failed", *key)

    def _keep_standby(self, pipeline: str, element_id: str) -> None:
        """:meth:`keep_standbys` for one PE: inside its exclusive section, drop a standby
        that may not stay and choose where a missing one goes; outside it, copy the
        primary's checkpoint (a primary that froze during the copy held the section, and
        with it the PE's restore, for a whole request timeout: 2 min); inside again, start
        the standby from the copy if nothing changed meanwhile (else next round); outside
        again, wait until it is warm (seconds, up to two minutes for a node's first stateful
        query or a large state: a restore meanwhile promotes it as it is); inside again,
        raise its cap to where the primary has committed, if it is still the standby."""
        key = (pipeline, element_id)
        # (Its own label: a restore refused while the keeper looked at a PE with no standby
        # said "the start of its standby is under way".)
        with self._exclusive(*key, STANDBY_LOOK):
            wanted = self._standby_wanted(pipeline, element_id)
        if wanted is None:
            return
        record = self.registry.get_pipeline(pipeline)
        if record is None:
            return
        element = record.spec.element(element_id)
        with self._lock:
            # (Its inputs' records it re-runs from must stay: orchestrator.history.)
            self._standby_copies.add(key)
        try:
            copy = warm_copy(pipeline, element, self.agent(wanted.primary))
            with self._exclusive(*key, "standby"):
                now = self._standby_wanted(pipeline, element_id)
                if now != wanted:
                    log.info("the standby of %s/%s is not started from the copy taken on %s: "
                             "the PE changed meanwhile (tried again next round)", pipeline,
                             element_id, wanted.primary)  # fmt: skip
                    return
                epoch = self._start_standby(pipeline, element, wanted, copy)
            self._warm_standby(pipeline, element, wanted, copy, epoch)
        finally:
            with self._lock:
                self._standby_copies.discard(key)

    def _warm_standby(
        self, pipeline: str, element: ElementSpec, wanted: WantedStandby, copy: WarmCopy,
        epoch: int,
    ) -> None:  # fmt: skip
        """Wait, outside the PE's exclusive section, until the standby started under
        ``epoch`` is warm, then raise its cap inside it if it is still the PE's standby (a
        restore may have promoted it meanwhile: its gate is then the PE's own). One that
        does not get warm is dropped, if still the standby."""
        key = (pipeline, element.id)
        target = (wanted.target, self.agent(wanted.target))

        def still() -> bool:
            now = self.registry.standby(pipeline, element.id)
            return now is not None and (now.node, now.epoch) == (wanted.target, epoch)

        try:
            warm_up(pipeline, element, target, copy)
        except FogshiftError as exc:
            log.warning("standby of %s/%s on %s did not get warm: %s", pipeline, element.id,
                        wanted.target, exc.render())  # fmt: skip
            with contextlib.suppress(MigrationInProgress), self._standby_turn(key):
                if still():
                    self.drop_standby(self.registry.standby(pipeline, element.id))
            # (Else the keeper drops it once its node reports it broken, or the promotion
            # that holds the PE made it the PE.)
            raise
        took_ms = round((time.perf_counter() - copy.started) * 1000, 1)
        try:
            with self._standby_turn(key):
                if not still():
                    return  # promoted, dropped or replaced while it warmed up
                if self._unresolved(*key):
                    # A promotion that failed unforeseen while it warmed up may have made
                    # it the PE: capped at the fenced primary, it stalled until resolved
                    # (the follower raises the cap once the entry is).
                    return
                first_follow(pipeline, element, (wanted.primary, self.agent(wanted.primary)),
                             target)  # fmt: skip
                self.standby_ready_ms[key] = took_ms
        except MigrationInProgress:
            return  # (an operation holds the PE: the follower raises the cap if it stands)
        log.info("standby of %s/%s on %s ready in %.0f ms (%d bytes of state)", pipeline,
                 element.id, wanted.target, took_ms, len(copy.fetched[0]))  # fmt: skip

    @contextlib.contextmanager
    def _standby_turn(self, key: tuple[str, str]) -> Iterator[None]:
        """The PE's exclusive section for the standby keeper, once free: a background round
        is refused a section another round holds (the follower's, a few requests long), and
        the keeper, back from a warm-up outside it, must not drop what it came to do.

        Raises:
            MigrationInProgress: Still held after :data:`STANDBY_TURN_WAIT_S` (an operation
                someone asked for, such as the PE's restore, holds it).
        """
        deadline = time.monotonic() + STANDBY_TURN_WAIT_S
        while True:
            section = contextlib.ExitStack()
            try:
                section.enter_context(self._exclusive(*key, "standby"))
                break
            except MigrationInProgress:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        with section:
            yield

    def _standby_wanted(self, pipeline: str, element_id: str) -> WantedStandby | None:
        """Inside the PE's exclusive section: drop its standby if it may not stay, and say
        where a missing one should be started (``None``: none wanted now)."""
        record = self.registry.get_pipeline(pipeline)
        if record is None or record.status != PipelineState.RUNNING:
            return None
        element = record.spec.element(element_id)
        primary = record.placement[element_id]
        current = self.registry.standby(pipeline, element_id)
        if current is not None:
            if self._standby_sound(record, element, current):
                return None
            self.drop_standby(current)
        if not self._ready(self.registry.node(primary)):
            return None  # nothing to copy from: the restore of the PE comes first
        target = self.standby_node(record, element)
        if target is None:
            return None
        there = self.registry.node(target)
        if there is not None and any(
            (e.pipeline, e.element) == (pipeline, element_id) for e in there.report.elements
        ):
            # An instance of the PE still runs there (a rolled-back migration's target, a
            # woken zombie), which the reconciler removes: its agent refused the standby's
            # start, and each try took an epoch. Next round.
            return None
        return WantedStandby(
            primary, target, self.registry.epoch(pipeline, element_id), record.status_since
        )

    def _start_standby(
        self, pipeline: str, element: ElementSpec, wanted: WantedStandby, copy: WarmCopy
    ) -> int:
        """Start the PE's standby where ``wanted`` says, from ``copy``, capped at it; inside
        the PE's exclusive section. (Its warm-up is waited for outside: :meth:`_warm_standby`.)

        Returns:
            The standby's epoch.
        """
        epoch = self.registry.add_standby(pipeline, element.id, wanted.target)
        log.info("starting a standby of %s/%s on %s (epoch %d; the PE runs on %s)",
                 pipeline, element.id, wanted.target, epoch, wanted.primary)  # fmt: skip
        try:
            self.permissions.sync(self.registry)  # it reads the PE's inputs and stream
            start_standby(pipeline, element, (wanted.target, self.agent(wanted.target)), epoch,
                          copy)  # fmt: skip
        except Exception:  # whatever it left on the target is discarded with it
            self.drop_standby(self.registry.standby(pipeline, element.id))
            raise
        return epoch

    def _standby_sound(
        self, record: PipelineRecord, element: ElementSpec, standby: StandbyRecord
    ) -> bool:
        """Whether ``standby`` may stay: still wanted there, its node healthy, and running
        under its epoch as its node reports (or started too recently to be reported)."""
        if record.spec.recovery.standby is None or not wants_standby(element):
            return False
        wanted = record.spec.recovery.standby
        primary = record.placement[element.id]
        if standby.node == primary or wanted not in (PLANNED_STANDBY, standby.node, primary):
            return False
        node = self.registry.node(standby.node)
        if (
            node is not None
            and node.last_seen < self.started_at
            and time.time() - self.started_at <= self.config.node_timeout_s
        ):
            # Not heard from since this orchestrator started (as the reconciler, it grants
            # the node its timeout first): judged by a report, not the one before the
            # restart (warm standbys were dropped in the first round after one).
            return True
        if not self._may_keep(node):
            return False
        assert node is not None
        reported = node.report.element(record.name, element.id)
        if reported is None:
            return time.time() - standby.updated < REPORT_GRACE_S
        broken = reported.state == PEState.FENCED or (
            reported.state == PEState.FAILED and reported.retry_in_s is None
        )
        return reported.epoch == standby.epoch and not broken

    def drop_standby(self, standby: StandbyRecord | None) -> None:
        """Forget ``standby`` and discard its instance (if its node does not answer, the
        reconciler removes it once it does: it is neither the placement nor a standby).
        Inside the PE's exclusive section."""
        if standby is None:
            return
        key = (standby.pipeline, standby.element)
        self.registry.drop_standby(*key, epoch=standby.epoch)
        self.followed.pop(key, None)
        self.standby_ready_ms.pop(key, None)
        log.info("dropping the standby of %s/%s on %s", *key, standby.node)
        if not self._ready(self.registry.node(standby.node)):
            return  # a silent node may hold a request for long: the reconciler removes it later
        try:
            self.agent(standby.node).delete(
                _here(*key), params={"discard": True}, timeout=DROP_TIMEOUT_S
            )
        except UnknownElement:
            pass
        except FogshiftError as exc:
            log.info("standby of %s/%s on %s not removed: %s", *key, standby.node, exc.message)

    def drop_standby_on(self, pipeline: str, element_id: str, node: str) -> None:
        """Drop the PE's standby if it runs on ``node`` (a migration is about to put the PE
        itself there). Inside the PE's exclusive section."""
        standby = self.registry.standby(pipeline, element_id)
        if standby is not None and standby.node == node:
            self.drop_standby(standby)

    # -- a node taken out -------------------------------------------------------------------

    def remove_node(self, name: str) -> None:
        """Take node ``name`` out of the cluster (:meth:`OrchestratorCore.remove_node`); the
        standbys the keeper chose there do not keep it: each is dropped (inside its PE's
        section) and the keeper's next round starts it on another node, as it starts a
        missing one (meanwhile a restore of its PE starts from the PE's checkpoint, as for a
        PE without a standby). A pipeline whose spec names the node as its standby node
        (``recovery.standby: NODE``) keeps it: the keeper would put its standbys back there.

        Nothing is dropped while something else keeps the node (a PE, an unfinished
        operation, such a pipeline), nor while a user's operation holds one of the PEs
        whose standby would be dropped: every such PE's section is taken before any
        standby is dropped, and what keeps the node is looked at again then. While the
        removal runs (and while a drain's lease holds, :meth:`drain_lease`) no standby is
        started or kept there, and no PE is deployed, scaled, migrated, restored or
        promoted there (:meth:`leaving_nodes`, :meth:`_may_keep`, ``_usable_node``); a standby
        the keeper had chosen there just before, landing after the drops, is dropped in a
        second pass.

        Raises:
            NodeInUse: Something other than the keeper's standbys keeps the node (nothing
                changed), or came to keep it after the standbys were dropped (a PE placed
                there by a choice made before the removal began).
            MigrationInProgress: A user's operation (or, after a minute, a round of the
                orchestrator's own) holds the PE of a standby to drop; nothing was dropped
                in that pass (in the first: nothing at all; the message says which).
        """
        # (Marked before the first look: a choice made after the look and before the mark
        # could still place something there.)
        with self._lock:
            self._leaving[name] += 1
        try:
            held = self.holds(name)
            if held:
                raise node_in_use(name, held)
            for attempt in range(REMOVAL_PASSES):
                self._drop_movable_standbys(name, first=attempt == 0)
                try:
                    super().remove_node(name)
                    return
                except NodeInUse:
                    # (A standby the keeper started there after the first pass is dropped
                    # in the next; anything else is the refusal, said without the ones a
                    # next pass would drop.)
                    held = self.holds(name)
                    if attempt + 1 == REMOVAL_PASSES or held:
                        raise node_in_use(name, held or self.registry.holding(name)) from None
        except FogshiftError as exc:
            log.warning("the removal of node %s was refused: %s", name, exc.render())
            raise
        finally:
            with self._lock:
                self._leaving[name] -= 1
                if self._leaving[name] <= 0:
                    del self._leaving[name]

    def _drop_movable_standbys(self, name: str, first: bool) -> None:
        """Drop the standbys the keeper chose on node ``name`` (one pass of
        :meth:`remove_node`; ``first``: the first, before which nothing was dropped): all
        their PEs' sections are taken first (within one :data:`BACKGROUND_WAIT_S` for the
        orchestrator's own rounds, not one per PE), then what keeps the node is looked at
        again, and only then is any standby dropped.

        Raises:
            NodeInUse: Something other than those standbys keeps the node; none dropped
                in this pass.
            MigrationInProgress: A PE's section is held (see :meth:`remove_node`); none
                dropped in this pass.
        """
        movable = self._movable_standbys(name)
        deadline = time.monotonic() + BACKGROUND_WAIT_S
        with contextlib.ExitStack() as sections:
            for key in movable:
                left = deadline - time.monotonic()
                try:
                    sections.enter_context(
                        self._exclusive(*key, NODE_REMOVAL, left, log_failure=False)
                    )
                except MigrationInProgress as exc:
                    done = ("nothing was changed" if first else "the standbys the keeper had "
                            "put there before were dropped already")  # fmt: skip
                    raise MigrationInProgress(
                        f"node {name!r} is not removed: its standby of {key[0]}/{key[1]} "
                        f"cannot be moved now ({exc.message}); {done}",
                        expected="no other operation holding the PE",
                        received=exc.message,
                        hint="wait for that operation to end, then remove the node again",
                    ) from exc
            held = self.holds(name)
            if held:
                raise node_in_use(name, held)
            for key in movable:
                standby = self.registry.standby(*key)
                if standby is not None and standby.node == name:
                    log.info("node %s is being removed: its standby of %s/%s moves to "
                             "another node", name, *key)  # fmt: skip
                    self.drop_standby(standby)

    def holds(self, name: str) -> list[NodeHold]:
        """What keeps node ``name`` in the cluster now: what :meth:`remove_node` would
        refuse on (the standbys the keeper chose there do not keep it)."""
        return self.registry.holding(name, besides=self._movable_standbys(name))

    def _movable_standbys(self, name: str) -> list[tuple[str, str]]:
        """The PEs (pipeline, element) whose standby is on node ``name`` by the keeper's
        choice, not because their spec names the node."""
        movable = []
        for standby in self.registry.standbys():
            if standby.node != name:
                continue
            record = self.registry.get_pipeline(standby.pipeline)
            if record is None or record.spec.recovery.standby != name:
                movable.append((standby.pipeline, standby.element))
        return movable

    # -- following --------------------------------------------------------------------------

    def follow_standbys(self) -> None:
        """Raise every standby's cap to where its primary has committed (one round)."""
        nodes = {n.name: n for n in self.registry.nodes()}
        for standby in self.registry.standbys():
            key = (standby.pipeline, standby.element)
            primary = self._primary_of(standby)
            if primary is None:
                continue
            if not (self._ready(nodes.get(primary)) and self._ready(nodes.get(standby.node))):
                continue
            try:
                with self._exclusive(*key, "standby follow"):
                    # Judged again: a promotion just before the section was free made the
                    # standby the PE, and capping it at the fenced primary stalled it until
                    # the next reconcile round.
                    now = self.registry.standby(*key)
                    # Nor one a dead orchestrator's promotion left unresolved: it may be the
                    # PE already (fenced its primary, opened its gate), and capped at the
                    # primary's position it stalled until that entry was resolved.
                    if (
                        now is not None
                        and (now.node, now.epoch) == (standby.node, standby.epoch)
                        and self._primary_of(now) == primary
                        and not self._unresolved(*key)
                    ):
                        self._follow_one(now, primary)
            except MigrationInProgress:
                continue  # a migration, restore or start of the standby owns it now
            except Exception:  # one standby's trouble must not stall the others' caps
                log.exception("following the standby of %s/%s on %s failed", *key, standby.node)

    def _primary_of(self, standby: StandbyRecord) -> str | None:
        """The node of the running PE ``standby`` follows (``None``: none to follow)."""
        record = self.registry.get_pipeline(standby.pipeline)
        if record is None or record.status != PipelineState.RUNNING:
            return None
        primary = record.placement.get(standby.element)
        return None if primary is None or primary == standby.node else primary

    def _follow_one(self, standby: StandbyRecord, primary: str) -> None:
        key = (standby.pipeline, standby.element)
        here = _here(*key)
        last = self.followed_of(standby)
        try:
            now, answer = follow(
                here, self.agent(primary), self.agent(standby.node), last.primary if last else None
            )
        except FogshiftError as exc:
            # Its node is slow or lost it: keep_standbys judges that from the heartbeats.
            log.debug("following %s/%s on %s: %s", *key, standby.node, exc.message)
            return
        if answer is None and last is not None and last.standby is not None:
            if last.standby.progress >= now.progress:
                return
            # The primary committed nothing new, and the standby was behind when its cap
            # was last raised: seen again, or `status` showed that lag for as long as the
            # pipeline stayed idle (the standby long caught up).
            try:
                answer = self.agent(standby.node).call(
                    ElementProgress, "GET", here + "/progress", timeout=5.0
                )
            except FogshiftError as exc:
                log.debug("following %s/%s on %s: %s", *key, standby.node, exc.message)
                return
        if answer is not None:
            self.followed[key] = Followed(primary=now, standby=answer)

    def run_standby_follower(self) -> None:
        """Loop :meth:`follow_standbys` until :meth:`close`."""
        self._every(self.config.standby_follow_s, self.follow_standbys, "standby follower")

    def run_standby_keeper(self) -> None:
        """Loop :meth:`keep_standbys` (every ``reconcile_s``) until :meth:`close`."""
        self._every(self.config.reconcile_s, self.keep_standbys, "standby keeper")

    # -- promotion --------------------------------------------------------------------------

    def promote_standby(
        self, element: ElementSpec, pipeline: str, current: str, standby: StandbyRecord
    ) -> RestoreReport:
        """Make ``standby`` the PE (its primary was on ``current``), journaled as a restore
        under the standby's epoch; inside the PE's exclusive section.

        Raises:
            RestoreFailed: The standby could not take over; it was dropped (the caller
                restores from a checkpoint).
        """
        key = (pipeline, element.id)
        op = self.registry.begin_operation(
            OperationKind.RESTORE, pipeline, element.id, current, standby.node, self.run_id,
            RestorePhase.STARTING, epoch=standby.epoch,
        )  # fmt: skip
        try:
            # Before its gate opens: its node may write the PE's records from here on (a
            # standby's may not), and the lost node no longer may.
            self.permissions.sync(self.registry)
        except BrokerError as exc:
            self.registry.finish(op.id, "failed")  # (nothing was fenced or opened)
            raise RestoreFailed(
                f"cannot promote the standby of {pipeline}/{element.id} on {standby.node}: "
                f"its node could not be given the PE's broker rights: {exc.message}",
                hint="the PE is restored from its checkpoint instead",
            ) from exc
        log.info("promoting the standby of %s/%s on %s (epoch %d; the PE was on %s)",
                 pipeline, element.id, standby.node, standby.epoch, current)  # fmt: skip
        try:
            self._test_pause("restore:promoting")
            report = promote(
                pipeline, element, standby.epoch, (standby.node, self.agent(standby.node)),
                self.broker, steps=RestoreSteps(phase=partial(self._enter, op)),
            )  # fmt: skip
        except RestoreFailed as exc:
            self.registry.finish(op.id, "failed")
            with contextlib.suppress(FogshiftError):
                self.drop_standby(standby)
            if isinstance(exc.report, RestoreReport):
                self.last_restore[key] = exc.report
            raise
        self.registry.route(op.id, standby.node)  # the PE's epoch becomes the standby's
        self.registry.finish(op.id, "restored")
        self.followed.pop(key, None)
        self.standby_ready_ms.pop(key, None)
        self.last_restore[key] = report
        self.plan_soon.set()
        log.info("promoted the standby of %s/%s: %s", pipeline, element.id,
                 report.model_dump(mode="json"))  # fmt: skip
        return report
