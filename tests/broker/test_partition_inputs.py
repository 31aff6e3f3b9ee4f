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
from pyspark.sql.streaming.datasource import ReadMaxRows

from fogshift.broker.client import SyncJetStream, ensure_pe_stream
from fogshift.broker.datasource import (
    JetStreamPartition,
    JetStreamReader,
    Range,
    positions_of,
    shift_of,
)
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
from fogshift.exceptions import InvariantViolation
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

    def move(self, name: str, key: str, move: str = "m1", to: int = 1) -> int:
        payload = KeyMove(0, move, "pe", (key,), to).payload()
        return self.publish(name, keys_subject(self.pipeline, name), payload)

    def state(self, name: str, key: str, origin: int, to: int, after: int | None = None) -> int:
        payload = state_payload("m1", "pe", key, to, {"sum": json.dumps(7)}, after=after)
        return self.publish(name, key_state_subject(self.pipeline, name, f"pe-p{origin}"), payload)


def reader(inputs: Inputs, index: int, nats_server: BrokerProcess, tmp_path: Path) -> Any:
    broker = nats_server.address.save(tmp_path / "broker.json")
    return JetStreamReader({
        "broker": str(broker), "pipeline": inputs.pipeline, "pe": f"pe-p{index}",
        "inputs": "a,b", "epoch": "1", "partition": f"pe:{index}:2", "key_by": "k",
    })  # fmt: skip


def rows(part: Any, shift: int = 0, **ranges: tuple[int, int]) -> list[tuple[int, str, Any]]:
    """``(origin, creator, n or the control detail)`` of one batch of ``ranges`` (input ->
    (start, end]) starting at origins' shift ``shift``, as an executor reads it."""
    span = [Range(name, *ranges[name]) for name in "ab"]
    out = []
    for batch in part.read(JetStreamPartition([span], shift=shift)):
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


