"""A partition's planner fetches the parts of the key states addressed to it as the broker
stores them (``fogshift.broker.parts_ahead``), and its batch then reads the same rows as one
that reads every part itself. Against a real nats-server; the reader is called as Spark's
planner and executor would call it."""

from __future__ import annotations

import base64
import itertools
import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from fogshift.broker.client import SyncJetStream, ensure_pe_stream, subject_count
from fogshift.broker.datasource import JetStreamPartition, JetStreamReader, Range, positions_of
from fogshift.broker.keys import (
    CONTROL_FIELD,
    KEY_STATE,
    KeyCopy,
    KeyMove,
    Ownership,
    state_parts,
    state_payload,
)
from fogshift.broker.naming import (
    data_subject,
    key_state_subject,
    keys_subject,
    state_subject,
    stream_name,
)
from fogshift.broker.parts_ahead import PARTS_WAIT_S, PartsAhead
from fogshift.broker.server import BrokerProcess
from fogshift.common.waiting import wait_until
from fogshift.spec.models import partition_of_key

pytestmark = pytest.mark.integration
_pipelines = (f"parts{n}" for n in itertools.count())


class Input:
    """Input ``src`` of a partitioned PE ``pe`` (two partitions) in a pipeline of its own."""

    def __init__(self, js: SyncJetStream) -> None:
        self.js, self.pipeline = js, next(_pipelines)
        self.stream = stream_name(self.pipeline, "src")
        js.run(lambda j: ensure_pe_stream(j, self.pipeline, "src"))

    def publish(self, subject: str, data: bytes) -> int:
        async def go(j: Any) -> int:
            return int((await j.publish(subject, data, stream=self.stream)).seq)

        return self.js.run(go)

    def event(self, key: str) -> int:
        body = {"seq": 0, "timestamp": 1.0, "creator": "src",
                "body": json.dumps({"patient": key})}  # fmt: skip
        return self.publish(data_subject(self.pipeline, "src"), json.dumps(body).encode())

    def moving_to_one(self) -> str:
        """A key of partition 0 (of two), moved to partition 1 here (its state comes from
        partition 0)."""
        key = next(k for k in "bcdefgh" if partition_of_key(k, 2) == 0)
        self.publish(
            keys_subject(self.pipeline, "src"), KeyMove(0, "m1", "pe", (key,), 1).payload()
        )
        return key

    def state(self, key: str, to: int, state: dict[str, str], element: str = "pe") -> list[int]:
        """A large state of ``key`` for partition ``to`` of ``element``, as an origin sends
        it: its parts on ``to``'s subject, then its record; the parts' sequences."""
        packed = state_parts(state)
        assert packed is not None and len(packed[0]) >= 2  # large enough for two parts
        bodies, raw = packed
        subject = state_subject(self.pipeline, "src", to, element)
        parts = [self.publish(subject, b) for b in bodies]
        self.publish(
            key_state_subject(self.pipeline, "src", f"{element}-p{1 - to}"),
            state_payload("m1", element, key, to, None, parts, size=sum(map(len, bodies)), raw=raw),
        )
        return parts


def big_state(seed: int) -> dict[str, str]:
    # Random text: compressed it still needs two parts of 512 KiB.
    return {"count": str(seed), "ballast": base64.b64encode(os.urandom(1_000_000)).decode()}


def test_parts_addressed_to_a_partition_are_read_as_stored_and_only_those(
    js_client: SyncJetStream, nats_server: BrokerProcess
) -> None:
    src = Input(js_client)
    src.event("a")
    theirs = src.state("b", 0, big_state(0))  # another partition's: never read here
    # Another partitioned element's partition 1's (reading the same input): nor those.
    others = src.state("d", 1, big_state(3), element="other")
    ahead = PartsAhead(js_client, src.stream, state_subject(src.pipeline, "src", 1, "pe"), 0)
    try:
        mine = src.state("a", 1, big_state(1))
        # What a precopy watches to know the origin is sending (keymoves._await_sending).
        counted = [state_subject(src.pipeline, "src", to, e)
                   for to, e in ((0, "pe"), (1, "other"), (1, "pe"))]  # fmt: skip
        assert [js_client.run(partial(subject_count, stream=src.stream, subject=subject))
                for subject in counted] == [len(theirs), len(others), len(mine)]  # fmt: skip
        wait_until(lambda: ahead.held() == mine, 30, describe="partition 1's parts held")
        assert ahead.take([*theirs, *others, *mine]).keys() == set(mine)
        assert ahead.held() == [] and ahead.take(mine) == {}  # handed over once
        later = src.state("c", 1, big_state(2))  # it goes on reading
        wait_until(lambda: ahead.held() == later, 30, describe="the later parts held")
        # Parts that will not come here (on no subject it reads): nothing to hand over, once
        # a read begun after the ask found nothing, well before the longest wait.
        asked = time.monotonic()
        assert ahead.take([later[-1] + 100]) == {}
        assert time.monotonic() - asked < PARTS_WAIT_S / 2
    finally:
        ahead.stop()


