"""Idempotent, single-writer appends to a PE's output stream.

Exactly-once across re-executed batches does not rest on the broker's duplicate window
(which is finite): every record carries its input position ``(origin, index)``, a PE's
records are appended in that order, and before appending, the writer reads the position of
the last stored record and skips everything up to it. Each append also states the stream
sequence it expects to follow (``Nats-Expected-Last-Sequence``), so a second writer racing
on the same stream makes the append fail instead of interleaving.

A batch's records go as JetStream *atomic batches* (ADR-50, nats-server 2.12+, streams with
``allow_atomic``) of up to :data:`ATOMIC_BATCH_MAX` messages: the first message carries the
expected last sequence, the server checks it when the commit arrives, under the stream's
lock, and stores all of the batch's messages or none. So a chunk is one round trip instead of
one per record, and nothing — a fence marker, another writer, a foreign message — can land
between two of its records: exactly the guarantee of the one-by-one chain, which an ordinary
pipelined publish would lose (a record after a refused one would find the marker that caused
the refusal as "its" expected last message). A stream created without ``allow_atomic`` is
written one record at a time, as before.

Round trips. A batch's append costs one round trip to the broker, not four: the chunk's
messages go as plain publishes and only the commit waits for an answer (the broker reports
a wrong last sequence, or a stream without atomic batches, at the commit and stores nothing),
and the tail is not read again before each batch: a writer remembers the tail its last
append left (:class:`_KnownTails`, per connection) and states it as the expected last
sequence. If anything was appended since — a fence marker, a handover's other instance, a
foreign message — that append stores nothing and fails, and the writer reads the tail and
goes on exactly as it would have without the memory. Over a fog link of 1 s RTT that is
three seconds less per batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from fogshift.broker.client import connection_of
from fogshift.broker.exceptions import FENCED_TOKEN, BrokerError, Fenced, WriterConflict
from fogshift.broker.naming import (
    cut_subject,
    data_subject,
    dead_subject,
    fence_subject,
    stream_name,
)
from fogshift.events import (
    EPOCH_HEADER,
    INDEX_HEADER,
    MSG_ID_HEADER,
    ORIGIN_HEADER,
    message_id,
    record_payload,
)
from fogshift.exceptions import InvariantViolation

log = logging.getLogger(__name__)

#: The streams whose atomic batches were found all taken, by this process (said once each).
_busy_streams: set[str] = set()

#: The headers of an atomic batch (ADR-50).
BATCH_ID_HEADER = "Nats-Batch-Id"
BATCH_SEQUENCE_HEADER = "Nats-Batch-Sequence"
BATCH_COMMIT_HEADER = "Nats-Batch-Commit"
#: JetStream's error code for a failed Nats-Expected-Last-Sequence check.
WRONG_LAST_SEQUENCE = 10071
#: How long :func:`fence` tries to land its marker on a stream that keeps moving (within
#: its callers' broker timeout, 30 s: past it they would report a broker that did not
#: answer, the fence still trying), and its first pause between tries (doubled at each,
#: jittered, at most 0.2 s).
FENCE_WAIT_S = 20.0
FENCE_PAUSE_S = 0.001
#: JetStream's error code for an atomic batch holding a message id the stream already has:
#: a record at one of the batch's positions was stored since the tail the batch follows (the
#: broker checks this before the expected last sequence).
DUPLICATE_IN_BATCH = 10201
#: JetStream's error code for an atomic batch sent to a stream without ``allow_atomic``.
ATOMIC_DISABLED = 10174
#: "atomic publish too many inflight": the stream has as many atomic batches open as it
#: takes (50), none of them ours. Another writer allowed on the stream holds them (a
#: partition's key states share its input's stream): nothing of the batch was stored.
ATOMIC_TOO_MANY_INFLIGHT = 10210
#: "atomic publish batch is incomplete": a message of the batch never reached the stream
#: (a node's imports rebuilt by a broker reload while it sent them, see
#: ``broker.permissions``); nothing of the batch was stored.
BATCH_INCOMPLETE = 10176
#: How many times a chunk a broker reload cut short is sent again.
INCOMPLETE_RETRIES = 5
#: Only a chunk refused as incomplete this soon is sent again: the broker also refuses a
#: batch whose next message did not come within its batch timeout (10 s), which a slow
#: link would make again.
INCOMPLETE_QUICK_S = 2.0
#: The most messages nats-server accepts in one atomic batch.
ATOMIC_BATCH_MAX = 1000
#: The most payload bytes sent in one atomic batch: the server holds a batch in memory
#: until its commit, and a fog node's broker is small.
ATOMIC_BATCH_BYTES = 4 * 1024 * 1024
#: How long to wait for the broker's answer to one message or commit of a batch.
ATOMIC_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Record:
    """One output record of a PE: an event or a dead letter.

    Attributes:
        origin: The input position the record derives from (strictly increasing per input).
        index: The record's number among those derived from the same origin.
        seq: The event's ``seq``.
        timestamp: The event's timestamp (epoch ms).
        creator: The PE that created the event.
        body: The body as JSON text (for a dead letter: the input as received).
        dead: ``None`` for an event; for a dead letter, the reason.
    """

    origin: int
    index: int
    seq: int
    timestamp: float
    creator: str
    body: str
    dead: str | None = None

    @property
    def position(self) -> tuple[int, int]:
        return (self.origin, self.index)


#: How many foreign messages (without fogshift headers) may stand at the end of a stream
#: before the writer gives up looking for its last record: a flood is an attack, not traffic.
FOREIGN_SCAN_LIMIT = 10_000
#: How often an append is retried when only foreign messages arrived since the tail was read.
FOREIGN_RETRIES = 100


@dataclass(frozen=True)
class StreamTail:
    """The end of a PE's output stream as its writers see it.

    Attributes:
        last_seq: The stream's last sequence, whoever wrote it (what an append must follow).
        mark_seq: The sequence of the last fogshift message (record, fence marker or cut);
            0 when there is none. Messages after it are foreign and carry no position.
        position: The ``(origin, index)`` the last fogshift message carries.
        epoch: The epoch of the last fogshift message.
    """

    last_seq: int
    mark_seq: int
    position: tuple[int, int]
    epoch: int


def _fogshift_headers(headers: dict[str, str] | None) -> tuple[tuple[int, int], int] | None:
    """``((origin, index), epoch)`` of a fogshift message; ``None`` for a foreign one."""
    if not headers:
        return None
    try:
        position = (int(headers[ORIGIN_HEADER]), int(headers[INDEX_HEADER]))
        epoch = int(headers[EPOCH_HEADER])
    except (KeyError, TypeError, ValueError):
        return None
    return position, epoch


#: The last part of the subjects fogshift's writers append marked messages to (records, dead
#: letters, fence markers, cuts); ``.keys`` and ``.state.*`` hold unmarked key moves and states.
MARKED_SUBJECTS = (".data", ".dead", ".fence", ".cut")


async def _last_marked(
    js: JetStreamContext, stream: str, subjects: Iterable[str]
) -> tuple[int, tuple[tuple[int, int], int]] | None:
    """The sequence, position and epoch of the last fogshift message of ``stream``, from the
    last message of each subject a writer marks (one request each, all at once; sequence 0
    when there is none); ``None`` when one of those is foreign (the caller then looks back
    message by message).

    Every marked message is on one of those subjects, so if each one's last is marked, the
    newest of them is the stream's last marked message: the key moves and states that
    follow it (a source's stream after every key move) are not stepped over one by one.
    """
    marked = _writers_subjects(subjects)

    async def last_on(subject: str) -> Any:
        try:
            return await js.get_last_msg(stream, subject)
        except NotFoundError:
            return None

    found = [m for m in await asyncio.gather(*(last_on(s) for s in marked)) if m is not None]
    newest: tuple[int, tuple[tuple[int, int], int]] = (0, ((0, -1), 0))  # none: as a scan ends
    for message in found:
        headers = _fogshift_headers(message.headers)
        if headers is None:
            return None
        if message.seq > newest[0]:
            newest = (int(message.seq), headers)
    return newest


def _writers_subjects(subjects: Iterable[str]) -> set[str]:
    """Of a stream's configured ``subjects``, those its writer appends marked messages to:
    named whole, not matched by their last token — a partition's node may publish on its
    input's ``.state.<element>.*``, whose ``*`` may be ``data``."""
    return {
        s for s in subjects if s.endswith(MARKED_SUBJECTS) and not {"*", ">"} & set(s.split("."))
    }


async def read_tail(js: JetStreamContext, stream: str) -> StreamTail:
    """The tail of ``stream``: its last sequence and its last fogshift message.

    A message published by someone else (no fogshift headers) is stepped over: it neither
    resets de-duplication to position 0 nor fencing to epoch 0.

    Raises:
        BrokerError: More than :data:`FOREIGN_SCAN_LIMIT` foreign messages end the stream.
    """
    info = await js.stream_info(stream)
    last = int(info.state.last_seq or 0)
    first = int(info.state.first_seq or 0)
    if last == 0 or not info.state.messages:
        return StreamTail(last, 0, (0, -1), 0)
    writers_subjects = _writers_subjects(info.config.subjects or [])
    seq = last
    while seq >= max(first, 1):
        if seq == last - 1:
            # The last message is not a writer's (a key move or state, usually): ask each
            # marked subject's last instead of stepping back (one round trip).
            marked = await _last_marked(js, stream, writers_subjects)
            if marked is not None:
                at, (position, epoch) = marked
                return StreamTail(last, at, position, epoch)
        if last - seq > FOREIGN_SCAN_LIMIT:
            raise BrokerError(
                f"stream {stream} ends with more than {FOREIGN_SCAN_LIMIT} messages that "
                "fogshift did not write",
                hint="something else publishes on this PE's subjects; the per-node broker "
                "permissions should prevent it: check who holds the admin credentials",
            )
        try:
            msg = await js.get_msg(stream, seq=seq)
        except NotFoundError:  # deleted by the limits or by hand: look further back
            seq -= 1
            continue
        # Only a writer's subject holds a writer's message: a partition's node may publish
        # on its input's `.keys.<id>` and `.state.<element>.*`, and one message there with a
        # writer's headers (a position far ahead, an epoch far ahead) silenced or fenced the
        # input's writer for good — on `.state.<element>.data` too, which a match of the
        # last token took for the writer's.
        writers = msg.subject in writers_subjects
        found = _fogshift_headers(msg.headers) if writers else None
        if found is not None:
            return StreamTail(last, seq, found[0], found[1])
        seq -= 1
    return StreamTail(last, 0, (0, -1), 0)


async def last_position(js: JetStreamContext, stream: str) -> tuple[int, tuple[int, int], int]:
    """The last stream sequence, and the ``(origin, index)`` and epoch of the last fogshift
    message (foreign messages are stepped over, see :func:`read_tail`)."""
    tail = await read_tail(js, stream)
    return tail.last_seq, tail.position, tail.epoch


async def check_epoch(js: JetStreamContext, pipeline: str, pe: str, epoch: int) -> None:
    """Refuse a writer of ``pe`` under ``epoch`` once a newer epoch took its output over (a
    fence marker or a record under it): for what it sends besides records (key states),
    which :func:`publish_records` does not check.

    Raises:
        Fenced: A newer epoch writes ``pe``'s output.
    """
    tail = await read_tail(js, stream_name(pipeline, pe))
    if tail.epoch > epoch:
        raise _fenced(pipeline, pe, epoch, tail.epoch)


def _fenced(pipeline: str, pe: str, mine: int, seen: int) -> Fenced:
    return Fenced(
        f"{FENCED_TOKEN}: {pipeline}/{pe} runs under epoch {mine}, but epoch {seen} has "
        "taken over its output: this instance must not write",
        hint="a newer instance of this PE runs elsewhere (it was restored); this one stops",
    )


async def _retrying(
    js: JetStreamContext,
    stream: str,
    tail: StreamTail,
    epoch: int,
    pipeline: str,
    pe: str,
    send: Callable[[StreamTail], Awaitable[StreamTail]],
    remembered: bool = False,
) -> StreamTail:
    """``send(tail)`` — an append right after ``tail`` that returns the new tail — retried
    while only foreign messages arrive after ``tail``.

    A newer epoch at the tail means this instance is fenced; another fogshift message means a
    second writer.

    Args:
        remembered: ``tail`` was not read now but left by this connection's last append:
            if the stream has moved on since, raise :class:`_StaleTail` (nothing stored).
    """
    who = f"{pipeline}/{pe}"
    for _ in range(FOREIGN_RETRIES):
        try:
            return await send(tail)
        except MaxPayloadError as exc:
            raise BrokerError(
                f"a message of {who} is over the broker's max payload",
                hint="the runtime dead-letters oversize outputs; raise nats-server's "
                "max_payload if such records are expected",
            ) from exc
        except APIError as exc:
            if exc.err_code not in (WRONG_LAST_SEQUENCE, DUPLICATE_IN_BATCH):
                raise BrokerError(f"append to {stream} of {who} failed: {exc}") from exc
            if remembered:
                raise _StaleTail from exc
            now = await read_tail(js, stream)
            if now.epoch > epoch:
                raise _fenced(pipeline, pe, epoch, now.epoch) from exc
            if now.mark_seq != tail.mark_seq and now.epoch < epoch:
                # A handover's older instance appended since the tail: this one is the
                # newer, so it skips what is stored and appends after it (the older one is
                # refused at its next append). Not a second writer.
                raise _StaleTail from exc
            if now.mark_seq != tail.mark_seq:
                raise WriterConflict(
                    f"output stream {stream} of {who} was appended to by another writer "
                    f"(expected its last record at sequence {tail.mark_seq}, found "
                    f"{now.mark_seq})",
                    hint="two instances of this PE are running; this one must stop",
                ) from exc
            tail = now  # only foreign messages came in between: append after them
    raise WriterConflict(
        f"output stream {stream} of {who} keeps receiving foreign messages",
        hint="something else publishes on this PE's subjects",
    )


async def _append(
    js: JetStreamContext,
    stream: str,
    subject: str,
    payload: bytes,
    headers: dict[str, str],
    tail: StreamTail,
    epoch: int,
    pipeline: str,
    pe: str,
) -> StreamTail:
    """Append one fogshift message right after ``tail``; return the new tail (see
    :func:`_retrying`)."""
    position = _fogshift_headers(headers)
    assert position is not None

    async def send(after: StreamTail) -> StreamTail:
        headers["Nats-Expected-Last-Sequence"] = str(after.last_seq)
        ack = await js.publish(subject, payload, headers=headers)
        return StreamTail(int(ack.seq), int(ack.seq), position[0], position[1])

    return await _retrying(js, stream, tail, epoch, pipeline, pe, send)


@dataclass(frozen=True)
class _Message:
    """One append: where, what, with which headers, at which input position."""

    subject: str
    payload: bytes
    headers: dict[str, str]
    position: tuple[int, int]


def _record_message(
    pipeline: str, pe: str, epoch: int, record: Record, nonce: str = ""
) -> _Message:
    """The subject, payload and headers of one record's append (``nonce``: its call's)."""
    payload = record_payload(record.seq, record.timestamp, record.creator, record.body, record.dead)
    headers = {
        MSG_ID_HEADER: message_id(pipeline, pe, record.origin, record.index, nonce),
        ORIGIN_HEADER: str(record.origin),
        INDEX_HEADER: str(record.index),
        EPOCH_HEADER: str(epoch),
    }
    subject = dead_subject(pipeline, pe) if record.dead is not None else data_subject(pipeline, pe)
    return _Message(subject, payload, headers, record.position)


def _chunks(messages: list[_Message]) -> Iterator[list[_Message]]:
    """``messages`` in consecutive chunks of at most :data:`ATOMIC_BATCH_MAX` messages and
    :data:`ATOMIC_BATCH_BYTES` bytes (a single larger message is a chunk of its own)."""
    chunk: list[_Message] = []
    size = 0
    for message in messages:
        full = len(chunk) >= ATOMIC_BATCH_MAX or size + len(message.payload) > ATOMIC_BATCH_BYTES
        if chunk and full:
            yield chunk
            chunk, size = [], 0
        chunk.append(message)
        size += len(message.payload)
    if chunk:
        yield chunk


class _AtomicDisabled(Exception):
    """The stream was created without ``allow_atomic``."""


class _AtomicBusy(_AtomicDisabled):
    """The stream takes no more atomic batches now (:data:`ATOMIC_TOO_MANY_INFLIGHT`): this
    append goes one record at a time, as to a stream without them. (A partition's node that
    opened batches on its input's stream and never committed them failed the upstream PE's
    every batch, on another node: a review's finding.)"""


def _api_error(reply: bytes) -> APIError | None:
    """The error in a JetStream reply, if it is one."""
    if not reply:
        return None
    try:
        answer = json.loads(reply)
    except ValueError:
        return None
    if not (isinstance(answer, dict) and "error" in answer):
        return None
    try:
        APIError.from_error(answer["error"])  # raises the error's own APIError subclass
    except APIError as exc:
        return exc
    return None


async def _commit_chunk(js: JetStreamContext, chunk: list[_Message], tail: StreamTail) -> int:
    """:func:`_send_chunk`, sent again (under a new batch id) while the broker finds it
    incomplete: its middle messages are plain publishes, and a broker reloading its accounts
    drops a plain publish it has no route for yet (a request is told, see ``broker.client``).

    Raises:
        APIError: The broker refused the batch (a wrong last sequence among others).
        _AtomicDisabled: The stream does not take atomic batches.
        _AtomicBusy: It takes no more now: too many open (:data:`ATOMIC_TOO_MANY_INFLIGHT`),
            or found incomplete at every quick try — what a stream whose atomic batches
            another writer holds answers a batch of several messages, whose first one it
            dropped (a plain publish) — so the append goes one by one.
    """
    loop = asyncio.get_running_loop()
    for tries in range(INCOMPLETE_RETRIES):
        started = loop.time()
        try:
            return await _send_chunk(js, chunk, tail)
        except APIError as exc:
            # (A batch that took long may have outlived the broker's wait between its
            # messages, also "incomplete": sent again it would be again.)
            quick = loop.time() - started < INCOMPLETE_QUICK_S
            if exc.err_code != BATCH_INCOMPLETE or not quick:
                raise
            if tries == INCOMPLETE_RETRIES - 1:
                raise _AtomicBusy from exc
            await asyncio.sleep(0.05 * 2**tries)
    raise AssertionError("unreachable")


async def _send_chunk(js: JetStreamContext, chunk: list[_Message], tail: StreamTail) -> int:
    """Send ``chunk`` as one atomic batch right after ``tail``; return the last sequence.

    Every message but the last is a plain publish on the same connection (ordered); the last
    commits the batch and is answered with its ack, or with the error that refused it (the
    expected last sequence the first message states is checked then, under the stream's
    lock). One round trip per chunk.

    Raises:
        APIError: The broker refused the batch (a wrong last sequence among others).
        _AtomicDisabled: The stream does not take atomic batches.
    """
    nc = connection_of(js)  # the batch's middle messages are plain publishes
    batch = uuid.uuid4().hex
    last = len(chunk)
    reply = b""
    for n, message in enumerate(chunk, start=1):
        headers = dict(message.headers)
        headers[BATCH_ID_HEADER] = batch
        headers[BATCH_SEQUENCE_HEADER] = str(n)
        if n == 1:
            headers["Nats-Expected-Last-Sequence"] = str(tail.last_seq)
        if n == last:
            headers[BATCH_COMMIT_HEADER] = "1"
        if n == last:
            answer = await nc.request(
                message.subject, message.payload, timeout=ATOMIC_TIMEOUT_S, headers=headers
            )
            reply = answer.data
            error = _api_error(reply)
            if error is not None:
                if error.err_code == ATOMIC_DISABLED:
                    raise _AtomicDisabled
                if error.err_code == ATOMIC_TOO_MANY_INFLIGHT:
                    raise _AtomicBusy
                raise error
        else:
            await nc.publish(message.subject, message.payload, headers=headers)
    ack = json.loads(reply)
    seq, count = int(ack.get("seq", 0)), int(ack.get("count", 0))
    if count != last or seq != tail.last_seq + last:
        raise InvariantViolation(
            f"the broker acknowledged an atomic batch of {last} records after sequence "
            f"{tail.last_seq} with {ack!r}",
            hint="the records must be stored together, right after the tail",
        )
    return seq


async def _append_chunk(
    js: JetStreamContext,
    stream: str,
    chunk: list[_Message],
    tail: StreamTail,
    epoch: int,
    pipeline: str,
    pe: str,
    remembered: bool = False,
) -> StreamTail:
    """Append ``chunk`` right after ``tail`` as one atomic batch; return the new tail (see
    :func:`_retrying`, also for ``remembered``).

    Raises:
        _AtomicDisabled: The stream does not take atomic batches (write one by one).
    """

    async def send(after: StreamTail) -> StreamTail:
        seq = await _commit_chunk(js, chunk, after)
        return StreamTail(seq, seq, chunk[-1].position, epoch)

    return await _retrying(js, stream, tail, epoch, pipeline, pe, send, remembered)


class _StaleTail(Exception):
    """The tail an append followed is no longer the stream's: something was appended since
    (nothing of the append was stored; ``appended``: records of earlier chunks that were)."""

    def __init__(self, appended: int = 0) -> None:
        super().__init__(appended)
        self.appended = appended


class _KnownTails:
    """The tail each stream had after this connection's last append to it, by
    ``(stream, epoch)``. A writer's connection lives as long as its worker process: the
    next batch of the same PE in that process starts from it instead of reading it."""

    def __init__(self) -> None:
        self._by_connection: weakref.WeakKeyDictionary[object, dict[tuple[str, int], StreamTail]]
        self._by_connection = weakref.WeakKeyDictionary()

    def take(self, js: JetStreamContext, stream: str, epoch: int) -> StreamTail | None:
        """The remembered tail, forgotten until :meth:`keep` (a failed append leaves none)."""
        return self._by_connection.get(connection_of(js), {}).pop((stream, epoch), None)

    def keep(self, js: JetStreamContext, stream: str, epoch: int, tail: StreamTail | None) -> None:
        if tail is not None:
            self._by_connection.setdefault(connection_of(js), {})[(stream, epoch)] = tail


_known_tails = _KnownTails()


async def publish_records(
    js: JetStreamContext, pipeline: str, pe: str, records: Iterable[Record], epoch: int = 0
) -> int:
    """Append the records of ``pe`` not yet in its stream; return how many were appended.

    The records go in atomic batches (see the module's docstring); after a failure part-way,
    the chunks already committed are stored whole and a retry skips them by position.

    Args:
        records: Records of one batch; they are sorted by position here.
        epoch: The epoch this instance runs under (fencing).

    Raises:
        Fenced: The stream's last fogshift message is from a newer epoch (or a fence marker
            for one).
        WriterConflict: Another writer appended meanwhile.
        BrokerError: JetStream refused an append for another reason.
    """
    stream = stream_name(pipeline, pe)
    ordered: list[Record] | None = None
    # The message ids name this call: a resend within it (an answer lost) is the broker's
    # duplicate, and nobody can store an id first. Every node reading the input may publish
    # in its stream (key states), and ids known ahead let it make the broker refuse each
    # append as a repeat (an atomic batch) or drop it as one (a record at a time). Across
    # calls the expected last sequence and the positions keep appends exactly once.
    nonce = uuid.uuid4().hex[:16]
    tail = _known_tails.take(js, stream, epoch)
    remembered = tail is not None
    appended = 0
    for _ in range(FOREIGN_RETRIES):
        if tail is None:
            tail = await read_tail(js, stream)
            if tail.epoch > epoch:
                raise _fenced(pipeline, pe, epoch, tail.epoch)
        if ordered is None:  # (after the tail is read: a racing writer is then detected)
            ordered = sorted(records, key=lambda r: r.position)
        try:
            count, left = await _append_after(
                js, pipeline, pe, ordered, epoch, tail, remembered=remembered, nonce=nonce
            )
        except _StaleTail as stale:
            # Appended to since the tail (the remembered one, or by a handover's older
            # instance): read it again; what is stored now is skipped by position.
            appended += stale.appended
            tail, remembered = None, False
            continue
        # Remembered only if this call appended, or had nothing to: records all stored
        # already (a warm standby's, which follows its primary; a retried batch) leave the
        # tail read, which the stream's writer moves on from, and the next call would send
        # what it stored since, to learn it from the broker's refusal. A standby may not
        # send at all (see broker.permissions.Hosted.standby).
        _known_tails.keep(js, stream, epoch, left if count or not ordered else None)
        return appended + count
    raise WriterConflict(
        f"output stream {stream} of {pipeline}/{pe} keeps moving under its writer",
        hint="another instance of this PE keeps appending; this one stops",
    )


async def _append_after(
    js: JetStreamContext,
    pipeline: str,
    pe: str,
    ordered: list[Record],
    epoch: int,
    tail: StreamTail,
    remembered: bool = False,
    nonce: str = "",
) -> tuple[int, StreamTail | None]:
    """Append the records of ``ordered`` beyond ``tail``'s position, right after ``tail``;
    return how many, and the tail they leave (``None`` for a stream without atomic batches,
    written one record at a time: not worth remembering).

    Args:
        remembered: ``tail`` is what this connection's last append left, not read now: if
            the stream has moved on, raise :class:`_StaleTail` with nothing stored.

    Raises:
        _StaleTail: The stream moved on under the append (see :func:`_retrying`).
    """
    stream = stream_name(pipeline, pe)
    messages = [
        _record_message(pipeline, pe, epoch, r, nonce)
        for r in ordered
        if r.position > tail.position
    ]
    appended = 0
    atomic: bool = True
    try:
        for chunk in _chunks(messages):
            if atomic:
                try:
                    tail = await _append_chunk(
                        js, stream, chunk, tail, epoch, pipeline, pe, remembered=remembered
                    )
                    appended += len(chunk)
                    remembered = False  # stored: the tail is this chunk's
                    continue
                except _AtomicDisabled as refused:
                    if remembered:
                        raise _StaleTail from None  # read the tail, as the first time
                    # A stream created without allow_atomic, or one whose atomic batches
                    # are all taken: one by one (each still after the tail it expects).
                    atomic = False
                    if isinstance(refused, _AtomicBusy) and stream not in _busy_streams:
                        _busy_streams.add(stream)
                        log.warning(
                            "%s/%s: its stream %s takes no more atomic batches now (another "
                            "writer's are open): appending one record at a time",
                            pipeline, pe, stream,
                        )  # fmt: skip
            for message in chunk:
                tail = await _append(
                    js, stream, message.subject, message.payload, dict(message.headers), tail,
                    epoch, pipeline, pe,
                )  # fmt: skip
                appended += 1
    except _StaleTail as stale:
        raise _StaleTail(appended) from stale  # (the chunks before it are stored)
    return appended, (tail if atomic else None)


async def fence(js: JetStreamContext, pipeline: str, pe: str, epoch: int) -> int:
    """Append a fence marker for ``epoch`` to ``pe``'s stream; return its sequence.

    After it, every writer of an older epoch finds a newer epoch at the end of the stream
    (and fails), or has its append rejected by ``Nats-Expected-Last-Sequence`` (and then
    finds it). The marker repeats the last record's position, so de-duplication by position
    is unaffected; readers of the data subject never see it.
    """
    stream = stream_name(pipeline, pe)
    deadline = time.monotonic() + FENCE_WAIT_S
    tries = 0
    while True:
        tail = await read_tail(js, stream)
        if tail.epoch >= epoch:
            return tail.mark_seq
        headers = {
            ORIGIN_HEADER: str(tail.position[0]),
            INDEX_HEADER: str(tail.position[1]),
            EPOCH_HEADER: str(epoch),
            "Nats-Expected-Last-Sequence": str(tail.last_seq),
        }
        try:
            ack = await js.publish(fence_subject(pipeline, pe), b"{}", headers=headers)
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise BrokerError(f"cannot fence {pipeline}/{pe}: {exc}") from exc
        else:
            return int(ack.seq)
        # The old instance (or a stranger) appended meanwhile: read again, after a pause
        # that grows (jittered), so that the marker lands between its bursts. (Fifty
        # immediate tries all fell within one burst of a batch's pipelined appends.)
        tries += 1
        if time.monotonic() >= deadline:
            raise BrokerError(
                f"cannot fence {pipeline}/{pe}: its stream kept moving for {FENCE_WAIT_S:g} s "
                f"({tries} markers refused): an instance of an older epoch is still writing",
                hint="stop the PE's old instance (its node), then restore it again",
            )
        await asyncio.sleep(random.uniform(0, min(FENCE_PAUSE_S * 2 ** min(tries, 10), 0.2)))


@dataclass(frozen=True)
class Cut:
    """One logged batch cut of a PE with several inputs: the input ranges of one micro-batch.

    Attributes:
        seq: Where the cut is stored in the PE's own stream.
        start: Every input's position before the batch.
        end: Every input's position after it.
        epoch: The epoch of the instance that planned it.
    """

    seq: int
    start: dict[str, int]
    end: dict[str, int]
    epoch: int


async def next_cut(js: JetStreamContext, pipeline: str, pe: str, after: int) -> Cut | None:
    """The first cut logged in ``pe``'s stream after sequence ``after``, or ``None``."""
    stream = stream_name(pipeline, pe)
    try:
        msg = await js.get_msg(stream, seq=after + 1, subject=cut_subject(pipeline, pe), next=True)
    except NotFoundError:
        return None
    found = _fogshift_headers(msg.headers)
    try:
        payload = json.loads(msg.data or b"{}")
        start = {str(k): int(v) for k, v in payload["start"].items()}
        end = {str(k): int(v) for k, v in payload["end"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvariantViolation(
            f"cut log of {pipeline}/{pe} holds a malformed cut at sequence {msg.seq}: {msg.data!r}",
            hint="only the PE's own instances may publish on its .cut subject",
        ) from exc
    return Cut(int(msg.seq or 0), start, end, found[1] if found else 0)


async def append_cut(
    js: JetStreamContext,
    pipeline: str,
    pe: str,
    epoch: int,
    start: dict[str, int],
    end: dict[str, int],
    after: int,
) -> int:
    """Log the cut ``(start, end]`` of ``pe``'s next micro-batch before it runs, as the cut
    after the one logged at sequence ``after`` (``0``: the first).

    The cut is appended under ``epoch`` right after the stream's tail, like a record, and
    only if the last cut logged is ``after`` (the broker checks both): a fenced instance
    cannot log a cut, and no two cuts follow the same one. During a handover both instances
    run and log cuts; an older one's cut stored between this one's look at the log and its
    append would otherwise be followed by a second cut from the same start, a fork that
    every replay across it refuses.

    Returns:
        The cut's stream sequence.

    Raises:
        Fenced: A newer epoch has taken over the PE.
        WriterConflict: A cut after ``after`` was logged meanwhile (the batch follows it), or
            another instance wrote under this epoch.
    """
    stream = stream_name(pipeline, pe)
    payload = json.dumps({"start": start, "end": end}, sort_keys=True).encode()
    for _ in range(FOREIGN_RETRIES):
        tail = await read_tail(js, stream)
        if tail.epoch > epoch:
            raise _fenced(pipeline, pe, epoch, tail.epoch)
        headers = {
            ORIGIN_HEADER: str(tail.position[0]),
            INDEX_HEADER: str(tail.position[1]),
            EPOCH_HEADER: str(epoch),
            "Nats-Expected-Last-Sequence": str(tail.last_seq),
            "Nats-Expected-Last-Subject-Sequence": str(after),
        }
        try:
            ack = await js.publish(cut_subject(pipeline, pe), payload, headers=headers)
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise BrokerError(f"cannot log a cut of {pipeline}/{pe}: {exc}") from exc
            logged = await next_cut(js, pipeline, pe, after)
            if logged is not None:
                raise WriterConflict(
                    f"{pipeline}/{pe}: a cut after sequence {after} was logged at "
                    f"{logged.seq} under epoch {logged.epoch} meanwhile",
                    hint="the batch follows the logged cut",
                ) from exc
            continue  # messages came after the tail (a fence, an older instance's): look again
        return int(ack.seq)
    raise WriterConflict(
        f"cut log of {pipeline}/{pe} keeps moving under this instance (epoch {epoch})",
        hint="something keeps appending to its stream; the batch is planned again",
    )
