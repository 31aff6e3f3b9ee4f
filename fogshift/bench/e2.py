"""E2 — restoration: time per reprocessed and per intermediate event, CPU load.

As in the thesis (§6.2.2): Case 1 with 1 MiB of added state, one event every 300 ms,
node-level checkpoints every 5 s. The aggregate runs on a fog node; once it has a central
checkpoint, after a further random wait, the node's whole process group is killed (SIGKILL,
pgid from ``fogshift nodes --json``) — harsher than the thesis, which discarded the PE — and
after another random wait the aggregate is restored on the next fog node (``fogshift restore
--to``). The random kill moment varies the reprocessed events, the random wait the
intermediate ones. Every run's whole output is compared with the reference; the load of the
restore target's process group is sampled.

With ``methods`` (``--methods checkpoint,standby``) the runs take turns: a ``standby`` run's
pipeline keeps a hot standby of the aggregate on the restore target (issue #13), the kill
comes once the standby follows, and the restore promotes it instead of installing a
checkpoint; results.md compares the two side by side.

A killed node stays dead, so each cluster has ``fog_nodes`` fog nodes and gives
``fog_nodes - 1`` runs (the aggregate of run *i* is on the target of run *i - 1*, warm);
then a fresh cluster is started.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fogshift.bench import thesis
from fogshift.bench.base import (
    MIB,
    ClusterRunConfig,
    Reporter,
    RunLog,
    failure_line,
    fmt,
    fmt_mean_std,
    least_squares,
    num,
    read_notes,
    read_rows,
    truthy,
    write_notes,
)
from fogshift.bench.cluster import BenchCluster, ClusterOptions, Clusters, isolation_available
from fogshift.bench.exceptions import BenchError
from fogshift.bench.probes import CpuSampler
from fogshift.bench.workload import Case1Run, wait_rows, warm_up
from fogshift.common.text import one_line

NAME = "e2"
EDGE = "cloud"
FOG_NAMES = ("fog-a", "fog-b", "fog-c", "fog-d", "fog-e", "fog-f")

#: How a run restores: from the central checkpoint, or by promoting a hot standby.
METHODS = ("checkpoint", "standby")

RUN_FIELDS = (
    "run", "method", "origin", "target", "isolated", "rtt_ms", "state_mib", "status", "error",
    "epoch", "checkpoint", "checkpoint_age_ms", "state_bytes", "reprocessed_events", "reprocess_ms",
    "intermediate_events", "intermediate_ms", "total_ms", "live_ms", "standby_lag_events",
    "events", "consistent", "problems",
    "kill_after_s", "restore_wait_s", "kill_s", "restore_start_s", "restore_end_s",
    "cpu_target_before_pct", "cpu_target_restore_pct", "cpu_target_peak_pct",
    "machine_busy_pct",
)  # fmt: skip
CPU_FIELDS = ("run", "t_s", "target_pct", "edge_pct", "machine_pct")


@dataclass(frozen=True)
class E2Config(ClusterRunConfig):
    """Settings of E2.

    Attributes:
        runs: Restorations (the thesis: 100).
        fog_nodes: Fog nodes per cluster (``fog_nodes - 1`` runs each), 2..6.
        state_mib: Added state (the thesis: 1 MiB).
        rate: Events per second.
        kill_after_s: Range of the random wait between the first central checkpoint and the
            kill.
        restore_wait_s: Range of the random wait between the kill and the restore.
        methods: How runs restore, in turn (:data:`METHODS`).
        lead_s: How far ahead of its schedule each run's input is written, and so how
            long its stream goes on after the run's action
            (:class:`~fogshift.bench.workload.InputFeeder`).

    ``warm_up`` is on: every fog node of a fresh cluster runs a short pipeline first.
    """

    runs: int = int(thesis.E2_RUNS.value)
    fog_nodes: int = 4
    state_mib: int = thesis.E2_STATE_MIB
    rate: float = thesis.thesis_rate_per_s()
    kill_after_s: tuple[float, float] = (0.0, 15.0)
    restore_wait_s: tuple[float, float] = (1.0, 30.0)
    seed: int = 2
    warm_up: bool = True
    methods: tuple[str, ...] = ("checkpoint",)
    lead_s: float = 4.0

    @classmethod
    def quick(cls) -> E2Config:
        """Three runs on one cluster, central pulls every 5 s, shorter waits."""
        return cls(
            runs=3, central_interval_s=5.0, kill_after_s=(0.0, 5.0), restore_wait_s=(1.0, 8.0)
        )


def run(config: E2Config, clusters: Clusters, out: Path, reporter: Reporter) -> None:
    """Run E2 and write ``out/e2/runs.csv``, ``cpu.csv`` and ``notes.json``."""
    if not config.methods or set(config.methods) - set(METHODS):
        raise BenchError(
            "bad E2 restore methods",
            expected="one or more of " + ", ".join(METHODS),
            received=", ".join(config.methods) or "(none)",
        )
    if not 2 <= config.fog_nodes <= len(FOG_NAMES):
        raise BenchError(
            "E2 needs between 2 and 6 fog nodes per cluster",
            expected=f"2..{len(FOG_NAMES)}",
            received=str(config.fog_nodes),
        )
    folder = out / NAME
    runs = RunLog(folder / "runs.csv", RUN_FIELDS)
    cpu_log = RunLog(folder / "cpu.csv", CPU_FIELDS)
    isolated = clusters.shared.options.isolate if clusters.shared else isolation_available()
    task = reporter.task("e2 restoration", config.runs)
    rng = random.Random(config.seed)
    fogs = FOG_NAMES[: config.fog_nodes]
    options = ClusterOptions((EDGE, *fogs), config.checkpoint_interval_s, config.central_interval_s)
    if clusters.shared is not None:
        options = replace(options, nodes=(EDGE,))  # any two live fog nodes of it will do
    elif isolated:
        options = replace(options, isolate=True, links=tuple((f, "n0") for f in fogs))
    effective = clusters.shared.options if clusters.shared is not None else options
    write_notes(folder, {**asdict(config), **effective.intervals(), "isolated": isolated})
    done = 0
    while done < config.runs:
        reporter.step(task, "starting a cluster")
        with clusters.cluster(options) as cluster:
            alive = [n for n in cluster.alive() if n.startswith("fog")]
            if len(alive) < 2:
                raise BenchError(
                    "E2 needs two live fog nodes (one to kill, one to restore on)",
                    received=", ".join(alive) or "none",
                )
            if config.warm_up and clusters.shared is None:
                reporter.step(task, "warming up the fog nodes")
                warm_up(cluster, alive, cluster.home / "runs", config.timeout_s)
            rtts = cluster.rtt_ms()
            pgids = cluster.pgids()
            for origin, target in itertools.pairwise(alive):
                if done >= config.runs:
                    break
                name = f"e2-r{done + 1:03d}"
                method = config.methods[done % len(config.methods)]
                reporter.step(task, f"{name}: {origin} -> {target} ({method})")
                waits = (rng.uniform(*config.kill_after_s), rng.uniform(*config.restore_wait_s))
                groups = {"target": pgids[target], "edge": pgids[EDGE]}
                row, samples = _one_run(
                    cluster, name, (origin, target), config, waits, groups, method
                )
                row.update(
                    run=name, method=method, origin=origin, target=target,
                    isolated=cluster.options.isolate,
                    rtt_ms=rtts.get(target), state_mib=config.state_mib,
                )  # fmt: skip
                runs.append(row)
                cpu_log.extend({"run": name, **s} for s in samples)
                _say(reporter, row)
                reporter.advance(task)
                done += 1
            if clusters.shared is not None:
                break  # a shared cluster's killed nodes do not come back


def _wait_central(cluster: BenchCluster, pipeline: str, timeout_s: float) -> dict[str, Any]:
    """Wait until the aggregate has a central checkpoint; returns its summary."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entry = cluster.checkpoints(pipeline, "aggregate")
        if entry and entry.get("central"):
            return dict(entry["central"])
        time.sleep(0.5)
    raise BenchError(f"{pipeline}: no central checkpoint of the aggregate in {timeout_s:.0f} s")


