"""Starting nats-server: a start cut short leaves no server behind (a real nats-server)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker import server as server_module
from fogshift.broker.server import start_nats_server


def test_a_start_ended_by_a_signal_stops_the_server_it_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `up` ended by SIGTERM or Ctrl-C while the broker started left it running, recorded
    # nowhere: the next `up` started a second one on the same store beside it.
    begun: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = popen(*args, **kwargs)
        begun.append(proc)
        return proc

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(server_module.subprocess, "Popen", recorded)
    monkeypatch.setattr(server_module, "wait_until", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start_nats_server(tmp_path)
    (proc,) = begun
    try:
        assert proc.wait(timeout=10) is not None  # (killed: it ends)
    finally:
        proc.kill()  # (if not: none left behind by this test)
        proc.wait()
