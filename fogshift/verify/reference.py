"""An independent computation of Case 1, for consistency verdicts.

Deliberately shares no code with the runtime: rows are split with the ``csv`` module, values
are validated with pandas (``to_numeric`` + ``isfinite``) and each window is a ``deque`` per
key, summed with ``math.fsum`` (exact, as the runtime's; pandas' ``rolling`` keeps a running
sum, whose rounding drifts from the exact one when magnitudes mix: 0.625 for 0.6).
"""

from __future__ import annotations

import csv
import math
import re
from collections import deque
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
        return next(csv.reader([line], strict=True), [])
    except csv.Error:
        return None


#: An integer or a decimal literal as a csv-source reads one (ASCII digits only).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _key(cell: str) -> str | None:
    """The key a keyed PE files a row's key cell under, as the contract says: an integer
    literal is its number (``01`` and ``1`` are one key), a finite decimal is refused (a
    float key has no one text: ``None``, the row a dead letter), anything else is the text
    as written (spaces too)."""
    text = cell.strip()
    if _INTEGER.fullmatch(text):
        try:
            return str(int(text))
        except ValueError:  # more digits than Python converts: the text, as written
            return cell
    if _DECIMAL.fullmatch(text) and math.isfinite(float(text)):
        return None
    return cell


def _aggregate(function: str, values: deque[float]) -> float:
    if function == "count":
        return float(len(values))
    if function == "min":
        return min(values)
    if function == "max":
        return max(values)
    if function == "sum":
        return math.fsum(values)
    try:
        return math.fsum(values) / len(values)
    except OverflowError:  # (a mean within range of a sum beyond it)
        return math.fsum(v / len(values) for v in values)


def case1_reference(
    csv_path: str | Path,
    field_name: str,
    window: int,
    function: str,
    key_field: str | None = None,
) -> Reference:
    """What a single process computes for source → window-aggregate over ``csv_path``;
    with ``key_field``, one window per key of that column (a keyed aggregate).

    A header naming a column twice: a row's body holds the last cell of that name."""
    lines = input_lines(csv_path)
    header = next(csv.reader([lines[0] or ""], strict=True), [])

    def last(name: str) -> int:
        return len(header) - 1 - header[::-1].index(name)

    seqs, raw, keys = [], [], []
    dropped = 0
    for k, line in enumerate(lines[1:], start=1):
        cells = _cells(line)
        if (
            cells is None
            or len(cells) != len(header)
            or field_name not in header
            or (key_field and key_field not in header)  # keyless: a dead letter
        ):
            dropped += 1
            continue
        key = _key(cells[last(key_field)]) if key_field else ""
        if key is None:
            dropped += 1
            continue
        seqs.append(k)
        raw.append(cells[last(field_name)].strip())
        keys.append(key)
    values = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").astype(float)
    valid = values.notna() & np.isfinite(values)
    dropped += int((~valid).sum())
    windows: dict[str, deque[float]] = {}
    rows = []
    for seq, key, value, ok in zip(seqs, keys, values.tolist(), valid.tolist(), strict=True):
        if not ok:
            continue
        kept = windows.setdefault(key, deque(maxlen=window))
        kept.append(value)
        rows.append((seq, _aggregate(function, kept)))
    return Reference(rows, dropped)


def read_sink(path: str | Path, field_name: str) -> list[tuple[int, float]]:
    """``(seq, value)`` rows of a csv-sink output file (its first column: ``seq``, or
    ``_seq`` beside events of a field ``seq``, see ``runtime.csv_io.seq_column``)."""
    target = Path(path)
    if not target.exists() or target.stat().st_size == 0:
        return []
    frame = pd.read_csv(target)
    return list(
        zip(
            frame.iloc[:, 0].astype(int).tolist(),
            frame[field_name].astype(float).tolist(),
            strict=True,
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
