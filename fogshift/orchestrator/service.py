"""What the orchestrator does: deploy, stop, report, and keep the cluster as specified."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fogshift.agent.exceptions import UnknownElement
from fogshift.broker.client import (
    BrokerAddress,
    SyncJetStream,
    delete_pe_stream,
    ensure_pe_stream,
    fetch_range,
    last_seq,
    subject_counts,
)
from fogshift.broker.naming import data_subject, dead_subject, stream_name
from fogshift.broker.publish import fence
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.spark_dir import progress_of
from fogshift.common.http import ServiceClient, node_token
from fogshift.exceptions import FogshiftError, InvalidInput, Unavailable
from fogshift.migration.exceptions import MigrationFailed, MigrationInProgress
from fogshift.migration.procedure import MigrationSteps, Mode
from fogshift.migration.procedure import migrate as run_migration
from fogshift.migration.procedure import roll_back as run_rollback
from fogshift.orchestrator.exceptions import PipelineExists, UnknownNode, UnknownPipeline
from fogshift.orchestrator.permissions import BrokerPermissions
from fogshift.orchestrator.planning import (
    FogTopology,
    LiveNode,
    LivePE,
    build_topology,
    describe_plan,
    nearest_first,
)
from fogshift.orchestrator.registry import NodeRecord, Operation, PipelineRecord, Registry
from fogshift.planner import plan as plan_backups
from fogshift.planner.model import Topology
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.restoration.procedure import Copy, RestoreSteps
from fogshift.restoration.procedure import restore as run_restore
from fogshift.runtime.kinds import KINDS
from fogshift.spec.loader import parse_spec, validate_spec
from fogshift.spec.models import ElementSpec, PipelineSpec

log = logging.getLogger("fogshift.orchestrator")


def _aged(snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
    """A node-level checkpoint summary with its age."""
    if snapshot is None:
        return None
    return {**snapshot, "age_ms": round((time.time() - snapshot["created"]) * 1000, 1)}


class OrchestratorConfig(BaseModel):
    """Orchestrator settings (frozen; built at the CLI edge).

    Attributes:
        home: Where the registry database lives.
        host: Interface to bind; loopback unless told otherwise.
        port: TCP port.
        token: The cluster's bearer token.
        broker_file: The broker address file.
        node_timeout_s: A node silent for longer is reported unhealthy.
        reconcile_s: Interval of the loop that redeploys PEs missing from healthy nodes,
            restores PEs of lost nodes and removes superseded instances.
        central_interval_s: Interval of central-level checkpoint pulls.
        duplicate_window_s: The broker's de-duplication window of new streams.
        plan_interval_s: Interval of the backup/redeploy planner (see ``planning``).
        plan_time_limit_s: Time limit of one exact solve; the greedy answers when it is hit.
        broker_config: The config of the nats-server ``fogshift up`` started (``None``: an
            external broker, whose users fogshift does not manage).
        broker_pid: That server's process, signalled to reload per-node rights.
        test_pause_at: Test hook: ``<kind>:<phase>`` of an operation (e.g.
            ``migration:switching``, ``restore:installing``) at which this orchestrator stops,
            once the journal has recorded that phase and before its side effect, and waits to
            be killed. ``None`` (always, outside tests): never.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    token: str = Field(min_length=16)
    broker_file: Path
    node_timeout_s: float = Field(default=5.0, gt=0)
    reconcile_s: float = Field(default=2.0, gt=0)
    central_interval_s: float = Field(default=15.0, gt=0)
    duplicate_window_s: float = Field(default=120.0, gt=0)
    plan_interval_s: float = Field(default=10.0, gt=0)
    plan_time_limit_s: float = Field(default=5.0, gt=0)
    test_pause_at: str | None = Field(default=None, pattern=r"^(migration|restore):[a-z_]+$")
    broker_config: Path | None = None
    broker_pid: int | None = Field(default=None, ge=1)

    @property
    def topology_file(self) -> Path:
        """The fog topology (node capacities, link bandwidths) the planner uses."""
        return self.home / "topology.yaml"


