"""A TCP relay that delays every chunk of data, in both directions, keeping order.

The kernel here has no ``netem``, so an isolated node's link delay is made in user space:
each node gets one relay process (``python -m fogshift.network.relay CONFIG``) in the host
namespace, with one listener per :class:`Route`. Every chunk read from one side is held for
a delay drawn from the link's :class:`~fogshift.network.links.LinkProfile` and then written
to the other side. Order is kept: a chunk's release time is
``max(now + delay, release time of the previous chunk in that direction)``, so a short draw
never overtakes a long one — a link is a pipe, not a set of packets.

The relay is what connects the namespace to the host at all: the broker and the
orchestrator stay bound to loopback, and the namespace reaches them only through the routes
on the host end of its veth; the orchestrator reaches the agent through a loopback route
into the namespace. Bandwidth is not the relay's job (``tbf`` on the veth does it), so data
crossing the relay's loopback legs is never shaped twice.

What is not modelled: connection set-up is not delayed (only data is), and one chunk is
whatever one ``read`` returned, so the delay is per chunk rather than per packet.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.logfile import LOG_MAX_BYTES, keep_logs
from fogshift.common.waiting import wait_until
from fogshift.network.exceptions import RelayFailed
from fogshift.network.links import LinkProfile

log = logging.getLogger("fogshift.relay")

#: Largest chunk read at once; each chunk gets one delay.
CHUNK_BYTES = 64 * 1024
#: Bytes a direction may hold before it stops reading from its source: the "link" can
#: carry at most this much in flight, i.e. at most BUFFER_BYTES / delay bytes per second.
BUFFER_BYTES = 16 * 1024 * 1024
#: The least a direction holds: a few full Ethernet frames. (Four chunks, 256 KiB, were
#: 2.1 s of queue in front of a 1 Mbit/s link, 4.1 s at 512 kbit/s: every message on the
#: connection waited behind a bulk transfer's backlog.)
MIN_BUFFER_BYTES = 4 * 1514


def buffer_bytes_for(profile: LinkProfile) -> int:
    """What a direction of a relay in front of a link of ``profile`` may hold: the link's
    bandwidth times its longest delay (mean + 3 sd) and 0.1 s, between
    :data:`MIN_BUFFER_BYTES` and :data:`BUFFER_BYTES`. Behind a limited link, 16 MiB queued
    in front of ``tbf`` hid the bottleneck from the sender (no backpressure for 134 s at
    1 Mbit/s: uploads "sent" long before the link carried them, replies waiting behind the
    backlog); without a limit, the delay alone is the link, and :data:`BUFFER_BYTES` of it
    are in flight at most."""
    bps = profile.bandwidth_bps
    if bps is None:
        return BUFFER_BYTES
    longest_s = (profile.mean_ms + 3 * profile.sd_ms) / 1000 + 0.1
    return max(MIN_BUFFER_BYTES, min(BUFFER_BYTES, int(bps / 8 * longest_s)))


CLONE_NEWNET = 0x40000000


class Route(BaseModel):
    """One listener of a relay and where its connections go.

    Attributes:
        name: What the route is for (``broker``, ``orchestrator``, ``agent``, ``echo``).
        listen_host: The address to listen on.
        listen_port: The port, 0 for one the kernel picks (reported once listening).
        target_host: Where each accepted connection is relayed to.
        target_port: Its port.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    listen_host: str
    listen_port: int = Field(default=0, ge=0, le=65535)
    target_host: str
    target_port: int = Field(ge=1, le=65535)


