"""Sum a suite run's per-test profile by module: where the wall clock goes, and how much of
it the machine's CPUs were busy (computing) or idle (tests waiting).

Record with ``FOGSHIFT_TEST_PROFILE=/tmp/profile.jsonl make test`` (``tests/conftest.py``
appends one line per test), then::

    .venv/bin/python scripts/test_profile.py /tmp/profile.jsonl

A module whose CPUs were mostly idle waits (timeouts, restarts, polls): shorter waits or
running it beside another module would save its time. A busy one computes: only cheaper
batches, fewer operations or fewer cluster starts save time there.

``--phases N`` lists the N longest phases by module (a test's waits, each by what it waited
for, its CLI commands, `up`, and the shared cluster's heal and stop: ``phase`` in
``tests/conftest.py``): where a long module's wall clock went.

``--write-seconds tests/module_seconds.json`` records each module's wall clock (those of at
least ``--min-seconds``) as the order `make test` hands modules to its workers in: longest
first (``tests/conftest.py``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="the JSON-lines file the suite wrote")
    parser.add_argument("--top", type=int, default=25, help="modules to list")
    parser.add_argument("--write-seconds", type=Path, help="write {module: wall s} here")
    parser.add_argument("--min-seconds", type=float, default=5.0, help="modules to write")
    parser.add_argument("--phases", type=int, default=0, help="longest phases to list")
    args = parser.parse_args()
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    #: Each worker's first start and last end (records since "ended" was added).
    workers: dict[str, list[float]] = {}
    phases: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for line in args.profile.read_text().splitlines():
        record = json.loads(line)
        if "phase" in record:  # a wait or an operation within a test (tests/conftest.py)
            what = re.sub(r"\d+", "N", record["phase"])
            phase = phases[(record["test"].split("::")[0], what)]
            phase[0] += record["wall_s"]
            phase[1] += 1
            continue
        if "ended" in record:
            span = workers.setdefault(record["worker"], [record["ended"], 0.0])
            span[0] = min(span[0], record["ended"] - record["wall_s"])
            span[1] = max(span[1], record["ended"])
        module = modules[record["test"].split("::")[0]]
        module[0] += record["wall_s"]
        module[1] += record["busy_cpu_s"]
        module[2] += record["idle_cpu_s"]
        module[3] += 1
    wall = sum(m[0] for m in modules.values())
    busy = sum(m[1] for m in modules.values())
    idle = sum(m[2] for m in modules.values())
    print(f"{'module':60} {'tests':>5} {'wall s':>8} {'share':>6} {'busy %':>7}")
    for name, (w, b, i, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{name:60} {n:5.0f} {w:8.1f} {w / wall:6.1%} {b / max(b + i, 1e-9):7.1%}")
    print(f"{'all':60} {'':5} {wall:8.1f} {'':6} {busy / max(busy + idle, 1e-9):7.1%}")
    if workers:
        # A worker that ran out of modules long before the others left its core's share idle.
        start = min(first for first, _ in workers.values())
        for name, (first, last) in sorted(workers.items()):
            print(f"worker {name}: from +{first - start:.0f} s to +{last - start:.0f} s")
    if args.phases:
        # The waits and operations the modules' wall clock went to, numbers made alike.
        print(f"\n{'phase (module: what)':90} {'times':>5} {'wall s':>8}")
        for (module, what), (w, n) in sorted(phases.items(), key=lambda kv: -kv[1][0])[
            : args.phases
        ]:
            print(f"{(module.removeprefix('tests/') + ': ' + what)[:90]:90} {n:5.0f} {w:8.1f}")
    if args.write_seconds:
        seconds = {
            name: round(m[0])
            for name, m in sorted(modules.items(), key=lambda kv: -kv[1][0])
            if m[0] >= args.min_seconds
        }
        args.write_seconds.write_text(json.dumps(seconds, indent=1) + "\n")


if __name__ == "__main__":
    main()
