"""The node agent's REST API and heartbeat."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from fogshift.agent.config import AgentConfig
from fogshift.agent.node import NodeRuntime
from fogshift.common.http import install_error_handlers
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.agent")


class DeployRequest(BaseModel):
    """Body of ``PUT /pipelines/{pipeline}/elements/{element}``."""

    model_config = ConfigDict(extra="forbid")

    element: ElementSpec
    fresh: bool = False


def heartbeat_loop(config: AgentConfig, runtime: NodeRuntime, stop: threading.Event) -> None:
    """Tell the orchestrator, every ``heartbeat_s``, that this node lives and what it runs."""
    with httpx.Client(
        base_url=config.orchestrator_url,
        headers={"Authorization": f"Bearer {config.token}"},
        timeout=5,
    ) as client:
        while not stop.is_set():
            body = {
                "url": config.url,
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
                "ready": runtime.ready,
                "error": runtime.spark_error,
                "elements": runtime.elements(),
            }
            try:
                client.post(f"/nodes/{config.name}/heartbeat", json=body)
            except httpx.HTTPError as exc:  # the orchestrator may be restarting
                log.debug("heartbeat failed: %s", exc)
            stop.wait(config.heartbeat_s)


def create_app(config: AgentConfig) -> FastAPI:
    """The agent's FastAPI app; starts Spark and the heartbeat with the server."""
    runtime = NodeRuntime(config)
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        beat = threading.Thread(
            target=heartbeat_loop, args=(config, runtime, stop), name="heartbeat", daemon=True
        )
        beat.start()
        yield
        stop.set()
        runtime.close()

    app = FastAPI(title=f"fogshift node agent {config.name}", lifespan=lifespan)
    app.state.runtime = runtime
    install_error_handlers(app, config.token)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "node": config.name,
            "ready": runtime.ready,
            "error": runtime.spark_error,
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
        }

    @app.get("/elements")
    def elements() -> list[dict[str, Any]]:
        return runtime.elements()

    @app.put("/pipelines/{pipeline}/elements/{element}")
    def deploy(pipeline: str, element: str, request: DeployRequest) -> dict[str, Any]:
        return runtime.deploy(pipeline, request.element, request.fresh)

    @app.delete("/pipelines/{pipeline}/elements/{element}")
    def remove(pipeline: str, element: str) -> dict[str, Any]:
        return runtime.remove(pipeline, element)

    @app.delete("/pipelines/{pipeline}")
    def remove_pipeline(pipeline: str) -> list[dict[str, Any]]:
        return runtime.remove_pipeline(pipeline)

    return app
