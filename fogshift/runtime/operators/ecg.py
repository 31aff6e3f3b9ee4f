"""Case 2's processors: ``amplify``, ``bandpass`` and ``classify``, over windows of ECG
samples (events ``{patient, t, fs, samples}`` from an ``ecg-source``).

``bandpass`` and ``classify`` keep their state per patient (``key_by: patient``, required by
the spec): a filter's state, a patient's recent beats and alarm. The signal processing is
:mod:`fogshift.ecg`'s, the same steps the offline reference runs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fogshift.ecg import beats, dsp
from fogshift.ecg.model import Model, load
from fogshift.events import Event
from fogshift.runtime.api import Processor, state
from fogshift.runtime.exceptions import DeadLetter
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions


def _window(event: Event) -> tuple[str, float, float, np.ndarray]:
    """``(patient, t, fs, samples)`` of an ECG event.

    Raises:
        DeadLetter: The event is not a window of ECG samples.
    """
    body = event.body
    patient, t, fs, samples = (body.get(k) for k in ("patient", "t", "fs", "samples"))
    if not isinstance(patient, str) or not patient:
        raise DeadLetter(f"field 'patient' is {patient!r}, not a patient's name")
    if not (isinstance(fs, (int, float)) and not isinstance(fs, bool) and math.isfinite(fs)):
        raise DeadLetter(f"field 'fs' is {fs!r}, not a sampling rate")
    if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)):
        raise DeadLetter(f"field 't' is {t!r}, not a time in seconds")
    if fs <= 0:
        raise DeadLetter(f"field 'fs' is {fs!r}, not a positive sampling rate")
    if not isinstance(samples, list) or not samples:
        raise DeadLetter("field 'samples' is not a non-empty list of numbers")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in samples):
        raise DeadLetter("field 'samples' holds something other than numbers")
    array = np.asarray(samples, dtype=float)
    if not np.all(np.isfinite(array)):
        raise DeadLetter("field 'samples' holds a value that is not finite")
    return patient, float(t), float(fs), array


class Amplify(Processor):
    """``samples`` times ``gain`` over the patient's wearable calibration. Stateless."""

    options_model = AmplifyOptions

    def process(self, event: Event) -> dict[str, Any]:
        opts: AmplifyOptions = self.config
        patient, _, _, samples = _window(event)
        factor = opts.gain / opts.calibration.get(patient, 1.0)
        return {**event.body, "samples": (samples * factor).tolist()}


class Bandpass(Processor):
    """A Butterworth band-pass in second-order sections; its state per patient."""

    options_model = BandpassOptions
    dead_letters_change_nothing = True  # _window() checks before the state is touched
    #: The filter's state after the patient's last window (``None``: no window yet).
    zi: list[list[float]] | None = state(None)
    #: The patient's sampling rate (Hz), and where its next window begins (s), as of its
    #: last window (``None``: no window yet, or a twin kept before they were).
    fs: float | None = state(None, added=True)
    t_next: float | None = state(None, added=True)

    def process(self, event: Event) -> dict[str, Any]:
        opts: BandpassOptions = self.config
        patient, t, fs, samples = _window(event)
        if not opts.low_hz < opts.high_hz < fs / 2:
            raise DeadLetter(
                f"the band {opts.low_hz}-{opts.high_hz} Hz does not fit under half the "
                f"sampling rate ({fs} Hz)"
            )
        if self.fs is not None and self.fs != fs:
            # (The filter's state is of the other rate's design: it went on with it, and the
            # classifier, refusing the window, met a filter already changed by it.)
            raise DeadLetter(
                f"the windows of patient {patient!r} come at {self.fs:g} Hz; this one at {fs:g} Hz"
            )
        sos = dsp.design(fs, opts.low_hz, opts.high_hz, opts.order)
        zi = None if self.zi is None else np.asarray(self.zi, dtype=float)
        if zi is not None and zi.shape != (sos.shape[0], 2):
            raise DeadLetter(f"the filter's state does not fit a {opts.order}-order filter")
        half = 0.5 / fs  # (windows meet when they are within half a sample)
        if self.t_next is not None and t < self.t_next - half:
            raise DeadLetter(
                f"the window of patient {patient!r} at t={t:g} s begins before the end of its "
                f"last one (t={self.t_next:g} s): repeated, or out of order"
            )
        if self.t_next is not None and t > self.t_next + half:
            # Windows missing: filtered as if it went on from the last one, the jump between
            # them rang through the filter as a step (read as beats). It starts over, as at
            # the patient's first window.
            zi = None
        out, zf = dsp.filter_window(sos, samples, zi)
        self.zi, self.fs, self.t_next = zf.tolist(), fs, t + samples.size / fs
        return {**event.body, "samples": out.tolist()}


