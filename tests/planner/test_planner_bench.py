"""The random instance generator and the benchmark runner (tiny sizes)."""

from __future__ import annotations

import builtins
import csv
import logging
from pathlib import Path
from typing import Any

import pytest

from fogshift.planner.bench import BenchRow, main, random_topology, run_bench


def test_random_topology_is_reproducible_and_valid() -> None:
    a = random_topology(30, 10, seed=7)
    b = random_topology(30, 10, seed=7)
    assert a == b
    assert a != random_topology(30, 10, seed=8)
    assert len(a.tasks) == 30 and len(a.servers) == 10
    net = a.network()
    # Connected: a route joins every pair of servers.
    assert all(net.route(0, k) is not None for k in range(10))
    assert all(f >= -1e-9 for f in net.free_cpu)


def test_random_topology_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="n_servers"):
        random_topology(1, 0, seed=0)
    with pytest.raises(ValueError, match="do not fit"):
        random_topology(200, 2, seed=0)


def test_run_bench_writes_csv_and_png(tmp_path: Path) -> None:
    seen: list[BenchRow] = []
    rows = run_bench(tmp_path / "out", [3, 5], [4], trials=2, time_limit_s=10, progress=seen.append)
    assert rows == seen
    assert len(rows) == 2 * 2 * 2  # methods x task counts x trials
    with (tmp_path / "out" / "bench.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    assert len(lines) == len(rows)
    assert set(lines[0]) == {
        "method",
        "tasks",
        "servers",
        "trial",
        "seed",
        "status",
        "time_ms",
        "objective_ms",
        "gap_ms",
        "gap_rel",
    }
    for row in rows:
        assert row.time_ms > 0
        if row.status in ("optimal", "heuristic", "time_limit"):
            assert row.objective_ms is not None
        exact = next(
            r for r in rows if r.method == "exact" and (r.tasks, r.trial) == (row.tasks, row.trial)
        )
        if exact.status == "optimal" and row.objective_ms is not None:
            assert row.gap_ms is not None and row.gap_ms >= -1e-6
    assert (tmp_path / "out" / "bench.png").stat().st_size > 0


def test_run_bench_skips_png_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with caplog.at_level(logging.WARNING, logger="fogshift.planner.bench"):
        rows = run_bench(tmp_path, [2], [3], trials=1, time_limit_s=5)
    assert len(rows) == 2
    assert (tmp_path / "bench.csv").exists()
    assert not (tmp_path / "bench.png").exists()
    assert "matplotlib is not installed" in caplog.text


def test_cli_prints_one_line_per_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--out",
            str(tmp_path),
            "--tasks",
            "2,3",
            "--servers",
            "3",
            "--trials",
            "1",
            "--time-limit",
            "5",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 4
    assert out[0].startswith("exact ")


def test_run_bench_plots_against_servers_when_only_they_vary(tmp_path: Path) -> None:
    rows = run_bench(tmp_path, [2], [3, 4], trials=1, time_limit_s=5)
    assert {r.servers for r in rows} == {3, 4}
    assert (tmp_path / "bench.png").stat().st_size > 0
