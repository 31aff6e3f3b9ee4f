"""What a node's own NATS account costs its data plane: the same appends and reads by the
admin (in the streams' account) and by a node user (in its own, through imports).

A real nats-server from the venv (``make setup``), one stream of each PE; the two users take
turns, five rounds each, and the medians are printed. Run it on a quiet machine:

    .venv/bin/python scripts/broker_account_cost.py
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fogshift.broker.client import SyncJetStream, ensure_pe_stream, read_ahead
from fogshift.broker.permissions import Hosted, apply_permissions
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import start_nats_server

ROUNDS = 5
BATCHES, BATCH = 20, 100  # atomic batches of the writer, as a PE's batch sends them
APPENDS = 2000  # single acked appends
READS, READ = 20, 1000  # batched direct gets of an input, as a reader takes them


def main() -> None:
    broker = start_nats_server(Path(tempfile.mkdtemp(prefix="account-cost-")), nodes=["n1"])
    try:
        admin = SyncJetStream(broker.address)
        for pe in ("src", "batches", "appends"):
            admin.run(lambda js, pe=pe: ensure_pe_stream(js, "cost", pe))
        hosted = [Hosted("cost", pe, ("src",)) for pe in ("batches", "appends")]
        apply_permissions(broker.config_file, broker.pid, {"n1": hosted})
        node = SyncJetStream(broker.node_addresses["n1"])
        node_ready(node)

        async def fill(js: Any) -> None:
            for _ in range(READ):
                await js.publish("fs.cost.src.data", b"x" * 200)

        admin.run(fill, timeout=120)
        origin = iter(range(1, 10**9))

        async def batches(js: Any) -> float:
            started = time.perf_counter()
            for _ in range(BATCHES):
                records = [Record(o, 0, o, 0.0, "batches", '{"v": 1}')
                           for o in (next(origin) for _ in range(BATCH))]  # fmt: skip
                assert await publish_records(js, "cost", "batches", records, 1) == BATCH
            return (time.perf_counter() - started) / BATCHES * 1e3

        async def appends(js: Any) -> float:
            started = time.perf_counter()
            for _ in range(APPENDS):
                await js.publish("fs.cost.appends.data", b'{"v": 1}')
            return (time.perf_counter() - started) / APPENDS * 1e6

        async def reads(js: Any) -> float:
            started = time.perf_counter()
            for _ in range(READS):
                assert len(await read_ahead(js, "FS_cost_src", 0, READ)) == READ
            return (time.perf_counter() - started) / READS * 1e3

        measures: dict[str, Callable[[Any], Awaitable[float]]] = {
            f"atomic batch of {BATCH} records (ms)": batches,
            "single acked append (µs)": appends,
            f"direct get of {READ} messages (ms)": reads,
        }
        taken: dict[str, list[float]] = {}
        for _ in range(ROUNDS):
            for name, measure in measures.items():
                for who, client in (("admin", admin), ("node", node)):
                    taken.setdefault(f"{who}: {name}", []).append(client.run(measure, 120))
        medians = {k: round(statistics.median(v), 2) for k, v in taken.items()}
        print(json.dumps(medians, indent=1, ensure_ascii=False))
        node.close()
        admin.close()
    finally:
        os.killpg(broker.pid, signal.SIGKILL)


def node_ready(node: SyncJetStream) -> None:
    """Wait until the reload gave the node its rights."""
    deadline = time.monotonic() + 10
    while True:
        try:
            node.run(lambda js: js.stream_info("FS_cost_src"))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


if __name__ == "__main__":
    main()
