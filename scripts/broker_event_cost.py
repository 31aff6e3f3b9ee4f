"""What one event costs a PE's reader and writer in Python, against a local nats-server.

Appends ``--events`` records to a PE's stream with :func:`publish_records` (the writer's
atomic batches), then reads them back with :func:`read_ahead` (the reader's one request) and
decodes them with :func:`event_fields`, ``--runs`` times each, and prints microseconds per
event; then one profiled read and one profiled append, their most expensive functions first.
Run it on a quiet machine:

    .venv/bin/python scripts/broker_event_cost.py

A measurement tool, not part of the runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import signal
import tempfile
import time
from pathlib import Path

import nats

from fogshift.broker.client import BrokerAddress, ensure_pe_stream, read_ahead
from fogshift.broker.keys import event_fields
from fogshift.broker.naming import stream_name
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import start_nats_server


def _records(first: int, count: int) -> list[Record]:
    now = time.time() * 1000
    return [
        Record(n, 0, n, now, "pe", json.dumps({"value": float(n % 97), "y": 3.0}))
        for n in range(first, first + count)
    ]


async def measure(address: BrokerAddress, events: int, runs: int) -> None:
    nc = await nats.connect(address.url, user=address.user, password=address.password)
    js = nc.jetstream()
    await ensure_pe_stream(js, "cost", "pe")
    stream = stream_name("cost", "pe")
    profiles = {"append": cProfile.Profile(), "read": cProfile.Profile()}
    for run in range(runs + 1):
        records = _records(run * events + 1, events)
        profile = profiles["append"] if run == runs else None
        started = time.perf_counter()
        if profile:
            profile.enable()
        await publish_records(js, "cost", "pe", records, epoch=1)
        if profile:
            profile.disable()
        appended = time.perf_counter()
        profile = profiles["read"] if run == runs else None
        if profile:
            profile.enable()
        messages = await read_ahead(js, stream, run * events, events)
        if profile:
            profile.disable()
        read = time.perf_counter()
        rows = [event_fields(m.data) for m in messages]
        decoded = time.perf_counter()
        assert len(rows) == events, (len(rows), events)
        if run < runs:
            per = {"append": appended - started, "read": read - appended,
                   "decode": decoded - read}  # fmt: skip
            print(" ".join(f"{k} {v / events * 1e6:.1f} µs" for k, v in per.items()), flush=True)
    await nc.close()
    for name, profile in profiles.items():
        print(f"\n-- one {name} of {events} events, by own time")
        pstats.Stats(profile).sort_stats("tottime").print_stats(8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fogshift-event-cost-"))
    broker = start_nats_server(work / "nats")
    try:
        asyncio.run(measure(broker.address, args.events, args.runs))
    finally:
        os.killpg(broker.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
