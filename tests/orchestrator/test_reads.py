"""What the orchestrator reads back from the streams (``events``, ``errors``, ``latency``):
a message no PE wrote, a body too deep to carry, or a stream that is missing is never a 500.

A real orchestrator and nats-server; stand-in agents (``standin``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.client import SyncJetStream, delete_pe_stream
from fogshift.broker.naming import data_subject, dead_subject, stream_name
from fogshift.broker.publish import Record, publish_records
from fogshift.contracts import EventPage
from fogshift.orchestrator.service import Orchestrator
from tests.orchestrator.standin import StandIn
from tests.orchestrator.test_fencing import orch, spec  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration  # a real nats-server (no Spark, no agents): ~1 s


def test_strangers_messages_deep_bodies_and_missing_streams_are_read_without_failing(
    orch: Orchestrator,  # noqa: F811
    tmp_path: Path,
    agents: dict[str, StandIn],
    js_client: SyncJetStream,
) -> None:
    name = "reads"
    orch.deploy(spec(tmp_path, name))
    deep = "[" * 300 + "]" * 300  # JSON reads it; an answer (pydantic) carries ~254 levels
    records = [
        Record(1, 0, 1, 1.0, "aggregate", json.dumps({"value": 1.0})),
        Record(2, 0, 2, 2.0, "aggregate", deep),
    ]
    js_client.run(lambda j: publish_records(j, name, "aggregate", records, epoch=1))
    stream = stream_name(name, "aggregate")

    async def strangers(j: Any) -> None:
        for subject in (data_subject(name, "aggregate"), dead_subject(name, "aggregate")):
            await j.publish(subject, b"not a fogshift message", stream=stream)
            await j.publish(subject, json.dumps({"seq": "x"}).encode(), stream=stream)
        # Bodies no PE writes (not text, and too deep to carry), a timestamp beyond a float:
        # the whole answer failed (a 500), or its model.
        nested: Any = []
        for _ in range(300):
            nested = [nested]
        for odd in ({"seq": 3, "timestamp": 0.0, "creator": "x", "body": nested},
                    {"seq": 4, "timestamp": 1e400, "creator": "x", "body": "{}"}):  # fmt: skip
            for subject in (data_subject(name, "aggregate"), dead_subject(name, "aggregate")):
                await j.publish(subject, json.dumps(odd).encode().replace(b"Infinity", b"1e400"),
                                stream=stream)  # fmt: skip
        letter = {"seq": 7, "timestamp": 0.0, "creator": "source", "body": "{", "reason": "bad"}
        await j.publish(dead_subject(name, "aggregate"), json.dumps(letter).encode(),
                        stream=stream)  # fmt: skip

    js_client.run(strangers)
    page = orch.events(name, "aggregate")
    assert [e.body for e in page.events] == [{"value": 1.0}, deep]  # the deep one as text
    EventPage.model_validate_json(page.model_dump_json())  # an answer can carry it
    letters = orch.errors(name)
    assert [(d.element, d.seq, d.reason) for d in letters] == [("aggregate", 7, "bad")]
    # A stream a failed deploy or scale never made: nothing stored there, not an error.
    js_client.run(lambda j: delete_pe_stream(j, name, "sink"))
    assert orch.events(name, "sink").events == []
    assert orch.errors(name) == letters
    assert all(h.element != "sink" for h in orch.latency(name))


def test_a_partitioned_element_s_events_are_its_partitions_merged_by_when_stored(
    orch: Orchestrator,  # noqa: F811
    tmp_path: Path,
    agents: dict[str, StandIn],
    js_client: SyncJetStream,
) -> None:
    # `fogshift events P aggregate s1` of a partitioned element was refused ("it is
    # partitioned") while `fogshift state P aggregate s1` answered: a key's events since a
    # move are in its new partition's stream, those before in the one it left.
    from fogshift.exceptions import InvalidInput

    name = "merged"
    partitioned = spec(tmp_path, name)
    aggregate = partitioned["elements"][1]
    del aggregate["node"]
    aggregate.update(partitions=["fog-a", "fog-b"], key_by="sensor")
    orch.deploy(partitioned)
    written = [("aggregate-p0", "s1", 1.0), ("aggregate-p1", "s2", 2.0),
               ("aggregate-p0", "s2", 3.0), ("aggregate-p1", "s1", 4.0),
               ("aggregate-p1", "s1", 5.0)]  # fmt: skip
    for n, (part, sensor, value) in enumerate(written, 1):  # (one after another: stored so)
        body = json.dumps({"sensor": sensor, "value": value})
        record = Record(n, 0, n, float(n), part, body)
        js_client.run(lambda j, p=part, r=record: publish_records(j, name, p, [r], epoch=1))
    page = orch.events(name, "aggregate", "s1")
    assert [(e.partition, e.body["value"]) for e in page.events] == [
        ("aggregate-p0", 1.0),
        ("aggregate-p1", 4.0),
        ("aggregate-p1", 5.0),
    ]
    p1 = [e.seq for e in page.events if e.partition == "aggregate-p1"]
    assert len(p1) == 2 and p1 == sorted(p1)  # (in its own stream)
    every = orch.events(name, "aggregate", limit=3)  # the newest three, of both
    assert [e.body["value"] for e in every.events] == [3.0, 4.0, 5.0]
    assert orch.events(name, "aggregate-p1").events[0].partition is None  # (one stream)
    with pytest.raises(InvalidInput) as refused:
        orch.events(name, "aggregate", after=0)
    assert "aggregate-p0, aggregate-p1" in (refused.value.expected or "")
    # Both ways at once: tail was left out without a word.
    with pytest.raises(InvalidInput) as refused:
        orch.events(name, "aggregate-p1", after=0, tail=5)
    assert refused.value.received == "after=0, tail=5"


def test_a_partition_a_scale_in_retired_still_shows_its_events(
    orch: Orchestrator,  # noqa: F811
    tmp_path: Path,
    agents: dict[str, StandIn],
    js_client: SyncJetStream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Scaled back from three partitions to two, a key's alarms emitted while a third held
    # it were in the sink but `events` no longer listed them, and `events P aggregate-p2`
    # was an unknown element: its stream stays (fenced), which the sink still drains.
    import time

    from fogshift.broker.keys import Ownership

    name = "retired"
    partitioned = spec(tmp_path, name)
    aggregate = partitioned["elements"][1]
    del aggregate["node"]
    aggregate.update(partitions=["fog-a", "fog-b", "fog-a"], key_by="sensor")
    orch.deploy(partitioned)
    for n, (part, value) in enumerate([("aggregate-p2", 1.0), ("aggregate-p0", 2.0)], 1):
        record = Record(n, 0, n, float(n), part, json.dumps({"sensor": "s1", "value": value}))
        js_client.run(lambda j, p=part, r=record: publish_records(j, name, p, [r], epoch=1))
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(2))
    monkeypatch.setattr(orch, "_committed_past", lambda *args: True)
    parts = orch.pipeline(name).spec.partitions_of("aggregate")
    retired, why = orch._retire(name, parts, 2, "source", 1, time.monotonic() + 5)
    assert retired == {"aggregate-p2": "fog-a"} and why is None, why
    spec_now = orch.pipeline(name).spec
    assert [p.id for p in spec_now.partitions_of("aggregate")] == ["aggregate-p0", "aggregate-p1"]
    assert spec_now.retired_partitions_of("aggregate") == ["aggregate-p2"]
    page = orch.events(name, "aggregate", "s1")
    assert [(e.partition, e.body["value"]) for e in page.events] == [
        ("aggregate-p2", 1.0),
        ("aggregate-p0", 2.0),
    ]
    alone = orch.events(name, "aggregate-p2")
    assert [e.body["value"] for e in alone.events] == [1.0]
    with pytest.raises(UnknownElement):
        orch.events(name, "aggregate-p3")


def test_the_newest_dead_letters_are_read_from_the_streams_end(
    orch: Orchestrator,  # noqa: F811
    tmp_path: Path,
    agents: dict[str, StandIn],
    js_client: SyncJetStream,
) -> None:
    # Every dead letter of a stream was read, then all but `limit` dropped: now from the
    # end back in growing windows, as far as `limit` of them take (here: past 1,500 events).
    name = "tail"
    orch.deploy(spec(tmp_path, name))
    early = [Record(k, 0, k, 0.0, "aggregate", "{", dead=f"bad {k}") for k in (1, 2, 3)]
    events = [Record(k, 0, k, 0.0, "aggregate", json.dumps({"value": 1.0}))
              for k in range(4, 1504)]  # fmt: skip
    late = [Record(1504, 0, 1504, 0.0, "aggregate", "{", dead="bad 1504")]
    js_client.run(lambda j: publish_records(j, name, "aggregate", early + events + late, epoch=1))
    newest = [(d.seq, d.reason) for d in orch.errors(name, limit=2)]
    assert newest == [(3, "bad 3"), (1504, "bad 1504")]
    assert [d.seq for d in orch.errors(name)] == [1, 2, 3, 1504]
    assert [d.seq for d in orch.errors(name, limit=1)] == [1504]
