"""Trimming the pipelines' streams (``recovery.history_s``): the orchestrator's side.

A PE's data records are deleted (:func:`fogshift.broker.history.trim_data`) once they are
older than the pipeline's ``recovery.history_s`` and below the stream's *horizon*: the lowest
position of it that a reader may read from again. A reader resumes from a checkpoint: its live
one (newer than any the central store pulled from it), a migration's copy of it (newer
still), or a restore's, which is the newest of the central store's that verifies — so the
least position among all the central store keeps of every reader bounds them all — taken
where a warm copy of each would start reading again (it re-runs its last batch that read
input: ``checkpoint.spark_dir.resume_floor``). A reader's hot standby is behind its primary
by what it has not been capped at yet: its own position, as last seen by the follower,
counts too.

Nothing is trimmed from a stream while one of its readers has no central checkpoint of its
current instance (epoch) yet (a promoted standby or a restored instance may stand behind its
predecessor's), has a standby not seen following, has a standby's copy being taken, or is
being migrated or restored. A stream no element of the pipeline reads (its records are the
pipeline's result, read from outside if at all) keeps its records ``history_s``, by age
alone — but a partition's, which nobody reads during a scale until its consumer is given it.
Dead letters, which no reader reads, go once older than ``history_s`` (but each stream's
last). Each PE is trimmed inside its exclusive section, as a background round (a stop,
which holds every section, waits for it; an operation someone asked for waits briefly): a
pipeline deployed afresh meanwhile is not trimmed from the positions of the run before.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from fogshift.broker.exceptions import BrokerUnavailable
from fogshift.broker.history import trim_data, trim_dead
from fogshift.contracts import PipelineState
from fogshift.exceptions import FogshiftError
from fogshift.migration.exceptions import MigrationInProgress
from fogshift.orchestrator.journal import TRIMMING
from fogshift.orchestrator.reconciler import Reconciler
from fogshift.orchestrator.registry import PipelineRecord

log = logging.getLogger("fogshift.orchestrator")

#: How often, at most, a pipeline's streams are looked at for records to trim (and at least
#: twice per ``history_s``).
TRIM_EVERY_S = 60.0
#: A stream's holds from trimming count as one in a row while noted at least this often.
HELD_GAP_S = 3 * TRIM_EVERY_S


def horizon(pe: str, offsets: Mapping[str, Sequence[Mapping[str, Any] | None]]) -> int | None:
    """The lowest position of ``pe``'s stream that one of its readers may read from again.

    Args:
        offsets: Per reader, every offset it may resume from (its checkpoints', its
            standby's): Spark offsets of fogshift's reader, ``{"positions": {input: seq}}``.

    Returns:
        The least position of ``pe`` among them; ``None`` when a reader has none, or one
        that does not name ``pe`` (it would read the stream from its start).
    """
    least = math.inf
    for known in offsets.values():
        if not known:
            return None
        for offset in known:
            position = (offset or {}).get("positions", {}).get(pe)
            if position is None:
                return None
            least = min(least, int(position))
    return None if least == math.inf else int(least)


class History(Reconciler):
    """The orchestrator's trimming of its pipelines' streams."""

    def trim_streams(self, at: float | None = None) -> None:
        """Trim every running pipeline's streams whose turn it is (see module docstring).

        Args:
            at: The wall-clock time records' ages are judged at (default: now).
        """
        now = time.monotonic()
        for record in self.registry.pipelines():
            keep = record.spec.recovery.history_s
            if record.status != PipelineState.RUNNING or keep is None:
                continue
            last = self._trimmed_at.get(record.name)
            if last is not None and now - last < min(TRIM_EVERY_S, keep / 2):
                continue
            self._trimmed_at[record.name] = now
            try:
                self._trim_pipeline(record, (time.time() if at is None else at) - keep)
            except BrokerUnavailable as exc:
                log.warning("cannot trim the streams of %s: %s", record.name, exc.message)
                return  # (next round: the other pipelines would wait for it too)

    def _trim_pipeline(self, record: PipelineRecord, cutoff: float) -> None:
        busy = {op.element for op in self.registry.unfinished() if op.pipeline == record.name}
        for element in record.spec.elements:
            readers: list[str] | None = [
                e.id for e in record.spec.elements if element.id in e.inputs
            ]
            if busy.intersection(readers or ()) or (not readers and element.partition):
                # (Its dead letters only: an operation is under way; or a partition nobody
                # reads yet — a scale adds its consumer's input after starting it.)
                readers = None
            try:
                with self._exclusive(record.name, element.id, TRIMMING):
                    self._trim_one(record, element.id, readers, cutoff)
            except MigrationInProgress:
                continue  # (its turn comes again)
            except BrokerUnavailable:
                raise
            except FogshiftError as exc:
                log.warning("cannot trim the stream of %s/%s: %s", record.name, element.id,
                            exc.message)  # fmt: skip
            except Exception:  # one stream's trouble must not stop the others' trimming
                log.exception("trimming the stream of %s/%s failed", record.name, element.id)

    def _trim_one(
        self, planned: PipelineRecord, pe: str, readers: list[str] | None, cutoff: float
    ) -> None:
        """Trim ``pe``'s stream of the records stored before ``cutoff`` that ``readers`` need
        no more (no reader: every old one but the last; ``None``: its data records stay),
        and of its dead letters stored before it; inside its exclusive section."""
        pipeline = planned.name
        record = self.registry.get_pipeline(pipeline)
        if (
            record is None
            or record.status != PipelineState.RUNNING
            or record.status_since != planned.status_since  # deployed afresh, or scaled
        ):
            return
        dead = int(self.broker.run(partial(trim_dead, pipeline=pipeline, pe=pe, cutoff=cutoff)))
        if dead:
            self.registry.add_trimmed(pipeline, pe, 0, dead)
            log.info("trimmed %d dead letters of %s/%s", dead, pipeline, pe)
        if readers is None:
            return self._held(pipeline, pe, "an operation on a reader of it is under way, "
                              "or no element reads it yet")  # fmt: skip
        if any(self._in_section(pipeline, r) or self._copying(pipeline, r) for r in readers):
            return self._held(pipeline, pe, "a reader of it is being moved, restored or "
                              "copied for a standby")  # fmt: skip
        offsets: dict[str, list[Mapping[str, Any] | None]] = {}
        for reader in readers:
            kept = self.central.manifests(pipeline, reader)
            current = self.registry.epoch(pipeline, reader)
            if not any(m.get("epoch") == current for m in kept):
                # Its instance now (promoted, restored, migrated, restarted under a new
                # epoch) may stand behind every checkpoint its predecessors left: once one
                # of its own is stored, its position is covered (it only goes forward).
                return self._held(pipeline, pe, f"its reader {reader} has no central "
                                  f"checkpoint of its instance now (epoch {current})")  # fmt: skip
            # Where each may be resumed from, at the lowest: a warm copy re-runs the last
            # batch that read input (a standby's start, a precopy or handover target).
            offsets[reader] = [m.get("resume_floor") for m in kept]
            standby = self.registry.standby(pipeline, reader)
            if standby is not None:
                # (Only this standby's: an entry of one dropped since says nothing of it.)
                followed = self.followed_of(standby)
                seen = followed.standby if followed is not None else None
                offsets[reader].append(seen.offset if seen is not None else None)
        # No element reads it: its records are the pipeline's result, read from outside if
        # at all, and kept history_s like the rest (kept for good, they filled the broker's
        # disk, and then every append of the pipeline was refused).
        bound = horizon(pe, offsets) if readers else math.inf
        if bound is None:
            return self._held(pipeline, pe, "a reader of it may read it from its start (a "
                              "checkpoint or standby not naming its position)")  # fmt: skip
        done = self.broker.run(
            partial(trim_data, pipeline=pipeline, pe=pe, horizon=bound, cutoff=cutoff),
            timeout=60,
        )  # fmt: skip
        with self._lock:
            self._trim_held.pop((pipeline, pe), None)
        if done.purged:
            self.registry.add_trimmed(pipeline, pe, done.purged)
            log.info("trimmed %d data records of %s/%s (below sequence %d; its readers' "
                     "checkpoints start at %d or later)", done.purged, pipeline, pe,
                     done.below, bound)  # fmt: skip

    def _held(self, pipeline: str, pe: str, why: str) -> None:
        """Note that ``pe``'s stream was not trimmed now, and why (since when: the first
        such round in a row): see :meth:`trim_warnings`."""
        now = time.time()
        with self._lock:
            since, _, noted = self._trim_held.get((pipeline, pe), (now, why, now))
            if now - noted > HELD_GAP_S:
                # (Not held in a row: the pipeline stopped, or trimmed by nobody meanwhile.
                # Counted from then, a pipeline started again after hours warned at once.)
                since = now
            self._trim_held[(pipeline, pe)] = (since, why, now)

    def _copying(self, pipeline: str, element: str) -> bool:
        """Whether a copy of the PE's checkpoint for a standby is being taken or started
        (outside its section: ``Standbys._keep_standby``): it re-runs from where it was
        taken, which the central checkpoints pulled meanwhile may have passed."""
        with self._lock:
            return (pipeline, element) in self._standby_copies

    def _in_section(self, pipeline: str, element: str) -> bool:
        """Whether an operation holds the PE's exclusive section now (a migration copying
        its checkpoint, a restore starting it)."""
        with self._lock:
            return (pipeline, element) in self._migrating
