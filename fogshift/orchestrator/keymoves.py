"""Moving single keys between the partitions of a partitioned keyed PE (PAM, seed 004).

The orchestrator only stores records among the partitions' input events — the copy
requests of a precopy (:class:`~fogshift.broker.keys.KeyCopy`), one after another, then the
move (:class:`~fogshift.broker.keys.KeyMove`) — and watches them complete; the partitions
do the rest themselves (:mod:`fogshift.broker.keys`): the origin pushes each key's state (or
what changed since its copy), in the order the move asks, and the target resumes each key as
soon as its state arrives. Nothing is paused, no query restarts, and the keys that do not
move never notice.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from nats.js.errors import APIError

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.client import (
    ensure_subjects,
    get_range,
    get_ranges,
    last_seq,
    publish_once,
    subject_count,
)
from fogshift.broker.exceptions import BrokerUnavailable
from fogshift.broker.history import trimmed_below
from fogshift.broker.keys import (
    INLINE_STATE_BYTES,
    KeyCopy,
    KeyMove,
    KeyState,
    Ownership,
    body_key,
    event_fields,
    in_group,
    listed_unions,
    parse,
    read_message,
    widened,
)
from fogshift.broker.naming import (
    data_subject,
    key_subjects,
    keys_subject,
    state_subject,
    stream_name,
)
from fogshift.broker.publish import WRONG_LAST_SEQUENCE
from fogshift.common.progress import PositionWatch
from fogshift.common.text import counted, has_utf8, one_line
from fogshift.contracts import (
    KeyMoveReport,
    KeyMoveStatus,
    KeyOrder,
    KeyWave,
    PipelineState,
    StateKeys,
)
from fogshift.events import MAX_KEY_CHARS
from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, Unavailable
from fogshift.orchestrator.exceptions import UnknownNode
from fogshift.orchestrator.locks import element_lock, element_lock_of
from fogshift.orchestrator.registry import PipelineRecord
from fogshift.orchestrator.standbys import Standbys
from fogshift.spec.loader import did_you_mean
from fogshift.spec.models import ElementSpec, partition_id

log = logging.getLogger(__name__)

#: How many keys one move may carry (a key: at most events.MAX_KEY_CHARS characters).
MAX_KEYS = 1000
#: The most key groups an element's keys may be split into by a group move.
MAX_GROUPS = 4096
#: How often a listed move is tried, each time after looking at what came meanwhile.
APPEND_TRIES = 50
#: A listed move's largest record (a broker message takes at most ~1 MiB).
MAX_RECORD_BYTES = 900 * 1024
#: How many partitions' state stores are listed at once (:meth:`KeyMoves._listed_keys`):
#: each listing is a Spark job on the partition's node.
LIST_AT_ONCE = 16
#: How long a key move waits for its target's keys, to tell which keys named ``already``
#: there it never saw (a warning only).
UNSEEN_ASK_S = 10.0
#: A listed move left in some inputs only is listed again from where its last record's scan
#: ended while that leaves at most this many messages to scan, none trimmed meanwhile; else
#: from the partitions' state stores, as a fresh one is (an orchestrator back after hours:
#: one look at the whole backlog would run past its request's timeout every round).
COMPLETE_SCAN_MAX = 100_000
#: A precopy asks for about this much state at a time (one key first, to learn the size):
#: each request's copies ride one batch of the origin and of the target, whose other keys
#: wait for that batch.
PRECOPY_STEP_BYTES = 1024 * 1024
#: How long one precopy request's copies may take to be stored before the move goes ahead
#: without the rest (their keys' whole states then travel at the move, as without precopy).
PRECOPY_WAIT_S = 15.0
#: What a key move stored in only some of a partitioned element's inputs holds until it is
#: completed (logged when completing it fails; tried again every central round).
_WAITING = (
    "until then its keys wait (a key group's move or a rescale holds the inputs it is in at "
    "its place; a move of listed keys holds those keys' events at their target), and a "
    "key move or scale of the element tries to complete it first; tried again next round"
)

#: A precopy stops once it has seen :data:`PRECOPY_SAMPLE` keys, none of whose copies held
#: this much: a small state costs more as one more record through both partitions (a
#: round of batches) than its bytes cost at the move (``bench pam``: 1 KiB states gained
#: nothing from a precopy, 64 KiB ones did; 1000 keys of 1 KiB lost seconds to it).
PRECOPY_MIN_BYTES = 16 * 1024
PRECOPY_SAMPLE = 5
#: The longest a precopy goes on (a step per origin batch: ~2 MiB/s at a 500 ms trigger);
#: the move's own timeout counts from its end.
PRECOPY_BUDGET_S = 600.0
#: How often a wait for a partition's commit looks up where it runs (see
#: :meth:`KeyMoves._committed_past`).
PLACEMENT_RECHECK_S = 1.0
#: Listed keys move in waves, each a move of its own appended once the states of the one
#: before are stored (large ones: are being sent, see :meth:`KeyMoves._move_waves`): the
#: first wave moves one key, to learn the size; each later one at
#: most four times as many, up to :data:`WAVE_KEYS` keys and about :data:`WAVE_BYTES` of
#: state (by the largest state sent so far). A key stops only while its own wave crosses,
#: and every key of a later wave is processed by its origin meanwhile; one move of hundreds
#: of keys stopped them all for seconds (``bench pam``, 1000 keys: ~2 ms per key on each
#: side, in PySpark's per-key path).
WAVE_KEYS = 64
WAVE_BYTES = 2 * 1024 * 1024
#: Keys whose sizes the state stores' listing gave (a key group's move, a rescale's waves)
#: need no first wave of one key to learn them: the first wave takes as many keys as fit
#: in :data:`FIRST_WAVE_BYTES`, at most :data:`FIRST_WAVE_KEYS` (a key still stops only
#: while its wave crosses, and ~2 ms a key on each side is PySpark's per-key path), and
#: each later wave up to four times the keys and bytes of the one before, within
#: :data:`WAVE_KEYS` and :data:`WAVE_BYTES`. The one-key first wave cost a key group of
#: ten 1 KiB keys two more rounds of batches than one wave (``bench pam``: 3.7-6.7 s
#: against 1.9-4.9 s for the same keys listed).
FIRST_WAVE_KEYS = 16
FIRST_WAVE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Listing:
    """The partitions' state stores as :meth:`KeyMoves._listed_keys` read them.

    Attributes:
        keys: Every key some partition holds anything for.
        since: For each of the partitions' inputs, the oldest position those reads are as
            of (where a scan for keys that gained state since starts).
        sizes: Each key's stored texts' length (:class:`~fogshift.contracts.StateKeys`);
            empty where not known.
    """

    keys: set[str]
    since: dict[str, int]
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass
class Settled:
    """How a move's states arrived (see :meth:`KeyMoves._settle`).

    Attributes:
        stoppage_ms: Each moved key whose state is stored, in the order they were, with the
            time from the move being stored to its state being stored.
        state_bytes: The states' size as sent (parts included).
        error: Why the move is still pending, if it is.
        left: Keys that did not move (their waves were never appended).
    """

    stoppage_ms: dict[str, float]
    state_bytes: int
    error: str | None = None
    left: list[str] = field(default_factory=list)
    #: Moved keys whose origin held no state of them (never seen there).
    stateless: set[str] = field(default_factory=set)

    def note(self, states: dict[str, tuple[Any, int]], moved_at: float | None) -> int:
        """Count ``states`` (as :meth:`KeyMoves._await_states` gives them, for a move stored
        at ``moved_at``) in, in the order they were stored; return the largest's size."""
        largest = 0
        for key, (message, size) in sorted(states.items(), key=lambda kv: kv[1][0].seq):
            waited = message.stored_at - moved_at if moved_at is not None else 0.0
            self.stoppage_ms[key] = round(waited * 1000, 1)
            self.state_bytes += size
            largest = max(largest, size)
        return largest


@dataclass
class Precopy:
    """How a move's copies went (see :meth:`KeyMoves._precopy`).

    Attributes:
        copy: The copy's id, for the move to name (``None``: nothing was copied).
        keys: The keys whose copies were stored before the move, in that order (a copy
            stored later still serves: its key then also sends only what changed).
        state_bytes: Those copies' size as sent (parts included).
        ms: From the first request to the move going ahead (a last wait in vain included).
    """

    copy: str | None
    keys: list[str]
    state_bytes: int
    ms: float


