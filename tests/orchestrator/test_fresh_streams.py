"""A fresh deploy's streams, against a real nats-server: every stream of the name's PEs
starts over, those of PEs the spec no longer has included."""

from __future__ import annotations

from typing import Any

import pytest

from fogshift.broker.client import (
    SyncJetStream,
    ensure_pe_stream,
    last_seq,
    pipeline_streams,
)
from fogshift.broker.naming import data_subject, stream_name
from fogshift.orchestrator.deployment import fresh_streams
from fogshift.spec.loader import parse_spec

pytestmark = pytest.mark.integration

SPEC = {
    "pipeline": "fresh",
    "elements": [
        {"id": "src", "kind": "csv-source", "node": "a", "options": {"path": "/etc/hostname"}},
        {"id": "agg", "kind": "window-aggregate", "partitions": ["a", "b"], "inputs": ["src"],
         "key_by": "k", "options": {"field": "v", "window": 2}},
        {"id": "out", "kind": "csv-sink", "node": "a", "inputs": ["agg"],
         "options": {"path": "/tmp/fogshift-fresh-streams-out.csv"}},
    ],
}  # fmt: skip


def test_a_fresh_deploy_drops_the_stream_of_a_partition_a_scale_added_before(
    js_client: SyncJetStream,
) -> None:
    spec = parse_spec(SPEC)
    ids = [e.id for e in spec.elements]
    assert "agg-p2" not in ids
    # The run before: scaled to three partitions, agg-p2's stream holds its outputs. And
    # pipelines whose names begin alike keep theirs.
    for pipeline, pe in (("fresh", "agg-p2"), ("fresh", "src"), ("fresh_x", "a"), ("freshy", "b")):
        js_client.run(lambda js, p=pipeline, e=pe: ensure_pe_stream(js, p, e))
        js_client.run(lambda js, p=pipeline, e=pe: js.publish(data_subject(p, e), b"old"))
    assert set(js_client.run(lambda js: pipeline_streams(js, "fresh"))) == {
        stream_name("fresh", "agg-p2"), stream_name("fresh", "src"),
    }  # fmt: skip
    js_client.run(lambda js: fresh_streams(js, spec, dict.fromkeys(ids, 2), 120.0))
    # A scale to three now makes agg-p2's stream anew (before: the old one, its records
    # taken as stored and read downstream).
    assert set(js_client.run(lambda js: pipeline_streams(js, "fresh"))) == {
        stream_name("fresh", pe) for pe in ids
    }
    for pe in ids:  # each holds its fence marker only
        assert js_client.run(lambda js, pe=pe: last_seq(js, stream_name("fresh", pe))) == 1
    for pipeline, pe in (("fresh_x", "a"), ("freshy", "b")):
        assert js_client.run(lambda js, p=pipeline, e=pe: last_seq(js, stream_name(p, e))) == 1


def test_a_fresh_deploy_keeps_another_users_streams_on_a_shared_broker(
    js_client: SyncJetStream,
) -> None:
    """Streams fogshift did not make whose subjects meet the pipeline's (``broker.url`` may
    name a broker others use) are neither listed nor deleted: a fresh deploy deleted a
    stream of ``fs.*.audit`` before, and with it another user's records."""
    spec = parse_spec({**SPEC, "pipeline": "shared"})
    ids = [e.id for e in spec.elements]

    async def streams(js: Any) -> None:
        await js.add_stream(name="AUDIT", subjects=["fs.*.audit"])
        # Named as a PE's stream of the pipeline, but not holding its subjects.
        await js.add_stream(name=stream_name("shared", "agg-p2"), subjects=["audit.agg"])
        await js.publish("fs.shared.audit", b"theirs")
        await js.publish("audit.agg", b"theirs too")

    js_client.run(streams)
    assert js_client.run(lambda js: pipeline_streams(js, "shared")) == []
    js_client.run(lambda js: fresh_streams(js, spec, dict.fromkeys(ids, 2), 120.0))
    for name in ("AUDIT", stream_name("shared", "agg-p2")):
        assert js_client.run(lambda js, n=name: last_seq(js, n)) == 1
    assert set(js_client.run(lambda js: pipeline_streams(js, "shared"))) == {
        stream_name("shared", pe) for pe in ids
    }
    for name in ("AUDIT", stream_name("shared", "agg-p2")):  # (the server is shared)
        js_client.run(lambda js, n=name: js.delete_stream(n))
