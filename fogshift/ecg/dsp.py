"""The band-pass filter of Case 2: Butterworth, second-order sections (scipy.signal).

Streamed window by window with the filter's state carried from one window to the next, it
gives exactly what filtering the whole recording at once gives: no transient at a window's
start, wherever the windows are cut, and so none after a migration or a restore either, as
long as the state travels (the ``bandpass`` PE keeps it per patient in keyed state).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=32)
def design(fs: float, low_hz: float, high_hz: float, order: int) -> np.ndarray:
    """The filter's second-order sections (``scipy.signal.butter(..., output="sos")``)."""
    from scipy.signal import butter

    return np.asarray(butter(order, [low_hz, high_hz], btype="bandpass", fs=fs, output="sos"))


def initial_state(sos: np.ndarray, first: float) -> np.ndarray:
    """The state of a filter that has seen ``first`` forever: starts without a step."""
    from scipy.signal import sosfilt_zi

    return np.asarray(sosfilt_zi(sos)) * first


def filter_window(
    sos: np.ndarray, samples: np.ndarray, state: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Filter one window; ``state`` ``None`` for the first. Returns the output and the state
    to filter the next window with."""
    from scipy.signal import sosfilt

    zi = initial_state(sos, float(samples[0])) if state is None else state
    out, zf = sosfilt(sos, samples, zi=zi)
    return np.asarray(out), np.asarray(zf)
