"""Key moves of a partitioned element with several inputs, against a real nats-server: each
move is stored in every input (the first first), a move an orchestrator left stored in some
only is appended to the others, and a key group's (or a rescale's) record in each input
lists every key seen until its append (completed ones listed again)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest

from fogshift.broker.client import (
    SyncJetStream,
    delete_pe_stream,
    ensure_pe_stream,
    get_range,
    last_seq,
)
from fogshift.broker.keys import KeyMove, parse
from fogshift.broker.naming import data_subject, keys_subject, stream_name
from fogshift.broker.server import BrokerProcess
from fogshift.contracts import KeyMoveStatus, ScaleReport
from fogshift.exceptions import Conflict, InvalidInput
from fogshift.orchestrator import keymoves
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec
from fogshift.spec.models import partition_of_key

pytestmark = pytest.mark.integration

SPEC = {
    "pipeline": "two",
    "elements": [
        {"id": "s1", "kind": "csv-source", "node": "cloud", "options": {"path": "in1.csv"}},
        {"id": "s2", "kind": "csv-source", "node": "cloud", "options": {"path": "in2.csv"}},
        {"id": "agg", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b"],
         "key_by": "sensor", "inputs": ["s1", "s2"],
         "options": {"field": "value", "window": 3, "function": "avg"}},
        {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["agg"],
         "options": {"path": "out/o.csv"}},
    ],
}  # fmt: skip


def _none_listed() -> keymoves.Listing:
    """A listing of state stores that hold nothing, as of both inputs' starts."""
    return keymoves.Listing(set(), {"s1": 0, "s2": 0})


@pytest.fixture
def orch(
    tmp_path: Path, nats_server: BrokerProcess, js_client: SyncJetStream
) -> Iterator[Orchestrator]:
    broker = nats_server.address.save(tmp_path / "broker.json")
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orchestrator = Orchestrator(config)
    orchestrator.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")  # type: ignore[arg-type]
    orchestrator.permissions = SimpleNamespace(sync=lambda registry: None)  # type: ignore[assignment]
    for name in ("s1", "s2"):
        js_client.run(lambda js, n=name: delete_pe_stream(js, "two", n))  # (each test anew)
        js_client.run(lambda js, n=name: ensure_pe_stream(js, "two", n))
    try:
        yield orchestrator
    finally:
        orchestrator.close()


def moves(js: SyncJetStream, name: str) -> list[str]:
    """The ids of the key moves stored in input ``name``, in order."""
    stream = stream_name("two", name)

    async def read(j: Any) -> Any:
        return await get_range(j, stream, keys_subject("two", name), 0, await last_seq(j, stream))

    parsed = (parse(m.seq, m.data) for m in js.run(read))
    return [m.move for m in parsed if isinstance(m, KeyMove)]


class LateAcks:
    """The orchestrator's broker client, whose first publish of a record is stored but its
    acknowledgement never comes (a busy broker: the client's wait runs out first)."""

    def __init__(self, client: SyncJetStream) -> None:
        self.client, self.late = client, 1

    def run(self, make: Any, timeout: float = 30.0, **_: Any) -> Any:
        outer = self

        class Late:
            def __init__(self, js: Any) -> None:
                self.js = js

            async def publish(self, *args: Any, **kwargs: Any) -> Any:
                ack = await self.js.publish(*args, **kwargs)
                if outer.late:
                    outer.late -= 1
                    raise nats.errors.TimeoutError
                return ack

            def __getattr__(self, name: str) -> Any:
                return getattr(self.js, name)

        return self.client.run(lambda js: make(Late(js)), timeout)


@pytest.mark.parametrize("inputs", [("s1",), ("s1", "s2")])
def test_a_move_acknowledged_late_is_stored_once_and_reported_where(
    orch: Orchestrator, js_client: SyncJetStream, inputs: tuple[str, ...]
) -> None:
    # Sent again under its id, the broker dropping the repeat and answering with where the
    # first is: before, a single input's move (and the first input's of several) had no
    # id, so its late-stored move was reported as failed (a 503) while its keys moved.
    real = orch.broker
    orch.broker = LateAcks(real)  # type: ignore[assignment]
    try:
        at = orch._append_move("two", inputs, KeyMove(0, "m1", "agg", ("k1",), 1))
    finally:
        orch.broker = real
    assert moves(js_client, "s1") == ["m1"] and all(moves(js_client, n) == ["m1"] for n in inputs)
    assert at == js_client.run(lambda j: last_seq(j, stream_name("two", "s1"))) == 1


