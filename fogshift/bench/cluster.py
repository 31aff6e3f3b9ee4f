"""Driving clusters for the bench through the real CLI.

``up``, ``down``, ``deploy``, ``stop``, ``nodes`` and ``net show`` run as ``python -m
fogshift.cli.main ... --home H`` subprocesses, exactly as a user types them, so the bench
depends on the CLI's flags and JSON. Two things go to the orchestrator's REST API instead,
the API the CLI itself calls: frequent polling (sink rows, checkpoints), to avoid a Python
start per poll, and ``migrate``/``restore`` (:meth:`BenchCluster.operation`, the same POST as
``fogshift migrate/restore --json``), so the bench knows to the millisecond when the operation
began — a CLI start takes 1-3 s here and would blur the CPU and latency windows around it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fogshift.agent.config import AgentConfig
from fogshift.bench.exceptions import BadBenchOption, BenchError, IsolationUnavailable
from fogshift.common.http import ServiceClient
from fogshift.migration.exceptions import MigrationFailed
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.supervisor.cluster import group_alive, kill_group, load_cluster, orchestrator_client

#: The delay of a link profile of ``fogshift up --link NODE=PROFILE`` (``n0``, ``n100``,
#: ``n500``), possibly after a bandwidth (``10mbit,n100``); ``fogshift up`` validates the rest.
DELAY_PATTERN = re.compile(r"^n\d+$")


def cli_command(*args: str) -> list[str]:
    """The argv of a fogshift CLI call with this interpreter."""
    return [sys.executable, "-m", "fogshift.cli.main", *args]


@functools.cache
def _help_text(*command: str) -> str:
    proc = subprocess.run(
        cli_command(*command, "--help"), capture_output=True, text=True, timeout=120
    )
    return proc.stdout + proc.stderr


def isolation_available() -> bool:
    """Whether ``fogshift up`` offers ``--isolate`` and ``--link`` (network namespaces)."""
    text = _help_text("up")
    return "--isolate" in text and "--link" in text


def delay_of(profile: str) -> str:
    """The delay part of a link profile (``n100`` of ``10mbit,n100``; ``n0`` if it has none).

    Raises:
        BadBenchOption: A profile without any part (``fogshift up`` checks the parts).
    """
    parts = [p.strip() for p in profile.split(",") if p.strip()]
    if not parts:
        raise BadBenchOption(
            f"bad link profile {profile!r}",
            expected="n0, n100 or n500, optionally after a bandwidth (e.g. 10mbit,n100)",
            received=repr(profile),
        )
    delays = [p for p in parts if DELAY_PATTERN.match(p)]
    return delays[-1] if delays else "n0"


@dataclass(frozen=True)
class ClusterOptions:
    """How an experiment wants its cluster started.

    Attributes:
        nodes: Node names; the first is the "cloud" node hosting sources and sinks.
        checkpoint_interval_s: ``--checkpoint-interval`` (node-level snapshots).
        central_interval_s: ``--central-interval`` (central pulls).
        trigger_ms: ``--trigger-ms`` (every query's micro-batch trigger).
        isolate: Start the nodes in network namespaces (``--isolate``).
        links: ``(node, profile)`` pairs for ``--link NODE=PROFILE`` (needs ``isolate``).
    """

    nodes: tuple[str, ...]
    checkpoint_interval_s: float = AgentConfig.default("checkpoint_interval_s")
    central_interval_s: float = OrchestratorConfig.default("central_interval_s")
    trigger_ms: int = AgentConfig.default("trigger_ms")
    isolate: bool = False
    links: tuple[tuple[str, str], ...] = ()

    def up_args(self) -> list[str]:
        """The ``fogshift up`` arguments (without ``--home``).

        Raises:
            IsolationUnavailable: Isolation or a link profile is asked for but ``fogshift up``
                has no ``--isolate``.
        """
        args = ["--nodes", ",".join(self.nodes)]
        args += ["--checkpoint-interval", f"{self.checkpoint_interval_s:g}"]
        args += ["--central-interval", f"{self.central_interval_s:g}"]
        args += ["--trigger-ms", str(self.trigger_ms)]
        if self.isolate or self.links:
            if not isolation_available():
                raise IsolationUnavailable(
                    "network isolation was asked for, but `fogshift up` has no --isolate",
                    expected="`fogshift up --isolate --link NODE=PROFILE`",
                    received=" ".join(f"--link {n}={p}" for n, p in self.links) or "--isolate",
                    hint="the bench never emulates a delay itself; run the n0 variants only",
                )
            args.append("--isolate")
            for node, profile in self.links:
                delay_of(profile)
                args += ["--link", f"{node}={profile}"]
        return args

    def intervals(self) -> dict[str, float]:
        """The checkpoint intervals and the trigger in effect, as experiment settings name
        them."""
        return {
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "central_interval_s": self.central_interval_s,
            "trigger_ms": self.trigger_ms,
        }

    def profile_of(self, node: str) -> str:
        """The link profile of ``node`` (``n0`` when it has none)."""
        return dict(self.links).get(node, "n0")


@dataclass
class BenchCluster:
    """One cluster under ``home``, started and stopped with the CLI.

    Attributes:
        dead: Nodes this bench killed (their agents no longer run).
    """

    home: Path
    options: ClusterOptions
    dead: set[str] = field(default_factory=set)
    _client: ServiceClient | None = None

    # -- the CLI ------------------------------------------------------------------------------

    def cli(
        self, *args: str, timeout_s: float = 900, check: bool = True
    ) -> subprocess.CompletedProcess:
        """Run ``fogshift ARGS --home HOME``.

        Raises:
            BenchError: It exited non-zero (and ``check``), with its error output.
        """
        command = cli_command(*args, "--home", str(self.home))
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(
                f"`fogshift {' '.join(args)}` did not finish within {timeout_s:.0f} s",
                hint=f"see the logs in {self.home / 'logs'}",
            ) from exc
        if check and proc.returncode != 0:
            raise BenchError(
                f"`fogshift {' '.join(args)}` exited {proc.returncode}",
                received=(proc.stderr or proc.stdout).strip()[-1500:],
                hint=f"see the logs in {self.home / 'logs'}",
            )
        return proc

    def json(self, *args: str, timeout_s: float = 900, check: bool = True) -> Any:
        """``fogshift ARGS --json``, parsed (also the report a failing command prints).

        Raises:
            BenchError: It failed without printing JSON.
        """
        proc = self.cli(*args, "--json", timeout_s=timeout_s, check=False)
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            data = None
        if data is None or (check and proc.returncode != 0 and not isinstance(data, dict)):
            raise BenchError(
                f"`fogshift {' '.join(args)} --json` exited {proc.returncode} without a report",
                received=(proc.stderr or proc.stdout).strip()[-1500:],
                hint=f"see the logs in {self.home / 'logs'}",
            )
        return data

    def up(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.cli("up", *self.options.up_args(), timeout_s=600)

    def down(self) -> None:
        """``fogshift down``; then SIGKILL any process group of ours that outlived it."""
        if self._client is not None:
            self._client.close()
            self._client = None
        groups = self.process_groups()
        if not groups:
            return
        with contextlib.suppress(BenchError):  # whatever it says, the groups are checked below
            self.cli("down", timeout_s=180)
        deadline = time.monotonic() + 10
        while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        for group in groups:
            if group_alive(group):
                kill_group(group, signal.SIGKILL)

    def process_groups(self) -> list[int]:
        """Every process group ``up`` recorded in ``cluster.json`` (empty when it is down)."""
        path = self.home / "cluster.json"
        return _pgids(json.loads(path.read_text())) if path.exists() else []

    # -- REST (polling) -------------------------------------------------------------------------

    @property
    def client(self) -> ServiceClient:
        """The orchestrator's REST client (what the CLI uses)."""
        if self._client is None:
            self._client = orchestrator_client(self.home, timeout_s=120)
        return self._client

    def element(self, pipeline: str, element: str) -> dict[str, Any]:
        """One PE's status (node, state, events in/out)."""
        status = self.client.get(f"/pipelines/{pipeline}")
        return dict(next(e for e in status["elements"] if e["element"] == element))

    def nodes(self) -> list[dict[str, Any]]:
        """``/nodes``: per node its health, PEs and their checkpoints."""
        return list(self.client.get("/nodes"))

    def checkpoints(self, pipeline: str, element: str) -> dict[str, Any] | None:
        """The node-level and central checkpoint summary of one PE (``None`` if not hosted)."""
        key = f"{pipeline}/{element}"
        for node in self.nodes():
            for entry in node.get("checkpoints", []):
                if entry["element"] == key:
                    return {**entry, "node": node["name"]}
        return None

    def operation(self, pipeline: str, element: str, verb: str, body: dict[str, Any]) -> Any:
        """POST a migrate or restore and return its report, also the report of a failure.

        Args:
            verb: ``migrate`` (body ``{"target", "mode"}``) or ``restore`` (``{"target"}``).

        Raises:
            FogshiftError: It was refused without a report (e.g. unknown node, 409).
        """
        path = f"/pipelines/{pipeline}/elements/{element}/{verb}"
        with orchestrator_client(self.home, timeout_s=900) as client:
            try:
                return client.post(path, json=body)
            except (MigrationFailed, RestoreFailed) as exc:
                if exc.report is not None:
                    return exc.report.model_dump(mode="json")
                raise

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 900) -> Any:
        """POST ``body`` to the orchestrator's ``path`` and return its answer, waiting up to
        ``timeout_s`` (a key move or a scale answers once its states are committed).

        Raises:
            FogshiftError: It was refused, or the orchestrator did not answer.
        """
        with orchestrator_client(self.home, timeout_s=timeout_s) as client:
            return client.post(path, json=body)

    def agent(self, node: str) -> ServiceClient:
        """A REST client for one node's agent (e.g. a source's offset with its ``t0``)."""
        url = next(n["url"] for n in self.nodes() if n["name"] == node)
        _, token = load_cluster(self.home)
        return ServiceClient(url, token, f"node agent {node!r}", 30)

    # -- nodes ----------------------------------------------------------------------------------

    def pgids(self) -> dict[str, int]:
        """The process group of each node's agent, from ``fogshift nodes --json``."""
        return {
            str(n["name"]): int(n["pgid"])
            for n in self.json("nodes", timeout_s=120)
            if n.get("pgid")
        }

    def pgid(self, node: str) -> int:
        """The process group of ``node``'s agent, from ``fogshift nodes --json``.

        Raises:
            BenchError: The node is unknown.
        """
        pgid = self.pgids().get(node)
        if pgid is None:
            raise BenchError(f"`fogshift nodes --json` names no process group for node {node!r}")
        return pgid

    def kill(self, node: str) -> int:
        """SIGKILL the whole process group of ``node`` (agent, JVM, Python workers)."""
        pgid = self.pgid(node)
        kill_group(pgid, signal.SIGKILL)
        self.dead.add(node)
        return pgid

    def alive(self) -> list[str]:
        return [n for n in self.options.nodes if n not in self.dead]

    def rtt_ms(self) -> dict[str, float]:
        """Measured round-trip time per node from ``fogshift net show --json`` (``{}`` if the
        command does not exist or the cluster is not isolated)."""
        if not self.options.isolate:
            return {}
        proc = self.cli("net", "show", "--json", timeout_s=120, check=False)
        if proc.returncode != 0:
            return {}
        try:
            return _rtts(json.loads(proc.stdout))
        except ValueError:
            return {}


