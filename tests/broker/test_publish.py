"""Idempotent single-writer appends, against a real nats-server."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker import publish
from fogshift.broker.client import (
    SyncJetStream,
    ensure_pe_stream,
    fetch_range,
    get_range,
    last_seq,
)
from fogshift.broker.exceptions import BrokerError, Fenced, WriterConflict
from fogshift.broker.naming import data_subject, dead_subject, stream_name
from fogshift.broker.publish import Record, publish_records
from tests.broker.reload_moments import redirect

pytestmark = pytest.mark.integration
_names = itertools.count()


def records(origins: list[int], dead: set[int] = frozenset()) -> list[Record]:  # type: ignore[assignment]
    return [
        Record(o, 0, o, 0.0, "pe", json.dumps({"v": o}), "bad" if o in dead else None)
        for o in origins
    ]


def fresh_pe(js_client: SyncJetStream) -> str:
    pe = f"pe{next(_names)}"
    js_client.run(lambda js: ensure_pe_stream(js, "t", pe))
    return pe


def test_reexecuted_batches_are_skipped_beyond_the_duplicate_window(
    js_client: SyncJetStream,
) -> None:
    pe = fresh_pe(js_client)
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2, 3]))) == 3
    # A re-execution of the same batch, and one overlapping it: only new records go in.
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([3, 1, 2]))) == 0
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([2, 3, 4, 5]))) == 2
    assert js_client.run(lambda js: last_seq(js, stream_name("t", pe))) == 5


def interleaved(batch: list[Record], action: Callable[[], object]) -> Iterator[Record]:
    """The records of ``batch``, running ``action`` (on another connection) once the writer
    has read the stream's tail and starts consuming its records: a real race, no patching."""
    action()
    yield from batch


def test_a_racing_writer_is_detected(js_client: SyncJetStream, nats_server: object) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    other = SyncJetStream(js_client.address)
    # Written by the other connection: this one has no tail of its own to start from, so it
    # reads the tail, and the rival appends between that read and its commit.
    other.run(lambda js: publish_records(js, "t", pe, records([1])))
    try:
        rival = interleaved(
            records([3]),
            lambda: other.run(lambda js: publish_records(js, "t", pe, records([2]))),
        )
        with pytest.raises(WriterConflict, match="another writer"):
            js_client.run(lambda js: publish_records(js, "t", pe, rival))
    finally:
        other.close()
    assert js_client.run(lambda js: last_seq(js, stream)) == 2


