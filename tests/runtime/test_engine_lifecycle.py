"""The PE contract in real Spark queries: one processor per query, not one per micro-batch,
and the lifecycle hooks called where the README says.

A local SparkSession in this process and a real nats-server; the processors
(``lifecycle_procs``) log each construction and hook with the pid that ran it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fogshift.broker.client import (
    SyncJetStream,
    ensure_pe_stream,
    fetch_range,
    get_range,
    get_ranges,
    last_seq,
)
from fogshift.broker.naming import (
    data_subject,
    dead_subject,
    key_state_subject,
    key_subjects,
    keys_subject,
    state_subject,
    stream_name,
)
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import BrokerProcess
from fogshift.checkpoint.spark_dir import committed_batch
from fogshift.common.gate import acknowledged, open_gate, write_gate
from fogshift.common.waiting import wait_until
from fogshift.runtime.engine import QueryPlan, start_query
from fogshift.runtime.gate import end_run
from fogshift.runtime.state_reader import read_key_variables, read_keys, read_state, read_waiting
from fogshift.spec.models import ElementSpec, Partition, partition_of_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
_pipelines = itertools.count()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    from fogshift.runtime.session import build_session

    # local[2,3]: a failed task is tried again (up to 3 times), as on a cluster.
    session = build_session("lifecycle", "local[2,3]", str(tmp_path_factory.mktemp("spark-local")))
    yield session
    session.stop()


def test_the_driver_jvm_maps_the_class_archive(spark: SparkSession) -> None:
    # `make setup` makes the archive (fogshift.runtime.jvm_archive); a JVM that cannot use it
    # ignores it silently, so what counts is that this one mapped it.
    from fogshift.runtime.jvm_archive import archive_path

    archive = archive_path()
    assert archive.is_file(), f"no class archive at {archive}: `make setup` makes it"
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert str(archive) in maps, f"the driver JVM ({pid}) did not map {archive}"


def test_the_driver_logs_by_fogshifts_configuration_from_its_start(spark: SparkSession) -> None:
    from fogshift.runtime.session import LOG_CONFIG

    jvm = spark._jvm  # type: ignore[attr-defined]
    context = jvm.org.apache.logging.log4j.core.LoggerContext.getContext(False)
    source = context.getConfiguration().getConfigurationSource().getLocation()
    assert source == str(LOG_CONFIG), source  # (Spark's defaults are in one of its jars)


def test_the_local_file_system_is_fogshifts_and_sets_modes(
    spark: SparkSession, tmp_path: Path
) -> None:
    # fogshift's (fogshift.runtime.jvm_classes) sets them through java.nio; Hadoop's own
    # starts a `chmod` process per file (scripts/set_permission_cost.py measures both).
    from fogshift.runtime.jvm_classes import LOCAL_FILE_SYSTEM

    jvm = spark._jvm  # type: ignore[attr-defined]
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    assert fs.getClass().getName() == LOCAL_FILE_SYSTEM
    target = tmp_path / "written"
    path = jvm.org.apache.hadoop.fs.Path(str(target))
    fs.create(path, True).close()
    assert (tmp_path / ".written.crc").is_file()  # still Hadoop's checksummed file system
    for mode in (0o640, 0o755, 0o600):
        fs.setPermission(path, jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
        assert target.stat().st_mode & 0o777 == mode


def test_the_checksums_spark_writes_beside_a_file_are_read_as_fogshift_reads_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    # A node-level snapshot checks each new file against them (a file torn before its first
    # snapshot is not frozen): the format read is the one Spark's file system writes.
    from fogshift.checkpoint.spark_dir import checksum_problem

    jvm = spark._jvm  # type: ignore[attr-defined]
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())  # type: ignore[attr-defined]
    target = tmp_path / "3.changelog"
    data = bytes(range(256)) * 5  # (three runs of Hadoop's 512 bytes, the last one short)
    out = fs.create(jvm.org.apache.hadoop.fs.Path(str(target)), True)
    out.write(bytearray(data))
    out.close()
    assert target.read_bytes() == data and (tmp_path / ".3.changelog.crc").is_file()
    assert checksum_problem(target) is None
    changed = bytearray(data)
    changed[700] ^= 1
    target.write_bytes(bytes(changed))
    assert checksum_problem(target) == "3.changelog's bytes 512 to 1023 do not match their checksum"
    target.write_bytes(b"")
    assert (
        checksum_problem(target)
        == "3.changelog has 0 bytes, its checksums are of 1025 to 1536 bytes"
    )


def test_the_warm_up_runs_a_stateful_batch_on_rocksdb_and_is_no_pe(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a node runs before its first PE (fogshift.runtime.warm_up): a batch through the
    # CSV source, transformWithStateInPandas and a Python sink, committed with its state in
    # RocksDB (whose native library the JVM has loaded then).
    from fogshift.runtime.warm_up import JVM_CHECKPOINT, QUERY_NAME, read_back, warm_up

    folder = tmp_path / "warm-up"
    assert warm_up(spark, folder) > 0
    # The JVM operator's query ran beside it (make setup compiled fogshift's JVM classes),
    # and its window (read back as `fogshift state` reads one) is the input's latest values:
    # read_back raises otherwise.
    assert (folder / JVM_CHECKPOINT / "commits" / "0").is_file()
    # Its state reads back as a keyed PE's does (the node's first key listing and twin
    # read): each value of its input, counted here from the file it read.
    lines = (folder / "in.csv").read_text().splitlines()
    column = lines[0].split(",").index("value")
    assert read_back(spark, folder) == Counter(line.split(",")[column] for line in lines[1:])
    checkpoint = folder / "checkpoint"
    assert (checkpoint / "commits" / "0").is_file()
    assert list((checkpoint / "state" / "0").rglob("*.changelog")), "no state was committed"
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    libraries = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                 if "rocksdbjni" in line}  # fmt: skip
    # Extracted into a session's own folder, not /tmp (fogshift.runtime.session._jvm_temp_dir):
    # the JVM loads it once, from the folder of the first session of this process that used
    # RocksDB (on a pytest worker, another module's session may have been first).
    assert libraries and all(Path(p).parent.name == "jvm-tmp" for p in libraries), libraries
    # Not running afterwards, and its name is no PE's (a PE's is PIPELINE.ELEMENT).
    assert not [q.name for q in spark.streams.active if q.name.startswith(QUERY_NAME)]
    assert "." not in QUERY_NAME
    # Again in the same folder (an agent started again in the same home): from scratch.
    assert warm_up(spark, folder) > 0
    # A JVM query that cannot start leaves the Python warm-up standing (and its state read).
    from fogshift.runtime import warm_up as module

    def fails(*_: object) -> None:
        raise RuntimeError("no JVM operator here")

    monkeypatch.setattr(module, "_start_jvm", fails)
    assert warm_up(spark, folder) > 0
    assert not (folder / JVM_CHECKPOINT).exists()
    assert (checkpoint / "commits" / "0").is_file()


def append_events(
    js: SyncJetStream, pipeline: str, first: int, bodies: list[dict[str, Any]]
) -> None:
    """Append events with ``bodies`` to ``pipeline``'s stream ``src``, the first as its
    sequence ``first`` (the source's own numbering, as a source PE would publish them)."""
    records = [
        Record(first + n, 0, first + n, 1000.0 + first + n, "src", json.dumps(body))
        for n, body in enumerate(bodies)
    ]
    js.run(lambda j: publish_records(j, pipeline, "src", records))


class Run:
    """One processor PE fed by a stream ``src`` that the test appends to."""

    def __init__(
        self,
        spark: SparkSession,
        js: SyncJetStream,
        broker: BrokerProcess,
        home: Path,
        cls: str,
        key_by: str | None = None,
        partition: Partition | None = None,
    ) -> None:
        self.spark, self.js, self.home = spark, js, home
        self.pipeline = f"life{next(_pipelines)}"
        self.log = home / "hooks.log"
        self.log.touch()
        broker_file = home / "broker.json"
        broker.address.save(broker_file)
        for pe in ("src", "pe"):
            js.run(lambda j, pe=pe: ensure_pe_stream(j, self.pipeline, pe))
        element = ElementSpec(
            id="pe",
            kind="custom",
            node="n",
            inputs=("src",),
            options={"class": f"lifecycle_procs:{cls}", "path": str(HERE),
                     "options": {"log": str(self.log)}},
            key_by=key_by,
            partition=partition,
        )  # fmt: skip
        self.gate = str(home / "gates" / "pe.json")
        self.plan = QueryPlan(
            self.pipeline,
            element,
            str(broker_file),
            str(home / "checkpoint"),
            gate_file=self.gate,
            trigger_ms=100,
        )
        self.sent = 0
        self.query: StreamingQuery | None = None

    def start(self) -> None:
        self.query = start_query(self.spark, self.plan)

    def stop(self) -> None:
        """Stop the query as the node agent does: its run ends with it."""
        if self.query is not None:
            self.query.stop()
            self.query = None
        end_run(self.gate)

    def send(self, bodies: list[dict[str, Any]], answered: bool = True) -> None:
        """Append ``bodies`` to the input and wait until the PE has answered every one (with
        ``answered=False``, until they are in a committed batch: a partition answers some)."""
        append_events(self.js, self.pipeline, self.sent + 1, bodies)
        self.sent += len(bodies)
        if not answered:
            self.wait_committed()
            return
        stream = stream_name(self.pipeline, "pe")
        wait_until(
            lambda: self.js.run(lambda j: last_seq(j, stream)) >= self.sent,
            120,
            describe=f"{self.pipeline}/pe answered {self.sent} events",
        )

    def outputs(self, subject: str = "data") -> list[dict[str, Any]]:
        stream = stream_name(self.pipeline, "pe")
        name = (data_subject if subject == "data" else dead_subject)(self.pipeline, "pe")
        end = self.js.run(lambda j: last_seq(j, stream))
        messages = self.js.run(lambda j: fetch_range(j, stream, name, 0, end))
        return [json.loads(m.data) for m in messages]

    def lines(self, what: str, workers_only: bool = True) -> list[str]:
        """The log lines ``what`` (build, assign, ...), of the Python workers by default."""
        entries = [line.split() for line in self.log.read_text().splitlines()]
        driver = str(os.getpid())
        return [
            pid for kind, pid in entries if kind == what and not (workers_only and pid == driver)
        ]

    def hooks(self) -> list[str]:
        return [line.split()[0] for line in self.log.read_text().splitlines()]

    def wait_batches(self, count: int) -> None:
        """Wait until ``count`` batches with input have reported progress (a batch's
        progress is posted after its commit, i.e. after its outputs are in the stream)."""
        query = self.query
        assert query is not None
        wait_until(
            lambda: len([p for p in query.recentProgress if p["numInputRows"] > 0]) >= count,
            30,
            describe=f"{count} batches of {self.pipeline}/pe",
        )

    def wait_committed(self) -> None:
        """Wait until every event sent is in a committed batch (its outputs reach the stream
        before the batch commits, so :meth:`send` returning does not mean its state is in)."""
        query = self.query
        assert query is not None

        def committed() -> int:
            progress = query.lastProgress
            if not progress:
                return 0
            end = progress["sources"][0]["endOffset"]
            end = json.loads(end) if isinstance(end, str) else end
            return int(end["positions"]["src"]) if end else 0

        wait_until(
            lambda: committed() >= self.sent,
            30,
            describe=f"{self.sent} events of {self.pipeline}/pe committed",
        )


@pytest.fixture()
def make_run(
    spark: SparkSession,
    js_client: SyncJetStream,
    nats_server: BrokerProcess,
    tmp_path: Path,
) -> Iterator[Any]:
    runs: list[Run] = []

    def make(cls: str, key_by: str | None = None, partition: Partition | None = None) -> Run:
        home = tmp_path / f"run{len(runs)}"
        home.mkdir()
        run = Run(spark, js_client, nats_server, home, cls, key_by, partition)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop()


def expected_stats(values: list[float]) -> list[dict[str, float]]:
    return [{"count": n, "total": float(sum(values[:n]))} for n in range(1, len(values) + 1)]


def test_a_stateful_processor_is_built_once_over_many_batches(make_run: Any) -> None:
    run = make_run("CountingStats")
    run.start()
    values: list[float] = []
    for round_ in range(5):
        batch = [float(10 * round_ + k) for k in range(4)]
        run.send([{"value": v} for v in batch])
        values += batch
    run.wait_batches(5)
    assert [json.loads(o["body"]) for o in run.outputs()] == expected_stats(values)
    # An unkeyed PE's state is one entry, without a key.
    _, states = read_state(run.spark, Path(run.plan.checkpoint_dir), ["count", "total"], False)
    assert states == {None: expected_stats(values)[-1]}
    # One instance in the workers for five batches (and one probe in the driver, closed).
    assert len(run.lines("build")) == 1
    assert run.lines("assign") == run.lines("build")
    assert run.lines("close") == []
    assert len(run.lines("build", workers_only=False)) == 2


def test_a_keyed_processor_keeps_a_state_per_key_in_one_instance(make_run: Any) -> None:
    run = make_run("CountingStats", key_by="patient")
    run.start()
    rnd = random.Random(7)
    sent: list[dict[str, Any]] = []
    for _ in range(4):
        bodies: list[dict[str, Any]] = []
        for _ in range(60):
            body: dict[str, Any] = {"patient": f"p{rnd.randrange(50):02d}",
                                    "value": float(rnd.randint(0, 100))}  # fmt: skip
            roll = rnd.random()
            if roll < 0.05:
                del body["patient"]  # no key: a dead letter that touches no key's state
            elif roll < 0.12:
                body["bad"] = True  # fails after changing its key's state: undone
            bodies.append(body)
        run.send(bodies)
        sent += bodies
    # The reference: a count and total per patient, in input order, bad events skipped.
    totals: dict[str, tuple[int, float]] = {}
    expected, dead = [], []
    for body in sent:
        if "patient" not in body or body.get("bad"):
            dead.append(body)
            continue
        count, total = totals.get(body["patient"], (0, 0.0))
        totals[body["patient"]] = (count + 1, total + body["value"])
        expected.append({"count": count + 1, "total": total + body["value"]})
    assert len(totals) >= 45
    assert [json.loads(o["body"]) for o in run.outputs()] == expected
    letters = run.outputs("dead")
    assert [json.loads(d["body"]) for d in letters] == dead
    assert any("'patient' (key_by of 'pe') is missing" in d["reason"] for d in letters), letters
    # The twins as stored: each key's state read back from the live state store.
    run.wait_committed()
    batch, states = read_state(run.spark, Path(run.plan.checkpoint_dir), ["count", "total"], True)
    assert batch is not None and batch >= 1  # the last committed batch, not a first one
    assert states == {k: {"count": c, "total": t} for k, (c, t) in sorted(totals.items())}
    one = next(iter(totals))
    assert read_state(run.spark, Path(run.plan.checkpoint_dir), ["count", "total"], True, one)[
        1
    ] == {one: states[one]}
    # A page's keys only (the others never collected): a key no longer held is left out.
    page = sorted(totals)[3:6]
    assert read_state(run.spark, Path(run.plan.checkpoint_dir), ["count", "total"], True,
                      only=[*page, "gone"])[1] == {k: states[k] for k in page}  # fmt: skip
    # The keys as listed for a key group's move or a rescale: each with the length of its
    # stored texts, which sizes the move's waves.
    listed, _, sizes = read_keys(run.spark, Path(run.plan.checkpoint_dir), ["count", "total"],
                                 False)  # fmt: skip
    assert listed == batch
    assert sizes == {
        k: sum(len(json.dumps(v, separators=(",", ":"))) for v in fields.values())
        for k, fields in states.items()
    }
    # The key index the query's batches noted says the same, with no Spark job.
    assert set(index_agrees(run.spark, Path(run.plan.checkpoint_dir), ["count", "total"],
                            False)) == set(totals)  # fmt: skip
    # One instance for every key and batch, undone events included (restored, not rebuilt).
    assert len(run.lines("build")) == 1
    assert run.lines("assign") == run.lines("build")
    assert run.lines("close") == []


def test_a_field_added_to_a_keyed_processor_since_its_checkpoint_starts_as_declared(
    make_run: Any,
) -> None:
    # An upgrade adding a state field (bandpass's rate and next window): every key's stored
    # state lacked it, and a restart on the checkpoint refused them all. Declared `added`,
    # an old key takes its initial value, and the twins read as the class has them.
    from dataclasses import replace

    run = make_run("CountingStats", key_by="patient")
    run.start()
    run.send([{"patient": "a", "value": 1.0}, {"patient": "b", "value": 2.0}])
    run.wait_committed()
    run.stop()
    fields = ["count", "total", "last"]
    # Read by the later class before it ran a batch (its twins shown, its keys listed for a
    # move): the checkpoint's state has no `last` at all yet.
    _, before = read_state(run.spark, Path(run.plan.checkpoint_dir), fields, True,
                           added={"last"})  # fmt: skip
    assert before == {"a": {"count": 1, "total": 1.0}, "b": {"count": 1, "total": 2.0}}
    _, _, sizes = read_keys(run.spark, Path(run.plan.checkpoint_dir), fields, False, {"last"})
    assert set(sizes) == {"a", "b"}
    # A field not declared added that the checkpoint lacks (renamed, another class's
    # checkpoint) fails the read, as ever: not a twin shown without it.
    with pytest.raises(Exception, match="is not defined"):
        read_state(run.spark, Path(run.plan.checkpoint_dir), ["count", "other"], True)
    element = run.plan.element
    later = {**element.options, "class": "lifecycle_procs:CountingLater"}
    run.plan = replace(run.plan, element=element.model_copy(update={"options": later}))
    run.start()
    run.send([{"patient": "a", "value": 3.0}, {"patient": "c", "value": 5.0},
              {"patient": "a", "value": 4.0}])  # fmt: skip
    assert [json.loads(o["body"]) for o in run.outputs()][2:] == [
        {"count": 2, "total": 4.0, "before": None},  # a: stored before, `last` as declared
        {"count": 1, "total": 5.0, "before": None},
        {"count": 3, "total": 8.0, "before": 3.0},
    ]
    assert run.outputs("dead") == []
    run.wait_committed()
    _, states = read_state(run.spark, Path(run.plan.checkpoint_dir), fields, True)
    assert states["a"] == {"count": 3, "total": 8.0, "last": 4.0}
    assert states["c"] == {"count": 1, "total": 5.0, "last": 5.0}
    assert states["b"]["count"] == 1 and states["b"].get("last") is None  # (never since)
    listed, _, sizes = read_keys(run.spark, Path(run.plan.checkpoint_dir), fields, False)
    assert listed is not None and set(sizes) == {"a", "b", "c"}


def test_a_key_without_one_text_is_a_dead_letter_and_keeps_no_state(make_run: Any) -> None:
    # Spark groups by get_json_object's text, a partition's reader routes by Python's
    # (broker.keys.key_text): a key the two write otherwise must never be processed.
    run = make_run("CountingStats", key_by="patient")
    run.start()
    texts = [
        '{"patient": "p1", "value": 1.0}',
        '{"patient": 7, "value": 2.0}',
        '{"patient": 1e7, "value": 3.0}',  # Spark: 1.0E7; Python: 10000000.0
        '{"patient": true, "value": 4.0}',
        '{"patient": 2.5, "value": 5.0}',
        '{"patient": {"b": 1, "a": 2}, "value": 6.0}',
        '{"patient": "x", "patient": "p1", "value": 7.0}',  # Spark: x; Python: p1
        '{"patient": "7", "value": 8.0}',  # the same key as 7, for both
        '{"patient": "p\\ud800", "value": 9.0}',  # Spark reads no key, Python no UTF-8
        '{"patient": "p1", "value": 10.0}',
    ]
    records = [Record(n + 1, 0, n + 1, 1000.0 + n, "src", text) for n, text in enumerate(texts)]
    run.js.run(lambda j: publish_records(j, run.pipeline, "src", records))
    run.sent = len(texts)
    stream = stream_name(run.pipeline, "pe")
    wait_until(
        lambda: run.js.run(lambda j: last_seq(j, stream)) >= len(texts),
        120,
        describe=f"{run.pipeline}/pe answered {len(texts)} events",
    )
    assert [json.loads(o["body"]) for o in run.outputs()] == [
        {"count": 1, "total": 1.0},
        {"count": 1, "total": 2.0},
        {"count": 1, "total": 4.0},
        {"count": 2, "total": 10.0},
        {"count": 2, "total": 11.0},
    ]
    letters = {json.loads(d["body"])["value"]: d["reason"] for d in run.outputs("dead")}
    assert sorted(letters) == [3.0, 5.0, 6.0, 7.0, 9.0], letters
    assert "is a float" in letters[3.0] and "is a float" in letters[5.0]
    assert "is an object" in letters[6.0]
    assert "reads as 'p1' here and as 'x' to Spark" in letters[7.0]
    assert "a lone surrogate" in letters[9.0]
    # No state was made for the refused keys.
    run.wait_committed()
    _, states = read_state(run.spark, Path(run.plan.checkpoint_dir), ["count", "total"], True)
    assert states == {
        "p1": {"count": 2, "total": 11.0},
        "7": {"count": 2, "total": 10.0},
        "true": {"count": 1, "total": 4.0},
    }


def test_a_partition_processes_only_the_keys_it_owns(make_run: Any) -> None:
    # Partition 1 of 3: Spark's filter (pmod of crc32 in the JVM) must pick the keys the
    # orchestrator routes to it (spec.partition_of_key, zlib's CRC-32).
    run = make_run(
        "CountingStats", key_by="patient", partition=Partition(of="pe", index=1, count=3)
    )
    run.start()
    rnd = random.Random(11)
    sent: list[dict[str, Any]] = []
    for _ in range(2):
        bodies: list[dict[str, Any]] = []
        for _ in range(90):
            body: dict[str, Any] = {"patient": f"p{rnd.randrange(30)}", "value": 1.0}
            roll = rnd.random()
            if roll < 0.05:
                del body["patient"]  # keyless: partition 0's dead letter, not this one's
            elif roll < 0.1:
                body["bad"] = True
            bodies.append(body)
        run.send(bodies, answered=False)
        sent += bodies
    mine = [b for b in sent if "patient" in b and partition_of_key(b["patient"], 3) == 1]
    counts: dict[str, int] = {}
    expected = []
    for body in mine:
        if not body.get("bad"):
            counts[body["patient"]] = counts.get(body["patient"], 0) + 1
            expected.append({"count": counts[body["patient"]], "total": counts[body["patient"]]})
    assert 0 < len(mine) < len([b for b in sent if "patient" in b])
    assert [json.loads(o["body"]) for o in run.outputs()] == expected
    assert [json.loads(d["body"]) for d in run.outputs("dead")] == [b for b in mine if b.get("bad")]


def test_the_querys_python_processes_are_forked_from_the_nodes_zygote(
    spark: SparkSession, make_run: Any
) -> None:
    import psutil

    from fogshift.runtime.zygote import SOURCE_RUNNER, socket_path

    def command(process: psutil.Process) -> list[str]:
        try:
            return process.cmdline()
        except psutil.Error:  # exited meanwhile, or a zombie not reaped yet
            return []

    # This session's zygote (a session an earlier module of this worker made has its own).
    socket = str(socket_path(Path(spark.conf.get("spark.local.dir"))))
    (server,) = [p for p in psutil.Process().children()
                 if "fogshift.runtime.zygote" in command(p) and socket in command(p)]  # fmt: skip
    run = make_run("CountingStats")
    run.start()
    run.send([{"value": 1.0}, {"value": 2.0}])
    # The source's runner: Spark started the wrapper, which handed it to the zygote.
    jvm = psutil.Process(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    started = [" ".join(command(p)) for p in jvm.children()]
    assert any("zygote_client.py" in c and SOURCE_RUNNER in c for c in started), started
    # The processor's worker: forked by a daemon the zygote forked.
    (worker,) = run.lines("build")
    assert server.pid in [p.pid for p in psutil.Process(int(worker)).parents()]
    assert [json.loads(o["body"]) for o in run.outputs()] == expected_stats([1.0, 2.0])


def test_a_stateless_processor_is_built_once_over_many_batches(make_run: Any) -> None:
    run = make_run("Doubling")
    run.start()
    for round_ in range(5):
        run.send([{"value": round_ + k} for k in range(3)])
    run.wait_batches(5)
    assert [json.loads(o["body"])["value"] for o in run.outputs()] == [
        2 * (round_ + k) for round_ in range(5) for k in range(3)
    ]
    assert len(run.lines("build")) == 1
    assert run.lines("assign") == run.lines("build")


@pytest.mark.parametrize("key_by", [None, "patient"])
def test_hooks_follow_the_gate_and_the_end_of_the_run(make_run: Any, key_by: str | None) -> None:
    # A keyed PE's one instance goes back to the worker's registry once the batch's keys
    # are done (Spark's close() of the partition), not after each key, where its hooks ran
    # between two keys of a batch: it must get there all the same for its hooks.
    run = make_run("CountingStats", key_by=key_by)
    run.start()
    key = {"patient": "p01"} if key_by else {}
    run.send([{"value": 1.0, **key}, {"value": 2.0, **key}])
    write_gate(run.gate, "hold")
    wait_until(lambda: run.lines("pause"), 30, describe="on_pause in the worker")
    open_gate(run.gate)
    wait_until(lambda: run.lines("resume"), 30, describe="on_resume in the worker")
    run.send([{"value": 3.0, **key}])
    run.stop()
    wait_until(lambda: run.lines("close"), 30, describe="close in the worker")
    worker = run.lines("build")
    assert len(worker) == 1
    # Every hook ran in the one worker that holds the instance, in the contract's order.
    for hook in ("assign", "pause", "resume", "revoke", "close"):
        assert run.lines(hook) == worker, hook
    in_worker = [h for h, pid in (line.split() for line in run.log.read_text().splitlines())
                 if pid == worker[0]]  # fmt: skip
    assert in_worker == ["build", "assign", "pause", "resume", "revoke", "close"]
    assert [json.loads(o["body"]) for o in run.outputs()] == expected_stats([1.0, 2.0, 3.0])


@contextmanager
def spark_log(spark: SparkSession, path: Path) -> Iterator[None]:
    """Spark's log lines (all loggers, the session's levels and filters) also into ``path``."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    core = jvm.org.apache.logging.log4j.core
    context = core.LoggerContext.getContext(False)
    config = context.getConfiguration()
    layout = core.layout.PatternLayout.newBuilder().withPattern("%p %c{1}: %m%n%ex").build()
    appender = (
        core.appender.FileAppender.newBuilder()
        .withFileName(str(path))
        .setName("fogshift-test-capture")
        .setLayout(layout)
        .setConfiguration(config)
        .build()
    )
    appender.start()
    config.addAppender(appender)
    config.getRootLogger().addAppender(appender, None, None)
    context.updateLoggers()
    try:
        yield
    finally:
        config.getRootLogger().removeAppender("fogshift-test-capture")
        context.updateLoggers()
        appender.stop()


def test_a_query_stopped_mid_batch_leaves_no_error_in_the_nodes_log(
    make_run: Any, spark: SparkSession, tmp_path: Path
) -> None:
    """A stop, a pause or a migration's origin stops a query in the middle of a batch: Spark
    aborts its write (the batch runs again from the checkpoint). Its ERROR lines and the
    killed task's trace read as failures in the node's log: the session keeps them out,
    and Spark's other errors in."""
    run = make_run("Holding")
    run.start()
    run.send([{"value": 1.0}])
    captured = tmp_path / "spark.log"
    with spark_log(spark, captured):
        append_events(run.js, run.pipeline, run.sent + 1, [{"value": 2.0, "hold": True}])
        wait_until(lambda: run.lines("held"), 60, describe="the batch held in the worker")
        run.stop()
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.util.Utils").error(
            "another error of Spark's"
        )
    Path(f"{run.log}.release").touch()
    text = captured.read_text()
    assert "ERROR Utils: another error of Spark's" in text, text
    for noise in ("TaskKilledException", "Aborting task", "is aborting", "Aborting commit"):
        assert noise not in text, text
    # The held event's batch was not committed: its output was never emitted.
    assert [json.loads(o["body"]) for o in run.outputs()] == [{"value": 2.0}]


def test_rolled_back_events_and_a_retried_batch_give_the_reference_output(
    make_run: Any,
) -> None:
    run = make_run("CountingStats")
    run.start()
    run.send([{"value": 1.0}, {"value": 2.0, "bad": True}, {"value": 3.0}])
    run.send([{"value": 4.0}])
    # The task dies with the third event of this batch (its worker exits) and
    # Spark tries it again: the state is the stored one, as if the first try never ran.
    run.send([{"value": 5.0}, {"value": 6.0}, {"value": 7.0, "crash": True}])
    run.send([{"value": 8.0, "bad": True}, {"value": 9.0}])
    good = [1.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0]
    assert [json.loads(o["body"]) for o in run.outputs()] == expected_stats(good)
    assert [json.loads(d["body"])["value"] for d in run.outputs("dead")] == [2.0, 8.0]
    assert Path(f"{run.log}.crashed").exists()
    # Each undone event built one instance; the crashed task's worker built one more.
    builds, closes = run.lines("build"), run.lines("close")
    assert len(builds) >= 4
    assert run.lines("assign") == builds
    # All but the one kept now and the crashed worker's, which died without its hooks.
    assert len(closes) == len(builds) - 2


def test_a_restart_from_an_older_checkpoint_rebuilds_from_its_state(make_run: Any) -> None:
    run = make_run("CountingStats")
    run.start()
    run.send([{"value": 1.0}, {"value": 2.0}])
    run.stop()
    older = run.home / "older"
    shutil.copytree(run.plan.checkpoint_dir, older)
    run.start()
    run.send([{"value": 3.0}])
    run.stop()
    shutil.rmtree(run.plan.checkpoint_dir)
    shutil.copytree(older, run.plan.checkpoint_dir)
    run.start()  # re-executes nothing new: the output of value 3 is already stored
    run.send([{"value": 4.0}])
    # Had the instance of the second run (count 3) been reused, the last count would be 5.
    assert [json.loads(o["body"]) for o in run.outputs()][-1] == {"count": 4, "total": 10.0}


def test_the_progress_feed_gets_every_batch_report_once_without_polling(
    spark: SparkSession, make_run: Any
) -> None:
    from fogshift.runtime.progress import ProgressFeed

    feed = ProgressFeed()
    feed.attach(spark)
    run = make_run("Doubling")
    run.start()
    for round_ in range(3):
        run.send([{"value": float(round_ * 10 + k)} for k in range(3)])
    assert run.query is not None
    name, run_id = run.plan.query_name, str(run.query.runId)
    reports: list[dict[str, Any]] = []

    def counted() -> int:
        reports.extend(feed.drain().get(name, []))
        return sum(r["numInputRows"] for r in reports)

    wait_until(lambda: counted() >= 9, 30, describe=f"reports of 9 input rows of {name}")
    assert counted() == 9  # each batch reported once: nothing counted twice
    ran = [r["batchId"] for r in reports if r["numInputRows"] > 0]
    assert ran == sorted(set(ran)), ran  # in order, each batch once
    assert {r["runId"] for r in reports} == {run_id}


def index_agrees(
    spark: SparkSession, checkpoint: Path, parts: list[str], movable: bool
) -> dict[str, dict[str, int]]:
    """The keys and their variables' lengths as the PE's key index gives them for its
    newest commit, checked against the state store's as Spark's state reader reads them
    at the same batch (checkpoint.key_index); those keys."""
    from fogshift.checkpoint import key_index

    for _ in range(50):
        before = committed_batch(checkpoint)
        noted = key_index.read(key_index.folder_of(checkpoint), before)
        batch, _, variables = read_key_variables(spark, checkpoint, parts, movable)
        if batch == before:  # (else a batch committed between the two reads: again)
            assert noted == variables, f"index {noted} != state store {variables}"
            return variables
    raise AssertionError(f"{checkpoint} kept committing while its keys were compared")


class Partitions:
    """Two partitions (``pe-p0``, ``pe-p1``) of a keyed ``lifecycle_procs`` processor
    reading one input ``src`` that the test appends events and key moves to."""

    def __init__(
        self, spark: SparkSession, js: SyncJetStream, broker: BrokerProcess, home: Path,
        cls: str, options: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.js, self.home = js, home
        self.pipeline = f"life{next(_pipelines)}"
        broker_file = home / "broker.json"
        broker.address.save(broker_file)
        log = home / "hooks.log"
        log.touch()
        for pe in ("src", "pe-p0", "pe-p1"):
            js.run(lambda j, pe=pe: ensure_pe_stream(j, self.pipeline, pe))
        self.plans = []
        self.queries: list[StreamingQuery] = []
        for index in (0, 1):
            element = ElementSpec(
                id=f"pe-p{index}", kind="custom", node="n", inputs=("src",),
                options={"class": f"lifecycle_procs:{cls}", "path": str(HERE),
                         "options": {"log": str(log), **(options or {})}},
                key_by="patient", partition=Partition(of="pe", index=index, count=2),
            )  # fmt: skip
            plan = QueryPlan(self.pipeline, element, str(broker_file), str(home / f"cp{index}"),
                             gate_file=str(home / f"gate{index}.json"), trigger_ms=100)  # fmt: skip
            self.plans.append(plan)
            self.queries.append(start_query(spark, plan))
        self.random = random.Random(5)
        self.sent: list[dict[str, Any]] = []
        self.key_at: dict[int, str] = {}  # input position -> key

    def send(self, count: int, keys: int = 12) -> None:
        """Append ``count`` events of keys ``p0`` .. ``p<keys-1>`` drawn at random."""
        self.publish([{"patient": f"p{self.random.randrange(keys)}", "value": 1.0}
                      for _ in range(count)])  # fmt: skip

    def publish(self, bodies: list[dict[str, Any]]) -> None:
        """Append events with these bodies."""
        first = self.js.run(lambda j: last_seq(j, stream_name(self.pipeline, "src"))) + 1
        append_events(self.js, self.pipeline, first, bodies)
        self.sent.extend(bodies)
        self.key_at.update((first + n, b["patient"]) for n, b in enumerate(bodies))

    def append(self, payload: bytes) -> int:
        """Append a key move (or copy) to the input's ``.keys`` subject; its sequence."""

        async def publish(j: Any) -> int:
            ack = await j.publish(keys_subject(self.pipeline, "src"), payload,
                                  stream=stream_name(self.pipeline, "src"))  # fmt: skip
            return int(ack.seq)

        return self.js.run(publish)

    def outputs(self, pe: str) -> list[dict[str, Any]]:
        stream = stream_name(self.pipeline, pe)
        end = self.js.run(lambda j: last_seq(j, stream))
        got = self.js.run(lambda j: fetch_range(j, stream, data_subject(self.pipeline, pe), 0, end))
        return [json.loads(json.loads(m.data)["body"]) | {"seq": json.loads(m.data)["seq"]}
                for m in got]  # fmt: skip

    def per_key(self) -> dict[str, list[int]]:
        """Each key's counts as output, by either partition."""
        found: dict[str, list[int]] = {}
        for pe in ("pe-p0", "pe-p1"):
            for out in self.outputs(pe):
                found.setdefault(self.key_at[out["seq"]], []).append(out["count"])
        return found

    def expected(self) -> dict[str, list[int]]:
        """The reference: each key's counts as one instance would give them."""
        counts: dict[str, list[int]] = {}
        for body in self.sent:
            counts.setdefault(body["patient"], []).append(len(counts.get(body["patient"], [])) + 1)
        return counts

    def answered(self) -> None:
        """Wait until every event sent has been answered by its partition."""
        wait_until(lambda: sum(map(len, self.per_key().values())) >= len(self.sent), 60,
                   describe="every event answered by its partition")  # fmt: skip

    def key_records(self) -> list[dict[str, Any]]:
        """The input's ``.keys`` and ``.keys.<origin>`` subjects, in stream order: moves,
        copies and states (a large state's parts are on ``.state.<to>``, see
        :meth:`part_seqs`)."""
        stream = stream_name(self.pipeline, "src")
        end = self.js.run(lambda j: last_seq(j, stream))
        found = self.js.run(
            lambda j: get_ranges(j, stream, key_subjects(self.pipeline, "src"), 0, end)
        )
        return [json.loads(m.data) for m in found]

    def publish_on(self, subject: str, payload: bytes, msg_id: str | None = None) -> None:
        """Append ``payload`` to ``subject`` of the input (as a partition's node would)."""
        stream = stream_name(self.pipeline, "src")
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        self.js.run(lambda j: j.publish(subject, payload, stream=stream, headers=headers))

    def part_seqs(self, to: int | None) -> list[int]:
        """The sequences of the input's ``.state.pe.<to>`` subject: the parts of large
        states for partition ``to`` (``None``: ``.state``, which only older fogshifts wrote)."""
        stream = stream_name(self.pipeline, "src")
        end = self.js.run(lambda j: last_seq(j, stream))
        on = None if to is None else "pe"
        found = self.js.run(
            lambda j: get_range(j, stream, state_subject(self.pipeline, "src", to, on), 0, end)
        )
        return [m.seq for m in found]

    def committed(self, index: int) -> None:
        """Wait until partition ``index`` has committed every position of the input."""
        query = self.queries[index]
        end = self.js.run(lambda j: last_seq(j, stream_name(self.pipeline, "src")))

        def position() -> int:
            progress = query.lastProgress
            offset = progress["sources"][0]["endOffset"] if progress else None
            offset = json.loads(offset) if isinstance(offset, str) else offset
            return int(offset["positions"]["src"]) if offset else 0

        wait_until(lambda: position() >= end, 30, describe=f"pe-p{index} committed {end}")

    def stop(self) -> None:
        for query in self.queries:
            query.stop()


def test_keys_move_between_partitions_at_one_input_position(
    spark: SparkSession, js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # Two partitions of a keyed count read one input; a key move stored in the input's
    # `.keys` subject hands three keys from their owners to partition 1 mid-stream. Every
    # key's outputs must be what one instance would give, in input order, once each.
    from fogshift.broker.keys import KeyMove

    parts = Partitions(spark, js_client, nats_server, tmp_path, "CountingStats")
    try:
        parts.send(120)
        moving = [k for k in (f"p{i}" for i in range(12)) if partition_of_key(k, 2) == 0][:3]
        assert len(moving) == 3
        parts.append(KeyMove(0, "m1", "pe", tuple(moving), 1, "backlog").payload())
        parts.send(120)
        parts.answered()
        assert parts.per_key() == parts.expected()
        # The moved keys' later events went to partition 1 only, after their state came.
        kinds = [r["type"] for r in parts.key_records()]
        assert kinds[0] == "key-move" and sorted(kinds[1:]) == ["key-state"] * 3, kinds
        after = {out["seq"] for out in parts.outputs("pe-p0")}
        move_at = min(n for n in range(1, 300) if n not in parts.key_at)
        moved_seqs = [n for n, k in parts.key_at.items() if k in moving and n > move_at]
        assert moved_seqs and not after & set(moved_seqs)
        # Each partition's key index follows the move: the moved keys left partition 0's
        # store and are in partition 1's, as Spark's state reader reads them.
        for index in (0, 1):
            parts.committed(index)
        listed = [index_agrees(spark, Path(plan.checkpoint_dir), ["count", "total"], True)
                  for plan in parts.plans]  # fmt: skip
        assert not set(moving) & set(listed[0]) and set(moving) <= set(listed[1])
        assert set(listed[0]) | set(listed[1]) == set(parts.expected())
    finally:
        parts.stop()


def test_partitions_whose_keys_move_dead_letter_keys_without_one_text(
    spark: SparkSession, js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # Their reader routes by Python's key text: a lone surrogate (no UTF-8 bytes to route
    # by) stopped both partitions at every retry; a float went by one text, was kept by
    # another. Such events are partition 0's dead letters, and everything else goes on.
    parts = Partitions(spark, js_client, nats_server, tmp_path, "CountingStats")
    try:
        parts.send(20)
        odd = [{"patient": "p\ud800", "value": 1.0}, {"patient": 1e7, "value": 1.0},
               {"patient": 3.5, "value": 1.0}, {"patient": ["p1"], "value": 1.0}]  # fmt: skip
        parts.publish(odd)
        parts.send(20)
        wait_until(lambda: sum(map(len, parts.per_key().values())) >= 40, 60,
                   describe="every keyed event answered by its partition")  # fmt: skip
        parts.sent = [b for b in parts.sent if b not in odd]
        assert parts.per_key() == parts.expected()

        def dead(pe: str) -> list[Any]:
            stream = stream_name(parts.pipeline, pe)
            end = js_client.run(lambda j: last_seq(j, stream))
            got = js_client.run(
                lambda j: fetch_range(j, stream, dead_subject(parts.pipeline, pe), 0, end)
            )
            return [json.loads(json.loads(m.data)["body"])["patient"] for m in got]

        assert dead("pe-p1") == []
        assert dead("pe-p0") == [b["patient"] for b in odd]
    finally:
        parts.stop()


def test_a_key_state_is_taken_only_from_the_keys_owner_before_its_move(
    spark: SparkSession, js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # Partition 0 is held while keys move from it to partition 1. Meanwhile a state for a
    # moving key comes on partition 1's subject (not the key's owner), a move on a
    # partition's subject (not the orchestrator's), and a message taking the id the owner
    # will send another key's state under: a partition's node forging them. The target must
    # wait for the owner's states, and nobody take the forged move: every key's outputs are
    # what one instance would give.
    from fogshift.broker.keys import KeyMove, state_payload

    parts = Partitions(spark, js_client, nats_server, tmp_path, "CountingStats")
    gate = parts.plans[0].gate_file
    assert gate is not None
    try:
        held = write_gate(gate, "hold")
        wait_until(lambda: acknowledged(gate, held), 30, describe="partition 0 held")
        parts.send(60, keys=8)
        mine = [k for k in (f"p{i}" for i in range(8)) if partition_of_key(k, 2) == 0]
        assert len(mine) >= 3, mine
        moving, staying = mine[:-1], mine[-1]
        parts.append(KeyMove(0, "m1", "pe", tuple(moving), 1).payload())
        forged = state_payload("m1", "pe", moving[0], 1, {"count": "1000", "total": "1000.0"})
        parts.publish_on(key_state_subject(parts.pipeline, "src", "pe-p1"), forged)
        parts.publish_on(key_state_subject(parts.pipeline, "src", "pe-p0"),
                         KeyMove(0, "m2", "pe", (staying,), 1).payload())  # fmt: skip
        parts.publish_on(key_state_subject(parts.pipeline, "src", "pe-p1"), b"{}",
                         msg_id=f"pe:m1:{moving[1]}")  # fmt: skip
        parts.send(30, keys=8)
        parts.committed(1)  # partition 1 read the forgeries (and holds the moved keys)
        assert all(parts.key_at[o["seq"]] not in mine for o in parts.outputs("pe-p1"))
        # A state read says so: the moved keys wait there for move m1's state, each with
        # the events of it sent since the move held; they hold no state there yet.
        target = Path(parts.plans[1].checkpoint_dir)
        batch, states = read_state(spark, target, ["count", "total"], True)
        late = Counter(body["patient"] for body in parts.sent[-30:])
        assert read_waiting(spark, target, batch) == {k: ("m1", late[k]) for k in moving}
        assert read_waiting(spark, target, batch, moving[1]) == {moving[1]: ("m1", late[moving[1]])}
        assert not set(moving) & set(states)
        open_gate(gate)
        parts.send(30, keys=8)
        parts.answered()
        assert parts.per_key() == parts.expected()
        assert {parts.key_at[o["seq"]] for o in parts.outputs("pe-p0")} >= {staying}
        parts.committed(1)
        batch, states = read_state(spark, target, ["count", "total"], True)
        assert read_waiting(spark, target, batch) == {} and set(moving) <= set(states)
    finally:
        parts.stop()


def test_a_precopied_key_move_sends_only_what_changed_since_the_copy(
    spark: SparkSession, js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # Keys with a 600 kB ballast (two broker messages) are copied to partition 1 while
    # partition 0 goes on counting them; the move then names the copy. Its states must hold
    # only the counts, name the ballast as kept, and partition 1 must end with the same
    # state one instance would have: the ballast from the copy, the counts from the move,
    # and a ballast grown between copy and move sent again.
    from fogshift.broker.keys import KeyCopy, KeyMove

    ballast = 600_000
    parts = Partitions(spark, js_client, nats_server, tmp_path, "Ballasted",
                       {"ballast_bytes": ballast})  # fmt: skip
    try:
        parts.send(60, keys=6)
        moving = [k for k in (f"p{i}" for i in range(6)) if partition_of_key(k, 2) == 0]
        assert len(moving) >= 2, moving
        grown = moving[0]
        parts.append(KeyCopy(0, "c1", "pe", tuple(moving), 1).payload())
        parts.send(30, keys=6)

        def copies() -> list[dict[str, Any]]:
            return [r for r in parts.key_records() if r["type"] == "key-state" and r.get("copy")]

        wait_until(lambda: len(copies()) == len(moving), 60, describe="a copy of every key")
        # One key grows its ballast between its copy and its move: that part travels again.
        parts.publish([{"patient": grown, "value": 1.0, "grow": True}])
        parts.append(KeyMove(0, "m1", "pe", tuple(moving), 1, "backlog", copy="c1").payload())
        parts.send(60, keys=6)
        parts.answered()
        assert parts.per_key() == parts.expected()
        states = {r["key"]: r for r in parts.key_records()
                  if r["type"] == "key-state" and r["move"] == "m1"}  # fmt: skip
        assert set(states) == set(moving)
        for key, record in states.items():
            assert record["base"] == "c1", record
            if key == grown:  # the whole state again, too large for its record
                assert record["keep"] == [] and record["parts"], record
            else:
                assert record["keep"] == ["ballast"] and "parts" not in record, record
                assert set(record["state"]) == {"count", "total"}, record
        # The ballasts' parts went apart, where only their target reads them: the copies'
        # (each key's) and the grown key's at the move, and nothing else.
        named = {(r["move"], r["key"]): r["parts"] for r in parts.key_records()
                 if r["type"] == "key-state" and r.get("parts")}  # fmt: skip
        assert set(named) == {*(("c1", k) for k in moving), ("m1", grown)}, named
        assert sorted(p for seqs in named.values() for p in seqs) == parts.part_seqs(1)
        assert parts.part_seqs(0) == parts.part_seqs(None) == []
        # Partition 1 holds each moved key's whole state: as one instance would have it.
        counts = {k: len(v) for k, v in parts.expected().items()}
        parts.committed(1)
        _, held = read_state(spark, Path(parts.plans[1].checkpoint_dir),
                             ["count", "ballast"], True)  # fmt: skip
        for key in moving:
            want = "b" * ballast + ("g" if key == grown else "")
            assert held[key] == {"count": counts[key], "ballast": want}, key
        # The key index of the partition the keys moved to, ballasts and all.
        listed = index_agrees(spark, Path(parts.plans[1].checkpoint_dir),
                              ["count", "total", "ballast"], True)  # fmt: skip
        assert all(listed[key]["f_ballast"] >= ballast for key in moving), listed
    finally:
        parts.stop()


def test_an_older_copy_sent_again_does_not_replace_the_newer_one_its_move_names(
    spark: SparkSession, js_client: SyncJetStream, nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # Copy c1 of some keys, then c2 of the same keys (c1's move never came). Then c1's copy
    # comes again: its origin, restored from before c1 after the broker's duplicate window,
    # sends it anew. The move names c2; partition 1 must complete each state from c2 (it
    # stopped on InvariantViolation at every retry when c1 had replaced it).
    from fogshift.broker.keys import KeyCopy, KeyMove

    parts = Partitions(spark, js_client, nats_server, tmp_path, "CountingStats")
    try:
        parts.send(60, keys=6)
        moving = [k for k in (f"p{i}" for i in range(6)) if partition_of_key(k, 2) == 0]
        assert len(moving) >= 2, moving

        def copies(copy: str) -> list[dict[str, Any]]:
            return [r for r in parts.key_records()
                    if r["type"] == "key-state" and r["move"] == copy]  # fmt: skip

        parts.append(KeyCopy(0, "c1", "pe", tuple(moving), 1).payload())
        wait_until(lambda: len(copies("c1")) == len(moving), 60, describe="c1's copies")
        parts.send(30, keys=6)
        parts.append(KeyCopy(0, "c2", "pe", tuple(moving), 1).payload())
        wait_until(lambda: len(copies("c2")) == len(moving), 60, describe="c2's copies")
        again = copies("c1")
        for record in again:
            parts.publish_on(key_state_subject(parts.pipeline, "src", "pe-p0"),
                             json.dumps(record).encode())  # fmt: skip
        wait_until(lambda: len(copies("c1")) == 2 * len(moving), 30, describe="c1 again")
        # No event of a moving key since c2: its move keeps every part of c2's copy.
        parts.append(KeyMove(0, "m1", "pe", tuple(moving), 1, "backlog", copy="c2").payload())
        wait_until(lambda: len(copies("m1")) == len(moving), 60, describe="m1's states")
        assert all(r["base"] == "c2" and r["keep"] for r in copies("m1")), copies("m1")
        parts.send(60, keys=6)
        parts.answered()
        assert parts.per_key() == parts.expected()
    finally:
        parts.stop()
