"""A node's fork server for the Python processes Spark starts per query.

Spark starts a fresh interpreter for every streaming query's data source runner
(``python_streaming_source_runner``) and for every ``transformWithStateInPandas`` query's
set-up runner (``transform_with_state_driver_worker``), and one daemon per kind of worker
(:mod:`fogshift.runtime.worker_daemon`). Each of them first imports pyspark, pyarrow,
numpy, nats and fogshift: ~0.4 s of CPU before it does anything, on the critical path of
every query start (a deploy, a migration's target, a restore), several times per start.
Measured over the test suite on the 2-core machine: ~400 such interpreters, ~150 s of CPU.

The zygote imports all of that once per node, then forks a child for each such process:

- Spark runs the interpreter wrapper (:func:`fogshift.runtime.session.build_session`); for a
  module in :data:`SERVED` and a zygote listening, the wrapper runs the tiny stdlib-only
  :mod:`fogshift.runtime.zygote_client` instead of a full interpreter;
- the client sends its arguments, environment, working directory and its stdin, stdout and
  stderr (the pipes Spark reads) over a Unix socket; the zygote forks, and the child runs
  the module as ``python -m`` would, with exactly those;
- the client waits and exits as the child did (same code, same signal). When Spark stops
  the client (``Process.destroy``), the zygote sends the child SIGTERM, as Spark would have.

Nothing depends on the zygote being there: without its socket, or when anything in the
hand-over fails before the child runs, the client becomes the interpreter Spark asked for
(``exec``), as before. A child starts in the node's process group, but Spark's daemon
puts itself and its workers in a group of their own: a killed node's group signal misses
them, and they end when the dead JVM closes the daemon's input (its workers then get
SIGHUP); the zygote exits when the process that started it does.

The socket is in a folder only the node's user can open (0700; the socket itself 0600),
and the zygote runs only the modules in :data:`SERVED`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import os
import runpy
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from fogshift.runtime.worker_daemon import SINGLE_THREADED, modules_for, preload, threads

#: The modules Spark starts interpreters for, which the zygote runs: the per-query runners
#: and the worker daemon (the wrapper runs it in place of ``pyspark.daemon``).
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
TWS_RUNNER = "pyspark.sql.streaming.transform_with_state_driver_worker"
SERVED = frozenset({SOURCE_RUNNER, TWS_RUNNER, "fogshift.runtime.worker_daemon"})

#: What Spark's transformWithState set-up runner notes at every keyed query's start: five
#: lines, each followed by a blank one, made most of a node's log.
TWS_CHATTER = "Streaming TransformWithStateInPandas Python worker"


class WithoutChatter:
    """A text stream minus the ``print()`` calls whose text holds ``marker`` (with the end
    each such call writes after it); whatever else is written goes through, a processor's
    own prints among it."""

    def __init__(self, stream: TextIO, marker: str) -> None:
        self._stream, self._marker, self._dropped = stream, marker, False

    def write(self, text: str) -> int:
        dropped, self._dropped = self._dropped, self._marker in text
        if self._dropped or (dropped and text == "\n"):
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


#: The worker modules Spark's daemons serve (each daemon preloads its own: all of them here).
_DAEMON_WORKERS = (
    "pyspark.worker",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.python_streaming_sink_runner",
)

#: Everything a served process imports, loaded once before the first fork.
PRELOAD: tuple[str, ...] = tuple(
    dict.fromkeys(
        [SOURCE_RUNNER, TWS_RUNNER, "pyspark.daemon", "fogshift.runtime.worker_daemon"]
        + [m for worker in _DAEMON_WORKERS for m in modules_for(worker)]
    )
)

#: A request (arguments, environment) is a few KiB; one datagram of a SOCK_SEQPACKET socket.
_MAX_REQUEST = 1 << 20
#: A Unix socket's path must fit in ``sun_path`` (108 bytes on Linux, with its NUL).
_MAX_PATH = 100
#: How often the zygote checks that the process that started it is still there.
_PARENT_CHECK_S = 1.0
#: How long a session's start waits for its zygote to listen before its first Python worker
#: (its imports take ~1 s of CPU, under load several seconds; the JVM starts meanwhile).
LISTEN_WAIT_S = 30.0
#: The temp folders of zygotes whose node's folder is too deep for a socket's path.
TEMP_PREFIX = "fogshift-zygote-"
#: How old such a folder must be, empty, before a sweep removes it: a zygote starting now
#: binds its socket in a folder just made.
STALE_EMPTY_S = 600.0


def socket_path(folder: Path) -> Path:
    """Where the zygote of the node whose Spark local dir is ``folder`` listens: in a folder
    of its own (0700), or under the temp dir when ``folder`` is too deep for a socket."""
    candidate = folder / "zygote" / "socket"
    if len(str(candidate)) <= _MAX_PATH:
        return candidate
    # One per folder, the same at every start (a new one at each start of the agent left a
    # folder in the temp dir, and a worker script named after it in the node's, for good);
    # another user's folder of that name is not taken (they could answer for the zygote).
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    temp = Path(tempfile.gettempdir())
    stable = temp / f"{TEMP_PREFIX}{digest}"
    with contextlib.suppress(OSError):  # tidying only: a start never fails for it
        sweep_stale(temp, keep=stable)
    try:
        stable.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix=TEMP_PREFIX)) / "socket"
    info = stable.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return Path(tempfile.mkdtemp(prefix=TEMP_PREFIX)) / "socket"
    return stable / "socket"


def sweep_stale(temp: Path, keep: Path | None = None) -> int:
    """Remove this user's zygote folders under ``temp`` that no zygote uses any more: one
    whose ``socket`` refuses connections (its zygote was killed with its node, and only a
    clean exit removes the folder: the test suite's SIGKILLed nodes left one per node
    folder, for good), and an empty one older than :data:`STALE_EMPTY_S`. ``keep`` is left
    alone. Returns how many were removed.

    A live zygote's socket is there only once it listens (it is bound under another name,
    then renamed), so a ``socket`` that refuses is a dead one's.
    """
    removed = 0
    for folder in temp.glob(f"{TEMP_PREFIX}*"):
        try:
            info = folder.lstat()
            if folder == keep or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            sock = folder / "socket"
            if _refuses(sock):
                sock.unlink()
            elif any(folder.iterdir()) or time.time() - info.st_mtime < STALE_EMPTY_S:
                continue
            folder.rmdir()  # fails if anything else is in it: then it stays
            removed += 1
        except OSError:
            continue  # gone meanwhile, or not ours to remove
    return removed


#: What :func:`_listener_pid` answers for a socket nobody listens on: never a pid (not 0
#: either, which the kernel gives for a live listener in a PID namespace the asker cannot
#: see: its socket is not a dead one's).
_NOBODY = -1
#: ``struct ucred`` (pid, uid, gid), as ``SO_PEERCRED`` gives it.
_UCRED = struct.Struct("3i")


def _listener_pid(path: Path) -> int | None:
    """The pid of the process listening at the Unix socket ``path`` (``SO_PEERCRED``: the
    process that called ``listen``); :data:`_NOBODY` for a socket a dead process left; None
    if there is no socket or it cannot be told. The probe connects and closes unsent, which
    a zygote takes for no request."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return None
    except OSError:
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except ConnectionRefusedError:
        return _NOBODY
    except OSError:
        return None
    finally:
        probe.close()
    pid, _uid, _gid = _UCRED.unpack(creds)
    return int(pid)


