"""The bench's workload: Case 1 inputs fed at a rate, its specs, and its consistency verdict.

A run must last as long as its experiment needs (a migration may take seconds or a minute),
while the thesis's input rate stays fixed. So the input file grows while the run goes on:
:class:`InputFeeder` appends rows well ahead of the source's rate schedule (``csv-source``
reads row *k* at ``t0 + k / rate`` and re-reads a file that grew), and stops when the
experiment's action is over; the stream then ends ``lead_s`` later. A row is always complete
seconds before it is due, so the source never sees half a line.

The verdict compares the sink's whole output with :func:`fogshift.verify.reference.case1_reference`
over the final input file — the same reference and comparison ``fogshift demo`` uses.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fogshift.bench.cluster import BenchCluster
from fogshift.bench.padded import aggregate_element
from fogshift.exceptions import FogshiftError
from fogshift.spec.loader import load_spec
from fogshift.verify.case1 import case1_parts

if TYPE_CHECKING:
    from fogshift.verify.reference import Verdict

HEADER = "timestamp,sensor,value"
INPUT = "in.csv"
OUTPUT = "out/out.csv"


class InputFeeder:
    """Writes a Case 1 input (``timestamp,sensor,value``, clean rows) ahead of its schedule.

    Args:
        path: The input file (created with its header).
        rate: The source's rate in events/s; 0 means "as fast as possible" (use
            :meth:`prefill` only: the source reads whatever is in the file).
        seed: Seed of the values; equal seeds give equal files.
        lead_s: How far ahead of the schedule the file is kept (and how long the stream
            goes on after :meth:`finish`).
    """

    def __init__(self, path: Path, rate: float, seed: int, lead_s: float = 4.0) -> None:
        self.path = path
        self.rate = rate
        self.lead_s = lead_s
        self.rows = 0
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t_ref = 0.0
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER + "\n")

    def prefill(self, rows: int) -> None:
        """Append ``rows`` rows now."""
        lines = []
        for _ in range(rows):
            self.rows += 1
            value = self._random.uniform(-50.0, 150.0)
            lines.append(f"{1_700_000_000 + self.rows},{self.sensor()},{value:.4f}\n")
        with open(self.path, "a") as handle:
            handle.write("".join(lines))

    def sensor(self) -> str:
        """The sensor of row :attr:`rows`: one of 4 in turn (subclasses draw others)."""
        return f"s{self.rows % 4}"

    def start(self) -> None:
        """Keep the file ``lead_s`` ahead of a schedule that starts now.

        The source's own schedule starts when its query starts (later), so it is never ahead
        of this one.
        """
        self._t_ref = time.time()
        self.prefill(int(self.lead_s * self.rate) + 1)
        self._thread = threading.Thread(target=self._run, name="input-feeder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            due = (time.time() - self._t_ref) * self.rate
            wanted = int(due + self.lead_s * self.rate) + 1
            if self.rows < wanted:
                # Half a lead at a time: few writes, and each row is written lead_s/2 early.
                self.prefill(wanted - self.rows + int(self.lead_s * self.rate / 2))

    def finish(self) -> int:
        """Stop growing the file; returns its number of data rows (the stream's length)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.rows


def write_case1(
    work: Path,
    name: str,
    *,
    rate: float,
    agg_node: str,
    pad_bytes: int = 0,
    window: int = 10,
    edge_node: str = "cloud",
    auto_recovery: bool = True,
    standby: str | None = None,
) -> Path:
    """Write the spec of Case 1 (csv-source -> window avg -> csv-sink) into ``work``.

    The source and the sink run on ``edge_node`` (the thesis's desktop PC), the aggregate on
    ``agg_node`` with ``pad_bytes`` of added state. The input is ``work/in.csv``.

    Args:
        auto_recovery: Whether the orchestrator restores the pipeline's PEs by itself when
            their node goes silent; experiments that restore on their own turn it off.
        standby: Keep hot standbys on this node (``recovery.standby``).
    """
    spec: dict[str, Any] = {
        "pipeline": name,
        "elements": [
            {"id": "source", "kind": "csv-source", "node": edge_node,
             "options": {"path": INPUT, "rate": rate}},
            aggregate_element(agg_node, pad_bytes, window),
            {"id": "sink", "kind": "csv-sink", "node": edge_node, "inputs": ["aggregate"],
             "options": {"path": OUTPUT}},
        ],
        "recovery": {"auto": auto_recovery, **({"standby": standby} if standby else {})},
    }  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sink_rows(cluster: BenchCluster, pipeline: str) -> int:
    """Lines the pipeline's sink has committed so far."""
    return int(cluster.element(pipeline, "sink")["events_out"])


def wait_rows(
    cluster: BenchCluster,
    pipeline: str,
    at_least: int,
    timeout_s: float,
    stall_s: float | None = None,
) -> int:
    """Wait until the sink has written ``at_least`` lines; returns the lines written.

    Gives up after ``timeout_s``, or after ``stall_s`` without a new line (a stuck pipeline
    fails its run quickly; a slow one that still progresses gets the whole ``timeout_s``).
    """
    deadline = time.monotonic() + timeout_s
    last, last_change = -1, time.monotonic()
    while True:
        rows = sink_rows(cluster, pipeline)
        now = time.monotonic()
        if rows != last:
            last, last_change = rows, now
        stalled = stall_s is not None and now - last_change > stall_s
        if rows >= at_least or now > deadline or stalled:
            return rows
        time.sleep(0.5)


def verdict(
    cluster: BenchCluster, spec_path: Path, timeout_s: float, stall_s: float = 120.0
) -> Verdict:
    """Wait for the whole output of a finished input, then compare it with the reference.

    Call after the input stopped growing. Waits until the sink has as many lines as the
    reference has rows (at most ``timeout_s``, or ``stall_s`` without progress), then a
    little longer - a duplicate would show within a batch or two - and compares every row:
    missing, extra, duplicated, reordered rows and wrong values all make the run
    inconsistent.
    """
    # pandas (the reference) loads only here, not with every `fogshift` command.
    from fogshift.verify.reference import case1_reference, compare, read_sink

    spec = load_spec(spec_path)
    source, agg, sink = case1_parts(spec)
    reference = case1_reference(source, agg["field"], agg["window"], agg.get("function", "avg"))
    written = wait_rows(cluster, spec.pipeline, len(reference.rows), timeout_s, stall_s)
    time.sleep(1.0)
    result = compare(reference.rows, read_sink(sink, agg["field"]))
    if written < len(reference.rows):
        result.problems.insert(
            0, f"the sink wrote {written} of {len(reference.rows)} rows within {timeout_s:.0f} s"
        )
        result.consistent = False
    return result


class Case1Run:
    """One run of Case 1: its input fed at a rate, its pipeline, and the run's row.

    Used as ``with Case1Run(...) as run:``: on entry the input starts growing; the block
    calls :meth:`deploy`, does the experiment's action, :meth:`finish_input` and
    :meth:`check`. A :class:`FogshiftError` in the block is the run's failure (the row's
    ``error``, not consistent) and goes no further: the bench carries on with its next run.
    On exit the input stops and the pipeline is stopped.

    Args:
        cluster: The cluster to run on.
        name: The pipeline's name; its files live in ``<cluster home>/runs/<name>``.
        rate: Events per second of the source.
        seed: The experiment's seed (mixed with ``name``: every run has its own input).
        agg_node: Where the aggregate runs.
        row: The row's first columns (default ``{"status": "error"}``, until the block sets
            the real status).
        lead_s: How far ahead of its schedule the input is written (:class:`InputFeeder`).
        prefill: Write this many rows at once instead of growing the input on a schedule.
        spec_options: More :func:`write_case1` options (``pad_bytes``, ``auto_recovery``).
    """

    def __init__(
        self,
        cluster: BenchCluster,
        name: str,
        *,
        rate: float,
        seed: int,
        agg_node: str,
        row: dict[str, Any] | None = None,
        lead_s: float = 4.0,
        prefill: int = 0,
        **spec_options: Any,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.work = cluster.home / "runs" / name
        self.feeder = InputFeeder(
            self.work / INPUT, rate, seed=zlib.crc32(name.encode()) ^ seed, lead_s=lead_s
        )
        self.spec = write_case1(self.work, name, rate=rate, agg_node=agg_node, **spec_options)
        self.row: dict[str, Any] = row if row is not None else {"status": "error"}
        self.prefill = prefill
        self.t0 = 0.0

    def __enter__(self) -> Case1Run:
        self.t0 = time.time()
        if self.prefill:
            self.feeder.prefill(self.prefill)  # a file that does not change is never re-scanned
        else:
            self.feeder.start()
        return self

    def deploy(self) -> None:
        """Deploy the pipeline (its source starts reading the growing input)."""
        # (A run's name may be an earlier bench's on a kept cluster: each run is anew.)
        self.cluster.cli("deploy", str(self.spec), "--fresh")

    def finish_input(self) -> int:
        """Stop the input growing (the experiment's action is over); records ``events``."""
        self.row["events"] = self.feeder.finish()
        return int(self.row["events"])

    def check(self, timeout_s: float) -> Verdict:
        """The run's :func:`verdict`, recorded as ``consistent`` and ``problems``."""
        result = verdict(self.cluster, self.spec, timeout_s)
        self.row.update(consistent=result.consistent, problems="; ".join(result.problems) or None)
        return result

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        self.feeder.finish()
        self.cluster.cli("stop", self.name, check=False)
        if isinstance(exc, FogshiftError):
            self.row.update(error=exc.message, consistent=False)
            return True  # a failed run is a row, not the end of the bench
        return False


def warm_up(cluster: BenchCluster, nodes: list[str], work: Path, timeout_s: float = 600) -> None:
    """Run a short Case 1 with its aggregate on each of ``nodes`` (in parallel), then stop them.

    A node's first ``transformWithStateInPandas`` query pays for JVM code paths and caches
    that later ones do not (seconds to tens of seconds on a loaded machine); the thesis's
    containers were long-running. Measured runs start on warm nodes.
    """
    specs = []
    for node in nodes:
        name = f"warm-{node}-{int(time.time() * 1000) % 10**8}"
        feeder = InputFeeder(work / name / INPUT, rate=0, seed=0)
        feeder.prefill(30)
        specs.append((name, write_case1(work / name, name, rate=0, agg_node=node)))
    for _, spec in specs:
        cluster.cli("deploy", str(spec), "--fresh")  # (a run is anew, its name too)
    try:
        for name, _ in specs:
            wait_rows(cluster, name, 30, timeout_s)
    finally:
        for name, _ in specs:
            cluster.cli("stop", name, check=False)
