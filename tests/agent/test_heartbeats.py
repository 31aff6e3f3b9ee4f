"""What a node's heartbeats tell the orchestrator about its checkpoints and its disk: the real
heartbeat loop, posting to a stand-in orchestrator (a real HTTP server)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fogshift.agent.app import RemovedNodes, heartbeat_loop
from fogshift.agent.config import AgentConfig
from fogshift.agent.node import NodeRuntime
from fogshift.agent.replicas import Replicas
from fogshift.contracts import Heartbeat
from tests.agent.test_agent_hostile import config, home  # noqa: F401
from tests.conftest import answer_json


@pytest.fixture
def orchestrator() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    beats: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            beats.append(json.loads(self.rfile.read(length)))
            answer_json(self, {"ok": True})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", beats
    server.shutdown()
    server.server_close()


def _beats(folder: Path, url: str, beats: list[dict[str, Any]], prepare: Any) -> Heartbeat:
    """Run the heartbeat loop until it has sent one heartbeat; that heartbeat."""
    agent = config(folder, orchestrator_url=url).model_copy(update={"heartbeat_s": 0.05})
    runtime = NodeRuntime(agent)
    prepare(runtime)  # e.g. its first round of snapshots
    stop = threading.Event()
    loop = threading.Thread(
        target=heartbeat_loop,
        args=(agent, runtime, Replicas(agent, runtime), stop, RemovedNodes()),
    )
    loop.start()
    try:
        for _ in range(200):
            if beats:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        loop.join(timeout=10)
    assert beats, "no heartbeat in 10 s"
    return Heartbeat.model_validate(beats[0])


def test_a_heartbeat_says_the_checkpoint_interval_the_last_round_and_the_disk(
    home: Path,  # noqa: F811
    orchestrator: tuple[str, list[dict[str, Any]]],
) -> None:
    url, beats = orchestrator
    beat = _beats(home, url, beats, lambda runtime: runtime.snapshot_all())
    assert beat.checkpoint_interval_s == AgentConfig.default("checkpoint_interval_s")
    assert beat.snapshots_age_s is not None and 0 <= beat.snapshots_age_s < 10
    usage = shutil.disk_usage(home)
    assert beat.disk_total_bytes == usage.total
    assert beat.disk_free_bytes is not None and 0 < beat.disk_free_bytes <= usage.total
    # Before the node's first round of snapshots, it says there was none.
    beats.clear()
    assert _beats(home, url, beats, lambda runtime: None).snapshots_age_s is None
