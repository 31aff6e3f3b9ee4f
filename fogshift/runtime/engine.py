"""Turning a pipeline element into a running Structured Streaming query.

* source (``csv-source``): CSV data source → JetStream writer;
* processor: JetStream reader → the processor → JetStream writer. A stateful processor runs
  in ``transformWithStateInPandas`` with its snapshot in one ``ValueState`` (RocksDB state
  store), so its state is versioned with Spark's checkpoint; a stateless one in ``mapInPandas``;
* sink (``csv-sink``): JetStream reader → exactly-once CSV writer.

Every query has a single partition end to end: a PE's events keep their order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fogshift.broker.datasource import EVENT_SCHEMA, RECORD_SCHEMA
from fogshift.runtime.api import encode_state
from fogshift.runtime.batch import RECORD_COLUMNS, run_events
from fogshift.runtime.kinds import KINDS, processor_for
from fogshift.spec.models import ElementSpec

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery


@dataclass(frozen=True)
class QueryPlan:
    """What a node needs to run one PE.

    Attributes:
        pipeline: The pipeline id.
        element: The element's spec (paths already absolute).
        broker_file: The node's broker file.
        checkpoint_dir: The query's checkpoint location on the node's disk.
        trigger_ms: The micro-batch trigger interval.
        gate_file: The gate of the query's input (pause/resume, see ``runtime.gate``).
        epoch: The epoch this instance writes under (fencing).
    """

    pipeline: str
    element: ElementSpec
    broker_file: str
    checkpoint_dir: str
    trigger_ms: int = 200
    gate_file: str = ""
    epoch: int = 0

    @property
    def query_name(self) -> str:
        return f"{self.pipeline}.{self.element.id}"


def _read_inputs(spark: SparkSession, plan: QueryPlan, max_events: int = 10_000) -> DataFrame:
    return (
        spark.readStream.format("fogshift-jetstream")
        .option("broker", plan.broker_file)
        .option("pipeline", plan.pipeline)
        .option("inputs", ",".join(plan.element.inputs))
        .option("max_events_per_batch", str(max_events))
        .option("gate", plan.gate_file)
        .schema(EVENT_SCHEMA)
        .load()
    )


def _stateless(kind: str, options: dict[str, Any], pe: str):  # type: ignore[no-untyped-def]
    """A ``mapInPandas`` function running a stateless processor (must be picklable)."""

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        cls, opts = processor_for(kind, options)
        processor = cls.build(opts, pe, None)
        for frame in frames:
            ordered = frame.sort_values("origin")
            rows = ordered[["origin", "seq", "timestamp", "creator", "body"]].itertuples(
                index=False, name=None
            )
            out = list(run_events(processor, rows))  # type: ignore[arg-type]
            if out:
                yield pd.DataFrame(out, columns=RECORD_COLUMNS)

    return run


def _stateful_processor(kind: str, options: dict[str, Any], pe: str):  # type: ignore[no-untyped-def]
    """A ``StatefulProcessor`` keeping the PE's snapshot in the state store.

    Each declared state field is a ValueState of its own, written only when its JSON text
    changed: a PE with a large, rarely changing field pays for it once, not every batch.
    """
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    opaque_part = "__snapshot__"

    class SnapshotProcessor(StatefulProcessor):
        def init(self, handle) -> None:  # type: ignore[no-untyped-def]
            self.cls, self.opts = processor_for(kind, options)
            self.parts = self.cls.state_parts()
            names = self.parts if self.parts is not None else [opaque_part]
            self.values = {n: handle.getValueState(f"f_{n}", "json string") for n in names}

        def handleInputRows(self, key, rows, timerValues):  # type: ignore[no-untyped-def]  # noqa: N802, N803
            import pandas as pd

            frame = pd.concat(list(rows), ignore_index=True).sort_values("origin")
            stored = {n: v.get()[0] for n, v in self.values.items() if v.exists()}
            resume: dict[str, Any] | None = None
            if stored:
                decoded = {n: json.loads(text) for n, text in stored.items()}
                resume = decoded if self.parts is not None else decoded[opaque_part]
            processor = self.cls.build(self.opts, pe, resume)
            tuples = frame[["origin", "seq", "timestamp", "creator", "body"]].itertuples(
                index=False, name=None
            )
            out = list(run_events(processor, tuples))  # type: ignore[arg-type]
            snapshot = processor.snapshot()
            if self.parts is None:
                fresh = {opaque_part: encode_state(snapshot)}
            else:
                fresh = {n: encode_state(snapshot[n]) for n in self.parts}
            for name, text in fresh.items():
                if stored.get(name) != text:
                    self.values[name].update((text,))
            if out:
                yield pd.DataFrame(out, columns=RECORD_COLUMNS)

        def close(self) -> None:
            pass

    return SnapshotProcessor()


def start_query(spark: SparkSession, plan: QueryPlan) -> StreamingQuery:
    """Start the streaming query of one PE; it resumes from ``plan.checkpoint_dir`` if present."""
    element = plan.element
    kind = KINDS[element.kind]
    options = dict(element.options)
    if kind.role == "source":
        frame = (
            spark.readStream.format("fogshift-csv-source")
            .option("path", options["path"])
            .option("pe", element.id)
            .option("rate", str(options.get("rate", 0)))
            .option("max_events_per_batch", str(options.get("max_events_per_batch", 10_000)))
            .option("gate", plan.gate_file)
            .load()
        )
        writer = frame.writeStream.format("fogshift-jetstream")
    elif kind.role == "processor":
        from pyspark.sql import functions as F  # noqa: N812

        events = _read_inputs(spark, plan)
        cls, _ = processor_for(element.kind, options)
        if cls.is_stateful():
            out = (
                events.withColumn("pe_key", F.lit(element.id))
                .groupBy("pe_key")
                .transformWithStateInPandas(
                    statefulProcessor=_stateful_processor(element.kind, options, element.id),
                    outputStructType=RECORD_SCHEMA,
                    outputMode="Append",
                    timeMode="None",
                )
            )
        else:
            out = events.mapInPandas(_stateless(element.kind, options, element.id), RECORD_SCHEMA)
        writer = out.coalesce(1).writeStream.format("fogshift-jetstream")
    else:
        writer = (
            _read_inputs(spark, plan)
            .writeStream.format("fogshift-csv-sink")
            .option("path", options["path"])
        )
    return (
        writer.option("broker", plan.broker_file)
        .option("pipeline", plan.pipeline)
        .option("pe", element.id)
        .option("epoch", str(plan.epoch))
        .option("checkpointLocation", plan.checkpoint_dir)
        .queryName(plan.query_name)
        .outputMode("append")
        .trigger(processingTime=f"{plan.trigger_ms} milliseconds")
        .start()
    )
