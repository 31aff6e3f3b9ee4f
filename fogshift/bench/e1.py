"""E1 - live migration: phases, total time and downtime by link delay, state size and mode.

As in the thesis (§6.2.1): Case 1 with the source and sink on the "desktop" node ``cloud`` and
the aggregate (window 10, one event every 300 ms) on a "Raspberry Pi" node; after a random
wait from the moment its output has shown its steady rhythm (``steady_batches`` intervals
between batches after its first second, so the output gap has the origin's own interval to be
measured against), the aggregate is live-migrated to ``cloud`` (``fogshift migrate
--json``). Series: the link profile of the origin (n0, n100, n500; one origin node per profile,
``fog-n100`` has ``--link fog-n100=n100``) x added state (0, 1, 5, 50 MiB) x mode
(``precopy``, the default, and ``literal``, the thesis's procedure), ``runs`` times each,
interleaved. Every run's whole output is compared with the reference. The CPU load of the
origin's and the target's process groups is sampled over each run.

Delayed links need ``fogshift up --isolate --link NODE=PROFILE`` (network namespaces, a
delaying relay); when it does not exist the delayed series are not run and ``notes.json`` says
so - no delay is ever emulated by sleeping. The relay delays each direction, so the measured
RTT of ``n100`` is about 200 ms (the thesis's ``tc`` delay was added once per round trip).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fogshift.bench import gaps, thesis
from fogshift.bench.base import (
    MIB,
    ClusterRunConfig,
    Reporter,
    RunLog,
    failure_line,
    fmt,
    fmt_mean_std,
    mean_std,
    num,
    read_notes,
    read_rows,
    truthy,
    write_notes,
)
from fogshift.bench.cluster import (
    BenchCluster,
    ClusterOptions,
    Clusters,
    delay_of,
    isolation_available,
)
from fogshift.bench.exceptions import BenchError
from fogshift.bench.probes import CpuSampler
from fogshift.bench.workload import Case1Run, wait_rows, warm_up
from fogshift.common.text import one_line

NAME = "e1"
TARGET = "cloud"
PHASES = ("prepare", "pause", "state", "invoke", "finalize")
#: A precopy's or handover's prepare, step by step (``MigrationReport.prepare_ms``).
PREPARE_STEPS = ("copy", "warm", "converge")
LINKS = {
    True: "isolated (network namespaces, `fogshift up --isolate`)",
    False: "loopback (no isolation)",
}

RUN_FIELDS = (
    "run", "profile", "delay", "isolated", "rtt_ms", "state_mib", "mode", "status", "error",
    "state_bytes", *(f"{p}_ms" for p in PHASES), "phases123_ms", "total_ms", "downtime_ms",
    "caught_up_events", "events", "consistent", "problems", "wait_s", "mig_start_s",
    "mig_end_s", "cpu_origin_before_pct", "cpu_origin_migration_pct",
    "cpu_target_migration_pct", "cpu_origin_peak_pct", "machine_busy_pct",
    *(f"{m}_ms" for m in ("steady_gap", "max_gap", "output_gap", "steady_p99", "window_p99",
                          "added_p99", "switch_gap")),
    "shipped_bytes", *(f"prepare_{s}_ms" for s in PREPARE_STEPS),
)  # fmt: skip
CPU_FIELDS = ("run", "t_s", "origin_pct", "target_pct", "machine_pct")


@dataclass(frozen=True)
class E1Config(ClusterRunConfig):
    """Settings of E1.

    Attributes:
        runs: Runs per series (the thesis: 10).
        sizes_mib: Added state in MiB.
        profiles: Link profiles of the origin node (``n0`` runs on loopback when isolation
            is unavailable).
        modes: Migration modes.
        delayed_series: ``(MiB, mode)`` series run on the profiles other than ``n0``;
            ``None`` runs every size and mode there too.
        rate: Events per second (the thesis: one every 300 ms).
        wait_s: Range of the random wait between the origin's steady rhythm and the
            migration (module doc).
        steady_batches: Intervals between the origin's batches to see before that wait.
        lead_s: How far ahead of its schedule each run's input is written, and so how
            long its stream goes on after the run's action
            (:class:`~fogshift.bench.workload.InputFeeder`).

    ``warm_up`` is off: the first run of every round is a precopy run (``modes`` order),
    whose ``prepare`` pays the target's first query outside the measured phases, and an
    origin's first query only delays its first output.
    """

    runs: int = thesis.E1_RUNS_PER_SERIES
    sizes_mib: tuple[int, ...] = thesis.E1_STATE_MIB
    profiles: tuple[str, ...] = ("n0", "n100", "n500")
    modes: tuple[str, ...] = ("precopy", "literal")
    delayed_series: tuple[tuple[int, str], ...] | None = None
    rate: float = thesis.thesis_rate_per_s()
    wait_s: tuple[float, float] = (2.0, 10.0)
    steady_batches: int = 3
    lead_s: float = 4.0
    seed: int = 1

    @classmethod
    def quick(cls) -> E1Config:
        """One run per series, no 50 MiB series; delayed links: 1 MiB, thesis's procedure."""
        return cls(runs=1, sizes_mib=(0, 1, 5), delayed_series=((1, "literal"),), wait_s=(1.0, 3.0))

    def series(self, profile: str) -> list[tuple[int, str]]:
        """The ``(MiB, mode)`` series of one link profile."""
        if profile != "n0" and self.delayed_series is not None:
            return list(self.delayed_series)
        return [(size, mode) for size in self.sizes_mib for mode in self.modes]


