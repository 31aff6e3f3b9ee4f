"""Case 2: the alarm latency the patients see while their processing moves to another gateway.

The same Case 2 pipeline (same patients, same recordings, at real time unless ``speed`` says
otherwise) runs once per mode:

* ``steady``: the amplifier, band-pass and classifier stay on ``fog-a``;
* ``moving``: when the wearables have streamed ``move_at_s`` seconds (around the abnormal
  onsets, so alarms fall due while it runs), the three move to ``fog-b`` as one group
  migration (``POST /pipelines/{p}/migrate``, precopy).

Latencies come from the broker's clock only: every event's *stored* time in its PE's output
stream (``GET .../events``). A window's latency is when the band-pass stored its filtered
window minus when the source stored the raw one; an alarm's latency is when the classifier
stored the alarm minus when the source stored the window that completed it (the window
ending at the alarm's ``t``). The alarms fall due at the same recording times in both runs
(same signals), so *added alarm latency* is per alarm: moving minus steady.

Every run is compared with the offline reference (:mod:`fogshift.verify.case2`): each
patient's filtered signal sample by sample and the alarms; a run that differs is reported
INCONSISTENT whatever its latencies.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fogshift.bench.base import (
    ClusterRunConfig,
    Reporter,
    RunLog,
    fmt,
    num,
    percentile,
    read_rows,
    truthy,
    write_notes,
)
from fogshift.bench.cluster import BenchCluster, ClusterOptions, Clusters
from fogshift.common.text import one_line
from fogshift.exceptions import FogshiftError
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions, EcgSourceOptions

if TYPE_CHECKING:
    import numpy as np

# The simulator and the reference (numpy, scipy, neurokit2) are imported where a run needs
# them: `fogshift --help` registers this module's command and must stay quick.

NAME = "ecg"
EDGE, FIRST, SECOND = "cloud", "fog-a", "fog-b"
PROCESSING = ("amplify", "bandpass", "classify")
MODES = ("steady", "moving")

RUN_FIELDS = (
    "run", "mode", "patients", "windows", "alarms", "consistent", "problems", "error",
    "mig_start_s", "mig_end_s", "mig_status", "mig_downtime_ms",
)  # fmt: skip
WINDOW_FIELDS = ("run", "patient", "t", "wall_s", "latency_ms")
ALARM_FIELDS = ("run", "patient", "t", "class", "wall_s", "latency_ms")


@dataclass(frozen=True)
class EcgConfig(ClusterRunConfig):
    """Settings of the Case 2 latency experiment.

    Attributes:
        patients: Simulated patients (every ``abnormal_every``-th turns abnormal).
        duration_s: Seconds of recording per patient (streamed at real time).
        onset_s: Around when the abnormal rhythms start (± 20 %, per patient).
        move_at_s: Seconds of recording streamed before the group migration starts.
        modes: The runs, of :data:`MODES`.
        abnormal_every: Every n-th patient turns abnormal.
        speed: Seconds of recording per wall-clock second (1: real time).
        group: The PEs that move, of :data:`PROCESSING` (all three by default).
        warm_up: First a run, not measured, until the processing has moved fog-a -> fog-b:
            without it the first measured run's early windows waited for Python workers, JIT
            compilation and the simulation of the recordings (kept by the source's worker
            afterwards), and the steady run looked slower than the moving one.
    """

    patients: int = 8
    duration_s: float = 60.0
    onset_s: float = 20.0
    move_at_s: float = 20.0
    modes: tuple[str, ...] = MODES
    abnormal_every: int = 2
    speed: float = 1.0
    group: tuple[str, ...] = PROCESSING
    central_interval_s: float = 5.0
    warm_up: bool = True
    seed: int = 3

    @classmethod
    def quick(cls) -> EcgConfig:
        """Four patients, 40 s of recording."""
        return cls(patients=4, duration_s=40.0, onset_s=14.0, move_at_s=14.0)

    def source(self) -> EcgSourceOptions:
        return EcgSourceOptions(
            patients=self.patients, duration_s=self.duration_s, onset_s=self.onset_s,
            abnormal_every=self.abnormal_every, seed=self.seed, speed=self.speed,
        )  # fmt: skip


def run(config: EcgConfig, clusters: Clusters, out: Path, reporter: Reporter) -> None:
    """One run per mode; writes ``out/ecg/runs.csv``, ``windows.csv``, ``alarms.csv`` and
    ``notes.json``."""
    folder = out / NAME
    runs = RunLog(folder / "runs.csv", RUN_FIELDS)
    windows = RunLog(folder / "windows.csv", WINDOW_FIELDS)
    alarms = RunLog(folder / "alarms.csv", ALARM_FIELDS)
    task = reporter.task("ecg alarm latency", len(config.modes))
    options = ClusterOptions(
        (EDGE, FIRST, SECOND), config.checkpoint_interval_s, config.central_interval_s
    )
    with clusters.cluster(options) as cluster:
        write_notes(folder, {**asdict(config), **cluster.options.intervals()})
        if config.warm_up:
            reporter.step(task, "warming up fog-a and fog-b")
            _run(cluster, config, "moving", "ecg-warm-up", until_moved=True)
        for mode in config.modes:
            reporter.step(task, f"{mode}: {config.patients} patients, {config.duration_s:g} s")
            row, window_rows, alarm_rows = _run(cluster, config, mode, f"ecg-{mode}")
            runs.append(row)
            windows.extend(window_rows)
            alarms.extend(alarm_rows)
            latencies = [r["latency_ms"] for r in alarm_rows]
            reporter.note(
                f"ecg-{mode}: {len(alarm_rows)} alarms, latency "
                + (f"{min(latencies):.0f}-{max(latencies):.0f} ms" if latencies else "-")
                + (f", migration {row.get('mig_status')}" if mode == "moving" else "")
                + f"; {'consistent' if row.get('consistent') else 'INCONSISTENT'}"
                + (f" ({one_line(str(row['error']), 120)})" if row.get("error") else "")
            )
            reporter.advance(task)


def _spec(config: EcgConfig, work: Path, name: str) -> Path:
    from fogshift.ecg.simulate import patients

    source = config.source()
    people = patients(source.patients, source.seed, source.abnormal_every, source.onset_s)
    calibration = {p.name: p.gain for p in people}
    elements = [
        {"id": "wearables", "kind": "ecg-source", "node": EDGE, "options": source.as_dict()},
        {"id": "amplify", "kind": "amplify", "node": FIRST, "inputs": ["wearables"],
         "options": {"gain": 1.0, "calibration": calibration}},
        {"id": "bandpass", "kind": "bandpass", "node": FIRST, "inputs": ["amplify"],
         "key_by": "patient"},
        {"id": "classify", "kind": "classify", "node": FIRST, "inputs": ["bandpass"],
         "key_by": "patient"},
        {"id": "alarms", "kind": "csv-sink", "node": EDGE, "inputs": ["classify"],
         "options": {"path": "out/alarms.csv"}},
    ]  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    path = work / "case2.yaml"
    # Recovery by hand only: a node slow under load must not be "restored" mid-measurement.
    path.write_text(
        yaml.safe_dump({"pipeline": name, "recovery": {"auto": False}, "elements": elements})
    )
    return path


def _run(
    cluster: BenchCluster, config: EcgConfig, mode: str, name: str, until_moved: bool = False
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One run of ``mode`` as pipeline ``name``: its row, window rows and alarm rows
    (``until_moved``: stopped once the migration is done, nothing measured)."""
    from fogshift.ecg.simulate import patients
    from fogshift.verify.case2 import read_alarms, reference_alarms, reference_filtered

    source = config.source()
    row: dict[str, Any] = {"run": name, "mode": mode, "patients": config.patients}
    work = cluster.home / "runs" / name
    spec = _spec(config, work, name)
    amplify = AmplifyOptions(calibration={
        p.name: p.gain
        for p in patients(source.patients, source.seed, source.abnormal_every, source.onset_s)
    })  # fmt: skip
    expected = reference_alarms(source, amplify, BandpassOptions(), ClassifyOptions())
    windows_total = int(source.duration_s / source.window_s) * source.patients
    window_rows: list[dict[str, Any]] = []
    alarm_rows: list[dict[str, Any]] = []
    try:
        cluster.cli("deploy", str(spec), "--fresh")  # (a run is anew, its name too)
        deadline = time.monotonic() + config.timeout_s
        if mode == "moving":
            due = int(config.move_at_s / source.window_s) * source.patients
            _wait(cluster, name, "wearables", due, deadline)
            called = time.time()
            report = cluster.client.post(
                f"/pipelines/{name}/migrate",
                json={"elements": list(config.group), "target": SECOND},
            )
            row.update(
                mig_start_s=called, mig_end_s=time.time(), mig_status=report["status"],
                mig_downtime_ms=round(sum(m.get("downtime_ms") or 0
                                          for m in report["migrations"]), 1),
            )  # fmt: skip
            if until_moved:
                return row, [], []
        _wait(cluster, name, "bandpass", windows_total, deadline)
        _wait(cluster, name, "alarms", len(expected), deadline)
        time.sleep(1.0)  # a duplicate would show within a batch or two
        raw = _events(cluster, name, "wearables")
        filtered = _events(cluster, name, "bandpass")
        raised = _events(cluster, name, "classify")
        start = min(e["stored"] for e in raw) if raw else 0.0
        for key in ("mig_start_s", "mig_end_s"):
            if key in row:
                row[key] = round(row[key] - start, 2)
        sent = {(e["body"]["patient"], round(float(e["body"]["t"]), 3)): e["stored"] for e in raw}
        for e in filtered:
            body = e["body"]
            at = sent.get((body["patient"], round(float(body["t"]), 3)))
            if at is not None:
                window_rows.append({
                    "run": name, "patient": body["patient"], "t": body["t"],
                    "wall_s": round(e["stored"] - start, 3),
                    "latency_ms": round((e["stored"] - at) * 1000, 1),
                })  # fmt: skip
        for e in raised:
            body = e["body"]
            at = sent.get((body["patient"], round(float(body["t"]) - source.window_s, 3)))
            if at is not None:
                alarm_rows.append({
                    "run": name, "patient": body["patient"], "t": body["t"],
                    "class": body["class"], "wall_s": round(e["stored"] - start, 3),
                    "latency_ms": round((e["stored"] - at) * 1000, 1),
                })  # fmt: skip
        problems = _compare(filtered, reference_filtered(source, amplify, BandpassOptions()))
        got = read_alarms(work / "out" / "alarms.csv")
        if got != expected:
            problems.append(f"alarms {got} differ from the reference's {expected}")
        dead = cluster.client.get(f"/pipelines/{name}/errors")
        if dead:  # (as the demo checks: the simulated signal has no bad event)
            problems.append(f"{len(dead)} dead letters, first: {dead[0].get('reason')}")
        row.update(windows=len(window_rows), alarms=len(alarm_rows),
                   consistent=not problems, problems="; ".join(problems) or None)  # fmt: skip
    except FogshiftError as exc:
        row.update(consistent=False, error=one_line(str(exc), 300))
    finally:
        cluster.cli("stop", name, check=False)
    return row, window_rows, alarm_rows


