"""The orchestrator's clients of its node agents: one per agent process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fogshift.contracts import Heartbeat
from fogshift.orchestrator import core, registry
from fogshift.orchestrator.service import Orchestrator
from tests.orchestrator.standin import offline_config


def test_a_restarted_agent_gets_a_new_client_with_no_pooled_connection(tmp_path: Path) -> None:
    config = offline_config(tmp_path)
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


def test_a_request_to_an_agent_is_given_up_once_its_node_has_gone_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration onto a node whose agent was just stopped (SIGSTOP) printed nothing for
    minutes: each request waited the client's whole timeout before the rollback."""
    config = offline_config(tmp_path)
    orch = Orchestrator(config)
    try:
        orch.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:9", pid=1, ready=True))
        client = orch.agent("fog-a")
        assert client._silent is not None and client._silent() is None
        # Counted by this process's clock: a wall-clock step changes nothing.
        monkeypatch.setattr(core.time, "time", lambda: 1e12)
        assert client._silent() is None
        later = time.monotonic() + config.call_silence_s + 1
        monkeypatch.setattr(core.time, "monotonic", lambda: later)
        reason = client._silent()
        quiet = f"node 'fog-a' has sent no heartbeat for {config.call_silence_s + 1:.1f} s"
        assert reason is not None and quiet in reason
    finally:
        orch.close()
    # A new orchestrator process: the registry's last_seen is an earlier process's (an hour
    # old, it was down that long); a node is silent only once this one has waited for it.
    monkeypatch.undo()
    past = time.time() - 3600
    monkeypatch.setattr(registry.time, "time", lambda: past)
    again = Orchestrator(config)
    try:
        again.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:9", pid=1, ready=True))
        again.close()
        again = Orchestrator(config)  # (started now, the node's last_seen an hour old)
        assert again.agent("fog-a")._silent is not None
        assert again.agent("fog-a")._silent() is None  # type: ignore[misc]
    finally:
        again.close()
