"""The PEs a node hosts: one Structured Streaming query each, on the node's one session."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fogshift.agent.config import AgentConfig
from fogshift.agent.exceptions import CannotBuild, ElementBusy, NodeNotReady, UnknownElement
from fogshift.agent.runs import boot_id, last_run_went_down, note_start, note_stop, set_aside
from fogshift.broker.exceptions import FENCED_TOKEN
from fogshift.checkpoint import key_index
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.locations import close_location, open_location, sweep_locations
from fogshift.checkpoint.spark_dir import (
    clear_orphan_state,
    committed_batch,
    committed_offset,
    copy_checkpoint,
    end_offset,
    incoming,
    install,
    installing,
    pack,
    planned_batch,
    progress_of,
    replaced,
    settle_install,
    torn_checkpoint,
    unpack,
    unreadable_checkpoint,
)
from fogshift.checkpoint.store import (
    SnapshotPins,
    known_digests,
    latest_manifest,
    snapshot_file,
    take_snapshot,
)
from fogshift.common.files import DISK_FULL
from fogshift.common.gate import acknowledged, gate_nonce, open_gate, write_gate
from fogshift.common.names import NAME_PATTERN, pe_folder, pipeline_folder
from fogshift.common.text import one_line
from fogshift.contracts import (
    LEFT_REPORTED,
    CheckpointInfo,
    CheckpointManifest,
    ElementInfo,
    ElementProgress,
    Gate,
    KeyWaiting,
    LeftCheckpoint,
    NodeCheckpoint,
    PEState,
    StateKeys,
    TwinEntry,
    TwinState,
)
from fogshift.exceptions import FogshiftError, InvalidInput
from fogshift.runtime import crashes
from fogshift.runtime.api import Processor
from fogshift.runtime.csv_io import read_marker, reset_sink
from fogshift.runtime.engine import QueryPlan, check_processor, start_query
from fogshift.runtime.exceptions import ElementError, NoState
from fogshift.runtime.gate import end_run
from fogshift.runtime.kinds import processor_for
from fogshift.runtime.progress import ProgressFeed
from fogshift.runtime.state_reader import (
    key_sizes,
    read_jvm_key_variables,
    read_jvm_window,
    read_key_variables,
    read_state,
    read_waiting,
)
from fogshift.spec.models import ElementSpec, runs_on_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from fogshift.runtime.warm_up import Started

log = logging.getLogger("fogshift.agent")

#: A failed query is restarted after 1, 2, 4... seconds (failures in a row), at most this.
RESTART_BACKOFF_MAX_S = 30.0
#: Restarts in a row after which a PE that cannot be built stays ``failed`` (an
#: :class:`ElementError`: its class, constructor, options or ``restore()``; no event did it,
#: so restarting cannot help until someone changes the PE and deploys it again). Other
#: failures (broker or disk trouble) are retried with the backoff as long as they last.
ELEMENT_ERROR_RESTARTS = 3
#: Failures in a row, each of Spark saying the query cannot read its checkpoint (a state
#: file torn or gone: :func:`unreadable_checkpoint`), spanning at least
#: :data:`UNREADABLE_SPAN_S`, after which the PE is reported so (``unreadable``): every
#: start from that checkpoint fails, and the orchestrator restores the PE from its central
#: checkpoint. (A few such failures in a row may pass: Spark's ``UNCATEGORIZED`` load
#: failure wraps whatever the load raised, a file system's hiccup too. A restore not needed
#: costs reprocessing since the central checkpoint, never correctness.)
UNREADABLE_FAILURES = 3
UNREADABLE_SPAN_S = 5.0
#: Spark's status message while a micro-batch runs (after its offsets were got, until its
#: commit): what :meth:`NodeRuntime._stalled` times.
BATCH_RUNNING = "Processing new data"
#: How often a long-polled progress request looks at its PE's state between two of Spark's
#: progress reports (a query that starts, fails or is fenced sends none).
PROGRESS_STATE_LOOK_S = 0.05


@dataclass
class HostedElement:
    """One PE on this node and what is known about its query."""

    plan: QueryPlan
    query: StreamingQuery | None = None
    state: PEState = PEState.STARTING
    error: str | None = None
    restarts: int = 0
    gated: bool = False
    #: When the monitor may start a failed query again (``time.monotonic()``).
    retry_at: float = 0.0
    #: Failures since the query last committed a batch (drives backoff).
    failures: int = 0
    #: Of those, the :class:`ElementError` s in a row (drives giving up: broker trouble
    #: before one is no sign that the PE cannot be built).
    element_failures: int = 0
    #: ``last_batch`` when the query was last started: a later batch means it works.
    started_batch: int = -1
    #: Its query's batch after ``last_batch`` seen running since when (``(last_batch,
    #: monotonic)``; ``None``: no batch running at the last look): see :meth:`_stalled`.
    batch_since: tuple[int, float] | None = None
    #: Restarts for a batch that ran past its time limit since the query last committed
    #: one: each doubles the limit.
    stalls: int = 0
    #: Failures in a row that said its checkpoint cannot be read, and what the last said
    #: (see :data:`UNREADABLE_FAILURES`).
    unreadable_failures: int = 0
    unreadable: str | None = None
    #: When (monotonic) the first of those failed; whether the log said it was reported.
    unreadable_since: float = 0.0
    unreadable_told: bool = False
    #: The last failure logged with Spark's whole text (its one line): the same again is
    #: logged in one line (a node cut off failed its PEs every restart, each with ~200
    #: lines of stack). Cleared once a batch commits.
    failure_said: str | None = None
    events_in: int = 0
    last_batch: int = -1
    started_at: float = field(default_factory=time.time)
    #: Spark's state-store metrics of the query's recent batches, by batch id (see
    #: :func:`state_metrics`), for the node-level checkpoints' manifests.
    state_metrics: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Spark's run ids of the queries started for this PE here: only their progress counts
    #: (not that of an instance this one replaced, reported late).
    run_ids: set[str] = field(default_factory=set)
    #: Why its last node-level checkpoint failed (``None``: it succeeded, or none was tried).
    snapshot_error: str | None = None
    #: The batch its checkpoint had committed when its query was last started here (-1:
    #: none; ``None``: never started here): later batches are that run's, whose progress
    #: reports come to be counted.
    resumed_batch: int | None = None
    #: Since when (monotonic) its node-level checkpoints are put off for want of a batch's
    #: progress report (:meth:`NodeRuntime.snapshot_all`).
    uncounted_since: float | None = None
    #: The rows counted for each recent batch (the last :data:`BATCH_ROWS_KEPT`), saved
    #: with the counters: a PE started on a checkpoint older than its counters takes those
    #: batches' rows back out and counts them again as they run (:meth:`NodeRuntime._resume`).
    batch_rows: dict[int, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.plan.pipeline, self.plan.element.id)


#: The PE's counters (``events_in``, ``last_batch``, and the rows of its recent batches as
#: ``batches``), inside its checkpoint folder so that they travel with it (migration,
#: restore).
METRICS_FILE = "fogshift-metrics.json"
#: How many recent batches' row counts the counters keep: a copy's checkpoint is at most a
#: few batches older than the counters that travel with it.
BATCH_ROWS_KEPT = 64
#: How long a round of node-level checkpoints waits for the progress reports of batches its
#: PEs committed but have not counted (Spark's listener bus hands a report over after the
#: batch's commit; under load, up to seconds later), and how often it looks.
COUNT_WAIT_S, COUNT_POLL_S = 2.0, 0.05
#: How long a PE's node-level checkpoints are put off for want of such a report before one
#: is taken all the same.
UNCOUNTED_LIMIT_S = 30.0

#: The agent's exit code when its Spark JVM is gone.
JVM_GONE_EXIT = 70
#: The most stored state text (the key index's lengths) a page of twins without a key
#: collects to the agent's driver: fewer keys than asked when theirs is longer (at least
#: one). 1000 keys of 1 MiB each, all collected, passed Spark's ``maxResultSize``; as Python
#: objects a page takes a few times its text.
TWIN_PAGE_BYTES = 64 * 1024 * 1024


def jvm_exit_code() -> int | None:
    """The exit code of this process's Spark driver JVM if it has exited; ``None`` while it
    runs (or if pyspark did not start it: no gateway, or one it did not launch)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return proc.poll() if proc is not None else None


