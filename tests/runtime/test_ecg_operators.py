"""Case 2's processors event by event (their state encoded after every batch, as stored):
the band-pass equals the whole recording filtered, the classifier's alarms equal the
reference's, and a window that is not one is a dead letter that changes nothing."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fogshift.ecg import beats
from fogshift.ecg.simulate import patients
from fogshift.events import Event
from fogshift.runtime.api import Processor
from fogshift.runtime.batch import run_events
from fogshift.runtime.ecg_source import EcgPartition, EcgSourceReader, Stream
from fogshift.runtime.operators.ecg import Amplify, Bandpass, Classify
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions, EcgSourceOptions
from fogshift.verify.case2 import reference_alarms, reference_filtered

SOURCE = EcgSourceOptions(patients=1, duration_s=30.0, onset_s=12.0, seed=4, abnormal_every=1)


def through(processor: Processor, bodies: list[dict[str, Any]], batch: int = 7) -> tuple[
    list[dict[str, Any]], list[str]
]:  # fmt: skip
    """Outputs and dead-letter reasons of ``bodies`` in batches of ``batch`` events, the
    state rebuilt from its JSON between batches (as the state store gives it back)."""
    outputs, reasons = [], []
    for start in range(0, len(bodies), batch):
        rows = [(k, k, 1000.0 + k, "src", json.dumps(b))
                for k, b in enumerate(bodies[start : start + batch], start=start + 1)]  # fmt: skip
        for record in run_events(processor, rows):  # type: ignore[arg-type]
            if record[6] is None:
                outputs.append(json.loads(record[5]))
            else:
                reasons.append(record[6])
        processor.restore(json.loads(json.dumps(processor.snapshot())))
    return outputs, reasons


def test_amplify_bandpass_and_classify_equal_the_reference() -> None:
    stream = Stream(SOURCE)
    bodies = [stream.event(k)[1] for k in range(1, stream.total + 1)]
    (patient,) = patients(1, SOURCE.seed, SOURCE.abnormal_every, SOURCE.onset_s)
    amplify_options = AmplifyOptions(gain=2.0, calibration={patient.name: patient.gain})
    amplified, dead = through(Amplify.build(amplify_options.as_dict(), "amp", None), bodies)
    assert not dead
    filtered, dead = through(Bandpass.build({}, "band", None), amplified)
    assert not dead
    signal = np.concatenate([b["samples"] for b in filtered])
    expected = reference_filtered(SOURCE, amplify_options, BandpassOptions())[patient.name]
    assert np.array_equal(signal, expected)
    classify = Classify.build({}, "classify", None)
    classify.on_assign()
    alarms, dead = through(classify, filtered)
    assert not dead
    reference = reference_alarms(SOURCE, amplify_options, BandpassOptions(), ClassifyOptions())
    assert [(a["patient"], a["t"], a["class"]) for a in alarms] == reference
    assert reference and reference[0][2] == "abnormal" and reference[0][1] > SOURCE.onset_s


def test_a_patient_whose_signal_went_flat_raises_an_alarm() -> None:
    # A lost electrode or a heart stopped: the last beats' rhythm read as normal, no alarm.
    stream = Stream(EcgSourceOptions(patients=1, duration_s=30.0, seed=4, abnormal_every=0))
    bodies = [stream.event(k)[1] for k in range(1, stream.total + 1)]
    flat_from = 16.0
    for body in bodies:
        if body["t"] >= flat_from:
            body["samples"] = [0.0] * len(body["samples"])
    filtered, dead = through(Bandpass.build({}, "band", None), bodies)
    assert not dead
    classify = Classify.build({"confirm": 2}, "classify", None)
    classify.on_assign()
    alarms, dead = through(classify, filtered)
    assert not dead
    assert [(a["class"], a["confidence"]) for a in alarms] == [("abnormal", 1.0)], alarms
    assert flat_from + beats.SILENT_S < alarms[0]["t"] <= flat_from + beats.SILENT_S + 1.5


def test_a_window_that_is_not_one_is_a_dead_letter_and_changes_nothing() -> None:
    band = Bandpass.build({}, "band", None)
    good = {"patient": "p01", "t": 0.0, "fs": 250, "samples": [0.1, 0.2, 0.3]}
    through(band, [good])
    before = band.snapshot()
    bad = [{**good, "samples": []}, {**good, "samples": [1, "x"]}, {**good, "fs": 0},
           {**good, "patient": None}, {**good, "samples": [1e400]}]  # fmt: skip
    outputs, reasons = through(band, bad)
    assert outputs == [] and len(reasons) == len(bad)
    assert band.snapshot() == before
    classify = Classify.build({}, "classify", None)
    classify.on_assign()
    assert classify.process(Event(1, 0.0, "x", good)) is None  # no beats yet: no alarm


def test_a_window_at_another_rate_or_without_a_probability_changes_no_twin() -> None:
    # Beats are counted in samples: a window at 500 Hz after forty at 250 Hz read a normal
    # 75 bpm as 150 bpm and raised an alarm; a probability that is not a number counted as
    # a normal window. Each is a dead letter now, the twin as before it.
    from types import SimpleNamespace

    classify = Classify.build({"confirm": 1}, "classify", None)
    classify.on_assign()
    pulse = np.zeros(40 * 125)
    pulse[::200] = 1.0  # a beat every 0.8 s at 250 Hz: 75 bpm
    for w in range(40):
        body = {"patient": "p01", "t": w * 0.5, "fs": 250,
                "samples": pulse[w * 125 : (w + 1) * 125].tolist()}  # fmt: skip
        assert classify.process(Event(w + 1, 0.0, "x", body)) is None  # normal: no alarm
    before = classify.snapshot()
    faster = {"patient": "p01", "t": 20.0, "fs": 500, "samples": [0.0] * 125}
    outputs, reasons = through(classify, [faster])
    assert outputs == [] and "come at 250 Hz; this one at 500 Hz" in reasons[0]
    assert classify.snapshot() == before
    classify.model = SimpleNamespace(abnormal=lambda found: float("nan"))  # type: ignore[assignment]
    same = {"patient": "p01", "t": 20.0, "fs": 250, "samples": pulse[:125].tolist()}
    outputs, reasons = through(classify, [same])
    assert outputs == [] and "give no probability" in reasons[0]
    assert classify.snapshot() == before


def test_a_repeated_window_is_a_dead_letter_and_a_hole_starts_the_rhythm_over() -> None:
    # Beats are counted in samples: a window sent again was read as more signal, and the
    # beats across windows lost (a dead letter upstream, a wearable off) as one interval
    # as short as the rest of the hole's samples made it.
    classify = Classify.build({"confirm": 1}, "classify", None)
    classify.on_assign()
    pulse = np.zeros(40 * 125)
    pulse[::200] = 1.0  # a beat every 0.8 s at 250 Hz: 75 bpm

    def window(w: int) -> dict[str, Any]:
        return {"patient": "p01", "t": w * 0.5, "fs": 250,
                "samples": pulse[w * 125 : (w + 1) * 125].tolist()}  # fmt: skip

    outputs, reasons = through(classify, [window(w) for w in range(20)])
    assert outputs == reasons == [] and classify.rhythm["beats"]
    before = classify.snapshot()
    outputs, reasons = through(classify, [window(19), window(5)])
    assert len(reasons) == 2 and all("repeated, or out of order" in r for r in reasons), reasons
    assert classify.snapshot() == before
    # Windows 20-23 lost: the rhythm starts over (its first second unread), the alarm stands.
    outputs, reasons = through(classify, [window(24)])
    assert reasons == [] and classify.rhythm["beats"] == []
    through(classify, [window(w) for w in range(25, 40)])
    found = beats.features(classify.rhythm, 250)
    assert found is not None and found[0] == pytest.approx(0.75, rel=0.02), found


def test_the_band_pass_keeps_a_patients_rate_and_its_windows_in_order() -> None:
    # A window at another rate went through the filter (of the other rate's design) and
    # changed its state before the classifier refused it; a window sent again or late was
    # filtered as more signal, and a hole as if the signal went on.
    band = Bandpass.build({}, "band", None)

    def window(w: int, fs: int = 250) -> dict[str, Any]:
        return {"patient": "p01", "t": w * 0.5, "fs": fs,
                "samples": np.sin(np.arange(w * 125, (w + 1) * 125) / 9.0).tolist()}  # fmt: skip

    outputs, reasons = through(band, [window(w) for w in range(6)])
    assert len(outputs) == 6 and reasons == []
    before = band.snapshot()
    outputs, reasons = through(band, [window(6, fs=500), window(5), window(2)])
    assert outputs == [] and "come at 250 Hz; this one at 500 Hz" in reasons[0]
    assert all("repeated, or out of order" in r for r in reasons[1:]), reasons
    assert band.snapshot() == before
    # A hole (windows 6-9 lost): the filter starts over, as a fresh patient's does.
    outputs, _ = through(band, [window(10)])
    fresh = Bandpass.build({}, "band", None)
    assert outputs == through(fresh, [window(10)])[0]
    assert band.t_next == pytest.approx(5.5)


def test_the_reference_places_an_alarm_where_the_classifier_does() -> None:
    from fogshift.verify.case2 import alarm_time

    fs, window = 256, 154  # 0.6 s windows
    for w in range(199):
        start = round(w * window / fs, 6)  # what the source sends as the window's t
        assert alarm_time(w, window, fs) == round(start + window / fs, 3), w  # Classify's
    assert alarm_time(7, window, fs) == 4.813  # (4.812 before)


def test_a_patient_whose_onset_is_after_the_recording_is_not_counted_as_missed() -> None:
    # Jitter put an onset at 35 s in a 32 s recording: the simulator keeps that patient
    # normal, and the scoring counted a missed alarm (sensitivity 0.0 where nothing was).
    from dataclasses import replace

    from fogshift.verify.case2 import quality

    late = replace(patients(1, 1, 1, 30.0)[0], onset_s=35.0)
    assert quality([], [late], 32.0).sensitivity == 1.0
    assert quality([], [late]).sensitivity == 0.0  # (scored without the recording's end)


def test_an_all_clear_while_a_patient_is_abnormal_is_a_detection_problem() -> None:
    # Sensitivity and specificity counted only `abnormal` alarms: a `normal` one after the
    # onset (a false all-clear) passed both at 1.0, and the demo's verdict never looked.
    from dataclasses import replace

    from fogshift.verify.case2 import quality

    sick, other = patients(2, 1, 1, 10.0)[:2]
    well = replace(other, onset_s=None)
    assert sick.onset_s is not None
    at = sick.onset_s + 3
    found = quality([(sick.name, at, "abnormal")], [sick, well], 60.0)
    assert (found.sensitivity, found.specificity, found.cleared, found.problems()) == (
        1.0, 1.0, (), [])  # fmt: skip
    cleared = quality([(sick.name, at, "abnormal"), (sick.name, at + 9, "normal")],
                      [sick, well], 60.0)  # fmt: skip
    assert cleared.cleared == (sick.name,) and cleared.sensitivity == 1.0
    assert cleared.problems() == [f"cleared while abnormal: {sick.name}"]
    false_alarm = quality([(well.name, 5.0, "abnormal")], [sick, well], 60.0)
    assert any("specificity 0.50" in p for p in false_alarm.problems())
    assert any("sensitivity 0.00" in p for p in false_alarm.problems())


def test_a_window_the_simulation_made_non_finite_is_the_sources_dead_letter() -> None:
    """The simulated signal is a pure function of the options; should it hold a NaN, that
    window is a dead letter and the source goes on with the next (the batch failed at
    every retry)."""
    reader = EcgSourceReader({"options": SOURCE.model_dump_json(), "pe": "ecg"})
    made = reader.stream.event

    def event(k: int) -> tuple[Any, dict[str, Any]]:
        patient, body = made(k)
        if k == 2:
            body["samples"][3] = float("nan")
        return patient, body

    reader.stream.event = event  # type: ignore[method-assign]
    rows = list(reader.read(EcgPartition(0, 3)))
    assert [(r[0], r[2]) for r in rows] == [(1, 1), (2, 2), (3, 3)]
    assert rows[0][6] is None and rows[2][6] is None
    assert rows[1][4] == "ecg" and "window 2 of patient" in rows[1][6]
    assert "non-finite sample" in rows[1][6]
    _, body = made(2)
    assert json.loads(rows[1][5]) == {"patient": body["patient"], "t": body["t"]}


def test_a_rate_no_ecg_has_is_a_dead_letter_not_the_patients_rate() -> None:
    # A patient's first window fixes its rate: one at 1e9 Hz (or 1e-9) was taken, and every
    # real window of the patient after it was refused.
    stream = Stream(SOURCE)
    windows = through(
        Bandpass.build({}, "band", None), [stream.event(k)[1] for k in range(1, stream.total + 1)]
    )[0]

    def alarms(windows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        classify = Classify.build({}, "classify", None)
        classify.on_assign()
        return through(classify, windows)

    for fs in (1e9, 1e-9, 49.0, 10_001):
        raised, reasons = alarms([{**windows[0], "fs": fs}, *windows])
        assert len(reasons) == 1 and "field 'fs' is" in reasons[0], reasons
        assert "50 to 10000 Hz" in reasons[0]
        assert raised == alarms(windows)[0] and raised, raised
