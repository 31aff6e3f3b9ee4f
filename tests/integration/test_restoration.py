"""Restoration after node loss, from dual-level checkpoints, exactly-once, with fencing."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fogshift.agent.runs import RUN_FILE
from fogshift.broker.client import (
    BrokerAddress,
    SyncJetStream,
    last_seq,
    next_message,
    subject_counts,
)
from fogshift.broker.exceptions import FENCED_TOKEN
from fogshift.broker.naming import data_subject, dead_subject, fence_subject, stream_name
from fogshift.broker.publish import last_position
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.spark_dir import progress_of
from fogshift.common.waiting import wait_until
from fogshift.events import EPOCH_HEADER
from tests.conftest import Cluster, group_alive
from tests.integration.control import kill_orchestrator
from tests.integration.helpers import (
    FEEDERS,
    assert_no_older_epoch_after,
    assert_only_new_epochs_after_fence,
    case1_spec,
    finish_and_compare,
    stream_messages,
    wait_central,
)

pytestmark = pytest.mark.integration


def rows_read(cluster: Cluster, pipeline: str, source: str = "source") -> int:
    """How many rows a csv-source has read so far: its events and its dead letters."""
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    try:
        counts = client.run(partial(subject_counts, stream=stream_name(pipeline, source)))
    finally:
        client.close()
    return counts.get(data_subject(pipeline, source), 0) + counts.get(
        dead_subject(pipeline, source), 0
    )


def freeze_past_central_checkpoint(
    cluster: Cluster, pipeline: str, element: str, pgid: int, timeout_s: float = 60
) -> tuple[int, int]:
    """SIGSTOP process group ``pgid`` (the node hosting ``element``) at a moment when the PE has
    emitted output derived from input beyond its newest central checkpoint.

    Once the node is frozen no further central checkpoint of the PE can be taken (its agent
    answers no pull), so what a restore will reprocess is fixed: the input between that
    checkpoint and the last output. Returns ``(position of the last output, position of the
    newest central checkpoint)``.
    """
    central = CentralStore(cluster.home / "central")
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    stream = stream_name(pipeline, element)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            os.killpg(pgid, signal.SIGSTOP)
            time.sleep(0.5)  # a pull in flight completes (all fetched) or stalls (it cannot)
            _, (emitted, _), _ = client.run(lambda js: last_position(js, stream))
            newest = central.manifests(pipeline, element)
            checkpoint = progress_of(newest[0]["offset"]) if newest else 0
            if emitted > checkpoint:
                return emitted, checkpoint
            os.killpg(pgid, signal.SIGCONT)
            assert time.monotonic() < deadline, f"{element} never emitted past its checkpoint"
            time.sleep(random.uniform(0.5, 1.5))
    finally:
        client.close()


def wait_trimmed(cluster: Cluster, pipeline: str, element: str, timeout_s: float = 60) -> None:
    """Wait until the oldest data records of the PE's stream were trimmed (``history_s``)."""
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    stream, data = stream_name(pipeline, element), data_subject(pipeline, element)
    try:
        wait_until(
            lambda: (
                (first := client.run(lambda js: next_message(js, stream, data))) is not None
                and first.seq > 1
            ),
            timeout_s,
            interval_s=0.5,
            describe=f"the oldest records of {pipeline}/{element} trimmed",
        )
    finally:
        client.close()


def wait_for_epoch(
    cluster: Cluster, pipeline: str, element: str, epoch: int, timeout_s: float = 60
) -> None:
    """Wait until the PE's output stream ends with a record (not a fence marker) of ``epoch``
    or newer: the instance that got it writes."""
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    stream = stream_name(pipeline, element)

    async def last(js: Any) -> tuple[str, int]:
        msg = await js.get_msg(stream, seq=await last_seq(js, stream))
        return msg.subject, int((msg.headers or {}).get(EPOCH_HEADER, 0))

    deadline = time.monotonic() + timeout_s
    try:
        while True:
            subject, seen = client.run(last)
            if seen >= epoch and subject != fence_subject(pipeline, element):
                return
            assert time.monotonic() < deadline, f"nothing was written under epoch {epoch}"
            time.sleep(0.2)
    finally:
        client.close()


