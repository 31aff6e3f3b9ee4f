"""Idempotent, single-writer appends to a PE's output stream.

Exactly-once across re-executed batches does not rest on the broker's duplicate window
(which is finite): every record carries its input position ``(origin, index)``, a PE's
records are appended in that order, and before appending, the writer reads the position of
the last stored record and skips everything up to it. Each append also states the stream
sequence it expects to follow (``Nats-Expected-Last-Sequence``), so a second writer racing
on the same stream makes the append fail instead of interleaving.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

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

#: JetStream's error code for a failed Nats-Expected-Last-Sequence check.
WRONG_LAST_SEQUENCE = 10071


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
    seq = last
    while seq >= max(first, 1):
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
        found = _fogshift_headers(msg.headers)
        if found is not None:
            return StreamTail(last, seq, found[0], found[1])
        seq -= 1
    return StreamTail(last, 0, (0, -1), 0)


async def last_position(js: JetStreamContext, stream: str) -> tuple[int, tuple[int, int], int]:
    """The last stream sequence, and the ``(origin, index)`` and epoch of the last fogshift
    message (foreign messages are stepped over, see :func:`read_tail`)."""
    tail = await read_tail(js, stream)
    return tail.last_seq, tail.position, tail.epoch


def _fenced(pipeline: str, pe: str, mine: int, seen: int) -> Fenced:
    return Fenced(
        f"{FENCED_TOKEN}: {pipeline}/{pe} runs under epoch {mine}, but epoch {seen} has "
        "taken over its output: this instance must not write",
        hint="a newer instance of this PE runs elsewhere (it was restored); this one stops",
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
) -> tuple[int, StreamTail]:
    """Append one fogshift message right after ``tail``; return its sequence and the new tail.

    Only foreign messages may have arrived since ``tail`` was read: then the append is retried
    after them. A newer epoch means this instance is fenced; another fogshift message means a
    second writer.
    """
    who = f"{pipeline}/{pe}"
    for _ in range(FOREIGN_RETRIES):
        headers["Nats-Expected-Last-Sequence"] = str(tail.last_seq)
        try:
            ack = await js.publish(subject, payload, headers=headers)
        except MaxPayloadError as exc:
            raise BrokerError(
                f"a message of {who} is {len(payload)} bytes, over the broker's max payload",
                hint="the runtime dead-letters oversize outputs; raise nats-server's "
                "max_payload if such records are expected",
            ) from exc
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise BrokerError(f"append to {stream} of {who} failed: {exc}") from exc
            now = await read_tail(js, stream)
            if now.epoch > epoch:
                raise _fenced(pipeline, pe, epoch, now.epoch) from exc
            if now.mark_seq != tail.mark_seq:
                raise WriterConflict(
                    f"output stream {stream} of {who} was appended to by another writer "
                    f"(expected its last record at sequence {tail.mark_seq}, found "
                    f"{now.mark_seq})",
                    hint="two instances of this PE are running; this one must stop",
                ) from exc
            tail = now  # only foreign messages came in between: append after them
            continue
        position = _fogshift_headers(headers)
        assert position is not None
        return int(ack.seq), StreamTail(int(ack.seq), int(ack.seq), position[0], position[1])
    raise WriterConflict(
        f"output stream {stream} of {who} keeps receiving foreign messages",
        hint="something else publishes on this PE's subjects",
    )


async def publish_records(
    js: JetStreamContext, pipeline: str, pe: str, records: Iterable[Record], epoch: int = 0
) -> int:
    """Append the records of ``pe`` not yet in its stream; return how many were appended.

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
    tail = await read_tail(js, stream)
    if tail.epoch > epoch:
        raise _fenced(pipeline, pe, epoch, tail.epoch)
    ordered = sorted(records, key=lambda r: r.position)
    appended = 0
    for record in ordered:
        if record.position <= tail.position:
            continue  # already stored by an earlier execution of this batch
        payload = record_payload(
            record.seq, record.timestamp, record.creator, record.body, record.dead
        )
        headers = {
            MSG_ID_HEADER: message_id(pipeline, pe, record.origin, record.index),
            ORIGIN_HEADER: str(record.origin),
            INDEX_HEADER: str(record.index),
            EPOCH_HEADER: str(epoch),
        }
        subject = (
            dead_subject(pipeline, pe) if record.dead is not None else data_subject(pipeline, pe)
        )
        _, tail = await _append(js, stream, subject, payload, headers, tail, epoch, pipeline, pe)
        appended += 1
    return appended


async def fence(js: JetStreamContext, pipeline: str, pe: str, epoch: int) -> int:
    """Append a fence marker for ``epoch`` to ``pe``'s stream; return its sequence.

    After it, every writer of an older epoch finds a newer epoch at the end of the stream
    (and fails), or has its append rejected by ``Nats-Expected-Last-Sequence`` (and then
    finds it). The marker repeats the last record's position, so de-duplication by position
    is unaffected; readers of the data subject never see it.
    """
    stream = stream_name(pipeline, pe)
    for _ in range(50):
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
            if exc.err_code == WRONG_LAST_SEQUENCE:
                continue  # the old instance (or a stranger) appended meanwhile: read again
            raise BrokerError(f"cannot fence {pipeline}/{pe}: {exc}") from exc
        return int(ack.seq)
    raise BrokerError(f"cannot fence {pipeline}/{pe}: its stream keeps moving")


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
) -> int:
    """Log the cut ``(start, end]`` of ``pe``'s next micro-batch before it runs.

    The cut is appended under ``epoch`` right after the stream's tail, like a record: a fenced
    instance cannot log a cut, and two instances cannot log interleaved histories.

    Returns:
        The cut's stream sequence.

    Raises:
        Fenced: A newer epoch has taken over the PE.
        WriterConflict: Another instance logged or wrote meanwhile.
    """
    stream = stream_name(pipeline, pe)
    tail = await read_tail(js, stream)
    if tail.epoch > epoch:
        raise _fenced(pipeline, pe, epoch, tail.epoch)
    headers = {
        ORIGIN_HEADER: str(tail.position[0]),
        INDEX_HEADER: str(tail.position[1]),
        EPOCH_HEADER: str(epoch),
    }
    payload = json.dumps({"start": start, "end": end}, sort_keys=True).encode()
    seq, _ = await _append(
        js, stream, cut_subject(pipeline, pe), payload, headers, tail, epoch, pipeline, pe
    )
    return seq
