"""The typed contracts of everything that crosses a process boundary.

Node agent -> orchestrator (heartbeats, PE info and progress, checkpoint manifests, replica
copies), orchestrator -> CLI (status, nodes, plans, migration and restore reports, errors)
and the gates the orchestrator sets on a PE's input. Each side builds these models and
parses what it receives into them (``Model.model_validate(json)``), so a field is read as an
attribute with its type, and a payload that does not fit is refused where it arrives, naming
the field. FastAPI endpoints declare them as response models: the OpenAPI schema
(``GET /openapi.json``, with the token) describes the real API.

The field names are the JSON keys on the wire and in the CLI's ``--json`` output; the enums'
values are the strings used there. Renaming either changes the API.

This module sits in the lowest layer with ``common`` and ``events``: it imports nothing of
fogshift but its errors' root, so every layer (and a client) can use it.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints

#: The URL of another service: a node agent's in its heartbeat, a checkpoint source.
URL_RE = r"^https?://[^\s/?#]+(?:/[^\s?#]*)?$"

#: A source offset as Spark's checkpoint records it (the data source's own JSON: ``{"type":
#: "csv-rows", "row", "t0"}``, ``{"type": "ecg-windows", "event", "t0"}`` or ``{"type":
#: "jetstream", "positions": {input: seq}}``). It is
#: carried opaquely — into a gate's limit, back to the same source — and only the checkpoint
#: layer (``checkpoint.spark_dir.progress_of``) looks inside.
Offset = dict[str, Any]

_WIRE = ConfigDict(frozen=True, extra="forbid")


# -- states -----------------------------------------------------------------------------------


#: The largest integer SQLite (the registry) and Arrow keep.
INT64_MAX = 2**63 - 1


class PEState(StrEnum):
    """The state of one PE's query on a node agent."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    FAILED = "failed"
    #: A newer instance owns the output; this one is never restarted.
    FENCED = "fenced"
    STOPPED = "stopped"
    #: Removed with its checkpoint (a migration target that never started).
    DISCARDED = "discarded"


class PipelineState(StrEnum):
    """A pipeline's status in the orchestrator's registry."""

    DEPLOYING = "deploying"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class PlacementState(StrEnum):
    """What ``status`` says of a PE its node does not report."""

    #: Its node is silent (or never registered).
    NODE_LOST = "node-lost"
    #: Its node is healthy but does not run it (yet).
    PENDING = "pending"


class GateMode(StrEnum):
    """How a PE's input gate holds its reads."""

    #: Plan no new batch.
    HOLD = "hold"
    #: Read up to ``limit`` and no further.
    CAP = "cap"


class MigrationMode(StrEnum):
    """The migration procedures (``fogshift.migration.procedure``)."""

    PRECOPY = "precopy"
    LITERAL = "literal"
    #: Make-before-break: the target runs live beside the origin under the next epoch.
    HANDOVER = "handover"


class OperationKind(StrEnum):
    """What an operations-journal entry records."""

    MIGRATION = "migration"
    RESTORE = "restore"


class MigrationPhase(StrEnum):
    """A migration's journal phases, in order; each is entered before its side effect."""

    PREPARING = "preparing"
    PAUSING = "pausing"
    SWITCHING = "switching"
    ROUTED = "routed"


class RestorePhase(StrEnum):
    """A restore's journal phases, in order (``routed``: the placement moved to it)."""

    FENCING = "fencing"
    INSTALLING = "installing"
    STARTING = "starting"
    LIVE = "live"
    ROUTED = "routed"


class MigrationStatus(StrEnum):
    """How a migration stands."""

    RUNNING = "running"
    MIGRATED = "migrated"
    FAILED = "failed"


class RestoreMethod(StrEnum):
    """How a PE was restored."""

    #: From its newest central checkpoint, on a node that starts its query then.
    CHECKPOINT = "checkpoint"
    #: Its hot standby, already running on another node, took over (fence, lift the cap).
    STANDBY = "standby"


class RestoreStatus(StrEnum):
    """How a restore stands."""

    RUNNING = "running"
    RESTORED = "restored"
    FAILED = "failed"


# -- errors -----------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    """The body of every error response: a :class:`~fogshift.exceptions.FogshiftError`.

    Attributes:
        code: The error's class (``FogshiftError.code``), rebuilt on the client side.
        report: A failed migration's or restore's report, if the error is one.
    """

    model_config = _WIRE

    code: str
    message: str
    expected: str | None = None
    received: str | None = None
    hint: str | None = None
    report: MigrationReport | RestoreReport | None = None


# -- checkpoints ------------------------------------------------------------------------------


class StateStoreMetrics(BaseModel):
    """Spark's state-store metrics of one batch, summed over its stateful operators."""

    model_config = _WIRE

    commit_ms: int
    updates_ms: int
    memory_bytes: int
    rows: int
    batch_ms: int | None = None


class ManifestFile(BaseModel):
    """One file of a checkpoint: its size and content digest."""

    model_config = _WIRE

    size: int = Field(ge=0)
    sha256: str


