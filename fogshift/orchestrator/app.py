"""The orchestrator's REST API.

Two kinds of caller: the operator (the CLI, with the operator token: every endpoint) and
the node agents (each with its own node token: only its node endpoints — heartbeat, node
directory — and the central store's checkpoint blobs); see :func:`orchestrator_access`.
Every name in a URL is checked against ``fogshift.common.names`` before a handler runs.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import Body, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from fogshift.common.exceptions import Forbidden
from fogshift.common.http import (
    DirectoryEntry,
    NodeDirectory,
    blob_token,
    node_token,
    same_token,
    token_node,
)
from fogshift.common.names import KEY_GROUP_RE, NAME_RE
from fogshift.common.service import (
    ERROR_RESPONSES,
    Access,
    ElementQuery,
    ErrorsLimitQuery,
    EventsAfterQuery,
    EventsLimitQuery,
    EventsTailQuery,
    FreshQuery,
    NameParam,
    StateKeyQuery,
    StateLimitQuery,
    add_blob_routes,
    bearer,
    install_error_handlers,
    wrong_token,
)
from fogshift.contracts import (
    Ack,
    DeadLetter,
    DeleteResult,
    EventPage,
    GroupMigrationReport,
    Heartbeat,
    HeartbeatAnswer,
    HopLatency,
    KeyMoveReport,
    KeyOrder,
    MigrationMode,
    MigrationReport,
    NodeAdmission,
    NodeHold,
    NodeView,
    OperationView,
    OrchestratorHealth,
    PipelineStatus,
    PlanView,
    RestoreReport,
    ScaleReport,
    StopResult,
    TwinState,
)
from fogshift.exceptions import FogshiftError, InvalidInput, NotFound
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.exceptions import NodeRemoved, stale_generation
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec.models import MAX_PARTITIONS, PipelineSpec

_BLOBS = re.compile(r"/checkpoints/blobs/[^/]+(/chunks)?")

log = logging.getLogger("fogshift.orchestrator")


def orchestrator_access(
    operator_token: str,
    removed: Callable[[str], bool] = lambda _: False,
    generation: Callable[[str], int] = lambda _: 0,
) -> Access:
    """The operator token opens every endpoint; node ``X``'s token (see
    ``common.http.node_token``) only ``POST /nodes/X/heartbeat``, ``GET /nodes/X/directory``
    and ``GET /checkpoints/blobs/{sha256}[/chunks]``: a node can neither speak for another node nor
    deploy, migrate, restore, stop or read the registry. A node ``removed`` (taken out of the
    cluster) has its token open nothing, and so has one of an earlier ``generation`` of a
    name added again since (the machine that was taken out)."""

    def access(method: str, path: str, given: str) -> FogshiftError | None:
        if same_token(given, operator_token):
            return None
        claim = token_node(given)
        if claim is None or not same_token(given, node_token(operator_token, *claim)):
            return wrong_token("the orchestrator", given)
        node, of = claim
        if removed(node):
            return NodeRemoved(
                f"node {node!r} was removed from the cluster: its token opens nothing on the "
                "orchestrator",
                expected="the operator token, or the token of a node in the cluster",
                received=f"the token of removed node {node!r}",
                hint=f"`fogshift up --nodes` naming every node and {node} adds it again",
            )
        now = generation(node)
        if of != now:
            return stale_generation(node, of, now)
        allowed = {("POST", f"/nodes/{node}/heartbeat"), ("GET", f"/nodes/{node}/directory")}
        if (method, path) in allowed or (method == "GET" and _BLOBS.fullmatch(path)):
            return None
        return Forbidden(
            f"the token of node {node!r} cannot call {method} {path} on the orchestrator: it opens "
            "only that node's heartbeat and directory and the central checkpoint blobs",
            expected="the operator token",
            received=f"node {node!r}'s token",
            hint="operator commands need the operator token in <home>/token",
        )

    return access


def _claimed_generation(request: Request) -> int | None:
    """The generation of the node token a request came with (checked by
    :func:`orchestrator_access` as it arrived), ``None`` for the operator token."""
    claim = token_node(bearer(request))
    return claim[1] if claim is not None else None


class DrainLease(BaseModel):
    """``PUT /nodes/{name}/leaving``: how long the node counts as leaving from now (a
    drain renews it while it runs); ``null`` ends it."""

    model_config = ConfigDict(extra="forbid")

    # (Strict: JSON's true was read as 1 s; NaN said "at most 7200".)
    seconds: float | None = Field(gt=0, le=7200, strict=True, allow_inf_nan=False)


class MigrateRequest(BaseModel):
    """Body of ``POST /pipelines/{name}/elements/{element}/migrate``."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(pattern=NAME_RE)
    mode: MigrationMode = MigrationMode.PRECOPY