def test_a_batch_waits_for_parts_being_read_instead_of_reading_them_again(
    js_client: SyncJetStream, nats_server: BrokerProcess
) -> None:
    src = Input(js_client)
    mine = src.state("a", 1, big_state(1))
    # Asked at once, before a read could have brought them: the take waits for the reads.
    ahead = PartsAhead(js_client, src.stream, state_subject(src.pipeline, "src", 1, "pe"), 0)
    try:
        assert ahead.take(mine).keys() == set(mine)
    finally:
        ahead.stop()
    # Stopped, it hands over what it holds without waiting for the reads.
    asked = time.monotonic()
    assert ahead.take([mine[-1] + 1]) == {}
    assert time.monotonic() - asked < PARTS_WAIT_S / 2


def partition_one(
    src: Input, nats_server: BrokerProcess, tmp_path: Path
) -> tuple[JetStreamReader, Any]:
    """Partition 1 of ``pe`` (two partitions) reading ``src``, its planner reading ahead;
    its first offset."""
    broker = nats_server.address.save(tmp_path / "broker.json")
    reader = JetStreamReader({
        "broker": str(broker), "pipeline": src.pipeline, "pe": "pe-p1", "inputs": "src",
        "epoch": "1", "partition": "pe:1:2", "key_by": "patient",
    })  # fmt: skip
    start = reader.initialOffset()
    reader.latestOffset(start, ReadMaxRows(10_000))  # the planner starts reading ahead
    return reader, start


def next_batch(reader: JetStreamReader, start: Any) -> tuple[JetStreamPartition, Any, list[Any]]:
    """The partition's next batch from ``start``, as Spark would run it: planned (its one
    partition), its end offset, and its rows as an executor reads them."""
    end = reader.latestOffset(start, ReadMaxRows(10_000))
    (planned,) = reader.partitions(start, end)
    assert isinstance(planned, JetStreamPartition)
    return planned, end, [row for batch in reader.read(planned) for row in batch.to_pylist()]


