"""Orchestrator configuration (frozen; built at the CLI edge). Its field defaults are the
only ones: ``fogshift up``, the CLI and the benchmarks take theirs from here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fogshift.broker.client import DUPLICATE_WINDOW_S
from fogshift.broker.naming import LOG_NAME as BROKER_LOG
from fogshift.common.logfile import LOG_MAX_BYTES
from fogshift.common.settings import MAX_SECONDS, Seconds
from fogshift.contracts import disk_sizes


class OrchestratorConfig(BaseSettings):
    """Orchestrator settings (frozen; built at the CLI edge).

    Settings: a value given to the constructor (the CLI's options) wins; a field not given is
    read from the environment variable ``FOGSHIFT_<FIELD>`` (e.g.
    ``FOGSHIFT_PLAN_INTERVAL_S=30``, or the test hooks ``FOGSHIFT_TEST_PAUSE_AT`` and
    ``FOGSHIFT_TEST_PAUSE_FILE``); otherwise
    its default applies. Nothing else in the orchestrator reads the environment.

    Attributes:
        home: Where the registry database lives.
        host: Interface to bind; loopback unless told otherwise.
        port: TCP port.
        token: The cluster's bearer token.
        broker_file: The broker address file.
        node_timeout_s: A node silent for longer is reported unhealthy.
        call_silence_s: A request to a node agent is given up (as no answer: it may still
            be carried out) once the node has sent no heartbeat for this long while the
            request waits: a stopped agent process keeps its connections open, and a
            migration onto it waited minutes before its rollback.
        reconcile_s: Interval of the loop that redeploys PEs missing from healthy nodes,
            restores PEs of lost nodes and removes superseded instances.
        central_interval_s: Interval of central-level checkpoint pulls.
        pull_new_state_bytes: A PE's node-level checkpoint that brings at least this many
            bytes new since the node's previous one is pulled into the central store at once,
            not at the next interval (``0``: at intervals only). A large state change then
            has a central copy within a heartbeat, and a migration ships only what changed
            after it.
        standby_follow_s: Interval at which hot standbys' caps are raised to where their
            primaries have committed (what a promotion has left to re-derive).
        duplicate_window_s: The broker's de-duplication window of new streams (the broker
            client's default, :data:`fogshift.broker.client.DUPLICATE_WINDOW_S`).
        low_disk_bytes: A node with less free space than this (at most a quarter of a
            small disk) on its home's file system, or less than ``low_disk_share`` of
            it, is warned of in ``GET /nodes`` (its
            checkpoints, and its PEs with them, fail once it is full); so is the
            orchestrator's own, in ``GET /health``.
        low_disk_share: See ``low_disk_bytes`` (for a large disk, where 1 GiB is little).
        stall_intervals: A node's node-level checkpoints are warned of as stopped once its
            last round, or a running PE's newest checkpoint while the PE commits newer
            batches, is this many of the node's checkpoint intervals old, plus
            ``stall_slack_s``.
        stall_slack_s: See ``stall_intervals``: a round waits behind a query start holding
            the node's lock, which takes tens of seconds on a loaded node.
        plan_interval_s: Interval of the backup/redeploy planner (see ``planning``).
        plan_time_limit_s: Time limit of one exact solve; the greedy answers when it is hit.
        broker_config: The config of the nats-server ``fogshift up`` started (``None``: an
            external broker, whose users fogshift does not manage).
        broker_pid: That server's process, signalled to reload per-node rights.
        broker_started: When that process started (clock ticks since boot, as ``fogshift
            up`` recorded it): it is signalled only while its pid is still that process.
            ``None``: read at this orchestrator's start.
        test_pause_at: Test hook: ``<kind>:<phase>`` of an operation (e.g.
            ``migration:switching``, ``restore:installing``, ``scale:placed``) at which this
            orchestrator stops, once the journal has recorded that phase and before its side
            effect (a scale: once that step is done), and waits to be killed. ``None``
            (always, outside tests): never.
        test_pause_file: Test hook: a file holding such a point, read at every point while
            it exists (absent: no stop), so that a test tells a running orchestrator where
            to stop instead of starting one for it; ``test_pause_at``, if given, wins.
            ``None`` (always, outside tests): none.
        log_max_bytes: The orchestrator's log (its standard output when it appends to a
            file, as ``up`` starts it) and the log of the broker ``up`` started (beside
            ``broker_config``) are copied aside and emptied once larger
            (:mod:`fogshift.common.logfile`); 0: never.
    """

    model_config = SettingsConfigDict(
        env_prefix="FOGSHIFT_", frozen=True, extra="forbid", env_ignore_empty=True
    )

    home: Path
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    token: str = Field(min_length=16)
    broker_file: Path
    node_timeout_s: Seconds = 5.0
    call_silence_s: Seconds = 20.0
    reconcile_s: Seconds = 2.0
    central_interval_s: Seconds = 15.0
    pull_new_state_bytes: int = Field(default=1 << 20, ge=0)
    standby_follow_s: Seconds = 0.5
    duplicate_window_s: Seconds = DUPLICATE_WINDOW_S
    low_disk_bytes: int = Field(default=1 << 30, ge=0)
    low_disk_share: float = Field(default=0.05, ge=0, le=1)
    stall_intervals: float = Field(default=3.0, gt=0, le=1000, allow_inf_nan=False)
    stall_slack_s: float = Field(default=30.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    plan_interval_s: Seconds = 10.0
    plan_time_limit_s: Seconds = 5.0
    test_pause_at: str | None = Field(default=None, pattern=r"^(migration|restore|scale):[a-z_]+$")
    test_pause_file: Path | None = None
    broker_config: Path | None = None
    broker_pid: int | None = Field(default=None, ge=1)
    broker_started: float | None = Field(default=None, ge=0)
    log_max_bytes: int = Field(default=LOG_MAX_BYTES, ge=0)

    @property
    def broker_log(self) -> Path | None:
        """The log of the broker ``fogshift up`` started (beside its config), if it did."""
        return self.broker_config.with_name(BROKER_LOG) if self.broker_config else None

    @model_validator(mode="after")
    def _calls_outlast_health(self) -> OrchestratorConfig:
        # A call given up before its node is even reported unhealthy would abort operations
        # on a node merely slow to send its heartbeat.
        if self.call_silence_s < self.node_timeout_s:
            raise ValueError(
                f"call_silence_s ({self.call_silence_s:g}) must be at least node_timeout_s "
                f"({self.node_timeout_s:g}): a call is given up only once its node counts as "
                "silent"
            )
        return self

    @classmethod
    def default(cls, field: str) -> Any:
        """The default of ``field``: for the CLI's help and the benchmarks' settings."""
        return cls.model_fields[field].get_default(call_default_factory=True)

    @property
    def warning_limits(self) -> WarningLimits:
        """The thresholds of the node and orchestrator warnings."""
        return WarningLimits(**{f: getattr(self, f) for f in WarningLimits.model_fields})

    @property
    def topology_file(self) -> Path:
        """The fog topology (node capacities, link bandwidths) the planner uses."""
        return self.home / "topology.yaml"

    @property
    def plan_file(self) -> Path:
        """The last plan's assignments, what an orchestrator started again begins with."""
        return self.home / "plan.json"


