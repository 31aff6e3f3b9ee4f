"""When the central store pulls: at its interval, and at once after a large state change.

A real orchestrator object and registry; heartbeats as its nodes send them; no agents (the
pull itself is not run: what is checked is whether the central loop is woken).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fogshift.contracts import Heartbeat
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec
from tests.orchestrator.standin import SPEC, offline_config, standins

MIB = 1 << 20


@pytest.fixture
def orchestrator(tmp_path: Path) -> Iterator[Orchestrator]:
    config = offline_config(tmp_path)
    orch = Orchestrator(config)
    orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
    yield orch
    orch.close()


def _beat(orch: Orchestrator, node: str, snapshot: str, new_bytes: int) -> bool:
    """Send ``node``'s heartbeat reporting the aggregate's newest node-level checkpoint;
    whether the central pull was woken (the wake-up is consumed)."""
    checkpoint = {"id": snapshot, "batch": int(snapshot[1:]), "progress": 1, "created": 0.0,
                  "bytes": new_bytes + 100, "new_bytes": new_bytes}  # fmt: skip
    report: dict[str, Any] = {
        "url": "http://127.0.0.1:9",
        "ready": True,
        "elements": [{"pipeline": "p", "element": "aggregate", "node_checkpoint": checkpoint}],
    }
    orch.heartbeat(node, Heartbeat.model_validate(report))
    woken = orch._pull_now.is_set()
    orch._pull_now.clear()
    return woken


def _central_holds(orch: Orchestrator, snapshot: str, node: str) -> None:
    """The central store holds the aggregate's checkpoint ``snapshot`` from ``node``."""
    manifest = {"type": "fogshift-checkpoint", "id": snapshot, "pipeline": "p",
                "element": "aggregate", "batch": int(snapshot[1:]), "offset": None,
                "created": 0.0, "bytes": 0, "files": {}, "node": node}  # fmt: skip
    orch.central.put(manifest, lambda rel: b"")


def _manifest(pipeline: str, element: str, batch: int, data: bytes) -> dict[str, Any]:
    """A node-level checkpoint's manifest of one file, ``state/0``, holding ``data``."""
    return {"type": "fogshift-checkpoint", "id": f"b{batch:012d}", "pipeline": pipeline,
            "element": element, "batch": batch, "created": 1.0, "bytes": len(data),
            "files": {"state/0": {"size": len(data),
                                  "sha256": hashlib.sha256(data).hexdigest()}}}  # fmt: skip


def _pull(orch: Orchestrator, since: float) -> None:
    """One central pull of p/aggregate from fog-a, as a round that read the pipeline's
    record at status time ``since`` makes it."""
    orch._pull_one("p", "aggregate", "fog-a", ("p", "aggregate"), since)


@contextmanager
def _serving(orch: Orchestrator, manifest: dict[str, Any], data: bytes) -> Iterator[None]:
    """fog-a's agent answering p/aggregate's newest snapshot with ``manifest`` (and its
    file with ``data``), fog-a's heartbeat naming it."""
    here = "/pipelines/p/elements/aggregate/snapshots"
    with standins("fog-a") as agents:
        agents["fog-a"].answer("GET", here + "/latest", body=manifest)
        agents["fog-a"].answer("GET", f"{here}/{manifest['id']}/files/state/0", content=data)
        orch.heartbeat("fog-a", Heartbeat(url=agents["fog-a"].url, ready=True))
        yield


def test_a_large_state_change_is_pulled_at_once_a_small_one_at_the_interval(
    orchestrator: Orchestrator,
) -> None:
    assert _beat(orchestrator, "fog-a", "b000000000003", 50 * MIB)  # no central copy yet
    _central_holds(orchestrator, "b000000000003", "fog-a")
    assert not _beat(orchestrator, "fog-a", "b000000000003", 50 * MIB)  # pulled already
    assert not _beat(orchestrator, "fog-a", "b000000000008", 4096)  # small: at the interval
    assert _beat(orchestrator, "fog-a", "b000000000011", 2 * MIB)  # RocksDB's snapshot SSTs
    # Once per checkpoint: while that pull runs (or if it failed) the next heartbeats,
    # reporting the same checkpoint, leave the retry to the interval.
    assert not _beat(orchestrator, "fog-a", "b000000000011", 2 * MIB)
    # Not the primary: a standby's (or a superseded instance's) checkpoint is not pulled.
    assert not _beat(orchestrator, "fog-b", "b000000000011", 50 * MIB)


