"""Hostile requests against a real cluster started by `fogshift up` (one node): the secret
files it writes, what a node's own credentials open, and the path-traversal requests a user
tried (``..`` as pipeline, element and snapshot names) sent byte for byte to the agent."""

from __future__ import annotations

import http.client
import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from fogshift.broker.server import free_port
from fogshift.common.processes import leads
from fogshift.supervisor.cluster import node_broker_file, node_token_file
from tests.conftest import ROOT, Cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster_needs() -> tuple[str, ...]:
    """Only cloud and the orchestrator are tested here. Other nodes an earlier module killed
    stay down (tests/conftest.py)."""
    return ("cloud",)


def raw(url: str, method: str, path: str, token: str) -> tuple[int, str]:
    """Send ``path`` exactly as given (an HTTP client would normalise ``..`` away)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def test_secret_files_are_0600(cluster: Cluster) -> None:
    home = cluster.home
    secrets = [home / "token", home / "nodes" / "cloud" / "token", home / "broker.json"]
    secrets += [home / "broker" / "nats.conf", home / "cluster.json"]
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # And the homes are the owner's alone: the checkpoints, twins and logs under them too.
    for folder in (home, home / "nodes" / "cloud", home / "nodes" / "fog-a"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_a_nodes_token_opens_only_its_node_endpoints(cluster: Cluster) -> None:
    data = json.loads((cluster.home / "cluster.json").read_text())
    orchestrator = data["orchestrator"]["url"]
    token = (cluster.home / "nodes" / "cloud" / "token").read_text()
    operator = (cluster.home / "token").read_text()
    assert token != operator and operator not in token
    headers = {"Authorization": f"Bearer {token}"}
    spec = {"pipeline": "x", "elements": []}
    assert httpx.post(f"{orchestrator}/pipelines", json=spec, headers=headers).status_code == 403
    assert httpx.get(f"{orchestrator}/nodes", headers=headers).status_code == 403
    directory = httpx.get(f"{orchestrator}/nodes/cloud/directory", headers=headers)
    assert directory.status_code == 200 and operator not in directory.text
    # The agent, which holds only that token, heartbeats with it all the while.
    seen = cluster.node("cloud")["last_seen_s"]
    assert cluster.node("cloud")["healthy"] and seen < 5


def test_dot_dot_names_read_and_delete_nothing_on_a_real_agent(cluster: Cluster) -> None:
    home: Path = cluster.home
    seed = json.loads((home / "broker.json").read_text())["seed"]
    url = cluster.node("cloud")["url"]
    operator = (home / "token").read_text()
    node_home = home / "nodes" / "cloud"
    before = sorted(p.name for p in node_home.iterdir())
    attacks = [
        # <node home>/node-checkpoints/../.. is the node home; one more .. is <home>/nodes.
        ("GET", "/pipelines/../elements/../snapshots/../files/../broker.json"),
        ("GET", "/pipelines/../elements/../snapshots/../files/cloud/token"),
        ("GET", "/pipelines/%2e%2e/elements/%2e%2e/snapshots/%2e%2e/files/..%2Fbroker.json"),
        ("DELETE", "/pipelines/../elements/..?discard=true"),
        ("DELETE", "/pipelines/%2e%2e/elements/%2e%2e?discard=true"),
    ]
    for method, path in attacks:
        status, body = raw(url, method, path, operator)
        assert 400 <= status < 500, (method, path, status, body)
        assert seed not in body and operator not in body
    assert sorted(p.name for p in node_home.iterdir()) == before
    assert (home / "broker.json").exists()
    deadline = time.monotonic() + 10  # still alive and heartbeating
    while time.monotonic() < deadline and not cluster.node("cloud")["healthy"]:
        time.sleep(0.5)
    assert cluster.node("cloud")["healthy"]


def test_a_second_agent_or_orchestrator_of_a_running_cluster_refuses_to_start(
    cluster: Cluster,
) -> None:
    # Started by hand (or by an `up` that took the first for dead), a second agent of a
    # node ran its PEs again into the same checkpoint folder, and a second orchestrator
    # wrote the same registry (two PEs given one epoch).
    home = cluster.home
    data = json.loads((home / "cluster.json").read_text())
    second = {
        "agent": ["serve-agent", "--name", "cloud", "--home", str(home / "nodes" / "cloud"),
                  "--orchestrator", data["orchestrator"]["url"],
                  "--token-file", str(node_token_file(home, "cloud")),
                  "--broker-file", str(node_broker_file(home, "cloud"))],
        "orchestrator": ["serve-orchestrator", "--home", str(home),
                         "--token-file", str(home / "token"),
                         "--broker-file", str(home / "broker.json")],
    }  # fmt: skip
    # (Side by side: each waits a few seconds for the claim to be let go before it gives up.)
    started = {
        what: subprocess.Popen(
            [sys.executable, "-m", "fogshift.cli.main", *args, "--port", str(free_port())],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for what, args in second.items()
    }
    for what, proc in started.items():
        output, _ = proc.communicate(timeout=120)
        out = " ".join(output.split())
        assert proc.returncode == 1, (what, out)
        assert "(already_running)" in out and "another process holds" in out, (what, out)
        assert "Traceback" not in out, (what, out)
    # The first ones run on.
    assert cluster.node("cloud")["healthy"]
    assert all(leads(s["pid"], s["pgid"]) for s in [data["orchestrator"], data["nodes"]["cloud"]])
