"""The exact MILP against hand-computed optima, brute force, and infeasible instances."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from planner_testlib import brute_force, close, task, topo, topologies

from fogshift.planner import InfeasiblePlan, SolverFailed, Topology, plan
from fogshift.planner.greedy import solve_greedy
from fogshift.planner.instances import random_topology
from fogshift.planner.milp import solve_exact


def forced_remote(t2_backup_rate: float | None = None) -> Topology:
    """t1 on s1 can only back up on s2 (s1-s3 is too thin) and only run on s3 (s2 is full).

    Hand optimum: recover 100 Mb from s2 to s3 over the 40 Mb/s s2-s3 link: 2500 ms. With
    t2 on s2 (``t2_backup_rate`` given), the s1-s2 link (20 Mb/s) cannot carry both t1's and
    t2's replication, so t2 backs up on s3 and its replication takes 15 of s2-s3's 40 Mb/s;
    when s1 fails only 25 are left for t1's recovery, the grid gives Z = 20: 5000 ms.
    """
    tasks = [task("t1", "s1", cpu=30, backup_rate=10, transfer_size=100, latency_ms=10_000)]
    load_s2 = 100.0
    if t2_backup_rate is not None:
        tasks.append(task("t2", "s2", cpu=10, backup_rate=t2_backup_rate, latency_ms=20_000))
        load_s2 = 90.0
    return topo(
        [("s1", 100, 0), ("s2", 100, load_s2), ("s3", 100, 50)],
        tasks,
        [("s1", "s2", 50 if t2_backup_rate is None else 20), ("s1", "s3", 5), ("s2", "s3", 40)],
    )


def test_colocation_is_free_and_optimal() -> None:
    t = topo(
        [("s1", 100, 0), ("s2", 100, 0), ("s3", 100, 0)],
        [task("t1", "s1")],
        [("s1", "s2", 100), ("s1", "s3", 100)],
    )
    p = solve_exact(t)
    assert p.status == "optimal"
    assert p.objective_ms == 0
    a = p.assignments[0]
    assert a.backup == a.redeploy != "s1"
    assert a.recovery_bandwidth is None
    assert p.check(t) == []


def test_forced_remote_recovery_uses_the_whole_bottleneck() -> None:
    t = forced_remote()
    p = solve_exact(t)
    assert p.status == "optimal"
    a = p.by_task()["t1"]
    assert (a.backup, a.redeploy, a.recovery_bandwidth) == ("s2", "s3", 40.0)
    assert p.objective_ms == pytest.approx(2500.0)
    assert p.bound_ms == pytest.approx(2500.0, rel=1e-5)
    assert p.check(t) == []


def test_replication_of_other_tasks_shrinks_the_recovery_share() -> None:
    t = forced_remote(t2_backup_rate=15)
    p = solve_exact(t)
    by = p.by_task()
    assert (by["t1"].backup, by["t1"].redeploy, by["t1"].recovery_bandwidth) == (
        "s2",
        "s3",
        20.0,
    )
    assert (by["t2"].backup, by["t2"].redeploy) == ("s3", "s3")
    assert p.objective_ms == pytest.approx(5000.0)
    best = brute_force(t)
    assert best is not None and close(best[0], 5000.0)


def greedy_trap() -> Topology:
    """The latency-first greedy gives s2's single slot to t_a although t_a could use s3.

    Line s1 - s2 - s3. s2 and s3 have 10 free CPU each (room for one task of s1). t_b
    (10 Mb/s backup) cannot back up on s3 through the 5 Mb/s s2-s3 link, so its only free
    plan is co-location on s2; t_a (served first, lower l_τ) takes s2 as the closest server.
    Exact: t_a -> s3, t_b -> s2, objective 0. Greedy: t_b recovers 100 Mb from s2 to s3 at
    5 Mb/s: 20000 ms.
    """
    return topo(
        [("s1", 100, 0), ("s2", 100, 90), ("s3", 100, 90)],
        [
            task("ta", "s1", cpu=10, backup_rate=1, latency_ms=1000),
            task("tb", "s1", cpu=10, backup_rate=8, transfer_size=100, latency_ms=30_000),
        ],
        [("s1", "s2", 100), ("s2", "s3", 5)],
    )


def test_exact_beats_the_greedy_on_its_trap() -> None:
    t = greedy_trap()
    exact = solve_exact(t)
    greedy = solve_greedy(t)
    assert exact.objective_ms == 0
    assert greedy.objective_ms == pytest.approx(20_000.0)
    assert exact.by_task()["ta"].backup == "s3"
    assert greedy.by_task()["ta"].backup == "s2"
    assert exact.check(t) == [] and greedy.check(t) == []
    best = brute_force(t)
    assert best is not None and best[0] == 0


def test_warm_start_never_hurts_and_reports_total_time() -> None:
    t = greedy_trap()
    p = plan(t, "exact")
    assert p.method == "exact" and p.status == "optimal"
    assert p.objective_ms == 0
    assert p.solve_ms > 0


def test_plan_validates_its_arguments() -> None:
    t = greedy_trap()
    with pytest.raises(ValueError, match="method"):
        plan(t, "magic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="time_limit_s"):
        plan(t, "exact", time_limit_s=0)
    with pytest.raises(ValueError, match="shares"):
        plan(t, "greedy", shares=[1.5])
    with pytest.raises(ValueError, match="shares"):
        solve_exact(t, shares=[])


def test_no_tasks_is_an_empty_optimal_plan() -> None:
    t = topo([("s1", 10, 0)], [], [])
    for method in ("exact", "greedy"):
        p = plan(t, method)  # type: ignore[arg-type]
        assert p.assignments == () and p.objective_ms == 0


# --- infeasible instances: the error names the constraint -------------------------------


def test_single_server_has_no_backup() -> None:
    t = topo([("s1", 100, 0)], [task("t1", "s1")], [])
    with pytest.raises(InfeasiblePlan) as info:
        plan(t)
    assert info.value.constraint == "no_other_server"
    assert "no server other than its primary s1" in info.value.message


def test_cpu_infeasible_names_task_need_and_failing_server() -> None:
    t = topo(
        [("s1", 100, 0), ("s2", 100, 70), ("s3", 100, 80)],
        [task("t3", "s1", cpu=40)],
        [("s1", "s2", 100), ("s1", "s3", 100)],
    )
    for method in ("exact", "greedy"):
        with pytest.raises(InfeasiblePlan) as info:
            plan(t, method)  # type: ignore[arg-type]
        err = info.value
        assert err.constraint == "cpu" and err.proven and err.task_id == "t3"
        assert err.message == (
            "task t3 needs 40 CPU but no server other than its primary s1 has 40 free when s1 fails"
        )
        assert err.received == "the most free CPU is 30 on s2"


def test_replication_infeasible_names_task_and_bottleneck() -> None:
    t = topo(
        [("s1", 100, 0), ("s2", 100, 0), ("s3", 100, 0)],
        [task("t2", "s1", backup_rate=10)],
        [("s1", "s2", 5), ("s2", "s3", 100)],
    )
    with pytest.raises(InfeasiblePlan) as info:
        plan(t)
    err = info.value
    assert err.constraint == "replication_bandwidth" and err.task_id == "t2"
    assert "no backup server for task t2 is reachable from its primary s1" in err.message
    assert "5 Mb/s bottleneck" in (err.received or "")


def test_isolated_server_cannot_replicate() -> None:
    t = topo([("s1", 100, 0), ("s2", 100, 0)], [task("t1", "s1", backup_rate=0)], [])
    with pytest.raises(InfeasiblePlan) as info:
        plan(t)
    assert info.value.constraint == "replication_bandwidth"
    assert info.value.received == "s1 has no route to any other server"


def test_latency_infeasible_names_the_requirement_and_fastest_recovery() -> None:
    # forced_remote's only plan takes 2500 ms; require 1000 ms.
    base = forced_remote()
    t = base.model_copy(
        update={"tasks": (base.tasks[0].model_copy(update={"latency_ms": 1000.0}),)}
    )
    for method in ("exact", "greedy"):
        with pytest.raises(InfeasiblePlan) as info:
            plan(t, method)  # type: ignore[arg-type]
        err = info.value
        assert err.constraint == "latency" and err.proven
        assert "recovers within its latency requirement 1000 ms" in err.message
        assert "takes 2500 ms" in (err.received or "")


def test_aggregate_cpu_conflict_is_blamed_on_the_failing_server() -> None:
    # Each task fits s2 alone, but when s1 fails both need s2: 60 > 50.
    t = topo(
        [("s1", 100, 0), ("s2", 100, 50), ("s3", 100, 100)],
        [task("t1", "s1", cpu=30), task("t2", "s1", cpu=30)],
        [("s1", "s2", 100), ("s2", "s3", 100)],
    )
    assert brute_force(t) is None
    with pytest.raises(InfeasiblePlan) as info:
        solve_exact(t)
    err = info.value
    assert err.constraint == "cpu" and err.server_id == "s1" and err.proven
    assert "when s1 fails, its tasks cannot all be redeployed" in err.message
    with pytest.raises(InfeasiblePlan) as ginfo:
        solve_greedy(t)
    assert not ginfo.value.proven and ginfo.value.constraint == "cpu"
    assert "greedy could not place task t2" in ginfo.value.message


def test_aggregate_replication_conflict() -> None:
    # Every backup route leaves s1 over the 10 Mb/s s1-s2 link: 6 + 6 > 10.
    t = topo(
        [("s1", 100, 0), ("s2", 100, 0), ("s3", 100, 0)],
        [task("t1", "s1", backup_rate=6), task("t2", "s1", backup_rate=6)],
        [("s1", "s2", 10), ("s2", "s3", 100)],
    )
    assert brute_force(t) is None
    with pytest.raises(InfeasiblePlan) as info:
        solve_exact(t)
    assert info.value.constraint == "replication_bandwidth"
    with pytest.raises(InfeasiblePlan) as ginfo:
        solve_greedy(t)
    assert ginfo.value.constraint == "replication_bandwidth" and not ginfo.value.proven


def test_time_limit_returns_the_incumbent_or_fails_cleanly() -> None:
    t = random_topology(90, 30, seed=5)
    greedy = solve_greedy(t)
    p = plan(t, "exact", time_limit_s=0.05)
    # 0.05 s does not cover HiGHS' presolve of this model; the greedy start is kept.
    assert p.status == "time_limit"
    assert p.objective_ms <= greedy.objective_ms + 1e-6
    assert p.check(t) == []
    with pytest.raises(SolverFailed, match="no plan within the time limit"):
        solve_exact(t, time_limit_s=0.05)


# --- the MILP agrees with brute force on random tiny instances --------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(max_servers=3, max_tasks=3))
def test_exact_matches_brute_force(t: Topology) -> None:
    best = brute_force(t)
    if best is None:
        with pytest.raises(InfeasiblePlan):
            solve_exact(t)
        return
    p = solve_exact(t)
    assert p.status == "optimal"
    assert p.check(t) == []
    assert close(p.objective_ms, best[0]), (p.objective_ms, best)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(max_servers=4, max_tasks=2))
def test_exact_matches_brute_force_on_four_servers(t: Topology) -> None:
    best = brute_force(t)
    if best is None:
        with pytest.raises(InfeasiblePlan):
            solve_exact(t)
        return
    p = solve_exact(t)
    assert p.check(t) == []
    assert close(p.objective_ms, best[0]), (p.objective_ms, best)


def test_a_share_grid_that_misses_the_latency_is_infeasible_not_an_assertion() -> None:
    # The pair s2 -> s3 meets the latency at its whole bottleneck, but not at half of it,
    # the grid's only share: explain_task found the pair, and the solver asserted.
    t = topo(
        [("s1", 100, 0), ("s2", 10, 10), ("s3", 100, 0)],
        [task("t1", "s1", cpu=10, latency_ms=1000, backup_rate=50, transfer_size=80)],
        [("s1", "s2", 100), ("s2", "s3", 100), ("s1", "s3", 10)],
    )
    with pytest.raises(InfeasiblePlan) as refused:
        solve_exact(t, shares=(0.5,))
    assert refused.value.constraint == "latency" and "grid [0.5]" in refused.value.message


def test_the_exact_solver_allows_what_the_plans_check_allows() -> None:
    # A backup rate 0.0005 Mb/s over a 1000 Mb/s link: within the check's tolerance (float
    # sums are inexact), so the greedy's plan passes it; HiGHS, held to the bare capacity,
    # called the task proven infeasible (and elsewhere settled on a worse plan).
    t = topo(
        [("s1", 100, 0), ("s2", 100, 0), ("s3", 100, 0)],
        [task("t1", "s1", backup_rate=1000.0005)],
        [("s1", "s2", 1000), ("s2", "s3", 1000)],
    )
    greedy = plan(t, "greedy")
    assert greedy.check(t) == []
    for warm_start in (True, False):
        exact = plan(t, "exact", warm_start=warm_start)
        assert exact.check(t) == [] and exact.objective_ms <= greedy.objective_ms
