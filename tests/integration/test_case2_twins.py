"""Case 2's source that moves (issue #16): the classifier's twins partitioned over two
gateways, one patient's wearable coming near the other gateway mid-stream, and only that
patient's twin moving there (`migrate --keys`), while the other patients on the first
gateway are classified on by the same instance. The alarms equal an offline reference per
patient."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fogshift.broker.naming import data_subject
from fogshift.common.waiting import wait_until
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions, EcgSourceOptions
from fogshift.spec.models import partition_of_key
from fogshift.verify.case2 import read_alarms, reference_alarms
from tests.conftest import Cluster
from tests.integration.helpers import case2_elements, stream_messages

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]

#: Six patients at real time (at twice that, a loaded machine had streamed all before the
#: move): p02, p04 and p06 turn abnormal around 10 s; p04, p05 and p06 hash to partition 0
#: (fog-a), the others to partition 1 (fog-b).
SOURCE = EcgSourceOptions(patients=6, duration_s=30.0, speed=1.0, onset_s=10.0, seed=3)
MOVING = "p04"


def test_a_wearable_moves_to_the_other_gateway_and_only_its_twin_follows(
    cluster: Cluster, tmp_path: Path
) -> None:
    elements = case2_elements(SOURCE, {"partitions": ["fog-a", "fog-b"]})
    spec = tmp_path / "twins.yaml"
    spec.write_text(yaml.safe_dump({"pipeline": "twins", "elements": elements}))
    names = [f"p{i:02d}" for i in range(1, SOURCE.patients + 1)]
    stay = [p for p in names if partition_of_key(p, 2) == 0 and p != MOVING]
    assert partition_of_key(MOVING, 2) == 0 and stay
    cluster.cli("deploy", str(spec))
    # The wearable moves once fog-a's partition has classified a couple of windows of each
    # of its three patients (the status is cheap to ask, a twin's state is a Spark job).
    wait_until(lambda: cluster.element("twins", "classify-p0")["events_in"] >= 6, 120,
               interval_s=0.2, describe="fog-a's twins at work")  # fmt: skip
    assert _samples(cluster).get(MOVING, 0) > 0
    before = cluster.element("twins", "classify-p0")
    moved = cluster.json("migrate", "twins", "classify", "--keys", MOVING, "--to", "fog-b")
    assert (moved["status"], moved["origins"], moved["target_partition"]) == (
        "moved", {MOVING: "classify-p0"}, "classify-p1"
    ), moved  # fmt: skip
    assert moved["sent"] == [MOVING] and moved["state_bytes"] > 0
    # Every twin took in every sample of its patient's recording exactly once: the moved
    # one's signal history crossed with it (a twin started afresh would count from 0).
    total = int(SOURCE.duration_s * SOURCE.sampling_rate)
    wait_until(lambda: _samples(cluster) == dict.fromkeys(names, total), 180, interval_s=2,
               describe="every recording classified to its end")  # fmt: skip
    amplify = AmplifyOptions.model_validate(elements[1]["options"])
    expected = reference_alarms(SOURCE, amplify, BandpassOptions(), ClassifyOptions())
    assert any(who == MOVING for who, _, _ in expected)
    out = tmp_path / "out" / "alarms.csv"
    wait_until(lambda: len(read_alarms(out)) >= len(expected), 60, describe="the alarms")
    # Every patient's alarms, in their order, as the offline reference has them (the two
    # partitions' alarms interleave at the sink as their batches meet).
    alarms = read_alarms(out)
    for patient in names:
        mine = [(t, cls) for who, t, cls in alarms if who == patient]
        assert mine == [(t, cls) for who, t, cls in expected if who == patient], patient
    # The other patients of fog-a never noticed: the same instance (no restart, same epoch)
    # went on classifying them.
    after = cluster.element("twins", "classify-p0")
    assert (after["epoch"], after["restarts"], after["node"]) == (
        before["epoch"], before["restarts"], "fog-a"
    )  # fmt: skip
    # The twin is on fog-b now; the others of fog-a are where they were.
    one = cluster.json("state", "twins", "classify", MOVING)
    assert (one["element"], one["node"]) == ("classify-p1", "fog-b")
    kept = cluster.json("state", "twins", "classify-p0")["entries"]
    assert sorted(e["key"] for e in kept) == stay
    # Mid-stream: the band-pass emitted windows of the patient after the move was stored.
    later = [
        m for m in stream_messages(cluster, "twins", "bandpass")
        if m.subject == data_subject("twins", "bandpass")
        and m.metadata.sequence.stream > moved["move_seq"]
        and json.loads(json.loads(m.data)["body"])["patient"] == MOVING
    ]  # fmt: skip
    assert later, "the recordings had ended before the wearable moved"
    cluster.cli("stop", "twins")


def _samples(cluster: Cluster) -> dict[str, int]:
    """Samples each patient's twin has taken in (its rhythm's tail and where it starts)."""
    twins = cluster.json("state", "twins", "classify")["entries"]
    return {
        e["key"]: int(e["state"]["rhythm"]["tail_start"]) + len(e["state"]["rhythm"]["tail"])
        for e in twins
    }
