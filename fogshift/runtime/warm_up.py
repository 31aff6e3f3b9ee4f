"""A node's first query of each kind, run once before any PE needs it.

A node's first ``transformWithStateInPandas`` query pays for what no later one pays again:
the JVM initialises the stateful operator's classes, loads RocksDB's native library,
compiles the code paths of a Python data source, of the state server and of a Python
streaming sink, and Spark starts the Python workers they talk to. The class archive
(:mod:`fogshift.runtime.jvm_archive`) maps the classes, but does not run them. Unwarmed, that
cost lands on the first PE a node hosts: a migration's target, a restore, a standby
(issue #12: "a node's first stateful query costs nothing extra at migration or restore
time").

:func:`warm_up` runs that query — fogshift's CSV source, a keyed count in one
``ValueState`` on RocksDB, a Python sink that keeps nothing — to its first batch, and a
``mapInPandas`` job for the stateless kinds. Where the node has fogshift's JVM classes it
runs a second query beside it: the same rows through ``window-aggregate``'s JVM operator
(``engine: jvm``), whose first query on a node paid ~0.25 s more of class loading, Scala
``transformWithState`` planning and code generation than the Python warm-up covers.
:func:`read_back` then reads both queries' states as the agent reads a PE's (Spark's state
data source: a key listing and a twin read; the JVM window as ``fogshift state`` reads it):
a node's first such read took ~2 s of class loading and code generation, which landed on
the first key group or rescale listing the node's partitions, or the first twin read. It
touches no broker (a node's broker user may create nothing) and leaves nothing behind but
its folder, which the caller owns. The class archive is made by the same queries and reads,
so the classes it maps are the ones a node runs.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fogshift.checkpoint.spark_dir import committed_batch
from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.waiting import wait_until
from fogshift.events import DEFAULT_MAX_RECORD_BYTES
from fogshift.runtime.engine import GROUP_COLUMN, KEY_PREFIX, jvm_window
from fogshift.runtime.jvm_classes import jar_path
from fogshift.runtime.state_reader import read_jvm_window, read_keys, read_state
from fogshift.spec.kinds import WindowAggregateOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

#: The warm-up query's name: progress reports of it are no PE's (the agent counts reports
#: by their query's name).
QUERY_NAME = "fogshift-warm-up"
#: The name the discarding sink is registered under.
DISCARD_SINK = "fogshift-warm-up-discard"
#: The warm-up processor's one state field: stored as a PE's declared field is
#: (``f_<field>``, one JSON text), so that :func:`read_back` reads it as the agent reads a
#: PE's.
COUNT_PART = "count"
#: The JVM warm-up's window: the latest five values of the input, averaged.
JVM_WINDOW = WindowAggregateOptions(field="value", window=5, function="avg", engine="jvm")
#: The JVM query's checkpoint in the warm-up's folder.
JVM_CHECKPOINT = "jvm-checkpoint"
#: The rows of the warm-up's input (``timestamp,value``): values ``i % 7``.
ROWS = 40


@dataclass(frozen=True)
class Started:
    """The warm-up's running queries: the Python stateful one, and the JVM operator's
    (``None`` where the node has no fogshift JVM classes, or it failed to start: the
    Python warm-up stands without it)."""

    python: StreamingQuery
    jvm: StreamingQuery | None

    @property
    def queries(self) -> list[StreamingQuery]:
        return [q for q in (self.python, self.jvm) if q is not None]

    def stop(self) -> None:
        """Stop both (each tried, even if the other's stop raises)."""
        try:
            self.python.stop()
        finally:
            if self.jvm is not None:
                self.jvm.stop()


def warm_up(spark: SparkSession, folder: Path, timeout_s: float = 120.0) -> float:
    """Run one batch of a stateful streaming query and one ``mapInPandas`` job in ``spark``,
    then read the query's state back (:func:`read_back`).

    Args:
        spark: The node's session (fogshift's data sources registered).
        folder: A scratch folder of the caller's; emptied and used for the query's input
            and checkpoint.
        timeout_s: How long the query may take to run its first batch.

    Returns:
        The seconds it took.

    Raises:
        RuntimeError: The query failed or ran no batch within ``timeout_s``.
    """
    started = time.monotonic()
    queries = begin(spark, folder)
    try:
        finish(queries, timeout_s)
    finally:
        queries.stop()
    read_back(spark, folder)
    return time.monotonic() - started


def read_back(spark: SparkSession, folder: Path) -> dict[str, Any]:
    """Read the state of the stopped warm-up queries in ``folder`` as the agent reads a
    PE's: the keyed query's keys with their sizes (``state_reader.read_keys``, what a key
    group's move or a rescale lists), then each key's state (``state_reader.read_state``, a
    twin read); and, if it ran, the JVM operator's window (``state_reader.read_jvm_window``,
    ``fogshift state`` of a PE with ``engine: jvm``).

    Returns:
        Each key's stored count (by the input's ``value``, as text).

    Raises:
        RuntimeError: The keyed query committed no batch, the two reads disagree on the
            keys, or the JVM query's window (if it committed a batch) is not the input's
            latest values.
    """
    checkpoint = folder / "checkpoint"
    batch, _, sizes = read_keys(spark, checkpoint, [COUNT_PART], movable=False)
    _, states = read_state(spark, checkpoint, [COUNT_PART], keyed=True)
    if batch is None or set(sizes) != set(states):
        raise RuntimeError(
            f"the warm-up's state reads disagree: keys {sorted(sizes)}, states "
            f"{sorted(k or '' for k in states)} at batch {batch}"
        )
    if committed_batch(folder / JVM_CHECKPOINT) is not None:
        _, window = read_jvm_window(spark, folder / JVM_CHECKPOINT)
        expected = [i % 7 for i in range(ROWS)][-JVM_WINDOW.window :]
        if window != {None: {"values": expected}}:
            raise RuntimeError(f"the JVM warm-up's window is {window}, not {expected}")
    return {str(key): fields[COUNT_PART] for key, fields in states.items()}


def begin(spark: SparkSession, folder: Path) -> Started:
    """The part of :func:`warm_up` that uses the session: the ``mapInPandas`` job, then the
    stateful queries started (in a fresh ``folder``), to :func:`finish` and stop. A query
    must be started on the thread that registered the data sources."""
    spark.range(4).mapInPandas(_identity, "id long").collect()
    python = _start_stateful(spark, folder)
    jvm = None
    if jar_path().is_file():
        try:
            jvm = _start_jvm(spark, folder)
        except Exception:  # a cold first JVM query is slower, never wrong
            log.exception("the JVM warm-up query failed to start; a first JVM PE starts cold")
    return Started(python, jvm)


def finish(started: Started, timeout_s: float = 120.0) -> None:
    """Wait until each warm-up query has run a batch (any thread may wait). The JVM query's
    failure is logged, not raised: the Python warm-up stands without it (and
    :func:`read_back` reads its state only if it committed a batch).

    Raises:
        RuntimeError: The Python query failed, or a query ran no batch within ``timeout_s``.
    """
    # The CSV is read in one batch: done once a batch with rows has run (or the query
    # failed).
    try:
        wait_until(
            lambda: all(not q.isActive or any(p["numInputRows"] > 0 for p in q.recentProgress)
                        for q in started.queries),
            timeout_s, interval_s=0.1, describe="the warm-up queries ran a batch",
        )  # fmt: skip
    except WaitTimedOut as exc:
        raise RuntimeError(str(exc)) from exc
    failure = started.python.exception()
    if failure is not None:
        raise RuntimeError(f"the warm-up query failed: {failure}")
    failure = started.jvm.exception() if started.jvm is not None else None
    if failure is not None:
        log.warning("the JVM warm-up query failed (%s); a first JVM PE starts cold", failure)


def _start_stateful(spark: SparkSession, folder: Path) -> StreamingQuery:
    """Start (in a fresh ``folder``) the warm-up's stateful query; the StreamingQuery."""
    from pyspark.sql import functions as func

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    data = folder / "in.csv"
    data.write_text("timestamp,value\n" + "".join(f"{i},{i % 7}\n" for i in range(ROWS)))
    spark.dataSource.register(_discard_sink())
    # Keyed as a keyed PE's query is (its grouping column, its keys' prefix).
    rows = (
        spark.readStream.format("fogshift-csv-source")
        .option("path", str(data)).option("pe", "source").option("tail_settle_s", "0")
        .load()
        .withColumn(GROUP_COLUMN, func.concat(func.lit(KEY_PREFIX),
                                              func.get_json_object("body", "$.value")))
    )  # fmt: skip
    return (
        rows.groupBy(GROUP_COLUMN)
        .transformWithStateInPandas(
            statefulProcessor=_counter(), outputStructType="key string, count long",
            outputMode="Update", timeMode="None",
        )
        .writeStream.format(DISCARD_SINK)
        .option("checkpointLocation", str(folder / "checkpoint"))
        .queryName(QUERY_NAME)
        .trigger(processingTime="100 milliseconds")
        .start()
    )  # fmt: skip


def _start_jvm(spark: SparkSession, folder: Path) -> StreamingQuery:
    """Start the warm-up's JVM query (after :func:`_start_stateful`, which made ``folder``):
    the same values, as a PE's input events, through ``window-aggregate``'s JVM operator
    into the discarding sink (a Python sink, as a PE's writer is). Its input is Spark's own
    CSV file source, not fogshift's: the Python source's path is the other query's, and
    this one then starts no source runner of its own."""
    from pyspark.sql import functions as func

    data = folder / "jvm-in"
    data.mkdir()
    (data / "in.csv").write_text("".join(f"{i},{i % 7}\n" for i in range(ROWS)))
    events = (
        spark.readStream.schema("origin long, value long").csv(str(data))
        .select(
            "origin", func.col("origin").alias("seq"),
            func.col("origin").cast("double").alias("timestamp"),
            func.lit("source").alias("creator"),
            func.to_json(func.struct("value")).alias("body"),
        )
    )  # fmt: skip
    return (
        jvm_window(spark, events, "warm-up", JVM_WINDOW, DEFAULT_MAX_RECORD_BYTES)
        .writeStream.format(DISCARD_SINK)
        .option("checkpointLocation", str(folder / JVM_CHECKPOINT))
        .queryName(f"{QUERY_NAME}-jvm")
        .trigger(processingTime="100 milliseconds")
        .start()
    )  # fmt: skip


def _identity(frames):  # type: ignore[no-untyped-def]
    yield from frames


def _counter():  # type: ignore[no-untyped-def]
    """A keyed count in one ValueState of a JSON text: the shape of fogshift's stateful
    PEs (``engine._stateful_processor``)."""
    import json

    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    part = f"f_{COUNT_PART}"

    class Counter(StatefulProcessor):
        def init(self, handle):  # type: ignore[no-untyped-def]
            self.count = handle.getValueState(part, "json string")

        def handleInputRows(self, key, rows, timerValues):  # type: ignore[no-untyped-def]  # noqa: N802, N803
            stored = self.count.get()
            total = (json.loads(stored[0]) if stored else 0) + sum(len(f) for f in rows)
            self.count.update((json.dumps(total),))
            yield pd.DataFrame({"key": [key[0]], "count": [total]})

        def close(self) -> None:
            pass

    return Counter()


def _discard_sink():  # type: ignore[no-untyped-def]
    """A Python streaming sink that keeps nothing (fogshift's own sinks need a broker for
    their dead letters; the warm-up needs only the JVM side of a Python sink)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

    class DiscardWriter(DataSourceStreamWriter):
        def write(self, iterator):  # type: ignore[no-untyped-def]
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):  # type: ignore[no-untyped-def]  # noqa: N803
            pass

        def abort(self, messages, batchId):  # type: ignore[no-untyped-def]  # noqa: N803
            pass

    class DiscardSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return DISCARD_SINK

        def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]  # noqa: N802
            return DiscardWriter()

    return DiscardSink
