"""The orchestrator's clients of its node agents: one per agent process."""

from __future__ import annotations

from pathlib import Path

from fogshift.broker.client import BrokerAddress
from fogshift.contracts import Heartbeat
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.service import Orchestrator


def test_a_restarted_agent_gets_a_new_client_with_no_pooled_connection(tmp_path: Path) -> None:
    broker = BrokerAddress("nats://127.0.0.1:9").save(tmp_path / "broker.json")  # never used
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orch = Orchestrator(config)
    try:

        def beat(pid: int) -> None:
            report = {"url": "http://127.0.0.1:9", "pid": pid, "ready": True}
            orch.heartbeat("fog-a", Heartbeat.model_validate(report))

        beat(100)
        first = orch.agent("fog-a")
        beat(100)
        assert orch.agent("fog-a") is first  # the same process: its connections are reused
        beat(200)  # killed and started again, on the same address
        second = orch.agent("fog-a")
        assert second is not first and second.url == first.url
        assert first._client.is_closed
    finally:
        orch.close()
