"""Scaling a partitioned keyed PE out and in while it runs (``fogshift scale``, issue #16).

A rescale is one record in the partitions' input: a key move with a ``count``
(:mod:`fogshift.broker.keys`). From its place on every key belongs to its partition of the
new count, in every execution. The orchestrator

1. places the added partitions (their own streams, epochs and fence markers; each reads
   the input from where it stood then, and owns nothing before the record but the keys the
   waves below move to it) and restarts the element's consumers to read them too (each
   under a new epoch, from its checkpoint);
2. lists the keys that hold state and change partition: the keys in each partition's state
   store as of its newest committed batch, plus the keys of every event, move and state
   stored in the input after the oldest of those batches, each with its owner as the
   moves stored give it;
   (first, with ``waves``, the keys in the state stores go to their partitions
   of the new count by key moves in waves, as ``migrate --keys`` moves keys: so each stops
   only while its wave crosses, and the list at the record holds only those seen since);
3. appends the record only if nothing came into the input after what it looked at
   (``Nats-Expected-Last-Sequence``), else it looks at what came and tries again — so no
   key gains state unseen before the record (with several inputs, to each in turn, each
   record listing what was seen until its append in any input and no earlier record
   lists: the move's keys are the
   union of its records, see :func:`~fogshift.broker.keys.listed_unions`);
4. waits, as for a key move, until every listed key's state is stored and committed by its
   new owner.

Scaling in is the same record with a smaller count (its waves first take the keys with state
off the partitions that go): the partitions from the new count on own nothing after it,
send the states of all the keys they still have, and once each has committed past the
record it is removed (spec, placement, standby, instance) and its stream fenced under a new
epoch, so nothing more is ever appended to it; its consumers read it on as an input that
has ended (their origins, sums of input positions, stay as they were). Scaling out again
gives a partition of that number a new epoch on the same stream, which its consumers still
read.

Nothing pauses: the keys that keep their partition never notice, a moved key waits for its
state. An added partition reads the input from where it stood when placed, before the first
wave, so it reads every key move to it. A failure before the record leaves the element at
its old count, with the keys moved by waves at their new partitions; the same ``scale``
again finishes the job, as it does only what is missing, and a ``scale`` back to the old
count rescales anyway (:func:`_rescaled_to`), so that no key stays on a partition it
retires. ``timeout_s`` bounds each phase: each wave's states, the commits, the rescale's
states, the retirement.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.client import ensure_pe_stream, last_seq
from fogshift.broker.exceptions import BrokerError, BrokerUnavailable
from fogshift.broker.keys import KeyMove, Ownership
from fogshift.broker.naming import stream_name
from fogshift.broker.publish import fence
from fogshift.common.names import NAME_PATTERN
from fogshift.common.text import one_line
from fogshift.contracts import ElementInfo, KeyMoveStatus, KeyOrder, KeyWave, ScaleReport
from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, NotFound, Unavailable
from fogshift.migration.exceptions import MigrationInProgress
from fogshift.orchestrator import journal
from fogshift.orchestrator.deployment import shared_node_warnings
from fogshift.orchestrator.keymoves import KeyMoves, _ms_since
from fogshift.orchestrator.locks import LOCK_WAIT_S, element_lock
from fogshift.orchestrator.registry import PipelineRecord, ScaleEntry
from fogshift.spec.models import (
    ElementSpec,
    Partition,
    PipelineSpec,
    partition_id,
    partition_of_key,
)

log = logging.getLogger(__name__)


class Scaling(KeyMoves):
    """``fogshift scale``: more or fewer partitions for a partitioned keyed element."""

    def scale(
        self,
        pipeline: str,
        element_id: str,
        partitions: int,
        nodes: list[str] | None = None,
        timeout_s: float = 90.0,
        waves: bool = False,
        resume: ScaleEntry | None = None,
        lock_wait_s: float = LOCK_WAIT_S,
    ) -> ScaleReport:
        """Give the partitioned element ``element_id`` ``partitions`` partitions (more or
        fewer) while every partition keeps running.

        The scale is journaled from the moment it holds the element to its end (an earlier
        one left unfinished is superseded), so an orchestrator that dies in it leaves it for
        the next to carry on (:meth:`~fogshift.orchestrator.reconciler.Reconciler.recover_scales`).
        It holds the element's key-move lock throughout, but the exclusive sections of the
        partitions and their consumers only while it changes them (placing, restarting,
        retiring): a partition lost while it waits is restored meanwhile.

        Args:
            nodes: The nodes of the added partitions, one each (default: the healthy nodes
                hosting fewest partitions of the element, in turn; one whose disk is
                nearly full last).
            waves: Move the keys in the state stores whose partition changes ahead of the
                rescale, in waves (:meth:`_ahead`); else all at the rescale record. Waves
                stop a key less and take longer, disturbing the partitions longer
                (``bench pam``, 20 and 1000 keys): not the default.
            resume: The unfinished journal entry this call carries on (the recovery's;
                ``None``: a new scale). It stays unfinished if a node or the broker is
                away, or a PE is held by another operation, for a later round to try again.
            lock_wait_s: How long to wait for a key move or scale of the element (or of a
                partitioned reader of it) that runs.

        Returns:
            ``moved`` once every moved key's new owner committed its state (and, scaling in,
            the partitions beyond ``partitions`` are retired); ``pending`` when a phase took
            longer than ``timeout_s`` (a wave's states, the commits, the rescale's states,
            the retirement): what was stored stands, as a key move's does.

        Raises:
            InvalidInput: Not a partitioned element whose keys move, wrong ``nodes``, too
                many keys moving; nothing changed.
            Conflict: A key still waits for a key move's state (the scale's own, too: the
                same request goes on once it came); nothing more changed.
            Unavailable: A node is not healthy; the same request again finishes what was
                started (ownership changes only by the waves' key moves and the rescale
                record, each complete on its own).
        """
        started = time.monotonic()
        record = self.pipeline(pipeline)
        what = f"scale {pipeline}/{element_id}"
        parts = self._movable_parts(
            record, element_id, f"cannot {what}",
            whole="only an element written with `partitions:` (and `key_by`) scales: deploy "
            "the spec again with them",
        )  # fmt: skip
        if partitions < len(parts) and nodes:
            raise InvalidInput(
                f"cannot {what} in to {partitions} partitions with nodes for added ones",
                expected="no --on when scaling in (partitions are retired, none added)",
                received=", ".join(nodes),
                hint=f"`fogshift scale {pipeline} {element_id} --partitions {partitions}`",
            )
        self._refuse_plain_readers(record, parts, partitions, what)
        adding = max(partitions - len(parts), 0)
        placed = self._nodes_for(record.placement, parts, adding, nodes, what) if adding else []
        old = [p.id for p in parts]
        new = [partition_id(element_id, i) for i in range(len(parts), partitions)]
        others = {e.id for e in record.spec.elements} - set(old)
        bad = [n for n in new if n in others or not NAME_PATTERN.fullmatch(n)]
        if bad:
            raise InvalidInput(
                f"cannot {what} to {partitions} partitions: an added partition's id "
                f"{bad[0]!r} is another element's, or too long",
                expected="ids of added partitions that no element has, of at most 63 characters",
                received=repr(bad[0]),
                hint="rename that element (deployed afresh), or scale to fewer partitions",
            )
        readers = [e.id for e in record.spec.elements if set(old) & set(e.inputs)]
        self._key_subjects(pipeline, parts[0].inputs[0])
        # One key move or scale of an element at a time, and no migration, restore or
        # reconciler restart of its partitions (added ones too) or consumers while they
        # change (see _scale for how long). The key moves of its partitioned readers wait
        # too: one stored while this scale waits would be lost to a reader that reads its
        # partitions merged after it.
        movers = sorted({e.partition.of for e in record.spec.elements
                         if e.id in readers and e.partition is not None})  # fmt: skip
        with contextlib.ExitStack() as held:
            held.enter_context(element_lock(pipeline, element_id, f"cannot {what}", lock_wait_s))
            for mover in movers:  # (downstream of this element: no lock order cycles)
                held.enter_context(element_lock(pipeline, mover, f"cannot {what}", lock_wait_s))
            sections = held.enter_context(contextlib.ExitStack())
            sections.enter_context(self._sections(pipeline, [*old, *new, *readers]))
            self._unchanged(pipeline, element_id, parts, f"cannot {what}")
            self._refuse_plain_readers(self.pipeline(pipeline), parts, partitions, what)
            self._moves_completed(pipeline, element_id, parts[0].inputs)
            taken_over: list[str] = []
            if resume is None:
                # (An earlier scale left open — its rescale stored, carried on by the
                # reconciler — is superseded by this one: which must then stay open as it
                # did, or the partitions it retires stayed placed, owning nothing.)
                taken_over = [e.id for e in self.registry.unfinished_scales()
                              if (e.pipeline, e.element) == (pipeline, element_id)]  # fmt: skip
                entry = self.registry.begin_scale(pipeline, element_id, partitions, nodes,
                                                  waves, self.run_id)  # fmt: skip
            else:
                entry = self.registry.scale(resume.id) or resume
                if entry.outcome is not None:
                    raise Conflict(
                        f"cannot carry on scale {resume.id} of {pipeline}/{element_id}: it "
                        f"ended meanwhile ({entry.outcome})",
                        expected="a scale left unfinished",
                        received=f"scale {resume.id}, {entry.outcome}",
                        hint="nothing to do: a newer scale or a round before this one saw to it",
                    )
            progress = _Progress()
            try:
                report = self._scale(pipeline, element_id, parts, partitions, placed, started,
                                     timeout_s, waves, sections, progress)  # fmt: skip
            except FogshiftError as exc:
                held_up = isinstance(exc, (Unavailable, BrokerError, Conflict))
                if resume is None:
                    if held_up and progress.unsure:
                        raise _carried_on(exc, pipeline, element_id, partitions,
                                          unsure=True) from exc  # fmt: skip
                    if held_up and progress.rescaled and not isinstance(exc, Conflict):
                        # The rescale stands (keys moved by it): ended here, the partitions
                        # it retires would stay placed, running, owning nothing (one fenced
                        # and restarted), until someone asked the same scale again. Left
                        # open, the reconciler's rounds carry it on as that.
                        raise _carried_on(exc, pipeline, element_id, partitions) from exc
                    if taken_over:
                        # (The hints say "ask the same scale again": doing so ended the open
                        # one as superseded, then this one as failed — a key still waiting —
                        # and nothing carried the rescale on.)
                        raise _taken_over(exc, pipeline, element_id, partitions,
                                          taken_over) from exc  # fmt: skip
                elif held_up:
                    raise  # (carried on: a later round tries again)
                self.registry.end_scale(entry.id, f"failed: {one_line(exc.message)}")
                raise
            except BaseException:
                self.registry.end_scale(entry.id, "failed")
                raise
            if (
                report.status == KeyMoveStatus.PENDING
                and progress.rescaled
                and partitions < len(parts)
            ):
                # The rescale stands but a state or a commit did not come in time (a node
                # lost, its partition restored meanwhile): ended "pending", the partitions
                # it retires stayed placed, running, owning nothing, for good. Left open,
                # the reconciler's rounds carry it on.
                return report.model_copy(update={"error": (
                    f"{report.error or 'a phase took longer than its time'}; the orchestrator "
                    "carries the scale on by itself (retiring the partitions once they have "
                    "processed the rescale)"
                )})  # fmt: skip
            self.registry.end_scale(entry.id, str(report.status))
            self.plan_soon.set()  # (its added partitions have no backup until planned)
            shared = shared_node_warnings(self.pipeline(pipeline), element_id)
            return report.model_copy(update={"warnings": shared}) if shared else report

    def _refuse_plain_readers(
        self, record: PipelineRecord, parts: list[ElementSpec], partitions: int, what: str
    ) -> None:
        """Refuse to scale out of one partition an element whose readers read that partition
        as a plain input (it was deployed with one partition), partitioned readers or not.

        A reader numbers a plain input's records by their stream sequence (a partition
        whose keys move too: see ``JetStreamReader._partition_rows`` in
        :mod:`fogshift.broker.datasource`), and a merged group's densely: after the scale a
        batch run again (the one in flight at its restart, or any from a checkpoint of
        before) would number the same records lower, and its writer skip those at or below
        what it stored: output lost. A partitioned reader's keys could no longer move
        either, and those moved before would go back to their CRC-32 partitions, which hold
        no state for them.

        Raises:
            InvalidInput: Such a reader exists; nothing was changed.
        """
        if not len(parts) == 1 < partitions:
            return
        only = parts[0].id
        plain = sorted({
            e.partition.of if e.partition is not None else e.id for e in record.spec.elements
            if only in e.inputs and not any(only in group for group in e.merged)
        })  # fmt: skip
        if plain:
            # (Found by reviews: first for readers that are not partitioned, then for
            # partitioned ones, which were let through as "numbering every input by
            # sequence" — until the scale makes them read a merged group.)
            raise InvalidInput(
                f"cannot {what} out of one partition: {', '.join(plain)} read"
                f"{'s' if len(plain) == 1 else ''} {only} as a plain input, whose records "
                "they number by stream sequence; merged with other partitions they would "
                "be numbered anew, and a batch run again could skip outputs",
                expected="an element deployed with two partitions or more (its readers then "
                "read them merged from the start)",
                received=f"{only} (one partition) read by " + ", ".join(plain),
                hint="deploy the pipeline afresh with `partitions: [NODE, NODE, ...]` of two "
                "or more (it may scale in and out between 1 and more from then on)",
            )

    def _scale(
        self, pipeline: str, element_id: str, parts: list[ElementSpec], partitions: int,
        placed: list[str], started: float, timeout_s: float, waves: bool = False,
        sections: contextlib.ExitStack | None = None, progress: _Progress | None = None,
    ) -> ScaleReport:  # fmt: skip
        """The scale's steps (see :meth:`scale`). ``sections`` holds the exclusive sections
        of the partitions and their consumers: released once the added partitions are
        placed and the consumers restarted. ``progress`` is told once the rescale stands."""
        progress = progress or _Progress()
        what = f"scale {pipeline}/{element_id}"
        first = parts[0].partition
        assert first is not None
        source = parts[0].inputs[0]
        owners = self._owners(pipeline, source, element_id, first.first_count)
        if owners.pending:
            # A wait, not a refusal for good (409): a scale's own waves and rescale leave
            # keys waiting while their states cross, which is when an orchestrator that
            # dies most likely dies, and its recovery ended the scale as refused (the
            # partitions a scale-in retires never retired) instead of trying it again.
            raise Conflict(
                f"cannot {what} now: keys {', '.join(sorted(owners.pending)[:5])} still "
                "wait for the state of an earlier key move",
                expected="no key move under way",
                received=f"{len(owners.pending)} keys waiting",
                hint="that move completes when its origin partition runs (restore it if "
                "its node is lost); then scale again (a scale an orchestrator's restart "
                "carries on is tried again by itself)",
            )
        try:
            added, consumers = self._place(self.pipeline(pipeline).spec, parts, partitions,
                                           placed, source)  # fmt: skip
        except _STEP_FAILED as exc:  # (a node or the broker refused, after the spec changed?)
            raise self._unfinished_scale(
                exc, pipeline, element_id, owners.count, ran=False
            ) from exc
        # What changes the partitions and their consumers is done. From here on the scale
        # appends to the input and waits for the partitions to process what it appended,
        # as a key move does, which holds no partition: a partition whose node is lost
        # meanwhile is restored, and sends its states or commits where it runs then (held,
        # its restore waited for the scale to give up its wait, a minute and more, while
        # the scale waited for it). The retirement takes the sections it needs again.
        if sections is not None:
            sections.close()
        self._test_pause("scale:placed")
        base: dict[str, Any] = {
            "pipeline": pipeline, "element": element_id, "before": len(parts),
            "after": partitions, "added": {e.id: e.node for e in added},
            "consumers": [c.id for c in consumers],
        }  # fmt: skip
        report = ScaleReport(**base, status=KeyMoveStatus.MOVED)
        at = owners.rescaled
        if not _rescaled_to(owners, partitions):  # else done by an earlier call
            ahead: dict[str, int] = {}
            try:
                listed = self._listed_keys(pipeline, parts)
            except _STEP_FAILED as exc:  # (a partition's node away: the added ones run)
                raise self._unfinished_scale(exc, pipeline, element_id, owners.count) from exc
            if waves:
                report, ahead = self._ahead(pipeline, element_id, source, listed.keys,
                                            partitions, owners, timeout_s, report,
                                            listed.sizes)  # fmt: skip
                if report.status != KeyMoveStatus.MOVED:
                    return report
            # The same listing: the input scan from its batches covers what came during the
            # waves (a state-reader job per partition again would slow their batches).
            try:
                move, at, _ = self._append_listed(
                    pipeline, element_id, parts, partial(_rescale, element_id, partitions),
                    f"scale {pipeline}/{element_id}", listed,
                )  # fmt: skip
            except InvalidInput as exc:  # (refusals: nothing stored)
                raise self._unfinished_scale(exc, pipeline, element_id, owners.count) from exc
            except Unavailable:
                # Maybe stored: in the first of several inputs before the others stood
                # still, or acknowledged too late. Ended as failed, a rescale that stood
                # left the partitions it retires placed, running, owning nothing; left
                # open, the reconciler's rounds carry the scale on (appending the record
                # where it is not, by the moves stored).
                progress.unsure = True
                raise
            progress.rescaled = True
            log.info("rescaled %s/%s to %d partitions at %d: %d keys move (%d ahead)",
                     pipeline, element_id, partitions, at, len(move.keys), len(ahead))  # fmt: skip
            self._test_pause("scale:rescaled")
            report = self._moved(pipeline, element_id, source, move, at,
                                 time.monotonic() + timeout_s, report, ahead)  # fmt: skip
            if report.status != KeyMoveStatus.MOVED:
                return report
        else:
            # Rescaled by an earlier call (whose wait for the commits may have run out):
            # moved once every partition has committed what the input holds now.
            progress.rescaled = True
            error = self._committed_now(pipeline, element_id, source, list(range(partitions)),
                                        time.monotonic() + timeout_s)  # fmt: skip
            if error is not None:
                return report.model_copy(update={"status": KeyMoveStatus.PENDING, "error": error})
        deadline = time.monotonic() + timeout_s
        if partitions < len(parts):
            retired, error = self._retire(pipeline, parts, partitions, source, at, deadline)
            report = report.model_copy(update={"retired": retired})
            if error is not None:
                return report.model_copy(update={"status": KeyMoveStatus.PENDING, "error": error})
        return report.model_copy(update={"done_ms": _ms_since(started)})

    def _ahead(
        self, pipeline: str, element_id: str, source: str, held: set[str], partitions: int,
        owners: Ownership, timeout_s: float, report: ScaleReport,
        sizes: dict[str, int] | None = None,
    ) -> tuple[ScaleReport, dict[str, int]]:  # fmt: skip
        """Move the keys ``held`` in the partitions' state stores whose partition of
        ``partitions`` differs from their owner now to that partition, ahead of the
        rescale, in waves per partition (:meth:`~KeyMoves._move_waves`): so each stops
        only while its wave crosses, not all of them at the rescale. An added partition
        takes its keys by key moves too (it reads the input from before them, and owns no
        key else before the rescale). ``sizes``: the keys' state sizes as listed (the
        waves are sized by them).

        Returns:
            ``report`` with the waves (``pending`` if a wave's states did not come: the
            rescale is not appended then; the same command again goes on), and the keys
            moved with their partitions.
        """
        targets: dict[int, list[str]] = {}
        for key in sorted(held):
            if owners.owner(key) != partition_of_key(key, partitions):
                targets.setdefault(partition_of_key(key, partitions), []).append(key)
        everyone = {p.partition.index: p for p in self.pipeline(pipeline).spec.partitions_of(
            element_id) if p.partition is not None}  # fmt: skip
        ahead: dict[str, int] = {}
        waves: list[KeyWave] = []
        stoppage: dict[str, float] = {}
        sent = 0
        for index, keys in sorted(targets.items()):
            settled, more, last = self._move_waves(pipeline, element_id, source, keys,
                                                   everyone[index], KeyOrder.BACKLOG,
                                                   timeout_s, None, sizes=sizes)  # fmt: skip
            waves += more
            stoppage |= settled.stoppage_ms
            sent += settled.state_bytes
            ahead |= dict.fromkeys(settled.stoppage_ms, index)
            if settled.error is None:
                settled.error = self._await_commits(pipeline, element_id, source, last,
                                                    time.monotonic() + timeout_s)  # fmt: skip
            if settled.error is not None:
                # (The wave that failed, and one appended while it was sent: the last two.)
                stuck = [k for wave in more for k in wave.keys if k not in stoppage]
                later = [k for i, ks in sorted(targets.items()) if i > index for k in ks]
                return report.model_copy(update={
                    "status": KeyMoveStatus.PENDING, "waves": waves, "moved": len(ahead),
                    "left": [*stuck, *settled.left, *later][:1000],
                    "keys": {k: partition_id(element_id, i) for k, i in list(ahead.items())[:1000]},
                    "state_bytes": sent, "stoppage_ms": max(stoppage.values(), default=None),
                    "error": f"{settled.error}; the rescale was not appended (the same command "
                    "again goes on once those keys have arrived)",
                }), ahead  # fmt: skip
        longest = max(stoppage.values(), default=None)
        return report.model_copy(
            update={"waves": waves, "state_bytes": sent, "stoppage_ms": longest}
        ), ahead

    def _moved(
        self, pipeline: str, element_id: str, source: str, move: KeyMove, at: int,
        deadline: float, report: ScaleReport, ahead: dict[str, int],
    ) -> ScaleReport:  # fmt: skip
        """``report`` with the rescale ``move`` (stored at ``at``) once every listed key's
        state is stored and committed by its new owner, or ``pending`` at ``deadline``;
        the keys moved ``ahead`` of it in waves counted in."""
        settled = self._settle(pipeline, element_id, source, move, at, deadline)
        moved = ahead | {k: move.target(k) for k in move.keys}
        stoppage = [*settled.stoppage_ms.values()] + (
            [report.stoppage_ms] if report.stoppage_ms is not None else []
        )
        report = report.model_copy(update={
            "scale_seq": at, "moved": len(moved),
            "keys": {k: partition_id(element_id, i) for k, i in list(moved.items())[:1000]},
            "state_bytes": report.state_bytes + settled.state_bytes,
            "stoppage_ms": max(stoppage, default=None),
        })  # fmt: skip
        if settled.error is not None:
            return report.model_copy(
                update={"status": KeyMoveStatus.PENDING, "error": settled.error}
            )
        return report

    def _retire(
        self, pipeline: str, parts: list[ElementSpec], count: int, source: str, at: int,
        deadline: float,
    ) -> tuple[dict[str, str], str | None]:  # fmt: skip
        """Remove the partitions from ``count`` on, which own nothing after the rescale at
        ``at``, once each has committed past it (its keys' states are sent then).

        Each has its stream fenced under a new epoch (so that nothing is appended to it any
        more: its consumers go on reading it as an input that has ended), then is dropped from
        the spec and its placement, its standby dropped and its instance discarded — under
        their and the consumers' exclusive sections, taken after a restore or migration of
        one under way, until ``deadline``.

        Returns:
            The partitions retired, with their nodes; and why not all were, if so.
        """
        retiring = parts[count:]
        first = parts[0].partition
        assert first is not None
        owners = self._owners(pipeline, source, first.of, first.first_count)
        if not _rescaled_to(owners, count):  # a partition retired must own nothing
            return {}, (f"a key move gives keys to a partition of {pipeline}/{first.of} "
                        f"from {count} on: not retired (the same command again rescales "
                        "first)")  # fmt: skip
        for part in retiring:
            if not self._committed_past(pipeline, part.id, source, at, deadline):
                return {}, (f"{pipeline}/{part.id} on {self._placed_on(pipeline, part.id)} has "
                            "not processed the rescale yet: it is retired once it has")  # fmt: skip
        # The element's consumers too, as while the scale placed: their spec is rewritten
        # with the element's, and none of them is restarted or moved meanwhile (the
        # registry applies the change to the spec it stores then: another element's scale
        # that changed them since is kept).
        ids = {p.id for p in parts}
        readers = [e.id for e in self.pipeline(pipeline).spec.elements if ids & set(e.inputs)]
        try:
            with self._sections_by(pipeline, [*(p.id for p in retiring), *readers], deadline):
                return self._remove_retiring(pipeline, retiring, count), None
        except MigrationInProgress as exc:
            return {}, (f"{exc.message}: the partitions are retired once it ended (the same "
                        "command again retires them)")  # fmt: skip

    @contextlib.contextmanager
    def _sections_by(self, pipeline: str, pes: list[str], deadline: float) -> Iterator[None]:
        """:meth:`_sections`, waiting until ``deadline`` (monotonic) for an operation that
        holds one of them (a restore of a partition whose node was lost) to end.

        Raises:
            MigrationInProgress: One still held at ``deadline``.
        """
        with contextlib.ExitStack() as stack:
            while True:
                try:
                    # (A round's section is waited for only until the deadline too.)
                    left = deadline - time.monotonic()
                    stack.enter_context(self._sections(pipeline, pes, wait_s=left))
                    break
                except MigrationInProgress:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.5)
            yield

    def _remove_retiring(
        self, pipeline: str, retiring: list[ElementSpec], count: int
    ) -> dict[str, str]:
        """Fence, drop and discard the ``retiring`` partitions (which own nothing and have
        committed past the rescale to ``count``), holding their sections: see
        :meth:`_retire`. Returns them with their nodes."""
        first = retiring[0].partition
        assert first is not None
        record = self.pipeline(pipeline)  # after the waits: a partition may have moved
        # Every stream fenced first: a broker away fails the scale with every partition
        # still placed and running (discarded one by one before, a failure half-way left
        # discarded partitions in the spec, which the reconciler then restored).
        # (Their standbys read before: a fence's new epoch drops the standby's record, and
        # the instance was left to the reconciler's stray removal.)
        standbys = [self.registry.standby(pipeline, part.id) for part in retiring]
        for part in retiring:
            self._fence_anew(pipeline, part.id)
        retired = {part.id: record.placement[part.id] for part in retiring}

        def change(spec: PipelineSpec) -> PipelineSpec:  # (of the spec stored then)
            if not set(retired) <= {e.id for e in spec.elements}:
                raise Conflict(
                    f"cannot retire {', '.join(sorted(retired))} of {pipeline}: the pipeline "
                    "was deployed afresh meanwhile",
                    expected=f"partitions {', '.join(sorted(retired))} of the scale's run",
                    received="a spec without them (the pipeline deployed afresh)",
                    hint="scale it again if it should have fewer partitions",
                )
            return _respec(spec, [
                _counted(e, count, first.first_count) if e.partition and e.partition.of == first.of
                else e
                for e in spec.elements
                if e.id not in retired
            ])  # fmt: skip

        # Their standbys' instances discarded first: a failure below leaves none running.
        for standby in standbys:
            self.drop_standby(standby)
        self.registry.remove_elements(pipeline, change, sorted(retired))
        self.permissions.sync(self.registry)
        for part_id, node in retired.items():
            try:
                self.agent(node).delete(
                    f"/pipelines/{pipeline}/elements/{part_id}", params={"discard": True}
                )
            except FogshiftError as exc:  # fenced; the reconciler removes it later
                log.warning("retired %s/%s not removed from %s: %s", pipeline, part_id, node,
                            exc.message)  # fmt: skip
        for part_id in retired:  # (a partition added again later under its id starts afresh)
            self.central.forget(pipeline, part_id)
        return retired

    def _nodes_for(
        self,
        placement: dict[str, str],
        parts: list[ElementSpec],
        adding: int,
        nodes: list[str] | None,
        what: str,
    ) -> list[str]:
        """The nodes of the ``adding`` partitions to add: ``nodes`` checked, or chosen."""
        if nodes is not None:
            if len(nodes) != adding:
                raise InvalidInput(
                    f"cannot {what}: {len(nodes)} nodes given for {adding} added partitions",
                    expected=f"{adding} nodes, one per added partition",
                    received=", ".join(nodes),
                    hint="leave --on out to let the orchestrator choose",
                )
            for node in nodes:
                self._usable_node(node, f"{what} onto")
            return list(nodes)
        leaving = self.leaving_nodes()
        healthy = sorted(
            n.name
            for n in self.registry.nodes()
            if self.healthy(n) and n.report.ready and n.name not in leaving
        )
        if not healthy:
            raise Unavailable(f"cannot {what}: no healthy node",
                              hint="`fogshift nodes` shows node health")  # fmt: skip
        hosting = {n: sum(1 for p in parts if placement.get(p.id) == n) for n in healthy}
        load = {n: sum(1 for v in placement.values() if v == n) for n in healthy}
        short = self.short_of_disk()  # (last: a partition there fails at its first commit)
        chosen = []
        for _ in range(adding):
            node = min(healthy, key=lambda n: (n in short, hosting[n], load[n], n))
            chosen.append(node)
            hosting[node] += 1
            load[node] += 1
        return chosen

    @contextlib.contextmanager
    def _sections(
        self, pipeline: str, pes: list[str], wait_s: float | None = None
    ) -> Iterator[None]:
        """The exclusive sections of ``pes`` (no migration or restore of them meanwhile),
        waiting up to ``wait_s`` in all (``None``: ``journal.BACKGROUND_WAIT_S``, as long as a
        migration of one PE waits) for the orchestrator's own rounds that hold some. One
        budget for all: given one each, a scale of two partitions with three readers could
        wait five minutes for rounds before it began."""
        budget = journal.BACKGROUND_WAIT_S if wait_s is None else wait_s
        deadline = time.monotonic() + budget
        with contextlib.ExitStack() as stack:
            for pe in pes:
                left = deadline - time.monotonic()
                stack.enter_context(self._exclusive(pipeline, pe, "scaling", wait_s=left))
            yield

    def _place(
        self,
        spec: PipelineSpec,
        parts: list[ElementSpec],
        count: int,
        nodes: list[str],
        source: str,
    ) -> tuple[list[ElementSpec], list[ElementSpec]]:
        """Add the missing partitions up to ``count`` to the spec and start them, and
        restart every consumer of the element that does not read them all yet.

        Returns:
            The partitions added and the consumers restarted.
        """
        pipeline, first = spec.pipeline, parts[0]
        assert first.partition is not None
        if count < len(parts):
            return [], []  # scaling in: every consumer reads every partition already
        of, base = first.partition.of, first.partition.first_count

        async def tail(js: Any, name: str) -> int:
            return int(await last_seq(js, stream_name(pipeline, name)))

        # The added partitions own nothing before the rescale record but the keys the waves
        # move to them, all of it stored after now: they need not read further back (with
        # several inputs, in each: the waves and the record are stored in every one).
        since: int | dict[str, int] = (
            self.broker.run(partial(tail, name=source), timeout=30) if len(first.inputs) == 1
            else {n: self.broker.run(partial(tail, name=n), timeout=30) for n in first.inputs}
        )  # fmt: skip
        ids = [partition_id(of, i) for i in range(count)]
        added = [
            first.model_copy(
                update={
                    "id": ids[i],
                    "node": nodes[i - len(parts)],
                    "partition": Partition(of=of, index=i, count=count, base=base, since=since),
                }
            )
            for i in range(len(parts), count)
        ]
        old = {p.id for p in parts}
        consumers: list[ElementSpec] = []

        def change(current: PipelineSpec) -> PipelineSpec:
            """The partitions counted anew, ``added`` after them, and every consumer reading
            them all; ``consumers``: the consumers changed. Applied to the spec stored when
            the registry writes it (another element's scale may have changed it since)."""
            present = {e.id for e in current.elements}
            if not old <= present or present & {p.id for p in added}:
                # (Only a stop and a fresh deploy meanwhile change the element's partitions:
                # a scale of it holds its key-move lock.)
                raise Conflict(
                    f"cannot scale {pipeline}/{of}: its partitions changed while the scale "
                    f"placed them ({', '.join(sorted(old))} before, now "
                    f"{', '.join(sorted(i for i in present if i in ids or i in old))})",
                    expected=f"partitions {', '.join(sorted(old))} and none of the new",
                    received=", ".join(sorted(present)),
                    hint="the pipeline was stopped or deployed afresh meanwhile: scale it again",
                )
            elements: list[ElementSpec] = []
            consumers.clear()
            for each in current.elements:
                element: ElementSpec = each
                if element.id in old:
                    element = _counted(element, count, base)
                elif old & set(element.inputs) and not set(ids) <= set(element.inputs):
                    # The added partitions' streams right after the element's last one.
                    at = max(n for n, i in enumerate(element.inputs) if i in old) + 1
                    missing = [i for i in ids if i not in element.inputs]
                    inputs = (*element.inputs[:at], *missing, *element.inputs[at:])
                    # Its partitions, retired ones too, stay one merged run of inputs.
                    mine = {*ids, *(i for g in element.merged if set(g) & old for i in g)}
                    merged = (
                        *(g for g in element.merged if not set(g) & old),
                        tuple(i for i in inputs if i in mine),
                    )
                    element = element.model_copy(update={"inputs": inputs, "merged": merged})
                    consumers.append(element)
                elements.append(element)
                if element.id == parts[-1].id:
                    elements.extend(added)
            return _respec(current, elements)

        change(spec)  # (what to do, as far as the spec read before tells)
        if added or consumers:
            # The added partitions' streams before the spec names them: a broker away then
            # fails the scale with nothing changed (placed without a stream, a partition
            # could not be started, and its consumers, restarted by the reconciler, failed
            # reading it).
            new, window_s = [p.id for p in added], self.config.duplicate_window_s
            self.broker.run(
                partial(_ensure_streams, pipeline=pipeline, ids=new, window_s=window_s), timeout=60
            )
            for part in added:
                # What an earlier partition of the same id left on the node: its retirement
                # discards it, but not on a node away then, and once this one is placed the
                # reconciler's clean-ups spare it — a start that is not this scale's first
                # (carried on after a crash, the reconciler's restart) resumed that
                # partition's checkpoint, and a central pull took its snapshot as this one's
                # newest. A node that does not answer fails the scale, nothing changed.
                self.agent(part.node).delete(
                    f"/pipelines/{pipeline}/elements/{part.id}", params={"discard": True}
                )
                self.central.forget(pipeline, part.id)  # (its checkpoints there too)
            self.registry.add_elements(pipeline, change, added)
            self.permissions.sync(self.registry)  # the nodes may use the added streams
        # From here on idempotent: a call after one that failed midway (a node or the broker
        # refused) finishes it, though the spec already has what that one added. Partitions
        # not running yet get their stream and fence (again) and are started; consumers
        # whose instance does not read every input they now have are started again (or the
        # added partitions' output would reach nobody).
        record = self.pipeline(pipeline)
        # (Only nodes that work: a partition on a lost node is restored, not started here.)
        reports = {n.name: n.report for n in self.registry.nodes()
                   if self.healthy(n) and n.report.ready}  # fmt: skip

        def reported(element: ElementSpec) -> ElementInfo | None:
            report = reports.get(record.placement.get(element.id, element.node))
            return report.element(pipeline, element.id) if report is not None else None

        def unstarted(element: ElementSpec) -> bool:
            return record.placement.get(element.id, element.node) in reports and not reported(
                element
            )

        fresh = {part.id for part in added}
        starting = [
            e for e in record.spec.elements
            if e.partition is not None and e.partition.of == of
            and (e.id in fresh or unstarted(e))
        ]  # fmt: skip
        consumers = [
            e for e in record.spec.elements
            if e.id in {c.id for c in consumers}
            or (set(ids) & set(e.inputs) and stale_inputs(reported(e), e))
        ]  # fmt: skip  # (only the element's readers: the scale holds their sections)
        if not starting and not consumers:
            return [], []

        async def streams(js: Any) -> None:
            for part in starting:
                await ensure_pe_stream(js, pipeline, part.id, self.config.duplicate_window_s)
                await fence(js, pipeline, part.id, self.registry.epoch(pipeline, part.id))

        self.broker.run(streams, timeout=60)
        for part in starting:
            here = part.model_copy(update={"node": record.placement.get(part.id, part.node)})
            self._deploy_element(pipeline, here, fresh=part.id in fresh)
        placement = record.placement
        for consumer in consumers:
            # A standby follows its primary's cuts with the inputs it started with: the
            # keeper starts it again from the new spec.
            self.drop_standby(self.registry.standby(pipeline, consumer.id))
            self._restart_fenced(pipeline, consumer, placement.get(consumer.id, consumer.node))
        return added, consumers

    def _unfinished_scale(
        self, exc: FogshiftError, pipeline: str, element_id: str, count: int, ran: bool = True
    ) -> FogshiftError:
        """:func:`_unfinished` with the partitions the spec has beyond ``count``."""
        now = self.pipeline(pipeline).spec.partitions_of(element_id)
        idle = [p.id for p in now if p.partition and p.partition.index >= count]
        return _unfinished(exc, pipeline, element_id, count, idle, ran)

    def _fence_anew(self, pipeline: str, pe: str) -> int:
        """A new epoch for ``pe``, above every one it had, and its fence marker on the PE's
        stream: whatever wrote under an older epoch is refused from here on."""
        epoch = self.registry.next_epoch(pipeline, pe)
        self.broker.run(partial(fence, pipeline=pipeline, pe=pe, epoch=epoch))
        return epoch

    def _restart_fenced(self, pipeline: str, element: ElementSpec, node: str) -> int:
        """Start ``element`` again on ``node`` from its own checkpoint, under a new epoch
        fenced first (see :meth:`_fence_anew`). Inside the PE's exclusive section.

        Returns:
            The new epoch.
        """
        epoch = self._fence_anew(pipeline, element.id)
        self._restart_instance(node, f"/pipelines/{pipeline}/elements/{element.id}", element, epoch)
        return epoch

    def _restart_instance(self, node: str, here: str, element: ElementSpec, epoch: int) -> None:
        """Stop the PE's instance on ``node`` (keeping its checkpoint) and start it again
        under ``epoch``: an agent keeps a running instance's epoch on a plain deploy."""
        agent = self.agent(node)
        with contextlib.suppress(UnknownElement):  # not there: just start it
            agent.delete(here)
        placed = element.model_copy(update={"node": node}).model_dump(mode="json")
        agent.put(here, json={"element": placed, "fresh": False, "epoch": epoch})


#: What a step of a scale may fail with (a node or the broker refused, or was away): each
#: built like :class:`~fogshift.exceptions.FogshiftError`, so :func:`_unfinished` can say more.
_STEP_FAILED = (InvalidInput, Unavailable, NotFound, Conflict, BrokerError)


async def _ensure_streams(js: Any, pipeline: str, ids: list[str], window_s: float) -> None:
    """The streams of partitions ``ids`` (made if missing; idempotent)."""
    for pe in ids:
        await ensure_pe_stream(js, pipeline, pe, window_s)


@dataclass
class _Progress:
    """How far a scale got: whether its rescale record stands (stored by it or before)."""

    rescaled: bool = False
    #: Its append of the rescale record met a broker away: it may stand.
    unsure: bool = False


def _carried_on(
    exc: FogshiftError, pipeline: str, element_id: str, count: int, unsure: bool = False
) -> FogshiftError:
    """``exc``, a step after the rescale record stood (``unsure``: its append met a broker
    away, and it may), saying that the scale's entry stays open for the reconciler's rounds
    to carry it on."""
    stored = "may be stored (its append met the broker away)" if unsure else "is stored"
    return _saying(
        exc,
        f"the rescale of {pipeline}/{element_id} to {count} partitions {stored}: the "
        "orchestrator carries the scale on by itself once that clears",
        f"{exc.hint or 'nothing to do'}; `fogshift status {pipeline}` shows the partitions "
        "(or ask the same scale again)",
    )


def _taken_over(
    exc: FogshiftError, pipeline: str, element_id: str, count: int, earlier: list[str]
) -> FogshiftError:
    """``exc``, a scale that superseded the open scale(s) ``earlier``, left open as they
    were for the reconciler's rounds to carry it on."""
    return _saying(
        exc,
        f"this scale of {pipeline}/{element_id} to {count} partitions takes the place of "
        f"scale {', '.join(earlier)}, left open: the orchestrator carries it on by itself "
        "once that clears",
        f"{exc.hint or 'nothing to do'}; `fogshift status {pipeline}` shows the partitions",
    )


def _saying(exc: FogshiftError, more: str, hint: str) -> FogshiftError:
    """``exc`` again (its type, expected and received), its message followed by ``more``."""
    return type(exc)(
        f"{exc.message}; {more}", expected=exc.expected, received=exc.received, hint=hint
    )


def _unfinished(
    exc: FogshiftError, pipeline: str, element_id: str, count: int, idle: list[str],
    ran: bool = True,
) -> FogshiftError:  # fmt: skip
    """``exc``, a failed step of a scale, saying what the scale had done by then:
    partitions ``idle`` it added (and, with ``ran``, started) beyond the ``count`` the keys
    are spread over. (It said "nothing changed" while the spec had them.)"""
    if not idle:
        return exc
    # (A broker away may have stored the record after all: the same scale again tells.)
    owned = (
        "whether the rescale record is stored is not known"
        if ran and isinstance(exc, BrokerUnavailable)
        else "though no key of the rescale is theirs yet"
    )
    done = "added and run" if ran else "added to the spec (not all started)"
    return _saying(
        exc,
        f"partitions {', '.join(idle)} were {done}, {owned}",
        f"{exc.hint or 'try again'}; the same scale again completes it, or `fogshift scale "
        f"{pipeline} {element_id} --partitions {count}` retires them",
    )


def _rescaled_to(owners: Ownership, count: int) -> bool:
    """Whether the moves stored so far (``owners``) leave every key with a partition of
    ``count``, by a rescale to it: none is given by a key move or key group to a partition
    from ``count`` on (a scale-out whose waves moved keys to an added partition, then
    failed before its rescale, leaves some there: scaling in again must rescale first)."""
    return owners.count == count and all(
        p < count for p in [*owners.moved.values(), *(to for _, _, to in owners.groups)]
    )


def _rescale(element_id: str, count: int, owners: Ownership, held: set[str], move: str) -> KeyMove:
    """The rescale of ``element_id`` to ``count`` partitions, given who owns each key now and
    the keys that may hold state: it lists those whose partition changes."""
    moving = sorted(k for k in held if owners.owner(k) != partition_of_key(k, count))
    return KeyMove(0, move, element_id, tuple(moving), -1, "backlog", count)


def _counted(part: ElementSpec, count: int, base: int) -> ElementSpec:
    """Partition ``part`` of an element that now has ``count`` partitions (``base``: the
    count its ownership starts from, see :class:`~fogshift.spec.models.Partition`)."""
    assert part.partition is not None
    return part.model_copy(
        update={"partition": part.partition.model_copy(update={"count": count, "base": base})}
    )


def _respec(spec: PipelineSpec, elements: list[ElementSpec]) -> PipelineSpec:
    """``spec`` with ``elements``, validated as a stored spec is when read back."""
    return PipelineSpec.model_validate(
        spec.model_copy(update={"elements": tuple(elements)}).model_dump(mode="json")
    )


def stale_inputs(reported: ElementInfo | None, element: ElementSpec) -> bool:
    """Whether the running instance ``reported`` reads other inputs than its ``element``
    now has (an agent that does not tell its inputs is taken at its word)."""
    return (
        reported is not None
        and reported.inputs is not None
        and tuple(reported.inputs) != tuple(element.inputs)
    )
