"""The orchestrator trims its pipelines' streams below every reader's checkpoints, once old
(fogshift.orchestrator.history): a real orchestrator object and a real nats-server; the
central store's checkpoints stand in as their manifests' offsets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.client import SyncJetStream, ensure_pe_stream, get_range
from fogshift.broker.naming import data_subject, dead_subject, stream_name
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import BrokerProcess
from fogshift.contracts import ElementProgress
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.core import Followed
from fogshift.orchestrator.history import horizon
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec
from tests.orchestrator.standin import SPEC

pytestmark = pytest.mark.integration

LATER = 60.0  # seconds ahead: every record is older than the pipelines' history then


def test_the_horizon_is_the_least_position_any_reader_may_resume_from() -> None:
    at = {"positions": {"s": 7, "t": 2}}
    assert horizon("s", {"a": [at, {"positions": {"s": 4}}], "b": [{"positions": {"s": 9}}]}) == 4
    assert horizon("s", {"a": [at], "b": []}) is None  # b would read from the start
    assert horizon("s", {"a": [at, {"positions": {"t": 3}}]}) is None
    assert horizon("s", {"a": [at, None]}) is None  # a standby not seen yet
    assert horizon("s", {}) is None


@pytest.fixture
def orch(tmp_path: Path, nats_server: BrokerProcess) -> Iterator[Orchestrator]:
    broker = nats_server.address.save(tmp_path / "broker.json")
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orchestrator = Orchestrator(config)
    try:
        yield orchestrator
    finally:
        orchestrator.close()


def _deploy(orch: Orchestrator, js_client: SyncJetStream, tmp_path: Path, name: str,
            recovery: dict[str, Any]) -> dict[str, list[int]]:  # fmt: skip
    """Pipeline ``name`` (source -> aggregate -> sink) with 10 records in the source's stream
    and 5 in the aggregate's: their data sequences."""
    spec = parse_spec({**SPEC, "pipeline": name, "recovery": recovery}, tmp_path)
    orch.registry.put_pipeline(spec, "running")
    seqs = {}
    for pe, count in (("source", 10), ("aggregate", 5)):
        records = [
            Record(o, 0, o, 1.0, pe, json.dumps({"v": o}), None) for o in range(1, count + 1)
        ]
        js_client.run(lambda js, p=pe, r=records: ensure_pe_stream(js, name, p))
        js_client.run(lambda js, p=pe, r=records: publish_records(js, name, p, r, epoch=1))
        seqs[pe] = _data_seqs(js_client, name, pe)
    return seqs


def _data_seqs(js_client: SyncJetStream, pipeline: str, pe: str) -> list[int]:
    stream, subject = stream_name(pipeline, pe), data_subject(pipeline, pe)
    return [m.seq for m in js_client.run(lambda js: get_range(js, stream, subject, 0, 1_000))]


def _checkpoints(
    orch: Orchestrator,
    monkeypatch: pytest.MonkeyPatch,
    positions: dict[str, list[int]],
    epoch: int | None = None,
) -> None:
    """The central store keeps, per reader, checkpoints of its instance (``epoch``: its
    current one) whose warm copies would start at these positions of the source (their
    offsets lie further on: only the resume floors count)."""

    def manifest(pipeline: str, pe: str, at: int) -> dict[str, Any]:
        return {
            "offset": {"type": "jetstream", "positions": {"source": at + 100}},
            "resume_floor": {"type": "jetstream", "positions": {"source": at}},
            "epoch": orch.registry.epoch(pipeline, pe) if epoch is None else epoch,
        }

    monkeypatch.setattr(
        orch.central,
        "manifests",
        lambda pipeline, pe: [manifest(pipeline, pe, at) for at in positions.get(pe, [])],
    )


def _trim(orch: Orchestrator) -> None:
    orch._trimmed_at.clear()  # (a round trims a pipeline at most every TRIM_EVERY_S)
    orch.trim_streams(at=time.time() + LATER)