# The tests run in file order on the shared cluster, and each node (a JVM) killed here costs
# a restart of about 25 s: first the one test that starts its node again (only fog-b), then
# those that kill no node (they freeze one, or the orchestrator), then the two that kill
# nodes and leave them down (fog-a, then fog-c) for the next module's heal.


def _back_damaged(
    cluster: Cluster, tmp_path: Path, damages: dict[str, Callable[[Path], None]],
    history_s: float | None = None, older_central: Collection[str] = (),
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Deploy Case 1 as each pipeline of ``damages`` (its aggregate on fog-b, its files in a
    folder of its own), SIGKILL fog-b once each aggregate has a central checkpoint (two for
    the pipelines of ``older_central``: one of them is then of a batch before the last the
    node committed; and, with ``history_s``, once each source's oldest records were
    trimmed), apply each damage to
    fog-b's folder, bring it back within ``detect_after_s`` and wait for each aggregate's
    restore; their reports, by pipeline, after each output was compared. (One kill and one
    node start for them all: a node's start costs 10 to 20 s.)"""
    works = {pipeline: tmp_path / pipeline for pipeline in damages}
    for pipeline, work in works.items():
        work.mkdir()
        spec = case1_spec(work, pipeline, agg_node="fog-b", detect_after_s=600,
                          history_s=history_s)  # fmt: skip
        cluster.cli("deploy", str(spec))
    for pipeline in works:
        cluster.wait_for(pipeline, "sink", 20)
        if history_s is not None:
            wait_trimmed(cluster, pipeline, "source")
        wait_central(cluster, pipeline, "aggregate")
        if pipeline in older_central:
            kept = cluster.home / "central" / "checkpoints" / pipeline / "aggregate"
            wait_until(lambda kept=kept: len(list(kept.glob("b*.json"))) >= 2, 90,
                       describe=f"two central checkpoints of {pipeline}/aggregate")  # fmt: skip
    node = cluster.node("fog-b")
    os.killpg(node["pgid"], signal.SIGKILL)
    wait_until(lambda: not group_alive(node["pgid"]), 30, describe="fog-b's processes gone")
    for damage in damages.values():
        damage(cluster.home / "nodes" / "fog-b")
    assert all(FEEDERS[w].feeding for w in works.values()), (
        "an input ended before the node came back"
    )
    cluster.heal()
    reports: dict[str, dict[str, Any]] = {}
    for pipeline in works:
        element = wait_until(
            lambda pipeline=pipeline: (
                (e := cluster.element(pipeline, "aggregate"))["last_restore"]
                and e["last_restore"]["status"] == "restored"
                and e
            ),
            180,
            interval_s=0.5,
            describe=f"{pipeline}'s aggregate restored on its node",
        )
        report: dict[str, Any] = element["last_restore"]
        assert element["node"] == "fog-b" and report["target"] == "fog-b", element
        assert report["checkpoint"] is not None and report["epoch"] >= 2, report
        reports[pipeline] = report
    for pipeline, work in works.items():
        finish_and_compare(cluster, work, pipeline)
        assert_no_older_epoch_after(cluster, pipeline, "aggregate", reports[pipeline]["epoch"])
    return reports


def test_a_node_back_without_its_disk_gets_its_pe_from_the_central_checkpoint(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Every node is up (the module's cluster is healed first). The aggregate's node dies and
    # comes back (within detect_after_s: nothing is restored elsewhere) with an empty disk,
    # after the aggregate's oldest input was trimmed: started from nothing it would read past
    # the trimmed records and fail at its first batch. The reconciler restores it in place
    # from its newest central checkpoint instead.
    def wipe(home: Path) -> None:
        for lost in ("checkpoints", "node-checkpoints", "query-locations", "gates", "replicas"):
            shutil.rmtree(home / lost, ignore_errors=True)

    _back_damaged(cluster, tmp_path, {"wiped": wipe}, history_s=1)


def test_a_node_back_with_a_torn_state_file_gets_its_pes_from_central(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Two pipelines' aggregates on the node; it comes back (its machine never down: its
    # agent trusts its checkpoints) with
    # - tornstate's state file emptied (a disk's fault, or a power loss: Spark syncs none of
    #   its files): every start failed at its first batch (CANNOT_LOAD_STATE_STORE), the
    #   agent retrying for good. Its agent refuses it as torn, the file not matching the
    #   checksums Spark wrote beside it, and the reconciler restores the PE in place from
    #   central. (Torn log entries, which the agent refuses alike by their content or their
    #   checksums, take the same way: tests/checkpoint/test_spark_dir.py.)
    # - unchecked's state file emptied with its checksums gone: nothing tells before the
    #   query loads it. Its agent reports it after failures in a row, and the reconciler
    #   restores the PE in place from central (from an older central checkpoint if the
    #   node's snapshot of the torn batch, taken as it came back, reached the central store:
    #   no checksum stopped it).
    torn: dict[str, list[str]] = {}

    def tear_state(pipeline: str, home: Path) -> None:
        checkpoint = home / "checkpoints" / pipeline / "aggregate"
        committed = max(int(p.name) for p in (checkpoint / "commits").iterdir()
                        if p.name.isdigit())  # fmt: skip
        # The state version its next start loads (the last committed batch's, batch + 1),
        # not the newest file: that may be of a batch the SIGKILL cut before its commit,
        # which the start runs again. Its snapshot, if maintenance made one, would stand in
        # for the changelog: removed.
        version = committed + 1
        changelogs = list((checkpoint / "state").rglob(f"{version}.changelog"))
        assert changelogs, f"no state changelog of version {version} in {checkpoint}"
        torn[pipeline] = [str(c.relative_to(checkpoint)) for c in changelogs]
        for changelog in changelogs:
            changelog.write_bytes(b"")
            if pipeline == "unchecked":
                changelog.with_name(f".{changelog.name}.crc").unlink()
        if pipeline == "unchecked":
            # Killed before its snapshot of that batch, and so before the central store's
            # pull of it, as may be: the snapshot taken as it came back freezes the emptied
            # file (no checksum tells), the central store pulls it, and a restore finds it
            # unreadable and passes over it to the one before.
            shutil.rmtree(home / "node-checkpoints" / pipeline / "aggregate" /
                          f"b{committed:012d}", ignore_errors=True)  # fmt: skip
            central = home.parents[1] / "central" / "checkpoints" / pipeline / "aggregate"
            for kept in central.glob("b*.json"):
                if int(kept.stem[1:]) >= committed:
                    kept.unlink()
        for snapshot in (checkpoint / "state").rglob(f"{version}.zip"):
            snapshot.unlink()

    # (unchecked's fallback needs a central checkpoint older than the torn batch: with only
    # that batch's, its restore rightly replayed the input from its start.)
    _back_damaged(cluster, tmp_path, {
        "tornstate": partial(tear_state, "tornstate"),
        "unchecked": partial(tear_state, "unchecked"),
    }, older_central=("unchecked",))  # fmt: skip
    said = (cluster.home / "logs" / "orchestrator.log").read_text(errors="replace")
    assert f"holds a torn checkpoint ({torn['tornstate'][0]} has 0 bytes, its checksums " in said
    assert "fog-b holds a checkpoint its query cannot read (Spark cannot load its state: " in said
    # The node's snapshots never froze tornstate's emptied file (it does not match the
    # checksums Spark wrote with it): no central checkpoint holds it as it was torn. (One
    # that did, pulled when the node's snapshot of its batch came after the kill, failed
    # every restore on every node.)
    central = cluster.home / "central" / "checkpoints" / "tornstate" / "aggregate"
    assert list(central.glob("*.json")), f"no central checkpoint in {central}"
    for kept in central.glob("*.json"):
        files = json.loads(kept.read_text())["files"]
        assert all(files[rel]["size"] > 0 for rel in torn["tornstate"] if rel in files), (
            kept.name, torn
        )  # fmt: skip


def test_a_node_whose_machine_went_down_under_it_gets_its_pes_from_central(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The machine went down under the aggregate's node (its agent's note of its run is of
    # another boot) and lost a state file Spark wrote and never synced: one the logs' check
    # cannot see. The agent sets the node's checkpoints aside as it starts, and the
    # reconciler restores the PE from its newest central checkpoint.
    def reboot(home: Path) -> None:
        note = json.loads((home / RUN_FILE).read_text())
        (home / RUN_FILE).write_text(json.dumps({**note, "boot_id": "a boot before this one"}))
        state = home / "checkpoints" / "reboot" / "aggregate" / "state"
        changelogs = sorted(state.rglob("*.changelog"), key=lambda p: int(p.name.split(".")[0]))
        assert changelogs, f"no state changelog in {state}"
        changelogs[-1].write_bytes(b"")

    _back_damaged(cluster, tmp_path, {"reboot": reboot})
    said = (cluster.home / "logs" / "node-fog-b.log").read_text(errors="replace")
    assert "the machine started again while this node's last agent ran" in said
    assert (cluster.home / "nodes" / "fog-b" / "distrusted").is_dir()


def _files_of(manifest: Path) -> list[dict[str, Any]]:
    """The file entries of a central checkpoint's manifest; none if it went meanwhile (the
    store expires old checkpoints of running PEs as it pulls new ones)."""
    try:
        return list(json.loads(manifest.read_text()).get("files", {}).values())
    except (OSError, ValueError):
        return []


def test_a_torn_central_checkpoint_is_installed_from_a_backup_nodes_replica(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Every node is up (the previous test started fog-b again): this pipeline lives on cloud
    # and fog-b.
    spec = case1_spec(tmp_path, "torn", agg_node="fog-b", detect_after_s=600)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("torn", "sink", 20)
    folder = cluster.home / "central" / "checkpoints" / "torn" / "source"
    deadline = time.monotonic() + 60
    while len(list(folder.glob("*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    # The input stops, so the source takes no newer checkpoint once the central store holds
    # one past every row (no input, no batch): the next one holding the damaged file would
    # ship it again (the store re-checks a blob changed on disk), and this test is about
    # the restore that finds the newest one torn. (It waited for 12 s without a new one.)
    rows = FEEDERS[tmp_path].stop()
    wait_until(
        lambda: json.loads(sorted(folder.glob("*.json"))[-1].read_text())["progress"] == rows,
        120,
        interval_s=0.5,
        describe=f"a central checkpoint of the source past all {rows} rows",
    )
    manifests = sorted(folder.glob("*.json"))
    assert len(manifests) >= 2
    newest = json.loads(manifests[-1].read_text())
    # A content no other checkpoint in the store names, and that none will: the store keeps
    # one blob per content, and a pull of any checkpoint holding the same content (a commit
    # file is the same for every PE and batch) finds the blob changed on disk, re-checks it
    # and ships it again, so the restore found the newest one whole (a suite run). An offset
    # file carries its batch's time.
    others = {
        e["sha256"]
        for path in (cluster.home / "central" / "checkpoints").rglob("*.json")
        if path != manifests[-1]
        for e in _files_of(path)
    }
    unique = [
        e["sha256"]
        for rel, e in newest["files"].items()
        if rel.startswith("offsets/") and e["size"] > 0 and e["sha256"] not in others
    ]
    assert unique, "the newest checkpoint shares every offset file with other checkpoints"
    # The planned backup node holds the newest checkpoint's replica, pushed from the central
    # store before the damage.
    backup = cluster.element("torn", "source")["planned_backup"]
    assert backup is not None
    wait_until(
        lambda: (
            f"torn/source@{newest['id']}"
            in {n["name"]: n for n in cluster.json("nodes")}[backup]["replicas"]
        ),
        60,
        interval_s=0.5,
        describe=f"{backup}'s replica of checkpoint {newest['id']}",
    )
    # Same size, other bytes: only the digest check can tell.
    blob = cluster.home / "central" / "blobs" / unique[0]
    data = blob.read_bytes()
    blob.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    # The source's node (cloud) is alive: the old instance is fenced by the restore. Onto a
    # node holding no replica of the source: the newest checkpoint, torn in the central
    # store, comes whole from the backup node's replica (one corrupt blob every kept
    # checkpoint named made them all unusable, and the PE replayed its whole input).
    holders = {n["name"]: n for n in cluster.json("nodes")}
    spare = sorted(
        name for name, n in holders.items()
        if name not in ("cloud", backup) and n["healthy"]
        and not any(r.startswith("torn/source@") for r in n["replicas"])
    )  # fmt: skip
    assert spare, holders
    report = json.loads(cluster.cli("restore", "torn", "source", "--to", spare[0],
                                    "--json").stdout)  # fmt: skip
    assert report["checkpoint"] == newest["id"], report
    # (The planned backup's, as a rule; a replan between the listing and the restore, on
    # live CPU use, may have pushed the replica to another node too: a replica either way.)
    assert report["checkpoint_source"].startswith("replica@"), report
    assert report["skipped_checkpoints"] == [], report
    finish_and_compare(cluster, tmp_path, "torn")


def test_frozen_node_is_restored_automatically_and_its_zombie_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    # On the JVM engine: restored from its central checkpoint, and its zombie fenced, as the
    # Python engine's are.
    spec = case1_spec(tmp_path, "zombie", agg_node="fog-b", detect_after_s=4, engine="jvm")
    cluster.cli("deploy", str(spec))
    cluster.wait_for("zombie", "sink", 40)
    wait_central(cluster, "zombie", "aggregate")
    frozen = cluster.node("fog-b")
    zombie_log = cluster.home / "logs" / "node-fog-b.log"
    os.killpg(frozen["pgid"], signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 120
        while cluster.element("zombie", "aggregate")["node"] == "fog-b":
            assert time.monotonic() < deadline, "the frozen node's PE was not restored"
            time.sleep(1)
        restored_on = cluster.element("zombie", "aggregate")["node"]
        wait_for_epoch(cluster, "zombie", "aggregate", 2)  # the new instance writes
        # Without an orchestrator nothing removes the zombie once it wakes: it gets to try
        # to write, which is what this test is about.
        kill_orchestrator(cluster)
        logged = zombie_log.stat().st_size
    finally:
        os.killpg(frozen["pgid"], signal.SIGCONT)
    # The zombie wakes up mid-batch and goes on: refused. Its writer finds the newer epoch
    # (fenced: it stops itself), or the broker refuses the node rights to a PE it no longer
    # hosts (its reads and writes fail), whichever comes first.
    refusals = (FENCED_TOKEN, "permissions violation")
    try:
        deadline = time.monotonic() + 60
        while not any(r in zombie_log.read_text(errors="replace")[logged:] for r in refusals):
            assert time.monotonic() < deadline, "the zombie was never refused: it tried nothing"
            time.sleep(0.2)
    finally:
        # The orchestrator only (every node is alive: fog-b was woken above): it removes
        # the zombie. Also when the wait failed, so that the module's next tests find an
        # orchestrator.
        cluster.up()
    deadline = time.monotonic() + 60
    while cluster.hosts("fog-b", "zombie/aggregate"):
        assert time.monotonic() < deadline, "the zombie was not removed from fog-b"
        time.sleep(1)
    assert cluster.element("zombie", "aggregate")["node"] == restored_on
    finish_and_compare(cluster, tmp_path, "zombie")
    assert_only_new_epochs_after_fence(cluster, "zombie", "aggregate")


def test_a_standby_takes_over_a_frozen_node_and_the_node_never_emits_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    """#13 item 2: with ``standby: planned`` the aggregate has a warm, capped twin on another
    node; when its node goes silent the twin is fenced in and let go (no checkpoint moves, no
    query starts), and the node, when it wakes, writes nothing. Every node is up: the aggregate
    runs on fog-c, its standby on another node (the planner's redeploy node, else the least
    busy)."""
    spec = case1_spec(tmp_path, "standby", agg_node="fog-c", detect_after_s=3, keys=20,
                      standby="planned", history_s=1)  # fmt: skip
    cluster.cli("deploy", str(spec))
    cluster.wait_for("standby", "sink", 20)

    def followed() -> dict[str, Any] | None:
        standby = cluster.element("standby", "aggregate")["standby"]
        ready = standby and standby["state"] == "running" and standby["lag_events"] is not None
        return standby if ready else None

    standby = wait_until(followed, 120, interval_s=0.5, describe="a followed standby")
    # Past the standby's position too: it takes over reading what is left.
    wait_trimmed(cluster, "standby", "source")
    standby = wait_until(followed, 120, interval_s=0.5, describe="a followed standby")
    assert standby["node"] != "fog-c", standby
    assert standby["epoch"] == 2 and cluster.element("standby", "aggregate")["epoch"] == 1
    # The standby writes nothing while it follows: every message so far is the primary's.
    assert {int(m.headers[EPOCH_HEADER]) for m in stream_messages(cluster, "standby",
            "aggregate")} == {1}  # fmt: skip
    frozen = cluster.node("fog-c")
    os.killpg(frozen["pgid"], signal.SIGSTOP)
    try:
        moved = wait_until(
            lambda: (e := cluster.element("standby", "aggregate"))["node"] != "fog-c" and e,
            120, interval_s=0.5, describe="the standby promoted",
        )  # fmt: skip
        assert FEEDERS[tmp_path].feeding, "the input had ended before the promotion"
    finally:
        os.killpg(frozen["pgid"], signal.SIGCONT)
    report = moved["last_restore"]
    assert moved["node"] == standby["node"], (moved, standby)
    assert report["method"] == "standby" and report["epoch"] == 2, report
    assert report["checkpoint"] is None and report["fetched_bytes"] == 0, report
    assert report["live_ms"] is not None and report["live_ms"] < report["total_ms"], report
    # The node wakes: its instance is removed (or refused first), and a new standby stands
    # by for the aggregate somewhere else than where it now runs.
    wait_until(
        lambda: not cluster.hosts("fog-c", "standby/aggregate")
        or (cluster.element("standby", "aggregate")["standby"] or {}).get("node") == "fog-c",
        60, interval_s=0.5, describe="the frozen node's instance removed",
    )  # fmt: skip
    again = wait_until(followed, 120, interval_s=0.5, describe="a new standby")
    assert again["node"] != moved["node"] and again["epoch"] >= 3, again
    finish_and_compare(cluster, tmp_path, "standby")
    # Nothing the frozen primary (epoch 1) wrote came after the fence.
    assert_only_new_epochs_after_fence(cluster, "standby", "aggregate", epoch=2)


def test_restore_after_sigkill_is_exact(cluster: Cluster, tmp_path: Path) -> None:
    # Keyed by sensor (50): every key's state comes back from the checkpoint. Records are
    # kept 1 s once every reader has checkpointed past them: the restore reads what is left.
    spec = case1_spec(tmp_path, "killed", detect_after_s=600, keys=50, history_s=1)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("killed", "sink", 20)
    wait_trimmed(cluster, "killed", "source")
    # The node-level figure comes with the node's heartbeat, the central one from the pull,
    # which may have taken a snapshot newer than the last heartbeat told (or come before the
    # first heartbeat that told of one): wait for the next.
    wait_until(
        lambda: (
            ((c := wait_central(cluster, "killed", "aggregate"))["node_level"] or {}).get(
                "batch", -1
            )
            >= c["central"]["batch"]
            >= 0
        ),
        30,
        interval_s=0.5,
        describe="the node-level checkpoint reported at least as new as the central one",
    )
    # A random moment: mid-batch, between checkpoints, or while one is being taken. fog-a,
    # the aggregate's node, stays down after this test (the next one needs it down).
    time.sleep(random.uniform(0, 2))
    pgid = cluster.node("fog-a")["pgid"]
    emitted, checkpoint = freeze_past_central_checkpoint(cluster, "killed", "aggregate", pgid)
    os.killpg(pgid, signal.SIGKILL)
    assert FEEDERS[tmp_path].feeding, "the input had ended before the kill"
    # Longer than the streams' duplicate window (1 s, checked below), with slack for the
    # broker's timer that forgets older message ids: a duplicate would not be dropped.
    time.sleep(1.5)
    # And input beyond what the killed instance had emitted has arrived (the feeder appends
    # every 4 s: on a loaded machine the source had published nothing new by the restore).
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    try:
        wait_until(
            lambda: client.run(partial(last_seq, stream=stream_name("killed", "source")))
            > emitted,
            60, interval_s=0.2, describe="input beyond the killed instance's last output",
        )  # fmt: skip
    finally:
        client.close()
    result = cluster.cli("restore", "killed", "aggregate", "--to", "fog-b", "--json")
    report = json.loads(result.stdout)
    assert report["status"] == "restored" and report["epoch"] == 2, report
    assert report["checkpoint"] is not None and report["checkpoint_age_ms"] >= 0
    # Killed while input still flowed: the restore re-processed, without emitting, exactly
    # what the killed instance had emitted since the checkpoint, then what arrived meanwhile.
    assert report["reprocessed_events"] == emitted - checkpoint > 0, (report, emitted)
    assert report["intermediate_events"] > 0 and report["intermediate_ms"] > 0, report
    assert report["reprocess_ms"] > 0, report
    assert cluster.element("killed", "aggregate")["node"] == "fog-b"
    finish_and_compare(cluster, tmp_path, "killed")
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    try:
        info = client.run(lambda js: js.stream_info(stream_name("killed", "aggregate")))
    finally:
        client.close()
    assert info.config.duplicate_window == pytest.approx(1.0)


def test_restore_target_that_dies_during_the_restore_is_retried_elsewhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    # fog-a is down: the previous test killed it (killed here if it runs, e.g. this test
    # alone); fog-c hosts nothing. cloud (source + sink) has no CPU to spare for one more PE
    # in this fog topology, so the planner's redeploy node for the aggregate is fog-c: a
    # restore without --to tries fog-c first and cloud (the least busy of the rest) next;
    # fog-b, the aggregate's own node, is never a candidate.
    cluster.stop_all()  # cloud's CPU in this topology fits this pipeline's PEs only
    fog_a = cluster.node("fog-a")
    if group_alive(fog_a["pgid"]):
        os.killpg(fog_a["pgid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while cluster.node("fog-a")["healthy"]:
        assert time.monotonic() < deadline, "fog-a was still taken for healthy"
        time.sleep(0.5)
    (tmp_path / "fog.yaml").write_text(
        "pe_cpu: 10\nnodes: {cloud: {cpu: 25}, fog-a: {cpu: 100}, fog-b: {cpu: 100}, "
        "fog-c: {cpu: 100}}\n"
    )
    cluster.cli("topology", "set", str(tmp_path / "fog.yaml"))
    spec = case1_spec(tmp_path, "retry", agg_node="fog-b", detect_after_s=600)
    cluster.cli("deploy", str(spec))
    cluster.wait_for("retry", "sink", 40)
    wait_central(cluster, "retry", "aggregate")
    deadline = time.monotonic() + 60
    while cluster.element("retry", "aggregate")["planned_redeploy"] != "fog-c":
        assert time.monotonic() < deadline, (
            cluster.element("retry", "aggregate"),
            cluster.cli("topology", "show", "--json").stdout,
        )
        time.sleep(0.5)
    # fog-b stays up (a node killed here costs the next module a restart): the candidates
    # are the same, and the first attempt fences its instance as it would a dead one's.
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
    # The fenced instance on fog-b, alive, never wrote again.
    assert_no_older_epoch_after(cluster, "retry", "aggregate", report["attempts"][0]["epoch"])
