"""Starting and stopping a local cluster: broker, orchestrator and one agent per node.

Every service runs in a process group of its own, so ``down`` (or a test) can kill a whole
node — agent, JVM and Python workers — with one signal. What was started is written to
``<home>/cluster.json``; the token and broker password live in 0600 files.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from fogshift.broker.client import BrokerAddress
from fogshift.broker.naming import NAME_PATTERN
from fogshift.broker.server import free_port, start_nats_server
from fogshift.cli.exceptions import AlreadyUp, NotUp
from fogshift.common.http import ServiceClient
from fogshift.exceptions import InvalidInput, Unavailable


class ProcessInfo(BaseModel):
    """A process started by ``up``."""

    model_config = ConfigDict(frozen=True)

    pid: int
    pgid: int
    url: str | None = None


class ClusterFile(BaseModel):
    """``<home>/cluster.json``: what ``up`` started and how to reach it."""

    model_config = ConfigDict(frozen=True)

    orchestrator: ProcessInfo
    broker: ProcessInfo | None  # None when an external broker is used
    nodes: dict[str, ProcessInfo]
    broker_url: str


def cluster_file(home: Path) -> Path:
    return home / "cluster.json"


def token_file(home: Path) -> Path:
    return home / "token"


def broker_file(home: Path) -> Path:
    return home / "broker.json"


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def load_cluster(home: Path) -> tuple[ClusterFile, str]:
    """The running cluster's file and token.

    Raises:
        NotUp: No cluster was started under ``home``.
    """
    path = cluster_file(home)
    if not path.exists():
        raise NotUp(
            f"no fogshift cluster is up under {str(home)!r}",
            hint="run `fogshift up` (or pass the --home it was started with)",
        )
    return ClusterFile.model_validate_json(path.read_text()), token_file(home).read_text().strip()


def orchestrator_client(home: Path, timeout_s: float = 120) -> ServiceClient:
    """A client for the orchestrator of the cluster under ``home``."""
    cluster, token = load_cluster(home)
    assert cluster.orchestrator.url is not None
    return ServiceClient(cluster.orchestrator.url, token, "the orchestrator", timeout_s)


def _spawn(args: list[str], log: Path) -> ProcessInfo:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd()
        )
    return ProcessInfo(pid=proc.pid, pgid=proc.pid)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fogshift.cli.main", *args]


def start_node(
    home: Path,
    name: str,
    orchestrator_url: str,
    host: str,
    spark_master: str,
    checkpoint_interval_s: float = 5.0,
) -> ProcessInfo:
    """Start the agent of node ``name`` in a new process group."""
    port = free_port(host)
    info = _spawn(
        _cli(
            "serve-agent",
            "--name",
            name,
            "--home",
            str(home / "nodes" / name),
            "--host",
            host,
            "--port",
            str(port),
            "--orchestrator",
            orchestrator_url,
            "--token-file",
            str(token_file(home)),
            "--broker-file",
            str(broker_file(home)),
            "--spark-master",
            spark_master,
            "--checkpoint-interval",
            str(checkpoint_interval_s),
        ),
        home / "logs" / f"node-{name}.log",
    )
    return info.model_copy(update={"url": f"http://{host}:{port}"})


def up(
    home: Path,
    nodes: list[str],
    host: str = "127.0.0.1",
    nats_url: str | None = None,
    nats_user: str | None = None,
    nats_password: str | None = None,
    spark_master: str = "local[*]",
    timeout_s: float = 180,
    on_progress: Callable[[str], None] | None = None,
    checkpoint_interval_s: float = 5.0,
    central_interval_s: float = 15.0,
    duplicate_window_s: float = 120.0,
) -> ClusterFile:
    """Start the broker (unless ``nats_url``), the orchestrator and the node agents.

    Returns once the orchestrator answers and every node reports a ready Spark session.

    Raises:
        AlreadyUp: A cluster already runs under ``home``.
        InvalidInput: A bad node name.
        Unavailable: Something did not become healthy within ``timeout_s``; what was started
            is stopped again.
    """
    say = on_progress or (lambda _msg: None)
    for name in nodes:
        if not NAME_PATTERN.match(name):
            raise InvalidInput(
                f"bad node name {name!r}",
                expected="letters, digits, '_' and '-' (e.g. cloud,fog-a,fog-b)",
                received=repr(name),
            )
    if not nodes:
        raise InvalidInput("no nodes to start", expected="--nodes cloud,fog-a,fog-b")
    if cluster_file(home).exists():
        cluster, _ = load_cluster(home)
        if alive(cluster.orchestrator.pid):
            raise AlreadyUp(
                f"a fogshift cluster is already up under {str(home)!r}",
                hint="`fogshift down` first, or use another --home",
            )
        cluster_file(home).unlink()
    home.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    token_file(home).write_text(token)
    token_file(home).chmod(0o600)
    started: list[ProcessInfo] = []
    try:
        broker_info: ProcessInfo | None = None
        if nats_url is None:
            say("starting nats-server (JetStream)")
            broker = start_nats_server(home / "broker", host="127.0.0.1")
            broker_info = ProcessInfo(pid=broker.pid, pgid=broker.pid, url=broker.address.url)
            started.append(broker_info)
            address = broker.address
        else:
            address = BrokerAddress(url=nats_url, user=nats_user, password=nats_password)
        address.save(broker_file(home))
        say("starting the orchestrator")
        port = free_port(host)
        orchestrator = _spawn(
            _cli(
                "serve-orchestrator",
                "--home",
                str(home),
                "--host",
                host,
                "--port",
                str(port),
                "--token-file",
                str(token_file(home)),
                "--broker-file",
                str(broker_file(home)),
                "--central-interval",
                str(central_interval_s),
                "--duplicate-window",
                str(duplicate_window_s),
            ),
            home / "logs" / "orchestrator.log",
        ).model_copy(update={"url": f"http://{host}:{port}"})
        started.append(orchestrator)
        node_infos = {}
        for name in nodes:
            say(f"starting node agent {name}")
            node_infos[name] = start_node(
                home, name, str(orchestrator.url), host, spark_master, checkpoint_interval_s
            )
            started.append(node_infos[name])
        cluster = ClusterFile(
            orchestrator=orchestrator,
            broker=broker_info,
            nodes=node_infos,
            broker_url=address.url,
        )
        cluster_file(home).write_text(cluster.model_dump_json(indent=2))
        wait_healthy(home, nodes, timeout_s, say)
        return cluster
    except BaseException:
        for info in started:
            kill_group(info.pgid, signal.SIGKILL)
        cluster_file(home).unlink(missing_ok=True)
        raise


def wait_healthy(
    home: Path, nodes: list[str], timeout_s: float, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Wait until the orchestrator reports every node in ``nodes`` healthy."""
    client = orchestrator_client(home, timeout_s=5)
    deadline = time.monotonic() + timeout_s
    last: Any = None
    try:
        while time.monotonic() < deadline:
            try:
                reports = {n["name"]: n for n in client.get("/nodes")}
            except Unavailable as exc:
                last = exc
                time.sleep(0.3)
                continue
            waiting = [n for n in nodes if not reports.get(n, {}).get("healthy")]
            errors = [
                f"{n}: {reports[n]['error']}" for n in nodes if reports.get(n, {}).get("error")
            ]
            if errors:
                raise Unavailable("node failed to start: " + "; ".join(errors))
            if not waiting:
                return list(reports.values())
            say("waiting for Spark on " + ", ".join(waiting))
            last = waiting
            time.sleep(0.5)
    finally:
        client.close()
    raise Unavailable(
        f"the cluster under {str(home)!r} did not become healthy in {timeout_s:.0f} s "
        f"(still waiting for: {last})",
        hint=f"see the logs in {home / 'logs'}",
    )


