"""Trimming a PE's stream: the records no reader can ask for again, once they are old.

A PE's output stream keeps every record it was given, so that a reader restored from an older
checkpoint reads on from there (streams are the pipeline's offsets). Kept for good, a busy
pipeline's streams fill the broker's disk (1,000 records a second of 200 bytes: 17 GB a day),
and the broker then refuses every append: the pipeline stops. So the orchestrator deletes a
stream's data records *below its horizon* — the lowest position of the stream any reader's
kept checkpoint may restart from (:func:`fogshift.orchestrator.history.horizon`) — once they
are older than the pipeline's ``recovery.history_s``.

Only data records go (``.data``) — and dead letters (``.dead``), which no reader reads, once
old (:func:`trim_dead`): key moves and states (``.keys``, ``.state``: replayed from the start
to know who owns a key) and cuts stay. The stream's last data record and last dead letter
always stay: a writer resumes from its stream's tail, which names the position its records
reached (``broker.publish.read_tail``: the newest of each marked subject's last message).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from fogshift.broker.client import api_prefix, connection_of, message_since, next_message
from fogshift.broker.exceptions import BrokerError
from fogshift.broker.naming import data_subject, dead_subject, stream_name

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
    js: JetStreamContext, pipeline: str, pe: str, horizon: float, cutoff: float
) -> Trimmed:
    """Delete the data records of ``pe``'s stream at sequences below ``horizon`` that were
    stored before ``cutoff`` (Unix time); never the stream's last data record.

    Args:
        horizon: The lowest position of the stream a reader may restart from: the records
            up to it were read and checkpointed past by every reader (``math.inf``: no
            reader; the age alone counts).

    Raises:
        BrokerError: The broker refused the purge.
    """
    stream, subject = stream_name(pipeline, pe), data_subject(pipeline, pe)
    below = await _bound(js, stream, subject, cutoff, horizon)
    if below == 0:
        return Trimmed(0, 0)
    info = await js.stream_info(stream)
    metadata = dict(info.config.metadata or {})
    if int(metadata.get(TRIMMED_BELOW, 0)) < below:
        metadata[TRIMMED_BELOW] = str(below)
        info.config.metadata = metadata
        await js.update_stream(info.config)
    return Trimmed(await _purge(js, stream, subject, below, f"{pipeline}/{pe}"), below)


async def trim_dead(js: JetStreamContext, pipeline: str, pe: str, cutoff: float) -> int:
    """Delete the dead letters of ``pe``'s stream stored before ``cutoff`` (Unix time) but
    the last one (no reader reads them: ``fogshift errors`` shows the newest); how many."""
    stream, subject = stream_name(pipeline, pe), dead_subject(pipeline, pe)
    below = await _bound(js, stream, subject, cutoff)
    if below == 0:
        return 0
    return await _purge(js, stream, subject, below, f"{pipeline}/{pe}")


async def _bound(
    js: JetStreamContext, stream: str, subject: str, cutoff: float, horizon: float = math.inf
) -> int:
    """The sequence the messages on ``subject`` may be trimmed below: those stored before
    ``cutoff`` and below ``horizon``, never the last one (0: none may go, or the stream is
    not there)."""
    try:
        await js.stream_info(stream)
    except NotFoundError:
        return 0  # (not made yet, or removed: nothing to trim)
    oldest = await next_message(js, stream, subject)
    if oldest is None or oldest.stored_at >= cutoff or oldest.seq >= horizon:
        return 0
    young = await message_since(js, stream, subject, cutoff)
    last = await js.get_last_msg(stream, subject)
    below = int(min(horizon, int(last.seq or 0)))
    if young is not None:
        below = min(below, young.seq)
    return below if below > oldest.seq else 0


async def _purge(js: JetStreamContext, stream: str, subject: str, below: int, pe: str) -> int:
    """Delete the messages on ``subject`` below sequence ``below``; how many went."""
    reply = await connection_of(js).request(
        f"{api_prefix(js)}.STREAM.PURGE.{stream}",
        json.dumps({"filter": subject, "seq": below}).encode(),
        timeout=10,
    )
    answer = json.loads(reply.data)
    if not answer.get("success"):
        raise BrokerError(
            f"the broker refused to trim {subject} of stream {stream} ({pe}) below {below}",
            received=str(answer.get("error")),
            hint="the orchestrator's broker user must be the broker's admin",
        )
    return int(answer.get("purged", 0))


async def trimmed_below(js: JetStreamContext, stream: str) -> int:
    """The sequence the data records of ``stream`` were trimmed below (0: none was)."""
    info = await js.stream_info(stream)
    return int((info.config.metadata or {}).get(TRIMMED_BELOW, 0))
