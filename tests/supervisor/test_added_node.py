"""A node taken out of a running cluster (`fogshift remove-node`) and added again
(`fogshift up` with a node it lacks), on the shared cluster; then the added node is a member
like the others.

The removal comes first: it ends with the node added again, which the second test needs. An
earlier module that started the shared cluster again whole (a whole-cluster kill) started its
last node with the others instead of adding it (``tests.conftest.shared_cluster``); the
second test would then have to stop and start the whole cluster again (broker, orchestrator,
four JVMs: over a minute of both cores) to see an added node."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from fogshift.broker.client import BrokerAddress
from fogshift.common.http import blob_token, node_token, token_node
from fogshift.common.processes import group_alive
from fogshift.supervisor.cluster import node_broker_file, node_token_file, token_file
from tests.broker.test_permissions import logs_in, until
from tests.conftest import SHARED_NODES, Cluster
from tests.integration.helpers import case1_spec, finish_and_compare, wait_central

pytestmark = pytest.mark.integration

#: The flags whose values are a node's own; every other word of its command is its peers'.
OWN = ("--name", "--home", "--port", "--token-file", "--broker-file")


def _without_own(argv: list[str]) -> list[str]:
    return [word for k, word in enumerate(argv) if k == 0 or argv[k - 1] not in OWN]


def _mode(path: Path) -> str:
    return oct(path.stat().st_mode & 0o777)


def test_a_node_taken_out_is_stopped_forgotten_and_locked_out_then_added_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    name = SHARED_NODES[-1]
    # A stopped pipeline's PE placed there does not keep it (see `start` below), and is
    # said.
    parked = tmp_path / "parked"
    parked.mkdir()
    cluster.cli("deploy", str(case1_spec(parked, "parked", agg_node=name, first=20)))
    cluster.wait_for("parked", "sink", 1)
    wait_central(cluster, "parked", "aggregate")
    cluster.cli("stop", "parked")

    def parked_said(placed: str) -> str:
        return (f"parked/aggregate of stopped pipeline parked {placed} placed on {name}: "
                "`fogshift start parked` restores it on other nodes")  # fmt: skip

    # Refused while it hosts a PE: nothing changes, the pipeline runs on to its exact end.
    spec = case1_spec(tmp_path, "leaving", agg_node=name, first=20)
    cluster.cli("deploy", str(spec))
    dry = " ".join(cluster.cli("remove-node", name, "--dry-run").stdout.split())
    assert f"{name} is kept by: PE leaving/aggregate (`--drain` moves it)" in dry, dry
    assert parked_said("is") in dry, dry
    refused = cluster.cli("remove-node", name, check=False)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0, said
    assert f"node '{name}' still hosts or is named by PE leaving/aggregate" in said
    assert "fogshift migrate" in said  # the way round
    assert not json.loads((cluster.home / "cluster.json").read_text())["removing"]
    assert cluster.node(name)["alive"]

    # With --drain its PE is moved away first (a migration), then it is removed; the
    # pipeline's output stays exact across the move.
    record = json.loads((cluster.home / "cluster.json").read_text())["nodes"][name]
    address = BrokerAddress.load(node_broker_file(cluster.home, name))
    token = node_token_file(cluster.home, name).read_text().strip()
    operator = token_file(cluster.home).read_text().strip()
    # What it copies a peer's replicas with (the node directory hands it out): it opens
    # that peer's blobs (none by this digest) until the node is removed.
    peer = json.loads((cluster.home / "cluster.json").read_text())["nodes"][SHARED_NODES[0]]
    claim = token_node(token)
    assert claim is not None and claim[0] == name, claim
    generation = claim[1]  # (0 unless an earlier run of this test removed it)
    blobs = blob_token(node_token(operator, SHARED_NODES[0]), name, generation)

    def peer_blob(with_token: str = blobs) -> httpx.Response:
        return httpx.get(f"{peer['url']}/checkpoints/blobs/{'0' * 64}", timeout=10,
                         headers={"Authorization": f"Bearer {with_token}"})  # fmt: skip

    assert peer_blob().status_code == 404, peer_blob().text
    done = cluster.cli("remove-node", name, name, "--drain")  # (named twice: once)
    assert f"removed {name}" in " ".join(done.stdout.split())
    assert parked_said("was") in " ".join(done.stdout.split()), done.stdout
    moved_to = cluster.element("leaving", "aggregate")["node"]
    assert moved_to in SHARED_NODES[:-1]
    # Said where it went, not only that the node is gone.
    assert f"moving leaving/aggregate from {name} to {moved_to}" in " ".join(done.stdout.split())
    assert cluster.element("leaving", "aggregate")["last_migration"]["status"] == "migrated"
    finish_and_compare(cluster, tmp_path, "leaving")  # (and stops it)
    assert not group_alive(record["pgid"])  # its agent, JVM and workers stopped
    data = json.loads((cluster.home / "cluster.json").read_text())
    assert sorted(data["nodes"]) == sorted(SHARED_NODES[:-1]) and not data["removing"]
    assert name not in [n["name"] for n in cluster.json("nodes")]
    dry = " ".join(cluster.cli("remove-node", SHARED_NODES[1], "--dry-run").stdout.split())
    assert f"{SHARED_NODES[1]}: nothing keeps it" in dry, dry
    users = json.loads((cluster.home / "broker" / "users.json").read_text())["nodes"]
    assert name not in users
    assert until(lambda: not logs_in(address))
    beat = httpx.post(f"{data['orchestrator']['url']}/nodes/{name}/heartbeat", timeout=10,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"url": record["url"], "ready": True})  # fmt: skip
    assert beat.status_code == 403 and beat.json()["code"] == "node_removed", beat.text
    # Its peers refuse its blob tokens (told by their heartbeats' answers).
    assert until(lambda: peer_blob().status_code == 403), peer_blob().text
    assert f"node '{name}' was removed from the cluster" in peer_blob().json()["message"]
    # The stopped pipeline, started again, has its PE of the removed node restored on
    # another from its central checkpoint (fenced, reprocessing without emitting); its
    # output, with what its input got while it was stopped, stays exact.
    cluster.cli("start", "parked")
    aggregate = cluster.element("parked", "aggregate")
    assert aggregate["node"] in SHARED_NODES[:-1], aggregate
    assert aggregate["last_restore"]["checkpoint"] is not None, aggregate["last_restore"]
    finish_and_compare(cluster, parked, "parked")
    # Added again as any new node: a fresh user, agent and token (its next generation), a
    # member like the others; what the machine taken out holds stays refused everywhere.
    assert cluster.up(SHARED_NODES) == {name}
    view = cluster.node(name)
    assert view["alive"] and view["ready"], view
    assert BrokerAddress.load(node_broker_file(cluster.home, name)).seed != address.seed
    renewed = node_token_file(cluster.home, name).read_text().strip()
    assert token_node(renewed) == (name, generation + 1)
    assert renewed == node_token(operator, name, generation + 1)
    beat = httpx.post(f"{data['orchestrator']['url']}/nodes/{name}/heartbeat", timeout=10,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"url": record["url"], "ready": True})  # fmt: skip
    assert beat.status_code == 403 and beat.json()["code"] == "node_removed", beat.text
    assert f"and the node is in its generation {generation + 1}" in beat.json()["message"]
    # The peer learns the new generation from its heartbeats' answers: the old blob token
    # stays refused, the one the directory hands the new node opens the peer's blobs.
    fresh = blob_token(node_token(operator, SHARED_NODES[0]), name, generation + 1)
    assert until(lambda: peer_blob(fresh).status_code == 404), peer_blob(fresh).text  # a member
    stale = peer_blob()
    assert stale.status_code == 403, stale.text
    assert (
        f"generation {generation}, and the node is in its generation" in (stale.json()["message"])
    )

    # A removal cut short once the node was marked (a crash, ^C): `up` finishes it, and
    # does not wait for the node or start it again meanwhile.
    data = json.loads((cluster.home / "cluster.json").read_text())
    pgid = data["nodes"][name]["pgid"]
    (cluster.home / "cluster.json").write_text(json.dumps({**data, "removing": [name]}))
    assert cluster.up(SHARED_NODES[:-1]) == set()
    assert not group_alive(pgid)
    data = json.loads((cluster.home / "cluster.json").read_text())
    assert sorted(data["nodes"]) == sorted(SHARED_NODES[:-1]) and not data["removing"]
    assert name not in [n["name"] for n in cluster.json("nodes")]
    assert cluster.up(SHARED_NODES) == {name}  # (whole again for the modules after)


def test_an_added_node_is_a_member_like_the_others_and_runs_pes_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    added = SHARED_NODES[-1]
    if added not in cluster.joined:  # (the removal test stopped before adding it again)
        cluster.down()
        cluster.up(SHARED_NODES[:-1])
        cluster.up(SHARED_NODES)
    assert cluster.joined == {added}
    nodes = json.loads((cluster.home / "cluster.json").read_text())["nodes"]
    assert sorted(nodes) == sorted(SHARED_NODES)
    # Started as its peers were (host, orchestrator, the cluster's settings), as itself.
    first = nodes[SHARED_NODES[0]]["argv"]
    argv = nodes[added]["argv"]
    assert _without_own(argv) == _without_own(first)
    assert argv[argv.index("--name") + 1] == added
    assert "--trigger-ms" in argv  # (one of `up`'s settings, copied)
    # Its own token and broker user, secret to its owner.
    token = node_token_file(cluster.home, added)
    assert _mode(token) == "0o600"
    # Of the generation it is in (the removal test above added it again twice).
    claim = token_node(token.read_text().strip())
    assert claim is not None and claim[0] == added, claim
    operator = token_file(cluster.home).read_text().strip()
    assert token.read_text().strip() == node_token(operator, added, claim[1])
    mine = node_broker_file(cluster.home, added)
    assert _mode(mine) == "0o600"
    users = json.loads((cluster.home / "broker" / "users.json").read_text())["nodes"]
    address = BrokerAddress.load(mine)
    assert address.seed == users[added]
    assert len(set(users.values())) == len(SHARED_NODES)  # nobody shares a user
    view = cluster.node(added)
    assert view["alive"] and view["ready"], view
    # And it serves a PE whose rights the orchestrator grants it like any node's.
    spec = case1_spec(tmp_path, "joined", agg_node=added, first=40)
    cluster.cli("deploy", str(spec))
    assert cluster.element("joined", "aggregate")["node"] == added
    finish_and_compare(cluster, tmp_path, "joined")
