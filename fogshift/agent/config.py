"""Node-agent configuration (frozen; built at the CLI edge). Its field defaults are the only
ones: ``fogshift up``, the CLI and the benchmarks take theirs from here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fogshift.common.logfile import LOG_MAX_BYTES
from fogshift.common.names import NAME_RE
from fogshift.common.settings import Seconds
from fogshift.runtime.session import JAVA_OPTIONS

#: The shortest trigger interval other than 0 (continuous).
MIN_TRIGGER_MS = 10


def _continuous_or_at_least_min(value: int) -> int:
    # Below 10 ms a trigger is Spark's own polling delay: continuous in all but name.
    if 0 < value < MIN_TRIGGER_MS:
        raise ValueError(f"0 (continuous) or at least {MIN_TRIGGER_MS} ms")
    return value


#: A query trigger in ms (the type carries the rule, so the CLI checks it in the environment).
TriggerMs = Annotated[int, Field(ge=0), AfterValidator(_continuous_or_at_least_min)]

#: The Spark masters a node runs: its own local session, in the agent's process.
LOCAL_MASTER_RE = r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?"


def _local_master(value: str) -> str:
    # A cluster master's executors got neither fogshift's JVM classes (only the driver's
    # class path is set) nor its local file system (every file:// checkpoint access failed
    # there), its Python workers marked no crash on the node, and the node's checkpoints
    # are its own folders: refused rather than half working.
    if re.fullmatch(LOCAL_MASTER_RE, value) is None:
        raise ValueError(
            f"local, local[N], local[*] or local[N,F] (each node runs its own local Spark "
            f"session; a cluster master is not supported), not {value!r}"
        )
    return value


#: A node's Spark master (the type carries the rule, as :data:`TriggerMs`).
SparkMaster = Annotated[str, AfterValidator(_local_master)]


class AgentConfig(BaseSettings):
    """Everything a node agent needs to run.

    Settings: a value given to the constructor (the CLI's options) wins; a field not given is
    read from the environment variable ``FOGSHIFT_<FIELD>`` (e.g.
    ``FOGSHIFT_CHECKPOINT_INTERVAL_S=2``); otherwise its default applies. Nothing else in the
    agent reads the environment.

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
        spark_master: ``local[*]``, ``local[N]`` (N threads) or ``local[N,F]`` (F task
            failures allowed): each node runs its own local Spark session.
        trigger_ms: Micro-batch trigger interval of every query; 0: the next batch as soon as
            the previous one ended and input is there (lowest latency; a busy PE then runs
            batches back to back).
        heartbeat_s: Interval between heartbeats.
        advertise_url: The URL the orchestrator should use (defaults to http://host:port).
        checkpoint_interval_s: Interval of node-level checkpoints (snapshots) of each PE.
        java_options: The Spark driver JVM's options (why these: ``JAVA_OPTIONS`` in
            :mod:`fogshift.runtime.session`); ``FOGSHIFT_JAVA_OPTIONS`` replaces them.
        warm_up: Run a stateful query of the node's own when its session is up
            (:mod:`fogshift.runtime.warm_up`), so the first PE it receives (a migration's
            target, a restore) starts like any later one; ~6 s of CPU at each start (its
            Python and JVM queries and their state reads). ``FOGSHIFT_WARM_UP=false`` saves
            that where first-query latency does not count (the test suite's clusters).
        pull_rate_bps: The most bits per second the central store's pulls of this node's
            checkpoints may take (:mod:`fogshift.agent.pacing`), so that they never fill the
            node's uplink ahead of its PEs' output; ``None``: as fast as the link goes.
            ``fogshift up --link`` sets half of an isolated node's bandwidth. Migrations and
            restores are not paced: they are what the pipeline waits for.
        log_max_bytes: The node's log (the agent's standard output when it appends to a
            file, as ``up`` starts it: its JVM's and Python workers' too) is copied aside
            and emptied once larger (:mod:`fogshift.common.logfile`); 0: never.
    """

    model_config = SettingsConfigDict(
        env_prefix="FOGSHIFT_", frozen=True, extra="forbid", env_ignore_empty=True
    )

    name: str = Field(pattern=NAME_RE)
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    home: Path
    token: str = Field(min_length=16)
    orchestrator_url: str
    broker_file: Path
    spark_master: SparkMaster = "local[*]"
    trigger_ms: TriggerMs = 200
    heartbeat_s: Seconds = 1.0
    advertise_url: str | None = None
    checkpoint_interval_s: Seconds = 5.0
    java_options: str = JAVA_OPTIONS
    warm_up: bool = True
    pull_rate_bps: int | None = Field(default=None, ge=8000)
    log_max_bytes: int = Field(default=LOG_MAX_BYTES, ge=0)

    @classmethod
    def default(cls, field: str) -> Any:
        """The default of ``field``: for the CLI's help and the benchmarks' settings."""
        return cls.model_fields[field].get_default(call_default_factory=True)

    @property
    def url(self) -> str:
        return self.advertise_url or f"http://{self.host}:{self.port}"
