"""Pacing the central store's checkpoint pulls (``fogshift.agent.pacing``): the bytes are the
file's, and they cannot leave faster than the node's pull rate (a lower bound on the time,
which a rate limiter guarantees: never an upper one)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from fogshift.agent.app import create_app
from fogshift.agent.config import AgentConfig
from fogshift.agent.pacing import BURST_S, Pacer
from fogshift.common.http import node_token
from fogshift.network.links import LinkProfile
from fogshift.supervisor.cluster import PULL_SHARE, pull_rate_bps
from tests.agent.test_agent_hostile import OPERATOR, SNAPSHOT, client


async def _collect(pacer: Pacer, data: bytes) -> list[bytes]:
    return [piece async for piece in pacer.paced(data)]


def test_paced_pieces_are_the_data_in_bursts_the_rate_holds() -> None:
    data = os.urandom(100_003)
    pacer = Pacer(8_000_000)  # 1 MB/s: a burst of 50 kB, pieces of 16 KiB
    pieces = asyncio.run(_collect(pacer, data))
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) <= pacer.chunk <= 8_000_000 / 8 * BURST_S
    slow = Pacer(8000)  # 1 kB/s: pieces no larger than a burst (50 bytes)
    assert slow.chunk == 50
    with pytest.raises(ValueError, match="below 8000"):
        Pacer(7999)


def test_a_paced_agent_serves_a_snapshot_file_no_faster_than_its_pull_rate(
    tmp_path: Path,
) -> None:
    data = os.urandom(60_000)
    home = tmp_path
    snap = home / "nodes" / "fog-a" / "node-checkpoints" / "p" / "agg" / SNAPSHOT
    snap.mkdir(parents=True)
    (snap / "state.bin").write_bytes(data)
    (home / "broker.json").write_text('{"url": "nats://x", "password": "p"}')
    rate = 800_000  # 100 kB/s
    config = AgentConfig(
        name="fog-a", port=1, home=home / "nodes" / "fog-a",
        token=node_token(OPERATOR, "fog-a"), orchestrator_url="http://127.0.0.1:9",
        broker_file=home / "broker.json", pull_rate_bps=rate,
    )  # fmt: skip
    app = create_app(config)
    c = client(app, node_token(OPERATOR, "fog-a"))
    started = time.monotonic()
    response = c.get(f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/state.bin")
    took = time.monotonic() - started
    assert response.status_code == 200 and response.content == data
    assert response.headers["content-length"] == str(len(data))
    # All but the first burst waits for the rate.
    assert took >= (len(data) - rate / 8 * BURST_S) / (rate / 8) * 0.95
    assert app.state.runtime.pins.held("p", "agg") == {SNAPSHOT}  # pinned once sent


def test_up_paces_an_isolated_nodes_pulls_at_a_share_of_its_bandwidth() -> None:
    assert pull_rate_bps(LinkProfile(bandwidth="10mbit")) == int(10_000_000 * PULL_SHARE)
    assert pull_rate_bps(LinkProfile(bandwidth="10kbit")) == 8000  # the pacer's floor
    assert pull_rate_bps(LinkProfile()) is None
    assert pull_rate_bps(LinkProfile(mean_ms=100)) is None
