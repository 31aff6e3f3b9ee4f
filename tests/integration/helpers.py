"""Test data and specs for the integration tests."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import yaml

from fogshift.bench.padded import aggregate_element
from fogshift.broker.client import (
    BrokerAddress,
    SyncJetStream,
    fetch_range,
    last_seq,
    pipeline_streams,
)
from fogshift.broker.naming import fence_subject, stream_name
from fogshift.ecg.simulate import patients
from fogshift.events import EPOCH_HEADER
from fogshift.spec.kinds import EcgSourceOptions
from fogshift.verify.reference import (
    case1_reference,
    compare,
    compare_per_key,
    keys_by_seq,
    read_sink,
)

if TYPE_CHECKING:
    from tests.conftest import Cluster


def _case1_line(rnd: random.Random, k: int, keys: int = 0) -> str:
    """Row ``k`` of a Case 1 input: now and then a malformed one (bad number, short row).
    Its sensor is one of 4 in turn, or with ``keys``, one of that many at random."""
    value = f"{rnd.uniform(-50, 150):.4f}"
    roll = rnd.random()
    if roll < 0.02:
        value = rnd.choice(["n/a", "", "inf", "NaN", "1.2.3"])
    sensor = f"s{rnd.randrange(keys)}" if keys else f"s{k % 4}"
    line = f"{1_700_000_000 + k},{sensor},{value}"
    if 0.02 <= roll < 0.03:
        line = f"{1_700_000_000 + k},s{k % 4}"
    return line + "\n"


def write_case1_csv(path: Path, rows: int, seed: int) -> Path:
    """A Case 1 input with a few malformed rows (bad numbers, wrong column counts)."""
    rnd = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "timestamp,sensor,value\n" + "".join(_case1_line(rnd, k) for k in range(1, rows + 1))
    )
    return path


class Feeder:
    """Feeds a CSV input file from a thread: ``first`` rows at once, then ``chunk`` whole
    rows every ``tick_s`` until stopped. Row ``k`` is ``line(rnd, k)`` (default: a Case 1
    row, now and then a malformed one).

    Input flows during every operation of a test however long the operation takes, and the
    test ends as soon as its operations do (no trickle of a fixed length to wait out); the
    reference is computed from the file once the feeder stopped. Few, larger appends keep
    the micro-batches few, which is what costs CPU on a small machine: a PE runs a batch at
    a trigger (every 2 s on the test clusters) only if new input came, so appends every 4 s
    halve the batches of every PE downstream against appends more often than the trigger
    (~0.3 CPU-s a batch whatever its size; the same rows per second either way).
    """

    def __init__(
        self,
        path: Path,
        seed: int,
        first: int = 100,
        chunk: int = 96,
        tick_s: float = 4.0,
        line: Callable[[random.Random, int], str] = _case1_line,
    ) -> None:
        self.path, self.chunk, self.tick_s, self.line = path, chunk, tick_s, line
        self.rnd = random.Random(seed)
        self.rows = 0
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("timestamp,sensor,value\n")
        self.append(first)
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"feeder {path}")
        self.thread.start()

    def append(self, count: int) -> None:
        """Append ``count`` rows now (whole lines, one write)."""
        with self.lock:
            lines = "".join(
                self.line(self.rnd, k) for k in range(self.rows + 1, self.rows + count + 1)
            )
            with self.path.open("a") as handle:
                handle.write(lines)  # whole lines, in one write
            self.rows += count

    def _run(self) -> None:
        while not self.stopped.wait(self.tick_s):
            self.append(self.chunk)

    @property
    def feeding(self) -> bool:
        return not self.stopped.is_set()

    def stop(self) -> int:
        """Stop appending; the number of rows written."""
        self.stopped.set()
        self.thread.join()
        return self.rows


#: The feeder of each Case 1 work folder (:func:`case1_spec`), stopped by
#: :func:`finish_and_compare` (or by :func:`stop_feeders` at the end of a test).
FEEDERS: dict[Path, Feeder] = {}


def stop_feeders() -> None:
    for feeder in FEEDERS.values():
        feeder.stop()
    FEEDERS.clear()


def write_spec(path: Path, pipeline: str, elements: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"pipeline": pipeline, "elements": elements}))
    return path


#: The key field of each keyed Case 1 work folder (``case1_spec(keys=...)``).
KEYED: dict[Path, str] = {}
#: Work folders whose aggregate is partitioned: their output is in order per key only.
PARTITIONED: set[Path] = set()


def case1_spec(
    work: Path,
    name: str,
    agg_node: str = "fog-a",
    pad_bytes: int = 0,
    detect_after_s: float | None = None,
    first: int = 100,
    keys: int = 0,
    standby: str | None = None,
    partitions: list[str] | None = None,
    history_s: float | None = None,
    engine: str = "python",
) -> Path:
    """Case 1 (source on cloud -> avg over 10 on ``agg_node`` -> sink on cloud) in ``work``,
    its input fed (:class:`Feeder`, ``first`` rows, then more) until :func:`finish_and_compare`.
    With ``keys``, the rows come from that many sensors and the aggregate is keyed by sensor
    (one window per sensor); with ``standby``, the pipeline keeps hot standbys there; with
    ``partitions`` (and ``keys``), the aggregate is partitioned over those nodes; with
    ``history_s``, its streams keep records that long (``recovery.history_s``); with
    ``engine="jvm"``, the aggregate runs on the JVM engine."""
    line = partial(_case1_line, keys=keys)
    FEEDERS[work] = Feeder(work / "in.csv", seed=len(name), first=first, line=line)
    aggregate = aggregate_element(agg_node, pad_bytes)
    if engine != "python":
        aggregate["options"]["engine"] = engine
    if keys:
        aggregate["key_by"] = KEYED[work] = "sensor"
    if partitions:
        del aggregate["node"]
        aggregate["partitions"] = partitions
        PARTITIONED.add(work)
    spec = write_spec(
        work / f"{name}.yaml",
        name,
        [
            {"id": "source", "kind": "csv-source", "node": "cloud",
             "options": {"path": "in.csv"}},
            aggregate,
            {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["aggregate"],
             "options": {"path": "out/case1.csv"}},
        ],
    )  # fmt: skip
    recovery = {"detect_after_s": detect_after_s, "standby": standby, "history_s": history_s}
    if any(v is not None for v in recovery.values()):
        fields = ", ".join(f"{k}: {v}" for k, v in recovery.items() if v is not None)
        spec.write_text(spec.read_text() + f"recovery: {{auto: true, {fields}}}\n")
    return spec


def finish_and_compare(cluster: Cluster, work: Path, pipeline: str, stop: bool = True) -> None:
    """Stop feeding a :func:`case1_spec` pipeline and wait until it finished; its output must
    equal the reference. Then, with ``stop``, stop the pipeline: a finished pipeline left
    running still costs its nodes checkpoints and the orchestrator pulls."""
    feeder = FEEDERS.pop(work, None)
    if feeder is not None:
        feeder.stop()
    ref = case1_reference(work / "in.csv", "value", 10, "avg", key_field=KEYED.pop(work, None))
    cluster.wait_for(pipeline, "sink", len(ref.rows), timeout_s=400)
    time.sleep(1)  # a duplicate would show up within a batch or two
    actual = read_sink(work / "out" / "case1.csv", "value")
    if work in PARTITIONED:
        PARTITIONED.discard(work)
        verdict = compare_per_key(ref.rows, actual, keys_by_seq(work / "in.csv", "sensor"))
    else:
        verdict = compare(ref.rows, actual)
    assert verdict.consistent, verdict.summary()
    if stop:
        cluster.cli("stop", pipeline)


def keyed_windows(csv_path: Path, key_field: str, field: str, window: int) -> dict[str, list]:
    """The last ``window`` valid values of ``field`` per ``key_field``: what the state of a
    keyed Case 1 aggregate must hold once every row was processed (computed from the file,
    with pandas' numeric parsing, as :func:`~fogshift.verify.reference.case1_reference`)."""
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False, on_bad_lines="skip")
    values = pd.to_numeric(frame[field], errors="coerce")
    valid = frame[values.notna() & np.isfinite(values)]
    numbers = values[valid.index]
    return {
        str(key): numbers[group.index].tolist()[-window:]
        for key, group in valid.groupby(key_field, sort=True)
    }


