"""Failures in the middle of a migration or restore never leave a PE fenced with nobody
writing, nor two writers under one epoch; redeployments never reuse an epoch.

A real orchestrator, a real nats-server (fence markers, streams), and real HTTP servers
standing in for the node agents (``standin``), told to fail where each test needs it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.client import SyncJetStream
from fogshift.broker.exceptions import Fenced
from fogshift.broker.naming import fence_subject, stream_name
from fogshift.broker.publish import Record, last_position, publish_records
from fogshift.broker.server import BrokerProcess
from fogshift.common.headers import INFO_HEADER, SHA_HEADER
from fogshift.contracts import Heartbeat, PipelineState
from fogshift.exceptions import Conflict
from fogshift.migration.exceptions import MigrationFailed
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.exceptions import PipelineExists
from fogshift.orchestrator.permissions import hosted_by_node
from fogshift.orchestrator.service import Orchestrator
from fogshift.restoration.exceptions import RestoreFailed
from tests.orchestrator.standin import StandIn

pytestmark = pytest.mark.integration  # a real nats-server (no Spark, no agents): ~1 s
_names = itertools.count()


def spec(tmp_path: Path, name: str) -> dict[str, Any]:
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n1,s1,2.0\n")
    return {
        "pipeline": name,
        "elements": [
            {"id": "source", "kind": "csv-source", "node": "cloud",
             "options": {"path": str(tmp_path / "in.csv")}},
            {"id": "aggregate", "kind": "window-aggregate", "node": "fog-a",
             "inputs": ["source"], "options": {"field": "value", "window": 3}},
            {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["aggregate"],
             "options": {"path": str(tmp_path / "out" / "o.csv")}},
        ],
    }  # fmt: skip


@pytest.fixture
def orch(
    tmp_path: Path, nats_server: BrokerProcess, agents: dict[str, StandIn]
) -> Iterator[Orchestrator]:
    broker = nats_server.address.save(tmp_path / "broker.json")
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orchestrator = Orchestrator(config)
    for name, agent in agents.items():
        orchestrator.heartbeat(
            name, Heartbeat.model_validate({"url": agent.url, "ready": True, "elements": []})
        )
    yield orchestrator
    orchestrator.close()


@pytest.fixture
def pipeline(orch: Orchestrator, tmp_path: Path, agents: dict[str, StandIn]) -> str:
    """A pipeline deployed (on the stand-ins) under a name of its own; the aggregate on fog-a."""
    name = f"fence{next(_names)}"
    orch.deploy(spec(tmp_path, name))
    running = {"cloud": ["source", "sink"], "fog-a": ["aggregate"]}
    for node, agent in agents.items():
        elements = [{"pipeline": name, "element": e, "state": "running", "epoch": 1}
                    for e in running.get(node, [])]  # fmt: skip
        orch.heartbeat(
            node, Heartbeat.model_validate({"url": agent.url, "ready": True, "elements": elements})
        )
        agent.calls.clear()
    return name


def tail(js_client: SyncJetStream, pipeline: str, pe: str) -> tuple[str, int]:
    """The subject and epoch of the last message of a PE's output stream."""

    async def last(js: Any) -> tuple[str, int]:
        seq, _, epoch = await last_position(js, stream_name(pipeline, pe))
        msg = await js.get_msg(stream_name(pipeline, pe), seq=seq)
        return msg.subject, epoch

    return js_client.run(last)


def literal_migration_answers(agents: dict[str, StandIn], here: str) -> None:
    """fog-a pauses at input position 30 and ships a checkpoint; fog-b takes it and runs."""
    offset = {"type": "jetstream", "positions": {"source": 30}}
    pe = {"pipeline": here.split("/")[2], "element": "aggregate"}  # a PE's answers name it
    agents["fog-a"].answer("POST", here + "/pause", body={
        **pe, "state": "paused", "committed_batch": 3, "offset": offset,
        "progress": 30})  # fmt: skip
    agents["fog-a"].answer(
        "GET", here + "/checkpoint", content=b"checkpoint",
        headers={SHA_HEADER: "0" * 64, INFO_HEADER: json.dumps({"batch": 3, "offset": offset})},
    )  # fmt: skip
    agents["fog-b"].answer("GET", here + "/progress", body={
        **pe, "state": "running", "committed_batch": 4, "progress": 31, "error": None})  # fmt: skip