class CheckpointManifest(BaseModel):
    """A node-level (or central) checkpoint: ``GET .../snapshots/latest``.

    Names in it are checked again, as paths, by ``checkpoint.central.check_manifest`` before
    anything is fetched or written; this model only gives it its shape. Keys it does not list
    are kept (manifests written by earlier versions, or by the central store, carry a few more).
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    type: str = "fogshift-checkpoint"
    id: str
    pipeline: str
    element: str
    batch: int | None
    offset: Offset | None = None
    #: Where a warm copy of it starts reading again (``checkpoint.spark_dir.resume_floor``).
    resume_floor: Offset | None = None
    #: The epoch of the instance it is of (``None``: written before it was recorded).
    epoch: int | None = None
    progress: int = 0
    created: float
    bytes: int = 0
    new_bytes: int | None = None
    took_ms: float | None = None
    copy_ms: float | None = None
    hash_ms: float | None = None
    state_store: StateStoreMetrics | None = None
    files: dict[str, ManifestFile]
    #: The node it was pulled from (central store only).
    node: str | None = None


class NodeCheckpoint(BaseModel):
    """The summary of a PE's newest node-level checkpoint, in its PE info."""

    model_config = _WIRE

    id: str
    batch: int | None
    progress: int
    created: float
    bytes: int
    new_bytes: int | None = None
    # What the snapshot cost (absent from manifests written before they existed).
    took_ms: float | None = None
    copy_ms: float | None = None
    hash_ms: float | None = None
    state_store: StateStoreMetrics | None = None


class AgedNodeCheckpoint(NodeCheckpoint):
    """A node-level checkpoint summary with its age, in ``GET /nodes``."""

    age_ms: float


class CentralCheckpoint(BaseModel):
    """The newest central checkpoint of a PE, in ``GET /nodes``."""

    model_config = _WIRE

    id: str
    batch: int | None
    #: The input position it resumes from: a restore reprocesses what lies beyond.
    progress: int
    age_ms: float
    bytes: int
    shipped_bytes: int | None = None


class ReplicaInfo(BaseModel):
    """The newest whole-looking checkpoint copy a node holds of one PE.

    Its ``id`` is its batch's (``checkpoint.store.snapshot_id``): a PE restored from an
    older checkpoint, or a partition added again under a retired one's id, numbers its
    batches again from below, so a copy is one checkpoint only by its ``id`` and its
    ``created`` together (:attr:`checkpoint`).
    """

    model_config = _WIRE

    pipeline: str
    element: str
    id: str
    batch: int | None
    created: float

    @property
    def checkpoint(self) -> tuple[str, float]:
        """What names the checkpoint copied: its id and when it was taken."""
        return self.id, self.created


class LeftCheckpoint(BaseModel):
    """A PE a node holds a checkpoint (or node-level snapshots) of but does not run: left by
    an instance removed while its agent was down (a restore moved the PE away from a node
    that came back with a new agent), or by a migration's target being set up.

    Attributes:
        partial: Only an unfinished install's copy is there (its agent stopped during
            the install): nothing a start could resume from.
    """

    model_config = _WIRE

    pipeline: str
    element: str
    partial: bool = False


class DroppedReplica(BaseModel):
    """Answer of ``DELETE /replicas/{pipeline}/{element}``: the copies a node held of that
    PE are gone (``held``: whether it held any), and ``blobs`` files with them."""

    model_config = _WIRE

    pipeline: str
    element: str
    held: bool
    blobs: int


class InstallResult(BaseModel):
    """Answer of ``POST .../checkpoint/install``."""

    model_config = _WIRE

    fetched_bytes: int
    #: ``central`` or the URL of the node the files came from.
    source: str


class FileChunks(BaseModel):
    """Answer of ``GET .../snapshots/{id}/chunks/{path}``: the file's size and its
    content-defined chunks (:func:`fogshift.checkpoint.chunks.file_chunks`), each
    ``[offset, length, sha256]``."""

    model_config = _WIRE

    size: int
    chunks: list[tuple[int, int, str]]


class CopyResult(BaseModel):
    """Answer of ``POST /replicas/{pipeline}/{element}``."""

    model_config = _WIRE

    fetched_bytes: int


class InstalledCheckpoint(BaseModel):
    """Answer of ``PUT .../checkpoint`` (a shipped, packed checkpoint)."""

    model_config = _WIRE

    installed_bytes: int


class CheckpointInfo(BaseModel):
    """The ``INFO_HEADER`` of ``GET .../checkpoint``: the packed copy's batch and offset."""

    model_config = ConfigDict(frozen=True, extra="allow")

    batch: int | None = None
    offset: Offset | None = None


class CheckpointRequest(BaseModel):
    """``POST .../checkpoint``: a packed copy of a PE's checkpoint, leaving out the files
    whose content the asker holds (``known``: their sha256 digests, the central store's), and
    the chunks of large files it holds (``known_chunks``)."""

    model_config = _WIRE

    warm: bool = False
    known: list[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=list, max_length=100_000
    )
    #: Content-defined chunks of the asker's large files (``checkpoint.chunks``): a large
    #: file holding some ships only its other chunks.
    known_chunks: list[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=list, max_length=100_000
    )


# -- node agent -------------------------------------------------------------------------------


class Gate(BaseModel):
    """A PE's input gate as the orchestrator sets it (``None`` elsewhere means open)."""

    model_config = _WIRE

    mode: GateMode
    #: The offset a ``cap`` gate stops at; ``None`` with ``hold``.
    limit: Offset | None = None


class ElementsChecked(BaseModel):
    """Answer of a node agent's ``POST /pipelines/{pipeline}/check``: these PEs' files, as
    this node sees them, are what they need, and their processors import and build here
    with their options (a refusal answers 422).

    Attributes:
        node: The node that checked.
        elements: The PEs whose files it checked.
    """

    model_config = _WIRE

    node: str
    elements: list[str]


