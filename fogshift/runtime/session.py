"""The one SparkSession of a node: configured for fogshift's streaming queries."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: How a query writes its checkpoint files (see :func:`build_session`).
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

#: The module Spark's Python workers are forked from (see :mod:`fogshift.runtime.worker_daemon`).
WORKER_DAEMON = "fogshift.runtime.worker_daemon"

#: The driver JVM's options. A fog node has a core or two and hosts several JVMs and Python
#: workers; at fog rates a batch is dominated by fixed costs, not by hot loops, so the C2
#: compiler's CPU (and parallel GC threads) cost more than they return. Measured on the
#: 2-core machine: a session's start-up plus 30 small stateful batches took 42 s of CPU
#: instead of 72 s, and 60 steady batches 12 s instead of 16 s, at the same wall time. CPU
#: left over is what lets a fresh Python worker connect back within Spark's fixed 10 s.
#: Nor does C2 pay back later (``scripts/batch_cpu.py --kind window-aggregate --warm-s 0
#: --windows 5``, 2026-12-02): the JVM took 47.7, 25.7, 20.8, 22.0, 18.1 s of CPU in five
#: minutes of batches at a 200 ms trigger with C2, 26.3, 19.2, 19.5, 18.8, 18.5 s with C1
#: only; C2's batches were ~10 % shorter (median 223 against 249 ms) from the third minute.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"
#: The driver JVM's log configuration (see the file): Spark at ERROR from its start, without
#: what a query stopped mid-batch makes it log.
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
#: The driver JVM's heap. Spark's default (1 GiB) is too small for a PE with a 50 MiB state
#: field: the transformWithState state server pickles a value it hands to Python into a
#: doubling byte buffer, a few times the value's size for a moment, and a node whose query
#: loaded such a state while another did the same died of ``OutOfMemoryError`` (E1, 50 MiB,
#: 11th run on one cluster). After a full GC the heap of such a node holds ~50 MB: the
#: memory is reserved, not used.
DRIVER_MEMORY = "2g"


def build_session(
    node: str,
    master: str = "local[*]",
    local_dir: str | None = None,
    java_options: str = JAVA_OPTIONS,
) -> SparkSession:
    """Create (or get) the node's SparkSession and register fogshift's data sources.

    Called once per process: a session costs ~7 s to start. One shuffle partition, because
    a PE's state is one unit (it is moved as one) and keeps its events in order; the same
    number must be used by every node, or a checkpoint cannot move between them. Nothing
    has run in it yet: :func:`fogshift.runtime.warm_up.warm_up` runs a node's first queries.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from fogshift.runtime import zygote

    # Some Python workers (the data-source planner among them) take their interpreter from
    # the environment, not from spark.pyspark.python: point both at this venv. A node (a
    # session with a local dir of its own) forks the per-query ones from its zygote, and
    # the driver-side ones too (Spark's lookup of Python data sources at the first
    # registration ran a plain interpreter: ~1.5 s of CPU per node start).
    zygote_socket, zygote_process = None, None
    if local_dir:
        zygote_socket = zygote.socket_path(Path(local_dir))
        zygote_process = zygote.start(zygote_socket)
    worker_python = _worker_python(Path(local_dir or tempfile.gettempdir()), zygote_socket)
    os.environ["PYSPARK_PYTHON"] = worker_python
    os.environ["PYSPARK_DRIVER_PYTHON"] = worker_python

    from fogshift.broker.datasource import JetStreamDataSource
    from fogshift.runtime.csv_io import CsvSinkDataSource, CsvSourceDataSource
    from fogshift.runtime.ecg_source import EcgSourceDataSource
    from fogshift.runtime.jvm_archive import with_archive
    from fogshift.runtime.jvm_classes import jvm_option, session_configs

    builder = (
        SparkSession.builder.master(master)
        .appName(f"fogshift-{node}")
        .config("spark.pyspark.python", worker_python)
        .config("spark.pyspark.driver.python", worker_python)
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # Pinned (it is Spark 4.3's default): a snapshot tells which SSTs a state store's
        # kept snapshot names from its `N.zip` (checkpoint.spark_dir); version 2 names them
        # `N_<id>.zip`, and a snapshot would then keep every SST, a half-uploaded one too
        # (RocksDB's SSTs are uploaded under their final names).
        .config("spark.sql.streaming.stateStore.checkpointFormatVersion", "1")
        # Retain Spark's default 100 batches: a checkpoint is copied while its query runs,
        # and what the copy needs must not be purged under it. Changelogs keep this small.
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "10s")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Checkpoint files through Hadoop's FileSystem API, not its FileContext API: without
        # Hadoop's native library (none here) FileContext resolved every rename with a
        # `readlink` process and set modes with `chmod` processes: ~150 processes a
        # second on a four-node test cluster, ~0.1 s of CPU per micro-batch. A local rename
        # is atomic either way. (The FileSystem API still started a `chmod` per file it
        # created: fogshift's local file system, below, sets modes without one; it stays
        # Hadoop's checksummed one, which RocksDB's state store requires.)
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", DRIVER_MEMORY)
    )
    if master.startswith("local"):
        # A local session talks to nobody: keep its driver off the network.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    if local_dir:
        # Only before this process's JVM starts: its own scratch is there afterwards.
        first = SparkContext._gateway is None
        if first:
            sweep_scratch(Path(local_dir))
        builder = builder.config("spark.local.dir", local_dir)
        temp = _jvm_temp_dir(Path(local_dir), sweep=first)
        java_options = f"{java_options} {jvm_option('-Djava.io.tmpdir=', temp)}"
    # Read when the driver JVM is launched, which the first session of a process does.
    # The environment's class archive, if made, saves ~a quarter of the JVM's start; its
    # local file system, if compiled, saves a chmod process per file written.
    java_options = f"{java_options} -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    builder = builder.config("spark.driver.extraJavaOptions", with_archive(java_options))
    for key, value in session_configs().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # The first registration has Spark look up Python data sources in a Python worker:
    # forked from the zygote once it listens (its imports run beside the JVM's start).
    if (
        zygote_socket is not None
        and zygote_process is not None
        and not zygote.wait_listening(zygote_socket, zygote_process)
    ):
        log.warning(
            "node %s: its zygote does not listen at %s (exit status %s): Spark's Python "
            "workers start as interpreters of their own", node, zygote_socket,
            zygote_process.poll(),
        )  # fmt: skip
    for source in (
        JetStreamDataSource,
        CsvSourceDataSource,
        CsvSinkDataSource,
        EcgSourceDataSource,
    ):
        spark.dataSource.register(source)
    return spark


