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

from fogshift.broker.exceptions import BrokerError, WriterConflict
from fogshift.broker.naming import data_subject, dead_subject, stream_name
from fogshift.events import INDEX_HEADER, MSG_ID_HEADER, ORIGIN_HEADER, message_id

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


async def last_position(js: JetStreamContext, stream: str) -> tuple[int, tuple[int, int]]:
    """The last stream sequence and the ``(origin, index)`` of the record stored there."""
    info = await js.stream_info(stream)
    last = int(info.state.last_seq or 0)
    if last == 0 or not info.state.messages:
        return last, (0, -1)
    msg = await js.get_msg(stream, seq=last)
    headers = msg.headers or {}
    return last, (int(headers.get(ORIGIN_HEADER, 0)), int(headers.get(INDEX_HEADER, -1)))


async def publish_records(
    js: JetStreamContext, pipeline: str, pe: str, records: Iterable[Record]
) -> int:
    """Append the records of ``pe`` not yet in its stream; return how many were appended.

    Args:
        records: Records of one batch; they are sorted by position here.

    Raises:
        WriterConflict: Another writer appended meanwhile.
        BrokerError: JetStream refused an append for another reason.
    """
    stream = stream_name(pipeline, pe)
    last_seq, last_pos = await last_position(js, stream)
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
            "Nats-Expected-Last-Sequence": str(last_seq),
        }
        subject = (
            dead_subject(pipeline, pe) if record.dead is not None else data_subject(pipeline, pe)
        )
        try:
            ack = await js.publish(subject, json.dumps(payload).encode(), headers=headers)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
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