def test_a_handovers_newer_writer_racing_the_older_one_skips_what_it_stored(
    js_client: SyncJetStream,
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    older = SyncJetStream(js_client.address)
    older.run(lambda js: publish_records(js, "t", pe, records([1]), epoch=1))
    try:
        # The target (epoch 2) reads the tail; the origin (epoch 1), still running, appends
        # the same position before the target's commit: the target reads again and goes on.
        racing = interleaved(
            records([2, 3]),
            lambda: older.run(lambda js: publish_records(js, "t", pe, records([2]), epoch=1)),
        )
        assert js_client.run(lambda js: publish_records(js, "t", pe, racing, epoch=2)) == 1
        with pytest.raises(Fenced):
            older.run(lambda js: publish_records(js, "t", pe, records([3, 4]), epoch=1))
    finally:
        older.close()
    stored = js_client.run(lambda js: get_range(js, stream, data_subject("t", pe), 0, 10**9))
    assert [(m.headers["Fogshift-Origin"], m.headers["Fogshift-Epoch"]) for m in stored] == [
        ("1", "1"), ("2", "1"), ("3", "2"),
    ]  # fmt: skip


def counting_tail_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The streams whose tail ``publish_records`` reads from here on (the real read)."""
    reads: list[str] = []
    read = publish.read_tail

    async def counted(js: object, stream: str) -> publish.StreamTail:
        reads.append(stream)
        return await read(js, stream)  # type: ignore[arg-type]

    monkeypatch.setattr(publish, "read_tail", counted)
    return reads


def test_a_writer_starts_each_batch_from_the_tail_its_last_append_left(
    js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    reads = counting_tail_reads(monkeypatch)
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2]), epoch=1)) == 2
    assert reads == [stream]
    # The next batches, a re-execution among them: no tail read, the same result.
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([2, 3]), epoch=1)) == 1
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([3]), epoch=1)) == 0
    assert reads == [stream]
    # After one whose records were all stored (a re-execution; or a standby's, which follows
    # its primary and may not send at all), the next reads the tail once.
    count = publish.ATOMIC_BATCH_MAX + 5  # more than one atomic batch
    batch = records(list(range(4, 4 + count)))
    assert js_client.run(lambda js: publish_records(js, "t", pe, batch, epoch=1)) == count
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([4 + count]), 1)) == 1
    assert reads == [stream, stream]
    tail = js_client.run(lambda js: publish.read_tail(js, stream))
    assert (tail.last_seq, tail.position, tail.epoch) == (4 + count, (4 + count, 0), 1)


def test_a_tail_left_behind_by_other_appends_is_read_again(
    js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    reads = counting_tail_reads(monkeypatch)
    other = SyncJetStream(js_client.address)
    try:
        js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2]), epoch=1))
        # Between two batches: the same epoch's other instance (a precopy's target) and a
        # stranger append. This writer's next batch reads the tail and skips what is stored.
        other.run(lambda js: publish_records(js, "t", pe, records([2, 3]), epoch=1))
        foreign(other, pe)
        assert js_client.run(lambda js: publish_records(js, "t", pe, records([3, 4]), epoch=1)) == 1
        assert reads.count(stream) == 3  # this writer's first, the other's, the stale one
        # A handover's target appends under the next epoch: the old writer is fenced at its
        # next batch, whatever it remembered, and nothing of it is stored.
        other.run(lambda js: publish_records(js, "t", pe, records([4, 5]), epoch=2))
        with pytest.raises(Fenced):
            js_client.run(lambda js: publish_records(js, "t", pe, records([5, 6]), epoch=1))
        # The fence marker alone is enough, with nothing of the new epoch's written yet.
        other.run(lambda js: publish.fence(js, "t", pe, 3))
        with pytest.raises(Fenced):
            other.run(lambda js: publish_records(js, "t", pe, records([6]), epoch=2))
    finally:
        other.close()
    stored = js_client.run(lambda js: get_range(js, stream, data_subject("t", pe), 0, 10**9))
    fogshift = [m for m in stored if "Fogshift-Origin" in m.headers]
    assert [int(m.headers["Fogshift-Origin"]) for m in fogshift] == [1, 2, 3, 4, 5]
    assert [m.headers["Fogshift-Epoch"] for m in fogshift] == ["1", "1", "1", "1", "2"]


def foreign(js_client: SyncJetStream, pe: str, subject: str | None = None) -> None:
    """Publish a message without fogshift headers into ``pe``'s stream."""
    target = subject or data_subject("t", pe)
    js_client.run(lambda js: js.publish(target, b"hello from outside"))


def test_a_foreign_message_resets_neither_deduplication_nor_fencing(
    js_client: SyncJetStream,
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2, 3]), epoch=2))
    foreign(js_client, pe)
    foreign(js_client, pe, dead_subject("t", pe))
    tail = js_client.run(lambda js: publish.read_tail(js, stream))
    assert (tail.last_seq, tail.mark_seq, tail.position, tail.epoch) == (5, 3, (3, 0), 2)
    # A re-executed batch is still skipped, and an older epoch is still fenced.
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([2, 3]), epoch=2)) == 0
    with pytest.raises(Fenced):
        js_client.run(lambda js: publish_records(js, "t", pe, records([4]), epoch=1))
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([3, 4]), epoch=2)) == 1
    assert js_client.run(lambda js: last_seq(js, stream)) == 6


