"""Sum the CPU time every process on the machine spends while something runs, by kind of
process (Spark JVM, an agent, an orchestrator, Spark's Python workers, pytest, ...): where a
suite run's CPU goes. Processes that ran before the sampler started count from then on; a
process's last second before it exits is not seen (a few percent of short-lived ones).

Run it beside what is measured, then stop it by creating the stop file::

    .venv/bin/python scripts/cpu_by_process.py /tmp/cpu.json /tmp/cpu.stop &
    FOGSHIFT_TEST_PROFILE=/tmp/p.jsonl make test; touch /tmp/cpu.stop

The JSON written holds CPU seconds per kind and how many JVMs started, by their parent's
kind (Spark's launcher starts two per session).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import psutil


def kind(process: psutil.Process) -> str | None:
    """What ``process`` is, from its command line; ``None`` if it cannot be read."""
    try:
        args = process.cmdline()
    except psutil.Error:
        return None
    if not args:
        return None
    line = " ".join(args)
    if "java" in Path(args[0]).name or "SparkSubmit" in line:
        return "jvm"
    if "nats-server" in line:
        return "nats-server"
    if "-m" in args:
        i = args.index("-m")
        module = args[i + 1] if i + 1 < len(args) else ""
        if module == "fogshift.cli.main":  # serve-agent, serve-orchestrator, up, bench, ...
            return "fogshift " + (args[i + 2] if i + 2 < len(args) else "")
        return "python -m " + module
    if "exec(eval(sys.stdin.readline()))" in line:
        return "pytest-xdist worker"
    return Path(args[0]).name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("stop", type=Path, help="sample until this file exists")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    args = parser.parse_args()
    started = time.time()
    seen: dict[tuple[int, float], list] = {}  # (pid, start) -> [kind, CPU s counted so far]
    cpu: Counter[str] = Counter()
    jvms: Counter[str] = Counter()
    while not args.stop.exists():
        for process in psutil.process_iter():
            try:
                times, born = process.cpu_times(), process.create_time()
            except psutil.Error:
                continue
            used = times.user + times.system
            key = (process.pid, born)
            if key not in seen:
                what = kind(process)
                # (What it spent before the sampler started is not this run's.)
                seen[key] = [what, used if born < started else 0.0]
                if what == "jvm" and born >= started:
                    try:
                        parent = process.parent()
                        jvms[(kind(parent) if parent else None) or "?"] += 1
                    except psutil.Error:
                        jvms["?"] += 1
            what, counted = seen[key]
            if what is not None:
                cpu[what] += used - counted
                seen[key][1] = used
        time.sleep(args.interval)
    total = sum(cpu.values())
    report = {
        "seconds": round(time.time() - started, 1),
        "cpu_s": round(total, 1),
        "by_kind": {
            k: {"cpu_s": round(v, 1), "share": round(v / total, 3) if total else 0.0}
            for k, v in cpu.most_common()
        },
        "jvm_starts_by_parent": dict(jvms),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
