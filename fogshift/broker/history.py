"""Trimming a PE's stream: the records no reader can ask for again, once they are old.

A PE's output stream keeps every record it was given, so that a reader restored from an older
checkpoint reads on from there (streams are the pipeline's offsets). Kept for good, a busy
pipeline's streams fill the broker's disk (1,000 records a second of 200 bytes: 17 GB a day),
and the broker then refuses every append: the pipeline stops. So the orchestrator deletes a
stream's data records *below its horizon* — the lowest position of the stream any reader's
kept checkpoint may restart from (:func:`fogshift.orchestrator.history.horizon`) — once they
are older than the pipeline's ``recovery.history_s``.

Only data records go (``.data``): key moves and states (``.keys``, ``.state``: replayed from
the start to know who owns a key), cuts and dead letters stay. The stream's last data record
always stays: a writer resumes from its stream's tail, which names the position its records
reached (``broker.publish.read_tail``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from nats.js import JetStreamContext

from fogshift.broker.client import connection_of, message_since, next_message
from fogshift.broker.exceptions import BrokerError
from fogshift.broker.naming import data_subject, stream_name

#: The stream's metadata entry naming the sequence its data records are trimmed below: set
#: before the records go, so a reader that would start below it fails loudly instead of
#: reading on past a hole (:func:`trimmed_below`).
TRIMMED_BELOW = "fogshift_data_trimmed_below"


@dataclass(frozen=True)
class Trimmed:
    """What :func:`trim_data` did.

    Attributes:
        purged: Data records deleted.
        below: The data records before this sequence are gone (0: none was).
    """

    purged: int
    below: int


async def trim_data(
    js: JetStreamContext, pipeline: str, pe: str, horizon: int, cutoff: float
) -> Trimmed:
    """Delete the data records of ``pe``'s stream at sequences below ``horizon`` that were
    stored before ``cutoff`` (Unix time); never the stream's last data record.

    Args:
        horizon: The lowest position of the stream a reader may restart from: the records
            up to it were read and checkpointed past by every reader.

    Raises:
        BrokerError: The broker refused the purge.
    """
    stream, subject = stream_name(pipeline, pe), data_subject(pipeline, pe)
    oldest = await next_message(js, stream, subject)
    if oldest is None or oldest.stored_at >= cutoff or oldest.seq >= horizon:
        return Trimmed(0, 0)
    young = await message_since(js, stream, subject, cutoff)
    last = await js.get_last_msg(stream, subject)
    below = min(horizon, int(last.seq or 0))
    if young is not None:
        below = min(below, young.seq)
    if below <= oldest.seq:
        return Trimmed(0, 0)
    info = await js.stream_info(stream)
    metadata = dict(info.config.metadata or {})
    if int(metadata.get(TRIMMED_BELOW, 0)) < below:
        metadata[TRIMMED_BELOW] = str(below)
        info.config.metadata = metadata
        await js.update_stream(info.config)
    reply = await connection_of(js).request(
        f"$JS.API.STREAM.PURGE.{stream}",
        json.dumps({"filter": subject, "seq": below}).encode(),
        timeout=10,
    )
    answer = json.loads(reply.data)
    if not answer.get("success"):
        raise BrokerError(
            f"the broker refused to trim stream {stream} of {pipeline}/{pe} below {below}",
            received=str(answer.get("error")),
            hint="the orchestrator's broker user must be the broker's admin",
        )
    return Trimmed(int(answer.get("purged", 0)), below)


async def trimmed_below(js: JetStreamContext, stream: str) -> int:
    """The sequence the data records of ``stream`` were trimmed below (0: none was)."""
    info = await js.stream_info(stream)
    return int((info.config.metadata or {}).get(TRIMMED_BELOW, 0))
