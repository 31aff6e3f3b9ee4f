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
``mapInPandas`` job for the stateless kinds. :func:`read_back` then reads that query's state
as the agent reads a PE's (Spark's state data source: a key listing and a twin read): a
node's first such read took ~2 s of class loading and code generation, which landed on the
first key group or rescale listing the node's partitions, or the first twin read. It
touches no broker (a node's broker user may create nothing) and leaves nothing behind but
its folder, which the caller owns. The class archive is made by the same query and reads,
so the classes it maps are the ones a node runs.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.waiting import wait_until
from fogshift.runtime.engine import GROUP_COLUMN, KEY_PREFIX
from fogshift.runtime.state_reader import read_keys, read_state

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The warm-up query's name: progress reports of it are no PE's (the agent counts reports
#: by their query's name).
QUERY_NAME = "fogshift-warm-up"
#: The name the discarding sink is registered under.
DISCARD_SINK = "fogshift-warm-up-discard"
#: The warm-up processor's one state field: stored as a PE's declared field is
#: (``f_<field>``, one JSON text), so that :func:`read_back` reads it as the agent reads a
#: PE's.
COUNT_PART = "count"


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
    query = begin(spark, folder)
    try:
        finish(query, timeout_s)
    finally:
        query.stop()
    read_back(spark, folder)
    return time.monotonic() - started


def read_back(spark: SparkSession, folder: Path) -> dict[str, Any]:
    """Read the state of the stopped warm-up query in ``folder`` as the agent reads a keyed
    PE's: its keys with their sizes (``state_reader.read_keys``, what a key group's move or
    a rescale lists), then each key's state (``state_reader.read_state``, a twin read).

    Returns:
        Each key's stored count (by the input's ``value``, as text).

    Raises:
        RuntimeError: The query committed no batch, or the two reads disagree on the keys.
    """
    checkpoint = folder / "checkpoint"
    batch, _, sizes = read_keys(spark, checkpoint, [COUNT_PART], movable=False)
    _, states = read_state(spark, checkpoint, [COUNT_PART], keyed=True)
    if batch is None or set(sizes) != set(states):
        raise RuntimeError(
            f"the warm-up's state reads disagree: keys {sorted(sizes)}, states "
            f"{sorted(k or '' for k in states)} at batch {batch}"
        )
    return {str(key): fields[COUNT_PART] for key, fields in states.items()}


def begin(spark: SparkSession, folder: Path) -> Any:
    """The part of :func:`warm_up` that uses the session: the ``mapInPandas`` job, then the
    stateful query started (in a fresh ``folder``); the StreamingQuery, to :func:`finish`
    and stop. A query must be started on the thread that registered the data sources."""
    spark.range(4).mapInPandas(_identity, "id long").collect()
    return _start_stateful(spark, folder)


def finish(query: Any, timeout_s: float = 120.0) -> None:
    """Wait until the warm-up ``query`` has run a batch (any thread may wait).

    Raises:
        RuntimeError: It failed or ran no batch within ``timeout_s``.
    """
    # The CSV is read in one batch: done once a batch with rows has run (or the query
    # failed).
    try:
        wait_until(
            lambda: not query.isActive
            or any(p["numInputRows"] > 0 for p in query.recentProgress),
            timeout_s, interval_s=0.1, describe="the warm-up query ran a batch",
        )  # fmt: skip
    except WaitTimedOut as exc:
        raise RuntimeError(str(exc)) from exc
    failure = query.exception()
    if failure is not None:
        raise RuntimeError(f"the warm-up query failed: {failure}")


def _start_stateful(spark: SparkSession, folder: Path) -> Any:
    """Start (in a fresh ``folder``) the warm-up's stateful query; the StreamingQuery."""
    from pyspark.sql import functions as func

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    data = folder / "in.csv"
    data.write_text("timestamp,value\n" + "".join(f"{i},{i % 7}\n" for i in range(40)))
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