#: The sampling rates ``classify`` takes (Hz): every ECG's, with room around the source's
#: 250-2000. A patient's first window fixes its rate, so one at a rate no ECG has (1e9 Hz)
#: would have every real window of the patient after it refused.
CLASSIFY_FS = (50.0, 10_000.0)


class Classify(Processor):
    """Beats, rhythm features and a neural network per window; an alarm (``class``
    ``abnormal``) after ``confirm`` abnormal windows in a row, cleared (``normal``) after as
    many normal ones. Emits only those two events: ``{patient, t, class, confidence}``."""

    options_model = ClassifyOptions
    dead_letters_change_nothing = True
    #: The patient's recent beats and signal tail (:mod:`fogshift.ecg.beats`).
    rhythm: dict[str, Any] = state(default_factory=beats.fresh)
    #: Windows in a row: > 0 abnormal ones, < 0 normal ones.
    streak: int = state(0)
    alarm: bool = state(False)

    def on_assign(self) -> None:
        self.model: Model = load()  # once per query, not per patient or batch

    def process(self, event: Event) -> dict[str, Any] | None:
        opts: ClassifyOptions = self.config
        patient, t, fs, samples = _window(event)
        low, high = CLASSIFY_FS
        if not low <= fs <= high:
            raise DeadLetter(
                f"field 'fs' is {fs:g} Hz; classify takes ECG sampled at {low:g} to {high:g} Hz"
            )
        known = self.rhythm.get("fs")
        if known is not None and known != fs:
            # Beats are counted in samples: taken at another rate, the heart rate read as
            # that much faster or slower (an alarm of a normal rhythm).
            raise DeadLetter(
                f"the windows of patient {patient!r} come at {known:g} Hz; this one at {fs:g} Hz"
            )
        base = self.rhythm
        expected = base.get("t_next")
        half = 0.5 / fs  # (windows meet when they are within half a sample)
        if expected is not None and t < expected - half:
            raise DeadLetter(
                f"the window of patient {patient!r} at t={t:g} s begins before the end of its "
                f"last one (t={expected:g} s): repeated, or out of order"
            )
        if expected is not None and t > expected + half:
            # Windows missing (dead letters upstream, a wearable off): beats counted in
            # samples across the hole would read it as one short interval. The rhythm starts
            # over (its first second, the filter's settling, unread); the alarm stands.
            base = beats.fresh()
        rhythm = {**beats.step(base, samples, fs), "fs": fs, "t_next": t + samples.size / fs}
        found = beats.features(rhythm, fs)
        p = self.model.abnormal(found) if found is not None else None
        if p is not None and not math.isfinite(p):
            # (Checked before the state changes: a NaN counted as a normal window.)
            raise DeadLetter(f"the rhythm's features {found} give no probability ({p})")
        if beats.silent(rhythm, fs):
            # No beat for seconds (asystole, or the electrodes off): the last beats' rhythm
            # read as normal, a flat line raised no alarm.
            p = 1.0
        self.rhythm = rhythm
        if p is None:
            return None
        abnormal = bool(p >= opts.threshold)  # state holds JSON values, not numpy's
        if abnormal:
            self.streak = self.streak + 1 if self.streak > 0 else 1
        else:
            self.streak = self.streak - 1 if self.streak < 0 else -1
        if abs(self.streak) < opts.confirm or abnormal == self.alarm:
            return None
        self.alarm = abnormal
        return {
            "patient": patient,
            "t": round(t + samples.size / fs, 3),
            "class": "abnormal" if abnormal else "normal",
            "confidence": round(p if abnormal else 1.0 - p, 4),
        }
