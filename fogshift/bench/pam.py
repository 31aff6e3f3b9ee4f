"""PAM (issue #16, seed 004): moving a partition's keys one at a time vs the whole PE.

A keyed, padded window aggregate runs as two partitions (``fog-a``, ``fog-b``) behind a
rate-limited source on ``cloud``; its input has ``keys`` sensors, drawn uniformly or by a
Zipf law, and every key carries ``state_kib`` of state. ``before_s`` after the output
flows, every key of partition 0 moves to ``fog-b`` by one of the methods below, or the
element scales out, in separate runs on fresh pipelines:

* ``whole``: partition 0 is live-migrated to ``fog-b`` (handover, make-before-break);
* ``literal``: the same by the thesis's procedure (pause, state, invoke, finalize): the
  stop-and-move whole-operator migration PAM's own evaluation compares with;
* ``fifo``: its keys move to partition 1 (``migrate --keys``) with their states sent as listed;
* ``backlog``: the same, the key whose next event is nearest first (PAM's order), in waves
  (one key first, growing with the states' sizes up to 64 keys: a key stops only while its
  wave crosses);
* ``at-once``: backlog order, every key in one wave (all change owner at one position: how
  key moves went before waves);
* ``precopy``: backlog order after copying the keys' states to partition 1 while partition 0
  keeps processing them (a per-key make-before-break): at the move only what changed since
  the copy travels;
* ``scale``: not those keys, but ``fogshift scale`` from two partitions to three (the third on
  ``cloud``): every key whose partition of three differs from its partition of two moves,
  at the rescale record;
* ``scale-waves``: the same in waves ahead of the rescale record (``scale --waves``);
* ``group``: key group 0 of 2 (``migrate --key-group 0/2``: partition 0's keys, now and
  later) to ``fog-b``, backlog order: the keys holding state go ahead in waves (as
  ``backlog``, but sized from the first by the sizes the state stores' listing gave), then
  the group's own record, a *listed* move stored in each input in turn,
  moves the keys seen since and every later one.

With ``inputs`` 2 the partitioned PE reads two sources on ``cloud`` (``a`` and ``b``, each
at half the rate, the same keys in both) and is a tally (:class:`~fogshift.bench.padded.
PaddedTally`): each key's events numbered as processed, so exactly-once is checked from the
output and the inputs alone; every move and rescale record is stored in both inputs.

Latency is measured from the broker's own timestamps, per event: when the partition's
output record was stored minus when its input event was stored (one clock, no sink in the
path), per event, not per time bin (:func:`figures`). From these: the *steady* p50/p99 (the
``before_s / 2`` before the move), each moved key's *stoppage* (the largest latency of its
events output from the move on and input before the operation ended, less the steady p50),
the time until the pipeline is *stable* again (from the move until the output of the last
*disturbed* event — its latency over the steady p99 by half, or by 50 ms — of the run of them
that reaches back to the operation, each within two triggers of the one before or of the
operation's end; disturbed events after that run are counted apart), the *added p99* (p99 of the
events output from the move until stable, less the steady p99), and the output throughput
before, during (from the move until stable, at least two triggers), after, and over the
operation (from the move until it answered or, if later, until stable; at least two
triggers). Every run's
sink output is compared per key with the reference (with two inputs: the tally's output
with both inputs, see :func:`~fogshift.bench.padded.tally_problems`).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from fogshift.bench.base import (
    ClusterRunConfig,
    Reporter,
    RunLog,
    fmt,
    mean_std,
    percentile,
    read_notes,
    read_rows,
    truthy,
    write_notes,
)
from fogshift.bench.cluster import BenchCluster, ClusterOptions, Clusters
from fogshift.bench.exceptions import BadBenchOption, BenchError
from fogshift.bench.padded import aggregate_element, tally_element, tally_problems
from fogshift.bench.workload import INPUT, OUTPUT, InputFeeder, wait_rows
from fogshift.broker.client import BrokerAddress, SyncJetStream, get_ranges, last_seq
from fogshift.broker.keys import KeyMove, KeyState, read_message
from fogshift.broker.naming import data_subject, key_subjects, stream_name
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.chunks import CHUNKED_MIN_BYTES
from fogshift.exceptions import FogshiftError
from fogshift.spec.models import partition_of_key
from fogshift.supervisor.cluster import orchestrator_client

NAME = "pam"
EDGE, FIRST, SECOND = "cloud", "fog-a", "fog-b"
#: How the input's keys are drawn.
TRAFFICS = ("uniform", "zipf")
METHODS = ("whole", "literal", "fifo", "backlog", "at-once", "precopy", "scale", "scale-waves",
           "group")  # fmt: skip
#: The key-group methods: the group's order (the group is partition 0's keys, 0/2).
GROUP_METHODS = {"group": "backlog"}
#: How many inputs the partitioned PE may read; their names with two.
INPUTS = (1, 2)
TWO_INPUTS = ("a", "b")
#: The scale methods: whether the keys move ahead of the rescale in waves.
SCALE_METHODS = {"scale": False, "scale-waves": True}
#: The key-move methods: (order, precopy, every key in one wave).
KEY_METHODS = {
    "fifo": ("fifo", False, False),
    "backlog": ("backlog", False, False),
    "at-once": ("backlog", False, True),
    "precopy": ("backlog", True, False),
}
#: How the ``whole`` and ``literal`` methods migrate partition 0.
WHOLE_MODES = {"whole": "handover", "literal": "literal"}

RUN_FIELDS = (
    "run", "method", "traffic", "keys", "state_kib", "rate", "inputs", "events", "moved_keys",
    "moved_at", "done_at", "op_ms", "waves", "precopy_ms", "precopy_bytes", "state_bytes",
    "steady_p50_ms", "steady_p99_ms", "stoppage_p50_ms", "stoppage_max_ms", "origin_leg_ms",
    "target_leg_ms", "stable_ms", "late_disturbed", "during_p99_ms",
    "added_p99_ms", "tput_before", "tput_during", "tput_after", "tput_op",
    "consistent", "problems", "error",
)  # fmt: skip


@dataclass(frozen=True)
class PamConfig(ClusterRunConfig):
    """Settings of the PAM benchmark.

    Attributes:
        keys: Numbers of keys (sensors) of the input.
        state_kib: State per key (KiB of incompressible padding).
        traffics: ``uniform`` and/or ``zipf`` (exponent ``zipf_s``) key choice.
        methods: Any of :data:`METHODS`.
        rate: Events per second of the source.
        before_s: Output time before the move (the steady window is its second half).
        after_s: Input time after the move.
        runs: Repetitions of each combination.
        trigger_ms: Every query's trigger. Four queries (source, two partitions, sink) share
            two cores here: at 200 ms their batches queue behind each other and the steady
            per-hop p99 is ~2 s, which hides what a move adds.
        link: A link profile (``fogshift up --link``, e.g. ``10mbit,n0``) for both fog
            nodes, each then isolated behind its own link to the broker and the other nodes,
            as fog nodes are (PAM's setting); ``None``: no isolation.
        inputs: The partitioned PE's inputs: 1 (the padded window aggregate behind one
            source) or 2 (a padded tally behind two sources of ``rate / 2`` each, the same
            keys in both).
    """

    keys: tuple[int, ...] = (10, 100, 1000)
    state_kib: tuple[int, ...] = (1, 64, 1024)
    traffics: tuple[str, ...] = TRAFFICS
    methods: tuple[str, ...] = METHODS
    rate: float = 100.0
    before_s: float = 16.0
    after_s: float = 16.0
    runs: int = 1
    zipf_s: float = 1.1
    trigger_ms: int = 500
    timeout_s: float = 600.0
    seed: int = 16
    link: str | None = None
    inputs: int = 1

    def __post_init__(self) -> None:
        if self.inputs not in INPUTS:
            raise BadBenchOption(
                "bench pam: the partitioned PE reads one or two inputs",
                expected=" or ".join(map(str, INPUTS)),
                received=str(self.inputs),
                hint="--inputs 1 or --inputs 2",
            )

    @classmethod
    def quick(cls) -> PamConfig:
        """20 keys of 1 and 64 KiB, both traffics, every method: 36 runs."""
        return cls(keys=(20,), state_kib=(1, 64), before_s=12.0, after_s=12.0)


class KeyedFeeder(InputFeeder):
    """A Case 1 input (kept ahead of the source's schedule as
    :class:`~fogshift.bench.workload.InputFeeder` does) whose sensor is drawn from ``keys``
    uniformly or by a Zipf law of exponent ``zipf_s``."""

    def __init__(
        self, path: Path, rate: float, keys: int, traffic: str, zipf_s: float, seed: int
    ) -> None:
        super().__init__(path, rate, seed)
        self._weights = (
            [1.0 / (k + 1) ** zipf_s for k in range(keys)] if traffic == "zipf" else None
        )
        self._keys = [f"s{k}" for k in range(keys)]

    def sensor(self) -> str:
        return self._random.choices(self._keys, weights=self._weights)[0]


def input_files(inputs: int) -> dict[str, str]:
    """Each source's input file (relative to the run's folder), by source id."""
    return {"source": INPUT} if inputs == 1 else {n: f"{n}.csv" for n in TWO_INPUTS}


def write_spec(work: Path, name: str, rate: float, pad_bytes: int, inputs: int = 1) -> Path:
    """The spec: source on cloud -> padded keyed aggregate in two partitions -> sink; with
    two ``inputs``, sources ``a`` and ``b`` (``rate`` / 2 each) -> padded tally -> sink."""
    files = input_files(inputs)
    if inputs == 1:
        aggregate = aggregate_element(FIRST, pad_bytes)
        del aggregate["node"]
    else:
        aggregate = tally_element(list(files), pad_bytes)
    aggregate.update(partitions=[FIRST, SECOND], key_by="sensor")
    sources = [
        {"id": source, "kind": "csv-source", "node": EDGE,
         "options": {"path": path, "rate": rate / inputs}}
        for source, path in files.items()
    ]  # fmt: skip
    spec = {
        "pipeline": name,
        "elements": [
            *sources,
            aggregate,
            {"id": "sink", "kind": "csv-sink", "node": EDGE, "inputs": ["aggregate"],
             "options": {"path": OUTPUT}},
        ],
        "recovery": {"auto": False},
    }  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


#: Settings that may differ between the invocations whose runs share one ``runs.csv``
#: (``--append``): each run's row records them.
COMBINATIONS = ("keys", "state_kib", "traffics", "methods", "runs")


def run(
    config: PamConfig, clusters: Clusters, out: Path, reporter: Reporter, append: bool = False
) -> None:
    """Every combination of the config, ``runs`` times; writes ``out/pam/runs.csv``.

    Args:
        append: Add to the runs already there, measured with the same settings but the
            combinations (:data:`COMBINATIONS`); their names and inputs' seeds go on from
            the rows there.

    Raises:
        BadBenchOption: ``append`` to runs measured with other settings.
    """
    folder = out / NAME
    settings = asdict(config)
    if append:
        earlier = read_notes(folder)["settings"]
        differ = {k for k in settings if k not in COMBINATIONS and k in earlier
                  and earlier[k] != _as_json(settings[k])}  # fmt: skip
        if differ:
            raise BadBenchOption(
                f"cannot append to the runs in {folder}: measured with other settings",
                expected=", ".join(f"{k}={earlier[k]}" for k in sorted(differ)),
                received=", ".join(f"{k}={settings[k]}" for k in sorted(differ)),
                hint="write to another --out, or leave out --append",
            )
        for k in COMBINATIONS[:-1]:  # what the folder holds runs of
            settings[k] = sorted({*earlier.get(k, ()), *settings[k]})
    runs = RunLog(folder / "runs.csv", RUN_FIELDS, append=append)
    combos = [
        (method, traffic, keys, kib, runs.kept + index)
        for index in range(config.runs)
        for keys in config.keys
        for kib in config.state_kib
        for traffic in config.traffics
        for method in config.methods
    ]
    task = reporter.task(NAME, len(combos))
    options = ClusterOptions(
        (EDGE, FIRST, SECOND), config.checkpoint_interval_s, config.central_interval_s,
        trigger_ms=config.trigger_ms,
    )  # fmt: skip
    if config.link is not None:
        options = replace(
            options, isolate=True, links=((FIRST, config.link), (SECOND, config.link))
        )
    with clusters.cluster(options) as cluster:
        write_notes(folder, {**settings, **cluster.options.intervals()})
        for method, traffic, keys, kib, index in combos:
            reporter.step(task, f"{method}: {keys} keys of {kib} KiB, {traffic}")
            row = _one(cluster, config, method, traffic, keys, kib, index)
            runs.append(row)
            reporter.note(
                f"pam {method} {traffic} {keys}x{kib} KiB: stoppage max "
                f"{row.get('stoppage_max_ms')} ms, stable after {row.get('stable_ms')} ms, "
                f"{'consistent' if row.get('consistent') else 'INCONSISTENT'}"
                + (f" ({row['error']})" if row.get("error") else "")
            )
            reporter.advance(task)


def _one(
    cluster: BenchCluster, config: PamConfig, method: str, traffic: str, keys: int, kib: int,
    index: int,
) -> dict[str, Any]:  # fmt: skip
    name = f"pam-{method}-{traffic}-{keys}k-{kib}kib-{index + 1}"
    row: dict[str, Any] = {"run": name, "method": method, "traffic": traffic, "keys": keys,
                           "state_kib": kib, "rate": config.rate, "inputs": config.inputs,
                           "consistent": False}  # fmt: skip
    work = cluster.home / "runs" / name
    files = input_files(config.inputs)
    feeders = [
        KeyedFeeder(work / path, config.rate / config.inputs, keys, traffic, config.zipf_s,
                    (config.seed * 1000 + index) * len(files) + n)
        for n, path in enumerate(files.values())
    ]  # fmt: skip
    spec = write_spec(work, name, config.rate, kib * 1024, config.inputs)
    moving = [f"s{k}" for k in range(keys) if partition_of_key(f"s{k}", 2) == 0]
    if method in SCALE_METHODS:
        moving = [
            f"s{k}" for k in range(keys)
            if partition_of_key(f"s{k}", 2) != partition_of_key(f"s{k}", 3)
        ]  # fmt: skip
    row["moved_keys"] = len(moving)
    try:
        for feeder in feeders:
            feeder.start()
        cluster.cli("deploy", str(spec), "--fresh")  # (a run is anew, its name too)
        if wait_rows(cluster, name, 1, config.timeout_s) < 1:
            raise FogshiftError(f"{name}: no output in {config.timeout_s:.0f} s")
        time.sleep(config.before_s)
        _await_central(cluster, name, config.timeout_s)
        moved_at = time.time()
        row["moved_at"] = round(moved_at, 3)
        if method in WHOLE_MODES:
            report = cluster.operation(name, "aggregate-p0", "migrate",
                                       {"target": SECOND, "mode": WHOLE_MODES[method]})  # fmt: skip
            row["op_ms"] = round(sum(report.get("phases_ms", {}).values()), 1)
            if report.get("status") != "migrated":
                raise FogshiftError(f"{name}: the migration ended {report.get('status')}")
        elif method in SCALE_METHODS:
            with orchestrator_client(cluster.home, timeout_s=900) as client:
                report = client.post(f"/pipelines/{name}/elements/aggregate/scale",
                                     json={"partitions": 3, "nodes": [EDGE],
                                           "waves": SCALE_METHODS[method]})  # fmt: skip
            row["op_ms"] = report.get("done_ms")
            row["waves"] = len(report.get("waves") or [])
            if report.get("status") != "moved":
                raise FogshiftError(f"{name}: the scale ended {report.get('status')}")
        elif method in GROUP_METHODS:
            with orchestrator_client(cluster.home, timeout_s=900) as client:
                report = client.post(f"/pipelines/{name}/elements/aggregate/keys/migrate",
                                     json={"group": "0/2", "target": SECOND,
                                           "order": GROUP_METHODS[method]})  # fmt: skip
            row["op_ms"] = report.get("done_ms")
            row["waves"] = len(report.get("waves") or [])
            if report.get("status") != "moved":
                raise FogshiftError(f"{name}: the key group's move ended {report.get('status')}")
        else:
            order, precopy, at_once = KEY_METHODS[method]
            body: dict[str, Any] = {"keys": moving, "target": SECOND, "order": order,
                                    "precopy": precopy}  # fmt: skip
            if at_once:
                body["wave_keys"] = len(moving)
            with orchestrator_client(cluster.home, timeout_s=900) as client:
                report = client.post(f"/pipelines/{name}/elements/aggregate/keys/migrate",
                                     json=body)  # fmt: skip
            row["op_ms"] = report.get("done_ms")
            row["waves"] = len(report.get("waves") or [])
            row["precopy_ms"] = report.get("precopy_ms")
            row["precopy_bytes"] = report.get("precopy_bytes")
            if report.get("status") != "moved":
                raise FogshiftError(f"{name}: the key move ended {report.get('status')}")
        done_at = time.time()
        row["done_at"] = round(done_at, 3)
        row["state_bytes"] = report.get("state_bytes")
        time.sleep(max(0.0, moved_at + config.after_s - time.time()))
        row["events"] = sum(feeder.finish() for feeder in feeders)
        streams: Records | None = None  # (read by the check with two inputs: read once)
        if config.inputs == 1:
            verdict = _verdict(cluster, name, work, config.timeout_s)
        else:
            sent = dict(zip(files, (feeder.rows for feeder in feeders), strict=True))
            verdict, streams = _tally_verdict(cluster, name, sent, config.timeout_s)
        row.update(consistent=verdict.consistent, problems="; ".join(verdict.problems) or None)
        points = _points(cluster, name, list(files), streams)
        row.update(figures(points, moved_at, done_at, set(moving), config.before_s / 2,
                           2 * config.trigger_ms / 1000))  # fmt: skip
        if method not in WHOLE_MODES:
            try:
                moves, states = _key_records(cluster, name, next(iter(files)))
                row.update(legs(moves, states, points, set(moving)))
            except FogshiftError as exc:  # (the run's other figures stand)
                noted = [row.get("problems"), f"no key legs: {exc.message}"]
                row["problems"] = "; ".join(p for p in noted if p)
    except FogshiftError as exc:
        row["error"] = exc.message
    finally:
        for feeder in feeders:
            feeder.finish()
        cluster.cli("stop", name, check=False)
    return row


#: How much of a partition's node-level checkpoint its central one must hold before a move
#: (:func:`_await_central`): the state grows a little between them.
CENTRAL_SHARE = 0.9


def _await_central(cluster: BenchCluster, name: str, timeout_s: float) -> None:
    """Wait until each partition has a central checkpoint of about its node-level
    checkpoint's size, holding its state in RocksDB's SSTs: the first pull of a partition's
    state ships it whole (6 MB at 10 Mbit/s: seconds), which a running pipeline did long ago.
    A move started during it shares the origin's link with it, as no move in a pipeline past
    its start does. And a whole-PE move's copy leaves out what the central store holds: while
    that is RocksDB's first changelogs (Spark compresses them), the SSTs in the copy share no
    chunk with it, and a move then ships the whole state, as none does later. The same for
    the partition's planned backup node, which a whole-PE move to it sends only what its
    replica lacks: it must hold a replica in SSTs.

    Raises:
        BenchError: Not within ``timeout_s``.
    """
    wanted = {f"{name}/{pe}" for pe in ("aggregate-p0", "aggregate-p1")}
    store = CentralStore(cluster.home / "central")  # the orchestrator's (read only here)
    deadline = time.monotonic() + timeout_s
    with orchestrator_client(cluster.home) as client:
        while True:
            nodes = client.get("/nodes")
            backups = {f"{name}/{e['element']}": e["planned_backup"]
                       for e in client.get(f"/pipelines/{name}")["elements"]
                       if e["planned_backup"] != e["node"]}  # (none pushed there)  # fmt: skip
            pulled = {
                view["element"]
                for node in nodes
                for view in node["checkpoints"]
                if view["central"] is not None
                and view["node_level"] is not None
                and view["central"]["bytes"] >= CENTRAL_SHARE * view["node_level"]["bytes"]
                and _state_in_ssts(store.newest(*view["element"].split("/", 1)))
                and _backup_in_ssts(store, nodes, view["element"], backups.get(view["element"]))
            }
            if wanted <= pulled:
                return
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{name}: no central checkpoint (and replica on the planned backup node) "
                    f"of {sorted(wanted - pulled)} in {timeout_s:.0f} s"
                )
            time.sleep(0.5)


def _backup_in_ssts(
    store: CentralStore, nodes: list[dict[str, Any]], element: str, backup: str | None
) -> bool:
    """Whether ``element``'s planned ``backup`` node (if it has one) holds a replica whose
    central checkpoint holds the state in SSTs (:func:`_state_in_ssts`)."""
    if backup is None:
        return True
    held = {r.rsplit("@", 1)[1] for n in nodes if n["name"] == backup
            for r in n["replicas"] if r.rsplit("@", 1)[0] == element}  # fmt: skip
    pipeline, pe = element.split("/", 1)
    return any(m["id"] in held and _state_in_ssts(m) for m in store.manifests(pipeline, pe))


def _state_in_ssts(manifest: dict[str, Any] | None) -> bool:
    """Whether each state partition of a checkpoint that holds 1 MiB or more holds it in a
    RocksDB snapshot (``<version>.zip`` and its SSTs), not only in changelogs."""
    if manifest is None:
        return False
    parts: dict[str, tuple[int, bool]] = {}  # state/<operator>/<partition>: bytes, a snapshot
    for rel, entry in manifest["files"].items():
        bits = rel.split("/")
        if len(bits) < 4 or bits[0] != "state":
            continue
        size, snapshot = parts.get("/".join(bits[:3]), (0, False))
        snapshot = snapshot or (len(bits) == 4 and bits[3].endswith(".zip"))
        parts["/".join(bits[:3])] = (size + int(entry["size"]), snapshot)
    return all(snapshot for size, snapshot in parts.values() if size >= CHUNKED_MIN_BYTES)


def _verdict(cluster: BenchCluster, name: str, work: Path, timeout_s: float) -> Any:
    """The sink's output against the keyed reference, per key (partitions interleave)."""
    from fogshift.verify.reference import (
        case1_reference,
        compare_per_key,
        keys_by_seq,
        read_sink,
    )

    reference = case1_reference(work / INPUT, "value", 10, "avg", key_field="sensor")
    written = wait_rows(cluster, name, len(reference.rows), timeout_s, stall_s=120)
    time.sleep(1.0)
    key_of = keys_by_seq(work / INPUT, "sensor")
    result = compare_per_key(reference.rows, read_sink(work / OUTPUT, "value"), key_of)
    if written < len(reference.rows):
        result.problems.insert(0, f"the sink wrote {written} of {len(reference.rows)} rows")
        result.consistent = False
    return result


