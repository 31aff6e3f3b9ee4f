"""A node's first stateful query against its later ones, with and without the warm-up.

Starts nats-server and one node session (as an agent does), then ``--queries`` fresh
``window-aggregate`` PEs one after another, each with 20 events already in its input, and
prints how long each took from ``start_query`` to its first committed batch, then how long
a key listing of its state took (``state_reader.read_keys``, as a key group's move asks an
agent). With ``--warm-up``, the session first runs :func:`fogshift.runtime.warm_up.warm_up`
(a stateful batch and a read of its state), as every agent does before its first PE. Run
it on a quiet machine:

    .venv/bin/python scripts/first_query.py
    .venv/bin/python scripts/first_query.py --warm-up
    .venv/bin/python scripts/first_query.py --warm-up --engine jvm

A measurement tool, not part of the runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from fogshift.broker.client import SyncJetStream, ensure_pe_stream
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import start_nats_server
from fogshift.common.waiting import wait_until
from fogshift.runtime.engine import QueryPlan, start_query
from fogshift.runtime.gate import end_run
from fogshift.runtime.kinds import processor_for
from fogshift.runtime.session import build_session
from fogshift.runtime.state_reader import read_jvm_window, read_keys
from fogshift.runtime.warm_up import warm_up
from fogshift.spec.models import ElementSpec


def _ran_a_batch(query: Any) -> bool:
    return any(p["numInputRows"] > 0 for p in query.recentProgress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3)
    parser.add_argument("--warm-up", action="store_true")
    parser.add_argument("--engine", choices=("python", "jvm"), default="python")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="fogshift-first-query-"))
    broker = start_nats_server(home / "nats")
    js = SyncJetStream(broker.address)
    broker_file = str(broker.address.save(home / "broker.json"))
    spark = build_session("first-query", "local[*]", str(home / "local"))
    try:
        if args.warm_up:
            print(f"warm-up: {warm_up(spark, home / 'warm-up'):.2f} s", flush=True)
        for index in range(args.queries):
            pipeline = f"fq{index}"
            for pe in ("src", "agg"):
                js.run(partial(ensure_pe_stream, pipeline=pipeline, pe=pe))
            records = [
                Record(n, 0, n, 1000.0 + n, "src", json.dumps({"value": n})) for n in range(1, 21)
            ]
            js.run(partial(publish_records, pipeline=pipeline, pe="src", records=records))
            options = {"field": "value", "window": 5, "engine": args.engine}
            element = ElementSpec.model_validate(
                {"id": "agg", "kind": "window-aggregate", "node": "n", "inputs": ["src"],
                 "options": options}
            )  # fmt: skip
            gate = str(home / pipeline / "gate.json")
            plan = QueryPlan(pipeline, element, broker_file, str(home / pipeline / "checkpoint"),
                             trigger_ms=200, gate_file=gate)  # fmt: skip
            started = time.monotonic()
            query = start_query(spark, plan)
            wait_until(
                partial(_ran_a_batch, query),
                120, interval_s=0.01, describe=f"{pipeline}'s first batch",
            )  # fmt: skip
            print(f"query {index}: first batch committed after "
                  f"{time.monotonic() - started:.2f} s", flush=True)  # fmt: skip
            query.stop()
            end_run(gate)
            parts = processor_for(element.kind, dict(element.options))[0].state_parts()
            started = time.monotonic()
            if args.engine == "jvm":  # (its state as `fogshift state` reads it)
                read_jvm_window(spark, Path(plan.checkpoint_dir))
            else:
                read_keys(spark, Path(plan.checkpoint_dir), parts, movable=False)
            print(f"query {index}: its state read in {time.monotonic() - started:.2f} s",
                  flush=True)  # fmt: skip
    finally:
        spark.stop()
        js.close()
        os.killpg(broker.pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