def origin_name(profile: str) -> str:
    """The node whose link has ``profile`` (``fog-n100``, ``fog-10mbit-n100``)."""
    return "fog-" + re.sub(r"[^A-Za-z0-9]+", "-", profile).strip("-")


def run(config: E1Config, clusters: Clusters, out: Path, reporter: Reporter) -> None:
    """Run E1 and write ``out/e1/runs.csv``, ``cpu.csv`` and ``notes.json``.

    One cluster: the target ``cloud`` and one origin node per link profile, so every profile
    shares one start and one warm-up; the runs of all profiles are interleaved.
    """
    folder = out / NAME
    runs = RunLog(folder / "runs.csv", RUN_FIELDS)
    cpu_log = RunLog(folder / "cpu.csv", CPU_FIELDS)
    isolated = clusters.shared.options.isolate if clusters.shared else isolation_available()
    origins, skipped, options = plan_cluster(config, clusters, isolated)
    write_notes(folder, {**asdict(config), **options.intervals(), "isolated": isolated}, skipped)
    for line in skipped:
        reporter.note(f"[yellow]e1: not run[/] {line}")
    if not origins:
        return
    plan = [
        (index, profile, size, mode)
        for index in range(config.runs)
        for profile in origins
        for size, mode in config.series(profile)
    ]
    task = reporter.task("e1 live migration", len(plan))
    rng = random.Random(config.seed)
    reporter.step(task, "starting the cluster")
    with clusters.cluster(options) as cluster:
        rtts = cluster.rtt_ms()
        if config.warm_up:
            reporter.step(task, "warming up the nodes")
            warm_up(cluster, [TARGET, *origins.values()], cluster.home / "runs", config.timeout_s)
        pgids = cluster.pgids()
        for index, profile, size, mode in plan:
            origin = origins[profile]
            name = f"e1-{origin.removeprefix('fog-')}-s{size}-{mode}-r{index + 1:02d}"
            reporter.step(task, f"{name}: running")
            groups = {"origin": pgids[origin], "target": pgids[TARGET]}
            row, samples = _one_run(
                cluster, name, origin, size, mode, config, rng.uniform(*config.wait_s), groups
            )
            row.update(
                run=name, profile=profile, delay=delay_of(profile), isolated=options.isolate,
                rtt_ms=rtts.get(origin), state_mib=size, mode=mode,
            )  # fmt: skip
            runs.append(row)
            cpu_log.extend({"run": name, **s} for s in samples)
            _say(reporter, row)
            reporter.advance(task)