class GroupMigrateRequest(BaseModel):
    """Body of ``POST /pipelines/{name}/migrate``: several PEs to one node, as one operation."""

    model_config = ConfigDict(extra="forbid")

    elements: list[Annotated[str, Field(pattern=NAME_RE)]] = Field(min_length=1, max_length=64)
    target: str = Field(pattern=NAME_RE)
    mode: MigrationMode = MigrationMode.PRECOPY


class KeyMoveRequest(BaseModel):
    """Body of ``POST /pipelines/{name}/elements/{element}/keys/migrate``."""

    model_config = ConfigDict(extra="forbid")

    keys: list[str] = Field(default=[], max_length=1000)
    target: str = Field(pattern=NAME_RE)
    order: KeyOrder = KeyOrder.BACKLOG
    #: ``G/N`` instead of keys: key group G of N (CRC-32 of the key modulo N), now and later.
    group: str | None = Field(default=None, pattern=KEY_GROUP_RE)
    #: Listed keys: copy their states to the target first, then move what changed since
    #: (``None``: yes). Refused with a group, which always sends whole states.
    precopy: bool | None = Field(default=None, strict=True)
    #: Listed keys: move them in waves of this many (default: one key first, then growing
    #: with the states' sizes, up to 64 keys); at least the number of keys: all at once.
    wave_keys: int | None = Field(default=None, ge=1, le=1000, strict=True)


class ScaleRequest(BaseModel):
    """Body of ``POST /pipelines/{name}/elements/{element}/scale``."""

    model_config = ConfigDict(extra="forbid")

    # (Strict, as the booleans: JSON's true was read as 1 partition, a scale-in that ran;
    # "no" as false. Not the whole model: FastAPI checks a parsed body in Python's mode,
    # where a strict enum refuses its own value's text.)
    partitions: int = Field(ge=1, le=MAX_PARTITIONS, strict=True)
    nodes: list[Annotated[str, Field(pattern=NAME_RE)]] | None = Field(
        default=None, min_length=1, max_length=63
    )
    #: Move the keys holding state ahead of the rescale in waves (else all at its record).
    waves: bool = Field(default=False, strict=True)


class RestoreRequest(BaseModel):
    """Body of ``POST /pipelines/{name}/elements/{element}/restore``."""

    model_config = ConfigDict(extra="forbid")

    target: str | None = Field(default=None, pattern=NAME_RE)


#: The largest request body the orchestrator reads: a spec, a command or a node's heartbeat
#: is kilobytes (a heartbeat ~1 KB per PE the node hosts); a node's token must not let it
#: make the orchestrator hold gigabytes.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Threads kept for heartbeats alone: the other handlers share the server's pool (40), which
#: long requests (a migration, a read waiting on a node) can fill; a heartbeat queued behind
#: them would leave its node looking dead, and every call to that node's agent is given up
#: after ``call_silence_s`` without one (``Orchestrator._silence``).
HEARTBEAT_THREADS = 4


