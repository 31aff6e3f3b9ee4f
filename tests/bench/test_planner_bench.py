"""The planner benchmark (`fogshift.bench.planner`) in-process: instance generator,
configurations, statuses, summaries, the report, and a tiny real run whose plans are
re-checked independently."""

from __future__ import annotations

import builtins
import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from fogshift.bench.planner import (
    CSV_FIELDS,
    CSV_NAME,
    META_NAME,
    REPORT_NAME,
    BenchConfig,
    BenchError,
    InvalidBenchConfig,
    InvalidBenchResults,
    RunRow,
    Sweep,
    instance_seed,
    measure,
    quick_config,
    random_topology,
    read_rows,
    reference_config,
    render_report,
    run_benchmark,
    summarise,
    write_report,
)
from fogshift.planner.greedy import solve_greedy
from tests.planner.planner_testlib import task, topo

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_random_topology_is_reproducible_and_valid() -> None:
    a = random_topology(30, 10, seed=7)
    assert a == random_topology(30, 10, seed=7)
    assert a != random_topology(30, 10, seed=8)
    assert len(a.tasks) == 30 and len(a.servers) == 10
    net = a.network()
    assert all(net.route(0, k) is not None for k in range(10))  # connected
    assert all(f >= -1e-9 for f in net.free_cpu)


def test_random_topology_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="n_servers"):
        random_topology(1, 0, seed=0)
    with pytest.raises(ValueError, match="do not fit"):
        random_topology(200, 2, seed=0)


def test_reference_config_is_the_papers_grid_plus_the_scale_sweep() -> None:
    config = reference_config()
    assert (config.trials, config.time_limit_s) == (10, 60.0)
    fig5, fig6, scale = config.sweeps
    assert fig5.points == tuple((t, 30) for t in range(10, 121, 10))
    assert fig6.points == tuple((30, s) for s in (30, 36, 42, 48, 54, 60))
    assert fig5.methods == fig6.methods == ("exact", "greedy")
    assert scale.methods == ("greedy",)
    assert max(scale.points) == (1000, 200)
    assert (fig5.x_axis, fig6.x_axis, scale.x_axis) == ("tasks", "servers", "tasks")
    quick = quick_config()
    assert [s.name for s in quick.sweeps] == [s.name for s in config.sweeps]
    assert quick.total_runs < config.total_runs / 5


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"trials": 0}, "trials"),
        ({"time_limit_s": 0.0}, "time limit"),
        ({"time_limit_s": math.inf}, "time limit"),
    ],
)
def test_bad_configurations_are_refused(change: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidBenchConfig, match=words) as info:
        dataclasses.replace(quick_config(), **change)
    assert info.value.expected is not None and info.value.received is not None


def test_bad_sweeps_are_refused() -> None:
    with pytest.raises(InvalidBenchConfig, match="file-safe"):
        Sweep("Fig 5", "t", ((1, 2),))
    with pytest.raises(InvalidBenchConfig, match="servers"):
        Sweep("a", "t", ((1, 1),))
    with pytest.raises(InvalidBenchConfig, match="method"):
        Sweep("a", "t", ((1, 2),), methods=("cbc",))  # type: ignore[arg-type]
    sweep = Sweep("a", "t", ((1, 2),))
    with pytest.raises(InvalidBenchConfig, match="unique"):
        BenchConfig("x", (sweep, sweep), 1, 1.0)


def test_measure_maps_planner_errors_to_statuses() -> None:
    # s2 cannot take t1's 50 CPU: proven infeasible for both methods, blaming the CPU.
    impossible = topo(
        [("s1", 100, 0), ("s2", 10, 0)],
        [task("t1", "s1", cpu=50)],
        [("s1", "s2", 100)],
    )
    for method in ("exact", "greedy"):
        outcome = measure(method, impossible, time_limit_s=5)  # type: ignore[arg-type]
        assert (outcome.status, outcome.detail, outcome.plan) == ("infeasible", "cpu", None)
        assert outcome.time_s > 0
    # A generated instance where the greedy gives up although no task is impossible alone.
    stuck = random_topology(100, 20, seed=instance_seed(100, 20, 0))
    outcome = measure("greedy", stuck, time_limit_s=5)
    assert outcome.status == "stuck" and outcome.plan is None and outcome.detail


def _row(trial: int, method: str, status: str, objective: float | None, **kw: Any) -> RunRow:
    values: dict[str, Any] = {
        "sweep": "s",
        "tasks": 5,
        "servers": 3,
        "trial": trial,
        "seed": instance_seed(5, 3, trial),
        "extra_links": 1.5,
        "method": method,
        "time_limit_s": 1.0 if method == "exact" else None,
        "status": status,
        "time_s": 0.5 if method == "exact" else 0.001,
        "objective_ms": objective,
        "bound_ms": None,
        "violations": None if objective is None else 0,
        "detail": "",
        "load1": 0.5,
    }
    values.update(kw)
    return RunRow(**values)


SYNTHETIC = [
    _row(0, "exact", "optimal", 0.0),  # optimum 0, greedy 0: matches
    _row(0, "greedy", "heuristic", 0.0),
    _row(1, "exact", "optimal", 1000.0),  # greedy 3 s worse
    _row(1, "greedy", "heuristic", 4000.0),
    _row(2, "exact", "optimal", 500.0),  # greedy stuck: not in the gap basis
    _row(2, "greedy", "stuck", None),
    _row(3, "exact", "time_limit", 800.0),  # not proven optimal: not in the gap basis
    _row(3, "greedy", "heuristic", 900.0),
    _row(4, "exact", "infeasible", None),  # counted, not dropped
    _row(4, "greedy", "infeasible", None),
    _row(5, "exact", "no_solution", None),  # neither a plan nor a proof
    _row(5, "greedy", "stuck", None),
]