#: What RocksJava extracts its native library as, once per JVM, into ``java.io.tmpdir``.
ROCKSDB_LIBRARY_GLOB = "librocksdbjni*.so"
#: What Spark makes in ``spark.local.dir`` (its scratch: RocksDB's working copies of the
#: state stores, shuffle and block files) and in ``java.io.tmpdir``, deleted only at a clean
#: JVM exit.
SCRATCH_GLOBS = ("spark-*", "blockmgr-*")
JVM_TEMP_GLOBS = (ROCKSDB_LIBRARY_GLOB, "liblz4-java*", "artifacts-*", "spark-*")


def sweep_scratch(local_dir: Path) -> None:
    """Remove what earlier JVMs of this node left in ``local_dir`` (one node runs per home,
    and a node is stopped with SIGKILL): every unclean stop left a state store's working
    copy, shuffle files and native libraries behind, for good. Only Spark's own names go
    (the zygote's and the worker script's folders stay)."""
    _remove_matching(local_dir, SCRATCH_GLOBS)


def _remove_matching(folder: Path, patterns: tuple[str, ...]) -> None:
    """Remove the files and folders in ``folder`` whose names match one of ``patterns``."""
    for pattern in patterns:
        for leftover in folder.glob(pattern):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def _jvm_temp_dir(local_dir: Path, sweep: bool = True) -> Path:
    """The node JVM's ``java.io.tmpdir``: a folder of the node's own, emptied of the native
    libraries its earlier JVMs left.

    RocksJava copies its 14 MB native library into the JVM's temporary folder at every start
    and deletes it only at a clean exit; a node is stopped with SIGKILL, so with ``/tmp`` a
    host collected one per node start (1.4 GB after a day of tests). The earlier JVMs of this
    node are gone (one node runs per home), and a library still mapped by a frozen one stays
    mapped when its file is removed.
    """
    folder = local_dir / "jvm-tmp"
    folder.mkdir(parents=True, exist_ok=True)
    if sweep:
        _remove_matching(folder, JVM_TEMP_GLOBS)
    return folder


#: The interpreter Spark starts its Python workers with (see :func:`_worker_python`).
_WORKER_SCRIPT = """#!/bin/sh
# fogshift: Spark puts its own pyspark.zip and py4j zip first on a Python worker's PYTHONPATH
# (and a Spark jar, which holds no Python). Modules imported from a zip are compiled at every
# import (a zip has no bytecode cache): a fresh worker spent ~1.2 s of CPU instead of ~0.4 s
# before connecting back, and on a loaded 2-core node missed Spark's fixed 10 s; every other
# import also probed the jar's 6,000 entries first. The venv has the same pyspark and py4j,
# byte-compiled, so these entries are taken off the path; nothing else changes.
set -f
new=
IFS=:
for entry in $PYTHONPATH; do
    case $entry in
        */pyspark.zip|*/py4j-*-src.zip|*/pyspark/jars/*.jar) ;;
        *) new=${new:+$new:}$entry ;;
    esac
done
unset IFS
PYTHONPATH=$new
export PYTHONPATH
# Every daemon Spark forks Python workers from is fogshift's, which imports what they need
# once, before it forks (fogshift.runtime.worker_daemon), instead of in every child.
if [ "$1" = "-m" ] && [ "$2" = "pyspark.daemon" ]; then
    shift 2
    set -- -m {daemon} "$@"
fi
# The per-query runners and the daemons are forked from the node's zygote, which has their
# imports done, when it listens (fogshift.runtime.zygote); otherwise, or should the hand-over
# fail, the client becomes the interpreter itself.
if [ "$1" = "-m" ] && [ -n "{socket}" ] && [ -S "{socket}" ]; then
    case $2 in
        {served}) exec "{python}" -I -S "{client}" "{socket}" "{python}" "$@" ;;
    esac
fi
exec "{python}" "$@"
"""


def _worker_python(folder: Path, zygote: Path | None = None) -> str:
    """Write (atomically) the executable that starts Spark's Python workers; its path.

    It runs this venv's interpreter without Spark's ``pyspark.zip`` on the path (why: in
    :data:`_WORKER_SCRIPT`), and the processes a zygote serves through the one listening at
    ``zygote``, if given and listening. Its name depends on its text (the interpreter, the
    socket), so sessions of different environments sharing ``folder`` do not overwrite
    each other's.
    """
    from fogshift.runtime import zygote_client
    from fogshift.runtime.zygote import SERVED

    replacements = {
        "{python}": sys.executable,
        "{daemon}": WORKER_DAEMON,
        "{socket}": str(zygote or ""),
        "{served}": "|".join(sorted(SERVED)),
        "{client}": str(Path(zygote_client.__file__).resolve()),
    }
    text = _WORKER_SCRIPT
    for key, value in replacements.items():
        text = text.replace(key, value)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = folder / f"fogshift-python-{digest}"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".fogshift-python-")
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return str(path)
