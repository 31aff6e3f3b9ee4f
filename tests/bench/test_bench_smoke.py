"""The bench experiments, end to end, in a tiny real configuration on one shared cluster.

One cluster (cloud, fog-a, fog-b, fog-c; loopback) serves four experiments in the order they
can share it: E1 migrates fog-a -> cloud, E3 checkpoints on fog-a, ecg moves Case 2's
processing fog-a -> fog-b, E2 kills fog-a and restores on fog-b (its first two live fog
nodes). The seamless experiment (a migration, a kill and a restore at load: one more node
to start again, ~1 min here) is left out: its results (section and plot) are rendered from
hand-written CSVs in test_bench_units.py; its run is the same migrate and restore calls as
E1's and E2's.
"""

from __future__ import annotations

import csv
import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fogshift.bench import e1, e2, e3, ecg, report
from fogshift.bench.base import Reporter, fmt_mean_std, write_machine
from fogshift.bench.cluster import BenchCluster, ClusterOptions, Clusters
from fogshift.ecg.simulate import patients
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions
from fogshift.verify.case2 import read_alarms, reference_alarms
from fogshift.verify.reference import case1_reference, compare, read_sink
from tests.conftest import SHARED_TRIGGER_MS, Cluster

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def shared(cluster: Cluster) -> Iterator[BenchCluster]:
    """The session's shared cluster (cloud, fog-a, fog-b, fog-c; checkpoints every 2 s,
    central pulls every 4 s, its trigger), seen as a bench cluster; the node E2 kills is
    started again by the next module that takes the cluster and uses it."""
    yield BenchCluster(
        cluster.home,
        ClusterOptions(
            ("cloud", "fog-a", "fog-b", "fog-c"),
            checkpoint_interval_s=2,
            central_interval_s=4,
            trigger_ms=SHARED_TRIGGER_MS,
        ),
    )


#: Case 2 with its processing moving, only (the steady run is the same code without the
#: migration): one patient, turning abnormal, at twice real time; only the classifier moves
#: (a group of one: each more PE is one more migration of the same code; each more patient
#: more of the same windows to classify).
ECG = ecg.EcgConfig(patients=1, abnormal_every=1, duration_s=16.0, onset_s=4.0, move_at_s=4.0,
                    speed=2.0, modes=("moving",), warm_up=False, group=("classify",))  # fmt: skip