def _tally_verdict(
    cluster: BenchCluster, name: str, sent: dict[str, int], timeout_s: float
) -> tuple[Any, Records]:
    """A two-input run's output against its inputs, as the broker holds both
    (:func:`~fogshift.bench.padded.tally_problems`: each key numbered 1..N, each event once,
    each input's in its order), once the sink wrote a line per event, which must number each
    key's lines 1..N too. ``sent``: the rows written to each source's file, which its stream
    must hold as its events 1..n, each once.

    Returns:
        The verdict, and the sources' and partitions' records it read (:func:`_records`).
    """
    import pandas as pd

    from fogshift.verify.reference import Verdict

    events = sum(sent.values())
    written = wait_rows(cluster, name, events, timeout_s, stall_s=120)
    time.sleep(1.0)  # a duplicate would show within a batch
    streams = _records(cluster, name, [*sent, *_partitions(cluster, name)])
    problems: list[str] = []
    try:
        inputs: dict[str, list[tuple[int, str]]] = {}  # (by creator: the tally's src)
        for source, rows in sent.items():
            got = [(str(r["creator"]), int(r["seq"]), str(json.loads(r["body"])["sensor"]))
                   for _, r in streams[source]]  # fmt: skip
            if [(c, q) for c, q, _ in got] != [(source, q) for q in range(1, rows + 1)]:
                problems.append(f"source {source} sent {len(got)} events, not its {rows} rows")
            inputs[source] = [(q, key) for _, q, key in got]
        outputs = [json.loads(r["body"]) for pe, got in streams.items() if pe not in sent
                   for _, r in got]  # fmt: skip
        problems += tally_problems(inputs, outputs)
        if written != events:
            problems.insert(0, f"the sink wrote {written} rows for {events} events")
        else:
            sink = pd.read_csv(cluster.home / "runs" / name / OUTPUT, dtype={"sensor": str})
            if any(list(g["n"]) != list(range(1, len(g) + 1)) for _, g in sink.groupby("sensor")):
                problems.append("the sink's lines of a key are not numbered 1..N in order")
    except (KeyError, TypeError, ValueError) as exc:  # (a record not as written: a failed run)
        problems.append(f"unreadable output or input: {type(exc).__name__}: {exc}")
        outputs = []
    return Verdict(not problems, events, len(outputs), problems), streams


