"""The live planner's inputs and the choice of the nearest checkpoint copy (pure logic), and
what the orchestrator's app tells of a topology it plans with."""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fogshift.contracts import Heartbeat, PlanView
from fogshift.exceptions import InvalidInput
from fogshift.orchestrator.planning import (
    FogTopology,
    LiveNode,
    LivePE,
    Recent,
    build_topology,
    describe_plan,
    nearest_first,
    route_bandwidth,
)
from fogshift.orchestrator.service import Orchestrator
from fogshift.planner import plan
from tests.orchestrator.conftest import OPERATOR
from tests.orchestrator.standin import SPEC, StandIn

FOG = """
central: cloud
default_cpu: 100
pe_cpu: 10
nodes: {cloud: {cpu: 400}, fog-b: {cpu: 15}}
links:
  - {a: cloud, b: fog-a, bandwidth: 10}
  - {a: fog-a, b: fog-c, bandwidth: 100}
  - {a: cloud, b: fog-b, bandwidth: 50}
"""

NODES = [LiveNode("cloud", 30.0), LiveNode("fog-a", 12.0), LiveNode("fog-b", 0.0),
         LiveNode("fog-c", 250.0)]  # fmt: skip


def pe(key: str, node: str, size: int = 2_000_000) -> LivePE:
    return LivePE(key, node, latency_ms=30_000, checkpoint_bytes=size, shipped_bytes_per_s=1000)


def test_live_topology_takes_capacities_loads_and_sizes() -> None:
    fog = FogTopology.parse(FOG)
    topo = build_topology(fog, NODES, [pe("p/agg", "fog-a"), pe("p/src", "cloud"),
                                       pe("p/gone", "fog-x")])  # fmt: skip
    servers = {s.id: s for s in topo.servers}
    assert servers["cloud"].cpu == 400 and servers["fog-a"].cpu == 100
    # Measured CPU minus what the node's own PEs are assumed to need, clamped to capacity.
    assert servers["cloud"].load == pytest.approx(20.0)
    assert servers["fog-a"].load == pytest.approx(2.0)
    assert servers["fog-c"].load == pytest.approx(100.0)  # 250 % measured: no spare CPU
    assert [t.id for t in topo.tasks] == ["p/agg", "p/src"]  # fog-x is not healthy
    agg = topo.tasks[0]
    # In the planner's units, written out (not by MB_PER_BYTE, which they check): 2 MB are
    # 16 megabits, 1,000 B/s 0.008 Mb/s.
    assert agg.transfer_size == pytest.approx(16.0)
    assert agg.backup_rate == pytest.approx(0.008)
    assert {frozenset((link.a, link.b)) for link in topo.links} == {
        frozenset(("cloud", "fog-a")), frozenset(("fog-a", "fog-c")),
        frozenset(("cloud", "fog-b")),
    }  # fmt: skip


def test_the_live_plan_counts_backup_data_from_the_central_node() -> None:
    """A PE's checkpoints reach its backup node from the central store (pulled there from
    its node, pushed on): fog-a's aggregate shipping 12 Mb/s cannot keep its backup on fog-c,
    whose copies would cross the 10 Mb/s cloud-fog-a link, though the direct fog-a-fog-c
    link is wide; it can on cloud (the store's node) or fog-b (50 Mb/s from cloud)."""
    from fogshift.planner.feasibility import backup_candidates

    fog = FogTopology.parse(FOG)
    heavy = LivePE("p/agg", "fog-a", latency_ms=30_000, checkpoint_bytes=2_000_000,
                   shipped_bytes_per_s=1_500_000)  # fmt: skip
    live = [*NODES[:3], LiveNode("fog-c", 0.0)]
    sent = build_topology(fog, live, [heavy], central="cloud")
    assert sent.tasks[0].replicas_from == "cloud"
    net = sent.network()
    names = {net.server_ids[i] for i in backup_candidates(net, 0)}
    assert names == {"cloud", "fog-b"}
    result = plan(sent, "exact", time_limit_s=10)
    assert result.assignments[0].backup in names and result.check(sent) == []
    # The paper's model (from the PE's node) — used with the central node not among the
    # healthy ones — puts it the other way round.
    direct = build_topology(fog, live, [heavy])
    assert direct.tasks[0].replicas_from is None
    net = direct.network()
    assert {net.server_ids[i] for i in backup_candidates(net, 0)} == {"fog-c"}
    assert build_topology(fog, live[1:], [heavy], central="cloud").tasks[0].replicas_from is None


