"""Matplotlib (Agg, no display) for the bench's PNGs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # after use("Agg"): no display is needed

#: One colour per migration phase, per mode and per series, kept across all plots.
COLOURS = {
    "prepare": "#c7c7c7",
    "pause": "#1f77b4",
    "state": "#ff7f0e",
    "invoke": "#2ca02c",
    "finalize": "#9467bd",
    "precopy": "#1f77b4",
    "literal": "#d62728",
    "handover": "#2ca02c",
    "thesis": "#000000",
    "origin": "#d62728",
    "target": "#1f77b4",
    "machine": "#7f7f7f",
}


def figure(ncols: int = 1, nrows: int = 1, width: float = 6.0, height: float = 4.0) -> Any:
    """A figure with ``nrows x ncols`` axes (always a 2-D array of axes)."""
    return plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, layout="constrained"
    )


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a PNG and free it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_y(axis: Any, label: str, shown: Iterable[float | None], empty: str = "no data") -> None:
    """A log y scale for ``axis``, labelled ``label (log)``, if anything ``shown`` on it is
    above 0; else a linear one saying ``empty``. Matplotlib cannot log-scale nothing, and
    raised at ``save``: a run with nothing to show there (every run failed, no central
    checkpoint, no latency measured) lost its whole report."""
    if any(v is not None and v > 0 for v in shown):
        axis.set_yscale("log")
        axis.set_ylabel(f"{label} (log)")
    else:
        axis.set_ylabel(label)
        axis.text(0.5, 0.5, empty, transform=axis.transAxes, ha="center", va="center")