def _partitions(cluster: BenchCluster, name: str) -> list[str]:
    """The partitions of the element (``aggregate-p<i>``) as the pipeline has them now."""
    pes = [e["element"] for e in cluster.json("status", name)["elements"]]
    return [pe for pe in pes if pe.startswith("aggregate-p")]


#: Records of PEs' streams by PE: ``(store time, record)`` in stream order.
Records = dict[str, list[tuple[float, dict[str, Any]]]]


def _stored(cluster: BenchCluster, name: str, reads: dict[str, list[str]]) -> dict[str, Any]:
    """The messages stored on ``reads``' subjects (by PE: the subjects of its stream), in
    stream order, by PE."""
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))

    async def read(js: Any, pe: str) -> Any:
        stream = stream_name(name, pe)
        return await get_ranges(js, stream, reads[pe], 0, await last_seq(js, stream))

    try:
        return {pe: client.run(partial(read, pe=pe), timeout=300) for pe in reads}
    finally:
        client.close()


def _records(cluster: BenchCluster, name: str, pes: list[str]) -> Records:
    """Each of ``pes``' data records as stored: ``(store time, record)`` in stream order."""
    stored = _stored(cluster, name, {pe: [data_subject(name, pe)] for pe in pes})
    return {pe: [(m.stored_at, json.loads(m.data)) for m in stored[pe]] for pe in pes}


