"""An independent computation of Case 1, for consistency verdicts.

Deliberately shares no code with the runtime: rows are split with the ``csv`` module, values
are validated with pandas (``to_numeric`` + ``isfinite``) and aggregated with pandas'
``rolling`` — a different algorithm from the window PE's list, so agreement means something.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Reference:
    """Expected Case 1 output: ``(seq, value)`` rows and the number of dropped input rows."""

    rows: list[tuple[int, float]]
    dropped: int


def input_lines(csv_path: str | Path) -> list[str | None]:
    """The lines of a CSV input as a csv-source numbers its rows: split at ``\n`` only (a
    ``\r`` before it dropped; a vertical tab, a form feed, U+2028 are in a cell, not line
    breaks, as ``str.splitlines`` would take them), each decoded on its own (``None``: not
    UTF-8, a row the source dead-letters)."""
    data = Path(csv_path).read_bytes().removeprefix(b"\xef\xbb\xbf")
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()  # (after the last line's end)
    out: list[str | None] = []
    for piece in pieces:
        try:
            out.append(piece.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
    return out or [""]


def _cells(line: str | None) -> list[str] | None:
    """A line's cells, ``None`` if it cannot be read as one CSV row (not UTF-8, a lone
    ``\r``, an unclosed quote)."""
    if line is None:
        return None
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return None


def case1_reference(
    csv_path: str | Path,
    field_name: str,
    window: int,
    function: str,
    key_field: str | None = None,
) -> Reference:
    """What a single process computes for source → window-aggregate over ``csv_path``;
    with ``key_field``, one window per value of that column (a keyed aggregate, grouped here
    with pandas' ``groupby().rolling()``)."""
    lines = input_lines(csv_path)
    header = next(csv.reader([lines[0] or ""]), [])
    seqs, raw, keys = [], [], []
    dropped = 0
    for k, line in enumerate(lines[1:], start=1):
        cells = _cells(line)
        if cells is None or len(cells) != len(header) or field_name not in header:
            dropped += 1
            continue
        seqs.append(k)
        raw.append(cells[header.index(field_name)].strip())
        keys.append(cells[header.index(key_field)].strip() if key_field else "")
    values = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").astype(float)
    valid = values.notna() & np.isfinite(values)
    dropped += int((~valid).sum())
    kept = values[valid].reset_index(drop=True)
    seq_kept = [s for s, ok in zip(seqs, valid, strict=True) if ok]
    method = {"avg": "mean", "sum": "sum", "min": "min", "max": "max", "count": "count"}[function]
    if key_field:
        keys_kept = pd.Series([key for key, ok in zip(keys, valid, strict=True) if ok])
        grouped = kept.groupby(keys_kept).rolling(window, min_periods=1)
        result = getattr(grouped, method)().reset_index(level=0, drop=True).sort_index()
    else:
        result = getattr(kept.rolling(window, min_periods=1), method)()
    return Reference(list(zip(seq_kept, result.tolist(), strict=True)), dropped)


def read_sink(path: str | Path, field_name: str) -> list[tuple[int, float]]:
    """``(seq, value)`` rows of a csv-sink output file."""
    target = Path(path)
    if not target.exists() or target.stat().st_size == 0:
        return []
    frame = pd.read_csv(target)
    return list(
        zip(
            frame["seq"].astype(int).tolist(), frame[field_name].astype(float).tolist(), strict=True
        )
    )


@dataclass
class Verdict:
    """The outcome of comparing an output with its reference."""

    consistent: bool
    expected_rows: int
    actual_rows: int
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        head = "CONSISTENT" if self.consistent else "INCONSISTENT"
        text = f"{head}: {self.actual_rows} output rows, {self.expected_rows} expected"
        return text + "".join(f"\n  - {p}" for p in self.problems[:10])


def compare(
    expected: list[tuple[int, float]], actual: list[tuple[int, float]], rel_tol: float = 1e-9
) -> Verdict:
    """Same rows, same order, values equal within ``rel_tol`` (float sums differ in order).

    Missing rows, extra rows (duplicates) and reordering are all reported.
    """
    problems = []
    seen: dict[int, int] = {}
    for seq, _ in actual:
        seen[seq] = seen.get(seq, 0) + 1
    duplicates = sorted(s for s, n in seen.items() if n > 1)
    if duplicates:
        problems.append(f"{len(duplicates)} seq written more than once, first {duplicates[:5]}")
    expected_seqs = {s for s, _ in expected}
    missing = sorted(expected_seqs - set(seen))
    if missing:
        problems.append(f"{len(missing)} seq missing, first {missing[:5]}")
    extra = sorted(set(seen) - expected_seqs)
    if extra:
        problems.append(f"{len(extra)} unexpected seq, first {extra[:5]}")
    if not problems:
        for i, ((s1, v1), (s2, v2)) in enumerate(zip(expected, actual, strict=True)):
            if s1 != s2:
                problems.append(f"row {i + 1}: seq {s2}, expected {s1} (order differs)")
                break
            if not math.isclose(v1, v2, rel_tol=rel_tol, abs_tol=1e-6):
                problems.append(f"seq {s1}: value {v2!r}, expected {v1!r}")
                break
    return Verdict(not problems, len(expected), len(actual), problems)


def keys_by_seq(csv_path: str | Path, key_field: str) -> dict[int, str]:
    """The ``key_field`` cell of each data row of a CSV input, by its sequence (row *k* is
    the event with ``seq = k``); rows too short to have it are left out."""
    lines = input_lines(csv_path)
    column = (_cells(lines[0]) or []).index(key_field)
    cells = [_cells(line) for line in lines[1:]]
    return {k: row[column] for k, row in enumerate(cells, start=1)
            if row is not None and len(row) > column}  # fmt: skip


def compare_per_key(
    expected: list[tuple[int, float]],
    actual: list[tuple[int, float]],
    key_of: dict[int, str],
    rel_tol: float = 1e-9,
) -> Verdict:
    """As :func:`compare`, but the order is checked per key only: what a partitioned PE
    promises (each key's outputs in input order; keys of different partitions interleave as
    the partitions' batches meet downstream).

    Args:
        expected: The reference's ``(seq, value)`` rows, in input order.
        actual: The output's rows, in output order.
        key_of: The key of every input ``seq``.
    """
    problems: list[str] = []
    unknown = sorted({s for s, _ in actual} - set(key_of))
    if unknown:
        problems.append(f"{len(unknown)} seq of no input event, first {unknown[:5]}")
    keyless = [s for s, _ in expected if s not in key_of]
    if keyless:  # (their rows would be checked by no key's comparison)
        problems.append(f"{len(keyless)} expected seq of no known key, first {keyless[:5]}")
    groups: dict[str, tuple[list[tuple[int, float]], list[tuple[int, float]]]] = {}
    for rows, side in ((expected, 0), (actual, 1)):
        for row in rows:
            if row[0] in key_of:
                groups.setdefault(key_of[row[0]], ([], []))[side].append(row)
    for key in sorted(groups):
        verdict = compare(*groups[key], rel_tol=rel_tol)
        problems += [f"key {key}: {p}" for p in verdict.problems]
    return Verdict(not problems, len(expected), len(actual), problems)