def test_a_targets_rows_from_a_moved_keys_state_on_are_numbered_beyond_its_origins(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # The origin passes the move far into b (its last rows' origins are large), the target
    # takes the state having read little of b: a consumer merging the two partitions by
    # origin would take the target's first records of the key for earlier than the origin's
    # last. The target's rows from the state on are shifted beyond the origin's, the shift
    # kept in its offsets (the planner's equals the executor's).
    inputs = Inputs(js_client)
    xa = inputs.move("a", KEY)
    busy = [inputs.event("b", OTHER, n) for n in range(20)]
    xb = inputs.move("b", KEY)
    origin, target = reader(inputs, 0, nats_server, tmp_path), reader(inputs, 1, nats_server,
                                                                        tmp_path)  # fmt: skip
    ((closing, kind, detail), *_) = [r for r in rows(origin, a=(0, xa), b=(0, xb)) if r[1] != "b"]
    assert kind == KEY_MOVE_OUT and closing == xa + xb and detail["after"] == closing
    on_a = inputs.state("a", KEY, 0, 1, after=closing)
    a3, b22 = inputs.event("a", KEY, 3), inputs.event("b", KEY, 22)
    got = rows(target, a=(0, on_a), b=(0, 0))
    assert [c for _, c, _ in got] == [KEY_MOVE_IN, KEY_STATE]
    assert got[0][0] == xa and got[1][0] == closing + 1  # (not on_a: beyond the origin's)
    start = {"type": "jetstream", "positions": {"a": 0, "b": 0}}
    end = {"type": "jetstream", "positions": {"a": on_a, "b": 0}}
    shift = target._shift_after(start, end)
    assert shift == closing + 1 - on_a > 0
    assert origin._shift_after(start, {"type": "jetstream", "positions": {"a": xa, "b": xb}}) == 0
    later = rows(target, shift, a=(on_a, a3), b=(0, b22))
    assert [(c, n) for _, c, n in later] == [("a", 3), ("b", 22)]
    origins = [o for o, _, _ in got + later]
    assert origins == sorted(set(origins)) and later[0][0] == a3 + shift
    assert busy  # (b's events of another key, which the target does not own)

    # As a query runs it: the planner logs a cut to the inputs' tails and keeps the shift in
    # its end offset; the executor ends at the same; an instance started again replays the
    # logged cut to the same offset.
    js_client.run(lambda j: ensure_pe_stream(j, inputs.pipeline, "pe-p1"))
    planner = reader(inputs, 1, nats_server, tmp_path)
    begin = planner.initialOffset()
    end = planner.latestOffset(begin, ReadMaxRows(10_000))
    assert shift_of(end) == shift and positions_of(end) == {"a": a3, "b": b22}
    (batch,) = planner.partitions(begin, end)
    planned = [(r["origin"], r["creator"]) for b in planner.read(batch) for r in b.to_pylist()]
    assert planned == [(o, c) for o, c, _ in got + later]
    again = reader(inputs, 1, nats_server, tmp_path).latestOffset(begin, ReadMaxRows(10_000))
    assert again == end
    # An executor that ends elsewhere than the planner said fails loudly.
    (wrong,) = planner.partitions(begin, {**end, "shift": shift + 1})
    with pytest.raises(InvariantViolation, match="its origins' shift after this batch"):
        list(planner.read(wrong))


def test_a_move_stored_twice_in_an_input_takes_its_first_place_only(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # m1 gives the key to partition 1, m2 back to 0; then m1 is stored again in b (an
    # append that timed out, completed again once the broker's duplicate window had
    # passed). Taken again, it would give partition 1 the key in b once more, with no state.
    inputs = Inputs(js_client)
    for name in "ab":
        inputs.move(name, KEY)
    for name in "ab":
        inputs.move(name, KEY, "m2", 0)
    again = inputs.move("b", KEY)
    event = inputs.event("b", KEY, 5)
    for index, owns in ((0, True), (1, False)):
        part = reader(inputs, index, nats_server, tmp_path)
        whole = [(c, n) for _, c, n in rows(part, a=(0, 2), b=(0, event)) if c == "b"]
        assert whole == ([("b", 5)] if owns else []), index
        # Read from past the second m1 (a restart there replays the moves before it).
        assert [c for _, c, _ in rows(part, a=(2, 2), b=(again, event))] == (
            ["b"] if owns else []
        ), index


def test_a_partition_a_scale_added_starts_each_input_where_it_stood_when_placed(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    inputs = Inputs(js_client)
    broker = nats_server.address.save(tmp_path / "broker.json")
    added = JetStreamReader({
        "broker": str(broker), "pipeline": inputs.pipeline, "pe": "pe-p2", "inputs": "a,b",
        "epoch": "1", "partition": "pe:2:3", "key_by": "k", "since": json.dumps({"a": 4, "b": 9}),
    })  # fmt: skip
    assert positions_of(added.initialOffset()) == {"a": 4, "b": 9}
    one = reader(inputs, 0, nats_server, tmp_path)  # (one position for every input: 0)
    assert positions_of(one.initialOffset()) == {"a": 0, "b": 0}


def test_a_key_group_move_is_read_only_once_stored_in_every_input_and_as_their_union(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # A key group's record lists the keys seen holding state when it was appended to its
    # input, one input after the other: NEW, first seen in b between the two appends, is in
    # b's list only. No batch passes the move's place in a while b lacks it; once both are
    # stored, every reader takes the union: the target holds NEW from a's place on, the
    # origin hands NEW's state over, and that state is the owner's (not a forged one).
    group = (partition_of_key(KEY, 4), 4)
    new = next(f"n{i}" for i in range(1000) if partition_of_key(f"n{i}", 4) == group[0])
    assert partition_of_key(new, 2) == 0  # (the group's keys are partition 0's of 2)
    inputs = Inputs(js_client)
    for pe in ("pe-p0", "pe-p1"):
        js_client.run(lambda j, p=pe: ensure_pe_stream(j, inputs.pipeline, p))

    def listed(name: str, keys: tuple[str, ...]) -> int:
        payload = KeyMove(0, "g1", "pe", keys, 1, group=group).payload()
        return inputs.publish(name, keys_subject(inputs.pipeline, name), payload)

    inputs.event("a", KEY, 1)
    b1 = inputs.event("b", KEY, 11)
    xa = listed("a", (KEY,))
    inputs.event("a", KEY, 2)
    a3 = inputs.event("a", new, 3)
    b12 = inputs.event("b", new, 12)
    planner = reader(inputs, 0, nats_server, tmp_path)
    begin = planner.initialOffset()
    first = planner.latestOffset(begin, ReadMaxRows(10_000))
    assert positions_of(first) == {"a": xa - 1, "b": b12}  # a held before the move's place
    xb = listed("b", (KEY, new))
    b13 = inputs.event("b", new, 13)
    second = planner.latestOffset(first, ReadMaxRows(10_000))
    assert positions_of(second) == {"a": a3, "b": b13}  # both places in one batch

    def executed(part: Any, start: dict, end: dict) -> list[tuple[str, Any]]:
        (batch,) = part.partitions(start, end)
        found = [r for b in part.read(batch) for r in b.to_pylist()]
        out = []
        for row in found:
            body = json.loads(row["body"])
            out.append((row["creator"], body["k"] if CONTROL_FIELD in body else body["n"]))
        return out

    assert [n for c, n in executed(planner, begin, first) if c == "b"] == [11, 12]
    assert executed(planner, first, second) == [(KEY_MOVE_OUT, KEY), (KEY_MOVE_OUT, new)]
    target = reader(inputs, 1, nats_server, tmp_path)
    start = target.initialOffset()
    end = target.latestOffset(start, ReadMaxRows(10_000))
    assert positions_of(end) == {"a": a3, "b": b13}
    assert executed(target, start, end) == [
        (KEY_MOVE_IN, KEY), (KEY_MOVE_IN, new), ("a", 2), ("a", 3), ("b", 13)
    ]  # fmt: skip
    # NEW's state, from its owner before the move, on the first input: installed.
    payload = state_payload("g1", "pe", new, 1, {"sum": json.dumps(12)}, after=xa + xb)
    on_a = inputs.publish("a", key_state_subject(inputs.pipeline, "a", "pe-p0"), payload)
    later = target.latestOffset(end, ReadMaxRows(10_000))
    assert positions_of(later) == {"a": on_a, "b": b13}
    assert executed(target, end, later) == [(KEY_STATE, new)]
    # Planned in one batch with the move, the state numbers the target's rows beyond the
    # origin's last of NEW (a state the planner took for forged would not).
    whole = {"type": "jetstream", "positions": {"a": on_a, "b": b13}}
    assert target._shift_after(start, whole) == xa + xb + 1 - on_a > 0
    assert b1 < xb


def test_merged_inputs_far_behind_go_on_past_a_listed_move_stored_in_one_of_them(
    js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    """Inputs a and b, an upstream element's partitions merged, far behind the read limit:
    the batch ends where both stood at one moment, and a listed move stored in a only holds
    a at its place. The moment, a's records ahead, fell before b's every record once b had
    read up to it: every look found the same empty batch, for good."""
    inputs = Inputs(js_client)
    js_client.run(lambda j: ensure_pe_stream(j, inputs.pipeline, "pe-p0"))  # (its cut log)
    group = (partition_of_key(KEY, 4), 4)

    def listed(name: str) -> int:
        payload = KeyMove(0, "g1", "pe", (KEY,), 1, group=group).payload()
        return inputs.publish(name, keys_subject(inputs.pipeline, name), payload)

    for n in range(1, 7):
        inputs.event("a", KEY, n)
    xa = listed("a")
    for n in range(7, 13):
        inputs.event("a", KEY, n)
    for n in range(21, 27):  # (all stored after a's records and a's place of the move)
        inputs.event("b", OTHER, n)
    planner = JetStreamReader({
        "broker": str(nats_server.address.save(tmp_path / "broker.json")),
        "pipeline": inputs.pipeline, "pe": "pe-p0", "inputs": "a,b", "merged": "a|b",
        "epoch": "1", "partition": "pe:0:2", "key_by": "k",
    })  # fmt: skip
    limit = ReadMaxRows(4)
    seen = [planner.initialOffset()]
    while len(seen) < 12 and (end := planner.latestOffset(seen[-1], limit)) != seen[-1]:
        seen.append(end)
    ends = [positions_of(o) for o in seen[1:]]
    # a up to its place (held there: b lacks the move), b on past the moment.
    assert ends[-1] == {"a": xa - 1, "b": 6}, ends
    assert all(e["a"] < xa for e in ends)
    xb = listed("b")
    end = planner.latestOffset(seen[-1], limit)
    assert positions_of(end)["a"] >= xa and positions_of(end)["b"] == xb, end
