"""The one SparkSession of a node: configured for fogshift's streaming queries."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def build_session(
    node: str, master: str = "local[*]", local_dir: str | None = None
) -> SparkSession:
    """Create (or get) the node's SparkSession and register fogshift's data sources.

    Called once per process: a session costs ~7 s to start. One shuffle partition, because
    a PE's state is one unit (it is moved as one) and keeps its events in order; the same
    number must be used by every node, or a checkpoint cannot move between them.
    """
    from pyspark.sql import SparkSession

    # Some Python workers (the data-source planner among them) take their interpreter from
    # the environment, not from spark.pyspark.python: point both at this venv.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    from fogshift.broker.datasource import JetStreamDataSource
    from fogshift.runtime.csv_io import CsvSinkDataSource, CsvSourceDataSource

    builder = (
        SparkSession.builder.master(master)
        .appName(f"fogshift-{node}")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # Retain Spark's default 100 batches: a checkpoint is copied while its query runs,
        # and what the copy needs must not be purged under it. Changelogs keep this small.
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "10s")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master.startswith("local"):
        # A local session talks to nobody: keep its driver off the network.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    if local_dir:
        builder = builder.config("spark.local.dir", local_dir)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for source in (JetStreamDataSource, CsvSourceDataSource, CsvSinkDataSource):
        spark.dataSource.register(source)
    _warm_up(spark)
    return spark


def _identity(frames):  # type: ignore[no-untyped-def]
    yield from frames


def _warm_up(spark: SparkSession) -> None:
    """Run one tiny pandas job, so the first PE (or migration target) on this node does not
    pay for the JVM's and Python workers' first-use costs inside its downtime."""
    spark.range(4).mapInPandas(_identity, "id long").collect()