class WarningLimits(BaseModel):
    """When a node, or the orchestrator, that works is warned of (see
    :class:`OrchestratorConfig`'s fields of the same names, whose defaults these take)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    low_disk_bytes: int = Field(default=OrchestratorConfig.default("low_disk_bytes"), ge=0)
    low_disk_share: float = Field(default=OrchestratorConfig.default("low_disk_share"), ge=0, le=1)
    stall_intervals: float = Field(default=OrchestratorConfig.default("stall_intervals"), gt=0)
    stall_slack_s: float = Field(default=OrchestratorConfig.default("stall_slack_s"), ge=0)

    def disk_warning(self, free: int | None, total: int | None) -> str | None:
        """``disk nearly full: ...`` when ``free`` is below ``low_disk_bytes`` (at most a
        quarter of ``total``) or ``low_disk_share`` of ``total``; ``None`` otherwise, or
        when unknown."""
        if free is None or not total:
            return None
        # (On a disk of under 4 GiB, 1 GiB free is no alarm: a node on a 400 MiB card was
        # "nearly full" from its start, and full it looked the same.)
        floor = min(self.low_disk_bytes, total // 4)
        if free >= floor and free >= self.low_disk_share * total:
            return None
        free_text, total_text, unit = disk_sizes(free, total)
        return f"disk nearly full: {free_text} {unit} free of {total_text} {unit}"
