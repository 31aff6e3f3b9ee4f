"""Shared fixtures: real nats-server, real local clusters (agents as separate processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.client import BrokerAddress, SyncJetStream
from fogshift.broker.server import BrokerProcess, start_nats_server
from fogshift.cli.cluster import group_alive

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A real nats-server with JetStream on a free port and its own store dir."""
    broker = start_nats_server(tmp_path_factory.mktemp("nats"))
    yield broker
    os.killpg(broker.pid, signal.SIGKILL)


@pytest.fixture()
def js_client(nats_server: BrokerProcess) -> Iterator[SyncJetStream]:
    client = SyncJetStream(nats_server.address)
    yield client
    client.close()


def fogshift(*args: str, check: bool = True, timeout: float = 400) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "fogshift.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"fogshift {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


class Cluster:
    """A local cluster started with `fogshift up` under a temp home."""

    def __init__(self, home: Path, nodes: list[str], up_args: tuple[str, ...] = ()) -> None:
        self.home = home
        self.nodes = nodes
        self.up_args = up_args

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return fogshift(*args, "--home", str(self.home), check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def up(self) -> None:
        self.cli("up", "--nodes", ",".join(self.nodes), *self.up_args)

    def down(self) -> None:
        if (self.home / "cluster.json").exists():
            self.cli("down")

    def status(self, pipeline: str) -> dict[str, Any]:
        return dict(self.json("status", pipeline))

    def node(self, name: str) -> dict[str, Any]:
        """Node ``name`` as `fogshift nodes --json` reports it."""
        return next(n for n in self.json("nodes") if n["name"] == name)

    def element(self, pipeline: str, element: str) -> dict[str, Any]:
        return next(e for e in self.status(pipeline)["elements"] if e["element"] == element)

    def wait_for(
        self, pipeline: str, element: str, count: int, timeout_s: float = 240
    ) -> dict[str, Any]:
        """Wait until ``element`` has emitted ``count`` events (sinks: lines written)."""
        deadline = time.monotonic() + timeout_s
        info: dict[str, Any] = {}
        while time.monotonic() < deadline:
            info = self.element(pipeline, element)
            if info["events_out"] >= count:
                return info
            time.sleep(0.5)
        others = [e for e in self.status(pipeline)["elements"] if e["element"] != element]
        raise AssertionError(
            f"{pipeline}/{element} emitted {info.get('events_out')} of {count} in {timeout_s}s: "
            f"{info}\nthe other elements: {others}\n{self.logs()}"
        )

    def logs(self) -> str:
        out = []
        for log in sorted((self.home / "logs").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()
            lines = [ln for ln in text if "ERROR" in ln]
            # The exception lines say why a query died; the ERROR lines alone only say that.
            causes = [ln for ln in text if "Exception:" in ln or "Error:" in ln]
            out.append(
                f"--- {log.name}: {len(lines)} error lines\n"
                + "\n".join(lines[-5:] + sorted(set(causes))[-8:])
            )
        return "\n".join(out)


def pgids_of(home: Path) -> list[int]:
    data = json.loads((home / "cluster.json").read_text())
    groups = [data["orchestrator"]["pgid"], *(n["pgid"] for n in data["nodes"].values())]
    if data.get("broker"):
        groups.append(data["broker"]["pgid"])
    return groups


@pytest.fixture(scope="module")
def up_args() -> tuple[str, ...]:
    """Extra `fogshift up` options; a test module overrides this fixture to change them."""
    return ()


@pytest.fixture(scope="module")
def cluster_nodes() -> list[str]:
    """The nodes of the module's cluster; a test module overrides this fixture to add some."""
    return ["cloud", "fog-a", "fog-b"]


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, up_args: tuple[str, ...], cluster_nodes: list[str]
) -> Iterator[Cluster]:
    """Nodes (by default cloud, fog-a, fog-b) as real processes, shared by a test module."""
    home = tmp_path_factory.mktemp("home")
    c = Cluster(home, cluster_nodes, up_args)
    c.up()
    try:
        yield c
    finally:
        groups = pgids_of(home) if (home / "cluster.json").exists() else []
        c.down()
        leftovers = [g for g in groups if group_alive(g)]
        for g in leftovers:
            os.killpg(g, signal.SIGKILL)
        assert not leftovers, f"`fogshift down` left process groups {leftovers} running"


__all__ = ["BrokerAddress", "Cluster", "fogshift", "group_alive", "pgids_of"]