class KeyMoves(Standbys):
    """``migrate --keys``: move keys of a partitioned element to the partition on a node."""

    def migrate_keys(
        self,
        pipeline: str,
        element_id: str,
        keys: list[str],
        target: str,
        order: KeyOrder = KeyOrder.BACKLOG,
        timeout_s: float = 60.0,
        group: tuple[int, int] | None = None,
        precopy: bool | None = None,
        wave_keys: int | None = None,
    ) -> KeyMoveReport:
        """Move ``keys`` of the partitioned element ``element_id`` to its partition on
        ``target`` (a node hosting one, or the partition's id), while every partition keeps
        running.

        With ``precopy`` (listed keys; ``None``: yes), their states are first copied to the
        target while their origins keep them (:meth:`_precopy`); the move then carries only
        what changed since, so its keys wait for that and not for their whole states. A key
        group always sends whole states: ``precopy`` given with one is refused.

        Listed keys move in waves (:meth:`_move_waves`): sized as :data:`WAVE_KEYS` says,
        or of ``wave_keys`` keys each.

        With ``group`` ``(g, n)`` instead of keys, key group ``g`` of ``n`` moves: every key
        whose CRC-32 modulo ``n`` is ``g``, those holding state now (listed as for a
        rescale, see :meth:`_append_listed`; those in state stores go ahead in waves) and
        any that comes later.

        Returns once the target has committed every moved key's state (``moved``), or with
        ``pending`` once a wave's states have not all been stored within ``timeout_s`` of
        it (that wave stands, and so does the one appended while it was sent, if any:
        their keys' events wait at the target until the origin partition, e.g. once
        restored, sends their states; later waves are not appended, their keys ``left``
        where they are), or the last states not committed within
        ``timeout_s`` more.

        Raises:
            InvalidInput: Not a partitioned element, partitioned inputs, no partition on
                ``target`` or several, bad keys; nothing was stored.
            Conflict: A key to move still waits for an earlier move's state (once that
                comes, the same request goes on); nothing was stored.
            Unavailable: ``target`` is not healthy.
        """
        started = time.monotonic()
        record = self.pipeline(pipeline)
        what = f"keys of {pipeline}/{element_id}"
        parts = self._movable_parts(record, element_id, f"cannot move {what}")
        to, target = _target_partition(pipeline, element_id, parts, record.placement, target,
                                       self.node_names())  # fmt: skip
        if group is None:
            _check_keys(what, keys)
        elif wave_keys is not None or precopy is not None:
            # Named as the CLI spells them and as the API's fields are.
            flag, field = (
                ("--wave-keys", f"wave_keys {wave_keys}") if wave_keys is not None
                else ("--precopy" if precopy else "--no-precopy", f"precopy {precopy}")
            )  # fmt: skip
            raise InvalidInput(
                f"cannot move {what}: {flag} is for --keys",
                expected=f"{flag} ({field.split()[0]}) with --keys (keys)",
                received=f"{field} with group {group[0]}/{group[1]} (--key-group)",
                hint="a key group sizes its waves itself and sends whole states: drop "
                f"{flag}, or list the keys",
            )
        elif keys or not 0 <= group[0] < group[1] <= MAX_GROUPS:
            raise InvalidInput(
                f"cannot move {what}: bad key group",
                expected=f"G/N with 0 <= G < N <= {MAX_GROUPS}, and no --keys beside it",
                received=f"{group[0]}/{group[1]}" + (f" and keys {keys}" if keys else ""),
                hint="e.g. --key-group 3/16 (keys whose CRC-32 modulo 16 is 3)",
            )
        self._usable_node(target, f"move {what} to")
        assert to.partition is not None
        source = parts[0].inputs[0]
        for name in parts[0].inputs:
            self._key_subjects(pipeline, name)
        # One key move of an element at a time: a key must not move again before the state
        # of its last move has arrived (its holder would have no state to hand on).
        with element_lock(pipeline, element_id, f"cannot move {what}"):
            self._unchanged(pipeline, element_id, parts, f"cannot move {what}", (to, target))
            self._moves_completed(pipeline, element_id, parts[0].inputs)
            return self._move_keys(
                pipeline, element_id, parts, keys, to, target, source, order, started, timeout_s,
                group, precopy is not False, wave_keys,
            )  # fmt: skip

    def _unchanged(
        self,
        pipeline: str,
        element_id: str,
        parts: list[ElementSpec],
        refusal: str,
        placed: tuple[ElementSpec, str] | None = None,
    ) -> None:
        """Check, once the element's lock is held, that its partitions are still ``parts``
        (and ``placed``'s partition still on its node): the request was planned on what it
        read before waiting for the operation ahead of it, a scale that may have added or
        retired partitions (a key given to a retired one would have no owner).

        Raises:
            Conflict: (starting with ``refusal``) they changed; nothing was stored.
        """
        record = self.pipeline(pipeline)
        self.refuse_unless_running(record, refusal)  # (stopped while it waited)
        # (Their inputs too: a scale of an element they read makes them read its partitions
        # merged, where keys no longer move.)
        current = record.spec.partitions_of(element_id)
        now, was = [p.id for p in current], [p.id for p in parts]
        read = [p.inputs for p in current] == [p.inputs for p in parts]
        moved = placed is not None and record.placement.get(placed[0].id) != placed[1]
        if now != was or moved or not read:
            raise Conflict(
                f"{refusal}: its partitions changed while it waited for the operation "
                "before it (a scale or a move)",
                expected=", ".join(was) + (f", {placed[0].id} on {placed[1]}" if placed else ""),
                received=", ".join(now)
                + (f", {placed[0].id} on {record.placement.get(placed[0].id)}" if placed else ""),
                hint="send it again: it is planned afresh on the partitions as they are",
            )

    def _movable_parts(
        self, record: PipelineRecord, element_id: str, refusal: str,
        whole: str = "without --keys, `fogshift migrate` moves a whole PE",
    ) -> list[ElementSpec]:  # fmt: skip
        """The partitions of ``element_id``, whose keys can move (their inputs are not
        partitioned).

        Raises:
            InvalidInput: (starting with ``refusal``) not partitioned (its hint ``whole``),
                or partitioned inputs.
            UnknownElement: No such element.
        """
        parts = record.spec.partitions_of(element_id)
        named = next((e for e in record.spec.elements if e.id == element_id), None)
        if not parts and named is not None and named.partition is not None:
            # (It said "'classify-p0' is not partitioned" of a partition.)
            of = named.partition.of
            raise InvalidInput(
                f"{refusal}: {element_id!r} is a partition of {of!r}, which is the element to name",
                expected=f"the partitioned element {of!r}",
                received=f"its partition {element_id!r}",
                hint=f"name {of!r} instead (a key move names the partition to move to with "
                f"--to, e.g. --to {element_id})",
            )
        if not parts:
            _known_for_keys(record, element_id)
            raise InvalidInput(
                f"{refusal}: {element_id!r} is not partitioned",
                expected="a keyed element written with partitions: [NODE, ...]",
                received=f"element {element_id!r}",
                hint=whole,
            )
        if not parts[0].moves_keys:
            raise InvalidInput(
                f"{refusal}: its partitions read the partitions of another element, "
                + ", ".join("+".join(group) for group in parts[0].merged),
                expected="a partitioned element whose inputs are not partitioned (where keys "
                "change owner is a position in each input)",
                received="inputs " + ", ".join(parts[0].inputs),
                hint="move its partitions whole with `fogshift migrate PIPELINE <id>-p<i>`",
            )
        self.refuse_unless_running(record, refusal)
        return parts

    def _key_subjects(self, pipeline: str, source: str) -> None:
        """Make sure the stream of ``source`` (the partitions' input) has the subjects key
        moves write on: one made by an older fogshift lacks ``.state.*``, ``.state.*.*`` or
        ``.keys.*``."""
        self.broker.run(partial(ensure_subjects, pipeline=pipeline, pe=source), timeout=30)

    def _move_keys(
        self, pipeline: str, element_id: str, parts: list[ElementSpec], keys: list[str],
        to: ElementSpec, target: str, source: str, order: KeyOrder, started: float,
        timeout_s: float, group: tuple[int, int] | None = None, precopy: bool = True,
        wave_keys: int | None = None,
    ) -> KeyMoveReport:  # fmt: skip
        what = f"keys of {pipeline}/{element_id}"
        assert to.partition is not None
        owners = self._owners(pipeline, source, element_id, to.partition.first_count)
        if to.partition.index >= owners.count and owners.rescaled > to.partition.since_of(source):
            # A rescale stored since it was placed left fewer partitions: this one is being
            # retired (its scale returned before the retirement, or died), and keys moved
            # to it would hold it back or go with it. (One a scale-out added, its rescale
            # not stored yet, reads from after the last one: keys may move there.)
            raise InvalidInput(
                f"cannot move {what} to {target!r}: its partition {to.id} is being retired "
                f"(the element is rescaled to {owners.count} partitions)",
                expected=f"a node hosting one of partitions 0 to {owners.count - 1}",
                received=f"{target} ({to.id})",
                hint=f"finish the scale first (`fogshift scale {pipeline} {element_id} "
                f"--partitions {owners.count}` again), then move the keys to a partition "
                "that stays",
            )
        if group is not None:
            return self._move_group(
                pipeline, element_id, parts, to, target, source, order, started, timeout_s,
                group, owners,
            )  # fmt: skip
        waiting = sorted(set(keys) & set(owners.pending))
        if waiting:
            raise Conflict(  # (a wait, not a refusal for good)
                f"cannot move {what} now: {', '.join(waiting)} still wait for the state of "
                "an earlier move",
                expected="keys whose earlier moves have completed",
                received=", ".join(waiting),
                hint="that move completes when its origin partition runs (restore it if its "
                "node is lost); then move them again",
            )
        moving = [k for k in keys if owners.owner(k) != to.partition.index]
        already = [k for k in keys if k not in moving]
        base: dict[str, Any] = {
            "pipeline": pipeline, "element": element_id, "target": target,
            "target_partition": to.id, "order": order, "keys": moving, "already": already,
            "origins": {k: parts[owners.owner(k)].id for k in moving},
            "unseen": self._unseen(pipeline, to, already),
        }  # fmt: skip
        if not moving:
            # Moved by an earlier call (whose wait for the commit may have run out): moved
            # once the target has committed what its input holds now, its states among it.
            error = self._committed_now(
                pipeline, element_id, source, [to.partition.index], time.monotonic() + timeout_s
            )
            if error is not None:
                return KeyMoveReport(**base, status=KeyMoveStatus.PENDING, move_seq=0,
                                     error=error)  # fmt: skip
            return KeyMoveReport(**base, status=KeyMoveStatus.MOVED, move_seq=0,
                                 done_ms=_ms_since(started))  # fmt: skip
        copied = Precopy(None, [], 0, 0.0)
        if precopy:
            copied = self._precopy(pipeline, element_id, source, moving, to.partition.index,
                                   time.monotonic() + PRECOPY_BUDGET_S)  # fmt: skip
            base.update(precopied=copied.keys, precopy_ms=copied.ms,
                        precopy_bytes=copied.state_bytes)  # fmt: skip
        settled, waves, last = self._move_waves(
            pipeline, element_id, source, moving, to, order, timeout_s, wave_keys, copied.copy,
            frozenset(copied.keys),
        )  # fmt: skip
        if settled.error is None:
            settled.error = self._await_commits(pipeline, element_id, source, last,
                                                time.monotonic() + timeout_s)  # fmt: skip
        report = KeyMoveReport(
            **base, status=KeyMoveStatus.MOVED, move_seq=waves[0].seq, waves=waves,
            sent=list(settled.stoppage_ms), stoppage_ms=settled.stoppage_ms,
            state_bytes=settled.state_bytes, left=settled.left,
            stateless=[k for k in moving if k in settled.stateless],
        )  # fmt: skip
        if settled.error is not None:
            return report.model_copy(
                update={"status": KeyMoveStatus.PENDING, "error": settled.error}
            )
        return report.model_copy(update={"done_ms": _ms_since(started)})

    def _move_waves(
        self, pipeline: str, element_id: str, source: str, moving: list[str], to: ElementSpec,
        order: KeyOrder, timeout_s: float, wave_keys: int | None, copy: str | None = None,
        copied: frozenset[str] = frozenset(), sizes: dict[str, int] | None = None,
    ) -> tuple[Settled, list[KeyWave], dict[int, int]]:  # fmt: skip
        """Move ``moving`` to partition ``to`` in waves: sized as :data:`WAVE_KEYS` says, or
        of ``wave_keys`` keys each; with every key's state size known beforehand
        (``sizes``, from the state stores' listing), as :data:`FIRST_WAVE_KEYS` says, by
        those sizes. The keys ``copied`` by the precopy ``copy`` go first (in
        the order listed), then the others, whose sizing starts again at one key: a copied
        key sends what changed since, the others their whole states. The origin orders
        each wave's states (``order``); the waves go in the order listed. Each wave's states
        must be stored within ``timeout_s`` of its move.

        Large states (parts, more than :data:`~fogshift.broker.keys.INLINE_STATE_BYTES`)
        go as a precopy's do: once the origin is sending a wave's states (its batch that
        moves them runs), the next wave is appended, for the batch after
        (:meth:`_await_sending`), so that the origin's batches follow each other instead of
        each waiting for the one before to be seen stored (behind a slow link, a trigger
        and the orchestrator's look of every wave). Never more than one wave is ahead, and
        a wave appended ahead is sized by the states seen before the one being sent (at
        most four times its keys still: it may hold more than :data:`WAVE_BYTES` if that
        one's states are larger than any before).

        Returns:
            How the states arrived (the keys of waves never appended, after one whose
            states did not all come, in ``left``), the waves appended, and the last state's
            sequence per partition taking them (to wait for their commits).
        """
        assert to.partition is not None
        settled = Settled({}, 0)
        waves: list[KeyWave] = []
        last: dict[int, int] = {}
        ordered = [k for k in moving if k in copied] + [k for k in moving if k not in copied]
        step, largest, asked = wave_keys or 1, 1, 0
        known = (
            sizes if wave_keys is None and not copied and sizes and set(moving) <= set(sizes)
            else None
        )  # fmt: skip
        most_keys, most_bytes = FIRST_WAVE_KEYS, FIRST_WAVE_BYTES
        index = to.partition.index
        pending: list[tuple[KeyWave, str, float]] = []  # appended, states not all seen
        parts = stream_name(pipeline, source), state_subject(pipeline, source, index, element_id)

        def append_wave() -> None:
            nonlocal asked, most_keys, most_bytes, step
            if known is not None:
                step = _fitting(ordered[asked:], known, most_keys, most_bytes)
                most_keys = min(4 * most_keys, WAVE_KEYS)
                most_bytes = min(4 * most_bytes, WAVE_BYTES)
            wave = ordered[asked : asked + step]
            if wave_keys is None and wave[0] in copied:
                wave = [k for k in wave if k in copied]  # the last wave of copied keys
            move = KeyMove(0, uuid.uuid4().hex[:12], element_id, tuple(wave), index,
                           order.value, copy=copy)  # fmt: skip
            at = self._append_move(pipeline, to.inputs, move)
            waves.append(KeyWave(seq=at, keys=wave))
            pending.append((waves[-1], move.move, time.monotonic() + timeout_s))
            asked += len(wave)
            log.info("moving %d keys of %s/%s to %s at %s (wave %d)", len(wave), pipeline,
                     element_id, to.id, at, len(waves))  # fmt: skip

        def ahead_ok() -> bool:
            """Whether the next wave may go in before this one's states are stored: a
            wave's worth of whole states, or of copied ones, like the last (sizing starts
            again at the first whole state: its size is unknown)."""
            return (
                len(pending) == 1
                and bool(settled.stoppage_ms)
                and asked < len(ordered)
                and largest > INLINE_STATE_BYTES
                and (ordered[asked] in copied) == (ordered[asked - 1] in copied)
            )

        if ordered:  # (a key group's move: none of its keys may hold state yet)
            append_wave()
        try:
            while pending:
                wave, move_id, deadline = pending[0]
                if ahead_ok():
                    before = self._parts_count(parts)
                    wait = min(deadline, time.monotonic() + PRECOPY_WAIT_S)
                    if before is not None and self._await_sending(
                        pipeline, source, move_id, wave.seq, wave.keys, parts, before, wait
                    ):
                        append_wave()
                states, moved_at = self._await_states(
                    pipeline, source, move_id, wave.seq, wave.keys, deadline, settled.stateless
                )
                pending.pop(0)
                largest = max(largest, settled.note(states, moved_at))
                _note_last(last, states)
                missing = [k for k in wave.keys if k not in states]
                if missing:
                    # A wave already appended after it moves on by itself (as this one does,
                    # once its origin runs): its keys are moving, not left.
                    for later, later_id, _ in pending:
                        got, at = self._await_states(
                            pipeline, source, later_id, later.seq, later.keys, 0.0,
                            settled.stateless,
                        )  # fmt: skip
                        settled.note(got, at)
                        _note_last(last, got)
                        missing += [k for k in later.keys if k not in got]
                    settled.left = ordered[asked:]
                    settled.error = _no_state(missing) + (
                        f"; {counted(len(settled.left), 'key')} of later waves did not move"
                        if settled.left
                        else ""
                    )  # fmt: skip
                    return settled, waves, last
                if wave_keys is None and known is None and asked < len(ordered):
                    if wave.keys[0] in copied and ordered[asked] not in copied:
                        step, largest = 1, 1  # whole states from here: their size is unknown
                    else:
                        step = _next_step(step, largest, WAVE_BYTES, WAVE_KEYS)
                if not pending and asked < len(ordered):
                    append_wave()
        except FogshiftError as exc:
            # (A broker away for a moment after the first wave was stored: the bare error
            # said nothing of the keys that move as stored.)
            stored = [k for wave in waves for k in wave.keys]
            settled.left = ordered[asked:]
            settled.error = (
                f"{one_line(exc.message)}, after {counted(len(waves), 'wave')} of "
                f"{counted(len(stored), 'key')} stored: those move as stored (their target "
                "takes them once it runs); "
                + (
                    f"{counted(len(settled.left), 'key')} of later waves did not move (the "
                    "same command again moves them)"
                    if settled.left
                    else "no key is left"
                )
            )
            return settled, waves, last
        return settled, waves, last

    def _append_move(self, pipeline: str, inputs: tuple[str, ...], move: KeyMove) -> int:
        """Append ``move`` to the ``.keys`` subject of each of the partitions' ``inputs``,
        the first first; its sequence in the first (where the states travel). A move
        stored in some only (this orchestrator died between the appends) holds its keys
        until :meth:`_complete_moves` appends the rest."""
        payload = move.payload()
        if len(inputs) == 1:
            return self._append_key_record(pipeline, inputs[0], payload, move.move)
        self._moves_complete.discard((pipeline, move.element))  # (checked again if this fails)
        at = self._append_key_record(pipeline, inputs[0], payload, move.move)
        for name in inputs[1:]:
            # (Under the move's id: an append that timed out and is sent again by
            # _complete_moves is stored once; a reader takes a move once per input anyway.)
            self._append_key_record(pipeline, name, payload, move.move)
        self._moves_complete.add((pipeline, move.element))
        return at

    def _moves_completed(self, pipeline: str, element_id: str, inputs: tuple[str, ...]) -> None:
        """:meth:`_complete_moves` unless this orchestrator knows them complete (under the
        element's lock, before a key move or scale appends one: a move left in some inputs
        only must come first in every input, and holds its inputs at its places)."""
        if (pipeline, element_id) not in self._moves_complete:
            # (Once per orchestrator: this one's own appends keep the mark true; a look at
            # every input's whole move history each time would grow with it.)
            self._complete_moves(pipeline, element_id, inputs)
            self._moves_complete.add((pipeline, element_id))

    def _complete_moves(self, pipeline: str, element_id: str, inputs: tuple[str, ...]) -> int:
        """Append to every input of ``element_id``'s partitions the key moves the first
        input holds and it lacks (the appends of a move go input after input: an
        orchestrator that died between them left its keys held at their target, and their
        origin waiting for the move's other places). Called under the element's lock; the
        missing ones are the last moves, so appended at the end they keep the order.

        Returns:
            How many records were appended.
        """
        if len(inputs) < 2:
            return 0

        async def moves(js: Any, name: str) -> list[KeyMove]:
            stream, subject = stream_name(pipeline, name), keys_subject(pipeline, name)
            found = await get_range(js, stream, subject, 0, await last_seq(js, stream))
            parsed = (parse(m.seq, m.data) for m in found)
            return [m for m in parsed if isinstance(m, KeyMove) and m.element == element_id]

        stored = {name: self.broker.run(partial(moves, name=name), timeout=60) for name in inputs}
        appended = 0
        for name in inputs[1:]:
            there = {m.move for m in stored[name]}
            for move in stored[inputs[0]]:
                if move.move in there:
                    continue
                log.warning("key move %s of %s/%s was not stored in input %s (an "
                            "orchestrator died while appending it): appended now",
                            move.move, pipeline, element_id, name)  # fmt: skip
                if move.listed:
                    # Listed again from where its last record's scan ended: keys may have
                    # gained state in the inputs since (the partitions read on up to the
                    # places that are stored). Its records so far, input by input.
                    records = [m for n in inputs for m in stored[n] if m.move == move.move]
                    already = frozenset(k for m in records for k in m.keys)
                    ends = dict(records[-1].scanned)
                    parts = self.pipeline(pipeline).spec.partitions_of(element_id)
                    short = bool(ends) and self.broker.run(
                        partial(_scan_is_short, pipeline=pipeline, ends=ends), timeout=60
                    )  # fmt: skip
                    done, _, _ = self._append_listed(
                        pipeline, element_id, parts, _relisted(move),
                        f"complete key move {move.move} of {pipeline}/{element_id}",
                        listed=Listing(set(already), ends) if short else None, move_id=move.move,
                        only=(name,), already=already,
                    )  # fmt: skip
                    stored[name].append(done)  # (its keys so far and where this scan ended)
                else:
                    self._append_key_record(pipeline, name, move.payload(), move.move)
                appended += 1
        return appended

    def complete_key_moves(self, records: list[PipelineRecord]) -> None:
        """:meth:`_complete_moves` for the running pipelines' partitioned elements with
        several inputs not known complete (once per orchestrator: one that died between a
        move's appends; and after an append failed half-way) whose keys no move is moving
        now (the central loop's upkeep)."""
        for record in records:
            if record.status != PipelineState.RUNNING:
                continue
            for element in record.spec.elements:
                part = element.partition
                if (
                    part is None
                    or part.index != 0
                    or len(element.inputs) < 2
                    or not element.moves_keys
                    or (record.name, part.of) in self._moves_complete
                ):
                    continue
                lock = element_lock_of(record.name, part.of)
                if not lock.acquire(blocking=False):
                    continue  # a move under way appends its own
                try:
                    self._complete_moves(record.name, part.of, element.inputs)
                    self._moves_complete.add((record.name, part.of))
                except BrokerUnavailable as exc:
                    log.warning("cannot complete the key moves of %s/%s: %s; %s",
                                record.name, part.of, exc.message, _WAITING)  # fmt: skip
                    return  # (next round: the other elements would wait for it too)
                except Exception as exc:
                    # (The central round's pulls and pushes go on: one element's trouble
                    # is logged and looked at again next round.)
                    log.warning("cannot complete the key moves of %s/%s: %r; %s",
                                record.name, part.of, exc, _WAITING)  # fmt: skip
                finally:
                    lock.release()

    def _append_key_record(self, pipeline: str, source: str, payload: bytes, msg_id: str) -> int:
        """Append ``payload`` (a key move or copy request) to the ``.keys`` subject of the
        input ``source`` under message id ``key-move:{msg_id}``; its stream sequence.

        Sent again under its id while its acknowledgement does not come
        (:func:`~fogshift.broker.client.publish_once`): one acknowledged late is stored
        anyway, and a move reported as failed then would still move its keys."""
        stream, subject = stream_name(pipeline, source), keys_subject(pipeline, source)
        store = partial(publish_once, subject=subject, payload=payload, stream=stream,
                        msg_id=f"key-move:{msg_id}")  # fmt: skip
        return int(self.broker.run(store, timeout=30))

    def _precopy(
        self, pipeline: str, element_id: str, source: str, keys: list[str], to: int,
        deadline: float,
    ) -> Precopy:  # fmt: skip
        """Copy the states of ``keys`` to partition ``to`` while their owners keep them (a
        per-key make-before-break), about :data:`PRECOPY_STEP_BYTES` at a time.

        Each request (:class:`~fogshift.broker.keys.KeyCopy`) is answered by one batch of
        the origin: the first asks for one key, the next for as many as fit the step at the
        largest copy seen so far (at most four times as many as the one before: sizes
        differ between keys). So a large state crosses in batches of its own, before any
        key waits for it. Once the origin is sending a request's copies (its parts arrive:
        the batch that answers it is running), the next request is appended, for the batch
        after (:meth:`_await_sending`): the origin's batches then follow each other instead
        of each waiting for the one before to be seen stored (behind 10 Mbit/s, ~0.6 s of
        every 1.4 s step). A request whose copies do not come within
        :data:`PRECOPY_WAIT_S` (an origin down), or ``deadline``, ends the precopy, and so do
        small states (:data:`PRECOPY_MIN_BYTES`): the keys not copied move with their whole
        states (a copy that comes later still serves, see :class:`Precopy`).
        """
        started = time.monotonic()
        copy = uuid.uuid4().hex[:12]
        done: list[str] = []
        sent, step, largest, asked = 0, 1, 1, 0
        pending: list[tuple[list[str], int]] = []  # requests appended, copies not all seen
        parts = stream_name(pipeline, source), state_subject(pipeline, source, to, element_id)

        def ask() -> None:
            nonlocal asked
            chunk = keys[asked : asked + step]
            request = KeyCopy(0, copy, element_id, tuple(chunk), to)
            at = self._append_key_record(pipeline, source, request.payload(), f"{copy}-{asked}")
            pending.append((chunk, at))
            asked += len(chunk)

        ask()
        while pending and time.monotonic() < deadline:
            chunk, at = pending[0]
            wait = min(deadline, time.monotonic() + PRECOPY_WAIT_S)
            if len(pending) == 1 and done and asked < len(keys) and largest > INLINE_STATE_BYTES:
                before = self._parts_count(parts)
                if before is not None and self._await_sending(
                    pipeline, source, copy, at, chunk, parts, before, wait
                ):
                    ask()
            empty: set[str] = set()
            states, _ = self._await_states(pipeline, source, copy, at, chunk, wait, empty)
            pending.pop(0)
            # (A key its origin holds no state of, a typo's, was said "precopied 1 of 1
            # key (119 bytes)" beside the warning that it had none: it moves whole, as
            # nothing.)
            done.extend(k for k in chunk if k in states and k not in empty)
            sent += sum(size for k, (_, size) in states.items() if k not in empty)
            if len(states) < len(chunk):
                log.warning("precopy of %s/%s: no copy of %d keys in time; they move whole",
                            pipeline, element_id, len(chunk) - len(states))  # fmt: skip
                break
            largest = max(largest, *(size for _, size in states.values()))
            if len(done) >= PRECOPY_SAMPLE and largest < PRECOPY_MIN_BYTES:
                log.info("precopy of %s/%s: states of at most %d bytes, the rest move whole",
                         pipeline, element_id, largest)  # fmt: skip
                break
            step = _next_step(step, largest, PRECOPY_STEP_BYTES)
            if not pending and asked < len(keys):
                ask()
        log.info("precopied %d keys of %s/%s (%d bytes)", len(done), pipeline, element_id, sent)
        return Precopy(copy if done else None, done, sent, _ms_since(started))

    def _parts_count(self, parts: tuple[str, str]) -> int | None:
        """How many messages the target's parts subject (``parts``: stream and subject)
        holds; ``None`` while the broker is away: the moves are stored, and a look that
        fails only makes the next request wait for the copies (it raised a 503 that said
        nothing of the waves stored)."""
        try:
            return int(
                self.broker.run(
                    partial(subject_count, stream=parts[0], subject=parts[1]),
                    again_if_closed=True,
                )
            )
        except BrokerUnavailable as exc:
            log.warning("counting the parts on %s: %s", parts[1], exc.message)
            return None

    def _await_sending(
        self, pipeline: str, source: str, copy: str, at: int, keys: list[str],
        parts: tuple[str, str], before: int, deadline: float,
    ) -> bool:  # fmt: skip
        """Wait until the origin sends the copies requested at ``at`` (``keys``): the count
        of the target's parts subject (``parts``: stream and subject) passes ``before`` —
        then its batch is running, and a request appended now falls in its next batch.

        Returns:
            Whether it did; ``False`` once the copies are all stored without a part seen
            beyond ``before`` (their batch may be over: the next request goes after them),
            or at ``deadline``.
        """
        while time.monotonic() < deadline:
            count = self._parts_count(parts)
            if count is not None and count > before:
                return True
            states, _ = self._await_states(pipeline, source, copy, at, keys, 0.0)
            if len(states) >= len(keys):
                return False
            time.sleep(0.05)
        return False

    def _move_group(
        self, pipeline: str, element_id: str, parts: list[ElementSpec], to: ElementSpec,
        target: str, source: str, order: KeyOrder, started: float, timeout_s: float,
        group: tuple[int, int], owners: Ownership,
    ) -> KeyMoveReport:  # fmt: skip
        """Move key group ``group`` to ``to`` (see :meth:`migrate_keys`)."""
        g, n = group
        waiting = sorted(k for k in owners.pending if in_group(k, g, n))
        if waiting:
            raise Conflict(  # (a wait, not a refusal for good)
                f"cannot move key group {g}/{n} of {pipeline}/{element_id} now: "
                f"{', '.join(waiting[:5])} still wait for the state of an earlier move",
                expected="no key of the group waiting for an earlier move",
                received=", ".join(waiting[:5]),
                hint="that move completes when its origin partition runs; then move the group",
            )
        assert to.partition is not None
        index = to.partition.index

        def make(now: Ownership, held: set[str], move_id: str) -> KeyMove:
            moving = sorted(k for k in held if in_group(k, g, n) and now.owner(k) != index)
            return KeyMove(0, move_id, element_id, tuple(moving), index, order.value,
                           group=group)  # fmt: skip

        what = f"move key group {g}/{n} of {pipeline}/{element_id}"
        base: dict[str, Any] = {
            "pipeline": pipeline, "element": element_id, "target": target,
            "target_partition": to.id, "order": order, "group": f"{g}/{n}",
        }  # fmt: skip
        # The keys holding state now go ahead in waves, as listed keys do (a key stops only
        # while its wave crosses); the group's own record then moves those seen since and
        # sends the group's later keys to the target.
        listed = self._listed_keys(pipeline, parts)
        ahead = sorted(k for k in listed.keys if in_group(k, g, n) and owners.owner(k) != index)
        settled, waves, last = self._move_waves(pipeline, element_id, source, ahead, to, order,
                                                timeout_s, None, sizes=listed.sizes)  # fmt: skip
        if settled.error is not None:
            return KeyMoveReport(
                **base, status=KeyMoveStatus.PENDING, keys=ahead, move_seq=waves[0].seq,
                waves=waves, origins={k: parts[owners.owner(k)].id for k in ahead},
                sent=list(settled.stoppage_ms), stoppage_ms=settled.stoppage_ms,
                state_bytes=settled.state_bytes, left=settled.left,
                error=f"{settled.error}; the group's own record was not appended (the same "
                "command again appends it once the keys above have arrived)",
            )  # fmt: skip
        # The same listing: the input scan from its batches covers what came during the
        # waves (a state-reader job per partition again would slow their batches).
        move, at, before = self._append_listed(pipeline, element_id, parts, make, what,
                                               listed)  # fmt: skip
        log.info("moving key group %d/%d of %s/%s (%d keys with state, %d in waves before) to "
                 "%s at %s", g, n, pipeline, element_id, len(move.keys), len(ahead), to.id,
                 at)  # fmt: skip
        deadline = time.monotonic() + timeout_s
        rest = self._settle(pipeline, element_id, source, move, at, deadline)
        if rest.error is None:
            rest.error = self._await_commits(pipeline, element_id, source, last, deadline)
        waves.append(KeyWave(seq=at, keys=list(move.keys)))
        report = KeyMoveReport(
            **base, status=KeyMoveStatus.MOVED, keys=[*ahead, *move.keys],
            move_seq=waves[0].seq, waves=waves,
            origins={
                **{k: parts[owners.owner(k)].id for k in ahead},
                **{k: parts[before.owner(k)].id for k in move.keys},
            },
            sent=[*settled.stoppage_ms, *rest.stoppage_ms],
            stoppage_ms={**settled.stoppage_ms, **rest.stoppage_ms},
            state_bytes=settled.state_bytes + rest.state_bytes,
        )  # fmt: skip
        if rest.error is not None:
            return report.model_copy(update={"status": KeyMoveStatus.PENDING, "error": rest.error})
        return report.model_copy(update={"done_ms": _ms_since(started)})

    def _settle(
        self, pipeline: str, element_id: str, source: str, move: KeyMove, at: int,
        deadline: float,
    ) -> Settled:  # fmt: skip
        """Wait until every key of ``move`` (stored at ``at`` in the input ``source``) has
        its state stored and committed by its new partition, or ``deadline``."""
        moving = list(move.keys)
        states, moved_at = self._await_states(pipeline, source, move.move, at, moving, deadline)
        settled = Settled({}, 0)
        settled.note(states, moved_at)
        missing = sorted(set(moving) - set(states))
        if missing:
            settled.error = _no_state(missing)
            return settled
        last: dict[int, int] = {}  # each new partition's last state
        _note_last(last, states)
        settled.error = self._await_commits(pipeline, element_id, source, last, deadline)
        return settled

    def _committed_now(
        self, pipeline: str, element_id: str, source: str, indexes: list[int], deadline: float
    ) -> str | None:
        """Wait until the partitions ``indexes`` have committed their input ``source`` up to
        its last message now (a move an earlier call stored: its states are in there), or
        ``deadline``: why not, if not."""
        tail = int(
            self.broker.run(
                partial(last_seq, stream=stream_name(pipeline, source)), again_if_closed=True
            )
        )
        return self._await_commits(
            pipeline, element_id, source, dict.fromkeys(indexes, tail), deadline
        )

    def _placed_on(self, pipeline: str, pe: str) -> str:
        """Where ``pipeline/pe`` is placed now, for a message (``"no node"``: nowhere)."""
        record = self.registry.get_pipeline(pipeline)
        node = None if record is None else record.placement.get(pe)
        return f"node {node}" if node else "no node"

    def _await_commits(
        self, pipeline: str, element_id: str, source: str, last: dict[int, int],
        deadline: float,
    ) -> str | None:  # fmt: skip
        """Wait until each partition of ``last`` has committed its input ``source`` up to
        the sequence given (its last moved state), or ``deadline``: why not, if not."""
        for index, seq in sorted(last.items()):
            pe = partition_id(element_id, index)
            if not self._committed_past(pipeline, pe, source, seq, deadline):
                return (f"{pipeline}/{pe} on {self._placed_on(pipeline, pe)} has not committed "
                        "the moved states yet (it holds the keys)")  # fmt: skip
        return None

    def _await_states(
        self, pipeline: str, source: str, move: str, at: int, keys: list[str], deadline: float,
        empty: set[str] | None = None,
    ) -> tuple[dict[str, tuple[Any, int]], float | None]:  # fmt: skip
        """Wait until the state of every key of ``keys`` for ``move`` (stored at ``at`` in
        the input ``source``) is stored, or ``deadline``. (The requests of one precopy share
        its id: states of a later request's keys may come meanwhile, and do not count.)

        Only a state its key's owner sent counts (the one the target takes): a state from
        another partition is forged, and would end the wait while the key still waits.
        ``empty``: the keys whose state came empty (their origin held none) are added.

        Returns:
            Each key's state message and its size (a large state's parts included), for
            those stored; and when the move itself was stored (``None`` if not found).
        """
        stream, subjects = stream_name(pipeline, source), key_subjects(pipeline, source)
        wanted = set(keys)
        states: dict[str, tuple[Any, int]] = {}
        moved_at = None
        after = at - 1
        senders: Ownership | None = None  # read once a state comes (the move is stored)

        def away(exc: BrokerUnavailable) -> None:
            # (The records are stored: a broker away for a moment ends no wait before its
            # deadline, checked below; past it, the move is reported pending as for late
            # states.)
            log.warning("waiting for the states of move %s on %s/%s: %s", move, pipeline,
                        source, exc.message)  # fmt: skip
            time.sleep(0.5)

        while True:

            async def read(js: Any, start: int = after) -> Any:
                end = await last_seq(js, stream)
                return await get_ranges(js, stream, subjects, start, end)

            try:
                found = self.broker.run(read, timeout=30)
            except BrokerUnavailable as exc:
                away(exc)
                found = []
            for message in found:
                item = read_message(pipeline, source, message.subject, message.seq, message.data)
                if isinstance(item, KeyMove) and item.move == move:
                    moved_at = message.stored_at
                elif isinstance(item, KeyState) and item.move == move and item.key in wanted:
                    if item.origin is not None:
                        if senders is None:
                            try:
                                senders = self._ownership(pipeline, source, item.element)
                            except BrokerUnavailable as exc:
                                away(exc)
                                break  # read again from this state on
                        if not senders.sent_by_owner(item):
                            after = max(after, message.seq)
                            continue
                    if item.key not in states:
                        states[item.key] = (message, len(message.data) + item.size)
                        # (No part sent, none kept of a copy: its origin held no state of
                        # it. A typo's key was reported moved like any other.)
                        if empty is not None and not (item.state or item.parts or item.keep):
                            empty.add(item.key)
                after = max(after, message.seq)
            if len(states) >= len(keys) or time.monotonic() >= deadline:
                return states, moved_at
            time.sleep(0.05)

    def _unseen(self, pipeline: str, part: ElementSpec, keys: list[str]) -> list[str]:
        """Those of ``keys`` (owned by partition ``part`` already) that its state store
        holds nothing for as of its newest committed batch: a typo's key was said to be
        "already" there, without a word. ``[]`` if its node cannot say now (a warning
        only: the request goes on)."""
        if not keys:
            return []
        node = self.pipeline(pipeline).placement.get(part.id, part.node)
        record = self.registry.node(node)
        if record is None or not self.healthy(record):
            return []  # (a silent node would hold the request up for the call's timeout)
        path = f"/pipelines/{pipeline}/elements/{part.id}/keys"
        try:
            held = self.agent(node).call(StateKeys, "GET", path, timeout=UNSEEN_ASK_S)
        except FogshiftError as exc:
            log.info("cannot tell which keys %s holds: %s", part.id, exc)
            return []
        return [k for k in keys if k not in set(held.keys)]

    def _listed_keys(self, pipeline: str, parts: list[ElementSpec]) -> Listing:
        """The keys in every partition's state store as of its newest committed batch, with
        their sizes, and for each of the partitions' inputs the oldest position those
        batches end at.

        Every partition's node is asked at once: each answers from a state-reader job in
        its Spark session, which takes a second or more beside a busy query, and a key
        group's move or a rescale waits for them all.

        Raises:
            FogshiftError: A partition's node did not answer: the first failure, as soon as
                it comes (the other requests are not waited for: one may take its whole
                timeout, and the operation fails either way).
        """
        record, started = self.pipeline(pipeline), time.monotonic()

        took: dict[str, float] = {}

        def ask(part: ElementSpec) -> StateKeys:
            node, began = record.placement.get(part.id, part.node), time.monotonic()
            path = f"/pipelines/{pipeline}/elements/{part.id}/keys"
            answer = self.agent(node).call(StateKeys, "GET", path, timeout=120)
            took[part.id] = _ms_since(began)
            return answer

        workers = max(1, min(len(parts), LIST_AT_ONCE))
        pool = ThreadPoolExecutor(workers, thread_name_prefix="list-keys")
        try:
            asked = [pool.submit(ask, part) for part in parts]
            for future in as_completed(asked):
                failure = future.exception()
                if failure is not None:
                    raise failure
            answers = [future.result() for future in asked]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        held: set[str] = set()
        since: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for part, answer in zip(parts, answers, strict=True):
            held.update(answer.keys)
            for key, size in answer.sizes.items():  # (in two stores: one holds its move in)
                sizes[key] = sizes.get(key, 0) + size
            for name in part.inputs:
                start = part.partition.since_of(name) if part.partition is not None else 0
                position = int(answer.positions.get(name, start))
                since[name] = min(since.get(name, position), position)
        log.info("listed %d keys in the state stores of %s's partitions in %.0f ms (%s)",
                 len(held), pipeline, _ms_since(started),
                 ", ".join(f"{pe} {ms:.0f} ms" for pe, ms in sorted(took.items())))  # fmt: skip
        return Listing(held, since, sizes if held <= set(sizes) else {})

    def _append_listed(
        self,
        pipeline: str,
        element_id: str,
        parts: list[ElementSpec],
        make: Callable[[Ownership, set[str], str], KeyMove],
        what: str,
        listed: Listing | None = None,
        move_id: str | None = None,
        only: tuple[str, ...] | None = None,
        already: frozenset[str] = frozenset(),
    ) -> tuple[KeyMove, int, Ownership]:
        """Append the move ``make`` gives, from who owns each key now and every key that
        may hold state, to each of the partitions' inputs, the first first: a rescale, or a
        key group's move (a *listed* move, :attr:`~fogshift.broker.keys.KeyMove.listed`).

        The keys are those in every partition's state store as of its newest committed
        batch (:meth:`_listed_keys`, or ``listed`` as it gave them earlier), plus the keys
        of every event, move and state stored in any of the inputs after the oldest of
        those batches. Each input's record is appended only if that input's last sequence
        is still the last one looked at (``Nats-Expected-Last-Sequence``); else what came
        is looked at too and the record made again. So no key gains state unseen before
        the move's place in its input: with several inputs, a record lists every key seen
        until its append, in any input, that no earlier record of the move lists (so a
        later record stays small), with the inputs' ends as scanned for it (``scanned``),
        and the move's keys are the union of its records
        (:func:`~fogshift.broker.keys.listed_unions`; the partitions read a listed move
        only once it is stored in all their inputs).

        ``move_id``, ``only`` and ``already``: complete a move stored in some inputs only
        (appended to ``only``, under its id, without the keys its stored records list;
        :meth:`_complete_moves`, which keeps the element's completeness mark).

        Returns:
            The move with all its keys (the union of its records; with several inputs,
            ``scanned`` where the last look ended), its sequence in the first input (where
            the keys' states travel; ``0`` when it was not appended there now), and the
            ownership before it.

        Raises:
            InvalidInput: The move is larger than a broker message.
            Unavailable: An input never stood still long enough (the inputs appended
                before keep the record: the move is completed by
                :meth:`complete_key_moves` or the next move of the element).
        """
        key_by = parts[0].key_by
        first = parts[0].partition
        assert key_by is not None and first is not None
        inputs = parts[0].inputs
        listing = listed or self._listed_keys(pipeline, parts)
        held, since = set(listing.keys), listing.since
        scanned = {name: since.get(name, first.since_of(name)) for name in inputs}
        move_id = move_id or uuid.uuid4().hex[:12]
        several = len(inputs) > 1
        marks = several and only is None  # (completing, the caller keeps the mark)
        if marks:
            self._moves_complete.discard((pipeline, element_id))  # (until all are stored)
        listed_before = set(already)  # the keys the move's records stored so far list
        # Who owns what changes only by moves, which only this orchestrator appends (under
        # the element's lock): replayed again only when a look finds one, not at every try
        # (the whole history of moves between a look and the append: on a busy input with
        # many moves behind it, some event always came meanwhile, and every try failed).
        owners: Ownership | None = None
        move: KeyMove | None = None
        first_at = 0
        for name in only if only is not None else inputs:
            at: int | None = None
            for _ in range(APPEND_TRIES):
                if owners is None:  # (before the look: its time is the append's window)
                    owners = self._owners(pipeline, inputs[0], element_id, first.first_count,
                                          without=move_id)  # fmt: skip
                ends, found, cut = self.broker.run(
                    partial(_look, pipeline=pipeline, since=dict(scanned), last=name),
                    timeout=120,
                )  # fmt: skip
                if cut:
                    # Records after where the look began were trimmed (a move that waited
                    # longer than the history's age on a lagging partition): a key only they
                    # held would be missed, and moved without its state. The partitions'
                    # state stores again, as of commits past what was trimmed.
                    log.warning("%s: records of %s after %s were trimmed while it looked; "
                                "listing the partitions' keys again", what, ", ".join(cut),
                                scanned)  # fmt: skip
                    again = self._listed_keys(pipeline, parts)
                    held |= again.keys
                    scanned = {n: again.since.get(n, first.since_of(n)) for n in inputs}
                    owners = None
                    continue
                for source, message in found:
                    if message.subject != data_subject(pipeline, source):
                        item = read_message(pipeline, source, message.subject, message.seq,
                                            message.data)  # fmt: skip
                        if item is None or item.element != element_id:
                            continue
                        if isinstance(item, KeyMove) and item.move == move_id:
                            continue  # (this move's own records, in the inputs before)
                        if isinstance(item, KeyMove):
                            held.update(item.keys)
                            owners = None
                        elif isinstance(item, KeyCopy):
                            owners = None
                        elif isinstance(item, KeyState):
                            held.add(item.key)
                        continue
                    key = body_key(event_fields(message.data)[3], key_by)
                    if key is not None:
                        held.add(key)
                scanned = ends
                if owners is None:
                    owners = self._owners(pipeline, inputs[0], element_id, first.first_count,
                                          without=move_id)  # fmt: skip
                move = make(owners, held, move_id)
                record = move
                if several:
                    fresh = tuple(k for k in move.keys if k not in listed_before)
                    record = replace(move, keys=fresh, scanned=tuple(sorted(ends.items())))
                payload = record.payload()
                if len(payload) > MAX_RECORD_BYTES:
                    raise InvalidInput(
                        f"cannot {what}: {len(record.keys)} keys would move, more than one "
                        f"record holds ({len(payload)} bytes)",
                        expected=f"a move record of at most {MAX_RECORD_BYTES} bytes",
                        received=f"{len(record.keys)} keys",
                        hint="move fewer keys at a time (smaller steps, smaller key groups)",
                    )
                at = self.broker.run(
                    partial(_append_after, pipeline=pipeline, source=name, body=payload,
                            after=ends[name], msg_id=f"{element_id}:listed:{move_id}"),
                    timeout=30,
                )  # fmt: skip
                if at is not None:
                    break
            if at is None:
                raise Unavailable(
                    f"cannot {what}: its input {name!r} never stood still between looking "
                    f"at it and appending the move ({APPEND_TRIES} tries); the move was not "
                    "appended there",
                    hint="try again",
                )
            if name == inputs[0]:
                first_at = at
            listed_before.update(record.keys)
        if marks:
            self._moves_complete.add((pipeline, element_id))
        assert move is not None and owners is not None
        if several:
            move = replace(move, keys=tuple(sorted(listed_before)),
                           scanned=tuple(sorted(scanned.items())))  # fmt: skip
        return move, first_at, owners

    def _ownership(self, pipeline: str, source: str, element_id: str) -> Ownership:
        """:meth:`_owners` of partitioned element ``element_id`` (its partitions' count at
        the input's start from its spec)."""
        parts = [e.partition for e in self.pipeline(pipeline).spec.elements
                 if e.partition is not None and e.partition.of == element_id]  # fmt: skip
        count = parts[0].first_count if parts else 1
        return self._owners(pipeline, source, element_id, count)

    def _owners(
        self, pipeline: str, source: str, element_id: str, count: int,
        without: str | None = None,
    ) -> Ownership:  # fmt: skip
        """Who owns each key now: the key moves stored so far in the first input
        ``source``, replayed (a listed move with the union of its records in every input
        of the partitions, see :func:`~fogshift.broker.keys.listed_unions`); ``without``
        that move (one being appended)."""
        stream, subjects = stream_name(pipeline, source), key_subjects(pipeline, source)
        parts = self.pipeline(pipeline).spec.partitions_of(element_id)
        others = [n for n in (parts[0].inputs if parts else ()) if n != source]

        async def read(js: Any) -> tuple[list[Any], list[Any]]:
            found = await get_ranges(js, stream, subjects, 0, await last_seq(js, stream))
            more: list[Any] = []
            for name in others:  # (their moves only: key states travel on the first)
                other = stream_name(pipeline, name)
                more += await get_range(js, other, keys_subject(pipeline, name), 0,
                                        await last_seq(js, other))  # fmt: skip
            return found, more

        found, more = self.broker.run(read, timeout=60)
        items = [
            (message, read_message(pipeline, source, message.subject, message.seq, message.data))
            for message in found
        ]
        unions = listed_unions(
            item for item in (*(i for _, i in items), *(parse(m.seq, m.data) for m in more))
            if isinstance(item, KeyMove) and item.element == element_id
        )  # fmt: skip
        owners = Ownership(count)
        for _, item in items:
            if item is None or item.element != element_id:
                continue
            if isinstance(item, KeyMove) and item.move != without:
                owners.apply(widened(item, unions))
            elif isinstance(item, KeyCopy):
                owners.request(item)
            elif isinstance(item, KeyState):
                owners.settle(item)  # (one its key's owner sent: see Ownership.settle)
        return owners

    def _committed_past(
        self, pipeline: str, pe: str, source: str, seq: int, deadline: float
    ) -> bool:
        """Whether ``pe`` commits input ``source`` up to ``seq`` by ``deadline``, wherever it
        runs: its node is looked up again after a failed ask and every
        :data:`PLACEMENT_RECHECK_S` (a restore or a migration may move it meanwhile: a
        partition restored elsewhere after its node died commits there)."""
        node: str | None = None
        looked = 0.0
        watch = PositionWatch()
        while time.monotonic() < deadline:
            if node is None or time.monotonic() - looked >= PLACEMENT_RECHECK_S:
                node, looked = self.pipeline(pipeline).placement.get(pe), time.monotonic()
            # After the first answer, each request waits at the agent for the next commit
            # (a long poll), never past the next placement look or the deadline.
            watch.wait_s = min(looked + PLACEMENT_RECHECK_S, deadline) - time.monotonic()
            position = (
                self._position(pipeline, pe, source, node, watch) if node is not None else None
            )
            if (position or 0) >= seq:  # (up to 0: nothing to commit, wherever it runs)
                return True
            if position is None:
                node = None
            time.sleep(0.05)
        return False