def test_a_move_is_stored_in_every_input_and_one_left_half_way_is_completed(
    orch: Orchestrator, js_client: SyncJetStream
) -> None:
    first = KeyMove(0, "m1", "agg", ("k1",), 1)
    at = orch._append_move("two", ("s1", "s2"), first)
    assert moves(js_client, "s1") == ["m1"] and moves(js_client, "s2") == ["m1"]
    assert at == js_client.run(lambda j: last_seq(j, stream_name("two", "s1")))
    # An orchestrator died after storing m2 in the first input only: its key would wait at
    # its target for good, its origin for the move's place in s2.
    orch._append_key_record("two", "s1", KeyMove(0, "m2", "agg", ("k2",), 1).payload(), "m2")
    orch._moves_complete.discard(("two", "agg"))  # (a new orchestrator knows none complete)
    records = orch.registry.pipelines()
    orch.complete_key_moves(records)
    assert moves(js_client, "s2") == ["m1", "m2"]
    orch.complete_key_moves(records)  # known complete now: nothing read or appended
    orch._moves_complete.discard(("two", "agg"))
    orch.complete_key_moves(records)  # checked again: nothing missing
    assert moves(js_client, "s1") == ["m1", "m2"] and moves(js_client, "s2") == ["m1", "m2"]


def _event(js: SyncJetStream, name: str, sensor: str) -> int:
    body = {"seq": 1, "timestamp": 1.0, "creator": name,
            "body": json.dumps({"sensor": sensor, "value": 1.0})}  # fmt: skip

    async def go(j: Any) -> int:
        subject, stream = data_subject("two", name), stream_name("two", name)
        return int((await j.publish(subject, json.dumps(body).encode(), stream=stream)).seq)

    return js.run(go)


def _listed(js: SyncJetStream, name: str, move: str) -> tuple[str, ...]:
    stream = stream_name("two", name)

    async def read(j: Any) -> Any:
        return await get_range(j, stream, keys_subject("two", name), 0, await last_seq(j, stream))

    (found,) = [m for m in (parse(x.seq, x.data) for x in js.run(read))
                if isinstance(m, KeyMove) and m.move == move]  # fmt: skip
    return found.keys


def _group_keys(group: tuple[int, int], count: int) -> list[str]:
    return [k for k in (f"k{i}" for i in range(1000)) if partition_of_key(k, group[1]) == group[0]][
        :count
    ]


