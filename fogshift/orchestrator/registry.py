"""The orchestrator's durable state in SQLite: pipelines, placements, epochs, nodes and the
journal of migrations and restores.

Placement is the routing state of the thesis: which node hosts each PE, and so who feeds
whom. It survives restarts of the orchestrator, which is what lets a restarted cluster carry
on where it stopped.

Epochs (fencing) live in a table of their own that no redeployment or removal of a pipeline
clears: a PE's epoch only ever grows, so an instance left over from any earlier deployment
is older than every instance started since, and is fenced.

A PE's hot standby writes, once promoted, under an epoch newer than its primary's; that epoch
is kept with the standby (table ``standbys``) rather than as the PE's, which stays the one its
placed instance runs under. The row outlives the standby (``node`` NULL): every epoch given
since is above it, so a dropped standby, should its node come back, is older than all.

The operations journal records each migration and restore as it passes each phase, *before*
the side effect the phase names, so an orchestrator that dies mid-way finds, on restart,
every operation it left unfinished and how far it got (``Orchestrator.recover_operations``).
The routing change of an operation is recorded in the same transaction as the placement.

A ``scale`` is journaled apart (table ``scales``): what was asked (partitions, nodes, waves),
from its start to its end. It has no phases to resolve: the same scale again completes what
one left at any step, so one an orchestrator died in is carried on by the next
(``Orchestrator.recover_scales``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fogshift.common.text import one_line
from fogshift.contracts import (
    Heartbeat,
    NodeHold,
    OperationKind,
    OperationRecord,
    PipelineState,
)
from fogshift.exceptions import NotFound
from fogshift.orchestrator.exceptions import NodeInUse, NodeRemoved, UnknownNode, stale_generation
from fogshift.spec.models import PLANNED_STANDBY, ElementSpec, PipelineSpec

log = logging.getLogger(__name__)

#: A change of a pipeline's spec: its new spec from the one stored (pure: no I/O, as it runs
#: inside the registry's write transaction).
SpecChange = Callable[[PipelineSpec], PipelineSpec]

SCHEMA = """
CREATE TABLE IF NOT EXISTS pipelines (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    status TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pipelines_ran (
    pipeline TEXT PRIMARY KEY REFERENCES pipelines(name) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS pipeline_failures (
    pipeline TEXT PRIMARY KEY REFERENCES pipelines(name) ON DELETE CASCADE,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS placements (
    pipeline TEXT NOT NULL REFERENCES pipelines(name) ON DELETE CASCADE,
    element TEXT NOT NULL,
    node TEXT NOT NULL,
    updated REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (pipeline, element)
);
CREATE TABLE IF NOT EXISTS epochs (
    pipeline TEXT NOT NULL,
    element TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    PRIMARY KEY (pipeline, element)
);
CREATE TABLE IF NOT EXISTS operations (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    element TEXT NOT NULL,
    origin TEXT NOT NULL,
    target TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    phase TEXT NOT NULL,
    owner TEXT NOT NULL,
    started REAL NOT NULL,
    updated REAL NOT NULL,
    outcome TEXT
);
CREATE INDEX IF NOT EXISTS unfinished_operations ON operations (outcome) WHERE outcome IS NULL;
CREATE TABLE IF NOT EXISTS groups (
    id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    elements TEXT NOT NULL,
    target TEXT NOT NULL,
    mode TEXT NOT NULL,
    owner TEXT NOT NULL,
    started REAL NOT NULL,
    updated REAL NOT NULL,
    outcome TEXT
);
-- Where each PE of a group migration ran when it began: a carry-on that fails moves the
-- ones an orchestrator that died had moved back there too (a home from before
-- 2026-12-06's sixth session has no rows: its carry-ons move back only what they moved).
CREATE TABLE IF NOT EXISTS group_origins (
    group_id TEXT NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
    element TEXT NOT NULL,
    origin TEXT NOT NULL,
    PRIMARY KEY (group_id, element)
);
CREATE TABLE IF NOT EXISTS scales (
    id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    element TEXT NOT NULL,
    partitions INTEGER NOT NULL,
    nodes TEXT NOT NULL,
    waves INTEGER NOT NULL,
    owner TEXT NOT NULL,
    started REAL NOT NULL,
    updated REAL NOT NULL,
    outcome TEXT
);
CREATE TABLE IF NOT EXISTS standbys (
    pipeline TEXT NOT NULL,
    element TEXT NOT NULL,
    node TEXT,
    epoch INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (pipeline, element)
);
CREATE TABLE IF NOT EXISTS last_reports (
    pipeline TEXT NOT NULL REFERENCES pipelines(name) ON DELETE CASCADE,
    element TEXT NOT NULL,
    kind TEXT NOT NULL,
    report TEXT NOT NULL,
    PRIMARY KEY (pipeline, element, kind)
);
CREATE TABLE IF NOT EXISTS deleted_pipelines (
    name TEXT PRIMARY KEY,
    deleted REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trimmed (
    pipeline TEXT NOT NULL REFERENCES pipelines(name) ON DELETE CASCADE,
    element TEXT NOT NULL,
    records INTEGER NOT NULL,
    dead INTEGER NOT NULL DEFAULT 0,
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
CREATE TABLE IF NOT EXISTS removed_nodes (
    name TEXT PRIMARY KEY,
    removed REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS node_generations (
    name TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
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
    report: Heartbeat


class Operation(OperationRecord):
    """One migration or restore as the journal last recorded it (internal to the orchestrator).

    Attributes:
        owner: The orchestrator process that runs it; an unfinished operation of another
            owner was left by an orchestrator that died.
    """

    owner: str


@dataclass(frozen=True)
class ScaleEntry:
    """A ``scale`` as journaled: what was asked, and how it ended (``None``: not yet).

    Attributes:
        nodes: The nodes asked for the added partitions (``--on``; empty: the default).
        owner: The orchestrator process that ran it (see :class:`Operation`).
    """

    id: str
    pipeline: str
    element: str
    partitions: int
    nodes: tuple[str, ...]
    waves: bool
    owner: str
    started: float
    outcome: str | None


_SCALE_COLUMNS = "id, pipeline, element, partitions, nodes, waves, owner, started, outcome"


def _scale(row: tuple[Any, ...]) -> ScaleEntry:
    scale_id, pipeline, element, partitions, nodes, waves, owner, started, outcome = row
    return ScaleEntry(scale_id, pipeline, element, int(partitions),
                      tuple(n for n in nodes.split(",") if n), bool(waves), owner,
                      float(started), outcome)  # fmt: skip


@dataclass(frozen=True)
class GroupEntry:
    """A group migration as journaled: what was asked, and how it ended (``None``: not yet).

    Attributes:
        elements: The PEs, in the order asked.
        owner: The orchestrator process that ran it (see :class:`Operation`).
    """

    id: str
    pipeline: str
    elements: tuple[str, ...]
    target: str
    mode: str
    owner: str
    outcome: str | None


_GROUP_COLUMNS = "id, pipeline, elements, target, mode, owner, outcome"


def _group(row: tuple[Any, ...]) -> GroupEntry:
    group_id, pipeline, elements, target, mode, owner, outcome = row
    return GroupEntry(group_id, pipeline, tuple(elements.split(",")), target, mode, owner, outcome)


def _end_unfinished(
    db: sqlite3.Connection,
    pipeline: str,
    outcome: str,
    now: float,
    element: str | None = None,
    groups_only: bool = False,
) -> None:
    """Inside a transaction: end ``pipeline``'s unfinished scales (of ``element`` only, if
    given; none with ``groups_only``) with ``outcome``, and (for the whole pipeline) its
    unfinished group migrations: what a dead orchestrator left is not carried on in a
    pipeline deployed anew (see :meth:`Registry.set_status` for a stopped one)."""
    if element is None:
        db.execute(
            "UPDATE groups SET outcome = ?, updated = ? WHERE pipeline = ? AND outcome IS NULL",
            (outcome, now, pipeline),
        )
    if groups_only:
        return
    db.execute(
        "UPDATE scales SET outcome = ?, updated = ? WHERE pipeline = ? "
        "AND (? IS NULL OR element = ?) AND outcome IS NULL",
        (outcome, now, pipeline, element, element),
    )


def _hosted(
    db: sqlite3.Connection, node: str, besides: Collection[tuple[str, str]] = ()
) -> list[NodeHold]:
    """What keeps ``node`` in the cluster (see :meth:`Registry.remove_node`), each a kind
    and its words (``what pipeline/element``); the standbys of the PEs ``besides``
    (pipeline, element) are not counted."""
    deployed = ", ".join(f"'{s}'" for s in (PipelineState.DEPLOYING, PipelineState.RUNNING,
                                             PipelineState.STOPPING))  # fmt: skip
    placed = db.execute(
        "SELECT p.pipeline, p.element, q.status FROM placements p "
        "JOIN pipelines q ON q.name = p.pipeline "
        f"WHERE p.node = ? AND q.status IN ({deployed}) ORDER BY p.pipeline, p.element",
        (node,),
    ).fetchall()
    # (Named whether or not a standby stands there now: its PE may have been promoted onto
    # it, and the keeper puts a standby back there whenever it can. A node called
    # "planned" is never named so: `standby: planned` asks for the planner's choice.)
    named = set() if node == PLANNED_STANDBY else {r[0] for r in db.execute(
        f"SELECT name FROM pipelines WHERE status IN ({deployed}) "
        "AND json_extract(spec, '$.recovery.standby') = ? ORDER BY name",
        (node,),
    ).fetchall()}  # fmt: skip
    standbys = db.execute(
        "SELECT pipeline, element FROM standbys WHERE node = ? ORDER BY pipeline, element",
        (node,),
    ).fetchall()
    operations = db.execute(
        "SELECT kind, pipeline, element FROM operations WHERE outcome IS NULL "
        "AND (origin = ? OR target = ?) ORDER BY started",
        (node, node),
    ).fetchall()
    groups = db.execute(
        "SELECT pipeline FROM groups WHERE outcome IS NULL AND target = ?", (node,)
    ).fetchall()
    # (A stopped pipeline's scale waits for `fogshift start`: it holds no node, as its PEs
    # do not; carried on once started, its placing a partition on a node since removed is
    # refused, and the scale ends so.)
    scales = db.execute(
        "SELECT s.pipeline, s.element, s.nodes FROM scales s "
        "JOIN pipelines q ON q.name = s.pipeline "
        f"WHERE s.outcome IS NULL AND q.status IN ({deployed}) ORDER BY s.started"
    ).fetchall()
    return [
        *(NodeHold(kind="pe", text=f"PE {p}/{e}") for p, e, status in placed
          if status == PipelineState.RUNNING),
        *(NodeHold(kind="settling", text=f"PE {p}/{e} of a pipeline being "
                   + ("deployed" if status == PipelineState.DEPLOYING else "stopped"))
          for p, e, status in placed if status != PipelineState.RUNNING),
        *(NodeHold(kind="standby", text=f"pipeline {p}, whose spec places its standbys "
                   "there (`recovery.standby`)") for p in sorted(named)),
        *(NodeHold(kind="standby", text=f"the standby of {p}/{e}") for p, e in standbys
          if (p, e) not in besides and p not in named),
        *(NodeHold(kind="operation", text=f"an unfinished {kind} of {p}/{e}")
          for kind, p, e in operations),
        *(NodeHold(kind="group", text=f"an unfinished group migration of {p}")
          for (p,) in groups),
        *(NodeHold(kind="scale", text=f"an unfinished scale of {p}/{e}")
          for p, e, nodes in scales if not nodes or node in nodes.split(",")),
    ]  # fmt: skip


def node_in_use(name: str, holds: list[NodeHold]) -> NodeInUse:
    """The refusal to remove node ``name`` while ``holds`` (:func:`_hosted`'s) keep it."""
    held = [h.text for h in holds]
    return NodeInUse(
        f"node {name!r} still hosts or is named by " + ", ".join(held[:10])
        + (f" and {len(held) - 10} more" if len(held) > 10 else ""),
        expected="a node that runs no PE of a deployed pipeline, that no deployed "
        "pipeline's spec names as its standby node (`recovery.standby: NODE`), and that no "
        "unfinished migration, restore, scale or group migration names",
        received=f"{len(held)} of them",
        hint="move its PEs first (`fogshift migrate PIPELINE ELEMENT --to NODE`, or "
        "`fogshift remove-node --drain`; `fogshift restore` if the node is down), stop "
        "the pipelines whose spec names it as their standby node (`recovery.standby`), or "
        "wait for the operation, deploy or stop to end",
    )  # fmt: skip


def _placeable(db: sqlite3.Connection, pipeline: str, placed: list[tuple[str, str]]) -> None:
    """Refuse, inside a write's transaction, to place anything on a removed node: a choice
    made before the node's removal (a deploy's spec checked, a restore's target picked)
    may be written after it, and would leave a PE on a node nobody runs."""
    nodes = {node for _, node in placed}
    if not nodes:
        return
    marks = ", ".join("?" * len(nodes))
    gone = {r[0] for r in db.execute(
        f"SELECT name FROM removed_nodes WHERE name IN ({marks})", tuple(nodes)
    ).fetchall()}  # fmt: skip
    for element, node in placed:
        if node in gone:
            raise UnknownNode(
                f"node {node!r} was removed from the cluster: {pipeline}/{element} cannot be "
                "placed there",
                expected="a node of the cluster",
                received=f"{node!r}, removed",
                hint="choose another node (`fogshift nodes` lists them), or add it again "
                f"with `fogshift up --nodes` naming every node and {node}",
            )


def _report(url: str, stored: str) -> Heartbeat:
    """A node's stored heartbeat; one another version wrote that does not fit the contract
    counts as a report of nothing (not ready, no PEs) until the node's next heartbeat
    replaces it, a second later: a registry is never unreadable for its node table."""
    try:
        return Heartbeat.model_validate_json(stored)
    except ValidationError:
        return Heartbeat(url=url)


def _operation(row: tuple[Any, ...]) -> Operation:
    return Operation.model_validate(dict(zip(_OPERATION_COLUMNS.split(", "), row, strict=True)))


_OPERATION_COLUMNS = (
    "id, kind, pipeline, element, origin, target, epoch, phase, owner, started, updated, outcome"
)


@dataclass(frozen=True)
class StandbyRecord:
    """A PE's hot standby: where it runs and the epoch it writes under once promoted."""

    pipeline: str
    element: str
    node: str
    epoch: int
    updated: float


@dataclass(frozen=True)
class PipelineRecord:
    """A deployed pipeline and where its PEs are."""

    spec: PipelineSpec
    status: PipelineState
    placement: dict[str, str]
    #: When its status last changed (this host's clock).
    status_since: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.pipeline


class Registry:
    """SQLite-backed store; safe to use from several threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # Every commit synced before it is acted on: an epoch given, then lost with the
        # machine's power, would be given again to another instance (two writers under one
        # epoch). SQLite's default in WAL mode is a build option (NORMAL syncs only at
        # checkpoints); set, not assumed.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        # Registries written before the epochs table kept epochs with the placements.
        self._db.execute(
            "INSERT INTO epochs SELECT pipeline, element, epoch FROM placements WHERE true "
            "ON CONFLICT(pipeline, element) DO UPDATE SET epoch = max(epoch, excluded.epoch)"
        )
        # ... and before the mark of a run that ran (:meth:`ran`): a pipeline running now
        # ran (its status is set so once its deploy completed), one stopped is not known to.
        self._db.execute(
            "INSERT OR IGNORE INTO pipelines_ran SELECT name FROM pipelines WHERE status = ?",
            (PipelineState.RUNNING,),
        )
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

    def put_pipeline(self, spec: PipelineSpec, status: PipelineState) -> dict[str, int]:
        """Insert or replace a pipeline with the placement its spec asks for.

        Every PE gets a new epoch, above any it had in an earlier deployment of the same
        name, so instances left over from that deployment are fenced by the new ones.

        Returns:
            The new epoch of each PE.
        """
        now = time.time()
        with self._tx() as db:
            _end_unfinished(db, spec.pipeline, "abandoned: the pipeline was deployed anew", now)
            db.execute("DELETE FROM pipelines WHERE name = ?", (spec.pipeline,))
            db.execute("DELETE FROM deleted_pipelines WHERE name = ?", (spec.pipeline,))
            db.execute(
                "INSERT INTO pipelines VALUES (?, ?, ?, ?)",
                (spec.pipeline, spec.model_dump_json(), status, now),
            )
            _placeable(db, spec.pipeline, [(e.id, e.node) for e in spec.elements])
            epochs = {e.id: self._bump_epoch(db, spec.pipeline, e.id) for e in spec.elements}
            db.executemany(
                "INSERT INTO placements VALUES (?, ?, ?, ?, ?)",
                [(spec.pipeline, e.id, e.node, now, epochs[e.id]) for e in spec.elements],
            )
        return epochs

    def add_elements(
        self, pipeline: str, change: SpecChange, added: list[ElementSpec]
    ) -> dict[str, int]:
        """Change a running pipeline's spec by ``change``, which adds the ``added`` PEs
        besides the ones placed already (``fogshift scale``), and place those.

        ``change`` is applied to the spec stored now, inside the transaction that stores
        its result: two scales of different elements never lose each other's change (each
        read the spec, waited on the broker, then wrote back what it had read).

        Returns:
            The new epoch of each added PE (above any it ever had).

        Raises:
            NotFound: The pipeline is not deployed (any longer).
        """
        now = time.time()
        with self._tx() as db:
            _placeable(db, pipeline, [(e.id, e.node) for e in added])
            self._change_spec(db, pipeline, change, now)
            epochs = {e.id: self._bump_epoch(db, pipeline, e.id) for e in added}
            db.executemany(
                "INSERT OR REPLACE INTO placements VALUES (?, ?, ?, ?, ?)",
                [(pipeline, e.id, e.node, now, epochs[e.id]) for e in added],
            )
        return epochs

    def remove_elements(self, pipeline: str, change: SpecChange, removed: list[str]) -> None:
        """Change a running pipeline's spec by ``change``, which leaves out the PEs
        ``removed`` (partitions ``scale`` retired), and forget their placement. Their
        epochs stay: should one ever come back, it is fenced above every instance it had.
        ``change`` is applied as :meth:`add_elements` applies it.

        Raises:
            NotFound: The pipeline is not deployed (any longer).
        """
        with self._tx() as db:
            self._change_spec(db, pipeline, change, time.time())
            db.executemany(
                "DELETE FROM placements WHERE pipeline = ? AND element = ?",
                [(pipeline, pe) for pe in removed],
            )

    @staticmethod
    def _change_spec(db: sqlite3.Connection, pipeline: str, change: SpecChange, now: float) -> None:
        """Inside a transaction: store ``change`` of ``pipeline``'s stored spec as its spec."""
        row = db.execute("SELECT spec FROM pipelines WHERE name = ?", (pipeline,)).fetchone()
        if row is None:
            raise NotFound(f"pipeline {pipeline!r} is not deployed: its spec cannot change")
        try:
            stored = PipelineSpec.model_validate_json(row[0])
        except ValidationError as exc:  # (as get_pipeline reads it: as if absent)
            raise NotFound(
                f"pipeline {pipeline!r}: its stored spec is no longer valid, so it cannot "
                f"change (deploy it again): {one_line(str(exc))[:300]}"
            ) from exc
        spec = change(stored)
        if spec.pipeline != pipeline:  # (a change is of elements, never of the name)
            raise ValueError(f"a change of {pipeline!r}'s spec named it {spec.pipeline!r}")
        db.execute(
            "UPDATE pipelines SET spec = ?, updated = ? WHERE name = ?",
            (spec.model_dump_json(), now, pipeline),
        )

    def set_status(self, name: str, status: PipelineState, reason: str | None = None) -> None:
        """Set a pipeline's status. ``reason``: why it failed (kept with a ``failed``
        status, for :meth:`failure`; any other status forgets it). Running marks that this
        deployment ran (:meth:`ran`), until it fails or is deployed again.

        A failed pipeline ends its scales and group migrations left unfinished (nothing is
        carried on in one deployed anew after); a stopped one its group migrations (its
        PEs run where they are placed when it starts again), not its scales: a scale whose
        rescale record stands is carried on once it runs again, or its partitions would
        not match the record."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "UPDATE pipelines SET status = ?, updated = ? WHERE name = ?", (status, now, name)
            )
            db.execute("DELETE FROM pipeline_failures WHERE pipeline = ?", (name,))
            if status == PipelineState.FAILED and reason:
                db.execute(
                    "INSERT INTO pipeline_failures SELECT name, ?, ? FROM pipelines WHERE name = ?",
                    (reason, now, name),
                )
            if status == PipelineState.RUNNING:
                db.execute(
                    "INSERT OR IGNORE INTO pipelines_ran SELECT name FROM pipelines WHERE name = ?",
                    (name,),
                )
            elif status in (PipelineState.DEPLOYING, PipelineState.FAILED):
                db.execute("DELETE FROM pipelines_ran WHERE pipeline = ?", (name,))
            if status == PipelineState.FAILED:
                _end_unfinished(db, name, f"abandoned: the pipeline is {status}", now)
            elif status in (PipelineState.STOPPING, PipelineState.STOPPED):
                _end_unfinished(db, name, f"abandoned: the pipeline is {status}", now,
                                groups_only=True)  # fmt: skip

    def put_report(self, pipeline: str, element: str, kind: str, report: str) -> bool:
        """Keep ``report`` (JSON) as PE ``pipeline/element``'s last of ``kind`` (dropped
        with its pipeline: a deploy of the name again, a delete); whether it was kept (not
        if the pipeline is gone)."""
        with self._tx() as db:
            kept = db.execute(
                "INSERT OR REPLACE INTO last_reports SELECT name, ?, ?, ? FROM pipelines "
                "WHERE name = ?",
                (element, kind, report, pipeline),
            ).rowcount
        return bool(kept)

    def drop_report(self, pipeline: str, element: str, kind: str) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM last_reports WHERE pipeline = ? AND element = ? AND kind = ?",
                (pipeline, element, kind),
            )

    def reports(self, kind: str) -> dict[tuple[str, str], str]:
        """Each PE's last report of ``kind`` kept (JSON)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT pipeline, element, report FROM last_reports WHERE kind = ?", (kind,)
            ).fetchall()
        return {(str(p), str(e)): str(r) for p, e, r in rows}

    def delete_pipeline(self, name: str) -> None:
        """Forget pipeline ``name`` (stopped: see ``Deployment.delete``) — its spec,
        placement, failure, trimmed counts, kept reports and standbys — and mark it deleted
        (:meth:`deleted`) until a deploy under its name. Its epochs stay, its standbys'
        reserved too: a deploy again fences every instance it ever had. Its journal stays
        (operations are kept by id, ended).

        Raises:
            NotFound: No pipeline of that name is deployed.
        """
        with self._tx() as db:
            gone = db.execute("DELETE FROM pipelines WHERE name = ?", (name,)).rowcount
            if not gone:
                raise NotFound(f"pipeline {name!r} is not deployed: it cannot be deleted")
            _end_unfinished(db, name, "abandoned: the pipeline was deleted", time.time())
            # (Forgotten, their epochs kept reserved, as a stop does: deleted, a standby's
            # epoch was given again to the next deploy's PE, which then did not fence it.)
            db.execute(
                "UPDATE standbys SET node = NULL, updated = ? WHERE pipeline = ?",
                (time.time(), name),
            )
            db.execute(
                "INSERT OR REPLACE INTO deleted_pipelines VALUES (?, ?)", (name, time.time())
            )

    def deleted(self, name: str) -> float | None:
        """When pipeline ``name`` was deleted (this host's clock), if it was and has not been
        deployed again since: what nodes still hold of it, heard later, is discarded."""
        with self._lock:
            row = self._db.execute(
                "SELECT deleted FROM deleted_pipelines WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else float(row[0])

    def ran(self, name: str) -> bool:
        """Whether pipeline ``name``'s deployment ran: its deploy completed (or it was
        started again since), so its PEs' checkpoints are of its streams. Not of one whose
        deploy failed, nor of one an older fogshift stopped (running when this registry
        was opened, it is marked)."""
        with self._lock:
            return (
                self._db.execute(
                    "SELECT 1 FROM pipelines_ran WHERE pipeline = ?", (name,)
                ).fetchone()
                is not None
            )

    def failure(self, name: str) -> str | None:
        """Why pipeline ``name`` failed (see :meth:`set_status`), if it did and was told."""
        with self._lock:
            row = self._db.execute(
                "SELECT reason FROM pipeline_failures WHERE pipeline = ?", (name,)
            ).fetchone()
        return str(row[0]) if row else None

    def add_trimmed(self, pipeline: str, element: str, records: int, dead: int = 0) -> None:
        """Count ``records`` more data records and ``dead`` more dead letters deleted from
        the PE's stream (see ``fogshift.broker.history``); a fresh deploy of the pipeline
        starts the counts anew."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO trimmed VALUES (?, ?, ?, ?) ON CONFLICT(pipeline, element) "
                "DO UPDATE SET records = records + excluded.records, dead = dead + excluded.dead",
                (pipeline, element, records, dead),
            )

    def trimmed(self, pipeline: str) -> dict[str, tuple[int, int]]:
        """The data records and dead letters deleted so far from each PE's stream of this
        deployment."""
        with self._lock:
            rows = self._db.execute(
                "SELECT element, records, dead FROM trimmed WHERE pipeline = ?", (pipeline,)
            ).fetchall()
        return {element: (int(records), int(dead)) for element, records, dead in rows}

    def set_placement(self, pipeline: str, element: str, node: str) -> None:
        """Record that ``element`` of ``pipeline`` now runs on ``node`` (routing state)."""
        with self._tx() as db:
            _placeable(db, pipeline, [(element, node)])
            db.execute(
                "UPDATE placements SET node = ?, updated = ? WHERE pipeline = ? AND element = ?",
                (node, time.time(), pipeline, element),
            )

    @staticmethod
    def _bump_epoch(db: sqlite3.Connection, pipeline: str, element: str) -> int:
        """Inside a transaction: raise a PE's epoch above every epoch it was given, its
        standbys' too (from 1 if it never had one).

        Its standby, if any, is dropped: it is older than the new epoch now, and would be
        refused once promoted.
        """
        above = Registry._standby_epoch(db, pipeline, element)
        row = db.execute(
            "INSERT INTO epochs VALUES (?, ?, ? + 1) ON CONFLICT(pipeline, element) "
            "DO UPDATE SET epoch = max(epoch, ?) + 1 RETURNING epoch",
            (pipeline, element, above, above),
        ).fetchone()
        db.execute(
            "UPDATE standbys SET node = NULL, updated = ? WHERE pipeline = ? AND element = ?",
            (time.time(), pipeline, element),
        )
        return int(row[0])

    @staticmethod
    def _standby_epoch(db: sqlite3.Connection, pipeline: str, element: str) -> int:
        row = db.execute(
            "SELECT epoch FROM standbys WHERE pipeline = ? AND element = ?", (pipeline, element)
        ).fetchone()
        return int(row[0]) if row else 0

    # -- standbys ---------------------------------------------------------------------------

    def add_standby(self, pipeline: str, element: str, node: str) -> int:
        """Record a new standby of a PE on ``node`` (replacing any); return its epoch, above
        every epoch the PE or any of its standbys was given. The PE's own epoch stays."""
        with self._tx() as db:
            _placeable(db, pipeline, [(element, node)])
            row = db.execute(
                "SELECT epoch FROM epochs WHERE pipeline = ? AND element = ?", (pipeline, element)
            ).fetchone()
            epoch = max(int(row[0]) if row else 0, self._standby_epoch(db, pipeline, element)) + 1
            db.execute(
                "INSERT INTO standbys VALUES (?, ?, ?, ?, ?) ON CONFLICT(pipeline, element) "
                "DO UPDATE SET node = excluded.node, epoch = excluded.epoch, "
                "updated = excluded.updated",
                (pipeline, element, node, epoch, time.time()),
            )
        return epoch

    def drop_standby(self, pipeline: str, element: str, epoch: int | None = None) -> None:
        """Forget a PE's standby (only the one of ``epoch``, if given); its epoch stays
        reserved."""
        with self._tx() as db:
            db.execute(
                "UPDATE standbys SET node = NULL, updated = ? WHERE pipeline = ? AND element = ? "
                "AND (? IS NULL OR epoch = ?)",
                (time.time(), pipeline, element, epoch, epoch),
            )

    def standby(self, pipeline: str, element: str) -> StandbyRecord | None:
        """The PE's standby, if it has one."""
        return next((s for s in self.standbys(pipeline) if s.element == element), None)

    def standbys(self, pipeline: str | None = None) -> list[StandbyRecord]:
        """Every standby (of one pipeline, if given)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT pipeline, element, node, epoch, updated FROM standbys "
                "WHERE node IS NOT NULL AND (? IS NULL OR pipeline = ?) "
                "ORDER BY pipeline, element",
                (pipeline, pipeline),
            ).fetchall()
        return [StandbyRecord(*r) for r in rows]

    def next_epoch(self, pipeline: str, element: str, operation: str | None = None) -> int:
        """Bump and return the epoch of a PE: an instance started under it supersedes every
        older one.

        Args:
            operation: The journal entry whose target writes under the new epoch (it is
                recorded there in the same transaction).
        """
        with self._tx() as db:
            epoch = self._bump_epoch(db, pipeline, element)
            if operation is not None:
                db.execute(
                    "UPDATE operations SET epoch = ?, updated = ? WHERE id = ?",
                    (epoch, time.time(), operation),
                )
        return epoch

    def epoch(self, pipeline: str, element: str) -> int:
        """The newest epoch a PE was given (0 if never): never decreases."""
        with self._lock:
            row = self._db.execute(
                "SELECT epoch FROM epochs WHERE pipeline = ? AND element = ?", (pipeline, element)
            ).fetchone()
        return int(row[0]) if row else 0

    def epochs(self, pipeline: str) -> dict[str, int]:
        """The newest epoch of each PE ever deployed under the pipeline's name."""
        with self._lock:
            return dict(
                self._db.execute(
                    "SELECT element, epoch FROM epochs WHERE pipeline = ?", (pipeline,)
                ).fetchall()
            )

    def get_pipeline(self, name: str) -> PipelineRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT spec, status, updated FROM pipelines WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                return None
            placement = dict(
                self._db.execute(
                    "SELECT element, node FROM placements WHERE pipeline = ?", (name,)
                ).fetchall()
            )
        try:
            spec = PipelineSpec.model_validate_json(row[0])
        except ValidationError as exc:
            # A spec an older fogshift accepted and this one refuses (stricter checks): as if
            # absent, so that the name can be deployed again; a 500 for every request that
            # reads the registry before.
            log.error("pipeline %r: its stored spec is no longer valid, so it is left out "
                      "(deploy it again): %s", name, one_line(str(exc))[:500])  # fmt: skip
            return None
        return PipelineRecord(spec, PipelineState(row[1]), placement, float(row[2] or 0.0))

    def placed_at(self, pipeline: str, element: str) -> float | None:
        """When ``pipeline/element`` was last placed (deployed, or moved by an operation's
        routing; this host's clock); ``None`` if it is not placed."""
        with self._lock:
            row = self._db.execute(
                "SELECT updated FROM placements WHERE pipeline = ? AND element = ?",
                (pipeline, element),
            ).fetchone()
        return None if row is None else float(row[0])

    def pipelines(self) -> list[PipelineRecord]:
        with self._lock:
            names = [r[0] for r in self._db.execute("SELECT name FROM pipelines ORDER BY name")]
        records = [self.get_pipeline(n) for n in names]
        return [r for r in records if r is not None]

    # -- operations journal -----------------------------------------------------------------

    def begin_operation(
        self,
        kind: OperationKind,
        pipeline: str,
        element: str,
        origin: str,
        target: str,
        owner: str,
        phase: str,
        new_epoch: bool = False,
        epoch: int | None = None,
    ) -> Operation:
        """Record that an operation starts; with ``new_epoch`` the PE's epoch is bumped for it
        in the same transaction (a restore), with ``epoch`` it runs under that one (a
        standby's promotion: the standby's), otherwise under the PE's current one."""
        now = time.time()
        op_id = uuid.uuid4().hex[:16]
        with self._tx() as db:
            _placeable(db, pipeline, [(element, target)])
            if new_epoch:
                epoch = self._bump_epoch(db, pipeline, element)
            elif epoch is None:
                row = db.execute(
                    "SELECT epoch FROM epochs WHERE pipeline = ? AND element = ?",
                    (pipeline, element),
                ).fetchone()
                epoch = int(row[0]) if row else 0
            db.execute(
                f"INSERT INTO operations ({_OPERATION_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                (op_id, kind, pipeline, element, origin, target, epoch, phase, owner, now, now),
            )
        operation = self.operation(op_id)
        assert operation is not None
        return operation

    def advance(self, op_id: str, phase: str) -> None:
        """Record that an operation enters ``phase`` (before the phase's side effect)."""
        with self._tx() as db:
            db.execute(
                "UPDATE operations SET phase = ?, updated = ? WHERE id = ?",
                (phase, time.time(), op_id),
            )

    def route(self, op_id: str, node: str, phase: str = "routed") -> None:
        """The routing change of an operation: its PE's placement moves to ``node`` and the
        operation enters ``phase``, in one transaction (neither is ever seen without the
        other).

        The PE's epoch becomes the operation's if that is newer (a promoted standby's), and
        a standby no newer than it (the one promoted) is dropped.
        """
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT pipeline, element, epoch FROM operations WHERE id = ?", (op_id,)
            ).fetchone()
            _placeable(db, row[0], [(row[1], node)])
            db.execute(
                "UPDATE placements SET node = ?, updated = ? WHERE pipeline = ? AND element = ?",
                (node, now, row[0], row[1]),
            )
            db.execute(
                "UPDATE epochs SET epoch = max(epoch, ?) WHERE pipeline = ? AND element = ?",
                (row[2], row[0], row[1]),
            )
            db.execute(
                "UPDATE standbys SET node = NULL, updated = ? WHERE pipeline = ? AND element = ? "
                "AND epoch <= ?",
                (now, row[0], row[1], row[2]),
            )
            db.execute(
                "UPDATE operations SET phase = ?, updated = ? WHERE id = ?", (phase, now, op_id)
            )

    def finish(self, op_id: str, outcome: str) -> None:
        """Record how an operation ended; it is no longer unfinished."""
        with self._tx() as db:
            db.execute(
                "UPDATE operations SET outcome = ?, updated = ? WHERE id = ?",
                (outcome, time.time(), op_id),
            )

    def operation(self, op_id: str) -> Operation | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_OPERATION_COLUMNS} FROM operations WHERE id = ?", (op_id,)
            ).fetchone()
        return _operation(row) if row else None

    def operations(
        self, pipeline: str | None = None, element: str | None = None
    ) -> list[Operation]:
        """Journal entries, oldest first; of one pipeline and/or PE if given."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_OPERATION_COLUMNS} FROM operations "
                "WHERE (? IS NULL OR pipeline = ?) AND (? IS NULL OR element = ?) "
                "ORDER BY started, rowid",
                (pipeline, pipeline, element, element),
            ).fetchall()
        return [_operation(r) for r in rows]

    def unfinished(self) -> list[Operation]:
        """Operations without an outcome, oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_OPERATION_COLUMNS} FROM operations WHERE outcome IS NULL "
                "ORDER BY started, rowid"
            ).fetchall()
        return [_operation(r) for r in rows]

    # -- group migrations -------------------------------------------------------------------

    def begin_group(
        self,
        pipeline: str,
        elements: list[str],
        target: str,
        mode: str,
        owner: str,
        origins: dict[str, str] | None = None,
    ) -> str:
        """Journal that a group migration of ``pipeline`` starts; return its id. Unfinished
        ones of the pipeline that share a PE with it end, superseded (a carry-on of an older
        request must not move a PE back where the user no longer wants it).

        Args:
            origins: Where each PE runs as the group begins (:meth:`group_origins`)."""
        now = time.time()
        group_id = uuid.uuid4().hex[:16]
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, elements FROM groups WHERE pipeline = ? AND outcome IS NULL",
                (pipeline,),
            ).fetchall()
            for older, named in rows:
                if set(named.split(",")) & set(elements):
                    db.execute(
                        "UPDATE groups SET outcome = ?, updated = ? WHERE id = ?",
                        (f"superseded by group migration {group_id}", now, older),
                    )
            db.execute(
                f"INSERT INTO groups ({_GROUP_COLUMNS}, started, updated) "
                "VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (group_id, pipeline, ",".join(elements), target, mode, owner, now, now),
            )
            db.executemany(
                "INSERT INTO group_origins (group_id, element, origin) VALUES (?, ?, ?)",
                [(group_id, e, n) for e, n in (origins or {}).items()],
            )
        return group_id

    def group_origins(self, group_id: str) -> dict[str, str]:
        """Where each PE of the group migration ran as it began (empty: not journaled)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT element, origin FROM group_origins WHERE group_id = ?", (group_id,)
            ).fetchall()
        return dict(rows)

    def end_group(self, group_id: str, outcome: str) -> None:
        """Record how a group migration ended, unless it has already (the first stands)."""
        with self._tx() as db:
            db.execute(
                "UPDATE groups SET outcome = ?, updated = ? WHERE id = ? AND outcome IS NULL",
                (outcome, time.time(), group_id),
            )

    def supersede_groups(self, pipeline: str, element: str, by: str, owner: str) -> list[str]:
        """End the unfinished group migrations of ``pipeline`` that hold ``element`` and that
        other orchestrators than ``owner`` left, as ``superseded by {by}``: a carry-on of
        one must not move the PE back where the user no longer wants it (a single migration
        or restore asked of it since). Return their ids."""
        now = time.time()
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, elements FROM groups WHERE pipeline = ? AND outcome IS NULL "
                "AND owner != ?",
                (pipeline, owner),
            ).fetchall()
            ended = [group_id for group_id, named in rows if element in named.split(",")]
            for group_id in ended:
                db.execute(
                    "UPDATE groups SET outcome = ?, updated = ? WHERE id = ?",
                    (f"superseded by {by}", now, group_id),
                )
        return ended

    def unfinished_groups(self) -> list[GroupEntry]:
        """Group migrations without an outcome, oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_GROUP_COLUMNS} FROM groups WHERE outcome IS NULL ORDER BY started, rowid"
            ).fetchall()
        return [_group(r) for r in rows]

    def group(self, group_id: str) -> GroupEntry | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_GROUP_COLUMNS} FROM groups WHERE id = ?", (group_id,)
            ).fetchone()
        return _group(row) if row else None

    # -- scales -----------------------------------------------------------------------------

    def begin_scale(
        self, pipeline: str, element: str, partitions: int, nodes: list[str] | None,
        waves: bool, owner: str,
    ) -> ScaleEntry:  # fmt: skip
        """Journal that a scale of ``pipeline/element`` starts; an earlier one of the element
        left unfinished ends, superseded (the newer request is what the user wants now)."""
        now = time.time()
        scale_id = uuid.uuid4().hex[:16]
        with self._tx() as db:
            _end_unfinished(db, pipeline, f"superseded by scale {scale_id}", now, element)
            db.execute(
                f"INSERT INTO scales ({_SCALE_COLUMNS}, updated) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                (scale_id, pipeline, element, partitions, ",".join(nodes or ()), int(waves),
                 owner, now, now),
            )  # fmt: skip
        entry = self.scale(scale_id)
        assert entry is not None
        return entry

    def end_scale(self, scale_id: str, outcome: str) -> None:
        """Record how a scale ended, unless it has ended already (the first outcome stands:
        a superseded one's, say); it is no longer unfinished."""
        with self._tx() as db:
            db.execute(
                "UPDATE scales SET outcome = ?, updated = ? WHERE id = ? AND outcome IS NULL",
                (outcome, time.time(), scale_id),
            )

    def scale(self, scale_id: str) -> ScaleEntry | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_SCALE_COLUMNS} FROM scales WHERE id = ?", (scale_id,)
            ).fetchone()
        return _scale(row) if row else None

    def unfinished_scales(self) -> list[ScaleEntry]:
        """Scales without an outcome, oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_SCALE_COLUMNS} FROM scales WHERE outcome IS NULL ORDER BY started, rowid"
            ).fetchall()
        return [_scale(r) for r in rows]

    # -- nodes ------------------------------------------------------------------------------

    def heartbeat(self, name: str, report: Heartbeat, generation: int | None = None) -> None:
        """Record node ``name``'s heartbeat: it lives now, as ``report`` says.

        Args:
            generation: The generation of the token it came with (``None``: the operator's),
                checked in the write's own transaction: a request of the machine taken out
                that outlasted the name's new admission must not record its address.

        Raises:
            NodeRemoved: The node was removed (:meth:`remove_node`), or ``generation`` is
                not its generation.
        """
        with self._tx() as db:
            if db.execute("SELECT 1 FROM removed_nodes WHERE name = ?", (name,)).fetchone():
                raise NodeRemoved(
                    f"node {name!r} was removed from the cluster: its heartbeat is refused",
                    hint=f"`fogshift up --nodes` naming every node and {name} adds it again",
                )
            if generation is not None:
                now = _generation(db, name)
                if generation != now:
                    raise stale_generation(name, generation, now)
            db.execute(
                "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                "url = excluded.url, pid = excluded.pid, pgid = excluded.pgid, "
                "last_seen = excluded.last_seen, report = excluded.report",
                (name, report.url, report.pid, report.pgid, time.time(),
                 report.model_dump_json()),
            )  # fmt: skip

    def seen_no_later_than(self, when: float) -> None:
        """Bring every node's ``last_seen`` later than ``when`` (wall clock) back to it: the
        clock was set back, and a node's silence would count only from a time to come."""
        with self._tx() as db:
            db.execute("UPDATE nodes SET last_seen = ? WHERE last_seen > ?", (when, when))

    def remove_node(self, name: str) -> None:
        """Forget node ``name`` and refuse it from now on: its heartbeats, and every write
        that would place something there (a deploy, a route, a standby, an operation's
        target) raises :class:`UnknownNode` (see :func:`_placeable`).

        What it hosts is read in the same transaction as it is forgotten: a write placing
        something there cannot come between the check and the removal.

        Raises:
            NodeInUse: A PE of a pipeline that is deployed (deploying, running or stopping)
                or a standby is placed there, a deployed pipeline's spec names it as its
                standby node, or an unfinished migration, restore, scale or group migration
                names it (a scale that names no node may choose it); nothing changed.
        """
        with self._tx() as db:
            held = _hosted(db, name)
            if held:
                raise node_in_use(name, held)
            db.execute("DELETE FROM nodes WHERE name = ?", (name,))
            db.execute("INSERT OR REPLACE INTO removed_nodes VALUES (?, ?)", (name, time.time()))

    def holding(self, name: str, besides: Collection[tuple[str, str]] = ()) -> list[NodeHold]:
        """What keeps node ``name`` in the cluster now, as :meth:`remove_node` would refuse
        it (``[]``: nothing); the standbys of the PEs ``besides`` are not counted."""
        with self._lock:
            return _hosted(self._db, name, besides)

    def admit_node(self, name: str) -> int:
        """Let node ``name`` join again after :meth:`remove_node`: a name that was removed
        gets its next generation (see ``common.http.node_token``: the removed machine's
        tokens stay refused). Returns its generation now (``0``: never removed)."""
        with self._tx() as db:
            if db.execute("DELETE FROM removed_nodes WHERE name = ?", (name,)).rowcount:
                db.execute(
                    "INSERT INTO node_generations VALUES (?, 1) ON CONFLICT(name) "
                    "DO UPDATE SET generation = generation + 1",
                    (name,),
                )
            return _generation(db, name)

    def generations(self) -> dict[str, int]:
        """The generation of every name added again after a removal (the others: ``0``)."""
        with self._lock:
            rows = self._db.execute("SELECT name, generation FROM node_generations").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def removed_nodes(self) -> set[str]:
        with self._lock:
            rows = self._db.execute("SELECT name FROM removed_nodes").fetchall()
        return {r[0] for r in rows}

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, url, pid, pgid, last_seen, report FROM nodes ORDER BY name"
            ).fetchall()
        return [NodeRecord(r[0], r[1], r[2], r[3], r[4], _report(r[1], r[5])) for r in rows]

    def node(self, name: str) -> NodeRecord | None:
        return next((n for n in self.nodes() if n.name == name), None)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _generation(db: sqlite3.Connection, name: str) -> int:
    """Node ``name``'s generation in the registry (``0``: never added again)."""
    row = db.execute("SELECT generation FROM node_generations WHERE name = ?", (name,)).fetchone()
    return int(row[0]) if row else 0