def test_a_redeployment_fences_instances_of_the_earlier_one(
    orch: Orchestrator, tmp_path: Path, agents: dict[str, StandIn], js_client: SyncJetStream
) -> None:
    name = f"fence{next(_names)}"
    orch.deploy(spec(tmp_path, name))
    orch.stop(name)
    kept = tail(js_client, name, "aggregate")
    # Not unasked: it ran, and `start` would go on with what a deploy empties.
    with pytest.raises(PipelineExists) as refused:
        orch.deploy(spec(tmp_path, name))
    assert refused.value.to_dict() == {
        "code": "pipeline_exists",
        "message": f"pipeline {name!r} is stopped, its streams, checkpoints and output kept: "
        "deployed again, it would start over with them emptied",
        "expected": f"a name no kept pipeline has, or a deploy asked to start {name!r} over "
        "(`--fresh`)",
        "received": f"{name!r}, stopped",
        "hint": f"`fogshift start {name}` goes on where it stopped; `fogshift deploy SPEC "
        "--fresh` starts it over (its sinks' files begin empty: copy what you keep of them "
        f"first); `fogshift delete {name}` removes it",
    }
    assert tail(js_client, name, "aggregate") == kept  # nothing changed
    orch.registry.set_status(name, PipelineState.STOPPING)  # (a stop a dead one left)
    with pytest.raises(PipelineExists, match=f"pipeline {name!r} is stopping, its streams"):
        orch.deploy(spec(tmp_path, name))
    orch.registry.set_status(name, PipelineState.STOPPED)
    assert len(agents["fog-a"].received("PUT", f"/pipelines/{name}/elements/aggregate")) == 1
    orch.deploy(spec(tmp_path, name), fresh=True)
    puts = [
        c.body for c in agents["fog-a"].received("PUT", f"/pipelines/{name}/elements/aggregate")
    ]
    assert [p["epoch"] for p in puts] == [1, 2]
    assert tail(js_client, name, "aggregate") == (fence_subject(name, "aggregate"), 2)
    # An instance of the first deployment that missed the stop tries to write: refused.
    record = Record(1, 0, 1, 0.0, "aggregate", json.dumps({"value": 1.0}))
    with pytest.raises(Fenced):
        js_client.run(lambda js: publish_records(js, name, "aggregate", [record], epoch=1))


def test_a_deploy_a_node_refuses_the_files_of_changes_nothing(
    orch: Orchestrator, tmp_path: Path, agents: dict[str, StandIn], js_client: SyncJetStream
) -> None:
    # Refused only when the PE started, a missing input came after the sink had emptied its
    # file, the run before's streams and checkpoints were gone, and a failed pipeline stayed.
    from fogshift.contracts import PipelineState
    from fogshift.spec.exceptions import InvalidSpec

    name = f"fence{next(_names)}"
    orch.deploy(spec(tmp_path, name))
    orch.stop(name)
    before = tail(js_client, name, "aggregate")
    for agent in agents.values():
        agent.calls.clear()
    missing = {
        "code": "invalid_spec",
        "message": "element 'source': file 'x' does not exist on node 'cloud'",
        "expected": "an existing file",
        "received": "no such file",
    }
    for again in (name, f"fence{next(_names)}"):  # a stopped pipeline's name, and a new one
        agents["cloud"].answer("POST", f"/pipelines/{again}/check", 422, missing)
        with pytest.raises(InvalidSpec, match="does not exist on node 'cloud'"):
            orch.deploy(spec(tmp_path, again), fresh=True)
    assert [c.method for a in agents.values() for c in a.calls] == ["POST"] * 2  # cloud's
    checked = agents["cloud"].received("POST", f"/pipelines/{name}/check")
    assert [e["id"] for e in checked[0].body["elements"]] == ["source", "sink"]
    record = orch.registry.get_pipeline(name)
    assert record is not None and record.status == PipelineState.STOPPED
    assert orch.registry.get_pipeline(again) is None
    assert tail(js_client, name, "aggregate") == before  # its streams as the stop left them
    # Files fine again: deployed, fog-a asked of its aggregate's too.
    del agents["cloud"].answers[("POST", f"/pipelines/{name}/check")]
    orch.deploy(spec(tmp_path, name), fresh=True)
    assert len(agents["fog-a"].received("POST", f"/pipelines/{name}/check")) == 1


