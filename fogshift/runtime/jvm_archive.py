"""A class-data-sharing archive of the Spark driver JVM's classes, made once per environment.

A node's Spark session starts a JVM that loads and verifies some 15,000 classes from Spark's
jars before it can run anything; a query of a new kind (a Python data source, a
``transformWithStateInPandas`` operator, the RocksDB state store) loads thousands more. Java 17
can map classes already parsed and verified from an archive instead (AppCDS). Measured on
this 2-core machine, quiet: a session with a small stateful query started in 7.3 to 9.4 s
instead of 13.3 to 15.9 s, its JVM using 10 to 12 s of CPU instead of 17 to 20 s; `fogshift
up` of four nodes took 46 to 47 s instead of 68 to 72 s. Every node start, node restart and
cluster start gains that.

``python -m fogshift.runtime.jvm_archive`` (run by ``make setup``) makes the archive if it is
missing: it starts a session that dumps the classes it loaded at exit
(``-XX:ArchiveClassesAtExit``) after running the kinds of query fogshift runs. Sessions use it
through :func:`with_archive`. An archive the JVM cannot use (another Java, other jars) is
ignored by the JVM (``-Xshare:auto``, its default): a slower start, never a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from filelock import FileLock

#: Options that already decide class data sharing: then fogshift adds nothing.
_SHARING_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")


def archive_path() -> Path:
    """Where this environment's archive lives: beside its interpreter, named by the pyspark
    version (its jars are the classpath the archive depends on)."""
    from importlib.metadata import version

    return Path(sys.prefix) / "share" / "fogshift" / f"spark-{version('pyspark')}.jsa"


def with_archive(java_options: str, archive: Path | None = None) -> str:
    """``java_options`` plus the archive's ``-XX:SharedArchiveFile``, if it exists and the
    options do not decide class data sharing themselves."""
    archive = archive_path() if archive is None else archive
    if not archive.is_file() or any(word in java_options for word in _SHARING_OPTIONS):
        return java_options
    return f"{java_options} -XX:SharedArchiveFile={archive}".strip()


def ensure(archive: Path | None = None, timeout_s: float = 600) -> bool:
    """Make the archive unless it exists (one process at a time). True if it exists after.

    A failure to make it is reported on stderr and leaves no file: sessions then start
    without it.
    """
    archive = archive_path() if archive is None else archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(archive) + ".lock"):
        if archive.is_file():
            return True
        started = time.monotonic()
        # Under the lock the name is ours; the JVM writes it at exit, then it is renamed.
        tmp = str(archive.with_name(archive.name + ".part"))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a previous attempt's, cut off
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "fogshift.runtime.jvm_archive", "--dump-to", tmp],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
            if proc.returncode != 0 or not Path(tmp).is_file():
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
                print(f"fogshift: no JVM class archive (sessions start without it):\n{tail}",
                      file=sys.stderr)  # fmt: skip
                return False
            os.replace(tmp, archive)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        print(f"fogshift: JVM class archive {archive} made in {time.monotonic() - started:.0f} s")
        return True


def _dump(target: str) -> None:
    """Start a session whose JVM writes its loaded classes to ``target`` at exit, after
    running the kinds of query a node runs: a Python streaming source (fogshift's CSV
    source), ``transformWithStateInPandas`` on RocksDB, a Python streaming sink, mapInPandas."""
    from fogshift.common.waiting import wait_until
    from fogshift.runtime.session import JAVA_OPTIONS, build_session

    with tempfile.TemporaryDirectory(prefix="fogshift-jsa-") as work:
        folder = Path(work)
        spark = build_session(
            "jvm-archive", "local[*]", str(folder / "local"),
            f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={target}",
        )  # fmt: skip
        sink = _discard_sink()
        spark.dataSource.register(sink)
        data = folder / "in.csv"
        data.write_text("timestamp,value\n" + "".join(f"{i},{i % 7}\n" for i in range(40)))
        from pyspark.sql import functions as func

        rows = (
            spark.readStream.format("fogshift-csv-source")
            .option("path", str(data)).option("pe", "source").option("tail_settle_s", "0")
            .load()
            .withColumn("key", func.col("creator"))
        )  # fmt: skip
        query = (
            rows.groupBy("key")
            .transformWithStateInPandas(
                statefulProcessor=_counter(), outputStructType="key string, count long",
                outputMode="Update", timeMode="None",
            )
            .writeStream.format(sink.name())
            .option("checkpointLocation", str(folder / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )  # fmt: skip
        try:
            # The CSV is read in one batch; done once a batch with rows has run (or the
            # query failed).
            wait_until(
                lambda: not query.isActive
                or any(p["numInputRows"] > 0 for p in query.recentProgress),
                120, interval_s=0.2, describe="the archive's query ran a batch",
            )  # fmt: skip
            failure = query.exception()
        finally:
            query.stop()
            spark.stop()
        if failure is not None:
            raise SystemExit(f"the archive's query failed: {failure}")


def _counter():  # type: ignore[no-untyped-def]
    """A keyed count in one ValueState: the shape of fogshift's stateful PEs."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class Counter(StatefulProcessor):
        def init(self, handle):  # type: ignore[no-untyped-def]
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):  # type: ignore[no-untyped-def]  # noqa: N802, N803
            total = (self.count.get() or (0,))[0] + sum(len(frame) for frame in rows)
            self.count.update((total,))
            yield pd.DataFrame({"key": [key[0]], "count": [total]})

        def close(self) -> None:
            pass

    return Counter()


def _discard_sink():  # type: ignore[no-untyped-def]
    """A Python streaming sink that keeps nothing (fogshift's own sinks need a broker for
    their dead letters; the archive needs only the JVM side of a Python sink)."""
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
            return "fogshift-jsa-discard"

        def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]  # noqa: N802
            return DiscardWriter()

    return DiscardSink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump_to:
        _dump(args.dump_to)
        return
    ensure()


if __name__ == "__main__":
    main()
