"""``fogshift bench ...``: the benchmark commands, one per experiment.

Each command measures, writes its raw data (CSV) and renders plots and a ``results.md`` from
that data into ``--out DIR``. The measuring and reporting live in the library (e.g.
:mod:`fogshift.bench.planner`); this module only parses options and shows progress, so a
benchmark can also be run from Python without the CLI. Heavy imports (HiGHS, numpy,
matplotlib) happen inside the commands to keep ``fogshift --help`` fast.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fogshift.cli.output import make_console
from fogshift.common.options import ranged

if TYPE_CHECKING:
    from fogshift.bench.planner import RunRow, Sweep

bench_app = typer.Typer(
    help="Benchmarks: each writes a CSV of every run, PNG plots and results.md into --out.",
    no_args_is_help=True,
)


def _register_thesis_experiments() -> None:
    # The thesis's E1-E3 and the seamless run live in fogshift.bench (they drive clusters).
    from fogshift.bench.commands import register

    register(bench_app)


_register_thesis_experiments()
console = make_console(log_path=False)  # the source line of a log call is noise here

OutDir = Annotated[
    Path, typer.Option("--out", help="Folder for the CSV, plots and results.md (created).")
]


@bench_app.command("planner")
def planner(
    out: OutDir,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="Fewer points and trials, 10 s limit: a few minutes on 2 cores."
        ),
    ] = False,
    time_limit: Annotated[
        float | None,
        typer.Option(help="Seconds per exact solve (default 60; 10 with --quick)."),
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(help="Random instances per point (default 10; 3 with --quick)."),
    ] = None,
    note: Annotated[
        str, typer.Option(help="Free text for results.md, e.g. what else ran on the machine.")
    ] = "",
    report_only: Annotated[
        bool,
        typer.Option(
            "--report-only", help="Measure nothing: re-render results.md and plots from DIR."
        ),
    ] = False,
) -> None:
    """Exact MILP vs greedy backup-location planning: Iijima et al.'s Fig. 5 and 6, and beyond.

    Fig. 5: 10..120 tasks on 30 servers. Fig. 6: 30 tasks on 30..60 servers.

    Both methods run on the same random instances; then the greedy alone up to 1000 x 200.

    Writes runs.csv, run.json, one PNG per sweep and results.md (see docs/planner.md).
    """
    from fogshift.bench import planner as bench
    from fogshift.bench.base import Reporter
    from fogshift.bench.exceptions import refuse_options_with_report_only

    if report_only:
        given = [
            name
            for name, value in (
                ("--quick", quick),
                ("--trials", trials is not None),
                ("--time-limit", time_limit is not None),
                ("--note", bool(note)),
            )
            if value
        ]
        refuse_options_with_report_only(given, "measurement")
        path = bench.write_report(out)
        console.print(f"[green]wrote[/] {path} (from {out / bench.CSV_NAME})")
        return
    preset = bench.quick_config if quick else bench.reference_config
    # Only the options given override the preset's defaults, so `--quick` alone stays quick;
    # replace() re-validates the result.
    config = preset()
    if trials is not None:
        config = dataclasses.replace(config, trials=trials)
    if time_limit is not None:
        config = dataclasses.replace(config, time_limit_s=time_limit)
    command = ["fogshift", "bench", "planner", "--out", str(out)]
    command += ["--quick"] if quick else []
    command += [] if trials is None else ["--trials", str(trials)]
    command += [] if time_limit is None else ["--time-limit", f"{time_limit:g}"]
    command += ["--note", note] if note else []

    start = time.perf_counter()
    reporter = Reporter(console)
    done: list[RunRow] = []
    try:
        with reporter.session():
            bars = {s.name: reporter.task(s.name, config.runs_of(s)) for s in config.sweeps}

            def on_start(sweep: Sweep, tasks: int, servers: int, trial: int, method: str) -> None:
                reporter.step(
                    bars[sweep.name],
                    f"{tasks} tasks x {servers} servers, trial {trial + 1}/{config.trials}: "
                    f"{method}",
                )

            def on_row(row: RunRow) -> None:
                reporter.advance(bars[row.sweep])
                done.append(row)
                sweep = next(s for s in config.sweeps if s.name == row.sweep)
                if row.trial == config.trials - 1 and row.method == sweep.methods[-1]:
                    reporter.note(_point_line(done, row))

            rows = bench.run_benchmark(
                config,
                out,
                command=shlex.join(command),
                note=note,
                on_start=on_start,
                on_row=on_row,
            )
    except KeyboardInterrupt:
        # runs.csv is flushed after every run, so what was measured is kept.
        console.print(
            f"[yellow]interrupted[/]: {out / bench.CSV_NAME} keeps the {len(done)} runs "
            f"measured; `fogshift bench planner --out {out} --report-only` reports them"
        )
        raise typer.Exit(130) from None
    minutes = (time.perf_counter() - start) / 60
    console.print(
        f"[green]done[/]: {len(rows)} runs in {minutes:.1f} min; "
        f"{out / bench.REPORT_NAME}, {out / bench.CSV_NAME} and one PNG per sweep"
    )


def _point_line(rows: list[RunRow], last: RunRow) -> str:
    """One line per finished point: mean times and outcomes, computed like the report."""
    from fogshift.bench.planner import fmt_time, summarise

    point = (last.sweep, last.tasks, last.servers)
    mine = [r for r in rows if (r.sweep, r.tasks, r.servers) == point]
    (p,) = summarise(mine)
    parts = []
    for method, counts in p.outcomes.items():
        outcome = ", ".join(f"{n} {s}" for s, n in counts.most_common())
        parts.append(f"{method} mean {fmt_time(p.mean(method))} ({outcome})")
    return f"{last.sweep} {last.tasks}x{last.servers}: " + "; ".join(parts)


@bench_app.command("dataplane")
def dataplane(
    out: OutDir,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Shorter runs and a smaller backlog: ~5-8 min on 2 cores."),
    ] = False,
    trigger_ms: Annotated[
        int | None,
        typer.Option(help="The queries' trigger (ms; default: the node agents' default)."),
    ] = None,
    runs: Annotated[
        int,
        ranged(
            "--runs",
            "Measure it all this many times, the cases in turn; results.md gives each "
            "figure's median and range.",
            1,
        ),
    ] = 1,
    broker_sync: Annotated[
        str | None,
        typer.Option(
            metavar="INTERVAL",
            help="The broker's sync_interval (default: fogshift's, 'always'; nats-server's "
            "own default, '2m', measures both systems without per-batch fsyncs).",
        ),
    ] = None,
    report_only: Annotated[
        bool,
        typer.Option("--report-only", help="Measure nothing: re-render results.md from DIR."),
    ] = False,
) -> None:
    """One PE's data plane, fogshift beside a plain PySpark query of the same job.

    For `map`, `window-aggregate` and `window-aggregate` on the JVM engine (`engine: jvm`,
    beside the same floor): per-hop latency at a steady input, the highest input
    rate sustained at p99 <= 1 s, and the reprocessing rate of a backlog (with and without
    the query's start), with Spark's per-batch durations. Writes dataplane.csv,
    dataplane.png and results.md.
    """
    from fogshift.bench import dataplane as bench
    from fogshift.bench.exceptions import refuse_options_with_report_only

    out = out.resolve()
    if report_only:
        given = [o for o, v in (("--quick", quick), ("--trigger-ms", trigger_ms is not None),
                                ("--runs", runs != 1),
                                ("--broker-sync", broker_sync is not None)) if v]  # fmt: skip
        refuse_options_with_report_only(given, "measurement")
        path = bench.render(out)
    else:
        settings = bench.QUICK if quick else bench.Settings()
        if trigger_ms is not None:
            settings = dataclasses.replace(settings, trigger_ms=trigger_ms)
        settings = dataclasses.replace(settings, runs=runs)
        if broker_sync is not None:
            settings = dataclasses.replace(settings, broker_sync=broker_sync)
        from fogshift.bench.commands import terminable

        try:
            # (Its broker runs in a session of its own: SIGTERM's default action left it
            # running, and the bench's folder behind.)
            with terminable():
                path = bench.run(out, settings, log=console.log)
        except KeyboardInterrupt:
            console.print(
                f"[yellow]interrupted[/]: {out / 'dataplane.csv'} keeps the runs measured; "
                f"`fogshift bench dataplane --out {out} --report-only` reports them"
            )
            raise typer.Exit(130) from None
    console.print(f"results: {path}")
