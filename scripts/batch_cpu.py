"""CPU per micro-batch of one PE's query: a real local Spark session and nats-server.

Feeds ``--rows`` events every ``--every`` seconds into the input of one processor PE for
``--seconds`` and reports the batches it committed, the CPU they cost (per process, the
JVM and every Python worker, and the whole machine's busy time, which includes workers that
ended meanwhile), then the CPU of the same query idle. Run it on a quiet machine:

    .venv/bin/python scripts/batch_cpu.py --kind window-aggregate --trigger-ms 200

``--windows N`` measures N times in a row (how the cost changes as the JIT compiles),
``--warm-s`` feeds that long before the first, ``--java-options`` replaces the driver JVM's
options (``fogshift.runtime.session.JAVA_OPTIONS``).

A measurement tool, not part of the runtime (the planned ``fogshift bench dataplane`` will
measure latency and throughput against plain Spark).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from fogshift.broker.client import SyncJetStream, ensure_pe_stream
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import start_nats_server
from fogshift.runtime.engine import QueryPlan, start_query
from fogshift.runtime.session import JAVA_OPTIONS, build_session
from fogshift.runtime.warm_up import warm_up
from fogshift.spec.models import ElementSpec

OPTIONS = {
    "window-aggregate": {"field": "value", "window": 10, "function": "avg"},
    "window-aggregate-jvm": {"field": "value", "window": 10, "function": "avg", "engine": "jvm"},
    "filter": {"where": "value > 0"},
}


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    with open("/proc/stat") as handle:
        values = [int(x) for x in handle.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(me: psutil.Process) -> dict[int, tuple[float, str]]:
    """CPU seconds so far of this process and its descendants, with their command lines."""
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            out[proc.pid] = (times.user + times.system, " ".join(proc.cmdline())[-70:])
        except psutil.Error:
            continue
    return out


def last_pid() -> int:
    """The last process or thread id the kernel gave (ids are given in turn, wrapping at
    ``pid_max``: the difference counts what was started meanwhile, machine-wide)."""
    return int(Path("/proc/sys/kernel/ns_last_pid").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=sorted(OPTIONS), default="filter")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between appends")
    parser.add_argument("--rows", type=int, default=12, help="events per append")
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument("--windows", type=int, default=1, help="measurements in a row")
    parser.add_argument("--warm-s", type=float, default=10, help="seconds fed before measuring")
    parser.add_argument("--java-options", default=JAVA_OPTIONS, help="the driver JVM's options")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="batch-cpu-"))
    broker = start_nats_server(home / "nats")
    broker_file = home / "broker.json"
    broker.address.save(broker_file)
    js = SyncJetStream(broker.address)
    for pe in ("src", "pe"):
        js.run(lambda j, pe=pe: ensure_pe_stream(j, "p", pe))
    kind = args.kind.removesuffix("-jvm")
    element = ElementSpec.model_validate(
        {"id": "pe", "kind": kind, "node": "n", "inputs": ["src"], "options": OPTIONS[args.kind]}
    )
    spark = build_session("batch-cpu", "local[2]", str(home / "spark"), args.java_options)
    warm_up(spark, home / "warm-up")
    plan = QueryPlan("p", element, str(broker_file), str(home / "checkpoint"),
                     trigger_ms=args.trigger_ms, gate_file=str(home / "gate.json"))  # fmt: skip
    query = start_query(spark, plan)
    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        records = [
            Record(n, 0, n, 1000.0 + n, "src", json.dumps({"value": n % 7 - 2.5}))
            for n in range(sent + 1, sent + count + 1)
        ]
        js.run(lambda j: publish_records(j, "p", "src", records))
        sent += count

    def committed() -> int:
        # (Spark keeps the last 100 commit files only: the last batch's id counts them all.)
        last = query.lastProgress
        return int(last.batchId) + 1 if last is not None else 0

    me = psutil.Process()
    # The first batches, the workers' start and the JIT's first compilations are not what is
    # measured.
    warm_until = time.time() + args.warm_s
    while time.time() < warm_until:
        send(args.rows)
        time.sleep(args.every)
    for window in range(args.windows):
        tasks = last_pid()
        before, batches, busy, started = (
            cpu_by_process(me),
            committed(),
            machine_busy_s(),
            time.time(),
        )
        while time.time() - started < args.seconds:
            send(args.rows)
            time.sleep(args.every)
        time.sleep(2 if window == args.windows - 1 else 0)
        after, batches, busy = cpu_by_process(me), committed() - batches, machine_busy_s() - busy
        wall = time.time() - started
        tasks = (last_pid() - tasks) % int(Path("/proc/sys/kernel/pid_max").read_text())
        spent = {pid: t - before.get(pid, (0.0, ""))[0] for pid, (t, _) in after.items()}
        total = sum(spent.values())
        print(f"[{window}] {args.kind}, {args.rows} events every {args.every} s, "
              f"trigger {args.trigger_ms} ms: "
              f"{batches} batches in {wall:.0f} s; processes {total:.1f} s of CPU "
              f"({1000 * total / max(batches, 1):.0f} ms a batch, {100 * total / wall:.0f}% of a "
              f"core); machine busy {busy:.1f} s; {tasks / max(batches, 1):.0f} processes and "
              f"threads started a batch")  # fmt: skip
        for pid, seconds in sorted(spent.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {seconds:6.1f} s  {1000 * seconds / max(batches, 1):5.0f} ms/batch  "
                  f"{after[pid][1]}")  # fmt: skip
        durations = [p.durationMs for p in query.recentProgress if "addBatch" in p.durationMs]
        for name in ("triggerExecution", "addBatch"):
            times = sorted(d.get(name, 0) for d in durations)
            if times:
                print(f"  {name}: median {times[len(times) // 2]} ms of the last {len(times)}")
    idle_before = cpu_by_process(me)
    time.sleep(15)
    idle = sum(t - idle_before.get(pid, (0.0, ""))[0] for pid, (t, _) in cpu_by_process(me).items())
    print(f"idle: {100 * idle / 15:.0f}% of a core")
    query.stop()
    spark.stop()
    js.close()
    os.killpg(broker.pid, 9)
    shutil.rmtree(home, ignore_errors=True)  # (its checkpoint, broker store and scratch)


if __name__ == "__main__":
    main()
