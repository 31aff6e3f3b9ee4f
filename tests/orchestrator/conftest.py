"""The orchestrator's REST app in-process, with a broker address that is never dialled, and
stand-in node agents."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from fogshift.broker.client import BrokerAddress
from fogshift.orchestrator.app import create_app
from fogshift.orchestrator.config import OrchestratorConfig
from tests.orchestrator.standin import StandIn, standins

#: The operator token of :func:`app`.
OPERATOR = "operator-token-" + "o" * 32


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FastAPI]:
    broker = BrokerAddress("nats://127.0.0.1:9").save(tmp_path / "broker.json")  # never used
    config = OrchestratorConfig(home=tmp_path, port=1, token=OPERATOR, broker_file=broker)
    app = create_app(config)
    yield app
    app.state.orchestrator.close()


@pytest.fixture
def agents() -> Iterator[dict[str, StandIn]]:
    """Stand-in agents of cloud, fog-a and fog-b (``standin``)."""
    with standins("cloud", "fog-a", "fog-b") as agents:
        yield agents