def test_a_deploy_whose_pe_cannot_start_is_failed_with_why_until_deployed_again(
    orch: Orchestrator, tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    from fogshift.exceptions import Unavailable

    name = f"fence{next(_names)}"
    agents["fog-a"].fail("PUT", f"/pipelines/{name}/elements/aggregate")
    with pytest.raises(Unavailable, match="fog-a fails"):
        orch.deploy(spec(tmp_path, name))
    (status,) = orch.status(name, counts=False)
    assert status.status == "failed"
    assert status.error is not None and status.error.startswith("a PE could not be started: ")
    assert "fog-a fails" in status.error
    del agents["fog-a"].answers[("PUT", f"/pipelines/{name}/elements/aggregate")]
    orch.deploy(spec(tmp_path, name))
    (status,) = orch.status(name, counts=False)
    assert status.status == "running" and status.error is None
    assert orch.registry.failure(name) is None


def test_a_stop_during_a_deploy_leaves_the_pipeline_stopped(
    orch: Orchestrator, tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    # The stop removed what had started and said "stopped"; the deploy then started the
    # rest and marked the pipeline running, and the reconciler restarted the PEs removed.
    import threading

    from fogshift.contracts import PipelineState

    name = f"fence{next(_names)}"
    came, release = agents["fog-a"].hold("PUT", f"/pipelines/{name}/elements/aggregate")
    deploying = threading.Thread(target=orch.deploy, args=(spec(tmp_path, name),))
    deploying.start()
    try:
        assert came.wait(30)  # the sink runs, the aggregate is starting
        stopping = threading.Thread(target=orch.stop, args=(name,))
        stopping.start()
        stopping.join(2)  # (it waits for the deploy, or did its work before the fix)
    finally:
        release.set()
    deploying.join(30)
    stopping.join(30)
    assert not deploying.is_alive() and not stopping.is_alive()
    record = orch.registry.get_pipeline(name)
    assert record is not None and record.status == PipelineState.STOPPED
    # Each node was told to stop the pipeline after its last PE there was started.
    for node in ("cloud", "fog-a"):
        calls = [c for c in agents[node].calls if name in c.path]
        assert calls[-1].method == "DELETE" and calls[-1].path == f"/pipelines/{name}", calls


def test_a_stop_waits_for_an_operation_under_way_and_stops_what_it_started(
    orch: Orchestrator, tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    """A migration, restore or scale starts instances: one running beside a stop started
    them after the stop had removed the pipeline's, and they ran on for a stopped pipeline.
    The stop now waits for it (holding its PEs' exclusive sections), and is refused, with
    nothing stopped, if it outlasts the wait."""
    import threading

    from fogshift.contracts import PipelineState
    from fogshift.exceptions import Conflict

    name = f"fence{next(_names)}"
    orch.deploy(spec(tmp_path, name))
    here = f"/pipelines/{name}/elements/aggregate"
    running, done = threading.Event(), threading.Event()

    def operation() -> None:  # e.g. a restart of the aggregate, at its end
        with orch._exclusive(name, "aggregate", "migration"):
            running.set()
            done.wait(30)
            orch.agent("fog-a").put(here, json={})

    worker = threading.Thread(target=operation)
    worker.start()
    assert running.wait(30)
    with (
        pytest.raises(Conflict, match=r"cannot stop pipeline .*a migration is under way"),
        orch._stopping(name, ["aggregate"], wait_s=0.3),
    ):
        pass
    stopping = threading.Thread(target=orch.stop, args=(name,))
    stopping.start()
    stopping.join(1)
    assert stopping.is_alive()  # waiting for the operation
    assert orch.registry.get_pipeline(name).status == PipelineState.RUNNING  # type: ignore[union-attr]
    done.set()
    worker.join(30)
    stopping.join(30)
    assert not stopping.is_alive()
    assert orch.registry.get_pipeline(name).status == PipelineState.STOPPED  # type: ignore[union-attr]
    calls = [(c.method, c.path) for c in agents["fog-a"].calls if name in c.path]
    assert calls[-2:] == [("PUT", here), ("DELETE", f"/pipelines/{name}")], calls


def test_a_failure_after_the_routing_change_completes_the_migration(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn]
) -> None:
    here = f"/pipelines/{pipeline}/elements/aggregate"
    literal_migration_answers(agents, here)
    agents["fog-a"].fail("DELETE", here)  # the origin cannot be removed after the switch
    orch.plan_soon.clear()
    report = orch.migrate(pipeline, "aggregate", "fog-b", mode="literal").model_dump(mode="json")
    assert report["status"] == "migrated" and report["rolled_back"] is False, report
    # The plan is made again at once, not up to an interval later naming fog-b as the
    # aggregate's own backup or redeploy node (a walk-through's finding).
    assert orch.plan_soon.is_set()
    assert any("fog-a was not removed" in w for w in report["warnings"]), report
    assert orch.registry.get_pipeline(pipeline).placement["aggregate"] == "fog-b"  # type: ignore[union-attr]
    # The origin stays held at its gate: it is never resumed as a second writer.
    assert agents["fog-a"].received("POST", here + "/resume") == []
    assert orch.registry.epoch(pipeline, "aggregate") == 1
    assert [o.outcome for o in orch.registry.operations(pipeline)] == ["migrated"]
    # The reconciler removes it once its node answers.
    agents["fog-a"].answer("DELETE", here)
    held = {"pipeline": pipeline, "element": "aggregate", "state": "paused", "epoch": 1}
    orch.heartbeat(
        "fog-a",
        Heartbeat.model_validate({"url": agents["fog-a"].url, "ready": True, "elements": [held]}),
    )
    orch.reconcile_once()
    assert agents["fog-a"].received("DELETE", here)[-1].query == {"discard": "true"}


def test_a_rollback_that_cannot_discard_the_target_fences_and_restarts_the_origin(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn], js_client: SyncJetStream
) -> None:
    here = f"/pipelines/{pipeline}/elements/aggregate"
    literal_migration_answers(agents, here)
    agents["fog-b"].fail("GET", here + "/progress")  # the target goes silent after its start
    agents["fog-b"].fail("DELETE", here)
    with pytest.raises(MigrationFailed) as failed:
        orch.migrate(pipeline, "aggregate", "fog-b", mode="literal")
    report = failed.value.report  # type: ignore[attr-defined]
    assert report.rolled_back is True and report.epoch == 2, report
    assert "discarding the target on fog-b failed" in report.error
    # The target may still write under epoch 1: the origin does not resume under it, it is
    # stopped and started again under epoch 2, behind a fence marker for 2.
    assert agents["fog-a"].received("POST", here + "/resume") == []
    deletes = agents["fog-a"].received("DELETE", here)
    assert [d.query for d in deletes] == [{}]  # its checkpoint is kept
    put = agents["fog-a"].received("PUT", here)[-1].body
    assert (put["epoch"], put["fresh"], put["element"]["node"]) == (2, False, "fog-a")
    assert orch.registry.epoch(pipeline, "aggregate") == 2
    assert tail(js_client, pipeline, "aggregate") == (fence_subject(pipeline, "aggregate"), 2)
    assert orch.registry.get_pipeline(pipeline).placement["aggregate"] == "fog-a"  # type: ignore[union-attr]
    assert [o.outcome for o in orch.registry.operations(pipeline)] == ["rolled_back"]


def test_a_rollback_whose_origin_does_not_run_again_is_not_reported_rolled_back(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn]
) -> None:
    here = f"/pipelines/{pipeline}/elements/aggregate"
    literal_migration_answers(agents, here)
    agents["fog-b"].fail("PUT", here)  # the target does not start
    agents["fog-a"].fail("POST", here + "/resume")
    with pytest.raises(MigrationFailed) as failed:
        orch.migrate(pipeline, "aggregate", "fog-b", mode="literal")
    report = failed.value.report  # type: ignore[attr-defined]
    assert report.rolled_back is False, report
    assert "could not be rolled back" in failed.value.message
    # What happens next either way: the origin answers again, or its PEs are restored.
    assert "once fog-a answers, the reconciler resumes the PE" in (failed.value.hint or "")
    assert "if fog-a stays silent, the PE is restored elsewhere" in (failed.value.hint or "")
    assert "running the origin on fog-a again failed" in report.error
    assert [o.outcome for o in orch.registry.operations(pipeline)] == ["failed"]


