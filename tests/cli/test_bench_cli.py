"""`fogshift bench planner` through the real CLI: a `--quick` run with one trial and a 1 s
limit, checked against its configuration and against a recomputation from its CSV."""

from __future__ import annotations

import csv
import json
import statistics
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import fogshift, fogshift_in_process

TRIALS = 1
TIME_LIMIT_S = 1.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("bench") / "out"
    fogshift(
        "bench", "planner", "--out", str(out), "--quick",
        "--trials", str(TRIALS), "--time-limit", f"{TIME_LIMIT_S:g}",
    )  # fmt: skip
    yield out


def _csv(out: Path) -> list[dict[str, str]]:
    with (out / "runs.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_csv_has_exactly_the_configured_runs(run: Path) -> None:
    from fogshift.bench.planner import instance_seed, quick_config

    config = quick_config(trials=TRIALS, time_limit_s=TIME_LIMIT_S)
    rows = _csv(run)
    expected = [
        (s.name, t, n, k, m)
        for s in config.sweeps
        for t, n in s.points
        for k in range(TRIALS)
        for m in s.methods
    ]
    got = [
        (r["sweep"], int(r["tasks"]), int(r["servers"]), int(r["trial"]), r["method"]) for r in rows
    ]
    assert got == expected
    for r in rows:
        assert int(r["seed"]) == instance_seed(int(r["tasks"]), int(r["servers"]), int(r["trial"]))
        assert float(r["time_s"]) > 0
        if r["method"] == "exact":
            assert float(r["time_limit_s"]) == TIME_LIMIT_S
            assert r["status"] in ("optimal", "time_limit", "no_solution", "infeasible")
        else:
            assert r["time_limit_s"] == ""
            assert r["status"] in ("heuristic", "stuck", "infeasible")
        assert (r["objective_ms"] != "") == (r["status"] in ("optimal", "time_limit", "heuristic"))
    meta = json.loads((run / "run.json").read_text())
    assert meta["config"]["trials"] == TRIALS and meta["finished"] is not None
    assert meta["machine"]["cores"] >= 1


def test_one_valid_png_per_sweep(run: Path) -> None:
    for name in ("fig5_tasks", "fig6_servers", "greedy_scale"):
        data = (run / f"{name}.png").read_bytes()
        assert data[:8] == PNG_SIGNATURE
        assert data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 100 and height > 100
        assert data.endswith(b"IEND\xaeB`\x82")  # complete file


def _tables(text: str) -> dict[str, dict[tuple[int, int], dict[str, str]]]:
    """Per sweep (from the 'Sweep `name`' line), each table row keyed by (tasks, servers)."""
    tables: dict[str, dict[tuple[int, int], dict[str, str]]] = {}
    sweep = None
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("Sweep `"):
            sweep = line.split("`")[1]
            header = None
        elif line.startswith("|") and sweep is not None:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(cells[0]) <= {"-"}:
                row = dict(zip(header, cells, strict=True))
                tables.setdefault(sweep, {})[(int(row["tasks"]), int(row["servers"]))] = row
    return tables


def _number(cell: str) -> float | None:
    if cell == "-":
        return None
    if cell == "∞":
        return float("inf")
    return float(cell.removesuffix("%").strip())


def test_results_md_gaps_equal_a_recomputation_from_the_csv(run: Path) -> None:
    rows = _csv(run)
    text = (run / "results.md").read_text()
    assert f"**{TIME_LIMIT_S:g} s**" in text  # the time limit used
    assert "cores" in text and "HiGHS" in text and "Python" in text
    tables = _tables(text)
    points = {(r["sweep"], int(r["tasks"]), int(r["servers"])) for r in rows}
    assert {(s, t, n) for s, tab in tables.items() for t, n in tab} == points
    for sweep, tasks, servers in points:
        mine = [
            r
            for r in rows
            if (r["sweep"], int(r["tasks"]), int(r["servers"])) == (sweep, tasks, servers)
        ]
        cell = tables[sweep][(tasks, servers)]
        trials = sorted({r["trial"] for r in mine})
        assert cell["trials"] == str(len(trials))
        for method in ("exact", "greedy"):
            times = [float(r["time_s"]) for r in mine if r["method"] == method]
            if times and f"{method} mean" in cell:
                shown = cell[f"{method} mean"]
                value = float(shown.split()[0]) / (1000 if shown.endswith(" ms") else 1)
                assert value == pytest.approx(statistics.fmean(times), rel=0.01, abs=1e-5)
        if "gap basis" not in cell:
            continue
        gaps: list[float] = []
        optima: list[float] = []
        for k in trials:
            by = {r["method"]: r for r in mine if r["trial"] == k}
            e, g = by["exact"], by["greedy"]
            if e["status"] == "optimal" and g["objective_ms"] != "":
                gaps.append(float(g["objective_ms"]) - float(e["objective_ms"]))
                optima.append(float(e["objective_ms"]))
        matches = sum(1 for g, o in zip(gaps, optima, strict=True) if g <= 1e-6 * max(1, o))
        assert cell["gap basis"] == f"{len(gaps)}/{len(trials)}"
        assert cell["greedy = opt"] == f"{matches}/{len(gaps)}"
        if not gaps:
            assert cell["mean gap (s)"] == cell["max gap (s)"] == cell["rel. gap"] == "-"
            continue
        assert _number(cell["mean gap (s)"]) == pytest.approx(
            statistics.fmean(gaps) / 1000, abs=0.005
        )
        assert _number(cell["max gap (s)"]) == pytest.approx(max(gaps) / 1000, abs=0.005)
        rel = _number(cell["rel. gap"])
        if sum(optima) > 0:
            assert rel == pytest.approx(100 * sum(gaps) / sum(optima), abs=0.05)
        else:
            assert rel == (0.0 if sum(gaps) <= 1e-6 else float("inf"))


def test_every_greedy_plan_passes_the_feasibility_checker(run: Path) -> None:
    from fogshift.planner.greedy import solve_greedy
    from fogshift.planner.instances import random_topology

    checked = 0
    for r in _csv(run):
        if r["method"] != "greedy" or r["status"] != "heuristic":
            continue
        assert r["violations"] == "0"  # the bench's own re-check
        # And ours: rebuild the instance from the CSV, re-run the deterministic greedy.
        topology = random_topology(
            int(r["tasks"]), int(r["servers"]), int(r["seed"]), extra_links=float(r["extra_links"])
        )
        plan = solve_greedy(topology)
        assert plan.check(topology) == []
        assert plan.objective_ms == pytest.approx(float(r["objective_ms"]))
        checked += 1
    assert checked >= 5


def test_report_only_rerenders_the_same_results(run: Path) -> None:
    before = (run / "results.md").read_text()
    (run / "results.md").unlink()
    fogshift("bench", "planner", "--out", str(run), "--report-only")
    assert (run / "results.md").read_text() == before


def test_bad_options_are_refused_with_expected_and_received(tmp_path: Path) -> None:
    # In this process (the real entry point, its output captured): each refusal is an
    # interpreter start fewer (~3 s of CPU each with the bench's imports).
    run = fogshift_in_process
    result = run("bench", "planner", "--out", str(tmp_path), "--trials", "0", check=False)
    assert result.returncode == 2
    assert "trials" in result.stderr and "expected" in result.stderr
    result = run(
        "bench", "planner", "--out", str(tmp_path), "--report-only", "--quick", check=False
    )
    assert result.returncode == 2
    assert "--report-only" in result.stderr and "--quick" in result.stderr
    # The data plane's too; and a folder without a run is named, not a traceback.
    result = run("bench", "dataplane", "--out", str(tmp_path), "--report-only",
                 "--trigger-ms", "0", check=False)  # fmt: skip
    assert result.returncode == 2 and "--trigger-ms" in result.stderr, result.stderr
    result = run("bench", "dataplane", "--out", str(tmp_path), "--report-only",
                 "--runs", "3", check=False)  # fmt: skip
    assert result.returncode == 2 and "--runs" in result.stderr, result.stderr
    result = run("bench", "dataplane", "--out", str(tmp_path), "--runs", "0", check=False)
    assert result.returncode == 2 and "--runs" in result.stderr, result.stderr
    result = run("bench", "dataplane", "--out", str(tmp_path), "--report-only",
                 "--broker-sync", "2m", check=False)  # fmt: skip
    assert result.returncode == 2 and "--broker-sync" in result.stderr, result.stderr
    result = run("bench", "dataplane", "--out", str(tmp_path), "--broker-sync", "never",
                 check=False)  # fmt: skip
    assert result.returncode == 2 and "'never'" in result.stderr, result.stderr
    assert "always, or an interval" in " ".join(result.stderr.split()), result.stderr
    assert not (tmp_path / "dataplane.csv").exists()  # refused before measuring anything
    result = run("bench", "dataplane", "--out", str(tmp_path), "--report-only", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "no data-plane run to report" in result.stderr and "settings.json" in result.stderr
    # A method PAM's bench does not know is refused before any cluster starts.
    result = run("bench", "pam", "--out", str(tmp_path), "--methods", "whole,teleport",
                 check=False)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "bad --methods" in result.stderr and "whole,teleport" in result.stderr
    assert "literal" in result.stderr  # what was expected
    assert not (tmp_path / "pam").exists()
