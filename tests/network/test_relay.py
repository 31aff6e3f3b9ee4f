"""The delaying relay, with real sockets on loopback: bytes, order, delay, half-close, errors.

Only lower bounds on time are asserted: the machine is shared and loaded, so anything may
take longer, but nothing may arrive before the relay releases it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fogshift.network.exceptions import LinkDown
from fogshift.network.links import LinkProfile, parse_link_profile
from fogshift.network.relay import Route, ThreadedRelay
from fogshift.network.rtt import measure_rtt


class Server:
    """A loopback TCP server running ``handle(conn)`` on a thread per connection."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.handle = handle
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(ConnectionResetError):  # a test's client may reset
            self.handle(conn)

    def close(self) -> None:
        self.sock.close()


def echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = sock.recv(min(65536, size - len(out)))
        assert chunk, f"connection closed after {len(out)} of {size} bytes"
        out += chunk
    return bytes(out)


@pytest.fixture()
def echo_server() -> Iterator[Server]:
    server = Server(echo)
    yield server
    server.close()


def relay_to(port: int, profile: LinkProfile, seed: int = 1) -> ThreadedRelay:
    route = Route(name="test", listen_host="127.0.0.1", target_host="127.0.0.1", target_port=port)
    return ThreadedRelay(profile, [route], seed=seed)


def connect(relay: ThreadedRelay) -> socket.socket:
    sock = socket.create_connection(relay.addresses["test"], timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@pytest.mark.parametrize("profile", ["n0", "normal:5:3"])
def test_bytes_pass_unchanged_both_ways(echo_server: Server, profile: str) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)
    with relay_to(echo_server.port, parse_link_profile(profile)) as relay, connect(relay) as sock:
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(recv_exactly(sock, len(payload))))
        reader.start()
        sock.sendall(payload)
        reader.join(120)
    assert received and received[0] == payload


def test_server_data_and_end_of_stream_reach_the_client() -> None:
    blob = os.urandom(1024 * 1024)

    def send_and_close(conn: socket.socket) -> None:
        conn.sendall(blob)

    server = Server(send_and_close)
    try:
        profile = parse_link_profile("normal:3:2")
        with relay_to(server.port, profile) as relay, connect(relay) as sock:
            data = bytearray()
            while chunk := sock.recv(65536):
                data += chunk
    finally:
        server.close()
    assert bytes(data) == blob  # the EOF came after every byte, not before


def test_half_close_lets_the_reply_come_back() -> None:
    def reply_after_eof(conn: socket.socket) -> None:
        request = bytearray()
        while chunk := conn.recv(4096):
            request += chunk
        conn.sendall(b"got " + bytes(request))

    server = Server(reply_after_eof)
    try:
        with relay_to(server.port, parse_link_profile("n0")) as relay, connect(relay) as sock:
            sock.sendall(b"question")
            sock.shutdown(socket.SHUT_WR)
            answer = bytearray()
            while chunk := sock.recv(4096):
                answer += chunk
    finally:
        server.close()
    assert bytes(answer) == b"got question"


def test_order_is_kept_although_each_chunk_draws_its_own_delay(echo_server: Server) -> None:
    # A deviation as large as the mean: in a relay without the ordering rule, about half
    # the chunks would overtake their predecessor.
    messages = [f"<{i:05d}>".encode() for i in range(300)]
    expected = b"".join(messages)
    profile = parse_link_profile("normal:15:15")
    with relay_to(echo_server.port, profile, seed=3) as relay, connect(relay) as sock:
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(recv_exactly(sock, len(expected))))
        reader.start()
        for message in messages:
            sock.sendall(message)
            time.sleep(0.002)  # separate writes: separate chunks, separate delays
        reader.join(120)
    assert received and received[0] == expected


def test_round_trip_gains_about_twice_the_mean_delay(echo_server: Server) -> None:
    direct = measure_rtt("127.0.0.1", echo_server.port, samples=5)
    with relay_to(echo_server.port, parse_link_profile("n100")) as relay:
        host, port = relay.addresses["test"]
        delayed = measure_rtt(host, port, samples=7)
    # 2 x 100 ms one way, minus a generous margin for the ±10 ms draws; no upper bound.
    assert delayed.median_ms >= 2 * 100 - 40, delayed
    assert delayed.min_ms >= 2 * 100 - 60, delayed
    assert delayed.median_ms > direct.median_ms + 150, (direct, delayed)