def _key_records(
    cluster: BenchCluster, name: str, source: str
) -> tuple[dict[str, float], list[tuple[float, KeyState]]]:
    """The key moves (each move's first record: when it was stored, by the move's id) and
    the key states (store time, state) in ``source``'s stream, where they travel (the first
    input)."""
    moves: dict[str, float] = {}
    states: list[tuple[float, KeyState]] = []
    for message in _stored(cluster, name, {source: key_subjects(name, source)})[source]:
        item = read_message(name, source, message.subject, message.seq, message.data)
        if isinstance(item, KeyMove):
            moves.setdefault(item.move, message.stored_at)
        elif isinstance(item, KeyState):
            states.append((message.stored_at, item))
    return moves, states


def legs(
    moves: dict[str, float],
    states: list[tuple[float, KeyState]],
    points: list[Point],
    moving: set[str],
) -> dict[str, Any]:
    """Where a moved key's stoppage goes, as the broker stored it: the origin's leg, from
    its move's record to its state's (the origin's batch that reached the move, and the wait
    for that batch), and the target's leg, from its state to the first output on the target
    of an event held for it (the target's batch that read the state, and the wait for the
    batch under way then); medians over the moved keys (a key's first state only: one sent
    again is the same). ``None`` where no key's is known (a whole move has neither)."""
    sent: dict[str, tuple[float, str]] = {}
    for stored, state in sorted(states, key=lambda s: s[0]):
        if not state.copy and state.key in moving and state.key not in sent:
            sent[state.key] = (stored, state.move)
    origin, target = [], []
    for key, (stored, move) in sent.items():
        if move in moves:
            origin.append((stored - moves[move]) * 1000)
        # The events held for the state (input before it): the origin's last outputs of the
        # key are stored before its state, so the first one after it is the target's. (A
        # later event's output would add the wait for that event.)
        first = min((p.t_out for p in points
                     if p.key == key and p.t_in <= stored <= p.t_out), default=None)  # fmt: skip
        if first is not None:
            target.append((first - stored) * 1000)

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 1) if values else None

    return {"origin_leg_ms": median(origin), "target_leg_ms": median(target)}