def plan_cluster(
    config: E1Config, clusters: Clusters, isolated: bool
) -> tuple[dict[str, str], list[str], ClusterOptions]:
    """The origin node of each profile that can run here, the profiles that cannot (with the
    reason) and the cluster to ask ``clusters`` for (a shared cluster: itself)."""
    for profile in config.profiles:
        delay_of(profile)  # refuse a bad profile before any cluster starts
    # Without isolation n0 runs on loopback: no delay to add, none to emulate.
    runnable = [p for p in config.profiles if isolated or p == "n0"]
    skipped = [
        f"link profile {p}: `fogshift up --isolate` is not available on this machine, and "
        "the bench never emulates a delay itself"
        for p in config.profiles
        if p not in runnable
    ]
    if clusters.shared is not None:
        shared = clusters.shared
        origins: dict[str, str] = {}
        for profile in runnable:
            node = next(
                (n for n in shared.alive()
                 if n != TARGET and shared.options.profile_of(n) == profile),
                None,
            )  # fmt: skip
            if node is None:
                skipped.append(f"link profile {profile}: no node of the shared cluster has it")
            else:
                origins[profile] = node
        return origins, skipped, shared.options
    origins = {p: origin_name(p) for p in runnable}
    options = ClusterOptions(
        (TARGET, *origins.values()), config.checkpoint_interval_s, config.central_interval_s
    )
    if isolated:
        options = replace(options, isolate=True, links=tuple((n, p) for p, n in origins.items()))
    return origins, skipped, options


def _one_run(
    cluster: BenchCluster,
    name: str,
    origin: str,
    size_mib: int,
    mode: str,
    config: E1Config,
    wait_s: float,
    groups: dict[str, int],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Deploy, wait, migrate, finish the input, compare. Never raises a FogshiftError: a
    failed step is the run's ``status``/``error``."""
    sampler = CpuSampler(groups)
    with Case1Run(
        cluster, name, rate=config.rate, seed=config.seed, agg_node=origin,
        pad_bytes=size_mib * MIB, row={"wait_s": round(wait_s, 2), "status": "error"},
        lead_s=config.lead_s,
    ) as run:  # fmt: skip
        t0 = run.t0
        run.deploy()
        with sampler:
            if wait_rows(cluster, name, 1, config.timeout_s) < 1:
                raise BenchError(f"{name}: no output within {config.timeout_s:.0f} s")
            _wait_steady(cluster, name, config.steady_batches, config.timeout_s)
            time.sleep(wait_s)
            called = time.time()
            report = cluster.operation(
                name, "aggregate", "migrate", {"target": TARGET, "mode": mode}
            )
            run.finish_input()
            phases = {p: report.get("phases_ms", {}).get(p) for p in PHASES}
            # The phases run back to back from the POST; the report comes back later (after
            # the downtime is measured), so the migration's window ends with its phases (a
            # handover's own ones too: follow, fence).
            start = called
            end = called + sum(v for v in (report.get("phases_ms") or {}).values() if v) / 1000
            run.check(config.timeout_s)
            # What the sink's side saw: the aggregate's output gap and added latency.
            emitted = gaps.outputs(cluster.client, name, "aggregate", "source")
            run.row.update(gaps.disruption(emitted, start, end).as_row())
            run.row.update(
                status=report.get("status"), error=report.get("error"),
                state_bytes=report.get("state_bytes"), shipped_bytes=report.get("shipped_bytes"),
                **{f"{p}_ms": v for p, v in phases.items()},
                **{f"prepare_{s}_ms": (report.get("prepare_ms") or {}).get(s)
                   for s in PREPARE_STEPS},
                # (All three or none: a handover has no pause or state phase, and its invoke
                # alone stood beside the thesis's pause + state + invoke.)
                phases123_ms=None if None in (phases["pause"], phases["state"], phases["invoke"])
                else _sum(phases["pause"], phases["state"], phases["invoke"]),
                total_ms=phases_total(report),
                downtime_ms=report.get("downtime_ms"),
                caught_up_events=report.get("caught_up_events"),
                mig_start_s=round(start - t0, 2), mig_end_s=round(end - t0, 2),
                cpu_origin_before_pct=sampler.mean("origin", t0, start),
                cpu_origin_migration_pct=sampler.mean("origin", start, end),
                cpu_target_migration_pct=sampler.mean("target", start, end),
                cpu_origin_peak_pct=sampler.peak("origin", start, end),
                machine_busy_pct=sampler.mean("machine", t0, time.time()),
            )  # fmt: skip
    return run.row, sampler.rows(run.t0)


def _wait_steady(cluster: BenchCluster, name: str, batches: int, timeout_s: float) -> None:
    """Wait until the aggregate's output shows ``batches`` intervals between batches after
    its first second (over a 1 s RTT link, three take ~8 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        emitted = gaps.outputs(cluster.client, name, "aggregate", "source")
        if gaps.batches_after_warm(emitted) >= batches:
            return
        time.sleep(0.5)
    raise BenchError(f"{name}: fewer than {batches} batches within {timeout_s:.0f} s")


def _gap_is(settings: dict[str, Any]) -> str:
    """What a run's output gap measured (runs before 2026-11-27: against all outputs'
    steady interval)."""
    if not settings.get("steady_batches"):
        return (
            "the longest interval between two of the aggregate's outputs around the "
            "migration minus the steady interval"
        )
    return (
        "the most an interval between two of the aggregate's outputs around the migration "
        "exceeded the steady interval of the instance that emitted its first output (the "
        "origin's own rhythm for the origin's intervals and the switch, the target's for its)"
    )


def _wait_from(settings: dict[str, Any]) -> str:
    """Where a run's random wait started (runs before 2026-11-27 waited from the first output)."""
    batches = settings.get("steady_batches")
    if not batches:
        return "its first output"
    return f"{batches} intervals between the origin's batches (after its first second of output)"