def test_a_restore_failing_everywhere_restarts_the_pe_on_its_live_node(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn], js_client: SyncJetStream
) -> None:
    here = f"/pipelines/{pipeline}/elements/aggregate"
    for node in ("cloud", "fog-b"):  # every candidate refuses the checkpoint
        agents[node].fail("POST", here + "/checkpoint/install")
    rights: list[set[str]] = []  # the nodes that may serve the PE, at each sync

    def sync_quietly(registry: object) -> None:
        hosted = hosted_by_node(orch.registry)
        rights.append(
            {n for n, pes in hosted.items() if any(p.element == "aggregate" for p in pes)}
        )

    orch.permissions.sync_quietly = sync_quietly  # type: ignore[method-assign]
    with pytest.raises(RestoreFailed) as failed:
        orch.restore(pipeline, "aggregate")
    # Each attempt took fog-a's rights; once they ended fog-a, where the PE runs again, had
    # them back at once (before: at the reconciler's next round, its reads and writes failing).
    assert "fog-a" not in rights[0] and rights[-1] == {"fog-a"}
    # Two attempts fenced fog-a's instance (epochs 2, 3); it runs again under a newer one.
    assert "runs again on fog-a" in failed.value.message and "epoch 4" in failed.value.message
    assert [d.query for d in agents["fog-a"].received("DELETE", here)] == [{}]
    put = agents["fog-a"].received("PUT", here)[-1].body
    assert (put["epoch"], put["fresh"], put["element"]["node"]) == (4, False, "fog-a")
    assert orch.registry.epoch(pipeline, "aggregate") == 4
    assert tail(js_client, pipeline, "aggregate") == (fence_subject(pipeline, "aggregate"), 4)
    assert [(o.target, o.epoch, o.outcome) for o in orch.registry.operations(pipeline)] == [
        ("fog-b", 2, "failed"), ("cloud", 3, "failed"),  # the least busy node first
    ]  # fmt: skip
    assert orch.last_restore[(pipeline, "aggregate")].fallback == (
        "restarted on fog-a under epoch 4"
    )
    assert orch.registry.get_pipeline(pipeline).placement["aggregate"] == "fog-a"  # type: ignore[union-attr]