def _refuses(path: Path) -> bool:
    """Whether ``path`` is a Unix socket nobody listens on."""
    return _listener_pid(path) == _NOBODY


def start(path: Path) -> subprocess.Popen[bytes]:
    """Start a zygote listening at ``path`` (a child of this process, in its process group);
    it exits when this process does. Clients fall back to a fresh interpreter until it
    listens (~1 s: its imports)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if _refuses(path):
        # A SIGKILLed node's zygote left its socket: :func:`wait_listening` took it for
        # this one's, and the session's first worker, sent to it, started as a plain
        # interpreter (its imports again, ~1.5 s of CPU at every restart after a kill).
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    # The imports stay single-threaded (a fork copies one thread); Spark starts every Python
    # worker with PYTHONHASHSEED=0, and string hashing is fixed when an interpreter starts.
    env = {**os.environ, **SINGLE_THREADED, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    return subprocess.Popen(
        [sys.executable, "-m", "fogshift.runtime.zygote", "--socket", str(path),
         "--parent", str(os.getpid())],
        stdin=subprocess.DEVNULL, env=env, close_fds=True,
    )  # fmt: skip


def wait_listening(
    path: Path, process: subprocess.Popen[bytes], timeout_s: float = LISTEN_WAIT_S
) -> bool:
    """Wait until the zygote ``process`` started at ``path`` listens (it binds once its
    imports are done), at most ``timeout_s``, and not once it has exited (it refuses to serve
    when its imports started a thread); whether it listens. The session's first Python worker
    (Spark's lookup of Python data sources, at the first registration) is then forked from
    it, not an interpreter of its own importing everything again (~1.5 s of CPU per node
    start); without a zygote the workers start as such interpreters, only slower.

    The socket must be ``process``'s own (by ``SO_PEERCRED``): one a killed zygote left, or
    another live zygote's, is no sign this one listens (it replaces either once it does).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if _listener_pid(path) == process.pid:
            return True
        if process.poll() is not None or time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def serve(path: Path, parent: int, served: frozenset[str] = SERVED) -> None:
    """Preload :data:`PRELOAD`, listen at ``path`` and fork a child per request to run one
    of the modules ``served`` until process ``parent`` is gone.

    Refuses to serve (returns at once, clients then start interpreters as before) if the
    imports left a second thread, which a forked child would find stuck.
    """
    missing = preload(PRELOAD)
    running = threads()
    if len(running) > 1:
        sys.stderr.write(f"fogshift zygote: imports started threads {running}; not serving\n")
        return
    if missing:  # the worker that needs it reports the error, as without the zygote
        sys.stderr.write(f"fogshift zygote: could not preload {', '.join(missing)}\n")
    gc.freeze()  # what is loaded now is shared copy-on-write and never collected
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    staging = path.with_name(path.name + f".{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staging)
    # Made again if gone: the zygote this one replaces removes its temp folder as it exits.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    listener.bind(str(staging))
    os.chmod(staging, 0o600)
    listener.listen(64)
    os.replace(staging, path)  # clients see a socket only once it accepts
    identity = os.stat(path).st_ino
    Zygote(listener, parent, served).run()
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == identity:  # not a newer zygote's
            os.unlink(path)
    if path.parent.name.startswith(TEMP_PREFIX):
        with contextlib.suppress(OSError):  # a newer zygote's socket in it: it stays
            path.parent.rmdir()


class Zygote:
    """The zygote's loop: accept requests, fork, report each child's exit to its client."""

    def __init__(self, listener: socket.socket, parent: int, served: frozenset[str]) -> None:
        self.listener = listener
        self.parent = parent
        self.served = served
        self.clients: dict[int, socket.socket] = {}  # child pid -> its client's connection
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)

    def run(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
        signal.set_wakeup_fd(self.wake_write)
        while os.getppid() == self.parent:
            conns = {conn.fileno(): pid for pid, conn in self.clients.items()}
            listening = self.listener.fileno()
            readable, _, _ = select.select(
                [listening, self.wake_read, *conns], [], [], _PARENT_CHECK_S
            )
            for ready in readable:
                if ready == listening:
                    self._accept()
                elif ready == self.wake_read:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_read, 512)
                else:  # a client closed its end: Spark stopped it, so stop its child
                    self._client_gone(conns[ready])
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            conn.settimeout(5)
            data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
            if not data and not fds:  # closed unsent: a sweep's probe (:func:`sweep_stale`)
                conn.close()
                return
            request = json.loads(data)
            args = list(request["args"])
            if len(fds) != 3 or len(args) < 2 or args[0] != "-m" or args[1] not in self.served:
                raise ValueError(f"not a request the zygote serves: {args[:2]}")
            pid = os.fork()
            if pid == 0:
                self._child(request, fds, conn)  # never returns
            conn.sendall(json.dumps({"pid": pid}).encode())
            self.clients[pid] = conn
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # No child runs: the client starts the interpreter itself.
            sys.stderr.write(f"fogshift zygote: refused a request: {exc}\n")
            conn.close()
        finally:
            for fd in fds:
                os.close(fd)

    def _child(self, request: dict, fds: list[int], conn: socket.socket) -> None:
        """In the forked child: become ``python ARGS`` run by the client, then exit."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for own in (self.listener, conn, *self.clients.values()):
                own.close()
            os.close(self.wake_read)
            os.close(self.wake_write)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.path[:0] = [p for p in extra if p not in sys.path]
            _fresh_stdio(unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
            _, module, *rest = request["args"]
            sys.argv = [module, *rest]
            if module == TWS_RUNNER:
                sys.stdout = WithoutChatter(sys.stdout, TWS_CHATTER)  # type: ignore[assignment]
            # Run as ``-m`` runs it: a fresh ``__main__``, not the preloaded module object.
            sys.modules.pop(module, None)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    def _client_gone(self, pid: int) -> None:
        self.clients.pop(pid).close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.clients.pop(pid, None)
            if conn is None:
                continue
            if os.WIFSIGNALED(status):
                reply = {"signal": os.WTERMSIG(status)}
            else:
                reply = {"exit": os.waitstatus_to_exitcode(status)}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode())
            conn.close()


def _fresh_stdio(unbuffered: bool) -> None:
    """Standard streams on file descriptors 0-2 (the client's, just installed)."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            line_buffering=not unbuffered,
            write_through=unbuffered,
        )
        setattr(sys, name, stream)


def _exit_code(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives an interpreter."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--parent", required=True, type=int)
    args = parser.parse_args()
    serve(args.socket, args.parent)


if __name__ == "__main__":
    main()
