"""Simulated patients: a seeded ECG per patient (neurokit2's ``ecg_simulate``), some of
them developing an abnormal rhythm at a seeded moment, with the ground truth kept.

A patient's whole recording is a pure function of the source's options and the patient's
number, so every node that runs the source — or re-runs it after a migration or a restore —
and the offline reference get the same samples.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fogshift.ecg.exceptions import BadSignal

#: The rhythm a patient's heart changes to at the onset.
RHYTHMS = ("tachycardia", "irregular")


@dataclass(frozen=True)
class Patient:
    """One simulated patient.

    Attributes:
        name: ``p01``, ``p02``, ...: the events' key.
        device: The wearable that records it (the events' creator).
        heart_rate: Beats per minute before any onset.
        onset_s: When the abnormal rhythm starts (``None``: never).
        rhythm: Which abnormal rhythm (one of :data:`RHYTHMS`), or ``None``.
        gain: The wearable's amplifier calibration (the ``amplify`` PE undoes it).
    """

    name: str
    device: str
    heart_rate: float
    onset_s: float | None
    rhythm: str | None
    gain: float

    def abnormal_at(self, t_s: float) -> bool:
        """The ground truth: is the rhythm abnormal at time ``t_s``?"""
        return self.onset_s is not None and t_s >= self.onset_s


def patients(count: int, seed: int, abnormal_every: int, onset_s: float) -> list[Patient]:
    """The simulated patients: every ``abnormal_every``-th one (the 2nd, 4th, ... for 2)
    develops an abnormal rhythm around ``onset_s`` (± 20 %, seeded); 0: none does."""
    rnd = random.Random(seed)
    out = []
    for n in range(1, count + 1):
        heart_rate = round(rnd.uniform(58, 92), 1)
        gain = round(rnd.uniform(0.6, 1.6), 3)
        jitter = rnd.uniform(0.8, 1.2)
        sick = abnormal_every > 0 and n % abnormal_every == 0
        out.append(
            Patient(
                name=f"p{n:02d}",
                device=f"wearable-p{n:02d}",
                heart_rate=heart_rate,
                onset_s=round(onset_s * jitter, 2) if sick else None,
                rhythm=RHYTHMS[(n // max(abnormal_every, 1)) % len(RHYTHMS)] if sick else None,
                gain=gain,
            )
        )
    return out


def segment(duration_s: float, fs: int, heart_rate: float, std: float, seed: int) -> np.ndarray:
    """``duration_s`` (at least 1 s) of a simulated ECG (neurokit2's ECGSYN) in millivolts,
    at ``heart_rate`` bpm with beat-to-beat standard deviation ``std``; seeded."""
    import neurokit2 as nk

    length = max(round(duration_s * fs), fs)
    # Asked for a length, ecgsyn may return fewer samples; asked for whole seconds, it
    # returns them: ask for enough and cut.
    signal = nk.ecg_simulate(
        duration=int(np.ceil(length / fs)) + 1,
        sampling_rate=fs,
        heart_rate=heart_rate,
        heart_rate_std=std,
        random_state=seed,
        method="ecgsyn",
    )
    out = np.asarray(signal, dtype=float)[:length]
    if out.size < length:
        raise BadSignal(f"the simulator gave {out.size} samples, not {length}")
    return out


def abnormal_rhythm(rhythm: str) -> tuple[float, float]:
    """Heart rate and its standard deviation of an abnormal rhythm."""
    return (150.0, 2.0) if rhythm == "tachycardia" else (105.0, 25.0)


#: Recordings kept per process: more than an ecg-source has patients (at most 99). Its
#: events visit the patients in turn, so a cache smaller than that never hit, and each
#: event simulated its patient's whole recording again (seconds each).
RECORDINGS_CACHED = 128


@lru_cache(maxsize=RECORDINGS_CACHED)
def recording(patient: Patient, duration_s: float, fs: int, seed: int) -> np.ndarray:
    """The patient's whole recording as the wearable measures it (millivolts times its gain),
    rounded to 5 decimals (what the events carry). Deterministic; cached per process."""
    number = int(patient.name[1:])
    base = seed * 1000 + number * 7
    if patient.onset_s is None or patient.onset_s >= duration_s:
        signal = segment(duration_s, fs, patient.heart_rate, 1.0, base)
    else:
        assert patient.rhythm is not None
        before = segment(patient.onset_s, fs, patient.heart_rate, 1.0, base)
        rate, std = abnormal_rhythm(patient.rhythm)
        after = segment(duration_s - patient.onset_s, fs, rate, std, base + 1)
        signal = np.concatenate([before[: round(patient.onset_s * fs)], after])
    total = round(duration_s * fs)
    return np.round(signal[:total] * patient.gain, 5)


def layout(sampling_rate: int, window_s: float, duration_s: float) -> tuple[int, int]:
    """Samples per window, and whole windows per patient, of a recording cut into events."""
    window = round(window_s * sampling_rate)
    return window, int(duration_s * sampling_rate) // window