def _points(
    cluster: BenchCluster, name: str, sources: list[str], streams: Records | None = None
) -> list[Point]:
    """Every output record of the partitions with its input event's store time, from the
    broker's timestamps (one clock): the input event is the one of the record's ``seq``
    with one source, of its body's ``src`` and ``src_seq`` with several (a tally's).
    ``streams``: the sources' and partitions' records if read already."""
    parts = _partitions(cluster, name)
    if streams is None:
        streams = _records(cluster, name, [*sources, *parts])
    came = {(source if len(sources) == 1 else str(r["creator"]), int(r["seq"])): stored
            for source in sources for stored, r in streams[source]}  # fmt: skip
    points: list[Point] = []
    for pe in parts:
        for stored_at, record in streams[pe]:
            body = json.loads(record["body"])
            event = (sources[0], int(record["seq"])) if len(sources) == 1 else (
                str(body.get("src")), int(body.get("src_seq", 0)))  # fmt: skip
            stored = came.get(event)
            if stored is not None:
                points.append(Point(stored, stored_at, str(body.get("sensor"))))
    return points


@dataclass(frozen=True)
class Point:
    """One event through the partitioned PE: when its input and its output were stored
    (broker seconds) and its key."""

    t_in: float
    t_out: float
    key: str

    @property
    def ms(self) -> float:
        return (self.t_out - self.t_in) * 1000


