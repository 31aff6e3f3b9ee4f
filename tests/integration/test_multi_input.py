"""PEs with two inputs through handover, precopy and literal migration, a node's SIGKILL with
restore (and a migration to the dead node, rolled back), and a SIGKILL of the whole cluster:
every output equals a reference computed from the inputs in the order the PE's logged cuts
define (a stateful PE whose output depends on that order, a stateless filter, and a csv-sink
with two inputs). A Case 1 pipeline goes through the whole cluster's SIGKILL too, and its
output equals the single-process reference."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fogshift.broker.client import BrokerAddress, SyncJetStream, subject_counts
from fogshift.broker.naming import cut_subject, data_subject, stream_name
from fogshift.spec.models import partition_of_key
from fogshift.verify.reference import case1_reference, compare, read_sink
from tests.conftest import Cluster, group_alive, pgids_of
from tests.integration.helpers import FEEDERS, Feeder, stream_messages, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def duo_line(name: str) -> Callable[[random.Random, int], str]:
    """Row ``k`` of input ``name``: its sensor names the input; now and then no number."""

    def line(rnd: random.Random, k: int) -> str:
        value = f"{rnd.uniform(-50, 50):.3f}" if rnd.random() > 0.03 else "n/a"
        return f"{1_700_000_000 + k},{name}{k % 3},{value}\n"

    return line


def merged(cluster: Cluster, pipeline: str, pe: str, inputs: list[str]) -> list[Any]:
    """The input events of ``pe`` in the order its logged cuts define; checks the log is one
    unbroken chain from the first event to the last."""
    events = {
        name: {m.metadata.sequence.stream: m for m in stream_messages(cluster, pipeline, name)
               if m.subject == data_subject(pipeline, name)}
        for name in inputs
    }  # fmt: skip
    cuts = [
        json.loads(m.data)
        for m in stream_messages(cluster, pipeline, pe)
        if m.subject == cut_subject(pipeline, pe)
    ]
    assert cuts, f"{pipeline}/{pe} logged no cut"
    assert cuts[0]["start"] == dict.fromkeys(inputs, 0)
    for before, after in itertools.pairwise(cuts):
        assert after["start"] == before["end"], f"the cut log of {pe} has a gap or a fork"
    order = []
    for cut in cuts:
        for name in inputs:
            order += [events[name][s] for s in sorted(events[name])
                      if cut["start"][name] < s <= cut["end"][name]]  # fmt: skip
    assert cuts[-1]["end"] == {n: max(events[n]) for n in inputs}, "input left unprocessed"
    return order


def bodies(cluster: Cluster, pipeline: str, pe: str) -> list[dict[str, Any]]:
    msgs = stream_messages(cluster, pipeline, pe)
    return [
        json.loads(json.loads(m.data)["body"])
        for m in msgs
        if m.subject == data_subject(pipeline, pe)
    ]


def wait_records(cluster: Cluster, pipeline: str, pe: str, count: int, timeout_s: float) -> None:
    """Wait until ``pe``'s stream holds ``count`` output events (what is stored, not counters)."""
    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    subject, stored = data_subject(pipeline, pe), 0
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = client.run(lambda js: subject_counts(js, stream_name(pipeline, pe)))
            stored = got.get(subject, 0)
            if stored >= count:
                return
            time.sleep(0.5)
    finally:
        client.close()
    raise AssertionError(f"{pipeline}/{pe} stored {stored} of {count} events\n{cluster.logs()}")


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and abs(value) < float("inf")


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid)


def migrate(cluster: Cluster, pe: str, to: str, mode: str) -> None:
    """Migrate ``pe``; a rolled-back attempt (a Python worker that could not start on a
    loaded machine) leaves the pipeline running and is tried again, at most four times."""
    for _ in range(5):
        result = cluster.cli("migrate", "duo", pe, "--to", to, "--mode", mode, "--json",
                             check=False)  # fmt: skip
        report = json.loads(result.stdout)
        if report["status"] == "migrated":
            return
        assert report["rolled_back"], report  # a failure must leave the origin running
        assert cluster.element("duo", pe)["node"] != to
    raise AssertionError(f"migrating {pe} to {to} failed five times: {report}")


