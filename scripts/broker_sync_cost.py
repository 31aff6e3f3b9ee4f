"""What the broker's ``sync_interval: always`` costs a writer: a real nats-server started as
fogshift starts it, once per setting, and fogshift's own writer (``publish_records``: atomic
batches chained by the expected last sequence) appending batches of 1, 10, 100 and 1,000
records of ~220 bytes. Prints the median time of one batch's append per setting, the
settings alternating (``--rounds``) so a drift of the machine falls on both. Run it on a
quiet machine:

    .venv/bin/python scripts/broker_sync_cost.py --rounds 3

A measurement tool, not part of the runtime (README, "How exactly-once works").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from fogshift.broker.client import SyncJetStream, ensure_pe_stream
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import start_nats_server


def batch_times(sync: str, size: int, batches: int) -> list[float]:
    """Seconds each of ``batches`` appends of ``size`` records took, on a new broker."""
    with tempfile.TemporaryDirectory(prefix="fogshift-sync-") as home:
        broker = start_nats_server(Path(home), sync=sync)
        try:
            with SyncJetStream(broker.address) as js:
                js.run(lambda j: ensure_pe_stream(j, "p", "a"))
                body = json.dumps({"x": "y" * 200})
                times = []
                for n in range(batches):
                    records = [
                        Record(n * size + i, 0, n * size + i, 0.0, "a", body) for i in range(size)
                    ]
                    started = time.perf_counter()
                    js.run(lambda j, r=records: publish_records(j, "p", "a", r))  # type: ignore[misc]
                    times.append(time.perf_counter() - started)
                return times
        finally:
            os.killpg(broker.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default="2m,always")
    args = parser.parse_args()
    settings = args.settings.split(",")
    print(
        "| records per batch | "
        + " | ".join(f"{s}: ms per batch (records/s)" for s in settings)
        + " |"
    )
    print("|---:|" + "---:|" * len(settings))
    for size in (1, 10, 100, 1000):
        batches = 60 if size < 1000 else 20
        times: dict[str, list[float]] = {s: [] for s in settings}
        for _ in range(args.rounds):
            for sync in settings:
                times[sync] += batch_times(sync, size, batches)
        cells = []
        for sync in settings:
            median = statistics.median(times[sync])
            cells.append(f"{median * 1e3:.2f} ({size / median:,.0f})")
        print(f"| {size} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
