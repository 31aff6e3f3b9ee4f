"""A partition with several inputs places a key move in each of them (the orchestrator
appends it to every input): the target holds the key from the move's first place it
reaches, the origin hands the state over once past them all, and key states count on the
first input only. Against a real nats-server; the reader is called as Spark's executor
would call it, with batches cut where a test needs them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.client import SyncJetStream, ensure_pe_stream
from fogshift.broker.datasource import JetStreamPartition, JetStreamReader, Range
from fogshift.broker.keys import (
    CONTROL_FIELD,
    KEY_MOVE_IN,
    KEY_MOVE_OUT,
    KEY_STATE,
    KeyMove,
    state_payload,
)
from fogshift.broker.naming import data_subject, key_state_subject, keys_subject, stream_name
from fogshift.broker.server import BrokerProcess
from fogshift.spec.models import partition_of_key

pytestmark = pytest.mark.integration
_pipelines = (f"twoin{n}" for n in itertools.count())

#: A key partition 0 of two owns before any move.
KEY = next(k for k in "abcdefgh" if partition_of_key(k, 2) == 0)
OTHER = next(k for k in "abcdefgh" if partition_of_key(k, 2) == 0 and k != KEY)


class Inputs:
    """Inputs ``a`` and ``b`` of partitioned PE ``pe`` (two partitions, keyed by ``k``)."""

    def __init__(self, js: SyncJetStream) -> None:
        self.js, self.pipeline = js, next(_pipelines)
        for name in "ab":
            js.run(lambda j, n=name: ensure_pe_stream(j, self.pipeline, n))

    def publish(self, name: str, subject: str, data: bytes) -> int:
        async def go(j: Any) -> int:
            stream = stream_name(self.pipeline, name)
            return int((await j.publish(subject, data, stream=stream)).seq)

        return self.js.run(go)

    def event(self, name: str, key: str, n: int) -> int:
        body = {"seq": n, "timestamp": 1.0, "creator": name,
                "body": json.dumps({"k": key, "n": n})}  # fmt: skip
        return self.publish(name, data_subject(self.pipeline, name), json.dumps(body).encode())

    def move(self, name: str, key: str) -> int:
        payload = KeyMove(0, "m1", "pe", (key,), 1).payload()
        return self.publish(name, keys_subject(self.pipeline, name), payload)

    def state(self, name: str, key: str, origin: int, to: int) -> int:
        payload = state_payload("m1", "pe", key, to, {"sum": json.dumps(7)})
        return self.publish(name, key_state_subject(self.pipeline, name, f"pe-p{origin}"), payload)


def reader(inputs: Inputs, index: int, nats_server: BrokerProcess, tmp_path: Path) -> Any:
    broker = nats_server.address.save(tmp_path / "broker.json")
    return JetStreamReader({
        "broker": str(broker), "pipeline": inputs.pipeline, "pe": f"pe-p{index}",
        "inputs": "a,b", "epoch": "1", "partition": f"pe:{index}:2", "key_by": "k",
    })  # fmt: skip


def rows(part: Any, **ranges: tuple[int, int]) -> list[tuple[int, str, Any]]:
    """``(origin, creator, n or the control detail)`` of one batch of ``ranges`` (input ->
    (start, end]), as an executor reads it."""
    span = [Range(name, *ranges[name]) for name in "ab"]
    out = []
    for batch in part.read(JetStreamPartition([span])):
        for row in batch.to_pylist():
            body = json.loads(row["body"])
            what = body[CONTROL_FIELD] if CONTROL_FIELD in body else body["n"]
            out.append((row["origin"], row["creator"], what))
    return out


def test_a_key_changes_owner_at_its_moves_place_in_each_input(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    inputs = Inputs(js_client)
    a1, a2 = inputs.event("a", KEY, 1), inputs.event("a", OTHER, 2)
    xa = inputs.move("a", KEY)
    a3 = inputs.event("a", KEY, 3)
    b1 = inputs.event("b", KEY, 11)
    xb = inputs.move("b", KEY)
    b2 = inputs.event("b", KEY, 12)
    origin, target = reader(inputs, 0, nats_server, tmp_path), reader(inputs, 1, nats_server,
                                                                        tmp_path)  # fmt: skip

    # The origin past the move in a, not yet in b: the key's events of a after it are not
    # its own, those of b before it are; no state is handed over yet.
    first = rows(origin, a=(0, a3), b=(0, b1))
    # (a row's origin: every input's position once it is consumed, summed)
    assert first == [(a1, "a", 1), (a2, "a", 2), (a3 + b1, "b", 11)]
    # Past the move in b too: the state goes (once), at the move's place in b.
    second = rows(origin, a=(a3, a3), b=(b1, b2))
    ((at, kind, detail),) = second
    assert kind == KEY_MOVE_OUT and at == a3 + xb
    assert detail["input"] == "a" and detail["at"] == xa and detail["ahead"] == {"a": xa, "b": xb}

    # The target reaching b's place first holds the key from there (b's event after it is
    # its own, a's before its place are not), and not again at a's place.
    early = rows(target, a=(0, a2), b=(0, b2))
    assert [(c, n if c in "ab" else None) for _, c, n in early] == [
        (KEY_MOVE_IN, None), ("b", 12)
    ]  # fmt: skip
    assert early[0][0] == a2 + xb
    late = rows(target, a=(a2, a3), b=(b2, b2))
    assert [(c, n) for _, c, n in late] == [("a", 3)]


def test_a_key_state_counts_on_the_first_input_only(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    inputs = Inputs(js_client)
    inputs.move("a", KEY)
    inputs.move("b", KEY)
    on_b = inputs.state("b", KEY, 0, 1)  # (no node may publish it there: the broker refuses)
    on_a = inputs.state("a", KEY, 0, 1)
    target = reader(inputs, 1, nats_server, tmp_path)
    got = rows(target, a=(0, on_a), b=(0, on_b))
    assert [c for _, c, _ in got] == [KEY_MOVE_IN, KEY_STATE]
    assert got[1][2]["state"] == {"sum": "7"} and got[1][0] == on_a