async def _look(
    js: Any, pipeline: str, since: dict[str, int], last: str | None = None
) -> tuple[dict[str, int], list[tuple[str, Any]], list[str]]:
    """Every input of ``since``'s last sequence, and its data and key messages after its
    position there: ``(input, message)``, input by input, input ``last`` last (the one a
    record is appended to next: the less time between reading its end and the append,
    the likelier nothing came in between on a busy input); and the inputs whose data
    records after that position were trimmed (``recovery.history_s``) before the read
    ended: the read skipped them, and the keys only they held."""
    ends: dict[str, int] = {}
    found: list[tuple[str, Any]] = []
    cut: list[str] = []
    order = sorted(since, key=lambda name: name == last)  # (stable: the others as given)
    for name, start in ((n, since[n]) for n in order):
        stream = stream_name(pipeline, name)
        end = ends[name] = int(await last_seq(js, stream))
        found += [(name, m) for m in await get_range(js, stream, data_subject(pipeline, name),
                                                      start, end)]  # fmt: skip
        found += [(name, m) for m in await get_ranges(js, stream, key_subjects(pipeline, name),
                                                       start, end)]  # fmt: skip
        # After the read: a trim marks its bound before it removes anything.
        if await trimmed_below(js, stream) > start + 1:
            cut.append(name)
    return ends, found, cut