def _wait_standby(cluster: BenchCluster, pipeline: str, node: str, timeout_s: float) -> None:
    """Wait until the aggregate's standby runs on ``node`` and its cap has been raised."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        standby = cluster.element(pipeline, "aggregate").get("standby") or {}
        if (
            standby.get("node") == node
            and standby.get("state") == "running"
            and standby.get("lag_events") is not None
        ):
            return
        time.sleep(0.5)
    raise BenchError(f"{pipeline}: no standby of the aggregate on {node} in {timeout_s:.0f} s")


def _one_run(
    cluster: BenchCluster,
    name: str,
    nodes: tuple[str, str],
    config: E2Config,
    waits: tuple[float, float],
    groups: dict[str, int],
    method: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Deploy on ``origin``, kill it, restore on ``target`` (``nodes``) by ``method``,
    compare. A failed step is the run's ``status``/``error``, never an exception."""
    origin, target = nodes
    kill_after, restore_wait = waits
    sampler = CpuSampler(groups)
    with Case1Run(
        cluster, name, rate=config.rate, seed=config.seed, agg_node=origin,
        pad_bytes=config.state_mib * MIB,
        auto_recovery=False,  # the bench restores, after its own random wait
        standby=target if method == "standby" else None,
        row={"status": "error", "kill_after_s": round(kill_after, 2),
             "restore_wait_s": round(restore_wait, 2)},
        lead_s=config.lead_s,
    ) as run:  # fmt: skip
        t0 = run.t0
        run.deploy()
        with sampler:
            if wait_rows(cluster, name, 1, config.timeout_s) < 1:
                raise BenchError(f"{name}: no output within {config.timeout_s:.0f} s")
            _wait_central(cluster, name, config.timeout_s)
            if method == "standby":
                _wait_standby(cluster, name, target, config.timeout_s)
            time.sleep(kill_after)
            killed_at = time.time()
            cluster.kill(origin)
            time.sleep(restore_wait)
            start = time.time()
            report = cluster.operation(name, "aggregate", "restore", {"target": target})
            run.finish_input()
            end = start + float(report.get("total_ms") or 0.0) / 1000.0
            run.check(config.timeout_s)
            run.row.update(
                {k: report.get(k) for k in (
                    "status", "error", "epoch", "checkpoint", "checkpoint_age_ms", "state_bytes",
                    "reprocessed_events", "reprocess_ms", "intermediate_events",
                    "intermediate_ms", "total_ms", "live_ms", "standby_lag_events")},
                kill_s=round(killed_at - t0, 2), restore_start_s=round(start - t0, 2),
                restore_end_s=round(end - t0, 2),
                cpu_target_before_pct=sampler.mean("target", t0, killed_at),
                cpu_target_restore_pct=sampler.mean("target", start, end),
                cpu_target_peak_pct=sampler.peak("target", start, end),
                machine_busy_pct=sampler.mean("machine", t0, time.time()),
            )  # fmt: skip
    return run.row, sampler.rows(run.t0)


