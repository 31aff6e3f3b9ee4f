"""A partitioned keyed PE on real agents: its keys split over nodes, single keys moved
between partitions (PAM), a partition moved whole and the element scaled out and in,
mid-stream, and a key move whose origin's node is killed; the output exact per key and
every twin readable through the element."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fogshift.broker.client import BrokerAddress, SyncJetStream, get_ranges, last_seq
from fogshift.broker.keys import KeyMove, KeyState, in_group, parse
from fogshift.broker.naming import key_subjects, stream_name
from fogshift.broker.publish import last_position
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.spark_dir import progress_of
from fogshift.common.waiting import wait_until
from fogshift.exceptions import InvalidInput
from fogshift.spec.models import partition_of_key
from fogshift.supervisor.cluster import orchestrator_client
from tests.conftest import Cluster, fogshift
from tests.integration.helpers import case1_spec, finish_and_compare, keyed_windows, wait_central

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_partitioned_pe_moves_keys_and_partitions_and_scales_out_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    spec = case1_spec(tmp_path, "split", keys=40, partitions=["fog-a", "fog-b"])
    cluster.cli("deploy", str(spec))
    cluster.wait_for("split", "sink", 20)
    status = cluster.status("split")["elements"]
    nodes = {e["element"]: e["node"] for e in status}
    assert [(e["partition_of"], e["partition"], e["partitions"]) for e in status] == [
        (None, None, None), ("aggregate", 0, 2), ("aggregate", 1, 2), (None, None, None)
    ]  # fmt: skip
    assert {e["element"]: e["inputs"] for e in status}["sink"] == ["aggregate-p0", "aggregate-p1"]
    assert nodes == {"source": "cloud", "aggregate-p0": "fog-a", "aggregate-p1": "fog-b",
                     "sink": "cloud"}  # fmt: skip
    # Single keys move (PAM): three of partition 0's sensors to partition 1 on fog-b, their
    # states copied ahead (precopy, the default) and what changed since pushed in backlog
    # order at the move, in waves (one key, then the two others), while both partitions run.
    static = {f"s{i}": partition_of_key(f"s{i}", 2) for i in range(40)}
    first = [k for k, p in static.items() if p == 0][:3]
    moved = cluster.json(
        "migrate", "split", "aggregate", "--keys", ",".join(first), "--to", "fog-b"
    )
    assert (moved["status"], moved["target_partition"], moved["order"]) == (
        "moved", "aggregate-p1", "backlog"
    )  # fmt: skip
    assert moved["keys"] == first and sorted(moved["sent"]) == sorted(first)
    assert moved["origins"] == dict.fromkeys(first, "aggregate-p0")
    assert set(moved["stoppage_ms"]) == set(first) and moved["state_bytes"] > 0
    if moved["precopied"] or "precopy of split/aggregate: no copy of 1 keys in time" not in (
        cluster.home / "logs" / "orchestrator.log"
    ).read_text(errors="replace"):
        assert moved["precopied"] == first and moved["precopy_bytes"] > 0
    # (Else the first key's copy did not come within the precopy's 15 s wait: on two cores
    # at a load of 17 a round of both partitions' batches took longer, and the keys moved
    # whole, as designed; what follows holds either way.)
    assert [w["keys"] for w in moved["waves"]] == [first[:1], first[1:]]
    assert moved["move_seq"] == moved["waves"][0]["seq"] < moved["waves"][1]["seq"]
    assert moved["sent"][0] == first[0] and moved["left"] == [] and moved["stateless"] == []
    # A key never seen (a typo's) moves as any other, but is said to have had no state
    # (and not to have been precopied: its copy was empty).
    ghost = next(f"ghost{i}" for i in range(100) if partition_of_key(f"ghost{i}", 2) == 0)
    typo = cluster.cli("migrate", "split", "aggregate", "--keys", ghost, "--to", "fog-b")
    said = " ".join(typo.stdout.split())
    assert f"warning: {ghost}: no state at its origin (never seen there: a typo?)" in said, said
    assert "precopied 0 of 1 key (0 bytes)" in said, said
    # Keys already there are not moved again (the partition named by its id); a node
    # without a partition is refused.
    # A key never seen whose hash names the target is "already" there too: said unseen.
    unseen = next(f"ghost{i}" for i in range(100) if partition_of_key(f"ghost{i}", 2) == 1)
    again = cluster.json(
        "migrate", "split", "aggregate", "--keys", f"{first[0]},{unseen}", "--to", "aggregate-p1"
    )
    assert (again["keys"], again["already"]) == ([], [first[0], unseen])
    assert again["unseen"] == [unseen], again
    nowhere = cluster.cli(
        "migrate", "split", "aggregate", "--keys", first[0], "--to", "cloud", check=False
    )
    assert nowhere.returncode != 0 and "no partition of 'aggregate' runs there" in " ".join(
        nowhere.stderr.split()
    )
    for args, says in [
        (["source", "--keys", "s1", "--to", "fog-b"], "'source' is not partitioned"),
        (["aggregate", "--keys", "s1,s1", "--to", "fog-b"], "distinct keys"),
    ]:
        refused = cluster.cli("migrate", "split", *args, check=False)
        assert refused.returncode != 0 and says in " ".join(refused.stderr.split()), says
    # Waves are for listed keys: the API refuses them with a group (the CLI before it) ...
    with (
        pytest.raises(InvalidInput, match="--wave-keys is for --keys"),
        orchestrator_client(cluster.home, timeout_s=30) as client,
    ):
        client.post("/pipelines/split/elements/aggregate/keys/migrate",
                    json={"group": "1/4", "wave_keys": 2, "target": "fog-b"})  # fmt: skip
    # ... and a precopy, which a group never makes (it was ignored before).
    with (
        pytest.raises(InvalidInput, match="--no-precopy is for --keys"),
        orchestrator_client(cluster.home, timeout_s=30) as client,
    ):
        client.post("/pipelines/split/elements/aggregate/keys/migrate",
                    json={"group": "1/4", "precopy": False, "target": "fog-b"})  # fmt: skip
    # Partition 1 moves while partition 0 goes on, make-before-break, as any PE does.
    moved = cluster.cli(
        "migrate", "split", "aggregate-p1", "--to", "cloud", "--mode", "handover", "--json"
    )
    report = json.loads(moved.stdout)
    assert (report["status"], report["origin"], report["target"]) == ("migrated", "fog-b", "cloud")
    # Two of partition 1's own keys go to partition 0 (fifo, whole states at the move as
    # PAM sends them, both in one wave), after the handover.
    second = [k for k, p in static.items() if p == 1][:2]
    back = cluster.json(
        "migrate", "split", "aggregate", "--keys", ",".join(second), "--to", "fog-a",
        "--order", "fifo", "--no-precopy", "--wave-keys", "2",
    )  # fmt: skip
    assert (back["status"], back["sent"]) == ("moved", second)
    assert back["waves"] == [{"seq": back["move_seq"], "keys": second}]
    assert (back["precopied"], back["precopy_ms"]) == ([], None)
    owner = {**static, **dict.fromkeys(first, 1), **dict.fromkeys(second, 0)}
    # A key group moves: its keys with state now, and any of it that comes later.
    group = cluster.json("migrate", "split", "aggregate", "--key-group", "1/4", "--to", "fog-a")
    grouped = sorted(k for k in static if in_group(k, 1, 4) and owner[k] != 0)
    assert (group["status"], group["group"], sorted(group["keys"])) == ("moved", "1/4", grouped)
    assert grouped and set(group["sent"]) == set(grouped)
    # Its nine keys holding state went ahead, in one wave: the listing of the state stores
    # gave their sizes (tens of bytes each, so no first wave of one key to learn them);
    # the group's own record last, with no key left to carry.
    assert [len(w["keys"]) for w in group["waves"]] == [9, 0]
    assert sorted(k for w in group["waves"] for k in w["keys"]) == grouped
    owner |= {k: 0 for k in static if in_group(k, 1, 4)}
    refused = cluster.cli("migrate", "split", "aggregate", "--key-group", "4/4", "--to", "fog-a",
                          check=False)  # fmt: skip
    assert refused.returncode != 0 and "bad key group" in refused.stderr
    # Scaled out to three partitions, mid-stream: every key goes to its partition of three
    # (the moves before are forgotten); those whose partition changes take their state.
    scaled = cluster.json(
        "scale", "split", "aggregate", "--partitions", "3", "--on", "fog-c", "--waves"
    )
    assert (scaled["status"], scaled["before"], scaled["after"]) == ("moved", 2, 3), scaled
    assert scaled["added"] == {"aggregate-p2": "fog-c"} and scaled["consumers"] == ["sink"]
    owner_before, owner = owner, {k: partition_of_key(k, 3) for k in static}
    changed = {k: f"aggregate-p{owner[k]}" for k in static if owner[k] != owner_before[k]}
    assert scaled["keys"] == changed and scaled["moved"] == len(changed) > 0
    # With --waves, those keys (all hold state) went to their partitions ahead of the
    # rescale, in waves per partition: sized by the listed sizes, each partition's keys
    # in one wave (a few small states); the rescale had none left to move.
    assert sorted(k for w in scaled["waves"] for k in w["keys"]) == sorted(changed)
    waves_to: dict[int, list[str]] = {}
    for wave in scaled["waves"]:
        assert len({owner[k] for k in wave["keys"]}) == 1, wave  # one partition a wave
        assert owner[wave["keys"][0]] not in waves_to, scaled["waves"]  # one wave each
        waves_to[owner[wave["keys"][0]]] = wave["keys"]
    assert set(waves_to) == set(owner[k] for k in changed)
    assert scaled["scale_seq"] > max(w["seq"] for w in scaled["waves"])
    assert scaled["state_bytes"] > 0 and scaled["scale_seq"] > 0
    status = cluster.status("split")["elements"]
    assert {e["element"]: e["inputs"] for e in status}["sink"] == [
        "aggregate-p0", "aggregate-p1", "aggregate-p2"
    ]  # fmt: skip
    assert {e["element"]: e["partitions"] for e in status if e["partition_of"]} == dict.fromkeys(
        ["aggregate-p0", "aggregate-p1", "aggregate-p2"], 3
    )
    for args, says in [
        (["source", "--partitions", "2"], "'source' is not partitioned"),
        (["aggregate", "--partitions", "2", "--on", "fog-c"], "no --on when scaling in"),
    ]:
        refused = cluster.cli("scale", "split", *args, check=False)
        assert refused.returncode != 0 and says in " ".join(refused.stderr.split()), says
    # Scaled in again: partition 2 gives every key it has to the two left, and is retired
    # once it has sent them; the sink reads its stream on, an input that has ended.
    shrunk = cluster.json("scale", "split", "aggregate", "--partitions", "2")
    assert (shrunk["status"], shrunk["retired"], shrunk["added"]) == (
        "moved", {"aggregate-p2": "fog-c"}, {}
    ), shrunk  # fmt: skip
    owner_before, owner = owner, {k: partition_of_key(k, 2) for k in static}
    changed = {k: f"aggregate-p{owner[k]}" for k in static if owner[k] != owner_before[k]}
    assert shrunk["keys"] == changed and any(owner_before[k] == 2 for k in changed)
    assert shrunk["waves"] == []  # without --waves: every key at the rescale record
    status = cluster.status("split")["elements"]
    assert [e["element"] for e in status if e["partition_of"]] == ["aggregate-p0", "aggregate-p1"]
    wait_until(lambda: not cluster.hosts("fog-c", "split/aggregate-p2"), 30,
               interval_s=0.5, describe="the retired partition gone from fog-c")  # fmt: skip
    # The partitioned element is not a PE: naming it is refused with its partitions named.
    refused = cluster.cli("migrate", "split", "aggregate", "--to", "cloud", check=False)
    said = " ".join(refused.stderr.split())
    assert refused.returncode != 0 and "aggregate-p0, aggregate-p1" in said, said
    # Every key's outputs in input order, none lost or doubled (keys of the two partitions
    # interleave at the sink as their batches meet).
    finish_and_compare(cluster, tmp_path, "split", stop=False)
    windows = keyed_windows(tmp_path / "in.csv", "sensor", "value", 10)
    twins = cluster.json("state", "split", "aggregate")
    assert twins["keys"] == len(windows) == 40
    assert {e["key"]: e["state"]["values"] for e in twins["entries"]} == windows
    for index, node in enumerate(["fog-a", "cloud"]):
        part = cluster.json("state", "split", f"aggregate-p{index}")
        owned = {k for k in windows if owner[k] == index}
        assert part["node"] == node
        assert {e["key"] for e in part["entries"]} == owned and owned
    # One key is asked of the partition that owns it, moved or not.
    for key in (first[0], second[0], sorted(set(windows) - set(first) - set(second))[0]):
        one = cluster.json("state", "split", "aggregate", key)
        assert one["element"] == f"aggregate-p{owner[key]}"
        assert [e["state"]["values"] for e in one["entries"]] == [windows[key]]
    cluster.cli("stop", "split")


def test_key_moves_whose_origin_or_target_node_dies_complete_once_it_is_restored(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Two key moves, each losing a node midway, each restored on another node from a
    # central checkpoint: every key's output stays exact, and each move completes by
    # itself once the partition it waits for runs again, wherever that is.
    spec = case1_spec(tmp_path, "orphan", keys=20, partitions=["fog-a", "fog-b"],
                      detect_after_s=600)  # fmt: skip
    cluster.cli("deploy", str(spec))
    cluster.wait_for("orphan", "sink", 20)
    wait_central(cluster, "orphan", "aggregate-p0")
    wait_central(cluster, "orphan", "aggregate-p1")
    keys = [k for k in (f"s{i}" for i in range(20)) if partition_of_key(k, 2) == 0]
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    stream, subjects = stream_name("orphan", "source"), key_subjects("orphan", "source")

    def records() -> list[KeyMove | KeyState]:
        end = client.run(partial(last_seq, stream=stream))
        found = client.run(partial(get_ranges, stream=stream, subjects=subjects, start=0, end=end))
        return [r for m in found if isinstance(r := parse(m.seq, m.data), KeyMove | KeyState)]

    def stored(moving: list[str], copies: bool) -> bool:
        got = {r.key for r in records() if isinstance(r, KeyState) and r.copy == copies}
        return got >= set(moving)

    def move_losing(moving: list[str], dies: str, restore: str, to: str) -> dict[str, Any]:
        """Move ``moving`` from partition 0 to partition 1 (on fog-b); freeze node ``dies``
        once the keys' copies are stored (the precopy) and kill it once the move is (and,
        the target dying, the states); restore its partition ``restore`` on ``to``. The
        move's report."""
        answer: list[subprocess.CompletedProcess] = []
        # A process of its own: the in-process CLI runs one command at a time, and the
        # restore goes on while this one waits.
        command = threading.Thread(target=lambda: answer.append(fogshift(
            "migrate", "orphan", "aggregate", "--keys", ",".join(moving), "--to", "fog-b",
            "--wave-keys", "2", "--json", "--home", str(cluster.home), check=False,
        )), daemon=True)  # fmt: skip
        pgid = cluster.node(dies)["pgid"]
        command.start()
        wait_until(lambda: stored(moving, copies=True), 90, interval_s=0.02,
                   describe="the moving keys' copies stored")  # fmt: skip
        os.killpg(pgid, signal.SIGSTOP)
        try:
            if restore == "aggregate-p0":
                wait_until(lambda: any(isinstance(r, KeyMove) and r.keys == tuple(moving)
                                       for r in records()), 60, interval_s=0.1,
                           describe="the move stored")  # fmt: skip
                # Frozen within a poll of its last copy, before its next trigger: it never
                # read the move (stored after the copies), so it sent no state.
                assert not [
                    r
                    for r in records()
                    if isinstance(r, KeyState) and not r.copy and r.key in moving
                ]
                # Meanwhile the target's state read shows the keys waiting for it.
                move = next(r.move for r in records()
                            if isinstance(r, KeyMove) and r.keys == tuple(moving))  # fmt: skip

                def waiting() -> dict[str, Any]:
                    read = cluster.json("state", "orphan", "aggregate-p1")
                    return {e["key"]: e["waiting"] for e in read["entries"] if e["waiting"]}

                wait_until(lambda: set(waiting()) == set(moving), 30,
                           describe="the target's state read shows the keys waiting")  # fmt: skip
                assert {w["move"] for w in waiting().values()} == {move}
            else:  # the target, frozen before the move, cannot have taken the states
                wait_until(lambda: stored(moving, copies=False), 60, interval_s=0.1,
                           describe="the moved states stored")  # fmt: skip
        finally:
            os.killpg(pgid, signal.SIGKILL)  # (the module's cluster starts it again after)
        # The killed partition's last output, where the restore starts re-deriving from.
        _, (emitted, _), _ = client.run(
            lambda js: last_position(js, stream_name("orphan", restore))
        )
        restored = cluster.json("restore", "orphan", restore, "--to", to)
        assert (restored["status"], restored["method"]) == ("restored", "checkpoint"), restored
        # It re-derived, without emitting, exactly what the killed one had emitted past the
        # central checkpoint it resumed from: none when a pull came after the last batch
        # (which, at a 2 s trigger, happens: the timing is the machine's).
        used = next(m for m in CentralStore(cluster.home / "central").manifests("orphan", restore)
                    if m["id"] == restored["checkpoint"])  # fmt: skip
        expected = max(0, emitted - progress_of(used["offset"]))
        assert restored["reprocessed_events"] == expected, (restored, emitted)
        command.join(240)
        assert not command.is_alive() and answer, "the key move never answered"
        assert answer[0].returncode == 0, (answer[0].stdout, answer[0].stderr)
        moved: dict[str, Any] = json.loads(answer[0].stdout)
        assert (moved["status"], moved["precopied"], sorted(moved["sent"])) == (
            "moved", moving, sorted(moving)
        ), moved  # fmt: skip
        # At the move only what changed since the copy went (a restored origin's copies
        # hold what its checkpoint and its replay gave, as the killed one's did).
        states = [r for r in records() if isinstance(r, KeyState) and r.key in moving]
        assert all(r.base for r in states if not r.copy), states
        assert cluster.element("orphan", restore)["node"] == to
        return moved

    try:
        # The origin dies: the restored one replays the copies (the broker may drop them as
        # duplicates), then sends at the move what changed since.
        move_losing(keys[:2], "fog-a", "aggregate-p0", "fog-c")
        # The target dies: the states are stored, but it had not committed them; the move
        # answers once the restored target has, on its new node.
        move_losing(keys[2:4], "fog-b", "aggregate-p1", "cloud")
    finally:
        client.close()
    finish_and_compare(cluster, tmp_path, "orphan", stop=False)
    windows = keyed_windows(tmp_path / "in.csv", "sensor", "value", 10)
    twins = cluster.json("state", "orphan", "aggregate")
    assert {e["key"]: e["state"]["values"] for e in twins["entries"]} == windows
    for key in keys[:4]:
        assert cluster.json("state", "orphan", "aggregate", key)["element"] == "aggregate-p1"
    cluster.cli("stop", "orphan")
