"""Streaming beat detection and rhythm features, window by window, with explicit state.

R-peaks are found in the band-passed signal (``scipy.signal.find_peaks``) over the window
plus a short tail of the one before, so a beat cut by a window boundary is still seen once;
a peak counts only once the signal after it is in hand (:data:`SETTLE_S`) and it is later
than the last beat by more than a refractory period, and by more than half the recent
intervals (so a tall T wave is not a beat), and tall enough (:data:`MIN_R`,
:data:`R_SHARE`: a flat line's noise, and the filter's ringing as the signal stops, are no
beats). From the last beats come three features
of the rhythm — heart rate, and two robust measures of irregularity — that the classifier
reads.
The state is plain JSON (lists and numbers), kept per patient by the ``classify`` PE.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Seconds of the previous windows kept to find the beats cut by a window boundary.
TAIL_S = 0.6
#: A peak counts once this much signal after it is in hand.
SETTLE_S = 0.12
#: No two beats closer than this (a refractory period: 240 bpm at most).
REFRACTORY_S = 0.25
#: Beats kept: the features use the intervals between them.
BEATS = 13
#: Fewest beats for features (5 intervals).
MIN_BEATS = 6
#: Beats in a recording's first second are not counted: the filter and the threshold are
#: still settling (a first beat cut in half, a baseline step).
WARMUP_S = 1.0
#: The least height of any R wave: far below one in any unit an ECG comes in (the
#: classifier reads intervals only, so the signal's scale is free: the simulated patients'
#: lowest R wave is 0.07 mV, 7e-5 in volts), far above a flat line's rounding noise after
#: the filter (1e-14). With a threshold relative to the tallest sample alone, that noise
#: was beats every 2 s: a lost electrode read as a normal rhythm of 28 bpm.
MIN_R = 1e-9
#: ... and of a patient's next one, as a share of its recent R waves' median height, halved
#: for every :data:`FLOOR_HALF_S` without a beat: the filter's ringing after the signal
#: stops (it decays by half every 0.22 s) is then no beat, and a signal that comes back
#: weaker is read again within seconds.
R_SHARE = 0.1
FLOOR_HALF_S = 2.0
#: The longest interval the T-wave rule (half the recent intervals) goes by: one across a
#: pause in the signal made the rule skip every other beat after it.
MAX_RR_S = 2.0
#: No beat for this long is no rhythm at all (asystole, or the electrodes off): the
#: classifier then takes the window as abnormal (:func:`silent`). The simulated rhythms'
#: longest interval is 1.2 s.
SILENT_S = 3.0


def fresh() -> dict[str, Any]:
    """The state before a patient's first window."""
    return {"tail": [], "tail_start": 0, "beats": [], "heights": []}


def step(state: dict[str, Any], samples: np.ndarray, fs: float) -> dict[str, Any]:
    """The state after one more window of band-passed ``samples`` (a new dict)."""
    from scipy.signal import find_peaks

    tail = np.asarray(state["tail"], dtype=float)
    segment = np.concatenate([tail, samples])
    start = int(state["tail_start"])
    beats = [int(b) for b in state["beats"]]
    heights = [float(h) for h in state.get("heights", [])]  # (states before 2026-12-07: none)
    typical = float(np.median(heights)) if heights else 0.0
    top = float(segment.max()) if segment.size else 0.0
    if top >= MIN_R:
        found, _ = find_peaks(segment, height=0.45 * top, distance=max(int(REFRACTORY_S * fs), 1))
        settled = segment.size - int(SETTLE_S * fs)
        for peak in found:
            at = start + int(peak)
            # Closer to the last beat than half the recent intervals: a T wave or noise,
            # not a beat (even the most irregular rhythms simulated stay above that).
            gap = REFRACTORY_S * fs
            if len(beats) >= 4:
                recent = min(float(np.median(np.diff(beats[-4:]))), MAX_RR_S * fs)
                gap = max(gap, 0.5 * recent)
            fresh_beat = not beats or at - beats[-1] > gap
            quiet_s = (at - beats[-1]) / fs if beats else 0.0
            floor = max(MIN_R, R_SHARE * typical * 0.5 ** (quiet_s / FLOOR_HALF_S))
            if peak <= settled and at >= WARMUP_S * fs and fresh_beat and segment[peak] >= floor:
                beats.append(at)
                heights.append(float(segment[peak]))
    # (Not ``segment[-keep:]``: at keep 0, a rate under 1 / TAIL_S, that is all of it.)
    cut = max(segment.size - int(TAIL_S * fs), 0)
    return {
        "tail": segment[cut:].tolist(),
        "tail_start": start + cut,
        "beats": beats[-BEATS:],
        "heights": heights[-BEATS:],
    }


def silent(state: dict[str, Any], fs: float) -> bool:
    """Whether no beat came in the last :data:`SILENT_S` of the signal seen (its first
    second, :data:`WARMUP_S`, aside): no rhythm, whatever the beats before said."""
    seen = int(state["tail_start"]) + len(state["tail"])
    last = max([int(b) for b in state["beats"][-1:]] + [int(WARMUP_S * fs)])
    # (A beat counts once SETTLE_S of signal after it is in hand: not seen before that.)
    return seen - last > (SILENT_S + SETTLE_S) * fs


def features(state: dict[str, Any], fs: float) -> list[float] | None:
    """Heart rate (bpm / 100, from the median interval), the median change from one
    interval to the next and the intervals' interquartile range, both over the median
    interval; ``None`` until :data:`MIN_BEATS` beats have been seen."""
    beats = np.asarray(state["beats"], dtype=float)
    if beats.size < MIN_BEATS:
        return None
    rr = np.diff(beats) / fs
    middle = float(np.median(rr))
    q1, q3 = np.percentile(rr, [25, 75])
    # Medians and quartiles: one premature beat (common, harmless) moves none of them much;
    # a rhythm that is irregular throughout moves all of them.
    return [
        60.0 / middle / 100.0,
        float(np.median(np.abs(np.diff(rr)))) / middle,
        float(q3 - q1) / middle,
    ]
