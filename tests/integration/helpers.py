"""Test data and specs for the integration tests."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import yaml


def write_case1_csv(path: Path, rows: int, seed: int) -> Path:
    """A Case 1 input with a few malformed rows (bad numbers, wrong column counts)."""
    rnd = random.Random(seed)
    lines = ["timestamp,sensor,value"]
    for k in range(1, rows + 1):
        value = f"{rnd.uniform(-50, 150):.4f}"
        roll = rnd.random()
        if roll < 0.02:
            value = rnd.choice(["n/a", "", "inf", "NaN", "1.2.3"])
        line = f"{1_700_000_000 + k},s{k % 4},{value}"
        if 0.02 <= roll < 0.03:
            line = f"{1_700_000_000 + k},s{k % 4}"
        lines.append(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_spec(path: Path, pipeline: str, elements: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"pipeline": pipeline, "elements": elements}))
    return path
