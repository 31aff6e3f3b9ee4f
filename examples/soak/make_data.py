"""Write the inputs of ``examples/soak/merge.yaml``: ``data/left.csv`` and ``data/right.csv``.

Each is ``timestamp,src,value`` with ``--rows`` data rows, from the generator the soak itself
feeds its growing inputs with (``fogshift.bench.soak.tagged_lines``), seeded per source, so
the same command always writes the same files.

    python examples/soak/make_data.py [--rows 600]
"""

from __future__ import annotations

import argparse
import random
import zlib
from pathlib import Path

from fogshift.bench.soak import MERGE_HEADER, MERGE_SOURCES, tagged_lines

HERE = Path(__file__).resolve().parent


def write_inputs(folder: Path, rows: int) -> dict[str, Path]:
    """Write ``<folder>/<source>.csv`` for each merge source; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for src in MERGE_SOURCES:
        rnd = random.Random(zlib.crc32(f"merge/{src}".encode()))
        path = folder / f"{src}.csv"
        path.write_text(MERGE_HEADER + "\n" + "".join(tagged_lines(src, 1, rows, rnd)))
        paths[src] = path
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the inputs of examples/soak/merge.yaml.")
    parser.add_argument("--rows", type=int, default=600, help="data rows per input")
    args = parser.parse_args()
    for src, path in write_inputs(HERE / "data", args.rows).items():
        print(f"wrote {path} ({args.rows} rows of {src})")


if __name__ == "__main__":
    main()
