"""Benchmark of the backup-location planner: the exact MILP (HiGHS) against the greedy.

Reproduces the evaluation of Iijima et al. (section VI-B): Fig. 5 times both methods on
10..120 tasks (step 10) on 30 servers, Fig. 6 on 30 tasks on 30..60 servers (step 6), each
point averaged over 10 random instances. It goes beyond the paper with a greedy-only sweep up
to 1000 tasks on 200 servers. The paper does not publish its instance generator;
:func:`random_topology` is ours.

Data flow, in two steps so that every published number comes from the raw data:

1. :func:`run_benchmark` measures every run and appends it to ``runs.csv`` as soon as it is
   measured (an interrupted run keeps what it measured), and writes the configuration, the
   machine and the wall time to ``run.json``.
2. :func:`write_report` reads only those two files and writes ``results.md`` and one PNG
   per sweep. It can re-render a finished or interrupted run (``--report-only``).

The command line is ``fogshift bench planner`` (:mod:`fogshift.cli.bench`); this module has
no user interface of its own. The instances come from :mod:`fogshift.planner.instances`.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from fogshift.bench.base import host_description, load_average
from fogshift.exceptions import FogshiftError, InvalidInput
from fogshift.planner.exceptions import InfeasiblePlan, PlannerError, SolverFailed
from fogshift.planner.greedy import solve_greedy
from fogshift.planner.instances import random_topology
from fogshift.planner.milp import solve_exact
from fogshift.planner.model import Plan, Topology

# --------------------------------------------------------------------------- configuration

Method = Literal["exact", "greedy"]
METHODS: tuple[Method, ...] = ("exact", "greedy")

#: File names inside the output directory.
CSV_NAME = "runs.csv"
META_NAME = "run.json"
REPORT_NAME = "results.md"

#: Run statuses. Exact: ``optimal`` (proven within HiGHS' gap), ``time_limit`` (a plan, not
#: proven optimal), ``no_solution`` (no plan when the solver stopped), ``infeasible``
#: (proven on the share grid). Greedy: ``heuristic`` (a plan), ``stuck`` (the greedy gave up;
#: a plan may exist), ``infeasible`` (some task has no admissible option at all: proven).
#: ``error``: another fogshift error (e.g. a plan that failed its re-check), kept in the CSV
#: rather than aborting a long run.
PLAN_STATUSES = frozenset({"optimal", "time_limit", "heuristic"})

_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")


class BenchError(PlannerError):
    """The planner benchmark cannot run or report as asked."""

    code = "bench_error"
    http_status = 500


class InvalidBenchConfig(BenchError, InvalidInput):
    """A benchmark configuration or output folder that cannot be used."""

    code = "invalid_bench_config"
    http_status = 422
    default_hint = "`fogshift bench planner --help` gives the presets and options"


class InvalidBenchResults(BenchError, InvalidInput):
    """``runs.csv``/``run.json`` that are missing or not what :func:`run_benchmark` writes."""

    code = "invalid_bench_results"
    http_status = 422
    default_hint = "run `fogshift bench planner --out DIR` again to write them anew"


@dataclass(frozen=True)
class Sweep:
    """One series of instance sizes, such as the paper's Fig. 5.

    Attributes:
        name: File-safe id (``[a-z0-9_]``); the plot is ``<name>.png``.
        title: Heading in ``results.md`` and title of the plot.
        points: ``(tasks, servers)`` per point, in run order.
        methods: Methods timed on every instance, in run order.
        extra_links: :func:`random_topology`'s ``extra_links`` for this sweep's instances.
        log_x: Whether the plot's x axis is logarithmic (for sizes spanning decades).
    """

    name: str
    title: str
    points: tuple[tuple[int, int], ...]
    methods: tuple[Method, ...] = METHODS
    extra_links: float = 1.5
    log_x: bool = False

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidBenchConfig(
                f"sweep name {self.name!r} is not file-safe",
                expected="lower-case letters, digits and _",
                received=repr(self.name),
            )
        if not self.points or any(t < 0 or s < 2 for t, s in self.points):
            raise InvalidBenchConfig(
                f"sweep {self.name}: every point needs >= 0 tasks and >= 2 servers",
                expected="a non-empty list of (tasks >= 0, servers >= 2)",
                received=repr(self.points),
            )
        if not self.methods or any(m not in METHODS for m in self.methods):
            raise InvalidBenchConfig(
                f"sweep {self.name}: unknown method",
                expected="a non-empty subset of exact, greedy",
                received=repr(self.methods),
            )
        if not self.extra_links >= 0:
            raise InvalidBenchConfig(
                f"sweep {self.name}: extra_links must be >= 0",
                expected="a whole number >= 0",
                received=repr(self.extra_links),
            )

    @property
    def x_axis(self) -> Literal["tasks", "servers"]:
        """What the sweep varies: ``servers`` if only they change, else ``tasks``."""
        tasks = {t for t, _ in self.points}
        servers = {s for _, s in self.points}
        return "servers" if len(tasks) == 1 and len(servers) > 1 else "tasks"


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run measures.

    Attributes:
        preset: Name of the configuration (``reference``, ``quick`` or a test's own).
        sweeps: The sweeps, in run order; names must be unique.
        trials: Random instances per point (the paper averages 10).
        time_limit_s: Wall-clock limit of each exact solve, in s.
    """

    preset: str
    sweeps: tuple[Sweep, ...]
    trials: int
    time_limit_s: float

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise InvalidBenchConfig(
                "trials must be at least 1", expected="an integer >= 1", received=str(self.trials)
            )
        if not (self.time_limit_s > 0 and math.isfinite(self.time_limit_s)):
            raise InvalidBenchConfig(
                "the exact solver's time limit must be a positive number of seconds",
                expected="a number > 0",
                received=str(self.time_limit_s),
            )
        names = [s.name for s in self.sweeps]
        if not names or len(set(names)) != len(names):
            raise InvalidBenchConfig(
                "a configuration needs at least one sweep and unique sweep names",
                expected="one sweep or more, each named once",
                received=repr(names),
            )

    def runs_of(self, sweep: Sweep) -> int:
        """Number of runs (instances x methods) ``sweep`` makes."""
        return len(sweep.points) * self.trials * len(sweep.methods)

    @property
    def total_runs(self) -> int:
        """Number of runs of the whole configuration."""
        return sum(self.runs_of(s) for s in self.sweeps)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able copy, as stored in ``run.json``."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchConfig:
        """Inverse of :meth:`to_json`.

        Raises:
            InvalidBenchResults: If ``data`` is not a stored configuration.
        """
        try:
            sweeps = tuple(
                Sweep(
                    name=s["name"],
                    title=s["title"],
                    points=tuple((int(t), int(n)) for t, n in s["points"]),
                    methods=tuple(s["methods"]),
                    extra_links=float(s["extra_links"]),
                    log_x=bool(s["log_x"]),
                )
                for s in data["sweeps"]
            )
            return cls(
                preset=str(data["preset"]),
                sweeps=sweeps,
                trials=int(data["trials"]),
                time_limit_s=float(data["time_limit_s"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidBenchResults(
                f"{META_NAME} does not hold a benchmark configuration ({exc!r})",
                expected="the 'config' object fogshift bench planner writes",
                received=f"keys {sorted(data)}" if isinstance(data, dict) else type(data).__name__,
                hint="re-run the benchmark to regenerate it",
            ) from exc


#: The paper's grid (section VI-B, captions of Fig. 5 and Fig. 6).
FIG5_TASKS = tuple(range(10, 121, 10))
FIG6_SERVERS = tuple(range(30, 61, 6))
#: Greedy-only scale sweep: every server count with every task count up to 5 tasks per
#: server (more does not fit the generator's edge servers' CPU).
SCALE_SERVERS = (50, 100, 200)
SCALE_TASKS = (100, 250, 500, 750, 1000)
#: A denser network for the scale sweep: with the default 1.5 extra links per server, the
#: links of a 5-tasks-per-server instance fill up and the greedy gets stuck on most of them,
#: which would time how fast it gives up rather than how fast it plans.
SCALE_EXTRA_LINKS = 3.0


def _sweeps(
    fig5_tasks: Sequence[int], fig6_servers: Sequence[int], scale: Sequence[tuple[int, int]]
) -> tuple[Sweep, ...]:
    return (
        Sweep(
            "fig5_tasks",
            "Fig. 5: time against the number of tasks (30 servers)",
            tuple((t, 30) for t in fig5_tasks),
        ),
        Sweep(
            "fig6_servers",
            "Fig. 6: time against the number of servers (30 tasks)",
            tuple((30, s) for s in fig6_servers),
        ),
        Sweep(
            "greedy_scale",
            "Beyond the paper: the greedy up to 1000 tasks on 200 servers",
            tuple(scale),
            methods=("greedy",),
            extra_links=SCALE_EXTRA_LINKS,
            log_x=True,
        ),
    )


def reference_config(trials: int = 10, time_limit_s: float = 60.0) -> BenchConfig:
    """The full run: the paper's Fig. 5 and Fig. 6 grids plus the greedy scale sweep."""
    scale = tuple((t, s) for s in SCALE_SERVERS for t in SCALE_TASKS if t <= 5 * s)
    return BenchConfig("reference", _sweeps(FIG5_TASKS, FIG6_SERVERS, scale), trials, time_limit_s)


def quick_config(trials: int = 3, time_limit_s: float = 10.0) -> BenchConfig:
    """A few minutes on 2 cores: every sweep, fewer points, trials and a shorter limit."""
    scale = ((100, 50), (500, 100), (1000, 200))
    return BenchConfig(
        "quick", _sweeps((10, 40, 70, 100), (30, 45, 60), scale), trials, time_limit_s
    )


# --------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class RunRow:
    """One run of one method on one instance: a line of ``runs.csv``.

    Attributes:
        sweep: Name of the sweep.
        tasks: Number of tasks of the instance.
        servers: Number of servers.
        trial: Trial number at this point, from 0.
        seed: Seed of :func:`random_topology` (with ``extra_links``, rebuilds the instance).
        extra_links: The generator's ``extra_links``.
        method: ``exact`` or ``greedy``.
        time_limit_s: The exact solver's time limit (None for the greedy).
        status: See :data:`PLAN_STATUSES` and the module's status list.
        time_s: Wall-clock time of the solve in s: routes, model building and solving,
            not generating the instance nor re-checking the plan.
        objective_ms: ``TL`` (eq. 3) of the plan in ms; None without a plan.
        bound_ms: The exact solver's lower bound in ms, where it reports one.
        violations: Constraint violations :meth:`Plan.check` finds in the plan (None
            without a plan); anything but 0 is a solver bug.
        detail: Why there is no plan (constraint blamed, solver message), else empty.
        load1: The machine's 1-minute load average when the run started (shared machine).
    """

    sweep: str
    tasks: int
    servers: int
    trial: int
    seed: int
    extra_links: float
    method: Method
    time_limit_s: float | None
    status: str
    time_s: float
    objective_ms: float | None
    bound_ms: float | None
    violations: int | None
    detail: str
    load1: float | None

    @property
    def has_plan(self) -> bool:
        """Whether the run produced a plan."""
        return self.status in PLAN_STATUSES

    @property
    def instance(self) -> tuple[str, int, int, int]:
        """``(sweep, tasks, servers, trial)``: the key shared by the methods' runs."""
        return (self.sweep, self.tasks, self.servers, self.trial)


CSV_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RunRow))


def instance_seed(tasks: int, servers: int, trial: int) -> int:
    """The seed of one instance: a fixed function of size and trial, so reruns, partial reruns
    and a point shared by two sweeps see the same instances."""
    return tasks * 1_000_003 + servers * 1_009 + trial


def _load1() -> float | None:
    avg = load_average()
    return None if avg is None else avg[0]


@dataclass(frozen=True)
class Outcome:
    """What one solve produced: its status, time, plan (if any) and why not."""

    status: str
    time_s: float
    plan: Plan | None
    detail: str = ""


def measure(method: Method, topology: Topology, time_limit_s: float) -> Outcome:
    """Time one method on one instance.

    The exact solve starts cold (no greedy warm start) so it times HiGHS alone, as the paper
    times CBC; planner errors become statuses so a long run is never aborted by one instance.

    Args:
        method: ``exact`` or ``greedy``.
        topology: The instance.
        time_limit_s: The exact solver's time limit (ignored by the greedy).

    Returns:
        The outcome; ``plan`` is set exactly when ``status`` is in :data:`PLAN_STATUSES`.
    """
    start = time.perf_counter()
    result: Plan | None = None
    status: str
    detail = ""
    try:
        if method == "greedy":
            result = solve_greedy(topology)
        else:
            result = solve_exact(topology, time_limit_s=time_limit_s)
        status = result.status
    except InfeasiblePlan as exc:
        status = "infeasible" if exc.proven or method == "exact" else "stuck"
        detail = exc.constraint
    except SolverFailed as exc:
        status = "no_solution"
        detail = exc.message.splitlines()[0]
    except FogshiftError as exc:
        status = "error"
        detail = f"{exc.code}: {exc.message.splitlines()[0]}"
    return Outcome(status, time.perf_counter() - start, result, detail)


def machine_info() -> dict[str, Any]:
    """The machine (:func:`~fogshift.bench.base.host_description`) and the solver's versions."""

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    import highspy  # already imported by the solver; here only for HiGHS' own version

    return {**host_description(), "highspy": version("highspy"), "highs": highspy.Highs().version()}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: a reader never sees half a file


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # round-trips exactly, so the report recomputes the same numbers
    return str(value)


def run_benchmark(
    config: BenchConfig,
    out_dir: str | Path,
    *,
    command: str = "",
    note: str = "",
    on_start: Callable[[Sweep, int, int, int, Method], None] | None = None,
    on_row: Callable[[RunRow], None] | None = None,
) -> list[RunRow]:
    """Measure every run of ``config`` and write ``runs.csv``, ``run.json`` and the report.

    For every sweep, point and trial, one instance is generated and every method of the
    sweep is timed on it (:func:`measure`); each plan is re-checked with
    :meth:`Plan.check`, outside the timing. Rows are appended to ``runs.csv`` and flushed
    as they are measured. ``run.json`` holds the configuration, the machine, the command,
    ``note``, start and end time, wall time and the load average at start and end. Then
    :func:`write_report` renders ``results.md`` and the plots. Files of a previous run in
    ``out_dir`` are replaced.

    Args:
        config: What to measure.
        out_dir: Output folder, created if missing.
        command: The command line that started the run, for the report.
        note: Free text for the report (e.g. what else ran on the machine).
        on_start: Called before each run with ``(sweep, tasks, servers, trial, method)``.
        on_row: Called with each row once it is measured and written.

    Returns:
        Every row, in run order.

    Raises:
        InvalidBenchConfig: If ``out_dir`` is not a usable folder, or a point's tasks do not
            fit its servers' CPU.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidBenchConfig(
            f"output path {str(out)!r} is not a folder",
            expected="a folder (created if missing)",
            received="an existing file",
            hint="choose another --out",
        )
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "config": config.to_json(),
        "machine": machine_info(),
        "command": command,
        "note": note,
        "started": _now(),
        "finished": None,
        "wall_s": None,
        "load_start": load_average(),
        "load_end": None,
    }
    _write_json(out / META_NAME, meta)
    rows: list[RunRow] = []
    start = time.perf_counter()
    with (out / CSV_NAME).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_FIELDS)
        for sweep in config.sweeps:
            for tasks, servers in sweep.points:
                for trial in range(config.trials):
                    seed = instance_seed(tasks, servers, trial)
                    topo = _instance(tasks, servers, seed, sweep)
                    for method in sweep.methods:
                        if on_start is not None:
                            on_start(sweep, tasks, servers, trial, method)
                        load = _load1()
                        outcome = measure(method, topo, config.time_limit_s)
                        plan = outcome.plan
                        row = RunRow(
                            sweep=sweep.name,
                            tasks=tasks,
                            servers=servers,
                            trial=trial,
                            seed=seed,
                            extra_links=sweep.extra_links,
                            method=method,
                            time_limit_s=config.time_limit_s if method == "exact" else None,
                            status=outcome.status,
                            time_s=outcome.time_s,
                            objective_ms=None if plan is None else plan.objective_ms,
                            bound_ms=None if plan is None else plan.bound_ms,
                            violations=None if plan is None else len(plan.check(topo)),
                            detail=outcome.detail,
                            load1=load,
                        )
                        writer.writerow([_csv_value(getattr(row, f)) for f in CSV_FIELDS])
                        fh.flush()
                        rows.append(row)
                        if on_row is not None:
                            on_row(row)
    meta.update(
        finished=_now(),
        wall_s=time.perf_counter() - start,
        load_end=load_average(),
    )
    _write_json(out / META_NAME, meta)
    write_report(out)
    return rows


def _instance(tasks: int, servers: int, seed: int, sweep: Sweep) -> Topology:
    try:
        return random_topology(tasks, servers, seed, extra_links=sweep.extra_links)
    except ValueError as exc:
        raise InvalidBenchConfig(
            f"sweep {sweep.name}: cannot generate {tasks} tasks on {servers} servers: {exc}",
            expected="at most about 5 tasks per server (edge servers have 100 CPU)",
            received=f"{tasks} tasks, {servers} servers",
            hint="use fewer tasks or more servers at this point",
        ) from exc


# --------------------------------------------------------------------------- reading


def _opt(text: str, cast: Callable[[str], Any]) -> Any:
    return None if text == "" else cast(text)


def read_rows(path: str | Path) -> list[RunRow]:
    """Read a ``runs.csv`` written by :func:`run_benchmark`.

    Raises:
        InvalidBenchResults: If the file is missing, has other columns or a bad value.
    """
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if tuple(reader.fieldnames or ()) != CSV_FIELDS:
                raise InvalidBenchResults(
                    f"{path} does not have the columns of a planner benchmark",
                    expected=", ".join(CSV_FIELDS),
                    received=", ".join(reader.fieldnames or ()),
                    hint="it must be the runs.csv `fogshift bench planner` wrote",
                )
            rows = []
            for k, rec in enumerate(reader, start=2):
                try:
                    rows.append(
                        RunRow(
                            sweep=rec["sweep"],
                            tasks=int(rec["tasks"]),
                            servers=int(rec["servers"]),
                            trial=int(rec["trial"]),
                            seed=int(rec["seed"]),
                            extra_links=float(rec["extra_links"]),
                            method="exact" if rec["method"] == "exact" else "greedy",
                            time_limit_s=_opt(rec["time_limit_s"], float),
                            status=rec["status"],
                            time_s=float(rec["time_s"]),
                            objective_ms=_opt(rec["objective_ms"], float),
                            bound_ms=_opt(rec["bound_ms"], float),
                            violations=_opt(rec["violations"], int),
                            detail=rec["detail"],
                            load1=_opt(rec["load1"], float),
                        )
                    )
                except (TypeError, ValueError) as exc:
                    raise InvalidBenchResults(
                        f"{path}, line {k}: bad value ({exc})",
                        expected="a row as fogshift bench planner writes it",
                        received=repr(rec)[:300],
                    ) from exc
                if rec["method"] not in METHODS:
                    raise InvalidBenchResults(
                        f"{path}, line {k}: unknown method",
                        expected="exact or greedy",
                        received=repr(rec["method"]),
                    )
            return rows
    except OSError as exc:
        raise InvalidBenchResults(
            f"cannot read {path}: {exc.strerror or exc}",
            expected=f"a readable {path.name}",
            received=exc.strerror or str(exc),
            hint="run `fogshift bench planner --out DIR` first",
        ) from exc


def read_meta(path: str | Path) -> tuple[BenchConfig, dict[str, Any]]:
    """Read ``run.json``: the configuration and the whole record.

    Raises:
        InvalidBenchResults: If the file is missing or not what :func:`run_benchmark` writes.
    """
    path = Path(path)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidBenchResults(
            f"cannot read {path}: {exc.strerror or exc}",
            expected=f"a readable {path.name}",
            received=exc.strerror or str(exc),
            hint="run `fogshift bench planner --out DIR` first",
        ) from exc
    except json.JSONDecodeError as exc:
        raise InvalidBenchResults(
            f"{path} is not valid JSON: {exc}",
            expected="JSON as fogshift bench planner writes it",
            received=f"text that is not JSON ({exc.msg} at line {exc.lineno})",
        ) from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise InvalidBenchResults(
            f"{path} has no 'config' object",
            expected="an object with a 'config' object",
            received=f"keys {sorted(meta)}" if isinstance(meta, dict) else type(meta).__name__,
            hint="re-run the benchmark to regenerate it",
        )
    return BenchConfig.from_json(meta["config"]), meta


# --------------------------------------------------------------------------- summarising


def _gap_tolerance(optimum: float) -> float:
    # HiGHS proves optimality within mip_rel_gap = 1e-6 (milp.py): smaller differences are
    # not differences.
    return 1e-6 * max(1.0, abs(optimum))


@dataclass
class PointSummary:
    """Everything the report says about one point of one sweep, computed from its rows.

    Attributes:
        sweep: Sweep name.
        tasks: Number of tasks.
        servers: Number of servers.
        trials: Instances measured at this point.
        times: Run times in s per method.
        outcomes: Status counts per method.
        infeasible: Instances proven infeasible (by either method).
        undecided: Instances with neither a plan nor a proof of infeasibility.
        exact_optimal: Instances the exact solver proved optimal within the limit.
        gaps_ms: Greedy objective minus the optimum, for instances where the exact run is
            optimal and the greedy found a plan (the gap basis), in trial order.
        optima_ms: The optima of the same instances, in the same order.
        errors: Runs with status ``error`` or a plan with violations (solver bugs).
    """

    sweep: str
    tasks: int
    servers: int
    trials: int = 0
    times: dict[str, list[float]] = field(default_factory=dict)
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    infeasible: int = 0
    undecided: int = 0
    exact_optimal: int = 0
    gaps_ms: list[float] = field(default_factory=list)
    optima_ms: list[float] = field(default_factory=list)
    errors: int = 0

    def mean(self, method: str) -> float | None:
        """Mean run time of ``method`` in s (None if it did not run here)."""
        ts = self.times.get(method)
        return statistics.fmean(ts) if ts else None

    def median(self, method: str) -> float | None:
        """Median run time of ``method`` in s (None if it did not run here)."""
        ts = self.times.get(method)
        return statistics.median(ts) if ts else None

    @property
    def greedy_matches(self) -> int:
        """Gap-basis instances where the greedy's objective equals the optimum."""
        return sum(
            1 for g, o in zip(self.gaps_ms, self.optima_ms, strict=True) if g <= _gap_tolerance(o)
        )

    @property
    def mean_gap_ms(self) -> float | None:
        """Mean greedy-minus-optimum over the gap basis, in ms."""
        return statistics.fmean(self.gaps_ms) if self.gaps_ms else None

    @property
    def max_gap_ms(self) -> float | None:
        """Largest greedy-minus-optimum over the gap basis, in ms."""
        return max(self.gaps_ms) if self.gaps_ms else None

    @property
    def relative_gap(self) -> float | None:
        """``Σ greedy / Σ optimum - 1`` over the gap basis.

        A ratio of sums rather than a mean of ratios because optima of 0 (every task
        co-located) are common: 0 if both sums are 0, ``inf`` if only the optima's is.
        """
        if not self.gaps_ms:
            return None
        opt = sum(self.optima_ms)
        gap = sum(self.gaps_ms)
        if opt > 0:
            return gap / opt
        return 0.0 if gap <= _gap_tolerance(0.0) else math.inf


def summarise(rows: Sequence[RunRow]) -> list[PointSummary]:
    """Group rows by sweep and point and compute what the report shows.

    Returns:
        One summary per ``(sweep, tasks, servers)``, in order of first appearance.
    """
    points: dict[tuple[str, int, int], PointSummary] = {}
    by_instance: dict[tuple[str, int, int, int], dict[str, RunRow]] = {}
    for r in rows:
        key = (r.sweep, r.tasks, r.servers)
        p = points.setdefault(key, PointSummary(r.sweep, r.tasks, r.servers))
        p.times.setdefault(r.method, []).append(r.time_s)
        p.outcomes.setdefault(r.method, Counter())[r.status] += 1
        if r.status == "error" or (r.violations or 0) > 0:
            p.errors += 1
        by_instance.setdefault(r.instance, {})[r.method] = r
    for (sweep, tasks, servers, _), runs in by_instance.items():
        p = points[(sweep, tasks, servers)]
        p.trials += 1
        exact, greedy = runs.get("exact"), runs.get("greedy")
        if any(r.status == "infeasible" for r in runs.values()):
            p.infeasible += 1
        elif not any(r.has_plan for r in runs.values()):
            p.undecided += 1
        if exact is not None and exact.status == "optimal":
            p.exact_optimal += 1
            if greedy is not None and greedy.has_plan:
                assert exact.objective_ms is not None and greedy.objective_ms is not None
                p.gaps_ms.append(greedy.objective_ms - exact.objective_ms)
                p.optima_ms.append(exact.objective_ms)
    return list(points.values())


# --------------------------------------------------------------------------- reporting


def fmt_time(seconds: float | None) -> str:
    """A duration for the report: ms below 1 s, else s."""
    if seconds is None:
        return "-"
    if seconds < 1.0:
        return f"{seconds * 1000:.2f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_gap_s(gap_ms: float | None) -> str:
    """A gap in the report's unit, s with 2 decimals ("-" when there is no gap basis)."""
    return "-" if gap_ms is None else f"{gap_ms / 1000:.2f}"


def fmt_rel(rel: float | None) -> str:
    """A relative gap in % with 1 decimal ("∞" when every optimum is 0 but the greedy is not)."""
    if rel is None:
        return "-"
    return "∞" if math.isinf(rel) else f"{rel * 100:.1f} %"


def _counts(c: Counter[str] | None) -> str:
    if not c:
        return "-"
    return ", ".join(
        f"{n} {status}" for status, n in sorted(c.items(), key=lambda x: (-x[1], x[0]))
    )


def _table(sweep: Sweep, summaries: Sequence[PointSummary]) -> list[str]:
    exact = "exact" in sweep.methods
    greedy = "greedy" in sweep.methods
    head = ["tasks", "servers", "trials"]
    if exact:
        head += ["exact mean", "exact median", "exact outcomes"]
    if greedy:
        head += ["greedy mean", "greedy median"]
        # The paper's claim for the greedy is a bound ("less than 1 second"): show the worst
        # run where the greedy is the only method, where the table has room for it.
        head += ["greedy outcomes"] if exact else ["greedy max", "greedy outcomes"]
    if exact and greedy:
        head += [
            "speed-up",
            "gap basis",
            "greedy = opt",
            "mean gap (s)",
            "max gap (s)",
            "rel. gap",
        ]
    head += ["infeasible", "undecided"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in summaries:
        cells = [str(p.tasks), str(p.servers), str(p.trials)]
        if exact:
            cells += [
                fmt_time(p.mean("exact")),
                fmt_time(p.median("exact")),
                _counts(p.outcomes.get("exact")),
            ]
        if greedy:
            ts = p.times.get("greedy")
            cells += [fmt_time(p.mean("greedy")), fmt_time(p.median("greedy"))]
            if not exact:
                cells.append(fmt_time(max(ts) if ts else None))
            cells.append(_counts(p.outcomes.get("greedy")))
        if exact and greedy:
            e, g = p.mean("exact"), p.mean("greedy")
            cells += [
                f"{e / g:.0f}x" if e is not None and g else "-",
                f"{len(p.gaps_ms)}/{p.trials}",
                f"{p.greedy_matches}/{len(p.gaps_ms)}",
                fmt_gap_s(p.mean_gap_ms),
                fmt_gap_s(p.max_gap_ms),
                fmt_rel(p.relative_gap),
            ]
        cells += [str(p.infeasible), str(p.undecided)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _machine_lines(meta: Mapping[str, Any]) -> list[str]:
    m = meta.get("machine") or {}

    def load(key: str) -> str:
        v = meta.get(key)
        return "-" if not v else " / ".join(f"{x:.2f}" for x in v)

    ram = m.get("ram_gib")
    return [
        f"- CPU: {m.get('cpu_model') or 'unknown'}; {m.get('cores')} cores "
        f"({m.get('usable_cores')} usable by this process)",
        f"- RAM: {'unknown' if ram is None else f'{ram:.1f} GiB'}",
        f"- OS: {m.get('os')}; Python: {m.get('python')}",
        f"- Solver: HiGHS {m.get('highs')} (highspy {m.get('highspy')})",
        f"- Load average (1/5/15 min) at start: {load('load_start')}; at end: {load('load_end')}",
    ]


def _load_line(rows: Sequence[RunRow], meta: Mapping[str, Any]) -> str:
    loads = [r.load1 for r in rows if r.load1 is not None]
    cores = (meta.get("machine") or {}).get("usable_cores") or (meta.get("machine") or {}).get(
        "cores"
    )
    if not loads:
        return "- The 1-minute load average was not available during the runs."
    busy = sum(1 for x in loads if cores and x > cores)
    return (
        f"- 1-minute load average at the start of each run: median "
        f"{statistics.median(loads):.2f}, max {max(loads):.2f}; above the {cores} usable cores "
        f"for {busy} of {len(loads)} runs. Above the core count, other work competed with the "
        "benchmark for the CPU and the times are longer than on an idle machine."
    )


def render_report(
    config: BenchConfig, meta: Mapping[str, Any], rows: Sequence[RunRow], plots: Mapping[str, str]
) -> str:
    """The text of ``results.md``, computed from the rows and ``run.json``.

    Args:
        config: The run's configuration.
        meta: The rest of ``run.json`` (machine, command, note, times).
        rows: Every row of ``runs.csv``.
        plots: Plot file name per sweep name (sweeps without a plot are left out).

    Returns:
        Markdown.
    """
    summaries = summarise(rows)
    n_plans = sum(1 for r in rows if r.has_plan)
    bad = sum(1 for r in rows if (r.violations or 0) > 0)
    errors = sum(1 for r in rows if r.status == "error")
    wall = meta.get("wall_s")
    complete = len(rows) == config.total_runs and meta.get("finished") is not None
    lines = [
        "# Planner benchmark: exact MILP (HiGHS) vs greedy",
        "",
        "Iijima et al., *Deciding Backup Location Methods for Distributed Stream Processing "
        "System*, section VI-B (Fig. 5 and Fig. 6), on fogshift's planner; see "
        "`docs/planner.md`. Written by `fogshift bench planner` from `runs.csv` and `run.json` "
        "in this folder: every number below is computed from them.",
        "",
        "## Run",
        "",
        f"- Command: `{meta.get('command') or '(not recorded)'}` (preset `{config.preset}`)",
        f"- Runs: {len(rows)} of {config.total_runs} planned"
        + ("" if complete else " - **incomplete run**: the tables cover what was measured"),
        f"- Started {meta.get('started')}, wall time "
        + ("-" if wall is None else f"{wall / 60:.1f} min"),
        f"- Trials per point: {config.trials}; exact solver time limit: "
        f"**{config.time_limit_s:g} s** per run",
        f"- Plans re-checked with `Plan.check`: {n_plans}; with a violation: {bad}; runs "
        f"ended by another error: {errors}",
    ]
    if meta.get("note"):
        lines.append(f"- Note: {meta['note']}")
    lines += ["", "## Machine", "", *_machine_lines(meta), _load_line(rows, meta), ""]
    lines += [
        "## What is measured",
        "",
        "- Instances come from `random_topology(tasks, servers, seed, extra_links=...)` "
        "(`fogshift/planner/instances.py`); the CSV's `seed` and `extra_links` rebuild each one. "
        "Every method of a sweep runs on the same instances.",
        "- Time: wall-clock of one solve (routes, model building, solving), not generating "
        "the instance nor re-checking the plan. The exact solver starts cold (no greedy warm "
        "start), so it times HiGHS alone, as the paper times CBC; unlike the paper, which "
        "stops CBC at its first solution, it runs to proven optimality or the time limit. An "
        "infeasible exact run includes explaining the conflict.",
        "- Mean and median include every run: a run stopped by the time limit counts with its "
        "measured time (about the limit), so at points with `time_limit`/`no_solution` "
        "outcomes the exact solver's real cost is higher than shown.",
        "- Outcomes: exact `optimal` (proven), `time_limit` (a plan, not proven optimal), "
        "`no_solution` (none at the limit), `infeasible` (proven); greedy `heuristic` (a "
        "plan), `stuck` (gave up; a plan may exist), `infeasible` (a task has no admissible "
        "option at all: proven). `infeasible` (column) counts instances proven infeasible by "
        "either method, `undecided` those with neither a plan nor a proof; none is dropped "
        "from the times.",
        "- Gap (greedy objective minus optimum, `TL` of eq. 3 in s) only over the *gap "
        "basis*: instances the exact solver proved optimal within the limit **and** the "
        "greedy found a plan for (`gap basis` = how many of the trials). `greedy = opt` counts "
        "gaps within HiGHS' relative tolerance 1e-6; `rel. gap` is sum(greedy) / sum(optimum) - 1 "
        "over the gap basis (a ratio of sums, as optima of 0 are common); `speed-up` is exact "
        "mean / greedy mean.",
        "",
    ]
    for sweep in config.sweeps:
        sums = [p for p in summaries if p.sweep == sweep.name]
        lines += [f"## {sweep.title}", ""]
        params = f"Sweep `{sweep.name}`: methods {', '.join(sweep.methods)}; "
        params += f"`extra_links={sweep.extra_links:g}`."
        lines += [params, ""]
        if not sums:
            lines += ["No runs measured.", ""]
            continue
        if sweep.name in plots:
            lines += [f"![{sweep.title}]({plots[sweep.name]})", ""]
        lines += _table(sweep, sums)
        inf = sum(p.infeasible for p in sums)
        und = sum(p.undecided for p in sums)
        n = sum(p.trials for p in sums)
        lines += ["", f"Infeasible instances: {inf} of {n}; undecided: {und} of {n}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_plots(out_dir: str | Path, config: BenchConfig, rows: Sequence[RunRow]) -> dict[str, str]:
    """Draw one PNG per sweep with runs: time per run against the varied size, log y.

    Each method (and, when a sweep varies both sizes, each server count) is a line through
    the mean times, with every single run as a faint dot; the exact solver's time limit is a
    dotted line. Matplotlib runs on the Agg backend (no display needed).

    Returns:
        The file name written per sweep name.

    Raises:
        BenchError: If matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: servers and CI have no display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator
    except ImportError as exc:
        raise BenchError(
            "matplotlib is needed for the benchmark's plots",
            hint="pip install 'fogshift[bench]', then "
            "`fogshift bench planner --out DIR --report-only`",
        ) from exc
    out = Path(out_dir)
    written: dict[str, str] = {}
    for sweep in config.sweeps:
        mine = [r for r in rows if r.sweep == sweep.name]
        if not mine:
            continue
        x_of: Callable[[RunRow], int] = (
            (lambda r: r.servers) if sweep.x_axis == "servers" else (lambda r: r.tasks)
        )
        group_of: Callable[[RunRow], int] = (
            (lambda r: r.tasks) if sweep.x_axis == "servers" else (lambda r: r.servers)
        )
        groups = sorted({group_of(r) for r in mine})
        fig, ax = plt.subplots(figsize=(9.5, 4.8))
        markers = iter("osD^v<>ph*")
        for method in sweep.methods:
            for group in groups:
                series = [r for r in mine if r.method == method and group_of(r) == group]
                if not series:
                    continue
                by_x: dict[int, list[float]] = {}
                for r in series:
                    by_x.setdefault(x_of(r), []).append(r.time_s)
                xs = sorted(by_x)
                other = "tasks" if sweep.x_axis == "servers" else "servers"
                label = method if len(groups) == 1 else f"{method}, {group} {other}"
                (line,) = ax.plot(
                    xs,
                    [statistics.fmean(by_x[x]) for x in xs],
                    marker=next(markers, "o"),
                    linestyle="-" if method == "exact" else "--",
                    label=f"{label} (mean)",
                )
                ax.scatter(
                    [x_of(r) for r in series],
                    [r.time_s for r in series],
                    s=10,
                    alpha=0.3,
                    color=line.get_color(),
                )
        if "exact" in sweep.methods:
            ax.axhline(
                config.time_limit_s,
                color="grey",
                linestyle=":",
                label=f"exact time limit ({config.time_limit_s:g} s)",
            )
        ax.set_yscale("log")
        if sweep.log_x:
            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(NullLocator())
        # Tick exactly the measured sizes (as the paper's figures do), in plain numbers even
        # on a log axis, where matplotlib would otherwise label only the decades.
        ticks = sorted({x_of(r) for r in mine})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel(f"number of {sweep.x_axis}")
        ax.set_ylabel("time per run (s)")
        ax.set_title(sweep.title, fontsize="medium")
        ax.grid(True, which="both", alpha=0.3)
        # Outside the axes: inside, it hides runs or the time-limit line on some sweep.
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        name = f"{sweep.name}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written[sweep.name] = name
    return written


def write_report(out_dir: str | Path) -> Path:
    """Render ``results.md`` and the plots from ``runs.csv`` and ``run.json`` in ``out_dir``.

    Returns:
        The path of ``results.md``.

    Raises:
        InvalidBenchResults: If the two files are missing or malformed.
        BenchError: If matplotlib is not installed.
    """
    out = Path(out_dir)
    config, meta = read_meta(out / META_NAME)
    rows = read_rows(out / CSV_NAME)
    known = {s.name for s in config.sweeps}
    stray = sorted({r.sweep for r in rows} - known)
    if stray:
        raise InvalidBenchResults(
            f"{out / CSV_NAME} has rows of sweeps {', '.join(stray)} that {META_NAME} lacks",
            expected=", ".join(sorted(known)),
            received=", ".join(stray),
            hint="runs.csv and run.json must come from the same run",
        )
    plots = write_plots(out, config, rows)
    path = out / REPORT_NAME
    path.write_text(render_report(config, meta, rows, plots), encoding="utf-8")
    return path
