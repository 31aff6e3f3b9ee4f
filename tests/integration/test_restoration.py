"""Restoration after node loss, from dual-level checkpoints, exactly-once, with fencing."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.client import BrokerAddress, SyncJetStream, fetch_range, last_seq
from fogshift.broker.naming import fence_subject, stream_name
from fogshift.events import EPOCH_HEADER
from tests.conftest import Cluster
from tests.integration.helpers import case1_spec, finish_and_compare

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def up_args() -> tuple[str, ...]:
    # Short intervals keep the test quick (defaults 5 s and 15 s); a 1 s duplicate window
    # (default 120 s) makes every outage here longer than the broker's de-duplication.
    return ("--checkpoint-interval", "1", "--central-interval", "2", "--duplicate-window", "1")


def node(cluster: Cluster, name: str) -> dict[str, Any]:
    return next(n for n in cluster.json("nodes") if n["name"] == name)


def wait_central(cluster: Cluster, pipeline: str, element: str, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for n in cluster.json("nodes"):
            for c in n.get("checkpoints", []):
                if c["element"] == f"{pipeline}/{element}" and c["central"]:
                    return dict(c)
        time.sleep(0.5)
    raise AssertionError(f"no central checkpoint of {pipeline}/{element} in {timeout_s}s")


def test_restore_after_sigkill_is_exact(cluster: Cluster, tmp_path: Path) -> None:
    spec = case1_spec(tmp_path, "killed", rows=1000, rate=20, detect_after_s=600)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("killed", "sink", 40)
    status = wait_central(cluster, "killed", "aggregate")
    assert status["node_level"]["batch"] >= status["central"]["batch"] >= 0
    os.killpg(node(cluster, "fog-a")["pgid"], signal.SIGKILL)
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
    frozen = node(cluster, "fog-b")
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
    while "zombie/aggregate" in node(cluster, "fog-b")["elements"]:
        assert time.monotonic() < deadline, "the zombie was not removed from fog-b"
        time.sleep(1)
    assert cluster.element("zombie", "aggregate")["node"] == restored_on
    finish_and_compare(cluster, tmp_path, "zombie")
    address = BrokerAddress.load(cluster.home / "broker.json")
    client = SyncJetStream(address)
    try:
        stream = stream_name("zombie", "aggregate")
        end = client.run(lambda js: last_seq(js, stream))
        msgs = client.run(lambda js: fetch_range(js, stream, "fs.zombie.aggregate.>", 0, end))
    finally:
        client.close()
    fences = [m for m in msgs if m.subject == fence_subject("zombie", "aggregate")]
    assert fences, "no fence marker was written"
    after = [m for m in msgs if m.metadata.sequence.stream > fences[-1].metadata.sequence.stream]
    assert after and all(int(m.headers[EPOCH_HEADER]) >= 2 for m in after)
