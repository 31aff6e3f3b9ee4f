"""Case 2 on real agents, through `fogshift demo --case ecg`: simulated patients' ECG through
amplify, a keyed band-pass and a keyed classifier, moved to another node mid-stream as one
group, that node SIGKILLed and the three restored by the orchestrator; the filtered signal
(sample by sample) and the alarms equal an offline reference that filters each recording
whole. The twins, the events endpoint and a refused group are checked on the pipeline the
demo leaves running."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from playwright.sync_api import expect

from fogshift.broker.naming import data_subject
from fogshift.common.waiting import wait_until
from fogshift.ecg.simulate import patients
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions, EcgSourceOptions
from fogshift.verify.case2 import quality, read_alarms, reference_alarms, reference_filtered
from tests.conftest import Cluster, fogshift
from tests.integration.helpers import (
    assert_only_new_epochs_after_fence,
    case2_elements,
    stream_messages,
)
from tests.web.browser import PAGE_FITS, shoot

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]

#: At real time, long enough that on a quiet machine the move and the kill come while the
#: wearables stream; on two loaded cores the recordings may end before the kill (they did
#: even at 72 s, so the suite waits 48 s, not longer). Which it is, is the machine's to
#: decide, so the test asserts what holds either way (the output equals the reference; the
#: fenced band-pass never wrote again).
SOURCE = EcgSourceOptions(patients=4, duration_s=48.0, speed=1.0, onset_s=12.0, seed=2)
PROCESSING = ("amplify", "bandpass", "classify")


def test_the_processing_moves_its_node_dies_and_the_output_equals_the_reference(
    cluster: Cluster, tmp_path: Path, dashboard: str, browser: object
) -> None:
    # Logged in before the demo: the printed link expires after 10 minutes, which a slow
    # demo run can outlast.
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    login = context.new_page()
    login.goto(dashboard)
    login.get_by_role("button", name="Log in").click()  # (opening the link logs nobody in)
    expect(login).to_have_url(re.compile(r"/pipelines$"))
    login.close()
    elements = case2_elements(SOURCE)
    spec = tmp_path / "case2.yaml"
    spec.write_text(yaml.safe_dump(
        {"pipeline": "ecg", "recovery": {"detect_after_s": 5}, "elements": elements}
    ))  # fmt: skip
    result = fogshift("demo", "--case", "ecg", "--home", str(cluster.home), "--spec", str(spec),
                      check=False, timeout=600)  # fmt: skip
    out = result.stdout + result.stderr
    # Kept beside the test's files (pytest keeps the last runs' temp folders): under load
    # this test took 112 s in some suite runs and 336 s in others, and which wait took the
    # time is only in the demo's output.
    (tmp_path / "demo.out").write_text(out)
    text = " ".join(out.split())  # the console wraps long lines
    assert result.returncode == 0, out + cluster.logs()
    assert "handed over amplify, bandpass, classify to fog-b as one group" in text, out
    # Each moved under a new epoch (make-before-break) and was then restored under another.
    assert text.count("fog-a -> fog-b migrated") == 3, out
    assert (
        "killed node fog-b (SIGKILL of its process group) with amplify, bandpass, classify" in text
    ), out
    restored = dict(re.findall(r"restored (\w+) on (\S+) \(epoch 3\)", text))
    assert sorted(restored) == sorted(PROCESSING), out
    assert "fog-b" not in restored.values(), out
    assert "CONSISTENT" in text and "INCONSISTENT" not in text, out
    assert "sensitivity 1.00" in text and "DETECTION FAILED" not in text, out

    # Independently of the demo's verdict: the alarms file ...
    amplify = AmplifyOptions.model_validate(elements[1]["options"])
    band, rule = BandpassOptions(), ClassifyOptions()
    expected = reference_alarms(SOURCE, amplify, band, rule)
    alarms = read_alarms(tmp_path / "out" / "alarms.csv")
    assert alarms == expected and alarms, (alarms, expected)
    people = patients(SOURCE.patients, SOURCE.seed, SOURCE.abnormal_every, SOURCE.onset_s)
    # (The reference shares the detector: the ground truth is what judges it.)
    found = quality(alarms, people, SOURCE.duration_s)
    assert found.problems() == [] and found.sensitivity == 1.0, found
    # ... and the band-pass's stream as the broker holds it: each patient's signal is the
    # whole recording filtered at once, so the filter's state crossed every window, the
    # migration and the restore without a transient.
    filtered: dict[str, list[float]] = {}
    for message in stream_messages(cluster, "ecg", "bandpass"):
        if message.subject == data_subject("ecg", "bandpass"):
            body = json.loads(json.loads(message.data)["body"])
            filtered.setdefault(body["patient"], []).extend(body["samples"])
    reference = reference_filtered(SOURCE, amplify, band)
    assert sorted(filtered) == sorted(reference)
    for patient, signal in reference.items():
        assert np.array_equal(np.asarray(filtered[patient]), signal), patient
    # Each PE counted every window it took in, through the handover and the restore: a
    # node-level snapshot that froze the counters a batch behind left a restored
    # classifier short of that batch's windows for good (and the demo waiting for them).
    windows = sum(
        m.subject == data_subject("ecg", "bandpass")
        for m in stream_messages(cluster, "ecg", "bandpass")
    )
    counted = {pe: cluster.element("ecg", pe)["events_in"] for pe in PROCESSING}
    assert counted == dict.fromkeys(PROCESSING, windows), (counted, windows)
    # The killed band-pass was fenced: nothing of its came after the restore (the
    # classifier writes only alarms, and there may be none after its fence). When the kill
    # came after the recordings had ended, the restored one had nothing left to write.
    midstream = "with amplify, bandpass, classify on it, while the wearables still stream" in text
    assert_only_new_epochs_after_fence(cluster, "ecg", "bandpass", epoch=3, input_left=midstream)

    # The twins where they now run: each patient's alarm as the classifier holds it.
    twins = cluster.json("state", "ecg", "classify")
    assert twins["node"] == restored["classify"] and twins["keys"] == SOURCE.patients
    held = {e["key"]: e["state"]["alarm"] for e in twins["entries"]}
    last = {who: cls == "abnormal" for who, _, cls in alarms}
    assert held == {p.name: last.get(p.name, False) for p in people}
    page = cluster.json("state", "ecg", "classify", "--limit", "2")  # (its first keys)
    assert page["keys"] == SOURCE.patients
    assert [e["key"] for e in page["entries"]] == sorted(held)[:2]
    assert all(e["state"]["alarm"] == held[e["key"]] for e in page["entries"])
    # One patient's newest filtered windows, as the dashboard's ECG view reads them.
    page = cluster.json("events", "ecg", "bandpass", "p01", "--tail", "40", "--limit", "5")
    assert [e["body"]["patient"] for e in page["events"]] == ["p01"] * 5, page
    assert page["events"][-1]["body"]["samples"] == filtered["p01"][-len(
        page["events"][-1]["body"]["samples"]):]  # fmt: skip
    unkeyed = cluster.cli("events", "ecg", "amplify", "p01", check=False)
    # Refused as bad input (exit 2) with its own code, though the CLI never imports the
    # orchestrator's error classes.
    assert unkeyed.returncode == 2 and "(not_keyed)" in unkeyed.stderr, unkeyed.stderr
    assert "is not keyed" in unkeyed.stderr
    # The dashboard's ECG view, in a real browser: a patient's signal drawn, their alarms
    # listed as the classifier emitted them (the screenshot is the README's).
    sick = next(who for who, _, cls in expected if cls == "abnormal")
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(dashboard.split("/login")[0] + "/pipelines/ecg")
        page.get_by_role("link", name="ECG and alarms of each patient").click()
        page.get_by_role("navigation", name="Patients").get_by_role("link", name=sick).click()
        mine = [(t, cls) for who, t, cls in expected if who == sick]
        rows = page.locator("#alarms tbody tr")
        expect(rows).to_have_count(len(mine))
        for row, (t, cls) in zip(rows.all(), mine, strict=True):
            expect(row.locator("td").nth(0)).to_have_text(f"{t:g}")
            expect(row.locator("td").nth(1)).to_have_text(cls)
        expect(page.locator("figure.chart .uplot canvas")).to_have_count(1)
        drawn = page.evaluate("fetch(document.querySelector('figure.chart').dataset.ecg)"
                              ".then(r => r.json())")  # fmt: skip
        # The newest 10 s of the patient's filtered signal, as the band-pass emitted it.
        assert drawn["y"] == filtered[sick][-len(drawn["y"]) :] and len(drawn["y"]) > 2000
        assert [m["t"] for m in drawn["marks"]] == [t for t, _ in mine]
        shoot(page, tmp_path, "ecg")
        page.set_viewport_size({"width": 390, "height": 844})
        wait_until(lambda: page.evaluate(PAGE_FITS), 10, interval_s=0.1,
                   describe="the ECG view as narrow as a phone's screen")  # fmt: skip
    finally:
        page.close()
        context.close()
    # A group with a PE that does not exist is refused before anything moves.
    elsewhere = next(n for n in ("fog-a", "fog-c") if n != restored["bandpass"])
    refused = cluster.cli("migrate", "ecg", "--elements", "bandpass,nope", "--to", elsewhere,
                          check=False)  # fmt: skip
    assert refused.returncode == 1 and "has no element 'nope'" in refused.stderr
    assert cluster.element("ecg", "bandpass")["node"] == restored["bandpass"]
    cluster.cli("stop", "ecg")