def test_a_batch_with_parts_fetched_ahead_reads_what_one_reading_them_itself_reads(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    src = Input(js_client)
    src.event("a")
    reader, start = partition_one(src, nats_server, tmp_path)
    try:
        state = big_state(7)
        key = src.moving_to_one()
        parts = src.state(key, 1, state)
        src.event(key)
        wait_until(lambda: reader._parts_ahead is not None and reader._parts_ahead.held() == parts,
                   30, describe="the planner holds the parts")  # fmt: skip
        planned, end, ahead = next_batch(reader, start)
        assert planned.keys is not None and sorted(planned.parts) == parts
        # The reference: the same batch read by an executor that fetches every part itself.
        rng = Range("src", positions_of(start)["src"], positions_of(end)["src"])
        itself = [row for b in reader.read(JetStreamPartition([[rng]])) for row in b.to_pylist()]
        assert ahead == itself
        (arrived,) = [row for row in ahead if row["creator"] == KEY_STATE]
        assert json.loads(arrived["body"])[CONTROL_FIELD]["state"] == state
    finally:
        reader.stop()


def test_a_state_an_older_fogshift_sent_is_read_where_it_put_the_parts(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # Until 2026-12-02 a state's parts went on `.state.<to>` (every element's partition
    # `to`), its record saying "addressed" only. An input holding one (a restore, or a
    # partition catching up, reads it again) still gives the key its whole state: the
    # batch reads the parts there itself, and the planner waits for none.
    src = Input(js_client)
    src.event("a")
    reader, start = partition_one(src, nats_server, tmp_path)
    try:
        state = big_state(8)
        key = src.moving_to_one()
        packed = state_parts(state)
        assert packed is not None
        bodies, raw = packed
        parts = [src.publish(state_subject(src.pipeline, "src", 1), b) for b in bodies]
        sent = json.loads(state_payload("m1", "pe", key, 1, None, parts,
                                        size=sum(map(len, bodies)), raw=raw))  # fmt: skip
        assert sent.pop("scoped") is True and sent["addressed"] is True
        src.publish(key_state_subject(src.pipeline, "src", "pe-p0"), json.dumps(sent).encode())
        src.event(key)
        planned, _, rows = next_batch(reader, start)
        assert planned.keys and planned.parts == {}
        (arrived,) = [row for row in rows if row["creator"] == KEY_STATE]
        assert json.loads(arrived["body"])[CONTROL_FIELD]["state"] == state
    finally:
        reader.stop()


def test_a_move_request_wakes_the_reads_of_an_idle_partition(
    js_client: SyncJetStream, nats_server: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Idle, it reads seldom (here: never again within the test); a wake reads at once.
    monkeypatch.setattr("fogshift.broker.parts_ahead.PARTS_IDLE_POLL_S", 600.0)
    src = Input(js_client)
    ahead = PartsAhead(js_client, src.stream, state_subject(src.pipeline, "src", 1, "pe"), 0)
    try:
        wait_until(lambda: ahead.reads >= 1, 30, describe="the first read")
        mine = src.state("a", 1, big_state(1))
        assert ahead.held() == []
        ahead.wake()
        wait_until(lambda: ahead.held() == mine, 30, describe="the parts read once woken")
    finally:
        ahead.stop()


def test_a_precopy_sees_the_origin_send_a_requests_copies_by_their_parts(
    js_client: SyncJetStream, nats_server: BrokerProcess
) -> None:
    # keymoves._await_sending: the next request goes in once the parts subject grows (the
    # origin's batch answering this one runs); not if the copies are stored without.
    from fogshift.orchestrator.keymoves import KeyMoves

    src = Input(js_client)
    moves: Any = KeyMoves.__new__(KeyMoves)
    moves.broker = js_client
    owners = Ownership(1)  # (the registry's part: partition 0 owns "a" and sends its copy)
    owners.request(KeyCopy(0, "c1", "pe", ("a",), 1))
    moves._ownership = lambda *args: owners
    parts = (src.stream, state_subject(src.pipeline, "src", 1, "pe"))
    at = src.publish(keys_subject(src.pipeline, "src"),
                     KeyCopy(0, "c1", "pe", ("a",), 1).payload())  # fmt: skip
    src.state("z", 1, big_state(1))  # another request's parts, counted before
    before = js_client.run(partial(subject_count, stream=parts[0], subject=parts[1]))
    assert not moves._await_sending(src.pipeline, "src", "c1", at, ["a"], parts, before,
                                    time.monotonic() + 0.5)  # fmt: skip
    src.publish(parts[1], b"a part")
    assert moves._await_sending(src.pipeline, "src", "c1", at, ["a"], parts, before,
                                time.monotonic() + 30)  # fmt: skip
    # Its copy stored inline, no part after the count: not sending, and no wait for one.
    small = state_payload("c1", "pe", "a", 1, {"v": "1"})
    src.publish(key_state_subject(src.pipeline, "src", "pe-p0"), small)
    now = before + 1
    asked = time.monotonic()
    assert not moves._await_sending(src.pipeline, "src", "c1", at, ["a"], parts, now,
                                    time.monotonic() + 30)  # fmt: skip
    assert time.monotonic() - asked < 15


def test_the_planner_waits_for_no_part_a_forged_state_names(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # A state from a partition that did not own its key is never installed; the planner
    # must not wait for the parts it names either (each batch would wait PARTS_WAIT_S).
    src = Input(js_client)
    reader, start = partition_one(src, nats_server, tmp_path)
    try:
        key = src.moving_to_one()
        forged = state_payload("m1", "pe", key, 1, None, [999_998, 999_999], size=10, raw=10)
        src.publish(key_state_subject(src.pipeline, "src", "pe-p1"), forged)  # not the owner's
        src.event(key)
        asked: list[list[int]] = []
        assert reader._parts_ahead is not None
        take = reader._parts_ahead.take
        reader._parts_ahead.take = lambda seqs, *a: asked.append(list(seqs)) or take(seqs, *a)  # type: ignore[method-assign]
        planned, _, rows = next_batch(reader, start)
        assert planned.keys
        assert asked == [[]], asked
        assert [r["creator"] for r in rows if r["creator"] == KEY_STATE] == []
    finally:
        reader.stop()