async def _scan_is_short(js: Any, pipeline: str, ends: dict[str, int]) -> bool:
    """Whether each input of ``ends`` holds at most :data:`COMPLETE_SCAN_MAX` messages after
    its position there, and none of those was trimmed (``recovery.history_s``: a scan
    would skip what was, and miss its keys)."""
    for name, end in ends.items():
        stream = stream_name(pipeline, name)
        if await last_seq(js, stream) - end > COMPLETE_SCAN_MAX:
            return False
        if await trimmed_below(js, stream) > end + 1:
            return False
    return True


async def _append_after(
    js: Any, pipeline: str, source: str, body: bytes, after: int, msg_id: str
) -> int | None:
    """Append ``body`` to the ``.keys`` subject of input ``source`` if its stream still
    ends at ``after``; its sequence, or ``None`` if something came in meanwhile."""
    try:
        ack = await js.publish(
            keys_subject(pipeline, source), body, stream=stream_name(pipeline, source),
            headers={"Nats-Expected-Last-Sequence": str(after), "Nats-Msg-Id": msg_id},
        )  # fmt: skip
    except APIError as exc:
        if exc.err_code == WRONG_LAST_SEQUENCE:
            return None  # something came in meanwhile: look at it, then again
        raise
    return int(ack.seq)


