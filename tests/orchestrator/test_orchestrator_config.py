"""The orchestrator's settings: given > ``FOGSHIFT_*`` > the default its config class writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fogshift.broker.client import DUPLICATE_WINDOW_S
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.supervisor import cluster as cluster_ops


def required(tmp_path: Path) -> dict[str, Any]:
    return {"home": tmp_path, "port": 1, "token": "t" * 16, "broker_file": tmp_path / "b.json"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OrchestratorConfig.model_fields:
        monkeypatch.delenv(f"FOGSHIFT_{name.upper()}", raising=False)


def test_settings_not_given_are_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert OrchestratorConfig(**required(tmp_path)).test_pause_at is None
    monkeypatch.setenv("FOGSHIFT_PLAN_INTERVAL_S", "30")
    monkeypatch.setenv("FOGSHIFT_TEST_PAUSE_AT", "migration:switching")
    config = OrchestratorConfig(**required(tmp_path))
    assert (config.plan_interval_s, config.test_pause_at) == (30.0, "migration:switching")
    assert OrchestratorConfig(**required(tmp_path), plan_interval_s=3).plan_interval_s == 3
    # The test hook's variable set empty (as a test that clears it may) is no hook.
    monkeypatch.setenv("FOGSHIFT_TEST_PAUSE_AT", "")
    assert OrchestratorConfig(**required(tmp_path)).test_pause_at is None
    monkeypatch.setenv("FOGSHIFT_TEST_PAUSE_AT", "sometime")
    with pytest.raises(ValidationError, match="test_pause_at"):
        OrchestratorConfig(**required(tmp_path))


def test_frozen_and_each_default_written_once(tmp_path: Path) -> None:
    config = OrchestratorConfig(**required(tmp_path))
    with pytest.raises(ValidationError, match="frozen"):
        config.plan_interval_s = 1  # type: ignore[misc]
    # The de-duplication window is the broker client's default, not a second copy of it.
    assert OrchestratorConfig.default("duplicate_window_s") == DUPLICATE_WINDOW_S
    assert config.duplicate_window_s == DUPLICATE_WINDOW_S
    for field in ("central_interval_s", "plan_interval_s", "reconcile_s", "node_timeout_s"):
        assert OrchestratorConfig.default(field) == getattr(config, field)


def test_up_passes_only_the_intervals_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[list[str]] = []

    def spawn(args: list[str], log: Path) -> cluster_ops.ProcessInfo:
        spawned.append(args)
        return cluster_ops.ProcessInfo(pid=1, pgid=1)

    monkeypatch.setattr(cluster_ops, "_spawn", spawn)
    cluster_ops.start_orchestrator(tmp_path, "127.0.0.1", 1, None, None, 7.0)
    cluster_ops.start_orchestrator(tmp_path, "127.0.0.1", 1, None, None, None)
    assert spawned[0][-2:] == ["--plan-interval", "7.0"]
    assert not {"--central-interval", "--duplicate-window"} & set(spawned[0])
    assert not {"--central-interval", "--duplicate-window", "--plan-interval"} & set(spawned[1])


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FOGSHIFT_RECONCILE_S", "1e300"),
        ("FOGSHIFT_RECONCILE_S", "inf"),
        ("FOGSHIFT_PLAN_INTERVAL_S", "nan"),
        ("FOGSHIFT_CENTRAL_INTERVAL_S", "1e12"),
        ("FOGSHIFT_STANDBY_FOLLOW_S", "inf"),
        ("FOGSHIFT_STALL_SLACK_S", "inf"),
        ("FOGSHIFT_HEARTBEAT_S", "inf"),
    ],
)
def test_a_period_no_wait_can_take_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    # The reconciler's wait on 1e300 s raised OverflowError outside its loop's guard: the
    # thread ended, and nothing was ever restored again.
    from fogshift.agent.config import AgentConfig
    from fogshift.common.settings import check_environment
    from fogshift.exceptions import InvalidInput

    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidInput) as refused:
        check_environment(OrchestratorConfig)
        check_environment(AgentConfig)
    assert variable in refused.value.message and refused.value.expected


def test_calls_are_not_given_up_before_their_node_counts_as_silent(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"call_silence_s \(3\) must be at least"):
        OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=tmp_path / "b",
                           call_silence_s=3)  # fmt: skip
