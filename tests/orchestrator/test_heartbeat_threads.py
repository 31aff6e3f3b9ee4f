"""A node's heartbeat reaches the orchestrator however busy its other requests keep it.

The orchestrator's real FastAPI app in process (FastAPI's TestClient on one event loop of
the test's, no lifespan: no background loops)."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio.to_thread
import pytest
from anyio.from_thread import start_blocking_portal
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fogshift.common.http import node_token
from fogshift.orchestrator.service import Orchestrator
from tests.orchestrator.conftest import OPERATOR
from tests.orchestrator.test_orchestrator_access import as_, beat

#: The shared pool's size in this test (the server's is 40): every thread of it is taken.
POOL = 2


def test_a_heartbeat_is_not_queued_behind_a_full_pool_of_long_requests(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long requests (migrations, reads waiting on a node) filling the server's threads held a
    heartbeat back, and with no heartbeat for ``call_silence_s`` every call to that node's
    agent is given up: the node would look dead because the orchestrator was busy."""
    orchestrator: Orchestrator = app.state.orchestrator
    release = threading.Event()
    inside = threading.Semaphore(0)

    def held(name: str | None = None) -> list[Any]:
        inside.release()
        release.wait(60)
        return []

    monkeypatch.setattr(orchestrator, "status", held)

    async def shrink() -> None:
        anyio.to_thread.current_default_thread_limiter().total_tokens = POOL

    with start_blocking_portal() as portal:
        operator, node = as_(app, OPERATOR), as_(app, node_token(OPERATOR, "fog-a"))
        for client in (operator, node):
            client.portal = portal  # one event loop, as a server has: one shared pool
        portal.call(shrink)
        long = [threading.Thread(target=operator.get, args=("/pipelines",)) for _ in range(POOL)]
        for thread in long:
            thread.start()
        try:
            for _ in range(POOL):
                assert inside.acquire(timeout=30), "the long requests never started"
            answers: list[int] = []
            # As if the orchestrator had run longer than the silence bound unheard from
            # fog-a: its calls to the node are given up until a heartbeat comes in.
            orchestrator._beats_since -= 2 * orchestrator.config.call_silence_s
            assert orchestrator._silence("fog-a") is not None
            sent = time.monotonic()

            def send() -> None:
                answers.append(node.post("/nodes/fog-a/heartbeat", json=beat()).status_code)

            beating = threading.Thread(target=send)
            beating.start()
            beating.join(30)
            assert answers == [200], "the heartbeat waited for the pool's threads"
            assert orchestrator.registry.node("fog-a") is not None
            assert orchestrator._beats["fog-a"] >= sent
            assert orchestrator._silence("fog-a") is None
            # The long requests are still waiting: the heartbeat used no thread of theirs.
            assert all(thread.is_alive() for thread in long)
        finally:
            release.set()
            for thread in long:
                thread.join(30)
        # And the pool is the server's again once they end.
        assert operator.get("/pipelines").status_code == 200


def test_a_heartbeat_is_heard_before_it_is_recorded(app: FastAPI) -> None:
    """The arrival is what the silence bound goes by: a heartbeat whose registry write is
    slow (a busy disk) has been heard while it waits."""
    orchestrator: Orchestrator = app.state.orchestrator
    heard_before: list[bool] = []
    record = orchestrator.registry.heartbeat

    def slow(name: str, report: Any, generation: int | None) -> None:
        heard_before.append(name in orchestrator._beats)
        assert generation == 0  # (fog-b's token's, checked again in the write)
        record(name, report, generation)

    orchestrator.registry.heartbeat = slow  # type: ignore[method-assign]
    node: TestClient = as_(app, node_token(OPERATOR, "fog-b"))
    assert node.post("/nodes/fog-b/heartbeat", json=beat()).status_code == 200
    assert heard_before == [True]
    assert orchestrator.registry.node("fog-b") is not None
