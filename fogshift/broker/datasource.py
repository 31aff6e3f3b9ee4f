"""The Spark side of the broker: a Python Data Source for JetStream.

Reading (``spark.readStream.format("fogshift-jetstream")``): the offsets are the stream
sequences of the element's inputs, as ``{"type": "jetstream", "positions": {pe: seq}}``.
A micro-batch ``(start, end]`` becomes one partition whose rows come in a fixed order (input by
input, then by sequence; for a batch that replays several logged cuts, see below, cut by cut
first) and carry an ``origin``: the sum of all input positions after the row. It grows
strictly, so it identifies the row's place in the element's input history.

For an element with several inputs that place depends on where batches are cut, so every cut
is *logged* in the element's own stream (subject ``.cut``, under its epoch, fenced like a
record) before the batch runs, and every later execution — a restart, a restore from an older
checkpoint, a migration target — replays the logged cuts instead of cutting anew. The order in
which the inputs' events meet the element, and so every ``origin``, is therefore the same in
every execution; fresh cuts are made only at the end of the log. An execution behind the log
replays several consecutive cuts in one batch, cut after cut: the same rows in the same
order, in fewer batches, so that it can catch up with an instance that runs.

Writing (``writeStream.format("fogshift-jetstream")``): every record goes through
:func:`fogshift.broker.publish.publish_records`, which makes re-executed batches idempotent.

Contract: both sides run in Spark's Python workers, which share no memory with the driver;
everything they need comes through the options (strings) — never credentials: those are
read from the broker file named by the ``broker`` option.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
from nats.errors import Error as NatsError
from nats.js.errors import NoStreamResponseError, NotFoundError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from fogshift.broker.client import (
    READ_AHEAD_BYTES,
    BrokerAddress,
    StoredMessage,
    SyncJetStream,
    connection_of,
    get_range,
    get_ranges,
    last_seq,
    last_stored_by,
    read_ahead,
    shared_client,
    stamp_nanos,
    stored_stamp,
)
from fogshift.broker.exceptions import BrokerError, BrokerUnavailable, Fenced, WriterConflict
from fogshift.broker.history import trimmed_below
from fogshift.broker.keys import (
    CONTROL_FIELD,
    KEY_COPY_IN,
    KEY_COPY_OUT,
    KEY_INDEX,
    KEY_MOVE_IN,
    KEY_MOVE_OUT,
    KEY_STATE,
    KeyCopy,
    KeyMove,
    KeyState,
    Ownership,
    body_key,
    event_fields,
    joined_state,
    listed_unions,
    parse,
    read_message,
    state_parts,
    state_payload,
    widened,
)
from fogshift.broker.naming import (
    data_subject,
    key_state_subject,
    key_subjects,
    keys_subject,
    state_subject,
    stream_name,
)
from fogshift.broker.parts_ahead import PartsAhead
from fogshift.broker.publish import (
    Cut,
    Record,
    append_cut,
    check_epoch,
    next_cut,
    publish_records,
)
from fogshift.checkpoint import key_index
from fogshift.common.gate import read_gate
from fogshift.events import DEFAULT_MAX_RECORD_BYTES, ORIGIN_HEADER, fit_dead_letter
from fogshift.exceptions import FogshiftError, InvariantViolation
from fogshift.spec.models import partition_id

log = logging.getLogger(__name__)

#: The rows a reader yields: one input event each.
EVENT_SCHEMA = "origin long, seq long, timestamp double, creator string, body string"
#: The rows a writer takes: one output record each (``dead`` is the reason of a dead letter).
RECORD_SCHEMA = (
    "origin long, idx int, seq long, timestamp double, creator string, body string, dead string"
)
OFFSET_TYPE = "jetstream"


def offset(positions: dict[str, int], cut: int | None = None, shift: int = 0) -> dict[str, Any]:
    """A reader offset as a typed plain dict.

    ``cut`` (PEs with several inputs): the stream sequence of the logged cut that ends at
    ``positions``; the next batch's cut is looked up after it. ``shift`` (a partition with
    several inputs whose keys move): how far its rows' origins are ahead of the sum of its
    inputs' positions (see :meth:`JetStreamReader._partition_rows`).
    """
    value: dict[str, Any] = {"type": OFFSET_TYPE, "positions": dict(positions)}
    if cut is not None:
        value["cut"] = int(cut)
    if shift:
        value["shift"] = int(shift)
    return value


def shift_of(value: dict[str, Any]) -> int:
    """The origins' shift an offset ends at (see :func:`offset`)."""
    return int(value.get("shift", 0))


def cut_of(value: dict[str, Any]) -> int:
    """The sequence of the logged cut an offset ends at (0: none yet, look from the start)."""
    return int(value.get("cut", 0))


def positions_of(value: dict[str, Any]) -> dict[str, int]:
    """The positions in a reader offset (checks the type tag)."""
    if value.get("type") != OFFSET_TYPE:
        raise InvariantViolation(f"not a jetstream offset: {value!r}")
    return {k: int(v) for k, v in value["positions"].items()}


#: Logged cuts replayed in one batch at most (see :meth:`JetStreamReader._replay`).
MAX_CUTS_PER_BATCH = 200
#: Collects of the inputs' tails at most, until two agree (see :meth:`JetStreamReader._tails`).
SNAPSHOT_TRIES = 20


def _upstream(message: StoredMessage) -> int:
    """The input position a partition's record carries (``-1``: none, a foreign message)."""
    try:
        return int(message.headers.get(ORIGIN_HEADER, -1))
    except ValueError:
        return -1


#: How many messages a read-ahead asks for when the query sets no read limit.
READ_AHEAD_COUNT = 10_000
#: How long a planned batch waits for the messages read for it in the background, before
#: reading them itself.
READ_AHEAD_WAIT_S = 30.0
#: A batch of at least this many messages (or a full one) means the input is busy: the
#: reader then reads the next batch in the background while Spark runs this one.
BUSY_BATCH = 1_000
#: The pause between two background reads: what is stored meanwhile is read by the next
#: one, or by the planned batch itself (a few requests a second, not one per message).
ROUND_PAUSE_S = 0.05
#: The longest a background read goes on untaken (a held gate keeps Spark from asking).
READ_AHEAD_MAX_S = 5.0
#: Background reads in a row that find nothing new before it stops (the input paused; the
#: batch reads what comes later itself). One empty read is no pause: a busy machine's
#: producer can miss a round.
READ_AHEAD_IDLE_ROUNDS = 4
#: A reader whose quickest of its last :data:`LINK_READS` small reads took at least this
#: long sits behind a slow link to the broker (a fog node over a delaying link): it reads
#: ahead after every batch, and a batch takes what was read by then, without asking again.
SLOW_LINK_S = 0.1
#: Small reads (fewer than :data:`BUSY_BATCH` messages) a reader times to know its link:
#: its first batches over a slow link are planned the slow way (each one more round trip).
LINK_READS = 3


@dataclass(frozen=True)
class Range:
    """Stream sequences ``(start, end]`` of one input."""

    input: str
    start: int
    end: int


def span_range(span: Sequence[Range], name: str) -> Range:
    """The range of input ``name`` in ``span``."""
    return next(r for r in span if r.input == name)


@dataclass(frozen=True)
class _Rows:
    """Messages read ahead: every message's sequence (of any subject: they all move the
    position), a row for each event on the data subject, and their payloads' bytes."""

    seqs: list[int] = field(default_factory=list)
    rows: list[tuple[int, int, float, str, str]] = field(default_factory=list)
    size: int = 0

    def until(self, stop: int | None) -> _Rows:
        """Those with a sequence up to ``stop`` (all if ``None``)."""
        if stop is None or not self.seqs or self.seqs[-1] <= stop:
            return self
        seqs = [q for q in self.seqs if q <= stop]
        return _Rows(seqs, [r for r in self.rows if r[0] <= stop], self.size)

    def extended(self, more: _Rows) -> _Rows:
        return _Rows([*self.seqs, *more.seqs], [*self.rows, *more.rows], self.size + more.size)


async def _read_rows(js: Any, stream: str, subject: str, after: int, count: int) -> _Rows:
    """Up to ``count`` messages of ``stream`` after ``after`` (:func:`read_ahead`), with the
    rows of its events on ``subject`` — decoded on the client's loop, so that a read in the
    background decodes in the background too."""
    messages = await read_ahead(js, stream, after, count)
    rows = [(m.seq, *event_fields(m.data)) for m in messages if m.subject == subject]
    return _Rows([m.seq for m in messages], rows, sum(len(m.data) for m in messages))