@pytest.mark.parametrize("forged_epoch", [0, 1_000_000])
def test_a_writers_headers_on_a_partitions_subject_are_not_the_writers_tail(
    js_client: SyncJetStream, forged_epoch: int
) -> None:
    # A partition's node may publish on its input's `.keys.<id>` and `.state.*`. One message
    # there with a writer's headers was taken for the input's tail: at epoch 0 and a far
    # position every later record was skipped silently; at a far epoch the writer, every
    # restored one and the orchestrator's fence were refused for good.
    from fogshift.broker.naming import key_state_subject, state_subject
    from fogshift.events import EPOCH_HEADER, INDEX_HEADER, ORIGIN_HEADER

    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2, 3]), epoch=2))
    forged = {ORIGIN_HEADER: "999999999", INDEX_HEADER: "0", EPOCH_HEADER: str(forged_epoch)}
    # (`.state.agg.data`: a partition of element agg may publish on `.state.agg.*`.)
    subjects = (
        key_state_subject("t", pe, "agg-p0"),
        state_subject("t", pe, 0),
        f"{state_subject('t', pe)}.agg.data",
        f"{state_subject('t', pe)}.agg.fence",
    )
    for subject in subjects:
        js_client.run(lambda js, subject=subject: js.publish(subject, b"{}", headers=forged))
    tail = js_client.run(lambda js: publish.read_tail(js, stream))
    assert (tail.mark_seq, tail.position, tail.epoch) == (3, (3, 0), 2)
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([3, 4]), epoch=2)) == 1
    assert js_client.run(lambda js: publish.fence(js, "t", pe, 3)) == 9  # its marker, stored


def test_a_tail_behind_key_records_is_found_without_stepping_over_them(
    js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Key moves and states (and a large state's parts) follow a source's last record in its
    # stream after every key move. Its writer finds the tail from the last message of each
    # subject it marks, not by stepping back over them: with a scan limit of 3, twelve of
    # them would stop it.
    from fogshift.broker.naming import keys_subject, state_subject

    monkeypatch.setattr(publish, "FOREIGN_SCAN_LIMIT", 3)
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2, 3], {2}), epoch=4))
    for _ in range(6):
        foreign(js_client, pe, keys_subject("t", pe))
        foreign(js_client, pe, state_subject("t", pe, 0, "data"))  # (an element "data")
    tail = js_client.run(lambda js: publish.read_tail(js, stream))
    assert (tail.last_seq, tail.mark_seq, tail.position, tail.epoch) == (15, 3, (3, 0), 4)
    # The writer goes on after them: a re-executed record skipped, the next one stored.
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([3, 4]), epoch=4)) == 1
    # A foreign message last on a marked subject hides that subject's marked ones: the
    # writer then looks back message by message, as before (and the limit holds).
    foreign(js_client, pe)
    for _ in range(4):
        foreign(js_client, pe, keys_subject("t", pe))
    with pytest.raises(BrokerError, match="more than 3 messages"):
        js_client.run(lambda js: publish.read_tail(js, stream))


def test_a_foreign_message_during_an_append_is_stepped_over(js_client: SyncJetStream) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    js_client.run(lambda js: publish_records(js, "t", pe, records([1])))
    other = SyncJetStream(js_client.address)
    try:
        batch = interleaved(records([2, 3]), lambda: foreign(other, pe))
        assert js_client.run(lambda js: publish_records(js, "t", pe, batch)) == 2
    finally:
        other.close()
    tail = js_client.run(lambda js: publish.read_tail(js, stream))
    assert (tail.last_seq, tail.mark_seq, tail.position) == (4, 4, (3, 0))