def _wait(cluster: BenchCluster, pipeline: str, element: str, count: int, deadline: float) -> None:
    while cluster.element(pipeline, element)["events_out"] < count:
        if time.monotonic() > deadline:
            return  # the comparison says what is missing
        time.sleep(0.2)


def _events(cluster: BenchCluster, pipeline: str, element: str) -> list[dict[str, Any]]:
    """Every event of the PE's output stream, page by page."""
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        page = cluster.client.get(
            f"/pipelines/{pipeline}/elements/{element}/events",
            params={"after": after, "limit": 5_000},
        )
        out += page["events"]
        after = page["scanned_to"]
        if after >= page["last_seq"]:
            return out


def _compare(filtered: list[dict[str, Any]], reference: dict[str, np.ndarray]) -> list[str]:
    import numpy as np

    signals: dict[str, list[float]] = {}
    for e in filtered:
        signals.setdefault(str(e["body"]["patient"]), []).extend(e["body"]["samples"])
    problems = []
    if sorted(signals) != sorted(reference):  # (a patient the reference has not is output)
        problems.append(f"patients {sorted(signals)}, expected {sorted(reference)}")
    for patient, expected in reference.items():
        got = np.asarray(signals.get(patient, []))
        if len(got) != len(expected) or not np.array_equal(got, expected):
            problems.append(f"{patient}: the filtered signal differs from the reference")
    return problems