def test_plan_of_the_live_topology_avoids_full_and_failed_nodes() -> None:
    fog = FogTopology.parse(FOG)
    topo = build_topology(fog, NODES, [pe("p/agg", "fog-a")])
    result = plan(topo, "exact", time_limit_s=10)
    (choice,) = result.assignments
    assert choice.redeploy not in ("fog-a", "fog-c")  # the failed node; no spare CPU
    assert choice.backup != "fog-a"
    assert result.check(topo) == []


def test_default_topology_is_a_full_mesh() -> None:
    topo = build_topology(FogTopology(), NODES[:3], [])
    assert len(topo.links) == 3 and all(link.bandwidth == 1000 for link in topo.links)
    assert FogTopology().central_node(["cloud", "fog-a"]) == "cloud"
    assert FogTopology().central_node(["edge"]) is None


def test_nearest_copy_first_and_central_last_on_a_tie() -> None:
    topo = build_topology(FogTopology.parse(FOG), NODES, [])
    assert route_bandwidth(topo, "fog-c", "fog-c") == math.inf
    assert route_bandwidth(topo, "fog-c", "cloud") == 10  # fog-c -> fog-a -> cloud
    # Restoring on fog-a: fog-c's replica (100 Mb/s) beats the central store on cloud (10).
    assert nearest_first(topo, "fog-a", ["fog-c"], "cloud") == ["fog-c", "central"]
    # Restoring on fog-b: cloud (50) beats fog-c (10, through cloud and fog-a).
    assert nearest_first(topo, "fog-b", ["fog-c"], "cloud") == ["central", "fog-c"]
    # The target's own copy always comes first.
    assert nearest_first(topo, "fog-c", ["fog-a", "fog-c"], "cloud")[0] == "fog-c"
    # A central store outside the topology comes after every replica.
    assert nearest_first(topo, "fog-b", ["fog-c"], None) == ["fog-c", "central"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nodes: {fog-a: {cpu: -1}}", "nodes.fog-a.cpu"),
        ("links: [{a: x, b: y}]", "links.0.bandwidth"),
        ("pe_cpu: lots", "pe_cpu"),
        # (YAML's yes was read as 1.)
        ("pe_cpu: yes", "pe_cpu"),
        ("links: [{a: x, b: y, bandwidth: true}]", "links.0.bandwidth"),
        ("nodes: [", "not valid YAML"),
        ("colour: blue", "colour"),
        # (Accepted before, then failed every plan with a bare ValidationError: a 500.)
        ("links: [{a: x, b: y, bandwidth: .inf}]", "links.0.bandwidth"),
        ("default_cpu: .nan", "default_cpu"),
        ("nodes: {fog-a: {cpu: .inf}}", "nodes.fog-a.cpu"),
        # (Stored, then every plan failed until someone uploaded a fixed file.)
        ("links: [{a: x, b: x, bandwidth: 10}]", "links a node to itself"),
        ("links: [{a: x, b: y, bandwidth: 10}, {a: y, b: x, bandwidth: 5}]", "a pair twice"),
        # (A RecursionError: PUT /topology answered 500, the CLI printed a traceback.)
        ("links: " + "[" * 3000 + "]" * 3000, "nests too deep to read"),
        # (Names no node can have; a number past what a plan computes with; a key twice.)
        ("links: [{a: cloud, b: 'fog a/1', bandwidth: 10}]", "links.0.b"),
        ("nodes: {'a b': {cpu: 10}}", "nodes.a b"),
        ("central: 'x.y'", "central"),
        ("pe_cpu: 1e308", "pe_cpu"),
        ("pe_cpu: 1\npe_cpu: 2", "found key 'pe_cpu' twice"),
        # (A ValueError from PyYAML: PUT /topology answered 500.)
        ("pe_cpu: " + "9" * 5000, "4300 digits"),
    ],
)
def test_bad_fog_topologies_are_refused_with_the_field(text: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as err:
        FogTopology.parse(text, source="t.yaml")
    assert needle in err.value.render() and "t.yaml" in err.value.message
    # Every refusal says what was expected, what was received and what to do (the YAML
    # errors said none of them).
    assert err.value.expected and err.value.received and err.value.hint, err.value.to_dict()


def test_a_node_whose_pes_exceed_its_capacity_is_planned_as_full() -> None:
    # Restores brought more PEs to a node than its capacity holds: it was refused, and
    # with it every round's plan, for good (every PE kept the plan naming the failed node).
    fog = FogTopology.parse("pe_cpu: 40\nnodes: {fog-a: {cpu: 60}}")
    full: set[str] = set()
    live = [LiveNode("fog-a", 0), LiveNode("fog-b", 0), LiveNode("fog-c", 0)]
    pes = [pe("p/x", "fog-a"), pe("p/y", "fog-a"), pe("p/z", "fog-b")]
    topo = build_topology(fog, live, pes, full=full)
    assert full == {"fog-a"}
    (a,) = [s for s in topo.servers if s.id == "fog-a"]
    assert (a.cpu, a.load, a.leaving) == (80, 0, True)  # no room, takes nothing
    view = describe_plan(plan(topo, "exact", time_limit_s=10), topo)
    assert sorted(view.assignments) == ["p/x", "p/y", "p/z"]  # its own PEs planned too
    assert all("fog-a" not in (v.backup, v.redeploy) for v in view.assignments.values())


def test_a_stored_topology_that_no_longer_validates_is_told_as_the_plans_error(
    app: FastAPI,
) -> None:
    # One an older fogshift stored (a self-link was accepted then) or edited by hand: every
    # round raised before the plan was touched, and the plan kept its age and no error.
    orchestrator = app.state.orchestrator
    orchestrator.config.topology_file.write_text("links: [{a: x, b: x, bandwidth: 10}]\n")
    view = orchestrator.replan()
    assert view.error is not None and "the stored fog topology cannot be used" in view.error
    assert "links a node to itself" in view.error and view.computed_at is not None


def test_a_latency_no_plan_can_sum_is_refused() -> None:
    # Two PEs recovering in 1e308 ms each: the objective summed to infinity and the plan
    # failed with a pydantic error (a 500), not a refusal.
    from pydantic import ValidationError

    from fogshift.planner.model import Task
    from fogshift.spec import parse_spec

    with pytest.raises(ValidationError, match="less than or equal to 1000000000000"):
        Task(id="t", server="a", cpu=1, latency_ms=1e308, backup_rate=1, transfer_size=1)
    spec = {
        "pipeline": "p",
        "recovery": {"latency_ms": 1e308},
        "elements": [{"id": "s", "kind": "csv-source", "node": "a", "options": {"path": "in.csv"}}],
    }
    with pytest.raises(InvalidInput, match="latency_ms"):
        parse_spec(spec)


def test_the_example_fog_topology_is_valid() -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "fog" / "topology.yaml"
    fog = FogTopology.load(path)
    assert fog.central == "cloud" and set(fog.nodes) == {"cloud", "fog-a", "fog-b"}
    assert FogTopology.load(path.with_name("absent.yaml")) == FogTopology()


def test_an_unreadable_or_invalid_topology_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read fog topology"):
        FogTopology.read_text(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("pe_cpu: -3")
    with pytest.raises(InvalidInput, match="pe_cpu"):
        FogTopology.read_text(tmp_path / "bad.yaml")
    (tmp_path / "ok.yaml").write_text("pe_cpu: 5")
    assert FogTopology.read_text(tmp_path / "ok.yaml") == "pe_cpu: 5"


def test_a_topology_names_its_nodes_links_and_central() -> None:
    fog = FogTopology.parse(FOG + "\n")
    assert fog.names() == {"cloud", "fog-a", "fog-b", "fog-c"}
    assert FogTopology.parse("central: hub").names() == {"hub"}


def test_names_no_node_registered_with_are_told_with_the_plan(app: FastAPI) -> None:
    # A typo (`fog_a` for `fog-a`) read as a node the cluster does not have: its capacity
    # and links were left out of the plan without a word. (The orchestrator's app in
    # process, no background loops.)
    orchestrator = app.state.orchestrator
    for name in ("cloud", "fog-a"):
        orchestrator.heartbeat(name, Heartbeat.model_validate(
            {"url": "http://127.0.0.1:9", "ready": True, "elements": []}))  # fmt: skip
    client = TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"})
    text = "nodes: {fog_a: {cpu: 50}}\nlinks: [{a: cloud, b: fog-a, bandwidth: 5}]\n"
    answer = client.put("/topology", content=text, headers={"Content-Type": "text/plain"})
    assert answer.status_code == 200, answer.text
    assert PlanView.model_validate(answer.json()).unknown_nodes == ["fog_a"]
    assert PlanView.model_validate(answer.json()).unlinked_nodes == []
    fixed = text.replace("fog_a", "fog-a")
    answer = client.put("/topology", content=fixed, headers={"Content-Type": "text/plain"})
    assert PlanView.model_validate(answer.json()).unknown_nodes == []
    assert client.get("/plan").json()["unknown_nodes"] == []
    assert client.get("/plan").json()["unlinked_nodes"] == []
    # The typo in a link: fog-a, which the links leave out, has none (no backup reaches
    # it); without links the default mesh joins every node.
    typo = "links: [{a: cloud, b: fog_a, bandwidth: 5}]\n"
    answer = client.put("/topology", content=typo, headers={"Content-Type": "text/plain"})
    assert PlanView.model_validate(answer.json()).unlinked_nodes == ["fog-a"]
    answer = client.put("/topology", content="pe_cpu: 5\n", headers={"Content-Type": "text/plain"})
    assert PlanView.model_validate(answer.json()).unlinked_nodes == []
    # An empty file is the topology of defaults (refused as "body: missing", with a hint to
    # send JSON); one not in UTF-8 is said so, not in pydantic's words.
    answer = client.put("/topology", content=b"", headers={"Content-Type": "text/plain"})
    assert answer.status_code == 200, answer.text
    answer = client.put(
        "/topology", content=b"pe_cpu: \xff", headers={"Content-Type": "text/plain"}
    )
    assert answer.status_code == 422 and answer.json()["expected"] == "YAML text in UTF-8"
    assert answer.json()["received"] == "byte 0xff at offset 8"


def test_a_refused_topology_file_shows_one_that_is_valid() -> None:
    # Its hint said `fogshift topology show` prints a valid one: it prints a plan.
    import re

    from fogshift.exceptions import InvalidInput
    from fogshift.orchestrator.planning import FogTopology

    for bad in ("nodes: [", "nodes: {fog-a: {cpu: -1}}"):
        with pytest.raises(InvalidInput) as refused:
            FogTopology.parse(bad, source="'fog.yaml'")
        hint = refused.value.hint or ""
        assert "topology show" not in hint
        example = "\n".join(re.findall(r"`([^`]+)`", hint.split("reads: ", 1)[1]))
        topology = FogTopology.parse(example, source="the hint")
        assert topology.central == "cloud" and topology.nodes["fog-a"].cpu == 50
        assert topology.links[0].bandwidth == 10


def running_case1(
    orchestrator: Orchestrator, agents: dict[str, StandIn], home: Path, full: Collection[str] = ()
) -> None:
    """Case 1 running as placed (source and sink on cloud, the aggregate on fog-a), and a
    heartbeat from each stand-in saying so; the nodes in ``full`` have 100 MiB of 100 GiB
    free, the others 40 GiB."""
    from fogshift.spec import parse_spec

    if orchestrator.registry.get_pipeline("p") is None:
        orchestrator.registry.put_pipeline(parse_spec(SPEC, home), "running")
    placed = {"cloud": ["source", "sink"], "fog-a": ["aggregate"]}
    for name, agent in agents.items():
        elements = [{"pipeline": "p", "element": e, "state": "running", "epoch": 1}
                    for e in placed.get(name, [])]  # fmt: skip
        orchestrator.heartbeat(name, Heartbeat.model_validate({
            "url": agent.url, "ready": True, "elements": elements,
            "disk_free_bytes": 100 * 2**20 if name in full else 40 * 2**30,
            "disk_total_bytes": 100 * 2**30}))  # fmt: skip


def test_a_node_marked_leaving_is_no_pes_backup_or_redeploy_node_at_once(
    app: FastAPI, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    # A drain moves each PE to its planned redeploy node: the plan of the last round named
    # the node being drained (it still counted as live) until the next round, 10 s later.
    orchestrator = app.state.orchestrator
    running_case1(orchestrator, agents, tmp_path)
    before = orchestrator.replan().assignments
    target = before["p/aggregate"].redeploy
    assert target in ("cloud", "fog-b"), before
    client = TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"})
    assert client.put(f"/nodes/{target}/leaving", json={"seconds": 60}).status_code == 200
    during = PlanView.model_validate(client.get("/plan").json())
    assert during.error is None and set(during.assignments) == set(before), during
    for key, chosen in during.assignments.items():  # its own PEs are still planned for
        assert target not in (chosen.backup, chosen.redeploy), (key, during)
    assert client.put(f"/nodes/{target}/leaving", json={"seconds": None}).status_code == 200
    after = PlanView.model_validate(client.get("/plan").json()).assignments
    assert {k: a.redeploy for k, a in after.items()} == {k: a.redeploy for k, a in before.items()}


def test_a_node_whose_disk_is_nearly_full_is_no_backup_or_redeploy_node_while_two_have_room(
    app: FastAPI, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    # A full-disk probe: the planner kept a node with 0 bytes free as a backup and redeploy
    # node, where a replica failed at its first write and a restore at its first checkpoint.
    orchestrator = app.state.orchestrator

    def beat(full: set[str]) -> PlanView:
        running_case1(orchestrator, agents, tmp_path, full)
        return orchestrator.replan()

    before = beat(set())
    target = before.assignments["p/aggregate"].redeploy
    assert target in ("cloud", "fog-b") and before.low_disk_nodes == [], before
    during = beat({target})
    assert during.low_disk_nodes == [target] and during.error is None, during
    assert set(during.assignments) == set(before.assignments) and not during.unplanned, during
    for key, chosen in during.assignments.items():
        assert target not in (chosen.backup, chosen.redeploy), (key, during)
    # Said where the plan is shown.
    page = TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"}).get("/plan")
    assert PlanView.model_validate(page.json()).low_disk_nodes == [target]
    # With one node of room left (or none: nodes sharing one full disk), the disk ranks
    # nothing: every PE planned as before, none left without a backup.
    for full in ({target, "fog-a"}, set(agents)):
        shared = beat(full)
        assert shared.low_disk_nodes == [] and not shared.unplanned, shared
        assert {k: a.redeploy for k, a in shared.assignments.items()} == {
            k: a.redeploy for k, a in before.assignments.items()
        }


def test_the_first_plan_comes_as_soon_as_the_nodes_were_heard(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator's walk-through: an orchestrator started again showed no backup or
    # redeploy node for ~20 s (its first rounds came a whole interval after its start).
    import threading

    from fogshift.common.waiting import wait_until
    from fogshift.orchestrator import replanning

    orchestrator = app.state.orchestrator
    later = orchestrator.config.model_copy(update={"plan_interval_s": 3600.0})
    monkeypatch.setattr(orchestrator, "config", later)
    monkeypatch.setattr(replanning, "FIRST_PLAN_S", 0.05)
    rounds: list[float] = []
    monkeypatch.setattr(orchestrator, "replan", lambda: rounds.append(1.0))
    loop = threading.Thread(target=orchestrator.run_planner, daemon=True)
    loop.start()
    wait_until(lambda: rounds or None, 10, describe="the planner's first round")
    orchestrator.close()
    loop.join(10)
    assert rounds == [1.0] and not loop.is_alive()


def test_recent_values_give_a_rate_and_a_mean_over_their_window_only() -> None:
    # A PE's backup rate was its last pull's bytes over one central interval: a PE pulled
    # early at every checkpoint (3 a 15 s interval) was counted a third, and an idle one
    # kept its last burst's rate for good (an unchanged checkpoint is not pulled again).
    shipped: Recent[str] = Recent(45.0)
    for at, size in ((0.0, 300_000), (5.0, 300_000), (10.0, 300_000), (15.0, 150_000)):
        shipped.add("p/agg", size, at=at)
    assert shipped.per_s("p/agg", now=15.0) == pytest.approx(1_050_000 / 45)
    assert shipped.per_s("p/agg", now=55.0) == pytest.approx(450_000 / 45)  # (2 gone)
    assert shipped.per_s("p/agg", now=59.0) == pytest.approx(150_000 / 45)
    assert shipped.per_s("p/agg", now=61.0) == 0.0 and shipped.per_s("p/other") == 0.0
    # A node's CPU: the mean of its heartbeats within the window, none when none came.
    cpu: Recent[str] = Recent(10.0)
    for at, percent in ((0.0, 120.0), (1.0, 20.0), (2.0, 10.0)):
        cpu.add("fog-a", percent, at=at)
    assert cpu.mean("fog-a", now=2.0) == pytest.approx(50.0)
    assert cpu.mean("fog-a", now=10.5) == pytest.approx(15.0)
    assert cpu.mean("fog-a", now=13.0) is None and cpu.mean("fog-b") is None
    cpu.add("fog-b", 5.0)
    cpu.forget(lambda name: name == "fog-b")
    assert cpu.mean("fog-b") is None


def test_the_live_plan_reads_recent_pulls_and_heartbeats(app: FastAPI) -> None:
    orchestrator = app.state.orchestrator
    for percent in (100.0, 0.0, 20.0):  # (one second's reading swung the plan)
        orchestrator.heartbeat("fog-a", Heartbeat.model_validate(
            {"url": "http://127.0.0.1:9", "ready": True, "elements": [],
             "cpu_percent": percent}))  # fmt: skip
    (node,) = orchestrator.registry.nodes()
    assert node.report.cpu_percent == 20.0 and orchestrator._cpu_of(node) == pytest.approx(40.0)
    window = orchestrator.shipped.window_s
    assert window == 3 * orchestrator.config.central_interval_s


def test_a_pe_that_cannot_be_planned_keeps_its_plan_and_the_others_are_planned(
    app: FastAPI, agents: dict[str, StandIn], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # One PE no node could back up (its checkpoints ship more than any link from its node
    # carries) kept the previous plan for every PE of every pipeline, none on a fresh start.
    from fogshift.spec import parse_spec

    orchestrator = app.state.orchestrator
    for spec in (SPEC, {**SPEC, "pipeline": "q"}):
        orchestrator.registry.put_pipeline(parse_spec(spec, tmp_path), "running")
    for name, agent in agents.items():
        orchestrator.heartbeat(name, Heartbeat.model_validate(
            {"url": agent.url, "ready": True, "elements": []}))  # fmt: skip
    before = orchestrator.replan()
    assert before.unplanned == {} and len(before.assignments) == 6, before
    # (Its backups come from the central node, cloud, which it runs on: ~180 Gb/s to send
    # over 1 Gb/s links.)
    orchestrator.shipped.add(("q", "source"), 10**12)
    view = orchestrator.replan()
    assert list(view.unplanned) == ["q/source"], view
    assert "no backup server for task q/source" in view.unplanned["q/source"]
    assert view.error is None
    assert view.assignments["q/source"] == before.assignments["q/source"]  # kept
    assert set(view.assignments) == set(before.assignments)
    client = TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"})
    assert client.get("/plan").json()["unplanned"] == view.unplanned
    # Said once while it stays unplanned, though its reason's figures change every round.
    orchestrator.shipped.add(("q", "source"), 10**12)
    caplog.clear()
    with caplog.at_level("WARNING", logger="fogshift.orchestrator"):
        again = orchestrator.replan()
    assert again.unplanned["q/source"] != view.unplanned["q/source"]
    assert "keeps its previous plan" not in caplog.text
    # A round that fails whole says its error, not the last round's unplanned PEs.
    orchestrator.config.topology_file.write_text("links: [{a: x, b: x, bandwidth: 10}]\n")
    failed = orchestrator.replan()
    assert failed.error and failed.unplanned == {}
    # A pipeline forgotten (stopped, deleted) leaves the plan, and the one kept for the
    # next orchestrator: deployed again under its name, it started with them.
    orchestrator.forget_plan("q")
    assert not any(k.startswith("q/") for k in orchestrator.plan.assignments)
    kept = PlanView.model_validate_json(orchestrator.config.plan_file.read_text())
    assert set(kept.assignments) == {"p/source", "p/aggregate", "p/sink"}


def test_an_orchestrator_started_again_keeps_the_plan_of_a_node_that_is_down(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    # A PE whose node is down keeps its assignment through the rounds (the plan for the
    # failure at hand), but only in memory: started again meanwhile, the orchestrator had
    # none, and restored it on the least busy node whatever the CPU and links.
    from fogshift.orchestrator.service import Orchestrator
    from fogshift.spec import parse_spec
    from tests.orchestrator.standin import offline_config

    def started() -> Orchestrator:
        orchestrator = Orchestrator(offline_config(tmp_path))
        for name, agent in agents.items():
            orchestrator.heartbeat(name, Heartbeat.model_validate(
                {"url": agent.url, "ready": True, "elements": []}))  # fmt: skip
        return orchestrator

    first = started()
    try:
        first.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
        planned = first.replan().assignments["p/aggregate"]
        assert planned.redeploy is not None
    finally:
        first.close()
    second = Orchestrator(offline_config(tmp_path))
    try:
        assert second.planned("p", "aggregate") == planned  # before its first round
        assert second.plan.error == "not computed yet"
        second.registry._db.execute(  # (the aggregate's node is down)
            "UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'"
        )
        for name, agent in agents.items():
            if name != "fog-a":
                second.heartbeat(name, Heartbeat.model_validate(
                    {"url": agent.url, "ready": True, "elements": []}))  # fmt: skip
        assert second.replan().assignments["p/aggregate"] == planned
    finally:
        second.close()
    # A file that cannot be read is a plan to make afresh, said in the log.
    (tmp_path / "home").mkdir(exist_ok=True)
    broken = offline_config(tmp_path).plan_file
    broken.write_text("{")
    from fogshift.orchestrator.core import last_plan

    assert last_plan(broken).assignments == {}


def test_a_refused_topology_says_what_its_field_expects_and_got() -> None:
    # Every refusal gave the file's field list as expected, and a link to itself the whole
    # file as received.
    with pytest.raises(InvalidInput) as refused:
        FogTopology.parse("links: [{a: x, b: x, bandwidth: 10}]", source="t.yaml")
    assert (refused.value.expected, refused.value.received) == (
        "links between two different nodes, each pair once", "a: x, b: x")  # fmt: skip
    assert (refused.value.hint or "").startswith("name another node at one end")
    with pytest.raises(InvalidInput) as refused:
        FogTopology.parse("nodes: {fog-a: {cpu: -1}}", source="t.yaml")
    assert (refused.value.expected, refused.value.received) == ("a number above 0", "-1")
    # A misspelt key: the key as received (it was its value), and what it may have meant.
    with pytest.raises(InvalidInput) as refused:
        FogTopology.parse("centrl: cloud", source="t.yaml")
    assert refused.value.received == "'centrl'"
    assert (refused.value.hint or "").startswith("did you mean 'central'? a valid one reads")
    # Misspelt below the top level: said rather than the field it leaves missing, with the
    # keys known there.
    for text, key, known, guess in [
        ("nodes: {fog-a: {cpuu: 50}}", "cpuu", "cpu", "cpu"),
        ("links: [{a: cloud, b: fog-a, bandwith: 3}]", "bandwith", "a, b, bandwidth", "bandwidth"),
    ]:
        with pytest.raises(InvalidInput) as refused:
            FogTopology.parse(text, source="t.yaml")
        assert f".{key}: not a key known here" in refused.value.message, refused.value.message
        assert (refused.value.expected, refused.value.received) == (known, repr(key))
        assert (refused.value.hint or "").startswith(f"did you mean {guess!r}?")


def test_a_kept_assignment_naming_the_node_a_pe_runs_on_now_is_dropped() -> None:
    # Restored onto its redeploy node while planning failed, a PE was shown with that node
    # as its backup and redeploy node: a plan that is none.
    from fogshift.contracts import Assignment
    from fogshift.orchestrator.replanning import _sound

    planned = {"p/a": Assignment(backup="fog-b", redeploy="fog-b"),
               "p/b": Assignment(backup="cloud", redeploy="fog-b"),
               "q/gone": Assignment(backup="cloud", redeploy="cloud")}  # fmt: skip
    now = [pe("p/a", "fog-b"), pe("p/b", "fog-a")]
    assert _sound(planned, now) == {"p/b": planned["p/b"]}


def test_a_kept_plan_naming_a_leaving_or_nearly_full_node_is_dropped() -> None:
    # A round that could not plan anew kept every PE's plan: one naming a node being
    # drained (or short of disk) went on sending backups there.
    from fogshift.contracts import Assignment
    from fogshift.orchestrator.replanning import _sound

    kept = {
        "p/a": Assignment(backup="fog-b", redeploy="fog-c"),
        "p/b": Assignment(backup="fog-c", redeploy="cloud"),
        "p/c": Assignment(backup="cloud", redeploy="fog-a"),  # its own node now
    }
    pes = [pe("p/a", "fog-a"), pe("p/b", "fog-a"), pe("p/c", "fog-a")]
    assert sorted(_sound(kept, pes)) == ["p/a", "p/b"]
    assert sorted(_sound(kept, pes, {"fog-b"})) == ["p/b"]
    assert sorted(_sound(kept, pes, {"fog-b", "cloud"})) == []
