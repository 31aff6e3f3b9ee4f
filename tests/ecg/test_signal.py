"""Case 2's signal processing: simulated patients, the band-pass filter streamed window by
window, the beat detector and the shipped classifier against the simulator's ground truth."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from scipy.signal import sosfilt

from fogshift.ecg import beats, dsp, simulate
from fogshift.ecg.exceptions import BadSignal
from fogshift.ecg.model import BAND, load, window_features
from fogshift.ecg.simulate import patients, recording, segment
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions, EcgSourceOptions
from fogshift.verify.case2 import quality, reference_alarms


def test_patients_are_seeded_and_every_second_one_turns_abnormal() -> None:
    people = patients(6, seed=3, abnormal_every=2, onset_s=30.0)
    assert people == patients(6, seed=3, abnormal_every=2, onset_s=30.0)
    assert [p.name for p in people if p.onset_s is not None] == ["p02", "p04", "p06"]
    for p in people:
        assert p.device == f"wearable-{p.name}"
        if p.onset_s is not None:
            assert 24.0 <= p.onset_s <= 36.0 and p.rhythm is not None
            assert not p.abnormal_at(p.onset_s - 0.01) and p.abnormal_at(p.onset_s)
    assert patients(6, seed=4, abnormal_every=2, onset_s=30.0) != people


def test_a_recording_is_the_same_wherever_it_is_made() -> None:
    (p,) = patients(1, seed=5, abnormal_every=1, onset_s=10.0)
    assert p.onset_s is not None and p.rhythm is not None
    first = recording(p, 20.0, 250, 5)
    simulate.piece.cache_clear()
    again = recording(p, 20.0, 250, 5)
    assert first.shape == (5000,) and np.array_equal(first, again)
    # The rhythm changes at the onset: faster, or more irregular, after it.
    onset = int(p.onset_s * 250)
    before = window_features(first[:onset], 250, 125)[-1]
    after = window_features(first[onset:], 250, 125)[-1]
    if p.rhythm == "tachycardia":
        assert after[0] > before[0] * 1.3, (before, after)
    else:
        assert after[1] > before[1] * 3, (before, after)


def test_the_filter_streamed_in_windows_equals_the_whole_recording_filtered() -> None:
    (p,) = patients(1, seed=6, abnormal_every=0, onset_s=10.0)
    x = recording(p, 12.0, 250, 6)
    sos = dsp.design(250.0, 0.5, 40.0, 4)
    whole = sosfilt(sos, x, zi=dsp.initial_state(sos, float(x[0])))[0]
    rnd = random.Random(1)
    cuts = sorted({rnd.randrange(1, x.size) for _ in range(20)})
    parts, state = [], None
    for a, b in zip([0, *cuts], [*cuts, x.size], strict=True):
        out, zf = dsp.filter_window(sos, x[a:b], state)
        # The state travels as JSON (keyed state): the round trip loses nothing.
        state = np.asarray(json.loads(json.dumps(zf.tolist())))
        parts.append(out)
    assert np.array_equal(np.concatenate(parts), whole)


def test_beats_are_found_once_whatever_the_windows() -> None:
    x = segment(20.0, 250, 72.0, 1.0, 11) * 1.3
    sos = dsp.design(250.0, *BAND)
    filtered = sosfilt(sos, x, zi=dsp.initial_state(sos, float(x[0])))[0]
    found = []
    for window in (125, 250, 333):
        state = beats.fresh()
        seen: list[int] = []
        for at in range(0, filtered.size, window):
            state = beats.step(state, filtered[at : at + window], 250)
            seen += [b for b in state["beats"] if not seen or b > seen[-1]]
        assert all(np.diff(seen) > 0.25 * 250)
        # The threshold follows the signal in hand: at the very start and end of a
        # recording it may differ with the windows; in between, every beat is found once.
        found.append([b for b in seen if 250 <= b < filtered.size - 250])
    # 72 bpm over 19 s: about 23 beats, the same ones with every window length.
    assert found[0] == found[1] == found[2] and 20 <= len(found[0]) <= 25, found


def _stepped(x: np.ndarray, fs: int = 250, window: int = 125) -> list[dict[str, Any]]:
    """The beat state after each window of ``x`` band-passed as the pipeline does."""
    sos = dsp.design(float(fs), *BAND)
    filtered = sosfilt(sos, x, zi=dsp.initial_state(sos, float(x[0])))[0]
    state, after = beats.fresh(), []
    for at in range(0, filtered.size, window):
        state = beats.step(state, filtered[at : at + window], fs)
        after.append(state)
    return after


def test_a_flat_line_is_no_rhythm_and_the_rhythm_after_it_is_read_again() -> None:
    # A lost electrode (the signal held flat): its rounding noise was beats every 2 s, a
    # normal rhythm of 28 bpm, and no alarm; once the signal came back, those intervals
    # made the T-wave rule skip every other beat (37.5 bpm for seconds).
    fs, rate = 250, 72.0
    x = segment(20.0, fs, rate, 1.0, 11)
    flat = np.full(10 * fs, x[-1])
    states = _stepped(np.concatenate([x, flat, segment(20.0, fs, rate, 1.0, 12)]))
    quiet = [beats.silent(s, fs) for s in states]  # (after each 0.5 s window)
    seen = {b for s in states for b in s["beats"]}
    assert not any(20 * fs + fs <= b < 30 * fs for b in seen)  # none in the flat line
    assert not any(quiet[:40]) and all(quiet[48:60]) and not any(quiet[65:])
    found = beats.features(states[-1], fs)
    assert found is not None and found[0] == pytest.approx(rate / 100, rel=0.1), found
    # In volts, not millivolts: the same beats, no silence (the floor is the patient's own).
    volts = _stepped(x * 1e-3)
    assert [s["beats"] for s in volts] == [s["beats"] for s in states[:40]]
    assert not any(beats.silent(s, fs) for s in volts)
    # Flat from the start: no beat, no rhythm once the first second and SILENT_S are over.
    still = _stepped(np.full(10 * fs, 0.7))
    assert not any(s["beats"] for s in still)
    assert [beats.silent(s, fs) for s in still].index(True) == 8  # (4.5 s seen)


def test_the_shipped_network_tells_the_rhythms_apart_on_recordings_it_never_saw() -> None:
    model = load()
    right, total = 0, 0
    for n, (rate, std, abnormal) in enumerate(
        [
            (64, 1.0, False),
            (80, 2.0, False),
            (90, 1.0, False),
            (150, 2.0, True),
            (140, 3.0, True),
            (105, 25.0, True),
        ]
    ):
        x = segment(30.0, 250, rate, std, 4242 + n)
        for row in window_features(x, 250, 125)[6:]:  # after the first beats
            right += (model.abnormal(row) >= 0.5) == abnormal
            total += 1
    assert total > 250 and right / total >= 0.9, (right, total)


def test_the_beat_tail_stays_bounded_at_any_sampling_rate() -> None:
    """A window's tail is TAIL_S of signal: none at a rate too low for one sample of it,
    not the whole history."""
    for fs in (1.5, 250.0):
        state = beats.fresh()
        for w in range(5):
            state = beats.step(state, np.linspace(0.0, 1.0, 10), fs)
            assert len(state["tail"]) == min(10 * (w + 1), int(beats.TAIL_S * fs))
            assert state["tail_start"] == 10 * (w + 1) - len(state["tail"])


def test_every_patients_recording_is_simulated_once_however_many_patients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Events visit the patients in turn: with more patients than the cache held (65-99),
    # every event simulated its patient's whole recording again (seconds each).
    limits = EcgSourceOptions.model_fields["patients"].metadata
    most = next(m.le for m in limits if hasattr(m, "le"))
    calls: list[int] = []

    def segment(duration_s: float, fs: int, heart_rate: float, std: float, seed: int) -> Any:
        calls.append(seed)
        return np.zeros(round(duration_s * fs) + 1)

    monkeypatch.setattr(simulate, "segment", segment)
    simulate.piece.cache_clear()
    people = simulate.patients(most, 1, 0, 30.0)
    for _ in range(2):
        for patient in people:
            simulate.recording(patient, 2.0, 250, 1)
    assert len(calls) == most
    simulate.piece.cache_clear()


def _counting_segments(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float, int]]:
    """Stands in for the simulator (a ramp numbering its samples, fast); records each call's
    duration, heart rate and seed."""
    calls: list[tuple[float, float, int]] = []

    def segment(duration_s: float, fs: int, heart_rate: float, std: float, seed: int) -> Any:
        calls.append((duration_s, heart_rate, seed))
        return np.arange(max(round(duration_s * fs), fs), dtype=float) + seed

    monkeypatch.setattr(simulate, "segment", segment)
    simulate.piece.cache_clear()
    return calls


def test_a_long_recordings_first_window_simulates_one_piece_not_the_recording(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An hour per patient simulated whole at the source's first event stalled it for minutes.
    calls = _counting_segments(monkeypatch)
    (p,) = patients(1, seed=2, abnormal_every=0, onset_s=30.0)
    window = simulate.samples(p, 3600.0, 250, 2, 0, 125)
    assert window.shape == (125,)
    assert [d for d, _, _ in calls] == [simulate.PIECE_S]
    # A window across a piece's end joins the two pieces' samples.
    edge = round(simulate.PIECE_S * 250)
    across = simulate.samples(p, 3600.0, 250, 2, edge - 50, edge + 75)
    assert [d for d, _, _ in calls] == [simulate.PIECE_S, simulate.PIECE_S]
    whole = recording(p, 3600.0, 250, 2)
    assert np.array_equal(across, whole[edge - 50 : edge + 75])
    assert np.array_equal(window, whole[:125])
    # Each piece simulated once, with its own seed.
    assert len(calls) == len({seed for _, _, seed in calls}) == 3600.0 / simulate.PIECE_S
    simulate.piece.cache_clear()


def test_pieces_before_the_onset_are_normal_and_after_it_abnormal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting_segments(monkeypatch)
    (p,) = patients(1, seed=3, abnormal_every=1, onset_s=1.5 * simulate.PIECE_S)
    assert p.onset_s is not None and p.rhythm is not None
    abnormal, _ = simulate.abnormal_rhythm(p.rhythm)
    x = recording(p, 4 * simulate.PIECE_S, 250, 3)
    assert x.shape == (round(4 * simulate.PIECE_S * 250),)
    rates = [rate for _, rate, _ in calls]
    # Piece 0 normal; piece 1 normal up to the onset, abnormal after it; pieces 2 and 3
    # abnormal.
    assert rates == [p.heart_rate, p.heart_rate, abnormal, abnormal, abnormal]
    assert sum(d for d, _, _ in calls) == pytest.approx(4 * simulate.PIECE_S)
    # A recording of one piece keeps the seeds it always had (seed * 1000 + number * 7, and
    # the next one after the onset): the examples' and the tests' signals did not change.
    calls.clear()
    (early,) = patients(1, seed=3, abnormal_every=1, onset_s=simulate.PIECE_S / 2)
    recording(early, simulate.PIECE_S, 250, 3)
    assert [seed for _, _, seed in calls] == [3 * 1000 + 7, 3 * 1000 + 7 + 1]
    simulate.piece.cache_clear()


def test_a_piece_with_an_onset_has_every_sample_whatever_the_roundings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Onset 598.97 s of 900 s at 250 Hz: its piece (480-600 s) was 29,999 samples, every
    # later window one sample off the reference's recording.
    _counting_segments(monkeypatch)
    (p,) = patients(1, seed=3, abnormal_every=1, onset_s=30.0)
    for onset in (598.97, 598.5, 510.01, 599.99):
        sick = simulate.Patient(p.name, p.device, p.heart_rate, onset, p.rhythm, p.gain)
        x = recording(sick, 900.0, 250, 3)
        assert x.shape == (900 * 250,), onset
        # The onset's sample is the abnormal part's first (its ramp restarts there).
        at = round(onset * 250)
        assert x[at] < x[at - 1], onset
        simulate.piece.cache_clear()


def test_a_window_outside_the_recording_is_refused() -> None:
    (p,) = patients(1, seed=2, abnormal_every=0, onset_s=30.0)
    with pytest.raises(BadSignal, match="not within"):
        simulate.samples(p, 10.0, 250, 2, 2400, 2600)
    assert simulate.samples(p, 10.0, 250, 2, 2500, 2500).size == 0


def test_a_normal_rhythm_raises_no_alarm_across_the_pieces_and_an_onset_one_after_it() -> None:
    """With the real simulator: where pieces join (an R wave begins each), the classifier
    sees no abnormal rhythm; the onset inside a later piece is found after it."""
    source = EcgSourceOptions(patients=2, duration_s=2.5 * simulate.PIECE_S, onset_s=180.0, seed=1)
    people = patients(2, source.seed, source.abnormal_every, source.onset_s)
    assert people[0].onset_s is None and people[1].onset_s is not None
    assert simulate.PIECE_S < people[1].onset_s < 2 * simulate.PIECE_S
    amplify = AmplifyOptions(calibration={p.name: p.gain for p in people})
    alarms = reference_alarms(source, amplify, BandpassOptions(), ClassifyOptions())
    found = quality(alarms, people, source.duration_s)
    assert found.specificity == 1.0 and found.sensitivity == 1.0, alarms