@pytest.fixture(scope="module")
def out(shared: BenchCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run the four experiments once; their output folder.

    E1 migrates as soon as the origin has shown one interval between its batches (the steady
    interval the output gap is measured against; ``_wait_steady``), and every Case 1 run's
    input leads its schedule by 1 s (the feeder's tick is 0.5 s; the source starts later
    still): the stream ends ~1 s after a run's operation instead of ~4 s."""
    folder = tmp_path_factory.mktemp("bench-out")
    write_machine(folder)
    clusters = Clusters(shared.home.parent, shared=shared)
    reporter = Reporter()
    with reporter.session():
        e1.run(
            e1.E1Config(runs=1, sizes_mib=(0,), modes=("precopy",), profiles=("n0",),
                        wait_s=(0.0, 0.0), steady_batches=1, lead_s=1.0, warm_up=False),
            clusters, folder, reporter,
        )  # fmt: skip
        # 3 s after the first output: e3.png needs a checkpoint row, and the aggregate's
        # first snapshot (its batch 0, a 2 s tick after the query starts) precedes the
        # sink's first line (the sink's batch after the aggregate's): 5 were seen in 5 s.
        e3.run(e3.E3Config(sizes_mib=(0,), duration_s=3, lead_s=1.0), clusters, folder, reporter)
        ecg.run(ECG, clusters, folder, reporter)
        e2.run(
            e2.E2Config(runs=1, kill_after_s=(0.0, 0.5), restore_wait_s=(0.5, 1.0), lead_s=1.0),
            clusters, folder, reporter,
        )  # fmt: skip
    report.render(folder)
    return folder


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_every_experiment_writes_csv_png_and_results(out: Path) -> None:
    for name, pngs in (
        ("e1", ["e1.png", "e1_cpu.png"]),
        ("e2", ["e2.png"]),
        ("e3", ["e3.png"]),
        ("ecg", ["ecg.png"]),
    ):
        rows = _rows(out / name / "runs.csv")
        assert rows, f"{name}: no runs"
        for png in pngs:
            assert (out / name / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    text = (out / "results.md").read_text()
    for heading in ("## Machine", "## E1", "## E2", "## E3", "## Case 2"):
        assert heading in text
    assert "Fig. 22a p. 48" in text  # the thesis's anchors are cited beside our figures


def test_each_run_migrated_or_restored_and_was_compared(out: Path, shared: BenchCluster) -> None:
    (run,) = _rows(out / "e1" / "runs.csv")
    assert run["status"] == "migrated", run
    (restore,) = _rows(out / "e2" / "runs.csv")
    assert restore["status"] == "restored", restore
    for row in (run, restore):
        # The consistency column is a real comparison: redo it from the run's files.
        work = shared.home / "runs" / row["run"]
        expected = case1_reference(work / "in.csv", "value", 10, "avg")
        verdict = compare(expected.rows, read_sink(work / "out" / "out.csv", "value"))
        assert row["consistent"] == ("true" if verdict.consistent else "false")
        assert verdict.consistent, verdict.summary()
        # ... and one that would catch a lost row.
        assert not compare(
            expected.rows, read_sink(work / "out" / "out.csv", "value")[1:]
        ).consistent
    # What the sink's side saw of the migration: the longest interval between two of the
    # aggregate's outputs around it is one the stream really has (read here on its own).
    stored = [e["stored"] for e in shared.client.get(
        f"/pipelines/{run['run']}/elements/aggregate/events", params={"after": 0, "limit": 5000}
    )["events"]]  # fmt: skip
    intervals = [round((b - a) * 1000, 1) for a, b in itertools.pairwise(stored)]
    assert float(run["max_gap_ms"]) in intervals, (run, intervals)
    assert float(run["output_gap_ms"]) == pytest.approx(
        float(run["max_gap_ms"]) - float(run["steady_gap_ms"]), abs=0.2
    )
    assert float(run["window_p99_ms"]) > 0 and float(run["steady_p99_ms"]) > 0, run
    # Case 2: the group moved, and the alarms the latencies are of are the reference's.
    (moving,) = _rows(out / "ecg" / "runs.csv")
    assert moving["mig_status"] == "migrated" and moving["consistent"] == "true", moving
    source = ECG.source()
    gains = {p.name: p.gain for p in patients(source.patients, source.seed,
                                              source.abnormal_every, source.onset_s)}  # fmt: skip
    expected_alarms = reference_alarms(
        source, AmplifyOptions(calibration=gains), BandpassOptions(), ClassifyOptions()
    )
    assert read_alarms(shared.home / "runs" / "ecg-moving" / "out" / "alarms.csv") == (
        expected_alarms
    )
    timed = _rows(out / "ecg" / "alarms.csv")
    assert [(a["patient"], float(a["t"]), a["class"]) for a in timed] == expected_alarms
    assert all(float(a["latency_ms"]) > 0 for a in timed)
    windows = _rows(out / "ecg" / "windows.csv")
    per_patient = int(source.duration_s / source.window_s)
    assert len(windows) == int(moving["windows"]) == source.patients * per_patient


def test_results_are_recomputed_from_the_csv(out: Path, tmp_path: Path) -> None:
    (run,) = _rows(out / "e1" / "runs.csv")
    downtime = fmt_mean_std([float(run["downtime_ms"])], 0)
    row = next(line for line in (out / "results.md").read_text().splitlines()
               if line.startswith("| n0 |"))  # fmt: skip
    assert f"| {downtime} |" in row
    # Edit the CSV, render again: the table follows the CSV, nothing else.
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    path = copy / "e1" / "runs.csv"
    rows = _rows(path)
    rows[0]["downtime_ms"] = "12345.0"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = report.render(copy, plots=False).read_text()  # the plots were drawn by `out`
    assert "| 12,345 |" in text
