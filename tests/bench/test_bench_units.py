"""The bench's pure parts: statistics, CSV logs, parsing, rendering and the command group."""

from __future__ import annotations

import builtins
import json
import math
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from fogshift.bench import commands, e1, e2, e3, pam, report, seamless, thesis
from fogshift.bench.base import (
    RunLog,
    fmt_mean_std,
    least_squares,
    read_rows,
    record_command,
    write_notes,
)
from fogshift.bench.cluster import ClusterOptions, _rtts, delay_of
from fogshift.bench.commands import register
from fogshift.bench.exceptions import BadBenchOption
from fogshift.bench.padded import PaddedTally, tally_problems
from fogshift.bench.seamless import _bins, _round_down
from fogshift.bench.workload import HEADER, InputFeeder
from fogshift.broker.keys import KeyState
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.chunks import CHUNKED_MIN_BYTES
from fogshift.common.text import one_line
from fogshift.exceptions import InvalidInput
from tests.checkpoint.test_central import manifest


def test_least_squares_recovers_a_line() -> None:
    xs = [1.0, 2.0, 3.0, 10.0]
    slope, intercept, r2 = least_squares(xs, [0.5 * x + 7 for x in xs]) or (0, 0, 0)
    assert math.isclose(slope, 0.5) and math.isclose(intercept, 7) and math.isclose(r2, 1)
    assert least_squares([1.0, 1.0], [2.0, 3.0]) is None  # no spread in x: no line
    assert least_squares([1.0], [2.0]) is None


def test_fmt_mean_std() -> None:
    assert fmt_mean_std([1000.0, 3000.0]) == "2,000 ± 1,414"
    assert fmt_mean_std([None, 12.34], 1, " %") == "12.3 %"
    assert fmt_mean_std([]) == "-"


def test_run_log_writes_rows_and_refuses_unknown_columns(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "runs.csv", ["run", "ok", "ms", "note"])
    log.append({"run": "a", "ok": True, "ms": 1.5, "note": None})
    with pytest.raises(ValueError, match="unknown columns"):
        log.append({"run": "b", "typo": 1})
    assert read_rows(tmp_path / "runs.csv") == [{"run": "a", "ok": "true", "ms": "1.5", "note": ""}]
    # A moment in epoch seconds keeps its milliseconds (six significant digits made it a
    # quarter hour); small values keep six significant digits.
    log.append({"run": "c", "ms": 1795775699.0982778})
    log.append({"run": "d", "ms": 0.1 + 0.2})
    assert [r["ms"] for r in read_rows(tmp_path / "runs.csv")[1:]] == ["1795775699.098", "0.3"]


def test_a_run_log_appended_to_keeps_its_rows_and_refuses_other_columns(tmp_path: Path) -> None:
    RunLog(tmp_path / "runs.csv", ["run", "ms"]).append({"run": "a", "ms": 1})
    log = RunLog(tmp_path / "runs.csv", ["run", "ms"], append=True)
    log.append({"run": "b", "ms": 2})
    assert log.kept == 1 and [r["run"] for r in read_rows(tmp_path / "runs.csv")] == ["a", "b"]
    with pytest.raises(BadBenchOption, match="columns differ"):
        RunLog(tmp_path / "runs.csv", ["run", "ms", "new"], append=True)
    assert RunLog(tmp_path / "fresh.csv", ["run"], append=True).kept == 0
    RunLog(tmp_path / "runs.csv", ["run", "ms"])  # without append: replaced
    assert read_rows(tmp_path / "runs.csv") == []


def test_link_profiles_and_rtt_parsing() -> None:
    assert delay_of("n100") == "n100"
    assert delay_of("10mbit,n500") == "n500"
    assert delay_of("10mbit") == "n0"
    with pytest.raises(BadBenchOption):
        delay_of(" , ")
    shown = [
        {"node": "cloud", "rtt": {"median_ms": 0.04}},
        {"node": "fog-n500", "rtt": {"median_ms": 1003.2}},
        {"node": "fog-x", "rtt": None, "rtt_error": "timed out"},
    ]
    assert _rtts(shown) == {"cloud": 0.04, "fog-n500": 1003.2}
    assert ClusterOptions(("cloud", "fog-a"), links=(("fog-a", "n100"),)).profile_of("fog-a") == (
        "n100"
    )


def test_e1_quick_plan_and_origin_names() -> None:
    quick = e1.E1Config.quick()
    assert quick.series("n0") == [(s, m) for s in (0, 1, 5) for m in ("precopy", "literal")]
    assert quick.series("n500") == [(1, "literal")]
    assert e1.origin_name("10mbit,n100") == "fog-10mbit-n100"


def test_e1_output_gap_target_is_one_rtt_one_steady_interval_and_50_ms() -> None:
    row = {"output_gap_ms": "300", "rtt_ms": "200", "steady_gap_ms": "60"}
    assert e1.gap_within_target(row) is True  # 300 <= 200 + 60 + 50
    assert e1.gap_within_target({**row, "output_gap_ms": "310.1"}) is False
    assert e1.gap_within_target({**row, "rtt_ms": ""}) is None  # not measured: unknown
    assert e1._within([row, {**row, "output_gap_ms": "999"}, {**row, "rtt_ms": ""}]) == "1 / 2"


def test_e1_prepare_table_tells_where_a_handover_s_prepare_went() -> None:
    def run(prepare: str, copy: str, shipped: str) -> dict[str, str]:
        return {"profile": "n500", "state_mib": "50", "mode": "handover", "status": "migrated",
                "consistent": "true", "prepare_ms": prepare, "prepare_copy_ms": copy,
                "prepare_warm_ms": "1500", "prepare_converge_ms": "1000",
                "shipped_bytes": shipped, "state_bytes": "53000000"}  # fmt: skip

    rows = [run("4300", "1800", "60000"), run("5500", "3000", "80000")]
    literal = {**rows[0], "mode": "literal"}
    table = e1._prepare_table([*rows, literal])
    lines = [line for line in table if line.startswith("| n500")]
    assert len(lines) == 1  # the literal run has no prepare
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[3:6] == ["2", "4.9 ± 0.8", "2.4 ± 0.8"]  # runs, prepare s, copy s
    assert cells[-3:] == ["70 ± 14", "53,000 ± 0", "1 / 2"]  # shipped KB, of KB, <= 5 s
    assert e1._prepare_table([{**r, "prepare_copy_ms": ""} for r in rows]) == []  # older runs