def wait_central(
    cluster: Cluster, pipeline: str, element: str, timeout_s: float = 90
) -> dict[str, Any]:
    """Wait for a central checkpoint of ``pipeline/element``; its ``nodes --json`` entry."""
    deadline = time.monotonic() + timeout_s
    seen: list[Any] = []
    while time.monotonic() < deadline:
        seen = []
        for n in cluster.json("nodes"):
            for c in n.get("checkpoints", []):
                if c["element"] == f"{pipeline}/{element}" and c["central"]:
                    return dict(c)
                if c["element"] == f"{pipeline}/{element}":
                    seen.append({"node": n["name"], **c})
        time.sleep(0.5)
    raise AssertionError(
        f"no central checkpoint of {pipeline}/{element} in {timeout_s}s; the nodes report "
        f"{seen}\n{cluster.logs()}"
    )


def stream_messages(cluster: Cluster, pipeline: str, element: str) -> list[Any]:
    """Every message (data, dead letters, fence markers) of a PE's output stream."""
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    try:
        stream = stream_name(pipeline, element)
        end = client.run(lambda js: last_seq(js, stream))
        subjects = f"fs.{pipeline}.{element}.>"
        return list(client.run(lambda js: fetch_range(js, stream, subjects, 0, end)))
    finally:
        client.close()


