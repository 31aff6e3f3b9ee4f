"""Where a reprocessing batch's time goes: Spark's per-phase durations while one PE drains a
backlog.

Uses the data-plane bench's harness (one nats-server, one session, warmed as a node's): for
each case, a fresh pipeline gets ``--backlog`` events, a fogshift query of the case drains
them, and the script prints the mean of each phase of Spark's progress reports
(``latestOffset`` is the reader planning the batch — reading it, with the read-ahead — and
``addBatch`` processing and appending it) with the batch sizes. Run it on a quiet machine:

    .venv/bin/python scripts/reprocess_batches.py --runs 2

A measurement tool, not part of the runtime.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from fogshift.bench.dataplane import CASES, Bench, Settings

PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets",
          "triggerExecution")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--backlog", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fogshift-reprocess-"))
    bench = Bench(work, Settings())
    try:
        for run in range(1, args.runs + 1):
            for case in args.cases.split(","):
                _, _, _, progress = bench.drain("fogshift", case, args.backlog)
                means = {
                    phase: statistics.fmean(p["durationMs"].get(phase, 0) for p in progress)
                    for phase in PHASES
                }
                shown = " ".join(f"{phase}={ms:.0f}" for phase, ms in means.items())
                sizes = [p["numInputRows"] for p in progress]
                print(f"run {run} {case}: {shown} ms; batches {sizes}", flush=True)
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
