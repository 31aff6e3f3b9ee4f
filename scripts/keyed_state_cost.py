"""Time per micro-batch of a keyed PE by the state each key holds: a real local Spark
session and nats-server.

A keyed, padded window aggregate (``fogshift.bench.padded``) gets ``--rows`` events every
``--every`` seconds, spread over ``--keys`` keys, so that every batch touches every key;
each key carries ``--pad-kib`` KiB of state that its events never change. Reports the
median and p90 of the batches' ``addBatch`` time and the CPU per batch, one line per
padding. Run it on a quiet machine:

    .venv/bin/python scripts/keyed_state_cost.py --pad-kib 0,1024 --keys 10

A measurement tool, not part of the runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from fogshift.bench.padded import aggregate_element
from fogshift.broker.client import SyncJetStream, ensure_pe_stream
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import start_nats_server
from fogshift.runtime.engine import QueryPlan, start_query
from fogshift.runtime.session import build_session
from fogshift.runtime.warm_up import warm_up
from fogshift.spec.models import ElementSpec


def cpu_s(me: psutil.Process) -> float:
    """CPU seconds so far of this process and its descendants."""
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def measure(  # type: ignore[no-untyped-def]
    spark, home: Path, js: SyncJetStream, broker_file: Path, pad: int, run: int, args
) -> str:
    """One padding's line (``run``: its number, which names its pipeline)."""
    pipeline = f"p{run}"
    for pe in ("source", "aggregate"):
        js.run(lambda j, pe=pe: ensure_pe_stream(j, pipeline, pe))
    spec = {**aggregate_element("n", pad * 1024), "key_by": "sensor"}
    if pad == 0:  # (the built-in one takes no padding: the padded class with none)
        spec = {**aggregate_element("n", 1), "key_by": "sensor"}
        spec["options"]["options"]["pad_bytes"] = 0
    element = ElementSpec.model_validate(spec)
    checkpoint = home / f"checkpoint-{run}"
    gate = str(home / f"gate-{run}.json")
    plan = QueryPlan(pipeline, element, str(broker_file), str(checkpoint),
                     trigger_ms=args.trigger_ms, gate_file=gate)  # fmt: skip
    query = start_query(spark, plan)
    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        records = [
            Record(n, 0, n, 1000.0 + n, "source",
                   json.dumps({"sensor": f"s{n % args.keys}", "value": n % 7 - 2.5}))
            for n in range(sent + 1, sent + count + 1)
        ]  # fmt: skip
        js.run(lambda j: publish_records(j, pipeline, "source", records))
        sent += count

    me = psutil.Process()
    send(args.rows)
    time.sleep(15)  # the first batches (every key's state made), the workers' start
    seen = {p["batchId"] for p in query.recentProgress}
    cpu, started = cpu_s(me), time.time()
    while time.time() - started < args.seconds:
        send(args.rows)
        time.sleep(args.every)
    time.sleep(3)
    cpu = cpu_s(me) - cpu
    progress = [p for p in query.recentProgress if p["batchId"] not in seen and p["numInputRows"]]
    query.stop()
    add = sorted(p["durationMs"]["addBatch"] for p in progress)
    whole = sorted(p["durationMs"]["triggerExecution"] for p in progress)
    n = len(add)
    return (f"{pad:>6} KiB/key, {args.keys} keys: {n} batches; addBatch median "
            f"{statistics.median(add):.0f} ms, p90 {add[int(0.9 * (n - 1))]:.0f} ms; batch "
            f"median {statistics.median(whole):.0f} ms; CPU {1000 * cpu / max(n, 1):.0f} ms "
            f"a batch")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pad-kib", default="0,1024", help="comma-separated KiB per key")
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between appends")
    parser.add_argument("--rows", type=int, default=20, help="events per append")
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--trigger-ms", type=int, default=500)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="keyed-state-cost-"))
    broker = start_nats_server(home / "nats")
    broker_file = home / "broker.json"
    broker.address.save(broker_file)
    js = SyncJetStream(broker.address)
    spark = build_session("keyed-state-cost", "local[2]", str(home / "spark"))
    warm_up(spark, home / "warm-up")
    try:
        for run, pad in enumerate(int(p) for p in args.pad_kib.split(",")):
            print(measure(spark, home, js, broker_file, pad, run, args), flush=True)
    finally:
        spark.stop()
        js.close()
        os.killpg(broker.pid, 9)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