def test_a_failed_restore_of_a_pe_whose_node_is_silent_leaves_it_to_the_reconciler(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn], js_client: SyncJetStream
) -> None:
    here = f"/pipelines/{pipeline}/elements/aggregate"
    agents["fog-b"].fail("POST", here + "/checkpoint/install")
    # fog-a was last heard of a minute ago: silent (a restore of its PE is what it needs).
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    with pytest.raises(RestoreFailed) as failed:
        orch.restore(pipeline, "aggregate", "fog-b")
    assert "runs again" not in failed.value.message
    assert agents["fog-a"].calls == []
    assert orch.registry.epoch(pipeline, "aggregate") == 2


def test_a_restore_onto_a_node_still_running_an_instance_fences_nothing(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn], js_client: SyncJetStream
) -> None:
    # The install there was refused only after the PE had a new epoch and a fence marker:
    # the healthy instance on fog-a was fenced, then restarted under yet another epoch.
    left = {"pipeline": pipeline, "element": "aggregate", "state": "failed", "epoch": 1}
    agents["fog-b"].answer("GET", "/elements", body=[left])
    install = f"/pipelines/{pipeline}/elements/aggregate/checkpoint/install"
    agents["fog-b"].answer(
        "POST",
        install,
        409,
        {  # (as its agent refuses)
            "code": "element_busy",
            "message": f"{pipeline}/aggregate already runs on node 'fog-b'",
        },
    )
    before = tail(js_client, pipeline, "aggregate")
    with pytest.raises(Conflict) as refused:
        orch.restore(pipeline, "aggregate", "fog-b")
    assert "still runs an instance of the PE (failed)" in refused.value.message
    assert refused.value.hint and "retry" in refused.value.hint
    assert orch.registry.epoch(pipeline, "aggregate") == 1
    assert tail(js_client, pipeline, "aggregate") == before  # no fence marker
    assert agents["fog-a"].calls == []  # not stopped, not restarted
    assert [c.method for c in agents["fog-b"].calls] == ["GET"]
    # A node that runs none takes it (the stand-in's install and start answer as asked).
    agents["fog-b"].answer("GET", "/elements", body=[])
    agents["fog-b"].fail("POST", install)
    with pytest.raises(RestoreFailed):
        orch.restore(pipeline, "aggregate", "fog-b")
    assert orch.registry.epoch(pipeline, "aggregate") > 1  # this one got as far as fencing