def _disturbance(disturbed: list[float], done_at: float, gap_s: float) -> tuple[float | None, int]:
    """The end of the disturbance the operation caused, and how many disturbed events came
    after it.

    The disturbance is the run of disturbed outputs (``disturbed``: their output times, from
    the move on, sorted) that reaches back to the operation: each within ``gap_s`` of the
    operation's end or of the one before it. A slow batch seconds later, apart from that run,
    is the kind a steady pipeline has now and then (at 1.5 times the p99 a handful of events
    a minute here): counted, not taken for the operation's. Its output time, or None when
    nothing was disturbed.
    """
    end, last = done_at, None
    for index, t_out in enumerate(disturbed):
        if t_out > end + gap_s:
            return last, len(disturbed) - index
        end, last = max(end, t_out), t_out
    return last, 0


def figures(
    points: list[Point],
    moved_at: float,
    done_at: float,
    moving: set[str],
    steady_s: float,
    min_window_s: float,
) -> dict[str, Any]:
    """A run's latency and throughput figures (module doc), per event.

    Args:
        points: Every event through the PE.
        moved_at: When the operation was asked for (the same clock as the points').
        done_at: When it answered (a moved key's later input is no longer its stoppage).
        moving: The keys the operation moved.
        steady_s: The steady window: input stored in the ``steady_s`` before ``moved_at``
            and output before it.
        min_window_s: The shortest "during" window (two triggers: a shorter one holds
            zero or one batch of output, and its throughput says nothing).

    Returns:
        The figures (:data:`RUN_FIELDS`' latency and throughput columns); empty when the
        steady window holds fewer than ten events.
    """
    # Steady: input in the window and output before the move. An event input just before
    # the move and output after it may be held up by it (a literal migration pauses at the
    # next batch): counted as steady, it raised the limit a disturbance is measured by.
    steady = sorted(p.ms for p in points if moved_at - steady_s <= p.t_in and p.t_out < moved_at)
    if len(steady) < 10:
        return {}
    p50, p99 = percentile(steady, 50) or 0.0, percentile(steady, 99) or 0.0
    limit = max(1.5 * p99, p99 + 50.0)
    # Output from the move on: an event input just before the move and held up by it is
    # disturbed as much as one input after it.
    after = [p for p in points if p.t_out >= moved_at]
    last, late = _disturbance(sorted(p.t_out for p in after if p.ms > limit), done_at, min_window_s)
    stable_ms = (last - moved_at) * 1000 if last is not None else 0.0
    stable_at = moved_at + max(stable_ms / 1000, min_window_s)
    during = sorted(p.ms for p in after if p.t_out < stable_at)
    per_key: dict[str, float] = {}
    for p in after:
        if p.key in moving and p.t_in <= done_at:
            per_key[p.key] = max(per_key.get(p.key, 0.0), p.ms - p50, 0.0)
    stalls = sorted(per_key.values())

    def rate(start: float, end: float) -> float:
        return round(sum(1 for p in points if start <= p.t_out < end) / (end - start), 1)

    return {
        "steady_p50_ms": round(p50, 1), "steady_p99_ms": round(p99, 1),
        "stoppage_p50_ms": round(statistics.median(stalls), 1) if stalls else None,
        "stoppage_max_ms": round(stalls[-1], 1) if stalls else None,
        "stable_ms": round(stable_ms, 1),
        "late_disturbed": late,
        "during_p99_ms": round(percentile(during, 99) or 0.0, 1) if during else None,
        "added_p99_ms": round((percentile(during, 99) or 0.0) - p99, 1) if during else None,
        "tput_before": rate(moved_at - steady_s, moved_at),
        "tput_during": rate(moved_at, stable_at),
        "tput_after": rate(stable_at, stable_at + steady_s),
        # Over the whole reconfiguration: the command and any disturbance after it. Unlike
        # "during", not one or two batches when nothing was disturbed (500 ms triggers make
        # those 0, 1 or 2 batches' worth).
        "tput_op": rate(moved_at, max(done_at, stable_at)),
    }  # fmt: skip


