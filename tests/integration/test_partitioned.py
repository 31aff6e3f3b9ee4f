"""A partitioned keyed PE on real agents: its keys split over nodes, each partition moved
alone mid-stream, the output exact per key and every twin readable through the element."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fogshift.spec.models import partition_of_key
from tests.conftest import Cluster
from tests.integration.helpers import case1_spec, finish_and_compare, keyed_windows

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_partitioned_pe_splits_its_keys_and_a_partition_moves_alone(
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
    # Partition 1 moves while partition 0 goes on, make-before-break, as any PE does.
    moved = cluster.cli(
        "migrate", "split", "aggregate-p1", "--to", "cloud", "--mode", "handover", "--json"
    )
    report = json.loads(moved.stdout)
    assert (report["status"], report["origin"], report["target"]) == ("migrated", "fog-b", "cloud")
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
        owned = {k for k in windows if partition_of_key(k, 2) == index}
        assert part["node"] == node
        assert {e["key"] for e in part["entries"]} == owned and owned
    # One key is asked of the partition that owns it.
    key = sorted(windows)[0]
    one = cluster.json("state", "split", "aggregate", key)
    assert one["element"] == f"aggregate-p{partition_of_key(key, 2)}"
    assert [e["state"]["values"] for e in one["entries"]] == [windows[key]]
    cluster.cli("stop", "split")
