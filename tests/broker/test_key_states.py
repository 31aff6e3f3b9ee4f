"""How a partition hands key states over (``broker.datasource._send_states``), against a real
nats-server: each state on its origin's subject, a large one's parts on its own target's, and
none lost to a message id another partition took first."""

from __future__ import annotations

import base64
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.client import SyncJetStream, ensure_pe_stream, get_range, get_ranges, last_seq
from fogshift.broker.datasource import _send_states
from fogshift.broker.keys import KEY_STATE, KeyState, joined_state, read_message
from fogshift.broker.naming import key_state_subject, key_subjects, state_subject, stream_name
from fogshift.broker.publish import Record

pytestmark = pytest.mark.integration
_pipelines = (f"kstates{n}" for n in itertools.count())


def state_row(key: str, to: int, rank: int, state: dict[str, str]) -> Record:
    """The row a partition's processor makes of ``key`` moving to partition ``to`` at input
    position 5 (move ``m1``)."""
    body = {"key": key, "move": "m1", "to": to, "rank": rank, "order": "fifo", "input": "src",
            "element": "pe", "key_by": "patient", "state": state}  # fmt: skip
    return Record(5, 0, 0, 0.0, KEY_STATE, json.dumps(body))


def stored(js: SyncJetStream, pipeline: str) -> list[KeyState]:
    """The key states stored in the input, as a reader takes them."""
    stream = stream_name(pipeline, "src")
    end = js.run(lambda j: last_seq(j, stream))
    found = js.run(lambda j: get_ranges(j, stream, key_subjects(pipeline, "src"), 0, end))
    items = [read_message(pipeline, "src", m.subject, m.seq, m.data) for m in found]
    return [i for i in items if isinstance(i, KeyState)]


def test_each_large_states_parts_go_to_its_own_target(js_client: SyncJetStream) -> None:
    # One batch hands two keys to two partitions (as a rescale does): each state's parts on
    # its own target's subject, which is the only one its target reads them from. (The
    # parts of every state went to the last state's target.)
    pipeline = next(_pipelines)
    js_client.run(lambda j: ensure_pe_stream(j, pipeline, "src"))
    big = {k: {"ballast": base64.b64encode(os.urandom(6_000)).decode()} for k in ("a", "b")}
    rows = [state_row("a", 1, 0, big["a"]), state_row("b", 2, 1, big["b"])]
    js_client.run(lambda j: _send_states(j, pipeline, 0, rows))
    states = {s.key: s for s in stored(js_client, pipeline)}
    assert set(states) == {"a", "b"}
    stream = stream_name(pipeline, "src")
    for key, to in (("a", 1), ("b", 2)):
        state = states[key]
        assert state.origin == 0 and state.to == to and state.parts and state.scoped
        apart = state_subject(pipeline, "src", to, "pe")  # its element's partition's
        parts: Any = js_client.run(lambda j, s=apart: get_range(j, stream, s, 0, 1000))
        bodies = {m.seq: m.data for m in parts}
        assert set(state.parts) <= set(bodies), (key, state.parts, sorted(bodies))
        assert joined_state([bodies[p] for p in state.parts], state.raw) == big[key]
    # Sent again (a retried batch): the broker keeps one of each, parts and records.
    before = js_client.run(lambda j: last_seq(j, stream))
    js_client.run(lambda j: _send_states(j, pipeline, 0, rows))
    assert js_client.run(lambda j: last_seq(j, stream)) == before


def test_a_state_whose_message_id_another_partition_took_is_still_stored(
    js_client: SyncJetStream,
) -> None:
    # A state's message ids are known to every partition reading the input, and each may
    # publish there (its own states, any target's parts). One that takes an id first must
    # not make the broker drop the origin's state as a repeat: its target would hold the key
    # forever, or read another's bytes as its parts.
    pipeline = next(_pipelines)
    stream = stream_name(pipeline, "src")
    js_client.run(lambda j: ensure_pe_stream(j, pipeline, "src"))
    big = {"ballast": base64.b64encode(os.urandom(6_000)).decode()}
    for subject, msg_id in (
        (key_state_subject(pipeline, "src", "pe-p2"), "pe:m1:small"),  # the record's id
        (state_subject(pipeline, "src", 1, "pe"), "pe:m1:large:0"),  # its first part's
    ):
        taken = {"Nats-Msg-Id": msg_id}
        js_client.run(lambda j, s=subject, h=taken: j.publish(s, b"x", stream=stream, headers=h))
    rows = [state_row("small", 1, 0, {"count": "3"}), state_row("large", 1, 1, big)]
    js_client.run(lambda j: _send_states(j, pipeline, 0, rows))
    states = {s.key: s for s in stored(js_client, pipeline) if s.origin == 0}
    assert states["small"].state == {"count": "3"}
    parts: Any = js_client.run(
        lambda j: get_range(j, stream, state_subject(pipeline, "src", 1, "pe"), 0, 1000)
    )
    bodies = {m.seq: m.data for m in parts}
    assert joined_state([bodies[p] for p in states["large"].parts], states["large"].raw) == big


