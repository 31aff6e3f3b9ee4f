"""The Python worker start-up: the interpreter wrapper Spark runs, and the daemon it forks
workers from (real processes, no Spark session)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fogshift.runtime.session import WORKER_DAEMON, _jvm_temp_dir, _worker_python
from fogshift.runtime.worker_daemon import (
    OOM_SCORE_ADJ,
    TASK_WORKER,
    QuietTraceback,
    modules_for,
)


def test_the_wrapper_takes_sparks_zips_and_jars_off_the_path(tmp_path: Path) -> None:
    wrapper = _worker_python(tmp_path)
    spark = "/opt/venv/lib/python3.11/site-packages/pyspark"
    path = ":".join([
        f"{spark}/python/lib/pyspark.zip",
        f"{spark}/python/lib/py4j-0.10.9.9-src.zip",
        f"{spark}/jars/spark-core_2.13-4.3.0.jar",
        "/home/user/lib",
    ])  # fmt: skip
    out = subprocess.run(
        [wrapper, "-c", "import os, sys; print(os.environ['PYTHONPATH']); print(sys.executable)"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["/home/user/lib", sys.executable]


def test_preloading_leaves_a_single_thread_to_fork_from() -> None:
    # A fork copies only the calling thread: a library that starts a thread on import would
    # make every forked worker a deadlock risk. The daemon checks this at start-up; this test
    # says which import did it, should an upgrade start one.
    script = (
        "import sys; from fogshift.runtime.worker_daemon import preload, modules_for, threads\n"
        "missing = preload(modules_for('pyspark.worker'))\n"
        "print(missing, threads(), all(m in sys.modules for m in modules_for('pyspark.worker')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[] ['python'] True", out


def test_task_workers_preload_pandas_and_planners_do_not() -> None:
    assert set(TASK_WORKER) <= set(modules_for("pyspark.worker"))
    planner = modules_for("pyspark.sql.worker.plan_data_source_read")
    assert planner[0] == "pyspark.sql.worker.plan_data_source_read"
    assert "pandas" not in planner and "fogshift.broker.datasource" in planner


def test_spark_starting_its_daemon_gets_fogshifts_single_threaded_one(tmp_path: Path) -> None:
    # What Spark's worker factory runs: the interpreter, `-m pyspark.daemon MODULE`, reading
    # the daemon's port from its stdout and stopping it by closing its stdin.
    wrapper = _worker_python(tmp_path)
    daemon = subprocess.Popen(
        [wrapper, "-m", "pyspark.daemon", "pyspark.sql.worker.plan_data_source_read"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert daemon.stdout is not None and daemon.stdin is not None
        (port,) = struct.unpack("!i", daemon.stdout.read(4))  # written once it listens
        assert 0 < port < 65536
        process = psutil.Process(daemon.pid)
        assert process.cmdline()[1:] == [
            "-m", WORKER_DAEMON, "pyspark.sql.worker.plan_data_source_read"
        ]  # fmt: skip
        assert process.num_threads() == 1
        # The OOM killer takes its workers (forked from it) before the node's JVM.
        with open(f"/proc/{daemon.pid}/oom_score_adj") as handle:
            assert int(handle.read()) == OOM_SCORE_ADJ == 1000
        daemon.stdin.close()  # Spark's way of telling the daemon to exit
        daemon.wait(timeout=30)  # (its exit status is 1 then, as Spark's own daemon's)
        assert daemon.stderr is not None
        assert b"Traceback" not in daemon.stderr.read()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_a_nodes_jvm_temp_folder_is_its_own_and_drops_native_libraries_left_behind(
    tmp_path: Path,
) -> None:
    folder = _jvm_temp_dir(tmp_path)
    assert folder.is_dir() and folder.parent == tmp_path
    left = folder / "librocksdbjni123456.so"
    left.write_bytes(b"x")
    scratch = folder / "spark-something"
    (scratch / "inner").mkdir(parents=True)
    lz4 = folder / "liblz4-java-123.so"
    lz4.write_bytes(b"z")
    other = folder / "keep-me"
    other.write_bytes(b"y")
    assert _jvm_temp_dir(tmp_path) == folder
    assert not left.exists()  # a dead JVM's copy of RocksJava's 14 MB library
    assert not scratch.exists() and not lz4.exists()  # its scratch and its other library
    assert other.exists()  # nothing else is touched


def test_spark_scratch_an_earlier_jvm_left_goes_the_zygotes_stays(tmp_path: Path) -> None:
    # A node stopped with SIGKILL left each of its JVMs' scratch: a state store's working
    # copy (RocksDB), shuffle and block files, for good.
    from fogshift.runtime.session import sweep_scratch

    working = tmp_path / "spark-0b1c" / "StateStoreId(opId=0,partId=0)" / "workingDir"
    working.mkdir(parents=True)
    (working / "000010.sst").write_bytes(b"s" * 100)
    (tmp_path / "blockmgr-9f" / "0c").mkdir(parents=True)
    kept = [tmp_path / "zygote", tmp_path / "fogshift-python-abc"]
    for folder in kept:
        folder.mkdir()
    sweep_scratch(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)


def test_a_worker_whose_socket_spark_closed_leaves_no_trace_and_others_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import traceback

    from pyspark import daemon

    # The daemon prints a worker's trace through its module's ``traceback``: the name the
    # quiet one replaces (a Spark that stops using it would print every trace again).
    assert daemon.traceback is traceback
    quiet = QuietTraceback()
    for closed in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
        try:
            raise closed
        except OSError:
            quiet.print_exc()
    assert capsys.readouterr().err == ""
    try:
        raise ValueError("a worker's real failure")
    except ValueError:
        quiet.print_exc()
        formatted = quiet.format_exc()
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: a worker's real failure" in err
    assert "ValueError: a worker's real failure" in formatted
