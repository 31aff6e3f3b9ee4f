"""A node agent lists a checkpoint file's chunks and serves byte ranges of it, for the
central store to fetch only what changed (``fogshift.checkpoint.chunks``). The agent's real
FastAPI app without Spark (its lifespan does not run)."""

from __future__ import annotations

import os
from pathlib import Path

from fogshift.agent.app import create_app
from fogshift.agent.config import AgentConfig
from fogshift.common.http import node_token
from tests.agent.test_agent_hostile import OPERATOR, SNAPSHOT, client

FILE = f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}"


def test_a_files_chunks_and_ranges_rebuild_it_and_a_bad_range_is_refused(
    tmp_path: Path,
) -> None:
    data = os.urandom(300_000)
    snap = tmp_path / "nodes" / "fog-a" / "node-checkpoints" / "p" / "agg" / SNAPSHOT
    snap.mkdir(parents=True)
    (snap / "state.sst").write_bytes(data)
    (tmp_path / "broker.json").write_text('{"url": "nats://x", "password": "p"}')
    config = AgentConfig(
        name="fog-a", port=1, home=tmp_path / "nodes" / "fog-a",
        token=node_token(OPERATOR, "fog-a"), orchestrator_url="http://127.0.0.1:9",
        broker_file=tmp_path / "broker.json",
    )  # fmt: skip
    c = client(create_app(config), node_token(OPERATOR, "fog-a"))
    listing = c.get(f"{FILE}/chunks/state.sst").json()
    assert listing["size"] == len(data) and len(listing["chunks"]) > 1
    pieces = [
        c.get(f"{FILE}/files/state.sst", params={"offset": o, "length": n}).content
        for o, n, _ in listing["chunks"]
    ]
    assert b"".join(pieces) == data
    for params in ({"offset": 0}, {"offset": len(data) - 1, "length": 2}, {"length": 5}):
        refused = c.get(f"{FILE}/files/state.sst", params=params)
        assert refused.status_code == 422, params
        assert "within its 300000 bytes" in refused.text and "fog-a" in refused.text
    assert c.get(f"{FILE}/files/state.sst", params={"offset": -1, "length": 1}).status_code == 422
    assert c.get(f"{FILE}/chunks/..%2F..%2Fbroker.json").status_code == 422