def test_a_key_groups_record_in_each_input_lists_every_key_seen_until_its_append(
    orch: Orchestrator, js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OLD holds state (its events in s1); NEW's first event comes to s2 after the group's
    # append to s1, between the look before s2's append and that append: s2's append is
    # refused (its input grew), looked at again, and lists NEW (only: OLD is in s1's). The
    # move's keys, and the orchestrator's ownership, are the union of the two.
    group = (partition_of_key("k0", 4), 4)
    old, new, third = _group_keys(group, 3)
    _event(js_client, "s1", old)
    real, tries = keymoves._append_after, []

    async def racing(js: Any, pipeline: str, source: str, *args: Any, **kwargs: Any) -> Any:
        tries.append(source)
        if tries == ["s1", "s2"]:
            body = {"seq": 2, "timestamp": 1.0, "creator": "s2",
                    "body": json.dumps({"sensor": new, "value": 1.0})}  # fmt: skip
            await js.publish(data_subject("two", "s2"), json.dumps(body).encode(),
                             stream=stream_name("two", "s2"))  # fmt: skip
        return await real(js, pipeline, source, *args, **kwargs)

    monkeypatch.setattr(keymoves, "_append_after", racing)
    record = orch.registry.get_pipeline("two")
    assert record is not None
    parts = record.spec.partitions_of("agg")
    to = 1 - partition_of_key(old, 2)
    make = keymoves._relisted(KeyMove(0, "x", "agg", (), to, group=group))
    move, at, before = orch._append_listed("two", "agg", parts, make, "test", listed=_none_listed())
    assert tries == ["s1", "s2", "s2"]  # s2's first append refused, the second stored
    assert _listed(js_client, "s1", move.move) == (old,)
    assert _listed(js_client, "s2", move.move) == (new,)
    assert move.keys == tuple(sorted((old, new)))
    assert at == js_client.run(lambda j: last_seq(j, stream_name("two", "s1")))
    assert before.owner(new) != to  # (the ownership the move was made from)
    owners = orch._owners("two", "s1", "agg", 2)
    assert owners.owner(new) == owners.owner(old) == to
    assert set(owners.pending) == {old, new}  # both wait for their states
    assert ("two", "agg") in orch._moves_complete

    # A group stored in s1 only (its orchestrator died): completed in s2 from where its
    # record's scan ended, without asking the partitions (one of their nodes may be
    # away), listing the key that gained state in s2 since.
    monkeypatch.setattr(keymoves, "_append_after", real)
    later = keymoves._relisted(KeyMove(0, "x", "agg", (), 1 - to, group=group))
    orch._moves_complete.discard(("two", "agg"))
    half, _, _ = orch._append_listed("two", "agg", parts, later, "test",
                                     listed=_none_listed(), only=("s1",))  # fmt: skip
    assert ("two", "agg") not in orch._moves_complete  # (completing, the caller marks)
    assert _listed(js_client, "s1", half.move) == tuple(sorted((old, new)))
    _event(js_client, "s2", third)

    def away(pipeline: str, parts: Any) -> Any:
        raise AssertionError("asked the partitions for their keys")

    monkeypatch.setattr(orch, "_listed_keys", away)
    orch._moves_complete.discard(("two", "agg"))
    orch.complete_key_moves(orch.registry.pipelines())
    assert _listed(js_client, "s2", half.move) == (third,)
    assert ("two", "agg") in orch._moves_complete

    # Left half-way again, and the inputs grew by more than a completion scans (an
    # orchestrator back after hours): listed from the partitions' state stores instead.
    more = keymoves._relisted(KeyMove(0, "x", "agg", (), to, group=group))
    again, _, _ = orch._append_listed("two", "agg", parts, more, "test",
                                      listed=_none_listed(), only=("s1",))  # fmt: skip
    fourth = _group_keys(group, 4)[3]
    _event(js_client, "s2", fourth)
    asked: list[str] = []

    def stores(pipeline: str, parts: Any) -> Any:
        asked.append(pipeline)
        return keymoves.Listing({fourth}, {"s1": 0, "s2": 0})

    monkeypatch.setattr(orch, "_listed_keys", stores)
    monkeypatch.setattr(keymoves, "COMPLETE_SCAN_MAX", 0)
    orch._moves_complete.discard(("two", "agg"))
    orch.complete_key_moves(orch.registry.pipelines())
    assert asked == ["two"] and _listed(js_client, "s2", again.move) == (fourth,)


def test_a_scale_completes_a_move_left_in_some_inputs_before_its_own(
    orch: Orchestrator, js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stored after one left half-way, the rescale's records would come before that move's
    # in the other input: the partitions would hold the first input at its place for good.
    record = orch.registry.get_pipeline("two")
    assert record is not None
    parts = record.spec.partitions_of("agg")
    group = (partition_of_key("k0", 4), 4)
    make = keymoves._relisted(KeyMove(0, "x", "agg", (), 1, group=group))
    half, _, _ = orch._append_listed("two", "agg", parts, make, "test",
                                     listed=_none_listed(), only=("s1",))  # fmt: skip
    orch._moves_complete.discard(("two", "agg"))  # (a new orchestrator knows none complete)
    seen: list[list[str]] = []
    monkeypatch.setattr(orch, "_nodes_for", lambda *args: ["fog-c"])
    monkeypatch.setattr(orch, "_sections", lambda *args, **kwargs: contextlib.nullcontext())
    done = ScaleReport(pipeline="two", element="agg", status=KeyMoveStatus.MOVED, before=2,
                       after=3)  # fmt: skip
    monkeypatch.setattr(orch, "_scale",
                        lambda *args: seen.append(moves(js_client, "s2")) or done)  # fmt: skip
    orch.scale("two", "agg", 3, ["fog-c"], timeout_s=0.1)
    assert seen == [[half.move]]  # stored in s2 before the scale went on
    # Journaled, and ended with its report's status.
    ((outcome,),) = orch.registry._db.execute("SELECT outcome FROM scales").fetchall()
    assert outcome == "moved"
    # Carried on for a dead orchestrator whose entry ended meanwhile: nothing is done.
    left = orch.registry.begin_scale("two", "agg", 3, None, False, "dead0rchestr")
    orch.registry.end_scale(left.id, "superseded")
    with pytest.raises(Conflict, match="ended meanwhile"):
        orch.scale("two", "agg", 3, resume=left, timeout_s=0.1)
    assert len(seen) == 1


def test_an_element_a_partitioned_reader_reads_is_not_scaled_out_of_one_partition(
    tmp_path: Path, nats_server: BrokerProcess, js_client: SyncJetStream
) -> None:
    # Its reader numbered up-p0's records by stream sequence (as a partition whose keys
    # move); the scale would make it read up-p0|up-p1 merged, numbered densely: a batch run
    # again across the scale would number the same records lower and its writer skip those
    # at or below what it stored (a review's finding: this was let through while no key of
    # the reader had moved). Once keys moved, they could not move back either.
    spec = {
        "pipeline": "chain",
        "elements": [
            {"id": "src", "kind": "csv-source", "node": "cloud", "options": {"path": "i.csv"}},
            {"id": "up", "kind": "window-aggregate", "partitions": ["fog-a"], "key_by": "k",
             "inputs": ["src"], "options": {"field": "v", "window": 2}},
            {"id": "down", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b"],
             "key_by": "k", "inputs": ["up"], "options": {"field": "v", "window": 2}},
        ],
    }  # fmt: skip
    broker = nats_server.address.save(tmp_path / "broker.json")
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orchestrator = Orchestrator(config)
    js_client.run(lambda js: ensure_pe_stream(js, "chain", "up-p0"))
    try:
        orchestrator.registry.put_pipeline(parse_spec(spec, tmp_path), "running")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput) as unmoved:
            orchestrator.scale("chain", "up", 2, ["fog-b"], timeout_s=0.1)
        assert "down reads up-p0 as a plain input" in unmoved.value.message
        assert unmoved.value.hint and "afresh" in unmoved.value.hint
        orchestrator._append_key_record(
            "chain", "up-p0", KeyMove(0, "m1", "down", ("k1",), 1).payload(), "m1"
        )
        with pytest.raises(InvalidInput) as moved:
            orchestrator.scale("chain", "up", 2, ["fog-b"], timeout_s=0.1)
        assert moved.value.message == unmoved.value.message
        record = orchestrator.registry.get_pipeline("chain")
        assert record is not None and [e.id for e in record.spec.partitions_of("up")] == ["up-p0"]
        assert record.spec.partitions_of("down")[0].inputs == ("up-p0",)
    finally:
        orchestrator.close()


def test_a_key_move_planned_before_its_partitions_inputs_changed_is_refused(
    orch: Orchestrator,
) -> None:
    # A scale of an element the partitions read (merged from then on, where keys no longer
    # move) ran while the move waited for the element's lock: appended to the inputs it
    # planned on, it was ignored, and the command waited for states that never came.
    record = orch.registry.get_pipeline("two")
    assert record is not None
    parts = record.spec.partitions_of("agg")
    orch._unchanged("two", "agg", parts, "cannot move keys")  # as planned: goes ahead
    planned = [p.model_copy(update={"inputs": ("s1",)}) for p in parts]
    with pytest.raises(Conflict, match="its partitions changed while it waited"):
        orch._unchanged("two", "agg", planned, "cannot move keys")


def test_whether_a_pe_s_inputs_hold_anything_beyond_an_offset(
    orch: Orchestrator, js_client: SyncJetStream
) -> None:
    """What a migration asks after its switch before waiting for its downtime, answered
    from the inputs' streams on a real nats-server; unknown counts as pending."""
    first = _event(js_client, "s1", "a")
    last = _event(js_client, "s1", "b")
    assert orch._input_pending("two", {"type": "jetstream", "positions": {"s1": first}})
    assert not orch._input_pending("two", {"type": "jetstream", "positions": {"s1": last}})
    # Several inputs: pending if any is behind its stream's end (s2 holds nothing).
    assert not orch._input_pending("two", {"type": "jetstream",
                                           "positions": {"s1": last, "s2": 0}})  # fmt: skip
    assert orch._input_pending("two", {"type": "jetstream", "positions": {"s1": 0, "s2": 0}})
    # A source's own offset, none yet, a stream that does not exist: waited for.
    assert orch._input_pending("two", {"row": 3})
    assert orch._input_pending("two", None)
    assert orch._input_pending("two", {"type": "jetstream", "positions": {"gone": 0}})