def test_an_unreachable_target_resets_the_client_and_rtt_says_link_down() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = int(closed.getsockname()[1])  # nothing listens once closed
    with relay_to(dead_port, parse_link_profile("n0")) as relay:
        host, port = relay.addresses["test"]
        with pytest.raises(LinkDown) as caught:
            measure_rtt(host, port, samples=1, timeout_s=10, what="the test link")
    assert "no echo through the test link" in caught.value.render()
    assert caught.value.hint and "heal" in caught.value.hint


def test_a_reset_by_the_server_reaches_the_client() -> None:
    def reset(conn: socket.socket) -> None:
        conn.recv(10)
        # SO_LINGER 0: close() sends a RST instead of a FIN.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    server = Server(reset)
    try:
        with relay_to(server.port, parse_link_profile("n0")) as relay, connect(relay) as sock:
            sock.sendall(b"hello")
            with pytest.raises(ConnectionResetError):
                while sock.recv(4096):
                    pass
    finally:
        server.close()


def test_closing_the_relay_frees_its_port_and_drops_connections(echo_server: Server) -> None:
    relay = relay_to(echo_server.port, parse_link_profile("n0")).start()
    sock = connect(relay)
    sock.sendall(b"ping")
    assert recv_exactly(sock, 4) == b"ping"
    relay.close()
    with sock:
        sock.settimeout(10)
        try:
            gone = sock.recv(10) == b""  # closed: EOF ...
        except ConnectionResetError:
            gone = True  # ... or reset: either way the connection is gone
    assert gone
    with pytest.raises(OSError):
        socket.create_connection(relay.addresses["test"], timeout=5)


def test_closing_the_relay_drops_a_connection_still_reaching_its_target() -> None:
    # Cancelled while it connected (a SYN the far end dropped), the client's connection was
    # left open: Python 3.12's Server.wait_closed() waited for it for good (a relay's
    # SIGTERM never ended). The target here accepts nothing: its backlog is full.
    with contextlib.ExitStack() as stack:
        full = stack.enter_context(socket.socket())
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        for _ in range(4):  # (SYNs beyond the backlog are dropped: connects hang)
            waiting = stack.enter_context(socket.socket())
            waiting.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                waiting.connect(full.getsockname())
        relay = relay_to(int(full.getsockname()[1]), parse_link_profile("n0")).start()
        sock = stack.enter_context(connect(relay))
        sock.sendall(b"ping")
        deadline = time.monotonic() + 10
        while not relay._relay._connections and time.monotonic() < deadline:
            time.sleep(0.01)  # (accepted, and connecting on)
        assert relay._relay._connections
        relay.close()
        sock.settimeout(5)
        try:
            gone = sock.recv(10) == b""
        except ConnectionResetError:
            gone = True
        assert gone


def test_a_limited_links_relay_holds_about_what_the_link_carries_in_its_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16 MiB queued in front of a 1 Mbit/s tbf: the sender saw no backpressure for 134 s.
    from types import SimpleNamespace

    from fogshift.broker.client import BrokerAddress
    from fogshift.network.links import LinkProfile
    from fogshift.network.links import parse_link_profile as parse_profile
    from fogshift.network.relay import BUFFER_BYTES, MIN_BUFFER_BYTES, buffer_bytes_for
    from fogshift.supervisor import cluster as cluster_ops

    assert buffer_bytes_for(LinkProfile()) == BUFFER_BYTES  # the delay alone is the link
    # 1 Mbit/s for 0.1 s; below a few frames, those (256 KiB before: 2.1 s of queue).
    assert buffer_bytes_for(parse_profile("1mbit")) == int(1_000_000 / 8 * 0.1)
    assert buffer_bytes_for(parse_profile("8kbit")) == MIN_BUFFER_BYTES
    n500 = parse_profile("10mbit,n500")  # 500 ± 50 ms: 1.25 MB/s for 0.75 s
    assert buffer_bytes_for(n500) == int(10_000_000 / 8 * 0.75)
    made: list[object] = []

    class Spawned(Exception):
        pass

    def spawn_relay(config: object, *args: object) -> None:
        made.append(config)
        raise Spawned

    monkeypatch.setattr(cluster_ops, "spawn_relay", spawn_relay)
    link = SimpleNamespace(node="fog-a", profile=parse_profile("1mbit"), host_ip="10.1.0.1",
                           ns_ip="10.1.0.2", namespace="fsx", host_if="fsx0h")  # fmt: skip
    broker = BrokerAddress("nats://127.0.0.1:4222")
    with pytest.raises(Spawned):
        cluster_ops.start_isolated_node(tmp_path, link, "http://127.0.0.1:1", broker)  # type: ignore[arg-type]
    assert [c.buffer_bytes for c in made] == [int(1_000_000 / 8 * 0.1)]  # type: ignore[attr-defined]
