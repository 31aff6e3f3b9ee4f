"""The ``fogshift bench`` commands: ``e1``, ``e2``, ``e3``, ``seamless``, ``ecg``, ``pam``,
``all``, ``report``, ``soak``.

:func:`register` adds them to an existing Typer group (``fogshift bench``). Each command
starts its own clusters through the CLI (under ``--work``, a temporary folder by default, that
is removed afterwards), shows progress bars, appends to the CSVs under ``--out`` as runs
finish, and renders ``--out/results.md`` at the end — also after a failure, from what was
measured. ``soak`` writes its own ``results.md`` (:func:`fogshift.bench.soak.render`).

Run a command on its own with ``python -m fogshift.bench.commands e1 --quick --out DIR``.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from fogshift.agent.config import AgentConfig
from fogshift.bench import e1, e2, e3, ecg, pam, report, seamless, soak
from fogshift.bench.base import Reporter, record_command, write_machine
from fogshift.bench.cluster import Clusters, delay_of
from fogshift.bench.exceptions import BadBenchOption, refuse_options_with_report_only
from fogshift.common.options import ranged

console = Console()

Out = Annotated[
    Path, typer.Option("--out", help="Folder of the CSVs, PNGs and results.md.", show_default=False)
]
Quick = Annotated[
    bool, typer.Option("--quick", help="Few runs, short series: minutes instead of hours.")
]
Work = Annotated[
    Path | None,
    typer.Option(
        "--work", help="Keep the clusters' homes (logs, checkpoints) here instead of a temp dir."
    ),
]


def _ints(text: str, what: str, minimum: int = 0) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < minimum for v in values):
        raise BadBenchOption(
            f"bad {what}",
            expected=f"comma-separated whole numbers of at least {minimum}, e.g. "
            + ("0,1,5" if minimum == 0 else "10,100"),
            received=text,
        )
    return values


def _choices(text: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    """The comma-separated choice ``text`` of ``allowed`` (refused: none, or another)."""
    chosen = tuple(c.strip() for c in text.split(",") if c.strip())
    if not chosen or any(c not in allowed for c in chosen):
        raise BadBenchOption(
            f"bad {option}",
            expected=f"a comma-separated choice of {', '.join(allowed)}",
            received=text,
        )
    return chosen


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given (on the command line or by its variable), not
    left at its default."""
    source = ctx.get_parameter_source(name)
    # (typer vendors click: its sources are compared by name.)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _rendered_from(out: Path, runs: list[Path]) -> Path:
    """``out``, refused unless it holds some of ``runs`` (the CSVs a report is rendered
    from): a missing folder gave a traceback, an empty one a results.md of nothing.

    Raises:
        BadBenchOption: None of ``runs`` is there.
    """
    if not any(path.is_file() for path in runs):
        raise BadBenchOption(
            f"nothing to render in {str(out)!r}",
            expected="the --out folder of an earlier run (" + ", ".join(
                str(p.relative_to(out)) for p in runs[:6]) + ")",
            received="no such folder" if not out.is_dir() else "a folder without them",
            hint="pass the --out the run wrote to",
        )  # fmt: skip
    return out


