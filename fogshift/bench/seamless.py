"""Seamless: throughput and end-to-end latency over a live migration and a restoration, at load.

The thesis fed one event every 300 ms. Here the load is what this machine sustains:

1. **Calibration**: Case 1 over ``calibration_rows`` events at rate 0 (as fast as the
   pipeline goes); the output rate between 20 % and 90 % of the output is the pipeline's
   peak throughput on this machine.
2. **Probes**: Case 1 at a fixed rate for ``probe_s``, starting at ``load_fraction`` of the
   peak. Output that keeps up has a flat latency; output that falls behind has a latency
   growing at ``1 - output rate / input rate``. A rate is *sustained* if the least-squares
   slope of latency over due time (events due after the first 30 % of the probe) is at most
   ``max_slope`` (0.05: the output keeps 95 % of the pace) and the output is consistent.
   Otherwise the rate is lowered by a quarter (at most ``probes`` times). Micro-batches of a
   rate-limited source are small, so the sustained rate is below the peak.
3. **The run**: Case 1 at the sustained rate (or ``rate``): ``before_s`` after the source
   started, the aggregate is live-migrated ``fog-a`` -> ``fog-b`` (precopy); ``between_s``
   after that, the process group of ``fog-b`` is killed and, ``restore_wait_s`` later, the
   aggregate is restored on ``fog-a``. The input grows while this goes on (in chunks, so the
   source re-scans its file rarely) and ends ``tail_s`` after the restore.

A :class:`~fogshift.bench.probes.SinkWatcher` notes when each output line appears; event
*k* is due at the source at ``t0 + k / rate`` (``t0`` from the source's offset), so its
end-to-end latency is "line appeared" minus "event due". Every run is compared with the
reference. ``timeline.csv`` has one row per second of the run.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fogshift.bench import thesis
from fogshift.bench.base import (
    ClusterRunConfig,
    Reporter,
    RunLog,
    fmt,
    least_squares,
    num,
    percentile,
    read_rows,
    truthy,
    write_notes,
)
from fogshift.bench.cluster import BenchCluster, ClusterOptions, Clusters
from fogshift.bench.exceptions import BenchError
from fogshift.bench.probes import SinkWatcher
from fogshift.bench.workload import OUTPUT, Case1Run, warm_up
from fogshift.common.text import one_line

NAME = "seamless"
EDGE, FIRST, SECOND = "cloud", "fog-a", "fog-b"

RUN_FIELDS = (
    "run", "kind", "rate", "events", "duration_s", "max_rate", "sustained", "lat_first_ms",
    "lat_second_ms", "lat_slope", "consistent", "problems", "error", "mig_start_s", "mig_end_s",
    "mig_status", "mig_downtime_ms", "kill_s", "restore_start_s", "restore_end_s",
    "restore_status", "restore_total_ms", "reprocessed_events", "intermediate_events",
)  # fmt: skip
TIMELINE_FIELDS = (
    "run", "t_s", "lines", "lat_mean_ms", "lat_p50_ms", "lat_p99_ms", "lat_max_ms",
)  # fmt: skip


@dataclass(frozen=True)
class SeamlessConfig(ClusterRunConfig):
    """Settings of the seamless experiment.

    Attributes:
        calibration_rows: Events of the calibration run.
        load_fraction: Share of the calibrated peak the first probe runs at.
        probes: At most this many probes.
        probe_s: Length of a probe's input.
        max_slope: Highest latency growth (s per s) of a sustained rate.
        rate: Use this rate (events/s): no calibration, no probes.
        before_s: From the source's start to the migration.
        between_s: From the end of the migration to the kill.
        restore_wait_s: From the kill to the restore.
        tail_s: Input after the restore (and how far the input file runs ahead).

    Central pulls are every 5 s (the restore starts from the newest); ``warm_up`` is off: the
    calibration warms fog-a, and precopy warms fog-b before the pause.
    """

    calibration_rows: int = 60_000
    load_fraction: float = 0.5
    probes: int = 3
    probe_s: float = 40.0
    max_slope: float = 0.05
    rate: float | None = None
    before_s: float = 30.0
    between_s: float = 15.0
    restore_wait_s: float = 2.0
    tail_s: float = 30.0
    central_interval_s: float = 5.0
    timeout_s: float = 900.0
    seed: int = 4

    @classmethod
    def quick(cls) -> SeamlessConfig:
        """A shorter calibration, two 20 s probes, shorter phases."""
        return cls(
            calibration_rows=20_000, probes=2, probe_s=20.0, before_s=15.0, between_s=10.0,
            tail_s=15.0,
        )  # fmt: skip


def run(config: SeamlessConfig, clusters: Clusters, out: Path, reporter: Reporter) -> None:
    """Calibrate, probe, then run with a migration and a restoration; write
    ``out/seamless/runs.csv``, ``timeline.csv`` and ``notes.json``."""
    folder = out / NAME
    runs = RunLog(folder / "runs.csv", RUN_FIELDS)
    timeline = RunLog(folder / "timeline.csv", TIMELINE_FIELDS)
    steps = 1 if config.rate else 2 + config.probes
    task = reporter.task("seamless", steps)
    options = ClusterOptions(
        (EDGE, FIRST, SECOND), config.checkpoint_interval_s, config.central_interval_s
    )
    reporter.step(task, "starting the cluster")
    with clusters.cluster(options) as cluster:
        write_notes(folder, {**asdict(config), **cluster.options.intervals()})
        if config.warm_up and clusters.shared is None:
            reporter.step(task, "warming up")
            warm_up(cluster, [FIRST, SECOND], cluster.home / "runs", config.timeout_s)
        rate = config.rate
        peak: float | None = None
        if rate is None:
            reporter.step(task, f"calibrating: {config.calibration_rows} events at full speed")
            calibration = _calibrate(cluster, config)
            runs.append(calibration)
            peak = calibration.get("max_rate")
            reporter.note(
                f"seamless: peak {peak} events/s at full speed "
                f"({'consistent' if calibration.get('consistent') else 'INCONSISTENT'})"
            )
            reporter.advance(task)
            if not peak:
                raise BenchError(
                    "the calibration run measured no rate",
                    received=one_line(str(calibration.get("error") or calibration.get("problems"))),
                )
            rate = _round_down(config.load_fraction * float(peak))
            for index in range(config.probes):
                reporter.step(task, f"probing {rate:g} events/s for {config.probe_s:.0f} s")
                probe = _probe(cluster, f"seamless-probe-{index + 1}", rate, config)
                runs.append({**probe, "max_rate": peak})
                reporter.note(
                    f"seamless: {rate:g} events/s "
                    + ("sustained" if probe.get("sustained") else "not sustained")
                    + f" (latency {probe.get('lat_first_ms')} -> {probe.get('lat_second_ms')} ms, "
                    f"growing {probe.get('lat_slope')} s/s)"
                )
                if probe.get("sustained") or index == config.probes - 1:
                    reporter.advance(task, config.probes - index)  # the rest are not needed
                    break
                reporter.advance(task)
                rate = _round_down(rate * 0.75)
        reporter.step(task, f"running at {rate:g} events/s")
        row, bins = _run_at(cluster, rate, config)
        runs.append({**row, "max_rate": peak})
        timeline.extend(bins)
        reporter.note(
            f"seamless: {rate:g} events/s, migration {row.get('mig_status')}, restore "
            f"{row.get('restore_status')}; "
            f"{'consistent' if row.get('consistent') else 'INCONSISTENT'}"
            + (f" ({one_line(str(row['error']), 120)})" if row.get("error") else "")
        )
        reporter.advance(task)


def _round_down(rate: float) -> float:
    """Two significant digits, rounded down (a round rate, never above the share)."""
    if rate <= 0:
        return 0.0
    step = 10 ** max(0, math.floor(math.log10(rate)) - 1)
    return float(math.floor(rate / step) * step)


def _calibrate(cluster: BenchCluster, config: SeamlessConfig) -> dict[str, Any]:
    name = "seamless-calibration"
    row: dict[str, Any] = {
        "run": name, "kind": "calibration", "rate": 0, "events": config.calibration_rows,
    }  # fmt: skip
    with Case1Run(
        cluster, name, rate=0, seed=config.seed, agg_node=FIRST, row=row,
        prefill=config.calibration_rows,
    ) as run:  # fmt: skip
        run.deploy()
        with SinkWatcher(run.work / OUTPUT) as watcher:
            run.check(config.timeout_s)
        times = [t for t, _ in watcher.seen]
        lo, hi = int(len(times) * 0.2), int(len(times) * 0.9)
        if hi - lo >= 2 and times[hi - 1] > times[lo]:
            row["max_rate"] = round((hi - 1 - lo) / (times[hi - 1] - times[lo]), 1)
    return row


def _source_t0(cluster: BenchCluster, pipeline: str, timeout_s: float) -> float:
    """When the source's rate schedule started (its offset's ``t0``), once it committed."""
    agent = cluster.agent(EDGE)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            offset = agent.get(f"/pipelines/{pipeline}/elements/source/progress").get("offset")
            if offset and offset.get("t0"):
                return float(offset["t0"])
            time.sleep(0.2)
    finally:
        agent.close()
    raise BenchError(f"{pipeline}: the source committed no batch in {timeout_s:.0f} s")


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _latencies(seen: list[tuple[float, int]], t0: float, rate: float) -> list[tuple[float, float]]:
    """``(s since t0 the event was due, latency ms)`` per output line."""
    return [(seq / rate, (t - (t0 + seq / rate)) * 1000.0) for t, seq in seen]


def _probe(cluster: BenchCluster, name: str, rate: float, config: SeamlessConfig) -> dict[str, Any]:
    """Run at ``rate`` for ``probe_s``; sustained if latency does not grow (module doc)."""
    events = int(rate * config.probe_s)
    row: dict[str, Any] = {"run": name, "kind": "probe", "rate": rate, "events": events,
                           "duration_s": config.probe_s, "sustained": False}  # fmt: skip
    with Case1Run(
        cluster, name, rate=rate, seed=config.seed, agg_node=FIRST, row=row, prefill=events
    ) as run:
        run.deploy()
        with SinkWatcher(run.work / OUTPUT) as watcher:
            t0 = _source_t0(cluster, name, config.timeout_s)
            result = run.check(config.timeout_s)
        points = [
            (due, ms)
            for due, ms in _latencies(watcher.seen, t0, rate)
            if due >= 0.3 * config.probe_s
        ]
        half = [ms for due, ms in points if due >= 0.65 * config.probe_s]
        first = [ms for due, ms in points if due < 0.65 * config.probe_s]
        line = least_squares([d for d, _ in points], [ms / 1000.0 for _, ms in points])
        if line is not None and first and half:
            row.update(
                lat_first_ms=round(statistics.median(first), 1),
                lat_second_ms=round(statistics.median(half), 1),
                lat_slope=round(line[0], 4),
                sustained=result.consistent and line[0] <= config.max_slope,
            )  # fmt: skip
    return row


def _run_at(
    cluster: BenchCluster, rate: float, config: SeamlessConfig
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run at ``rate``: returns its row and its one-second bins."""
    name = "seamless-run"
    row: dict[str, Any] = {"run": name, "kind": "run", "rate": rate}
    bins: list[dict[str, Any]] = []
    # Appends of tail_s / 2 seconds of input at a time: the source re-scans its file once
    # per append, not once per batch.
    with Case1Run(
        cluster, name, rate=rate, seed=config.seed, agg_node=FIRST, row=row,
        lead_s=config.tail_s, auto_recovery=False,
    ) as run:  # fmt: skip
        run.deploy()
        with SinkWatcher(run.work / OUTPUT) as watcher:
            t0 = _source_t0(cluster, name, config.timeout_s)
            _sleep_until(t0 + config.before_s)
            called = time.time()
            migration = cluster.operation(name, "aggregate", "migrate", {"target": SECOND})
            ended = called + sum(migration.get("phases_ms", {}).values()) / 1000.0
            row.update(
                mig_start_s=round(called - t0, 2), mig_end_s=round(ended - t0, 2),
                mig_status=migration.get("status"), mig_downtime_ms=migration.get("downtime_ms"),
            )  # fmt: skip
            _sleep_until(max(ended, time.time()) + config.between_s)
            row["kill_s"] = round(time.time() - t0, 2)
            cluster.kill(SECOND)
            time.sleep(config.restore_wait_s)
            called = time.time()
            restore = cluster.operation(name, "aggregate", "restore", {"target": FIRST})
            row.update(
                restore_start_s=round(called - t0, 2),
                restore_end_s=round(called + float(restore.get("total_ms") or 0) / 1000 - t0, 2),
                restore_status=restore.get("status"), restore_total_ms=restore.get("total_ms"),
                reprocessed_events=restore.get("reprocessed_events"),
                intermediate_events=restore.get("intermediate_events"),
            )  # fmt: skip
            row["duration_s"] = round(run.finish_input() / rate, 1)
            run.check(config.timeout_s)
        bins = _bins(name, watcher.seen, t0, rate)
    return row, bins


