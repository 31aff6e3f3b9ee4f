"""E3 — checkpointing: node-level checkpoint cost and central shipping by state size.

The thesis (§6.2.3) timed its PE-level checkpoint (serialise the operator state, store it)
from E1's runs. Here the aggregate of Case 1 runs on ``fog-a`` for ``duration_s`` per added
state size while the bench polls ``/nodes`` (what ``fogshift nodes --json`` shows) and notes
every node-level snapshot and every central checkpoint of it:

* node level (every ``checkpoint_interval_s``): ``took_ms`` — freezing the committed batch
  (``copy_ms``: hard links, from the previous snapshot or the live checkpoint) and digesting
  new files (``hash_ms``) — and the state-store metrics of the batch it froze: Spark serialised that
  batch's state changes and committed them (``commit_ms``, ``commitTimeMs``). Our checkpoint
  of a state is that commit plus the snapshot; its serialisation share is
  ``commit_ms / (commit_ms + took_ms)``.
* central (every ``central_interval_s``): ``shipped_bytes`` beside ``bytes`` — what the
  orchestrator fetched (only files it did not hold) against the whole checkpoint.

Every run's whole output is compared with the reference too.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
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
    mean_std,
    num,
    read_notes,
    read_rows,
    truthy,
    write_notes,
)
from fogshift.bench.cluster import BenchCluster, ClusterOptions, Clusters
from fogshift.bench.exceptions import BenchError
from fogshift.bench.workload import Case1Run, sink_rows, warm_up
from fogshift.common.text import one_line

NAME = "e3"
NODE, EDGE = "fog-a", "cloud"


def _node(clusters: Clusters) -> str:
    """The node the aggregate runs on: ``fog-a``, or on a shared cluster its first live node
    with an undelayed link."""
    if clusters.shared is None:
        return NODE
    shared = clusters.shared
    for name in shared.alive():
        if name != EDGE and shared.options.profile_of(name) == "n0":
            return name
    raise BenchError(
        "E3 needs a node with an undelayed link besides cloud",
        received=", ".join(shared.alive()),
    )


RUN_FIELDS = (
    "run", "state_mib", "status", "error", "events", "node_checkpoints", "central_checkpoints",
    "consistent", "problems",
)  # fmt: skip
CHECKPOINT_FIELDS = (
    "run", "state_mib", "level", "id", "batch", "first", "bytes", "new_bytes", "shipped_bytes",
    "took_ms", "copy_ms", "hash_ms", "commit_ms", "updates_ms", "batch_ms",
)  # fmt: skip


@dataclass(frozen=True)
class E3Config(ClusterRunConfig):
    """Settings of E3.

    Attributes:
        sizes_mib: Added state in MiB.
        duration_s: How long each size runs after its first output.
        rate: Events per second (the thesis's: little state changes per checkpoint).
        lead_s: How far ahead of its schedule each run's input is written, and so how
            long its stream goes on after the run's action
            (:class:`~fogshift.bench.workload.InputFeeder`).

    Central pulls are every 5 s, to see several per run; ``warm_up`` is off: snapshots and
    central pulls do not depend on the query's start.
    """

    sizes_mib: tuple[int, ...] = thesis.E1_STATE_MIB
    duration_s: float = 120.0
    rate: float = thesis.thesis_rate_per_s()
    central_interval_s: float = 5.0
    lead_s: float = 4.0
    seed: int = 3

    @classmethod
    def quick(cls) -> E3Config:
        """No 50 MiB size, 20 s each (four or five checkpoints)."""
        return cls(sizes_mib=(0, 1, 5), duration_s=20.0)


def run(config: E3Config, clusters: Clusters, out: Path, reporter: Reporter) -> None:
    """Run E3 and write ``out/e3/runs.csv``, ``checkpoints.csv`` and ``notes.json``."""
    folder = out / NAME
    runs = RunLog(folder / "runs.csv", RUN_FIELDS)
    checkpoints = RunLog(folder / "checkpoints.csv", CHECKPOINT_FIELDS)
    node = _node(clusters)
    options = ClusterOptions((EDGE, node), config.checkpoint_interval_s, config.central_interval_s)
    task = reporter.task("e3 checkpointing", len(config.sizes_mib))
    reporter.step(task, "starting the cluster")
    with clusters.cluster(options) as cluster:
        write_notes(folder, {**asdict(config), **cluster.options.intervals()})
        if config.warm_up and clusters.shared is None:
            reporter.step(task, "warming up")
            warm_up(cluster, [node], cluster.home / "runs", config.timeout_s)
        for size in config.sizes_mib:
            name = f"e3-s{size}"
            reporter.step(task, f"{name}: running {config.duration_s:.0f} s")
            row, taken = _one_run(cluster, name, node, size, config)
            row.update(run=name, state_mib=size)
            runs.append(row)
            checkpoints.extend({"run": name, "state_mib": size, **c} for c in taken)
            colour = "green" if row.get("consistent") else "red"
            reporter.note(
                f"{name}: {row['node_checkpoints']} node-level and "
                f"{row['central_checkpoints']} central checkpoints; "
                f"[{colour}]{'consistent' if row.get('consistent') else 'INCONSISTENT'}[/]"
                + (f" ({one_line(str(row['error']), 120)})" if row.get("error") else "")
            )
            reporter.advance(task)


def _one_run(
    cluster: BenchCluster, name: str, node: str, size_mib: int, config: E3Config
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one size; returns the run's row and its checkpoints (never raises a
    FogshiftError: a failed step is the run's ``status``/``error``)."""
    node_level: dict[str, dict[str, Any]] = {}
    central: dict[str, dict[str, Any]] = {}
    with Case1Run(
        cluster, name, rate=config.rate, seed=config.seed, agg_node=node,
        pad_bytes=size_mib * MIB, lead_s=config.lead_s,
    ) as run:  # fmt: skip
        run.deploy()
        # Watched from the deploy on: the first (full) checkpoints may precede the first output.
        started = time.monotonic()
        deadline: float | None = None
        while deadline is None or time.monotonic() < deadline:
            entry = cluster.checkpoints(name, "aggregate") or {}
            for level, seen in (("node_level", node_level), ("central", central)):
                summary = entry.get(level)
                if summary and summary["id"] not in seen:
                    seen[summary["id"]] = summary
            if deadline is None and sink_rows(cluster, name) > 0:
                deadline = time.monotonic() + config.duration_s
            elif deadline is None and time.monotonic() - started > config.timeout_s:
                raise BenchError(f"{name}: no output within {config.timeout_s:.0f} s")
            time.sleep(0.5)
        run.finish_input()
        run.check(config.timeout_s)
        run.row["status"] = "done"
    row = run.row
    row.update(node_checkpoints=len(node_level), central_checkpoints=len(central))
    return row, _rows(node_level, central)


def _rows(
    node_level: dict[str, dict[str, Any]], central: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One CSV row per checkpoint, oldest first; ``first`` marks each level's first one
    (a full copy: nothing earlier to link to or to skip)."""
    out = []
    for i, (_, snap) in enumerate(sorted(node_level.items())):
        state = snap.get("state_store") or {}
        out.append(
            {
                "level": "node", "id": snap["id"], "batch": snap["batch"], "first": i == 0,
                "bytes": snap["bytes"], "new_bytes": snap.get("new_bytes"),
                "took_ms": snap.get("took_ms"), "copy_ms": snap.get("copy_ms"),
                "hash_ms": snap.get("hash_ms"), "commit_ms": state.get("commit_ms"),
                "updates_ms": state.get("updates_ms"), "batch_ms": state.get("batch_ms"),
            }
        )  # fmt: skip
    for i, (_, pulled) in enumerate(sorted(central.items())):
        out.append(
            {
                "level": "central", "id": pulled["id"], "batch": pulled["batch"],
                "first": i == 0, "bytes": pulled["bytes"],
                "shipped_bytes": pulled.get("shipped_bytes"),
            }
        )  # fmt: skip
    return out


# -- results (from the CSV files only) --------------------------------------------------------


def _share(row: dict[str, str]) -> float | None:
    """Serialisation share of one node-level checkpoint, in percent (see the module doc)."""
    commit, took = num(row["commit_ms"]), num(row["took_ms"])
    if commit is None or took is None or commit + took <= 0:
        return None
    return 100.0 * commit / (commit + took)


def section(folder: Path) -> str | None:
    """E3's part of ``results.md``: checkpoint cost and shipping by state size."""
    runs = read_rows(folder / "runs.csv")
    if not runs:
        return None
    taken = read_rows(folder / "checkpoints.csv")
    settings = read_notes(folder)["settings"]
    out = [
        "## E3 - checkpointing (thesis §6.2.3, Fig. 24)",
        "",
        f"Case 1, the aggregate on a fog node, one event every "
        f"{1000 / float(settings.get('rate', 1)):.0f} ms, {settings.get('duration_s'):.0f} s "
        f"per state size; node-level checkpoints every "
        f"{settings.get('checkpoint_interval_s')} s, central pulls every "
        f"{settings.get('central_interval_s')} s. *snapshot* is the node-level "
        "checkpoint (freeze the committed batch: a hard link per file, digests of the new "
        "ones); *commit* is Spark's state-store commit of the batch it froze "
        "(`commitTimeMs`: that batch's state changes serialised and written). Our checkpoint "
        "is commit + snapshot; *serialisation share* = commit / (commit + snapshot), over the "
        "snapshots after the first. The thesis serialised the whole state at every "
        "checkpoint; here Spark writes only what changed, and a snapshot copies only new files.",
        "",
        "| state | ok / runs | snapshots | first snapshot ms | later snapshots ms | "
        "thesis checkpoint | commit ms | serialisation share | thesis share | checkpoint "
        "bytes | new bytes per later snapshot | first central pull shipped | later pulls "
        "shipped (mean) | shipped / checkpoint |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in dict.fromkeys(int(r["state_mib"]) for r in runs):
        of_size = [r for r in runs if int(r["state_mib"]) == size]
        good = {r["run"] for r in of_size if truthy(r["consistent"])}
        node = [c for c in taken if c["run"] in good and c["level"] == "node"]
        later = [c for c in node if not truthy(c["first"])]
        central = [c for c in taken if c["run"] in good and c["level"] == "central"]
        pulls = [c for c in central if not truthy(c["first"])]
        shipped = mean_std(num(c["shipped_bytes"]) for c in pulls)[0]
        whole = mean_std(num(c["bytes"]) for c in pulls)[0]
        anchor = thesis.E3_CHECKPOINT_MS.get(size)
        share = thesis.E3_SERIALISATION_SHARE_PCT.get(size)
        out.append(
            "| " + " | ".join([
                f"{size} MiB", f"{len(good)} / {len(of_size)}", str(len(node)),
                fmt_mean_std((num(c["took_ms"]) for c in node if truthy(c["first"])), 1),
                fmt_mean_std((num(c["took_ms"]) for c in later), 1),
                anchor.cite() if anchor else "-",
                fmt_mean_std((num(c["commit_ms"]) for c in later), 1),
                fmt_mean_std((_share(c) for c in later), 1, " %"),
                share.cite() if share else "-",
                fmt(mean_std(num(c["bytes"]) for c in node)[0]),
                fmt(mean_std(num(c["new_bytes"]) for c in later)[0]),
                fmt(mean_std(num(c["shipped_bytes"]) for c in central
                             if truthy(c["first"]))[0]),
                fmt(shipped),
                fmt(100.0 * shipped / whole, 2, " %") if shipped is not None and whole else "-",
            ]) + " |"
        )  # fmt: skip
    for r in runs:
        if not truthy(r["consistent"]):
            out.append(failure_line(r, "inconsistent or failed"))
    out += ["", f"![E3]({NAME}/e3.png)", ""]
    return "\n".join(out)


def plot(folder: Path) -> list[Path]:
    """``e3.png``: snapshot duration by state size beside the thesis (Fig. 24), and bytes
    shipped per central checkpoint."""
    from fogshift.bench.plotting import COLOURS, figure, log_y, save

    taken = read_rows(folder / "checkpoints.csv")
    if not taken:
        return []
    sizes = sorted({int(c["state_mib"]) for c in taken})
    fig, axes = figure(ncols=2, width=5.5, height=4)
    left, right = axes[0]
    xs = range(len(sizes))
    bars: list[float] = []
    for offset, (label, first) in enumerate((("first snapshot", True), ("later", False))):
        values = [
            mean_std(
                num(c["took_ms"]) for c in taken
                if c["level"] == "node" and int(c["state_mib"]) == s
                and truthy(c["first"]) == first
            )[0] or 0.0
            for s in sizes
        ]  # fmt: skip
        left.bar([x + offset * 0.3 for x in xs], values, 0.3, label=label)
        bars += values
    commits = [
        mean_std(
            num(c["commit_ms"]) for c in taken
            if c["level"] == "node" and int(c["state_mib"]) == s and not truthy(c["first"])
        )[0] or 0.0
        for s in sizes
    ]  # fmt: skip
    left.bar([x + 0.6 for x in xs], commits, 0.3, label="state-store commit")
    points = [(x, thesis.E3_CHECKPOINT_MS[s].value) for x, s in zip(xs, sizes, strict=True)
              if s in thesis.E3_CHECKPOINT_MS]  # fmt: skip
    if points:
        left.plot([p[0] + 0.3 for p in points], [p[1] for p in points], "x", markersize=10,
                  color=COLOURS["thesis"], label="thesis checkpoint")  # fmt: skip
    left.set_xticks([x + 0.3 for x in xs], [f"{s} MiB" for s in sizes])
    log_y(left, "ms", [*bars, *commits, *(p[1] for p in points)])
    left.set_title("E3 node-level checkpoint")
    left.legend(fontsize=7)
    position = {size: x for x, size in enumerate(sizes)}
    shown: list[float] = []
    for first, shift, label in ((True, -0.15, "first pull"), (False, 0.15, "later pulls")):
        pts = [
            (position[int(c["state_mib"])] + shift, num(c["shipped_bytes"])) for c in taken
            if c["level"] == "central" and truthy(c["first"]) == first and c["shipped_bytes"]
        ]  # fmt: skip
        right.plot([p[0] for p in pts], [max(1.0, p[1] or 0) for p in pts], "o",
                   linestyle="none", label=label, alpha=0.7)  # fmt: skip
        shown += [max(1.0, p[1] or 0) for p in pts]
    whole = [
        (position[int(c["state_mib"])], num(c["bytes"])) for c in taken if c["level"] == "central"
    ]
    right.plot([p[0] for p in whole], [p[1] for p in whole], "_", markersize=20,
               color=COLOURS["machine"], label="whole checkpoint")  # fmt: skip
    shown += [p[1] or 0.0 for p in whole]
    right.set_xticks(list(xs), [f"{s} MiB" for s in sizes])
    log_y(right, "bytes", shown, "no central checkpoint in these runs")
    right.set_title("shipped to the central store per checkpoint")
    right.legend(fontsize=7)
    return [save(fig, folder / "e3.png")]
