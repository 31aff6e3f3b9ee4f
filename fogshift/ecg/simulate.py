"""Simulated patients: a seeded ECG per patient (neurokit2's ``ecg_simulate``), some of
them developing an abnormal rhythm at a seeded moment, with the ground truth kept.

A patient's whole recording is a pure function of the source's options and the patient's
number, so every node that runs the source — or re-runs it after a migration or a restore —
and the offline reference get the same samples. It is simulated in pieces of
:data:`PIECE_S` seconds, each when a window first needs it: a source's first events wait for
one piece per patient, not for whole recordings (up to an hour each), and a process holds a
few pieces, not every recording.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fogshift.ecg.exceptions import BadSignal
from fogshift.spec.kinds import patient_name

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
                name=patient_name(n),
                device=f"wearable-{patient_name(n)}",
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


#: Seconds of a recording simulated at a time. A recording this long or shorter is one
#: piece, simulated as it always was (the examples and tests run 120 s or less); a longer
#: one is simulated piece by piece, each piece with its own seed, joined where an R wave
#: begins a piece as the onset of an abnormal rhythm already joins two simulations. Whole
#: recordings simulated at a source's first event stalled it: 900 s of six patients took
#: 49 s in each Python worker, an hour of 99 patients would take a quarter of an hour.
PIECE_S = 120.0

#: Pieces kept per process: two per patient (at most 99), so a window across a piece's end
#: and the patients' turns never evict a piece still in use.
PIECES_CACHED = 256


def _piece_seed(base: int, piece: int, part: int) -> int:
    """The simulator's seed of part ``part`` (0: normal rhythm, 1: abnormal) of piece
    ``piece``: piece 0 keeps the seeds a one-piece recording always had."""
    if piece == 0:
        return base + part
    return int(np.random.SeedSequence([base, piece, part]).generate_state(1)[0])


@lru_cache(maxsize=PIECES_CACHED)
def piece(patient: Patient, duration_s: float, fs: int, seed: int, n: int) -> np.ndarray:
    """Piece ``n`` of the patient's recording as the wearable measures it: samples
    ``round(n * PIECE_S * fs)`` up to ``round(min((n + 1) * PIECE_S, duration_s) * fs)``
    (millivolts times its gain, rounded to 5 decimals, what the events carry).
    Deterministic; cached per process."""
    begin_s = n * PIECE_S
    end_s = min(begin_s + PIECE_S, duration_s)
    if begin_s >= end_s:
        raise BadSignal(f"piece {n} begins after the recording's end ({duration_s:g} s)")
    number = int(patient.name[1:])
    base = seed * 1000 + number * 7
    onset = patient.onset_s
    first = round(begin_s * fs)
    length = round(end_s * fs) - first
    if onset is None or onset >= end_s:
        signal = segment(end_s - begin_s, fs, patient.heart_rate, 1.0, _piece_seed(base, n, 0))
    else:
        assert patient.rhythm is not None
        rate, std = abnormal_rhythm(patient.rhythm)
        if onset <= begin_s:
            signal = segment(end_s - begin_s, fs, rate, std, _piece_seed(base, n, 1))
        else:
            # Each part by its count of samples: ``end_s - onset`` rounded on its own lost
            # a sample to the two roundings' at some onsets (598.97 s at 250 Hz), the
            # piece one short and every later window of the recording one sample off.
            k = round(onset * fs) - first
            before = segment(k / fs, fs, patient.heart_rate, 1.0, _piece_seed(base, n, 0))
            after = segment((length - k) / fs, fs, rate, std, _piece_seed(base, n, 1))
            signal = np.concatenate([before[:k], after])
    if signal.size < length:
        raise BadSignal(f"piece {n} of {patient.name}'s recording has {signal.size} samples, "
                        f"not {length}")  # fmt: skip
    return np.round(signal[:length] * patient.gain, 5)


def samples(
    patient: Patient, duration_s: float, fs: int, seed: int, start: int, end: int
) -> np.ndarray:
    """Samples ``start`` up to ``end`` of the patient's recording, simulating only the
    pieces they lie in."""
    per_piece = round(PIECE_S * fs)
    total = round(duration_s * fs)
    if not 0 <= start <= end <= total:
        raise BadSignal(f"samples {start}..{end} are not within the recording's {total}")
    if start == end:
        return np.empty(0)
    parts = []
    for n in range(start // per_piece, (end - 1) // per_piece + 1):
        offset = round(n * PIECE_S * fs)
        parts.append(piece(patient, duration_s, fs, seed, n)[max(start - offset, 0) : end - offset])
    return np.concatenate(parts)[: end - start]


def recording(patient: Patient, duration_s: float, fs: int, seed: int) -> np.ndarray:
    """The patient's whole recording (every piece, in order). Deterministic."""
    return samples(patient, duration_s, fs, seed, 0, round(duration_s * fs))


def layout(sampling_rate: int, window_s: float, duration_s: float) -> tuple[int, int]:
    """Samples per window, and whole windows per patient, of a recording cut into events."""
    window = round(window_s * sampling_rate)
    return window, int(duration_s * sampling_rate) // window
