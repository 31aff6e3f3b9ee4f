"""A real HTTP server standing in for a node agent, for in-process orchestrator tests.

It records every request and answers each from a table set by the test (default: HTTP 200
with ``{}``), so a test drives a real :class:`~fogshift.orchestrator.service.Orchestrator`
through the agent behaviour it needs (a refused install, an unreachable node, a PE held at
its gate) without Spark.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fogshift.broker.client import BrokerAddress
from fogshift.orchestrator.config import OrchestratorConfig


#: A Case 1 pipeline: source on cloud, aggregate on fog-a, sink on cloud.
def offline_config(home: Path, token: str = "t" * 16, **settings: Any) -> OrchestratorConfig:
    """An orchestrator's configuration in ``home`` whose broker address is never dialled
    (the test stands in for the broker, or needs none); ``settings`` as the config takes
    them."""
    broker = BrokerAddress("nats://127.0.0.1:9").save(home / "broker.json")
    return OrchestratorConfig(home=home, port=1, token=token, broker_file=broker, **settings)


SPEC = {
    "pipeline": "p",
    "elements": [
        {"id": "source", "kind": "csv-source", "node": "cloud", "options": {"path": "in.csv"}},
        {"id": "aggregate", "kind": "window-aggregate", "node": "fog-a", "inputs": ["source"],
         "options": {"field": "value", "window": 3, "function": "avg"}},
        {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["aggregate"],
         "options": {"path": "out/o.csv"}},
    ],
}  # fmt: skip


@dataclass(frozen=True)
class Call:
    """One request the stand-in received."""

    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class Answer:
    """What the stand-in sends for one ``(method, path)``."""

    status: int = 200
    body: Any = field(default_factory=dict)
    content: bytes | None = None  # raw bytes instead of ``body`` as JSON
    headers: dict[str, str] = field(default_factory=dict)


class StandIn:
    """The agent of one node: ``url`` to put in its heartbeats, ``calls`` it received."""

    def __init__(self, name: str, everywhere: list[tuple[str, Call]] | None = None) -> None:
        self.name = name
        self.calls: list[Call] = []
        #: Shared by the stand-ins of one test: every call on any of them, in order.
        self.everywhere = everywhere if everywhere is not None else []
        self.answers: dict[tuple[str, str], Answer] = {}
        #: ``(method, path)`` -> (set when such a call came, set to answer it): see :meth:`hold`.
        self.holds: dict[tuple[str, str], tuple[threading.Event, threading.Event]] = {}
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw  # a shipped checkpoint
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                call = Call(self.command, parts.path, query, body)
                standin.calls.append(call)
                standin.everywhere.append((standin.name, call))
                held = standin.holds.get((self.command, parts.path))
                if held is not None:  # answered once the test releases it
                    held[0].set()
                    held[1].wait(60)
                answer = standin.answers.get((self.command, parts.path), Answer())
                data = answer.content
                if data is None:
                    data = json.dumps(answer.body).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = _serve  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def answer(
        self, method: str, path: str, status: int = 200, body: Any = None, **kw: Any
    ) -> None:
        """Answer ``method path`` with ``status`` and ``body`` (JSON) from now on."""
        self.answers[(method, path)] = Answer(status, {} if body is None else body, **kw)

    def hold(self, method: str, path: str) -> tuple[threading.Event, threading.Event]:
        """Hold the answers to ``method path``: the first event is set when such a call
        came, and it is answered once the test sets the second."""
        events = (threading.Event(), threading.Event())
        self.holds[(method, path)] = events
        return events

    def fail(self, method: str, path: str, status: int = 503) -> None:
        """Answer ``method path`` with a fogshift error (``unavailable`` by default)."""
        self.answer(method, path, status, {"code": "unavailable", "message": f"{self.name} fails"})

    def received(self, method: str, path: str) -> list[Call]:
        """The calls of ``method`` on ``path``, in order."""
        return [c for c in self.calls if (c.method, c.path) == (method, path)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def standins(*names: str) -> Iterator[dict[str, StandIn]]:
    """Stand-in agents for ``names``, stopped afterwards."""
    everywhere: list[tuple[str, Call]] = []
    agents = {name: StandIn(name, everywhere) for name in names}
    try:
        yield agents
    finally:
        for agent in agents.values():
            agent.close()


def dead_url() -> str:
    """The URL of a port nothing listens on (an unreachable node)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_port
    server.server_close()
    return f"http://127.0.0.1:{port}"