def test_a_zombie_is_refused_after_the_fence_even_behind_foreign_messages(
    js_client: SyncJetStream,
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2]), epoch=1))
    fenced_at = js_client.run(lambda js: publish.fence(js, "t", pe, 2))
    foreign(js_client, pe)
    # The fence repeats the last position, so the new epoch skips what is stored ...
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([2, 3]), epoch=2)) == 1
    # ... and the old instance, trying to write its next record, is refused.
    with pytest.raises(Fenced, match="FOGSHIFT_FENCED"):
        js_client.run(lambda js: publish_records(js, "t", pe, records([4]), epoch=1))
    with pytest.raises(Fenced):
        js_client.run(lambda js: publish.append_cut(js, "t", pe, 1, {"a": 0}, {"a": 1}, after=0))
    assert fenced_at == 3
    assert js_client.run(lambda js: last_seq(js, stream)) == 5
    # Fencing again at the same epoch is a no-op.
    assert js_client.run(lambda js: publish.fence(js, "t", pe, 2)) == 5


def test_cuts_are_logged_in_order_and_found_after_a_sequence(js_client: SyncJetStream) -> None:
    pe = fresh_pe(js_client)
    assert js_client.run(lambda js: publish.next_cut(js, "t", pe, 0)) is None
    first = js_client.run(
        lambda js: publish.append_cut(js, "t", pe, 1, {"a": 0, "b": 0}, {"a": 3, "b": 1}, after=0)
    )
    js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2]), epoch=1))
    foreign(js_client, pe)
    second = js_client.run(
        lambda js: publish.append_cut(
            js, "t", pe, 1, {"a": 3, "b": 1}, {"a": 5, "b": 4}, after=first
        )
    )
    # A cut carries the last record's position: de-duplication is unaffected by it.
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([2, 3]), epoch=1)) == 1
    got = js_client.run(lambda js: publish.next_cut(js, "t", pe, 0))
    assert (got.seq, got.start, got.end, got.epoch) == (
        first,
        {"a": 0, "b": 0},
        {"a": 3, "b": 1},
        1,
    )
    got = js_client.run(lambda js: publish.next_cut(js, "t", pe, first))
    assert (got.seq, got.start, got.end) == (second, {"a": 3, "b": 1}, {"a": 5, "b": 4})
    assert js_client.run(lambda js: publish.next_cut(js, "t", pe, second)) is None
    # No second cut after the same one, whatever the epoch: the log never forks.
    with pytest.raises(
        WriterConflict, match=f"a cut after sequence {first} was logged at {second}"
    ):
        js_client.run(
            lambda js: publish.append_cut(
                js, "t", pe, 2, {"a": 3, "b": 1}, {"a": 6, "b": 1}, after=first
            )
        )
    with pytest.raises(WriterConflict, match="a cut after sequence 0 was logged"):
        js_client.run(lambda js: publish.append_cut(js, "t", pe, 2, {}, {"a": 1}, after=0))
    assert js_client.run(lambda js: publish.next_cut(js, "t", pe, second)) is None


def test_fetch_range_skips_dead_letters_and_honours_bounds(js_client: SyncJetStream) -> None:
    pe = fresh_pe(js_client)
    js_client.run(lambda js: publish_records(js, "t", pe, records(list(range(1, 11)), {3, 7})))
    stream, subject = stream_name("t", pe), data_subject("t", pe)
    got = js_client.run(lambda js: fetch_range(js, stream, subject, 0, 10, batch=3))
    assert [m.metadata.sequence.stream for m in got] == [1, 2, 4, 5, 6, 8, 9, 10]
    got = js_client.run(lambda js: fetch_range(js, stream, subject, 2, 7))
    assert [m.metadata.sequence.stream for m in got] == [4, 5, 6]
    assert js_client.run(lambda js: fetch_range(js, stream, subject, 5, 5)) == []


