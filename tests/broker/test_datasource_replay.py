"""A PE with several inputs replays logged cuts, several in one batch when it is behind the log:
the same rows in the same order with the same origins as cut by cut. Against a real
nats-server; the reader is called as Spark's planner and executor would call it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from fogshift.broker import datasource, publish
from fogshift.broker.client import (
    BrokerAddress,
    SyncJetStream,
    delete_pe_stream,
    ensure_pe_stream,
    shared_client,
    stamp_nanos,
    stored_stamp,
)
from fogshift.broker.datasource import JetStreamReader, cut_of, positions_of
from fogshift.broker.keys import KeyMove
from fogshift.broker.naming import data_subject, keys_subject, stream_name
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import BrokerProcess
from fogshift.common.gate import write_gate

pytestmark = pytest.mark.integration

#: Each cut's (start, end) positions of inputs a and b.
CUTS = [
    ({"a": 0, "b": 0}, {"a": 2, "b": 1}),
    ({"a": 2, "b": 1}, {"a": 3, "b": 3}),
    ({"a": 3, "b": 3}, {"a": 5, "b": 4}),
]


@pytest.fixture
def logged(js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path) -> dict[str, str]:
    """Inputs a (5 events) and b (4 events) of PE m in pipeline ``replay``, m's three cuts
    logged; the reader's options."""
    for name, count in (("a", 5), ("b", 4)):
        js_client.run(lambda js, n=name: ensure_pe_stream(js, "replay", n))
        rows = [
            Record(k, 0, k, 1000.0 + k, name, json.dumps({"v": f"{name}{k}"}), None)
            for k in range(1, count + 1)
        ]
        js_client.run(lambda js, n=name, r=rows: publish_records(js, "replay", n, r, epoch=1))
    js_client.run(lambda js: delete_pe_stream(js, "replay", "m"))  # (each test logs anew)
    js_client.run(lambda js: ensure_pe_stream(js, "replay", "m"))
    after = 0
    for start, end in CUTS:
        after = js_client.run(
            lambda js, s=start, e=end, a=after: publish.append_cut(js, "replay", "m", 1, s, e, a)
        )
    broker = nats_server.address.save(tmp_path / "broker.json")
    return {"broker": str(broker), "pipeline": "replay", "pe": "m", "inputs": "a,b",
            "epoch": "2", "gate": str(tmp_path / "gate")}  # fmt: skip


def _rows(reader: JetStreamReader, start: dict, end: dict) -> list[tuple[int, str]]:
    """``(origin, body value)`` of the batch ``(start, end]``, as an executor reads it."""
    (partition,) = reader.partitions(start, end)
    rows = [row for batch in reader.read(partition) for row in batch.to_pylist()]
    return [(row["origin"], json.loads(row["body"])["v"]) for row in rows]


def _cut_by_cut() -> list[tuple[int, str]]:
    """The reference: each cut alone, inputs one after the other, origin = the sum of the
    positions once the row is consumed."""
    out = []
    for start, end in CUTS:
        for seq in range(start["a"] + 1, end["a"] + 1):
            out.append((seq + start["b"], f"a{seq}"))
        for seq in range(start["b"] + 1, end["b"] + 1):
            out.append((end["a"] + seq, f"b{seq}"))
    return out


def test_a_reader_behind_the_log_replays_every_cut_in_one_batch_in_order(
    logged: dict[str, str],
) -> None:
    reader = JetStreamReader(logged)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10_000))
    assert positions_of(end) == CUTS[-1][1] and cut_of(end) > 0
    rows = _rows(reader, start, end)
    assert rows == _cut_by_cut()
    assert [origin for origin, _ in rows] == list(range(1, 10))  # strictly growing, no gap
    # A re-execution of the batch (another process: nothing planned there) reads the same.
    assert _rows(JetStreamReader(logged), start, end) == rows
    # Nothing left to replay and no new input: no batch.
    assert reader.latestOffset(end, ReadMaxRows(10_000)) == end


def test_the_read_limit_and_a_cap_end_a_batch_at_a_cut(logged: dict[str, str]) -> None:
    reader = JetStreamReader(logged)
    start = reader.initialOffset()
    # Four events at most: the first cut (three) fits, the second would not.
    first = reader.latestOffset(start, ReadMaxRows(4))
    assert positions_of(first) == CUTS[0][1]
    # A cap at the second cut's end (a standby following an instance): two cuts, not three.
    write_gate(logged["gate"], "cap", {"type": "jetstream", "positions": CUTS[1][1]})
    capped = reader.latestOffset(start, ReadMaxRows(10_000))
    assert positions_of(capped) == CUTS[1][1]
    assert _rows(reader, start, capped) == _cut_by_cut()[:6]
    assert reader.latestOffset(capped, ReadMaxRows(10_000)) == capped  # held at the cap