def test_summary_gap_only_over_proven_optima_and_counts_every_outcome() -> None:
    (p,) = summarise(SYNTHETIC)
    assert p.trials == 6
    assert p.exact_optimal == 3
    assert p.gaps_ms == [0.0, 3000.0] and p.optima_ms == [0.0, 1000.0]
    assert p.greedy_matches == 1
    assert p.mean_gap_ms == 1500.0 and p.max_gap_ms == 3000.0
    assert p.relative_gap == pytest.approx(3000.0 / 1000.0)
    assert (p.infeasible, p.undecided) == (1, 1)
    assert p.outcomes["exact"] == {
        "optimal": 3,
        "time_limit": 1,
        "infeasible": 1,
        "no_solution": 1,
    }
    assert p.mean("exact") == 0.5 and p.median("greedy") == 0.001
    # Every optimum 0 but a positive greedy objective: the relative gap is infinite.
    (q,) = summarise([_row(0, "exact", "optimal", 0.0), _row(0, "greedy", "heuristic", 10.0)])
    assert q.relative_gap == math.inf


def test_report_states_limit_counts_and_incompleteness() -> None:
    config = BenchConfig("t", (Sweep("s", "Sweep S", ((5, 3),)),), trials=8, time_limit_s=1.0)
    text = render_report(config, {"command": "c", "machine": {"cores": 2}}, SYNTHETIC, {})
    assert "**1 s**" in text
    assert "12 of 16 planned" in text and "incomplete run" in text
    assert "Infeasible instances: 1 of 6; undecided: 1 of 6." in text
    line = next(x for x in text.splitlines() if x.startswith("| 5 | 3 |"))
    assert "| 2/6 | 1/2 | 1.50 | 3.00 | 300.0 % |" in line


def test_reading_results_that_are_not_a_benchmarks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidBenchResults, match="cannot read") as info:
        write_report(tmp_path)
    assert info.value.hint is not None
    (tmp_path / CSV_NAME).write_text("a,b\n1,2\n")
    with pytest.raises(InvalidBenchResults, match="columns") as info:
        read_rows(tmp_path / CSV_NAME)
    assert info.value.expected == ", ".join(CSV_FIELDS)


def test_output_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(InvalidBenchConfig, match="not a folder"):
        run_benchmark(quick_config(), tmp_path / "f")


TINY = BenchConfig(
    "tiny",
    (
        Sweep("both", "exact and greedy", ((6, 5), (12, 6))),
        Sweep("greedy_only", "greedy only", ((40, 10),), methods=("greedy",), extra_links=3.0),
    ),
    trials=2,
    time_limit_s=5.0,
)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RunRow]]:
    out = tmp_path_factory.mktemp("bench")
    started: list[tuple[str, int, int, int, str]] = []
    seen: list[RunRow] = []
    rows = run_benchmark(
        TINY,
        out,
        command="test",
        on_start=lambda s, t, n, k, m: started.append((s.name, t, n, k, m)),
        on_row=seen.append,
    )
    assert rows == seen
    assert started == [(r.sweep, r.tasks, r.servers, r.trial, r.method) for r in rows]
    return out, rows


def test_tiny_run_writes_every_configured_run(tiny_run: tuple[Path, list[RunRow]]) -> None:
    out, rows = tiny_run
    expected = [
        (s.name, t, n, k, m)
        for s in TINY.sweeps
        for t, n in s.points
        for k in range(TINY.trials)
        for m in s.methods
    ]
    assert [(r.sweep, r.tasks, r.servers, r.trial, r.method) for r in rows] == expected
    assert read_rows(out / CSV_NAME) == rows  # the CSV round-trips exactly
    for r in rows:
        assert r.seed == instance_seed(r.tasks, r.servers, r.trial)
        assert r.time_s > 0
        assert r.has_plan == (r.objective_ms is not None) == (r.violations is not None)
        assert r.violations in (None, 0)
    for name in ("both.png", "greedy_only.png"):
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE)
    assert (out / META_NAME).exists() and (out / REPORT_NAME).exists()


def test_every_greedy_plan_of_the_tiny_run_is_feasible(
    tiny_run: tuple[Path, list[RunRow]],
) -> None:
    _, rows = tiny_run
    exact = {r.instance: r for r in rows if r.method == "exact"}
    checked = 0
    for r in rows:
        if r.method != "greedy" or not r.has_plan:
            continue
        # Rebuild the instance from the CSV alone and re-run the (deterministic) greedy.
        topology = random_topology(r.tasks, r.servers, r.seed, extra_links=r.extra_links)
        plan = solve_greedy(topology)
        assert plan.check(topology) == []
        assert plan.objective_ms == pytest.approx(r.objective_ms)
        e = exact.get(r.instance)
        if e is not None and e.status == "optimal":
            assert e.objective_ms is not None
            assert r.objective_ms is not None
            assert r.objective_ms >= e.objective_ms - 1e-6 * max(1.0, e.objective_ms)
        checked += 1
    assert checked >= 4


def test_report_without_matplotlib_is_an_error_with_a_hint(
    tiny_run: tuple[Path, list[RunRow]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _ = tiny_run
    for name in (CSV_NAME, META_NAME):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(BenchError, match="matplotlib") as info:
        write_report(tmp_path)
    assert info.value.hint is not None and "--report-only" in info.value.hint


def test_csv_columns_are_documented(tiny_run: tuple[Path, list[RunRow]]) -> None:
    out, _ = tiny_run
    with (out / CSV_NAME).open() as fh:
        header = next(csv.reader(fh))
    assert tuple(header) == CSV_FIELDS
    assert {"tasks", "servers", "trial", "seed", "method", "time_s", "status"} <= set(header)