class ElementInfo(BaseModel):
    """One PE on a node agent: ``GET /elements``, and each PE of a heartbeat.

    Attributes:
        state: Its query's state.
        error: Why it failed or was fenced.
        restarts: Restarts after failures.
        events_in: Input rows committed (travels with the checkpoint).
        last_batch: The last committed batch counted.
        gated: Its input gate is closed or capped.
        epoch: The epoch it writes under (fencing).
        node_checkpoint: Its newest node-level checkpoint.
        lines_written: A sink's committed output lines (``None`` for other PEs).
        snapshot_error: Why its last node-level checkpoint failed (``None``: it succeeded,
            or none was tried yet).
        retry_in_s: A ``failed`` PE whose query the agent will start again: in how many
            seconds (``0``: now). ``None``: not failed, or the agent gave up on it.
        inputs: The inputs its query reads, as it was started (``None``: not told). A
            consumer whose element gained inputs since (``scale``) is started again.
        unreadable: A ``failed`` PE whose query cannot read its checkpoint here, every start
            failing on it (a state file torn or gone): what Spark said. The orchestrator
            restores it from its central checkpoint. ``None`` otherwise.
    """

    model_config = _WIRE

    pipeline: str
    element: str
    kind: str | None = None
    inputs: list[str] | None = None
    state: PEState = PEState.STARTING
    error: str | None = None
    restarts: int = 0
    retry_in_s: float | None = None
    events_in: int = 0
    last_batch: int = -1
    gated: bool = False
    epoch: int = 0
    node_checkpoint: NodeCheckpoint | None = None
    lines_written: int | None = None
    snapshot_error: str | None = None
    unreadable: str | None = None


class StoppedCounts(BaseModel):
    """What a PE had done when its pipeline was stopped, as its node said at the stop (kept
    by the orchestrator: the nodes' reports go with the instances).

    Attributes:
        events_in: Input rows committed.
        lines_written: A sink's committed output lines (``None`` for other PEs).
        restarts: Restarts after failures.
    """

    model_config = _WIRE

    events_in: int = 0
    lines_written: int | None = None
    restarts: int = 0


class ElementProgress(ElementInfo):
    """A PE with its committed position: ``GET .../progress`` and the answers of pause,
    resume, gate and deploy.

    Attributes:
        committed_batch: The last committed batch (``None``: none yet).
        offset: Its end offset.
        progress: A number that grows with the offset (sum of positions / rows read).
        last_batch_ms: Spark's ``durationMs`` of the last batch.
    """

    committed_batch: int | None = None
    offset: Offset | None = None
    progress: int = 0
    last_batch_ms: dict[str, int] | None = None


class AgentHealth(BaseModel):
    """Answer of a node agent's ``GET /health``."""

    model_config = _WIRE

    node: str
    ready: bool
    error: str | None
    pid: int
    pgid: int


#: The most :attr:`Heartbeat.left` entries one heartbeat carries (the rest come once these
#: are discarded).
LEFT_REPORTED = 100


class Heartbeat(BaseModel):
    """Body of ``POST /nodes/{name}/heartbeat``: a node lives, what it runs and holds.

    Attributes:
        url: Where its agent is reached.
        ready: Its Spark session is up.
        error: Why its Spark session did not start.
        elements: The PEs it hosts.
        replicas: The checkpoint copies it holds.
        left: The PEs it holds checkpoints of without running them (at most
            :data:`LEFT_REPORTED`): the orchestrator discards those of PEs placed elsewhere.
        cpu_percent: Its CPU use since the last heartbeat.
        checkpoint_interval_s: How often it takes node-level checkpoints.
        snapshots_age_s: How long before this heartbeat its last round of node-level
            checkpoints ended (``None``: none yet). An age, not a time: the orchestrator's
            clock need not agree with the node's.
        disk_free_bytes: Free space on the file system of its home (checkpoints, Spark's
            state, snapshots, replicas); ``None``: not known.
        disk_total_bytes: That file system's size.
    """

    model_config = _WIRE

    url: str = Field(pattern=URL_RE, max_length=2048)
    # (Bounded: SQLite keeps 64-bit integers, and a larger one was a 500.)
    pid: int | None = Field(default=None, ge=0, le=INT64_MAX)
    pgid: int | None = Field(default=None, ge=0, le=INT64_MAX)
    ready: bool = False
    error: str | None = None
    elements: list[ElementInfo] = []
    replicas: list[ReplicaInfo] = []
    left: list[LeftCheckpoint] = Field(default=[], max_length=LEFT_REPORTED)
    cpu_percent: float | None = None
    checkpoint_interval_s: float | None = None
    snapshots_age_s: float | None = None
    disk_free_bytes: int | None = Field(default=None, ge=0, le=INT64_MAX)
    disk_total_bytes: int | None = Field(default=None, ge=0, le=INT64_MAX)

    def element(self, pipeline: str, element: str) -> ElementInfo | None:
        """The report of ``pipeline/element`` if this node runs it."""
        return next(
            (e for e in self.elements if (e.pipeline, e.element) == (pipeline, element)), None
        )


# -- operations -------------------------------------------------------------------------------


#: How a migration report's warning starts when its downtime could not be measured (a node
#: that did not answer): not measured for want of input is said otherwise.
DOWNTIME_FAILED = "downtime not measured"


