"""Node-agent configuration (frozen; built at the CLI edge)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fogshift.common.names import NAME_RE


class AgentConfig(BaseModel):
    """Everything a node agent needs to run.

    Attributes:
        name: The node's name (``cloud``, ``fog-a``...).
        host: Interface to bind; loopback unless told otherwise.
        port: TCP port to bind.
        home: The node's own folder: checkpoints, metrics, logs.
        token: This node's token (``fogshift.common.http.node_token`` of the operator
            token, from a 0600 file ``up`` writes into the node's home): sent with the
            heartbeats and checkpoint fetches, and what the orchestrator calls this agent
            with. The operator token itself is accepted too, but never stored here.
        orchestrator_url: Where to send heartbeats.
        broker_file: The broker address file (0600).
        spark_master: ``local[*]`` or a Spark cluster URL.
        trigger_ms: Micro-batch trigger interval of every query.
        heartbeat_s: Interval between heartbeats.
        advertise_url: The URL the orchestrator should use (defaults to http://host:port).
        checkpoint_interval_s: Interval of node-level checkpoints (snapshots) of each PE.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_RE)
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    home: Path
    token: str = Field(min_length=16)
    orchestrator_url: str
    broker_file: Path
    spark_master: str = "local[*]"
    trigger_ms: int = Field(default=200, ge=10)
    heartbeat_s: float = Field(default=1.0, gt=0)
    advertise_url: str | None = None
    checkpoint_interval_s: float = Field(default=5.0, gt=0)

    @property
    def url(self) -> str:
        return self.advertise_url or f"http://{self.host}:{self.port}"
