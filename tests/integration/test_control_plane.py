"""The orchestrator SIGKILLed in the middle of a migration (one of a group's too), a restore
or a scale, with real processes.

Each test has the running orchestrator stop at a named step (its test hook file), SIGKILLs it
there and starts a new one (``fogshift up`` on a cluster whose orchestrator died). The new
one finds the operation in its journal and rolls it back or completes it: no PE stays
paused, none stays fenced with nobody writing, and the output is exactly the reference.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, fogshift
from tests.integration.control import (
    kill_orchestrator,
    pause_at,
    release_pause,
    restart_orchestrator,
    start_cli,
    wait_logged,
)
from tests.integration.helpers import (
    assert_only_new_epochs_after_fence,
    case1_spec,
    finish_and_compare,
)

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def no_pause_left(cluster: Cluster) -> Iterator[None]:
    """A test that failed before it killed the orchestrator it had stop leaves no stop asked
    for, and no orchestrator held at one."""
    yield
    release_pause(cluster)


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 120) -> Any:
    """Poll ``check`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.5)


def hosts(cluster: Cluster, key: str) -> dict[str, int]:
    """The nodes whose agents report an instance of ``key`` (pipeline/element), with its epoch."""
    return {
        n["name"]: c["epoch"]
        for n in cluster.json("nodes")
        for c in n["checkpoints"]
        if c["element"] == key
    }


def test_killed_while_a_migration_holds_the_origin_it_is_rolled_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    spec = case1_spec(tmp_path, "held")
    cluster.cli("deploy", str(spec))
    cluster.wait_for("held", "sink", 10)
    since = pause_at(cluster, "migration:switching")
    migration = start_cli(cluster, "migrate", "held", "aggregate", "--to", "fog-b", "--json")
    wait_logged(cluster, "test pause at migration:switching", since)
    # The origin is paused at its gate now; the warm target waits behind its own.
    wait_until("the origin paused", lambda: cluster.element("held", "aggregate")["state"]
               == "paused")  # fmt: skip
    since = restart_orchestrator(cluster)  # SIGKILL right there, then a plain one
    assert migration.wait(timeout=60) != 0
    logged = wait_logged(cluster, "recovery: migration", since)
    # Left while switching, the target's start may have been sent: fenced anew.
    rolled = re.search(r"rolled back: fog-a runs under epoch (\d+)", logged)
    assert "left at 'switching'" in logged and rolled is not None, logged
    epoch = int(rolled.group(1))
    assert epoch > 1
    wait_until(
        "the origin running again, alone",
        lambda: (
            cluster.element("held", "aggregate")["state"] == "running"
            and hosts(cluster, "held/aggregate") == {"fog-a": epoch}
        ),
    )
    assert cluster.element("held", "aggregate")["node"] == "fog-a"
    finish_and_compare(cluster, tmp_path, "held")


def test_killed_after_the_routing_change_of_a_migration_it_is_completed(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The aggregate's migration is the first of a group's (aggregate, then sink): completed
    # by the next orchestrator, which then carries the group on and moves the sink too.
    spec = case1_spec(tmp_path, "routed")
    cluster.cli("deploy", str(spec))
    cluster.wait_for("routed", "sink", 10)
    since = pause_at(cluster, "migration:routed")
    said = tmp_path / "migrate.err"
    migration = start_cli(cluster, "migrate", "routed", "--elements", "aggregate,sink", "--to",
                          "fog-b", stderr_to=said)  # fmt: skip
    wait_logged(cluster, "test pause at migration:routed", since)
    assert cluster.element("routed", "aggregate")["node"] == "fog-b"  # the placement moved
    assert cluster.element("routed", "sink")["node"] == "cloud"
    # Its phases on stderr as it runs (no terminal: each once; a group's said none). The
    # CLI polls them: a short phase may pass unseen, the one the orchestrator stops at not.
    held = "migration of routed/aggregate fog-a -> fog-b: routed"
    wait_until("the CLI showing the phase held", lambda: held in said.read_text())
    since = restart_orchestrator(cluster)
    assert migration.wait(timeout=60) != 0
    migration.communicate()
    lines = [line.strip() for line in said.read_text().splitlines()]
    assert lines.count(held) == 1, lines
    logged = wait_logged(cluster, "recovery: migration", since)
    assert "left at 'routed'" in logged and "completed: fog-b is the PE" in logged
    # (Not the line of a try held up, which names the group too: its decision.)
    logged = wait_logged(cluster, "carried on: migrated", since)
    assert "recovery: group migration" in logged and "left by orchestrator" in logged, logged
    wait_until(
        "the targets running, the origins gone",
        lambda: (
            cluster.element("routed", "aggregate")["state"] == "running"
            and hosts(cluster, "routed/aggregate") == {"fog-b": 1}
            and cluster.element("routed", "sink")["state"] == "running"
            and set(hosts(cluster, "routed/sink")) == {"fog-b"}
        ),
    )
    finish_and_compare(cluster, tmp_path, "routed")


def test_killed_in_the_middle_of_a_restore_the_pe_runs_under_the_newest_epoch(
    cluster: Cluster, tmp_path: Path
) -> None:
    spec = case1_spec(tmp_path, "fenced")
    cluster.cli("deploy", str(spec))
    cluster.wait_for("fenced", "sink", 10)
    # A restore onto the node the PE runs on is refused, and nothing is fenced or discarded.
    refused = cluster.cli("restore", "fenced", "aggregate", "--to", "fog-a", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "already runs on node 'fog-a'" in " ".join(refused.stderr.split()), refused.stderr
    assert hosts(cluster, "fenced/aggregate") == {"fog-a": 1}
    since = pause_at(cluster, "restore:installing")
    restore = start_cli(cluster, "restore", "fenced", "aggregate", "--to", "fog-b", "--json")
    # Stopped after the fence (epoch 2): fog-a's instance is fenced, no other runs yet.
    wait_logged(cluster, "test pause at restore:installing", since)
    since = restart_orchestrator(cluster)
    assert restore.wait(timeout=60) != 0
    logged = wait_logged(cluster, "recovery: restore", since)
    assert "left at 'installing'" in logged and "restarted" in logged, logged
    # The restart fences again (epoch 3) and restores on a node other than fog-a.
    node = wait_until(
        "the PE running under epoch 3, alone",
        lambda: (
            (e := cluster.element("fenced", "aggregate"))["state"] == "running"
            and hosts(cluster, "fenced/aggregate") == {e["node"]: 3}
            and e["node"]
        ),
    )
    assert node != "fog-a"
    finish_and_compare(cluster, tmp_path, "fenced")
    assert_only_new_epochs_after_fence(cluster, "fenced", "aggregate", epoch=3)


def test_killed_in_the_middle_of_a_scale_it_is_carried_on_to_the_count_asked(
    cluster: Cluster, tmp_path: Path
) -> None:
    spec = case1_spec(tmp_path, "rescaled", keys=12, partitions=["fog-a", "fog-b"])
    cluster.cli("deploy", str(spec))
    cluster.wait_for("rescaled", "sink", 10)
    since = pause_at(cluster, "scale:placed")
    scale = start_cli(cluster, "scale", "rescaled", "aggregate", "--partitions", "3", "--on",
                      "fog-c", "--json")  # fmt: skip
    # Stopped with the third partition placed and its consumer reading it, and no key of
    # the rescale its yet: the record was never stored.
    wait_logged(cluster, "test pause at scale:placed", since)
    since = restart_orchestrator(cluster)
    assert scale.wait(timeout=60) != 0
    # (A standby's start or a key move holding a PE would make it wait for a later round.)
    logged = wait_logged(cluster, "carried on: moved", since)
    assert "rescaled/aggregate to 3 partitions, left by orchestrator" in logged, logged
    parts = [(e["element"], e["node"], e["partitions"])
             for e in cluster.status("rescaled")["elements"] if e["partition_of"]]  # fmt: skip
    assert parts == [("aggregate-p0", "fog-a", 3), ("aggregate-p1", "fog-b", 3),
                     ("aggregate-p2", "fog-c", 3)]  # fmt: skip
    # The rescale is stored: the same scale again finds nothing left to do.
    again = cluster.json("scale", "rescaled", "aggregate", "--partitions", "3")
    assert (again["status"], again["moved"]) == ("moved", 0), again
    finish_and_compare(cluster, tmp_path, "rescaled")


def test_an_up_while_a_node_is_frozen_keeps_the_orchestrator_it_started(
    cluster: Cluster,
) -> None:
    # `up` restarted a dead orchestrator, then killed it again once a node whose processes
    # run (frozen: SIGSTOP, a hung machine) stayed silent past its --timeout: the pipelines
    # ran on with nothing to restore or supervise them, and every `up` while the node was
    # frozen did the same. (--timeout bounds the orchestrator's start too: room for a
    # loaded machine; the frozen node stays silent however long.)
    frozen = next(n for n in cluster.json("nodes")[1:] if n["healthy"])
    os.killpg(frozen["pgid"], signal.SIGSTOP)
    try:
        wait_until(f"{frozen['name']} silent", lambda: not cluster.node(frozen["name"])["healthy"])
        kill_orchestrator(cluster)
        result = fogshift(
            "up", "--nodes", ",".join(cluster.nodes), *cluster.up_args, "--timeout", "12",
            "--home", str(cluster.home), env=cluster.up_env(), check=False,
        )  # fmt: skip
        said = " ".join(result.stderr.split())
        assert result.returncode != 0, said
        assert "the orchestrator runs again, but not every node" in said, said
        assert frozen["name"] in said and "frozen or hung" in said, said
        assert {n["name"] for n in cluster.json("nodes")} >= {frozen["name"]}  # it answers
    finally:
        os.killpg(frozen["pgid"], signal.SIGCONT)
    wait_until(f"{frozen['name']} healthy again", lambda: cluster.node(frozen["name"])["healthy"])
