"""The agent's settings: given > ``FOGSHIFT_*`` > the default its config class writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import ValidationError
from typer.testing import CliRunner

from fogshift.agent.config import AgentConfig
from fogshift.cli.main import app
from fogshift.common.http import SERVER_KEEP_ALIVE_S
from fogshift.exceptions import InvalidInput
from fogshift.supervisor import cluster as cluster_ops


def required(tmp_path: Path) -> dict[str, Any]:
    return {
        "name": "fog-a",
        "port": 8000,
        "home": tmp_path,
        "token": "t" * 16,
        "orchestrator_url": "http://127.0.0.1:1",
        "broker_file": tmp_path / "broker.json",
    }


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The settings under test read the environment: start each test from none of them.
    for name in AgentConfig.model_fields:
        monkeypatch.delenv(f"FOGSHIFT_{name.upper()}", raising=False)


def test_a_setting_not_given_is_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert AgentConfig(**required(tmp_path)).checkpoint_interval_s == 5.0
    monkeypatch.setenv("FOGSHIFT_CHECKPOINT_INTERVAL_S", "2.5")
    monkeypatch.setenv("FOGSHIFT_SPARK_MASTER", "local[2]")
    config = AgentConfig(**required(tmp_path))
    assert (config.checkpoint_interval_s, config.spark_master) == (2.5, "local[2]")
    # A value given (the CLI's option) wins over the environment.
    assert AgentConfig(**required(tmp_path), checkpoint_interval_s=9).checkpoint_interval_s == 9
    # Only the prefixed name counts; an empty variable is no setting.
    monkeypatch.setenv("CHECKPOINT_INTERVAL_S", "1")
    monkeypatch.setenv("FOGSHIFT_TRIGGER_MS", "")
    config = AgentConfig(**required(tmp_path))
    assert (config.checkpoint_interval_s, config.trigger_ms) == (2.5, 200)
    # The warm-up query runs unless the environment turns it off.
    assert config.warm_up
    monkeypatch.setenv("FOGSHIFT_WARM_UP", "false")
    assert not AgentConfig(**required(tmp_path)).warm_up


def test_a_bad_value_in_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FOGSHIFT_TRIGGER_MS", "5")
    with pytest.raises(ValidationError, match="trigger_ms"):
        AgentConfig(**required(tmp_path))


def test_the_config_is_frozen_and_strict(tmp_path: Path) -> None:
    config = AgentConfig(**required(tmp_path))
    with pytest.raises(ValidationError, match="frozen"):
        config.trigger_ms = 100  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        AgentConfig(**required(tmp_path), trigger=100)


def test_each_default_is_written_once_in_the_config_class(tmp_path: Path) -> None:
    for field in ("checkpoint_interval_s", "trigger_ms", "spark_master", "heartbeat_s"):
        assert AgentConfig.default(field) == getattr(AgentConfig(**required(tmp_path)), field)
    # `up` passes a setting to the agent only when given; otherwise the agent's config
    # decides (its environment, else its default): no second copy of the number.
    args = cluster_ops._agent_args(
        tmp_path, "fog-a", "127.0.0.1", 1, "http://o", tmp_path / "b.json", None, None
    )
    assert not {"--checkpoint-interval", "--spark-master", "--trigger-ms"} & set(args)
    args = cluster_ops._agent_args(
        tmp_path, "fog-a", "127.0.0.1", 1, "http://o", tmp_path / "b.json", "local[1]", 2.0,
        trigger_ms=1000,
    )  # fmt: skip
    assert args[-6:] == [
        "--spark-master", "local[1]", "--checkpoint-interval", "2.0", "--trigger-ms", "1000"
    ]  # fmt: skip
    up = typer.main.get_command(app).commands["up"]  # type: ignore[attr-defined]
    help_of = {p.name: getattr(p, "help", "") for p in up.params}
    assert "$FOGSHIFT_CHECKPOINT_INTERVAL_S, else 5.0]" in help_of["checkpoint_interval"]
    assert "$FOGSHIFT_TRIGGER_MS, else 200]" in help_of["trigger_ms"]


def test_serve_agent_takes_what_it_is_not_given_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    import fogshift.agent.app

    built: list[AgentConfig] = []
    monkeypatch.setattr(fogshift.agent.app, "create_app", built.append)
    served: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: served.append(kwargs))
    monkeypatch.setenv("FOGSHIFT_CHECKPOINT_INTERVAL_S", "3")
    (tmp_path / "token").write_text("t" * 16)
    base = ["serve-agent", "--name", "fog-a", "--home", str(tmp_path / "home"), "--port", "1",
            "--orchestrator", "http://127.0.0.1:1", "--token-file", str(tmp_path / "token"),
            "--broker-file", str(tmp_path / "broker.json")]  # fmt: skip
    result = CliRunner().invoke(app, base)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, [*base, "--trigger-ms", "50", "--checkpoint-interval", "4"])
    assert result.exit_code == 0, result.output
    assert [(c.checkpoint_interval_s, c.trigger_ms) for c in built] == [(3.0, 200), (4.0, 50)]
    # Idle connections outlive the clients' reuse of them (fogshift.common.http).
    assert [kw["timeout_keep_alive"] for kw in served] == [SERVER_KEEP_ALIVE_S] * 2


def recorded_up(started: list[object]) -> Any:
    """A stand-in for ``cluster_ops.up`` that records its arguments in ``started`` and
    answers as a cluster of node ``a``."""
    from fogshift.supervisor.cluster import ClusterFile, ProcessInfo

    node = ProcessInfo(pid=1, pgid=1, url="http://127.0.0.1:9")

    def up(*args: object, **kwargs: object) -> ClusterFile:
        started.append(args)
        return ClusterFile(orchestrator=node, broker=None, nodes={"a": node},
                           broker_url="nats://127.0.0.1:9")  # fmt: skip

    return up


def test_up_refuses_a_bad_setting_in_the_environment_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[object] = []
    monkeypatch.setattr(cluster_ops, "up", recorded_up(started))
    monkeypatch.setenv("FOGSHIFT_TRIGGER_MS", "3")
    result = CliRunner().invoke(app, ["up", "--home", str(tmp_path), "--nodes", "a"])
    assert isinstance(result.exception, InvalidInput) and started == []
    assert "FOGSHIFT_TRIGGER_MS" in result.exception.message
    assert result.exception.received == "'3'"
    assert "0 (continuous) or at least 10 ms" in (result.exception.expected or "")
    monkeypatch.setenv("FOGSHIFT_TRIGGER_MS", "50")
    result = CliRunner().invoke(app, ["up", "--home", str(tmp_path), "--nodes", "a"])
    assert result.exit_code == 0, result.output
    assert len(started) == 1


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("--trigger-ms", "5", "trigger_ms"),
        ("--checkpoint-interval", "0", "checkpoint_interval_s"),
        ("--central-interval", "-1", "central_interval_s"),
        ("--duplicate-window", "0", "duplicate_window_s"),
        ("--plan-interval", "0", "plan_interval_s"),
    ],
)
def test_up_refuses_a_bad_option_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, value: str, field: str
) -> None:
    # Each reaches a service's command line; the service died on it at start-up, and `up`
    # waited its whole timeout to say the node did not become healthy.
    started: list[object] = []
    monkeypatch.setattr(cluster_ops, "up", recorded_up(started))
    result = CliRunner().invoke(app, ["up", "--home", str(tmp_path), "--nodes", "a", option, value])
    assert isinstance(result.exception, InvalidInput) and started == []
    assert result.exception.message == f"option {option} is not a valid {field}"
    assert result.exception.received is not None and value in result.exception.received
    # (Not pydantic's "Input should be greater than or equal to 0".)
    assert result.exception.expected and "should" not in result.exception.expected


def test_a_node_runs_a_local_spark_session_only(tmp_path: Path) -> None:
    # A cluster master's executors got neither fogshift's JVM classes nor its file system
    # (every file:// checkpoint access failed there): refused, with what a node runs.
    from fogshift.common.settings import check_value
    from fogshift.exceptions import InvalidInput

    for master in ("local", "local[*]", "local[4]", "local[2,3]"):
        assert AgentConfig(**required(tmp_path), spark_master=master).spark_master == master
    for master in ("spark://head:7077", "yarn", "local[0]", "local[*", "local-cluster[2,1,1024]"):
        with pytest.raises(ValidationError, match="a cluster master is not supported"):
            AgentConfig(**required(tmp_path), spark_master=master)
    with pytest.raises(InvalidInput) as refused:
        check_value(AgentConfig, "spark_master", "spark://head:7077", "option --spark-master",
                    "leave it out (the default)")  # fmt: skip
    assert "local[*]" in (refused.value.expected or "")
    assert refused.value.received == "'spark://head:7077'"