@pytest.mark.timeout(1800)  # four operations and two kills: long on a loaded 2-core machine
def test_two_input_pes_stay_exactly_once_through_migrations_restores_and_restarts(
    cluster: Cluster, tmp_path: Path
) -> None:
    procs = Path(__file__).parent
    # Input flows into both from the start, through every operation however long it takes.
    for seed, name in enumerate("ab", start=1):
        FEEDERS[tmp_path / name] = Feeder(tmp_path / f"{name}.csv", seed, first=0,
                                          line=duo_line(name))  # fmt: skip
    spec = write_spec(
        tmp_path / "duo.yaml",
        "duo",
        [
            {"id": "a", "kind": "csv-source", "node": "cloud", "options": {"path": "a.csv"}},
            {"id": "b", "kind": "csv-source", "node": "cloud", "options": {"path": "b.csv"}},
            {"id": "pick", "kind": "filter", "node": "fog-a", "inputs": ["a", "b"],
             "options": {"where": "isfinite(value) and value > 0"}},
            {"id": "tally", "kind": "custom", "node": "fog-a", "inputs": ["a", "b"],
             "options": {"class": "procs_multi:Interleave", "path": str(procs)}},
            {"id": "both", "kind": "csv-sink", "node": "fog-b", "inputs": ["a", "b"],
             "options": {"path": "out/both.csv"}},
        ],
    )  # fmt: skip
    spec.write_text(spec.read_text() + "recovery: {auto: false}\n")
    cluster.cli("deploy", str(spec))
    for _ in range(3):  # a few batches committed: a copy is of a query in its stride
        cluster.wait_for("duo", "tally", cluster.element("duo", "tally")["events_out"] + 40)
    for pe, mode, to in (
        # Make-before-break: both instances cut the two inputs; whichever logs a cut first,
        # the other replays it.
        ("tally", "handover", "fog-c"),
        ("tally", "precopy", "fog-b"),
        ("pick", "literal", "fog-b"),
        ("both", "precopy", "fog-a"),
    ):
        migrate(cluster, pe, to, mode)

    # fog-b, with tally and pick on it, dies while both inputs flow.
    cluster.wait_for("duo", "tally", cluster.element("duo", "tally")["events_out"] + 40)
    kill_group(cluster.node("fog-b")["pgid"])
    # A migration to the dead node fails and is rolled back: the sink runs on on fog-a.
    both = cluster.element("duo", "both")
    victim = cluster.cli("migrate", "duo", "both", "--to", "fog-b", "--mode", "precopy",
                         "--json", check=False)  # fmt: skip
    assert victim.returncode == 1, victim
    if victim.stdout.strip():  # the orchestrator still believed fog-b healthy
        # Rolled back because fog-b is gone, not for any other reason; fog-b never started
        # the PE, so the origin resumes under its own epoch (nothing to fence).
        report = json.loads(victim.stdout)
        assert report["status"] == "failed" and report["rolled_back"] is True, report
        assert report["epoch"] == both["epoch"], (report, both)
        assert report["error"].startswith("node agent 'fog-b' at "), report
        assert "cannot be reached" in report["error"].splitlines()[0], report
    else:  # it had already noticed fog-b's silence
        assert "cannot migrate duo/both to node 'fog-b': it is not healthy" in (
            " ".join(victim.stderr.split())
        ), victim
    after = cluster.element("duo", "both")
    assert (after["node"], after["state"], after["epoch"]) == ("fog-a", "running",
                                                                both["epoch"]), after  # fmt: skip
    for pe in ("tally", "pick"):
        report = json.loads(cluster.cli("restore", "duo", pe, "--to", "fog-a", "--json").stdout)
        assert report["status"] == "restored" and report["epoch"] >= 2, report

    # Then everything dies at once, and comes back: the two-input pipeline and a Case 1
    # one, both with input flowing at the kill.
    whole = tmp_path / "whole"
    case1 = FEEDERS[whole] = Feeder(whole / "in.csv", seed=21)
    cluster.cli("deploy", str(whole_spec(whole)))
    cluster.wait_for("whole", "sink", 30)
    cluster.wait_for("duo", "tally", cluster.element("duo", "tally")["events_out"] + 40)
    assert case1.feeding  # the input flows at the kill
    for pgid in pgids_of(cluster.home):
        kill_group(pgid)  # fog-b's group is gone already
    case1.stop()
    case1.append(50)  # input that arrives while everything is down
    ref = case1_reference(whole / "in.csv", "value", 10, "avg")
    partial = read_sink(whole / "out" / "case1.csv", "value")
    assert compare(ref.rows[: len(partial)], partial).consistent  # a prefix, no duplicates
    assert len(partial) < len(ref.rows), "the output was complete before the kill"
    cluster.up()  # same home: registry, streams and checkpoints are all on disk
    cluster.wait_for("duo", "tally", cluster.element("duo", "tally")["events_out"] + 40)
    total = sum(FEEDERS.pop(tmp_path / name).stop() for name in "ab")
    wait_records(cluster, "duo", "tally", total, timeout_s=300)
    order = merged(cluster, "duo", "tally", ["a", "b"])
    expected = [
        {"n": n, "src": json.loads(m.data)["creator"], "src_seq": json.loads(m.data)["seq"]}
        for n, m in enumerate(order, start=1)
    ]
    assert bodies(cluster, "duo", "tally") == expected

    events = [json.loads(m.data) for m in merged(cluster, "duo", "pick", ["a", "b"])]
    hot = [e for e in events if finite(json.loads(e["body"])["value"])
           and json.loads(e["body"])["value"] > 0]  # fmt: skip
    wait_records(cluster, "duo", "pick", len(hot), timeout_s=120)
    assert bodies(cluster, "duo", "pick") == [json.loads(e["body"]) for e in hot]

    out = tmp_path / "out" / "both.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(out.read_text().splitlines()) < total + 1:
        time.sleep(0.5)
    time.sleep(1)  # a duplicate would show within a batch
    rows = pd.read_csv(out, dtype=str)
    want = [json.loads(m.data) for m in merged(cluster, "duo", "both", ["a", "b"])]
    assert list(zip(rows["seq"].astype(int), rows["sensor"], strict=True)) == [
        (e["seq"], json.loads(e["body"])["sensor"]) for e in want
    ]

    # The Case 1 pipeline carried on where it was killed, exactly once.
    cluster.wait_for("whole", "sink", len(ref.rows))
    verdict = compare(ref.rows, read_sink(whole / "out" / "case1.csv", "value"))
    assert verdict.consistent, verdict.summary()
    status = cluster.status("whole")
    assert all(e["state"] == "running" for e in status["elements"]), status
    for pipeline in ("duo", "whole"):
        cluster.cli("stop", pipeline)


