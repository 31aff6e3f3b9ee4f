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

from nats.js import JetStreamContext
from nats.js.errors import APIError

from fogshift.broker.exceptions import FENCED_TOKEN, BrokerError, Fenced, WriterConflict
from fogshift.broker.naming import data_subject, dead_subject, fence_subject, stream_name
from fogshift.events import EPOCH_HEADER, INDEX_HEADER, MSG_ID_HEADER, ORIGIN_HEADER, message_id

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


async def last_position(js: JetStreamContext, stream: str) -> tuple[int, tuple[int, int], int]:
    """The last stream sequence, and the ``(origin, index)`` and epoch stored there."""
    info = await js.stream_info(stream)
    last = int(info.state.last_seq or 0)
    if last == 0 or not info.state.messages:
        return last, (0, -1), 0
    msg = await js.get_msg(stream, seq=last)
    headers = msg.headers or {}
    position = (int(headers.get(ORIGIN_HEADER, 0)), int(headers.get(INDEX_HEADER, -1)))
    return last, position, int(headers.get(EPOCH_HEADER, 0))


def _fenced(pipeline: str, pe: str, mine: int, seen: int) -> Fenced:
    return Fenced(
        f"{FENCED_TOKEN}: {pipeline}/{pe} runs under epoch {mine}, but epoch {seen} has "
        "taken over its output: this instance must not write",
        hint="a newer instance of this PE runs elsewhere (it was restored); this one stops",
    )


async def publish_records(
    js: JetStreamContext, pipeline: str, pe: str, records: Iterable[Record], epoch: int = 0
) -> int:
    """Append the records of ``pe`` not yet in its stream; return how many were appended.

    Args:
        records: Records of one batch; they are sorted by position here.
        epoch: The epoch this instance runs under (fencing).

    Raises:
        Fenced: The stream's last message is from a newer epoch (or a fence marker for one).
        WriterConflict: Another writer appended meanwhile.
        BrokerError: JetStream refused an append for another reason.
    """
    stream = stream_name(pipeline, pe)
    last_seq, last_pos, last_epoch = await last_position(js, stream)
    if last_epoch > epoch:
        raise _fenced(pipeline, pe, epoch, last_epoch)
    ordered = sorted(records, key=lambda r: r.position)
    appended = 0
    for record in ordered:
        if record.position <= last_pos:
            continue  # already stored by an earlier execution of this batch
        payload = {
            "seq": record.seq,
            "timestamp": record.timestamp,
            "creator": record.creator,
            "body": record.body,
        }
        if record.dead is not None:
            payload["reason"] = record.dead
        headers = {
            MSG_ID_HEADER: message_id(pipeline, pe, record.origin, record.index),
            ORIGIN_HEADER: str(record.origin),
            INDEX_HEADER: str(record.index),
            EPOCH_HEADER: str(epoch),
            "Nats-Expected-Last-Sequence": str(last_seq),
        }
        subject = (
            dead_subject(pipeline, pe) if record.dead is not None else data_subject(pipeline, pe)
        )
        try:
            ack = await js.publish(subject, json.dumps(payload).encode(), headers=headers)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                _, _, now_epoch = await last_position(js, stream)
                if now_epoch > epoch:
                    raise _fenced(pipeline, pe, epoch, now_epoch) from exc
                raise WriterConflict(
                    f"output stream {stream} of {pipeline}/{pe} was appended to by another "
                    f"writer (expected last sequence {last_seq})",
                    hint="two instances of this PE are running; this one must stop",
                ) from exc
            raise BrokerError(f"append to {stream} of {pipeline}/{pe} failed: {exc}") from exc
        if ack.duplicate:
            raise WriterConflict(
                f"broker saw record {record.position} of {pipeline}/{pe} as a duplicate, "
                "but it was not the last stored record",
            )
        last_seq = ack.seq
        last_pos = record.position
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
        last_seq, (origin, index), last_epoch = await last_position(js, stream)
        if last_epoch >= epoch:
            return last_seq
        headers = {
            ORIGIN_HEADER: str(origin),
            INDEX_HEADER: str(index),
            EPOCH_HEADER: str(epoch),
            "Nats-Expected-Last-Sequence": str(last_seq),
        }
        try:
            ack = await js.publish(fence_subject(pipeline, pe), b"{}", headers=headers)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                continue  # the old instance appended meanwhile: read again, fence after it
            raise BrokerError(f"cannot fence {pipeline}/{pe}: {exc}") from exc
        return int(ack.seq)
    raise BrokerError(f"cannot fence {pipeline}/{pe}: its stream keeps moving")