def _say(reporter: Reporter, row: dict[str, Any]) -> None:
    verdict_text = "[green]consistent[/]" if row.get("consistent") else "[red]INCONSISTENT[/]"
    reporter.note(
        f"{row['run']}: {row.get('status')} on {row.get('target')}: reprocessed "
        f"{row.get('reprocessed_events')} in {row.get('reprocess_ms')} ms, intermediate "
        f"{row.get('intermediate_events')} in {row.get('intermediate_ms')} ms; {verdict_text}"
        + (f" ({one_line(str(row['error']), 120)})" if row.get("error") else "")
    )


# -- results (from the CSV files only) --------------------------------------------------------


def ok(row: dict[str, str]) -> bool:
    """A run counts only if the PE was restored and the output was consistent."""
    return row["status"] == "restored" and truthy(row["consistent"])


#: E2's two series: label, events column, ms column, the thesis's ms per event.
_SERIES = (
    ("reprocessed", "reprocessed_events", "reprocess_ms", thesis.E2_REPROCESS_MS_PER_EVENT),
    ("intermediate", "intermediate_events", "intermediate_ms",
     thesis.E2_INTERMEDIATE_MS_PER_EVENT),
)  # fmt: skip


def _by_method(rows: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """Runs per restore method, in :data:`METHODS` order (runs from before methods existed
    restored from checkpoints). Each is fitted apart: a standby re-derives a batch where a
    checkpoint restore starts a query, and one line over both measures neither."""
    grouped = {m: [r for r in rows if (r.get("method") or "checkpoint") == m] for m in METHODS}
    return {m: mine for m, mine in grouped.items() if mine}


def _fit(rows: list[dict[str, str]], events: str, ms: str) -> dict[str, Any]:
    """Least squares ``ms = slope * events + intercept`` over runs with events > 0 and a
    time measured for them, and the mean time per event (sum of ms / sum of events). (A
    standby's promotion re-derives its few events in its next batch, live: no time of its
    own is measured for them.)"""
    pairs = [
        (float(r[events]), float(r[ms]))
        for r in rows
        if r[events] and float(r[events]) > 0 and r[ms] and float(r[ms]) > 0
    ]
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    line = least_squares(xs, ys)
    return {
        "n": len(pairs),
        "range": (min(xs), max(xs)) if xs else None,
        "slope": line[0] if line else None,
        "intercept": line[1] if line else None,
        "r2": line[2] if line else None,
        "per_event": sum(ys) / sum(xs) if xs else None,
    }


def section(folder: Path) -> str | None:
    """E2's part of ``results.md``: regression lines beside the thesis's ms per event."""
    rows = read_rows(folder / "runs.csv")
    if not rows:
        return None
    settings = read_notes(folder)["settings"]
    good = [r for r in rows if ok(r)]
    out = [
        "## E2 - restoration (thesis §6.2.2, Fig. 22-23)",
        "",
        f"Case 1 with {settings.get('state_mib')} MiB of added state, one event every "
        f"{1000 / float(settings.get('rate', 1)):.0f} ms, node-level checkpoints every "
        f"{settings.get('checkpoint_interval_s')} s, central pulls every "
        f"{settings.get('central_interval_s')} s. The aggregate's node is killed (SIGKILL of "
        f"its process group) {settings.get('kill_after_s')} s after its first central "
        f"checkpoint, and the aggregate restored on another fog node "
        f"{settings.get('restore_wait_s')} s later. Links "
        f"{'isolated' if settings.get('isolated') else 'loopback (no isolation)'}. "
        "Least-squares lines over the runs that were restored **and** consistent; "
        "*per event* is total ms / total events. The thesis reports the average time per "
        "event. Our reprocessing time starts when the restored query is started on the "
        "target (its Python workers start per query) and ends when it has re-processed up "
        "to what the old instance had emitted, in one micro-batch: the fixed start-up cost "
        "is the intercept, the slope is the cost per event.",
        "",
        f"Runs: {len(rows)}; restored and consistent: {len(good)} "
        f"(thesis: {thesis.E2_RUNS.cite()}).",
        "",
        "| events | runs with > 0 | events range | slope ms/event | intercept ms | r² | "
        "per event ms | thesis |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_method = _by_method(good)
    for label, events, ms, anchor in _SERIES:
        for method, mine in by_method.items():
            fit = _fit(mine, events, ms)
            if not fit["n"] and len(by_method) > 1:
                continue  # nothing of this method's to fit (see _fit)
            span = f"{fit['range'][0]:.0f}-{fit['range'][1]:.0f}" if fit["range"] else "-"
            named = label if len(by_method) == 1 else f"{label}, {method}"
            out.append(
                f"| {named} | {fit['n']} | {span} | {fmt(fit['slope'], 3)} | "
                f"{fmt(fit['intercept'], 0)} | {fmt(fit['r2'], 2)} | "
                f"{fmt(fit['per_event'], 3)} | {anchor.cite()} |"
            )
    out += _methods_table(rows)
    if len(good) < 10:
        out += [
            "",
            f"Only {len(good)} run(s): too few for the slope to separate the per-event cost "
            "from the start-up cost (`fogshift bench e2` runs 100).",
        ]
    out += [
        "",
        "| restore total ms | checkpoint age ms | CPU target before kill | CPU target during "
        "restore | peak | thesis | machine busy |",
        "|---|---|---|---|---|---|---|",
        "| " + " | ".join([
            fmt_mean_std((num(r["total_ms"]) for r in good), 0),
            fmt_mean_std((num(r["checkpoint_age_ms"]) for r in good), 0),
            fmt_mean_std((num(r["cpu_target_before_pct"]) for r in good), 0, " %"),
            fmt_mean_std((num(r["cpu_target_restore_pct"]) for r in good), 0, " %"),
            fmt_mean_std((num(r["cpu_target_peak_pct"]) for r in good), 0, " %"),
            thesis.E2_CPU_RESTORE_PCT.cite(),
            fmt_mean_std((num(r["machine_busy_pct"]) for r in rows), 0, " %"),
        ]) + " |",
        "",
        "CPU: the restore target's process group, % of one core.",
    ]  # fmt: skip
    for r in rows:
        if not ok(r):
            out.append(
                failure_line(
                    r, f"failed: status {r['status'] or '-'}, consistent {r['consistent']}"
                )
            )
    out += ["", f"![E2]({NAME}/e2.png)", ""]
    return "\n".join(out)


def _methods_table(rows: list[dict[str, str]]) -> list[str]:
    """Checkpoint restore beside standby promotion (issue #13), when the run had both."""
    methods = [m for m in METHODS if any((r.get("method") or "checkpoint") == m for r in rows)]
    if len(methods) < 2:
        return []
    out = [
        "",
        "Checkpoint restore beside hot-standby promotion (runs take turns). *Live* runs from "
        "the restore's start until the new instance may emit new output (a standby's gate "
        "opens; a checkpoint restore's cap passes what the killed instance had emitted); "
        "*total* until it has caught up with the input that arrived while it was down. A "
        "standby's state was copied when it started, long before: nothing moves during its "
        "restore.",
        "",
        "| method | runs ok / all | live ms | total ms | re-derived events | state moved "
        "during the restore, bytes |",
        "|---|---|---|---|---|---|",
    ]
    for method in methods:
        mine = [r for r in rows if (r.get("method") or "checkpoint") == method]
        good = [r for r in mine if ok(r)]
        out.append(
            f"| {method} | {len(good)} / {len(mine)} | "
            f"{fmt_mean_std((num(r['live_ms']) for r in good), 0)} | "
            f"{fmt_mean_std((num(r['total_ms']) for r in good), 0)} | "
            f"{fmt_mean_std((num(r['reprocessed_events']) for r in good), 0)} | "
            f"{fmt_mean_std((num(r['state_bytes']) for r in good), 0)} |"
        )
    return out


def plot(folder: Path) -> list[Path]:
    """``e2.png``: ms vs events with least-squares and thesis lines (Fig. 22), and the CPU
    load of one restore (Fig. 23)."""
    from fogshift.bench.plotting import COLOURS, figure, save

    rows = read_rows(folder / "runs.csv")
    if not rows:
        return []
    good = [r for r in rows if ok(r)]
    fig, axes = figure(ncols=3, width=4.8, height=4)
    by_method = _by_method(good)
    for ax, (label, events, ms, anchor) in zip(axes[0][:2], _SERIES, strict=True):
        top = max((float(r[events]) for r in good if r[events]), default=1.0)
        for method, mine in by_method.items():
            named = "runs" if len(by_method) == 1 else method
            xs = [float(r[events]) for r in mine if r[events]]
            ys = [float(r[ms]) for r in mine if r[events]]
            dots = ax.scatter(xs, ys, s=14, label=named)
            fit = _fit(mine, events, ms)
            if fit["slope"] is not None:
                ax.plot([0, top], [fit["intercept"], fit["intercept"] + fit["slope"] * top],
                        color=dots.get_facecolor()[0],
                        label=f"{named}: least squares, {fit['slope']:.2f} ms/event")  # fmt: skip
        ax.plot([0, top], [0, anchor.value * top], "--", color=COLOURS["thesis"],
                label=f"thesis: {anchor.value} ms/event")  # fmt: skip
        ax.set_xlabel(f"{label} events")
        ax.set_ylabel("ms")
        ax.set_title(f"E2 {label}")
        ax.legend(fontsize=7)
    ax = axes[0][2]
    timed = [r for r in good if r["kill_s"] and r["restore_start_s"] and r["restore_end_s"]]
    example = max(timed, key=lambda r: float(r["reprocessed_events"] or 0), default=None)
    if example is not None:
        samples = [s for s in read_rows(folder / "cpu.csv") if s["run"] == example["run"]]
        ts = [float(s["t_s"]) for s in samples]
        ax.plot(ts, [float(s["target_pct"]) for s in samples], color=COLOURS["target"],
                label=f"target ({example['target']})")  # fmt: skip
        ax.plot(ts, [float(s["machine_pct"]) for s in samples], color=COLOURS["machine"],
                linestyle=":", label="machine (% of all)")  # fmt: skip
        ax.axvline(float(example["kill_s"]), color="red", label="kill")
        ax.axvspan(float(example["restore_start_s"]), float(example["restore_end_s"]),
                   alpha=0.2, color="orange", label="restore")  # fmt: skip
        ax.set_title(f"CPU over run {example['run']}")
        ax.set_xlabel("s since deploy")
        ax.set_ylabel("% of one core")
        ax.legend(fontsize=7)
    return [save(fig, folder / "e2.png")]