def _session(
    out: Path,
    work: Path | None,
    experiments: tuple[str, ...],
    body: Callable[[Clusters, Reporter], None],
    render: Callable[[Path], Path] = report.render,
    append: bool = False,
) -> None:
    """Run ``body`` (the ``experiments``) with fresh clusters under ``work`` and ``render``
    ``results.md`` after it; ``append``: ``body`` adds to the runs in ``out``."""
    out = out.resolve()
    at_start = write_machine(out)
    root = work.resolve() if work else Path(tempfile.mkdtemp(prefix="fogshift-bench-"))
    command = (
        shlex.join(["fogshift", "bench", *sys.argv[sys.argv.index("bench") + 1 :]])
        if ("bench" in sys.argv)
        else shlex.join(["fogshift", "bench", *sys.argv[1:]])
    )
    reporter = Reporter(console)
    started = time.monotonic()
    completed = interrupted = False
    try:
        with terminable(), reporter.session():
            body(Clusters(root), reporter)
        completed = True
    except KeyboardInterrupt:
        interrupted = True  # (what was measured is rendered below, then exit 130)
    finally:
        record_command(
            out, command, experiments, at_start, time.monotonic() - started, completed, append
        )
        path = render(out)
        if work is None:
            shutil.rmtree(root, ignore_errors=True)
        console.print(
            f"results: {path} ({(time.monotonic() - started) / 60:.1f} min"
            + ("" if completed else ", incomplete")
            + ")"
        )
    if interrupted:
        # As a shell reports a ^C (the README's exit codes); click said "Aborted!", exit 1.
        raise typer.Exit(130)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def terminable() -> Iterator[None]:
    """SIGTERM (e.g. `timeout`) ends the block as an exception does, exit 143: its clean-up
    runs (the clusters or broker it started stopped, what was measured rendered), where the
    signal's default action left them behind."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(bench_app: typer.Typer) -> None:
    """Add the bench commands to ``bench_app`` (the ``fogshift bench`` group)."""

    @bench_app.command("e1")
    def cmd_e1(
        out: Out,
        quick: Quick = False,
        work: Work = None,
        runs: Annotated[
            int | None, ranged("--runs", "Runs per series (default 10).", 1, 100_000)
        ] = None,
        sizes: Annotated[
            str | None, typer.Option(help="Added state in MiB, e.g. 0,1,5,50.")
        ] = None,
        link_profile: Annotated[
            list[str] | None,
            typer.Option(
                "--link-profile",
                metavar="PROFILE",
                help="Link profile of the origin node (repeat): n0, n100, n500, 10mbit,n100.",
            ),
        ] = None,
        modes: Annotated[
            str | None, typer.Option(help="Of precopy,literal,handover (default precopy,literal).")
        ] = None,
        wait: Annotated[
            str | None,
            typer.Option(
                help="Range of the random wait before a migration, s: MIN,MAX (default 2,10; "
                "longer lets the central store pull the PE first)."
            ),
        ] = None,
    ) -> None:
        """E1: live migration by link delay, state size and mode (thesis Fig. 20-21)."""
        config = e1.E1Config.quick() if quick else e1.E1Config()
        config = _e1_overrides(config, runs, sizes, link_profile, modes, wait)
        _session(
            out,
            work,
            (e1.NAME,),
            lambda clusters, rep: e1.run(config, clusters, out.resolve(), rep),
        )

    @bench_app.command("e2")
    def cmd_e2(
        out: Out,
        quick: Quick = False,
        work: Work = None,
        runs: Annotated[
            int | None, ranged("--runs", "Restorations (default 100).", 1, 100_000)
        ] = None,
        methods: Annotated[
            str | None,
            typer.Option(help="How runs restore, in turn: checkpoint, standby (comma-separated)."),
        ] = None,
    ) -> None:
        """E2: restoration after SIGKILL of the aggregate's node (thesis Fig. 22-23)."""
        config = e2.E2Config.quick() if quick else e2.E2Config()
        if runs is not None:
            config = replace(config, runs=runs)
        if methods is not None:
            chosen = tuple(m.strip() for m in methods.split(",") if m.strip())
            if not chosen or set(chosen) - set(e2.METHODS):
                raise BadBenchOption(
                    "bad restore methods",
                    expected="one or more of " + ", ".join(e2.METHODS) + " (comma-separated)",
                    received=methods,
                )
            config = replace(config, methods=chosen)
        _session(
            out,
            work,
            (e2.NAME,),
            lambda clusters, rep: e2.run(config, clusters, out.resolve(), rep),
        )

    @bench_app.command("e3")
    def cmd_e3(
        out: Out,
        quick: Quick = False,
        work: Work = None,
        sizes: Annotated[str | None, typer.Option(help="Added state in MiB.")] = None,
        duration: Annotated[
            float | None, ranged("--duration", "Seconds per size.", 1, 86_400)
        ] = None,
    ) -> None:
        """E3: node-level checkpoint cost and central shipping by state size (thesis Fig. 24)."""
        config = e3.E3Config.quick() if quick else e3.E3Config()
        if sizes is not None:
            config = replace(config, sizes_mib=_ints(sizes, "state sizes"))
        if duration is not None:
            config = replace(config, duration_s=duration)
        _session(
            out,
            work,
            (e3.NAME,),
            lambda clusters, rep: e3.run(config, clusters, out.resolve(), rep),
        )

    @bench_app.command("seamless")
    def cmd_seamless(
        out: Out,
        quick: Quick = False,
        work: Work = None,
        rate: Annotated[
            float | None,
            ranged(
                "--rate",
                "Events/s (default: the highest rate the probes find sustained).",
                1,
                10_000_000,
            ),
        ] = None,
    ) -> None:
        """Throughput and latency through a migration and a restoration, at high load."""
        config = seamless.SeamlessConfig.quick() if quick else seamless.SeamlessConfig()
        if rate is not None:
            config = replace(config, rate=rate)
        _session(
            out,
            work,
            (seamless.NAME,),
            lambda clusters, rep: seamless.run(config, clusters, out.resolve(), rep),
        )

    @bench_app.command("ecg")
    def cmd_ecg(out: Out, quick: Quick = False, work: Work = None) -> None:
        """Case 2: window and alarm latency with the processing steady and while it moves."""
        config = ecg.EcgConfig.quick() if quick else ecg.EcgConfig()
        _session(
            out,
            work,
            (ecg.NAME,),
            lambda clusters, rep: ecg.run(config, clusters, out.resolve(), rep),
        )

    @bench_app.command("pam")
    def cmd_pam(
        out: Out,
        quick: Quick = False,
        work: Work = None,
        keys: Annotated[
            str | None, typer.Option(help="Numbers of keys, comma-separated (e.g. 10,100,1000).")
        ] = None,
        state_kib: Annotated[
            str | None, typer.Option(help="KiB of state per key, comma-separated.")
        ] = None,
        runs: Annotated[
            int | None,
            ranged("--runs", "Repetitions of each combination.", 1, 100_000),
        ] = None,
        methods: Annotated[
            str | None,
            typer.Option(help=f"Methods, comma-separated, of {','.join(pam.METHODS)}."),
        ] = None,
        rate: Annotated[
            float | None,
            typer.Option(help="Events/s of the source (default 100; PAM's runs were loaded)."),
        ] = None,
        traffics: Annotated[
            str | None, typer.Option(help="Key choice, comma-separated, of uniform,zipf.")
        ] = None,
        link: Annotated[
            str | None,
            typer.Option(
                help="Link profile of both fog nodes, isolated (e.g. 10mbit,n0 or n100; "
                "default: none, no isolation)."
            ),
        ] = None,
        append: Annotated[
            bool,
            typer.Option(
                "--append",
                help="Add these runs to those in --out (same settings but the combinations) "
                "instead of replacing them.",
            ),
        ] = False,
        inputs: Annotated[
            int,
            ranged(
                "--inputs",
                "Inputs of the partitioned PE: 1 (a window aggregate) or 2 (a tally of "
                "two sources at half the rate each, the same keys in both).",
                1,
                2,
            ),
        ] = 1,
    ) -> None:
        """Issue #16: per-key migration (fifo, backlog order) vs whole-PE and scaling.

        Every key of one partition moves: key by key (fifo or backlog order, in waves or
        all at once, with or without a precopy), as a key group, or the whole partition (a
        handover, and the thesis's pause-and-move procedure); or the element scales from
        two partitions to three. Uniform and Zipf traffic; one input or two.
        """
        config = pam.PamConfig.quick() if quick else pam.PamConfig()
        config = replace(config, inputs=inputs)
        if rate is not None:
            if not (math.isfinite(rate) and rate > 0):
                raise BadBenchOption(
                    "bad --rate", expected="a number of events per second above 0",
                    received=str(rate),
                )  # fmt: skip
            config = replace(config, rate=rate)
        if traffics is not None:
            config = replace(config, traffics=_choices(traffics, pam.TRAFFICS, "--traffics"))
        if methods is not None:
            config = replace(config, methods=_choices(methods, pam.METHODS, "--methods"))
        if keys:
            config = replace(config, keys=_ints(keys, "numbers of keys", minimum=1))
        if state_kib:
            config = replace(config, state_kib=_ints(state_kib, "state sizes"))
        if runs is not None:
            config = replace(config, runs=runs)
        if link is not None:
            delay_of(link)  # refuses an empty profile; `fogshift up` checks its parts
            config = replace(config, link=link.strip())
        _session(
            out,
            work,
            (pam.NAME,),
            lambda clusters, rep: pam.run(config, clusters, out.resolve(), rep, append),
            append=append,
        )

    @bench_app.command("all")
    def cmd_all(out: Out, quick: Quick = False, work: Work = None) -> None:
        """E1, E2, E3, seamless and ecg, one after the other (--quick: under 25 min)."""
        target = out.resolve()

        def body(clusters: Clusters, rep: Reporter) -> None:
            # Each on a cluster of its own: on E1's cluster, with its delayed nodes, the
            # orchestrator's replica pushes to those nodes hold up the central pulls E3 counts.
            e1.run(e1.E1Config.quick() if quick else e1.E1Config(), clusters, target, rep)
            e3.run(e3.E3Config.quick() if quick else e3.E3Config(), clusters, target, rep)
            e2.run(e2.E2Config.quick() if quick else e2.E2Config(), clusters, target, rep)
            config = seamless.SeamlessConfig.quick() if quick else seamless.SeamlessConfig()
            seamless.run(config, clusters, target, rep)
            ecg.run(ecg.EcgConfig.quick() if quick else ecg.EcgConfig(), clusters, target, rep)

        _session(out, work, tuple(m.NAME for m in report.EXPERIMENTS if m is not pam), body)

    @bench_app.command("soak")
    def cmd_soak(
        ctx: typer.Context,
        out: Out,
        migrations: Annotated[
            int, ranged("--migrations", "Migrations in the schedule.", 0, 1_000_000)
        ] = 200,
        kills: Annotated[
            int,
            ranged("--kills", "Node kills (SIGKILL of a node's process group).", 0, 1_000_000),
        ] = 50,
        orchestrator_kills: Annotated[
            int,
            ranged(
                "--orchestrator-kills",
                "Orchestrator kills (SIGKILL), then started again.",
                0,
                1_000_000,
            ),
        ] = 1,
        modes: Annotated[
            str,
            typer.Option(help="Migration modes drawn from, of precopy,literal,handover."),
        ] = ",".join(soak.MODES),
        mid_migration: Annotated[
            float,
            ranged(
                "--mid-migration",
                "Probability that an orchestrator kill lands during a migration.",
                0,
                1,
            ),
        ] = 0.5,
        mid_operation: Annotated[
            float,
            ranged(
                "--mid-operation",
                "Probability that a node kill lands during a migration, key move or scale "
                "(then on a node it involves).",
                0,
                1,
            ),
        ] = soak.SoakConfig.mid_operation,
        duration: Annotated[
            float | None,
            ranged(
                "--duration", "Start no operation after this many seconds (a cap).", 1, 10_000_000
            ),
        ] = None,
        seed: Annotated[int, typer.Option(help="Seed of the schedule, choices and inputs.")] = 0,
        nodes: Annotated[
            str, typer.Option(help="Comma-separated node names (at least two).")
        ] = "cloud,fog-a,fog-b,fog-c",
        rate: Annotated[
            float, ranged("--rate", "Events/s of each source.", 0.001, 1_000_000)
        ] = 10.0,
        standby: Annotated[
            str | None,
            typer.Option(
                help="planned: keep hot standbys; a killed node's PEs are taken over by them."
            ),
        ] = None,
        trigger_ms: Annotated[
            int,
            ranged(
                "--trigger-ms",
                "Micro-batch trigger of every query (ms): on two cores, the default's "
                "batches of two pipelines keep the CPU busy, and every operation waits for it.",
                0,
                3_600_000,
            ),
        ] = AgentConfig.default("trigger_ms"),
        pipelines: Annotated[
            str,
            typer.Option(
                help="The pipelines to run, of case1,merge,keyed (Case 1, the two-input one, "
                "the keyed one in partitions)."
            ),
        ] = ",".join(soak.PIPELINES),
        no_keyed: Annotated[
            bool,
            typer.Option(
                "--no-keyed",
                help="Leave out the keyed pipeline (its aggregate in partitions), its key moves "
                "and scales.",
            ),
        ] = False,
        key_moves: Annotated[
            int,
            ranged(
                "--key-moves",
                "Key moves of the keyed pipeline (1-3 random keys each).",
                0,
                1_000_000,
            ),
        ] = soak.SoakConfig.key_moves,
        scales: Annotated[
            int,
            ranged(
                "--scales",
                "Scales of the keyed pipeline's element, between 2 and 3 partitions.",
                0,
                1_000_000,
            ),
        ] = soak.SoakConfig.scales,
        keys: Annotated[
            int, ranged("--keys", "Keys (sensors) of the keyed pipeline's input.", 1, 1000)
        ] = soak.SoakConfig.keys,
        work: Work = None,
        report_only: Annotated[
            bool,
            typer.Option("--report-only", help="Run nothing: render results.md from --out again."),
        ] = False,
    ) -> None:
        """Soak: pipelines under random migrations, key moves, scales and kills; lost rows.

        Case 1, a two-input and a keyed, partitioned pipeline under random migrations, key
        moves, scales and SIGKILLs of nodes and the orchestrator; counts lost, duplicated and
        wrong output rows."""
        target = out.resolve()
        if report_only:
            given = [
                f"--{name.replace('_', '-')}" for name in (
                    "migrations", "kills", "orchestrator_kills", "modes", "mid_migration",
                    "mid_operation", "duration", "seed", "nodes", "rate", "standby",
                    "trigger_ms", "pipelines", "no_keyed",
                    "key_moves", "scales", "keys", "work")
                if _given(ctx, name)
            ]  # fmt: skip
            refuse_options_with_report_only(given, "run")
            _rendered_from(target, [target / soak.RUNS_CSV, target / soak.VERDICT_JSON])
            console.print(f"results: {soak.render(target)}")
            return
        chosen = tuple(p.strip() for p in pipelines.split(",") if p.strip())
        if no_keyed:
            chosen = tuple(p for p in chosen if p != "keyed")
        if "keyed" not in chosen:  # (their defaults go with the keyed pipeline; given, refused)
            key_moves = key_moves if _given(ctx, "key_moves") else 0
            scales = scales if _given(ctx, "scales") else 0
        config = soak.SoakConfig(
            migrations=migrations, kills=kills, orchestrator_kills=orchestrator_kills,
            modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
            mid_migration=mid_migration, mid_operation=mid_operation, duration_s=duration,
            seed=seed,
            nodes=tuple(n.strip() for n in nodes.split(",") if n.strip()), rate=rate,
            trigger_ms=trigger_ms, standby=standby, pipelines=chosen, key_moves=key_moves,
            scales=scales, keys=keys,
        )  # fmt: skip
        config.check()  # before a cluster starts
        verdict: dict[str, Any] = {}
        _session(
            out,
            work,
            (soak.NAME,),
            lambda clusters, rep: verdict.update(soak.run(config, clusters, target, rep)),
            render=soak.render,
        )
        if not verdict.get("zero_errors"):
            # Like `fogshift demo`: the run completed, its output did not match (verdict.json).
            console.print("[red]soak: lost, duplicated or wrong output rows[/] (verdict.json)")
            raise typer.Exit(1)

    @bench_app.command("report")
    def cmd_report(out: Out) -> None:
        """Render results.md and the PNGs again from the CSVs in --out."""
        target = out.resolve()
        _rendered_from(target, [target / m.NAME / "runs.csv" for m in report.EXPERIMENTS])
        console.print(f"results: {report.render(target)}")