class _ReadingAhead:
    """The next batch's messages, read in the background on a client's loop while Spark runs
    this one: a read every :data:`ROUND_PAUSE_S` from where the last ended, until
    :meth:`take`, a batch's worth (``count`` messages, :data:`READ_AHEAD_BYTES`),
    :data:`READ_AHEAD_IDLE_ROUNDS` reads in a row that find nothing new, or
    :data:`READ_AHEAD_MAX_S`.

    Args:
        client: The reader's broker client.
        read: :func:`_read_rows` with its stream and subject.
        after: The position the next batch starts from.
        count: The most messages it may take.
    """

    def __init__(
        self,
        client: SyncJetStream,
        read: Callable[..., Awaitable[_Rows]],
        after: int,
        count: int,
    ) -> None:
        self.after = after
        self._read, self._count = read, count
        self._taken = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        #: What the reads so far found (replaced whole after each read: a consistent
        #: snapshot for :meth:`take` from another thread).
        self._got = _Rows()
        self._future: Future[_Rows] = client.submit(self._rounds)

    async def _rounds(self, js: Any) -> _Rows:
        self._wake, self._loop = asyncio.Event(), asyncio.get_running_loop()
        last = self.after
        until, idle = time.monotonic() + READ_AHEAD_MAX_S, 0
        while not self._taken.is_set() and time.monotonic() < until:
            more = await self._read(js, after=last, count=self._count - len(self._got.seqs))
            if more.seqs:
                self._got, last, idle = self._got.extended(more), more.seqs[-1], 0
            else:
                idle += 1
            if len(self._got.seqs) >= self._count or self._got.size >= READ_AHEAD_BYTES:
                break
            if idle >= READ_AHEAD_IDLE_ROUNDS:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), ROUND_PAUSE_S)
        return self._got

    def take(self, settled: bool = True) -> _Rows | None:
        """What was read (after the read under way, if one is); ``None`` if reading failed
        (the caller then reads for itself, and meets the error if it persists).

        Args:
            settled: Wait for the read under way. ``False`` takes what the finished reads
                found and drops the read under way (over a slow link that is a round trip
                the batch need not wait for: what it would bring goes to the next batch);
                with nothing found yet, it waits as with ``True``.
        """
        self._taken.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: so is the future
                loop.call_soon_threadsafe(wake.set)
        got = self._got
        if not settled and got.seqs and not self._future.done():
            self._future.cancel()
            return got
        try:
            return self._future.result(READ_AHEAD_WAIT_S)
        except Exception as exc:  # a failed read-ahead only costs the reads it saved
            log.debug("reading ahead after %d failed: %r", self.after, exc)
            self.cancel()
            return None

    def cancel(self) -> None:
        self._taken.set()
        self._future.cancel()


class JetStreamPartition(InputPartition):
    """One micro-batch: its spans in order, each a range per input, read input by input.

    A batch is one span, except when a PE with several inputs replays several logged cuts
    in one batch: then each cut is a span, and the rows come span by span, so that they
    meet the PE in the order (and with the ``origin``) they had when the cuts ran one by one.
    """

    def __init__(
        self,
        spans: Sequence[Sequence[Range]],
        rows: list[tuple[int, int, float, str, str]] | None = None,
        keys: list[StoredMessage] | None = None,
        parts: dict[int, bytes] | None = None,
        shift: int = 0,
        ends: int | None = None,
    ) -> None:
        super().__init__([list(span) for span in spans])
        self.spans = [list(span) for span in spans]
        #: The batch's rows, read ahead by the planner (see ``JetStreamReader._read_ahead``):
        #: then the executor asks the broker nothing.
        self.rows = rows
        #: A partition's batch: its ``.keys`` messages, read by the planner, and the parts of
        #: the key states they name that the planner had fetched ahead
        #: (:mod:`fogshift.broker.parts_ahead`), by sequence.
        self.keys = keys
        self.parts = parts or {}
        #: A partition with several inputs: its origins' shift where the batch starts, and
        #: where the planner found it ends (``None``: not checked).
        self.shift = shift
        self.ends = ends


#: The Arrow schema of :data:`EVENT_SCHEMA`.
EVENT_ARROW_SCHEMA = pa.schema(
    [
        ("origin", pa.int64()),
        ("seq", pa.int64()),
        ("timestamp", pa.float64()),
        ("creator", pa.string()),
        ("body", pa.string()),
    ]
)


def _arrow_rows(rows: Sequence[tuple[int, int, float, str, str]]) -> pa.RecordBatch:
    """Event rows (:data:`EVENT_SCHEMA`) as one Arrow record batch."""
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, EVENT_ARROW_SCHEMA, strict=True)],
        schema=EVENT_ARROW_SCHEMA,
    )


class InputArrivals:
    """Wakes a waiting reader when a message arrives on one of its inputs.

    A plain (core NATS) subscription on the inputs' data subjects: each message published to
    an input is also delivered here, and only noted (the reader then asks the stream).
    Arrivals between two waits are not lost: :meth:`wait` returns at once if any came since
    the last call.
    """

    def __init__(self, client: SyncJetStream, subjects: Sequence[str]) -> None:
        self._event = threading.Event()
        self._client = client
        self._subjects = list(subjects)
        self._subscribed_on: Any = None  # the connection the subscriptions are on
        self._subscriptions: list[Any] = []
        self._subscribe()

    def _subscribe(self) -> None:
        async def on_message(msg: Any) -> None:
            self._event.set()

        async def subscribe(js: Any) -> tuple[Any, list[Any]]:
            nc = connection_of(js)
            return nc, [await nc.subscribe(s, cb=on_message) for s in self._subjects]

        self._subscribed_on, self._subscriptions = self._client.run(subscribe)

    def close(self) -> None:
        """Unsubscribe (the client is the process's, shared: it outlives the reader)."""
        subscriptions, self._subscriptions = self._subscriptions, []

        async def unsubscribe(js: Any) -> None:
            for subscription in subscriptions:
                with contextlib.suppress(NatsError):  # (already gone with its connection)
                    await subscription.unsubscribe()

        if subscriptions:
            with contextlib.suppress(FogshiftError):  # (the broker gone: nothing to undo)
                self._client.run(unsubscribe)

    def wait(self, timeout_s: float) -> bool:
        """Whether a message arrived since the last call, waiting up to ``timeout_s``."""
        if self._subscribed_on is not None and self._subscribed_on.is_closed:
            # Closed for good by the broker (the client connects anew at its next call):
            # the subscriptions went with it, and no arrival would wake this again — each
            # idle poll of the reader waited its whole time, for the worker's life.
            with contextlib.suppress(FogshiftError):  # (the broker away: next time)
                self._subscribe()
                self._event.set()  # (what came meanwhile was not seen: look at the stream)
        arrived = self._event.wait(max(0.0, timeout_s))
        self._event.clear()
        return arrived