# -- results (from the CSV files only) --------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of fraction ``q``; ``None`` of nothing (``round`` made the
    median of 1..5 be 2)."""
    return percentile(values, q * 100.0)


def section(folder: Path) -> str | None:
    """The Case 2 part of ``results.md``: window and alarm latency per run, and per alarm
    the latency the move added."""
    runs = read_rows(folder / "runs.csv")
    if not runs:
        return None
    windows = read_rows(folder / "windows.csv")
    alarms = read_rows(folder / "alarms.csv")
    out = [
        "## Case 2 - alarm latency while the processing moves",
        "",
        "The thesis motivates fogshift with Case 2 (ch. 1) but measures no alarm. Here: "
        "patients' ECG at real time through amplify, band-pass and classifier on fog-a; in "
        "the *moving* run the three move to fog-b as one group migration around the abnormal "
        "onsets. Latencies are broker store times (source window stored -> band-pass window "
        "stored; source window stored -> alarm stored).",
        "",
        "| run | windows | window latency p50 / p99 / max ms | during the move p99 / max ms "
        "| alarms | alarm latency min / max ms | migration | consistent |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        mine = [float(w["latency_ms"]) for w in windows if w["run"] == r["run"]]
        start, end = num(r["mig_start_s"]), num(r["mig_end_s"])
        moving = [float(w["latency_ms"]) for w in windows if w["run"] == r["run"]
                  and start is not None and end is not None
                  and start <= float(w["wall_s"]) <= end + 5]  # fmt: skip
        raised = [float(a["latency_ms"]) for a in alarms if a["run"] == r["run"]]
        migration = (
            f"{r['mig_status']}, {fmt(num(r['mig_start_s']), 1)}-{fmt(num(r['mig_end_s']), 1)} s, "
            f"downtime sum {fmt(num(r['mig_downtime_ms']))} ms"
            if r["mig_status"] else "-"
        )  # fmt: skip
        verdict = (
            "yes"
            if truthy(r["consistent"])
            else ("**no**: " + one_line(r["problems"] or r["error"] or "", 160))
        )
        during = f"{fmt(_pct(moving, 0.99))} / {fmt(max(moving, default=None))}" if moving else "-"
        out.append(
            f"| {r['run']} | {r['windows'] or '-'} | {fmt(_pct(mine, 0.5))} / "
            f"{fmt(_pct(mine, 0.99))} / {fmt(max(mine, default=None))} | {during} | "
            f"{r['alarms'] or '-'} | {fmt(min(raised, default=None))} / "
            f"{fmt(max(raised, default=None))} | {migration} | {verdict} |"
        )
    steady = {(a["patient"], a["t"]): float(a["latency_ms"]) for a in alarms
              if a["run"] == "ecg-steady"}  # fmt: skip
    moving_run = next((r for r in runs if r["mode"] == "moving"), None)
    paired = [
        (a, steady[(a["patient"], a["t"])])
        for a in alarms
        if a["run"] == "ecg-moving" and (a["patient"], a["t"]) in steady
    ]
    if paired and moving_run is not None:
        start, end = num(moving_run["mig_start_s"]), num(moving_run["mig_end_s"])
        out += [
            "",
            "Per alarm, the latency the move added (moving minus steady; *during* when the "
            "alarm was stored between the migration's start and 5 s after its end):",
            "",
            "| patient | t s | class | steady ms | moving ms | added ms | during the move |",
            "|---|---|---|---|---|---|---|",
        ]
        added_during = []
        for a, base in paired:
            ms = float(a["latency_ms"])
            inside = (start is not None and end is not None
                      and start <= float(a["wall_s"]) <= end + 5)  # fmt: skip
            if inside:
                added_during.append(ms - base)
            out.append(
                f"| {a['patient']} | {a['t']} | {a['class']} | {fmt(base)} | {fmt(ms)} | "
                f"{fmt(ms - base)} | {'yes' if inside else 'no'} |"
            )
        if added_during:
            out += [
                "",
                f"Alarms raised during the move: {len(added_during)}; added latency mean "
                f"**{fmt(statistics.fmean(added_during))} ms**, max "
                f"**{fmt(max(added_during))} ms**.",
            ]
    out += ["", f"![ecg]({NAME}/ecg.png)", ""]
    return "\n".join(out)


def plot(folder: Path) -> list[Path]:
    """``ecg.png``: window latency over the run per mode, alarms marked, the move shaded."""
    from fogshift.bench.plotting import figure, log_y, save

    runs = read_rows(folder / "runs.csv")
    windows = read_rows(folder / "windows.csv")
    alarms = read_rows(folder / "alarms.csv")
    if not runs or not windows:
        return []
    fig, axes = figure(ncols=1, nrows=1, width=9, height=3.6)
    ax = axes[0][0]
    latencies: list[float] = []
    for r in runs:
        mine = [w for w in windows if w["run"] == r["run"]]
        latencies += [max(1.0, float(w["latency_ms"])) for w in mine]
        ax.scatter([float(w["wall_s"]) for w in mine],
                   [max(1.0, float(w["latency_ms"])) for w in mine],
                   s=4, alpha=0.5, label=f"{r['mode']}: band-pass windows")  # fmt: skip
        raised = [a for a in alarms if a["run"] == r["run"]]
        if raised:
            ax.scatter([float(a["wall_s"]) for a in raised],
                       [max(1.0, float(a["latency_ms"])) for a in raised],
                       s=40, marker="^", label=f"{r['mode']}: alarms")  # fmt: skip
        start, end = num(r["mig_start_s"]), num(r["mig_end_s"])
        if start is not None and end is not None:
            ax.axvspan(start, end, alpha=0.2, color="orange", label="group migration")
    log_y(ax, "latency ms", latencies, "no window of these runs")
    ax.set_xlabel("s since the first window was stored")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("Case 2: latency while the processing moves")
    return [save(fig, folder / "ecg.png")]
