"""The orchestrator's durable state in SQLite: pipelines, placements, nodes.

Placement is the routing state of the thesis: which node hosts each PE, and so who feeds
whom. It survives restarts of the orchestrator, which is what lets a restarted cluster carry
on where it stopped.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fogshift.spec.models import PipelineSpec

SCHEMA = """
CREATE TABLE IF NOT EXISTS pipelines (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    status TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS placements (
    pipeline TEXT NOT NULL REFERENCES pipelines(name) ON DELETE CASCADE,
    element TEXT NOT NULL,
    node TEXT NOT NULL,
    updated REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (pipeline, element)
);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    pid INTEGER,
    pgid INTEGER,
    last_seen REAL NOT NULL,
    report TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class NodeRecord:
    """A node as last heard from."""

    name: str
    url: str
    pid: int | None
    pgid: int | None
    last_seen: float
    report: dict[str, Any]


@dataclass(frozen=True)
class PipelineRecord:
    """A deployed pipeline and where its PEs are."""

    spec: PipelineSpec
    status: str
    placement: dict[str, str]

    @property
    def name(self) -> str:
        return self.spec.pipeline


class Registry:
    """SQLite-backed store; safe to use from several threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- pipelines --------------------------------------------------------------------------

    def put_pipeline(self, spec: PipelineSpec, status: str) -> None:
        """Insert or replace a pipeline with the placement its spec asks for."""
        now = time.time()
        with self._tx() as db:
            db.execute("DELETE FROM pipelines WHERE name = ?", (spec.pipeline,))
            db.execute(
                "INSERT INTO pipelines VALUES (?, ?, ?, ?)",
                (spec.pipeline, spec.model_dump_json(), status, now),
            )
            db.executemany(
                "INSERT INTO placements VALUES (?, ?, ?, ?, 1)",
                [(spec.pipeline, e.id, e.node, now) for e in spec.elements],
            )

    def set_status(self, name: str, status: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE pipelines SET status = ?, updated = ? WHERE name = ?",
                (status, time.time(), name),
            )

    def set_placement(self, pipeline: str, element: str, node: str) -> None:
        """Record that ``element`` of ``pipeline`` now runs on ``node`` (routing state)."""
        with self._tx() as db:
            db.execute(
                "UPDATE placements SET node = ?, updated = ? WHERE pipeline = ? AND element = ?",
                (node, time.time(), pipeline, element),
            )

    def next_epoch(self, pipeline: str, element: str) -> int:
        """Bump and return the epoch of a PE (a restored instance supersedes the old one)."""
        with self._tx() as db:
            db.execute(
                "UPDATE placements SET epoch = epoch + 1 WHERE pipeline = ? AND element = ?",
                (pipeline, element),
            )
            row = db.execute(
                "SELECT epoch FROM placements WHERE pipeline = ? AND element = ?",
                (pipeline, element),
            ).fetchone()
        return int(row[0])

    def epochs(self, pipeline: str) -> dict[str, int]:
        with self._lock:
            return dict(
                self._db.execute(
                    "SELECT element, epoch FROM placements WHERE pipeline = ?", (pipeline,)
                ).fetchall()
            )

    def get_pipeline(self, name: str) -> PipelineRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT spec, status FROM pipelines WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                return None
            placement = dict(
                self._db.execute(
                    "SELECT element, node FROM placements WHERE pipeline = ?", (name,)
                ).fetchall()
            )
        return PipelineRecord(PipelineSpec.model_validate_json(row[0]), row[1], placement)

    def pipelines(self) -> list[PipelineRecord]:
        with self._lock:
            names = [r[0] for r in self._db.execute("SELECT name FROM pipelines ORDER BY name")]
        records = [self.get_pipeline(n) for n in names]
        return [r for r in records if r is not None]

    # -- nodes ------------------------------------------------------------------------------

    def heartbeat(
        self, name: str, url: str, pid: int | None, pgid: int | None, report: dict
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                "url = excluded.url, pid = excluded.pid, pgid = excluded.pgid, "
                "last_seen = excluded.last_seen, report = excluded.report",
                (name, url, pid, pgid, time.time(), json.dumps(report)),
            )

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, url, pid, pgid, last_seen, report FROM nodes ORDER BY name"
            ).fetchall()
        return [NodeRecord(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    def node(self, name: str) -> NodeRecord | None:
        return next((n for n in self.nodes() if n.name == name), None)

    def close(self) -> None:
        with self._lock:
            self._db.close()