def test_a_fenced_partition_hands_no_key_state_over(
    js_client: SyncJetStream, tmp_path: Path
) -> None:
    # A batch of key states only (no record to append, whose append checks the epoch): a
    # fenced instance's states were stored, and a target takes a move's first state.
    from fogshift.broker.exceptions import Fenced
    from fogshift.broker.publish import fence

    pipeline, writer = _partition_writer(js_client, tmp_path)
    js_client.run(lambda j: fence(j, pipeline, "pe-p0", 3))  # restored elsewhere, under 3
    with pytest.raises(Fenced):
        writer.write(iter([_batch(state_row("a", 1, 0, {"v": "1"}))]))
    assert stored(js_client, pipeline) == []


def test_a_batch_re_run_under_its_remembered_tail_is_fenced_before_its_states(
    js_client: SyncJetStream, tmp_path: Path
) -> None:
    # The batch's records were stored, then its states failed (a timeout) and the partition
    # was restored elsewhere; the re-run skips the records by the tail it remembers, without
    # reading the stream, so nothing read the fence: its states went out under epoch 2.
    from fogshift.broker.exceptions import Fenced
    from fogshift.broker.publish import fence

    pipeline, writer = _partition_writer(js_client, tmp_path)
    record = Record(5, 0, 5, 0.0, "pe", json.dumps({"v": 1}))
    writer.write(iter([_batch(record)]))  # stored; its states then failed
    js_client.run(lambda j: fence(j, pipeline, "pe-p0", 3))  # restored elsewhere, under 3
    with pytest.raises(Fenced):
        writer.write(iter([_batch(record, state_row("a", 1, 0, {"v": "1"}))]))
    assert stored(js_client, pipeline) == []


def _partition_writer(js_client: SyncJetStream, tmp_path: Path) -> tuple[str, Any]:
    """A fresh pipeline's input and partition streams, and the partition's writer (epoch 2,
    a movable partition 0 of 2)."""
    from fogshift.broker.datasource import JetStreamWriter

    pipeline = next(_pipelines)
    for pe in ("src", "pe-p0"):
        js_client.run(lambda j, pe=pe: ensure_pe_stream(j, pipeline, pe))
    broker = js_client.address.save(tmp_path / "broker.json")
    writer = JetStreamWriter({"broker": str(broker), "pipeline": pipeline, "pe": "pe-p0",
                              "epoch": "2", "partition": "pe:0:2"})  # fmt: skip
    return pipeline, writer


def _batch(*rows: Record) -> Any:
    """``rows`` as the Arrow batch Spark hands the writer."""
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([
        {"origin": r.origin, "idx": r.index, "seq": r.seq, "timestamp": r.timestamp,
         "creator": r.creator, "body": r.body, "dead": None} for r in rows
    ])  # fmt: skip


def test_the_state_of_a_key_near_the_brokers_size_limit_is_stored(
    js_client: SyncJetStream,
) -> None:
    # A record may be nearly as large as a broker message, and so may its key: the state's
    # message id named the key again in its header, and the broker refused the message
    # (over its payload limit) at every retry of the origin's batch.
    pipeline = next(_pipelines)
    js_client.run(lambda j: ensure_pe_stream(j, pipeline, "src"))
    key = "k" * 600_000
    js_client.run(lambda j: _send_states(j, pipeline, 0, [state_row(key, 1, 0, {"n": "1"})]))
    (state,) = stored(js_client, pipeline)
    assert (state.key, state.state, state.origin) == (key, {"n": "1"}, 0)


def test_a_key_state_nobody_acked_is_sent_again_under_its_id(js_client: SyncJetStream) -> None:
    """Key states go without waiting for each ack; one the broker answered "no responders"
    (its accounts reloading, as a rescale's placement change makes it) is sent again, acked,
    under the same message id: stored once."""
    import asyncio

    from nats.js.errors import NoStreamResponseError

    from fogshift.broker.datasource import _Sent

    pipeline = next(_pipelines)
    js_client.run(lambda js: ensure_pe_stream(js, pipeline, "src"))
    subject = key_state_subject(pipeline, "src", "agg-p0")

    async def unanswered_then_again(js: Any) -> list[Any]:
        lost: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        lost.set_exception(NoStreamResponseError())  # as nats-py's 503 handler sets it
        sent = _Sent(subject, b"state", stream_name(pipeline, "src"), "m1:k", lost)
        first = await sent.ack(js)
        again = await (await _Sent.publish(js, subject, b"state", sent.stream, "m1:k")).ack(js)
        return [first, again]

    first, again = js_client.run(unanswered_then_again)
    assert first.seq == again.seq and again.duplicate
    stored_once = js_client.run(
        lambda js: get_range(js, stream_name(pipeline, "src"), subject, 0, 100)
    )
    assert [m.data for m in stored_once] == [b"state"]