class MigrationReport(BaseModel):
    """What ``fogshift migrate --json`` prints (and a failed migration's error carries).

    Attributes:
        state_bytes: Size of the checkpoint installed on the target.
        shipped_bytes: Of it, the bytes shipped from the origin (fewer when the central
            store held the rest; ``None``: nothing shipped).
        sent_bytes: Of it, the bytes sent to the target (fewer when the target held the
            rest as the PE's backup; ``None``: nothing sent).
        phases_ms: Duration of each phase (prepare, pause, state, invoke, finalize).
        prepare_ms: A precopy's or handover's ``prepare``, step by step: ``copy`` (the
            origin's checkpoint fetched and installed on the target), ``warm`` (the target
            started until it re-ran the copy's last batch: workers up, state loaded) and
            ``converge`` (its capped rounds following the origin).
        downtime_ms: From the pause until the target committed input beyond it (``None``:
            no input beyond the pause came within the wait, or none was there to process).
        caught_up_events: Events the target read beyond the copy it started from.
        rolled_back: A failed migration was undone: the origin runs again.
        epoch: The epoch the PE writes under afterwards (new if a rollback had to fence).
        warnings: What went wrong without changing the outcome.
        trace: ``[ms since start, node, committed batch, input progress, last batch ms]``.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pipeline: str
    element: str
    origin: str
    target: str
    mode: MigrationMode
    status: MigrationStatus = MigrationStatus.RUNNING
    state_bytes: int = 0
    shipped_bytes: int | None = None
    sent_bytes: int | None = None
    phases_ms: dict[str, float] = {}
    prepare_ms: dict[str, float] = {}
    downtime_ms: float | None = None
    caught_up_events: int = 0
    error: str | None = None
    rolled_back: bool = False
    epoch: int = 0
    warnings: list[str] = []
    trace: list[list[Any]] = []

    #: When the report was made: the origin of the trace's times.
    _t0: float = PrivateAttr(default_factory=time.perf_counter)

    def observe(self, node: str, info: ElementProgress) -> None:
        """Add a progress observation to the trace when it differs from the last one."""
        row = [node, info.committed_batch, info.progress, info.last_batch_ms]
        if not self.trace or self.trace[-1][1:] != row:
            self.trace.append([round((time.perf_counter() - self._t0) * 1000, 1), *row])


class GroupMigrationStatus(StrEnum):
    """How a migration of several PEs ended."""

    #: Every PE runs on the target.
    MIGRATED = "migrated"
    #: One failed; those already moved were moved back: every PE runs where it ran before.
    ROLLED_BACK = "rolled_back"
    #: One failed and moving one back failed too: ``placement`` says where each runs.
    FAILED = "failed"


class GroupMigrationReport(BaseModel):
    """Answer of ``POST /pipelines/{name}/migrate``: several PEs moved as one operation.

    Attributes:
        elements: The PEs, in the order they were moved.
        migrations: Each move towards the target, in order; a failed one is the last.
        undone: The moves back of the PEs that had reached the target, latest first.
        error: Why the operation did not complete.
        hint: What to do about it: the failed move's own hint (a target that went silent:
            the PE runs on once it answers, or is restored elsewhere).
        placement: Where each PE runs afterwards.
        already_there: PEs of ``elements`` that ran on the target already and were not
            moved (the same group asked again after it was cut short finishes it).
    """

    model_config = _WIRE

    pipeline: str
    elements: list[str]
    target: str
    mode: MigrationMode
    status: GroupMigrationStatus
    migrations: list[MigrationReport]
    undone: list[MigrationReport] = []
    error: str | None = None
    hint: str | None = None
    placement: dict[str, str]
    already_there: list[str] = []


class KeyOrder(StrEnum):
    """In which order a key move sends its keys' states: as listed, or the key whose next
    event is nearest first (PAM's look-ahead at the backlog)."""

    FIFO = "fifo"
    BACKLOG = "backlog"


class KeyMoveStatus(StrEnum):
    """``moved``: the target processes the keys; ``pending``: a move is stored (its keys
    belong to the target, which holds their events) but a state has not come yet, e.g.
    because the origin partition's node is down; it comes when that partition runs again.
    (Keys of later waves, never appended, stay with their origins: a report's ``left``.)"""

    MOVED = "moved"
    PENDING = "pending"


class KeyWave(BaseModel):
    """One wave of a key move: a move record of its own in the partitions' input.

    Attributes:
        seq: Where it is stored: its keys change owner there, for every execution.
        keys: Its keys (a key group's own record: those seen since its waves, maybe none).
    """

    model_config = _WIRE

    seq: int
    keys: list[str]


class KeyMoveReport(BaseModel):
    """Answer of ``POST /pipelines/{name}/elements/{element}/keys/migrate``.

    Attributes:
        element: The partitioned element (its partitions are ``<element>-p<i>``).
        keys: The keys to move, in the order given (a key group: its keys holding state);
            those in ``left`` did not.
        already: Keys given that the target partition owned already (nothing to move).
        origins: Each moved key's partition before the move.
        target_partition: The partition that owns them afterwards (on ``target``).
        group: ``G/N`` for a key group move (its keys seen later go there too).
        move_seq: Where the move (its first wave) is stored in the partitions' input: the
            keys change owner there, for every execution.
        waves: The moves appended, in order (a key group's own record last).
        left: Keys that did not move: an earlier wave's states did not come in time, so
            theirs was never appended (their origins keep them).
        sent: The keys in the order their states were stored.
        stoppage_ms: Per key, from its wave being stored to its state being stored: how
            long its events wait at the target (plus the target's next batch).
        done_ms: From the request to the target having committed every state.
        state_bytes: The states' size as sent at the move.
        precopied: The keys whose states were copied to the target before the move (in
            that order): at the move they sent only what changed since.
        precopy_ms: How long that copying took (``None``: no precopy asked).
        precopy_bytes: The copies' size as sent.
        stateless: Keys moved whose origin held no state of them: never seen there (a
            typo?). They moved all the same: their events from the move on go to the target.
        unseen: Keys ``already`` on the target that it holds no state of either (as of its
            newest committed batch): never seen (a typo?), or their first events not
            committed yet. ``[]`` too if the target's keys could not be read.
    """

    model_config = _WIRE

    pipeline: str
    element: str
    target: str
    target_partition: str
    order: KeyOrder
    status: KeyMoveStatus
    keys: list[str]
    already: list[str] = []
    origins: dict[str, str] = {}
    group: str | None = None
    move_seq: int
    waves: list[KeyWave] = []
    left: list[str] = []
    sent: list[str] = []
    stoppage_ms: dict[str, float] = {}
    done_ms: float | None = None
    state_bytes: int = 0
    precopied: list[str] = []
    precopy_ms: float | None = None
    precopy_bytes: int = 0
    stateless: list[str] = []
    unseen: list[str] = []
    error: str | None = None


class ScaleReport(BaseModel):
    """Answer of ``POST /pipelines/{name}/elements/{element}/scale``.

    Attributes:
        element: The partitioned element (its partitions are ``<element>-p<i>``).
        before: Its partitions before; ``after``: after.
        added: The partitions added, with their nodes.
        consumers: The PEs reading the element, restarted to read the added partitions too.
        retired: The partitions removed (scaling in), with the nodes they ran on; their
            consumers read their streams on as inputs that have ended.
        scale_seq: Where the rescale is stored in the partitions' input: every key has its
            new owner from there on, for every execution (``0``: not stored, the scale is
            pending before it).
        waves: With ``waves`` asked, the key moves ahead of the rescale: the keys in the
            state stores whose partition changes go to their partitions of the new count
            in waves, as ``migrate --keys`` moves them (a key stops only while its wave
            crosses); the rescale then moves the keys seen since.
        moved: How many keys holding state changed partition (their states moved).
        keys: Up to 1000 of them, each with its new partition.
        left: Pending before the rescale: the keys whose wave's state did not come (their
            move stands) and those of waves never appended (they stay); up to 1000.
        stoppage_ms: The longest a moved key waited for its state (from its wave or the
            rescale being stored to its state being stored).
        done_ms: From the request to every moved state being committed by its new owner.
        state_bytes: The moved states' size as sent.
        warnings: What to know that did not change the outcome (partitions of the element
            sharing a node: a key move to it must name one).
    """

    model_config = _WIRE

    pipeline: str
    element: str
    status: KeyMoveStatus
    before: int
    after: int
    added: dict[str, str] = {}
    consumers: list[str] = []
    retired: dict[str, str] = {}
    scale_seq: int = 0
    waves: list[KeyWave] = []
    moved: int = 0
    keys: dict[str, str] = {}
    left: list[str] = []
    stoppage_ms: float | None = None
    done_ms: float | None = None
    state_bytes: int = 0
    error: str | None = None
    warnings: list[str] = []


class RestoreAttempt(BaseModel):
    """A failed attempt of a restore.

    Attributes:
        epoch: The epoch it fenced with (``None``: skipped before it fenced anything).
    """

    model_config = _WIRE

    node: str
    epoch: int | None = None
    error: str


class RestoreReport(BaseModel):
    """What ``fogshift restore --json`` prints (and a failed restore's error carries).

    Attributes:
        checkpoint_source: Where the checkpoint was copied from (``central`` or
            ``replica@NODE``).
        fetched_bytes: The bytes that actually moved.
        skipped_copies: The nearer copies that failed.
        attempts: Earlier failed attempts of this restore.
        fallback: When every attempt failed: what became of the PE.
        method: From a checkpoint, or by promoting the PE's standby.
        standby_lag_events: A promoted standby: how far behind the primary's last output it
            was (what it re-derived without emitting).
        live_ms: From the restore's start until the new instance may emit new output (a
            standby's gate opened; a checkpoint restore's cap raised beyond what the old
            instance had emitted): what a restore adds to failure detection before output
            flows again.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pipeline: str
    element: str
    target: str
    status: RestoreStatus = RestoreStatus.RUNNING
    epoch: int = 0
    checkpoint: str | None = None
    checkpoint_age_ms: float | None = None
    skipped_checkpoints: list[str] = []
    checkpoint_source: str | None = None
    fetched_bytes: int = 0
    skipped_copies: list[str] = []
    state_bytes: int = 0
    reprocessed_events: int = 0
    reprocess_ms: float = 0.0
    intermediate_events: int = 0
    intermediate_ms: float = 0.0
    total_ms: float = 0.0
    error: str | None = None
    attempts: list[RestoreAttempt] = []
    fallback: str | None = None
    method: RestoreMethod = RestoreMethod.CHECKPOINT
    standby_lag_events: int = 0
    live_ms: float | None = None


class OperationRecord(BaseModel):
    """A migration or restore (restore attempt) as the operations journal last recorded it.

    Attributes:
        id: The journal entry's id (one per restore attempt).
        kind: ``migration`` or ``restore``.
        origin: Where the PE was placed when the operation began.
        target: Where the operation moves it.
        epoch: The epoch the target instance writes under (a restore's new one; a
            migration's current one, or the one it fenced with when rolling back).
        phase: The last phase entered (journaled before its side effect), e.g. ``pausing``.
        started: When it began (orchestrator's clock, seconds since the epoch).
        updated: When the journal entry last changed.
        outcome: ``None`` while it runs; then how it ended (``migrated``, ``restored``,
            ``rolled_back``, ``failed``, ``recovered: ...``).
    """

    model_config = _WIRE

    id: str
    kind: OperationKind
    pipeline: str
    element: str
    origin: str
    target: str
    epoch: int
    #: One of :class:`MigrationPhase` or :class:`RestorePhase` as the procedures journal them;
    #: a string, as the journal keeps whatever phase it is told.
    phase: str
    started: float
    updated: float
    outcome: str | None


class OperationView(OperationRecord):
    """Body of ``GET /pipelines/{name}/elements/{element}/operation``: the PE's latest
    migration or restore (restore attempt).

    Attributes:
        running: ``outcome is None``.
    """

    running: bool


# -- orchestrator -----------------------------------------------------------------------------


class OrchestratorHealth(BaseModel):
    """Answer of the orchestrator's ``GET /health``.

    Attributes:
        ok: It answers.
        nodes: Nodes it knows.
        warnings: What is wrong with it while it works: its disk (the registry and the
            central checkpoint store) nearly full.
    """

    model_config = _WIRE

    ok: bool
    nodes: int
    warnings: list[str] = []


class Ack(BaseModel):
    """Answer of a request that only needs acknowledging."""

    model_config = _WIRE

    ok: bool = True


class HeartbeatAnswer(Ack):
    """Answer of ``POST /nodes/{name}/heartbeat``.

    Attributes:
        removed: The nodes taken out of the cluster (``fogshift remove-node``) and not
            added again: the node that sent the heartbeat refuses their blob tokens from
            now on (what they copied with before their removal opens nothing while they
            stay removed).
        generations: Each node added again after a removal, with its generation now (the
            others are in generation 0): the node that sent the heartbeat refuses the blob
            tokens of their earlier generations (``common.http.blob_token``), which the
            machines taken out may hold.
    """

    removed: list[str] = []
    generations: dict[str, int] = {}


class NodeAdmission(BaseModel):
    """Answer of ``POST /nodes/{name}/admit``.

    Attributes:
        name: The node.
        generation: Its generation now: how many times it was added again after a removal
            (``0``: never removed). Its node token is ``common.http.node_token`` of it.
    """

    model_config = _WIRE

    name: str
    generation: int = Field(ge=0)


class CheckpointsView(BaseModel):
    """One PE a node runs, with its node-level and central checkpoints."""

    model_config = _WIRE

    element: str
    epoch: int | None
    node_level: AgedNodeCheckpoint | None
    central: CentralCheckpoint | None


class NodeHold(BaseModel):
    """One thing that keeps a node in the cluster: ``GET /nodes/{name}/holds``, and what
    ``DELETE /nodes/{name}`` refuses on.

    Attributes:
        kind: ``pe`` (a PE of a running pipeline placed there: `migrate` or `remove-node
            --drain` moves it), ``settling`` (a PE placed there of a pipeline being
            deployed or stopped: nothing moves it until that ends), ``standby`` (a
            deployed pipeline whose spec places its standbys there, ``recovery.standby:
            NODE``, whether one stands there now or not; or a standby that stands there
            when the keeper may not move it), ``operation`` (an unfinished migration or restore
            from or to it), ``group`` (an unfinished group migration to it) or ``scale`` (an
            unfinished scale that names it or may choose it).
        text: What it is, as the refusal says it (``PE pipeline/element``, ...).
    """

    model_config = _WIRE

    kind: Literal["pe", "settling", "standby", "operation", "group", "scale"]
    text: str


class NodeView(BaseModel):
    """One node in ``GET /nodes`` (``fogshift nodes``).

    Attributes:
        healthy: ``alive`` and ``ready``.
        alive: Heard from within the node timeout.
        ready: Its Spark session is up.
        last_seen_s: Seconds since its last heartbeat.
        replicas: ``pipeline/element@checkpoint`` of each copy it holds.
        elements: ``pipeline/element`` of each PE it runs (hot standbys among them).
        standbys: Those of ``elements`` that are a PE's hot standby there, not the PE.
        warnings: What is wrong with a node that still works: its node-level checkpoints
            failing or no longer taken (a restore would then reprocess ever more input, and
            nothing new reaches the central store), its PEs' central pulls failing, its disk
            nearly full (Spark's checkpoints fail, and the PEs with them, when it is).
        disk_free_bytes: Free space on the file system of the node's home, as of its last
            heartbeat (``None``: not told).
        disk_total_bytes: That file system's size.
    """

    model_config = _WIRE

    name: str
    url: str
    pid: int | None
    pgid: int | None
    healthy: bool
    alive: bool
    ready: bool
    error: str | None
    last_seen_s: float
    cpu_percent: float | None
    disk_free_bytes: int | None = None
    disk_total_bytes: int | None = None
    replicas: list[str]
    elements: list[str]
    checkpoints: list[CheckpointsView]
    warnings: list[str] = []
    standbys: list[str] = []

    @property
    def disk_text(self) -> str | None:
        """``12.3 of 50 GiB free`` (``370 of 400 MiB free`` on a small disk), or ``None``
        when the node did not say."""
        if self.disk_free_bytes is None or not self.disk_total_bytes:
            return None
        free, total, unit = disk_sizes(self.disk_free_bytes, self.disk_total_bytes)
        return f"{free} of {total} {unit} free"


#: Disks smaller than this are told in MiB: a fog node's small disk read "0.4 of 0 GiB free".
SMALL_DISK_BYTES = 2 << 30


def disk_sizes(free: int, total: int) -> tuple[str, str, str]:
    """``free`` and ``total`` bytes of a disk as numbers in one unit, and the unit: GiB
    (``free`` to one decimal), or whole MiB for a disk under :data:`SMALL_DISK_BYTES`."""
    if total < SMALL_DISK_BYTES:
        return f"{free / 2**20:.0f}", f"{total / 2**20:.0f}", "MiB"
    return f"{free / 2**30:.1f}", f"{total / 2**30:.0f}", "GiB"


class StandbyStatus(BaseModel):
    """A PE's hot standby (``recovery.standby``), as ``status`` shows it.

    Attributes:
        node: Where it runs.
        epoch: The epoch it writes under once promoted (newer than the primary's).
        state: What its node reports (``pending`` while it starts).
        lag_events: The primary's committed input position minus the standby's, when the
            orchestrator last raised its cap, or looked again while the standby was behind
            and the primary committed nothing new (``None``: not followed yet).
        ready_ms: How long starting it took (copy, start, warm-up).
    """

    model_config = _WIRE

    node: str
    epoch: int
    state: PEState | PlacementState
    lag_events: int | None = None
    ready_ms: float | None = None


class ElementStatus(BaseModel):
    """One PE in a pipeline's status.

    Attributes:
        state: What its node reports, or why it reports nothing (``node-lost``, ``pending``,
            or the pipeline's status).
        events_out: Records it emitted (a sink: lines written).
        planned_backup: The planner's backup node for it.
        planned_redeploy: The planner's redeploy node for it.
        last_restore: The report of its last restore (kept across orchestrator restarts,
            dropped by a deploy of the pipeline again; ``None`` while one an orchestrator
            died in is the latest: the journal has its outcome).
        inputs: The PEs it reads (the pipeline's edges).
        epoch: The epoch its instance writes under, as its node last reported (``None``:
            no report).
        last_migration: The report of its last migration (``None``: none, or one an
            orchestrator died in is the latest); kept as ``last_restore`` is.
        standby: Its hot standby, if the pipeline keeps one for it and one is up.
        standby_missing: Why it has none though its pipeline asks for one (its node not
            up, no other node to take it, being started); ``None`` otherwise.
        partition_of: For a partition of a partitioned keyed PE: the element the spec
            partitioned (``partition``: its number from 0, ``partitions``: how many).
    """

    model_config = _WIRE

    element: str
    kind: str
    node: str
    state: PEState | PlacementState | PipelineState
    events_in: int
    events_out: int
    dead_letters: int
    restarts: int
    error: str | None
    planned_backup: str | None
    planned_redeploy: str | None
    last_restore: RestoreReport | None
    inputs: list[str] = []
    epoch: int | None = None
    last_migration: MigrationReport | None = None
    standby: StandbyStatus | None = None
    standby_missing: str | None = None
    partition_of: str | None = None
    partition: int | None = None
    partitions: int | None = None


class PipelineStatus(BaseModel):
    """A pipeline's status: ``GET /pipelines/{name}`` (``fogshift status``).

    Attributes:
        error: Why a ``failed`` pipeline failed (its deploy's error), ``None`` otherwise.
        warnings: What to know of a running pipeline that does not stop it (partitions of
            one element on one node).
    """

    model_config = _WIRE

    pipeline: str
    status: PipelineState
    elements: list[ElementStatus]
    error: str | None = None
    warnings: list[str] = []


class StopResult(BaseModel):
    """Answer of ``POST /pipelines/{name}/stop``."""

    model_config = _WIRE

    pipeline: str
    status: PipelineState
    unreachable_nodes: list[str]


class DeleteResult(BaseModel):
    """Answer of ``DELETE /pipelines/{name}``: what went of a stopped pipeline.

    Attributes:
        streams: The broker streams deleted (its PEs' records and dead letters).
        nodes: The nodes that discarded what they held of it (checkpoints, node-level
            snapshots).
        unreachable_nodes: Nodes not heard now: what they hold of it is discarded once
            they are (the orchestrator remembers the deletion until a deploy of the name).
    """

    model_config = _WIRE

    pipeline: str
    streams: list[str]
    nodes: list[str]
    unreachable_nodes: list[str]


class DeadLetter(BaseModel):
    """One dead letter of ``GET /pipelines/{name}/errors``.

    Attributes:
        seq: Its input's stream sequence.
        reason: Why the PE refused it.
        event: The input event's text as it came: its JSON, or what could not be read
            as JSON (kept as text either way: a dead letter shows what the PE was given).
    """

    model_config = _WIRE

    element: str
    seq: int
    reason: str | None
    event: str


class KeyWaiting(BaseModel):
    """A key that moved in to a partition whose state has not come yet.

    Attributes:
        move: The key move whose state it waits for.
        events: The key's events held until then (processed, in order, once it comes).
    """

    model_config = _WIRE

    move: str
    events: int


class TwinEntry(BaseModel):
    """The state of one key of a PE (of the whole PE when it is not keyed).

    Attributes:
        key: The key (the ``key_by`` field's value as text); ``None`` for an unkeyed PE.
        state: The processor's snapshot for that key, as it stored it.
        partition: In a read of a whole partitioned element, the partition holding the
            key's state (a key moved by ``migrate --keys`` is not where its hash puts it);
            ``None`` otherwise.
        waiting: A key moving in whose state has not come yet (``state`` is then ``None``):
            its events are held here until it does; ``None`` otherwise.
    """

    model_config = _WIRE

    key: str | None
    state: Any
    partition: str | None = None
    waiting: KeyWaiting | None = None


class TwinState(BaseModel):
    """Answer of ``GET .../elements/{element}/state``: a stateful PE's state as of a
    committed micro-batch, read from its live state store.

    Attributes:
        node: The node whose state store was read.
        batch: The committed batch the state is as of (``None``: no batch committed yet).
        key_by: The PE's key field, ``None`` for an unkeyed PE.
        keys: How many keys hold state (all of them, also when ``entries`` is cut).
        waiting: How many keys moving in wait for their state (all of them).
        entries: The keys asked for, sorted by key, at most ``limit`` of them (the first
            ones: fewer when their stored state passes the node's page size,
            ``agent.node.TWIN_PAGE_BYTES``): those holding state, and those waiting for it
            (see :attr:`TwinEntry.waiting`).
    """

    model_config = _WIRE

    pipeline: str
    element: str
    node: str
    batch: int | None
    key_by: str | None
    keys: int
    entries: list[TwinEntry]
    waiting: int = 0


class StateKeys(BaseModel):
    """Answer of an agent's ``GET .../elements/{element}/keys``: the keys a keyed PE holds
    anything for, as of a committed micro-batch (what ``fogshift scale`` redistributes).

    Attributes:
        node: The node whose state store was read.
        batch: The committed batch read (``None``: none committed yet, no keys).
        positions: The input positions that batch ends at (``{}`` with no batch).
        keys: The keys' texts, sorted.
        sizes: Each key's stored JSON texts' length (its state fields; a key moving in
            whose state has not come: its move's few bytes): about what its state
            weighs when it moves, so a key group's move or a rescale
            sizes its waves before sending any (``{}`` from an agent that does not say).
    """

    model_config = _WIRE

    pipeline: str
    element: str
    node: str
    batch: int | None
    positions: dict[str, int]
    keys: list[str]
    sizes: dict[str, int] = Field(default_factory=dict)


class StreamEvent(BaseModel):
    """One event a PE emitted, as its output stream holds it.

    Attributes:
        seq: Its stream sequence (the offset its consumers read it at).
        epoch: The epoch of the instance that wrote it.
        stored: When the broker stored it (seconds since the epoch, the broker's clock).
        timestamp: The event's own timestamp (when its creator made it).
        creator: The PE (a source: the device) that created it.
        body: The body, decoded if it is JSON, else the text as it is.
        origin: The sequence, in the PE's input stream, of the event it came from (``None``
            for a source's events and a multi-input PE's, which come from a cut of several).
        partition: In a page of a partitioned element, the partition whose stream holds it
            (``seq`` is in that stream); ``None`` otherwise.
    """

    model_config = _WIRE

    seq: int
    epoch: int
    stored: float
    timestamp: float
    creator: str
    body: Any
    origin: int | None = None
    partition: str | None = None


class HopLatency(BaseModel):
    """A PE's newest per-hop latency: its newest output event against the input event it
    came from, both by the broker's clock (``GET /pipelines/{name}/latency``).

    Attributes:
        element: The PE (one with a single input: a multi-input PE's outputs derive from a
            cut of several inputs, not from one event).
        input: The PE it reads.
        seq: The output event's stream sequence.
        input_seq: The input event's (the output's origin).
        stored: When the output was stored (seconds since the epoch).
        latency_ms: Output stored minus input stored: reading, processing and appending,
            with the wait for the micro-batch.
    """

    model_config = _WIRE

    element: str
    input: str
    seq: int
    input_seq: int
    stored: float
    latency_ms: float


class EventPage(BaseModel):
    """Answer of ``GET .../elements/{element}/events``: a page of a PE's output events.

    Attributes:
        key: The key asked for (only events whose ``key_by`` field has it), or ``None``.
        events: The events, in stream order.
        scanned_after: The page covers the stream sequences after this one ...
        scanned_to: ... up to this one: ask again with ``after=scanned_to`` for the next page.
        last_seq: The stream's newest sequence when it was read.

    A partitioned element's page holds its partitions' newest events (each partition's
    newest ``tail`` messages scanned), merged by when the broker stored them, each naming its
    partition; sequences are each partition's own, so the three fields above are 0 (page a
    partition's stream forward by its id).
    """

    model_config = _WIRE

    pipeline: str
    element: str
    key: str | None
    events: list[StreamEvent]
    scanned_after: int
    scanned_to: int
    last_seq: int


class PlannedServer(BaseModel):
    """A node as the planner saw it."""

    model_config = _WIRE

    node: str
    cpu: float
    load: float


class Assignment(BaseModel):
    """The planned backup and redeploy node of one PE."""

    model_config = _WIRE

    backup: str | None = None
    redeploy: str | None = None
    recovery_ms: float | None = None


class PlanView(BaseModel):
    """The latest backup/redeploy plan: ``GET /plan`` (and ``PUT /topology``).

    Attributes:
        assignments: By ``pipeline/element``.
        error: Why the latest planning round kept the previous plan (``None``: it did not).
        computed_at: When the latest round ran (``None``: never).
        unknown_nodes: Names the fog topology gives that no node of the cluster has
            registered with (a typo such as ``fog_a``, or a node not started yet): their
            capacities and links are left out of the plan until one does.
        unlinked_nodes: Nodes of the cluster that a fog topology listing links gives none:
            no copy reaches them and none leaves them (their PEs' backups come only from
            the central node, if it is theirs), so the plan takes them for nothing.
        low_disk_nodes: Nodes whose disk is nearly full (``fogshift nodes`` says how full):
            the plan takes them for nothing, as nodes leaving, while two nodes or more have
            disk to spare.
        unplanned: PEs (``pipeline/element``) the latest round found no backup for, each
            with why: each keeps its previous assignment (none, if it had none, or if that
            named the node it runs on now), and the others were planned without it.
    """

    model_config = _WIRE

    method: str | None = None
    status: str | None = None
    objective_ms: float | None = None
    solve_ms: float | None = None
    servers: list[PlannedServer] = []
    assignments: dict[str, Assignment] = {}
    error: str | None = None
    computed_at: float | None = None
    unknown_nodes: list[str] = []
    unlinked_nodes: list[str] = []
    low_disk_nodes: list[str] = []
    unplanned: dict[str, str] = {}


ErrorBody.model_rebuild()
