"""Deleting a stopped pipeline: what goes (streams, central checkpoints, what nodes hold, its
entry), what stays (its epochs), and what a node away at the delete discards once heard.

A real orchestrator object and registry, real HTTP servers standing in for the node agents;
the broker's answer is the test's (a real one deletes streams in
``tests/integration/test_case1.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.exceptions import BrokerError
from fogshift.contracts import Heartbeat, PipelineState, RestoreReport, RestoreStatus
from fogshift.exceptions import Conflict
from fogshift.orchestrator import reconciler
from fogshift.orchestrator.exceptions import UnknownPipeline
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec
from tests.orchestrator.standin import SPEC, StandIn, offline_config, standins

STREAMS = ["FS_p__aggregate", "FS_p__sink", "FS_p__source"]


@pytest.fixture
def agents() -> Iterator[dict[str, StandIn]]:
    with standins("cloud", "fog-a", "fog-b") as agents:
        yield agents


@pytest.fixture
def orch(tmp_path: Path, agents: dict[str, StandIn]) -> Iterator[Orchestrator]:
    config = offline_config(tmp_path)
    orch = Orchestrator(config)
    orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), PipelineState.RUNNING)
    for name, agent in agents.items():
        orch.heartbeat(name, Heartbeat.model_validate({"url": agent.url, "ready": True}))
    yield orch
    orch.close()


@pytest.fixture
def broker(orch: Orchestrator, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pipelines whose streams the broker stand-in was asked to delete."""
    asked: list[str] = []

    def run(work: Any) -> Any:
        asked.append(work.keywords["pipeline"])
        return list(STREAMS)

    monkeypatch.setattr(orch.broker, "run", run)
    return asked


def discards(agents: dict[str, StandIn]) -> dict[str, list[str]]:
    return {
        name: [f"{c.path}?{'&'.join(f'{k}={v}' for k, v in c.query.items())}"
               for c in agent.calls if c.method == "DELETE"]
        for name, agent in agents.items()
    }  # fmt: skip


def test_a_running_pipeline_is_not_deleted(orch: Orchestrator, broker: list[str]) -> None:
    with pytest.raises(Conflict) as refused:
        orch.delete("p")
    assert "fogshift stop p" in (refused.value.hint or "")
    assert refused.value.expected == "a stopped or failed pipeline"
    assert broker == [] and orch.registry.get_pipeline("p") is not None
    with pytest.raises(UnknownPipeline):
        orch.delete("nope")


def test_a_stopped_pipeline_is_deleted_its_epochs_kept(
    orch: Orchestrator, broker: list[str], agents: dict[str, StandIn], tmp_path: Path
) -> None:
    standby = orch.registry.add_standby("p", "aggregate", "fog-b")  # (above the PE's epoch)
    epochs = {**orch.registry.epochs("p"), "aggregate": standby}
    stored = tmp_path / "central" / "checkpoints" / "p" / "aggregate"
    stored.mkdir(parents=True)
    (stored / "x").write_text("a checkpoint")
    orch.last_restore[("p", "aggregate")] = RestoreReport(
        pipeline="p", element="aggregate", target="fog-c", status=RestoreStatus.RESTORED, epoch=2
    )
    orch.registry.set_status("p", PipelineState.STOPPED)
    # fog-b is away: what it holds is discarded once it is heard again.
    orch.registry.heartbeat(
        "fog-b", Heartbeat.model_validate({"url": agents["fog-b"].url, "ready": True})
    )
    with orch.registry._tx() as db:
        db.execute("UPDATE nodes SET last_seen = ? WHERE name = 'fog-b'", (time.time() - 3600,))
    result = orch.delete("p")
    assert result.streams == STREAMS and result.pipeline == "p" and broker == ["p"]
    assert result.nodes == ["cloud", "fog-a"] and result.unreachable_nodes == ["fog-b"]
    assert discards(agents) == {
        "cloud": ["/pipelines/p?discard=true"], "fog-a": ["/pipelines/p?discard=true"],
        "fog-b": [],
    }  # fmt: skip
    assert not stored.exists() and ("p", "aggregate") not in orch.last_restore
    assert orch.registry.reports("restore") == {}
    assert orch.registry.get_pipeline("p") is None
    assert [s.pipeline for s in orch.status()] == []
    assert orch.registry.deleted("p") is not None
    # Deployed again, every PE is fenced above the deleted run's instances, its standby's
    # too (deleted, the standby's epoch was given to the next run's PE).
    again = orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), PipelineState.RUNNING)
    assert all(again[pe] > epochs[pe] for pe in epochs), (again, epochs)
    assert orch.registry.deleted("p") is None