def _bins(run: str, seen: list[tuple[float, int]], t0: float, rate: float) -> list[dict[str, Any]]:
    """One row per second since ``t0``: lines that appeared, and their latencies."""
    by_second: dict[int, list[float]] = {}
    for t, seq in seen:
        latency_ms = (t - (t0 + seq / rate)) * 1000.0
        by_second.setdefault(math.floor(t - t0), []).append(latency_ms)
    if not by_second:
        return []
    out = []
    for second in range(min(0, *by_second), max(by_second) + 1):
        values = sorted(by_second.get(second, []))
        row: dict[str, Any] = {"run": run, "t_s": second, "lines": len(values)}
        if values:
            row.update(
                lat_mean_ms=round(statistics.fmean(values), 1),
                lat_p50_ms=round(percentile(values, 50) or 0.0, 1),
                lat_p99_ms=round(percentile(values, 99) or 0.0, 1),  # (nearest rank)
                lat_max_ms=round(values[-1], 1),
            )
        out.append(row)
    return out


# -- results (from the CSV files only) --------------------------------------------------------


def _windows(run: dict[str, str], last: float) -> list[tuple[str, float, float]]:
    """The run's phases on its timeline: ``(label, start s, end s)``."""
    marks = [num(run[k]) for k in ("mig_start_s", "mig_end_s", "kill_s", "restore_end_s")]
    if any(m is None for m in marks):
        return [("whole run", 0.0, last + 1)]
    mig_start, mig_end, kill, restored = (float(m or 0) for m in marks)
    return [
        ("before", 0.0, mig_start),
        ("live migration", mig_start, mig_end),
        ("between", mig_end, kill),
        ("node killed + restore", kill, restored),
        ("after (catching up)", restored, last + 1),
    ]


