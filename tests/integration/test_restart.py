"""The whole local cluster killed (SIGKILL, every process group) and started again."""

from __future__ import annotations

import os
import signal
import time

import pytest

from fogshift.verify.reference import case1_reference, compare, read_sink
from tests.conftest import Cluster, group_alive, pgids_of
from tests.integration.helpers import write_case1_csv, write_spec

pytestmark = pytest.mark.integration


def test_kill_everything_then_up_again_keeps_output_exact(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("restart")
    data = write_case1_csv(work / "in.csv", 600, seed=21)
    spec = write_spec(
        work / "case1.yaml",
        "case1",
        [
            {"id": "source", "kind": "csv-source", "node": "cloud",
             "options": {"path": "in.csv", "rate": 15}},
            {"id": "aggregate", "kind": "window-aggregate", "node": "fog-a", "inputs": ["source"],
             "options": {"field": "value", "window": 10, "function": "avg"}},
            {"id": "sink", "kind": "csv-sink", "node": "fog-b", "inputs": ["aggregate"],
             "options": {"path": "out/case1.csv"}},
        ],
    )  # fmt: skip
    ref = case1_reference(data, "value", 10, "avg")
    cluster.cli("deploy", str(spec))
    before = cluster.wait_for("case1", "sink", 30)["events_out"]
    assert before < len(ref.rows), "the stream finished before the kill: nothing was tested"

    groups = pgids_of(cluster.home)
    for pgid in groups:
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(group_alive(g) for g in groups)
    partial = read_sink(work / "out" / "case1.csv", "value")
    assert compare(ref.rows[: len(partial)], partial).consistent  # a prefix, no duplicates

    cluster.up()  # same home: registry, streams and checkpoints are all on disk
    cluster.wait_for("case1", "sink", len(ref.rows))
    time.sleep(2)  # give a duplicate the chance to show
    verdict = compare(ref.rows, read_sink(work / "out" / "case1.csv", "value"))
    assert verdict.consistent, verdict.summary()
    status = cluster.status("case1")
    assert all(e["state"] == "running" for e in status["elements"]), status
