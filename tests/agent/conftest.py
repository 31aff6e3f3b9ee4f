"""Fixtures of the node agent's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from fogshift.agent.config import AgentConfig
from fogshift.agent.node import NodeRuntime


@pytest.fixture
def runtime(tmp_path: Path) -> NodeRuntime:
    """A node agent's runtime of node ``n1`` in ``tmp_path``, with no Spark session (its
    ``spark`` is a placeholder: the tests fake what would call it)."""
    config = AgentConfig(
        name="n1",
        port=9999,
        home=tmp_path,
        token="t" * 32,
        orchestrator_url="http://127.0.0.1:1",
        broker_file=tmp_path / "broker.json",
    )
    rt = NodeRuntime(config)
    rt.spark = object()  # type: ignore[assignment]  # never called: start_query is faked
    return rt