def _window_stats(bins: list[dict[str, str]], start: float, end: float) -> dict[str, Any]:
    inside = [b for b in bins if start <= float(b["t_s"]) < end]
    lines = sum(int(b["lines"]) for b in inside)
    weighted = [(int(b["lines"]), float(b["lat_mean_ms"])) for b in inside if b["lat_mean_ms"]]
    return {
        "seconds": end - start,
        "throughput": lines / len(inside) if inside else None,
        "lat_mean": (sum(n * v for n, v in weighted) / lines) if lines and weighted else None,
        "lat_p99": max((float(b["lat_p99_ms"]) for b in inside if b["lat_p99_ms"]), default=None),
        "lat_max": max((float(b["lat_max_ms"]) for b in inside if b["lat_max_ms"]), default=None),
    }


def section(folder: Path) -> str | None:
    """The seamless part of ``results.md``: load, and throughput/latency per phase."""
    runs = read_rows(folder / "runs.csv")
    if not runs:
        return None
    bins = read_rows(folder / "timeline.csv")
    calibration = next((r for r in runs if r["kind"] == "calibration"), None)
    out = [
        "## Seamless - throughput and latency through a migration and a restoration",
        "",
        "No thesis counterpart: the thesis fed "
        f"{thesis.thesis_rate_per_s():.2f} events/s ({thesis.EVENT_INTERVAL_MS.cite()}). "
        "*Latency* is end to end: from when event *k* is due at the source (its rate "
        "schedule) until its output line is in the sink's file (polled every 50 ms). "
        "Throughput is output lines per second; both per phase of the run, from one-second "
        "bins (*worst p99* is the highest per-second p99).",
        "",
    ]
    if calibration is not None:
        out.append(
            f"Calibration: {calibration['events']} events at full speed: peak output "
            f"**{fmt(num(calibration['max_rate']), 0)} events/s** "
            f"({'consistent' if truthy(calibration['consistent']) else 'INCONSISTENT'})."
        )
    probes = [r for r in runs if r["kind"] == "probe"]
    if probes:
        out += [
            "",
            f"Probes (sustained: latency grows at most {SeamlessConfig.max_slope:g} s per s, "
            "i.e. the output keeps 95 % of the input's pace, and the output is consistent):",
            "",
            "| probe | events/s | s | latency (30-65 %) ms | latency (65-100 %) ms | "
            "latency growth s/s | sustained | consistent |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {r['run']} | {float(r['rate']):g} | {fmt(num(r['duration_s']))} | "
            f"{fmt(num(r['lat_first_ms']))} | {fmt(num(r['lat_second_ms']))} | "
            f"{fmt(num(r['lat_slope']), 3)} | {'yes' if truthy(r['sustained']) else 'no'} | "
            f"{'yes' if truthy(r['consistent']) else 'no'} |"
            for r in probes
        ]
    for run in (r for r in runs if r["kind"] == "run"):
        rate = float(run["rate"])
        mine = [b for b in bins if b["run"] == run["run"]]
        last = max((float(b["t_s"]) for b in mine), default=0.0)
        out += [
            "",
            f"Run: **{rate:g} events/s** ({rate / thesis.thesis_rate_per_s():,.0f} x the "
            f"thesis's load), {run['events']} events; live migration fog-a -> fog-b "
            f"({run['mig_status'] or 'not done'}, downtime {fmt(num(run['mig_downtime_ms']))} "
            f"ms), then fog-b killed and the aggregate restored on fog-a "
            f"({run['restore_status'] or 'not done'}, {fmt(num(run['restore_total_ms']))} ms, "
            f"{run['reprocessed_events'] or '-'} reprocessed, {run['intermediate_events'] or '-'}"
            f" intermediate events). Output "
            f"{'consistent' if truthy(run['consistent']) else 'INCONSISTENT'}"
            + (f": {one_line(run['problems'])}" if run["problems"] else "")
            + (f" ({one_line(run['error'])})" if run["error"] else "")
            + ".",
            "",
            "| phase | s | throughput events/s | latency mean ms | worst p99 ms | max ms |",
            "|---|---|---|---|---|---|",
        ]
        for label, start, end in _windows(run, last):
            if end <= start:
                continue  # e.g. the kill followed the migration at once
            stats = _window_stats(mine, start, end)
            out.append(
                f"| {label} | {fmt(stats['seconds'], 1)} | {fmt(stats['throughput'])} | "
                f"{fmt(stats['lat_mean'])} | {fmt(stats['lat_p99'])} | {fmt(stats['lat_max'])} |"
            )
    out += ["", f"![seamless]({NAME}/seamless.png)", ""]
    return "\n".join(out)