class Orchestrator:
    """The central controller. Thread-safe; one instance per orchestrator process."""

    def __init__(self, config: OrchestratorConfig) -> None:
        self.config = config
        self.registry = Registry(config.home / "orchestrator.db")
        self.broker = SyncJetStream(BrokerAddress.load(config.broker_file))
        #: Each node's broker rights follow placement (least privilege).
        self.permissions = BrokerPermissions(config.broker_config, config.broker_pid)
        self._agents: dict[str, ServiceClient] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        #: Owner of the journal entries this process writes: an unfinished entry of another
        #: owner was left by an orchestrator that died (see :meth:`recover_operations`).
        self.run_id = uuid.uuid4().hex[:12]
        # PEs under migration or restoration: those operations own their instances.
        self._migrating: set[tuple[str, str]] = set()
        self.central = CentralStore(config.home / "central")
        self.central_stats: dict[tuple[str, str], dict[str, Any]] = {}
        self.replica_stats: dict[tuple[str, str], dict[str, Any]] = {}
        #: The report of each PE's last restore (manual or automatic).
        self.last_restore: dict[tuple[str, str], dict[str, Any]] = {}
        self.started_at = time.time()
        #: The latest plan (``planning.describe_plan``), ``computed_at`` and ``error``.
        self.plan: dict[str, Any] = {"assignments": {}, "error": "not computed yet"}
        self._topology: Topology | None = None
        #: The central node of the fog topology ``_topology`` was built from.
        self._central: str | None = None

    # -- nodes ------------------------------------------------------------------------------

    def heartbeat(self, name: str, report: dict[str, Any]) -> None:
        """Record that node ``name`` is alive and what it runs."""
        self.registry.heartbeat(name, report["url"], report.get("pid"), report.get("pgid"), report)

    def healthy(self, node: NodeRecord) -> bool:
        return time.time() - node.last_seen <= self.config.node_timeout_s

    def node_names(self) -> list[str]:
        return [n.name for n in self.registry.nodes()]

    def agent(self, name: str) -> ServiceClient:
        """A client for node ``name``'s agent."""
        node = self.registry.node(name)
        if node is None:
            raise UnknownNode(
                f"node {name!r} has never registered",
                expected="one of " + (", ".join(self.node_names()) or "(none)"),
            )
        with self._lock:
            client = self._agents.get(name)
            if client is None or client.url != node.url:
                # The node's own token: a node never receives the operator token.
                token = node_token(self.config.token, name)
                client = ServiceClient(node.url, token, f"node agent {name!r}", 120)
                self._agents[name] = client
            return client

    def nodes(self) -> list[dict[str, Any]]:
        out = []
        for node in self.registry.nodes():
            out.append(
                {
                    "name": node.name,
                    "url": node.url,
                    "pid": node.pid,
                    "pgid": node.pgid,
                    "healthy": self.healthy(node) and bool(node.report.get("ready")),
                    "alive": self.healthy(node),
                    "ready": bool(node.report.get("ready")),
                    "error": node.report.get("error"),
                    "last_seen_s": round(time.time() - node.last_seen, 3),
                    "cpu_percent": node.report.get("cpu_percent"),
                    "replicas": [
                        f"{r['pipeline']}/{r['element']}@{r['id']}"
                        for r in node.report.get("replicas", [])
                    ],
                    "elements": [
                        f"{e['pipeline']}/{e['element']}" for e in node.report.get("elements", [])
                    ],
                    "checkpoints": [
                        {
                            "element": f"{e['pipeline']}/{e['element']}",
                            "epoch": e.get("epoch"),
                            "node_level": _aged(e.get("node_checkpoint")),
                            "central": self.checkpoint_status(e["pipeline"], e["element"]),
                        }
                        for e in node.report.get("elements", [])
                    ],
                }
            )
        return out

    # -- pipelines --------------------------------------------------------------------------

    def pipeline(self, name: str) -> PipelineRecord:
        record = self.registry.get_pipeline(name)
        if record is None:
            known = [p.name for p in self.registry.pipelines()]
            raise UnknownPipeline(
                f"no pipeline named {name!r}",
                expected="one of " + (", ".join(known) or "(none deployed)"),
            )
        return record

    def deploy(self, data: dict[str, Any]) -> dict[str, Any]:
        """Validate a spec (paths already absolute) and start all of its PEs, fresh.

        Each PE gets a new epoch, above any it had in an earlier deployment of the same name,
        and its fresh output stream starts with a fence marker for it: an instance left over
        from an earlier deployment (on a node that missed the stop) is fenced at its first
        write.

        Raises:
            InvalidSpec: The spec is invalid or names an unknown node.
            PipelineExists: A pipeline of that name is running.
            Unavailable: A node agent refused or could not be reached; the PEs already
                started are stopped again.
        """
        spec = parse_spec(data)
        validate_spec(spec, nodes=self.node_names())
        existing = self.registry.get_pipeline(spec.pipeline)
        if existing is not None and existing.status in ("running", "deploying"):
            raise PipelineExists(
                f"pipeline {spec.pipeline!r} is already {existing.status}",
                hint=f"`fogshift stop {spec.pipeline}` first, or deploy under another name",
            )
        for node in {e.node for e in spec.elements}:
            record = self.registry.node(node)
            if record is None or not self.healthy(record) or not record.report.get("ready"):
                raise Unavailable(
                    f"node {node!r} (needed by pipeline {spec.pipeline!r}) is not healthy",
                    hint="`fogshift nodes` shows node health; wait for it or change the spec",
                )

        epochs = self.registry.put_pipeline(spec, "deploying")
        self.permissions.sync(self.registry)  # the nodes may use their PEs' streams

        def reset_streams(js: Any) -> Any:
            async def go() -> None:
                for element in spec.elements:
                    await delete_pe_stream(js, spec.pipeline, element.id)
                    await ensure_pe_stream(
                        js, spec.pipeline, element.id, self.config.duplicate_window_s
                    )
                    await fence(js, spec.pipeline, element.id, epochs[element.id])

            return go()

        try:
            self.broker.run(reset_streams)
        except FogshiftError:
            self.registry.set_status(spec.pipeline, "failed")
            raise
        started: list[ElementSpec] = []
        try:
            # Downstream first, so nothing is produced before its consumer exists.
            for element in reversed(spec.topological_order()):
                self._deploy_element(spec.pipeline, element, fresh=True)
                started.append(element)
        except FogshiftError:
            for element in started:
                self._remove_quietly(spec.pipeline, element)
            self.registry.set_status(spec.pipeline, "failed")
            raise
        self.registry.set_status(spec.pipeline, "running")
        return self.status(spec.pipeline)[0]

    def _deploy_element(self, pipeline: str, element: ElementSpec, fresh: bool) -> Any:
        """Start ``element`` on ``element.node`` under the PE's newest epoch."""
        epoch = self.registry.epoch(pipeline, element.id)
        return self.agent(element.node).put(
            f"/pipelines/{pipeline}/elements/{element.id}",
            json={"element": element.model_dump(mode="json"), "fresh": fresh, "epoch": epoch},
        )

    def _remove_quietly(self, pipeline: str, element: ElementSpec) -> None:
        try:
            self.agent(element.node).delete(f"/pipelines/{pipeline}/elements/{element.id}")
        except FogshiftError as exc:
            log.warning("could not remove %s/%s: %s", pipeline, element.id, exc)

    def stop(self, name: str) -> dict[str, Any]:
        """Stop every PE of a pipeline; its streams, checkpoints and output stay."""
        record = self.pipeline(name)
        self.registry.set_status(name, "stopping")
        unreachable = []
        for node in sorted(set(record.placement.values())):
            try:
                self.agent(node).delete(f"/pipelines/{name}")
            except Unavailable:
                unreachable.append(node)
        self.registry.set_status(name, "stopped")
        self.permissions.sync_quietly(self.registry)
        return {"pipeline": name, "status": "stopped", "unreachable_nodes": unreachable}

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Per pipeline, per PE: node, state, events in/out, dead letters."""
        records = [self.pipeline(name)] if name else self.registry.pipelines()
        nodes = {n.name: n for n in self.registry.nodes()}
        out = []
        for record in records:
            elements = []
            for element in record.spec.elements:
                node_name = record.placement[element.id]
                node = nodes.get(node_name)
                report = next(
                    (
                        e
                        for e in (node.report.get("elements", []) if node else [])
                        if e["pipeline"] == record.name and e["element"] == element.id
                    ),
                    None,
                )
                stream = stream_name(record.name, element.id)
                counts = self.broker.run(partial(subject_counts, stream=stream))
                role = KINDS[element.kind].role
                if node is None or not self.healthy(node):
                    state = "node-lost"
                elif report is None:
                    state = "pending" if record.status == "running" else record.status
                else:
                    state = report["state"]
                out_count = (
                    (report or {}).get("lines_written", 0)
                    if role == "sink"
                    else counts.get(data_subject(record.name, element.id), 0)
                )
                elements.append(
                    {
                        "element": element.id,
                        "kind": element.kind,
                        "node": node_name,
                        "state": state,
                        "events_in": (report or {}).get("events_in", 0),
                        "events_out": out_count,
                        "dead_letters": counts.get(dead_subject(record.name, element.id), 0),
                        "restarts": (report or {}).get("restarts", 0),
                        "error": (report or {}).get("error"),
                        "planned_backup": self.planned(record.name, element.id).get("backup"),
                        "planned_redeploy": self.planned(record.name, element.id).get("redeploy"),
                        "last_restore": self.last_restore.get((record.name, element.id)),
                    }
                )
            out.append({"pipeline": record.name, "status": record.status, "elements": elements})
        return out

    def errors(self, name: str, limit: int = 1000) -> list[dict[str, Any]]:
        """The pipeline's dead letters with their reasons, PE by PE."""
        record = self.pipeline(name)
        letters: list[dict[str, Any]] = []
        for element in record.spec.elements:
            stream = stream_name(name, element.id)

            async def dead(js: Any, stream: str = stream, pe: str = element.id) -> list[Any]:
                end = await last_seq(js, stream)
                return await fetch_range(js, stream, dead_subject(name, pe), 0, end)

            for msg in self.broker.run(dead, timeout=60)[:limit]:
                payload = json.loads(msg.data)
                letters.append(
                    {
                        "element": element.id,
                        "seq": payload["seq"],
                        "reason": payload.get("reason"),
                        "event": payload["body"],
                    }
                )
        return letters[:limit]

    # -- migration --------------------------------------------------------------------------

    def migrate(
        self, pipeline: str, element_id: str, target: str, mode: Mode = "precopy"
    ) -> dict[str, Any]:
        """Live-migrate a running PE to ``target`` (see :mod:`fogshift.migration.procedure`).

        Raises:
            UnknownPipeline / UnknownElement / UnknownNode: A name does not exist.
            InvalidInput: The PE already runs on ``target``, or the pipeline is not running.
            MigrationInProgress: Another migration of this PE is under way.
            Unavailable: ``target`` is not healthy.
            MigrationFailed: The procedure failed before its routing change and was rolled
                back (its report says whether the origin runs again, and under which epoch).
        """
        record = self.pipeline(pipeline)
        element = self._element(record, element_id)
        if record.status != "running":
            raise InvalidInput(
                f"pipeline {pipeline!r} is {record.status}, not running",
                hint="only running pipelines can be migrated",
            )
        self._refuse_current_node(record, element_id, target, "migrate")
        self._usable_node(target, f"migrate {pipeline}/{element_id} to")
        with self._exclusive(pipeline, element_id, "migration"):
            # Afresh: a restore or migration that just ended may have moved the PE.
            record = self.pipeline(pipeline)
            self._refuse_current_node(record, element_id, target, "migrate")
            origin = record.placement[element_id]
            log.info("migrating %s/%s: %s -> %s (%s)", pipeline, element_id, origin, target, mode)
            op = self.registry.begin_operation(
                "migration", pipeline, element_id, origin, target, self.run_id, "preparing"
            )
            self.permissions.sync(self.registry)  # the target may read and, later, write
            steps = MigrationSteps(
                phase=partial(self._enter, op),
                route=partial(self._route, op),
                fence=partial(self._fence_for, op),
            )
            try:
                report = run_migration(
                    pipeline, element, (origin, self.agent(origin)),
                    (target, self.agent(target)), mode=mode, steps=steps, epoch=op.epoch,
                )  # fmt: skip
            except MigrationFailed as exc:
                failed = getattr(exc, "report", None)
                rolled_back = failed is not None and failed.rolled_back
                self.registry.finish(op.id, "rolled_back" if rolled_back else "failed")
                raise
            # Anything else escaping the procedure leaves the entry unfinished: the next
            # reconcile round resolves it by its phase (see recover_operations).
            self.registry.finish(op.id, "migrated")
        log.info("migrated %s/%s: %s", pipeline, element_id, report.phases_ms)
        return report.to_dict()

    def _refuse_current_node(
        self, record: PipelineRecord, element_id: str, node: str, what: str
    ) -> None:
        """Refuse to ``what`` (migrate, restore) a PE onto the node it is placed on.

        Raises:
            InvalidInput: ``node`` is the PE's placement; nothing was changed.
        """
        if record.placement[element_id] != node:
            return
        raise InvalidInput(
            f"{record.name}/{element_id} already runs on node {node!r}: cannot {what} it there",
            expected="a node other than " + repr(node),
            received=repr(node),
            hint=(
                "choose another node (`fogshift nodes` lists them)"
                if what == "migrate"
                else "restore it on another node, or leave --to out; a PE missing from its "
                "healthy node is started there again by the reconciler"
            ),
        )

    # -- operations journal -----------------------------------------------------------------

    def _test_pause(self, point: str) -> None:
        """The test hook of :attr:`OrchestratorConfig.test_pause_at`: block at ``point``."""
        if point != self.config.test_pause_at:
            return
        log.warning("test pause at %s: waiting to be killed", point)
        self._stop.wait()
        raise Unavailable(f"the orchestrator stopped while held at {point} (test hook)")

    def _enter(self, op: Operation, phase: str) -> None:
        """Journal that ``op`` enters ``phase`` (before the phase's side effect)."""
        self.registry.advance(op.id, phase)
        self._test_pause(f"{op.kind}:{phase}")

    def _route(self, op: Operation) -> None:
        """The routing change of ``op``: placement and journal move to the target at once."""
        self.registry.route(op.id, op.target)
        log.info("%s of %s/%s: routed to %s", op.kind, op.pipeline, op.element, op.target)
        self._test_pause(f"{op.kind}:routed")

    def _fence_for(self, op: Operation) -> int:
        """Give ``op``'s PE a new epoch and fence its output stream with it; return it."""
        epoch = self.registry.next_epoch(op.pipeline, op.element, operation=op.id)
        self.broker.run(lambda js: fence(js, op.pipeline, op.element, epoch))
        log.warning("%s of %s/%s: fenced under epoch %d", op.kind, op.pipeline, op.element,
                    epoch)  # fmt: skip
        return epoch

    def recover_operations(self) -> list[str]:
        """Resolve every migration and restore left unfinished by an orchestrator that died.

        An entry is unfinished and nobody runs it when its PE's exclusive section is free
        (an operation of this process holds it from its first journal entry to its outcome).
        Each is resolved by the phase it had reached:

        * a migration before its routing change is rolled back: the target instance is
          discarded and the origin resumed (fenced under a new epoch and restarted if the
          target cannot be discarded);
        * a migration after it is completed: the target's gate is opened, the origin removed;
        * a restore whose target runs under the entry's epoch (and nothing newer exists) is
          carried on: the target's gate opens and the placement moves to it;
        * any other restore is restarted (what its attempt left on the target is discarded):
          the PE ends up running under a newer epoch — if no node takes it and its own node
          is alive, it is started again there (see :meth:`restore`).

        Each decision is logged. An entry whose resolution fails is retried next round.

        Returns:
            The decisions taken, one line each.
        """
        decisions: list[str] = []
        for op in self.registry.unfinished():
            restart = False
            try:
                with self._exclusive(op.pipeline, op.element, "recovery"):
                    current = self.registry.operation(op.id)
                    if current is None or current.outcome is not None:
                        continue  # resolved meanwhile
                    decision, restart = self._recover(current)
                    self.registry.finish(op.id, f"recovered: {decision}")
            except MigrationInProgress:
                continue  # an operation of this process runs: it owns the entry
            except FogshiftError:
                continue  # logged by _exclusive; the entry stays for the next round
            line = (f"{op.kind} {op.id} of {op.pipeline}/{op.element} {op.origin} -> "
                    f"{op.target} (epoch {op.epoch}), left at {op.phase!r} by orchestrator "
                    f"{op.owner}: {decision}")  # fmt: skip
            log.warning("recovery: %s", line)
            decisions.append(line)
            if restart:
                try:
                    self.restore(op.pipeline, op.element)
                except FogshiftError as exc:
                    log.warning("recovery: restarting the restore of %s/%s failed: %s",
                                op.pipeline, op.element, exc.render())  # fmt: skip
        return decisions

    def _recover(self, op: Operation) -> tuple[str, bool]:
        """Resolve one unfinished entry (inside its PE's exclusive section).

        Returns:
            The decision, and whether the restore must be started again.
        """
        record = self.registry.get_pipeline(op.pipeline)
        here = f"/pipelines/{op.pipeline}/elements/{op.element}"
        if record is None or record.status != "running" or op.element not in record.placement:
            self._discard_quietly(op.target, here, record, op)
            return "abandoned: the PE does not run any more; the target was discarded", False
        element = record.spec.element(op.element)
        if op.kind == "migration":
            if op.phase != "routed":
                undone = run_rollback(
                    op.pipeline, element, (op.origin, self.agent(op.origin)),
                    (op.target, self.agent(op.target)), op.epoch, partial(self._fence_for, op),
                )  # fmt: skip
                notes = "; ".join(undone.notes)
                if undone.resumed:
                    return f"rolled back: {op.origin} runs under epoch {undone.epoch}" + (
                        f" ({notes})" if notes else ""
                    ), False
                return f"rolled back, but the origin does not run again ({notes})", False
            self._open_gate_quietly(op.target, here)
            self._discard_quietly(op.origin, here, record, op)
            return f"completed: {op.target} is the PE, the origin was removed", False
        if op.phase == "routed":
            self._open_gate_quietly(op.target, here)
            return f"completed: {op.target} runs it under epoch {op.epoch}", False
        newest = self.registry.epoch(op.pipeline, op.element)
        if op.phase in ("starting", "live") and newest == op.epoch:
            try:
                info = self.agent(op.target).get(here + "/progress")
            except FogshiftError as exc:
                info = {"state": f"unreachable ({exc.message})"}
            if int(info.get("epoch") or 0) == op.epoch and info.get("state") in (
                "running", "starting", "paused",
            ):  # fmt: skip
                self.agent(op.target).put(here + "/gate", json={"gate": None})
                self.registry.route(op.id, op.target)
                return f"carried on: {op.target} runs it under epoch {op.epoch}, now live", False
        self._discard_quietly(op.target, here, record, op)
        return "restarted: the attempt's leftovers on the target were discarded", True

    def _discard_quietly(
        self, node: str, here: str, record: PipelineRecord | None, op: Operation
    ) -> None:
        """Discard what ``op`` left on ``node`` — never the PE's placed instance."""
        if record is not None and record.placement.get(op.element) == node:
            return
        try:
            self.agent(node).delete(here, params={"discard": True})
        except FogshiftError as exc:
            # Not placed there: the reconciler removes it once the node answers.
            log.warning("recovery: %s on %s not removed: %s", here, node, exc.message)

    def _open_gate_quietly(self, node: str, here: str) -> None:
        try:
            self.agent(node).put(here + "/gate", json={"gate": None})
        except FogshiftError as exc:
            # Not there or its node is silent: the reconciler restarts or restores it.
            log.warning("recovery: the gate of %s on %s not opened: %s", here, node, exc.message)

    def _usable_node(self, name: str, what: str) -> NodeRecord:
        """Node ``name``, known, healthy and ready, to ``what`` (e.g. "restore p/e on").

        Raises:
            UnknownNode: It never registered.
            Unavailable: It is not healthy (silent, or its Spark session is not ready).
        """
        node = self.registry.node(name)
        if node is None:
            raise UnknownNode(
                f"cannot {what} unknown node {name!r}",
                expected="one of " + ", ".join(self.node_names()),
                received=repr(name),
            )
        if not self.healthy(node) or not node.report.get("ready"):
            raise Unavailable(
                f"cannot {what} node {name!r}: it is not healthy",
                hint="choose another node; `fogshift nodes` shows node health",
            )
        return node

    @contextlib.contextmanager
    def _exclusive(self, pipeline: str, element_id: str, what: str) -> Iterator[None]:
        """Run one migration or restore of a PE at a time; log its failure.

        Raises:
            MigrationInProgress: Another one is under way.
        """
        key = (pipeline, element_id)
        with self._lock:
            if key in self._migrating:
                raise MigrationInProgress(
                    f"{pipeline}/{element_id} is already being migrated, restored or cleaned up",
                    hint="wait for that operation to finish",
                )
            self._migrating.add(key)
        try:
            yield
        except FogshiftError as exc:
            log.warning("%s of %s/%s failed: %s", what, pipeline, element_id, exc.render())
            raise
        finally:
            with self._lock:
                self._migrating.discard(key)

    # -- restoration ------------------------------------------------------------------------

    def _element(self, record: PipelineRecord, element_id: str) -> ElementSpec:
        try:
            return record.spec.element(element_id)
        except KeyError:
            raise UnknownElement(
                f"pipeline {record.name!r} has no element {element_id!r}",
                expected="one of " + ", ".join(e.id for e in record.spec.elements),
            ) from None

    def restore_candidates(self, pipeline: str, element_id: str, exclude: set[str]) -> list[str]:
        """Healthy, ready nodes outside ``exclude``: the PE's planned redeploy node first,
        then the least busy (fewest PEs)."""
        candidates = [
            n
            for n in self.registry.nodes()
            if n.name not in exclude and self.healthy(n) and n.report.get("ready")
        ]
        planned = self.planned(pipeline, element_id).get("redeploy")
        ranked = sorted(
            candidates,
            key=lambda n: (n.name != planned, len(n.report.get("elements", [])), n.name),
        )
        return [n.name for n in ranked]

    def checkpoint_copies(
        self, pipeline: str, element_id: str, target: str
    ) -> Callable[[dict[str, Any]], list[Copy]]:
        """Where ``target`` can copy a checkpoint of the PE from, nearest first (by the fog
        topology's route bandwidth): replicas on healthy nodes, then the central store."""

        def copies(manifest: dict[str, Any]) -> list[Copy]:
            holders: dict[str, str] = {}
            for n in self.registry.nodes():
                held = {
                    r["id"]
                    for r in n.report.get("replicas", [])
                    if (r["pipeline"], r["element"]) == (pipeline, element_id)
                }
                # Another node helps only with this very checkpoint; the target's own copy,
                # even an older one, saves every file the two have in common.
                if self.healthy(n) and (manifest["id"] in held or (held and n.name == target)):
                    holders[n.name] = n.url
            if self._topology is None:
                order = [*sorted(holders, key=lambda n: n != target), "central"]
            else:
                order = nearest_first(self._topology, target, sorted(holders), self._central)
            # The target's own copy needs no source of its own: what it lacks comes from
            # the central store.
            return [
                ("central", None)
                if name == "central"
                else (f"replica@{name}", None if name == target else holders[name])
                for name in order
            ]

        return copies

    def restore(self, pipeline: str, element_id: str, target: str | None = None) -> dict[str, Any]:
        """Restore a PE from its central checkpoint on ``target``, or on the best healthy node.

        Without ``target`` a failed attempt (the chosen node died or failed during the
        restore) is retried on the next candidate; every attempt fences the previous ones
        with a new epoch. The report's ``attempts`` lists the failed attempts. Each attempt
        is journaled (see :meth:`recover_operations`).

        ``target`` may not be the node the PE is placed on: that is refused before anything
        changes (nothing is fenced or discarded).

        If every attempt fails while the PE's own node is healthy, the PE is started again
        there — from its own checkpoint, under a newer epoch than every attempt's — so it
        never stays fenced with nobody writing; the error says so.

        Raises:
            UnknownPipeline / UnknownElement / UnknownNode: A name does not exist.
            InvalidInput: ``target`` is the node the PE is placed on.
            Unavailable: The target (or, without one, every candidate) is not healthy.
            MigrationInProgress: Another migration or restore of this PE is under way.
            RestoreFailed: Every attempt failed; the report lists them. Retry elsewhere.
        """
        record = self.pipeline(pipeline)
        element = self._element(record, element_id)
        if target is not None:
            self._refuse_current_node(record, element_id, target, "restore")
            self._usable_node(target, f"restore {pipeline}/{element_id} on")
        with self._exclusive(pipeline, element_id, "restore"):
            # Afresh: a migration or restore that just ended may have moved the PE.
            record = self.pipeline(pipeline)
            current = record.placement[element_id]
            if target is not None:
                self._refuse_current_node(record, element_id, target, "restore")
                candidates = [target]
            else:
                candidates = self.restore_candidates(pipeline, element_id, {current})
                if not candidates:
                    raise Unavailable(
                        f"no healthy node to restore {pipeline}/{element_id} on "
                        f"(it was on {current!r})",
                        hint="`fogshift nodes` shows node health; start a node or wait",
                    )
            attempts: list[dict[str, Any]] = []
            try:
                return self._restore_on(element, pipeline, current, candidates, attempts)
            except FogshiftError as exc:
                if not any("epoch" in a for a in attempts):
                    raise  # nothing was fenced: the PE runs as it did
                epoch = self._restart_in_place(pipeline, element, current)
                if epoch is None:
                    raise
                failed = getattr(exc, "report", None)
                if failed is not None:
                    failed.fallback = f"restarted on {current} under epoch {epoch}"
                    self.last_restore[(pipeline, element_id)] = failed.to_dict()
                again = type(exc)(
                    f"{exc.message}; {pipeline}/{element_id} runs again on {current} (its own "
                    f"node, from its own checkpoint) under epoch {epoch}",
                    expected=exc.expected,
                    received=exc.received,
                    hint=exc.hint,
                )
                again.report = failed  # type: ignore[attr-defined]
                raise again from exc

    def _restore_on(
        self,
        element: ElementSpec,
        pipeline: str,
        current: str,
        candidates: list[str],
        attempts: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """The attempts of :meth:`restore`, in its exclusive section; failed ones are added
        to ``attempts`` (with the epoch they fenced with)."""
        element_id = element.id
        for name in candidates:
            node = self.registry.node(name)
            if attempts and (node is None or not self.healthy(node)):
                attempts.append({"node": name, "error": "not healthy any more: skipped"})
                continue
            op = self.registry.begin_operation(
                "restore", pipeline, element_id, current, name, self.run_id, "fencing",
                new_epoch=True,
            )  # fmt: skip
            self.permissions.sync_quietly(self.registry)  # the target may write, nobody else
            log.info("restoring %s/%s on %s (epoch %d)", pipeline, element_id, name, op.epoch)
            try:
                self._test_pause("restore:fencing")
                report = run_restore(
                    pipeline, element, op.epoch, (name, self.agent(name)), self.central,
                    self.broker, copies=self.checkpoint_copies(pipeline, element_id, name),
                    steps=RestoreSteps(phase=partial(self._enter, op)),
                )  # fmt: skip
            except RestoreFailed as exc:
                self.registry.finish(op.id, "failed")
                failed = getattr(exc, "report", None)
                attempts.append({"node": name, "epoch": op.epoch, "error": exc.message})
                if failed is not None:
                    failed.attempts = list(attempts)
                    self.last_restore[(pipeline, element_id)] = failed.to_dict()
                if name == candidates[-1]:
                    raise
                log.warning("restore of %s/%s on %s failed; trying the next node: %s",
                            pipeline, element_id, name, exc.message)  # fmt: skip
                continue
            report.attempts = attempts
            self.registry.route(op.id, name)
            self.registry.finish(op.id, "restored")
            self.last_restore[(pipeline, element_id)] = report.to_dict()
            log.info("restored %s/%s: %s", pipeline, element_id, report.to_dict())
            return report.to_dict()
        raise Unavailable(  # every candidate became unhealthy before its turn
            f"no healthy node left to restore {pipeline}/{element_id} on",
            received="; ".join(f"{a['node']}: {a['error']}" for a in attempts),
            hint="`fogshift nodes` shows node health",
        )

    def _restart_in_place(self, pipeline: str, element: ElementSpec, node: str) -> int | None:
        """Start ``element`` again on ``node``, its placement, under a new epoch.

        After failed restore attempts its instance there was fenced (and an attempt's
        instance elsewhere may still write under the epoch it got): a new epoch above all of
        them, a fence marker for it, then the instance is stopped and started again from its
        own checkpoint under it. Inside the PE's exclusive section.

        Returns:
            The new epoch, or ``None`` if ``node`` is not healthy or did not take it (logged;
            the reconciler starts it under the newest epoch once the node can).
        """
        record = self.registry.node(node)
        if record is None or not self.healthy(record) or not record.report.get("ready"):
            log.warning("restore of %s/%s failed everywhere and its node %s is not healthy: "
                        "left to the reconciler", pipeline, element.id, node)  # fmt: skip
            return None
        here = f"/pipelines/{pipeline}/elements/{element.id}"
        try:
            epoch = self.registry.next_epoch(pipeline, element.id)
            self.broker.run(lambda js: fence(js, pipeline, element.id, epoch))
            self._restart_instance(node, here, element, epoch)
        except FogshiftError as exc:
            log.warning("restore of %s/%s failed everywhere; restarting it on %s failed too "
                        "(left to the reconciler): %s", pipeline, element.id, node,
                        exc.message)  # fmt: skip
            return None
        log.warning("restore of %s/%s failed everywhere: restarted on its node %s under "
                    "epoch %d", pipeline, element.id, node, epoch)  # fmt: skip
        return epoch

    def _restart_instance(self, node: str, here: str, element: ElementSpec, epoch: int) -> None:
        """Stop the PE's instance on ``node`` (keeping its checkpoint) and start it again
        under ``epoch``: an agent keeps a running instance's epoch on a plain deploy."""
        agent = self.agent(node)
        with contextlib.suppress(UnknownElement):  # not there: just start it
            agent.delete(here)
        placed = element.model_copy(update={"node": node}).model_dump(mode="json")
        agent.put(here, json={"element": placed, "fresh": False, "epoch": epoch})

    # -- central checkpoints ----------------------------------------------------------------

    def pull_checkpoints(self) -> None:
        """Copy each running PE's newest node-level checkpoint into the central store."""
        nodes = {n.name: n for n in self.registry.nodes()}
        for record in self.registry.pipelines():
            if record.status != "running":
                continue
            for element in record.spec.elements:
                node = nodes.get(record.placement[element.id])
                if node is None or not self.healthy(node):
                    continue
                key = (record.name, element.id)
                try:
                    self._pull_one(record.name, element.id, node.name, key)
                except FogshiftError as exc:
                    log.info("central checkpoint of %s/%s skipped: %s", *key, exc.message)

    def _pull_one(self, pipeline: str, pe: str, node: str, key: tuple[str, str]) -> None:
        agent = self.agent(node)
        here = f"/pipelines/{pipeline}/elements/{pe}/snapshots"
        manifest = agent.get(here + "/latest")
        known = self.central.manifests(pipeline, pe)
        if known and known[0]["id"] >= manifest["id"] and known[0].get("node") == node:
            return
        manifest = {**manifest, "node": node}
        started = time.perf_counter()
        shipped = self.central.put(
            manifest,
            lambda rel: agent.raw("GET", f"{here}/{manifest['id']}/files/{rel}").content,
        )
        self.central_stats[key] = {
            "id": manifest["id"],
            "shipped_bytes": shipped,
            "bytes": manifest["bytes"],
            "took_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    def push_replicas(self) -> None:
        """Give each PE's planned backup node a copy of the PE's newest central checkpoint.

        The node fetches only the files it lacks, from the central store. Runs after each
        central pull; a node that is down or fails is retried at the next round.
        """
        nodes = {n.name: n for n in self.registry.nodes()}
        for record in self.registry.pipelines():
            if record.status != "running":
                continue
            for element in record.spec.elements:
                backup = self.planned(record.name, element.id).get("backup")
                node = nodes.get(backup or "")
                if node is None or backup == record.placement[element.id]:
                    continue
                if not self.healthy(node):
                    continue
                manifests = self.central.manifests(record.name, element.id)
                if not manifests:
                    continue
                newest = manifests[0]
                held = {
                    r["id"]
                    for r in node.report.get("replicas", [])
                    if (r["pipeline"], r["element"]) == (record.name, element.id)
                }
                if newest["id"] in held:
                    continue
                started = time.perf_counter()
                try:
                    result = self.agent(node.name).post(
                        f"/replicas/{record.name}/{element.id}", json={"manifest": newest}
                    )
                except FogshiftError as exc:
                    log.info("replica of %s/%s on %s skipped: %s",
                             record.name, element.id, node.name, exc.message)  # fmt: skip
                    continue
                self.replica_stats[(record.name, element.id)] = {
                    "node": node.name,
                    "id": newest["id"],
                    "fetched_bytes": result["fetched_bytes"],
                    "took_ms": round((time.perf_counter() - started) * 1000, 1),
                }

    def run_central(self) -> None:
        """Loop :meth:`pull_checkpoints` until :meth:`close`."""

        def step() -> None:
            self.pull_checkpoints()
            self.push_replicas()

        self._every(self.config.central_interval_s, step, "central checkpointing")

    def _every(self, interval_s: float, step: Callable[[], object], what: str) -> None:
        """Run ``step`` every ``interval_s`` until :meth:`close`; a failure is logged, not fatal."""
        while not self._stop.wait(interval_s):
            try:
                step()
            except Exception:  # the loop must outlive any one failure
                log.exception("%s failed", what)

    def checkpoint_status(self, pipeline: str, pe: str) -> dict[str, Any] | None:
        """The newest central checkpoint of a PE, with its age."""
        manifests = self.central.manifests(pipeline, pe)
        if not manifests:
            return None
        newest = manifests[0]
        return {
            "id": newest["id"],
            "batch": newest["batch"],
            # The input position it resumes from: a restore reprocesses what lies beyond.
            "progress": progress_of(newest.get("offset")),
            "age_ms": round((time.time() - newest["created"]) * 1000, 1),
            "bytes": newest["bytes"],
            "shipped_bytes": newest.get("shipped_bytes"),
        }

    # -- planning ---------------------------------------------------------------------------

    def planned(self, pipeline: str, element_id: str) -> dict[str, Any]:
        """The PE's planned ``backup`` and ``redeploy`` nodes (empty before a plan exists)."""
        return dict(self.plan["assignments"].get(f"{pipeline}/{element_id}", {}))

    def set_topology(self, text: str) -> dict[str, Any]:
        """Validate and store a new fog topology (YAML), then plan with it at once.

        Raises:
            InvalidInput: The topology is invalid (nothing is changed).
        """
        FogTopology.parse(text, source="(uploaded)")
        tmp = self.config.topology_file.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.config.topology_file)
        return self.replan()

    def replan(self) -> dict[str, Any]:
        """Recompute the plan from the fog topology, live CPU use and checkpoint sizes.

        PEs whose node is not healthy keep their previous assignment: that is the plan for
        the failure at hand. An instance the planner cannot satisfy keeps the previous plan
        and reports the reason in ``error``.
        """
        fog = FogTopology.load(self.config.topology_file)
        live = [n for n in self.registry.nodes() if self.healthy(n) and n.report.get("ready")]
        pes = []
        for record in self.registry.pipelines():
            if record.status != "running":
                continue
            for element in record.spec.elements:
                key = (record.name, element.id)
                manifests = self.central.manifests(*key)
                shipped = self.central_stats.get(key, {}).get("shipped_bytes", 0)
                pes.append(
                    LivePE(
                        key=f"{record.name}/{element.id}",
                        node=record.placement[element.id],
                        latency_ms=record.spec.recovery.latency_ms,
                        checkpoint_bytes=int(manifests[0]["bytes"]) if manifests else 0,
                        shipped_bytes_per_s=shipped / self.config.central_interval_s,
                    )
                )
        previous = self.plan["assignments"]
        try:
            topology = build_topology(
                fog, [LiveNode(n.name, float(n.report.get("cpu_percent") or 0.0)) for n in live],
                pes,
            )  # fmt: skip
            result = (
                plan_backups(topology, "exact", time_limit_s=self.config.plan_time_limit_s)
                if topology.tasks
                else None
            )
        except FogshiftError as exc:
            self.plan = {**self.plan, "error": exc.render(), "computed_at": time.time()}
            return self.plan
        self._topology = topology
        self._central = fog.central_node(self.node_names())
        fresh = describe_plan(result, topology) if result else {"assignments": {}}
        planned_now = {t.id for t in topology.tasks}
        kept = {k: v for k, v in previous.items() if k not in planned_now and
                any(pe.key == k for pe in pes)}  # fmt: skip
        fresh["assignments"] = {**kept, **fresh["assignments"]}
        self.plan = {**fresh, "error": None, "computed_at": time.time()}
        return self.plan

    def run_planner(self) -> None:
        """Loop :meth:`replan` until :meth:`close`."""
        self._every(self.config.plan_interval_s, self.replan, "planning")

    # -- reconciliation ---------------------------------------------------------------------

    def reconcile_once(self) -> None:
        """Keep running pipelines as placed.

        * a PE missing from its healthy node is started there (from its local checkpoint);
        * a PE whose node has been silent longer than the pipeline's ``detect_after_s`` is
          restored on a healthy node, if its recovery is automatic;
        * an instance on a node that is not the PE's placement (a fenced zombie, a leftover)
          is removed;
        * a PE on its node under an epoch older than its newest (fenced, or about to be) is
          started again there under the newest; one held at its gate with no operation under
          way is resumed.

        First, every operation an orchestrator left unfinished is resolved
        (:meth:`recover_operations`); a PE whose entry could not be resolved is left alone
        until it is.
        """
        self.recover_operations()
        self.permissions.sync_quietly(self.registry)
        pending = {(op.pipeline, op.element) for op in self.registry.unfinished()}
        for record in self.registry.pipelines():
            for element in record.spec.elements:
                if (record.name, element.id) not in pending:
                    self._reconcile_element(record.name, element.id)
        self._remove_strays(pending)

    def _reconcile_element(self, pipeline: str, element_id: str) -> None:
        """One PE's part of :meth:`reconcile_once`.

        Its placement is read afresh, and a restart happens inside the PE's exclusive
        section: a migration or restore (this round's, or one from the REST API) may have
        moved it since the round began, and a stale view would start a second instance on
        the node it left.
        """
        record = self.registry.get_pipeline(pipeline)
        if (
            record is None
            or record.status != "running"
            or (pipeline, element_id) in self._migrating
        ):
            return  # a migration or restore owns the PE's instances until it ends
        node = self.registry.node(record.placement[element_id])
        if node is None:
            return
        # Silence counts from this process's start: after a restart of the whole cluster,
        # nodes that have not re-registered yet are not lost.
        silent = time.time() - max(node.last_seen, self.started_at)
        if record.spec.recovery.auto and silent > record.spec.recovery.detect_after_s:
            log.warning("node %s silent for %.1f s: restoring %s/%s",
                        node.name, silent, pipeline, element_id)  # fmt: skip
            try:
                self.restore(pipeline, element_id)
            except FogshiftError as exc:
                log.warning("auto-restore of %s/%s: %s", pipeline, element_id, exc)
            return
        if not self.healthy(node) or not node.report.get("ready"):
            return
        reported = next(
            (
                e
                for e in node.report.get("elements", [])
                if (e["pipeline"], e["element"]) == (pipeline, element_id)
            ),
            None,
        )
        newest = self.registry.epoch(pipeline, element_id)
        if reported is not None and not (
            reported.get("gated") or int(reported.get("epoch") or 0) < newest
        ):
            return
        try:
            with self._exclusive(pipeline, element_id, "restart"):
                record = self.registry.get_pipeline(pipeline)
                if record is None or record.placement.get(element_id) != node.name:
                    return  # moved meanwhile
                here = record.spec.element(element_id).model_copy(update={"node": node.name})
                if reported is None:
                    log.info("reconcile: starting %s/%s on %s", pipeline, element_id, node.name)
                    self._deploy_element(pipeline, here, fresh=False)
                else:
                    self._mend(pipeline, here)
        except FogshiftError:
            # MigrationInProgress: the operation under way owns the PE; a failed start was
            # logged by _exclusive and is retried next round.
            return

    def _mend(self, pipeline: str, element: ElementSpec) -> None:
        """The PE's instance on its node (``element.node``) looked stale in the node's last
        report — under an older epoch than the PE's newest, or held at its gate. Judged again
        by what the agent says now (a report lags a heartbeat); inside the exclusive section,
        so no operation is under way.

        An older epoch means a newer one was given (a restore that failed everywhere, a
        rollback that had to fence) and this instance is, or will be at its next write,
        fenced: it is started again under the newest, from its own checkpoint. A gate held
        with no operation under way was left by one that ended without opening it.
        """
        here = f"/pipelines/{pipeline}/elements/{element.id}"
        info = self.agent(element.node).get(here + "/progress")
        newest = self.registry.epoch(pipeline, element.id)
        if int(info.get("epoch") or 0) < newest:
            log.warning("reconcile: %s/%s on %s runs under epoch %s, older than its newest %d: "
                        "starting it again under that one", pipeline, element.id, element.node,
                        info.get("epoch"), newest)  # fmt: skip
            self._restart_instance(element.node, here, element, newest)
        elif info.get("gated"):
            log.warning("reconcile: %s/%s on %s is held at its gate with no operation under "
                        "way: resuming it", pipeline, element.id, element.node)  # fmt: skip
            self.agent(element.node).post(here + "/resume")

    def _remove_strays(self, pending: set[tuple[str, str]] | None = None) -> None:
        """Remove instances running on a node that is not their PE's placement.

        The placement is read afresh for every instance, inside the PE's exclusive section:
        a restore or migration that ended a moment ago has moved the placement to the very
        instance a stale view would call superseded (and removing it discards its checkpoint).

        Args:
            pending: PEs with an unfinished journal entry: their instances are left to its
                resolution.
        """
        for node in self.registry.nodes():
            if not self.healthy(node):
                continue
            for hosted in node.report.get("elements", []):
                key = (hosted["pipeline"], hosted["element"])
                if key in (pending or set()):
                    continue
                try:
                    with self._exclusive(*key, "removal of a superseded instance"):
                        record = self.registry.get_pipeline(key[0])
                        if (
                            record is None
                            or record.status != "running"
                            or record.placement.get(key[1]) in (None, node.name)
                        ):
                            continue
                        log.warning("removing superseded %s/%s from %s", *key, node.name)
                        try:
                            self.agent(node.name).delete(
                                f"/pipelines/{key[0]}/elements/{key[1]}", params={"discard": True}
                            )
                        except FogshiftError as exc:
                            # Gone meanwhile, or its node stopped answering: the next round
                            # sees what its heartbeats then report.
                            log.info("superseded %s/%s on %s not removed: %s", *key, node.name,
                                     exc.message)  # fmt: skip
                except MigrationInProgress:
                    continue  # the operation under way owns the PE's instances

    def run_reconciler(self) -> None:
        """Loop :meth:`reconcile_once` until :meth:`close`."""
        self._every(self.config.reconcile_s, self.reconcile_once, "reconcile")

    def close(self) -> None:
        self._stop.set()
        for client in self._agents.values():
            client.close()
        self.broker.close()
        self.registry.close()


__all__ = ["Orchestrator", "OrchestratorConfig", "PipelineSpec"]
