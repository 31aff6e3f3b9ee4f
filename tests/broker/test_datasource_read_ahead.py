"""A one-input reader plans a batch and reads its rows in one request: the same end and the
same rows as asking the stream's tail and reading the range in the executor. Against a real
nats-server; the reader is called as Spark's planner and executor would call it."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from fogshift.broker import client as broker_client
from fogshift.broker.client import SyncJetStream, ensure_pe_stream, last_seq
from fogshift.broker.datasource import (
    LINK_READS,
    READ_AHEAD_IDLE_ROUNDS,
    JetStreamReader,
    positions_of,
)
from fogshift.broker.naming import stream_name
from fogshift.broker.publish import Record, fence, publish_records
from fogshift.broker.server import BrokerProcess
from fogshift.common.gate import write_gate
from fogshift.common.waiting import wait_until

pytestmark = pytest.mark.integration
_pipelines = (f"ahead{n}" for n in itertools.count())


@pytest.fixture
def source(js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path) -> dict[str, str]:
    """Input ``s`` of PE ``m`` in a pipeline of its own: events 1-4, a dead letter (5), event
    6, then a fence marker (7): the stream ends with messages that are no events. The
    reader's options."""
    pipeline = next(_pipelines)
    js_client.run(lambda js: ensure_pe_stream(js, pipeline, "s"))
    rows = [
        Record(k, 0, k, 1000.0 + k, "s", json.dumps({"v": k}), "bad" if k == 5 else None)
        for k in range(1, 7)
    ]
    js_client.run(lambda js: publish_records(js, pipeline, "s", rows, epoch=1))
    js_client.run(lambda js: fence(js, pipeline, "s", 2))
    broker = nats_server.address.save(tmp_path / "broker.json")
    return {"broker": str(broker), "pipeline": pipeline, "pe": "m", "inputs": "s",
            "epoch": "1", "gate": str(tmp_path / "gate")}  # fmt: skip


def _values(reader: JetStreamReader, start: dict, end: dict) -> list[tuple[int, int]]:
    """``(origin, body value)`` of the batch ``(start, end]``, as an executor reads it."""
    (partition,) = reader.partitions(start, end)
    rows = [row for batch in reader.read(partition) for row in batch.to_pylist()]
    return [(row["origin"], json.loads(row["body"])["v"]) for row in rows]


def test_a_batch_is_planned_and_read_in_one_request_like_tail_and_range(
    source: dict[str, str], js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    tail = broker_client.last_seq

    async def counted(js: object, stream: str) -> int:
        asked.append(stream)
        return await tail(js, stream)  # type: ignore[arg-type]

    monkeypatch.setattr("fogshift.broker.datasource.last_seq", counted)
    reader = JetStreamReader(source)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10_000))
    # The end is the stream's last sequence, past the dead letter and the fence marker.
    stream = stream_name(source["pipeline"], "s")
    assert positions_of(end) == {"s": js_client.run(lambda js: last_seq(js, stream))}
    assert positions_of(end) == {"s": 7} and asked == []
    (planned,) = reader.partitions(start, end)
    assert planned.rows is not None  # the executor will ask the broker nothing
    ahead = _values(reader, start, end)
    assert ahead == [(1, 1), (2, 2), (3, 3), (4, 4), (6, 6)]
    # The same batch re-executed elsewhere (nothing read ahead there) reads the same rows.
    assert _values(JetStreamReader(source), start, end) == ahead
    # Nothing after the end: the stream's tail is asked (and checked) instead, and while
    # idle only the tail, one request per look.
    assert reader.latestOffset(end, ReadMaxRows(10_000)) == end
    assert reader.latestOffset(end, ReadMaxRows(10_000)) == end
    assert asked == [stream, stream]
    # Input again: the first batch is found by the tail, the next ones read ahead.
    pipeline = source["pipeline"]
    more = [Record(k, 0, k, 1000.0 + k, "s", json.dumps({"v": k}), None) for k in (8, 9)]
    js_client.run(lambda js: publish_records(js, pipeline, "s", more[:1], epoch=2))
    after = reader.latestOffset(end, ReadMaxRows(10_000))
    assert positions_of(after) == {"s": 8} and len(asked) == 3
    assert _values(reader, end, after) == [(8, 8)]
    js_client.run(lambda js: publish_records(js, pipeline, "s", more[1:], epoch=2))
    last = reader.latestOffset(after, ReadMaxRows(10_000))
    assert positions_of(last) == {"s": 9} and len(asked) == 3
    assert _values(reader, after, last) == [(9, 9)]


def test_the_read_limit_and_a_cap_end_a_read_ahead_batch(
    source: dict[str, str], tmp_path: Path
) -> None:
    reader = JetStreamReader(source)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(3))
    assert positions_of(end) == {"s": 3}
    assert _values(reader, start, end) == [(1, 1), (2, 2), (3, 3)]
    write_gate(tmp_path / "gate", "cap", {"type": "jetstream", "positions": {"s": 5}})
    capped = reader.latestOffset(end, ReadMaxRows(10_000))
    assert positions_of(capped) == {"s": 5}
    assert _values(reader, end, capped) == [(4, 4)]  # 5 is a dead letter
    assert reader.latestOffset(capped, ReadMaxRows(10_000)) == capped


