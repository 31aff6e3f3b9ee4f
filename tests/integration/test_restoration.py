"""Restoration after node loss, from dual-level checkpoints, exactly-once, with fencing."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fogshift.broker.client import BrokerAddress, SyncJetStream
from fogshift.broker.naming import stream_name
from tests.conftest import Cluster
from tests.integration.helpers import (
    assert_only_new_epochs_after_fence,
    case1_spec,
    finish_and_compare,
    wait_central,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def up_args() -> tuple[str, ...]:
    # Short intervals keep the test quick (defaults 5 s and 15 s); a 1 s duplicate window
    # (default 120 s) makes every outage here longer than the broker's de-duplication.
    return ("--checkpoint-interval", "1", "--central-interval", "2", "--duplicate-window", "1")


@pytest.fixture(scope="module")
def cluster_nodes() -> list[str]:
    return ["cloud", "fog-a", "fog-b", "fog-c"]


def test_restore_after_sigkill_is_exact(cluster: Cluster, tmp_path: Path) -> None:
    spec = case1_spec(tmp_path, "killed", rows=1000, rate=20, detect_after_s=600)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("killed", "sink", 40)
    status = wait_central(cluster, "killed", "aggregate")
    assert status["node_level"]["batch"] >= status["central"]["batch"] >= 0
    # A random moment: mid-batch, between checkpoints, or while one is being taken.
    time.sleep(random.uniform(0, 2))
    os.killpg(cluster.node("fog-a")["pgid"], signal.SIGKILL)
    time.sleep(3)  # longer than the streams' duplicate window (checked below)
    result = cluster.cli("restore", "killed", "aggregate", "--to", "fog-b", "--json")
    report = json.loads(result.stdout)
    assert report["status"] == "restored" and report["epoch"] == 2, report
    assert report["checkpoint"] is not None and report["checkpoint_age_ms"] >= 0
    for key in ("reprocessed_events", "reprocess_ms", "intermediate_events", "intermediate_ms"):
        assert report[key] >= 0
    assert cluster.element("killed", "aggregate")["node"] == "fog-b"
    finish_and_compare(cluster, tmp_path, "killed")
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    try:
        info = client.run(lambda js: js.stream_info(stream_name("killed", "aggregate")))
    finally:
        client.close()
    assert info.config.duplicate_window == pytest.approx(1.0)
    cluster.cli("stop", "killed")


def test_torn_central_checkpoint_falls_back_to_an_older_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    # fog-a was killed by the previous test: this pipeline lives on cloud and fog-b.
    spec = case1_spec(tmp_path, "torn", rows=800, rate=20, agg_node="fog-b", detect_after_s=600)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("torn", "sink", 20)
    folder = cluster.home / "central" / "checkpoints" / "torn" / "source"
    deadline = time.monotonic() + 60
    while len(list(folder.glob("*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    manifests = sorted(folder.glob("*.json"))
    assert len(manifests) >= 2
    newest = json.loads(manifests[-1].read_text())
    older = json.loads(manifests[-2].read_text())
    unique = [
        e["sha256"]
        for rel, e in newest["files"].items()
        if older["files"].get(rel) != e and e["size"] > 0
    ]
    assert unique, "the newest checkpoint shares every file with the older one"
    # Same size, other bytes: only the digest check can tell (and no pull repairs it).
    blob = cluster.home / "central" / "blobs" / unique[0]
    data = blob.read_bytes()
    blob.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    # The source's node (cloud) is alive: the old instance is fenced by the restore.
    report = json.loads(cluster.cli("restore", "torn", "source", "--to", "fog-b", "--json").stdout)
    assert report["checkpoint"] != newest["id"], report
    assert any(newest["id"] in s for s in report["skipped_checkpoints"]), report
    finish_and_compare(cluster, tmp_path, "torn")
    cluster.cli("stop", "torn")


def test_frozen_node_is_restored_automatically_and_its_zombie_never_writes(
    cluster: Cluster, tmp_path: Path
) -> None:
    spec = case1_spec(tmp_path, "zombie", rows=1000, rate=20, agg_node="fog-b", detect_after_s=4)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("zombie", "sink", 40)
    wait_central(cluster, "zombie", "aggregate")
    frozen = cluster.node("fog-b")
    os.killpg(frozen["pgid"], signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 120
        while cluster.element("zombie", "aggregate")["node"] == "fog-b":
            assert time.monotonic() < deadline, "the frozen node's PE was not restored"
            time.sleep(1)
        restored_on = cluster.element("zombie", "aggregate")["node"]
        time.sleep(3)  # the restored instance emits under epoch 2
    finally:
        os.killpg(frozen["pgid"], signal.SIGCONT)
    # The zombie wakes up mid-batch; it must be fenced and removed, never write.
    deadline = time.monotonic() + 60
    while "zombie/aggregate" in cluster.node("fog-b")["elements"]:
        assert time.monotonic() < deadline, "the zombie was not removed from fog-b"
        time.sleep(1)
    assert cluster.element("zombie", "aggregate")["node"] == restored_on
    finish_and_compare(cluster, tmp_path, "zombie")
    assert_only_new_epochs_after_fence(cluster, "zombie", "aggregate")
    cluster.cli("stop", "zombie")


def test_restore_target_that_dies_during_the_restore_is_retried_elsewhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    # fog-a is dead (first test); fog-b woke up (previous test); fog-c has hosted nothing.
    # cloud (source + sink) has no CPU to spare for one more PE in this fog topology, so the
    # planner's redeploy node for the aggregate is fog-c: a restore without --to tries fog-c
    # first and cloud (the least busy of the rest) next.
    (tmp_path / "fog.yaml").write_text(
        "pe_cpu: 10\nnodes: {cloud: {cpu: 25}, fog-a: {cpu: 100}, fog-b: {cpu: 100}, "
        "fog-c: {cpu: 100}}\n"
    )
    cluster.cli("topology", "set", str(tmp_path / "fog.yaml"))
    spec = case1_spec(tmp_path, "retry", rows=1000, rate=20, agg_node="fog-b", detect_after_s=600)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("retry", "sink", 40)
    wait_central(cluster, "retry", "aggregate")
    deadline = time.monotonic() + 60
    while cluster.element("retry", "aggregate")["planned_redeploy"] != "fog-c":
        assert time.monotonic() < deadline, cluster.element("retry", "aggregate")
        time.sleep(0.5)
    os.killpg(cluster.node("fog-b")["pgid"], signal.SIGKILL)
    doomed = cluster.node("fog-c")
    assert doomed["healthy"] and not doomed["elements"], doomed
    restore = subprocess.Popen(
        [sys.executable, "-m", "fogshift.cli.main", "restore", "retry", "aggregate", "--json",
         "--home", str(cluster.home)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    installed = cluster.home / "nodes" / "fog-c" / "checkpoints" / "retry" / "aggregate"
    deadline = time.monotonic() + 120
    while not installed.exists():
        assert restore.poll() is None, restore.communicate()
        assert time.monotonic() < deadline, "the restore never reached fog-c"
        time.sleep(0.02)
    os.killpg(doomed["pgid"], signal.SIGKILL)  # mid-restore: checkpoint installed, not live
    out, err = restore.communicate(timeout=600)
    assert restore.returncode == 0, out + err
    report = json.loads(out)
    assert report["status"] == "restored" and report["target"] == "cloud", report
    assert [a["node"] for a in report["attempts"]] == ["fog-c"], report
    assert report["epoch"] == report["attempts"][0]["epoch"] + 1, report
    assert cluster.element("retry", "aggregate")["node"] == "cloud"
    finish_and_compare(cluster, tmp_path, "retry")