def test_input_feeder_writes_whole_rows(tmp_path: Path) -> None:
    feeder = InputFeeder(tmp_path / "in.csv", rate=0, seed=3)
    feeder.prefill(5)
    lines = (tmp_path / "in.csv").read_text().splitlines()
    assert lines[0] == HEADER and len(lines) == 6
    assert all(len(line.split(",")) == 3 for line in lines)


def test_seamless_helpers() -> None:
    assert _round_down(1837.4) == 1800 and _round_down(0.0) == 0.0 and _round_down(57.9) == 57
    # seq k is due at t0 + k / rate: seq 10 at 101 s, seq 20 at 102 s, seq 30 at 103 s.
    bins = _bins("r", [(101.5, 10), (101.9, 20), (103.7, 30)], t0=100.0, rate=10.0)
    assert [b["lines"] for b in bins] == [0, 2, 0, 1]
    assert bins[1]["lat_max_ms"] == pytest.approx(500.0)
    assert bins[1]["lat_mean_ms"] == pytest.approx(200.0)  # (500 - 100) / 2
    assert bins[3]["lat_p50_ms"] == pytest.approx(700.0)


def test_thesis_anchors_are_cited() -> None:
    assert thesis.E2_REPROCESS_MS_PER_EVENT.cite() == "0.608 ms/event (Fig. 22a p. 48)"
    assert thesis.E3_SERIALISATION_SHARE_PCT[5].cite() == "40.6% (§6.2.3 p. 49-50)"
    assert math.isclose(thesis.thesis_rate_per_s(), 10 / 3)


def test_report_of_a_hand_written_e2_log(tmp_path: Path) -> None:
    """The E2 table's regression comes from the CSV rows only."""
    log = RunLog(tmp_path / "e2" / "runs.csv", e2.RUN_FIELDS)
    for i, (events, ms) in enumerate(((10, 1010.0), (20, 1020.0), (40, 1040.0))):
        log.append(
            {"run": f"r{i}", "status": "restored", "consistent": True,
             "reprocessed_events": events, "reprocess_ms": ms, "intermediate_events": 0,
             "intermediate_ms": 0.0}
        )  # fmt: skip
    log.append({"run": "bad", "status": "restored", "consistent": False,
                "reprocessed_events": 30, "reprocess_ms": 99999.0})  # fmt: skip
    (tmp_path / "e2" / "notes.json").write_text(json.dumps({"settings": {}, "skipped": []}))
    text = report.render(tmp_path).read_text()
    assert "| reprocessed | 3 | 10-40 | 1.000 | 1,000 | 1.00 |" in text
    assert "`bad` failed" in text