class NodeRuntime:
    """Owns the node's SparkSession and the queries of its PEs.

    Thread-safe: REST handlers, the monitor and the heartbeat call in from several threads.
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.spark: SparkSession | None = None
        self.spark_error: str | None = None
        self._elements: dict[tuple[str, str], HostedElement] = {}
        self._lock = threading.RLock()
        #: How the agent stops when its Spark JVM is gone (see :meth:`_monitor_round`).
        self._exit: Callable[[int], object] = os._exit
        #: One checkpoint install at a time per PE (see :meth:`_installing`).
        self._install_locks: dict[tuple[str, str], threading.Lock] = {}
        self._install_locks_guard = threading.Lock()
        #: One key listing or key index compaction at a time per PE (checkpoint.key_index).
        self._key_index_locks: dict[tuple[str, str], threading.Lock] = {}
        #: How many times each PE was discarded here (see :meth:`discards`).
        self._discards: dict[tuple[str, str], int] = {}
        #: Held while a discard counts itself and while an install renames its copy into
        #: place (after checking that count): a node-wide lock held only for that, so an
        #: install neither waits for another PE's deploy nor blocks one.
        self._placing = threading.Lock()
        self._stop = threading.Event()
        #: The warm-up's queries while they run (see :meth:`_warm_up`): a node stopping then
        #: stops them before its session.
        self._warming: Started | None = None
        # Every Spark control call runs on the thread that created the session: a query
        # started from another thread (e.g. a web worker) may not see the session's
        # registered Python data sources.
        self._spark_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark")
        #: Spark's progress reports of every query, pushed by Spark (see _monitor).
        self.progress_feed = ProgressFeed()
        #: Node-level checkpoints a central pull is reading: not pruned under it.
        self.pins = SnapshotPins()
        #: When the last round of node-level checkpoints ended (``time.monotonic``); its age
        #: goes into heartbeats: a round that stops coming is a node whose checkpoints stopped.
        self.snapshots_at: float | None = None

    # -- life cycle -------------------------------------------------------------------------

    @property
    def _outgoing(self) -> Path:
        """Where copies of checkpoints are packed for shipping, one folder per request."""
        return self.config.home / "outgoing"

    def start(self) -> None:
        """Start Spark (slow, ~7 s) and the monitor, in the background."""
        # Copies a process before this one was packing when it ended: no one reads them.
        shutil.rmtree(self._outgoing, ignore_errors=True)
        self._distrust_after_a_machine_stop()
        self._settle_installs()
        self._spark_thread.submit(self._start_spark)
        threading.Thread(target=self._monitor, name="monitor", daemon=True).start()
        threading.Thread(target=self.run_snapshots, name="snapshots", daemon=True).start()

    def _distrust_after_a_machine_stop(self) -> None:
        """Set the node's checkpoints aside if its machine went down while the last agent
        ran (see :mod:`fogshift.agent.runs`): without them, the orchestrator restores each
        PE from its central checkpoint (or promotes its standby), where one started from
        them failed for good, or read state that was never whole."""
        home, boot = self.config.home, boot_id()
        previous = last_run_went_down(home, boot)
        if previous is not None:
            aside = set_aside(home, ("checkpoints", "node-checkpoints"))
            if aside is not None:
                log.warning("the machine started again while this node's last agent ran "
                            "(boot %s…): its checkpoints may not all have reached the disk "
                            "(Spark syncs none); set aside in %s, its PEs are restored from "
                            "their central checkpoints", previous[:8], aside)  # fmt: skip
        # (After the set-aside: one cut short is done again at the next start.)
        note_start(home, boot)

    def _settle_installs(self) -> None:
        """Settle the checkpoint installs a process before this one ended between their two
        renames (:func:`settle_install`), before anything reads the node's checkpoints."""
        root = self.config.home / "checkpoints"
        for old in sorted(root.glob("*/*.replaced")) if root.is_dir() else ():
            target = old.with_name(old.name.removesuffix(".replaced"))
            outcome = settle_install(target)
            if outcome is not None:
                log.warning("checkpoint %s/%s: an install ended between its renames; %s",
                            target.parent.name, target.name,
                            "the checkpoint it replaced is back" if outcome
                            else "the one it replaced is removed")  # fmt: skip

    def _start_spark(self) -> None:
        from fogshift.runtime.session import build_session

        # Links a process before this one gave its queries lead nowhere now.
        sweep_locations(self.query_locations, keep=set())
        try:
            local = self.config.home / "spark-local"
            local.mkdir(parents=True, exist_ok=True)
            spark = build_session(
                self.config.name, self.config.spark_master, str(local), self.config.java_options
            )
            self.progress_feed.attach(spark)
            self.spark = spark
        except Exception as exc:  # reported through /health; the agent stays up to say so
            log.exception("spark session failed to start")
            self.spark_error = f"{type(exc).__name__}: {exc}"
            return
        if self.config.warm_up:
            self._warm_up(spark)

    def _warm_up(self, spark: SparkSession) -> None:
        """Run the node's first stateful query now, then its first state read: a PE that
        comes here later (a migration's target, a restore, a standby), or the first key
        listing or twin read of a PE here, does not pay for it.

        Only its start takes the Spark thread; its batch runs while the node is ready, and a
        PE deployed meanwhile starts at once (a node restarted with PEs to resume does not
        wait for the warm-up: their queries warm it anyway).
        """
        from fogshift.runtime import warm_up

        folder = self.config.home / "warm-up"
        started = time.monotonic()
        try:
            queries = warm_up.begin(spark, folder)
        except Exception:  # a cold first query is slower, never wrong: the node serves on
            log.exception("the warm-up queries failed to start; the first PE here starts cold")
            shutil.rmtree(folder, ignore_errors=True)
            return

        self._warming = queries

        def finish() -> None:
            try:
                warm_up.finish(queries)
            except Exception:
                if self._stop.is_set():  # stopped under it by close(): no failure of its own
                    log.info("warm-up: cut short by the node's stop")
                else:
                    log.exception("the warm-up queries failed; the first PE here may start cold")
                ran = False
            else:
                kinds = "Python and JVM" if queries.jvm is not None else "Python only"
                log.info("warm-up: the first stateful queries (%s) ran in %.1f s",
                         kinds, time.monotonic() - started)  # fmt: skip
                ran = True
            finally:
                self._warming = None
                try:
                    self._spark_thread.submit(queries.stop).result()
                except RuntimeError:  # the node is closing: close() stops them
                    pass
                except Exception:  # (its folder is still removed below)
                    log.exception("the warm-up queries could not be stopped")
            try:
                if ran and not self._stop.is_set():
                    # The node's first state read (a key listing, a twin read) paid ~1 s
                    # of code generation and class initialisation; now the warm-up does.
                    began = time.monotonic()
                    warm_up.read_back(spark, folder)
                    log.info("warm-up: its state read back in %.1f s", time.monotonic() - began)
            except Exception as exc:  # slower first state read, never a wrong one
                log.warning("warm-up: its state could not be read back (%s); the first "
                            "state read here starts cold", exc)  # fmt: skip
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        threading.Thread(target=finish, name="warm-up", daemon=True).start()

    @property
    def ready(self) -> bool:
        return self.spark is not None

    def close(self) -> None:
        """Stop every query (their checkpoints stay) and the session."""
        self._stop.set()
        with self._lock:
            for hosted in list(self._elements.values()):
                self._stop_counted(hosted)
        if self.spark is not None:
            self._spark_thread.submit(self._stop_session, self.spark).result()
        self._spark_thread.shutdown()
        note_stop(self.config.home)  # (last: what the queries wrote, synced)

    def _stop_session(self, spark: SparkSession) -> None:
        """On the Spark thread, after whatever it was doing (the warm-up's start among it):
        the warm-up's queries, then the session. A session stopped under running queries
        logged ~250 lines of their errors (a `down` right after an `up`)."""
        warming = self._warming
        if warming is not None:
            try:
                warming.stop()
            except Exception:  # the session's stop ends them anyway
                log.info("warm-up: its queries could not be stopped first", exc_info=True)
        spark.stop()

    # -- paths ------------------------------------------------------------------------------

    def checkpoint_dir(self, pipeline: str, pe: str) -> Path:
        # Names come from requests: checked, and the folder must stay inside the node's.
        return pe_folder(self.config.home / "checkpoints", pipeline, pe)

    def _reset_sink(self, pipeline: str, element: ElementSpec, epoch: int) -> None:
        """Empty a freshly deployed sink's file, its marker under ``epoch`` (fencing an
        earlier deployment's instance); one that cannot be written is refused."""
        path = element.options["path"]
        try:
            reset_sink(path, epoch, f"{pipeline}/{element.id}")
        except OSError as exc:
            raise InvalidInput(
                f"sink {element.id!r} of pipeline {pipeline!r} cannot write {path!r} on node "
                f"{self.config.name!r}: {exc.strerror or exc}",
                expected="a path to a file this node may write",
                received=f"{type(exc).__name__}: {exc}",
                hint="give the sink another `path`, or fix the folder's rights",
            ) from exc

    def _metrics_file(self, pipeline: str, pe: str) -> Path:
        # Inside the checkpoint, so the counters travel with it (migration, restore).
        return self.checkpoint_dir(pipeline, pe) / METRICS_FILE

    @property
    def query_locations(self) -> Path:
        """Where the paths Spark is given for the checkpoints live (see
        :mod:`fogshift.checkpoint.locations`)."""
        return self.config.home / "query-locations"

    def snapshot_store(self, pipeline: str, pe: str) -> Path:
        return pe_folder(self.config.home / "node-checkpoints", pipeline, pe)

    def gate_file(self, pipeline: str, pe: str) -> Path:
        return pe_folder(self.config.home / "gates", pipeline, pe).with_name(f"{pe}.json")

    # -- operations -------------------------------------------------------------------------

    def deploy(
        self,
        pipeline: str,
        element: ElementSpec,
        fresh: bool,
        gate: Gate | None = None,
        epoch: int = 0,
    ) -> ElementInfo:
        """Start ``element`` of ``pipeline`` here, resuming its local checkpoint unless ``fresh``.

        Deploying a PE that already runs here is a no-op (idempotent), unless ``fresh``.

        Args:
            gate: Start behind this gate, e.g. as a warm standby during a migration;
                ``None`` starts open.
            epoch: The epoch this instance writes under (fencing).
        """
        if self.spark is None:
            raise NodeNotReady(
                f"node {self.config.name!r} is still starting Spark",
                hint=self.spark_error or "try again in a few seconds",
            )
        key = (pipeline, element.id)
        # After any install of its checkpoint under way (one sent again while the first
        # was still running), which finds the PE running once this is done and refuses.
        with self._install_lock(pipeline, element.id), self._lock:
            current = self._elements.get(key)
            if (
                current is not None
                and not fresh
                and current.state in (PEState.RUNNING, PEState.STARTING, PEState.PAUSED)
            ):
                return self.describe(current)
            checkpoint = self.checkpoint_dir(pipeline, element.id)
            torn = None if fresh or not checkpoint.is_dir() else torn_checkpoint(checkpoint)
            if torn is not None:
                # (Refused before anything changes: the orchestrator restores the PE from
                # its central checkpoint, here or elsewhere, rather than start it again.)
                raise TornCheckpoint(
                    f"the checkpoint of {pipeline}/{element.id} on node {self.config.name!r} "
                    f"is torn: {torn}",
                    expected="a checkpoint whose logs read and whose files match the "
                    "checksums Spark wrote beside them",
                    received=torn,
                    hint="its node lost or changed what Spark wrote (a power loss, a disk's "
                    "fault?): "
                    "the reconciler restores the PE from its central checkpoint; "
                    f"`fogshift restore {pipeline} {element.id}` restores it on another node",
                )
            if current is not None:
                self._stop_counted(current)
            metrics = self._metrics_file(pipeline, element.id)
            try:
                if fresh:
                    shutil.rmtree(checkpoint, ignore_errors=True)
                    shutil.rmtree(self.snapshot_store(pipeline, element.id), ignore_errors=True)
                    # Its origins start again at 0: no event of an earlier deploy is condemned.
                    crashes.reset(crashes.folder_of(self.gate_file(pipeline, element.id)))
                    if element.role == "sink":
                        self._reset_sink(pipeline, element, epoch)
                checkpoint.mkdir(parents=True, exist_ok=True)
                gate_file = self.gate_file(pipeline, element.id)
                if gate is None:
                    open_gate(gate_file)
                else:
                    write_gate(gate_file, gate.mode, gate.limit)
            except Exception:
                # The instance stopped above is gone with its checkpoint (fresh): reported
                # STOPPED, it stayed hosted with no query for good, which nothing restarts.
                if current is not None:
                    del self._elements[key]
                raise
            plan = QueryPlan(
                pipeline=pipeline,
                element=element,
                broker_file=str(self.config.broker_file),
                checkpoint_dir=str(checkpoint),
                trigger_ms=self.config.trigger_ms,
                gate_file=str(gate_file),
                epoch=epoch,
            )
            hosted = HostedElement(plan=plan, gated=gate is not None)
            if metrics.exists():
                self._resume(hosted, json.loads(metrics.read_text()), committed_batch(checkpoint))
            self._elements[key] = hosted
            self._start_query(hosted)
            # (Operators read the node's log for what ran where, and when: it said nothing.
            # A start that failed said "cannot start" already: not "started" after it.)
            batch = committed_batch(checkpoint)
            if hosted.state == PEState.RUNNING:
                origin = (
                    "fresh" if fresh or batch is None else f"from its checkpoint at batch {batch}"
                )
                held = f", held at its gate ({gate.mode})" if gate is not None else ""
                log.info("started %s under epoch %d, %s%s", plan.query_name, epoch, origin, held)
            return self.describe(hosted)

    def _resume(self, hosted: HostedElement, saved: dict[str, Any], committed: int | None) -> None:
        """Take the counters ``saved`` with the PE's checkpoint, whose last committed batch is
        ``committed``, as they were at that batch.

        Counters can be ahead of the checkpoint they came with: a warm copy drops its last
        commit (the batch runs again where it goes), and a copy's counters file may be
        picked up after a batch committed that its commit log, listed first, left out. Those
        batches run again here, their rows maybe others than before (a warm copy's origin
        may have run batches that read nothing, whose ids the copy then gives batches that
        do): counted as before, they were never counted again (a restored classifier counted
        96 of its 384 windows for good, and Case 2's demo waited for the rest to its end).
        """
        hosted.events_in, hosted.last_batch = int(saved["events_in"]), int(saved["last_batch"])
        rows = saved.get("batches") or {}  # absent in counters written before it was kept
        hosted.batch_rows = {int(b): int(n) for b, n in rows.items()}
        floor = -1 if committed is None else committed
        if hosted.last_batch <= floor:
            return
        ahead = range(floor + 1, hosted.last_batch + 1)
        unknown = [b for b in ahead if b not in hosted.batch_rows]
        if unknown:
            log.warning("%s: counters of batches %s, run again from its checkpoint, are not "
                        "known: its input count may exceed its input by their rows",
                        hosted.plan.query_name, unknown)  # fmt: skip
        hosted.events_in -= sum(hosted.batch_rows.pop(b, 0) for b in ahead)
        hosted.last_batch = floor
        self._save_counters(hosted)

    def _save_counters(self, hosted: HostedElement) -> None:
        target = self._metrics_file(*hosted.key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        counters = {
            "events_in": hosted.events_in,
            "last_batch": hosted.last_batch,
            "batches": {str(b): n for b, n in sorted(hosted.batch_rows.items())},
        }
        tmp.write_text(json.dumps(counters))
        tmp.replace(target)

    def _start_query(self, hosted: HostedElement) -> None:
        assert self.spark is not None
        try:
            # (Inside: a disk that is full or unwritable fails the start as any other cause,
            # retried by the monitor; outside, it left the PE starting for good.)
            if clear_orphan_state(Path(hosted.plan.checkpoint_dir)):
                log.warning("%s: removed state files left without any batch in its "
                            "checkpoint", hosted.plan.query_name)  # fmt: skip
            self._close_location(hosted)  # a failed run's, before it is restarted
            if hosted.plan.gate_file:
                # Marks left by workers Spark killed (a stop, a cancelled task) are never
                # blamed for a later crash.
                crashes.prepare(crashes.folder_of(hosted.plan.gate_file))
            with self._lock:
                keep = {Path(h.plan.location) for h in self._elements.values()
                        if h.plan.location}  # fmt: skip
            if diverted := sweep_locations(self.query_locations, keep):
                log.info("%d late write(s) of stopped queries kept out of the checkpoints",
                         diverted)  # fmt: skip
            location = open_location(
                self.query_locations, Path(hosted.plan.checkpoint_dir), hosted.plan.query_name
            )
            hosted.plan = replace(hosted.plan, location=str(location))
            spark = self.spark
            resumed = committed_batch(Path(hosted.plan.checkpoint_dir))
            hosted.query = self._spark_thread.submit(start_query, spark, hosted.plan).result()
            hosted.resumed_batch = -1 if resumed is None else resumed
            hosted.run_ids.add(str(hosted.query.runId))
            hosted.state, hosted.error = PEState.RUNNING, None
            hosted.started_at = time.time()
            hosted.started_batch = hosted.last_batch
        except ElementError as exc:  # the PE cannot be built: no traceback needed
            log.error("cannot start %s: %s", hosted.plan.query_name, exc)
            self._note_unreadable(hosted, "")
            self._failed(hosted, f"{type(exc).__name__}: {exc}", element_error=True)
        except Exception as exc:  # the failure is the PE's status; the monitor retries
            log.exception("cannot start %s", hosted.plan.query_name)
            self._note_unreadable(hosted, str(exc))
            self._failed(hosted, f"{type(exc).__name__}: {exc}")

    def _note_unreadable(self, hosted: HostedElement, text: str) -> None:
        """Count a failure of the PE's query (Spark's ``text``) towards
        :data:`UNREADABLE_FAILURES` if it says the checkpoint cannot be read (not an
        exception the PE's own code raised, whatever it says); any other failure starts the
        count over."""
        said = unreadable_checkpoint(text) if python_error(text) is None else None
        if said is None:
            hosted.unreadable_failures, hosted.unreadable = 0, None
            return
        if not hosted.unreadable_failures:
            hosted.unreadable_since, hosted.unreadable_told = time.monotonic(), False
        hosted.unreadable_failures += 1
        hosted.unreadable = said
        if not hosted.unreadable_told and self._unreadable(hosted) is not None:
            hosted.unreadable_told = True
            log.error("%s: its checkpoint on node %r cannot be read (%s), %d failures in a "
                      "row: reported to the orchestrator (which restores the PE from its "
                      "central checkpoint)", hosted.plan.query_name, self.config.name, said,
                      hosted.unreadable_failures)  # fmt: skip

    @staticmethod
    def _unreadable(hosted: HostedElement) -> str | None:
        """What Spark said of the PE's checkpoint if its failures in a row make it
        unreadable (:data:`UNREADABLE_FAILURES` over :data:`UNREADABLE_SPAN_S`)."""
        if (
            hosted.unreadable_failures >= UNREADABLE_FAILURES
            and time.monotonic() - hosted.unreadable_since >= UNREADABLE_SPAN_S
        ):
            return hosted.unreadable
        return None

    def _failed(
        self, hosted: HostedElement, error: str, element_error: bool = False, text: str = ""
    ) -> None:
        """Mark the PE failed; schedule its restart, or give up on one that cannot be built.

        Restarts back off exponentially with the failures in a row (never a hot loop); an
        :class:`ElementError` is restarted :data:`ELEMENT_ERROR_RESTARTS` times at most, but
        for a full disk's (in ``error`` or in Spark's whole ``text``), which passes.
        """
        full = DISK_FULL in error or DISK_FULL in text
        element_error = element_error and not full
        hosted.failures += 1
        hosted.element_failures = hosted.element_failures + 1 if element_error else 0
        hosted.state, hosted.error = PEState.FAILED, error[:2000]
        if full:
            # (The errno alone named neither the node nor where: a probe's operator looked
            # at the network.)
            hosted.error += (
                f"\nthe disk of node {self.config.name!r} is full (its home: "
                f"{self.config.home}): free space there; the PE is retried until it runs, "
                "or restore it elsewhere (`fogshift restore`)"
            )
        if element_error and hosted.element_failures > ELEMENT_ERROR_RESTARTS:
            hosted.retry_at = math.inf
            hosted.error = (
                # (No "change it and deploy again": a deploy starts it over, state lost, and
                # a migration's target that gave up has its origin running again.)
                f"{error[:2000]}\ngave up after {hosted.element_failures - 1} restarts in a "
                f"row: it cannot be built on node {self.config.name!r}"
            )
            log.error("%s: %s", hosted.plan.query_name, hosted.error)
            return
        # (The exponent capped: 2.0 ** 1024 overflows — after ~8.5 h of failures in a row
        # — and the monitor then restarted the PE every round, the node's lock held.)
        delay = min(RESTART_BACKOFF_MAX_S, 2.0 ** min(hosted.failures - 1, 16))
        hosted.retry_at = time.monotonic() + delay  # (a clock stepped back delays nothing)

    def _stop_counted(self, hosted: HostedElement) -> None:
        """Stop the PE's query (under the lock), then count the progress reports of its
        last batches, which Spark hands over after their commits: a query started again on
        this checkpoint (a restart, a redeploy, the agent's next start) never runs those
        batches again, and their rows were never counted (a consumer restarted by a scale
        lost up to a second of them). Waits at most :data:`COUNT_WAIT_S`, for a query that
        was running only."""
        running = hosted.query is not None and hosted.state != PEState.FAILED
        self._stop_query(hosted)
        if running and self._wait_counted(hosted, time.monotonic() + COUNT_WAIT_S) is not None:
            log.warning("%s stopped before the progress report of its last batch came: its "
                        "input count may fall short of that batch's rows",
                        hosted.plan.query_name)  # fmt: skip

    def _stop_query(self, hosted: HostedElement) -> None:
        if hosted.query is not None:
            try:
                self._spark_thread.submit(hosted.query.stop).result()
            except Exception:  # a query that already died cannot be stopped twice
                log.warning("stopping %s raised", hosted.plan.query_name, exc_info=True)
            hosted.query = None
        # Stopped whatever the clean-up below raises (a disk error in the agent's home): a
        # PE left RUNNING with no query is one the monitor never looks at again.
        hosted.state = PEState.STOPPED
        self._end_run(hosted)

    def _end_run(self, hosted: HostedElement) -> None:
        """After the PE's query ended (stopped, or fenced): cut its path to the checkpoint,
        and end its run, so that the Python workers keeping its processor call on_revoke()
        and close()."""
        try:
            self._close_location(hosted)
        finally:
            if hosted.plan.gate_file:
                end_run(hosted.plan.gate_file)

    def _close_location(self, hosted: HostedElement) -> None:
        """Cut the stopped query's path to the checkpoint: what its state store still
        uploads late never reaches the PE's folder (see ``checkpoint.locations``)."""
        if hosted.plan.location:
            close_location(Path(hosted.plan.location))
            hosted.plan = replace(hosted.plan, location="")

    def hosted(self, pipeline: str, pe: str) -> HostedElement:
        """The hosted PE, or :class:`UnknownElement`."""
        hosted = self._elements.get((pipeline, pe))
        if hosted is None:
            hosts = sorted(f"{p}/{e}" for p, e in self._elements)
            raise UnknownElement(
                f"node {self.config.name!r} does not host {pipeline}/{pe}",
                expected="one of " + ", ".join(hosts[:10]) + (", …" if len(hosts) > 10 else "")
                if hosts
                else "none: it hosts no PE",
                received=f"{pipeline}/{pe}",
                hint="`fogshift status` shows where each element runs",
            )
        return hosted

    def remove(self, pipeline: str, pe: str, discard: bool = False) -> ElementInfo:
        """Stop a PE and forget it. Its checkpoint stays on disk unless ``discard``: then it
        goes with its node-level snapshots and any half-installed copy, at once. An install
        of its checkpoint under way is refused (it puts nothing in place once a discard came
        after it began: see :meth:`_installing`), so the discard need not wait for it — the
        orchestrator discards after giving up on a slow install, and a wait here would hold
        its request (and one of this agent's threads) as long as the copy takes."""
        with self._lock:
            if discard:
                # After any rename under way; every later one checks this count and refuses.
                with self._placing:
                    self._discards[(pipeline, pe)] = self.discards(pipeline, pe) + 1
            if discard and (pipeline, pe) not in self._elements:
                # A migration target that got its checkpoint but never started.
                self._discard(pipeline, pe)
                log.info("discarded what this node held of %s/%s (not running here)",
                         pipeline, pe)  # fmt: skip
                return ElementInfo(pipeline=pipeline, element=pe, state=PEState.DISCARDED)
            hosted = self.hosted(pipeline, pe)
            if discard:
                self._stop_query(hosted)
            else:
                self._stop_counted(hosted)
            del self._elements[(pipeline, pe)]
            open_gate(self.gate_file(pipeline, pe))
            if discard:
                self._discard(pipeline, pe)
            log.info("removed %s%s", hosted.plan.query_name,
                     ", its checkpoint discarded" if discard else "")  # fmt: skip
            return self.describe(hosted)

    def _discard(self, pipeline: str, pe: str) -> None:
        """Remove what this node holds of a PE that is gone from it: its checkpoint, its
        node-level snapshots (hard links that keep the state's files on disk, and that
        would stand in for another history's if the PE came back) and an unfinished
        install's copy."""
        checkpoint = self.checkpoint_dir(pipeline, pe)
        for folder in (
            checkpoint,
            self.snapshot_store(pipeline, pe),
            installing(checkpoint),
            replaced(checkpoint),
        ):
            shutil.rmtree(folder, ignore_errors=True)
        self._prune(pipeline)

    def _prune(self, pipeline: str) -> None:
        """Once this node holds nothing of ``pipeline`` — no PE of it runs here, no
        checkpoint or snapshot of it is left — remove its empty folders and its PEs' gates
        and crash marks (left for good after a delete, or a move of its last PE away).
        Called holding ``_lock`` (as a deploy, which writes a gate, does)."""
        if any(key[0] == pipeline for key in self._elements):
            return
        roots = self._pipeline_roots(pipeline)
        for root in roots:
            with contextlib.suppress(OSError):  # (not empty: something of it is still held)
                root.rmdir()
        if not any(root.exists() for root in roots):
            shutil.rmtree(pipeline_folder(self.config.home / "gates", pipeline), ignore_errors=True)

    # -- pause, resume, state ---------------------------------------------------------------

    def pause(self, pipeline: str, pe: str, timeout_s: float = 60.0) -> ElementProgress:
        """Hold the PE's input and wait until it is quiescent at a batch boundary.

        The query stays up (warm): the batch in flight commits, no new batch is planned,
        nothing is emitted afterwards. Returns the committed batch and its end offset.

        Raises:
            NodeNotReady: The PE did not reach a boundary within ``timeout_s`` (it is
                resumed again before this is raised).
        """
        hosted = self.hosted(pipeline, pe)
        gate = self.gate_file(pipeline, pe)
        checkpoint = self.checkpoint_dir(pipeline, pe)
        nonce = write_gate(gate, "hold")
        hosted.gated = True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # (A fenced or stopped query never acknowledges the gate: waited for, it held a
            # migration's pause, inside the PE's exclusive section, for the whole timeout.)
            if hosted.state in (PEState.FAILED, PEState.FENCED, PEState.STOPPED):
                break
            if gate_nonce(gate) != nonce:
                break  # opened (the orchestrator gave up and resumed it) or held anew since
            if acknowledged(gate, nonce):
                batch = committed_batch(checkpoint)
                query = hosted.query
                busy = query is not None and query.status["isTriggerActive"]
                if (
                    planned_batch(checkpoint) == batch
                    and not busy
                    and self._turn(
                        hosted,
                        (PEState.STARTING, PEState.RUNNING, PEState.PAUSED),
                        PEState.PAUSED,
                        # (Its gate still this pause's: a resume that came while this waited
                        # for the lock opened it, and PAUSED then hid a running PE.)
                        still=lambda: acknowledged(gate, nonce),
                    )
                ):
                    log.info("paused %s at batch %s", hosted.plan.query_name, batch)
                    return self._position(hosted)
            time.sleep(0.01)
        self._open(hosted, nonce)
        if hosted.state in (PEState.FAILED, PEState.FENCED, PEState.STOPPED):
            raise NodeNotReady(
                f"{pipeline}/{pe} on node {self.config.name!r} cannot pause: its query is "
                f"{hosted.state} ({hosted.error})",
                hint="it is restarted (failed), or replaced by a newer instance (fenced)",
            )
        raise NodeNotReady(
            f"{pipeline}/{pe} on node {self.config.name!r} did not reach a batch boundary "
            f"within {timeout_s:.0f} s (state {hosted.state}: {hosted.error})",
            hint="the PE was resumed; try again",
        )

    def resume(self, pipeline: str, pe: str) -> ElementProgress:
        """Open the PE's input gate again."""
        hosted = self.hosted(pipeline, pe)
        self._open(hosted)
        log.info("resumed %s", hosted.plan.query_name)
        return self._position(hosted)

    def _open(self, hosted: HostedElement, nonce: str | None = None) -> None:
        """Open the gate of ``hosted`` if it is still the instance hosted under its name (a
        pause that ended after its PE was removed and deployed anew must not open the new
        one's gate: another operation may be pausing it) and, given its ``nonce``, the gate
        is still that one's (a pause that timed out must not open a hold or cap written
        since)."""
        with self._lock:
            if self._elements.get(hosted.key) is not hosted:
                return
            if nonce is not None and gate_nonce(self.gate_file(*hosted.key)) not in (None, nonce):
                return
            open_gate(self.gate_file(*hosted.key))
            hosted.gated = False
        self._turn(hosted, (PEState.PAUSED,), PEState.RUNNING)

    def _turn(
        self, hosted: HostedElement, was: tuple[PEState, ...], now: PEState,
        still: Callable[[], bool] | None = None,
    ) -> bool:  # fmt: skip
        """Set ``hosted``'s state to ``now`` if it is one of ``was`` and ``hosted`` is still the
        instance hosted under its name; whether it did. Under the lock the monitor changes
        states under: a pause that saw its query at a boundary, then wrote PAUSED over the
        FENCED the monitor had just set, hid the fenced PE from the monitor and the
        reconciler, and the resume after made it RUNNING with no query, for good."""
        with self._lock:
            if hosted.state not in was or self._elements.get(hosted.key) is not hosted:
                return False
            if still is not None and not still():
                return False
            hosted.state = now
            return True

    def _position(self, hosted: HostedElement) -> ElementProgress:
        batch, offset = committed_offset(Path(hosted.plan.checkpoint_dir))
        last: dict[str, Any] = (hosted.query.lastProgress or {}) if hosted.query else {}
        return ElementProgress(
            **self.describe(hosted).model_dump(),
            committed_batch=batch,
            offset=offset,
            progress=progress_of(offset),
            last_batch_ms=last.get("durationMs"),
        )

    def progress(
        self,
        pipeline: str,
        pe: str,
        changed_from: tuple[int, PEState] | None = None,
        wait_s: float = 0.0,
    ) -> ElementProgress:
        """The PE's committed batch and end offset, and its query state.

        Args:
            changed_from: ``(progress, state)`` of the caller's last answer. The answer then
                waits, at most ``wait_s``, until the PE's progress or state differs from it
                (a batch committed; the query started, failed or was fenced): a long poll.
                The caller learns of a commit when Spark reports it, not at its next poll,
                and the PE's position is read once per progress report of the node's
                queries instead of once per poll (each read is ~5 ms of CPU in the agent
                and its JVM: polled every 20 ms, a quarter of a core per waiting caller).
        """
        deadline = time.monotonic() + wait_s
        while True:
            # Counted before the position is read: a report that comes in between ends the
            # wait below at once instead of being missed.
            seen = self.progress_feed.arrivals
            hosted = self.hosted(pipeline, pe)
            info = self._position(hosted)
            if changed_from is None or (info.progress, info.state) != changed_from:
                return info
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return info
                look = min(left, PROGRESS_STATE_LOOK_S)
                if self.progress_feed.wait_beyond(seen, look) > seen:
                    break
                if self._elements.get((pipeline, pe)) is not hosted:
                    break
                if hosted.state != changed_from[1]:
                    break

    def checkpoint(
        self,
        pipeline: str,
        pe: str,
        warm: bool,
        known: frozenset[str] = frozenset(),
        known_chunks: frozenset[str] = frozenset(),
    ) -> tuple[bytes, str, CheckpointInfo]:
        """A consistent copy of the PE's checkpoint, packed: ``(archive, sha256, info)``.

        Args:
            warm: Drop the last commit, so a query started on the copy re-executes (and
                emits nothing for) the last batch — see :func:`copy_checkpoint`.
            known: sha256 digests of files the asker holds: left out (:func:`pack`).
            known_chunks: sha256 digests of chunks of large files the asker holds: a large
                file holding some ships only its others (:func:`pack`).
        """
        hosted = self.hosted(pipeline, pe)
        deadline = time.monotonic() + COUNT_WAIT_S
        source = self.checkpoint_dir(pipeline, pe)
        # A folder of its own per request: two copies of one PE at once (a request sent
        # again while the first is still packed) would remove and refill each other's.
        staging = self._outgoing / pipeline / f"{pe}.{uuid.uuid4().hex[:12]}"
        try:
            # Linked, not copied: the staging copy is only read (packed), then removed.
            info = copy_checkpoint(source, staging, warm=warm, link=True)
            # Its counters must cover its last commit: the batches up to it never run
            # again where it goes (a warm copy runs only its last busy batch again), and
            # reports come up to a second after their batch (counted by the monitor). The
            # copy is checked, not the live counters: a warm copy's origin runs on.
            while not self._counted_in(hosted, staging):
                if time.monotonic() >= deadline:
                    log.warning("copy of %s made before the progress reports of its last "
                                "batches came: its input count may fall short of their rows",
                                hosted.plan.query_name)  # fmt: skip
                    break
                time.sleep(COUNT_POLL_S)
                with self._lock:
                    self._count_queued()
                info = copy_checkpoint(source, staging, warm=warm, link=True)
            # The newest node-level snapshot links the same files: their digests are known.
            # (Looked up after the copy: an inode both hold then is one file, never a reuse.)
            asks = known or known_chunks
            hashed = known_digests(self.snapshot_store(pipeline, pe)) if asks else None
            data, digest = pack(staging, known, hashed, known_chunks)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return data, digest, CheckpointInfo.model_validate(info)

    def install_checkpoint(
        self, pipeline: str, pe: str, data: bytes, digest: str, discards: int | None = None
    ) -> None:
        """Install a shipped checkpoint as the PE's local one (the PE must not run here).

        Args:
            discards: :meth:`discards` when the caller began (before it received the copy).

        Raises:
            ElementBusy: The PE runs here, or was discarded since ``discards``.
        """
        self._not_running(pipeline, pe)
        with self._installing(pipeline, pe, discards) as place:
            unpack(data, digest, self.checkpoint_dir(pipeline, pe), place)

    def discards(self, pipeline: str, pe: str) -> int:
        """How many times the PE was discarded here since the agent started: an install
        that fetched its copy first (``install_from_store(discards=)``) is refused if this
        changed meanwhile."""
        return self._discards.get((pipeline, pe), 0)

    def install_from_store(
        self,
        pipeline: str,
        pe: str,
        store: CentralStore,
        manifest: dict[str, Any] | None,
        discards: int | None = None,
    ) -> None:
        """Install a checkpoint held in a content-addressed ``store`` as the PE's local one.

        Args:
            manifest: The checkpoint (its blobs must be in ``store`` and whole); ``None``
                removes the local checkpoint, so the PE starts from the beginning.
            discards: :meth:`discards` when the caller began (fetching the copy).

        Raises:
            ElementBusy: The PE runs here, or was discarded since ``discards``: the
                orchestrator gave up on this install (it timed out) and took back what it
                had asked, which the install must not put in place after it.
        """
        self._not_running(pipeline, pe)
        target = self.checkpoint_dir(pipeline, pe)
        with self._installing(pipeline, pe, discards) as place:
            if manifest is None:
                shutil.rmtree(target, ignore_errors=True)
                return
            staging = incoming(target)
            store.materialize(manifest, staging)
            staging.mkdir(exist_ok=True)  # a checkpoint may have no files yet
            place(staging, target)

    @contextlib.contextmanager
    def _installing(
        self, pipeline: str, pe: str, discards: int | None = None
    ) -> Iterator[Callable[[Path, Path], None]]:
        """Around an install of the PE's checkpoint, one at a time per PE: a request sent
        again (its first got no answer in time) shared the first's staging folder, each
        emptying it for itself, and the PE could start on a checkpoint missing files.

        Yields what puts the assembled copy in place: it refuses (:class:`ElementBusy`) if
        the PE was discarded here since ``discards`` (:meth:`discards` when the caller
        began, e.g. before fetching the copy; by default on entry). The check and the
        renames hold ``_placing``, as a discard's count does: a discard that came during
        the copy (removing the staging folder under it) never finds a torn copy renamed
        into place after it, nor leaves a whole one on a node not running the PE.

        A failed install leaves no half-made copy (a disk that filled up stays full
        otherwise: nothing else removes it); a done one drops the node-level snapshots of the
        checkpoint it replaced, of another history or an earlier point (they would stand in
        for it until it passed their batch)."""
        since = self.discards(pipeline, pe) if discards is None else discards

        @contextlib.contextmanager
        def renames() -> Iterator[None]:
            with self._placing:
                self._not_discarded(pipeline, pe, since)
                yield

        def place(staging: Path, target: Path) -> None:
            install(staging, target, renames())

        with self._install_lock(pipeline, pe):
            # (Asked again under the lock: a deploy waits for it, and one that ran while
            # this install waited for an earlier one must not have its checkpoint replaced.)
            self._not_running(pipeline, pe)
            self._not_discarded(pipeline, pe, since)
            try:
                yield place
            except BaseException:
                shutil.rmtree(installing(self.checkpoint_dir(pipeline, pe)), ignore_errors=True)
                # (A copy whose folder a discard removed under it fails on a missing file:
                # said as the refusal it is.)
                self._not_discarded(pipeline, pe, since)
                raise
            shutil.rmtree(self.snapshot_store(pipeline, pe), ignore_errors=True)

    def _not_discarded(self, pipeline: str, pe: str, since: int) -> None:
        if self.discards(pipeline, pe) != since:
            raise ElementBusy(
                f"{pipeline}/{pe} was discarded on node {self.config.name!r} while its "
                "checkpoint was copied here: not installed",
                hint="the operation that asked for it gave up; ask again if it still wants it",
            )

    def _install_lock(self, pipeline: str, pe: str) -> threading.Lock:
        """The lock of the PE's checkpoint installs (and of its deploys, which wait for one)."""
        # (Not under the node's lock, which a deploy holds while its query starts.)
        with self._install_locks_guard:
            return self._install_locks.setdefault((pipeline, pe), threading.Lock())

    def _key_index_lock(self, pipeline: str, pe: str) -> threading.Lock:
        """The lock of the PE's key listings and key index compactions."""
        with self._install_locks_guard:
            return self._key_index_locks.setdefault((pipeline, pe), threading.Lock())

    def _not_running(self, pipeline: str, pe: str) -> None:
        if (pipeline, pe) in self._elements:
            raise ElementBusy(
                f"{pipeline}/{pe} already runs on node {self.config.name!r}",
                hint="a checkpoint can only be installed for a PE this node does not run",
            )

    def set_gate(self, pipeline: str, pe: str, gate: Gate | None) -> ElementProgress:
        """Replace the PE's gate (``None`` opens it)."""
        hosted = self.hosted(pipeline, pe)
        if gate is None:
            return self.resume(pipeline, pe)
        write_gate(self.gate_file(pipeline, pe), gate.mode, gate.limit)
        hosted.gated = True
        return self._position(hosted)

    def check_build(self, pipeline: str, element: ElementSpec) -> None:
        """Import and build processor ``element`` of ``pipeline`` once, as its start would
        (:func:`~fogshift.runtime.engine.check_processor`), without starting anything.

        Raises:
            CannotBuild: It cannot be built here (its class does not import, has no
                ``process()``, refuses its options, or took too long).
        """
        plan = QueryPlan(
            pipeline=pipeline,
            element=element,
            broker_file=str(self.config.broker_file),
            checkpoint_dir=str(self.checkpoint_dir(pipeline, element.id)),
        )
        try:
            check_processor(plan)
        except ElementError as exc:
            raise CannotBuild(
                f"{pipeline}/{element.id} cannot be built on node {self.config.name!r}: "
                f"{exc.message}",
                expected=exc.expected or "a processor that imports and builds with its options",
                received=exc.received,
                hint=exc.hint or "fix the processor or its options, then deploy again",
            ) from exc

    def remove_pipeline(self, pipeline: str, discard: bool = False) -> list[ElementInfo]:
        """Stop every PE of ``pipeline`` on this node. With ``discard`` (the pipeline is
        deleted), also discard everything this node holds of it: the checkpoints and
        node-level snapshots of the PEs it ran here before, listed as ``left``."""
        with self._lock:
            keys = [k for k in self._elements if k[0] == pipeline]
            removed = [self.remove(*k, discard=discard) for k in keys]
            if discard:
                held = {e for root in self._pipeline_roots(pipeline) for e in _pe_names(root)}
                removed += [self.remove(pipeline, pe, discard=True) for pe in sorted(held)]
            return removed

    def _pipeline_roots(self, pipeline: str) -> list[Path]:
        """The folders this node keeps ``pipeline``'s PEs' checkpoints and node-level
        snapshots in (as :meth:`left` reads them)."""
        # (checked: names come from requests, and must stay inside the node's folder)
        return [pipeline_folder(self.config.home / root, pipeline)
                for root in ("checkpoints", "node-checkpoints")]  # fmt: skip

    def _stateful(self, pipeline: str, pe: str) -> tuple[ElementSpec, type[Processor]]:
        """The PE's spec and processor class, once it is known to hold state here.

        Raises:
            UnknownElement: The PE does not run here.
            NoState: It holds no state (a source, a sink, a stateless processor).
            NodeNotReady: The node's Spark session is not up yet.
        """
        element = self.hosted(pipeline, pe).plan.element
        stateless = NoState(
            f"{pipeline}/{pe} on node {self.config.name!r} holds no state: it is "
            + (
                f"a processor of kind {element.kind!r}, without state fields"
                if element.role == "processor"
                else f"a {element.role} ({element.kind})"
            ),
            expected="a stateful processor (window-aggregate, bandpass, classify, or a custom "
            "one with state)",
            received=f"{pe!r}, kind {element.kind!r}",
            hint="`fogshift status PIPELINE` lists the elements and their kinds",
        )
        if element.role != "processor":
            raise stateless
        cls, _ = processor_for(element.kind, dict(element.options))
        if not cls.is_stateful():
            raise stateless
        if self.spark is None:
            raise NodeNotReady(f"node {self.config.name!r} is still starting Spark")
        return element, cls

    def twin_state(
        self, pipeline: str, pe: str, key: str | None = None, limit: int = 1000
    ) -> TwinState:
        """The PE's state per key, as of its newest committed batch (see ``state_reader``).

        Raises:
            UnknownElement: The PE does not run here.
            NoState: It holds no state (a source, a sink, a stateless processor), or a
                ``key`` was asked of a PE that keeps no state per key.
            NodeNotReady: The node's Spark session is not up yet.
        """
        element, cls = self._stateful(pipeline, pe)
        assert self.spark is not None
        keyed = element.key_by is not None
        if key is not None and not keyed:
            # (The key was dropped: the whole state came back, under no key, said nothing.)
            raise _no_key(pipeline, pe, element, f"key {key!r} asked")
        batch: int | None
        states: dict[str | None, Any]
        # A page of a large keyed state: its first ``limit`` keys by the key index (when it
        # covers the newest commit: no Spark job), fewer if their state is longer than
        # ``TWIN_PAGE_BYTES``, the others never collected (1000 keys of 1 MiB each, all
        # read, passed Spark's maxResultSize). A small one: one job, as is.
        at, indexed = self._indexed_keys(pipeline, pe) if keyed and key is None else (None, None)
        if keyed and key is None and indexed is None and at is not None:
            # The index does not cover the newest commit (a PE resumed from a copy): its
            # keys from the state store (their lengths only, one job) give it its base, and
            # the page is read by its keys. All the state was read for one page before.
            self.state_keys(pipeline, pe)
            at, indexed = self._indexed_keys(pipeline, pe)
        only = _page(indexed, limit) if indexed is not None else None
        at = at if only is not None else None  # (the page read at the batch it was listed at)
        if runs_on_jvm(element):
            batch, states = read_jvm_window(
                self.spark, self.checkpoint_dir(pipeline, pe), keyed, key if keyed else None,
                only, at,
            )  # fmt: skip
        else:
            batch, states = read_state(
                self.spark,
                self.checkpoint_dir(pipeline, pe),
                cls.state_parts(),
                keyed,
                key if keyed else None,
                only,
                at,
                cls.added_parts(),
            )
        waiting = (
            read_waiting(
                self.spark, self.checkpoint_dir(pipeline, pe), batch, key if keyed else None
            )
            if element.moves_keys
            else {}
        )
        entries = [TwinEntry(key=k, state=v) for k, v in states.items()]
        entries += [
            TwinEntry(key=k, state=None, waiting=KeyWaiting(move=move, events=events))
            for k, (move, events) in waiting.items()
            # (A page is a prefix of the keys: not one waiting past the page's last.)
            if only is None or k <= only[-1]
        ]
        entries.sort(key=lambda e: e.key or "")
        return TwinState(
            pipeline=pipeline,
            element=pe,
            node=self.config.name,
            batch=batch,
            key_by=element.key_by,
            keys=len(indexed) if only is not None and indexed is not None else len(states),
            waiting=len(waiting),
            entries=entries[:limit],
        )

    def _indexed_keys(self, pipeline: str, pe: str) -> tuple[int | None, dict[str, int] | None]:
        """The newest committed batch of a keyed PE and the keys holding state as of it with
        their stored state's length, by its key index alone (keys ``None``: the index does
        not cover that batch; no Spark job is run)."""
        checkpoint = self.checkpoint_dir(pipeline, pe)
        with self._key_index_lock(pipeline, pe):
            batch = committed_batch(checkpoint)
            variables = key_index.read(key_index.folder_of(checkpoint), batch)
        if variables is None:
            return batch, None
        # (A key that only waits for its move's state holds ``held`` alone: no state yet.)
        return batch, {
            k: sum(v for v in names.values())
            for k, names in variables.items()
            if any(n != "held" for n in names)
        }

    def state_keys(self, pipeline: str, pe: str) -> StateKeys:
        """The keys a keyed PE holds anything for, as of its newest committed batch (see
        ``state_reader.read_keys``).

        Raises:
            UnknownElement: The PE does not run here.
            NoState: It is not a keyed stateful processor.
            NodeNotReady: The node's Spark session is not up yet.
        """
        element, cls = self._stateful(pipeline, pe)
        assert self.spark is not None
        if element.key_by is None:
            raise _no_key(pipeline, pe, element, f"on node {self.config.name!r}")
        checkpoint = self.checkpoint_dir(pipeline, pe)
        index = key_index.folder_of(checkpoint)
        hosted = self._elements.get((pipeline, pe))
        with self._key_index_lock(pipeline, pe):
            # From the key index when it covers the newest commit (a few small files);
            # else from the state store (a Spark job), which then gives the index its base.
            batch = committed_batch(checkpoint)
            variables = key_index.read(index, batch)
            if variables is not None and batch is not None:
                end: dict[str, Any] | None = end_offset(checkpoint, batch)
            else:
                if runs_on_jvm(element):
                    batch, end, variables = read_jvm_key_variables(self.spark, checkpoint)
                else:
                    batch, end, variables = read_key_variables(
                        self.spark, checkpoint, cls.state_parts(), element.moves_keys,
                        cls.added_parts(),
                    )  # fmt: skip
                with self._lock:
                    # Not if the PE was deployed afresh (or installed) while the state
                    # store was read: the old history's base would stand for the new
                    # one's batch of that number. (A deploy replaces it under the lock.)
                    if batch is not None and self._elements.get((pipeline, pe)) is hosted:
                        key_index.write_base(index, batch, variables)
        sizes = key_sizes(variables)
        positions = {k: int(v) for k, v in ((end or {}).get("positions") or {}).items()}
        return StateKeys(pipeline=pipeline, element=pe, node=self.config.name, batch=batch,
                         positions=positions, keys=list(sizes), sizes=sizes)  # fmt: skip

    # -- reporting --------------------------------------------------------------------------

    def describe(self, hosted: HostedElement) -> ElementInfo:
        """What is known of one hosted PE (its PE info)."""
        element = hosted.plan.element
        snap = latest_manifest(self.snapshot_store(hosted.plan.pipeline, element.id))
        sink = element.role == "sink"
        return ElementInfo(
            pipeline=hosted.plan.pipeline,
            element=element.id,
            kind=element.kind,
            inputs=list(element.inputs),
            state=hosted.state,
            error=hosted.error,
            restarts=hosted.restarts,
            retry_in_s=(
                round(max(0.0, hosted.retry_at - time.monotonic()), 1)
                if hosted.state == PEState.FAILED and math.isfinite(hosted.retry_at)
                else None
            ),
            events_in=hosted.events_in,
            last_batch=hosted.last_batch,
            gated=hosted.gated,
            epoch=hosted.plan.epoch,
            # The manifest's summary; what the snapshot cost is absent from manifests
            # written before it was recorded (those fields default to None).
            node_checkpoint=(
                NodeCheckpoint.model_validate(
                    {k: snap.get(k) for k in NodeCheckpoint.model_fields if k in snap}
                )
                if snap
                else None
            ),
            lines_written=self._lines_written(element) if sink else None,
            snapshot_error=hosted.snapshot_error,
            unreadable=self._unreadable(hosted) if hosted.state == PEState.FAILED else None,
        )

    def _lines_written(self, element: ElementSpec) -> int | None:
        """The lines a sink's marker counts; ``None`` if it cannot be read now (on shared
        storage: a fault, a folder in its place), which must not fail the node's heartbeat."""
        try:
            return int(read_marker(element.options["path"])["lines"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("the marker of sink %s cannot be read: %s", element.id, exc)
            return None

    def elements(self) -> list[ElementInfo]:
        """What runs here, for heartbeats and ``GET /elements``.

        Taken without the node's lock: a query start holds it for seconds (tens under
        load), and a heartbeat that waited behind it would make a busy node look lost to
        the orchestrator. A copy of the table (one step under the GIL) is consistent
        enough: each PE's fields are read as they are at that moment.
        """
        hosted = list(self._elements.values())
        return [self.describe(h) for h in hosted]

    def left(self) -> list[LeftCheckpoint]:
        """The PEs this node holds a checkpoint or node-level snapshots of without running
        them (for heartbeats, at most :data:`LEFT_REPORTED`): what an instance removed while
        the agent was down left, for the orchestrator to discard if the PE runs elsewhere.
        One holding only an unfinished install's copy is ``partial``: nothing to resume."""
        running = set(self._elements)
        found: dict[tuple[str, str], bool] = {}  # -> only an unfinished install's copy
        for root in (self.config.home / "checkpoints", self.config.home / "node-checkpoints"):
            for folder in sorted(root.glob("*/*")) if root.is_dir() else ():
                # (an unfinished install's copy counts for its PE; anything else not named
                # as a PE is, is not one)
                incoming = folder.name.endswith(".incoming")
                key = (folder.parent.name, folder.name.removesuffix(".incoming"))
                if (
                    key in running
                    or not folder.is_dir()
                    or not all(NAME_PATTERN.fullmatch(n) for n in key)
                ):
                    continue
                if key not in found and len(found) == LEFT_REPORTED:
                    continue
                found[key] = found.get(key, True) and incoming
        return [LeftCheckpoint(pipeline=p, element=e, partial=only)
                for (p, e), only in found.items()]  # fmt: skip

    # -- monitor ----------------------------------------------------------------------------

    def _monitor(self) -> None:
        while not self._stop.wait(1.0):
            self._monitor_round()

    def _monitor_round(self) -> None:
        """One look at every PE; first, whether the node's Spark JVM still runs.

        A JVM that exited (killed for memory, crashed) leaves the agent answering and its
        PEs "running" in every heartbeat, while no query runs: nothing would ever restore
        them. The agent stops then (fail-stop): the node goes silent, its PEs are restored
        elsewhere, and `fogshift up` starts it again."""
        if self.spark is not None and (code := jvm_exit_code()) is not None:
            log.critical("the node's Spark JVM exited (code %s): the agent stops, so that its "
                         "PEs are restored elsewhere", code)  # fmt: skip
            self._exit(JVM_GONE_EXIT)
            return
        with self._lock:
            self._count_queued()
            for hosted in list(self._elements.values()):
                try:
                    self._check(hosted)
                except Exception:  # the monitor must survive any one PE's trouble
                    log.exception("monitor failed on %s", hosted.plan.query_name)

    def _count_queued(self) -> None:
        """Count the progress reports Spark has queued since the last call (under the lock):
        every second by the monitor, and before every node-level snapshot."""
        reports = self.progress_feed.drain()
        for hosted in list(self._elements.values()):
            try:
                self._count(hosted, _reports_of(hosted, reports))
            except Exception:  # as in the monitor: one PE's trouble stops no other
                log.exception("counting the progress of %s failed", hosted.plan.query_name)

    def _check(self, hosted: HostedElement, reports: Sequence[dict[str, Any]] = ()) -> None:
        """Count ``reports`` (Spark's progress of the PE's query since the last check), and
        restart a failed query when its backoff has elapsed."""
        self._count(hosted, reports)
        query = hosted.query
        if hosted.state == PEState.FAILED:
            if time.monotonic() >= hosted.retry_at and self.spark is not None:
                hosted.restarts += 1
                log.warning("restarting %s (try %d)", hosted.plan.query_name, hosted.restarts)
                self._start_query(hosted)
            return
        if query is None:
            return
        if hosted.last_batch > hosted.started_batch:
            # It committed a batch: it works.
            hosted.failures = hosted.element_failures = hosted.stalls = 0
            hosted.unreadable_failures, hosted.unreadable = 0, None
            hosted.failure_said = None
        if hosted.plan.gate_file and hosted.plan.element.role == "processor":
            self._stop_overrunning(hosted)
        if self._stalled(hosted, query):
            return
        if not query.isActive:
            error = query.exception()
            text = str(error) if error else "query stopped by itself"
            if FENCED_TOKEN in text:
                # A newer instance owns the output: never restart this one.
                fenced = python_error(text)  # (the writer's Fenced, said without the plan)
                said = f"{fenced[0]}: {fenced[1]}" if fenced else spark_head(text)
                hosted.state, hosted.error = PEState.FENCED, said[:2000]
                hosted.query = None
                log.warning("%s is fenced: %s", hosted.plan.query_name, said[:300])
                # (Its processors kept by the workers held their models and connections
                # until the PE was removed or restarted.)
                self._end_run(hosted)
                return
            self._note_unreadable(hosted, text)
            blamed = self._blame(hosted, text)
            if blamed:
                # The next run skips the event that crashed this one: it starts at once.
                # The failures in a row still count, so a processor that crashes on every
                # event waits longer and longer to find the next one.
                self._failed(hosted, text)
                hosted.retry_at = 0.0
                return
            cause = python_error(text)
            if cause is None:
                # (Only "restarting" was logged, and the status cut Spark's text before the
                # words that said what died.)
                summary = spark_failure(text, in_event=blamed is not None)
                self._log_failure(hosted, summary, text)
                # (Its 2,000 characters in the status were mostly Spark's plan and stack.)
                self._failed(hosted, f"{summary}\n{spark_head(text)}\n{SPARK_TEXT_LOGGED}",
                             text=text)  # fmt: skip
                return
            # Spark's text around a Python worker's exception is a plan and a JVM stack:
            # the status says what the PE raised; the log keeps the rest.
            kind, message = cause
            self._log_failure(hosted, f"{kind}: {message}", text)
            self._failed(hosted, f"{kind}: {message}", element_error=kind == ElementError.__name__,
                         text=text)  # fmt: skip

    def _log_failure(self, hosted: HostedElement, summary: str, text: str) -> None:
        """Log that the PE's query failed: ``summary`` with Spark's ``text`` (its first 4,000
        characters), or only the summary if the failure before it said the same."""
        if hosted.failure_said == summary:
            log.warning("%s failed again, as before: %s", hosted.plan.query_name,
                        one_line(summary)[:300])  # fmt: skip
            return
        hosted.failure_said = summary
        log.warning("%s failed: %s\n%s", hosted.plan.query_name, summary, text[:4000])

    def _stalled(self, hosted: HostedElement, query: StreamingQuery) -> bool:
        """Stop and mark failed (to be started again at once) a running query whose batch
        has run without committing for the element's ``batch_timeout_s``, doubled for each
        such restart in a row. The event time limit ends an event that runs too long; this
        ends a batch held up outside any one event (a Python worker that never answers, a
        stuck call in the engine), which kept the PE silent while its status said
        running. The batch runs again on the restart, its output appended only beyond what
        is stored (exactly-once).

        Returns:
            Whether the query was stopped.
        """
        try:
            status = query.status if hosted.state == PEState.RUNNING else {}
        except Exception:  # (a query ending now: the next look sees how)
            status = {}
        if not status.get("isTriggerActive") or status.get("message") != BATCH_RUNNING:
            hosted.batch_since = None
            return False
        now = time.monotonic()
        if hosted.batch_since is None or hosted.batch_since[0] != hosted.last_batch:
            hosted.batch_since = (hosted.last_batch, now)
            return False
        limit = hosted.plan.element.batch_timeout * 2**hosted.stalls
        if now - hosted.batch_since[1] < limit:
            return False
        pipeline, pe = hosted.key
        text = (
            f"PE {pe!r} of pipeline {pipeline!r} on node {self.config.name!r}: its batch "
            f"after batch {hosted.last_batch} ran {limit:g} s without committing "
            f"(batch_timeout_s {hosted.plan.element.batch_timeout:g} s, doubled for each "
            "restart in a row): its query was started again to run it again"
        )
        log.warning("%s", text)
        hosted.stalls += 1
        hosted.batch_since = None
        self._stop_query(hosted)
        self._failed(hosted, text)
        hosted.retry_at = 0.0  # (nothing to back off from: the batch never failed)
        return True

    def _stop_overrunning(self, hosted: HostedElement) -> None:
        """Kill the PE's Python workers stuck in one event far past its time limit, which
        its alarm cannot end (native code): the crash that follows blames the event."""
        limit = hosted.plan.element.event_timeout
        killed = crashes.stop_overrunning(crashes.folder_of(hosted.plan.gate_file), limit)
        for pid, event in killed.items():
            log.warning(
                "%s on node %s: killed its Python worker %d, in process() of event %s "
                "(origin:seq:crc) for over %g s (event_timeout_s %g s)",
                hosted.plan.query_name,
                self.config.name,
                pid,
                event,
                crashes.kill_after(limit),
                limit,
            )

    def _blame(self, hosted: HostedElement, error: str) -> bool | None:
        """After the PE's query failed with ``error``: if a Python worker crashed, count the
        event it died in; one that killed its worker twice is a dead letter from the next
        start on (:mod:`fogshift.runtime.crashes`), so it cannot stop the PE.

        Returns:
            Whether an event was condemned now; None if no event was found to blame (no
            crash, or one outside any event).
        """
        if not hosted.plan.gate_file or crashes.CRASHED not in error:
            return None
        try:
            folder = crashes.folder_of(hosted.plan.gate_file)
            suspects = crashes.blame(folder, error, hosted.plan.element.id)
        except OSError:  # (the folder unreadable: the restart loop goes on as before)
            log.exception("%s: cannot look for the event that crashed its worker",
                          hosted.plan.query_name)  # fmt: skip
            return None
        if not suspects:
            return None
        for event, count in suspects.items():
            condemned = count >= crashes.CRASHES_TO_CONDEMN
            log.warning(
                "%s on node %s: its Python worker died processing event %s (origin:seq:crc), "
                "%d time(s)%s",
                hosted.plan.query_name,
                self.config.name,
                event,
                count,
                ": it is a dead letter from now on" if condemned else "",
            )
        return any(n >= crashes.CRASHES_TO_CONDEMN for n in suspects.values())

    def snapshot_all(self) -> None:
        """Take a node-level checkpoint of every running PE that committed a new batch."""
        with self._lock:
            # The progress queued since the monitor's last look first: the state-store
            # metrics of a batch that has just committed then go into its snapshot's manifest
            # (the monitor counts only once a second, often after the snapshot).
            self._count_queued()
            hosted = [
                h for h in self._elements.values() if h.state in (PEState.RUNNING, PEState.PAUSED)
            ]
        # A snapshot freezes the PE's counters file with its batch: one a batch behind stays
        # short of that batch's rows in every instance started from it (a restore, a
        # promotion), as Spark hands a batch's report over only after its commit. So each
        # waits (all within one bound) for the report of the batch it would freeze.
        deadline = time.monotonic() + COUNT_WAIT_S
        for h in hosted:
            pipeline, pe = h.key
            try:
                late = self._wait_counted(h, deadline)
                if late is not None and not self._put_off(h, late):
                    continue
                take_snapshot(
                    Path(h.plan.checkpoint_dir),
                    self.snapshot_store(pipeline, pe),
                    pipeline,
                    pe,
                    dict(h.state_metrics),
                    pinned=functools.partial(self.pins.held, pipeline, pe),
                    epoch=h.plan.epoch,
                    complete=functools.partial(self._covers, h),
                )
                h.snapshot_error = None
            except (OSError, ValueError, FogshiftError) as exc:
                # A PE removed meanwhile (its checkpoint "moved on while it was copied"), a
                # file in flux: this PE's next snapshot retries; no other PE's waits for it.
                log.warning("node-level checkpoint of %s failed: %s", h.plan.query_name, exc)
                h.snapshot_error = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # as in the monitor: one PE's trouble stops no other
                log.exception("node-level checkpoint of %s failed", h.plan.query_name)
                h.snapshot_error = f"{type(exc).__name__}: {exc}"
            finally:
                # Also when the snapshot is put off or fails: the notes pile up otherwise.
                self._compact_key_index(h)
        self.snapshots_at = time.monotonic()

    def _compact_key_index(self, hosted: HostedElement) -> None:
        """Fold a keyed PE's key index notes into a base at its newest commit (one small
        file per batch otherwise piles up); skipped while a key listing of it runs."""
        if hosted.plan.element.key_by is None:
            return
        lock = self._key_index_lock(*hosted.key)
        if not lock.acquire(blocking=False):
            return
        try:
            live = Path(hosted.plan.checkpoint_dir)
            key_index.compact(key_index.folder_of(live), committed_batch(live))
        except Exception as exc:  # no snapshot's failure: listings fall back to a state read
            log.warning("folding the key index of %s failed: %r", hosted.plan.query_name, exc)
        finally:
            lock.release()

    def _uncounted(self, hosted: HostedElement, batch: int | None) -> bool:
        """Whether ``batch``, committed in the PE's checkpoint, is one its query ran since it
        was last started here and whose progress report is not counted yet."""
        resumed = hosted.resumed_batch
        return batch is not None and resumed is not None and batch > max(hosted.last_batch, resumed)

    def _wait_counted(self, hosted: HostedElement, deadline: float) -> int | None:
        """Until the PE's newest committed batch is counted, or ``deadline`` (monotonic);
        then that batch if it is still not counted, else ``None``."""
        live = Path(hosted.plan.checkpoint_dir)
        while self._uncounted(hosted, batch := committed_batch(live)):
            if time.monotonic() >= deadline:
                return batch
            time.sleep(COUNT_POLL_S)
            with self._lock:
                self._count_queued()
        hosted.uncounted_since = None
        return None

    def _put_off(self, hosted: HostedElement, batch: int) -> bool:
        """For a PE whose ``batch`` is not counted: whether to take its node-level
        checkpoint all the same, only once it has been put off :data:`UNCOUNTED_LIMIT_S`
        (a report that never comes must not leave the PE without newer checkpoints)."""
        now = time.monotonic()
        since = hosted.uncounted_since = hosted.uncounted_since or now
        if now - since < UNCOUNTED_LIMIT_S:
            log.info("node-level checkpoint of %s put off: the progress report of its newest "
                     "batch has not come", hosted.plan.query_name)  # fmt: skip
            return False
        log.warning("node-level checkpoint of %s taken without the progress report of its "
                    "newest batch (awaited %.0f s): its input count may fall short of that "
                    "batch's rows", hosted.plan.query_name, now - since)  # fmt: skip
        # Given up on: no later round waits for it again (its report, should it come, is
        # still counted).
        hosted.resumed_batch, hosted.uncounted_since = max(hosted.resumed_batch or -1, batch), None
        return True

    def _covers(self, hosted: HostedElement, staged: Path, batch: int) -> bool:
        """Whether the counters in a staged copy of the PE's checkpoint cover the batch it
        froze (:func:`take_snapshot`'s ``complete``: a batch committed while the copy was
        made may not be counted yet)."""
        return self._counted_in(hosted, staged, batch) or self._put_off(hosted, batch)

    def _counted_in(self, hosted: HostedElement, staged: Path, batch: int | None = None) -> bool:
        """Whether the counters in a staged copy of the PE's checkpoint cover ``batch``
        (default: the copy's last commit)."""
        batch = committed_batch(staged) if batch is None else batch
        if batch is None or hosted.resumed_batch is None or batch <= hosted.resumed_batch:
            return True  # came with the checkpoint: no report of it is to come here
        try:
            counted = int(json.loads((staged / METRICS_FILE).read_text())["last_batch"])
        except (OSError, ValueError, KeyError, TypeError):
            counted = -1
        return counted >= batch

    def run_snapshots(self) -> None:
        """Loop :meth:`snapshot_all` every ``checkpoint_interval_s`` until :meth:`close`.

        The loop outlives any failure: before, one PE's checkpoint removed in the middle of a
        snapshot ended it, and the node took no node-level checkpoint of any PE again.
        """
        while not self._stop.wait(self.config.checkpoint_interval_s):
            try:
                self.snapshot_all()
            except Exception:
                log.exception("node-level checkpoints failed")

    def latest_snapshot(self, pipeline: str, pe: str) -> CheckpointManifest | None:
        """The PE's newest node-level checkpoint here, if it has one. (Not pinned: it is the
        newest, pruned two snapshots later at the soonest; the reader pins it by reading
        its first file.)"""
        manifest = latest_manifest(self.snapshot_store(pipeline, pe))
        return CheckpointManifest.model_validate(manifest) if manifest else None

    def snapshot_file(self, pipeline: str, pe: str, snapshot: str, rel: str) -> Path:
        """One file of a node-level checkpoint (names checked, see ``store.snapshot_file``);
        the snapshot stays pinned while its files are read."""
        path = snapshot_file(self.snapshot_store(pipeline, pe), snapshot, rel)
        self.pins.touch(pipeline, pe, snapshot)
        return path

    def _count(self, hosted: HostedElement, reports: Sequence[dict[str, Any]]) -> None:
        changed = False
        for progress in reports:
            metrics = state_metrics(progress)
            if metrics is not None:
                hosted.state_metrics[int(progress["batchId"])] = metrics
                while len(hosted.state_metrics) > STATE_METRICS_KEPT:
                    del hosted.state_metrics[min(hosted.state_metrics)]
            if "addBatch" not in (progress.get("durationMs") or {}):
                # An idle trigger's progress carries the id of the batch still to come:
                # counting it would skip that batch's rows when it does come.
                continue
            batch = int(progress["batchId"])
            if batch > hosted.last_batch:
                rows = int(progress["numInputRows"])
                hosted.events_in += rows
                hosted.last_batch = batch
                hosted.batch_rows[batch] = rows
                while len(hosted.batch_rows) > BATCH_ROWS_KEPT:
                    del hosted.batch_rows[min(hosted.batch_rows)]
                changed = True
        if changed:
            self._save_counters(hosted)


_SPARK_TRAILERS = re.compile(r" SQLSTATE: |\n=== Streaming Query ===|\n\tat |\n\s*at org\.apache")


def _page(sizes: dict[str, int], limit: int) -> list[str] | None:
    """The keys of a page of twins: the first ``limit`` keys of ``sizes`` (each key's
    stored state length), sorted, fewer once their lengths pass :data:`TWIN_PAGE_BYTES` (at
    least one); ``None`` when that is every key (the whole state is read as is)."""
    page: list[str] = []
    total = 0
    for key in sorted(sizes):
        if len(page) == limit or (page and total + sizes[key] > TWIN_PAGE_BYTES):
            return page
        page.append(key)
        total += sizes[key]
    return None


def _pe_names(root: Path) -> set[str]:
    """The PEs whose checkpoints, node-level snapshots or unfinished install's copy a
    pipeline's folder ``root`` holds (named as :meth:`NodeRuntime.left` reads them)."""
    if not root.is_dir():
        return set()
    # (a checkpoint being installed, or the one it replaced not yet removed, is a PE's too:
    # spark_dir.installing's and spark_dir.replaced's folders)
    names = {f.name.removesuffix(".incoming").removesuffix(".replaced")
             for f in root.iterdir() if f.is_dir()}  # fmt: skip
    return {n for n in names if NAME_PATTERN.fullmatch(n)}


def python_error(text: str) -> tuple[str, str] | None:
    """``(type name, message)`` of the Python exception a query failed with, if it did.

    Spark reports an exception raised in a Python worker as ``[PYTHON_EXCEPTION] ...
    Traceback (most recent call last): ... module.Type: message`` followed by its own plan
    and stack; the last traceback is the outermost exception (chained ones come before).
    """
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    body = text[at:]
    trailer = _SPARK_TRAILERS.search(body)
    lines = (body[: trailer.start()] if trailer else body).splitlines()
    for i, line in enumerate(lines[1:], start=1):
        if line and not line[0].isspace():  # frames are indented; the exception is not
            name, _, first = line.partition(": ")
            message = "\n".join([first, *lines[i + 1 :]]).strip()
            return name.rpartition(".")[2], message
    return None


#: Where the rest of Spark's text of a failure is (a status carries its head only).
SPARK_TEXT_LOGGED = "(Spark's whole text, its plan and stack: the node's log, `fogshift logs NODE`)"


def spark_head(text: str) -> str:
    """Spark's text of a failure up to its plan, stack or SQL state (its first 1,000
    characters at most): what it says, without what only a Spark developer reads."""
    trailer = _SPARK_TRAILERS.search(text)
    return (text[: trailer.start()] if trailer else text).strip()[:1000]


def spark_failure(text: str, in_event: bool = False) -> str:
    """One line saying why a query failed, from Spark's text of a failure that is no
    Python exception (see :func:`python_error`): a Python worker that died (``in_event``:
    in an event the node blamed), else the innermost cause Spark names, else its first
    line."""
    if crashes.CRASHED in text:
        return (
            "its Python worker exited unexpectedly processing an event (a second time on it "
            "makes it a dead letter)"
            if in_event
            else "its Python worker exited unexpectedly, not while processing an event (in "
            "a hook such as snapshot(), or killed: out of memory?)"
        )
    causes = [line.strip() for line in text.splitlines() if line.strip().startswith("Caused by: ")]
    line = causes[-1].removeprefix("Caused by: ") if causes else text.strip().split("\n", 1)[0]
    return line[:300]


#: How many batches' state-store metrics a PE keeps (a snapshot is of a recent batch).
STATE_METRICS_KEPT = 100


def _reports_of(hosted: HostedElement, reports: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """The progress reports among ``reports`` (by query name) of the PE's current runs."""
    mine = reports.get(hosted.plan.query_name, [])
    return [r for r in mine if r.get("runId") in hosted.run_ids]


def _no_key(pipeline: str, pe: str, element: ElementSpec, where: str) -> NoState:
    """The refusal of a per-key read of PE ``element``, which has no ``key_by``."""
    return NoState(
        f"{pipeline}/{pe} holds no state per key ({where})",
        expected="a keyed stateful processor (key_by, with state)",
        received=f"{pe!r}, kind {element.kind!r}, without key_by",
        hint=f"only a PE with key_by keeps a state per key; `fogshift state {pipeline} {pe}` "
        "without a key shows its whole state",
    )


def state_metrics(progress: dict[str, Any]) -> dict[str, Any] | None:
    """Spark's state-store metrics of one batch's progress report (``None``: no state).

    Summed over the batch's stateful operators: ``commit_ms`` (``commitTimeMs``: the state
    store's commit, where the batch's state changes are serialised and written),
    ``updates_ms`` (``allUpdatesTimeMs``), ``memory_bytes`` and ``rows``; and ``batch_ms``,
    the batch's ``triggerExecution`` time.
    """
    operators = progress.get("stateOperators") or []
    if not operators:
        return None
    return {
        "commit_ms": sum(int(op.get("commitTimeMs") or 0) for op in operators),
        "updates_ms": sum(int(op.get("allUpdatesTimeMs") or 0) for op in operators),
        "memory_bytes": sum(int(op.get("memoryUsedBytes") or 0) for op in operators),
        "rows": sum(int(op.get("numRowsTotal") or 0) for op in operators),
        "batch_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
    }
