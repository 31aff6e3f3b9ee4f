"""``fogshift bench dataplane``: one PE's data plane, fogshift beside plain PySpark, in one run.

For a stateless ``map`` PE and the ``window-aggregate`` PE, each measured the same way twice:

* **fogshift**: the PE's query as a node runs it (:func:`fogshift.runtime.engine.start_query`:
  exactly-once reader and writer, gate, dead letters, fencing);
* **plain**: the same job as a plain PySpark Structured Streaming query in the same session
  (same settings, same trigger), the floor: a minimal Python data source that reads the same
  JetStream stream (batched direct gets, no cut log, no gate), the operator as a plain user
  writes it (``map``: ``from_json`` → expression → ``to_json`` in the JVM, no Python;
  ``window-aggregate``: ``transformWithStateInPandas`` keeping the window in a
  ``ValueState``), and a writer that publishes asynchronously, without exactly-once.

Measured, each run on fresh streams and a fresh checkpoint:

* **per-hop latency** at a steady input: an event's store time in the output stream minus
  its store time in the input stream (the broker's clock for both), p50/p99;
* **sustained throughput**: input rates swept upwards; the highest at which the p99 of the
  per-hop latency stays ≤ 1 s and everything fed came out;
* **reprocessing**: a backlog appended before the query starts, drained: events/s from the
  query's start to the last output (with the query start), and from the first output to the
  last (without);
* **where the time goes**: Spark's own per-batch durations (``durationMs``) of the steady run.

One SparkSession and one nats-server on this machine, both kept for the whole run; the
feeder publishes from this process in atomic batches every :data:`FEED_TICK_S`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fogshift.agent.config import AgentConfig
from fogshift.bench.base import RunLog, fmt, num, percentile, read_rows, truthy, write_machine
from fogshift.bench.exceptions import BadBenchOption
from fogshift.broker.client import SyncJetStream, ensure_pe_stream, get_range, last_seq
from fogshift.broker.naming import data_subject, stream_name
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import DEFAULT_SYNC, BrokerProcess, check_sync, start_nats_server
from fogshift.common.waiting import wait_until
from fogshift.events import ORIGIN_HEADER

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

CASES = ("map", "window-aggregate", "window-aggregate-jvm")
SYSTEMS = ("fogshift", "plain")
#: The options of each case's PE (and what the plain query computes).
OPTIONS: dict[str, dict[str, Any]] = {
    "map": {"set": {"y": "value * 2 + 1"}},
    "window-aggregate": {"field": "value", "window": 10, "function": "avg"},
    "window-aggregate-jvm": {"field": "value", "window": 10, "function": "avg", "engine": "jvm"},
}
#: A case that is another's job on another engine: its PE's kind, and the floor it is
#: compared with (that case's plain query, measured once).
KIND_OF = {"window-aggregate-jvm": "window-aggregate"}
#: How often the feeder publishes what is due.
FEED_TICK_S = 0.02
#: The latency bound of "sustained".
SUSTAINED_P99_S = 1.0
FIELDS = (
    "run", "system", "case", "measure", "rate", "events", "p50_ms", "p99_ms", "max_ms",
    "events_per_s", "with_start_per_s", "sustained", "trigger_ms", "batch_ms",
    "add_batch_ms", "wal_commit_ms", "commit_offsets_ms", "latest_offset_ms", "planning_ms",
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """What one run measures.

    Attributes:
        steady_rate: Events/s of the latency measurement.
        steady_s: Its length.
        rates: The throughput sweep's rates, in order (stops at the first not sustained).
        sweep_s: Seconds fed at each rate.
        backlog: Events appended before the reprocessing query starts.
        trigger_ms: The queries' trigger (the node agents' default).
        cases: The cases measured, each beside its plain floor.
        runs: How many times the whole measurement runs (one round of every case and
            system after the other; the report gives each figure's median and range):
            single runs here differ by more than fogshift and its floor do.
        broker_sync: The broker's ``sync_interval`` (:data:`DEFAULT_SYNC`: fogshift's,
            each stored batch fsynced). It weighs on the two systems differently: fogshift
            appends a batch's records as one atomic batch (one fsync), the floor's writer
            publishes each record on its own (one each); nats-server's own default
            (``2m``) measures both without it.
    """

    steady_rate: float = 100.0
    steady_s: float = 30.0
    rates: tuple[int, ...] = (1000, 2500, 5000, 7500, 10000, 15000, 20000, 30000, 40000)
    sweep_s: float = 15.0
    backlog: int = 200_000
    trigger_ms: int = AgentConfig.default("trigger_ms")
    cases: tuple[str, ...] = CASES
    runs: int = 1
    broker_sync: str = DEFAULT_SYNC

    def __post_init__(self) -> None:
        check_sync(self.broker_sync)
        if self.runs < 1:
            raise BadBenchOption(
                f"bench dataplane cannot run {self.runs} times",
                expected="--runs of at least 1",
                received=f"--runs {self.runs}",
                hint="--runs 3 gives each figure's median of three rounds",
            )


QUICK = Settings(
    steady_s=10.0, rates=(1000, 2500, 5000, 7500, 10000, 15000, 20000), sweep_s=6.0, backlog=50_000
)


# -- the plain PySpark floor -------------------------------------------------------------------


def _plain_source() -> type:
    """The floor's reader: the stream's sequences as offsets, one range per batch."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from fogshift.broker.client import BrokerAddress, shared_client

    class PlainRange(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            super().__init__((start, end))
            self.start, self.end = start, end

    class PlainReader(DataSourceStreamReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.broker = BrokerAddress.load(options["broker"])
            self.stream, self.subject = options["stream"], options["subject"]
            self.limit = int(options.get("max_events_per_batch", "10000"))

        def initialOffset(self) -> dict:  # noqa: N802
            return {"seq": 0}

        def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
            client = shared_client(self.broker)
            return {"seq": client.run(lambda js: last_seq(js, self.stream))}

        def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
            first, last = int(start["seq"]), int(end["seq"])
            step = self.limit
            return [PlainRange(a, min(a + step, last)) for a in range(first, last, step)]

        def read(self, partition: InputPartition) -> Iterator[tuple]:
            assert isinstance(partition, PlainRange)
            client = shared_client(self.broker)
            messages = client.run(
                lambda js: get_range(js, self.stream, self.subject, partition.start, partition.end),
                timeout=120,
            )
            for message in messages:
                payload = json.loads(message.data)
                yield (message.seq, payload["body"])

    class PlainSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "fogshift-bench-plain"

        def schema(self) -> str:
            return "origin long, body string"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
            return PlainReader(dict(self.options))

    return PlainSource


def _plain_sink(broker_file: str, stream: str, subject: str) -> Callable[[Any, int], None]:
    """The floor's writer (``foreachBatch``): asynchronous publishes, awaited per batch."""

    def write(frame: Any, batch_id: int) -> None:
        from fogshift.broker.client import BrokerAddress, shared_client

        rows = frame.select("origin", "body").collect()
        if not rows:
            return
        client = shared_client(BrokerAddress.load(broker_file))

        async def publish(js: Any) -> None:
            futures = [
                await js.publish_async(
                    subject, row.body.encode(), headers={ORIGIN_HEADER: str(row.origin)}
                )
                for row in rows
            ]
            for future in futures:
                await future

        client.run(publish, timeout=300)

    return write


def _plain_window() -> Any:
    """The floor's ``window-aggregate``: the last N values in a ValueState."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    window = int(OPTIONS["window-aggregate"]["window"])

    class Window(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.values = handle.getValueState("values", "values string")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
            frame = pd.concat(list(rows), ignore_index=True).sort_values("origin")
            values = json.loads(self.values.get()[0]) if self.values.exists() else []
            bodies = []
            for value in frame["value"]:
                values.append(float(value))
                del values[:-window]
                bodies.append(json.dumps({"value": sum(values) / len(values)}))
            self.values.update((json.dumps(values),))
            yield pd.DataFrame({"origin": frame["origin"], "body": bodies})

        def close(self) -> None:
            pass

    return Window()


def start_plain(
    spark: SparkSession,
    case: str,
    broker_file: str,
    pipeline: str,
    checkpoint: str,
    trigger_ms: int,
) -> StreamingQuery:
    """Start the plain PySpark query of ``case`` (see the module's docstring)."""
    from pyspark.sql import functions as F  # noqa: N812

    spark.dataSource.register(_plain_source())
    events = (
        spark.readStream.format("fogshift-bench-plain")
        .option("broker", broker_file)
        .option("stream", stream_name(pipeline, "src"))
        .option("subject", data_subject(pipeline, "src"))
        .load()
    )
    parsed = events.select("origin", F.from_json("body", "value double").alias("b"))
    if case == "map":
        out = parsed.select(
            "origin",
            F.to_json(
                F.struct(F.col("b.value").alias("value"), (F.col("b.value") * 2 + 1).alias("y"))
            ).alias("body"),
        )
    else:
        out = (
            parsed.select("origin", F.col("b.value").alias("value"), F.lit(1).alias("k"))
            .groupBy("k")
            .transformWithStateInPandas(
                statefulProcessor=_plain_window(),
                outputStructType="origin long, body string",
                outputMode="Append",
                timeMode="None",
            )
        )
    sink = _plain_sink(broker_file, stream_name(pipeline, "pe"), data_subject(pipeline, "pe"))
    return (
        out.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .queryName(f"{pipeline}.plain")
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )


# -- one run -------------------------------------------------------------------------------------


class Bench:
    """A broker and a session for the whole run; a fresh pipeline per measurement."""

    def __init__(self, work: Path, settings: Settings) -> None:
        from fogshift.runtime.session import build_session
        from fogshift.runtime.warm_up import warm_up

        self.work, self.settings = work, settings
        self.broker: BrokerProcess = start_nats_server(work / "nats", sync=settings.broker_sync)
        self.broker_file = str(self.broker.address.save(work / "broker.json"))
        self.js = SyncJetStream(self.broker.address)
        self.spark = build_session("bench-dataplane", "local[2]", str(work / "local"))
        # As a node does: neither the first fogshift nor the first plain query starts cold.
        warm_up(self.spark, work / "warm-up")
        self._count = 0

    def close(self) -> None:
        self.js.close()
        self.spark.stop()
        os.killpg(self.broker.pid, signal.SIGKILL)

    def _pipeline(self) -> str:
        self._count += 1
        name = f"dp{self._count}"
        for pe in ("src", "pe"):
            self.js.run(partial(ensure_pe_stream, pipeline=name, pe=pe))
        return name

    def _start(self, system: str, case: str, pipeline: str) -> StreamingQuery:
        checkpoint = str(self.work / "checkpoints" / pipeline)
        if system == "plain":
            return start_plain(
                self.spark, case, self.broker_file, pipeline, checkpoint, self.settings.trigger_ms
            )
        from fogshift.runtime.engine import QueryPlan, start_query
        from fogshift.spec.models import ElementSpec

        element = ElementSpec.model_validate(
            {"id": "pe", "kind": KIND_OF.get(case, case), "node": "bench", "inputs": ["src"],
             "options": OPTIONS[case]}
        )  # fmt: skip
        gate = str(self.work / "gates" / f"{pipeline}.json")
        plan = QueryPlan(
            pipeline, element, self.broker_file, checkpoint, self.settings.trigger_ms, gate
        )
        return start_query(self.spark, plan)

    def _append(self, pipeline: str, first: int, count: int) -> None:
        now = time.time() * 1000
        records = [
            Record(n, 0, n, now, "src", json.dumps({"value": float(n % 97)}))
            for n in range(first, first + count)
        ]
        self.js.run(partial(publish_records, pipeline=pipeline, pe="src", records=records),
                    timeout=300)  # fmt: skip

    def _outputs(self, pipeline: str) -> int:
        return int(self.js.run(lambda js: last_seq(js, stream_name(pipeline, "pe"))))

    def _latencies(self, pipeline: str, after: int) -> tuple[list[float], list[float], list[int]]:
        """Per-hop latencies (s) of the outputs of inputs after ``after``, the output store
        times, and the input sequence (origin) of each."""
        source = self.js.run(
            lambda js: get_range(js, stream_name(pipeline, "src"), data_subject(pipeline, "src"),
                                 0, 10**12), timeout=300)  # fmt: skip
        output = self.js.run(
            lambda js: get_range(js, stream_name(pipeline, "pe"), data_subject(pipeline, "pe"),
                                 0, 10**12), timeout=300)  # fmt: skip
        stored = {m.seq: m.stored_at for m in source}
        latencies, times, origins = [], [], []
        for message in output:
            origin = int(message.headers[ORIGIN_HEADER])
            if origin > after and origin in stored:
                latencies.append(message.stored_at - stored[origin])
                times.append(message.stored_at)
                origins.append(origin)
        return latencies, times, origins

    def _warm(self, system: str, case: str) -> tuple[str, StreamingQuery]:
        """A started query that has answered its first event."""
        pipeline = self._pipeline()
        query = self._start(system, case, pipeline)
        self._append(pipeline, 1, 1)
        wait_until(lambda: self._outputs(pipeline) >= 1, 180, describe=f"{pipeline} warm")
        return pipeline, query

    def _feed(self, pipeline: str, first: int, rate: float, seconds: float) -> int:
        """Append ``rate`` events/s for ``seconds`` from sequence ``first``; return the count."""
        total = int(rate * seconds)
        sent, start = 0, time.monotonic()
        while sent < total:
            due = min(total, int((time.monotonic() - start) * rate) + 1)
            if due > sent:
                self._append(pipeline, first + sent, due - sent)
                sent = due
            time.sleep(FEED_TICK_S)
        return total

    def steady(self, system: str, case: str, rate: float, seconds: float) -> dict[str, Any]:
        """Per-hop latency at ``rate`` events/s, and Spark's batch durations meanwhile."""
        pipeline, query = self._warm(system, case)
        try:
            # recentProgress keeps only the last updates: filter by batch id, not position.
            before = int(query.lastProgress["batchId"]) if query.lastProgress else -1
            sent = self._feed(pipeline, 2, rate, seconds)
            drained = _wait_drained(lambda: self._outputs(pipeline), 1 + sent, 10 + seconds)
            _wait_idle(query)
            progress = [
                p
                for p in query.recentProgress
                if p.get("numInputRows", 0) > 0 and int(p["batchId"]) > before
            ]
        finally:
            query.stop()
        latencies, times, origins = self._latencies(pipeline, 1)
        row = _latency_row(latencies, sent, drained, origins)
        row.update(_durations(progress))
        row["events_per_s"] = _rate(len(times), times)
        return row

    def drain(self, system: str, case: str, backlog: int) -> tuple[str, float, bool, list[Any]]:
        """Start a query on a backlog of ``backlog`` events appended before it, and let it
        drain them.

        Returns:
            The pipeline, when the query was started (epoch s), whether it drained the
            backlog in time, and Spark's progress of its batches that read input.
        """
        pipeline = self._pipeline()
        for first in range(1, backlog + 1, 5000):
            self._append(pipeline, first, min(5000, backlog + 1 - first))
        started = time.time()
        query = self._start(system, case, pipeline)
        try:
            drained = _wait_drained(lambda: self._outputs(pipeline), backlog, 900)
            # A batch's outputs are in the stream before its progress is reported.
            _wait_idle(query)
            progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
        finally:
            query.stop()
        return pipeline, started, drained, progress

    def reprocess(self, system: str, case: str, backlog: int) -> dict[str, Any]:
        """Drain a backlog of ``backlog`` events appended before the query starts."""
        pipeline, started, drained, progress = self.drain(system, case, backlog)
        _, times, _ = self._latencies(pipeline, 0)
        # Without the query start: the events over the time its batches took (Spark's own
        # triggerExecution, which covers reading, processing and writing).
        busy_s = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
        return {
            "events": len(times),
            "events_per_s": round(len(times) / busy_s, 1) if busy_s and drained else None,
            "with_start_per_s": (
                round(len(times) / (max(times) - started), 1) if times and drained else None
            ),
            "batch_ms": round(busy_s * 1000 / len(progress), 1) if progress else None,
        }


def _wait_idle(query: StreamingQuery) -> None:
    """Wait (up to 30 s) until no batch runs: the one that wrote the last outputs has then
    reported its progress too (a batch's outputs are stored before its end)."""
    wait_until(lambda: not query.status["isTriggerActive"], 30, interval_s=0.02,
               describe="the query's last batch to end")  # fmt: skip


def _wait_drained(count: Callable[[], int], expected: int, timeout_s: float) -> bool:
    """Wait until ``count()`` reaches ``expected``; False when it did not within the time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if count() >= expected:
            return True
        time.sleep(0.05)
    return False


def _quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of fraction ``q`` (``int(q * n)`` was one rank above)."""
    found = percentile(values, q * 100.0)
    assert found is not None  # (callers pass values)
    return found


def _latency_row(
    latencies: Sequence[float], sent: int, drained: bool, origins: Sequence[int]
) -> dict[str, Any]:
    """One rate's latency figures; ``sustained`` only if every event sent was answered once
    (counted by input sequence: a count of outputs let duplicates make up for losses)."""
    if not latencies:
        return {"events": 0, "sustained": False}
    p99 = _quantile(latencies, 0.99)
    once = len(set(origins)) == len(origins) >= sent
    return {
        "events": len(latencies),
        "p50_ms": round(_quantile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "sustained": drained and once and p99 <= SUSTAINED_P99_S,
    }


def _rate(count: int, times: Sequence[float]) -> float | None:
    span = max(times) - min(times) if times else 0.0
    return round(count / span, 1) if span > 0 else None


def _durations(progress: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean per-batch durations (ms) of Spark's progress reports."""
    if not progress:
        return {}

    def mean(key: str) -> float:
        return round(statistics.fmean(p["durationMs"].get(key, 0) for p in progress), 1)

    return {
        "batch_ms": mean("triggerExecution"),
        "add_batch_ms": mean("addBatch"),
        "wal_commit_ms": mean("walCommit"),
        "commit_offsets_ms": mean("commitOffsets"),
        "latest_offset_ms": mean("latestOffset"),
        "planning_ms": mean("queryPlanning"),
    }


def run(out: Path, settings: Settings, log: Callable[[str], None] = print) -> Path:
    """Measure every system and case into ``out/dataplane.csv``; render ``out/results.md``."""
    out.mkdir(parents=True, exist_ok=True)
    write_machine(out)
    (out / "settings.json").write_text(json.dumps(asdict(settings), indent=2) + "\n")
    rows = RunLog(out / "dataplane.csv", FIELDS)
    work = Path(tempfile.mkdtemp(prefix="fogshift-dataplane-"))
    bench = Bench(work, settings)
    try:
        for number, case, system in rounds(settings):
            base = {"run": number, "system": system, "case": case,
                    "trigger_ms": settings.trigger_ms}  # fmt: skip
            said = f"run {number}: {system} {case}" if settings.runs > 1 else f"{system} {case}"
            log(f"{said}: steady {settings.steady_rate:g}/s")
            row = bench.steady(system, case, settings.steady_rate, settings.steady_s)
            rows.append({**base, "measure": "steady", "rate": settings.steady_rate, **row})
            for rate in settings.rates:
                log(f"{said}: sweep {rate}/s")
                row = bench.steady(system, case, rate, settings.sweep_s)
                rows.append({**base, "measure": "sweep", "rate": rate, **row})
                if not row.get("sustained"):
                    break
            log(f"{said}: reprocess {settings.backlog} events")
            row = bench.reprocess(system, case, settings.backlog)
            rows.append({**base, "measure": "reprocess", "rate": "", **row})
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    return render(out)


def rounds(settings: Settings) -> list[tuple[int, str, str]]:
    """What :func:`run` measures, in order: (run, case, system). Every case beside its floor
    (a JVM case's floor is its kind's, measured once per run); each run goes through the
    cases the other way round from the one before, so that a machine slowing down or
    speeding up through the runs weighs on every case alike."""
    order: list[tuple[int, str, str]] = []
    for number in range(1, settings.runs + 1):
        cases = settings.cases if number % 2 else tuple(reversed(settings.cases))
        for case in cases:
            systems = SYSTEMS if case not in KIND_OF else SYSTEMS[:1]
            order += [(number, case, system) for system in systems]
    return order


# -- report ----------------------------------------------------------------------------------------


def _find(rows: Sequence[Mapping[str, str]], system: str, case: str, measure: str) -> list[dict]:
    return [
        dict(r)
        for r in rows
        if r["system"] == system and r["case"] == case and r["measure"] == measure
    ]


def _run_of(row: Mapping[str, str]) -> str:
    """A row's run (``1`` in a CSV written before runs were numbered)."""
    return row.get("run") or "1"


def summary(rows: Sequence[Mapping[str, str]], system: str, case: str) -> dict[str, float | None]:
    """The headline figures of one system and case: each the median of its runs' (of those
    that have it; ``None`` if none has)."""
    per_run = summaries(rows, system, case)
    medians: dict[str, float | None] = {}
    for key, _label, _lower in HEADLINES:
        got = _present(per_run, key)
        medians[key] = statistics.median(got) if got else None
    return medians


def _present(runs: Sequence[Mapping[str, float | None]], key: str) -> list[float]:
    """The runs' values of ``key``, those they have."""
    return [v for r in runs if (v := r[key]) is not None]


def summaries(
    rows: Sequence[Mapping[str, str]], system: str, case: str
) -> list[dict[str, float | None]]:
    """The headline figures of one system and case, one dict per run, in run order."""
    runs = sorted({_run_of(r) for r in rows if r["system"] == system and r["case"] == case},
                  key=int)  # fmt: skip
    return [_one_run([r for r in rows if _run_of(r) == n], system, case) for n in runs]


def _one_run(rows: Sequence[Mapping[str, str]], system: str, case: str) -> dict[str, float | None]:
    """The headline figures of one system and case in one run's rows."""
    steady = _find(rows, system, case, "steady")
    sweep = [r for r in _find(rows, system, case, "sweep") if truthy(r["sustained"])]
    reprocess = _find(rows, system, case, "reprocess")
    first = steady[0] if steady else {}
    again = reprocess[0] if reprocess else {}
    return {
        "p50_ms": num(first.get("p50_ms")),
        "p99_ms": num(first.get("p99_ms")),
        "batch_ms": num(first.get("batch_ms")),
        "add_batch_ms": num(first.get("add_batch_ms")),
        "sustained_per_s": max((num(r["rate"]) or 0.0 for r in sweep), default=None),
        "reprocess_per_s": num(again.get("events_per_s")),
        "reprocess_with_start_per_s": num(again.get("with_start_per_s")),
    }


HEADLINES = (
    ("p50_ms", "per-hop p50 (ms)", True),
    ("p99_ms", "per-hop p99 (ms)", True),
    ("batch_ms", "Spark batch (ms)", True),
    ("add_batch_ms", "of which addBatch (ms)", True),
    ("sustained_per_s", "sustained at p99 ≤ 1 s (events/s)", False),
    ("reprocess_per_s", "reprocessing, in its batches (events/s)", False),
    ("reprocess_with_start_per_s", "reprocessing, with the query start (events/s)", False),
)


def _cell(median: float | None, runs: Sequence[Mapping[str, float | None]], key: str) -> str:
    """A figure's cell: the median, and with several runs their range in brackets."""
    got = _present(runs, key)
    if len(runs) < 2 or not got:
        return fmt(median)
    return f"{fmt(median)} ({fmt(min(got))} to {fmt(max(got))})"


def render(out: Path) -> Path:
    """``out/results.md`` and ``out/dataplane.png`` from ``out/dataplane.csv``."""
    from fogshift.bench.plotting import figure, save

    rows = read_rows(out / "dataplane.csv")
    try:
        settings = json.loads((out / "settings.json").read_text())
    except (OSError, ValueError) as exc:
        raise BadBenchOption(
            f"no data-plane run to report in {str(out)!r}",
            expected="the settings.json and dataplane.csv a `fogshift bench dataplane` run wrote",
            received=f"settings.json: {type(exc).__name__}: {exc}",
            hint="give the --out of a finished run, or drop --report-only to measure",
        ) from None
    lines = [
        "# Data plane: fogshift beside plain PySpark",
        "",
        f"Settings: {json.dumps(settings)}. One nats-server and one local[2] SparkSession on "
        "this machine (see machine.json). Per-hop latency: output store time - input store "
        "time, both by the broker's clock. Ratio: fogshift / plain (latency: lower is better; "
        "rates: higher is better).",
        "",
    ]
    cases = [c for c in CASES if _find(rows, "fogshift", c, "steady")] or list(CASES)
    fig, axes = figure(ncols=len(cases), width=5.0, height=3.6)
    for n, case in enumerate(cases):
        mine = summary(rows, "fogshift", case)
        floor = summary(rows, "plain", KIND_OF.get(case, case))
        lines += [f"## {case}", ""]
        if case in KIND_OF:
            kind = KIND_OF[case]
            lines += [f"(`{kind}` with `engine: jvm`; the floor is `{kind}`'s.)", ""]
        runs_mine = summaries(rows, "fogshift", case)
        runs_floor = summaries(rows, "plain", KIND_OF.get(case, case))
        if max(len(runs_mine), len(runs_floor)) > 1:
            lines += [
                f"Medians of {len(runs_mine)} runs (fogshift) and {len(runs_floor)} (plain), "
                "the runs' lowest and highest in brackets; the ratio is of the medians.",
                "",
            ]
        lines += ["| | fogshift | plain PySpark | ratio |", "|---|---|---|---|"]
        for key, label, _lower in HEADLINES:
            a, b = mine[key], floor[key]
            ratio = fmt(a / b, 2, "x") if a is not None and b else "-"
            cells = (_cell(a, runs_mine, key), _cell(b, runs_floor, key))
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
        lines.append("")
        ax = axes[0][n]
        labels = ["p50", "p99"]
        for k, (system, values) in enumerate((("fogshift", mine), ("plain", floor))):
            heights = [values["p50_ms"] or 0.0, values["p99_ms"] or 0.0]
            ax.bar([x + 0.38 * k for x in range(2)], heights, width=0.36, label=system)
        ax.set_xticks([0.19, 1.19], labels)
        ax.set_ylabel("per-hop latency (ms)")
        ax.set_title(case)
        ax.legend()
    save(fig, out / "dataplane.png")
    lines += ["![per-hop latency](dataplane.png)", "", "## Every run", ""]
    lines += ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join(r.get(f, "") for f in FIELDS) + " |" for r in rows]
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path


__all__ = ["QUICK", "Settings", "render", "rounds", "run", "start_plain", "summaries", "summary"]
