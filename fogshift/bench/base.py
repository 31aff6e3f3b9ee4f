"""What every experiment shares: run logs (CSV), statistics, the machine, progress display.

A run log is a CSV with a fixed header, appended to and flushed after every run, so an
interrupted bench keeps what it measured; plots and ``results.md`` are rendered from these
files only (:mod:`fogshift.bench.report`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from fogshift.bench import thesis
from fogshift.bench.exceptions import BadBenchOption
from fogshift.common.text import one_line
from fogshift.orchestrator.config import OrchestratorConfig

MIB = 1024 * 1024


@dataclass(frozen=True)
class ClusterRunConfig:
    """The settings every experiment shares (each sets its own defaults).

    Attributes:
        checkpoint_interval_s: Node-level checkpoints (the thesis: 5 s).
        central_interval_s: Central pulls.
        timeout_s: Limit of each wait (first output; the whole output while it grows).
        seed: Seed of the random waits and the inputs.
        warm_up: Run a short pipeline on the experiment's nodes before the measured runs.
    """

    checkpoint_interval_s: float = thesis.E2_CHECKPOINT_INTERVAL_S
    central_interval_s: float = OrchestratorConfig.default("central_interval_s")
    timeout_s: float = 600.0
    seed: int = 0
    warm_up: bool = False


# -- run logs ---------------------------------------------------------------------------------


class RunLog:
    """A CSV file with a fixed header, one row per run (or sample), written as it goes.

    Args:
        path: The CSV file; created with its header (replacing an older one).
        fields: The column names; a row may leave some out (empty cells), never add one.
        append: Keep the rows of an existing file (its header must be ``fields``).

    Raises:
        BadBenchOption: ``append`` to a file of other columns (an older fogshift's).
    """

    def __init__(self, path: Path, fields: Sequence[str], append: bool = False) -> None:
        self.path = path
        self.fields = list(fields)
        #: The rows the file held already (``append``).
        self.kept = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if append and path.exists():
            with open(path, newline="") as handle:
                header = next(csv.reader(handle), [])
                self.kept = sum(1 for _ in handle)
            if header != self.fields:
                raise BadBenchOption(
                    f"cannot append to {path}: its columns differ",
                    expected=",".join(self.fields),
                    received=",".join(header),
                    hint="write to another --out, or leave out --append",
                )
            return
        with open(path, "w", newline="") as handle:
            csv.writer(handle).writerow(self.fields)

    def append(self, row: Mapping[str, Any]) -> None:
        """Append one row and flush it to disk.

        Raises:
            ValueError: ``row`` names a column the log does not have (a programming error).
        """
        unknown = set(row) - set(self.fields)
        if unknown:
            raise ValueError(f"{self.path.name}: unknown columns {sorted(unknown)}")
        with open(self.path, "a", newline="") as handle:
            csv.writer(handle).writerow([_cell(row.get(f)) for f in self.fields])

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.append(row)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        # Six significant digits, except for large values (a time of day in epoch seconds,
        # bytes): those to the thousandth, or a moment would be rounded to a quarter hour.
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a run log as strings (empty list if the file does not exist)."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def num(value: str | None) -> float | None:
    """A CSV cell as a number; ``None`` for an empty cell."""
    if value is None or value == "":
        return None
    return float(value)


def truthy(value: str | None) -> bool:
    return value == "true"


# -- statistics -------------------------------------------------------------------------------


def mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation (``None`` below two values) and count of the non-None."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None), len(xs)


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float] | None:
    """Ordinary least squares ``y = slope * x + intercept``: ``(slope, intercept, r²)``.

    Returns:
        ``None`` with fewer than two points or no spread in ``x`` (no line is defined).
    """
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    syy = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 if syy == 0 else (sxy * sxy) / (sxx * syy)
    return slope, intercept, r2


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (``None`` for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100.0 * len(ordered)) - 1)]


def fmt(value: float | None, digits: int = 0, unit: str = "") -> str:
    """A table cell: ``-`` for no value, else the number rounded to ``digits``."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def fmt_mean_std(values: Iterable[float | None], digits: int = 0, unit: str = "") -> str:
    """``mean ± std`` (or just the mean for one value, ``-`` for none)."""
    mean, std, _ = mean_std(values)
    if mean is None:
        return "-"
    if std is None:
        return fmt(mean, digits, unit)
    return f"{fmt(mean, digits)} ± {fmt(std, digits)}{unit}"


# -- the machine ------------------------------------------------------------------------------


def _first_line(args: list[str]) -> str | None:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text else None


def _cpu_model() -> str:
    # psutil has no CPU model name: /proc/cpuinfo is the one place Linux gives it.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        return round(psutil.virtual_memory().total / MIB / 1024, 1)
    except (OSError, RuntimeError):
        return None


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages, or None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def host_description() -> dict[str, Any]:
    """The machine every benchmark reports: cores (all and usable), CPU model, RAM, OS and
    Python."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "cpu_model": _cpu_model(),
        "ram_gib": _ram_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def machine_description() -> dict[str, Any]:
    """:func:`host_description` and the versions of what runs the pipelines."""
    import pyspark

    nats = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or shutil.which(
        "nats-server"
    )
    java = _first_line(["java", "-version"])
    match = re.search(r'"([^"]+)"', java or "")
    return {
        **host_description(),
        "java": match.group(1) if match else java,
        "spark": pyspark.__version__,
        "nats_server": _first_line([nats, "--version"]) if nats else None,
        "load_average_at_start": load_average(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_machine(out: Path) -> dict[str, Any]:
    """Describe the machine into ``out/machine.json``, keeping the commands recorded there."""
    path = out / "machine.json"
    previous = dict(json.loads(path.read_text())) if path.exists() else {}
    out.mkdir(parents=True, exist_ok=True)
    data = {**machine_description(), "commands": previous.get("commands", [])}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


# -- progress ---------------------------------------------------------------------------------


class Reporter:
    """Rich progress bars and notes for a bench session.

    Args:
        console: Where to draw; a non-terminal console gets plain lines (tests, CI logs).
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._progress: Progress | None = None

    @contextmanager
    def session(self) -> Iterator[Reporter]:
        """Show the bars while the block runs."""
        with Progress(
            TextColumn("[bold]{task.fields[name]}[/]"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.description}"), console=self.console,
            transient=False,
        ) as progress:  # fmt: skip
            self._progress = progress
            try:
                yield self
            finally:
                self._progress = None

    def task(self, name: str, total: int) -> TaskID | None:
        """A bar of ``total`` steps (runs) named ``name``."""
        if self._progress is None:
            return None
        return self._progress.add_task("", total=total, name=name)

    def step(self, task: TaskID | None, text: str) -> None:
        """What the task does now (shown beside its bar)."""
        if self._progress is not None and task is not None:
            self._progress.update(task, description=text)

    def advance(self, task: TaskID | None, steps: int = 1) -> None:
        """``steps`` more steps of the task are done (or skipped)."""
        if self._progress is not None and task is not None:
            self._progress.advance(task, steps)

    def note(self, text: str) -> None:
        """A line above the bars."""
        self.console.print(text, highlight=False)


def now() -> float:
    """Wall-clock seconds (the clock the nodes' timestamps use)."""
    return time.time()


# -- notes of an experiment -------------------------------------------------------------------


def write_notes(folder: Path, settings: Mapping[str, Any], skipped: Sequence[str] = ()) -> None:
    """``folder/notes.json``: the experiment's settings and what it did not run, and why.

    The settings must be those in effect (e.g. a shared cluster's checkpoint intervals, not
    the experiment's defaults): ``results.md`` quotes them.
    """
    folder.mkdir(parents=True, exist_ok=True)
    data = {"settings": dict(settings), "skipped": list(skipped)}
    (folder / "notes.json").write_text(json.dumps(data, indent=2, default=str) + "\n")


def read_notes(folder: Path) -> dict[str, Any]:
    path = folder / "notes.json"
    if not path.exists():
        return {"settings": {}, "skipped": []}
    return dict(json.loads(path.read_text()))


def record_command(
    out: Path,
    command: str,
    experiments: tuple[str, ...],
    started: dict[str, Any],
    elapsed_s: float,
    ok: bool,
    append: bool = False,
) -> None:
    """Add a bench invocation to ``out/machine.json``'s ``commands``.

    An earlier command whose experiments this one all re-ran is dropped, unless this one
    appended to their CSV files (``append``): they were overwritten, so it no longer produced
    anything in the folder.

    Args:
        experiments: The experiments it ran (their folders under ``out``).
        started: ``measured_at`` and ``load_average_at_start`` when it started
            (:func:`machine_description`).
    """
    data = write_machine(out)
    kept = [
        c
        for c in data["commands"]
        if append or not set(c.get("experiments", ())) <= set(experiments)
    ]
    kept.append(
        {"command": command, "experiments": list(experiments), "wall_s": round(elapsed_s, 1),
         "completed": ok, "started_at": started["measured_at"],
         "load_average_at_start": started["load_average_at_start"]}
    )  # fmt: skip
    data["commands"] = kept
    (out / "machine.json").write_text(json.dumps(data, indent=2) + "\n")


def failure_line(row: dict[str, Any], what: str) -> str:
    """A results.md bullet for a failed or inconsistent run: ``what`` happened, then its
    error and the problems its comparison found."""
    return (
        f"- `{row['run']}` {what}"
        + (f"; {one_line(row['error'])}" if row.get("error") else "")
        + (f"; {one_line(row['problems'])}" if row.get("problems") else "")
    )