def _pgids(data: Any) -> list[int]:
    """Every ``pgid`` in a cluster file, whatever its layout."""
    if isinstance(data, dict):
        own = [int(data["pgid"])] if isinstance(data.get("pgid"), int) else []
        return own + [g for value in data.values() for g in _pgids(value)]
    if isinstance(data, list):
        return [g for value in data for g in _pgids(value)]
    return []


def _rtts(data: Any) -> dict[str, float]:
    """``{node: median RTT ms}`` from ``net show --json`` (a list of per-node objects with
    ``node`` and ``rtt: {median_ms, ...}``); nodes whose RTT could not be measured are left
    out."""
    found: dict[str, float] = {}
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict):
            continue
        rtt = entry.get("rtt")
        median = rtt.get("median_ms") if isinstance(rtt, dict) else rtt
        if isinstance(entry.get("node"), str) and isinstance(median, (int, float)):
            found[entry["node"]] = float(median)
    return found


class Clusters:
    """Hands clusters out to experiments.

    By default each request starts a fresh cluster under ``root`` and stops it afterwards. With
    ``shared``, every request gets that running cluster instead (the smoke test runs every
    experiment on one cluster to stay within minutes); it is neither started nor stopped here.

    Args:
        root: Parent folder of the homes of fresh clusters.
        shared: A cluster that is already up.
    """

    def __init__(self, root: Path, shared: BenchCluster | None = None) -> None:
        self.root = root
        self.shared = shared
        self._count = 0

    @contextlib.contextmanager
    def cluster(self, options: ClusterOptions) -> Iterator[BenchCluster]:
        """A running cluster with at least ``options.nodes`` alive.

        Raises:
            BadBenchOption: The shared cluster lacks a node (or it was killed).
            IsolationUnavailable: See :meth:`ClusterOptions.up_args`.
        """
        if self.shared is not None:
            missing = [n for n in options.nodes if n not in self.shared.alive()]
            if missing:
                raise BadBenchOption(
                    "the shared cluster lacks nodes this experiment needs",
                    expected=", ".join(options.nodes),
                    received=", ".join(self.shared.alive()),
                )
            yield self.shared
            return
        self._count += 1
        cluster = BenchCluster(self.root / f"cluster-{self._count:03d}", options)
        try:
            cluster.up()
            yield cluster
        finally:
            cluster.down()
