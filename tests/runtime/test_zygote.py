"""The node's zygote (fogshift.runtime.zygote): real processes, no Spark session.

Spark's side is played by the test: it starts the interpreter wrapper as Spark does
(``WRAPPER -m MODULE``, pipes on stdin/stdout/stderr), reads what the process writes, and
stops it the way ``Process.destroy`` does (SIGTERM to the process it started).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket as sockets
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fogshift.common.processes import alive
from fogshift.common.waiting import wait_until
from fogshift.runtime import zygote
from fogshift.runtime.session import _worker_python

ROOT = Path(__file__).resolve().parents[2]
ECHO = "tests.runtime.zygote_echo"

#: A zygote serving the test module besides its own (the preload is the real one).
_SERVE = (
    "import sys; from pathlib import Path; from fogshift.runtime import zygote\n"
    "zygote.serve(Path(sys.argv[1]), int(sys.argv[2]), zygote.SERVED | {sys.argv[3]})\n"
)


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[psutil.Process, Path]]:
    """A listening zygote (child of this process) and its socket."""
    socket = zygote.socket_path(tmp_path)
    socket.parent.mkdir(mode=0o700)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(socket), str(os.getpid()), ECHO], cwd=ROOT
    )
    try:
        wait_until(socket.exists, 60, describe="the zygote listens")
        yield psutil.Process(proc.pid), socket
    finally:
        proc.kill()
        proc.wait()


CLIENT = Path(zygote.__file__).with_name("zygote_client.py")


def client_command(socket: Path, *args: str) -> list[str]:
    """What the wrapper runs for a module the zygote serves (it routes only Spark's)."""
    return [sys.executable, "-I", "-S", str(CLIENT), str(socket), sys.executable, *args]


def spark_starts(socket: Path, *args: str, cwd: Path) -> subprocess.Popen[str]:
    """Start the client of ``python -m ECHO ARGS`` with pipes, as Spark's worker factory
    starts the wrapper."""
    return subprocess.Popen(
        client_command(socket, "-m", ECHO, *args),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=cwd, env={**os.environ, "ZYGOTE_TEST_MARKER": "m-42", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_a_forked_child_runs_with_the_callers_arguments_environment_and_streams(
    served: tuple[psutil.Process, Path], tmp_path: Path
) -> None:
    server, socket = served
    assert server.num_threads() == 1  # safe to fork from, after its whole preload
    proc = spark_starts(socket, "echo", "3", cwd=tmp_path)
    out, err = proc.communicate("hello\n", timeout=60)
    report = json.loads(out)
    assert report == {"argv": ["echo", "3"], "cwd": str(tmp_path), "pid": report["pid"],
                      "marker": "m-42", "stdin": "hello"}  # fmt: skip
    assert "to stderr" in err
    assert proc.returncode == 3  # its exit status is the client's
    # The module ran in the zygote's child, not in the process Spark started.
    assert report["pid"] != proc.pid


def test_the_child_is_forked_from_the_zygote(
    served: tuple[psutil.Process, Path], tmp_path: Path
) -> None:
    server, socket = served
    proc = spark_starts(socket, "sleep", cwd=tmp_path)
    try:
        assert proc.stdout is not None
        report = json.loads(proc.stdout.readline())
        child = psutil.Process(report["pid"])
        assert child.ppid() == server.pid
        # Same process group as the zygote: a node killed as a group takes it along.
        assert os.getpgid(child.pid) == os.getpgid(server.pid)
        # Spark stops a worker by stopping the process it started: the child stops too.
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        # (``alive``: the zygote may reap the child between a look at its pid and one at
        # its status, which then raised NoSuchProcess and ended the wait as a failure.)
        wait_until(lambda: not alive(child.pid), 30, describe="the child stopped with its client")
    finally:
        proc.kill()


def test_a_child_killed_by_a_signal_is_reported_as_such(
    served: tuple[psutil.Process, Path], tmp_path: Path
) -> None:
    _, socket = served
    proc = spark_starts(socket, "signal", cwd=tmp_path)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM


def test_without_a_zygote_the_client_is_the_interpreter(tmp_path: Path) -> None:
    socket = tmp_path / "zygote" / "socket"  # nothing listens
    proc = spark_starts(socket, "echo", "5", cwd=tmp_path)
    out, _ = proc.communicate("x\n", timeout=60)
    assert json.loads(out)["pid"] == proc.pid and proc.returncode == 5
    # A socket file no zygote listens on (a killed node's) is the same.
    socket.parent.mkdir()
    stale = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    stale.bind(str(socket))
    stale.close()
    proc = spark_starts(socket, "echo", "6", cwd=tmp_path)
    out, _ = proc.communicate("x\n", timeout=60)
    assert json.loads(out)["pid"] == proc.pid and proc.returncode == 6


def test_a_module_it_does_not_serve_gets_an_interpreter_of_its_own(tmp_path: Path) -> None:
    socket = zygote.socket_path(tmp_path)
    proc = zygote.start(socket)  # the real one: serves Spark's runners, not the echo
    try:
        wait_until(socket.exists, 60, describe="the zygote listens")
        assert oct(socket.stat().st_mode & 0o777) == "0o600"
        assert oct(socket.parent.stat().st_mode & 0o777) == "0o700"
        # Asked to run a module it does not serve: refused, so the client runs python itself.
        run = spark_starts(socket, "echo", "7", cwd=tmp_path)
        out, _ = run.communicate("y\n", timeout=60)
        assert json.loads(out)["pid"] == run.pid and run.returncode == 7
    finally:
        proc.kill()
        proc.wait()


def _orphan_exits(socket: Path) -> None:
    """Start a zygote at ``socket`` from a process that then exits; wait until it exits too."""
    starter = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from fogshift.runtime import zygote\n"
         "print(zygote.start(Path(sys.argv[1])).pid)", str(socket)],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    pid = int(starter.stdout)
    wait_until(lambda: not psutil.pid_exists(pid), 60, describe="the orphaned zygote exited")


def test_the_zygote_exits_with_the_process_that_started_it(tmp_path: Path) -> None:
    socket = zygote.socket_path(tmp_path)
    _orphan_exits(socket)
    assert not socket.exists()


def test_spark_starting_its_daemon_gets_one_forked_from_the_zygote(tmp_path: Path) -> None:
    # What Spark's worker factory runs: the wrapper, `-m pyspark.daemon MODULE`, reading the
    # daemon's port from its stdout and stopping it by closing its stdin.
    socket = zygote.socket_path(tmp_path)
    server = zygote.start(socket)
    try:
        wait_until(socket.exists, 60, describe="the zygote listens")
        daemon = subprocess.Popen(
            [_worker_python(tmp_path, socket), "-m", "pyspark.daemon",
             "pyspark.sql.worker.plan_data_source_read"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert daemon.stdout is not None and daemon.stdin is not None
        (port,) = struct.unpack("!i", daemon.stdout.read(4))  # written once it listens
        assert 0 < port < 65536
        assert str(CLIENT) in psutil.Process(daemon.pid).cmdline()
        (forked,) = psutil.Process(server.pid).children()
        assert forked.num_threads() == 1
        daemon.stdin.close()  # Spark's way of telling the daemon to exit
        daemon.wait(timeout=30)
        assert daemon.returncode == 1, daemon.stderr.read() if daemon.stderr else ""
        wait_until(lambda: not psutil.Process(server.pid).children(), 30,
                   describe="the forked daemon exited")  # fmt: skip
    finally:
        server.kill()
        server.wait()


def test_a_deep_folders_socket_is_the_same_at_every_start(tmp_path: Path) -> None:
    # Too deep for a socket's path: a new temp folder at every agent start (and a worker
    # script named after it), left for good.
    import tempfile

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    before = {p.name for p in Path(tempfile.gettempdir()).glob("fogshift-zygote-*")}
    first, again = zygote.socket_path(deep), zygote.socket_path(deep)
    assert first == again and len(str(first)) <= 100
    made = {p.name for p in Path(tempfile.gettempdir()).glob("fogshift-zygote-*")} - before
    assert made <= {first.parent.name}
    assert (first.parent.stat().st_mode & 0o777) == 0o700
    first.parent.rmdir()


def test_a_probe_of_a_live_zygote_is_no_request(tmp_path: Path) -> None:
    # A sweep connects to tell a live zygote from a dead one's socket, then closes unsent:
    # the zygote serves on, and says nothing of it (it had logged a refused request).
    socket = zygote.socket_path(tmp_path)
    socket.parent.mkdir(mode=0o700)
    log = tmp_path / "zygote.err"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(socket), str(os.getpid()), ECHO], cwd=ROOT,
            stderr=err,
        )  # fmt: skip
    try:
        wait_until(socket.exists, 60, describe="the zygote listens")
        probe = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
        probe.connect(str(socket))
        probe.close()
        run = spark_starts(socket, "echo", "3", cwd=tmp_path)
        out, _ = run.communicate("x\n", timeout=60)
        assert run.returncode == 3 and json.loads(out)["pid"] != run.pid  # forked: served
    finally:
        proc.kill()
        proc.wait()
    assert "refused" not in log.read_text()


def test_zygote_folders_no_zygote_uses_are_swept(tmp_path: Path) -> None:
    # The suite's SIGKILLed nodes left a /tmp/fogshift-zygote-* folder each, for good: only a
    # zygote's clean exit removes its folder.
    def folder(name: str, age_s: float = 0.0) -> Path:
        made = tmp_path / f"{zygote.TEMP_PREFIX}{name}"
        made.mkdir(mode=0o700)
        if age_s:
            os.utime(made, (made.stat().st_atime - age_s, made.stat().st_mtime - age_s))
        return made

    dead = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    dead.bind(str(folder("dead") / "socket"))
    dead.close()  # its file stays: a killed zygote's
    live = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    live.bind(str(folder("live") / "socket"))
    live.listen(1)
    half = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    half.bind(str(folder("half") / "socket.12"))  # bound, not yet listening nor renamed
    folder("young")
    folder("old", age_s=2 * zygote.STALE_EMPTY_S)
    (folder("kept") / "socket").touch()  # not a socket: not judged
    mine = folder("mine", age_s=2 * zygote.STALE_EMPTY_S)
    try:
        assert zygote.sweep_stale(tmp_path, keep=mine) == 2
        left = sorted(p.name.removeprefix(zygote.TEMP_PREFIX) for p in tmp_path.iterdir())
        assert left == ["half", "kept", "live", "mine", "young"]
    finally:
        live.close()
        half.close()


def test_a_deep_folders_zygote_removes_its_folder_when_it_exits(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    socket = zygote.socket_path(deep)
    assert socket.parent.name.startswith(zygote.TEMP_PREFIX)
    _orphan_exits(socket)
    assert not socket.parent.exists()


def test_a_session_waits_for_its_zygote_to_listen_and_not_for_one_that_exited(
    tmp_path: Path,
) -> None:
    # The wait before a session's first Python worker: over once the socket is there...
    path = zygote.socket_path(tmp_path / "spark")
    proc = zygote.start(path)
    try:
        assert zygote.wait_listening(path, proc, timeout_s=60)
    finally:
        proc.kill()
        proc.wait()
    # ... the new zygote's, not the socket a SIGKILLed one left (taken for the new one's,
    # the session's first worker found nobody listening and started as an interpreter) ...
    assert zygote._refuses(path)  # (the killed one's socket is still there)
    proc = zygote.start(path)
    try:
        assert zygote.wait_listening(path, proc, timeout_s=60)
        assert not zygote._refuses(path)
    finally:
        proc.kill()
        proc.wait()
    # ... and at once when the zygote exited without listening (not after the timeout).
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started = time.monotonic()
    assert not zygote.wait_listening(tmp_path / "none" / "socket", gone, timeout_s=60)
    assert time.monotonic() - started < 5


def test_a_session_does_not_take_another_live_zygotes_socket_for_its_own(tmp_path: Path) -> None:
    """Another process listening at the path (a second agent on the same folder, say) was
    taken for this zygote at once; the wait is for ``process``'s own socket."""
    path = zygote.socket_path(tmp_path / "spark")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    other = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    other.bind(str(path))
    other.listen(8)

    def serve() -> None:  # as a live zygote does with probes: accept, read nothing, close
        with contextlib.suppress(OSError):
            while True:
                other.accept()[0].close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert not zygote.wait_listening(path, silent, timeout_s=1.0)
        assert zygote._listener_pid(path) == os.getpid()
    finally:
        silent.kill()
        silent.wait()
    # A zygote started there replaces the other's socket with its own, and is waited for.
    proc = zygote.start(path)
    try:
        assert zygote.wait_listening(path, proc, timeout_s=60)
        assert zygote._listener_pid(path) == proc.pid
    finally:
        proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            other.shutdown(sockets.SHUT_RDWR)  # wakes the accept
        other.close()
        server.join(10)


def test_the_keyed_query_runners_notes_are_left_out_and_other_prints_kept() -> None:
    import io

    out = io.StringIO()
    stream = zygote.WithoutChatter(out, zygote.TWS_CHATTER)
    print(f"Starting {zygote.TWS_CHATTER}.\n", file=stream)
    print("a processor's own line", file=stream)
    print(f"{zygote.TWS_CHATTER} Starting execution of UDF: f.\n", file=stream)
    print(file=stream)
    stream.write("\n")
    print("second", "line", sep=" ", file=stream)
    stream.flush()
    assert out.getvalue() == "a processor's own line\n\n\nsecond line\n"
    # Spark's runner prints them so; a Spark that stops would leave them in the log.
    import inspect

    from pyspark.sql.streaming import transform_with_state_driver_worker as runner

    assert f'log_name = "{zygote.TWS_CHATTER}"' in inspect.getsource(runner)
