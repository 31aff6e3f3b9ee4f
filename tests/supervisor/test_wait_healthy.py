"""`wait_healthy` after a node's restart: the dead agent's last heartbeat does not count.

The orchestrator is a stand-in HTTP server that answers ``GET /nodes`` from a script: the
killed agent's report (still fresh: "healthy"), then the new agent's while its Spark session
starts, then the new agent ready.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fogshift.supervisor.cluster import ClusterFile, ProcessInfo, wait_healthy
from tests.conftest import answer_json

OLD_PID, NEW_PID = 1111, 2222


def _view(pid: int, ready: bool) -> dict[str, object]:
    return {
        "name": "fog-a", "url": "http://127.0.0.1:1", "pid": pid, "pgid": pid,
        "healthy": ready, "alive": True, "ready": ready, "error": None, "last_seen_s": 0.1,
        "cpu_percent": None, "replicas": [], "elements": [], "checkpoints": [],
    }  # fmt: skip


class Script:
    """The answers, in order; the last one repeats. ``served`` counts the requests."""

    def __init__(self, answers: list[dict[str, object]]) -> None:
        self.answers = answers
        self.served = 0
        self.lock = threading.Lock()

    def next(self) -> dict[str, object]:
        with self.lock:
            answer = self.answers[min(self.served, len(self.answers) - 1)]
            self.served += 1
            return answer


@pytest.fixture()
def orchestrator(tmp_path: Path) -> Iterator[tuple[Path, Script]]:
    script = Script(
        [_view(OLD_PID, True)] * 3 + [_view(NEW_PID, False)] * 2 + [_view(NEW_PID, True)]
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer_json(self, [script.next()])

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    home = tmp_path / "home"
    home.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    cluster = ClusterFile(
        orchestrator=ProcessInfo(pid=1, pgid=1, url=url), broker=None, nodes={},
        broker_url="nats://127.0.0.1:1",
    )  # fmt: skip
    (home / "cluster.json").write_text(cluster.model_dump_json())
    (home / "token").write_text("t" * 32)
    try:
        yield home, script
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def test_a_restarted_node_counts_only_once_its_new_agent_is_ready(
    orchestrator: tuple[Path, Script],
) -> None:
    home, script = orchestrator
    views = wait_healthy(home, ["fog-a"], 30, lambda _: None, {"fog-a": NEW_PID})
    assert [(v.pid, v.ready) for v in views] == [(NEW_PID, True)]
    assert script.served == 6  # three stale answers and two not ready were waited out


def test_without_pids_a_fresh_report_of_any_process_counts(
    orchestrator: tuple[Path, Script],
) -> None:
    home, script = orchestrator
    views = wait_healthy(home, ["fog-a"], 30, lambda _: None)
    assert [(v.pid, v.ready) for v in views] == [(OLD_PID, True)] and script.served == 1
