"""Measuring the round-trip time a node's link actually gives.

Each isolated node's relay opens a TCP echo server inside the node's namespace and a
loopback route to it (``echo``), so a round trip measured here crosses exactly what the
node's traffic crosses: the relay's delay in both directions, the veth pair and its
``tbf`` shaping. Small messages over one connection measure latency, not the connection
set-up or the bandwidth.
"""

from __future__ import annotations

import socket
import statistics
import time

from pydantic import BaseModel, ConfigDict

from fogshift.exceptions import InvalidInput
from fogshift.network.exceptions import LinkDown


class RttReport(BaseModel):
    """Round trips through a link, in milliseconds.

    Attributes:
        median_ms: The median round trip: what a benchmark should report.
        min_ms: The fastest.
        max_ms: The slowest.
        samples_ms: Every round trip, in order.
    """

    model_config = ConfigDict(frozen=True)

    median_ms: float
    min_ms: float
    max_ms: float
    samples_ms: list[float]


def measure_rtt(
    host: str,
    port: int,
    samples: int = 5,
    timeout_s: float = 5.0,
    payload_bytes: int = 32,
    what: str = "the link",
) -> RttReport:
    """Time ``samples`` echo round trips of ``payload_bytes`` through ``host:port``.

    One unmeasured round trip comes first: it includes the relay's connection to the far
    end, which is not part of the link's latency.

    Args:
        host: The echo route's address (the relay's loopback end).
        port: Its port.
        samples: How many round trips to time (at least 1).
        timeout_s: Longest wait for one round trip (and for connecting).
        payload_bytes: Size of each message.
        what: How errors name the link (``"the link of node 'fog-a'"``).

    Raises:
        InvalidInput: ``samples`` or ``payload_bytes`` below 1.
        LinkDown: No echo came back within ``timeout_s`` (partitioned link, relay gone).
    """
    if samples < 1 or payload_bytes < 1:
        raise InvalidInput(
            f"cannot measure the round trip through {what}",
            expected="at least 1 sample of at least 1 byte",
            received=f"{samples} samples of {payload_bytes} bytes",
            hint="ask for 1 sample or more, of 1 byte or more",
        )
    payload = (bytes(range(256)) * (payload_bytes // 256 + 1))[:payload_bytes]
    times: list[float] = []
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for round_trip in range(samples + 1):
                started = time.perf_counter()
                sock.sendall(payload)
                received = b""
                while len(received) < len(payload):
                    chunk = sock.recv(len(payload) - len(received))
                    if not chunk:
                        raise ConnectionResetError("the echo connection was closed")
                    received += chunk
                if received != payload:
                    raise ConnectionError("the echo came back altered")
                if round_trip > 0:
                    times.append((time.perf_counter() - started) * 1000)
    except OSError as exc:  # refused, reset, timed out
        raise LinkDown(
            f"no echo through {what} at {host}:{port}: {type(exc).__name__}: {exc}",
            hint="is it partitioned (`fogshift net show`)? `fogshift net heal NODE` restores it",
        ) from exc
    return RttReport(
        median_ms=round(statistics.median(times), 3),
        min_ms=round(min(times), 3),
        max_ms=round(max(times), 3),
        samples_ms=[round(t, 3) for t in times],
    )