def test_a_batch_after_a_full_one_is_read_while_that_one_runs_and_misses_nothing_since(
    source: dict[str, str], js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []  # the position each read-ahead starts after, in the background too
    read = broker_client.read_ahead

    async def counted(js: object, stream: str, after: int, count: int) -> object:
        if stream == stream_name(source["pipeline"], "s"):  # (not another test's reader)
            reads.append(after)
        return await read(js, stream, after, count)  # type: ignore[arg-type]

    monkeypatch.setattr("fogshift.broker.datasource.read_ahead", counted)
    reader = JetStreamReader(source)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(4))
    assert positions_of(first) == {"s": 4}
    # A full batch: the next one (5-7: a dead letter, an event, the fence marker) is read
    # at once, before anything asks for it.
    wait_until(lambda: 4 in reads, 10, describe="the read-ahead after 4")
    assert reads[0] == 0
    assert _values(reader, start, first) == [(1, 1), (2, 2), (3, 3), (4, 4)]
    pipeline = source["pipeline"]
    later = [Record(8, 0, 8, 1008.0, "s", json.dumps({"v": 8}), None)]
    js_client.run(lambda js: publish_records(js, pipeline, "s", later, epoch=2))
    # Stored after that read: the next batch still has it (read by a later round in the
    # background, or by the batch itself after what was read ahead).
    second = reader.latestOffset(first, ReadMaxRows(4))
    assert positions_of(second) == {"s": 8}
    assert reads.count(0) == 1 and reads.count(4) == 1
    assert _values(reader, first, second) == [(6, 6), (8, 8)]
    assert _values(JetStreamReader(source), first, second) == [(6, 6), (8, 8)]
    # A small batch is no sign of a backlog: nothing is read in the background after it.
    small = JetStreamReader(source)
    assert positions_of(small.latestOffset(start, ReadMaxRows(10_000))) == {"s": 8}
    assert small._prefetch is None
    # After a full batch with nothing more stored, the reading in the background stops by
    # itself (the input paused), taken or not.
    pending = reader._prefetch
    assert pending is not None and pending.after == 8
    wait_until(pending._future.done, 10, describe="the read-ahead after 8 to stop")
    assert reads.count(8) == READ_AHEAD_IDLE_ROUNDS
    reader.stop()


def test_a_read_ahead_that_failed_or_started_elsewhere_is_read_again(
    source: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    read = broker_client.read_ahead
    attempts: list[int] = []

    async def failing_once(js: object, stream: str, after: int, count: int) -> object:
        if stream != stream_name(source["pipeline"], "s"):
            return await read(js, stream, after, count)  # type: ignore[arg-type]
        attempts.append(after)
        if attempts.count(2) == 1 and after == 2:  # the read in the background after 2
            raise OSError("connection reset")
        return await read(js, stream, after, count)  # type: ignore[arg-type]

    monkeypatch.setattr("fogshift.broker.datasource.read_ahead", failing_once)
    reader = JetStreamReader(source)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(2))
    wait_until(lambda: 2 in attempts, 10, describe="the read-ahead after 2")
    second = reader.latestOffset(first, ReadMaxRows(2))
    assert attempts[:3] == [0, 2, 2]  # it failed, and the batch read for itself
    assert positions_of(second) == {"s": 4}
    assert _values(reader, first, second) == [(3, 3), (4, 4)]
    # Read ahead after 4, but the query restarted at 2: that read is not used.
    again = reader.latestOffset(first, ReadMaxRows(3))
    assert positions_of(again) == {"s": 5}
    assert _values(reader, first, again) == [(3, 3), (4, 4)]
    reader.stop()
    assert reader._prefetch is None


def test_behind_a_slow_link_a_batch_takes_what_was_read_and_waits_for_no_more(
    source: dict[str, str], js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A link of 0.5 s round trip, half each way, for this test's stream only.
    read = broker_client.read_ahead
    found: list[tuple[int, int]] = []  # (after, messages) of every read, as it ends

    async def far(js: object, stream: str, after: int, count: int) -> object:
        if stream != stream_name(source["pipeline"], "s"):
            return await read(js, stream, after, count)  # type: ignore[arg-type]
        await asyncio.sleep(0.25)
        got = await read(js, stream, after, count)  # type: ignore[arg-type]
        await asyncio.sleep(0.25)
        found.append((after, len(got)))
        return got

    monkeypatch.setattr("fogshift.broker.datasource.read_ahead", far)
    pipeline = source["pipeline"]

    def publish(k: int) -> None:
        event = [Record(k, 0, k, 1000.0 + k, "s", json.dumps({"v": k}), None)]
        js_client.run(lambda js: publish_records(js, pipeline, "s", event, epoch=2))

    reader = JetStreamReader(source)
    end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(10_000))
    assert positions_of(end) == {"s": 7}
    # Small batches read at planning, as on any link, until the reader knows its link.
    last = 7
    for _ in range(LINK_READS - 1):
        assert reader._prefetch is None
        last += 1
        publish(last)
        end = reader.latestOffset(end, ReadMaxRows(10_000))
        assert positions_of(end) == {"s": last}
    assert reader._prefetch is not None  # slow: it reads ahead after a small batch too
    publish(last + 1)
    wait_until(lambda: (last, 1) in found, 10, describe="the read in the background")
    publish(last + 2)
    # The batch takes what was read (last + 1), not what the read under way brings: it
    # waits for no round trip; last + 2 is the next batch's.
    batch = reader.latestOffset(end, ReadMaxRows(10_000))
    assert positions_of(batch) == {"s": last + 1}
    assert _values(reader, end, batch) == [(last + 1, last + 1)]
    following = reader.latestOffset(batch, ReadMaxRows(10_000))
    assert positions_of(following) == {"s": last + 2}
    assert _values(reader, batch, following) == [(last + 2, last + 2)]
    # The same batch re-executed elsewhere reads the same rows.
    assert _values(JetStreamReader(source), end, batch) == [(last + 1, last + 1)]
    reader.stop()