def test_an_e3_run_without_central_checkpoints_renders_its_report(tmp_path: Path) -> None:
    """A run shorter than the pull interval has node-level snapshots only: its plot's
    log scale over no bytes at all raised, and the whole report was lost (the bench smoke,
    once: E3 ran 3 s, the pulls every 4 s)."""
    pytest.importorskip("matplotlib")
    runs = RunLog(tmp_path / "e3" / "runs.csv", e3.RUN_FIELDS)
    runs.append({"run": "e3-s0", "state_mib": 0, "status": "done", "events": 37,
                 "node_checkpoints": 2, "central_checkpoints": 0, "consistent": True})  # fmt: skip
    taken = RunLog(tmp_path / "e3" / "checkpoints.csv", e3.CHECKPOINT_FIELDS)
    for batch, first in ((0, True), (1, False)):
        taken.append({"run": "e3-s0", "state_mib": 0, "level": "node", "id": f"b{batch}",
                      "batch": batch, "first": first, "bytes": 7000, "new_bytes": 1500,
                      "took_ms": 2.0, "copy_ms": 1.5, "hash_ms": 0.4, "commit_ms": 1})  # fmt: skip
    settings = {"rate": 10.0 / 3, "duration_s": 3, "checkpoint_interval_s": 2,
                "central_interval_s": 4}  # fmt: skip
    (tmp_path / "e3" / "notes.json").write_text(json.dumps({"settings": settings, "skipped": []}))
    text = report.render(tmp_path).read_text()
    assert "## E3" in text
    assert (tmp_path / "e3" / "e3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_hand_written_seamless_run(tmp_path: Path) -> None:
    """The seamless section's figures come from its CSVs (per phase, from one-second bins),
    and its plot is drawn: the smoke no longer runs the experiment."""
    folder = tmp_path / seamless.NAME
    runs = RunLog(folder / "runs.csv", seamless.RUN_FIELDS)
    runs.append({"run": "seamless-calibration", "kind": "calibration", "rate": 0,
                 "events": 20000, "max_rate": 987.6, "consistent": True})  # fmt: skip
    runs.append(
        {"run": "seamless-run", "kind": "run", "rate": 200, "events": 2600, "consistent": True,
         "mig_start_s": 3, "mig_end_s": 5, "mig_status": "migrated",
         "mig_downtime_ms": 1234.4, "kill_s": 7, "restore_start_s": 7.5,
         "restore_end_s": 10, "restore_status": "restored", "restore_total_ms": 2500.0,
         "reprocessed_events": 150, "intermediate_events": 100}
    )  # fmt: skip
    timeline = RunLog(folder / "timeline.csv", seamless.TIMELINE_FIELDS)
    # (t_s, lines, mean, p99, max): no line in the two seconds after the kill.
    for t, lines, mean, p99, top in (
        (0, 200, 50, 90, 100), (1, 200, 50, 90, 100), (2, 200, 50, 90, 100),
        (3, 100, 300, 800, 900), (4, 300, 100, 400, 450),
        (5, 200, 60, 95, 110), (6, 200, 60, 95, 110),
        (7, 0, None, None, None), (8, 0, None, None, None), (9, 150, 2000, 2900, 3000),
        (10, 450, 1000, 1500, 1600), (11, 200, 80, 120, 130), (12, 200, 60, 95, 110),
    ):  # fmt: skip
        timeline.append({"run": "seamless-run", "t_s": t, "lines": lines, "lat_mean_ms": mean,
                         "lat_p50_ms": mean, "lat_p99_ms": p99, "lat_max_ms": top})  # fmt: skip
    text = report.render(tmp_path).read_text()
    assert "## Seamless" in text and "peak output **988 events/s** (consistent)" in text
    assert "(migrated, downtime 1,234 ms)" in text
    assert "(restored, 2,500 ms, 150 reprocessed, 100 intermediate events)" in text
    # Throughput is lines per second of the phase; latency the line-weighted mean of the
    # bins' means, the highest p99 and max.
    for row in (
        "| before | 3.0 | 200 | 50 | 90 | 100 |",
        "| live migration | 2.0 | 200 | 150 | 800 | 900 |",  # (100x300 + 300x100) / 400
        "| between | 2.0 | 200 | 60 | 95 | 110 |",
        "| node killed + restore | 3.0 | 50 | 2,000 | 2,900 | 3,000 |",
        "| after (catching up) | 3.0 | 283 | 562 | 1,500 | 1,600 |",  # 850 lines, 478,000 / 850
    ):
        assert row in text, row
    assert "![seamless](seamless/seamless.png)" in text
    assert (folder / "seamless.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_e2_sets_standby_promotion_beside_checkpoint_restore(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "e2" / "runs.csv", e2.RUN_FIELDS)
    for i, (method, live, total, state) in enumerate((
        ("checkpoint", 3000.0, 4000.0, 1000), ("standby", 100.0, 300.0, 0),
        ("checkpoint", 5000.0, 6000.0, 3000), ("standby", 300.0, 500.0, 0),
    )):  # fmt: skip
        log.append(
            {"run": f"r{i}", "method": method, "status": "restored", "consistent": True,
             "live_ms": live, "total_ms": total, "state_bytes": state,
             "reprocessed_events": 4, "reprocess_ms": 10.0}
        )  # fmt: skip
    log.append({"run": "lost", "method": "standby", "status": "failed", "consistent": False})
    (tmp_path / "e2" / "notes.json").write_text(json.dumps({"settings": {}, "skipped": []}))
    text = report.render(tmp_path).read_text()
    assert "| checkpoint | 2 / 2 | 4,000 ± 1,414 | 5,000 ± 1,414 | 4 ± 0 | 2,000 ± 1,414 |" in text
    assert "| standby | 2 / 3 | 200 ± 141 | 400 ± 141 | 4 ± 0 | 0 ± 0 |" in text


def test_e2_fits_each_restore_method_apart(tmp_path: Path) -> None:
    # A checkpoint restore starts a query (a fixed cost) and re-derives since its checkpoint;
    # a standby re-derives its few events live in its next batch (no time of their own).
    log = RunLog(tmp_path / "e2" / "runs.csv", e2.RUN_FIELDS)
    for i, events in enumerate((10, 20, 40)):
        log.append({"run": f"c{i}", "method": "checkpoint", "status": "restored",
                    "consistent": True, "reprocessed_events": events,
                    "reprocess_ms": 700.0 + events, "intermediate_events": events,
                    "intermediate_ms": 2.0 * events})  # fmt: skip
        log.append({"run": f"s{i}", "method": "standby", "status": "restored",
                    "consistent": True, "reprocessed_events": 2, "reprocess_ms": 0.0,
                    "intermediate_events": events, "intermediate_ms": 3.0 * events})  # fmt: skip
    (tmp_path / "e2" / "notes.json").write_text(json.dumps({"settings": {}, "skipped": []}))
    text = report.render(tmp_path).read_text()
    assert "| reprocessed, checkpoint | 3 | 10-40 | 1.000 | 700 | 1.00 |" in text
    assert "reprocessed, standby" not in text  # nothing of its own to fit
    assert "| intermediate, checkpoint | 3 | 10-40 | 2.000 | 0 | 1.00 |" in text
    assert "| intermediate, standby | 3 | 10-40 | 3.000 | 0 | 1.00 |" in text


def test_results_render_without_matplotlib_as_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """matplotlib is the `bench` extra: without it the tables come out, the plots are named."""
    log = RunLog(tmp_path / "e2" / "runs.csv", e2.RUN_FIELDS)
    log.append({"run": "r0", "status": "restored", "consistent": True,
                "reprocessed_events": 10, "reprocess_ms": 1010.0, "intermediate_events": 0,
                "intermediate_ms": 0.0})  # fmt: skip
    (tmp_path / "e2" / "notes.json").write_text(json.dumps({"settings": {}, "skipped": []}))
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib") or name == "fogshift.bench.plotting":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "fogshift.bench.plotting", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    text = report.render(tmp_path).read_text()
    assert "(no plots of e2: `pip install 'fogshift[bench]'`)" in text
    assert "## E2" in text and not (tmp_path / "e2" / "e2.png").exists()


def test_register_adds_the_commands() -> None:
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    listing = runner.invoke(app, ["--help"]).output
    for name in ("e1", "e2", "e3", "seamless", "pam", "all", "report"):
        assert name in listing
    assert "--link-profile" in runner.invoke(app, ["e1", "--help"]).output
    bad = runner.invoke(app, ["e1", "--out", "x", "--sizes", "a,b"])
    assert isinstance(bad.exception, BadBenchOption)
    for wait in ("10,2", "a,b", "5", "-1,3"):
        bad = runner.invoke(app, ["e1", "--out", "x", "--wait", wait])
        assert isinstance(bad.exception, BadBenchOption), wait
    for option, value, received in (("--rate", "0", "0.0"), ("--rate", "inf", "inf"),
                                     ("--traffics", "zipf,poisson", "zipf,poisson"),
                                     ("--traffics", ",", ","),
                                     ("--link", " , ", "' , '")):  # fmt: skip
        bad = runner.invoke(app, ["pam", "--out", "x", option, value])
        assert isinstance(bad.exception, BadBenchOption), (option, value)
        assert bad.exception.received == received, bad.exception


def test_one_line() -> None:
    assert one_line("a\nb   c") == "a b c"
    assert len(one_line("x" * 500, 50)) == 50


def test_a_command_that_reruns_an_experiment_supersedes_the_earlier_one(tmp_path: Path) -> None:
    start = {"measured_at": "2026-01-01 00:00:00 UTC", "load_average_at_start": [0.5, 0.4, 0.3]}
    record_command(tmp_path, "fogshift bench e1", ("e1",), start, 60.0, True)
    record_command(tmp_path, "fogshift bench e2", ("e2",), start, 120.0, False)
    record_command(tmp_path, "fogshift bench all", ("e1", "e2", "e3"), start, 600.0, True)
    commands = json.loads((tmp_path / "machine.json").read_text())["commands"]
    # e1's and e2's CSVs were overwritten by `all`: only it produced the folder now.
    assert [c["command"] for c in commands] == ["fogshift bench all"]
    record_command(tmp_path, "fogshift bench e3", ("e3",), start, 30.0, True)
    commands = json.loads((tmp_path / "machine.json").read_text())["commands"]
    assert [c["command"] for c in commands] == ["fogshift bench all", "fogshift bench e3"]
    assert commands[1]["load_average_at_start"] == [0.5, 0.4, 0.3]
    lines = report._commands(tmp_path)
    assert "- `fogshift bench e3`: 0.5 min, started 2026-01-01 00:00:00 UTC" in lines[-2]
    # A command that appended to the CSVs leaves the earlier ones their runs.
    record_command(tmp_path, "fogshift bench e3 --append", ("e3",), start, 30.0, True, True)
    commands = json.loads((tmp_path / "machine.json").read_text())["commands"]
    assert [c["command"] for c in commands][1:] == [
        "fogshift bench e3",
        "fogshift bench e3 --append",
    ]


def test_the_committed_handover_run_renders_with_a_colour_per_mode(tmp_path: Path) -> None:
    # E1 with --modes precopy,handover: its plots once had no colour for handover.
    folder = tmp_path / "e1h"
    shutil.copytree(Path(__file__).parents[2] / "docs" / "results" / "e1-handover", folder)
    for png in folder.glob("e1/*.png"):
        png.unlink()
    text = report.render(folder).read_text()
    assert "| n0 | 0.2 | 5 MiB | handover | 2 / 2 |" in text
    assert (folder / "e1" / "e1_cpu.png").read_bytes()[:4] == b"\x89PNG"


def test_an_e1_run_whose_migrations_all_failed_renders_its_report(tmp_path: Path) -> None:
    # Nothing above 0 on a log axis (no migration to draw, a size the thesis has no anchor
    # for): matplotlib warned and drew an empty log axis (E3's plot, with no point at all,
    # raised at its save, and the whole report was lost). Now a linear axis says why.
    pytest.importorskip("matplotlib")
    import csv
    import warnings

    folder = tmp_path / "e1f"
    shutil.copytree(Path(__file__).parents[2] / "docs" / "results" / "e1-handover", folder)
    runs = folder / "e1" / "runs.csv"
    with open(runs, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows
    for row in rows:
        row.update(status="failed", consistent="false", state_mib="2", downtime_ms="")
    with open(runs, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for png in folder.glob("e1/*.png"):
        png.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ("Data has no positive values ... log-scaled")
        report.render(folder)
    assert (folder / "e1" / "e1.png").read_bytes()[:4] == b"\x89PNG"


def test_pam_table_comes_from_the_csv_and_names_failed_runs(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "pam" / "runs.csv", pam.RUN_FIELDS)
    for method, stall in (("whole", 900.0), ("literal", 2000.0), ("backlog", 40.0),
                          ("backlog", 60.0), ("precopy", 20.0), ("group", 100.0)):  # fmt: skip
        log.append(
            {"run": f"r-{method}-{stall}", "method": method, "traffic": "zipf", "keys": 20,
             "state_kib": 64, "rate": 1500.0, "consistent": True,
             "stoppage_p50_ms": stall / 2,
             "stoppage_max_ms": stall, "stable_ms": stall * 10, "steady_p99_ms": 300,
             "added_p99_ms": stall, "tput_before": 100, "tput_during": 95, "tput_after": 100,
             "tput_op": 97, "op_ms": 1000}
        )  # fmt: skip
    broken = {"run": "broken", "method": "fifo", "traffic": "zipf", "keys": 20, "state_kib": 64,
              "rate": 1500.0}  # fmt: skip
    log.append({**broken, "consistent": False, "problems": "key s3: 1 seq missing"})
    text = pam.section(tmp_path / "pam") or ""
    assert "behind a link" not in text
    write_notes(tmp_path / "pam", {"link": "10mbit,n0"})
    text = pam.section(tmp_path / "pam") or ""
    assert "fog-a and fog-b each behind a link of 10mbit,n0" in text
    rows = [line for line in text.splitlines() if line.startswith("| 20 |")]
    # One row per method, in the order whole, literal, fifo, backlog, precopy, group; means
    # over the good runs only.
    assert [r.split("|")[5].strip() for r in rows[:6]] == [
        "whole", "literal", "fifo", "backlog", "precopy", "group"
    ]  # fmt: skip
    assert "| 2/2 | 25 / 50 | - / - | 500 (2/2) |" in rows[3] and "| 97 | 1,000 |" in rows[3]
    # Runs disturbed at all: a stable time above 0 (none recorded: not disturbed).
    assert pam._disturbed([{"stable_ms": "0"}, {"stable_ms": "12.5"}, {"stable_ms": ""}]) == 1
    assert "| 0/1 |" in rows[2]
    assert "broken (key s3: 1 seq missing)" in text
    # Key moves' stable time against moving the whole partition: 500 ms (backlog), 200 ms
    # (precopy) and 1,000 ms (group) vs 20,000 ms (literal) and 9,000 ms (whole).
    assert rows[6] == (
        "| 20 | 64 | zipf | 1,500 | 20,000 / 9,000 / 500 / 200 / 1,000 | 98 % / 99 % / 95 % "
        "| 94 % / 98 % / 89 % |"
    ), rows[6]


def _point(t_in: float, ms: float, key: str = "k") -> pam.Point:
    return pam.Point(t_in, t_in + ms / 1000, key)


def test_pam_figures_are_per_event_not_per_time_bin() -> None:
    moved, done = 100.0, 100.4
    # The steady window (the 5 s before the move): 100 ms, now and then 120 ms.
    points = [_point(95 + i * 0.05, 120 if i % 10 == 0 else 100, f"s{i % 4}") for i in range(100)]
    steady_p99 = 120.0
    points += [
        # Input before the move, held up by it (a pause at the next batch): disturbed, and
        # not steady (three of them would have been the steady window's p99).
        *(_point(t, 400, "s1") for t in (99.85, 99.9, 99.95)),
        _point(100.1, 900, "s0"),  # a moved key's first event waits for its state
        _point(100.2, 100, "s1"),  # a key that stays: undisturbed
        _point(100.7, 600, "s0"),  # input after the operation: not the key's stoppage
        *(_point(101.0 + i * 0.05, 100, f"s{i % 4}") for i in range(100)),
    ]
    got = pam.figures(points, moved, done, {"s0", "s2"}, steady_s=5, min_window_s=1.0)
    assert got["steady_p50_ms"] == 100 and got["steady_p99_ms"] == steady_p99
    # Stable when the last event above 1.5 x 120 ms (its output at 101.3) came out.
    assert got["stable_ms"] == pytest.approx(1300, abs=0.1)
    # Per moved key, its events output from the move on and input before the operation
    # ended, less the steady p50: s0 800 ms (its later 600 ms event does not count), s2 0
    # (one steady event output at the move).
    assert (got["stoppage_p50_ms"], got["stoppage_max_ms"]) == (400, 800)
    assert got["added_p99_ms"] > 400  # the 900 ms event is within the window until stable
    # Throughput: 100 outputs in the 5 s before; none lost after.
    assert got["tput_before"] == pytest.approx(20, abs=0.5)
    assert got["late_disturbed"] == 0
    # A slow batch seconds after the disturbance (its events over the limit, apart from the
    # run that reaches back to the operation) is counted, not taken for the operation's.
    later = [_point(106.0, 400, f"s{k}") for k in range(4)]
    with_late = pam.figures(points + later, moved, done, {"s0", "s2"}, steady_s=5,
                            min_window_s=1.0)  # fmt: skip
    assert with_late["stable_ms"] == got["stable_ms"] and with_late["late_disturbed"] == 4
    # ... but one within two triggers of the one before belongs to it.
    near = [_point(101.8, 400, "s3")]
    joined = pam.figures(points + near, moved, done, {"s0"}, steady_s=5, min_window_s=1.0)
    assert joined["stable_ms"] == pytest.approx(2200, abs=0.1) and joined["late_disturbed"] == 0
    undisturbed = [p for p in points if p.ms < 300]
    calm = pam.figures(undisturbed, moved, done, {"s0"}, steady_s=5, min_window_s=1.0)
    assert calm["stable_ms"] == 0
    # The "during" window is never shorter than two triggers (here 1 s, not 0 s).
    assert calm["tput_during"] == sum(100 <= p.t_out < 101 for p in undisturbed) > 0
    # Over the operation: from the move until it answered or, if later, stable.
    assert got["tput_op"] == pytest.approx(sum(100 <= p.t_out < 101.3 for p in points) / 1.3,
                                           abs=0.1)  # fmt: skip
    # ... at least two triggers (as "during"), and the whole of a longer operation.
    assert calm["tput_op"] == calm["tput_during"]
    long = pam.figures(undisturbed, moved, 103.0, {"s0"}, steady_s=5, min_window_s=1.0)
    assert long["tput_op"] == pytest.approx(
        sum(100 <= p.t_out < 103 for p in undisturbed) / 3, abs=0.1
    ) and long["tput_during"] == calm["tput_during"]  # fmt: skip
    assert pam.figures(points[:9], moved, done, set(), steady_s=5, min_window_s=1.0) == {}


def test_pam_legs_split_a_moved_keys_way_at_its_state() -> None:
    def state(key: str, move: str, copy: bool = False) -> KeyState:
        return KeyState(0, move, "aggregate", key, 1, {}, copy=copy)

    moves = {"m1": 100.0, "m2": 101.0}
    states = [
        (99.0, state("s0", "c1", copy=True)),  # a copy ahead: not the move's state
        (100.6, state("s0", "m1")),
        (101.2, state("s0", "m1")),  # sent again (a retried batch): the first counts
        (101.9, state("s1", "m2")),
        (102.0, state("s9", "m2")),  # a key the run did not move
    ]
    points = [
        _point(99.5, 1000, "s0"),  # the origin's last output of s0, stored before its state
        _point(100.2, 1200, "s0"),  # held on the target: out 1.4 s after its state was
        _point(101.5, 800, "s1"),  # out at 102.3: 0.4 s after s1's state
        _point(101.9, 500, "s1"),
        _point(102.0, 100, "s0"),  # input after its state: not held, not the target's leg
    ]
    got = pam.legs(moves, states, points, {"s0", "s1", "s2"})
    # Origin: 600 and 900 ms from the moves' records to the states; target: 800 and 400 ms.
    assert got == {"origin_leg_ms": 750.0, "target_leg_ms": 600.0}
    assert pam.legs({}, [], points, {"s0"}) == {"origin_leg_ms": None, "target_leg_ms": None}


def test_pam_traffic_is_uniform_or_skewed_as_asked(tmp_path: Path) -> None:
    counts = {}
    for traffic in ("uniform", "zipf"):
        feeder = pam.KeyedFeeder(tmp_path / f"{traffic}.csv", 2000, 20, traffic, 1.1, seed=3)
        feeder.prefill(2001)
        lines = (tmp_path / f"{traffic}.csv").read_text().splitlines()
        assert lines[0] == HEADER and len(lines) > 2000
        sensors = [line.split(",")[1] for line in lines[1:]]
        counts[traffic] = max(sensors.count(f"s{k}") for k in range(20)) / len(sensors)
    assert counts["uniform"] < 0.1 < 0.25 < counts["zipf"]


def test_pam_with_two_inputs_is_a_valid_spec_of_a_tally_behind_two_sources(
    tmp_path: Path,
) -> None:
    from fogshift.spec.loader import load_spec

    for path in (*pam.input_files(2).values(), *pam.input_files(1).values()):
        (tmp_path / path).write_text(HEADER + "\n")  # (the feeders write them first)
    spec = load_spec(pam.write_spec(tmp_path, "duo", 100.0, 2048, inputs=2),
                     nodes=[pam.EDGE, pam.FIRST, pam.SECOND])  # fmt: skip
    sources = {e.id: e for e in spec.elements if e.kind == "csv-source"}
    assert {n: Path(e.options["path"]) for n, e in sources.items()} == {
        n: tmp_path / path for n, path in pam.input_files(2).items()
    }
    assert all(e.options["rate"] == 50.0 for e in sources.values())  # half each
    parts = spec.partitions_of("aggregate")
    assert [p.node for p in parts] == [pam.FIRST, pam.SECOND]
    assert all(p.inputs == ("a", "b") and p.key_by == "sensor" for p in parts)
    one = load_spec(pam.write_spec(tmp_path, "one", 100.0, 0), nodes=[pam.EDGE, pam.FIRST,
                                                                      pam.SECOND])  # fmt: skip
    assert [e.id for e in one.elements if e.kind == "csv-source"] == ["source"]
    with pytest.raises(BadBenchOption, match="one or two inputs"):
        pam.PamConfig(inputs=3)
    app = typer.Typer()
    register(app)
    refused = CliRunner().invoke(app, ["pam", "--out", "x", "--inputs", "3"])
    # (Refused as every option out of its range: what was expected, received, a hint; the
    # `fogshift` command exits 2 for it.)
    assert isinstance(refused.exception, InvalidInput), refused.output
    assert refused.exception.expected == "a number from 1 to 2" and refused.exception.hint


def test_a_tally_numbers_each_keys_events_and_carries_its_padding() -> None:
    from fogshift.events import Event

    tally = PaddedTally.build({"pad_bytes": 300}, "t-p0", None)
    assert len(tally.padding) == 300
    outs = [tally.process(Event(seq, 0.0, src, {"sensor": "s1"})) for src, seq in
            (("a", 4), ("b", 2), ("a", 9))]  # fmt: skip
    assert [(o["n"], o["src"], o["src_seq"]) for o in outs] == [(1, "a", 4), (2, "b", 2),
                                                                  (3, "a", 9)]  # fmt: skip
    again = PaddedTally.build({"pad_bytes": 300}, "t-p1", tally.snapshot())
    assert again.process(Event(10, 0.0, "a", {"sensor": "s1"}))["n"] == 4
    assert again.padding == tally.padding  # the same noise: a key's state moves whole


def test_tally_problems_find_every_way_a_key_can_go_wrong() -> None:
    inputs = {"a": [(1, "s0"), (2, "s1"), (3, "s0")], "b": [(1, "s0"), (2, "s1")]}

    def out(key: str, n: int, src: str, seq: int) -> dict[str, Any]:
        return {"sensor": key, "n": n, "src": src, "src_seq": seq}

    good = [out("s0", 1, "a", 1), out("s0", 2, "b", 1), out("s0", 3, "a", 3),
            out("s1", 1, "b", 2), out("s1", 2, "a", 2)]  # fmt: skip
    assert tally_problems(inputs, good) == []
    assert tally_problems(inputs, list(reversed(good))) == []  # partitions interleave
    # A state lost at a move: the key's numbers start again.
    restarted = [*good[:2], out("s0", 1, "a", 3), *good[3:]]
    assert "numbered" in " ".join(tally_problems(inputs, restarted))
    # An event lost, or one output twice (renumbered by a state that took it twice).
    lost = [o for o in good if o != good[2]]
    assert "1 events missing" in " ".join(tally_problems(inputs, lost))
    twice = [*good, out("s0", 4, "a", 3)]
    assert "repeated" in " ".join(tally_problems(inputs, twice))
    # One input's events of a key processed out of that input's order.
    swapped = [out("s0", 1, "a", 3), out("s0", 2, "b", 1), out("s0", 3, "a", 1), *good[3:]]
    assert "out of their order" in " ".join(tally_problems(inputs, swapped))
    # A key never output.
    assert "differ from input" in " ".join(tally_problems(inputs, good[:3]))


def test_e1_takes_a_wait_range() -> None:
    config = commands._e1_overrides(e1.E1Config(), None, None, None, None, "30,40")
    assert config.wait_s == (30.0, 40.0)


def test_pam_runs_are_appended_only_to_runs_measured_with_the_same_settings(
    tmp_path: Path,
) -> None:
    write_notes(tmp_path / pam.NAME, {**asdict(pam.PamConfig(link="10mbit,n0")), "x": 1})
    other = pam.PamConfig(link="n100", methods=("whole",))
    with pytest.raises(BadBenchOption, match="other settings") as refused:
        pam.run(other, None, tmp_path, None, append=True)  # type: ignore[arg-type]
    assert "link=10mbit,n0" in str(refused.value.expected)
    assert "link=n100" in str(refused.value.received)


def test_pam_moves_once_a_large_state_is_in_rocksdbs_ssts_centrally() -> None:
    big, small = {"size": 6_000_000}, {"size": 900}
    changelogs = {"files": {"state/0/0/1.changelog": big, "state/0/1/1.changelog": small,
                            "offsets/1": small}}  # fmt: skip
    assert not pam._state_in_ssts(changelogs) and not pam._state_in_ssts(None)
    snapshot = {"files": {"state/0/0/9.zip": small, "state/0/0/SSTs/000008-x.sst": big,
                          "state/0/0/10.changelog": small,
                          "state/0/1/1.changelog": small}}  # fmt: skip
    assert pam._state_in_ssts(snapshot)  # the small partition needs no snapshot


def test_pam_moves_once_the_backup_node_holds_a_replica_in_ssts(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "central")
    for batch, rel in ((1, "state/0/0/1.changelog"), (9, "state/0/0/SSTs/000008.sst")):
        files = {rel: b"s" * CHUNKED_MIN_BYTES, f"state/0/0/{batch}.zip": b"z"}
        if batch == 1:
            del files["state/0/0/1.zip"]
        store.put({**manifest(batch, files), "pipeline": "r", "element": "agg-p0"},
                  files.__getitem__)  # fmt: skip
    nodes = [{"name": "fog-b", "replicas": ["r/agg-p0@b000000000001", "r/agg-p1@b000000000009"]}]
    assert not pam._backup_in_ssts(store, nodes, "r/agg-p0", "fog-b")  # its changelog only
    nodes[0]["replicas"].append("r/agg-p0@b000000000009")
    assert pam._backup_in_ssts(store, nodes, "r/agg-p0", "fog-b")
    assert not pam._backup_in_ssts(store, nodes, "r/agg-p0", "fog-c")  # holds nothing
    assert pam._backup_in_ssts(store, [], "r/agg-p0", None)  # no backup planned


def test_percentiles_are_nearest_rank_and_a_rate_counts_each_event_once() -> None:
    # ecg's median of 1..5 was 2 (round), dataplane's p99 of 200 values the 199th (int), and
    # a rate was "sustained" when duplicates made up for lost events.
    from fogshift.bench import dataplane, ecg

    assert ecg._pct([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert ecg._pct([float(v) for v in range(1, 151)], 0.99) == 149.0
    assert dataplane._quantile([float(v) for v in range(1, 201)], 0.99) == 198.0
    fast = [0.01] * 10
    assert dataplane._latency_row(fast, 10, True, list(range(2, 12)))["sustained"]
    twice = [*range(2, 7), *range(2, 7)]  # five lost, five answered twice
    assert not dataplane._latency_row(fast, 10, True, twice)["sustained"]


def test_a_run_without_a_figure_is_left_out_of_its_mean_not_counted_as_zero() -> None:
    assert e1._kilo([4000.0, None]) == [4.0, None]
    assert fmt_mean_std(e1._kilo([4000.0, None]), 1) == "4.0"


def test_the_ecg_bench_flags_a_patient_the_reference_does_not_know() -> None:
    import numpy as np

    from fogshift.bench import ecg

    reference = {"p01": np.asarray([1.0, 2.0])}
    mine = [{"body": {"patient": "p01", "samples": [1.0, 2.0]}}]
    assert ecg._compare(mine, reference) == []
    stranger = [*mine, {"body": {"patient": "p99", "samples": [5.0]}}]
    assert ecg._compare(stranger, reference) == ["patients ['p01', 'p99'], expected ['p01']"]


def test_e1_total_counts_every_phase_a_handover_ran() -> None:
    from fogshift.bench.e1 import phases_total

    handover = {"phases_ms": {"prepare": 1000.0, "follow": 400.0, "fence": 200.0,
                              "invoke": 10.0, "finalize": 50.0}}  # fmt: skip
    assert phases_total(handover) == 1660.0
    assert phases_total({"phases_ms": {}}) is None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["report"], "nothing to render"),
        (["soak", "--report-only"], "nothing to render"),
        (["soak", "--report-only", "--migrations", "5", "--rate", "2"], "--migrations, --rate"),
        (["e1", "--runs", "0"], "--runs"),
        (["e3", "--duration", "inf"], "--duration"),
        (["seamless", "--rate", "nan"], "--rate"),
        (["pam", "--keys", "0,10"], "bad numbers of keys"),
        (["soak", "--trigger-ms", "-5"], "--trigger-ms"),
        (["soak", "--rate", "nan"], "--rate"),
    ],
)
def test_bench_options_that_cannot_work_are_refused_before_anything_runs(
    tmp_path: Path, args: list[str], said: str
) -> None:
    # A missing --out gave `report` a traceback and an empty one a results.md of nothing;
    # `soak --report-only` ignored a run's options; runs of 0, a NaN rate or an infinite
    # duration were taken, to fail (or never end) once clusters had started.
    from fogshift.cli import main as cli

    out = tmp_path / "out"
    if args[0] == "soak" and "--report-only" in args and len(args) > 2:
        out.mkdir()
    result = CliRunner().invoke(cli.app, ["bench", *args[:1], "--out", str(out), *args[1:]])
    text = result.output + str(result.exception or "")
    assert said in " ".join(text.split()), text
    assert result.exit_code == 2 or getattr(result.exception, "code", None) in (
        "bad_bench_option",
        "invalid",  # (an option out of its range: `fogshift` exits 2 for it)
    )
    assert not any(out.glob("*/runs.csv")) and not (out / "results.md").exists()


def test_dataplane_runs_alternate_the_cases_and_report_medians_and_ranges(tmp_path: Path) -> None:
    import csv
    import statistics

    from fogshift.bench import dataplane

    settings = dataplane.Settings(runs=3, cases=("map", "window-aggregate-jvm"))
    # Each run in the other order than the one before; a JVM case beside no floor of its own.
    assert dataplane.rounds(settings) == [
        (1, "map", "fogshift"), (1, "map", "plain"), (1, "window-aggregate-jvm", "fogshift"),
        (2, "window-aggregate-jvm", "fogshift"), (2, "map", "fogshift"), (2, "map", "plain"),
        (3, "map", "fogshift"), (3, "map", "plain"), (3, "window-aggregate-jvm", "fogshift"),
    ]  # fmt: skip
    with pytest.raises(BadBenchOption, match="--runs of at least 1"):
        dataplane.Settings(runs=0)
    # Three runs of `map` written by hand: fogshift's p50 250, 310, 190 ms, the floor's 200,
    # 220, 180; fogshift sustained 5,000, 2,500 and 7,500 events/s, the floor 2,500 each time
    # (a rate not sustained is no figure); only run 2 reprocessed fogshift's backlog.
    log = dataplane.RunLog(tmp_path / "dataplane.csv", dataplane.FIELDS)
    p50s = {"fogshift": [250.0, 310.0, 190.0], "plain": [200.0, 220.0, 180.0]}
    sustained = {"fogshift": [5000, 2500, 7500], "plain": [2500, 2500, 2500]}
    for number in (1, 2, 3):
        for system in dataplane.SYSTEMS:
            base = {"run": number, "system": system, "case": "map", "trigger_ms": 200}
            p50 = p50s[system][number - 1]
            log.append({**base, "measure": "steady", "rate": 100, "p50_ms": p50,
                        "p99_ms": 2 * p50, "batch_ms": p50 / 2})  # fmt: skip
            top = sustained[system][number - 1]
            for rate in (2500, 5000, 7500, 10000):
                log.append({**base, "measure": "sweep", "rate": rate,
                            "sustained": "true" if rate <= top else "false"})  # fmt: skip
                if rate > top:
                    break
            if system == "plain" or number == 2:
                log.append({**base, "measure": "reprocess", "events_per_s": 1000 * number})
    (tmp_path / "settings.json").write_text(json.dumps(asdict(settings)))
    rows = read_rows(tmp_path / "dataplane.csv")
    mine = dataplane.summary(rows, "fogshift", "map")
    assert mine["p50_ms"] == statistics.median(p50s["fogshift"]) == 250.0
    assert mine["sustained_per_s"] == 5000.0
    assert mine["reprocess_per_s"] == 2000.0  # the one run that has it, not a median with 0s
    assert [r["p50_ms"] for r in dataplane.summaries(rows, "plain", "map")] == p50s["plain"]
    text = (dataplane.render(tmp_path)).read_text()
    assert "Medians of 3 runs (fogshift) and 3 (plain)" in text
    assert "| per-hop p50 (ms) | 250 (190 to 310) | 200 (180 to 220) | 1.25x |" in text
    assert (
        "| sustained at p99 ≤ 1 s (events/s) | 5,000 (2,500 to 7,500) | 2,500 (2,500 to "
        "2,500) | 2.00x |" in text
    )
    # A CSV from before runs were numbered reads as one run, with the medians' plain cells.
    with open(tmp_path / "dataplane.csv", newline="") as handle:
        old = [{k: v for k, v in row.items() if k != "run"} for row in csv.DictReader(handle)
               if row["run"] == "1"]  # fmt: skip
    with open(tmp_path / "dataplane.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[f for f in dataplane.FIELDS if f != "run"])
        writer.writeheader()
        writer.writerows(old)
    text = dataplane.render(tmp_path).read_text()
    assert "Medians of" not in text
    assert "| per-hop p50 (ms) | 250 | 200 | 1.25x |" in text


@pytest.mark.parametrize("stop", ["interrupt", "sigterm"])
def test_a_bench_stopped_renders_what_it_measured_and_exits_as_a_shell_says(
    tmp_path: Path, stop: str
) -> None:
    # ^C exits 130 and SIGTERM (`timeout`) 143, as the README's exit codes say: the first
    # left click's "Aborted!" and exit 1, the second (outside a cluster session) its
    # broker running. Either way the session's clean-up runs: what was measured rendered.
    import os
    import signal

    rendered: list[Path] = []

    def body(clusters: Any, reporter: Any) -> None:
        if stop == "interrupt":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)

    def render(out: Path) -> Path:
        rendered.append(out)
        return out / "results.md"

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises((typer.Exit, SystemExit)) as ended:
        commands._session(tmp_path / "out", tmp_path / "work", ("e1",), body, render)
    code = getattr(ended.value, "exit_code", None) or getattr(ended.value, "code", None)
    assert code == (130 if stop == "interrupt" else 143)
    assert rendered == [tmp_path / "out"]
    assert signal.getsignal(signal.SIGTERM) == before
    machine = json.loads((tmp_path / "out" / "machine.json").read_text())
    assert machine["commands"][-1]["completed"] is False


def test_phases_1_to_3_are_the_three_phases_or_none() -> None:
    # A handover has no pause or state phase: its invoke alone stood as "phases 1-3" beside
    # the thesis's pause + state + invoke (7 ms against 308 ms).
    handover = {"pause_ms": "", "state_ms": "", "invoke_ms": "7.5", "phases123_ms": "7.5"}
    assert e1.phases123(handover) is None
    precopy = {"pause_ms": "43.8", "state_ms": "0.6", "invoke_ms": "312.3"}
    assert e1.phases123(precopy) == pytest.approx(356.7)