def test_foreign_messages_become_readable_rows() -> None:
    from fogshift.broker.keys import event_fields

    assert event_fields(b'{"seq": 3, "timestamp": 1.5, "creator": "s", "body": "{}"}') == (
        3,
        1.5,
        "s",
        "{}",
    )
    assert event_fields(b"not json at all") == (0, 0.0, "?", "not json at all")
    # Whatever a stranger stores, the planner and the executor read a row of it (the PE
    # dead-letters it) instead of failing on it at every restart.
    from fogshift.broker.datasource import _arrow_rows

    strange = [
        b'{"seq": 1e999, "timestamp": 0, "creator": "a", "body": "{}"}',  # int(inf)
        b'{"seq": 1, "timestamp": 1' + b"0" * 400 + b', "creator": "a", "body": "{}"}',
        b'{"seq": 9223372036854775808, "timestamp": 0, "creator": "a", "body": "{}"}',
        b'{"seq": -1, "timestamp": 0, "creator": "a", "body": "{}"}',
        b"[" * 100_000 + b"]" * 100_000,  # nested too deep for json
        # A creator no PE has: the reader's own control rows of key moves, which a data
        # message could otherwise pass for (stopping a partition, handing a key's state away).
        b'{"seq": 1, "timestamp": 0, "creator": "fogshift:key-out", "body": "{}"}',
        b'{"seq": 1, "timestamp": 0, "creator": "fogshift:key-in", "body": "{}"}',
        b'{"seq": 1, "timestamp": 0, "creator": "?", "body": "{}"}',
        # A lone surrogate (a JSON escape no writer of ours makes): Arrow refused the row.
        b'{"seq": 1, "timestamp": 0, "creator": "a", "body": "\\ud800"}',
        b'{"seq": 1, "timestamp": 0, "creator": "\\udfff", "body": "{}"}',
    ]
    for data in strange:
        seq, timestamp, creator, body = event_fields(data)
        assert (seq, timestamp, creator) == (0, 0.0, "?")
        assert body == data.decode()
    rows = [(k, *event_fields(data)) for k, data in enumerate(strange, 1)]
    assert _arrow_rows(rows).num_rows == len(strange)


@pytest.mark.parametrize("status", ["204", "404", "500"])
def test_a_stored_message_with_a_status_header_of_its_own_is_read_as_a_message(
    js_client: SyncJetStream, status: str
) -> None:
    # nats-py files a message's own `Status` header where the broker's status line goes: it
    # was taken for the end of the batch (the messages after it never read) or an error (a
    # reader failing at every retry). A partition's node may publish on its input's .keys.
    from fogshift.broker.client import read_ahead

    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    subject = data_subject("t", pe)
    for n in range(3):
        headers = {"Status": status} if n == 1 else None
        js_client.run(lambda js, n=n, h=headers: js.publish(subject, b"m%d" % n, headers=h))
    got = js_client.run(lambda js: get_range(js, stream, subject, 0, 10))
    assert [m.data for m in got] == [b"m0", b"m1", b"m2"]
    assert got[1].headers.get("Status") == status
    ahead = js_client.run(lambda js: read_ahead(js, stream, 0, 100))
    assert [m.seq for m in ahead] == [1, 2, 3]