def create_app(config: OrchestratorConfig) -> FastAPI:
    """The orchestrator's FastAPI app; runs the reconciler with the server."""
    orchestrator = Orchestrator(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loops = (
            orchestrator.run_pause_watch,
            orchestrator.run_reconciler,
            orchestrator.run_central,
            orchestrator.run_planner,
            orchestrator.run_standby_follower,
            orchestrator.run_standby_keeper,
        )
        # (After a crash, its log went on from the dead one's with nothing between.)
        pipelines = orchestrator.registry.pipelines()
        log.info("orchestrator started: pid %d, home %s, port %d; %d pipeline(s), %d "
                 "unfinished operation(s) to resolve", os.getpid(), config.home, config.port,
                 len(pipelines), len(orchestrator.registry.unfinished()))  # fmt: skip
        for loop in loops:
            threading.Thread(target=loop, daemon=True).start()
        yield
        orchestrator.close()
        log.info("orchestrator stopped")

    # The schema (/openapi.json) is served behind the operator token like everything else
    # (see orchestrator_access): it describes every endpoint with its contract. No /docs:
    # its page loads Swagger UI from a CDN (a fog node may be offline) and fetches the
    # schema without the token, so it only ever showed a blank page or a 401.
    app = FastAPI(
        title="fogshift orchestrator",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        docs_url=None,
        redoc_url=None,
    )
    app.state.orchestrator = orchestrator
    install_error_handlers(
        app,
        orchestrator_access(config.token, orchestrator.removed, orchestrator.generation),
        MAX_BODY_BYTES,
    )
    _describe_spec_body(app)

    @app.get("/health")
    def health() -> OrchestratorHealth:
        return OrchestratorHealth(
            ok=True,
            nodes=len(orchestrator.registry.nodes()),
            warnings=orchestrator.health_warnings(),
        )

    beats = CapacityLimiter(HEARTBEAT_THREADS)

    @app.post("/nodes/{name}/heartbeat")
    async def heartbeat(name: NameParam, report: Heartbeat, request: Request) -> HeartbeatAnswer:
        # The token's generation was current when its headers came; a body sent slowly
        # can outlast a removal and a new admission: checked again here, and in the
        # registry's write (or the removed machine's URL would be called with the new token).
        generation = _claimed_generation(request)
        if generation is not None:
            orchestrator.check_generation(name, generation)
        # Heard on arrival, on the event loop: the registry's write (SQLite) waits for one
        # of the heartbeats' own threads, never for the shared pool.
        orchestrator.heard(name)
        await anyio.to_thread.run_sync(
            orchestrator.heartbeat, name, report, generation, limiter=beats
        )
        return HeartbeatAnswer(
            removed=orchestrator.removed_nodes(), generations=orchestrator.generations()
        )

    @app.get("/nodes/{name}/directory")
    def directory(name: NameParam, request: Request) -> NodeDirectory:
        """The nodes ``name`` may copy checkpoint files from, with their blob tokens for
        ``name`` (of the generation of the caller's token: a request of the machine taken
        out that outlasted a new admission gets tokens the peers refuse)."""
        reader = _claimed_generation(request)
        if reader is None:  # (the operator's)
            reader = orchestrator.generation(name)
        return NodeDirectory(
            nodes=[
                DirectoryEntry(
                    name=n.name,
                    url=n.url,
                    blob_token=blob_token(
                        node_token(config.token, n.name, orchestrator.generation(n.name)),
                        name,
                        reader,
                    ),
                )
                for n in orchestrator.registry.nodes()
            ]
        )

    @app.get("/nodes")
    def nodes() -> list[NodeView]:
        return orchestrator.nodes()

    @app.get("/nodes/{name}/holds")
    def node_holds(name: NameParam) -> list[NodeHold]:
        """What keeps the node in the cluster now: what ``DELETE /nodes/{name}`` would
        refuse on (``[]``: it may be removed)."""
        return orchestrator.holds(name)

    @app.put("/nodes/{name}/leaving")
    def drain_lease(name: NameParam, lease: DrainLease) -> Ack:
        """Mark the node leaving for ``lease.seconds`` (a drain before its removal: nothing
        is placed there meanwhile), or (``null``) end the mark."""
        orchestrator.drain_lease(name, lease.seconds)
        return Ack()

    @app.delete("/nodes/{name}")
    def remove_node(name: NameParam) -> Ack:
        """Take the node out of the cluster (it must host nothing); its agent is the
        caller's to stop. Asked again once removed: nothing changes."""
        orchestrator.remove_node(name)
        return Ack()

    @app.post("/nodes/{name}/admit")
    def admit_node(name: NameParam) -> NodeAdmission:
        """Let a removed node join again (before its agent starts): its heartbeats are taken
        again, with the token of its next generation (the caller writes it for the agent;
        those of before stay refused). A node not removed: nothing changes."""
        return NodeAdmission(name=name, generation=orchestrator.admit_node(name))

    @app.post("/pipelines")
    def deploy(spec: dict[str, Any] = Body(...), fresh: FreshQuery = False) -> PipelineStatus:
        """Start the spec's pipeline, fresh; a stopped one of its name that ran is started
        over only with ``fresh`` (else refused, 409: `start` goes on with it)."""
        # The spec is taken as it comes: ``spec.loader`` refuses a bad one with "did you
        # mean", which a model's validation error would not say.
        return orchestrator.deploy(spec, fresh=fresh)

    @app.get("/pipelines")
    def status_all() -> list[PipelineStatus]:
        return orchestrator.status()

    @app.get("/pipelines/{name}")
    def status(name: NameParam) -> PipelineStatus:
        return orchestrator.status(name)[0]

    @app.get("/pipelines/{name}/errors")
    def errors(
        name: NameParam, limit: ErrorsLimitQuery = 1000, element: ElementQuery = None
    ) -> list[DeadLetter]:
        """The pipeline's dead letters with their reasons: each PE's newest ``limit``, PE by
        PE, oldest first (``element``: that PE's only)."""
        return orchestrator.errors(name, limit, element)

    @app.get("/pipelines/{name}/latency")
    def latency(name: NameParam) -> list[HopLatency]:
        """Each single-input PE's newest per-hop latency, by the broker's clock."""
        return orchestrator.latency(name)

    @app.get("/pipelines/{name}/elements/{element}/state")
    def twin_state(
        name: NameParam,
        element: NameParam,
        key: StateKeyQuery = None,
        limit: StateLimitQuery = 1000,
    ) -> TwinState:
        """A stateful PE's state per key (its digital twins), as of a committed batch."""
        return orchestrator.twin_state(name, element, key, limit)

    @app.get("/pipelines/{name}/elements/{element}/events")
    def events(
        name: NameParam,
        element: NameParam,
        key: StateKeyQuery = None,
        after: EventsAfterQuery = None,
        tail: EventsTailQuery = None,
        limit: EventsLimitQuery = 500,
    ) -> EventPage:
        """A page of the events a PE emitted (its output stream): forward from ``after``, or
        the newest ones; only a key's with ``key`` (a keyed PE). A partitioned element's:
        its partitions' newest, merged, each naming its partition (no ``after``)."""
        return orchestrator.events(name, element, key, after, tail, limit)

    @app.post("/pipelines/{name}/elements/{element}/migrate")
    def migrate(name: NameParam, element: NameParam, request: MigrateRequest) -> MigrationReport:
        return orchestrator.migrate(name, element, request.target, request.mode)

    @app.post("/pipelines/{name}/migrate")
    def migrate_group(name: NameParam, request: GroupMigrateRequest) -> GroupMigrationReport:
        """Move several PEs to one node, one after another; if one fails, the ones moved are
        moved back. Answers 200 with the outcome in ``status`` once anything moved."""
        return orchestrator.migrate_group(name, request.elements, request.target, request.mode)

    @app.post("/pipelines/{name}/elements/{element}/keys/migrate")
    def migrate_keys(name: NameParam, element: NameParam, request: KeyMoveRequest) -> KeyMoveReport:
        """Move single keys of a partitioned element to its partition on ``target`` (a node,
        or a partition's id), while every partition runs (PAM). Answers 200 with ``pending``
        if a wave's states have not come within a minute: that wave stands (the target holds
        its keys' events), later ones are not appended."""
        group = None
        if request.group is not None:
            g, n = request.group.split("/")
            group = (int(g), int(n))
        return orchestrator.migrate_keys(
            name,
            element,
            request.keys,
            request.target,
            request.order,
            group=group,
            precopy=request.precopy,
            wave_keys=request.wave_keys,
        )

    @app.post("/pipelines/{name}/elements/{element}/scale")
    def scale(name: NameParam, element: NameParam, request: ScaleRequest) -> ScaleReport:
        """Give a partitioned element ``partitions`` partitions while all run: the added ones
        on ``nodes`` (default: the healthy nodes hosting fewest of them); the keys holding
        state whose partition changes move as in a key move (with ``waves``, in waves ahead
        of the rescale)."""
        return orchestrator.scale(name, element, request.partitions, request.nodes,
                                  waves=request.waves)  # fmt: skip

    @app.post("/pipelines/{name}/elements/{element}/restore")
    def restore(
        name: NameParam, element: NameParam, request: RestoreRequest | None = None
    ) -> RestoreReport:
        # (No body: every field has its default; a 422 "Field required" said otherwise.)
        return orchestrator.restore(name, element, request.target if request else None)

    @app.get("/pipelines/{name}/elements/{element}/operation")
    def operation(name: NameParam, element: NameParam) -> OperationView:
        """The PE's latest migration or restore as journaled, running or not: the CLI polls
        it to show the phase of the operation it waits for."""
        journal = orchestrator.registry.operations(name, element)
        if not journal:
            raise NotFound(
                f"no migration or restore of {name}/{element} has been journaled",
                hint="`fogshift migrate` and `fogshift restore` start one",
            )
        # ``owner`` (which orchestrator process runs it) is internal to recovery.
        op = journal[-1].model_dump(exclude={"owner"})
        return OperationView.model_validate({**op, "running": op["outcome"] is None})

    @app.get("/plan")
    def plan() -> PlanView:
        return orchestrator.plan

    @app.put(
        "/topology",
        openapi_extra={"requestBody": {"required": False, "content": {
            "text/plain": {"schema": {"type": "string", "description": "the fog topology (YAML)"}},
        }}},
    )  # fmt: skip
    async def put_topology(request: Request) -> PlanView:
        # (Read whole, not as a required text body: an empty file, a valid topology of
        # defaults, was refused as "body: missing" with a hint to send JSON, and one not in
        # UTF-8 with pydantic's words.)
        body = await request.body()
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                "the fog topology is not text in UTF-8",
                expected="YAML text in UTF-8",
                received=f"byte {body[exc.start]:#04x} at offset {exc.start}",
                hint="save the file as UTF-8 and send it again",
            ) from None
        return await anyio.to_thread.run_sync(orchestrator.set_topology, text)

    add_blob_routes(app, orchestrator.central.blob_path, orchestrator.central.blob_chunks,
                    "in the central store")  # fmt: skip

    @app.post("/pipelines/{name}/stop")
    def stop(name: NameParam) -> StopResult:
        return orchestrator.stop(name)

    @app.post("/pipelines/{name}/start")
    def start(name: NameParam) -> PipelineStatus:
        # (A stopped pipeline went on only by a deploy, which starts it afresh.)
        return orchestrator.start(name)

    @app.delete("/pipelines/{name}")
    def delete(name: NameParam) -> DeleteResult:
        # (Stopped first: a running pipeline's delete is refused, 409.)
        return orchestrator.delete(name)

    return app


def _describe_spec_body(app: FastAPI) -> None:
    """Describe ``POST /pipelines``'s body in the schema as a :class:`PipelineSpec` (its
    route takes the spec as a plain mapping, so that the loader refuses a bad one with a
    "did you mean": the schema said only "an object"). Its models join the schema's
    components; one of a name the API's own models have keeps theirs (none today)."""
    made = app.openapi

    def schema() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = made()
        spec = PipelineSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        models = document.setdefault("components", {}).setdefault("schemas", {})
        for name, model in spec.pop("$defs", {}).items():
            models.setdefault(name, model)
        models.setdefault("PipelineSpec", spec)
        body = {"schema": {"$ref": "#/components/schemas/PipelineSpec"}}
        deploy = document["paths"]["/pipelines"]["post"]
        deploy["requestBody"] = {"required": True, "content": {"application/json": body}}
        return document

    app.openapi = schema  # type: ignore[method-assign]