def test_an_idle_reader_answers_as_soon_as_input_arrives(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    for pe in ("waiting", "w_in"):
        js_client.run(lambda js, pe=pe: ensure_pe_stream(js, "replay", pe))
    broker = nats_server.address.save(tmp_path / "broker.json")
    reader = JetStreamReader({"broker": str(broker), "pipeline": "replay", "pe": "waiting",
                              "inputs": "w_in", "idle_wait_ms": "300"})  # fmt: skip
    start = reader.initialOffset()
    limit = reader.getDefaultReadLimit()
    # Nothing arrives: it waits, then answers "nothing".
    began = time.monotonic()
    assert reader.latestOffset(start, limit) == start
    assert time.monotonic() - began >= 0.3
    # Input arrives while it waits: it answers then, long before its wait is over.
    reader.idle_wait_s = 20.0
    later = threading.Timer(
        0.5, lambda: js_client.run(lambda js: publish_records(js, "replay", "w_in", [
            Record(1, 0, 1, 0.0, "w_in", json.dumps({"v": 1}))]))
    )  # fmt: skip
    later.start()
    began = time.monotonic()
    assert positions_of(reader.latestOffset(start, limit)) == {"w_in": 1}
    assert time.monotonic() - began < 10
    later.join()
    # Stopped, it leaves no subscription behind on the process's shared connection (which
    # outlives it: a runner's next reader would keep adding some).
    connection = shared_client(BrokerAddress.load(broker)).connection
    subscribed = [s.subject for s in connection._subs.values()]  # (nats-py's own listing)
    assert data_subject("replay", "w_in") in subscribed
    reader.stop()
    assert data_subject("replay", "w_in") not in [s.subject for s in connection._subs.values()]


def test_the_partitions_of_one_element_meet_a_reader_merged_by_input_position(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # Two partitions' records, each in its own input-position order (a key moved between
    # them has its earlier records on one, its later on the other), and a third input.
    made = {"p0": [1, 4, 5], "p1": [2, 3, 6], "x": [1, 2]}
    for name, origins in made.items():
        js_client.run(lambda js, n=name: ensure_pe_stream(js, "merge", n))
        rows = [
            Record(o, 0, o, 1000.0 + o, name, json.dumps({"v": f"{name}@{o}"}), None)
            for o in origins
        ]
        js_client.run(lambda js, n=name, r=rows: publish_records(js, "merge", n, r, epoch=1))
    js_client.run(lambda js: ensure_pe_stream(js, "merge", "sink"))
    broker = nats_server.address.save(tmp_path / "broker.json")
    options = {"broker": str(broker), "pipeline": "merge", "pe": "sink", "epoch": "1",
               "inputs": "p0,p1,x", "merged": "p0|p1", "gate": str(tmp_path / "gate")}  # fmt: skip
    reader = JetStreamReader(options)
    start = reader.initialOffset()
    # (Within the read limit: each input whole. Beyond it, see the test after.)
    end = reader.latestOffset(start, ReadMaxRows(8))
    assert positions_of(end) == {"p0": 3, "p1": 3, "x": 2}
    rows = _rows(reader, start, end)
    assert [v for _, v in rows] == ["p0@1", "p1@2", "p1@3", "p0@4", "p0@5", "p1@6", "x@1", "x@2"]
    origins = [o for o, _ in rows]
    assert origins == sorted(set(origins)) and origins[-1] == 3 + 3 + 2
    # A re-execution in another process: the same rows, the same origins.
    assert _rows(JetStreamReader(options), start, end) == rows


def test_merged_partitions_far_behind_are_read_to_one_moment_within_the_limit(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    """A consumer of a scaled element far behind read its whole backlog in one batch (the
    read limit never applied to partitions): now each batch ends where every partition
    stood at one moment of the broker's clock — a snapshot still — within the limit."""
    # p0's records, then p1's, then p0's again: a partition's later records stored after
    # the other's.
    for name, count in (("p0", 6), ("p1", 6), ("p0", 6)):
        js_client.run(lambda js, n=name: ensure_pe_stream(js, "behind", n))

        async def append(js: Any, n: str = name, c: int = count) -> None:
            for _ in range(c):
                await js.publish(data_subject("behind", n), b"{}", stream=stream_name("behind", n))

        js_client.run(append)

    def stamp(name: str, seq: int) -> str | None:
        return js_client.run(lambda js: stored_stamp(js, stream_name("behind", name), seq))

    stamps = {name: [stamp(name, seq) or "" for seq in range(1, last + 1)]
              for name, last in (("p0", 12), ("p1", 6))}  # fmt: skip
    broker = nats_server.address.save(tmp_path / "broker.json")
    options = {"broker": str(broker), "pipeline": "behind", "pe": "sink", "epoch": "1",
               "inputs": "p0,p1", "merged": "p0|p1", "gate": str(tmp_path / "gate")}  # fmt: skip
    reader = JetStreamReader(options)
    # Within the limit, or no limit: the tails as they are.
    assert reader._available(js_client, {}, ReadMaxRows(18), None) == {"p0": 12, "p1": 6}
    assert reader._available(js_client, {}, ReadAllAvailable(), None) == {"p0": 12, "p1": 6}
    begin: dict[str, int] = {"p0": 0, "p1": 0}
    batches = []
    while begin != {"p0": 12, "p1": 6}:
        end = reader._available(js_client, begin, ReadMaxRows(8), None)
        assert end is not None
        size = sum(end[n] - begin[n] for n in end)
        assert 0 < size <= 8, (begin, end)
        # One moment: every record within it stored before every record after it.
        inside = [stamp_nanos(s) for n in end for s in stamps[n][: end[n]]]
        outside = [stamp_nanos(s) for n in end for s in stamps[n][end[n] :]]
        assert max(inside) < min(outside, default=max(inside) + 1), (begin, end)
        batches.append(end)
        begin = end
    # p0's first four (an even share of 8), then up to p1's fourth (p0's first six were
    # stored before it), then the rest.
    assert batches[:2] == [{"p0": 4, "p1": 0}, {"p0": 6, "p1": 4}], batches


def test_inputs_far_behind_share_the_read_limit(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    """Each input of a PE took the whole read limit: one of three inputs all far behind read
    three times the limit in a batch. Now they share it, the least behind first."""
    pipeline = f"share{uuid.uuid4().hex[:6]}"
    for name, count in (("a", 10), ("b", 10), ("c", 2)):
        js_client.run(lambda js, n=name: ensure_pe_stream(js, pipeline, n))
        rows = [Record(k, 0, k, 1000.0 + k, name, "{}", None) for k in range(1, count + 1)]
        js_client.run(lambda js, n=name, r=rows: publish_records(js, pipeline, n, r, epoch=1))
    options = {"broker": str(nats_server.address.save(tmp_path / "broker.json")),
               "pipeline": pipeline, "pe": "m", "inputs": "a,b,c", "epoch": "1",
               "gate": str(tmp_path / "gate")}  # fmt: skip
    reader = JetStreamReader(options)
    begin = {"a": 0, "b": 0, "c": 0}
    # c's two, then a and b an even share of the other eight.
    assert reader._available(js_client, begin, ReadMaxRows(10), None) == {"a": 4, "b": 4, "c": 2}
    assert reader._available(js_client, begin, ReadMaxRows(100), None) == {"a": 10, "b": 10,
                                                                           "c": 2}  # fmt: skip
    # Below one record each: one each all the same (no input waits for the others).
    assert reader._available(js_client, begin, ReadMaxRows(2), None) == {"a": 1, "b": 1, "c": 1}


def test_a_cut_an_older_instance_logs_while_the_newer_plans_is_followed_not_forked(
    js_client: SyncJetStream,
    nats_server: BrokerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handover runs both instances: the older (epoch 1) logs the next cut between the
    newer's (epoch 2) look at the log and its own append. The newer follows that cut; a
    second cut from the same start would fork the log, which every replay refuses."""
    pipeline = f"fork{uuid.uuid4().hex[:6]}"
    for name, count in (("a", 3), ("b", 2)):
        js_client.run(lambda js, n=name: ensure_pe_stream(js, pipeline, n))
        rows = [Record(k, 0, k, 1000.0 + k, name, json.dumps({"v": f"{name}{k}"}), None)
                for k in range(1, count + 1)]  # fmt: skip
        js_client.run(lambda js, n=name, r=rows: publish_records(js, pipeline, n, r, epoch=1))
    js_client.run(lambda js: ensure_pe_stream(js, pipeline, "m"))
    options = {"broker": str(nats_server.address.save(tmp_path / "broker.json")),
               "pipeline": pipeline, "pe": "m", "inputs": "a,b", "epoch": "2",
               "gate": str(tmp_path / "gate")}  # fmt: skip
    older = ({"a": 0, "b": 0}, {"a": 2, "b": 0})
    logged: list[int] = []
    real = datasource.append_cut

    async def raced(js: Any, **kwargs: Any) -> int:
        logged.append(await publish.append_cut(js, pipeline, "m", 1, *older, after=0))
        return await real(js, **kwargs)

    monkeypatch.setattr(datasource, "append_cut", raced)
    reader = JetStreamReader(options)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10_000))
    assert positions_of(end) == older[1] and cut_of(end) == logged[0]
    assert _rows(reader, start, end) == [(1, "a1"), (2, "a2")]
    cut = js_client.run(lambda js: publish.next_cut(js, pipeline, "m", 0))
    assert (cut.seq, cut.epoch) == (logged[0], 1)
    assert js_client.run(lambda js: publish.next_cut(js, pipeline, "m", cut.seq)) is None
    # The newer goes on from there, and a replay from the start reads the same history.
    monkeypatch.setattr(datasource, "append_cut", real)
    last = reader.latestOffset(end, ReadMaxRows(10_000))
    assert positions_of(last) == {"a": 3, "b": 2}
    again = JetStreamReader(options)
    assert again.latestOffset(start, ReadMaxRows(10_000)) == last
    assert [v for _, v in _rows(again, start, last)] == ["a1", "a2", "a3", "b1", "b2"]


def test_a_pipeline_deployed_again_has_its_key_moves_read_anew(js_client: SyncJetStream) -> None:
    """Spark's Python workers outlive queries: the moves a worker read of a stream are not
    those of the stream of the same name that a new deployment (new epochs) made."""
    pipeline = f"again{uuid.uuid4().hex[:6]}"

    def deploy_with(move: KeyMove, padding: int) -> None:
        js_client.run(lambda js: delete_pe_stream(js, pipeline, "src"))
        js_client.run(lambda js: ensure_pe_stream(js, pipeline, "src"))
        for _ in range(padding):  # events before the move, so it lands at another sequence
            js_client.run(lambda js: js.publish(data_subject(pipeline, "src"), b"{}"))
        js_client.run(lambda js: js.publish(keys_subject(pipeline, "src"), move.payload()))

    def moves(epoch: int, reader: str) -> list[Any]:
        return datasource._moves_until(js_client, pipeline, "src", "agg", 100, epoch, reader)

    first = KeyMove(0, "m1", "agg", ("s1",), 1)
    deploy_with(first, padding=4)
    (read,) = moves(3, "agg-p0")
    assert (read.move, read.seq) == ("m1", 5)
    (read,) = moves(2, "agg-p1")  # (cached for this partition too)
    assert (read.move, read.seq) == ("m1", 5)
    second = KeyMove(0, "m2", "agg", ("s2",), 0)
    deploy_with(second, padding=1)
    (read,) = moves(4, "agg-p0")
    assert (read.move, read.seq, read.keys) == ("m2", 2, ("s2",))
    # Epochs are counted per PE: the other partition's new epoch may be one this partition
    # had in the run before (p0 migrated there under 3; p1 now 3, deployed again).
    (read,) = moves(3, "agg-p1")
    assert (read.move, read.seq, read.keys) == ("m2", 2, ("s2",))


class _Tails:
    """A client whose streams grow by one message at each look, counting round trips."""

    def __init__(self, grow: bool) -> None:
        self.grow, self.looks, self.trips = grow, 0, 0

    def run(self, make: Any, timeout: float = 30, **_: Any) -> Any:
        self.trips += 1

        async def stream_info(stream: str) -> Any:
            self.looks += 1
            last = self.looks if self.grow else 7
            return SimpleNamespace(state=SimpleNamespace(last_seq=last))

        return asyncio.run(make(SimpleNamespace(stream_info=stream_info)))


async def _no_cut(js: Any, **_: Any) -> None:
    return None


def test_merged_partitions_tails_are_read_in_one_round_trip_and_a_moving_read_is_told(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = JetStreamReader.__new__(JetStreamReader)
    reader.pipeline, reader.pe = "p", "sink"
    reader.inputs = ["agg-p0", "agg-p1"]
    reader.merged = [("agg-p0", "agg-p1")]
    still = _Tails(grow=False)
    assert reader._tails(still) == {"agg-p0": 7, "agg-p1": 7}
    assert still.trips == 2  # two collects that agree, each one round trip for both tails
    # Tails that never stood still are no snapshot: no batch is cut from them (it could
    # hold a moved key's first record on its target, not its last on its origin).
    busy = _Tails(grow=True)
    with caplog.at_level("WARNING"):
        assert reader._tails(busy) is None
    assert busy.trips == datasource.SNAPSHOT_TRIES + 1
    assert "never stood still" in caplog.text
    reader.gate, reader.partition, reader._parts_ahead = None, None, None
    reader._reads_ahead, reader._idle = False, True
    monkeypatch.setattr(datasource, "shared_client", lambda _broker: _Tails(grow=True))
    monkeypatch.setattr(datasource, "next_cut", _no_cut)
    reader.broker = None
    start = datasource.offset({"agg-p0": 0, "agg-p1": 0}, cut=0)
    assert reader._latest_cut(start, ReadAllAvailable()) == start