class JetStreamDataSource(DataSource):
    """Options: ``broker`` (broker file), ``pipeline``, ``pe`` (the element itself),
    ``inputs`` (comma-separated element ids, reader only), ``max_events_per_batch``,
    ``gate`` (the gate file, see :mod:`fogshift.common.gate`; reader only), ``idle_wait_ms``
    (reader only: how long ``latestOffset`` waits for new input before answering "nothing";
    0, the default, answers at once)."""

    @classmethod
    def name(cls) -> str:
        return "fogshift-jetstream"

    def schema(self) -> str:
        return EVENT_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return JetStreamReader(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return JetStreamWriter(dict(self.options))


#: The merged partitions' name among the inputs sharing a batch's read limit.
MERGED_SHARE = "|merged|"


class JetStreamReader(DataSourceStreamReader):
    """Reads the data subjects of an element's inputs. Created by Spark, once per query."""

    def __init__(self, options: dict[str, str]) -> None:
        self.broker = BrokerAddress.load(options["broker"])
        self.pipeline = options["pipeline"]
        self.pe = options.get("pe", "")
        self.epoch = int(options.get("epoch", "0"))
        self.inputs = [i for i in options["inputs"].split(",") if i]
        self.max_events = int(options.get("max_events_per_batch", "10000"))
        self.gate = options.get("gate")
        self.idle_wait_s = int(options.get("idle_wait_ms", "0")) / 1000
        # A partition whose keys move (see ElementSpec.moves_keys): "element:index:count".
        part = options.get("partition", "")
        self.key_by = options.get("key_by", "")
        self.partition: tuple[str, int, int] | None = None
        if part:  # (one input, or several none of which is a partitioned element's)
            of, index, count = part.rsplit(":", 2)
            self.partition = (of, int(index), int(count))
        #: Where a partition added by ``fogshift scale`` starts, in each input: it owns
        #: nothing before (one position for every input, or a JSON object by input).
        since = json.loads(options.get("since", "0") or "0")
        self.since = {n: int(since.get(n, 0) if isinstance(since, dict) else since)
                      for n in self.inputs}  # fmt: skip
        #: Runs of inputs that are the partitions of one element: "a|b;c|d" (see ``read``).
        self.merged = [tuple(g.split("|")) for g in options.get("merged", "").split(";") if g]
        self._group = {name: group for group in self.merged for name in group}
        self._arrivals: InputArrivals | None = None
        #: The logged cuts a planned batch replays, by the sequence of its last cut (the
        #: planner process asks for a batch's partitions right after planning it).
        self._planned: dict[int, list[Cut]] = {}
        #: One input, read whole: the next batch's end and rows come from one request.
        self._reads_ahead = len(self.inputs) == 1 and self.partition is None and not self.merged
        #: The last planned batch's rows read ahead: (start, end, rows) of its one input.
        self._ahead: tuple[int, int, list[tuple[int, int, float, str, str]]] | None = None
        #: The next batch, being read since this one was planned.
        self._prefetch: _ReadingAhead | None = None
        #: A partition's: the parts of key states addressed to it, read as they are stored.
        self._parts_ahead: PartsAhead | None = None
        #: The last look found nothing: ask the tail first (one request per idle look, not
        #: a read-ahead and then the tail), and read ahead again once input flows.
        self._idle = False
        #: How long this reader's last small reads took (:data:`SLOW_LINK_S`).
        self._link_reads: deque[float] = deque(maxlen=LINK_READS)
        self.slow_link_s = float(options.get("slow_link_ms", SLOW_LINK_S * 1000)) / 1000
        #: Whether the first batch's start was checked against the inputs' trimmed records.
        self._history_checked = False
        #: Whether the last :meth:`_available` brought merged partitions back to a moment.
        self._at_moment = False

    def initialOffset(self) -> dict:  # noqa: N802
        return offset(dict(self.since))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.max_events)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        """The end of the next batch (``start``: none to run).

        With ``idle_wait_ms``, an answer of "nothing" waits up to that long for an input to
        receive a message (a plain subscription on the inputs' data subjects wakes it) and
        looks again — so a query triggered continuously (trigger 0) starts its batch as soon
        as input arrives, without asking the broker every few milliseconds while idle.
        """
        if not self._history_checked:
            self._check_history(start)
        latest = self._latest(start, limit)
        if latest != start or self.idle_wait_s <= 0:
            return latest
        if self._arrivals is None:
            self._arrivals = InputArrivals(
                shared_client(self.broker),
                [data_subject(self.pipeline, name) for name in self.inputs],
            )
        deadline = time.monotonic() + self.idle_wait_s
        while self._arrivals.wait(deadline - time.monotonic()):
            # The subscription can hear of a message before the stream has stored it:
            # look again for a moment (the gate too, it may have changed meanwhile).
            for pause in (0.0, 0.002, 0.005, 0.01, 0.02):
                time.sleep(pause)
                latest = self._latest(start, limit)
                if latest != start:
                    return latest
        return latest

    def _check_history(self, start: dict) -> None:
        """Refuse to start reading an input below the records trimmed from it
        (:mod:`fogshift.broker.history`): those between would be skipped unread. A reader
        resumes from a checkpoint the trimming left records for; one that starts lower
        (its node's checkpoint lost, every central one torn) must be restored from a newer
        one, loudly, not read on past a hole.

        Raises:
            InvariantViolation: An input was trimmed past where this reader starts.
        """
        begin = positions_of(start)
        client = shared_client(self.broker)
        for name in self.inputs:
            at = int(begin.get(name, self.since[name]))
            try:
                below = client.run(
                    partial(trimmed_below, stream=stream_name(self.pipeline, name)), timeout=30
                )
            except NotFoundError:
                continue  # (not made yet: nothing trimmed)
            if at + 1 < below:
                raise InvariantViolation(
                    f"PE {self.pe!r} of pipeline {self.pipeline!r} would read input {name!r} "
                    f"from sequence {at + 1}, but its records below {below} were trimmed "
                    "(recovery.history_s)",
                    expected=f"a start at sequence {below - 1} or later",
                    received=f"sequence {at}",
                    hint="restore the PE from its newest central checkpoint (`fogshift "
                    "restore PIPELINE ELEMENT`), which starts later; keep records longer "
                    "with a larger recovery.history_s",
                )
        self._history_checked = True

    def _latest(self, start: dict, limit: ReadLimit) -> dict:
        end = self._latest_cut(start, limit)
        if self.partition is None or len(self.inputs) == 1 or end == start:
            return end
        return offset(positions_of(end), cut_of(end), self._shift_after(start, end))

    def _shift_after(self, start: dict, end: dict) -> int:
        """The origins' shift of this partition (several inputs) once the batch from
        ``start`` to ``end`` has run: the executor's (:meth:`_partition_rows`), from the
        key states in the first input, which the planner reads too (a few messages)."""
        assert self.partition is not None
        of, index, _ = self.partition
        home = self.inputs[0]
        shift = shift_of(start)
        begin, finish = positions_of(start), positions_of(end)
        if cut_of(end) == 0:
            spans = [[Range(n, begin.get(n, 0), finish.get(n, 0)) for n in self.inputs]]
        else:
            spans = [
                [Range(n, cut.start.get(n, 0), cut.end.get(n, 0)) for n in self.inputs]
                for cut in self._cuts_between(start, end, keep=True)
            ]
        first = min(span_range(s, home).start for s in spans)
        client = shared_client(self.broker)
        unions = self._unions(
            client, {n: max(span_range(s, n).end for s in spans) for n in self.inputs}
        )
        ownership, earlier = self._owners_before(client, home, first, unions)
        places = {move.move: {home: move.seq} for move in earlier}
        found = client.run(
            partial(get_ranges, stream=stream_name(self.pipeline, home),
                    subjects=key_subjects(self.pipeline, home), start=first,
                    end=max(span_range(s, home).end for s in spans)),
            timeout=120,
        )  # fmt: skip
        for span in spans:
            rng, later = span[0], sum(r.start for r in span[1:])
            for msg in found:
                if not rng.start < msg.seq <= rng.end:
                    continue
                item = read_message(self.pipeline, home, msg.subject, msg.seq, msg.data)
                if item is None or item.element != of:
                    continue
                if isinstance(item, KeyMove):
                    _place_move(widened(item, unions), home, ownership, places)
                elif isinstance(item, KeyCopy):
                    ownership.request(item)
                elif self._installs(item, index, ownership):
                    shift = _shifted(shift, msg.seq + later, item)
        return shift

    @staticmethod
    def _installs(item: KeyState, index: int, ownership: Ownership) -> bool:
        """Whether partition ``index`` takes ``item`` as a moved key's state (a row)."""
        return item.to == index and not item.copy and ownership.sent_by_owner(item)

    def _latest_cut(self, start: dict, limit: ReadLimit) -> dict:
        begin = positions_of(start)
        gate = read_gate(self.gate)
        if gate is not None and gate["mode"] == "hold":
            return start
        cap = positions_of(gate["limit"]) if gate is not None and gate["limit"] else None
        client = shared_client(self.broker)
        if self.partition is not None and self._parts_ahead is None and len(self.inputs) == 1:
            # (With several inputs a batch's key states are read with its rows.)
            name = self.inputs[0]
            with contextlib.suppress(BrokerUnavailable):  # the batch reads them, or says why
                self._parts_ahead = PartsAhead(
                    client, stream_name(self.pipeline, name),
                    state_subject(self.pipeline, name, self.partition[1], self.partition[0]),
                    begin.get(name, 0),
                )  # fmt: skip
        if len(self.inputs) > 1:
            # Several inputs: the order in which their events meet the PE is fixed by where
            # batches are cut. A cut logged by any earlier execution is replayed as it was,
            # so a re-execution (restart, restore, migration) sees the same order.
            logged = client.run(
                partial(next_cut, pipeline=self.pipeline, pe=self.pe, after=cut_of(start))
            )
            if logged is not None:
                return self._replay(client, start, begin, logged, cap, limit)
        if self._reads_ahead and not self._idle:
            ahead = self._read_ahead(client, start, begin, limit, cap)
            if ahead is not None:
                return ahead
            self._idle = True
        latest = self._available(client, begin, limit, cap)
        if latest is None:
            return start  # (no snapshot of merged inputs' tails now: the next look tries)
        if len(self.inputs) > 1:
            latest = self._clamped(client, begin, latest)
            if self._at_moment and all(latest[n] == begin.get(n, 0) for n in self._group):
                # The merged partitions brought back to a moment (_merged_within) before a
                # listed move's place in one of them, the clamp holding another at its
                # place: the next look would find the same moment, for good. The whole
                # snapshot then, as before there was a bound (it holds every place stored).
                whole = self._available(client, begin, limit, cap, bounded=False)
                if whole is None:
                    return start
                latest = self._clamped(client, begin, whole)
        if latest == begin:
            return start
        self._idle = False
        if len(self.inputs) == 1:
            return offset(latest)
        try:
            seq = client.run(
                partial(
                    append_cut,
                    pipeline=self.pipeline,
                    pe=self.pe,
                    epoch=self.epoch,
                    start=begin,
                    end=latest,
                    after=cut_of(start),
                )
            )
        except Fenced:
            raise
        except WriterConflict:
            # Someone else logged the next cut first (a racing instance under the same epoch
            # is refused elsewhere): follow the log, never a history of our own.
            logged = client.run(
                partial(next_cut, pipeline=self.pipeline, pe=self.pe, after=cut_of(start))
            )
            if logged is None:
                raise
            return self._replay(client, start, begin, logged, cap, limit)
        self._planned = {seq: [Cut(seq, begin, latest, self.epoch)]}
        return offset(latest, cut=seq)

    def _read_ahead(
        self,
        client: SyncJetStream,
        start: dict,
        begin: dict[str, int],
        limit: ReadLimit,
        cap: dict[str, int] | None,
    ) -> dict | None:
        """The next batch's end, with its rows read in the same request (one input).

        One round trip instead of two (the stream's last sequence here, then the range in
        the executor): every message after the position, of every subject, up to the read
        limit and the cap. The end is the last of them, which is the stream's last sequence
        when they were all it held, as :meth:`_available` would have found. The rows wait
        for :meth:`partitions`; a batch planned before a restart is read in the executor.

        While the input is busy (a batch of :data:`BUSY_BATCH` messages or a full one), the
        next batch's messages are read and decoded in the background while Spark processes
        this one (:class:`_ReadingAhead`); the next call takes them
        (:meth:`_take_prefetched`) and reads what was stored after them if they are fewer
        than a batch, so a batch never misses what the broker held when it was planned.
        Reading then no longer waits in line with processing: catching up, a 10,000-event
        batch was planned in ~10 ms instead of ~225 ms.

        Returns:
            The end offset; ``None`` if nothing is stored after the position (then
            :meth:`_available` asks the stream, which also checks it did not go backwards).
        """
        name = self.inputs[0]
        position = begin.get(name, 0)
        stop = position + limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if cap is not None:
            capped = cap.get(name, position)
            stop = capped if stop is None else min(stop, capped)
        if stop is not None and stop <= position:
            return start
        count = stop - position if stop is not None else READ_AHEAD_COUNT
        read = partial(
            self._timed_read,
            stream=stream_name(self.pipeline, name),
            subject=data_subject(self.pipeline, name),
        )
        slow = self._slow_link()
        prefetched = self._take_prefetched(position, settled=not slow)
        ahead = (prefetched or _Rows()).until(stop)
        if prefetched is None or (len(ahead.seqs) < count and not (slow and ahead.seqs)):
            after = ahead.seqs[-1] if ahead.seqs else position
            more = client.run(partial(read, after=after, count=count - len(ahead.seqs)))
            ahead = ahead.extended(more.until(stop))
        if not ahead.seqs:
            return None
        end = ahead.seqs[-1]
        self._ahead = (position, end, ahead.rows)
        busy = len(ahead.seqs) >= min(count, BUSY_BATCH)
        if (busy or self._slow_link()) and (cap is None or end < cap.get(name, end)):
            # The input is busy: read the next batch while Spark runs this one (if the
            # client is gone, the next batch reads for itself and says why).
            with contextlib.suppress(BrokerUnavailable):
                self._prefetch = _ReadingAhead(client, read, end, count)
        return offset({name: end})

    def _take_prefetched(self, position: int, settled: bool = True) -> _Rows | None:
        """What was read in the background after ``position``; ``None`` if nothing was
        read from there, or the read failed (then the caller reads, and sees the error).

        The stream's messages never change once stored, so messages read then are the ones
        the batch would read now; what they cannot have is what was stored after them,
        which :meth:`_read_ahead` reads now when they are fewer than a batch — except
        over a slow link (``settled`` False, :meth:`_ReadingAhead.take`).
        """
        pending, self._prefetch = self._prefetch, None
        if pending is None:
            return None
        if pending.after != position:
            pending.cancel()
            return None
        return pending.take(settled)

    async def _timed_read(
        self, js: Any, stream: str, subject: str, after: int, count: int
    ) -> _Rows:
        """:func:`_read_rows`, timed when it brings few messages (a round trip, not a
        transfer): in the planner or in the background, both on the client's loop."""
        asked = time.monotonic()
        got = await _read_rows(js, stream, subject, after, count)
        if len(got.seqs) < BUSY_BATCH:
            self._link_reads.append(time.monotonic() - asked)
        return got

    def _slow_link(self) -> bool:
        """Whether this reader sits behind a slow link to the broker: its quickest recent
        small read took :data:`SLOW_LINK_S` or more (one slow read on a busy machine does
        not make a link slow).

        Over such a link a batch used to wait two round trips besides its work: one to read
        its input, one to append its output. Reading after every batch in the background,
        and planning the next from what was read by then, leaves one: over a 1 s round trip
        the origin's batches came every ~2.3 s. A batch then holds what the broker had
        about a round trip before it was planned (it never waits for the read under way),
        which is as fresh, measured from when the batch starts, as reading at planning.
        """
        reads = tuple(self._link_reads)  # (appended to on the client's loop)
        return len(reads) == LINK_READS and min(reads) >= self.slow_link_s

    def stop(self) -> None:
        """Cancel the reads ahead still running (Spark calls this when the query stops)."""
        pending, self._prefetch = self._prefetch, None
        if pending is not None:
            pending.cancel()
        parts, self._parts_ahead = self._parts_ahead, None
        if parts is not None:
            parts.stop()
        arrivals, self._arrivals = self._arrivals, None
        if arrivals is not None:
            arrivals.close()

    def _clamped(
        self, client: SyncJetStream, begin: dict[str, int], latest: dict[str, int]
    ) -> dict[str, int]:
        """``latest`` (each input's end for the next batch of a partition with several
        inputs) cut short before the places of every listed move (a rescale or a key group,
        :attr:`~fogshift.broker.keys.KeyMove.listed`) not yet stored in all inputs within
        it: no batch, and so no logged cut, ends between the places of such a move.

        Why: a listed move's keys are the union of its records' lists
        (:func:`~fogshift.broker.keys.listed_unions`), and each record lists what had
        been seen when it was appended to its input (and no earlier record lists), one
        input after another. A key first
        seen in a later input between two appends holds state at its old owner, which
        hands it over only if the key is listed; its new owner must hold the key's events
        from the move's first place on. Both learn the whole list only from the last
        record: so each batch passes either none of a move's places or all of them, and
        reads every record of the move in it. A move stored in some inputs only (an
        orchestrator that died between the appends) holds those inputs at their places
        until it completes the move (``complete_key_moves``); the others read on.
        """
        if self.partition is None:
            return latest
        of = self.partition[0]
        places: dict[str, dict[str, int]] = {}
        for name in self.inputs:
            for move in _moves_until(
                client, self.pipeline, name, of, latest[name], self.epoch, self.pe
            ):  # fmt: skip
                if isinstance(move, KeyMove) and move.listed:
                    # (A move stored twice in an input counts at its first place.)
                    places.setdefault(move.move, {}).setdefault(name, move.seq)
        clamped = dict(latest)
        for at in places.values():
            if len(at) == len(self.inputs):
                continue  # stored in all within the batch: it passes them all
            for name, seq in at.items():
                if seq > begin.get(name, 0):
                    clamped[name] = min(clamped[name], seq - 1)
        return clamped

    def _unions(self, client: SyncJetStream, ends: dict[str, int]) -> dict[str, tuple[str, ...]]:
        """The keys of the listed moves stored in this partition's inputs up to ``ends``
        (several inputs; ``{}`` for one): the union of each move's records
        (:func:`~fogshift.broker.keys.listed_unions`). A batch that passes a listed move
        passes all its records (:meth:`_clamped`), so its union is whole there."""
        if self.partition is None or len(self.inputs) < 2:
            return {}
        of = self.partition[0]
        return listed_unions(
            move
            for name in self.inputs
            for move in _moves_until(
                client, self.pipeline, name, of, ends.get(name, 0), self.epoch, self.pe
            )
        )

    def _replay(
        self,
        client: SyncJetStream,
        start: dict,
        begin: dict[str, int],
        first: Cut,
        cap: dict[str, int] | None,
        limit: ReadLimit,
    ) -> dict:
        """The offset after the logged cuts the next batch replays, or ``start`` while a cap
        keeps the query short of the first.

        Consecutive logged cuts are replayed in one batch (up to :data:`MAX_CUTS_PER_BATCH`,
        the read limit and the cap): an instance catching up on a log (a restart, a restore,
        a migration target) would otherwise run one batch per cut, as many as the instance
        it follows, and never catch up with a running one. The rows are the same, in the
        same order (see :class:`JetStreamPartition`).
        """
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        cuts: list[Cut] = []
        cut: Cut | None = first
        expected, events = begin, 0
        while cut is not None and len(cuts) < MAX_CUTS_PER_BATCH:
            if self._full(cut.start) != self._full(expected):
                raise InvariantViolation(
                    f"cut log of {self.pipeline}/{self.pe} does not continue where this query "
                    f"stands: the next logged cut starts at {cut.start}, the query at "
                    f"{expected}",
                    hint="two instances of this PE planned batches; restore it to fence the other",
                )
            end, begun = self._full(cut.end), self._full(cut.start)
            if cap is not None and any(end[n] > cap.get(n, 0) for n in self.inputs):
                break  # a capped standby must not run ahead of the instance it follows
            size = sum(end[n] - begun[n] for n in self.inputs)
            if cuts and budget is not None and events + size > budget:
                break
            cuts.append(cut)
            expected, events = cut.end, events + size
            cut = client.run(partial(next_cut, pipeline=self.pipeline, pe=self.pe, after=cut.seq))
        if not cuts:
            return start
        self._planned = {cuts[-1].seq: cuts}
        return offset(cuts[-1].end, cut=cuts[-1].seq)

    def _full(self, positions: dict[str, int]) -> dict[str, int]:
        """``positions`` with every input, at 0 where missing: an input added since
        (``fogshift scale`` adds partitions to their consumers) had not been read."""
        return {n: int(positions.get(n, 0)) for n in self.inputs}

    def _cuts_between(self, start: dict, end: dict, keep: bool = False) -> list[Cut]:
        """The logged cuts from ``start`` to ``end`` (planned here, or read from the log for
        a batch planned by an earlier run of the query), checked to chain; planned ones
        are forgotten unless ``keep``."""
        last = cut_of(end)
        cuts = self._planned.get(last) if keep else self._planned.pop(last, None)
        if cuts is None:
            client = shared_client(self.broker)
            cuts, after = [], cut_of(start)
            while after < last:
                cut = client.run(partial(next_cut, pipeline=self.pipeline, pe=self.pe, after=after))
                if cut is None or cut.seq > last:
                    break
                cuts.append(cut)
                after = cut.seq
        begin, finish = self._full(positions_of(start)), self._full(positions_of(end))
        full = self._full
        chained = bool(cuts) and full(cuts[0].start) == begin and full(cuts[-1].end) == finish
        chained = chained and all(full(a.end) == full(b.start) for a, b in itertools.pairwise(cuts))
        if not chained or cuts[-1].seq != last:
            raise InvariantViolation(
                f"cut log of {self.pipeline}/{self.pe} has no chain of cuts from {begin} "
                f"(after cut {cut_of(start)}) to {finish} (cut {last})",
                hint="only the PE's own instances may publish on its .cut subject",
            )
        return cuts

    def _available(
        self,
        client: SyncJetStream,
        begin: dict[str, int],
        limit: ReadLimit,
        cap: dict[str, int] | None,
        bounded: bool = True,
    ) -> dict[str, int] | None:
        """Every input's end for the next batch: what is stored, within the limit and cap
        (``None``: merged inputs' tails that never stood still, see :meth:`_tails`); merged
        partitions within the limit at one moment if ``bounded`` (:meth:`_merged_within`)."""
        latest: dict[str, int] = {}
        tails = self._tails(client)
        if tails is None:
            return None
        self._at_moment = False
        shares = (
            self._shares(begin, tails, limit.max_rows) if isinstance(limit, ReadMaxRows) else {}
        )
        if bounded and isinstance(limit, ReadMaxRows) and self.merged:
            within = self._merged_within(client, begin, tails, shares[MERGED_SHARE])
            self._at_moment, tails = within != tails, within
        for name in self.inputs:
            stream = stream_name(self.pipeline, name)
            last = tails[name]
            position = begin.get(name, 0)
            if last < position:
                raise InvariantViolation(
                    f"input {name!r} of pipeline {self.pipeline!r} went backwards: stream "
                    f"{stream} ends at {last} but this query already read up to {position}",
                    hint="the stream was deleted or purged under a running query",
                )
            if isinstance(limit, ReadMaxRows) and name not in self._group:
                # (A partition's records are cut short only at a moment: _merged_within.)
                last = min(last, position + shares[name])
            if cap is not None:
                last = max(position, min(last, cap.get(name, position)))
            latest[name] = last
        return latest

    def _shares(self, begin: dict[str, int], tails: dict[str, int], budget: int) -> dict[str, int]:
        """The read limit shared by the inputs (the merged partitions together, under
        :data:`MERGED_SHARE`): each takes what it is behind, up to an even share of what
        the others left, the least behind first; at least one record each. Each input took
        the whole limit before: a PE of N inputs all far behind read N times it in a batch.
        """
        behind = {
            name: max(tails[name] - begin.get(name, 0), 0)
            for name in self.inputs
            if name not in self._group
        }
        if self._group:
            behind[MERGED_SHARE] = sum(max(tails[n] - begin.get(n, 0), 0) for n in self._group)
        shares: dict[str, int] = {}
        left = budget
        for i, name in enumerate(sorted(behind, key=lambda n: (behind[n], n))):
            shares[name] = max(1, min(behind[name], left // (len(behind) - i)))
            left = max(left - shares[name], 0)
        return shares

    def _merged_within(
        self, client: SyncJetStream, begin: dict[str, int], tails: dict[str, int], budget: int
    ) -> dict[str, int]:
        """``tails`` (a snapshot, see :meth:`_tails`) with the merged partitions' ends
        brought back to what each had stored by one moment, when together they are more
        than ``budget`` records behind: a consumer of a scaled element stopped for an hour
        read the hour in one batch (the read limit was never applied to partitions), and
        every replay of its logged cut did again — a worker out of memory at every retry,
        on every node it was restored to.

        The moment is the earliest among each behind partition's record an even share of
        ``budget`` ahead, as the broker stamped them when it stored them: one clock, so a
        moved key's first record on its target, stored after the target read the key's
        state and so after its last record on the origin, is within the moment only if
        that one is too (the snapshot's reason). At least the record that set the moment
        is read: the next batch goes on. (A broker's clock set back meanwhile is the one
        thing this takes on trust, as the broker's own searches by time do.)
        """
        behind = {name: tails[name] - begin.get(name, 0) for name in self._group}
        if min(behind.values()) < 0 or sum(behind.values()) <= budget:
            return tails  # (a stream gone backwards is told by the caller)
        moving = [name for name, count in behind.items() if count > 0]
        share = max(1, budget // len(moving))

        async def stamps(js: Any) -> list[str | None]:
            return list(await asyncio.gather(*(
                stored_stamp(js, stream_name(self.pipeline, name),
                             begin.get(name, 0) + min(share, behind[name]))
                for name in moving
            )))  # fmt: skip

        found = [stamp for stamp in client.run(stamps) if stamp]
        if not found:
            return tails  # (trimmed or deleted meanwhile: told when read)
        moment = min(found, key=stamp_nanos)

        async def ends(js: Any) -> list[int]:
            return list(await asyncio.gather(*(
                last_stored_by(js, stream_name(self.pipeline, name), moment)
                for name in self._group
            )))  # fmt: skip

        bounded = dict(tails)
        for name, end in zip(self._group, client.run(ends), strict=True):
            bounded[name] = max(begin.get(name, 0), min(tails[name], end))
        return bounded

    def _tails(self, client: SyncJetStream) -> dict[str, int] | None:
        """Every input's last sequence. With merged partitions (see :meth:`read`), a
        snapshot: collected again until two collects agree, so the tails were all as read
        at one moment. A key moved between partitions has its last records on the origin
        stored before its state, and its first on the target after the target read that
        state; a cut that holds the latter then holds the former, and the merge puts them in
        order. (Which is also why a partition's range is cut short only at a moment of the
        broker's clock: :meth:`_merged_within`.)
        ``None`` when :data:`SNAPSHOT_TRIES` collects never agreed: no batch is cut from
        them (one that held a moved key's first record on the target but not its last on
        the origin would merge them out of order, and every replay of its logged cut
        would too); the next look tries again (the partitions write in batches, so their
        tails stand still between them).
        """

        async def last_seqs(js: Any) -> list[int]:
            # All at once, one round trip: the closer together the reads, the likelier two
            # collects agree on a busy input (one after another, each read was a round trip
            # apart, over a fog node's link too).
            return list(await asyncio.gather(*(
                last_seq(js, stream_name(self.pipeline, name)) for name in self.inputs
            )))  # fmt: skip

        def collect() -> dict[str, int]:
            return dict(zip(self.inputs, client.run(last_seqs), strict=True))

        tails = collect()
        for _ in range(SNAPSHOT_TRIES if self.merged else 0):
            again = collect()
            if again == tails:
                break
            tails = again
        else:
            if self.merged:
                # Not a snapshot: a key moving now could reach this PE out of order.
                log.warning(
                    "%s/%s: its merged inputs' tails never stood still over %d reads; no "
                    "batch is cut from them, the next look tries again",
                    self.pipeline, self.pe, SNAPSHOT_TRIES,
                )  # fmt: skip
                return None
        return tails

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if not self._history_checked:
            # (A batch planned before a restart is run again without asking latestOffset.)
            self._check_history(start)
        begin, finish = positions_of(start), positions_of(end)
        ranges = [Range(n, begin.get(n, 0), finish.get(n, 0)) for n in self.inputs]
        if all(r.end <= r.start for r in ranges):
            return []
        if len(self.inputs) == 1 or cut_of(end) == 0:
            ahead = self._ahead
            if (
                len(ranges) == 1
                and ahead is not None
                and ahead[:2] == (ranges[0].start, ranges[0].end)
            ):
                return [JetStreamPartition([ranges], rows=ahead[2])]
            if self._parts_ahead is not None:
                return [self._with_parts(ranges[0])]
            return [JetStreamPartition([ranges], shift=shift_of(start), ends=shift_of(end))]
        spans = [
            [Range(n, cut.start.get(n, 0), cut.end.get(n, 0)) for n in self.inputs]
            for cut in self._cuts_between(start, end)
        ]
        return [JetStreamPartition(spans, shift=shift_of(start), ends=shift_of(end))]

    def _with_parts(self, rng: Range) -> JetStreamPartition:
        """A partition's batch with the parts fetched ahead that its key states name: the
        planner reads the batch's ``.keys`` messages (which the executor would read) to
        know which, and waits for those being read (:meth:`PartsAhead.take`)."""
        assert self.partition is not None and self._parts_ahead is not None
        of, index = self.partition[0], self.partition[1]
        client = shared_client(self.broker)
        keys = client.run(
            partial(get_ranges, stream=stream_name(self.pipeline, rng.input),
                    subjects=key_subjects(self.pipeline, rng.input), start=rng.start,
                    end=rng.end),
            timeout=120,
        )  # fmt: skip
        items = [read_message(self.pipeline, rng.input, m.subject, m.seq, m.data) for m in keys]
        if any(isinstance(i, KeyMove | KeyCopy) and i.element == of for i in items):
            self._parts_ahead.wake()  # states may come: their parts are read at once
        owners = self._owners_before(client, rng.input, rng.start)[0]
        named: list[int] = []
        for item in items:  # (a forged state's parts are not waited for)
            if item is None or item.element != of:
                continue
            if isinstance(item, KeyMove):
                owners.apply(item)
            elif isinstance(item, KeyCopy):
                owners.request(item)
            elif item.to == index and item.scoped and owners.sent_by_owner(item):
                named.extend(item.parts)
        return JetStreamPartition([[rng]], keys=keys, parts=self._parts_ahead.take(named))

    def _owners_before(
        self,
        client: SyncJetStream,
        name: str,
        start: int,
        unions: dict[str, tuple[str, ...]] | None = None,
    ) -> tuple[Ownership, list[KeyMove]]:
        """Who owns each key of this partition's element where input ``name`` is at
        ``start``, and who must send the states of the moves and copies stored before it:
        those replayed (copies on the input key states travel on only); and those moves.
        ``unions``: the listed moves' keys in every input (:meth:`_unions`)."""
        assert self.partition is not None
        of, _, count = self.partition
        owners = Ownership(count)
        moves: list[KeyMove] = []
        seen: set[str] = set()
        for earlier in _moves_until(client, self.pipeline, name, of, start, self.epoch, self.pe):
            if isinstance(earlier, KeyMove):
                if earlier.move in seen:
                    continue  # (stored twice in this input: taken once, see _partition_row)
                seen.add(earlier.move)
                earlier = widened(earlier, unions or {})
                owners.apply(earlier)
                moves.append(earlier)
            elif name == self.inputs[0]:
                owners.request(earlier)
        return owners, moves

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, JetStreamPartition)
        if partition.rows is not None:  # read ahead by the planner
            if partition.rows:
                yield _arrow_rows(partition.rows)
            return
        client = shared_client(self.broker)
        spans = partition.spans
        if self.partition is not None:
            owned = self._partition_rows(
                client, spans, partition.keys, partition.parts, partition.shift, partition.ends
            )
            if owned:
                yield _arrow_rows(owned)
            return
        messages = {}
        for name in self.inputs:  # each input's whole range at once, split by span below
            first = min(span_range(span, name).start for span in spans)
            last = max(span_range(span, name).end for span in spans)
            messages[name] = client.run(
                partial(
                    get_range,
                    stream=stream_name(self.pipeline, name),
                    subject=data_subject(self.pipeline, name),
                    start=first,
                    end=last,
                ),
                timeout=120,
            )
        rows: list[tuple[int, int, float, str, str]] = []
        for span in spans:
            # origin = sum of every input's position once this row is consumed; inputs are
            # read one after another, so the ones before are at their end, the ones after at
            # their start.
            done, i = 0, 0
            while i < len(span):
                group = self._group.get(span[i].input, (span[i].input,))
                block = span[i : i + len(group)]
                i += len(group)
                later = sum(r.start for r in span[i:])
                found = [
                    (msg, k) for k, rng in enumerate(block)
                    for msg in messages[rng.input] if rng.start < msg.seq <= rng.end
                ]  # fmt: skip
                if len(block) == 1:
                    rows.extend(
                        (done + msg.seq + later, *event_fields(msg.data)) for msg, _ in found
                    )
                else:
                    # The partitions of one element: their records merged by the input
                    # position each carries (a key's, on whichever partition, in input
                    # order), numbered on from the block's start: strictly between the
                    # origins of the inputs before and after, the same in every execution.
                    found.sort(key=lambda f: (_upstream(f[0]), f[1], f[0].seq))
                    base = done + later + sum(r.start for r in block)
                    rows.extend(
                        (base + rank, *event_fields(msg.data))
                        for rank, (msg, _) in enumerate(found, start=1)
                    )
                done += sum(r.end for r in block)
        if rows:
            # One Arrow batch for the whole range: Spark takes it as is, instead of
            # converting row by row.
            yield _arrow_rows(rows)

    def _partition_rows(
        self,
        client: SyncJetStream,
        spans: Sequence[Sequence[Range]],
        keys_read: list[StoredMessage] | None = None,
        parts_read: dict[int, bytes] | None = None,
        shift: int = 0,
        ends: int | None = None,
    ) -> list[tuple[int, int, float, str, str]]:
        """A partition's rows of ``spans``: the events of the keys it owns at their place, and
        a row per key for each key move and key state that concerns it (see
        :mod:`fogshift.broker.keys`), grouped with the key's events by its ``key_by`` field.

        With several inputs a move is stored in each (the orchestrator appends it to every
        one, the first input first), and a key changes owner in each input at the move's
        place there: the target holds the key's events from the first of those places it
        reaches, the origin sends the key's state once it has passed them all, on the first
        input (where key states and copy requests travel). Rows are numbered as for any PE
        with several inputs (every input's position once the row is consumed, summed),
        plus a *shift*: the partitions' cuts differ, so these sums are no common measure, and
        a consumer merging the partitions' records by them could take a moved key's first
        records on its target for earlier than its last on its origin. So the origin's
        state names the origin it made its last rows at (``after``), and the target's rows
        from the state's on are numbered beyond it (the shift grows to what it takes, and is
        kept in the reader's offsets: ``shift`` is where this batch starts). With one input
        the state comes after the move in the input, so the shift stays 0 and ``origin`` is
        the input's sequence.

        ``keys_read``: the ``.keys`` messages of a one-input batch, if the planner read them;
        ``parts_read``: parts of the key states they name, by sequence, fetched ahead (the
        others are read here)."""
        assert self.partition is not None
        home = self.inputs[0]  # the input key states and copy requests travel on
        first = {n: min(span_range(s, n).start for s in spans) for n in self.inputs}
        last = {n: max(span_range(s, n).end for s in spans) for n in self.inputs}
        owners: dict[str, Ownership] = {}
        #: Each move's place in the inputs that have stored it and that this batch is past.
        places: dict[str, dict[str, int]] = {}
        messages: dict[str, list[StoredMessage]] = {}
        unions = self._unions(client, last)
        for name in self.inputs:
            owners[name], earlier = self._owners_before(client, name, first[name], unions)
            for move in earlier:
                places.setdefault(move.move, {})[name] = move.seq
            stream = stream_name(self.pipeline, name)
            subjects = key_subjects(self.pipeline, name) if name == home else [
                keys_subject(self.pipeline, name)
            ]  # fmt: skip
            if keys_read is None or len(self.inputs) > 1:
                keys_read = client.run(
                    partial(get_ranges, stream=stream, subjects=subjects, start=first[name],
                            end=last[name]),
                    timeout=120,
                )  # fmt: skip
            data = client.run(
                partial(get_range, stream=stream, subject=data_subject(self.pipeline, name),
                        start=first[name], end=last[name]),
                timeout=120,
            )  # fmt: skip
            messages[name] = sorted([*data, *keys_read], key=lambda m: m.seq)
        rows: list[tuple[int, int, float, str, str]] = []
        shifted = [shift]

        def control(origin: int, kind: str, key: str, detail: dict[str, Any]) -> None:
            body = json.dumps({self.key_by: key, CONTROL_FIELD: detail})
            rows.append((origin, 0, 0.0, kind, body))

        for span in spans:
            done = 0  # (see ``read``: the inputs before are at their end, those after at start)
            for i, rng in enumerate(span):
                later = sum(r.start for r in span[i + 1 :])
                for msg in messages[rng.input]:
                    if rng.start < msg.seq <= rng.end:
                        self._partition_row(client, rng.input, msg, done + msg.seq + later,
                                            shifted, owners, places, control, rows,
                                            parts_read, unions)  # fmt: skip
                done += rng.end
        if ends is not None and len(self.inputs) > 1 and shifted[0] != ends:
            # The next batch numbers its rows from the planner's shift: another here would
            # number rows twice, or skip numbers a retry then takes for appended ones.
            raise InvariantViolation(
                f"partition {self.pe!r} of pipeline {self.pipeline!r}: its origins' shift "
                f"after this batch is {shifted[0]}, the planner's {ends}",
                hint="the planner and the executor read the batch's key states alike; did "
                "the input change under them (a stream deleted and made anew)?",
            )
        return rows

    def _partition_row(
        self, client: SyncJetStream, name: str, msg: StoredMessage, own: int,
        shift: list[int], owners: dict[str, Ownership], places: dict[str, dict[str, int]],
        control: Any, rows: list[tuple[int, int, float, str, str]],
        parts_read: dict[int, bytes] | None, unions: dict[str, tuple[str, ...]],
    ) -> None:  # fmt: skip
        """The rows message ``msg`` of input ``name`` makes (see :meth:`_partition_rows`):
        ``own`` is its place (the inputs' positions summed), ``shift`` the shift so far."""
        assert self.partition is not None
        of, index, _ = self.partition
        home = self.inputs[0]
        ownership = owners[name]
        origin = own + shift[0]
        if msg.subject == data_subject(self.pipeline, name):
            fields = event_fields(msg.data)
            if ownership.owner(body_key(fields[3], self.key_by)) == index:
                rows.append((origin, *fields))
            return
        item = read_message(self.pipeline, name, msg.subject, msg.seq, msg.data)
        if item is None or item.element != of:
            return
        if isinstance(item, KeyMove):
            item = widened(item, unions)  # (a listed move: every input's list)
            before = _place_move(item, name, ownership, places)
            if before is None:
                return
            passed = places[item.move]
            # The target holds a key's events from the move's first place it reaches; the
            # origin hands the state over once past every place (its events before each
            # are its own).
            opening, closing = len(passed) == 1, len(passed) == len(self.inputs)
            for rank, key in enumerate(item.keys):
                to = item.target(key)
                detail = {"move": item.move, "to": to, "rank": rank,
                          "order": item.order, "input": home, "element": of,
                          "key_by": self.key_by}  # fmt: skip
                if before.get(key) == index and to != index and closing:
                    detail.update(at=passed.get(home, item.seq), ahead=dict(passed))
                    if len(self.inputs) > 1:
                        detail["after"] = origin  # (its last rows' origin, see above)
                    if item.copy is not None:  # precopied: send what changed since
                        detail["base"] = item.copy
                    control(origin, KEY_MOVE_OUT, key, detail)
                elif to == index and before.get(key) != index and opening:
                    control(origin, KEY_MOVE_IN, key, detail)
            return
        if name != home:
            return  # (copies and states travel on the first input only)
        if isinstance(item, KeyCopy):
            ownership.request(item)
            for rank, key in enumerate(item.keys):
                # Only the key's owner here sends a copy, and never to itself.
                if ownership.owner(key) == index and item.to != index:
                    control(origin, KEY_COPY_OUT, key,
                            {"move": item.move, "to": item.to, "rank": rank,
                             "order": "fifo", "input": home, "element": of,
                             "key_by": self.key_by, "copy": True, "at": item.seq,
                             "ahead": {home: item.seq}})  # fmt: skip
            return
        if not isinstance(item, KeyState) or item.to != index:
            return
        if self._installs(item, index, ownership):
            shift[0] = _shifted(shift[0], own, item)
            origin = own + shift[0]
        if not ownership.sent_by_owner(item):
            # A partition that did not own the key forged it: neither its parts are read
            # nor is it installed (the owner's comes).
            log.warning("partition %r of pipeline %r: a state of key %r for move %s from "
                        "partition %s, which did not own it, is ignored", self.pe,
                        self.pipeline, item.key, item.move, item.origin)  # fmt: skip
            return
        if item.copy and not ownership.newest_copy(item):
            log.info("partition %r of pipeline %r: copy %s of key %r, sent again after a "
                     "newer copy request, is ignored", self.pe, self.pipeline, item.move,
                     item.key)  # fmt: skip
            return
        state = item.state
        if item.parts:  # a large state: its parts are stored before it, apart
            state = self._state_parts(client, name, item, parts_read or {})
        if item.copy:
            control(origin, KEY_COPY_IN, item.key, {"move": item.move, "state": state})
            return
        arrived: dict[str, Any] = {"move": item.move, "state": state}
        if item.base is not None:
            arrived.update(base=item.base, keep=list(item.keep))
        control(origin, KEY_STATE, item.key, arrived)

    def _state_parts(
        self, client: SyncJetStream, name: str, item: KeyState, held: dict[int, bytes]
    ) -> dict[str, str]:
        """The state whose parts ``item`` names, on input ``name``'s stream (``held``: those
        fetched ahead)."""
        stream = stream_name(self.pipeline, name)
        by_seq = {p: held[p] for p in item.parts if p in held}
        wanted = [p for p in item.parts if p not in by_seq]
        if wanted:
            # (On .state.<to>, .state or .keys if an older fogshift stored them: its records
            # say they are not scoped, or not addressed, or give no raw length, their parts
            # being the text itself.)
            apart = (
                state_subject(self.pipeline, name, item.to, item.element) if item.scoped
                else state_subject(self.pipeline, name, item.to) if item.addressed
                else state_subject(self.pipeline, name) if item.raw
                else keys_subject(self.pipeline, name)
            )  # fmt: skip
            found = client.run(
                partial(get_range, stream=stream, subject=apart, start=min(wanted) - 1,
                        end=max(wanted)),
                timeout=120,
            )  # fmt: skip
            by_seq.update((m.seq, m.data) for m in found if m.seq in wanted)
        missing = [p for p in item.parts if p not in by_seq]
        if missing:
            raise InvariantViolation(
                f"partition {self.pe!r} of pipeline {self.pipeline!r}: the state of key "
                f"{item.key!r} (move {item.move}) names parts {missing} that stream {stream} "
                "does not hold",
                hint="a state's parts are stored before it and kept with the stream; were "
                "they deleted by hand or by the stream's limits?",
            )
        return joined_state([by_seq[p] for p in item.parts], item.raw)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, streams keep their history."""


#: How long a key state's append may go unacknowledged before its batch fails.
STATE_ACK_S = 60.0
#: How far past a key move its origin looks for the moving keys' next events
#: (``order: backlog``): keys not seen that far go last.
BACKLOG_LOOKAHEAD = 10_000


def _place_move(
    move: KeyMove, name: str, ownership: Ownership, places: dict[str, dict[str, int]]
) -> dict[str, int] | None:
    """Apply ``move``, stored in input ``name``, to that input's ``ownership`` and note its
    place there in ``places`` (move -> input -> sequence); the owners of its keys before
    it. ``None``: already applied there — a move stored twice in an input (an append that
    timed out and was completed again past the broker's duplicate window) counts at its
    first place (the executor's rows and the planner's shift alike)."""
    if move.seq <= ownership.applied or name in places.get(move.move, {}):
        return None
    places.setdefault(move.move, {})[name] = move.seq
    return ownership.apply(move)


def _shifted(shift: int, own: int, state: KeyState) -> int:
    """A partition's origins' shift once it takes ``state`` at its place ``own`` (see
    :meth:`JetStreamReader._partition_rows`): its rows from there on are numbered beyond
    the origin's last for the key (:attr:`~fogshift.broker.keys.KeyState.after`)."""
    if state.after is None:
        return shift
    return max(shift, state.after + 1 - own)


async def _send_states(js: Any, pipeline: str, origin: int, records: list[Record]) -> None:
    """Append the states of moving keys (rows the processor of partition ``origin`` made at
    their move, see :mod:`fogshift.broker.keys`) to the origin's ``.keys.<origin>`` subject
    of the input they move on, in the order their move asks; a large state's parts first,
    on the input's subject addressed to its target (``.state.<element>.<to>``). Sent again
    (a retried batch), a state is the same state: the broker drops the copy within its duplicate
    window, the target ignores it after. (A precopy's copy sent again after its move only
    replaces the copy the target keeps aside, which nothing reads then: one stale copy per
    key at most, until its next copy or move.)

    Pipelined: every part is written, then their acks awaited (one round trip for all, to
    learn their sequences, not one per state: behind a 200 ms link, 64 states of 8 KiB
    would add 13 s to the batch), then every record, then their acks. The broker stores a
    connection's messages in the order written, so each record follows its parts and the
    records keep their order."""
    moves: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        state = json.loads(record.body)
        # The move's sequence in the input it travels on (a row an older reader made: its
        # origin, which was that sequence).
        state.setdefault("at", record.origin)
        moves.setdefault((state["input"], state["move"]), []).append(state)
    # Copies first, each in input order: a key's copy is stored before its move's state,
    # which may complete it (a batch that reads both, e.g. catching up, makes both).
    ordered = sorted(moves.items(), key=lambda m: (not m[1][0].get("copy"), m[1][0]["at"]))
    # (input, move, state, its parts' bodies, its message id)
    sending: list[tuple[str, str, dict[str, Any], list[bytes], str]] = []
    for (source, move), states in ordered:
        states.sort(key=lambda s: s["rank"])
        if states[0]["order"] == "backlog":
            # PAM: the key whose next event is nearest goes first (how far past the move's
            # place in an input; with several inputs, the nearest of them).
            first: dict[str, int] = {}
            wanted = {s["key"] for s in states}
            for name, start in (states[0].get("ahead") or {source: states[0]["at"]}).items():
                ahead = await get_range(
                    js, stream_name(pipeline, name), data_subject(pipeline, name), start,
                    start + BACKLOG_LOOKAHEAD,
                )  # fmt: skip
                for message in ahead:
                    key = body_key(event_fields(message.data)[3], states[0]["key_by"])
                    if key is not None and key in wanted:
                        first[key] = min(first.get(key, 1 << 62), message.seq - start)
            states.sort(key=lambda s: (first.get(s["key"], 1 << 62), s["rank"]))
        for state in states:
            bodies, state["raw"] = state_parts(state["state"]) or ([], 0)
            sending.append((source, move, state, bodies,
                            f"{state['element']}:{move}:{_id_of(state['key'])}"))  # fmt: skip
    written: list[list[_Sent]] = []
    for source, _, state, bodies, msg_id in sending:  # (each state's parts to its own target)
        written.append([
            await _Sent.publish(
                js, state_subject(pipeline, source, state["to"], state["element"]), body,
                stream_name(pipeline, source), f"{msg_id}:{index}",
            )
            for index, body in enumerate(bodies)
        ])  # fmt: skip
    acks: list[tuple[_Sent, str, str, bytes]] = []
    for (source, move, state, bodies, msg_id), futures in zip(sending, written, strict=True):
        # (An error, or no answer, fails the batch; Spark runs it again.)
        stream = stream_name(pipeline, source)
        apart = state_subject(pipeline, source, state["to"], state["element"])
        got = [await w.ack(js) for w in futures]
        # (Checked at once: a retried batch finds every part a repeat.)
        parts = list(await asyncio.gather(*(
            _stored(js, stream, apart, ack, body) for ack, body in zip(got, bodies, strict=True)
        )))  # fmt: skip
        payload = state_payload(
            move,
            state["element"],
            state["key"],
            state["to"],
            None if parts else state["state"],
            parts or None,
            copy=bool(state.get("copy")),
            base=state.get("base"),
            keep=state.get("keep"),
            size=sum(map(len, bodies)),
            raw=state["raw"],
            after=state.get("after"),
        )
        subject = key_state_subject(pipeline, source, partition_id(state["element"], origin))
        sent = await _Sent.publish(js, subject, payload, stream, msg_id)
        acks.append((sent, stream, subject, payload))
    done = [(await sent.ack(js), *rest) for sent, *rest in acks]
    await asyncio.gather(*(_stored(js, stream, subject, ack, payload)
                           for ack, stream, subject, payload in done))  # fmt: skip


@dataclass
class _Sent:
    """A key state (or part) published without waiting for its ack (they go together)."""

    subject: str
    body: bytes
    stream: str
    msg_id: str
    future: asyncio.Future[Any]

    @classmethod
    async def publish(cls, js: Any, subject: str, body: bytes, stream: str, msg_id: str) -> _Sent:
        headers = {"Nats-Msg-Id": msg_id}
        future = await js.publish_async(subject, body, stream=stream, headers=headers)
        return cls(subject, body, stream, msg_id, future)

    async def ack(self, js: Any) -> Any:
        """Its ack. One nobody answered (a broker reloading its accounts, as a rescale's
        placement change makes it: see ``broker.client``) is sent again, acked this time
        (a request, which waits for a responder a moment), under the same message id (a
        repeat the broker drops)."""
        try:
            return await asyncio.wait_for(self.future, STATE_ACK_S)
        except NoStreamResponseError:
            headers = {"Nats-Msg-Id": self.msg_id}
            return await js.publish(self.subject, self.body, timeout=STATE_ACK_S,
                                    stream=self.stream, headers=headers)  # fmt: skip


def _id_of(key: str) -> str:
    """A key as its state's message id names it: as is when short, else its digest (a key
    of an event near the broker's size limit, in the id's header beside the record that
    holds it again, made a message the broker refused: the batch failed at every retry)."""
    if len(key) <= 64:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


async def _stored(js: Any, stream: str, subject: str, ack: Any, body: bytes) -> int:
    """The sequence ``body``, published on ``subject`` of ``stream`` with a message id, is
    stored at: ``ack``'s; or, when the broker took it for a repeat and what it holds under
    that id is not ``body`` on ``subject``, where it is stored once appended again without
    an id. A state's ids are known to every partition reading the stream, which may publish
    there too: one taken first by another partition must not make the broker drop the
    origin's state (its target would wait for the key forever). A real repeat (a retried
    batch) is the same bytes on the same subject."""
    if not getattr(ack, "duplicate", False):
        return int(ack.seq)
    found = await get_range(js, stream, subject, int(ack.seq) - 1, int(ack.seq))
    if found and found[0].seq == int(ack.seq) and found[0].data == body:
        return int(ack.seq)
    log.warning("%s: message id of a key state taken by another message (sequence %s): "
                "appended again without one", subject, ack.seq)  # fmt: skip
    return int((await js.publish(subject, body, stream=stream)).seq)


#: The key moves and copy requests read so far in this worker, by (stream, partitioned
#: element, the reading partition, its epoch): the sequence read up to, and the records (a
#: partition's reads replay them at every batch). The partition and its epoch, because
#: Spark's Python workers outlive queries: a pipeline deployed again has new streams under
#: the same names, whose sequences start over (the old ones' moves would be applied, the
#: new unread), and a new epoch for each PE. Epochs are counted per PE, only ever growing:
#: another partition of the element may read under an epoch number this one had before.
_MOVES: dict[tuple[str, str, str, int], tuple[int, list[KeyMove | KeyCopy]]] = {}
MOVES_CACHED = 256
_MOVES_LOCK = threading.Lock()


def _moves_until(
    client: SyncJetStream,
    pipeline: str,
    source: str,
    element: str,
    end: int,
    epoch: int,
    reader: str,
) -> list[KeyMove | KeyCopy]:
    """The key moves and copy requests of ``element`` stored in the stream of ``source`` at
    sequences up to ``end``, in order, as read by partition PE ``reader`` under ``epoch``."""
    stream = stream_name(pipeline, source)
    cached = (stream, element, reader, epoch)
    with _MOVES_LOCK:
        read, moves = _MOVES.get(cached, (0, []))
        if read < end:
            subject = keys_subject(pipeline, source)
            found = client.run(
                partial(get_range, stream=stream, subject=subject, start=read, end=end),
                timeout=120,
            )
            parsed = (parse(m.seq, m.data) for m in found)
            moves = moves + [
                m for m in parsed if isinstance(m, KeyMove | KeyCopy) and m.element == element
            ]
            read = end
            if len(_MOVES) >= MOVES_CACHED:
                _MOVES.clear()  # (entries of epochs gone by: read again when needed)
            _MOVES[cached] = (read, moves)
    return [m for m in moves if m.seq <= end]


@dataclass
class PublishedCount(WriterCommitMessage):
    """How many records one write task appended, and the notes of its keys' stored state
    (``checkpoint.key_index``: ``{key: {variable: length or None}}``, in batch order)."""

    appended: int
    noted: dict[str, dict[str, int | None]] | None = None


class JetStreamWriter(DataSourceStreamArrowWriter):
    """Appends records to the element's own stream. Expects a single partition per batch.

    Takes the batch as Arrow record batches (no per-row conversion into Spark rows).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.broker = BrokerAddress.load(options["broker"])
        self.pipeline = options["pipeline"]
        self.pe = options["pe"]
        self.epoch = int(options.get("epoch", "0"))
        # A partition whose keys can move ("element:index:count"): its index names the
        # subject it hands key states over on (the only one its node may publish them on).
        part = options.get("partition", "")
        self.origin = int(part.rsplit(":", 2)[1]) if part else None
        # A keyed PE's key index (checkpoint.key_index): where each batch's notes go.
        index = options.get("key_index", "")
        self.key_index = Path(index) if index else None
        self.max_record_bytes = int(options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        records: list[Record] = []
        for batch in iterator:
            columns = batch.to_pydict()
            records.extend(
                Record(int(o), int(i), int(q), float(t), str(c), str(b), d)
                if d is None
                else self._dead_letter(int(o), int(i), int(q), float(t), str(c), str(b), d)
                for o, i, q, t, c, b, d in zip(
                    columns["origin"], columns["idx"], columns["seq"], columns["timestamp"],
                    columns["creator"], columns["body"], columns["dead"], strict=True,
                )
            )  # fmt: skip
        # A keyed PE's notes of its keys' stored state: kept for the commit, never appended.
        noted: dict[str, dict[str, int | None]] = {}
        for record in records:
            if record.creator == KEY_INDEX and self.key_index is not None:
                note = json.loads(record.body)
                noted.setdefault(str(note["key"]), {}).update(note["vars"])
        records = [r for r in records if r.creator != KEY_INDEX]
        client = shared_client(self.broker)
        states = [r for r in records if r.creator == KEY_STATE]
        records = [r for r in records if r.creator != KEY_STATE]
        appended = 0
        if records:
            appended = client.run(
                lambda js: publish_records(js, self.pipeline, self.pe, records, self.epoch),
                timeout=300,
            )
        if states:
            if self.origin is None:
                raise InvariantViolation(
                    f"PE {self.pe!r} of pipeline {self.pipeline!r} made key states but is "
                    "not a partition whose keys move",
                    hint="only a movable partition's processor hands key states over",
                )
            origin = self.origin
            if not appended:
                # No record appended: nothing checked this instance's epoch (a fenced
                # partition handed states over, which the targets took) — also when the
                # records were all stored already (a batch re-run under the remembered
                # tail, which skips them without reading the stream and its fence).
                client.run(
                    lambda js: check_epoch(js, self.pipeline, self.pe, self.epoch), timeout=60
                )
            # After the batch's records: a moved key's last records here are stored before
            # the target can have its state, so before any record of the target's for it.
            client.run(lambda js: _send_states(js, self.pipeline, origin, states), timeout=300)
        return PublishedCount(appended, noted)

    def _dead_letter(
        self, origin: int, idx: int, seq: int, at: float, creator: str, body: str, reason: str
    ) -> Record:
        """A dead letter's record, cut to the record size limit (a no-op for the Python
        processors' own, cut already; a JVM operator's carry their input whole)."""
        body, reason = fit_dead_letter(seq, at, creator, body, reason, self.max_record_bytes)
        return Record(origin, idx, seq, at, creator, body, reason)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """The records are already durable in JetStream when ``write`` returns. A keyed
        PE's notes of its keys' stored state are stored now, before Spark commits the
        batch (``checkpoint.key_index``), also when the batch wrote none."""
        if self.key_index is None:
            return
        noted: dict[str, dict[str, int | None]] = {}
        for message in messages:
            for key, variables in (getattr(message, "noted", None) or {}).items():
                noted.setdefault(key, {}).update(variables)
        key_index.write_batch(self.key_index, int(batchId), noted)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to undo: a retried batch skips what was appended (see publish)."""


__all__ = ["EVENT_SCHEMA", "RECORD_SCHEMA", "BrokerError", "JetStreamDataSource"]