def plot(folder: Path) -> list[Path]:
    """``seamless.png``: throughput and latency over time, phases shaded."""
    from fogshift.bench.plotting import COLOURS, figure, log_y, save

    runs = [r for r in read_rows(folder / "runs.csv") if r["kind"] == "run"]
    bins = read_rows(folder / "timeline.csv")
    if not runs or not bins:
        return []
    run = runs[-1]
    mine = [b for b in bins if b["run"] == run["run"]]
    fig, axes = figure(ncols=1, nrows=2, width=9, height=3.2)
    top, bottom = axes[0][0], axes[1][0]
    ts = [float(b["t_s"]) for b in mine]
    lines = [int(b["lines"]) for b in mine]
    top.plot(ts, lines, label="output lines/s", alpha=0.4)
    # Micro-batches land about once a second: the 5 s mean shows the trend.
    smooth = [sum(lines[max(0, i - 4) : i + 1]) / len(lines[max(0, i - 4) : i + 1])
              for i in range(len(lines))]  # fmt: skip
    top.plot(ts, smooth, label="5 s mean")
    top.axhline(float(run["rate"]), color=COLOURS["thesis"], linestyle="--", label="input rate")
    top.set_ylabel("events/s")
    latencies: list[float] = []
    for key, label in (("lat_p50_ms", "p50"), ("lat_p99_ms", "p99"), ("lat_max_ms", "max")):
        pts = [(float(b["t_s"]), float(b[key])) for b in mine if b[key]]
        bottom.plot([p[0] for p in pts], [max(1.0, p[1]) for p in pts], label=label)
        latencies += [max(1.0, p[1]) for p in pts]
    log_y(bottom, "end-to-end latency ms", latencies, "no output line's latency measured")
    bottom.set_xlabel("s since the source started")
    for ax in (top, bottom):
        for key_start, key_end, colour, label in (
            ("mig_start_s", "mig_end_s", "orange", "live migration"),
            ("kill_s", "restore_end_s", "red", "killed + restore"),
        ):
            start, end = num(run[key_start]), num(run[key_end])
            if start is not None and end is not None:
                ax.axvspan(start, end, alpha=0.2, color=colour, label=label)
        ax.legend(fontsize=7, loc="upper right")
    top.set_title(f"seamless: {float(run['rate']):g} events/s")
    return [save(fig, folder / "seamless.png")]
