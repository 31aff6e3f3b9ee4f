"""The planner wired in: a PE's checkpoint is copied to its planned backup node, and when its
node dies it is restored on its planned redeploy node from that copy, exactly-once."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster
from tests.integration.helpers import case1_spec, finish_and_compare

pytestmark = pytest.mark.integration

# cloud (source + sink) and fog-b have no CPU to spare for one more PE (pe_cpu 10), so the
# aggregate on fog-a can only be redeployed on fog-c; keeping its backup there too makes
# the recovery transfer zero, the planner's optimum.
FOG = """
central: cloud
pe_cpu: 10
nodes: {cloud: {cpu: 25}, fog-a: {cpu: 100}, fog-b: {cpu: 12}, fog-c: {cpu: 100}}
links:
  - {a: cloud, b: fog-a, bandwidth: 5}
  - {a: fog-a, b: fog-c, bandwidth: 100}
  - {a: cloud, b: fog-b, bandwidth: 100}
  - {a: cloud, b: fog-c, bandwidth: 5}
"""


def wait(what: str, check: Any, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_node_loss_restores_on_the_planned_node_from_the_planned_backup(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "fog.yaml").write_text(FOG)
    cluster.cli("topology", "set", str(tmp_path / "fog.yaml"))
    spec = case1_spec(tmp_path, "planned", agg_node="fog-a", detect_after_s=4)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("planned", "sink", 40)
    agg = wait(
        "a plan for the aggregate",
        lambda: (e := cluster.element("planned", "aggregate"))["planned_redeploy"] and e,
    )
    assert (agg["planned_backup"], agg["planned_redeploy"]) == ("fog-c", "fog-c"), agg
    plan = json.loads(cluster.cli("topology", "show", "--json").stdout)
    assert plan["error"] is None and plan["assignments"]["planned/aggregate"]["backup"] == "fog-c"
    # The extra copy reaches the backup node (pushed after a central pull).
    wait(
        "a replica of the aggregate on fog-c",
        lambda: any(r.startswith("planned/aggregate@") for r in cluster.node("fog-c")["replicas"]),
    )
    os.killpg(cluster.node("fog-a")["pgid"], signal.SIGKILL)
    restored = wait(
        "the automatic restore",
        lambda: (e := cluster.element("planned", "aggregate"))["node"] != "fog-a" and e,
    )
    report = restored["last_restore"]
    assert restored["node"] == "fog-c" and report["status"] == "restored", report
    # Its own copy was used: at most the files of checkpoints newer than it were fetched.
    assert report["checkpoint_source"] == "replica@fog-c", report
    assert report["fetched_bytes"] < report["state_bytes"], report
    finish_and_compare(cluster, tmp_path, "planned")