def test_a_target_that_never_started_is_no_writer_and_the_origin_simply_resumes(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn]
) -> None:
    here = f"/pipelines/{pipeline}/elements/aggregate"
    literal_migration_answers(agents, here)
    agents["fog-b"].fail("PUT", here + "/checkpoint")  # the install fails: nothing started
    agents["fog-b"].fail("DELETE", here)
    with pytest.raises(MigrationFailed) as failed:
        orch.migrate(pipeline, "aggregate", "fog-b", mode="literal")
    report = failed.value.report  # type: ignore[attr-defined]
    assert report.rolled_back is True and report.epoch == 1, report
    assert len(agents["fog-a"].received("POST", here + "/resume")) == 1
    assert agents["fog-a"].received("PUT", here) == []
    assert orch.registry.epoch(pipeline, "aggregate") == 1


def test_a_migrations_origin_loses_its_broker_rights_when_it_ends(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The rights were brought in step with placement only at the next reconcile round: the
    # origin could publish on the moved PE's subjects meanwhile.
    here = f"/pipelines/{pipeline}/elements/aggregate"
    literal_migration_answers(agents, here)
    seen: list[list[str | None]] = []

    def sync(registry: Any) -> bool:
        seen.append([o.outcome for o in registry.operations(pipeline)])
        return True

    monkeypatch.setattr(orch.permissions, "sync", sync)
    orch.migrate(pipeline, "aggregate", "fog-b", mode="literal")
    assert seen[0] == [None] and seen[-1] == ["migrated"], seen


def test_a_restore_skips_a_node_removed_since_it_was_chosen(
    orch: Orchestrator, pipeline: str, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fogshift remove-node` between a restore's choice of nodes and its attempt there: the
    attempt is skipped (before, it fenced the PE, then failed on a node nobody knew) and the
    next candidate is tried (here it refuses the checkpoint too)."""
    here = f"/pipelines/{pipeline}/elements/aggregate"
    agents["cloud"].fail("POST", here + "/checkpoint/install")
    chosen = orch.restore_candidates(pipeline, "aggregate", {"fog-a"})
    assert chosen[0] == "fog-b"
    orch.remove_node("fog-b")
    monkeypatch.setattr(orch, "restore_candidates", lambda *_: chosen)
    with pytest.raises(RestoreFailed) as failed:
        orch.restore(pipeline, "aggregate")
    attempts = failed.value.report.attempts  # type: ignore[attr-defined]
    assert (attempts[0].node, attempts[0].error) == ("fog-b", "not in the cluster: skipped")
    assert [a.node for a in attempts] == ["fog-b", "cloud"]
    assert agents["fog-b"].calls == []
    assert [o.target for o in orch.registry.operations(pipeline)] == ["cloud"]


def test_a_restore_attempts_reason_is_logged_in_full_once_while_it_stays_the_same(
    orch: Orchestrator,
    pipeline: str,
    agents: dict[str, StandIn],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An automatic restore tries again every back-off round: each round logged every
    # failing candidate's reason again, for as long as the failure lasted.
    here = f"/pipelines/{pipeline}/elements/aggregate"
    agents["fog-b"].fail("POST", here + "/checkpoint/install")
    agents["cloud"].fail("POST", here + "/checkpoint/install")
    monkeypatch.setattr(orch, "restore_candidates", lambda *_: ["fog-b", "cloud"])

    def said() -> list[tuple[str, str]]:
        lines = [(r.levelname, r.getMessage()) for r in caplog.records]
        caplog.clear()
        return [(level, text) for level, text in lines if "on fog-b failed" in text]

    with caplog.at_level("INFO", logger="fogshift.orchestrator"):
        with pytest.raises(RestoreFailed):
            orch.restore(pipeline, "aggregate")
        first = said()
        with pytest.raises(RestoreFailed):
            orch.restore(pipeline, "aggregate")
        again = said()
    assert [level for level, _ in first] == ["WARNING"], first
    assert first[0][1].startswith(f"restore of {pipeline}/aggregate on fog-b failed; trying")
    assert again == [
        ("INFO", f"restore of {pipeline}/aggregate on fog-b failed again, as before; trying "
         "the next node")
    ]  # fmt: skip
    assert orch._attempts_said  # (kept until a restore of the PE succeeds)