class EchoSpec(BaseModel):
    """A TCP echo server the relay opens *inside* a namespace, to measure the link's RTT.

    Attributes:
        namespace: The named network namespace (``ip netns``).
        host: The namespace's address to listen on.
        port: The port.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    host: str
    port: int = Field(ge=1, le=65535)


class RelayConfig(BaseModel):
    """What a relay process does; written as JSON, read by :func:`main`.

    Attributes:
        profile: The link's delay (its bandwidth is applied by ``tc``, not here).
        routes: The listeners.
        echo: An echo server to open in the node's namespace, if any.
        ready_file: Where to write the bound addresses (:class:`RelayReady`) once listening.
        watch_interface: A host interface (the node's veth end); the relay exits when it
            disappears, so a relay orphaned by a killed ``fogshift up`` does not outlive the
            namespace it serves.
        seed: Seed of the delay draws (``None``: from the OS).
        buffer_bytes: See :data:`BUFFER_BYTES`.
        connect_timeout_s: How long to try to reach a route's target per connection.
        log_max_bytes: Its log is copied aside and emptied once larger
            (:func:`fogshift.common.logfile.keep_logs`); 0: never.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: LinkProfile = LinkProfile()
    routes: list[Route]
    echo: EchoSpec | None = None
    ready_file: Path | None = None
    watch_interface: str | None = None
    seed: int | None = None
    buffer_bytes: int = Field(default=BUFFER_BYTES, ge=MIN_BUFFER_BYTES)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    log_max_bytes: int = Field(default=LOG_MAX_BYTES, ge=0)


class RelayReady(BaseModel):
    """The ready file: the relay's pid and each route's bound ``(host, port)``."""

    model_config = ConfigDict(frozen=True)

    pid: int
    routes: dict[str, tuple[str, int]]


class Relay:
    """The delaying relay, on the running asyncio loop.

    Args:
        profile: The link's delay distribution.
        routes: The listeners to open.
        seed: Seed of the delay draws.
        buffer_bytes: See :data:`BUFFER_BYTES`.
        connect_timeout_s: How long to try to reach a target per accepted connection.
    """

    def __init__(
        self,
        profile: LinkProfile,
        routes: list[Route],
        *,
        seed: int | None = None,
        buffer_bytes: int = BUFFER_BYTES,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.profile = profile
        self.routes = list(routes)
        self.buffer_bytes = buffer_bytes
        self.connect_timeout_s = connect_timeout_s
        self._rng = random.Random(seed)
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        #: Each route's bound ``(host, port)``, filled by :meth:`start`.
        self.addresses: dict[str, tuple[str, int]] = {}

    async def start(self) -> dict[str, tuple[str, int]]:
        """Open every route's listener; return each route's bound ``(host, port)``.

        Raises:
            OSError: A listener could not be opened (those already open are closed).
        """
        try:
            for route in self.routes:
                server = await asyncio.start_server(
                    functools.partial(self._accept, route), route.listen_host, route.listen_port
                )
                self._servers.append(server)
                host, port = server.sockets[0].getsockname()[:2]
                self.addresses[route.name] = (str(host), int(port))
        except BaseException:
            await self.close()
            raise
        return dict(self.addresses)

    async def close(self) -> None:
        """Stop listening and drop every relayed connection."""
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        self._servers.clear()

    def _accept(
        self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(route, reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _relay(
        self,
        route: Route,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
    ) -> None:
        try:
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection(route.target_host, route.target_port),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            # The far end is unreachable (a partitioned link, a dead agent): the client
            # sees its connection reset, as it would when a router answers "unreachable".
            log.info("route %s: %s:%d unreachable: %r", route.name, route.target_host,
                     route.target_port, exc)  # fmt: skip
            _reset(client_writer)
            return
        except BaseException:
            # Cancelled (the relay closing) while it connects: the client's connection is
            # closed too — left open, Python 3.12's wait_closed() waited for it for good.
            _reset(client_writer)
            raise
        clean = False
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._forward(client_reader, target_writer))
                group.create_task(self._forward(target_reader, client_writer))
            clean = True
        except* (OSError, asyncio.IncompleteReadError) as errors:
            log.debug("route %s: connection dropped: %r", route.name, errors.exceptions)
        finally:
            for writer in (client_writer, target_writer):
                if clean:
                    writer.close()
                else:  # pass a reset on as a reset, not as an orderly end
                    _reset(writer)

    async def _forward(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy ``source`` to ``sink`` until EOF, each chunk held for one delay draw."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        room = asyncio.Event()
        room.set()
        buffered = 0

        async def pump() -> None:
            nonlocal buffered
            last_release = 0.0
            while True:
                # (Not more than the direction holds: a chunk read whole overshot it.)
                data = await source.read(min(CHUNK_BYTES, self.buffer_bytes))
                release = max(loop.time() + self.profile.sample_delay_s(self._rng), last_release)
                last_release = release
                queue.put_nowait((release, data))
                if not data:
                    return  # EOF travels with the same delay and order as data
                buffered += len(data)
                while buffered >= self.buffer_bytes:
                    room.clear()
                    await room.wait()

        async def deliver() -> None:
            nonlocal buffered
            while True:
                release, data = await queue.get()
                wait = release - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if sink.can_write_eof():
                        sink.write_eof()  # half-close: the other direction may go on
                    return
                sink.write(data)
                await sink.drain()
                buffered -= len(data)
                room.set()

        async with asyncio.TaskGroup() as group:
            group.create_task(pump())
            group.create_task(deliver())


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a reset (RST), not an orderly end of stream (FIN)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ThreadedRelay:
    """A :class:`Relay` on an event loop of its own, in a daemon thread of this process.

    For benchmarks and tests that want a delayed link without a relay process::

        with ThreadedRelay(parse_link_profile("n100"), [route]) as relay:
            host, port = relay.addresses["name"]

    Args:
        profile: The delay distribution.
        routes: The listeners.
        seed: Seed of the delay draws.
        buffer_bytes: See :data:`BUFFER_BYTES`.
    """

    def __init__(
        self,
        profile: LinkProfile,
        routes: list[Route],
        *,
        seed: int | None = None,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._relay = Relay(profile, routes, seed=seed, buffer_bytes=buffer_bytes)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.addresses: dict[str, tuple[str, int]] = {}

    def start(self) -> ThreadedRelay:
        """Start the loop and open the listeners.

        Raises:
            OSError: A listener could not be opened.
        """
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._relay.start(), self._loop)
        try:
            self.addresses = future.result(timeout=30)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Close the relay and its connections, stop the loop and the thread."""
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._relay.close(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> ThreadedRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        # A reset, or the relay shutting down: asyncio 3.11 logs a cancelled connection
        # callback as an error, and an echo has nothing to clean up.
        pass
    finally:
        writer.close()


def listen_in_namespace(namespace: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``host:port`` inside network namespace ``namespace``.

    A socket stays in the namespace it was created in, whichever thread uses it later; so a
    short-lived thread enters the namespace (``setns`` changes only the calling thread's),
    creates the socket there and ends. Needs CAP_SYS_ADMIN (root).

    Raises:
        OSError: The namespace does not exist, cannot be entered, or the bind failed.
    """
    result: dict[str, socket.socket | BaseException] = {}

    def enter_and_listen() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{namespace}") as handle:
                if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {namespace}: {os.strerror(err)}")
            result["socket"] = socket.create_server((host, port))
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=enter_and_listen, name=f"netns-{namespace}")
    thread.start()
    thread.join()
    made = result.get("socket") or result.get("error")
    if isinstance(made, socket.socket):
        return made
    raise made if isinstance(made, BaseException) else OSError("no socket was made")


async def serve(config: RelayConfig) -> None:
    """Run a relay process's relay (and echo server) until SIGTERM, SIGINT, or until its
    watched interface disappears."""
    relay = Relay(
        config.profile,
        config.routes,
        seed=config.seed,
        buffer_bytes=config.buffer_bytes,
        connect_timeout_s=config.connect_timeout_s,
    )
    addresses = await relay.start()
    echo_server: asyncio.Server | None = None
    if config.echo is not None:
        sock = listen_in_namespace(config.echo.namespace, config.echo.host, config.echo.port)
        echo_server = await asyncio.start_server(_echo, sock=sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.ready_file is not None:
        ready = RelayReady(pid=os.getpid(), routes=addresses)
        tmp = config.ready_file.with_suffix(".tmp")
        tmp.write_text(ready.model_dump_json())
        tmp.replace(config.ready_file)
    log.info("relay up: %s; profile %s", addresses, config.profile.label())
    iface = config.watch_interface
    # Watched by its index, not its name alone: a relay orphaned by a killed `up` outlived
    # its namespace when the next `up` of the home made the same name again within a poll.
    index = _ifindex(iface) if iface is not None else None
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if iface is not None and _ifindex(iface) != index:
                log.warning("interface %s is gone: the relay exits", iface)
                break
    finally:
        if echo_server is not None:
            echo_server.close()
        await relay.close()


def _ifindex(iface: str) -> int | None:
    """The kernel's index of host interface ``iface`` (``None``: there is none)."""
    try:
        return int(Path(f"/sys/class/net/{iface}/ifindex").read_text())
    except (OSError, ValueError):
        return None


def spawn_relay(
    config: RelayConfig, folder: Path, log_file: Path, timeout_s: float = 15.0
) -> RelayReady:
    """Start a relay process in a process group of its own; return once it listens.

    Writes the config to ``folder/relay.json``; the relay writes ``folder/relay-ready.json``.

    Raises:
        RelayFailed: It exited or did not listen within ``timeout_s`` (it is then killed).
    """
    folder.mkdir(parents=True, exist_ok=True)
    ready_file = folder / "relay-ready.json"
    ready_file.unlink(missing_ok=True)
    config = config.model_copy(update={"ready_file": ready_file})
    config_file = folder / "relay.json"
    config_file.write_text(config.model_dump_json(indent=2))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fogshift.network.relay", str(config_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ready_or_exited() -> RelayReady | bool:
        if ready_file.exists():
            return RelayReady.model_validate_json(ready_file.read_text())
        return proc.poll() is not None  # it exited: no use waiting on

    with contextlib.suppress(WaitTimedOut):
        ready = wait_until(ready_or_exited, timeout_s, describe=f"the relay in {folder}")
        if isinstance(ready, RelayReady):
            return ready
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    tail = log_file.read_text(errors="replace").strip().splitlines()[-3:]
    raise RelayFailed(
        f"the link relay for {config.watch_interface or folder.name} did not start "
        f"within {timeout_s:.0f} s",
        received="; ".join(tail) or f"exit code {proc.returncode}",
        hint=f"see {log_file}",
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m fogshift.network.relay CONFIG.json``: run one relay process."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m fogshift.network.relay CONFIG.json\n")
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = RelayConfig.model_validate_json(Path(args[0]).read_text())
    keep_logs(config.log_max_bytes)  # (`spawn_relay` appends its output to the node's relay log)
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