def test_records_beyond_one_atomic_batch_are_stored_in_order_and_once(
    js_client: SyncJetStream,
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    count = 2 * publish.ATOMIC_BATCH_MAX + 345
    dead = set(range(7, count, 50))
    batch = records(list(range(1, count + 1)), dead)
    assert js_client.run(lambda js: publish_records(js, "t", pe, reversed(batch))) == count
    # A re-execution that overlaps the last chunk appends only what is new.
    more = records(list(range(count - 10, count + 6)))
    assert js_client.run(lambda js: publish_records(js, "t", pe, more)) == 5
    data = js_client.run(lambda js: get_range(js, stream, data_subject("t", pe), 0, count + 5))
    dead_letters = js_client.run(lambda js: get_range(js, stream, dead_subject("t", pe), 0, 10**9))
    assert [json.loads(m.data)["seq"] for m in data] == [
        o for o in range(1, count + 6) if o not in dead
    ]
    assert [json.loads(m.data)["seq"] for m in dead_letters] == sorted(dead)
    stored = sorted(data + dead_letters, key=lambda m: m.seq)
    assert [m.seq for m in stored] == list(range(1, count + 6))
    assert [int(m.headers["Fogshift-Origin"]) for m in stored] == list(range(1, count + 6))


def test_a_fence_between_two_atomic_batches_stops_the_writer_with_nothing_after_it(
    js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    orchestrator = SyncJetStream(js_client.address)
    chunks = publish._chunks

    def fenced_after_the_first(messages: list) -> Iterator[list]:  # type: ignore[type-arg]
        for n, chunk in enumerate(chunks(messages)):
            if n == 1:  # the first chunk is stored: the orchestrator fences, for real
                orchestrator.run(lambda js: publish.fence(js, "t", pe, 2))
            yield chunk

    monkeypatch.setattr(publish, "_chunks", fenced_after_the_first)
    try:
        batch = records(list(range(1, publish.ATOMIC_BATCH_MAX + 11)))
        with pytest.raises(Fenced):
            js_client.run(lambda js: publish_records(js, "t", pe, batch, epoch=1))
    finally:
        orchestrator.close()
    # The first chunk whole, then the fence marker, and nothing of the refused chunk.
    assert js_client.run(lambda js: last_seq(js, stream)) == publish.ATOMIC_BATCH_MAX + 1
    tail = js_client.run(lambda js: publish.read_tail(js, stream))
    assert (tail.epoch, tail.position) == (2, (publish.ATOMIC_BATCH_MAX, 0))


def test_streams_made_without_atomic_batches_or_direct_gets_are_still_written_and_read(
    js_client: SyncJetStream,
) -> None:
    from nats.js.api import StreamConfig

    from fogshift.broker.naming import stream_subjects

    pe = f"pe{next(_names)}"
    stream = stream_name("t", pe)
    config = StreamConfig(name=stream, subjects=stream_subjects("t", pe))
    js_client.run(lambda js: js.add_stream(config))
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2, 3], {2}))) == 3
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([2, 3, 4]))) == 1
    got = js_client.run(lambda js: get_range(js, stream, data_subject("t", pe), 0, 4))
    assert [m.seq for m in got] == [1, 3, 4]
    assert [json.loads(m.data)["seq"] for m in got] == [1, 3, 4]


def test_a_stream_whose_atomic_batches_another_writer_holds_is_written_one_by_one(
    js_client: SyncJetStream,
) -> None:
    # A partition's node may append key states to its input's stream: it opened the 50
    # atomic batches a stream takes and never committed them, and the upstream PE's writer
    # failed every batch ("atomic publish too many inflight"), on another node.
    from fogshift.broker.client import connection_of

    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)

    async def hold(js: Any) -> None:
        nc = connection_of(js)
        for n in range(60):
            await nc.publish(data_subject("t", pe), b"{}", headers={
                publish.BATCH_ID_HEADER: f"held{n}", publish.BATCH_SEQUENCE_HEADER: "1",
            })  # fmt: skip
        await nc.flush()

    js_client.run(hold)
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2, 3], {2}))) == 3
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([3, 4]))) == 1
    stored = js_client.run(lambda js: get_range(js, stream, data_subject("t", pe), 0, 10))
    assert [json.loads(m.data)["seq"] for m in stored] == [1, 3, 4]
    assert js_client.run(lambda js: last_seq(js, stream)) == 4  # the dead letter between


def test_a_stream_made_before_the_state_subject_gets_it_and_keeps_its_messages(
    js_client: SyncJetStream,
) -> None:
    # A stream an older fogshift made has no `.state` subject, nor `.state.*.*`, where key
    # moves now put a large state's parts: made sure of, it has every subject and still its
    # messages.
    from nats.js.api import StreamConfig

    from fogshift.broker.naming import state_subject, state_subjects, stream_subjects

    pe = f"pe{next(_names)}"
    stream = stream_name("t", pe)
    newer = (state_subject("t", pe), state_subjects("t", pe, "*"))
    older = [s for s in stream_subjects("t", pe) if s not in newer]
    js_client.run(lambda js: js.add_stream(StreamConfig(name=stream, subjects=older)))
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2]))) == 2
    js_client.run(lambda js: ensure_pe_stream(js, "t", pe))
    info = js_client.run(lambda js: js.stream_info(stream))
    assert sorted(info.config.subjects or []) == sorted(stream_subjects("t", pe))
    for seq, subject in enumerate((state_subject("t", pe), state_subject("t", pe, 0, "agg")), 3):
        ack = js_client.run(lambda js, s=subject: js.publish(s, b"part", stream=stream))
        assert ack.seq == seq and js_client.run(lambda js: last_seq(js, stream)) == seq


