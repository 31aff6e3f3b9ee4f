"""Idempotent single-writer appends, against a real nats-server."""

from __future__ import annotations

import itertools
import json

import pytest

from fogshift.broker import publish
from fogshift.broker.client import SyncJetStream, ensure_pe_stream, fetch_range, last_seq
from fogshift.broker.exceptions import WriterConflict
from fogshift.broker.naming import data_subject, stream_name
from fogshift.broker.publish import Record, publish_records

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


def test_a_racing_writer_is_detected(
    js_client: SyncJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    pe = fresh_pe(js_client)
    stream = stream_name("t", pe)
    js_client.run(lambda js: publish_records(js, "t", pe, records([1])))
    seen = js_client.run(lambda js: publish.last_position(js, stream))
    # Writer A appends; writer B had read the last position before that.
    js_client.run(lambda js: publish_records(js, "t", pe, records([2])))

    async def stale(js: object, name: str) -> tuple[int, tuple[int, int]]:
        return seen

    monkeypatch.setattr(publish, "last_position", stale)
    with pytest.raises(WriterConflict, match="another writer"):
        js_client.run(lambda js: publish_records(js, "t", pe, records([3])))
    monkeypatch.undo()
    assert js_client.run(lambda js: last_seq(js, stream)) == 2


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
    from fogshift.broker.datasource import _event_fields

    assert _event_fields(b'{"seq": 3, "timestamp": 1.5, "creator": "s", "body": "{}"}') == (
        3,
        1.5,
        "s",
        "{}",
    )
    assert _event_fields(b"not json at all") == (0, 0.0, "?", "not json at all")