def _relisted(stored: KeyMove) -> Callable[[Ownership, set[str], str], KeyMove]:
    """How to make again the listed move ``stored`` (read from an input) for the inputs
    that lack it: its keys and every key held whose owner it changes."""

    def make(now: Ownership, held: set[str], move_id: str) -> KeyMove:
        covered = (k for k in held if stored.group is None or in_group(k, *stored.group))
        moving = {k for k in covered if now.owner(k) != stored.target(k)}
        return replace(stored, seq=0, move=move_id, keys=tuple(sorted(moving | set(stored.keys))))

    return make


def _ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 1)


def _next_step(step: int, largest: int, most_bytes: int, most_keys: int = MAX_KEYS) -> int:
    """How many keys the next step of a precopy or move may take, after one of ``step``
    keys: at most four times as many (sizes differ between keys), as many as
    ``most_bytes`` holds at the ``largest`` state so far, at most ``most_keys``, at least
    one."""
    return max(1, min(4 * step, most_bytes // largest, most_keys))


def _fitting(keys: list[str], sizes: dict[str, int], most_keys: int, most_bytes: int) -> int:
    """How many of ``keys``, from the first, make a wave of at most ``most_keys`` keys and
    ``most_bytes`` of ``sizes``: at least one."""
    count, total = 0, 0
    for key in keys[:most_keys]:
        total += sizes[key]
        if count and total > most_bytes:
            break
        count += 1
    return max(1, count)


def _note_last(last: dict[int, int], states: dict[str, tuple[Any, int]]) -> None:
    """Raise ``last`` (each partition's last state's sequence, to await its commit) to the
    key state messages of ``states`` (as :meth:`KeyMoves._await_states` gives them)."""
    for message, _ in states.values():
        item = parse(message.seq, message.data)  # (a state: read_message took it)
        if isinstance(item, KeyState):
            last[item.to] = max(last.get(item.to, 0), message.seq)


def _no_state(missing: list[str]) -> str:
    return (
        f"no state yet for {counted(len(missing), 'key')} ({', '.join(missing[:10])}) in time: "
        "their events wait at their new partition until their origin sends them"
    )


def _target_partition(
    pipeline: str,
    element_id: str,
    parts: list[ElementSpec],
    placement: Mapping[str, str],
    target: str,
    nodes: Collection[str],
) -> tuple[ElementSpec, str]:
    """The partition a key move's ``target`` names and the node it runs on: ``target`` is a
    partition's id, or a node (one of ``nodes``) where exactly one partition of the element
    runs.

    Raises:
        UnknownNode: ``target`` is neither a node nor one of the element's partitions.
        InvalidInput: No partition of the element runs on node ``target``, or several do
            (which one the keys should go to is the user's to say).
    """
    what = f"keys of {pipeline}/{element_id}"
    if (
        target not in nodes
        and all(p.id != target for p in parts)
        and not target.startswith(f"{element_id}-p")
    ):  # (it said "no partition runs there" of a node that does not exist)
        raise UnknownNode(
            f"cannot move {what} to {target!r}: no node or partition of {element_id!r} has "
            "that name",
            expected="a node ("
            + ", ".join(sorted(nodes))
            + ") or a partition's id ("
            + ", ".join(p.id for p in parts)
            + ")",
            received=repr(target),
            hint=f"`fogshift nodes` lists the nodes, `fogshift status {pipeline}` the partitions",
        )
    for part in parts:
        if part.id == target and placement.get(part.id) is not None:
            return part, placement[part.id]
    here = [p for p in parts if placement.get(p.id) == target]
    if len(here) == 1:
        return here[0], target
    hosted = ", ".join(f"{p.id} ({placement.get(p.id)})" for p in parts)
    if not here:
        # (A partition id the element does not have is no node to move a partition to.)
        named_part = target.startswith(f"{element_id}-p") and all(p.id != target for p in parts)
        raise InvalidInput(
            f"cannot move {what} to {target!r}: "
            + (
                f"{element_id!r} has no partition {target!r}"
                if named_part
                else f"no partition of {element_id!r} runs there"
            ),
            expected="a partition's id, or a node hosting one of " + hosted,
            received=repr(target),
            hint=f"name one of {', '.join(p.id for p in parts)}, or give it more partitions "
            f"first (`fogshift scale {pipeline} {element_id} --partitions N`)"
            if named_part
            else f"move a partition there first (`fogshift migrate {pipeline} "
            f"{parts[0].id} --to {target}`)",
        )
    raise InvalidInput(
        f"cannot move {what} to {target!r}: {len(here)} partitions of {element_id!r} run there",
        expected="one partition's id: " + " or ".join(p.id for p in here),
        received=repr(target),
        hint=f"name the partition the keys go to, e.g. `--to {here[0].id}`",
    )


def _check_keys(what: str, keys: list[str]) -> None:
    """Refuse an empty, too long or doubled key list, or a key no PE could hold.

    A PE holds any key of at most :data:`MAX_KEY_CHARS` characters (a longer one's event is
    a dead letter): an empty one (an empty CSV cell) or one with a tab or another control
    character too, which was held, read and moved by a scale but refused here by name. Not
    one with a lone surrogate: its event is a dead letter (``broker.keys.key_refusal``), and
    it has no UTF-8 form to be routed by.
    """
    bad = [k for k in keys if len(k) > MAX_KEY_CHARS or not has_utf8(k)]
    if not keys or len(keys) > MAX_KEYS or bad or len(set(keys)) != len(keys):
        raise InvalidInput(
            f"cannot move {what}: bad key list",
            expected=f"1 to {MAX_KEYS} distinct keys, each of at most {MAX_KEY_CHARS} "
            "characters, no lone surrogate (a key is the key_by field's value as text)",
            received=_bad_keys(keys, bad),
            hint="e.g. --keys p01,p02",
        )
    listed = len(json.dumps(keys))
    if listed > MAX_RECORD_BYTES // 2:  # (the move's record, and its state requests, carry them)
        raise InvalidInput(
            f"cannot move {what}: the keys are too long together for one move",
            expected=f"keys of at most {MAX_RECORD_BYTES // 2:,} bytes as JSON in one move",
            received=f"{len(keys)} keys, {listed:,} bytes",
            hint="move them in two or more commands",
        )


def _bad_keys(keys: list[str], bad: list[str]) -> str:
    """What is wrong with a key list :func:`_check_keys` refuses, as received."""
    if not keys:
        return "(none)"
    if bad:
        return ", ".join(repr(k[: MAX_KEY_CHARS + 1]) for k in bad[:5])
    if len(keys) > MAX_KEYS:
        return f"{len(keys)} keys"
    doubled = sorted({k for k in keys if keys.count(k) > 1})
    return "listed twice: " + ", ".join(repr(k) for k in doubled[:5])


def _known_for_keys(record: PipelineRecord, element_id: str) -> None:
    """Refuse an id that is no element of ``record``'s pipeline, naming its partitioned
    elements (what keys move between), not every element and partition.

    Raises:
        UnknownElement: No element has that id.
    """
    if any(e.id == element_id for e in record.spec.elements):
        return
    keyed = sorted({e.partition.of for e in record.spec.elements if e.partition is not None})
    guess = did_you_mean(element_id, keyed)
    raise UnknownElement(
        f"pipeline {record.name!r} has no element {element_id!r}",
        expected="one of its partitioned elements (keys move between their partitions): "
        + (", ".join(keyed) or "(it has none)"),
        received=repr(element_id),
        hint=f"did you mean {guess!r}?"
        if guess
        else f"`fogshift status {record.name}` lists its elements",
    )
