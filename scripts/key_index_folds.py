"""What folding the key index costs a keyed PE with many keys (fogshift.checkpoint.key_index).

Writes a base of ``--keys`` keys, then ``--batches`` batches' notes of ``--changed`` keys
each (drawn at random), folding at every batch as the agent's snapshot rounds may
(``compact``), and prints how many folds there were, the CPU they took in all and per batch,
the bytes of bases written, and the slowest listing (``read``) between them. ``--every-16``
folds every 16 notes whatever the base's size, as before the size share. Run it from the
repository on a quiet machine:

    .venv/bin/python scripts/key_index_folds.py [--every-16]

A measurement tool, not part of the runtime.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fogshift.checkpoint import key_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=200)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--every-16", action="store_true")
    args = parser.parse_args()
    if args.every_16:
        key_index.COMPACT_SHARE = 0.0
    rng = random.Random(1)
    work = Path(tempfile.mkdtemp(prefix="fogshift-bench-folds-"))
    try:
        folder = work / key_index.FOLDER
        names = [f"patient-{n:06d}" for n in range(args.keys)]
        key_index.write_base(folder, 0, {k: {"f_sum": rng.randint(10, 999)} for k in names})
        folds, fold_cpu, base_bytes, slowest = 0, 0.0, 0, 0.0
        for batch in range(1, args.batches + 1):
            changes = {
                rng.choice(names): {"f_sum": rng.randint(10, 999)} for _ in range(args.changed)
            }
            key_index.write_batch(folder, batch, changes)
            started = time.process_time()
            if key_index.compact(folder, batch):
                fold_cpu += time.process_time() - started
                folds += 1
                base_bytes += (folder / f"base-{batch}.json").stat().st_size
            if batch % 50 == 0:
                started = time.perf_counter()
                assert key_index.read(folder, batch) is not None
                slowest = max(slowest, time.perf_counter() - started)
        print(
            f"{args.keys} keys, {args.changed} changed a batch, {args.batches} batches"
            f"{' (a fold every 16 notes)' if args.every_16 else ''}: {folds} folds, "
            f"{fold_cpu:.2f} CPU-s in all ({fold_cpu / args.batches * 1000:.1f} ms a batch), "
            f"{base_bytes / 1e6:.1f} MB of bases written, slowest listing {slowest * 1000:.0f} ms"
        )
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
