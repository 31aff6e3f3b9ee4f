"""The node agent's REST API and heartbeat.

Every name in a URL is checked against ``fogshift.common.names`` before a handler runs, and
again where it becomes a path; who may call what is :func:`agent_access`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from starlette.background import BackgroundTask

from fogshift.agent.config import AgentConfig
from fogshift.agent.exceptions import UnknownElement
from fogshift.agent.load import CpuMeter
from fogshift.agent.node import NodeRuntime
from fogshift.agent.pacing import Pacer
from fogshift.agent.replicas import Replicas
from fogshift.checkpoint.central import check_manifest
from fogshift.checkpoint.chunks import file_chunks
from fogshift.common.exceptions import Forbidden
from fogshift.common.files import write_private
from fogshift.common.headers import INFO_HEADER, SHA_HEADER
from fogshift.common.http import (
    blob_reader,
    blob_token,
    client_limits,
    node_token,
    same_token,
    tls_context,
    token_node,
)
from fogshift.common.names import NAME_RE, SHA256_RE
from fogshift.common.service import (
    ERROR_RESPONSES,
    Access,
    LengthQuery,
    NameParam,
    OffsetQuery,
    PauseTimeoutQuery,
    ProgressSeenQuery,
    ProgressWaitQuery,
    RelPathParam,
    SnapshotParam,
    StateKeyQuery,
    StateLimitQuery,
    add_blob_routes,
    install_error_handlers,
    read_range,
    wrong_token,
)
from fogshift.contracts import (
    URL_RE,
    AgentHealth,
    CheckpointInfo,
    CheckpointManifest,
    CheckpointRequest,
    CopyResult,
    DroppedReplica,
    ElementInfo,
    ElementProgress,
    ElementsChecked,
    FileChunks,
    Gate,
    Heartbeat,
    HeartbeatAnswer,
    InstalledCheckpoint,
    InstallResult,
    PEState,
    ReplicaInfo,
    StateKeys,
    TwinState,
)
from fogshift.exceptions import FogshiftError, InvalidInput
from fogshift.spec.loader import check_element_files
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.agent")


class DeployRequest(BaseModel):
    """Body of ``PUT /pipelines/{pipeline}/elements/{element}``."""

    model_config = ConfigDict(extra="forbid")

    element: ElementSpec
    fresh: bool = False
    gate: Gate | None = None
    epoch: int = 0


class ElementsCheck(BaseModel):
    """Body of ``POST /pipelines/{pipeline}/check``: the PEs to check."""

    model_config = ConfigDict(extra="forbid")

    elements: list[ElementSpec] = Field(min_length=1, max_length=10_000)


class CopyRequest(BaseModel):
    """Body of ``POST /replicas/...`` and ``POST .../checkpoint/install``.

    ``manifest`` is a central checkpoint manifest (``None`` on install: start over), taken as
    it comes and checked by ``checkpoint.central.check_manifest`` before anything is fetched
    or written (that check names the unsafe path or digest, as a model's would not);
    ``source`` the base URL serving its blobs (``None``: the orchestrator), which must be a
    node of the orchestrator's directory (``agent.replicas``).
    """

    model_config = ConfigDict(extra="forbid")

    manifest: dict[str, Any] | None = None
    source: str | None = Field(default=None, pattern=URL_RE, max_length=2048)


class GateRequest(BaseModel):
    """Body of ``PUT .../gate``: the new gate, ``null`` to open it."""

    model_config = ConfigDict(extra="forbid")

    gate: Gate | None = None


_BLOBS = re.compile(r"/checkpoints/blobs/[^/]+(/chunks)?")


def _packed(data: bytes, digest: str, info: CheckpointInfo) -> Response:
    """A packed checkpoint as a response: the archive, its sha256 and what it holds."""
    return Response(
        content=data,
        media_type="application/octet-stream",
        headers={SHA_HEADER: digest, INFO_HEADER: info.model_dump_json()},
    )


#: Where an agent keeps the nodes it was last told were removed (in its own folder).
REMOVED_NODES_FILE = "removed-nodes.json"
_NODE_NAME = Annotated[str, Field(pattern=NAME_RE)]


class _Kept(BaseModel):
    """What :class:`RemovedNodes` keeps on disk."""

    model_config = ConfigDict(extra="forbid")

    removed: list[_NODE_NAME] = []
    generations: dict[_NODE_NAME, Annotated[int, Field(ge=1)]] = {}


#: An older agent's file: the removed nodes' names only.
_KEPT = TypeAdapter(_Kept | list[_NODE_NAME])


class RemovedNodes:
    """The nodes the orchestrator last said were removed from the cluster, and the
    generations of those added again since (its answer to this node's heartbeat): the blob
    tokens of the removed ones, and of the earlier generations of the others, open nothing
    here.

    Kept in ``path`` too (0600, replaced whole): an agent started again (after a crash, or
    `fogshift up` after `down`, which starts the agents before the orchestrator) refuses
    them from its first request, not from its first answered heartbeat. Written by the
    heartbeat thread, read by every request: one reference, swapped whole.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._kept = _Kept()
        if path is not None and path.exists():
            try:
                kept = _KEPT.validate_json(path.read_bytes())
            except (OSError, ValueError) as exc:  # (pydantic's ValidationError is one)
                # Not a reason to stay down: the first answered heartbeat says it again.
                log.warning("cannot read the removed nodes from %s: %s", path, exc)
            else:
                self._kept = kept if isinstance(kept, _Kept) else _Kept(removed=kept)

    def update(self, names: list[str], generations: dict[str, int] | None = None) -> None:
        """Take the orchestrator's answer: ``names`` removed, ``generations`` of the nodes
        added again (``None``: as before)."""
        kept = _Kept(
            removed=sorted(set(names)),
            generations=self._kept.generations if generations is None else generations,
        )
        if kept == self._kept:
            return
        log.info("nodes removed from the cluster (their blob tokens refused here): %s; "
                 "added again (their earlier tokens refused): %s",
                 ", ".join(kept.removed) or "none",
                 ", ".join(f"{n} in generation {g}" for n, g in sorted(kept.generations.items()))
                 or "none")  # fmt: skip
        self._kept = kept
        if self.path is not None:
            try:
                write_private(self.path, kept.model_dump_json())
            except OSError as exc:  # refused here meanwhile all the same
                log.warning("cannot keep the removed nodes in %s: %s", self.path, exc)

    def __contains__(self, name: object) -> bool:
        return name in self._kept.removed

    def generation(self, name: str) -> int:
        """Node ``name``'s generation as last told (``0``: never added again)."""
        return self._kept.generations.get(name, 0)


def agent_access(config: AgentConfig, removed: RemovedNodes) -> Access:
    """Who may call this agent.

    Its own node token (the orchestrator's calls) and the operator token (an operator's
    tools) open everything; the agent recognises the operator token by deriving its node
    token from it, so it never holds the operator token. Another node's blob token for this
    node (that node copying one of its replicas) opens only
    ``GET /checkpoints/blobs/{sha256}[/chunks]``, and nothing once that node is ``removed``.
    """

    # This node's own generation, from its token: the operator token derives it only so.
    own = token_node(config.token)
    own_generation = own[1] if own is not None else 0

    def access(method: str, path: str, given: str) -> FogshiftError | None:
        if same_token(given, config.token) or same_token(
            node_token(given, config.name, own_generation), config.token
        ):
            return None
        claim = blob_reader(given)
        if claim is not None and same_token(given, blob_token(config.token, *claim)):
            reader, of = claim
            if reader in removed:
                return Forbidden(
                    f"node {reader!r} was removed from the cluster: its blob token opens "
                    f"nothing on node {config.name!r} any more",
                    expected="the orchestrator's token, or the blob token of a node in the cluster",
                    received=f"the blob token of removed node {reader!r}",
                    hint=f"an operator's `fogshift up --nodes` naming every node and "
                    f"{reader} adds it again",
                )
            now = removed.generation(reader)
            if of != now:
                return Forbidden(
                    f"this blob token is of node {reader!r} in its generation {of}, and the node "
                    f"is in its generation {now}: it was removed from the cluster and added "
                    f"again since, and its tokens of before open nothing on node "
                    f"{config.name!r}",
                    expected=f"the blob token of node {reader!r} of generation {now}",
                    received=f"one of generation {of}",
                    hint="a node gets its blob tokens from the orchestrator's node directory",
                )
            if method == "GET" and _BLOBS.fullmatch(path):
                return None
            return Forbidden(
                f"the blob token of node {reader!r} for node {config.name!r} only reads checkpoint "
                f"blobs, not {method} {path}",
                expected="GET of a checkpoint blob, or the orchestrator's token",
                received=f"{method} {path} with node {reader!r}'s blob token",
                hint="control requests to a node come from the orchestrator",
            )
        return wrong_token(f"node agent {config.name!r}", given)

    return access


def _disk(home: Path) -> dict[str, int]:
    """The free and total bytes of the file system ``home`` is on (nothing if unknown)."""
    try:
        usage = shutil.disk_usage(home)
    except OSError:
        return {}
    return {"disk_free_bytes": usage.free, "disk_total_bytes": usage.total}


def heartbeat_loop(
    config: AgentConfig,
    runtime: NodeRuntime,
    replicas: Replicas,
    stop: threading.Event,
    removed: RemovedNodes,
) -> None:
    """Tell the orchestrator, every ``heartbeat_s``, that this node lives, what it runs, what
    checkpoint copies it holds and how much CPU it uses; learn from its answer which nodes
    were removed from the cluster (``removed``)."""
    meter = CpuMeter()
    refused = 0  # the status of the last refusal, said once until it changes
    with httpx.Client(
        base_url=config.orchestrator_url,
        headers={"Authorization": f"Bearer {config.token}"},
        timeout=5,
        verify=tls_context(),
        trust_env=False,
        limits=client_limits(),
    ) as client:
        while not stop.is_set():
            try:
                beat = Heartbeat(
                    url=config.url,
                    pid=os.getpid(),
                    pgid=os.getpgid(0),
                    ready=runtime.ready,
                    error=runtime.spark_error,
                    elements=runtime.elements(),
                    replicas=replicas.held(),
                    left=runtime.left(),
                    cpu_percent=meter.percent(),
                    checkpoint_interval_s=config.checkpoint_interval_s,
                    **_disk(config.home),
                    snapshots_age_s=(
                        round(time.monotonic() - runtime.snapshots_at, 3)
                        if runtime.snapshots_at is not None
                        else None
                    ),
                )
                answer = client.post(
                    f"/nodes/{config.name}/heartbeat", json=beat.model_dump(mode="json")
                )
                if answer.is_error and answer.status_code != refused:
                    # (A node removed from the cluster, a token that is not the cluster's:
                    # the orchestrator takes this node for dead; said, not silently retried.)
                    log.warning("the orchestrator refused this node's heartbeat (%d): %s",
                                answer.status_code, answer.text[:300])  # fmt: skip
                refused = answer.status_code if answer.is_error else 0
                if not answer.is_error:
                    heard = HeartbeatAnswer.model_validate(answer.json())
                    removed.update(heard.removed, heard.generations)
            except httpx.HTTPError as exc:  # the orchestrator may be restarting
                log.debug("heartbeat failed: %s", exc)
            except Exception:  # a node whose heartbeats ended would be taken for dead
                log.exception("heartbeat failed")
            stop.wait(config.heartbeat_s)


def create_app(config: AgentConfig) -> FastAPI:
    """The agent's FastAPI app; starts Spark and the heartbeat with the server."""
    runtime = NodeRuntime(config)
    replicas = Replicas(config, runtime)
    stop = threading.Event()
    removed = RemovedNodes(config.home / REMOVED_NODES_FILE)
    # One for the node: every pull shares its uplink.
    pacer = Pacer(config.pull_rate_bps) if config.pull_rate_bps else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # (A restarted agent's lines went on from its predecessor's with nothing between.)
        log.info("node agent %s started: pid %d, home %s, port %d", config.name, os.getpid(),
                 config.home, config.port)  # fmt: skip
        runtime.start()
        beat = threading.Thread(
            target=heartbeat_loop,
            args=(config, runtime, replicas, stop, removed),
            name="heartbeat",
            daemon=True,
        )
        beat.start()
        yield
        stop.set()
        runtime.close()
        log.info("node agent %s stopped", config.name)

    # The schema (/openapi.json) is served behind the token like everything else (no
    # /docs: see the orchestrator's).
    app = FastAPI(
        title=f"fogshift node agent {config.name}",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        docs_url=None,
        redoc_url=None,
    )
    app.state.runtime = runtime
    app.state.removed = removed
    install_error_handlers(app, agent_access(config, removed))

    @app.get("/health")
    def health() -> AgentHealth:
        return AgentHealth(
            node=config.name,
            ready=runtime.ready,
            error=runtime.spark_error,
            pid=os.getpid(),
            pgid=os.getpgid(0),
        )

    @app.get("/elements")
    def elements() -> list[ElementInfo]:
        return runtime.elements()

    @app.put("/pipelines/{pipeline}/elements/{element}")
    def deploy(pipeline: NameParam, element: NameParam, request: DeployRequest) -> ElementInfo:
        if request.element.id != element:
            raise InvalidInput(
                f"deploy request for {pipeline}/{element} carries element {request.element.id!r}",
                expected=repr(element),
                received=repr(request.element.id),
                hint="the path and the body name the same element",
            )
        # Here, not only where the spec was loaded: the files are read on this node, and a
        # missing one failed the PE over and over once started (a deploy refused instead is
        # undone, a migration to here rolled back).
        check_element_files(request.element, node=config.name)
        return runtime.deploy(pipeline, request.element, request.fresh, request.gate, request.epoch)

    @app.post("/pipelines/{pipeline}/check")
    def check_elements(pipeline: NameParam, request: ElementsCheck) -> ElementsChecked:
        # A deploy asks before it changes anything: refused at a PE's start, one PE's
        # missing input or a class that does not import came after a sink had emptied its
        # file and the run before's streams and checkpoints were gone (and a class that
        # does not build was hosted failed while the deploy said "deployed").
        for element in request.elements:
            check_element_files(element, node=config.name)
        for element in request.elements:
            if element.role == "processor":
                runtime.check_build(pipeline, element)
        return ElementsChecked(node=config.name, elements=[e.id for e in request.elements])

    @app.delete("/pipelines/{pipeline}/elements/{element}")
    def remove(pipeline: NameParam, element: NameParam, discard: bool = False) -> ElementInfo:
        return runtime.remove(pipeline, element, discard)

    @app.post("/pipelines/{pipeline}/elements/{element}/pause")
    def pause(
        pipeline: NameParam, element: NameParam, timeout_s: PauseTimeoutQuery = 60.0
    ) -> ElementProgress:
        return runtime.pause(pipeline, element, timeout_s)

    @app.post("/pipelines/{pipeline}/elements/{element}/resume")
    def resume(pipeline: NameParam, element: NameParam) -> ElementProgress:
        return runtime.resume(pipeline, element)

    @app.put("/pipelines/{pipeline}/elements/{element}/gate")
    def gate(pipeline: NameParam, element: NameParam, request: GateRequest) -> ElementProgress:
        return runtime.set_gate(pipeline, element, request.gate)

    @app.get("/pipelines/{pipeline}/elements/{element}/progress")
    def progress(
        pipeline: NameParam,
        element: NameParam,
        wait_s: ProgressWaitQuery = 0.0,
        seen: ProgressSeenQuery = None,
        state: PEState | None = None,
    ) -> ElementProgress:
        # A long poll when the caller says what it last saw: answered when that changed.
        last = (seen, state) if seen is not None and state is not None else None
        return runtime.progress(pipeline, element, changed_from=last, wait_s=wait_s)

    @app.get("/pipelines/{pipeline}/elements/{element}/state")
    def twin_state(
        pipeline: NameParam,
        element: NameParam,
        key: StateKeyQuery = None,
        limit: StateLimitQuery = 1000,
    ) -> TwinState:
        """A stateful PE's state per key as of its newest committed batch (one Spark job)."""
        return runtime.twin_state(pipeline, element, key, limit)

    @app.get("/pipelines/{pipeline}/elements/{element}/keys")
    def state_keys(pipeline: NameParam, element: NameParam) -> StateKeys:
        """The keys a keyed PE holds state for, as of its newest committed batch."""
        return runtime.state_keys(pipeline, element)

    @app.get("/pipelines/{pipeline}/elements/{element}/checkpoint")
    def get_checkpoint(pipeline: NameParam, element: NameParam, warm: bool = False) -> Response:
        return _packed(*runtime.checkpoint(pipeline, element, warm))

    @app.post("/pipelines/{pipeline}/elements/{element}/checkpoint")
    def pack_checkpoint(
        pipeline: NameParam, element: NameParam, request: CheckpointRequest
    ) -> Response:
        """As GET, leaving out the files whose content the asker holds (``known``), and the
        chunks of large files it holds (``known_chunks``)."""
        return _packed(
            *runtime.checkpoint(
                pipeline,
                element,
                request.warm,
                frozenset(request.known),
                frozenset(request.known_chunks),
            )
        )

    @app.get("/pipelines/{pipeline}/elements/{element}/snapshots/latest")
    def latest_snapshot(pipeline: NameParam, element: NameParam) -> CheckpointManifest:
        manifest = runtime.latest_snapshot(pipeline, element)
        if manifest is None:
            raise UnknownElement(
                f"node {config.name!r} has no node-level checkpoint of {pipeline}/{element}",
                expected="a PE that ran here and committed a batch since its start",
                received=f"{pipeline}/{element}",
                hint="node-level checkpoints are taken every checkpoint interval "
                "(FOGSHIFT_CHECKPOINT_INTERVAL_S) of a PE that committed a batch",
            )
        return manifest

    def snapshot_bytes(
        pipeline: str, element: str, snapshot: str, rel: str,
        offset: int | None = None, length: int | None = None,
    ) -> bytes:  # fmt: skip
        """File ``rel`` of the snapshot, or ``length`` bytes of it from ``offset``."""
        # A bad name or a path leaving the snapshot raises InvalidName/PathEscape (422).
        path = runtime.snapshot_file(pipeline, element, snapshot, rel)
        what = (
            f"file {rel!r} of snapshot {snapshot} of {pipeline}/{element} on node {config.name!r}"
        )
        return read_range(path, offset, length, what)

    @app.get("/pipelines/{pipeline}/elements/{element}/snapshots/{snapshot}/chunks/{rel:path}")
    def snapshot_file_chunks(
        pipeline: NameParam, element: NameParam, snapshot: SnapshotParam, rel: RelPathParam
    ) -> FileChunks:
        data = snapshot_bytes(pipeline, element, snapshot, rel)
        return FileChunks(size=len(data), chunks=file_chunks(data))

    @app.get("/pipelines/{pipeline}/elements/{element}/snapshots/{snapshot}/files/{rel:path}")
    def snapshot_file_bytes(
        pipeline: NameParam,
        element: NameParam,
        snapshot: SnapshotParam,
        rel: RelPathParam,
        offset: OffsetQuery = None,
        length: LengthQuery = None,
    ) -> Response:
        data = snapshot_bytes(pipeline, element, snapshot, rel, offset, length)
        # Pinned again once sent: over a slow link a large file takes long to go out, and
        # the puller's next request for the snapshot comes only after it.
        sent = BackgroundTask(runtime.pins.touch, pipeline, element, snapshot)
        if pacer is None:
            return Response(content=data, media_type="application/octet-stream", background=sent)
        return StreamingResponse(
            pacer.paced(data),
            media_type="application/octet-stream",
            headers={"content-length": str(len(data))},
            background=sent,
        )

    @app.put("/pipelines/{pipeline}/elements/{element}/checkpoint")
    async def put_checkpoint(
        pipeline: NameParam, element: NameParam, request: Request
    ) -> InstalledCheckpoint:
        digest = request.headers.get(SHA_HEADER, "")
        if not re.fullmatch(SHA256_RE, digest):
            # A request without the archive's digest cannot be checked: the caller's mistake
            # (a 422), not a copy torn in transit (a 500 the orchestrator would retry).
            raise InvalidInput(
                f"a checkpoint of {pipeline}/{element} sent without its digest",
                expected=f"header {SHA_HEADER}: the archive's sha256 (64 hex digits)",
                received=repr(digest[:80]),
                hint="send the archive `fogshift.checkpoint` packs with its sha256",
            )
        # Counted before the body comes: a discard while it is received or filled in (the
        # orchestrator gave up on this request) must keep the copy out.
        discards = runtime.discards(pipeline, element)
        data = await request.body()
        await run_in_threadpool(replicas.install_packed, pipeline, element, data, digest, discards)
        return InstalledCheckpoint(installed_bytes=len(data))

    @app.post("/pipelines/{pipeline}/elements/{element}/checkpoint/install")
    def install_checkpoint(
        pipeline: NameParam, element: NameParam, request: CopyRequest
    ) -> InstallResult:
        if request.manifest is not None:
            check_manifest(request.manifest, pipeline, element)
        return replicas.install(pipeline, element, request.manifest, request.source)

    @app.get("/replicas")
    def held_replicas() -> list[ReplicaInfo]:
        return replicas.held()

    @app.post("/replicas/{pipeline}/{element}")
    def copy_replica(pipeline: NameParam, element: NameParam, request: CopyRequest) -> CopyResult:
        if request.manifest is None:
            raise InvalidInput(
                f"replica request for {pipeline}/{element} needs that PE's checkpoint manifest",
                expected="manifest: the PE's checkpoint manifest as the central store keeps it",
                received="null",
                hint="send the manifest of the checkpoint to copy (the orchestrator's "
                "replication does)",
            )
        check_manifest(request.manifest, pipeline, element)
        return CopyResult(fetched_bytes=replicas.copy(request.manifest, request.source))

    @app.delete("/replicas/{pipeline}/{element}")
    def drop_replica(pipeline: NameParam, element: NameParam) -> DroppedReplica:
        # The orchestrator's, for a PE this node no longer backs up (its pipeline stopped or
        # gone, the PE retired, or running here): copies kept for good filled the disk.
        return replicas.drop(pipeline, element)

    add_blob_routes(app, replicas.store.blob_path, replicas.store.blob_chunks,
                    f"on node {config.name!r}")  # fmt: skip

    @app.delete("/pipelines/{pipeline}")
    def remove_pipeline(pipeline: NameParam, discard: bool = False) -> list[ElementInfo]:
        # With ``discard`` (the pipeline is deleted): its copies kept here as a backup too.
        removed = runtime.remove_pipeline(pipeline, discard)
        if discard:
            replicas.drop_pipeline(pipeline)
        return removed

    return app