# -- results (from the CSV files only) --------------------------------------------------------


def section(folder: Path) -> str | None:
    """The PAM table: per method, traffic, keys and state size, the mean of each figure."""
    rows = read_rows(folder / "runs.csv")
    if not rows:
        return None
    settings = read_notes(folder)["settings"]
    link, inputs = settings.get("link"), int(settings.get("inputs") or 1)
    groups: dict[tuple[str, str, str, str, str], list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(
            (row["keys"], row["state_kib"], row["traffic"], _rate(row), row["method"]), []
        ).append(row)
    lines = [
        "## PAM: moving keys one at a time vs the whole PE (issue #16)",
        "",
        "Every key of partition 0 moves from fog-a to fog-b while the source runs: the whole "
        "partition by a handover (whole) or by the thesis's pause-and-move procedure "
        "(literal, the baseline PAM compares with), or its keys to partition 1 "
        "(`migrate --keys`, in waves: one key, then growing with the states' sizes up to 64 "
        "keys, each wave once the one before arrived or, states in parts, was being sent), "
        "their states sent as listed (fifo) or nearest next event first (backlog, PAM), or "
        "every key in one wave (at-once, backlog order), or in backlog order after copies of "
        "the states went ahead while partition 0 kept the keys (precopy: only what changed "
        "since travels at the move); "
        "or (scale) the element goes from two partitions to three (the third "
        "on cloud) and every key whose partition changes moves (at the rescale record, or "
        "with scale-waves in waves ahead of it), or key group 0 of 2 (partition 0's keys) "
        "moves (group: its keys holding state in backlog waves sized by the state "
        "stores' listing, then the group's record, stored in each input, with the keys "
        "seen since and every later one; scale-waves' waves are sized so too). "
        + (
            "The partitioned PE reads two inputs (sources a and b, each at half the rate "
            "below, the same keys in both): a tally numbering each key's events, every move "
            "and rescale stored in both inputs, exactly-once checked from its output and "
            "the inputs. "
            if inputs == 2
            else ""
        )
        + "Latency per event from the "
        "broker's timestamps (output stored - input stored); stoppage: per moved key, "
        "the largest latency of its events output from the move on and input before the "
        "operation ended, less the steady p50 (median over keys / max); key's way: per "
        "moved key, from its move's record to its state's (origin: the origin's batch that "
        "reached the move, and the wait for it) and from there to its first output on the "
        "target of its events held for the state (target: the target's batch that read "
        "the state, and the wait for it), medians over keys (from the records' store "
        "times; with two inputs the origin's includes the move's append to the second); "
        "stable: from the move "
        "until the output of the last disturbed event (above 1.5 times the steady p99, or "
        "50 ms above it) of the run of them reaching back to the operation's end, each within "
        "two triggers of the one before (mean over runs; in brackets, how many runs were "
        "disturbed at all); late: disturbed events after that run, per run "
        "(a slow batch now and then, as steady pipelines have); throughput: output records/s "
        "before, from the move until stable (at least two triggers), after; op tput: from "
        "the move until the operation answered or, if later, stable (at least two triggers). "
        "Means over runs."
        + (
            f" fog-a and fog-b each behind a link of {link} (`fogshift up --isolate --link`): "
            "their input, output, states and checkpoints cross it."
            if link
            else ""
        ),
        "",
        "| keys | KiB/key | traffic | events/s | method | runs ok | stoppage p50 / max ms | "
        "key's way: origin / target ms | stable ms (runs disturbed) | late | steady p99 ms | "
        "added p99 ms | tput before / during / after | op tput | op ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (keys, kib, traffic, rate, method), group in sorted(
        groups.items(),
        key=lambda kv: (
            int(kv[0][0]),
            int(kv[0][1]),
            kv[0][2],
            float(kv[0][3]),
            METHODS.index(kv[0][4]) if kv[0][4] in METHODS else 9,
        ),
    ):
        ok = _ok(group)

        def mean(field: str, rows: list[dict[str, str]] = ok) -> float | None:
            return mean_std(float(r[field]) for r in rows if r.get(field))[0]

        lines.append(
            f"| {keys} | {kib} | {traffic} | {fmt(float(rate))} | {method} | "
            f"{len(ok)}/{len(group)} | "
            f"{fmt(mean('stoppage_p50_ms'))} / {fmt(mean('stoppage_max_ms'))} | "
            f"{fmt(mean('origin_leg_ms'))} / {fmt(mean('target_leg_ms'))} | "
            f"{fmt(_stable(ok))} ({_disturbed(ok)}/{len(ok)}) | "
            f"{fmt(mean('late_disturbed'), 1)} | "
            f"{fmt(mean('steady_p99_ms'))} | "
            f"{fmt(mean('added_p99_ms'))} | {fmt(mean('tput_before'))} / "
            f"{fmt(mean('tput_during'))} / {fmt(mean('tput_after'))} | "
            f"{fmt(mean('tput_op'))} | {fmt(mean('op_ms'))} |"
        )
    lines += _sooner(groups)
    failed = [r for r in rows if r.get("error") or not truthy(r.get("consistent"))]
    if failed:
        lines += [
            "",
            "Failed or inconsistent runs: "
            + "; ".join(f"{r['run']} ({r.get('error') or r.get('problems')})" for r in failed),
        ]
    return "\n".join(lines)


def _ok(group: list[dict[str, str]]) -> list[dict[str, str]]:
    """The runs of ``group`` that count: consistent and without an error."""
    return [r for r in group if truthy(r.get("consistent")) and not r.get("error")]


def _stable(rows: list[dict[str, str]]) -> float | None:
    """The mean time until stable (ms) of ``rows``."""
    return mean_std(float(r["stable_ms"]) for r in rows if r.get("stable_ms"))[0]


def _rate(row: dict[str, str]) -> str:
    """The run's input rate (events/s; 100, the default, if the CSV has none), one text per
    number ("100" and "100.0" are one group)."""
    return repr(float(row.get("rate") or PamConfig.rate))


def _disturbed(rows: list[dict[str, str]]) -> int:
    """How many of ``rows`` were disturbed at all (a stable time above 0): at a steady p99
    near a second, whether a run is, is partly chance, and a mean hides how many were."""
    return sum(1 for r in rows if float(r.get("stable_ms") or 0) > 0)


#: The key moves :func:`_sooner` sets beside moving the whole partition.
KEYED = ("backlog", "precopy", "group")


def _sooner(groups: dict[tuple[str, str, str, str, str], list[dict[str, str]]]) -> list[str]:
    """Issue #16's comparison: how much sooner the key moves (backlog order, without and with
    precopy, and a key group's move) are stable than moving the whole partition (literal:
    PAM's baseline; whole: the handover), per keys, size, traffic and input rate."""
    cells: dict[tuple[str, str, str, str], dict[str, float | None]] = {}
    for (keys, kib, traffic, rate, method), group in groups.items():
        ok = _ok(group)
        cells.setdefault((keys, kib, traffic, rate), {})[method] = _stable(ok)
    lines = []
    for (keys, kib, traffic, rate), stable in sorted(
        cells.items(),
        key=lambda kv: (int(kv[0][0]), int(kv[0][1]), kv[0][2], float(kv[0][3])),
    ):
        if not any(stable.get(m) is not None for m in KEYED) or not any(
            stable.get(m) for m in WHOLE_MODES
        ):
            continue

        def sooner(whole: str, stable: dict[str, float | None] = stable) -> str:
            baseline = stable.get(whole)
            return " / ".join(
                "-" if stable.get(m) is None or not baseline
                else f"{(1 - (stable.get(m) or 0.0) / baseline) * 100:.0f} %"
                for m in KEYED
            )  # fmt: skip

        times = " / ".join(fmt(stable.get(m)) for m in ("literal", "whole", *KEYED))
        lines.append(
            f"| {keys} | {kib} | {traffic} | {fmt(float(rate))} | {times} | "
            f"{sooner('literal')} | {sooner('whole')} |"
        )
    if not lines:
        return []
    return [
        "",
        "Stable sooner by key moves in backlog order (without / with precopy) and by a key "
        "group's move than by moving the whole partition (issue #16's target: at least 45 % "
        "sooner; a negative figure: later):",
        "",
        "| keys | KiB/key | traffic | events/s | stable ms: literal / whole / backlog / "
        "precopy / group | vs literal | vs whole |",
        "|---|---|---|---|---|---|---|",
        *lines,
    ]


def plot(folder: Path) -> list[Path]:
    """No plots: the table says it (kept for the report's interface)."""
    return []


__all__ = ["METHODS", "NAME", "PamConfig", "run", "section"]


def _as_json(value: Any) -> Any:
    """``value`` as notes.json gives it back (tuples become lists)."""
    return json.loads(json.dumps(value, default=str))