def phases_total(report: dict[str, Any]) -> float | None:
    """A migration's every phase, summed: a handover's ``follow`` and ``fence`` too, which
    :data:`PHASES` leaves out (its total was short by them, ~2 s over a 1 s-RTT link)."""
    return _sum(*(report.get("phases_ms") or {}).values())


def phases123(row: dict[str, str]) -> float | None:
    """A run's pause + state + invoke (what the thesis reports as downtime), from its three
    phases: ``None`` without one of them (a handover's: rows written before 2026-12-07 held
    its invoke alone as ``phases123_ms``)."""
    parts = [num(row.get(f"{p}_ms")) for p in ("pause", "state", "invoke")]
    return None if None in parts else _sum(*parts)


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present), 1) if present else None


def _say(reporter: Reporter, row: dict[str, Any]) -> None:
    verdict_text = "[green]consistent[/]" if row.get("consistent") else "[red]INCONSISTENT[/]"
    reporter.note(
        f"{row['run']}: {row.get('status')}, downtime {row.get('downtime_ms')} ms, "
        f"phases 1-3 {row.get('phases123_ms')} ms, total {row.get('total_ms')} ms, output gap "
        f"{row.get('output_gap_ms')} ms, added p99 {row.get('added_p99_ms')} ms; "
        f"{verdict_text}" + (f" ({one_line(row['error'], 120)})" if row.get("error") else "")
    )


# -- results (from the CSV files only) --------------------------------------------------------


def _groups(rows: list[dict[str, str]]) -> dict[tuple[str, int, str], list[dict[str, str]]]:
    """Runs by series ``(profile, state MiB, mode)``, in the order they first ran."""
    out: dict[tuple[str, int, str], list[dict[str, str]]] = {}
    for row in rows:
        out.setdefault((row["profile"], int(row["state_mib"]), row["mode"]), []).append(row)
    return out


def ok(row: dict[str, str]) -> bool:
    """A run counts only if it migrated and its output was consistent (a fast but
    inconsistent run is a failure)."""
    return row["status"] == "migrated" and truthy(row["consistent"])


#: Issue #13's bound on the output gap beyond one round trip and one steady batch (ms).
GAP_SLACK_MS = 50.0


