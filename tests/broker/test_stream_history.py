"""Trimming a PE's stream (fogshift.broker.history) against a real nats-server."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from fogshift.broker.client import SyncJetStream, ensure_pe_stream, get_range
from fogshift.broker.datasource import JetStreamReader, offset
from fogshift.broker.history import Trimmed, trim_data, trim_dead, trimmed_below
from fogshift.broker.naming import data_subject, dead_subject, keys_subject, stream_name
from fogshift.broker.publish import Record, publish_records, read_tail
from fogshift.broker.server import BrokerProcess
from fogshift.exceptions import InvariantViolation

pytestmark = pytest.mark.integration


def _records(origins: range) -> list[Record]:
    return [Record(o, 0, o, 1000.0 + o, "w", json.dumps({"v": o}), None) for o in origins]


def _stream(js_client: SyncJetStream, pipeline: str) -> str:
    js_client.run(lambda js: ensure_pe_stream(js, pipeline, "w"))
    return stream_name(pipeline, "w")


def _data_seqs(js_client: SyncJetStream, pipeline: str) -> list[int]:
    stream, subject = stream_name(pipeline, "w"), data_subject(pipeline, "w")
    return [m.seq for m in js_client.run(lambda js: get_range(js, stream, subject, 0, 10_000))]


def _append(js_client: SyncJetStream, pipeline: str, origins: range) -> int:
    return int(
        js_client.run(lambda js: publish_records(js, pipeline, "w", _records(origins), epoch=1))
    )


def _trim(js_client: SyncJetStream, pipeline: str, horizon: int, cutoff: float) -> Trimmed:
    return js_client.run(lambda js: trim_data(js, pipeline, "w", horizon, cutoff))


def test_old_records_below_the_horizon_go_the_last_and_the_key_moves_stay(
    js_client: SyncJetStream,
) -> None:
    stream = _stream(js_client, "hist")
    assert _append(js_client, "hist", range(1, 11)) == 10
    keys = keys_subject("hist", "w")

    async def key_move(js: Any) -> int:
        return int((await js.publish(keys, b'{"type": "key-move"}', stream=stream)).seq)

    moved = js_client.run(key_move)
    seqs = _data_seqs(js_client, "hist")
    tail = js_client.run(lambda js: read_tail(js, stream))
    later = time.time() + 60  # every record is old

    # Below the horizon only: the records a reader may still read from there stay.
    assert _trim(js_client, "hist", seqs[5], later) == Trimmed(5, seqs[5])
    assert _data_seqs(js_client, "hist") == seqs[5:]
    # Past every record: all but the last go; the key move is no data record.
    assert _trim(js_client, "hist", moved + 100, later) == Trimmed(4, seqs[-1])
    assert _data_seqs(js_client, "hist") == seqs[-1:]
    assert _trim(js_client, "hist", moved + 100, later) == Trimmed(0, 0)
    found = js_client.run(lambda js: get_range(js, stream, keys, 0, moved))
    assert [m.seq for m in found] == [moved]
    # The writer's tail is as it was: its next batch appends exactly what is new.
    assert js_client.run(lambda js: read_tail(js, stream)) == tail
    assert _append(js_client, "hist", range(8, 13)) == 2


def test_only_records_older_than_the_cutoff_go(js_client: SyncJetStream) -> None:
    _stream(js_client, "young")
    _append(js_client, "young", range(1, 4))
    time.sleep(0.01)  # (the broker's clock is this machine's: stored before the cutoff)
    cutoff = time.time()
    time.sleep(0.01)
    _append(js_client, "young", range(4, 7))
    seqs = _data_seqs(js_client, "young")
    assert _trim(js_client, "young", 1_000, cutoff) == Trimmed(3, seqs[3])
    assert _data_seqs(js_client, "young") == seqs[3:]
    # Nothing older is left: nothing more goes, whatever the horizon.
    assert _trim(js_client, "young", 1_000, cutoff) == Trimmed(0, 0)
    # An empty stream has nothing to trim.
    _stream(js_client, "empty")
    assert _trim(js_client, "empty", 1_000, time.time() + 60) == Trimmed(0, 0)


def test_a_reader_starting_below_the_trimmed_records_fails_loudly(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    stream = _stream(js_client, "hole")
    _append(js_client, "hole", range(1, 11))
    seqs = _data_seqs(js_client, "hole")
    assert js_client.run(lambda js: trimmed_below(js, stream)) == 0
    assert _trim(js_client, "hole", seqs[4], time.time() + 60) == Trimmed(4, seqs[4])
    assert js_client.run(lambda js: trimmed_below(js, stream)) == seqs[4]
    broker = str(nats_server.address.save(tmp_path / "broker.json"))

    def reader() -> JetStreamReader:
        return JetStreamReader({"broker": broker, "pipeline": "hole", "pe": "next",
                                "inputs": "w", "epoch": "1"})  # fmt: skip

    def start(at: int) -> dict[str, Any]:
        return dict(reader().latestOffset(offset({"w": at}), ReadMaxRows(100)))

    # From a checkpoint the trimming left records for: reads on to the end.
    assert start(seqs[4] - 1)["positions"] == {"w": seqs[-1]}
    # From below (its checkpoint lost): the records between are gone, and it says so.
    with pytest.raises(InvariantViolation, match="trimmed"):
        start(0)
    # A batch planned before a restart is run again without a latestOffset first.
    with pytest.raises(InvariantViolation, match="trimmed"):
        reader().partitions(offset({"w": 0}), offset({"w": seqs[-1]}))
    assert reader().partitions(offset({"w": seqs[4] - 1}), offset({"w": seqs[-1]}))


def test_old_dead_letters_go_but_the_last(js_client: SyncJetStream) -> None:
    stream = _stream(js_client, "dead")
    records = [
        Record(o, 0, o, 1.0, "w", json.dumps({"v": o}), "bad" if o % 2 else None)
        for o in range(1, 9)
    ]
    js_client.run(lambda js: publish_records(js, "dead", "w", records, epoch=1))
    tail = js_client.run(lambda js: read_tail(js, stream))
    subject = dead_subject("dead", "w")
    dead = [m.seq for m in js_client.run(lambda js: get_range(js, stream, subject, 0, 99))]
    data = _data_seqs(js_client, "dead")
    assert len(dead) == 4 and js_client.run(lambda js: trim_dead(js, "dead", "w", 0.0)) == 0
    assert js_client.run(lambda js: trim_dead(js, "dead", "w", time.time() + 60)) == 3
    left = [m.seq for m in js_client.run(lambda js: get_range(js, stream, subject, 0, 99))]
    assert left == dead[-1:]
    assert _data_seqs(js_client, "dead") == data  # data records are another matter
    assert js_client.run(lambda js: read_tail(js, stream)) == tail


def test_a_stream_that_is_not_there_has_nothing_to_trim(js_client: SyncJetStream) -> None:
    # (A raw exception and its traceback were logged every round.)
    later = time.time() + 60
    assert js_client.run(lambda js: trim_dead(js, "gone", "w", later)) == 0
    assert js_client.run(lambda js: trim_data(js, "gone", "w", 10, later)) == Trimmed(0, 0)
