"""The orchestrator's REST app in-process, with a broker address that is never dialled, and
stand-in node agents."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from fogshift.orchestrator.app import create_app
from tests.orchestrator.standin import StandIn, offline_config, standins

#: The operator token of :func:`app`.
OPERATOR = "operator-token-" + "o" * 32


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FastAPI]:
    config = offline_config(tmp_path, token=OPERATOR)
    app = create_app(config)
    yield app
    app.state.orchestrator.close()


@pytest.fixture
def agents() -> Iterator[dict[str, StandIn]]:
    """Stand-in agents of cloud, fog-a and fog-b (``standin``)."""
    with standins("cloud", "fog-a", "fog-b") as agents:
        yield agents