def _e1_overrides(
    config: e1.E1Config,
    runs: int | None,
    sizes: str | None,
    profiles: list[str] | None,
    modes: str | None,
    wait: str | None = None,
) -> e1.E1Config:
    if runs is not None:
        config = replace(config, runs=runs)
    if wait is not None:
        bounds = _floats(wait)
        if bounds is None or len(bounds) != 2 or not 0 <= bounds[0] <= bounds[1] <= 600:
            raise BadBenchOption(
                "bad wait range",
                expected="MIN,MAX in seconds, 0 <= MIN <= MAX <= 600 (e.g. 2,10)",
                received=wait,
            )
        config = replace(config, wait_s=(bounds[0], bounds[1]))
    if sizes is not None:
        config = replace(config, sizes_mib=_ints(sizes, "state sizes"))
    if profiles:
        for profile in profiles:
            delay_of(profile)
        config = replace(config, profiles=tuple(profiles))
    if modes is not None:
        chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
        if not chosen or set(chosen) - {"precopy", "literal", "handover"}:
            raise BadBenchOption(
                "bad migration modes",
                expected="one or more of precopy, literal, handover (comma-separated)",
                received=modes,
            )
        config = replace(config, modes=chosen)
    return config


def _floats(text: str) -> list[float] | None:
    """Comma-separated numbers, or ``None`` if one is not a number."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        return None


def main() -> None:
    """``python -m fogshift.bench.commands ...``: the bench without the ``fogshift`` CLI."""
    from fogshift.exceptions import FogshiftError, InvalidInput

    app = typer.Typer(help="fogshift bench", no_args_is_help=True, pretty_exceptions_enable=False)
    register(app)
    try:
        app()
    except FogshiftError as exc:
        Console(stderr=True).print(f"[red]error[/] ({exc.code}): {exc.render()}", highlight=False)
        sys.exit(2 if isinstance(exc, InvalidInput) else 1)


if __name__ == "__main__":
    main()
