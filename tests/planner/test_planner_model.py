"""Model validation, routes, and the independent constraint checker (Plan.check)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pydantic
import pytest
from planner_testlib import task, topo

import fogshift.planner
from fogshift.exceptions import FogshiftError, InvalidInput
from fogshift.planner import (
    Assignment,
    InfeasiblePlan,
    InvalidTopology,
    Plan,
    PlannerError,
    Topology,
)
from fogshift.planner.model import violations

YAML = """
servers:
  - {id: s1, cpu: 100, load: 10}
  - {id: s2, cpu: 100}
  - {id: s3, cpu: 50, load: 5}
tasks:
  - {id: t1, server: s1, cpu: 20, latency_ms: 5000, backup_rate: 5, transfer_size: 160}
links:
  - {a: s1, b: s2, bandwidth: 100}
  - {a: s2, b: s3, bandwidth: 10}
"""


def test_from_yaml_loads_every_field(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(YAML)
    t = Topology.from_yaml(path)
    assert [s.id for s in t.servers] == ["s1", "s2", "s3"]
    assert t.servers[1].load == 0.0
    assert t.tasks[0].transfer_size == 160
    assert t.links[1].bandwidth == 10
    net = t.network()
    assert net.free_cpu == (70.0, 100.0, 45.0)


def test_models_are_frozen() -> None:
    t = topo([("s1", 100, 0)], [], [])
    with pytest.raises(pydantic.ValidationError):
        t.servers[0].cpu = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"servers": [{"id": "s1", "cpu": -1}]}, "servers[0].cpu"),
        ({"servers": [{"id": "s1", "cpu": 10, "cpus": 3}]}, "servers[0].cpus"),
        ({"servers": [{"id": "s1", "cpu": 10}], "tasks": [{"id": "t"}]}, "tasks[0].server"),
        (
            {"servers": [{"id": "s1", "cpu": 10}], "tasks": [task("t1", "s9")]},
            "tasks[0].server: unknown server 's9'",
        ),
        (
            {"servers": [{"id": "s1", "cpu": 10}, {"id": "s1", "cpu": 10}]},
            "servers[1].id: duplicate",
        ),
        (
            {"servers": [{"id": "s1", "cpu": 10}], "tasks": [task("t1", "s1", cpu=11)]},
            "servers[0].cpu: server 's1' has capacity 10",
        ),
        (
            {
                "servers": [{"id": "s1", "cpu": 10}],
                "links": [{"a": "s1", "b": "s1", "bandwidth": 1}],
            },
            "links[0]: link joins server 's1' to itself",
        ),
        (
            {
                "servers": [{"id": "s1", "cpu": 10}, {"id": "s2", "cpu": 10}],
                "links": [
                    {"a": "s1", "b": "s2", "bandwidth": 1},
                    {"a": "s2", "b": "s1", "bandwidth": 1},
                ],
            },
            "links[1]: second link",
        ),
        (
            {
                "servers": [{"id": "s1", "cpu": 10}],
                "links": [{"a": "s1", "b": "x", "bandwidth": 1}],
            },
            "links[0].b: unknown server 'x'",
        ),
        ({"servers": [{"id": "s1", "cpu": float("nan")}]}, "servers[0].cpu"),
        (
            {"servers": [{"id": "s1", "cpu": 10}], "tasks": [task("t1", "s1", latency_ms=0)]},
            "tasks[0].latency_ms",
        ),
    ],
)
def test_validation_errors_name_the_field(data: dict[str, object], where: str) -> None:
    with pytest.raises(InvalidTopology) as info:
        Topology.from_dict(data)
    assert where in info.value.message
    assert isinstance(info.value, InvalidInput)
    assert info.value.to_dict()["code"] == "invalid_topology"


def test_a_number_too_long_to_write_is_refused_not_a_crash() -> None:
    # Python writes no integer of over 4300 digits as text: the refusal quoting it raised
    # ValueError (`fogshift plan` printed a traceback; `PUT /topology` answered 500).
    huge = 16**3600 - 1
    with pytest.raises(InvalidTopology) as info:
        Topology.from_dict({"servers": [{"id": "s1", "cpu": huge, "load": 0}]})
    assert "servers[0].cpu" in info.value.message
    assert info.value.received == "an integer of 14400 bits"


def test_from_yaml_reports_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidTopology, match="cannot read topology file"):
        Topology.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("servers: [unclosed\n")
    with pytest.raises(InvalidTopology, match="not valid YAML"):
        Topology.from_yaml(bad)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(InvalidTopology, match="top level must be a mapping"):
        Topology.from_yaml(top)


def test_error_hierarchy() -> None:
    err = InfeasiblePlan("x", constraint="cpu", task_id="t1")
    assert isinstance(err, PlannerError)
    assert isinstance(err, InvalidInput)
    assert isinstance(err, FogshiftError)
    assert err.http_status == 422
    assert err.to_dict()["code"] == "infeasible_plan"
    assert err.proven


def test_routes_prefer_fewest_hops_then_widest() -> None:
    # s1-s2-s4 (bottleneck 10) and s1-s3-s4 (bottleneck 50) both have 2 hops; the direct
    # but slow s1-s5 link wins over any 2-hop path to s5.
    t = topo(
        [(f"s{k}", 100, 0) for k in range(1, 7)],
        [],
        [
            ("s1", "s2", 100),
            ("s2", "s4", 10),
            ("s1", "s3", 50),
            ("s3", "s4", 80),
            ("s1", "s5", 1),
            ("s4", "s5", 1000),
        ],
    )
    net = t.network()
    s = net.server_index
    route = net.route(s["s1"], s["s4"])
    assert route is not None
    assert [net.link_name(e) for e in route] == ["s1-s3", "s3-s4"]
    assert net.bottleneck(s["s1"], s["s4"]) == 50
    assert net.hops(s["s1"], s["s5"]) == 1
    assert net.bottleneck(s["s1"], s["s5"]) == 1
    assert net.route(s["s1"], s["s6"]) is None
    assert net.bottleneck(s["s1"], s["s6"]) == 0
    assert net.route(s["s2"], s["s2"]) == ()


def test_assignment_requires_bandwidth_exactly_when_remote() -> None:
    Assignment(task="t", backup="a", redeploy="a", recovery_ms=0)
    Assignment(task="t", backup="a", redeploy="b", recovery_bandwidth=5, recovery_ms=1)
    with pytest.raises(pydantic.ValidationError, match="recovery_bandwidth must be None"):
        Assignment(task="t", backup="a", redeploy="b", recovery_ms=1)
    with pytest.raises(pydantic.ValidationError, match="recovery_bandwidth must be None"):
        Assignment(task="t", backup="a", redeploy="a", recovery_bandwidth=5, recovery_ms=0)


# A line s1 - s2 - s3 with t1, t2 on s1; s2 has 15 free CPU, s3 has 100.
LINE = topo(
    [("s1", 100, 0), ("s2", 100, 85), ("s3", 100, 0)],
    [
        task("t1", "s1", cpu=10, backup_rate=30, transfer_size=100, latency_ms=3000),
        task("t2", "s1", cpu=10, backup_rate=30, transfer_size=100, latency_ms=3000),
    ],
    [("s1", "s2", 100), ("s2", "s3", 40)],
)


def test_violations_accepts_a_valid_plan() -> None:
    net = LINE.network()
    ok = {"t1": ("s2", "s2", None), "t2": ("s2", "s3", 40.0)}
    assert violations(net, ok) == []


@pytest.mark.parametrize(
    ("choice", "fragment"),
    [
        ({"t1": ("s1", "s2", 40.0), "t2": ("s2", "s2", None)}, "backup server s1 is its own"),
        ({"t1": ("s2", "s1", 100.0), "t2": ("s2", "s3", 40.0)}, "redeploy server s1 is its own"),
        # 60 Mb/s of replication over the 40 Mb/s s2-s3 link.
        ({"t1": ("s3", "s3", None), "t2": ("s3", "s3", None)}, "link s2-s3: replication"),
        # both redeployed to s2 when s1 fails: 20 CPU > 15 free.
        ({"t1": ("s2", "s2", None), "t2": ("s3", "s2", 40.0)}, "CheckCPU"),
        # two full-bandwidth recoveries share s2-s3 when s1 fails: 80 > 40.
        ({"t1": ("s2", "s3", 40.0), "t2": ("s2", "s3", 40.0)}, "(eq. 4)"),
        # 100 Mb at 20 Mb/s = 5000 ms > 3000 ms.
        ({"t1": ("s2", "s2", None), "t2": ("s2", "s3", 20.0)}, "over its latency"),
        ({"t1": ("s2", "s2", None), "t2": ("s2", "s3", 80.0)}, "exceeds the 40 Mb/s bottleneck"),
        ({"t1": ("s2", "s2", None)}, "task t2 has no assignment"),
        ({"t1": ("s2", "s2", None), "t2": ("s2", "s9", 1.0)}, "unknown server s9"),
        ({"t1": ("s2", "s2", None), "t2": ("s2", "s3", 40.0), "t3": ("s2", "s2", None)}, "t3"),
    ],
)
def test_violations_names_each_broken_constraint(
    choice: dict[str, tuple[str, str, float | None]], fragment: str
) -> None:
    problems = violations(LINE.network(), choice)
    assert any(fragment in p for p in problems), problems


def test_violations_needs_a_route_for_replication_and_recovery() -> None:
    t = topo(
        [("s1", 100, 0), ("s2", 100, 0), ("s3", 100, 0)],
        [task("t1", "s1")],
        [("s1", "s2", 100)],
    )
    net = t.network()
    assert "no route from s1 to backup s3" in violations(net, {"t1": ("s3", "s3", None)})[0]
    assert "no route from backup s2 to redeploy s3" in violations(net, {"t1": ("s2", "s3", 1.0)})[0]


def test_violations_names_a_leaving_backup_or_redeploy_server() -> None:
    t = topo(
        [("s1", 100, 0), ("s2", 100, 0, True), ("s3", 100, 0)],
        [task("t1", "s1")],
        [("s1", "s2", 100), ("s2", "s3", 100)],
    )
    net = t.network()
    assert violations(net, {"t1": ("s3", "s3", None)}) == []  # through s2: it forwards
    assert violations(net, {"t1": ("s2", "s2", None)}) == [
        "task t1: backup server s2 is leaving",
        "task t1: redeploy server s2 is leaving",
    ]
    assert violations(net, {"t1": ("s3", "s2", 50.0)}) == ["task t1: redeploy server s2 is leaving"]


def _plan(assignments: list[Assignment], objective: float) -> Plan:
    return Plan(
        assignments=tuple(assignments),
        objective_ms=objective,
        method="greedy",
        status="heuristic",
        solve_ms=0,
    )


def test_plan_check_verifies_recovery_times_and_objective() -> None:
    a1 = Assignment(task="t1", backup="s2", redeploy="s2", recovery_ms=0)
    a2 = Assignment(task="t2", backup="s2", redeploy="s3", recovery_bandwidth=40, recovery_ms=2500)
    assert _plan([a1, a2], 2500).check(LINE) == []
    assert "objective_ms is 1 but the sum is 2500" in _plan([a1, a2], 1).check(LINE)[0]
    wrong = a2.model_copy(update={"recovery_ms": 10.0})
    assert "recovery_ms is 10 but b/Z gives 2500" in _plan([a1, wrong], 10).check(LINE)[0]
    assert "assigned more than once" in _plan([a1, a1, a2], 2500).check(LINE)[0]
    assert _plan([a1, a2], 2500).by_task()["t2"].redeploy == "s3"


def test_package_docstring_example_runs() -> None:
    result = doctest.testmod(fogshift.planner, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_backup_data_from_another_server_is_checked_on_the_route_from_it() -> None:
    """A task's backup data sent to its backup from another server (fogshift's central
    store: ``replicas_from``) loads the route from there; the direct route, fat here,
    carries none of it."""
    t = topo(
        [("w", 100, 0), ("c", 100, 0), ("b", 100, 0), ("x", 100, 0)],
        [task("t1", "w", backup_rate=10, replicas_from="c"),
         task("t2", "w", backup_rate=10, replicas_from="c")],
        [("w", "c", 100), ("c", "b", 15), ("w", "b", 100), ("w", "x", 25)],
    )  # fmt: skip
    net = t.network()
    link = {net.link_name(e): e for e in range(len(net.bandwidth))}
    assert net.replication_route(0, net.server_index["b"]) == (link["c-b"],)
    assert net.replication_route(0, net.server_index["x"]) == (link["w-c"], link["w-x"])
    assert net.replication_width(0, net.server_index["x"]) == 25
    assert net.replication_route(0, net.server_index["c"]) == ()
    both_on_b = {"t1": ("b", "b", None), "t2": ("b", "b", None)}
    assert any("link c-b: replication" in p for p in violations(net, both_on_b))
    one_each = {"t1": ("b", "b", None), "t2": ("x", "x", None)}
    assert violations(net, one_each) == []
    unknown = t.model_dump()
    unknown["tasks"][0]["replicas_from"] = "nowhere"
    with pytest.raises(InvalidInput, match=r"tasks\[0\].replicas_from: unknown server"):
        Topology.from_dict(unknown)