def test_a_pipeline_whose_streams_cannot_be_deleted_stays_listed(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch, agents: dict[str, StandIn]
) -> None:
    def run(work: Any) -> Any:
        raise OSError("connection refused")

    monkeypatch.setattr(orch.broker, "run", run)
    orch.registry.set_status("p", PipelineState.FAILED, "a PE could not be started")
    with pytest.raises(BrokerError, match="delete again"):
        orch.delete("p")
    record = orch.registry.get_pipeline("p")
    assert record is not None and record.status == PipelineState.FAILED
    assert orch.registry.deleted("p") is None
    assert discards(agents) == {name: [] for name in agents}


def test_a_node_heard_after_the_delete_discards_what_it_holds_of_the_pipeline(
    orch: Orchestrator,
    broker: list[str],
    agents: dict[str, StandIn],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orch.registry.set_status("p", PipelineState.STOPPED)
    orch.delete("p")
    for agent in agents.values():
        agent.calls.clear()
    # fog-b was away: it comes back running the aggregate (a restore it had started) and
    # holding the source's checkpoint; "q" is another orchestrator's (never judged here).
    report = {
        "url": agents["fog-b"].url, "ready": True,
        "elements": [{"pipeline": "p", "element": "aggregate"}],
        "left": [{"pipeline": "p", "element": "source"}, {"pipeline": "q", "element": "x"}],
    }  # fmt: skip
    orch.heartbeat("fog-b", Heartbeat.model_validate(report))
    orch._remove_strays()
    orch._discard_left(set())
    assert discards(agents)["fog-b"] == ["/pipelines/p/elements/source?discard=true"]
    # A heartbeat sent before the delete may arrive after it: judged by a later one.
    monkeypatch.setattr(reconciler, "STOPPED_HEARD_S", 0.0)
    orch.heartbeat("fog-b", Heartbeat.model_validate(report))
    # Not while a deploy (or delete) of the name holds the pipeline: a deploy again may be
    # starting its fresh PE on that very node.
    with orch.pipeline_lock("p"):
        orch._remove_strays()
        orch._discard_left(set())
    assert len(discards(agents)["fog-b"]) == 1
    orch._remove_strays()
    assert discards(agents)["fog-b"][-1] == "/pipelines/p/elements/aggregate?discard=true"
    assert discards(agents)["cloud"] == [] and discards(agents)["fog-a"] == []


def test_a_deploy_again_of_the_name_is_not_taken_for_the_deleted_run(
    orch: Orchestrator,
    broker: list[str],
    agents: dict[str, StandIn],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orch.registry.set_status("p", PipelineState.STOPPED)
    orch.delete("p")
    orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), PipelineState.RUNNING)
    for agent in agents.values():
        agent.calls.clear()
    monkeypatch.setattr(reconciler, "STOPPED_HEARD_S", 0.0)
    report = {"url": agents["fog-a"].url, "ready": True,
              "elements": [{"pipeline": "p", "element": "aggregate"}]}  # fmt: skip
    orch.heartbeat("fog-a", Heartbeat.model_validate(report))  # the new run's, placed there
    orch._remove_strays()
    orch._discard_left(set())
    assert discards(agents) == {name: [] for name in agents}