def test_records_below_every_readers_checkpoints_go_once_old(
    orch: Orchestrator, js_client: SyncJetStream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = _deploy(orch, js_client, tmp_path, "p", {"history_s": 30})
    source = seqs["source"]
    _checkpoints(orch, monkeypatch, {"aggregate": [source[6], source[3]]})
    orch.trim_streams()  # nothing is 30 s old yet
    assert _data_seqs(js_client, "p", "source") == source
    _trim(orch)
    # Below the aggregate's oldest checkpoint only; the aggregate's own stream stays whole,
    # its reader (the sink) having no checkpoint yet (it would read from the start).
    assert _data_seqs(js_client, "p", "source") == source[3:]
    assert _data_seqs(js_client, "p", "aggregate") == seqs["aggregate"]
    assert orch.registry.trimmed("p") == {"source": (3, 0)}
    # What the status counts as the source's output still counts the trimmed records.
    (status,) = orch.status("p")
    assert {e.element: e.events_out for e in status.elements}["source"] == 10

    # A reader with a standby the follower has not seen yet holds its stream whole; once
    # seen, its position counts like a checkpoint's.
    _checkpoints(orch, monkeypatch, {"aggregate": [source[8]]})
    orch.registry.add_standby("p", "aggregate", "fog-b")
    _trim(orch)
    assert _data_seqs(js_client, "p", "source") == source[3:]
    behind = {"type": "jetstream", "positions": {"source": source[5]}}
    # (One seen of a standby dropped since, under another epoch, says nothing of this one.)
    old = ElementProgress(
        pipeline="p",
        element="aggregate",
        state="running",
        epoch=1,
        offset={"type": "jetstream", "positions": {"source": source[8]}},
    )
    orch.followed[("p", "aggregate")] = Followed(primary=old, standby=old)
    _trim(orch)
    assert _data_seqs(js_client, "p", "source") == source[3:]
    standby = orch.registry.standby("p", "aggregate")
    assert standby is not None
    seen = ElementProgress(pipeline="p", element="aggregate", state="running",
                           epoch=standby.epoch, offset=behind)  # fmt: skip
    orch.followed[("p", "aggregate")] = Followed(primary=seen, standby=seen)
    # Nor while a standby's copy of the reader is taken, outside its section.
    orch._standby_copies.add(("p", "aggregate"))
    _trim(orch)
    assert _data_seqs(js_client, "p", "source") == source[3:]
    orch._standby_copies.clear()
    # Nor while the reader is being migrated or restored (its copy may be older).
    orch._migrating[("p", "aggregate")] = "migration"
    _trim(orch)
    assert _data_seqs(js_client, "p", "source") == source[3:]
    del orch._migrating[("p", "aggregate")]
    _trim(orch)
    assert _data_seqs(js_client, "p", "source") == source[5:]
    assert orch.registry.trimmed("p") == {"source": (5, 0)}
    # A new instance of the reader (promoted, restored: a new epoch) may stand behind its
    # predecessor's checkpoints: nothing more goes until it has one of its own.
    orch.registry.drop_standby("p", "aggregate")
    orch.registry.next_epoch("p", "aggregate")
    _checkpoints(orch, monkeypatch, {"aggregate": [source[9]]}, epoch=1)
    _trim(orch)
    assert _data_seqs(js_client, "p", "source") == source[5:]
    _checkpoints(orch, monkeypatch, {"aggregate": [source[9], source[7]]})
    _trim(orch)
    assert _data_seqs(js_client, "p", "source") == source[7:]
    assert orch.registry.trimmed("p") == {"source": (7, 0)}
    # A fresh deploy starts the count anew.
    orch.registry.put_pipeline(orch.registry.get_pipeline("p").spec, "running")  # type: ignore[union-attr]
    assert orch.registry.trimmed("p") == {}


def test_a_stream_held_from_trimming_past_its_history_is_a_warning_of_the_status(
    orch: Orchestrator, js_client: SyncJetStream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing bounds the broker's disk but trimming, which a reader with no central
    # checkpoint of its instance (pulls failing over a slow link) held for good, silently:
    # the disk filled, and every append of the pipeline was refused.
    seqs = _deploy(orch, js_client, tmp_path, "held", {"history_s": 30})
    _checkpoints(orch, monkeypatch, {"aggregate": [seqs["source"][3]]}, epoch=7)
    _trim(orch)
    assert _data_seqs(js_client, "held", "source") == seqs["source"]  # held
    (status,) = orch.status("held")
    assert status.warnings == []  # (not yet: held for less than its history)
    since, why, noted = orch._trim_held[("held", "source")]
    orch._trim_held[("held", "source")] = (since - 46, why, noted)  # 46 s of a 30 s history
    (status,) = orch.status("held")
    (warning,) = [w for w in status.warnings if "held/source" in w]
    assert "has not been trimmed for 46.0 s (recovery.history_s 30 s)" in warning
    assert "its reader aggregate has no central checkpoint of its instance now" in warning
    # Held again after a while without rounds (the pipeline stopped, then started): counted
    # from then, not from the first hold (a pipeline started after hours warned at once).
    orch._trim_held[("held", "source")] = (since - 46, why, noted - 1000)
    _trim(orch)
    (status,) = orch.status("held")
    assert not [w for w in status.warnings if "held/source" in w]
    # Its reader's checkpoint stored: trimmed, and the warning gone.
    _checkpoints(orch, monkeypatch, {"aggregate": [seqs["source"][3]]})
    _trim(orch)
    assert _data_seqs(js_client, "held", "source") == seqs["source"][3:]
    (status,) = orch.status("held")
    assert not [w for w in status.warnings if "held/source" in w]


def test_a_pipeline_keeping_its_history_for_good_is_never_trimmed(
    orch: Orchestrator, js_client: SyncJetStream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = _deploy(orch, js_client, tmp_path, "kept", {"history_s": None})
    _checkpoints(orch, monkeypatch, {"aggregate": [seqs["source"][-1]], "sink": [99]})
    _trim(orch)
    assert _data_seqs(js_client, "kept", "source") == seqs["source"]
    assert orch.registry.trimmed("kept") == {}


def test_old_dead_letters_go_whoever_reads_the_stream_and_are_still_counted(
    orch: Orchestrator, js_client: SyncJetStream, tmp_path: Path
) -> None:
    _deploy(orch, js_client, tmp_path, "dl", {"history_s": 30})
    dead = [Record(o, 0, o, 1.0, "sink", json.dumps({"v": o}), "no good") for o in (1, 2, 3)]
    js_client.run(lambda js: ensure_pe_stream(js, "dl", "sink"))
    js_client.run(lambda js: publish_records(js, "dl", "sink", dead, epoch=1))
    stream, subject = stream_name("dl", "sink"), dead_subject("dl", "sink")
    stored = [m.seq for m in js_client.run(lambda js: get_range(js, stream, subject, 0, 99))]
    assert len(stored) == 3
    _trim(orch)  # (no reader has a checkpoint: no data record goes, dead letters do)
    left = [m.seq for m in js_client.run(lambda js: get_range(js, stream, subject, 0, 99))]
    assert left == stored[-1:]  # the last stays: its writer's tail
    assert orch.registry.trimmed("dl") == {"sink": (0, 2)}
    assert _data_seqs(js_client, "dl", "source") == list(range(1, 11))
    (status,) = orch.status("dl")
    assert {e.element: e.dead_letters for e in status.elements}["sink"] == 3


def test_a_stream_no_element_reads_keeps_its_records_history_s_by_age_alone(
    orch: Orchestrator, js_client: SyncJetStream, tmp_path: Path
) -> None:
    # The pipeline's result (a processor nobody in it reads) was kept for good: a busy
    # pipeline's result filled the broker's disk, and then every append was refused.
    # Partitions nobody reads yet (a scale gives their consumer its input after starting
    # them) stay whole.
    source, aggregate, _ = SPEC["elements"]
    parts = {**aggregate, "id": "keyed", "key_by": "sensor", "partitions": ["fog-a", "fog-b"]}
    del parts["node"]
    spec = {**SPEC, "pipeline": "end", "recovery": {"history_s": 30},
            "elements": [source, aggregate, parts]}  # fmt: skip
    orch.registry.put_pipeline(parse_spec(spec, tmp_path), "running")
    js_client.run(lambda js: ensure_pe_stream(js, "end", "keyed-p1"))  # (empty)
    for pe in ("source", "aggregate", "keyed-p0"):
        records = [Record(o, 0, o, 1.0, pe, json.dumps({"v": o}), None) for o in range(1, 6)]
        js_client.run(lambda js, p=pe: ensure_pe_stream(js, "end", p))
        js_client.run(lambda js, p=pe, r=records: publish_records(js, "end", p, r, epoch=1))
    stored = {pe: _data_seqs(js_client, "end", pe) for pe in ("source", "aggregate", "keyed-p0")}
    orch.trim_streams()  # nothing is 30 s old yet
    assert _data_seqs(js_client, "end", "aggregate") == stored["aggregate"]
    _trim(orch)
    assert _data_seqs(js_client, "end", "aggregate") == stored["aggregate"][-1:]  # its tail
    assert _data_seqs(js_client, "end", "keyed-p0") == stored["keyed-p0"]
    # Read by the aggregate and the partitions, which have no checkpoint yet: whole.
    assert _data_seqs(js_client, "end", "source") == stored["source"]
    assert orch.registry.trimmed("end") == {"aggregate": (4, 0)}
