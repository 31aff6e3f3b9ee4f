"""Ports handed to a child to bind (fogshift.broker.server.free_port): outside the range the
kernel gives out by itself, so no process binding port 0 meanwhile can take one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fogshift.broker import server


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = server._ephemeral_low()
    ports = {server.free_port() for _ in range(20)}
    assert all(max(1024, low - server.PORTS_BELOW_EPHEMERAL) <= p < low for p in ports), ports
    assert len(ports) > 1  # drawn, not one fixed port
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    # The draw first names a port something listens on (twice), then a free one.
    with socket.socket() as taken, socket.socket() as probe:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
        probe.close()  # (free again)
        draws = iter([busy, busy, free])

        class Draw:
            def randrange(self, start: int, stop: int) -> int:
                return next(draws)

        monkeypatch.setattr(server, "_draws", Draw())
        assert server.free_port() == free


def test_without_room_below_the_range_the_kernel_chooses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ranges = tmp_path / "range"
    ranges.write_text("1024\t65535\n")
    monkeypatch.setattr(server, "EPHEMERAL_RANGE_FILE", ranges)
    assert 1024 <= server.free_port() <= 65535
    # An unreadable range file counts as Linux's default.
    monkeypatch.setattr(server, "EPHEMERAL_RANGE_FILE", tmp_path / "absent")
    assert server._ephemeral_low() == 32768
