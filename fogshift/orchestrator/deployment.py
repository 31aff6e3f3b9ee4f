"""Deploying, stopping and reporting pipelines, and the nodes' view with their checkpoints."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator, MutableMapping
from functools import partial
from pathlib import Path
from typing import Any

from nats.js.errors import NotFoundError
from pydantic_core import to_json

from fogshift.broker.client import (
    delete_pe_stream,
    delete_pipeline_streams,
    ensure_pe_stream,
    fetch_range,
    get_range,
    last_seq,
    subject_counts,
)
from fogshift.broker.exceptions import BrokerError
from fogshift.broker.keys import Ownership, key_text
from fogshift.broker.naming import data_subject, dead_subject, stream_name
from fogshift.broker.publish import fence
from fogshift.common.progress import PositionWatch, progress_params
from fogshift.common.service import PROGRESS_WAIT_MAX_S
from fogshift.contracts import (
    AgedNodeCheckpoint,
    CheckpointsView,
    DeadLetter,
    DeleteResult,
    ElementInfo,
    ElementProgress,
    ElementStatus,
    EventPage,
    Heartbeat,
    HopLatency,
    KeyWaiting,
    NodeCheckpoint,
    NodeView,
    PEState,
    PipelineState,
    PipelineStatus,
    PlacementState,
    RestoreStatus,
    StandbyStatus,
    StoppedCounts,
    StopResult,
    StreamEvent,
    TwinEntry,
    TwinState,
)
from fogshift.events import EPOCH_HEADER, ORIGIN_HEADER
from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, NotFound, Unavailable
from fogshift.orchestrator.config import WarningLimits
from fogshift.orchestrator.exceptions import NotKeyed, PipelineExists, UnknownPipeline
from fogshift.orchestrator.journal import STOP_WAIT_S, Journal
from fogshift.orchestrator.locks import element_lock_of
from fogshift.orchestrator.registry import NodeRecord, PipelineRecord
from fogshift.spec.exceptions import InvalidSpec
from fogshift.spec.loader import (
    check_fresh,
    did_you_mean,
    input_file,
    output_file,
    parse_spec,
    require_absolute_paths,
    same_file,
    validate_spec,
)
from fogshift.spec.models import ElementSpec, PipelineSpec, partition_of_key

log = logging.getLogger("fogshift.orchestrator")

#: What a cluster's home holds of its own state (``fogshift up``, the orchestrator, agents):
#: no sink may write there.
CLUSTER_STATE = frozenset(
    {"token", "cluster.json", "broker", "broker.json", "nodes", "central", "logs",
     "topology.yaml", "network"}
)  # fmt: skip

#: How far back from a stream's end the newest data message is looked for (the end may be a
#: fence or cut marker).
LATENCY_SCAN = 20


def _aged(snapshot: NodeCheckpoint | None) -> AgedNodeCheckpoint | None:
    """A node-level checkpoint summary with its age."""
    if snapshot is None:
        return None
    age_ms = round((time.time() - snapshot.created) * 1000, 1)
    return AgedNodeCheckpoint(**snapshot.model_dump(), age_ms=age_ms)


def node_warnings(
    report: Heartbeat, heard_s: float, now: float, limits: WarningLimits
) -> list[str]:
    """What is wrong with a node that works, from its last heartbeat: its disk nearly full,
    its node-level checkpoints failing or stopped.

    A node whose snapshot thread died, or whose snapshots of one PE keep failing, still
    beats and runs its PEs: nothing else tells it, yet its restores reprocess ever more
    input and the central store gets nothing new. A full disk fails Spark's checkpoints,
    and the PEs with them: told before it is.

    Args:
        report: The node's last heartbeat.
        heard_s: Seconds since that heartbeat arrived.
        now: This host's ``time.time()`` (a checkpoint's age is by the node's clock, as
            everywhere its age is shown).
        limits: When the disk counts as nearly full, and the checkpoints as stopped (a
            round, or a running PE's newest checkpoint while it commits newer batches,
            ``stall_intervals`` of the node's intervals plus ``stall_slack_s`` old).
    """
    warnings = []
    disk = limits.disk_warning(report.disk_free_bytes, report.disk_total_bytes)
    if disk is not None:
        warnings.append(disk + " (checkpoints fail, and the PEs with them, once it is full)")
    interval = report.checkpoint_interval_s
    if interval is None:
        return warnings  # an agent that does not say its interval: nothing to compare with
    limit = limits.stall_intervals * interval + limits.stall_slack_s
    if report.snapshots_age_s is not None and report.snapshots_age_s + heard_s > limit:
        warnings.append(
            f"node-level checkpoints stopped: the last round ended "
            f"{report.snapshots_age_s + heard_s:.0f} s ago (one every {interval:g} s)"
        )
    for e in report.elements:
        name = f"{e.pipeline}/{e.element}"
        if e.snapshot_error is not None:
            warnings.append(f"node-level checkpoint of {name} failed: {e.snapshot_error}")
            continue
        newest = e.node_checkpoint
        if e.state not in (PEState.RUNNING, PEState.PAUSED):
            continue  # not snapshotted (a failed PE's own state says what is wrong)
        if newest is None or newest.batch is None or e.last_batch <= newest.batch:
            continue
        age = now - newest.created
        if age > limit:
            warnings.append(
                f"node-level checkpoint of {name} is {age:.0f} s old (batch {newest.batch}) "
                f"while it committed batch {e.last_batch} (one every {interval:g} s)"
            )
    return warnings


async def fresh_streams(
    js: Any, spec: PipelineSpec, epochs: dict[str, int], duplicate_window_s: float
) -> None:
    """Give each PE of ``spec`` a fresh stream, fenced under its epoch in ``epochs``.

    Streams of the name's PEs that ``spec`` does not have go too: a partition a scale added
    in a run before kept its records, and the same scale now would reuse them (its new
    outputs taken for stored ones, its old ones read downstream as new).
    """
    ours = {stream_name(spec.pipeline, e.id) for e in spec.elements}
    await delete_pipeline_streams(js, spec.pipeline, keep=ours)
    for element in spec.elements:
        await delete_pe_stream(js, spec.pipeline, element.id)
        await ensure_pe_stream(js, spec.pipeline, element.id, duplicate_window_s)
        await fence(js, spec.pipeline, element.id, epochs[element.id])


class Deployment(Journal):
    """Deploy, stop, status, dead letters and the node view."""

    def health_warnings(self) -> list[str]:
        """What is wrong with this orchestrator while it works (``GET /health``), and with
        the broker `fogshift up` started for it (its store failed to be written)."""
        warnings = []
        log = self.config.broker_log
        if log is not None:
            failed = self.store_failures(log)
            if failed is not None:
                warnings.append(
                    f"the broker failed to write its store and refuses every store until it "
                    f"starts again ({log}: {failed!r}): free space on its disk, then "
                    "`fogshift up` starts the cluster again whole"
                )
        try:
            usage = shutil.disk_usage(self.config.home)
        except OSError:
            return warnings
        disk = self.config.warning_limits.disk_warning(usage.free, usage.total)
        if disk is not None:
            warnings.append(disk + " (central checkpoints fail once it is full)")
        return warnings

    def nodes(self) -> list[NodeView]:
        """Every node as last heard from, with the checkpoints of the PEs it runs.

        A node not heard from lately lists only the PEs still placed on it: one restored
        elsewhere since is told among its warnings (listed as the node's, it read as running
        in two places)."""
        placed = {
            (record.name, element): node
            for record in self.registry.pipelines()
            for element, node in record.placement.items()
        }
        standing = {(s.pipeline, s.element): s.node for s in self.registry.standbys()}
        out = []
        for node in self.registry.nodes():
            report = node.report
            listed, moved = report.elements, []
            if not self.healthy(node):
                listed = []
                for e in report.elements:
                    now = placed.get((e.pipeline, e.element))
                    if now == node.name:
                        listed.append(e)
                    else:
                        where = f"runs on {now} now" if now else "is no longer deployed"
                        # (Its copy there may have been the PE or its standby: the standby's
                        # record goes with the node, but a standby is held at its cap, which
                        # the report says: "holding p/source" of a standby read as the PE.)
                        copy = (f"a capped copy of {e.pipeline}/{e.element} (its standby, or a "
                                "migration's target)" if e.gated
                                else f"{e.pipeline}/{e.element}")  # fmt: skip
                        moved.append(f"last heard holding {copy}, which {where}")
            out.append(
                NodeView(
                    name=node.name,
                    url=node.url,
                    pid=node.pid,
                    pgid=node.pgid,
                    healthy=self.healthy(node) and report.ready,
                    alive=self.healthy(node),
                    ready=report.ready,
                    error=report.error,
                    last_seen_s=round(time.time() - node.last_seen, 3),
                    cpu_percent=report.cpu_percent,
                    disk_free_bytes=report.disk_free_bytes,
                    disk_total_bytes=report.disk_total_bytes,
                    replicas=[f"{r.pipeline}/{r.element}@{r.id}" for r in report.replicas],
                    elements=[f"{e.pipeline}/{e.element}" for e in listed],
                    standbys=[
                        f"{e.pipeline}/{e.element}"
                        for e in listed
                        if standing.get((e.pipeline, e.element)) == node.name
                        and placed.get((e.pipeline, e.element)) != node.name
                    ],
                    checkpoints=[
                        CheckpointsView(
                            element=f"{e.pipeline}/{e.element}",
                            epoch=e.epoch,
                            node_level=_aged(e.node_checkpoint),
                            central=self.checkpoint_status(e.pipeline, e.element),
                        )
                        for e in listed
                    ],
                    warnings=self._node_warnings(node) + moved,
                )
            )
        return out

    def _node_warnings(self, node: NodeRecord) -> list[str]:
        """What ``nodes`` warns of for ``node``: of a silent one, its silence only (its last
        report's checkpoints age with the silence: "stopped" said nothing the silence does
        not, and read as the node's own trouble)."""
        heard_s = time.time() - node.last_seen
        if not self.healthy(node):
            return [f"no heartbeat for {heard_s:.0f} s (its agent is down or cut off)"]
        return node_warnings(node.report, heard_s, time.time(), self.config.warning_limits) + [
            f"central checkpoint of {p}/{e} failed: {error}"
            for (p, e), (at, error) in sorted(self.pull_errors.items())
            if at == node.name
        ]

    def pipeline(self, name: str) -> PipelineRecord:
        record = self.registry.get_pipeline(name)
        if record is None:
            known = [p.name for p in self.registry.pipelines()]
            guess = did_you_mean(name, known)
            raise UnknownPipeline(
                f"no pipeline named {name!r}",
                expected="one of " + (", ".join(known) or "(none deployed)"),
                received=repr(name),
                hint=f"did you mean {guess!r}?"
                if guess
                else (
                    "`fogshift status` lists the pipelines"
                    if known
                    else "`fogshift deploy SPEC` deploys one"
                ),
            )
        return record

    @staticmethod
    def refuse_unless_running(record: PipelineRecord, refusal: str) -> None:
        """Refuse an operation (``refusal`` says which) on a pipeline that is not running:
        what it starts or stores would be nobody's.

        Raises:
            Conflict: ``record`` is not running (a state that forbids it: exit 1).
        """
        if record.status != PipelineState.RUNNING:
            raise Conflict(
                f"{refusal}: pipeline {record.name!r} is {record.status}, not running",
                expected="a running pipeline",
                received=str(record.status),
                # (It read as "resume": a deploy starts over, and a sink's file is emptied.)
                hint=f"`fogshift status {record.name}` shows its state; `fogshift start "
                f"{record.name}` starts a stopped one again where it stopped; `fogshift "
                "deploy SPEC --fresh` starts it over: its state and its sinks' files begin "
                "empty (copy what you keep of them first)",
            )

    def deploy(self, data: dict[str, Any], fresh: bool = False) -> PipelineStatus:
        """Validate a spec (paths already absolute) and start all of its PEs, fresh.

        Each PE gets a new epoch, above any it had in an earlier deployment of the same name,
        and its fresh output stream starts with a fence marker for it: an instance left over
        from an earlier deployment (on a node that missed the stop) is fenced at its first
        write.

        Args:
            data: The spec.
            fresh: Start over a stopped pipeline of the name that ran (one :meth:`start`
                would go on with): its streams, checkpoints and sinks' files begin empty.

        Raises:
            InvalidSpec: The spec is invalid or names an unknown node.
            PipelineExists: A pipeline of that name is running, or stopped with what it
                ran kept and ``fresh`` not asked.
            Unavailable: A node agent refused or could not be reached; the PEs already
                started are stopped again.
        """
        spec = parse_spec(data)
        require_absolute_paths(spec)
        validate_spec(spec, nodes=self.node_names())
        check_fresh(spec)
        # A stop meanwhile waits for the deploy, then stops what it started (run one after
        # the other, the deploy's last step marked a stopped pipeline running again).
        with self.pipeline_lock(spec.pipeline):
            self._refuse_taken_name(spec, fresh)
            self._check_on_nodes(spec)
            # No node gets rights to its streams until each is made and fenced (a round's
            # sync in between, too, let a node that missed the last stop append its old
            # instance's records ahead of a fence marker, which then carried their position).
            with self.permissions.withholding(spec.pipeline):
                with self._admission:
                    epochs = self._admit(spec, fresh)
                self._make_streams(spec, epochs)
            return self._start(spec, epochs)

    def _check_on_nodes(self, spec: PipelineSpec) -> None:
        """Have each healthy node check ``spec``'s PEs placed on it — their files, and that
        each processor imports and builds with its options — before anything of the deploy
        changes: refused only when a PE started, a missing input or a class that does not
        import came after a sink had emptied its file, the streams and central checkpoints
        of an earlier run under the name were gone, and a failed pipeline stayed behind.
        (A node that is not healthy is refused by :meth:`_admit`, in its words.)

        Raises:
            InvalidSpec: A node found a PE's input missing or its output path unusable.
            CannotBuild: A node cannot build a PE's processor (``cannot_build``, 422).
            Unavailable: A node could not be asked.
        """
        placed: dict[str, list[ElementSpec]] = {}
        for element in spec.elements:
            placed.setdefault(element.node, []).append(element)
        for node, elements in sorted(placed.items()):
            if not self._heard(node):
                continue
            self.agent(node).post(
                f"/pipelines/{spec.pipeline}/check",
                json={"elements": [e.model_dump(mode="json") for e in elements]},
            )

    def _refuse_taken_name(self, spec: PipelineSpec, fresh: bool) -> None:
        """Refuse ``spec`` if a pipeline of its name runs or is being deployed — or, unless
        ``fresh``, is stopped with what it ran kept: a deploy empties its streams and its
        sinks' files, which a user who stopped it for a while (and would go on with
        `start`) may not expect of a command that reads as "run this spec".

        Raises:
            PipelineExists: It does; nothing was changed.
        """
        name = spec.pipeline
        existing = self.registry.get_pipeline(name)
        if existing is not None and existing.status in (
            PipelineState.RUNNING,
            PipelineState.DEPLOYING,
        ):
            raise PipelineExists(
                f"pipeline {name!r} is already {existing.status}",
                expected="a pipeline name no running or deploying pipeline has",
                received=f"{name!r}, {existing.status}",
                hint=f"`fogshift stop {name}` first, or deploy under another name",
            )
        # (Stopping too: a stop a dead orchestrator left is ended by the next round.)
        if (
            not fresh
            and existing is not None
            and existing.status in (PipelineState.STOPPED, PipelineState.STOPPING)
            and self.registry.ran(name)
        ):
            raise PipelineExists(
                f"pipeline {name!r} is {existing.status}, its streams, checkpoints and "
                "output kept: deployed again, it would start over with them emptied",
                expected=f"a name no kept pipeline has, or a deploy asked to start {name!r} "
                "over (`--fresh`)",
                received=f"{name!r}, {existing.status}",
                hint=f"`fogshift start {name}` goes on where it stopped; `fogshift deploy "
                f"SPEC --fresh` starts it over (its sinks' files begin empty: copy what you "
                f"keep of them first); `fogshift delete {name}` removes it",
            )

    def _admit(self, spec: PipelineSpec, fresh: bool) -> dict[str, int]:
        """Refuse ``spec`` if its name or an output file is taken or one of its nodes is not
        healthy; else store it as deploying. Its PEs' epochs."""
        self._refuse_taken_name(spec, fresh)
        self._refuse_shared_outputs(spec)
        leaving = self.leaving_nodes()
        for node in {e.node for e in spec.elements}:
            if node in leaving:
                raise Unavailable(
                    f"node {node!r} (needed by pipeline {spec.pipeline!r}) is being removed "
                    "from the cluster",
                    expected="nodes that stay in the cluster",
                    received=f"{node!r}, whose removal (`fogshift remove-node`) is under way",
                    hint="place its elements on other nodes (`fogshift nodes` lists them)",
                )
            record = self.registry.node(node)
            if record is None or not self.healthy(record) or not record.report.ready:
                raise Unavailable(
                    f"node {node!r} (needed by pipeline {spec.pipeline!r}) is not healthy",
                    hint="`fogshift nodes` shows node health; wait for it or change the spec",
                )
        return self.registry.put_pipeline(spec, PipelineState.DEPLOYING)

    def _make_streams(self, spec: PipelineSpec, epochs: dict[str, int]) -> None:
        """Give ``spec``'s PEs fresh streams, fenced under ``epochs``; forget the runs
        before under its name.

        Raises:
            FogshiftError: The broker refused (the pipeline is then failed, not deploying).
        """
        # Rights a node holds now go first: withheld, no sync grants them, but one applied
        # before stays until the config is rewritten — a run stopping (a deploy afresh may
        # take over a stop an orchestrator left), a stop's sync that failed, the last config
        # of an orchestrator restarted. A leftover instance could then append to a stream
        # made anew ahead of its fence marker, which carried their position (the new run's
        # records skipped as written).
        self._sync_rights(spec.pipeline, "withdrawn first")
        # What the orchestrator remembers of the run before goes (shown as the new run's,
        # its migrations and restores read as this run's outcomes): first, as the registry
        # dropped its kept reports with the run's entry.
        self._forget_runs(spec.pipeline)
        # Afresh: the central checkpoints of a run before under this name hold positions of
        # streams deleted below (restored, a PE would wait for input that never comes, or
        # skip what the new streams hold up to there).
        self.central.forget(spec.pipeline)  # (every PE's: partitions of a scale too)

        def reset_streams(js: Any) -> Any:
            return fresh_streams(js, spec, epochs, self.config.duplicate_window_s)

        try:
            # (Again if the broker closed the connection under it: it refused a connected
            # client at a rights reload, once in a test run.)
            self.broker.run(reset_streams, again_if_closed=True)
        except Exception as exc:
            # Failed, not left deploying (which a deploy again would be refused for).
            reason = f"the broker refused its streams: {_said(exc)}"
            self.registry.set_status(spec.pipeline, PipelineState.FAILED, reason)
            if isinstance(exc, FogshiftError):
                raise
            raise BrokerError(
                f"cannot deploy pipeline {spec.pipeline!r}: the broker refused its streams: "
                f"{exc!r}",
                hint="`fogshift nodes` and the orchestrator's log say more; deploy again",
            ) from exc

    def _sync_rights(self, pipeline: str, done: str) -> None:
        """Apply the nodes' broker rights as placements say now; if they cannot be written,
        the pipeline is failed (not left deploying: every deploy again was refused as
        "already deploying" until a stop), its reason "its nodes' broker rights could not
        be ``done``"."""
        try:
            self.permissions.sync(self.registry)
        except Exception as exc:
            reason = f"its nodes' broker rights could not be {done}: {_said(exc)}"
            self.registry.set_status(pipeline, PipelineState.FAILED, reason)
            raise

    def _start(self, spec: PipelineSpec, epochs: dict[str, int]) -> PipelineStatus:
        """Start ``spec``'s PEs, their streams made (:meth:`_make_streams`)."""
        # The nodes may use their PEs' streams from here on: only once each stream is made
        # and fenced (given before, a node that missed the last stop could append its old
        # instance's records to a stream made anew before its fence marker, which then
        # carried their position: the new run's skipped as written).
        self._sync_rights(spec.pipeline, "set")
        started: list[ElementSpec] = []
        try:
            # Downstream first, so nothing is produced before its consumer exists.
            for element in reversed(spec.topological_order()):
                self._deploy_element(spec.pipeline, element, fresh=True)
                started.append(element)
        except FogshiftError as exc:
            for element in started:
                self._remove_quietly(spec.pipeline, element)
            reason = f"a PE could not be started: {_said(exc)}"
            self.registry.set_status(spec.pipeline, PipelineState.FAILED, reason)
            raise
        self.registry.set_status(spec.pipeline, PipelineState.RUNNING)
        # (Its log said nothing of deploys and stops: only the broker rights they changed.)
        placed = self.pipeline(spec.pipeline).placement
        log.info("deployed pipeline %s: %s", spec.pipeline,
                 ", ".join(f"{pe} on {node}" for pe, node in placed.items()))  # fmt: skip
        try:
            return self.status(spec.pipeline)[0]
        except Unavailable as exc:
            # Deployed and running: a broker away now must not make it look failed (a 503,
            # and deploying again is refused as running). Counts come with the next status.
            log.warning("deployed %s; its stream counts cannot be read now: %s",
                        spec.pipeline, exc.message)  # fmt: skip
            return self.status(spec.pipeline, counts=False)[0]

    def _forget_runs(self, pipeline: str) -> None:
        """Drop what this process remembers of ``pipeline``'s runs: its PEs' last central
        pulls and their errors, migrations and restores, replica pushes, standbys followed,
        restore and restart failures (each pipeline name ever deployed kept its entries for
        the process's life)."""
        memories: tuple[MutableMapping[Any, Any], ...] = (
            self.central_stats, self.pull_errors, self._early_pulls, self.last_migration,
            self.last_restore, self.stopped_counts, self.replica_stats, self.followed,
            self._restart_backoff, self._restore_failures, self._in_place_failed,
            self._attempts_said, self._trim_held,
        )  # fmt: skip
        for memory in memories:
            for key in [k for k in list(memory) if k[0] == pipeline]:
                memory.pop(key, None)
        self._streams_checked.discard(pipeline)
        self._trimmed_at.pop(pipeline, None)
        self.shipped.forget(lambda key: key[0] == pipeline)
        self.forget_plan(pipeline)

    def _ownership(self, pipeline: str, source: str, element_id: str) -> Ownership:
        """Who owns each key of partitioned ``element_id`` (:class:`KeyMoves`, above)."""
        raise NotImplementedError

    def _position(
        self, pipeline: str, pe: str, source: str, node: str, watch: PositionWatch | None = None
    ) -> int | None:
        """How far ``pe`` on ``node`` has committed its input ``source`` (``None``: its node
        did not answer, or does not run it).

        Args:
            watch: The caller's last answer from that node and how long this request may
                wait at the agent for a newer one (a long poll); it gets this answer.
        """
        params = {}
        if watch is not None and watch.node == node:
            params = progress_params(watch.last, watch.wait_s)
        try:
            progress = self.agent(node).call(
                ElementProgress, "GET", f"/pipelines/{pipeline}/elements/{pe}/progress",
                params=params, timeout=5 + PROGRESS_WAIT_MAX_S,
            )  # fmt: skip
        except FogshiftError:
            return None
        if watch is not None:
            watch.node, watch.last = node, progress
        return int(((progress.offset or {}).get("positions") or {}).get(source, 0))

    def _read_owners(self, pipeline: str, part: ElementSpec, element_id: str) -> Ownership | None:
        """Who owns each key of partitioned ``element_id`` (one of its partitions:
        ``part``), from the key moves stored in its first input; ``None`` if they cannot be
        read now (the broker away): the reads then go by CRC-32 alone, as before."""
        try:
            return self._ownership(pipeline, part.inputs[0], element_id)
        except Exception as exc:  # (a read of state must not fail on the moves' replay)
            log.warning("the key moves of %s/%s could not be read (%s): reading its state "
                        "by its keys' hash", pipeline, element_id, exc)  # fmt: skip
            return None

    def _refuse_shared_outputs(self, spec: PipelineSpec, stopped: bool = True) -> None:
        """Refuse a sink writing a file a sink of another pipeline writes (their
        exactly-once markers would be one, and the deploy would empty the other's output), or
        reads (the deploy would empty the other's input), and a source reading a file
        another pipeline's sink writes (torn lines): within one spec the loader refuses
        all three. The others are those running, deploying or stopping, and, if
        ``stopped``, those stopped that `fogshift start` would go on with
        (:meth:`Registry.ran`): a deploy that took such a one's file emptied its output or
        input, and its start then found its sink's file another's (refused for good) or
        its source's file rewritten under its position. ``start`` asks without them (two
        stopped pipelines cannot both have been admitted so; a registry older than this
        check may hold them).

        Raises:
            InvalidSpec: Such a file, with the other pipeline and what it does with it.
        """
        # (Compared as files, not names: a hard link is one file under two names.)
        mine = {same_file(p): (e.id, p) for e in spec.elements if (p := output_file(e)) is not None}
        reads = {same_file(p): (e.id, p) for e in spec.elements if (p := input_file(e)) is not None}
        home = Path(self.config.home).resolve()
        for path, element_id in ((output_file(e), e.id) for e in spec.elements):
            # A deploy empties its sinks' files: one of the cluster's own (its token, its
            # registry, a node's checkpoints) would break the cluster.
            where = Path(path).resolve() if path is not None else None
            if where is not None and where.is_relative_to(home) and where != home:
                first = where.relative_to(home).parts[0]
                if first in CLUSTER_STATE or first.startswith("orchestrator.db"):
                    raise InvalidInput(
                        f"sink {element_id!r} of pipeline {spec.pipeline!r} would write the "
                        f"cluster's own {first!r} in its home {str(home)!r}",
                        expected="an output file that is not the cluster's state",
                        received=repr(path),
                        hint="give the sink a `path` elsewhere (the deploy empties that "
                        "file), e.g. under the home's runs/",
                    )
        active = (PipelineState.RUNNING, PipelineState.DEPLOYING, PipelineState.STOPPING)
        for other in self.registry.pipelines():
            resumable = (
                stopped and other.status == PipelineState.STOPPED and self.registry.ran(other.name)
            )
            if other.name == spec.pipeline or (other.status not in active and not resumable):
                continue
            # How the other is made to let go of the file: a stopped one would take it up
            # again at its start, so only its delete does.
            away = (
                f"`fogshift delete {other.name}` first (`fogshift start {other.name}` would "
                "go on with that file)"
                if resumable
                else f"`fogshift stop {other.name}` first"
            )
            for element in other.spec.elements:
                # (their path, ours by path, our role and verb, theirs, expected, hint)
                clashes = (
                    (input_file(element), mine, "sink writes", "source", "reads",
                     "an output file no other pipeline reads",
                     f"give the sink another `path` (the deploy would empty that file), or "
                     f"{away}"),
                    # A sink cuts a line it had not finished and writes it again when it is
                    # restored: a source tailing its file took the torn line for a row.
                    (output_file(element), reads, "source reads", "sink", "writes",
                     "an input file no other pipeline writes",
                     "join the pipelines into one (a PE's output is read exactly once "
                     "through its stream), or read a finished copy of the file"
                     + (f"; or {away}" if resumable else "")),
                    (output_file(element), mine, "sink writes", "sink", "writes",
                     "an output file no other pipeline writes",
                     f"give the sink another `path`, or {away}"
                     + ("" if resumable else " (its output is then replaced)")),
                )  # fmt: skip
                for path, ours, doing, role, does, expected, hint in clashes:
                    if path is not None and (clash := ours.get(same_file(path))) is not None:
                        (pe, own), what, verb = clash, *doing.split()
                        # (A link is one file under two names: both said.)
                        named = f"{own!r}" if own == path else f"{own!r}, one file with {path!r}"
                        raise InvalidSpec(
                            f"{what} {pe!r} of pipeline {spec.pipeline!r} {verb} {named}, "
                            f"which {role} {element.id!r} of {other.status} pipeline "
                            f"{other.name!r} {does}",
                            expected=expected,
                            received=path,
                            hint=hint,
                        )

    def _deploy_element(self, pipeline: str, element: ElementSpec, fresh: bool) -> None:
        """Start ``element`` on ``element.node`` under the PE's newest epoch."""
        epoch = self.registry.epoch(pipeline, element.id)
        self.agent(element.node).put(
            f"/pipelines/{pipeline}/elements/{element.id}",
            json={"element": element.model_dump(mode="json"), "fresh": fresh, "epoch": epoch},
        )

    def _remove_quietly(self, pipeline: str, element: ElementSpec) -> bool:
        """Remove ``element``'s instance from its node; whether the node did (a failure is
        logged)."""
        try:
            self.agent(element.node).delete(f"/pipelines/{pipeline}/elements/{element.id}")
        except FogshiftError as exc:
            log.warning("could not remove %s/%s: %s", pipeline, element.id, exc)
            return False
        return True

    def _heard(self, node: str) -> bool:
        """Whether ``node`` is registered and healthy (heard of within the node timeout)."""
        record = self.registry.node(node)
        return record is not None and self.healthy(record)

    def stop(self, name: str) -> StopResult:
        """Stop every PE of a pipeline; its streams, checkpoints and output stay. A
        migration, restore, key move or scale under way ends first (they start instances,
        or append to the pipeline's inputs).

        Raises:
            Conflict: Such an operation still ran after ``STOP_WAIT_S``; nothing stopped.
        """
        # The key-move locks before the pipeline's (a scale holds its element's throughout).
        keyed = {e.partition.of for e in self.pipeline(name).spec.elements if e.partition}
        with self._key_operations_ended(name, keyed), self.pipeline_lock(name):
            while True:
                pes = [e.id for e in self.pipeline(name).spec.elements]
                with self._stopping(name, pes):
                    # (A scale that ran meanwhile may have added partitions: theirs too.)
                    if {e.id for e in self.pipeline(name).spec.elements} <= set(pes):
                        return self._stop_pipeline(name)

    @contextlib.contextmanager
    def _key_operations_ended(self, name: str, elements: set[str]) -> Iterator[None]:
        """Hold the key-move locks of the partitioned ``elements`` of pipeline ``name``, once
        the key moves and scales under way on them ended (within ``STOP_WAIT_S``; taken all
        at once or none, so no order of taking them can deadlock). A scale holds its
        partitions' sections only while it changes them: without this, a stop ran beside
        its waits, which then appended waves and rescale records to a stopped pipeline's
        input (or a fresh deploy's).

        Raises:
            Conflict: One still ran after ``STOP_WAIT_S``; nothing was stopped.
        """
        locks = [element_lock_of(name, element) for element in sorted(elements)]
        deadline = time.monotonic() + STOP_WAIT_S
        while True:
            taken = [lock for lock in locks if lock.acquire(blocking=False)]
            if len(taken) == len(locks):
                break
            for lock in taken:
                lock.release()
            if time.monotonic() >= deadline:
                raise Conflict(
                    f"cannot stop pipeline {name!r}: a key move or scale of "
                    f"{', '.join(sorted(elements))} is under way",
                    expected="no key move or scale of its partitioned elements under way",
                    received=f"one still running after {STOP_WAIT_S:.0f} s",
                    hint="its own command reports when it ends; then stop again",
                )
            time.sleep(0.1)
        try:
            yield
        finally:
            for lock in taken:
                lock.release()

    def _stop_pipeline(self, name: str, heard_only: bool = False) -> StopResult:
        """Stop pipeline ``name`` on every node that hosts a PE or standby of it; ``stopped``
        whichever node answers. With ``heard_only``, a node that is not healthy is not asked
        (told as not reached): the reconciler stops its instances once it is heard again."""
        record = self.pipeline(name)
        self.registry.set_status(name, PipelineState.STOPPING)
        unreachable = []
        standbys = self.registry.standbys(name)
        for standby in standbys:
            self.registry.drop_standby(standby.pipeline, standby.element, standby.epoch)
        for node in sorted({*record.placement.values(), *(s.node for s in standbys)}):
            if self.removed(node):
                continue  # (nothing of it runs there: a PE a restore could not move yet)
            if heard_only and not self._heard(node):
                unreachable.append(node)
                continue
            try:
                removed = self.agent(node).delete(f"/pipelines/{name}")
            except Unavailable:
                unreachable.append(node)
            except FogshiftError as exc:
                # (An agent answering an error stopped the stop half-way, the pipeline left
                # "stopping" with some PEs running: the other nodes are stopped all the
                # same, and this one is told as not stopped, as one away is.)
                log.warning("node %s did not stop pipeline %s: %s", node, name, exc.message)
                unreachable.append(node)
            else:
                self._keep_stopped_counts(record, node, removed)
        self.registry.set_status(name, PipelineState.STOPPED)
        log.info("stopped pipeline %s%s", name,
                 f" (not heard: {', '.join(unreachable)})" if unreachable else "")  # fmt: skip
        self.permissions.sync_quietly(self.registry)
        return StopResult(
            pipeline=name, status=PipelineState.STOPPED, unreachable_nodes=unreachable
        )

    def _keep_stopped_counts(self, record: PipelineRecord, node: str, removed: Any) -> None:
        """Keep the counts of the PEs placed on ``node`` as its agent gave them when it
        stopped them (``removed``: its answer, a list of ``ElementInfo``): they come from
        the nodes' reports, gone with the instances, so a stopped pipeline showed ``in 0``
        for every PE and a sink's ``out 0`` (:meth:`status` reads them back)."""
        for item in removed if isinstance(removed, list) else []:
            try:
                info = ElementInfo.model_validate(item)
            except ValueError:  # (an answer out of contract: nothing kept, the stop goes on)
                continue
            if record.placement.get(info.element) == node:  # (not a standby's)
                self.stopped_counts[(record.name, info.element)] = StoppedCounts(
                    events_in=info.events_in, lines_written=info.lines_written,
                    restarts=info.restarts,
                )  # fmt: skip

    def delete(self, name: str) -> DeleteResult:
        """Delete a stopped (or failed) pipeline: its streams (records and dead letters), its
        central checkpoints, what each node holds of it, and its entry. Its sinks' output
        files stay (they are the user's). Its PEs' epochs are kept, so a deploy of the name
        again fences any instance of it still somewhere; a node not heard now discards what
        it holds of it once it is (:meth:`Reconciler._discard_left`).

        Order: the streams first — a broker away refuses the delete with nothing changed
        but streams already gone (the pipeline stays listed, stopped; delete again).

        Raises:
            UnknownPipeline: No pipeline of that name.
            Conflict: It is not stopped or failed.
            BrokerError: Its streams could not all be deleted; it stays listed.
        """
        with self.pipeline_lock(name):
            record = self.pipeline(name)
            if record.status not in (PipelineState.STOPPED, PipelineState.FAILED):
                raise Conflict(
                    f"cannot delete pipeline {name!r}: it is {record.status}",
                    expected="a stopped or failed pipeline",
                    received=str(record.status),
                    hint=f"`fogshift stop {name}` first: a delete drops its streams and "
                    "checkpoints, which a running pipeline uses",
                )

            try:
                streams = self.broker.run(partial(delete_pipeline_streams, pipeline=name))
            except FogshiftError:
                raise
            except Exception as exc:
                raise BrokerError(
                    f"cannot delete pipeline {name!r}: the broker refused to delete its "
                    f"streams: {_said(exc)}",
                    hint="`fogshift nodes` says whether the broker is up; delete again",
                ) from exc
            # Its files go with a collection once past the store's horizon (a restore or
            # copy of another PE may still read a file an expired checkpoint named): the
            # central loop's, every ten minutes, or a pull's that expires a checkpoint.
            self.central.forget(name)
            self._forget_runs(name)
            self.registry.delete_pipeline(name)
            cleared, unreachable = [], []
            for node in self.registry.nodes():
                if not self.healthy(node):
                    unreachable.append(node.name)
                    continue
                try:
                    self.agent(node.name).delete(f"/pipelines/{name}", params={"discard": True})
                except FogshiftError as exc:
                    log.warning("node %s did not discard deleted pipeline %s: %s", node.name,
                                name, exc.message)  # fmt: skip
                    unreachable.append(node.name)
                else:
                    cleared.append(node.name)
        self.permissions.sync_quietly(self.registry)
        log.info("deleted pipeline %s (streams %s)", name, ", ".join(streams) or "none")
        return DeleteResult(
            pipeline=name, streams=streams, nodes=sorted(cleared),
            unreachable_nodes=sorted(unreachable),
        )  # fmt: skip

    def status(self, name: str | None = None, counts: bool = True) -> list[PipelineStatus]:
        """Per pipeline, per PE: node, state, events in/out, dead letters (``counts``:
        read from the broker; else the streams' counts are 0)."""
        records = [self.pipeline(name)] if name else self.registry.pipelines()
        nodes = {n.name: n for n in self.registry.nodes()}
        out = []
        for record in records:
            elements = []
            trimmed = self.registry.trimmed(record.name)
            stopped = self.stopped_counts if record.status == PipelineState.STOPPED else {}
            for element in record.spec.elements:
                node_name = record.placement[element.id]
                node = nodes.get(node_name)
                report = node.report.element(record.name, element.id) if node else None
                # A stopped PE's counts, as its node gave them at the stop (none reports it).
                counted = report or stopped.get((record.name, element.id)) or StoppedCounts()
                stream = stream_name(record.name, element.id)
                stored = (
                    self.broker.run(partial(subject_counts, stream=stream), again_if_closed=True)
                    if counts
                    else {}
                )
                role = element.role
                state: PEState | PlacementState | PipelineState
                if node is None or not self.healthy(node):
                    state = PlacementState.NODE_LOST
                elif report is None:
                    running = record.status == PipelineState.RUNNING
                    state = PlacementState.PENDING if running else record.status
                else:
                    state = report.state
                if role == "sink":
                    out_count = counted.lines_written or 0
                else:
                    # (Records trimmed from the stream count: see broker.history.)
                    out_count = stored.get(data_subject(record.name, element.id), 0)
                    out_count += trimmed.get(element.id, (0, 0))[0]
                planned = self.planned(record.name, element.id)
                error = report.error if report else None
                restore = self.last_restore.get((record.name, element.id))
                if (
                    state == PlacementState.NODE_LOST
                    and restore is not None
                    and restore.status == RestoreStatus.FAILED
                    and restore.error
                ):
                    # (Automatic restores failing over and over showed only "node-lost",
                    # the reason in --json's last_restore.)
                    error = f"its last restore, onto {restore.target}, failed: {restore.error}"
                elif state == PlacementState.NODE_LOST:
                    error = self._lost_note(record, element.id, node_name, node)
                elements.append(
                    ElementStatus(
                        element=element.id,
                        kind=element.kind,
                        node=node_name,
                        state=state,
                        events_in=counted.events_in,
                        events_out=out_count,
                        dead_letters=stored.get(dead_subject(record.name, element.id), 0)
                        + trimmed.get(element.id, (0, 0))[1],
                        restarts=counted.restarts,
                        error=error,
                        planned_backup=planned.backup,
                        planned_redeploy=planned.redeploy,
                        last_restore=restore,
                        inputs=list(element.inputs),
                        epoch=report.epoch if report else None,
                        last_migration=self.last_migration.get((record.name, element.id)),
                        standby=self.standby_status(record.name, element.id),
                        standby_missing=self.standby_missing(record, element),
                        **_partition_fields(element),
                    )
                )
            out.append(
                PipelineStatus(
                    pipeline=record.name,
                    status=record.status,
                    elements=elements,
                    error=self.registry.failure(record.name)
                    if record.status == PipelineState.FAILED
                    else None,
                    warnings=[
                        warning
                        for element_id in dict.fromkeys(
                            e.partition.of for e in record.spec.elements if e.partition
                        )
                        for warning in shared_node_warnings(record, element_id)
                    ]
                    + self.trim_warnings(record)
                    if record.status == PipelineState.RUNNING
                    else [],
                )
            )
        return out

    def _lost_note(
        self, record: PipelineRecord, element_id: str, node_name: str, node: NodeRecord | None
    ) -> str:
        """What is done about PE ``element_id``, whose node is lost (short: a cell of
        `status`): an operator saw only "node-lost" until the PE showed up elsewhere."""
        silent = None if node is None else time.time() - node.last_seen
        removed = node is None and self.removed(node_name)
        lost = f"node {node_name} " + (
            "removed" if removed else "gone" if silent is None else f"silent {silent:.0f} s"
        )
        doing = self._migrating.get((record.name, element_id))
        recovery = record.spec.recovery
        if record.status == PipelineState.STOPPED and removed:
            return f"{lost}; `fogshift start {record.name}` restores it elsewhere"
        if record.status != PipelineState.RUNNING:
            return lost  # (nothing restores a PE of a pipeline that does not run)
        if doing is not None:
            return f"{lost}; {doing} under way"
        if removed:
            return f"{lost}; restore due (automatic: whatever the recovery)"
        if node is None:  # (added again, not heard yet: started there once it is)
            return f"node {node_name} not heard yet since it was added again"
        if not recovery.auto:
            return f"{lost}; recovery is manual: `fogshift restore {record.name} {element_id}`"
        if silent is not None and silent < recovery.detect_after_s:
            # ("restored elsewhere after 10 s" read as done already.)
            return f"{lost}; to be restored elsewhere at {recovery.detect_after_s:g} s of silence"
        return f"{lost}; restore due (automatic)"

    def standby_missing(self, record: PipelineRecord, element: ElementSpec) -> str | None:
        """Why a PE whose spec asks for a hot standby has none now (``None``: it has one,
        or none is asked for); :class:`~fogshift.orchestrator.standbys.Standbys` says."""
        return None

    def standby_status(self, pipeline: str, element_id: str) -> StandbyStatus | None:
        """The PE's standby for ``status``."""
        standby = self.registry.standby(pipeline, element_id)
        if standby is None:
            return None
        node = self.registry.node(standby.node)
        reported = node.report.element(pipeline, element_id) if node else None
        state: PEState | PlacementState
        if node is None or not self.healthy(node):
            state = PlacementState.NODE_LOST
        else:
            state = reported.state if reported is not None else PlacementState.PENDING
        seen = self.followed_of(standby)
        lag = None
        if seen is not None and seen.standby is not None:
            lag = max(0, seen.primary.progress - seen.standby.progress)
        return StandbyStatus(
            node=standby.node,
            epoch=standby.epoch,
            state=state,
            lag_events=lag,
            ready_ms=self.standby_ready_ms.get((pipeline, element_id)),
        )

    def errors(
        self, name: str, limit: int = 1000, element_id: str | None = None
    ) -> list[DeadLetter]:
        """The pipeline's dead letters with their reasons: each PE's newest ``limit``, PE by
        PE, oldest first (a PE with many never hides another's); ``element_id``: only that
        PE's (the dashboard's PE page read every PE's stream to show one's).

        Raises:
            NotFound: The pipeline has no element ``element_id``.
        """
        record = self.pipeline(name)
        elements = list(record.spec.elements)
        if element_id is not None:
            elements = [e for e in elements if e.id == element_id]
            if not elements:
                raise NotFound(
                    f"pipeline {name!r} has no element {element_id!r}",
                    expected="one of " + ", ".join(e.id for e in record.spec.elements),
                    received=element_id,
                )
        letters: list[DeadLetter] = []
        for element in elements:
            stream = stream_name(name, element.id)

            async def dead(js: Any, stream: str = stream, pe: str = element.id) -> list[Any]:
                # The newest ``limit`` only, read back from the stream's end in growing
                # windows: every dead letter of the stream was read, then all but ``limit``
                # dropped (the dashboard asks for 50 every 15 s).
                end = await _stored_end(js, stream)
                span = max(8 * limit, 1024)
                while True:
                    start = max(0, end - span)
                    got = await fetch_range(js, stream, dead_subject(name, pe), start, end)
                    if len(got) >= limit or start == 0:
                        return got[-limit:]
                    span *= 8

            for msg in self.broker.run(dead, timeout=60, again_if_closed=True)[-limit:]:
                # The dead letter's own format (``broker.publish``), read where it is stored.
                try:
                    payload = json.loads(msg.data)
                    # (A PE writes the input's text and a reason.)
                    if not isinstance(payload["body"], str) or not isinstance(
                        payload.get("reason"), str
                    ):
                        raise TypeError("a dead letter's body and reason are text")
                    letter = DeadLetter(
                        element=element.id,
                        seq=payload["seq"],
                        reason=payload.get("reason"),
                        event=payload["body"],
                    )
                except (ValueError, KeyError, TypeError, RecursionError):
                    # (not one a PE wrote: left out, as the PEs leave strangers' messages)
                    log.warning("%s/%s: message %s on the dead-letter subject is no dead "
                                "letter, left out", name, element.id,
                                msg.metadata.sequence.stream)  # fmt: skip
                    continue
                letters.append(letter)
        return letters

    def events(
        self,
        name: str,
        element_id: str,
        key: str | None = None,
        after: int | None = None,
        tail: int | None = None,
        limit: int = 500,
    ) -> EventPage:
        """A page of the events a PE emitted, read from its output stream (dead letters and
        control markers left out).

        Args:
            name: The pipeline.
            element_id: The PE.
            key: Only events whose ``key_by`` field has this value (as text, as the PE
                groups them); only for a keyed PE.
            after: Scan the ``limit`` stream sequences after this one (forward paging).
            tail: Without ``after``: scan the newest ``tail`` sequences (default ``limit``)
                and answer the last ``limit`` events among them.
            limit: The most sequences a forward page scans; the most events an answer has.

        Raises:
            UnknownPipeline: No such pipeline.
            UnknownElement: No such PE in it.
            NotKeyed: ``key`` was given for a PE without ``key_by``.
            InvalidInput: ``after`` for a partitioned element (each partition's stream has
                its own sequences), or ``after`` and ``tail`` both.
        """
        record = self.pipeline(name)
        parts = record.spec.partitions_of(element_id)
        element = parts[0] if parts else self._retired_partition(record, element_id)
        if element is None:
            element = self._element(record, element_id)
        _refuse_key(name, element_id, element, key, "its events have no key to select",
                    f"leave out key, or ask a keyed PE of {name}")  # fmt: skip
        if after is not None and tail is not None:
            # (Both were taken, and tail left out without a word.)
            raise InvalidInput(
                f"the events of {name}/{element_id} are read forward from `after` or back "
                "from the end by `tail`, not both",
                expected="`after` or `tail`",
                received=f"after={after}, tail={tail}",
                hint="leave one out: `after` pages forward, `tail` looks at the newest",
            )
        if not parts:
            return self._event_page(name, element, key, after, tail, limit)
        if after is not None:
            raise InvalidInput(
                f"cannot page forward through the events of {name}/{element_id}: it is "
                "partitioned, each partition's stream with sequences of its own",
                expected="`after` with one partition's id ("
                + ", ".join(p.id for p in parts)
                + "), or `tail` with the element's",
                received=f"after={after}",
                hint=f"e.g. `GET /pipelines/{name}/elements/{parts[0].id}/events?after={after}`",
            )
        # (A key's events since a move are in its new partition's stream, those before in
        # the one it left: every partition's newest, merged by when they were stored. A
        # partition a scale-in retired left its stream, which its readers still drain: its
        # events are the keys' before the rescale.)
        retired = [
            parts[0].model_copy(update={"id": i})
            for i in record.spec.retired_partitions_of(element_id)
        ]
        merged = [
            event.model_copy(update={"partition": part.id})
            for part in [*parts, *retired]
            for event in self._event_page(name, part, key, None, tail, limit).events
        ]
        merged.sort(key=lambda e: (e.stored, e.partition or "", e.seq))
        return EventPage(pipeline=name, element=element_id, key=key, events=merged[-limit:],
                         scanned_after=0, scanned_to=0, last_seq=0)  # fmt: skip

    @staticmethod
    def _retired_partition(record: PipelineRecord, element_id: str) -> ElementSpec | None:
        """``element_id`` as a partition a scale-in retired (see
        :meth:`PipelineSpec.retired_partitions_of`), to read its stream; None if it is none."""
        for of in sorted({e.partition.of for e in record.spec.elements if e.partition}):
            if element_id in record.spec.retired_partitions_of(of):
                return record.spec.partitions_of(of)[0].model_copy(update={"id": element_id})
        return None

    def _event_page(
        self,
        name: str,
        element: ElementSpec,
        key: str | None,
        after: int | None,
        tail: int | None,
        limit: int,
    ) -> EventPage:
        """:meth:`events` of one PE (a partition too)."""
        element_id = element.id
        stream = stream_name(name, element_id)

        async def read(js: Any) -> tuple[int, int, int, list[Any]]:
            end = await _stored_end(js, stream)
            if after is not None:
                start, stop = min(after, end), min(end, after + limit)
            else:
                start, stop = max(0, end - (tail or limit)), end
            messages = await fetch_range(js, stream, data_subject(name, element_id), start, stop)
            return start, stop, end, messages

        start, stop, end, messages = self.broker.run(read, timeout=60, again_if_closed=True)
        events: list[StreamEvent] = []
        single = len(element.inputs) == 1  # a multi-input PE's events come from a cut
        for msg in messages:
            try:
                payload = json.loads(msg.data)
                # A PE writes its body as text and a finite timestamp: anything else is no
                # event of a PE's (a body nested 300 deep failed the whole answer, an
                # infinite timestamp its model).
                if not isinstance(payload["body"], str):
                    raise TypeError("an event's body is text")
                if not math.isfinite(float(payload["timestamp"])):
                    raise ValueError("an event's timestamp is finite")
                body = _decoded(payload["body"])
                event = StreamEvent(
                    seq=msg.metadata.sequence.stream,
                    epoch=int((msg.headers or {}).get(EPOCH_HEADER, 0)),
                    stored=msg.metadata.timestamp.timestamp(),
                    timestamp=payload["timestamp"],
                    creator=payload["creator"],
                    body=body,
                    origin=_origin(msg.headers) if single else None,
                )
            except (ValueError, KeyError, TypeError, RecursionError):
                log.warning("%s/%s: message %s on the data subject is no event, left out",
                            name, element_id, msg.metadata.sequence.stream)  # fmt: skip
                continue
            if key is not None and (
                element.key_by is None or key_text(event.body, element.key_by) != key
            ):
                continue
            events.append(event)
        if after is None:
            events = events[-limit:]
        return EventPage(
            pipeline=name, element=element_id, key=key, events=events,
            scanned_after=start, scanned_to=stop, last_seq=end,
        )  # fmt: skip

    def latency(self, name: str) -> list[HopLatency]:
        """Each single-input PE's newest per-hop latency (:class:`HopLatency`); a PE that has
        emitted nothing yet, or whose input event is no longer stored, is left out."""
        record = self.pipeline(name)

        async def read(js: Any) -> list[HopLatency]:
            out: list[HopLatency] = []
            for element in record.spec.elements:
                if len(element.inputs) != 1:
                    continue
                (source,) = element.inputs
                stream = stream_name(name, element.id)
                end = await _stored_end(js, stream)
                # The newest data message among the last few (fence and cut markers too).
                recent = await get_range(
                    js, stream, data_subject(name, element.id), max(0, end - LATENCY_SCAN), end
                )
                if not recent or ORIGIN_HEADER not in recent[-1].headers:
                    continue
                newest = recent[-1]
                origin = int(newest.headers[ORIGIN_HEADER])
                came = await get_range(
                    js, stream_name(name, source), data_subject(name, source), origin - 1, origin
                )
                if not came:
                    continue
                out.append(
                    HopLatency(
                        element=element.id, input=source, seq=newest.seq, input_seq=origin,
                        stored=newest.stored_at,
                        latency_ms=round((newest.stored_at - came[0].stored_at) * 1000, 1),
                    )
                )  # fmt: skip
            return out

        return list(self.broker.run(read, timeout=30, again_if_closed=True))

    def twin_state(
        self, name: str, element_id: str, key: str | None = None, limit: int = 1000
    ) -> TwinState:
        """A stateful PE's state per key, read by the node that runs it from its live state
        store, as of its newest committed batch."""
        record = self.pipeline(name)
        parts = record.spec.partitions_of(element_id)
        element = parts[0] if parts else self._element(record, element_id)
        # (Asked of its node, the key was dropped: the whole state came back, unsaid.)
        _refuse_key(name, element_id, element, key, "it holds no state per key",
                    f"`fogshift state {name} {element_id}` without a key shows its whole "
                    "state")  # fmt: skip
        if record.status != PipelineState.RUNNING:
            raise Unavailable(
                f"the state of {name}/{element_id} cannot be read: pipeline {name!r} is "
                f"{record.status} (a PE's state is read from its running query)",
                expected="a running pipeline",
                received=str(record.status),
                hint=f"`fogshift status {name}` shows it; `fogshift start {name}` starts a "
                "stopped one again where it stopped, its state kept",
            )
        params: dict[str, Any] = {"limit": limit}
        if key is not None:
            params["key"] = key

        def ask(pe: str) -> TwinState:
            node = record.placement[pe]
            known = self.registry.node(node)
            if known is None or not self.healthy(known):
                # (Asked anyway, a partitioned node held the read for the client's whole
                # timeout, and one lost partition every partition's read.)
                raise Unavailable(
                    f"the state of {name}/{pe} cannot be read now: its node {node!r} is lost",
                    hint="it is restored elsewhere (or its node comes back); try again then",
                )
            try:
                return self.agent(node).call(
                    TwinState, "GET", f"/pipelines/{name}/elements/{pe}/state", params=params
                )
            except NotFound as exc:  # (being restarted or restored, its node just back)
                raise Unavailable(
                    f"the state of {name}/{pe} cannot be read now: node {node!r} does not run "
                    f"it ({exc.message})",
                    hint="the orchestrator starts it again; try in a few seconds",
                ) from exc

        if not parts:
            return ask(element_id)
        owners = self._read_owners(name, parts[0], element_id)
        if key is not None:
            # A key lives in one partition: the one its moves stored in the stream give it
            # (CRC-32's, if it never moved, or they cannot be read); asked first, then the
            # others. A key moving whose origin has not sent its state yet is in two: at its
            # origin with its state, at its target waiting for it. Its state is the answer.
            # (The owner first: a partition restored from a checkpoint before the key left
            # holds its older state again until it replays the move.)
            first = owners.owner(key) if owners else partition_of_key(key, len(parts))
            first = first if first < len(parts) else 0
            # (One partition after another, the owner first: its answer is the usual one,
            # and a lost node elsewhere does not fail it.)
            answers: list[TwinState] = []
            for part in [parts[first], *(p for p in parts if p is not parts[first])]:
                answer = ask(part.id)
                if any(e.waiting is None for e in answer.entries):
                    if part is parts[first] or not _left_behind(owners, key):
                        return _with_partition(answer)
                    continue  # (an older copy: its owner's answer, or the wait, is the one)
                answers.append(answer)
            waits = next((a for a in answers if a.entries), None)
            if waits is None and owners is not None and owners.last_move(key):
                waits = self._in_flight(name, element_id, parts, key, ask)
            # (Found nowhere: the owner's answer, and its node, says so.)
            if waits is not None:
                return _with_partition(waits)
            return answers[0].model_copy(update={"element": element_id})
        # The whole partitioned element: every partition's keys, each read as of its own
        # newest committed batch (the answer's batch is the oldest of those). Where each
        # stood first: a key moving whose origin has sent its state and whose target has
        # not taken it in is held by neither (each commits the move in its own batch).
        before = self._positions(name, parts) if owners is not None and owners.last else {}
        answers = [ask(p.id) for p in parts]
        batches = [a.batch for a in answers]
        held = {  # (a key's state at its owner: a copy elsewhere is an older one's, restored)
            (e.key, a.element)
            for a in answers
            for e in a.entries
            if e.waiting is None and owners is not None
            and parts[min(owners.owner(e.key), len(parts) - 1)].id == a.element
        }  # fmt: skip
        owned = {k for k, _ in held}
        kept = [
            e.model_copy(update={"partition": a.element})
            for a in answers
            for e in a.entries
            if e.waiting is not None
            or (e.key, a.element) in held
            or (e.key not in owned and not _left_behind(owners, e.key))
        ]
        listed = {e.key for e in kept}
        moving = self._moving(name, element_id, parts, before, listed) if before else []
        entries = sorted([*kept, *moving], key=lambda e: e.key or "")
        # A partition's page cut short (by ``limit``, or its node's page size) ends at its
        # last key: the others' keys past it would leave a hole before them.
        ends = [a.entries[-1].key or "" for a in answers
                if a.entries and len(a.entries) < a.keys + a.waiting]  # fmt: skip
        if ends:
            entries = [e for e in entries if (e.key or "") <= min(ends)]
        return TwinState(
            pipeline=name,
            element=element_id,
            node=", ".join(dict.fromkeys(a.node for a in answers)),
            batch=None if None in batches else min(b for b in batches if b is not None),
            key_by=answers[0].key_by,
            # (Older copies left out are no keys of the element.)
            keys=sum(a.keys for a in answers)
            - sum(1 for a in answers for e in a.entries if e.waiting is None)
            + sum(1 for e in kept if e.waiting is None),
            waiting=sum(a.waiting for a in answers) + len(moving),
            entries=entries[:limit],
        )

    def _positions(self, name: str, parts: list[ElementSpec]) -> dict[str, int | None]:
        """How far each partition had committed its first input (``None``: not known: its
        node lost, or not answering)."""
        placement = self.pipeline(name).placement
        found: dict[str, int | None] = {}
        for part in parts:
            node = placement.get(part.id)
            known = self.registry.node(node) if node else None
            healthy = known is not None and self.healthy(known)
            found[part.id] = (self._position(name, part.id, parts[0].inputs[0], known.name)
                              if healthy and known is not None else None)  # fmt: skip
        return found

    def _moving(
        self, name: str, element_id: str, parts: list[ElementSpec],
        before: dict[str, int | None], listed: set[str | None],
    ) -> list[TwinEntry]:  # fmt: skip
        """The keys no partition listed whose newest move's state is stored at an input
        position their target had not reached ``before`` the partitions were asked: in
        flight (as :meth:`_in_flight` says of one key), each a waiting entry at its target.
        Taken in since, the target's answer lists the key; a key listed nowhere whose target
        had passed its state has none (the PE dropped it)."""
        owners = self._read_owners(name, parts[0], element_id)  # (states stored since)
        if owners is None:
            return []
        moving = []
        for key, (move, seq) in owners.carried.items():
            if key in listed or owners.last_move(key) != move:
                continue
            owner = owners.owner(key)
            target = parts[owner if owner < len(parts) else 0]
            position = before.get(target.id)
            if position is None or position < seq:
                waiting = KeyWaiting(move=move, events=0)
                moving.append(TwinEntry(key=key, state=None, partition=target.id,
                                        waiting=waiting))  # fmt: skip
        return moving

    def _in_flight(
        self, name: str, element_id: str, parts: list[ElementSpec], key: str,
        ask: Callable[[str], TwinState],
    ) -> TwinState | None:  # fmt: skip
        """A moved key no partition holds: waiting for its move (its origin has sent the state
        it held, its target not yet taken it in: each commits the move in its own batch), or
        ``None``: it has no state (the move carried none, or the target took it and the PE
        has dropped it since). The moves are read again: the state may have been stored
        since the partitions were asked."""
        owners = self._read_owners(name, parts[0], element_id)
        seq = owners.carried_at(key) if owners is not None else None
        move = owners.last_move(key) if owners is not None else None
        if owners is None or seq is None or move is None:
            return None
        owner = owners.owner(key)
        target = parts[owner if owner < len(parts) else 0]  # (as twin_state asks it first)
        node = self.pipeline(name).placement.get(target.id)
        position = self._position(name, target.id, parts[0].inputs[0], node) if node else None
        if position is not None and position >= seq:
            # Taken in (so asked again, once): no entry there now means none.
            answer = ask(target.id)
            return answer if answer.entries else None
        entry = TwinEntry(key=key, state=None, waiting=KeyWaiting(move=move, events=0))
        return TwinState(pipeline=name, element=target.id, node=node or "", batch=None,
                         key_by=target.key_by, keys=0, waiting=1, entries=[entry])  # fmt: skip


def _left_behind(owners: Ownership | None, key: str | None) -> bool:
    """Whether a state of ``key`` at a partition that does not own it is an older copy: its
    newest move's state was sent (the origin holds none after), so a partition holding
    one was restored from a checkpoint before the move and holds it until it replays the
    move. While that state is not sent, the origin's is the key's."""
    if owners is None or key is None:
        return False
    move = owners.last_move(key)
    return move is not None and owners.pending.get(key) != move


def _with_partition(answer: TwinState) -> TwinState:
    """A partition's answer for one key, each entry naming that partition (as a read of the
    whole element names each key's; its ``partition`` was null)."""
    entries = [e.model_copy(update={"partition": answer.element}) for e in answer.entries]
    return answer.model_copy(update={"entries": entries})


#: Opening brackets below which a body cannot nest deeper than an answer can carry.
_SHALLOW = 200


def _decoded(text: Any) -> Any:
    """An event's body text decoded, or the text itself if it is not JSON or nests deeper
    than an answer can carry (pydantic serialises ~254 levels; Python's JSON reads ~1000)."""
    try:
        body = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return text
    if isinstance(text, str) and text.count("[") + text.count("{") >= _SHALLOW:
        try:
            to_json(body)
        except ValueError:  # (PydanticSerializationError: too deep)
            return text
    return body


async def _stored_end(js: Any, stream: str) -> int:
    """The last sequence of ``stream``, 0 if it does not exist (a deploy or scale that failed
    before making it: for what a read shows, nothing is stored)."""
    try:
        return await last_seq(js, stream)
    except NotFoundError:
        return 0


def shared_node_warnings(
    record: PipelineRecord, element_id: str, node: str | None = None, name: str | None = None
) -> list[str]:
    """What to say of each node (``node`` only, if given) that runs two or more partitions
    of the partitioned element ``element_id``: a key move to it is refused there as
    ambiguous, which nothing said when they came together (a spec's ``partitions: [a,
    a]``, a migration, a scale's ``--on``). ``name``: the partition to suggest (else the
    node's first)."""
    by_node: dict[str, list[str]] = {}
    for part in record.spec.partitions_of(element_id):
        by_node.setdefault(record.placement.get(part.id, ""), []).append(part.id)
    return [
        f"{where} runs {len(ids)} partitions of {element_id!r} now ({', '.join(ids)}): a key "
        f"move `--to {where}` is refused there as ambiguous; name the partition instead "
        f"(`--to {name if name in ids else ids[0]}`)"
        for where, ids in sorted(by_node.items())
        if where and len(ids) > 1 and node in (None, where)
    ]


def _partition_fields(element: ElementSpec) -> dict[str, Any]:
    """``partition_of``, ``partition`` and ``partitions`` of a status entry."""
    part = element.partition
    if part is None:
        return {}
    return {"partition_of": part.of, "partition": part.index, "partitions": part.count}


def _origin(headers: dict[str, str] | None) -> int | None:
    """The input sequence a single-input PE's record names in its origin header."""
    value = (headers or {}).get(ORIGIN_HEADER)
    return int(value) if value is not None else None


def _refuse_key(
    name: str, element_id: str, element: ElementSpec, key: str | None, why: str, hint: str
) -> None:
    """Refuse ``key`` asked of PE ``element_id`` of pipeline ``name`` (``element``: it, or
    one of its partitions) if it has no ``key_by``.

    Raises:
        NotKeyed: It has none, and a key was given.
    """
    if key is not None and element.key_by is None:
        raise NotKeyed(
            f"{name}/{element_id} is not keyed: {why}",
            expected="a key only for a PE with key_by",
            received=f"key={key!r} for {element_id!r}, kind {element.kind!r}, without key_by",
            hint=hint,
        )


def _said(exc: BaseException) -> str:
    """``exc`` as a failed pipeline's reason says it: a fogshift error's message, hint
    and all; any other with its type."""
    if isinstance(exc, FogshiftError):
        return exc.render()
    return f"{type(exc).__name__}: {exc}"