def test_a_checkpoint_of_the_pe_s_new_node_is_pulled_though_its_batch_is_older(
    orchestrator: Orchestrator,
) -> None:
    _central_holds(orchestrator, "b000000000020", "fog-a")
    orchestrator.registry.set_placement("p", "aggregate", "fog-b")  # migrated to fog-b
    assert _beat(orchestrator, "fog-b", "b000000000019", 50 * MIB)
    # Pulled, the store's newest is still fog-a's b..20 (ids sort by batch): no pull again.
    _central_holds(orchestrator, "b000000000019", "fog-b")
    assert not _beat(orchestrator, "fog-b", "b000000000019", 50 * MIB)
    # Back on fog-a, whose batches now count from behind its old ones (a standby promoted
    # there): pulled, though the store holds fog-a's b..20 (skipped until its batches
    # passed 20, the old checkpoint stood in for the new history).
    _central_holds(orchestrator, "b000000000020", "fog-a")
    orchestrator.registry.set_placement("p", "aggregate", "fog-a")
    assert _beat(orchestrator, "fog-a", "b000000000006", 50 * MIB)


def test_pulling_only_at_intervals_when_told(tmp_path: Path) -> None:
    config = offline_config(tmp_path, pull_new_state_bytes=0)
    orch = Orchestrator(config)
    try:
        orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
        assert not _beat(orch, "fog-a", "b000000000003", 500 * MIB)
    finally:
        orch.close()