def gap_within_target(row: dict[str, str]) -> bool | None:
    """Whether a run's output gap is at most one RTT + one steady batch + 50 ms (issue
    #13), the steady batch being the steady interval between outputs; ``None``: unknown."""
    gap, rtt, steady = (num(row.get(k)) for k in ("output_gap_ms", "rtt_ms", "steady_gap_ms"))
    if gap is None or rtt is None or steady is None:
        return None
    return gap <= rtt + steady + GAP_SLACK_MS


def section(folder: Path) -> str | None:
    """E1's part of ``results.md``: one table row per series, beside the thesis."""
    rows = read_rows(folder / "runs.csv")
    notes = read_notes(folder)
    if not rows and not notes["skipped"]:
        return None
    settings = notes["settings"]
    out = [
        "## E1 - live migration (thesis §6.2.1, Fig. 20-21)",
        "",
        f"Case 1, one event every {1000 / float(settings.get('rate', 1)):.0f} ms, window "
        f"{thesis.WINDOW}; the aggregate migrates from the origin (its link: *link*, RTT "
        "measured by `fogshift net show`) to cloud after a random wait of "
        f"{settings.get('wait_s')} s from {_wait_from(settings)}; "
        f"{settings.get('runs')} run(s) per "
        f"series; links {LINKS[bool(settings.get('isolated'))]}; node-level checkpoints "
        f"every {settings.get('checkpoint_interval_s')} s, central pulls every "
        f"{settings.get('central_interval_s')} s. "
        "Times are means ± standard deviation over the runs that migrated **and** were "
        "consistent (`ok`); *phases 1-3* (pause + state + invoke) is what the thesis reports "
        'as downtime ("an upper limit for the PE downtime"); *downtime* is measured: from '
        "the pause until the target committed its first batch beyond the pause position. "
        "What the consumers saw, by the broker's store times (`fogshift/bench/gaps.py`): "
        f"*output gap* is {_gap_is(settings)}; *switch gap* is the interval between the "
        "origin's last output and the target's first (the first under the new epoch); "
        "*gap ≤ target* counts the runs whose "
        "output gap is at most one RTT + one steady interval + 50 ms (issue #13); "
        "*added p99* is the p99 per-hop latency "
        "(output stored minus its input event stored) of the outputs during the migration "
        "(and 1 s after, and the first output after it in any case) minus the p99 of the "
        "others. "
        "CPU: the origin node's process group, % of one core.",
        "",
        "| link | RTT ms | state | mode | ok / runs | pause ms | state ms | invoke ms | "
        "finalize ms | prepare s | phases 1-3 ms | downtime ms | thesis downtime | "
        "output gap ms | switch gap ms | gap ≤ target | added p99 ms | "
        "CPU origin during migration | machine busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (profile, mib, mode), group in _groups(rows).items():
        good = [r for r in group if ok(r)]
        anchor = thesis.E1_DOWNTIME_MS.get((delay_of(profile), mib))
        prepare = [num(r["prepare_ms"]) for r in good]
        out.append(
            "| " + " | ".join([
                profile, fmt(mean_std(num(r["rtt_ms"]) for r in group)[0], 1),
                f"{mib} MiB", mode, f"{len(good)} / {len(group)}",
                *(fmt_mean_std((num(r[f"{p}_ms"]) for r in good), 0) for p in PHASES[1:]),
                fmt_mean_std(_kilo(prepare), 1) if mode != "literal" else "-",
                fmt_mean_std((phases123(r) for r in good), 0),
                fmt_mean_std((num(r["downtime_ms"]) for r in good), 0),
                anchor.cite() if anchor else "-",
                # Runs from before these columns existed have none: "-".
                fmt_mean_std((num(r.get("output_gap_ms")) for r in good), 0),
                fmt_mean_std((num(r.get("switch_gap_ms")) for r in good), 0),
                _within(good),
                fmt_mean_std((num(r.get("added_p99_ms")) for r in good), 0),
                fmt_mean_std((num(r["cpu_origin_migration_pct"]) for r in good), 0, " %"),
                fmt_mean_std((num(r["machine_busy_pct"]) for r in group), 0, " %"),
            ]) + " |"
        )  # fmt: skip
    out += _prepare_table(rows)
    failures = [r for r in rows if not ok(r)]
    out.append("")
    out.append(
        f"Consistent runs: {sum(truthy(r['consistent']) for r in rows)} of {len(rows)} "
        f"(thesis: {thesis.E1_CONSISTENT_RUNS.cite()}, all consistent)."
    )
    for r in failures:
        out.append(
            failure_line(r, f"failed: status {r['status'] or '-'}, consistent {r['consistent']}")
        )
    out += [f"- not run: {s}" for s in notes["skipped"]]
    out += ["", f"![E1 phases]({NAME}/e1.png)", "", f"![E1 CPU]({NAME}/e1_cpu.png)", ""]
    return "\n".join(out)


def _prepare_table(rows: list[dict[str, str]]) -> list[str]:
    """Where a precopy's or handover's ``prepare`` went (runs that recorded its steps)."""
    groups = {
        key: [r for r in group if ok(r) and r.get("prepare_copy_ms")]
        for key, group in _groups(rows).items()
        if key[2] != "literal"
    }
    groups = {key: good for key, good in groups.items() if good}
    if not groups:
        return []
    out = [
        "",
        "*Prepare* step by step: *copy* fetches the origin's checkpoint (a warm copy, without "
        "the files the central store holds: *shipped*) and installs it on the target; *warm* "
        "starts the target until it has re-run the copy's last batch (workers up, state "
        "loaded); *converge* lets it follow the origin up to where it got. The issue's "
        "target: a warm target "
        "within 5 s.",
        "",
        "| link | state | mode | ok runs | prepare s | copy s | warm s | converge s | "
        "shipped KB | of a checkpoint of KB | prepare ≤ 5 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (profile, mib, mode), good in groups.items():
        seconds = [
            fmt_mean_std(_kilo(num(r[f"{c}_ms"]) for r in good), 1)
            for c in ("prepare", *(f"prepare_{s}" for s in PREPARE_STEPS))
        ]
        prepares = [v for v in (num(r["prepare_ms"]) for r in good) if v is not None]
        out.append(
            "| " + " | ".join([
                profile, f"{mib} MiB", mode, str(len(good)), *seconds,
                fmt_mean_std(_kilo(num(r.get("shipped_bytes")) for r in good), 0),
                fmt_mean_std(_kilo(num(r["state_bytes"]) for r in good), 0),
                f"{sum(v <= 5000 for v in prepares)} / {len(prepares)}",
            ]) + " |"
        )  # fmt: skip
    return out


def _within(good: list[dict[str, str]]) -> str:
    """``met / measured`` of :func:`gap_within_target` ("-" when no run measured it)."""
    verdicts = [v for v in map(gap_within_target, good) if v is not None]
    return f"{sum(verdicts)} / {len(verdicts)}" if verdicts else "-"


def plot(folder: Path) -> list[Path]:
    """``e1.png`` (phases and downtime per series, Fig. 20) and ``e1_cpu.png`` (Fig. 21)."""
    from fogshift.bench.plotting import COLOURS, figure, log_y, save

    rows = read_rows(folder / "runs.csv")
    if not rows:
        return []
    groups = _groups(rows)
    profiles = list(dict.fromkeys(k[0] for k in groups))
    fig, axes = figure(ncols=len(profiles), width=5.5, height=4.5)
    for ax, profile in zip(axes[0], profiles, strict=True):
        keys = [k for k in groups if k[0] == profile]
        labels = []
        shown: set[str] = set()
        drawn: list[float] = []  # (what the y axis shows: its scale)

        def once(label: str, shown: set[str] = shown) -> str | None:
            """The legend label the first time it is drawn on these axes."""
            if label in shown:
                return None
            shown.add(label)
            return label

        for x, key in enumerate(keys):
            good = [r for r in groups[key] if ok(r)]
            bottom = 0.0
            for phase in PHASES[1:]:
                value = mean_std(num(r[f"{phase}_ms"]) for r in good)[0] or 0.0
                ax.bar(x, value, bottom=bottom, color=COLOURS[phase], label=once(phase))
                bottom += value
            drawn.append(bottom)
            _, std, _ = mean_std(phases123(r) for r in good)
            if std is not None:
                ax.errorbar(x, bottom, yerr=std, color="black", capsize=3)
            down = mean_std(num(r["downtime_ms"]) for r in good)[0]
            if down is not None:
                ax.plot(x, down, "D", color="black", label=once("downtime (measured)"))
                drawn.append(down)
            anchor = thesis.E1_DOWNTIME_MS.get((delay_of(profile), key[1]))
            if anchor is not None:
                ax.plot(x, anchor.value, "x", color="red", markersize=9,
                        label=once("thesis downtime"))  # fmt: skip
                drawn.append(anchor.value)
            labels.append(f"{key[1]} MiB\n{key[2]}\n{len(good)}/{len(groups[key])} ok")
        ax.set_xticks(range(len(keys)), labels, fontsize=7)
        log_y(ax, "ms", drawn, "no migration succeeded")
        ax.set_title(f"E1 live migration, link {profile}")
        ax.legend(fontsize=7)
    paths = [save(fig, folder / "e1.png")]
    paths.append(_plot_cpu(folder, rows))
    return paths


def _plot_cpu(folder: Path, rows: list[dict[str, str]]) -> Path:
    from fogshift.bench.plotting import COLOURS, figure, save

    fig, axes = figure(ncols=2, width=6, height=4)
    left, right = axes[0]
    good = [r for r in rows if ok(r)]
    example = max(good, key=lambda r: (int(r["state_mib"]), r["mode"] == "precopy"), default=None)
    if example is not None:
        samples = [s for s in read_rows(folder / "cpu.csv") if s["run"] == example["run"]]
        ts = [float(s["t_s"]) for s in samples]
        for key, label in (("origin_pct", "origin"), ("target_pct", "target (cloud)")):
            colour = COLOURS[key.split("_")[0]]
            left.plot(ts, [float(s[key]) for s in samples], label=label, color=colour)
        left.plot(ts, [float(s["machine_pct"]) for s in samples], label="machine (% of all)",
                  color=COLOURS["machine"], linestyle=":")  # fmt: skip
        left.axvspan(float(example["mig_start_s"]), float(example["mig_end_s"]), alpha=0.2,
                     color="orange", label="migration")  # fmt: skip
        left.set_title(f"CPU over run {example['run']}")
        left.set_xlabel("s since deploy")
        left.set_ylabel("% of one core")
        left.legend(fontsize=7)
    # Like Fig. 21, on the undelayed link (or the first profile if n0 was not run).
    profile = "n0" if any(r["profile"] == "n0" for r in rows) else rows[0]["profile"]
    good = [r for r in good if r["profile"] == profile]
    sizes = sorted({int(r["state_mib"]) for r in good})
    modes = list(dict.fromkeys(r["mode"] for r in good))
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        values = [
            mean_std(
                num(r["cpu_origin_migration_pct"])
                for r in good if int(r["state_mib"]) == size and r["mode"] == mode
            )[0] or 0.0
            for size in sizes
        ]  # fmt: skip
        right.bar([x + i * width for x in range(len(sizes))], values, width, label=mode,
                  color=COLOURS[mode])  # fmt: skip
    right.axhline(thesis.E1_CPU_MIGRATION_PCT.value, color="black", linestyle="--",
                  label=f"thesis, 50 MiB ({thesis.E1_CPU_MIGRATION_PCT.source})")  # fmt: skip
    right.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(sizes))],
                     [f"{s} MiB" for s in sizes])  # fmt: skip
    right.set_ylabel("% of one core")
    right.set_title(f"origin CPU during the migration (mean), link {profile}")
    right.legend(fontsize=7)
    return save(fig, folder / "e1_cpu.png")


def _kilo(values: Iterable[float | None]) -> list[float | None]:
    """``values`` in thousands; a run without the figure stays without it (as 0 it pulled
    the mean down)."""
    return [None if v is None else v / 1000 for v in values]