def test_get_range_skips_other_subjects_and_honours_bounds(js_client: SyncJetStream) -> None:
    pe = fresh_pe(js_client)
    js_client.run(lambda js: publish_records(js, "t", pe, records(list(range(1, 11)), {3, 7})))
    stream, subject = stream_name("t", pe), data_subject("t", pe)
    got = js_client.run(lambda js: get_range(js, stream, subject, 0, 10))
    assert [m.seq for m in got] == [1, 2, 4, 5, 6, 8, 9, 10]
    assert all(m.subject == subject and "Nats-Sequence" not in m.headers for m in got)
    middle = js_client.run(lambda js: get_range(js, stream, subject, 2, 7))
    assert [m.seq for m in middle] == [4, 5, 6]
    assert js_client.run(lambda js: get_range(js, stream, subject, 5, 5)) == []
    assert js_client.run(lambda js: get_range(js, stream, subject, 10, 20)) == []


@pytest.mark.parametrize("atomic", [True, False])
def test_message_ids_taken_ahead_neither_stall_nor_drop_the_writers_records(
    js_client: SyncJetStream, atomic: bool
) -> None:
    # Every node reading a stream may publish in it (a partition's key states), and the ids
    # of a writer's next records were its position: taken ahead, they made the broker refuse
    # each atomic batch as a repeat (the writer gave up after 100 tries) or, a record at a
    # time, acknowledge it as a repeat without storing it (lost).
    from nats.js.api import StreamConfig

    from fogshift.broker.naming import keys_subject, stream_subjects
    from fogshift.events import message_id

    pe = f"pe{next(_names)}"
    stream = stream_name("t", pe)
    if atomic:
        js_client.run(lambda js: ensure_pe_stream(js, "t", pe))
    else:
        config = StreamConfig(name=stream, subjects=stream_subjects("t", pe))
        js_client.run(lambda js: js.add_stream(config))
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([1]))) == 1
    for origin in (2, 3):
        squat = {"Nats-Msg-Id": message_id("t", pe, origin, 0)}
        js_client.run(lambda js, h=squat: js.publish(keys_subject("t", pe), b"x", headers=h))
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([2, 3]))) == 2
    got = js_client.run(lambda js: get_range(js, stream, data_subject("t", pe), 0, 10))
    assert [json.loads(m.data)["seq"] for m in got] == [1, 2, 3]