def kill_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a whole process group, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # A group whose members are all zombies is gone for our purposes.
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().split(")")[-1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def down(home: Path, grace_s: float = 15) -> list[str]:
    """Stop everything ``up`` started.

    Each service's leader gets SIGTERM (the agents stop their queries cleanly); whatever is
    left of its process group (JVM, Python workers) gets SIGKILL after ``grace_s``.

    Returns:
        What was stopped. The registry, checkpoints and outputs stay, so a later ``up``
        carries on with the pipelines that were running.
    """
    cluster, _ = load_cluster(home)
    # The orchestrator first: it must not take stopping nodes for lost ones and restore them.
    tiers: list[dict[str, ProcessInfo]] = [
        {"orchestrator": cluster.orchestrator},
        {f"node {n}": p for n, p in cluster.nodes.items()},
    ]
    if cluster.broker is not None:
        tiers.append({"broker": cluster.broker})
    # Then the nodes (they stop their queries cleanly), then the broker.
    for tier in tiers:
        for info in tier.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(alive(i.pid) for i in tier.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for info in tier.values():
            kill_group(info.pgid, signal.SIGKILL)
        for info in tier.values():
            while group_alive(info.pgid) and time.monotonic() < deadline + 5:
                time.sleep(0.05)
    cluster_file(home).unlink(missing_ok=True)
    return [label for tier in tiers for label in tier]
