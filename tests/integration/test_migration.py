"""Live migration with real agents: exactly-once output through many migrations, rollback."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fogshift.checkpoint.central import KnownBlobs
from fogshift.checkpoint.chunks import CHUNKED_MIN_BYTES, file_chunks
from fogshift.checkpoint.spark_dir import CHUNKS_FOLDER, OMITTED
from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.http import ServiceClient, node_token
from fogshift.common.progress import progress_params
from fogshift.common.waiting import wait_until
from fogshift.contracts import ElementProgress
from fogshift.migration.procedure import fetch_checkpoint
from fogshift.supervisor.cluster import load_cluster
from tests.conftest import Cluster
from tests.integration.helpers import (
    assert_no_older_epoch_after,
    case1_spec,
    finish_and_compare,
    keyed_windows,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster_needs() -> tuple[str, ...]:
    """The pipelines run on cloud, fog-a and fog-b. Other nodes an earlier module killed stay
    down (tests/conftest.py)."""
    return ("cloud", "fog-a", "fog-b")


NODES = ["cloud", "fog-a", "fog-b"]


def migrate(cluster: Cluster, pipeline: str, element: str, to: str, mode: str) -> dict[str, Any]:
    result = cluster.cli(
        "migrate", pipeline, element, "--to", to, "--mode", mode, "--json", check=False
    )
    report = json.loads(result.stdout) if result.stdout.strip() else {}
    report["exit_code"] = result.returncode
    report["stderr"] = result.stderr
    return report


def test_many_migrations_during_a_stream_keep_output_exact(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Keyed: the aggregate keeps one window per sensor, 50 of them, and every key's state
    # moves with each migration (the reference keeps a window per sensor too).
    spec = case1_spec(tmp_path, "bounce", keys=50)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("bounce", "sink", 20)
    placement = {"source": "cloud", "aggregate": "fog-a", "sink": "cloud"}
    # Each kind of PE, each mode for the stateful one; every migration starts a query,
    # which is what costs time here. The handover runs the target live beside the origin
    # under the next epoch (make-before-break). One right after another: how long each
    # takes varies by seconds from run to run, so where in a batch or between the
    # feeder's appends each one pauses its PE varies anyway (a pause before each, seeded
    # and under a second, added nothing to that).
    plan = [("aggregate", "precopy", "fog-b"), ("aggregate", "literal", "cloud"),
            ("aggregate", "handover", "fog-a"), ("source", "precopy", "fog-a"),
            ("sink", "literal", "fog-b")]  # fmt: skip
    reports = []
    handed_over = False
    for element, mode, target in plan:
        assert target != placement[element] and target in NODES
        report = migrate(cluster, "bounce", element, target, mode)
        assert report["exit_code"] == 0, (report.get("error"), report["stderr"])
        assert report["status"] == "migrated"
        assert (report["origin"], report["target"]) == (placement[element], target)
        expected_phases = (
            {"prepare", "follow", "fence", "invoke", "finalize"} if mode == "handover"
            else {"pause", "state", "invoke", "finalize"}
        )  # fmt: skip
        assert expected_phases <= set(report["phases_ms"]), report["phases_ms"]
        if mode != "literal":  # a warm target: where its prepare went, step by step
            steps = report["prepare_ms"]
            assert set(steps) == {"copy", "warm", "converge"}, steps
            assert sum(steps.values()) <= report["phases_ms"]["prepare"] + 1, report
        # Only the handover takes a new epoch (precopy and literal never run two writers).
        handed_over |= mode == "handover"
        assert report["epoch"] == (2 if element == "aggregate" and handed_over else 1), report
        assert report["state_bytes"] > 0
        placement[element] = target
        reports.append(report)
        status = {e["element"]: e for e in cluster.status("bounce")["elements"]}
        assert status[element]["node"] == target

    # Bad migrations are refused, changing nothing (the pipeline runs on: its output is
    # compared below): an unknown node, the node the PE runs on, an unknown element ...
    unknown = migrate(cluster, "bounce", "aggregate", "fog-z", "precopy")
    assert unknown["exit_code"] == 1 and "unknown node 'fog-z'" in unknown["stderr"]
    here = placement["aggregate"]
    same = migrate(cluster, "bounce", "aggregate", here, "precopy")
    assert same["exit_code"] == 2 and f"already runs on node '{here}'" in same["stderr"]
    elsewhere = next(n for n in NODES if n != placement["sink"])
    no_pe = migrate(cluster, "bounce", "nope", elsewhere, "precopy")
    assert no_pe["exit_code"] == 1 and "has no element 'nope'" in no_pe["stderr"]
    # ... and a sink's handover: two sinks side by side would both write the file.
    sink = migrate(cluster, "bounce", "sink", elsewhere, "handover")
    assert sink["exit_code"] == 2 and "cannot be handed over" in sink["stderr"], sink
    assert "--mode precopy" in sink["stderr"]

    # What the nodes say they host comes with their heartbeats (every second): right after
    # the last migration one may still be a beat behind. Each PE on exactly its node, soon.
    def hosting() -> dict[str, list[str]]:
        hosts = {n["name"]: n["elements"] for n in cluster.json("nodes")}
        return {e: [n for n, hosted in hosts.items() if f"bounce/{e}" in hosted] for e in placement}

    with contextlib.suppress(WaitTimedOut):
        wait_until(
            lambda: hosting() == {e: [n] for e, n in placement.items()},
            30,
            interval_s=0.5,
            describe="the nodes' heartbeats show the placement",
        )
    assert hosting() == {e: [n] for e, n in placement.items()}
    # The input flowed during every migration: the feeder stops in finish_and_compare.
    finish_and_compare(cluster, tmp_path, "bounce", stop=False)
    measured = [r["downtime_ms"] for r in reports if r["downtime_ms"] is not None]
    assert measured, "no migration saw the target process new input"
    # Each sensor's twin, read from the live state store where the aggregate now runs,
    # holds the last 10 valid values of that sensor in the whole input.
    windows = keyed_windows(tmp_path / "in.csv", "sensor", "value", 10)

    # The state is read as of the aggregate's newest committed batch; its last batch's
    # outputs reach the sink before that batch commits (a loaded machine showed it).
    def state() -> dict[str, Any]:
        return cluster.json("state", "bounce", "aggregate")

    with contextlib.suppress(WaitTimedOut):
        wait_until(
            lambda: {e["key"]: e["state"]["values"] for e in state()["entries"]} == windows,
            30,
            interval_s=0.5,
            describe="the aggregate's last batch committed",
        )
    twins = state()
    assert (twins["node"], twins["key_by"], twins["keys"]) == (
        placement["aggregate"],
        "sensor",
        len(windows),
    )
    assert twins["batch"] is not None
    assert {e["key"]: e["state"]["values"] for e in twins["entries"]} == windows
    # The handover cut the origin off with the target's epoch: nothing under the old one
    # came after the first message under the new one.
    assert_no_older_epoch_after(cluster, "bounce", "aggregate", epoch=2)
    refused = cluster.cli("state", "bounce", "source", check=False)
    assert refused.returncode != 0 and "holds no state" in " ".join(refused.stderr.split())
    cluster.cli("stop", "bounce")


def test_concurrent_migrations_of_one_pe_conflict(cluster: Cluster, tmp_path: Path) -> None:
    # On the JVM engine: its state moves with the checkpoint as the Python engine's does.
    spec = case1_spec(tmp_path, "race", engine="jvm")
    cluster.cli("deploy", str(spec))
    cluster.wait_for("race", "sink", 10)
    data = json.loads((cluster.home / "cluster.json").read_text())
    token = (cluster.home / "token").read_text().strip()
    url = data["orchestrator"]["url"] + "/pipelines/race/elements/aggregate/migrate"
    results: dict[str, httpx.Response] = {}

    def go(target: str) -> None:
        results[target] = httpx.post(
            url,
            json={"target": target},
            headers={"Authorization": f"Bearer {token}"},
            timeout=300,
        )

    threads = [threading.Thread(target=go, args=(t,)) for t in ("fog-b", "cloud")]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results.values())
    assert codes == [200, 409], {k: r.text[:300] for k, r in results.items()}
    loser = next(r for r in results.values() if r.status_code == 409)
    assert "already being migrated" in loser.json()["message"]
    finish_and_compare(cluster, tmp_path, "race")


def test_a_shipped_checkpoint_leaves_out_what_the_central_store_holds(
    cluster: Cluster, tmp_path: Path
) -> None:
    pad = 2 * 1024 * 1024
    spec = case1_spec(tmp_path, "lean", pad_bytes=pad)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("lean", "sink", 150)
    node = "fog-a"  # case1_spec's
    url = next(n["url"] for n in cluster.json("nodes") if n["name"] == node)
    _, token = load_cluster(cluster.home)
    here = "/pipelines/lean/elements/aggregate"
    with ServiceClient(url, node_token(token, node), f"node agent {node!r}", 60) as agent:
        # Past the first batch: a warm copy of batch 0 holds no state by design (it resumes
        # by running batch 0 again), and under load batch 0 may read the first two appends.
        copies: list[Any] = []

        def past_batch_0() -> bool:
            copies.append(fetch_checkpoint(agent, here, warm=True))
            return (copies[-1].info.batch or 0) >= 1

        wait_until(past_batch_0, 120, describe="a warm copy of lean/aggregate past batch 0")
        # The agent's long poll: a request naming what the caller last saw waits there until
        # a batch commits (Spark's report of it), so a caller waiting for the next commit
        # asks a few times, not every 20 ms (each ask is ~5 ms of the node's CPU).
        first = now = agent.call(ElementProgress, "GET", here + "/progress")
        asked, began = 0, time.monotonic()
        while now.progress == first.progress and time.monotonic() - began < 120:
            params = progress_params(now, 2.0)
            now = agent.call(ElementProgress, "GET", here + "/progress", params=params)
            asked += 1
        assert now.progress > first.progress, (first, now)
        assert (now.committed_batch or 0) > (first.committed_batch or 0), (first, now)
        # Every answer but the last waited its 2 s for a change.
        assert asked <= (time.monotonic() - began) / 2.0 + 1, asked
        whole = copies[-1]
        # What a store would hold after pulling that copy: its files, by content.
        blobs = tmp_path / "blobs"
        blobs.mkdir()
        with tarfile.open(fileobj=io.BytesIO(whole.data)) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    content = tar.extractfile(member).read()  # type: ignore[union-attr]
                    (blobs / hashlib.sha256(content).hexdigest()).write_bytes(content)
        known = KnownBlobs(frozenset(p.name for p in blobs.iterdir()), lambda s: blobs / s)
        lean = fetch_checkpoint(agent, here, warm=True, known=known)
        # A store holding the large files' chunks but not the files (RocksDB rewrote them).
        large = {p.name: p.read_bytes() for p in blobs.iterdir()
                 if p.stat().st_size >= CHUNKED_MIN_BYTES}  # fmt: skip
        held = {d: data[o : o + n] for data in large.values() for o, n, d in file_chunks(data)}
        chunked = KnownBlobs(known.digests - set(large), known.path, frozenset(held), held.get)
        rebuilt = fetch_checkpoint(agent, here, warm=True, known=chunked)
    # The 2 MiB of state stayed on the node; the archive holds them all the same.
    assert whole.shipped == len(whole.data) > pad
    assert large and rebuilt.shipped < 512 * 1024 < pad < len(rebuilt.data)
    assert lean.shipped < 512 * 1024 < pad < len(lean.data)
    for fetched in (lean, rebuilt):
        assert hashlib.sha256(fetched.data).hexdigest() == fetched.digest
        with tarfile.open(fileobj=io.BytesIO(fetched.data)) as tar:
            assert OMITTED not in tar.getnames()
            assert not [n for n in tar.getnames() if n.startswith(CHUNKS_FOLDER)]

    # A migration once the cluster's central store holds a checkpoint of the PE asks for
    # such a copy (how much stays behind depends on what RocksDB wrote since that pull):
    # the target installs it whole and the output stays exact.
    def pulled() -> bool:
        views = [c for n in cluster.json("nodes") for c in n.get("checkpoints") or []]
        return any(v["element"] == "lean/aggregate" and v["central"] for v in views)

    wait_until(pulled, 60, describe="a central checkpoint of lean/aggregate")
    precopy = migrate(cluster, "lean", "aggregate", "fog-b", "precopy")
    assert precopy["exit_code"] == 0, precopy
    assert precopy["state_bytes"] > pad
    assert 0 < precopy["shipped_bytes"] <= precopy["state_bytes"]
    # Megabytes of state go on, the other way (to the cloud) and the other mode (literal:
    # paused, then the whole state shipped).
    literal = migrate(cluster, "lean", "aggregate", "cloud", "literal")
    assert literal["exit_code"] == 0, literal
    # The shipped archive holds the state (base64 of random bytes: LZ4 keeps it whole).
    assert literal["state_bytes"] > pad * 0.7, literal["state_bytes"]
    finish_and_compare(cluster, tmp_path, "lean")
