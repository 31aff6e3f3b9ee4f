"""Case 2 on real agents: simulated patients' ECG through amplify, a keyed band-pass and a
keyed classifier, both moved to another node mid-stream as one operation; the filtered
signal (sample by sample) and the alarms equal an offline reference that filters each
recording whole."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fogshift.broker.naming import data_subject
from fogshift.ecg.simulate import patients
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions, EcgSourceOptions
from fogshift.verify.case2 import quality, read_alarms, reference_alarms, reference_filtered
from tests.conftest import Cluster
from tests.integration.helpers import stream_messages, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SOURCE = EcgSourceOptions(patients=4, duration_s=40.0, speed=2.0, onset_s=12.0, seed=2)


def case2_elements(source: EcgSourceOptions) -> list[dict]:
    people = patients(source.patients, source.seed, source.abnormal_every, source.onset_s)
    calibration = {p.name: p.gain for p in people}  # the wearables' gains, undone
    return [
        {"id": "wearables", "kind": "ecg-source", "node": "cloud", "options": source.as_dict()},
        {"id": "amplify", "kind": "amplify", "node": "fog-a", "inputs": ["wearables"],
         "options": {"gain": 1.0, "calibration": calibration}},
        {"id": "bandpass", "kind": "bandpass", "node": "fog-a", "inputs": ["amplify"],
         "key_by": "patient"},
        {"id": "classify", "kind": "classify", "node": "fog-a", "inputs": ["bandpass"],
         "key_by": "patient"},
        {"id": "alarms", "kind": "csv-sink", "node": "cloud", "inputs": ["classify"],
         "options": {"path": "out/alarms.csv"}},
    ]  # fmt: skip


def test_the_processing_moves_mid_stream_and_equals_the_reference(
    cluster: Cluster, tmp_path: Path
) -> None:
    elements = case2_elements(SOURCE)
    spec = write_spec(tmp_path / "case2.yaml", "ecg", elements)
    cluster.cli("deploy", str(spec))
    total = int(SOURCE.duration_s / SOURCE.window_s) * SOURCE.patients
    cluster.wait_for("ecg", "bandpass", 2 * SOURCE.patients, timeout_s=120)
    # A group with a PE that does not exist is refused before anything moves.
    refused = cluster.cli("migrate", "ecg", "--elements", "bandpass,nope", "--to", "fog-b",
                          check=False)  # fmt: skip
    assert refused.returncode == 1 and "has no element 'nope'" in refused.stderr
    assert cluster.element("ecg", "bandpass")["node"] == "fog-a"
    # The wearable moves: its processing follows as one operation, while the patients keep
    # streaming.
    assert cluster.element("ecg", "wearables")["events_out"] < total
    moved = cluster.json("migrate", "ecg", "--elements", "bandpass,classify", "--to", "fog-b")
    assert moved["status"] == "migrated", moved
    assert moved["placement"] == {"bandpass": "fog-b", "classify": "fog-b"}
    assert [m["element"] for m in moved["migrations"]] == ["bandpass", "classify"]
    cluster.wait_for("ecg", "bandpass", total, timeout_s=300)
    amplify = AmplifyOptions.model_validate(elements[1]["options"])
    band, rule = BandpassOptions(), ClassifyOptions()
    expected = reference_alarms(SOURCE, amplify, band, rule)
    cluster.wait_for("ecg", "alarms", len(expected), timeout_s=120)

    # Sample by sample, each patient's filtered signal is the whole recording filtered at
    # once: the filter's state crossed every window, and the migration, without a transient.
    filtered: dict[str, list[float]] = {}
    for message in stream_messages(cluster, "ecg", "bandpass"):
        if message.subject == data_subject("ecg", "bandpass"):
            body = json.loads(json.loads(message.data)["body"])
            filtered.setdefault(body["patient"], []).extend(body["samples"])
    reference = reference_filtered(SOURCE, amplify, band)
    assert sorted(filtered) == sorted(reference)
    for patient, signal in reference.items():
        assert np.array_equal(np.asarray(filtered[patient]), signal), patient

    alarms = read_alarms(tmp_path / "out" / "alarms.csv")
    assert alarms == expected and alarms, (alarms, expected)
    people = patients(SOURCE.patients, SOURCE.seed, SOURCE.abnormal_every, SOURCE.onset_s)
    assert quality(alarms, people).sensitivity > 0
    # The twins where they now run: each patient's alarm as the classifier holds it.
    twins = cluster.json("state", "ecg", "classify")
    assert twins["node"] == "fog-b" and twins["keys"] == SOURCE.patients
    held = {e["key"]: e["state"]["alarm"] for e in twins["entries"]}
    last = {who: cls == "abnormal" for who, _, cls in alarms}
    assert held == {p.name: last.get(p.name, False) for p in people}
    cluster.cli("stop", "ecg")