def test_a_batch_the_broker_found_incomplete_is_sent_again_whole(
    js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker reloading its accounts (each placement change) drops a plain publish it has
    no route for yet: the batch's commit then finds it incomplete and stores nothing. The
    writer sends the batch again, each record once."""
    pe = fresh_pe(js_client)
    always = False

    def where(subject: str, headers: dict[str, str]) -> str | None:
        second = headers.get(publish.BATCH_SEQUENCE_HEADER) == "2"
        return None if second and (not dropped or always) else subject  # (the reload's)

    dropped = redirect(monkeypatch, publish, where)
    assert js_client.run(lambda js: publish_records(js, "t", pe, records([1, 2, 3]))) == 3
    assert dropped == [data_subject("t", pe)]
    stored = js_client.run(
        lambda js: get_range(js, stream_name("t", pe), data_subject("t", pe), 0, 100)
    )
    assert [json.loads(m.data)["seq"] for m in stored] == [1, 2, 3]
    # A batch refused as incomplete after a long send (the broker's batch timeout, which a
    # slow link would outlast again) is not sent again.
    monkeypatch.setattr(publish, "INCOMPLETE_QUICK_S", 0.0)
    always = True
    dropped.clear()
    with pytest.raises(BrokerError, match="incomplete"):
        js_client.run(lambda js: publish_records(js, "t", pe, records([4, 5, 6])))
    assert len(dropped) == 1


def test_the_writer_cuts_a_dead_letter_carrying_its_input_whole(
    js_client: SyncJetStream, tmp_path: Path
) -> None:
    # A JVM operator's dead letter carries its input as received: the writer cuts it to the
    # record size limit as the Python processors cut theirs (a record must be appendable).
    import pyarrow as pa

    from fogshift.broker.datasource import JetStreamWriter
    from fogshift.events import fit_dead_letter

    pe = fresh_pe(js_client)
    broker = js_client.address.save(tmp_path / "broker.json")
    limit = 4096
    writer = JetStreamWriter({"broker": str(broker), "pipeline": "t", "pe": pe, "epoch": "1",
                              "max_record_bytes": str(limit)})  # fmt: skip
    huge = json.dumps({"v": "x" * 20_000})
    small = fit_dead_letter(2, 0.0, "pe", '{"v": "y"}', "not a number", limit)
    rows = [
        {"origin": 1, "idx": 0, "seq": 1, "timestamp": 0.0, "creator": "pe", "body": huge,
         "dead": "field 'v' is 'xxx', not a finite number"},
        {"origin": 2, "idx": 0, "seq": 2, "timestamp": 0.0, "creator": "pe", "body": small[0],
         "dead": small[1]},
        {"origin": 3, "idx": 0, "seq": 3, "timestamp": 0.0, "creator": "pe", "body": '{"v":1}',
         "dead": None},
    ]  # fmt: skip
    writer.write(iter([pa.RecordBatch.from_pylist(rows)]))
    stored = js_client.run(lambda js: get_range(js, stream_name("t", pe), dead_subject("t", pe),
                                                0, 10))  # fmt: skip
    letters = [json.loads(m.data) for m in stored]
    assert [len(m.data) <= limit for m in stored] == [True, True]
    assert letters[0]["body"].startswith(huge[:1000])
    assert letters[0]["body"].endswith(f" ...[cut: {len(huge)} characters in all]")
    assert letters[0]["reason"] == "field 'v' is 'xxx', not a finite number"
    assert (letters[1]["body"], letters[1]["reason"]) == small  # already fitting: unchanged


def test_a_fence_lands_between_an_old_instance_s_bursts_however_many_tries_it_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A zombie appending a large batch (pipelined) moved the tail under each of fifty
    # immediate tries: the restore failed with "its stream keeps moving".
    import asyncio

    from nats.js.errors import APIError

    tail = {"seq": 10}
    headers_sent: list[dict[str, str]] = []

    async def read_tail(js: object, stream: str) -> publish.StreamTail:
        return publish.StreamTail(tail["seq"], tail["seq"], (1, tail["seq"]), 2)

    class Moving:
        """A stream the old instance appends to under each of the first 120 tries."""

        async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> object:
            headers_sent.append(headers)
            if len(headers_sent) <= 120:
                tail["seq"] += 1
                raise APIError(err_code=publish.WRONG_LAST_SEQUENCE)
            return type("Ack", (), {"seq": tail["seq"] + 1})()

    monkeypatch.setattr(publish, "read_tail", read_tail)
    monkeypatch.setattr(publish, "FENCE_PAUSE_S", 0.0)  # (the pauses' length is not tested)
    assert asyncio.run(publish.fence(Moving(), "p", "pe", 3)) == 131  # type: ignore[arg-type]
    last = headers_sent[-1]
    assert last["Nats-Expected-Last-Sequence"] == "130" and last["Fogshift-Epoch"] == "3"
    # Given up only after its time, saying why.
    headers_sent.clear()
    monkeypatch.setattr(publish, "FENCE_WAIT_S", 0.0)
    with pytest.raises(BrokerError, match="kept moving for 0 s \\(1 markers refused\\)"):
        asyncio.run(publish.fence(Moving(), "p", "pe", 3))  # type: ignore[arg-type]
