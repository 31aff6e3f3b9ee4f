"""The orchestrator's REST API."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Body, FastAPI
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict

from fogshift.common.http import install_error_handlers
from fogshift.migration.procedure import Mode
from fogshift.orchestrator.service import Orchestrator, OrchestratorConfig


class MigrateRequest(BaseModel):
    """Body of ``POST /pipelines/{name}/elements/{element}/migrate``."""

    model_config = ConfigDict(extra="forbid")

    target: str
    mode: Mode = "precopy"


class RestoreRequest(BaseModel):
    """Body of ``POST /pipelines/{name}/elements/{element}/restore``."""

    model_config = ConfigDict(extra="forbid")

    target: str | None = None


def create_app(config: OrchestratorConfig) -> FastAPI:
    """The orchestrator's FastAPI app; runs the reconciler with the server."""
    orchestrator = Orchestrator(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loops = (orchestrator.run_reconciler, orchestrator.run_central, orchestrator.run_planner)
        for loop in loops:
            threading.Thread(target=loop, daemon=True).start()
        yield
        orchestrator.close()

    app = FastAPI(title="fogshift orchestrator", lifespan=lifespan)
    app.state.orchestrator = orchestrator
    install_error_handlers(app, config.token)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "nodes": len(orchestrator.registry.nodes())}

    @app.post("/nodes/{name}/heartbeat")
    def heartbeat(name: str, report: dict[str, Any] = Body(...)) -> dict[str, Any]:
        orchestrator.heartbeat(name, report)
        return {"ok": True}

    @app.get("/nodes")
    def nodes() -> list[dict[str, Any]]:
        return orchestrator.nodes()

    @app.post("/pipelines")
    def deploy(spec: dict[str, Any] = Body(...)) -> dict[str, Any]:
        return orchestrator.deploy(spec)

    @app.get("/pipelines")
    def status_all() -> list[dict[str, Any]]:
        return orchestrator.status()

    @app.get("/pipelines/{name}")
    def status(name: str) -> dict[str, Any]:
        return orchestrator.status(name)[0]

    @app.get("/pipelines/{name}/errors")
    def errors(name: str, limit: int = 1000) -> list[dict[str, Any]]:
        return orchestrator.errors(name, limit)

    @app.post("/pipelines/{name}/elements/{element}/migrate")
    def migrate(name: str, element: str, request: MigrateRequest) -> dict[str, Any]:
        return orchestrator.migrate(name, element, request.target, request.mode)

    @app.post("/pipelines/{name}/elements/{element}/restore")
    def restore(name: str, element: str, request: RestoreRequest) -> dict[str, Any]:
        return orchestrator.restore(name, element, request.target)

    @app.get("/plan")
    def plan() -> dict[str, Any]:
        return orchestrator.plan

    @app.put("/topology")
    def put_topology(text: str = Body(..., media_type="text/plain")) -> dict[str, Any]:
        return orchestrator.set_topology(text)

    @app.get("/checkpoints/blobs/{sha}")
    def central_blob(sha: str) -> FileResponse:
        return FileResponse(
            orchestrator.central.blob_path(sha), media_type="application/octet-stream"
        )

    @app.post("/pipelines/{name}/stop")
    def stop(name: str) -> dict[str, Any]:
        return orchestrator.stop(name)

    return app
