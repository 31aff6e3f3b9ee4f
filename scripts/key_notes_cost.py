"""What the key index's notes cost in a keyed batch's per-key path (fogshift.checkpoint.key_index).

Runs ``--keys`` keys of one event each through a keyed ``window-aggregate``'s processor, on
the engine tests' stand-in state store (tests/runtime/test_engine_state.py), with and without
its writes noted, ``--rounds`` times, and prints both times. Run it from the repository on a
quiet machine:

    .venv/bin/python scripts/key_notes_cost.py

A measurement tool, not part of the runtime.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["SPARK_REUSE_WORKER"] = "1"  # (instances kept between keys, as in a worker)

import fogshift.runtime.engine as engine
from tests.runtime.test_engine_state import Store

OPTIONS = {"field": "value", "window": 3, "function": "sum"}
_runs = itertools.count()


def batch(keys: int, noted: bool) -> float:
    """Seconds to run ``keys`` keys of one event each (``noted``: their writes noted)."""
    original = engine._noted
    if not noted:
        engine._noted = lambda state, name, written, noted: state
    try:
        processor = engine._stateful_processor(
            "window-aggregate", OPTIONS, "p", "agg", 1 << 20, run=f"r{next(_runs)}", gate="",
            key_by="sensor",
        )  # fmt: skip
        stores = [Store() for _ in range(keys)]
        frames = [
            pd.DataFrame([(k, k, 1000.0 + k, "src", json.dumps({"sensor": f"s{k}", "value": 1.0}))],
                         columns=["origin", "seq", "timestamp", "creator", "body"])
            for k in range(keys)
        ]  # fmt: skip
        started = time.perf_counter()
        for k in range(keys):
            processor.init(stores[k])
            list(processor.handleInputRows((f"k:s{k}",), iter([frames[k]]), None))
        return time.perf_counter() - started
    finally:
        engine._noted = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.rounds):
        without, with_notes = batch(args.keys, False), batch(args.keys, True)
        print(f"{args.keys} keys: without notes {without * 1000:.0f} ms, "
              f"with {with_notes * 1000:.0f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