def test_the_central_loop_runs_at_once_when_woken_and_ends_on_close(
    orchestrator: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    pulled = threading.Event()
    monkeypatch.setattr(orchestrator, "pull_checkpoints", pulled.set)
    monkeypatch.setattr(orchestrator, "push_replicas", lambda: None)
    loop = threading.Thread(target=orchestrator.run_central, daemon=True)
    loop.start()
    orchestrator._pull_now.set()  # as a heartbeat reporting a large state change does
    assert pulled.wait(10)  # long before the 15 s interval
    orchestrator.close()
    loop.join(10)
    assert not loop.is_alive()


def test_one_pe_whose_pull_fails_stops_no_other_pull_and_its_node_is_warned_of(
    orchestrator: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    for node in ("cloud", "fog-a"):
        orchestrator.heartbeat(node, Heartbeat(url="http://127.0.0.1:9", ready=True))
    pulled: list[str] = []
    broken = {"source"}

    def pull_one(pipeline: str, pe: str, node: str, key: tuple[str, str], since: float) -> None:
        if pe in broken:  # not a FogshiftError: before, it ended the whole round
            raise OSError(28, "No space left on device")
        pulled.append(pe)

    monkeypatch.setattr(orchestrator, "_pull_one", pull_one)
    orchestrator.pull_checkpoints()
    assert pulled == ["aggregate", "sink"]
    warnings = {n.name: n.warnings for n in orchestrator.nodes()}
    assert warnings == {
        "cloud": [
            "central checkpoint of p/source failed: OSError: [Errno 28] No space left on device"
        ],
        "fog-a": [],
    }
    broken.clear()  # room again: the next pull succeeds and the warning goes
    orchestrator.pull_checkpoints()
    assert {n.name: n.warnings for n in orchestrator.nodes()} == {"cloud": [], "fog-a": []}
    # A failure of a pipeline since stopped is no longer told.
    broken.add("source")
    orchestrator.pull_checkpoints()
    assert orchestrator.pull_errors
    orchestrator.registry.set_status("p", "stopped")
    orchestrator.pull_checkpoints()
    assert {n.name: n.warnings for n in orchestrator.nodes()} == {"cloud": [], "fog-a": []}


def test_a_pe_with_no_node_level_checkpoint_yet_is_not_pulled_nor_warned_of(
    orchestrator: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Just deployed, migrated or restored there: every round tried it, the node answered
    # "no node-level checkpoint", and `fogshift nodes` warned of a failed central checkpoint.
    pulled: list[str] = []

    def pull_one(pipeline: str, pe: str, node: str, key: tuple[str, str], since: float) -> None:
        pulled.append(pe)

    monkeypatch.setattr(orchestrator, "_pull_one", pull_one)
    orchestrator.pull_errors[("p", "aggregate")] = ("fog-a", "UnknownElement: no checkpoint")
    fresh = {"pipeline": "p", "element": "aggregate", "state": "running", "epoch": 1}
    for node, elements in (("cloud", []), ("fog-a", [fresh])):
        orchestrator.heartbeat(node, Heartbeat.model_validate(
            {"url": "http://127.0.0.1:9", "ready": True, "elements": elements}
        ))  # fmt: skip
    orchestrator.pull_checkpoints()
    assert pulled == ["source", "sink"]  # (the others: not reported, so tried as before)
    assert {n.name: n.warnings for n in orchestrator.nodes()} == {"cloud": [], "fog-a": []}
    # Its first snapshot reported: pulled.
    assert _beat(orchestrator, "fog-a", "b000000000001", 10) is False
    orchestrator.pull_checkpoints()
    assert pulled == ["source", "sink", "source", "aggregate", "sink"]


def test_a_pull_that_outlives_a_stop_and_a_fresh_deploy_stores_nothing_of_the_run_before(
    orchestrator: Orchestrator, tmp_path: Path
) -> None:
    # A round reads the registry once; stopped and deployed afresh meanwhile, the node still
    # serves the run before's snapshot (its store is cleared only at its own PE's fresh
    # start). Stored after the deploy forgot the pipeline's checkpoints, it was the newest:
    # a restore resumed at positions of streams that are gone, and the new run's own pulls
    # were skipped as older.
    old = _manifest("p", "aggregate", 5000, b"a state of the run before")
    with _serving(orchestrator, old, b"a state of the run before"):
        seen = orchestrator.registry.get_pipeline("p")
        assert seen is not None
        orchestrator.registry.set_status("p", "stopped")
        orchestrator.registry.put_pipeline(parse_spec(SPEC, tmp_path), "deploying")
        orchestrator.central.forget("p")
        orchestrator.registry.set_status("p", "running")
        _pull(orchestrator, seen.status_since)
        assert orchestrator.central.newest("p", "aggregate") is None
        # A round that read the record after the deploy stores what the node holds.
        now = orchestrator.registry.get_pipeline("p")
        assert now is not None and now.status_since != seen.status_since
        _pull(orchestrator, now.status_since)
        assert (orchestrator.central.newest("p", "aggregate") or {}).get("id") == old["id"]


def test_a_pull_from_a_node_the_pe_left_meanwhile_stores_nothing(
    orchestrator: Orchestrator,
) -> None:
    # A pull from a node frozen through the PE's restore, answered when the node woke,
    # stored the superseded instance's checkpoint as the newest (a review's finding): the
    # next restore went back to it.
    zombie = _manifest("p", "aggregate", 5000, b"the superseded instance's state")
    with _serving(orchestrator, zombie, b"the superseded instance's state"):
        seen = orchestrator.registry.get_pipeline("p")
        assert seen is not None and seen.placement["aggregate"] == "fog-a"
        orchestrator.registry.set_placement("p", "aggregate", "fog-b")  # restored there
        _pull(orchestrator, seen.status_since)
        assert orchestrator.central.newest("p", "aggregate") is None
        orchestrator.registry.set_placement("p", "aggregate", "fog-a")  # (and back)
        _pull(orchestrator, seen.status_since)
        assert (orchestrator.central.newest("p", "aggregate") or {}).get("id") == zombie["id"]


def test_replicas_of_pes_no_running_pipeline_has_here_elsewhere_are_dropped(
    orchestrator: Orchestrator, tmp_path: Path
) -> None:
    from tests.orchestrator.standin import standins

    def replica(pipeline: str, element: str) -> dict[str, Any]:
        return {"pipeline": pipeline, "element": element, "id": "b000000000004", "batch": 4,
                "created": 1.0}  # fmt: skip

    orchestrator.registry.put_pipeline(parse_spec({**SPEC, "pipeline": "off"}, tmp_path),
                                       "running")  # fmt: skip
    orchestrator.registry.set_status("off", "stopped")
    with standins("fog-b", "fog-a") as agents:
        for name in agents:
            agents[name].answer("DELETE", "/replicas/off/aggregate",
                                body={"pipeline": "off", "element": "aggregate", "held": True,
                                      "blobs": 0})  # fmt: skip
        # fog-b backs p/aggregate up (running on fog-a) and still holds a stopped pipeline's
        # copy and a partition's that no spec has; fog-a holds a copy of the PE it runs.
        held = {
            "fog-b": [replica("p", "aggregate"), replica("off", "aggregate"),
                      replica("p", "aggregate-p7"), replica("gone", "x")],
            "fog-a": [replica("p", "aggregate")],
        }  # fmt: skip
        for name, agent in agents.items():
            orchestrator.heartbeat(name, Heartbeat.model_validate(
                {"url": agent.url, "ready": True, "replicas": held[name]}))  # fmt: skip
        orchestrator.drop_stale_replicas()
        dropped = {n: sorted(c.path for c in a.calls if c.method == "DELETE")
                   for n, a in agents.items()}  # fmt: skip
    assert dropped == {
        "fog-b": ["/replicas/gone/x", "/replicas/off/aggregate", "/replicas/p/aggregate-p7"],
        "fog-a": ["/replicas/p/aggregate"],
    }


def test_a_backup_holding_an_older_historys_checkpoint_of_the_same_id_gets_the_new_one(
    orchestrator: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The PE was restored from an older checkpoint (or its partition id added again): its
    # batches count again from below, and its new b4 was "held" by fog-b, its backup,
    # which held the old history's b4 — never pushed, its restore's nearest copy wrong.
    from types import SimpleNamespace

    from tests.orchestrator.standin import standins

    monkeypatch.setattr(orchestrator, "planned", lambda *args: SimpleNamespace(backup="fog-b"))
    orchestrator.central.put({**_manifest("p", "aggregate", 4, b""), "created": 2.0},
                             lambda rel: b"")  # fmt: skip
    with standins("fog-b") as agents:
        agents["fog-b"].answer("POST", "/replicas/p/aggregate", body={"fetched_bytes": 0})
        for created, pushes in ((1.0, 1), (2.0, 0)):
            copy = {"pipeline": "p", "element": "aggregate", "id": "b000000000004",
                    "batch": 4, "created": created}  # fmt: skip
            orchestrator.heartbeat("fog-b", Heartbeat.model_validate(
                {"url": agents["fog-b"].url, "ready": True, "replicas": [copy]}))  # fmt: skip
            agents["fog-b"].calls.clear()
            orchestrator.push_replicas()
            assert [c.path for c in agents["fog-b"].calls if c.method == "POST"] == [
                "/replicas/p/aggregate"
            ] * pushes
            held = orchestrator.held_by("fog-b", "p", "aggregate")
            assert (held is not None) == (pushes == 0)


def test_a_node_cannot_plant_another_pes_checkpoint_in_the_central_store(
    orchestrator: Orchestrator,
) -> None:
    # Asked for p/aggregate's newest snapshot, a (compromised) node answers with the names
    # of a PE of another pipeline: stored as that PE's newest, a restore of it would resume
    # at whatever offsets and state the node chose.
    from fogshift.exceptions import InvalidInput

    forged = _manifest("q", "y", 9000, b"forged")
    with _serving(orchestrator, forged, b"forged"):
        record = orchestrator.registry.get_pipeline("p")
        assert record is not None
        with pytest.raises(InvalidInput, match="belongs to another PE") as refused:
            _pull(orchestrator, record.status_since)
        assert refused.value.received == "q/y"
    assert orchestrator.central.newest("q", "y") is None
    assert orchestrator.central.newest("p", "aggregate") is None


def test_the_central_loop_collects_unnamed_files_with_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A deleted (or stopped) pipeline's central files were collected only by a pull that
    # expired a checkpoint: with nothing running, never.
    from fogshift.common.waiting import wait_until
    from fogshift.orchestrator import replication

    config = offline_config(tmp_path, central_interval_s=0.05)
    orch = Orchestrator(config)
    monkeypatch.setattr(replication, "CENTRAL_GC_S", 0.0)
    for step in ("streams_upkeep", "pull_checkpoints", "push_replicas", "trim_streams"):
        monkeypatch.setattr(orch, step, lambda: None)
    collections: list[float] = []
    monkeypatch.setattr(orch.central, "collect_garbage", lambda: collections.append(1.0) or 0)
    loop = threading.Thread(target=orch.run_central, daemon=True)
    loop.start()
    try:
        wait_until(lambda: len(collections) >= 2 or None, 10, describe="two collections")
    finally:
        orch.close()
        loop.join(10)
    assert not loop.is_alive()