def shared_line(rnd: random.Random, k: int) -> str:
    """Row ``k`` of either input: six sensors, each in both inputs."""
    return f"{1_700_000_000 + k},s{k % 6},{rnd.uniform(-50, 50):.3f}\n"


@pytest.mark.timeout(900)
def test_keys_of_a_partition_with_two_inputs_move_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    # A keyed PE in two partitions reads two inputs, each key's events in both: keys, then a
    # key group, move between the partitions while both inputs flow, then it scales out to
    # three, each move and the rescale stored in both inputs. Every
    # key's events are numbered as processed (procs_multi.KeyedTally), so a state lost or
    # doubled at a move, an event lost, repeated or out of its input's order shows.
    procs = Path(__file__).parent
    for seed, name in enumerate("ab", start=7):
        FEEDERS[tmp_path / name] = Feeder(tmp_path / f"{name}.csv", seed, first=30,
                                          line=shared_line)  # fmt: skip
    spec = write_spec(
        tmp_path / "keyduo.yaml",
        "keyduo",
        [
            {"id": "a", "kind": "csv-source", "node": "cloud", "options": {"path": "a.csv"}},
            {"id": "b", "kind": "csv-source", "node": "cloud", "options": {"path": "b.csv"}},
            {"id": "tally", "kind": "custom", "partitions": ["fog-a", "fog-b"],
             "key_by": "sensor", "inputs": ["a", "b"],
             "options": {"class": "procs_multi:KeyedTally", "path": str(procs)}},
            {"id": "out", "kind": "csv-sink", "node": "cloud", "inputs": ["tally"],
             "options": {"path": "out/keyduo.csv"}},
        ],
    )  # fmt: skip
    cluster.cli("deploy", str(spec))
    for pe in ("tally-p0", "tally-p1"):
        cluster.wait_for("keyduo", pe, 10)
    zero = [f"s{i}" for i in range(6) if partition_of_key(f"s{i}", 2) == 0]
    one = [f"s{i}" for i in range(6) if partition_of_key(f"s{i}", 2) == 1]
    assert zero and one
    # Two of partition 0's keys to fog-b (backlog order, their states copied ahead), then
    # the key group of one of partition 1's to fog-a (fifo, whole states: the group's keys
    # holding state go in a wave, then its record, stored in both inputs and read by the
    # partitions only once in both, sends the group's later keys too), each while both
    # inputs flow.
    moved = cluster.json("migrate", "keyduo", "tally", "--keys", ",".join(zero[:2]),
                         "--to", "fog-b")  # fmt: skip
    assert (moved["status"], sorted(moved["sent"])) == ("moved", sorted(zero[:2])), moved
    cluster.wait_for("keyduo", "tally-p1", cluster.element("keyduo", "tally-p1")["events_out"] + 20)
    group = partition_of_key(one[0], 4)
    in_group = [k for k in one if partition_of_key(k, 4) == group]
    back = cluster.json("migrate", "keyduo", "tally", "--key-group", f"{group}/4", "--to",
                        "fog-a", "--order", "fifo")  # fmt: skip
    assert (back["status"], sorted(back["sent"])) == ("moved", in_group), back
    cluster.wait_for("keyduo", "tally-p0", cluster.element("keyduo", "tally-p0")["events_out"] + 20)
    # Then out to three partitions: the rescale is a listed move stored in both inputs, the
    # added partition (on cloud) reads each from where it stood when placed, and every key
    # goes to its partition of three, earlier moves forgotten.
    scaled = cluster.json("scale", "keyduo", "tally", "--partitions", "3", "--on", "cloud")
    assert scaled["status"] == "moved", scaled
    parts = ("tally-p0", "tally-p1", "tally-p2")
    for pe in parts:
        cluster.wait_for("keyduo", pe, cluster.element("keyduo", pe)["events_out"] + 10)
    total = sum(FEEDERS.pop(tmp_path / name).stop() for name in "ab")

    client = SyncJetStream(BrokerAddress.load(cluster.home / "broker.json"))
    try:
        subjects = {pe: data_subject("keyduo", pe) for pe in parts}
        deadline = time.monotonic() + 300
        stored = 0
        while time.monotonic() < deadline and stored < total:
            time.sleep(0.5)
            stored = sum(
                client.run(lambda js, p=pe: subject_counts(js, stream_name("keyduo", p))).get(s, 0)
                for pe, s in subjects.items()
            )  # fmt: skip
    finally:
        client.close()
    assert stored == total, f"{stored} of {total} events out\n{cluster.logs()}"
    time.sleep(1)  # a duplicate would show within a batch
    inputs: dict[str, set[tuple[str, int]]] = {}
    for name in "ab":
        for m in stream_messages(cluster, "keyduo", name):
            if m.subject == data_subject("keyduo", name):
                event = json.loads(m.data)
                key = json.loads(event["body"])["sensor"]
                inputs.setdefault(key, set()).add((event["creator"], event["seq"]))
    out: dict[str, list[tuple[int, str, int, str]]] = {}
    for pe in parts:
        for body in bodies(cluster, "keyduo", pe):
            out.setdefault(body["sensor"], []).append((body["n"], body["src"], body["src_seq"], pe))
    assert set(out) == set(inputs)
    for key, rows in out.items():
        rows.sort()
        # Numbered 1..N without a gap or a repeat: the state moved whole, once.
        assert [n for n, *_ in rows] == list(range(1, len(rows) + 1)), key
        # Each of the key's input events exactly once, each input's in its order.
        assert {(src, seq) for _, src, seq, _ in rows} == inputs[key] and len(rows) == len(
            inputs[key]
        ), key
        for name in "ab":
            seqs = [seq for _, src, seq, _ in rows if src == name]
            assert seqs == sorted(seqs), (key, name)
    # Each key was processed by its owners in turn: its CRC-32 partition of two, the one
    # a move or the group gave it, its partition of three (a stretch without events of the
    # key leaves one out, never two owners at once or one twice).
    for key, rows in out.items():
        chain = [f"tally-p{partition_of_key(key, 2)}"]
        if key in zero[:2] or key in in_group:
            chain.append("tally-p1" if key in zero[:2] else "tally-p0")
        chain.append(f"tally-p{partition_of_key(key, 3)}")
        chain = [pe for i, pe in enumerate(chain) if i == 0 or pe != chain[i - 1]]
        runs = [pe for i, (*_, pe) in enumerate(rows) if i == 0 or pe != rows[i - 1][3]]
        assert runs[0] == chain[0] and runs[-1] == chain[-1], (key, runs, chain)
        rest = iter(chain)
        assert all(pe in rest for pe in runs), (key, runs, chain)  # (a subsequence)
    assert {pe for rows in out.values() for *_, pe in rows} == set(parts)
    # Downstream, the partitions' records merged: each key's in the order it was processed
    # (the target's rows from a moved key's state on are numbered beyond the origin's).
    sink = tmp_path / "out" / "keyduo.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not sink.exists() or len(sink.read_text().splitlines()) < total + 1
    ):
        time.sleep(0.5)
    time.sleep(1)  # a duplicate would show within a batch
    written = pd.read_csv(sink, dtype={"sensor": str})
    assert len(written) == total
    for key, group in written.groupby("sensor"):
        assert list(group["n"]) == list(range(1, len(group) + 1)), key
    cluster.cli("stop", "keyduo")


def whole_spec(work: Path) -> Path:
    """Case 1 with its three PEs on three nodes, reading ``work/in.csv``."""
    return write_spec(
        work / "whole.yaml",
        "whole",
        [
            {"id": "source", "kind": "csv-source", "node": "cloud",
             "options": {"path": "in.csv"}},
            {"id": "aggregate", "kind": "window-aggregate", "node": "fog-a", "inputs": ["source"],
             "options": {"field": "value", "window": 10, "function": "avg"}},
            {"id": "sink", "kind": "csv-sink", "node": "fog-c", "inputs": ["aggregate"],
             "options": {"path": "out/case1.csv"}},
        ],
    )  # fmt: skip