def pipeline_stream_names(cluster: Cluster, pipeline: str) -> list[str]:
    """The broker's streams of ``pipeline``'s PEs."""
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    try:
        return sorted(client.run(lambda js: pipeline_streams(js, pipeline)))
    finally:
        client.close()


def assert_no_older_epoch_after(cluster: Cluster, pipeline: str, element: str, epoch: int) -> None:
    """Something was written under ``epoch`` (a record, or a fence marker) and nothing under
    an older one came after it: the writer it superseded never wrote again. (A handover's
    fence writes no marker when the new instance's own records already carry the epoch.)"""
    msgs = stream_messages(cluster, pipeline, element)
    newer = [m.metadata.sequence.stream for m in msgs if int(m.headers[EPOCH_HEADER]) >= epoch]
    assert newer, f"nothing under epoch {epoch} was written to {pipeline}/{element}"
    stale = [
        m.metadata.sequence.stream
        for m in msgs
        if m.metadata.sequence.stream > newer[0] and int(m.headers[EPOCH_HEADER]) < epoch
    ]
    assert not stale, f"messages {stale[:10]} after epoch {epoch} began carry an older one"


def assert_only_new_epochs_after_fence(
    cluster: Cluster, pipeline: str, element: str, epoch: int = 2, input_left: bool = True
) -> None:
    """A fence marker was written and every message after the last one has ``epoch`` or newer:
    the fenced instance never wrote again. With ``input_left`` (input arrived after the
    fence), something must have been written after it."""
    msgs = stream_messages(cluster, pipeline, element)
    fences = [m for m in msgs if m.subject == fence_subject(pipeline, element)]
    assert fences, f"no fence marker was written for {pipeline}/{element}"
    last = fences[-1].metadata.sequence.stream
    after = [m for m in msgs if m.metadata.sequence.stream > last]
    assert after or not input_left, f"nothing was written to {pipeline}/{element} after the fence"
    stale = [m.metadata.sequence.stream for m in after if int(m.headers[EPOCH_HEADER]) < epoch]
    assert not stale, f"messages {stale[:10]} after the fence carry an epoch below {epoch}"


def case2_elements(source: EcgSourceOptions, classify: dict[str, Any] | None = None) -> list[dict]:
    """Case 2 (wearables on cloud -> amplify, keyed band-pass and keyed classifier on fog-a
    -> alarms on cloud), the classifier's placement replaced by ``classify`` if given (e.g.
    ``{"partitions": [...]}``)."""
    people = patients(source.patients, source.seed, source.abnormal_every, source.onset_s)
    calibration = {p.name: p.gain for p in people}  # the wearables' gains, undone
    return [
        {"id": "wearables", "kind": "ecg-source", "node": "cloud", "options": source.as_dict()},
        {"id": "amplify", "kind": "amplify", "node": "fog-a", "inputs": ["wearables"],
         "options": {"gain": 1.0, "calibration": calibration}},
        {"id": "bandpass", "kind": "bandpass", "node": "fog-a", "inputs": ["amplify"],
         "key_by": "patient"},
        {"id": "classify", "kind": "classify", "inputs": ["bandpass"], "key_by": "patient",
         **(classify or {"node": "fog-a"})},
        {"id": "alarms", "kind": "csv-sink", "node": "cloud", "inputs": ["classify"],
         "options": {"path": "out/alarms.csv"}},
    ]  # fmt: skip
