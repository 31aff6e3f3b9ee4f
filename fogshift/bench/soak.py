"""Soak: three pipelines under random migrations, key moves, scales and SIGKILLs, then lost,
duplicated, wrong rows.

``fogshift bench soak --migrations N --kills M`` starts one cluster (``--nodes``, 4 by default)
and runs three pipelines on it (``--pipelines``: all by default) while their inputs keep
growing:

* **Case 1** (csv-source -> window-aggregate avg 10 -> csv-sink), through
  :class:`~fogshift.bench.workload.Case1Run`, compared with
  :func:`~fogshift.verify.reference.case1_reference`;
* **merge**, a two-input pipeline (``examples/soak/merge.yaml``): two csv-sources ``left``
  and ``right`` -> one ``filter`` reading both (``value % 3 != 0``) -> csv-sink. Its reference
  (:func:`merge_reference`) is computed from the input files alone: the multiset of
  ``(source, seq) -> (timestamp, value)`` of the rows the filter keeps;
* **keyed** (unless ``--no-keyed``): csv-source -> Case 1's aggregate keyed by sensor in
  two partitions -> csv-sink (:class:`KeyedRun`), compared with the keyed Case 1 reference,
  each key's rows in its input order (partitions interleave in the sink).

Then a seeded random schedule of ``N`` migrations, ``M`` node kills, ``K``
(``--orchestrator-kills``, at least one by default) orchestrator kills, and the keyed
pipeline's key moves (``--key-moves``) and scales (``--scales``) runs, one operation at a
time, after a random pause each:

* **migrate**: a random PE (a partition too) of any pipeline to a random other live node, in
  a mode drawn from ``modes`` (``precopy``, ``literal``, ``handover``; a handover not for
  sinks, which the orchestrator refuses) (the REST call ``fogshift migrate`` makes).
* **move-keys**: one to three random keys (with or without the precopy), or a random key
  group of 4, to a random partition's node (``fogshift migrate --keys`` / ``--key-group``),
  in backlog or fifo order.
* **scale**: the keyed element from 2 partitions to 3 or back (``fogshift scale``), in waves
  or not.
* **kill-node**: SIGKILL of a random node's whole process group - idle or, with probability
  ``mid_operation``, while a migration, key move or scale runs (then of a node it involves,
  if known); the orchestrator restores
  its PEs by itself (the specs keep ``recovery.auto``); a PE still on the dead node after
  ``restore_timeout_s`` is restored by hand (``fogshift restore``). Then the node's agent is
  started again, exactly as ``fogshift up`` had started it (:func:`start_node_again`).
* **kill-orchestrator**: SIGKILL of the orchestrator's process group, idle or - with
  probability ``mid_migration`` - while a migration, key move or scale it runs is under way;
  then ``fogshift up`` starts it again (only it: the agents still run), and it resolves what
  the dead one left unfinished (:func:`start_orchestrator_again`).

Each operation is one row of ``runs.csv``: outcome (:data:`OUTCOMES`) and durations. A
failed operation is recorded and the soak goes on; before the next one it waits (up to
``settle_timeout_s``) until every PE runs on a live node. At the end the inputs stop growing,
the outputs drain, and each is counted against its reference (:func:`tally`):
``verdict.json``; ``results.md`` is rendered from ``runs.csv`` and ``verdict.json`` only
(``--report-only`` renders it again).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import signal
import subprocess
import time
import zlib
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import yaml
from rich.progress import TaskID

from fogshift.agent.config import AgentConfig
from fogshift.bench.base import (
    ClusterRunConfig,
    Reporter,
    RunLog,
    fmt,
    num,
    percentile,
    read_rows,
)
from fogshift.bench.cluster import BenchCluster, ClusterOptions, Clusters, cli_command
from fogshift.bench.exceptions import BadBenchOption, BenchError
from fogshift.bench.padded import aggregate_element
from fogshift.bench.pam import KeyedFeeder
from fogshift.bench.workload import INPUT, OUTPUT, Case1Run, InputFeeder, wait_rows
from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.text import one_line
from fogshift.common.waiting import wait_until
from fogshift.exceptions import FogshiftError
from fogshift.spec.loader import load_spec
from fogshift.spec.models import KINDS, PLANNED_STANDBY
from fogshift.supervisor.cluster import (
    ProcessInfo,
    group_alive,
    kill_group,
    load_cluster,
    orchestrator_client,
    restart_nodes,
)
from fogshift.verify.case1 import case1_parts

NAME = "soak"
CASE1 = "soak-case1"
MERGE = "soak-merge"
#: The merge pipeline's sources, in the order its filter lists them as inputs.
MERGE_SOURCES = ("left", "right")
MERGE_HEADER = "timestamp,src,value"
#: The merge filter's condition; :func:`merge_reference` evaluates it on its own.
MERGE_WHERE = "value % 3 != 0"
MERGE_OUTPUT = "out/merge.csv"
#: Timestamps of generated rows: row *k* has ``TIMESTAMP_BASE + k`` (as in Case 1's inputs).
TIMESTAMP_BASE = 1_700_000_000

#: The keyed pipeline: csv-source -> window avg keyed by sensor in partitions -> csv-sink.
KEYED = "soak-keys"
#: The pipelines a soak can run, by the short names ``--pipelines`` takes.
PIPELINES = ("case1", "merge", "keyed")
#: Its partitioned element (partitions ``aggregate-p<i>``) and the body field it is keyed by.
KEYED_ELEMENT, KEY_FIELD = "aggregate", "sensor"
#: The keyed aggregate's window (events per key), its spec's and its reference's.
KEYED_WINDOW = 10
#: How many partitions a scale of the keyed element goes between.
KEYED_PARTITIONS = (2, 3)

MIGRATE, KILL_NODE, KILL_ORCHESTRATOR = "migrate", "kill-node", "kill-orchestrator"
MOVE_KEYS, SCALE = "move-keys", "scale"
OPERATIONS = (MIGRATE, KILL_NODE, KILL_ORCHESTRATOR, MOVE_KEYS, SCALE)
#: ``pending``: a key move or scale whose states had not all come when it answered (they
#: come once the origin partition runs again, see ``fogshift migrate --keys``).
OUTCOMES = ("ok", "rolled back", "failed", "interrupted", "refused", "skipped", "pending")
MODES = ("precopy", "literal", "handover")
#: Key move orders drawn from.
KEY_ORDERS = ("backlog", "fifo")
#: How often a key move moves a key group (``G/GROUPS``) instead of listed keys.
GROUP_SHARE, GROUPS = 0.2, 4

OP_FIELDS = (
    "index", "op", "started_s", "pipeline", "element", "origin", "target", "mode", "outcome",
    "duration_ms", "downtime_ms", "recovered_ms", "restore_ms", "restart_ms", "settled_ms",
    "note", "error",
)  # fmt: skip
RUNS_CSV = "runs.csv"
VERDICT_JSON = "verdict.json"
RESULTS_MD = "results.md"
#: The counts every pipeline's verdict carries (integers).
COUNTS = ("expected", "written", "lost", "duplicated", "wrong")


@dataclass(frozen=True)
class SoakConfig(ClusterRunConfig):
    """Settings of a soak.

    Attributes:
        migrations: Migrations in the schedule.
        kills: Node kills in the schedule (SIGKILL of a node's process group).
        orchestrator_kills: Orchestrator kills in the schedule (the issue asks for one at
            least; 0 leaves them out).
        modes: The migration modes drawn from (:data:`MODES`).
        mid_migration: Probability that an orchestrator kill lands while a migration (or a
            key move or scale) runs.
        mid_operation: Probability that a node kill lands while a migration, key move or
            scale runs, the node one it involves (a migration's origin or target, a key
            move's partition), if known.
        interrupt_after_s: Range of the wait between starting that operation and the kill.
        duration_s: Start no operation after this many seconds of schedule (``None``: no cap).
        nodes: The cluster's nodes; the first hosts the sources and sinks at first.
        rate: Events per second of each of the three sources.
        gap_s: Range of the random pause before each operation.
        restore_timeout_s: How long each PE of a killed node may take to be restored
            automatically (the orchestrator restores them one after the other) before the
            soak restores the rest by hand.
        settle_timeout_s: How long to wait after an operation for every PE to run again.
        restart_timeout_s: How long a restarted node (its Spark session) or orchestrator may
            take to be healthy again.
        quiet_s: At the end, a sink counts as drained once it wrote nothing for this long
            (after reaching its reference's length, or stalling).
        stall_s: At the end, give up on a sink that wrote nothing for this long.
        standby: ``planned``: the pipelines keep hot standbys (``recovery.standby``); a
            killed node's PEs are then taken over by them.
        pipelines: Which of the pipelines run (:data:`PIPELINES`: ``case1``, ``merge``,
            ``keyed``). The keyed one (:data:`KEYED`: its aggregate in two partitions, on
            the second and third nodes, or the second and first of two) has its PEs and
            partitions hit by the migrations and kills as any, besides its own operations.
        key_moves: Key moves in the schedule (``migrate --keys``): one to three random keys
            (with or without the precopy) or a key group to a random partition's node, in a
            random order (backlog or fifo).
        scales: Scales of the keyed element in the schedule, between 2 and 3 partitions
            (with or without waves).
        keys: How many keys (sensors) the keyed pipeline's input draws from, uniformly.

    ``timeout_s`` bounds every wait for output (first rows, the drain); node-level
    checkpoints every 2 s and central pulls every 5 s keep restores from recent checkpoints.
    """

    migrations: int = 200
    kills: int = 50
    orchestrator_kills: int = 1
    modes: tuple[str, ...] = MODES
    mid_migration: float = 0.5
    mid_operation: float = 0.5
    interrupt_after_s: tuple[float, float] = (0.5, 5.0)
    duration_s: float | None = None
    nodes: tuple[str, ...] = ("cloud", "fog-a", "fog-b", "fog-c")
    rate: float = 10.0
    gap_s: tuple[float, float] = (0.0, 5.0)
    restore_timeout_s: float = 120.0
    settle_timeout_s: float = 180.0
    restart_timeout_s: float = 240.0
    quiet_s: float = 5.0
    stall_s: float = 180.0
    checkpoint_interval_s: float = 2.0
    central_interval_s: float = 5.0
    trigger_ms: int = AgentConfig.default("trigger_ms")
    timeout_s: float = 900.0
    standby: str | None = None
    pipelines: tuple[str, ...] = PIPELINES
    key_moves: int = 50
    scales: int = 10
    keys: int = 20

    @property
    def keyed(self) -> bool:
        """Whether the keyed pipeline runs."""
        return "keyed" in self.pipelines

    def check(self) -> None:
        """Refuse settings a soak cannot run with.

        Raises:
            BadBenchOption: A negative count, a probability outside 0..1, fewer than two
                nodes, a repeated node, a non-positive rate or duration.
        """
        for name in ("migrations", "kills", "orchestrator_kills", "key_moves", "scales"):
            value = getattr(self, name)
            if value < 0:
                raise BadBenchOption(
                    f"bad --{name.replace('_', '-')}",
                    expected="a whole number >= 0",
                    received=str(value),
                )
        if not self.modes or not set(self.modes) <= set(MODES):
            raise BadBenchOption(
                "bad --modes",
                expected=f"a comma-separated choice of {', '.join(MODES)}",
                received=",".join(self.modes) or "(none)",
            )
        for name in ("mid_migration", "mid_operation"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BadBenchOption(
                    f"bad --{name.replace('_', '-')}",
                    expected="a probability between 0 and 1",
                    received=f"{getattr(self, name):g}",
                )
        if len(self.nodes) < 2 or len(set(self.nodes)) != len(self.nodes):
            raise BadBenchOption(
                "a soak needs at least two distinct nodes",
                expected="comma-separated node names, e.g. cloud,fog-a,fog-b,fog-c",
                received=",".join(self.nodes) or "(none)",
                hint="a killed node's PEs must have another node to be restored on",
            )
        if self.rate <= 0:
            raise BadBenchOption(
                "bad --rate",
                expected="events per second > 0 (the inputs grow on this schedule)",
                received=f"{self.rate:g}",
            )
        if self.duration_s is not None and self.duration_s <= 0:
            raise BadBenchOption(
                "bad --duration", expected="seconds > 0, or no --duration",
                received=f"{self.duration_s:g}",
            )  # fmt: skip
        if (
            not self.pipelines
            or not set(self.pipelines) <= set(PIPELINES)
            or len(set(self.pipelines)) != len(self.pipelines)
        ):
            raise BadBenchOption(
                "bad --pipelines",
                expected=f"a comma-separated choice of {', '.join(PIPELINES)}, each once",
                received=",".join(self.pipelines) or "(none)",
            )
        if not self.keyed and self.key_moves + self.scales > 0:
            raise BadBenchOption(
                "--key-moves and --scales need the keyed pipeline",
                expected="the keyed pipeline (in --pipelines, no --no-keyed), or --key-moves 0 "
                "--scales 0",
                received=f"pipelines {','.join(self.pipelines)} with --key-moves "
                f"{self.key_moves} --scales {self.scales}",
            )
        if self.keyed and not 1 <= self.keys <= 1000:
            raise BadBenchOption(
                "bad --keys", expected="1 to 1000 keys (sensors)", received=str(self.keys),
                hint="a key move takes at most 3 of them; the input draws from all uniformly",
            )  # fmt: skip
        if self.standby not in (None, PLANNED_STANDBY):
            raise BadBenchOption(
                "bad --standby",
                expected=f"{PLANNED_STANDBY!r} (each PE's redeploy node, else the least busy)",
                received=repr(self.standby),
                hint="the soak's pipelines start on every node, and its migrations move PEs "
                "anywhere: no fixed node can stay free for standbys",
            )

    def schedule(self) -> list[str]:
        """The operations in their seeded random order (same seed, same order)."""
        ops = [MIGRATE] * self.migrations + [KILL_NODE] * self.kills
        ops += [KILL_ORCHESTRATOR] * self.orchestrator_kills
        ops += [MOVE_KEYS] * self.key_moves + [SCALE] * self.scales
        random.Random(self.seed).shuffle(ops)
        return ops


# -- the merge pipeline: inputs, spec, reference ------------------------------------------------


def tagged_lines(src: str, first: int, count: int, rnd: random.Random) -> list[str]:
    """``count`` rows of a merge input (``timestamp,src,value``) from data row ``first`` on.

    ``value`` is a whole number in 0..999, so the filter keeps about two rows in three.
    """
    return [
        f"{TIMESTAMP_BASE + k},{src},{rnd.randint(0, 999)}\n" for k in range(first, first + count)
    ]


class TaggedFeeder(InputFeeder):
    """A merge input growing on the source's schedule, like Case 1's (:class:`InputFeeder`),
    with rows that name their source (``src``) so the output says where each row came from.

    Args:
        src: The source element's id, written into every row.
    """

    def __init__(self, path: Path, rate: float, seed: int, src: str, lead_s: float = 4.0) -> None:
        self.src = src
        super().__init__(path, rate, seed, lead_s)
        # The parent wrote Case 1's header; the schedule (start/finish) is all it is reused for.
        path.write_text(MERGE_HEADER + "\n")

    def prefill(self, rows: int) -> None:
        """Append ``rows`` rows now."""
        lines = tagged_lines(self.src, self.rows + 1, rows, self._random)
        self.rows += rows
        with open(self.path, "a") as handle:
            handle.write("".join(lines))


def merge_spec(
    name: str,
    *,
    rate: float,
    placement: Mapping[str, str],
    paths: Mapping[str, str] | None = None,
    auto_recovery: bool = True,
    standby: str | None = None,
) -> dict[str, Any]:
    """The merge pipeline's spec: ``left`` and ``right`` -> ``merge`` (filter) -> ``sink``.

    Args:
        placement: Node of each element (``left``, ``right``, ``merge``, ``sink``).
        paths: Input file of each source (default ``<source>.csv``) and ``sink`` output.
        standby: ``recovery.standby`` (``None``: no standbys).
    """
    files = {**{s: f"{s}.csv" for s in MERGE_SOURCES}, "sink": MERGE_OUTPUT, **(paths or {})}
    sources = [
        {"id": s, "kind": "csv-source", "node": placement[s],
         "options": {"path": files[s], "rate": rate}}
        for s in MERGE_SOURCES
    ]  # fmt: skip
    return {
        "pipeline": name,
        "elements": [
            *sources,
            {"id": "merge", "kind": "filter", "node": placement["merge"],
             "inputs": list(MERGE_SOURCES), "options": {"where": MERGE_WHERE}},
            {"id": "sink", "kind": "csv-sink", "node": placement["sink"], "inputs": ["merge"],
             "options": {"path": files["sink"]}},
        ],
        "recovery": {"auto": auto_recovery, **({"standby": standby} if standby else {})},
    }  # fmt: skip


def merge_reference(inputs: Mapping[str, Path]) -> dict[tuple[str, int], tuple[int, int]]:
    """The merge pipeline's expected output, from its input files alone.

    Shares no code with the runtime: rows are split with the ``csv`` module and the filter's
    condition is evaluated here in Python.

    Args:
        inputs: Each source's id and input file.

    Returns:
        ``(source, seq) -> (timestamp, value)`` of every row the filter keeps, where ``seq``
        is the row's number in its file (its event's ``seq``).
    """
    import csv

    expected: dict[tuple[str, int], tuple[int, int]] = {}
    for src, path in inputs.items():
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            next(reader)  # header
            for k, cells in enumerate(reader, start=1):
                timestamp, _, value = int(cells[0]), cells[1], int(cells[2])
                if value % 3 != 0:
                    expected[(src, k)] = (timestamp, value)
    return expected


def read_merge_sink(path: Path) -> list[tuple[tuple[str, int], tuple[int, int] | None]]:
    """``((src, seq), (timestamp, value))`` per output line of the merge sink, in file order.

    A line that cannot be read as such keeps its place as ``(("?", line number), None)``: it
    counts as wrong.
    """
    import csv

    if not path.exists() or path.stat().st_size == 0:
        return []
    rows: list[tuple[tuple[str, int], tuple[int, int] | None]] = []
    with open(path, newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle), start=2):
            try:
                key = (str(row["src"]), int(row["seq"]))
                rows.append((key, (int(row["timestamp"]), int(row["value"]))))
            except (KeyError, TypeError, ValueError):
                rows.append((("?", number), None))
    return rows


class SoakRun:
    """One of the soak's pipelines: its inputs growing, its spec, deploy and stop.

    Used like :class:`~fogshift.bench.workload.Case1Run`: on entry the inputs start growing,
    :meth:`finish_input` stops them; on exit they stop and the pipeline is stopped. Errors
    are not swallowed here (the soak records them).

    Args:
        cluster: The cluster to run on.
        name: The pipeline's name; its files live in ``<cluster home>/runs/<name>``
            (:func:`run_folder`).
        feeders: The feeder of each source, by source id.
        spec: The pipeline's spec, written there as ``<name>.yaml``.
    """

    def __init__(
        self,
        cluster: BenchCluster,
        name: str,
        feeders: Mapping[str, InputFeeder],
        spec: Mapping[str, Any],
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.work = run_folder(cluster, name)
        self.feeders = dict(feeders)
        self.work.mkdir(parents=True, exist_ok=True)
        self.spec = self.work / f"{name}.yaml"
        self.spec.write_text(yaml.safe_dump(dict(spec), sort_keys=False))

    def __enter__(self) -> Self:
        for feeder in self.feeders.values():
            feeder.start()
        return self

    def deploy(self) -> None:
        # (A run's name may be an earlier bench's on a kept cluster: each run is anew.)
        self.cluster.cli("deploy", str(self.spec), "--fresh")

    def finish_input(self) -> int:
        """Stop the inputs growing; returns their data rows together."""
        return sum(feeder.finish() for feeder in self.feeders.values())

    def inputs(self) -> dict[str, Path]:
        return {src: feeder.path for src, feeder in self.feeders.items()}

    def __exit__(self, *exc_info: object) -> None:
        for feeder in self.feeders.values():
            feeder.finish()
        self.cluster.cli("stop", self.name, check=False)


def run_folder(cluster: BenchCluster, name: str) -> Path:
    """Where a pipeline's files (inputs, spec, output) live: ``<cluster home>/runs/<name>``."""
    return cluster.home / "runs" / name


class MergeRun(SoakRun):
    """The merge pipeline (:func:`merge_spec`), its two inputs growing.

    Args:
        cluster: The cluster to run on.
        name: The pipeline's name.
        rate: Events per second of each source.
        seed: The soak's seed (mixed with the name and the source: each input differs).
        placement: Node of each element.
        standby: ``recovery.standby`` of the pipeline.
    """

    def __init__(
        self,
        cluster: BenchCluster,
        name: str,
        *,
        rate: float,
        seed: int,
        placement: Mapping[str, str],
        standby: str | None = None,
    ) -> None:
        work = run_folder(cluster, name)
        feeders = {
            src: TaggedFeeder(
                work / f"{src}.csv", rate, zlib.crc32(f"{name}/{src}".encode()) ^ seed, src
            )
            for src in MERGE_SOURCES
        }
        spec = merge_spec(name, rate=rate, placement=placement, standby=standby)
        super().__init__(cluster, name, feeders, spec)


# -- the keyed pipeline -------------------------------------------------------------------------


def keyed_spec(
    name: str, *, rate: float, edge: str, partitions: Sequence[str], standby: str | None = None
) -> dict[str, Any]:
    """The keyed pipeline's spec: a csv-source on ``edge`` -> Case 1's aggregate keyed by
    :data:`KEY_FIELD`, one partition on each of ``partitions`` -> a csv-sink on ``edge``."""
    aggregate = aggregate_element(partitions[0], window=KEYED_WINDOW, element_id=KEYED_ELEMENT)
    del aggregate["node"]
    aggregate.update(partitions=list(partitions), key_by=KEY_FIELD)
    return {
        "pipeline": name,
        "elements": [
            {"id": "source", "kind": "csv-source", "node": edge,
             "options": {"path": INPUT, "rate": rate}},
            aggregate,
            {"id": "sink", "kind": "csv-sink", "node": edge, "inputs": [KEYED_ELEMENT],
             "options": {"path": OUTPUT}},
        ],
        "recovery": {"auto": True, **({"standby": standby} if standby else {})},
    }  # fmt: skip


class KeyedRun(SoakRun):
    """The keyed pipeline (:func:`keyed_spec`), its input growing with keys drawn uniformly.

    Args:
        cluster: The cluster to run on.
        name: The pipeline's name.
        rate: Events per second of the source.
        seed: The soak's seed (mixed with the name).
        keys: How many keys (``s0``..) the input draws from.
        edge: Node of the source and the sink.
        partitions: Node of each partition of the aggregate.
        standby: ``recovery.standby`` of the pipeline.
    """

    def __init__(
        self,
        cluster: BenchCluster,
        name: str,
        *,
        rate: float,
        seed: int,
        keys: int,
        edge: str,
        partitions: Sequence[str],
        standby: str | None = None,
    ) -> None:
        source = run_folder(cluster, name) / INPUT
        feeder = KeyedFeeder(source, rate, keys, "uniform", 1.0, zlib.crc32(name.encode()) ^ seed)
        spec = keyed_spec(name, rate=rate, edge=edge, partitions=partitions, standby=standby)
        super().__init__(cluster, name, {"source": feeder}, spec)


# -- counting ---------------------------------------------------------------------------------

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class Tally:
    """An output counted against its reference.

    Attributes:
        expected: Rows the reference has.
        written: Lines the output has.
        lost: Expected keys the output never wrote.
        duplicated: Lines beyond the first for a key written more than once.
        wrong: Keys written with a value other than the reference's (any of their lines), or
            not in the reference at all.
        examples: Up to five keys of each kind (``lost``, ``duplicated``, ``wrong``).
    """

    expected: int
    written: int
    lost: int
    duplicated: int
    wrong: int
    examples: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return self.lost == self.duplicated == self.wrong == 0


def tally(
    expected: Mapping[K, V],
    written: Sequence[tuple[K, V | None]],
    same: Callable[[V, V], bool],
) -> Tally:
    """Count lost, duplicated and wrong rows of ``written`` against ``expected``.

    Order is not judged here (Case 1's order is, by :func:`~fogshift.verify.reference.compare`).

    Args:
        expected: The reference: key -> value.
        written: The output's ``(key, value)`` lines in file order; ``None`` is a value that
            could not be read (always wrong).
        same: Whether a written value equals the expected one.
    """
    lines = Counter(key for key, _ in written)
    lost = [key for key in expected if key not in lines]
    duplicated = [key for key, n in lines.items() if n > 1]
    wrong: dict[K, None] = {}  # insertion-ordered set: the first wrong keys are the examples
    for key, value in written:
        if key in wrong:
            continue
        if key not in expected or value is None or not same(value, expected[key]):
            wrong[key] = None
    return Tally(
        expected=len(expected),
        written=len(written),
        lost=len(lost),
        duplicated=sum(lines[key] - 1 for key in duplicated),
        wrong=len(wrong),
        examples={"lost": lost[:5], "duplicated": duplicated[:5], "wrong": list(wrong)[:5]},
    )


def _close(a: float, b: float) -> bool:
    # The tolerance of verify.reference.compare: float sums differ in order.
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def drain(cluster: BenchCluster, pipeline: str, rows: int, config: SoakConfig) -> int:
    """Wait until the sink wrote ``rows`` lines (or stalled), then until it is quiet.

    A duplicate or a late row shows within a few batches, so the output is read only after
    ``quiet_s`` without a new line. Returns the lines written.
    """
    written = wait_rows(cluster, pipeline, rows, config.timeout_s, config.stall_s)
    quiet_since, deadline = time.monotonic(), time.monotonic() + config.timeout_s
    while time.monotonic() - quiet_since < config.quiet_s and time.monotonic() < deadline:
        time.sleep(0.5)
        now = _sink_rows(cluster, pipeline)
        if now != written:
            written, quiet_since = now, time.monotonic()
    return written


def _sink_rows(cluster: BenchCluster, pipeline: str) -> int:
    return int(cluster.element(pipeline, "sink")["events_out"])


def count_case1(run: Case1Run, config: SoakConfig, events: int) -> dict[str, Any]:
    """Drain Case 1 and count its output against the Case 1 reference."""
    # pandas (the reference) loads only here, as in workload.verdict.
    from fogshift.verify.reference import case1_reference, compare, read_sink

    spec = load_spec(run.spec)
    source, agg, sink = case1_parts(spec)
    reference = case1_reference(source, agg["field"], agg["window"], agg.get("function", "avg"))
    drain(run.cluster, run.name, len(reference.rows), config)
    actual = read_sink(sink, agg["field"])
    counted = tally(dict(reference.rows), actual, _close)
    verdict = compare(reference.rows, actual)
    return _pipeline_verdict("case1", events, counted, verdict.consistent, verdict.problems)


def count_merge(run: MergeRun, config: SoakConfig, events: int) -> dict[str, Any]:
    """Drain the merge pipeline and count its output against :func:`merge_reference`."""
    expected = merge_reference(run.inputs())
    drain(run.cluster, run.name, len(expected), config)
    counted = tally(expected, read_merge_sink(run.work / MERGE_OUTPUT), lambda a, b: a == b)
    return _pipeline_verdict("two inputs", events, counted, counted.clean, [])


def count_keyed(run: KeyedRun, config: SoakConfig, events: int) -> dict[str, Any]:
    """Drain the keyed pipeline and count its output against the keyed Case 1 reference
    (each key's window over its own events); the order is judged per key, as partitions
    promise (their outputs interleave in the sink)."""
    from fogshift.verify.reference import case1_reference, compare_per_key, keys_by_seq, read_sink

    source = run.inputs()["source"]
    reference = case1_reference(source, "value", KEYED_WINDOW, "avg", key_field=KEY_FIELD)
    drain(run.cluster, run.name, len(reference.rows), config)
    actual = read_sink(run.work / OUTPUT, "value")
    counted = tally(dict(reference.rows), actual, _close)
    verdict = compare_per_key(reference.rows, actual, keys_by_seq(source, KEY_FIELD))
    return _pipeline_verdict("keyed, partitioned", events, counted, verdict.consistent,
                             verdict.problems)  # fmt: skip


def _pipeline_verdict(
    kind: str, events: int, counted: Tally, consistent: bool, problems: list[str]
) -> dict[str, Any]:
    return {
        "kind": kind,
        "events": events,
        **{name: getattr(counted, name) for name in COUNTS},
        "consistent": consistent and counted.clean,
        "problems": problems,
        "examples": {k: [list(x) if isinstance(x, tuple) else x for x in v]
                     for k, v in counted.examples.items()},
    }  # fmt: skip


# -- bringing killed processes back -----------------------------------------------------------


class Processes:
    """Kills the cluster's orchestrator and node agents (``cluster.json`` says where they
    are); the supervisor starts them again (:func:`start_node_again`,
    :func:`start_orchestrator_again`), as ``fogshift up`` had started them.

    Args:
        home: The cluster's home.
    """

    def __init__(self, home: Path) -> None:
        self.home = home

    def info(self, node: str | None) -> ProcessInfo:
        """The orchestrator's (``node`` None) or node ``node``'s process in ``cluster.json``."""
        cluster, _ = load_cluster(self.home)
        return cluster.orchestrator if node is None else cluster.nodes[node]

    def kill(self, node: str | None, timeout_s: float = 60.0) -> None:
        """SIGKILL the process group of the orchestrator (``node`` None) or of node ``node``
        and wait until it is gone.

        Raises:
            BenchError: It was not running, or its group outlived ``timeout_s``.
        """
        what = "the orchestrator" if node is None else f"node {node!r}"
        info = self.info(node)
        if not group_alive(info.pgid):
            raise BenchError(
                f"{what} (process group {info.pgid}) is not running: there is nothing to kill",
                hint="an earlier operation left it dead; see the cluster's logs",
            )
        kill_group(info.pgid, signal.SIGKILL)
        try:
            wait_until(lambda: not group_alive(info.pgid), timeout_s, interval_s=0.05,
                       describe=f"{what} gone")  # fmt: skip
        except WaitTimedOut:
            raise BenchError(f"{what}'s process group {info.pgid} outlived SIGKILL") from None


def start_orchestrator_again(cluster: BenchCluster, timeout_s: float) -> tuple[float, float]:
    """Start a killed orchestrator again with ``fogshift up`` (on a cluster whose agents run,
    it starts only the orchestrator, where the agents look for it, and returns once every
    living node is healthy again).

    Returns:
        Seconds until it answered, and until ``fogshift up`` returned.

    Raises:
        BenchError: ``fogshift up`` failed or did not return within ``timeout_s``.
    """
    command = cli_command("up", *cluster.options.up_args(), "--home", str(cluster.home))
    started = time.monotonic()
    answered: float | None = None
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as up:  # fmt: skip
        while up.poll() is None and time.monotonic() - started < timeout_s:
            if answered is None and _answers(cluster.home):
                answered = time.monotonic() - started
            time.sleep(0.2)
        if up.poll() is None:
            up.kill()
        output = up.communicate()[0] or ""
    if up.returncode != 0:
        raise BenchError(
            f"`fogshift up` did not start the orchestrator again (exit {up.returncode})",
            received=one_line(output[-1500:], 1500),
            hint=f"see {cluster.home / 'logs' / 'orchestrator.log'}",
        )
    total = time.monotonic() - started
    return (answered if answered is not None else total), total


def _answers(home: Path) -> bool:
    """Whether the orchestrator of ``home`` answers a request now."""
    try:
        with orchestrator_client(home, timeout_s=2) as client:
            client.get("/nodes")
    except FogshiftError:
        return False
    return True


def start_node_again(home: Path, node: str, timeout_s: float) -> float:
    """Start a killed node's agent again, exactly as ``fogshift up`` had started it; returns
    the seconds until every node of the cluster is healthy (its Spark session up).

    Raises:
        Unavailable: It did not become healthy within ``timeout_s``.
    """
    started = time.monotonic()
    cluster, _ = load_cluster(home)
    restart_nodes(home, cluster, [node], timeout_s, lambda _: None)
    return time.monotonic() - started


# -- the operations ---------------------------------------------------------------------------


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


class Soak:
    """Runs the schedule against the pipelines on ``cluster``, one row per operation.

    Args:
        cluster: The running cluster.
        config: The soak's settings.
        log: ``runs.csv``.
        reporter: Progress display.
        pipelines: The pipelines whose PEs are migrated and counted.
    """

    def __init__(
        self,
        cluster: BenchCluster,
        config: SoakConfig,
        log: RunLog,
        reporter: Reporter,
        pipelines: Sequence[str] = (CASE1, MERGE),
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.log = log
        self.reporter = reporter
        self.pipelines = tuple(pipelines)
        self.rng = random.Random(config.seed)
        self.processes = Processes(cluster.home)
        #: Nodes that could not be started again after their kill (left out from then on).
        self.lost: set[str] = set()
        self.done: Counter[str] = Counter()
        self.t0 = time.monotonic()

    # -- state ------------------------------------------------------------------------------

    def alive(self) -> list[str]:
        return [n for n in self.config.nodes if n not in self.lost]

    def status(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every PE's status (node, state, last restore) by ``(pipeline, element)``.

        Raises:
            FogshiftError: The orchestrator does not answer.
        """
        return {
            (p, e["element"]): dict(e)
            for p in self.pipelines
            for e in self.cluster.client.get(f"/pipelines/{p}")["elements"]
        }

    def settle(self) -> float | None:
        """Wait until every PE runs on a live node; seconds waited, ``None`` if it timed out."""
        started = time.monotonic()
        deadline = started + self.config.settle_timeout_s
        while time.monotonic() < deadline:
            try:
                pes = self.status()
            except FogshiftError:
                pes = {}
            alive = set(self.alive())
            if pes and all(e["state"] == "running" and e["node"] in alive for e in pes.values()):
                return time.monotonic() - started
            time.sleep(0.5)
        return None

    # -- the schedule -----------------------------------------------------------------------

    def run(
        self,
        ops: Sequence[str],
        on_op: Callable[[int, str], None] = lambda _i, _op: None,
        on_done: Callable[[], None] = lambda: None,
    ) -> Counter[str]:
        """Run ``ops`` in order (until ``duration_s``); returns the operations done by kind.

        Args:
            on_op: Called with each operation's index and kind before it starts.
            on_done: Called after each operation's rows are written.

        Raises:
            BenchError: The orchestrator could not be started again (nothing can go on).
        """
        self.t0 = time.monotonic()
        with ThreadPoolExecutor(1, thread_name_prefix="soak-migration") as pool:
            for index, op in enumerate(ops, start=1):
                if self.config.duration_s is not None and self.elapsed() >= self.config.duration_s:
                    break
                time.sleep(self.rng.uniform(*self.config.gap_s))
                on_op(index, op)
                if op == MIGRATE:
                    rows = [self.migrate(index)]
                elif op == KILL_NODE:
                    rows = self.kill_node(index, pool)
                elif op == MOVE_KEYS:
                    rows = [self.move_keys(index)]
                elif op == SCALE:
                    rows = [self.scale(index)]
                else:
                    rows = self.kill_orchestrator(index, pool)
                fatal = [str(r.pop("fatal")) for r in rows if "fatal" in r]
                settled = None if fatal else self.settle()
                for row in rows:
                    row["settled_ms"] = _ms(settled)
                    if settled is None:
                        _add_note(row, "PEs not all running afterwards")
                    if row["outcome"] == "interrupted" and row["op"] == MIGRATE:
                        # Where the orchestrator's recovery left it: origin or target.
                        _add_note(row, f"afterwards on {self.node_of(row) or 'no node'}")
                    self.log.append(row)
                    self.done[row["op"]] += 1
                    if row["outcome"] != "ok":
                        self.reporter.note(_say(row))
                on_done()
                if fatal:
                    raise BenchError(
                        "the orchestrator could not be started again after its kill",
                        received=one_line(fatal[0]),
                        hint=f"see the logs in {self.cluster.home / 'logs'}",
                    )
        return self.done

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def node_of(self, row: Mapping[str, Any]) -> str | None:
        """The node the PE of a migration ``row`` is placed on now (``None``: unknown)."""
        try:
            return str(self.status()[(row["pipeline"], row["element"])]["node"])
        except (FogshiftError, KeyError):
            return None

    def _row(self, index: int, op: str, **values: Any) -> dict[str, Any]:
        return {"index": index, "op": op, "started_s": round(self.elapsed(), 2), **values}

    def choose_migration(self) -> tuple[str, str, str, str, str] | None:
        """A random PE, a random other live node and a random mode (``None``: no choice)."""
        try:
            pes = self.status()
        except FogshiftError:
            return None
        movable = sorted((pe, info) for pe, info in pes.items() if _modes(info, self.config.modes))
        if not movable:
            return None
        (pipeline, element), info = self.rng.choice(movable)
        targets = [n for n in self.alive() if n != info["node"]]
        if not targets:
            return None
        mode = self.rng.choice(_modes(info, self.config.modes))
        return pipeline, element, info["node"], self.rng.choice(targets), mode

    def migrate(
        self, index: int, chosen: tuple[str, str, str, str, str] | None = None
    ) -> dict[str, Any]:
        """Migrate a PE (``chosen``, else a random one); the row of its outcome."""
        chosen = chosen or self.choose_migration()
        if chosen is None:
            return self._row(index, MIGRATE, outcome="skipped",
                             error="no PE and live target to choose from")  # fmt: skip
        pipeline, element, origin, target, mode = chosen
        row = self._row(index, MIGRATE, pipeline=pipeline, element=element, origin=origin,
                        target=target, mode=mode)  # fmt: skip
        started = time.monotonic()
        try:
            report = self.cluster.operation(
                pipeline, element, "migrate", {"target": target, "mode": mode}
            )
        except FogshiftError as exc:
            # No report: refused before it began (409, unknown or unhealthy node), or the
            # orchestrator went away while it ran (interrupted; the caller says so).
            return {**row, "outcome": "refused", "duration_ms": _ms(time.monotonic() - started),
                    "error": exc.message}  # fmt: skip
        if report.get("status") == "migrated":
            outcome = "ok"
        else:
            outcome = "rolled back" if report.get("rolled_back") else "failed"
        return {
            **row, "outcome": outcome, "duration_ms": _ms(time.monotonic() - started),
            "downtime_ms": report.get("downtime_ms"), "error": report.get("error"),
        }  # fmt: skip

    def keyed_ops(self) -> bool:
        """Whether the schedule has operations of the keyed pipeline's own."""
        return KEYED in self.pipelines and self.config.key_moves + self.config.scales > 0

    def partitions(self) -> dict[str, str]:
        """The keyed element's partitions and their nodes, as the orchestrator has them now.

        Raises:
            FogshiftError: The orchestrator does not answer.
        """
        return {
            str(e["element"]): str(e["node"])
            for e in self.cluster.client.get(f"/pipelines/{KEYED}")["elements"]
            if str(e["element"]).startswith(f"{KEYED_ELEMENT}-p")
        }

    def choose_key_move(self) -> dict[str, Any] | None:
        """The body of a random key move (``None``: no partition on a live node): to the node
        of a random partition, in a random order; one to three random keys with or without
        the precopy, or (one time in :data:`GROUP_SHARE`) a random key group of
        :data:`GROUPS`."""
        try:
            nodes = sorted(set(self.partitions().values()) & set(self.alive()))
        except FogshiftError:
            return None
        if KEYED not in self.pipelines or not nodes:
            return None
        body: dict[str, Any] = {"target": self.rng.choice(nodes),
                                "order": self.rng.choice(KEY_ORDERS)}  # fmt: skip
        if self.rng.random() < GROUP_SHARE:
            return {**body, "group": f"{self.rng.randrange(GROUPS)}/{GROUPS}"}
        names = [f"s{k}" for k in range(self.config.keys)]
        keys = sorted(self.rng.sample(names, min(len(names), self.rng.randint(1, 3))))
        return {**body, "keys": keys, "precopy": self.rng.random() < 0.5}

    def move_keys(self, index: int, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """Move keys of the keyed element (``body`` of the request, else a random one); the
        row of its outcome (``downtime_ms``: the longest a moved key waited for its state)."""
        body = body or self.choose_key_move()
        if body is None:
            return self._row(index, MOVE_KEYS, outcome="skipped",
                             error="no partition on a live node to move keys to")  # fmt: skip
        what = f"group {body['group']}" if "group" in body else f"keys {','.join(body['keys'])}"
        row = self._row(index, MOVE_KEYS, pipeline=KEYED, element=KEYED_ELEMENT,
                        target=body["target"],
                        mode=body["order"] + (" precopy" if body.get("precopy") else ""),
                        note=what)  # fmt: skip
        return self._key_operation(row, "keys/migrate", body)

    def scale(self, index: int, waves: bool | None = None) -> dict[str, Any]:
        """Scale the keyed element from 2 partitions to 3 or back (with ``waves`` or not,
        else at random); the row of its outcome (``downtime_ms``: its longest stoppage)."""
        try:
            now = len(self.partitions())
        except FogshiftError as exc:
            return self._row(index, SCALE, outcome="skipped", error=exc.message)
        if KEYED not in self.pipelines or not now:
            return self._row(index, SCALE, outcome="skipped", error="no keyed pipeline")
        low, high = KEYED_PARTITIONS
        wanted = high if now <= low else low
        waves = self.rng.random() < 0.5 if waves is None else waves
        row = self._row(index, SCALE, pipeline=KEYED, element=KEYED_ELEMENT,
                        mode=f"{now} -> {wanted}" + (" in waves" if waves else ""))  # fmt: skip
        return self._key_operation(row, "scale", {"partitions": wanted, "waves": waves})

    def _key_operation(
        self, row: dict[str, Any], verb: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """POST a key move or scale of the keyed element; ``row`` with its outcome."""
        started = time.monotonic()
        path = f"/pipelines/{KEYED}/elements/{KEYED_ELEMENT}/{verb}"
        try:
            report = self.cluster.post(path, body)
        except FogshiftError as exc:
            # Refused before it began (409: another operation of the element under way),
            # or the orchestrator went away while it ran (interrupted; the caller says so).
            return {**row, "outcome": "refused", "duration_ms": _ms(time.monotonic() - started),
                    "error": exc.message}  # fmt: skip
        status = report.get("status")
        stoppage = report.get("stoppage_ms")
        if isinstance(stoppage, dict):  # a key move's: per key
            stoppage = max(stoppage.values(), default=None)
        # Partitions, not nodes: a key move's origins (by key), a scale's retired ones, and
        # its added ones with their nodes.
        origins = {*(report.get("origins") or {}).values(), *(report.get("retired") or {})}
        added = sorted(f"{p}@{n}" for p, n in (report.get("added") or {}).items())
        return {
            **row, "outcome": {"moved": "ok", "pending": "pending"}.get(status, "failed"),
            "origin": ";".join(sorted(origins)) or None,
            "target": row.get("target") or ";".join(added) or None,
            "duration_ms": _ms(time.monotonic() - started),
            "downtime_ms": stoppage, "error": None if status == "moved" else f"status {status}",
        }  # fmt: skip

    def kill_node(self, index: int, pool: ThreadPoolExecutor | None = None) -> list[dict[str, Any]]:
        """SIGKILL a random live node, idle or (with ``pool``, at the odds of
        ``mid_operation``) during a migration, key move or scale, then one of the nodes that
        operation involves; wait for its PEs' restore, start it again.

        Returns:
            Its row, and the operation's if one ran (noting the kill).
        """
        operation: Future[dict[str, Any]] | None = None
        involved: set[str] = set()
        if pool is not None and self.rng.random() < self.config.mid_operation:
            operation, involved = self._start_operation(index, pool)
        alive = self.alive()
        ended = operation is not None and operation.done()
        row = self._kill_node(index, sorted(involved & set(alive)) or alive)
        if operation is None:
            return [row]
        ran = operation.result()
        _add_note(row, f"after the {ran['op']} it was to land in had ended" if ended
                  else f"during a {ran['op']}")  # fmt: skip
        if row.get("origin") and not ended:
            _add_note(ran, f"node {row['origin']} was killed while it ran")
        return [row, ran]

    def _kill_node(self, index: int, candidates: Sequence[str]) -> dict[str, Any]:
        """SIGKILL one of ``candidates`` (live nodes) at random; see :meth:`kill_node`."""
        alive = self.alive()
        if len(alive) < 2:
            return self._row(index, KILL_NODE, outcome="skipped",
                             error="fewer than two live nodes: nowhere to restore")  # fmt: skip
        victim = self.rng.choice(candidates)
        row = self._row(index, KILL_NODE, origin=victim)
        try:
            before = self.status()
        except FogshiftError as exc:
            return {**row, "outcome": "skipped", "error": exc.message}
        moved = sorted(key for key, e in before.items() if e["node"] == victim)
        row["element"] = ";".join(f"{p}/{e}" for p, e in moved)
        started = time.monotonic()
        try:
            self.processes.kill(victim)
        except FogshiftError as exc:
            return {**row, "outcome": "failed", "error": exc.message}
        errors: list[str] = []
        row["mode"], recovered, after = self._await_restores(victim, moved, started, errors)
        row["recovered_ms"] = _ms(recovered)
        row["target"] = ";".join(sorted({after[k]["node"] for k in moved if k in after}))
        totals = [
            float((after.get(k, {}).get("last_restore") or {}).get("total_ms") or 0) for k in moved
        ]
        row["restore_ms"] = max(totals) if any(totals) else None
        try:
            restart = start_node_again(self.cluster.home, victim, self.config.restart_timeout_s)
            row["restart_ms"] = _ms(restart)
        except FogshiftError as exc:
            self.lost.add(victim)
            errors.append(f"node {victim} did not come back: {exc.message}")
        row["duration_ms"] = _ms(time.monotonic() - started)
        row["outcome"] = "ok" if (recovered is not None or not moved) and not errors else "failed"
        row["error"] = "; ".join(errors) or None
        return row

    def _await_restores(
        self,
        victim: str,
        moved: list[tuple[str, str]],
        killed_at: float,
        errors: list[str],
    ) -> tuple[str, float | None, dict[tuple[str, str], dict[str, Any]]]:
        """Wait until every PE of ``moved`` runs on another node: automatically, else (after
        ``restore_timeout_s``) by a restore the soak asks for.

        Returns:
            How they were restored (``auto``; ``manual`` if a restore the soak asked for
            succeeded; ``none`` to restore), the seconds from the kill until all ran elsewhere
            (``None``: not all did), and their status.
        """
        if not moved:
            # Nothing to run elsewhere: no recovery time (a 0 ms one went into the
            # percentiles of those that recovered something).
            return "none", None, {}

        def placed(pes: dict[tuple[str, str], dict[str, Any]]) -> bool:
            return all(
                k in pes and pes[k]["node"] != victim and pes[k]["state"] == "running"
                for k in moved
            )

        how = "auto"
        pes: dict[tuple[str, str], dict[str, Any]] = {}
        # A manual restore may race the automatic one (409): only the end result counts.
        refused: list[str] = []
        # The orchestrator restores one PE after the other: each gets restore_timeout_s.
        waits = (self.config.restore_timeout_s * len(moved), self.config.settle_timeout_s)
        for attempt, wait_s in enumerate(waits):
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                try:
                    pes = self.status()
                except FogshiftError:
                    pes = {}
                if placed(pes):
                    return how, time.monotonic() - killed_at, pes
                time.sleep(0.5)
            if attempt == len(waits) - 1:
                break
            for pipeline, element in moved:
                if pes.get((pipeline, element), {}).get("node") != victim:
                    continue
                try:
                    report = self.cluster.operation(pipeline, element, "restore", {})
                except FogshiftError as exc:
                    refused.append(f"restore of {pipeline}/{element}: {exc.message}")
                    continue
                if report.get("status") == "restored":
                    how = "manual"
                else:
                    refused.append(f"restore of {pipeline}/{element}: {report.get('error')}")
        errors += [f"PEs of {victim} not all running elsewhere in time", *refused]
        return how, None, pes

    def _start_operation(
        self, index: int, pool: ThreadPoolExecutor
    ) -> tuple[Future[dict[str, Any]] | None, set[str]]:
        """Start a random migration or (with the keyed pipeline's own operations in the
        schedule) a key move or scale, as often as they come, in ``pool``, then wait a random
        ``interrupt_after_s``: a kill is to land while it runs.

        Returns:
            Its future (``None``: nothing to start), and the nodes it involves (a
            migration's origin and target, a key move's partitions' nodes; a scale's: none
            known).
        """
        kinds = [MIGRATE] * (self.config.migrations > 0 or not self.keyed_ops())
        kinds += [MOVE_KEYS] * (self.config.key_moves > 0) + [SCALE] * (self.config.scales > 0)
        kind = self.rng.choice(kinds)
        started: Future[dict[str, Any]] | None = None
        involved: set[str] = set()
        if kind == MIGRATE and (chosen := self.choose_migration()) is not None:
            started, involved = pool.submit(self.migrate, index, chosen), {chosen[2], chosen[3]}
        elif kind == MOVE_KEYS and (body := self.choose_key_move()) is not None:
            with contextlib.suppress(FogshiftError):
                involved = set(self.partitions().values())
            started = pool.submit(self.move_keys, index, body)
        elif kind == SCALE:
            started = pool.submit(self.scale, index)
        if started is not None:
            time.sleep(self.rng.uniform(*self.config.interrupt_after_s))
        return started, involved

    def kill_orchestrator(self, index: int, pool: ThreadPoolExecutor) -> list[dict[str, Any]]:
        """SIGKILL the orchestrator, idle or during a migration, and start it again.

        Returns:
            Its row, and the migration's row if one ran. Its row has ``fatal`` (the reason,
            not a ``runs.csv`` column) when it could not be started again.
        """
        row = self._row(index, KILL_ORCHESTRATOR, mode="idle")
        migration: Future[dict[str, Any]] | None = None
        if self.rng.random() < self.config.mid_migration:
            migration, _ = self._start_operation(index, pool)
        if migration is not None:
            row["mode"] = "idle (the migration had ended)" if migration.done() else "mid-migration"
        started = time.monotonic()
        try:
            self.processes.kill(None)
        except FogshiftError as exc:
            rows = [{**row, "outcome": "failed", "error": exc.message}]
            return rows + ([migration.result()] if migration else [])
        try:
            answered, healthy = start_orchestrator_again(
                self.cluster, self.config.restart_timeout_s
            )
            row.update(outcome="ok", recovered_ms=_ms(answered), restart_ms=_ms(healthy))
        except FogshiftError as exc:
            row.update(outcome="failed", error=exc.message, fatal=exc.message)
        row["duration_ms"] = _ms(time.monotonic() - started)
        rows = [row]
        if migration is not None:
            moved = migration.result()
            if row["mode"] == "mid-migration" and moved["outcome"] != "refused":
                # It got its report after all: it ended just before the kill.
                row["mode"] = "idle (the migration had ended)"
            if row["mode"] == "mid-migration":
                _add_note(moved, "the orchestrator was killed while it ran")
                moved["outcome"] = "interrupted"
            row["pipeline"], row["element"] = moved.get("pipeline"), moved.get("element")
            rows.append(moved)
        return rows


def _add_note(row: dict[str, Any], note: str) -> None:
    row["note"] = "; ".join(filter(None, [row.get("note"), note]))


def _say(row: Mapping[str, Any]) -> str:
    what = " ".join(
        str(row[k]) for k in ("pipeline", "element", "origin", "target", "mode") if row.get(k)
    )
    error = f" ({one_line(str(row['error']), 160)})" if row.get("error") else ""
    note = f" [{row['note']}]" if row.get("note") else ""
    return f"soak #{row['index']} {row['op']} {what}: {row['outcome']}{error}{note}"


# -- the soak ---------------------------------------------------------------------------------


def run(config: SoakConfig, clusters: Clusters, out: Path, reporter: Reporter) -> dict[str, Any]:
    """Run the soak on a fresh cluster; write ``runs.csv`` and ``verdict.json`` into ``out``.

    Returns:
        The verdict (also written when the soak fails part-way, with ``error`` set).

    Raises:
        BadBenchOption: See :meth:`SoakConfig.check`.
        BenchError: The soak could not be carried out (a cluster, a deploy, the orchestrator's
            restart failed); ``verdict.json`` says how far it got.
    """
    config.check()
    ops = config.schedule()
    out.mkdir(parents=True, exist_ok=True)
    log = RunLog(out / RUNS_CSV, OP_FIELDS)
    verdict: dict[str, Any] = {
        "status": "failed",
        "error": None,
        "settings": asdict(config),
        "planned": {op: ops.count(op) for op in OPERATIONS},
        "done": {op: 0 for op in OPERATIONS},
        "pipelines": {},
    }
    task = reporter.task("soak", len(ops) + 2)
    started = time.monotonic()
    try:
        reporter.step(task, "starting the cluster")
        options = ClusterOptions(
            config.nodes, config.checkpoint_interval_s, config.central_interval_s,
            config.trigger_ms,
        )  # fmt: skip
        with clusters.cluster(options) as cluster:
            _soak(cluster, config, ops, log, reporter, task, verdict)
    except FogshiftError as exc:
        verdict["error"] = exc.render()
        raise
    finally:
        verdict["elapsed_s"] = round(time.monotonic() - started, 1)
        if verdict["error"] is None and verdict["pipelines"]:
            verdict["status"] = "complete"
        verdict["zero_errors"] = zero_errors(verdict["pipelines"])
        (out / VERDICT_JSON).write_text(json.dumps(verdict, indent=2, default=str) + "\n")
    return verdict


def zero_errors(pipelines: dict[str, dict[str, Any]]) -> bool:
    """Whether every pipeline's output was counted with no row lost, duplicated or wrong,
    and found consistent: a wrong order, or any problem the counts do not show, fails it
    too (it passed with results.md saying INCONSISTENT)."""
    counts = [p.get(k) for p in pipelines.values() for k in COUNTS[2:]]
    return (
        bool(counts)
        and all(c == 0 for c in counts)
        and all(p.get("consistent") for p in pipelines.values())
    )


def _modes(info: dict[str, Any], modes: Sequence[str]) -> list[str]:
    """The ``modes`` a PE (its status) can migrate in: a handover not for a sink (the
    orchestrator refuses it)."""
    sink = KINDS[info["kind"]].role == "sink"
    return [m for m in modes if m != "handover" or not sink]


def _soak(
    cluster: BenchCluster,
    config: SoakConfig,
    ops: list[str],
    log: RunLog,
    reporter: Reporter,
    task: TaskID | None,
    verdict: dict[str, Any],
) -> None:
    """Deploy the pipelines, run ``ops``, drain and count (filling ``verdict``)."""
    nodes = config.nodes
    placement = {"left": nodes[0], "right": nodes[-1], "merge": nodes[2 % len(nodes)],
                 "sink": nodes[0]}  # fmt: skip
    case1_row: dict[str, Any] = {}
    names = dict(zip(PIPELINES, (CASE1, MERGE, KEYED), strict=True))
    pipelines = tuple(names[p] for p in PIPELINES if p in config.pipelines)
    soak = Soak(cluster, config, log, reporter, pipelines)
    with contextlib.ExitStack() as stack:
        runs: dict[str, Case1Run | SoakRun] = {}
        if CASE1 in pipelines:
            runs[CASE1] = stack.enter_context(Case1Run(
                cluster, CASE1, rate=config.rate, seed=config.seed, agg_node=nodes[1],
                edge_node=nodes[0], row=case1_row, standby=config.standby,
            ))  # fmt: skip
        if MERGE in pipelines:
            runs[MERGE] = stack.enter_context(MergeRun(
                cluster, MERGE, rate=config.rate, seed=config.seed, placement=placement,
                standby=config.standby,
            ))  # fmt: skip
        if KEYED in pipelines:
            runs[KEYED] = stack.enter_context(KeyedRun(
                cluster, KEYED, rate=config.rate, seed=config.seed, keys=config.keys,
                edge=nodes[0], partitions=(nodes[1], nodes[2 % len(nodes)]),
                standby=config.standby,
            ))  # fmt: skip
        reporter.step(task, "deploying the pipelines")
        for run in runs.values():
            run.deploy()
        for pipeline in pipelines:
            if wait_rows(cluster, pipeline, 1, config.timeout_s) < 1:
                raise BenchError(f"{pipeline}: no output within {config.timeout_s:.0f} s")
        reporter.advance(task)

        try:
            soak.run(
                ops,
                on_op=lambda index, op: reporter.step(task, f"#{index}/{len(ops)} {op}"),
                on_done=lambda: reporter.advance(task),
            )
        finally:
            verdict["done"] = {op: soak.done[op] for op in OPERATIONS}
            verdict["schedule_s"] = round(soak.elapsed(), 1)
        events = {name: run.finish_input() for name, run in runs.items()}
        reporter.step(task, "draining the outputs")
        counted: dict[str, dict[str, Any]] = {}
        for name, run in runs.items():
            if isinstance(run, Case1Run):
                counted[name] = count_case1(run, config, events[name])
            elif isinstance(run, MergeRun):
                counted[name] = count_merge(run, config, events[name])
            elif isinstance(run, KeyedRun):
                counted[name] = count_keyed(run, config, events[name])
        # (All at once: counts of some pipelines only would pass for a soak without errors.)
        verdict["pipelines"] = counted
        reporter.advance(task)
    if case1_row.get("error"):  # Case1Run records a FogshiftError of the block, then ends it
        raise BenchError("the soak failed", received=one_line(str(case1_row["error"]), 400))
    for name, counted in verdict["pipelines"].items():
        reporter.note(
            f"soak {name}: {counted['written']} lines for {counted['expected']} expected; lost "
            f"{counted['lost']}, duplicated {counted['duplicated']}, wrong {counted['wrong']}"
        )


# -- results (from runs.csv and verdict.json only) ---------------------------------------------


#: The durations results.md summarises per operation: (column, what it measures).
MEASURES: dict[str, tuple[tuple[str, str], ...]] = {
    MIGRATE: (("duration_ms", "the migrate call"), ("downtime_ms", "downtime (its report)")),
    KILL_NODE: (
        ("recovered_ms", "kill -> its PEs run elsewhere"),
        ("restore_ms", "slowest restore (its report)"),
        ("restart_ms", "node started again -> healthy"),
    ),
    KILL_ORCHESTRATOR: (
        ("recovered_ms", "`fogshift up` -> it answers"),
        ("restart_ms", "`fogshift up` -> every node healthy"),
    ),
    MOVE_KEYS: (
        ("duration_ms", "the migrate --keys call"),
        ("downtime_ms", "longest stoppage of a moved key (its report)"),
    ),
    SCALE: (
        ("duration_ms", "the scale call"),
        ("downtime_ms", "longest stoppage of a moved key (its report)"),
    ),
}


#: What each of :data:`PIPELINES` is, in results.md.
_DESCRIBED = {
    "case1": "Case 1 (csv-source -> window avg -> csv-sink)",
    "merge": "a two-input pipeline (two csv-sources -> one filter reading both -> csv-sink, "
    "`examples/soak/merge.yaml`)",
    "keyed": "a keyed one (csv-source -> window avg per sensor in 2 or 3 partitions -> "
    "csv-sink; its order is judged per key)",
}


def _ran(settings: Mapping[str, Any]) -> str:
    """The pipelines a soak's ``settings`` ran, in words (a verdict written before
    ``--pipelines`` has ``keyed`` instead: all three, or the first two)."""
    ran = settings.get("pipelines")
    if ran is None:
        ran = PIPELINES if settings.get("keyed", True) else PIPELINES[:2]
    said = [_DESCRIBED[p] for p in PIPELINES if p in ran]
    if not said:
        return "No pipeline"
    words = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
    return words[0].upper() + words[1:]


def render(out: Path) -> Path:
    """Write ``out/results.md`` from ``runs.csv`` and ``verdict.json``; returns its path."""
    rows = read_rows(out / RUNS_CSV)
    path = out / VERDICT_JSON
    verdict = json.loads(path.read_text()) if path.exists() else {}
    settings = verdict.get("settings", {})
    parts = [
        "# fogshift soak",
        "",
        f"{_ran(settings)} ran while PEs were migrated, keys moved, the keyed element "
        "scaled between 2 and 3 partitions, and nodes and the orchestrator were SIGKILLed at "
        "random (`fogshift/bench/soak.py`; each operation only where its pipeline ran). "
        "Every number below comes from `runs.csv` (one row per operation) and "
        "`verdict.json` beside this file.",
        "",
        *_header(out, verdict, settings),
        "## Output against the references",
        "",
        "| pipeline | input events | expected rows | lines written | lost | duplicated | wrong "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, p in verdict.get("pipelines", {}).items():
        parts.append(
            f"| {name} ({p.get('kind')}) | {p.get('events')} | {p.get('expected')} | "
            f"{p.get('written')} | **{p.get('lost')}** | **{p.get('duplicated')}** | "
            f"**{p.get('wrong')}** | {'consistent' if p.get('consistent') else 'INCONSISTENT'} |"
        )
    if not verdict.get("pipelines"):
        parts.append("| (not counted: the soak did not get that far) | | | | | | | |")
    parts += ["", *_examples(verdict), *_outcomes(rows, verdict), *_durations(rows)]
    parts += _failures(rows)
    target = out / RESULTS_MD
    target.write_text("\n".join(parts).rstrip() + "\n")
    return target


def _header(out: Path, verdict: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    lines = []
    if verdict:
        error = verdict.get("error")
        lines.append(
            f"Status: **{verdict.get('status')}**"
            + (f" ({one_line(str(error), 300)})" if error else "")
            + f"; {fmt((verdict.get('elapsed_s') or 0) / 60, 1)} min in all, of which the "
            f"schedule {fmt((verdict.get('schedule_s') or 0) / 60, 1)} min. Seed "
            f"{settings.get('seed')}, nodes {', '.join(settings.get('nodes', []))}, "
            f"{settings.get('rate')} events/s per source, node-level checkpoints every "
            f"{settings.get('checkpoint_interval_s')} s, central pulls every "
            f"{settings.get('central_interval_s')} s, micro-batch trigger "
            f"{settings.get('trigger_ms', 'the default')} ms."
        )
    machine = out / "machine.json"
    if machine.exists():
        m = json.loads(machine.read_text())
        lines.append(
            f"Machine: {m.get('cores')} cores ({m.get('cpu_model')}), {m.get('ram_gib')} GiB, "
            f"Spark {m.get('spark')}, Java {m.get('java')}; every node, the orchestrator and "
            "nats-server ran on it."
        )
        for c in m.get("commands", []):
            done = "" if c.get("completed") else ", did not complete"
            lines.append(f"Command: `{c['command']}` ({c['wall_s'] / 60:.1f} min{done}).")
    return [f"{line}\n" for line in lines]


def _examples(verdict: Mapping[str, Any]) -> list[str]:
    lines = []
    for name, p in verdict.get("pipelines", {}).items():
        for kind, keys in (p.get("examples") or {}).items():
            if keys:
                lines.append(f"- {name}: first {kind} keys {keys}")
        for problem in p.get("problems") or []:
            lines.append(f"- {name}: {one_line(problem)}")
    return [*lines, ""] if lines else []


def _outcomes(rows: list[dict[str, str]], verdict: Mapping[str, Any]) -> list[str]:
    planned = verdict.get("planned", {})
    lines = [
        "## Operations",
        "",
        "Planned: the seeded schedule; done: rows of `runs.csv` (a migration, key move or "
        "scale the orchestrator was killed during is a row of its own).",
        "",
        f"| operation | planned | done | {' | '.join(OUTCOMES)} |",
        "|---|---|---|" + "---|" * len(OUTCOMES),
    ]
    for op in OPERATIONS:
        mine = [r for r in rows if r["op"] == op]
        counts = Counter(r["outcome"] for r in mine)
        lines.append(
            f"| {op} | {planned.get(op, '-')} | {len(mine)} | "
            + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES)
            + " |"
        )
    mid = sum(1 for r in rows if r["op"] == KILL_ORCHESTRATOR and r["mode"] == "mid-migration")
    unsettled = sum(1 for r in rows if not r["settled_ms"])
    lines += [
        "",
        f"Orchestrator kills during a migration, key move or scale: {mid}. Operations after "
        "which not every PE "
        f"ran again within the settle timeout: {unsettled}.",
        "",
    ]
    return lines


def _durations(rows: list[dict[str, str]]) -> list[str]:
    lines = [
        "## Durations",
        "",
        "| operation | measure | n | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for op, measures in MEASURES.items():
        for column, label in measures:
            values = [
                v for r in rows
                if r["op"] == op and (v := num(r[column])) is not None
                # A killed node that hosted nothing recovered nothing (runs before the fix
                # wrote 0 ms for it).
                and not (column == "recovered_ms" and r.get("mode") == "none")
            ]  # fmt: skip
            lines.append(
                f"| {op} | {label} | {len(values)} | {fmt(percentile(values, 50))} | "
                f"{fmt(percentile(values, 99))} | {fmt(max(values, default=None))} |"
            )
    settled = [v for r in rows if (v := num(r["settled_ms"])) is not None]
    lines.append(
        f"| any | operation end -> every PE running | {len(settled)} | "
        f"{fmt(percentile(settled, 50))} | {fmt(percentile(settled, 99))} | "
        f"{fmt(max(settled, default=None))} |"
    )
    return [*lines, ""]


def _failures(rows: list[dict[str, str]], limit: int = 30) -> list[str]:
    bad = [r for r in rows if r["outcome"] != "ok"]
    if not bad:
        return []
    lines = ["## Operations that did not succeed", ""]
    lines += [f"- {_say(r)}" for r in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"- ... and {len(bad) - limit} more (see `runs.csv`)")
    return lines
