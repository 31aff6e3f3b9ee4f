"""The dashboard's pages and actions (FastAPI, server-rendered with Jinja2).

Every figure comes from the orchestrator's REST API through :class:`Orchestrator` (typed
contracts, the operator token); the dashboard keeps nothing but its sessions and the last
minutes of samples (:mod:`fogshift.web.history`). Actions (migrate, restore, stop, deploy)
take two steps: a form, then a confirmation page naming exactly what will happen; the result
page shows the operation's report, or the refusal with what was expected, what was received
and a hint, as the CLI prints them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from fogshift.common.http import NameParam, ServiceClient
from fogshift.contracts import (
    DeadLetter,
    MigrationMode,
    MigrationReport,
    NodeView,
    OperationView,
    PipelineStatus,
    PlanView,
    RestoreReport,
    StopResult,
)
from fogshift.exceptions import FogshiftError, InvalidInput, NotFound
from fogshift.spec.loader import load_spec_text
from fogshift.web.auth import COOKIE, Sessions
from fogshift.web.exceptions import CrossSiteRequest
from fogshift.web.graph import lag, layout
from fogshift.web.history import History, Sampler

HERE = Path(__file__).parent
#: Largest spec file the deploy form takes.
MAX_SPEC_BYTES = 256 * 1024


class Orchestrator:
    """The orchestrator's REST API as the dashboard uses it: typed answers only."""

    def __init__(self, client: ServiceClient) -> None:
        self.client = client

    def pipelines(self) -> list[PipelineStatus]:
        return [PipelineStatus.model_validate(p) for p in self.client.get("/pipelines")]

    def pipeline(self, name: str) -> PipelineStatus:
        return self.client.call(PipelineStatus, "GET", f"/pipelines/{name}")

    def nodes(self) -> list[NodeView]:
        return [NodeView.model_validate(n) for n in self.client.get("/nodes")]

    def plan(self) -> PlanView:
        return self.client.call(PlanView, "GET", "/plan")

    def errors(self, name: str) -> list[DeadLetter]:
        return [DeadLetter.model_validate(d) for d in self.client.get(f"/pipelines/{name}/errors")]

    def operation(self, name: str, element: str) -> OperationView | None:
        try:
            return self.client.call(
                OperationView, "GET", f"/pipelines/{name}/elements/{element}/operation"
            )
        except NotFound:
            return None

    def migrate(self, name: str, element: str, target: str, mode: str) -> MigrationReport:
        return self.client.call(
            MigrationReport, "POST", f"/pipelines/{name}/elements/{element}/migrate",
            json={"target": target, "mode": mode},
        )  # fmt: skip

    def restore(self, name: str, element: str, target: str | None) -> RestoreReport:
        return self.client.call(
            RestoreReport, "POST", f"/pipelines/{name}/elements/{element}/restore",
            json={"target": target} if target else {},
        )  # fmt: skip

    def stop(self, name: str) -> StopResult:
        return self.client.call(StopResult, "POST", f"/pipelines/{name}/stop")

    def deploy(self, spec: dict[str, Any]) -> PipelineStatus:
        return self.client.call(PipelineStatus, "POST", "/pipelines", json=spec)


@dataclass(frozen=True)
class DashboardConfig:
    """Settings of one dashboard process.

    Attributes:
        spec_dir: Relative paths in a deployed spec are relative to it.
        interval_s: How often the orchestrator is polled for the live parts.
        window_s: How much history the charts keep.
    """

    spec_dir: Path
    interval_s: float = 1.0
    window_s: float = 600.0


def create_app(orchestrator: Orchestrator, sessions: Sessions, config: DashboardConfig) -> FastAPI:
    """The dashboard app: pages behind a session cookie, a sampler thread while it serves."""
    history = History(config.window_s)
    sampler = Sampler(
        history, lambda: (orchestrator.pipelines(), orchestrator.nodes()), config.interval_s
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sampler.start()
        yield
        sampler.close()

    app = FastAPI(title="fogshift dashboard", lifespan=lifespan, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.globals["fmt_rate"] = _fmt_rate
    templates.env.globals["fmt_time"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t))

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if path.startswith("/static/") or path == "/login":
            return await call_next(request)
        if not sessions.valid(request.cookies.get(COOKIE)):
            if request.method == "GET" and "hx-request" not in request.headers:
                return RedirectResponse("/login", status_code=303)
            return JSONResponse({"code": "not_logged_in", "message": "log in first"}, 401)
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
                err = CrossSiteRequest(
                    "this request came from another site's page",
                    expected=f"a form of this dashboard ({request.headers.get('host')})",
                    received=origin,
                )
                return _page(templates, request, "result.html", {"error": err}, err.http_status)
        return await call_next(request)

    def page(
        request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> HTMLResponse:
        context.setdefault("poll_error", sampler.error)
        return _page(templates, request, name, context, status_code)

    def failed(request: Request, err: FogshiftError, title: str) -> HTMLResponse:
        return page(request, "result.html", {"error": err, "title": title}, err.http_status)

    # -- login ----------------------------------------------------------------------------------

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request, token: str | None = None) -> Response:
        if token is None:
            return page(request, "login.html", {})
        return _log_in(request, token)

    @app.post("/login", response_class=HTMLResponse)
    def login_form(request: Request, token: Annotated[str, Form()] = "") -> Response:
        return _log_in(request, token.strip())

    def _log_in(request: Request, token: str) -> Response:
        try:
            session = sessions.login(token)
        except FogshiftError as err:
            return page(request, "login.html", {"error": err}, err.http_status)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, session, httponly=True, samesite="strict", path="/")
        return response

    @app.post("/logout")
    def logout(request: Request) -> Response:
        sessions.logout(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pages ----------------------------------------------------------------------------------

    def overview() -> dict[str, Any]:
        if history.latest is None:  # the first page before the sampler's first poll
            sampler.poll()
        snapshot = history.latest
        pipelines = snapshot.pipelines if snapshot else []
        nodes = snapshot.nodes if snapshot else []
        healthy = {n.name for n in nodes if n.healthy}
        drawings = {
            p.pipeline: layout(p, _rates(history, p), healthy) for p in pipelines
        }  # fmt: skip
        return {"pipelines": pipelines, "drawings": drawings, "nodes": nodes}

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request) -> Response:
        return RedirectResponse("/pipelines", status_code=303)

    @app.get("/pipelines", response_class=HTMLResponse)
    def pipelines_page(request: Request) -> HTMLResponse:
        return page(request, "pipelines.html", overview())

    @app.get("/fragments/pipelines", response_class=HTMLResponse)
    def pipelines_fragment(request: Request) -> HTMLResponse:
        return page(request, "_pipelines.html", overview())

    def pipeline_context(name: str) -> dict[str, Any]:
        status = orchestrator.pipeline(name)
        nodes = orchestrator.nodes()
        healthy = {n.name for n in nodes if n.healthy}
        by_id = {e.element: e for e in status.elements}
        return {
            "status": status,
            "drawing": layout(status, _rates(history, status), healthy),
            "rates": _rates(history, status),
            "lags": {e.element: lag(e, by_id) for e in status.elements},
            "marks": history.marks(name)[:20],
        }

    @app.get("/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_page(request: Request, name: NameParam) -> HTMLResponse:
        try:
            return page(request, "pipeline.html", pipeline_context(name))
        except FogshiftError as err:
            return failed(request, err, f"pipeline {name}")

    @app.get("/fragments/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_fragment(request: Request, name: NameParam) -> HTMLResponse:
        try:
            return page(request, "_pipeline.html", pipeline_context(name))
        except FogshiftError as err:
            return failed(request, err, f"pipeline {name}")

    @app.get("/api/pipelines/{name}/series")
    def series(name: NameParam) -> dict[str, object]:
        return history.series(name)

    def element_context(name: str, element: str) -> dict[str, Any]:
        status = orchestrator.pipeline(name)
        mine = next((e for e in status.elements if e.element == element), None)
        if mine is None:
            raise NotFound(
                f"pipeline {name!r} has no element {element!r}",
                expected="one of " + ", ".join(e.element for e in status.elements),
                received=element,
            )
        nodes = orchestrator.nodes()
        key = f"{name}/{element}"
        checkpoints = next(
            (c for n in nodes if n.name == mine.node for c in n.checkpoints if c.element == key),
            None,
        )
        by_id = {e.element: e for e in status.elements}
        return {
            "status": status,
            "e": mine,
            "rate": history.rate(name, element),
            "lag": lag(mine, by_id),
            "checkpoints": checkpoints,
            "operation": orchestrator.operation(name, element),
            "letters": [d for d in orchestrator.errors(name) if d.element == element][-50:],
            "targets": sorted(n.name for n in nodes if n.healthy and n.name != mine.node),
            "modes": [m.value for m in MigrationMode],
        }

    @app.get("/pipelines/{name}/elements/{element}", response_class=HTMLResponse)
    def element_page(request: Request, name: NameParam, element: NameParam) -> HTMLResponse:
        try:
            return page(request, "element.html", element_context(name, element))
        except FogshiftError as err:
            return failed(request, err, f"{name}/{element}")

    @app.get("/nodes", response_class=HTMLResponse)
    def nodes_page(request: Request) -> HTMLResponse:
        try:
            nodes, plan = orchestrator.nodes(), orchestrator.plan()
        except FogshiftError as err:
            return failed(request, err, "nodes")
        backups: dict[str, list[str]] = {}
        for key, assignment in plan.assignments.items():
            if assignment.backup:
                backups.setdefault(assignment.backup, []).append(key)
        return page(request, "nodes.html", {"nodes": nodes, "backups": backups, "plan": plan})

    # -- actions --------------------------------------------------------------------------------

    @app.post("/pipelines/{name}/elements/{element}/migrate", response_class=HTMLResponse)
    def migrate(
        request: Request,
        name: NameParam,
        element: NameParam,
        target: Annotated[str, Form()] = "",
        mode: Annotated[str, Form()] = MigrationMode.PRECOPY.value,
        confirmed: Annotated[bool, Form()] = False,
    ) -> HTMLResponse:
        what = f"migrate {name}/{element}"
        try:
            if not target:
                raise InvalidInput(
                    f"no target node to {what} to", expected="a node name", received="nothing"
                )
            if mode not in {m.value for m in MigrationMode}:
                raise InvalidInput(
                    f"unknown migration mode for {name}/{element}",
                    expected=" or ".join(m.value for m in MigrationMode), received=mode,
                )  # fmt: skip
            if not confirmed:
                current = orchestrator.pipeline(name)
                node = next((e.node for e in current.elements if e.element == element), "?")
                return page(request, "confirm.html", {
                    "title": f"Migrate {element}?",
                    "question": f"Migrate {name}/{element} from {node} to {target} ({mode})?",
                    "action": f"/pipelines/{name}/elements/{element}/migrate",
                    "fields": {"target": target, "mode": mode},
                    "back": f"/pipelines/{name}/elements/{element}",
                })  # fmt: skip
            report = orchestrator.migrate(name, element, target, mode)
        except FogshiftError as err:
            return failed(request, err, what)
        sampler.poll()
        return page(request, "result.html", {"title": what, "migration": report,
                                             "back": f"/pipelines/{name}"})  # fmt: skip

    @app.post("/pipelines/{name}/elements/{element}/restore", response_class=HTMLResponse)
    def restore(
        request: Request,
        name: NameParam,
        element: NameParam,
        target: Annotated[str, Form()] = "",
        confirmed: Annotated[bool, Form()] = False,
    ) -> HTMLResponse:
        what = f"restore {name}/{element}"
        if not confirmed:
            where = f"on {target}" if target else "on the best healthy node"
            return page(request, "confirm.html", {
                "title": f"Restore {element}?",
                "question": f"Restore {name}/{element} from its central checkpoint {where}? "
                            "Its current instance is fenced: it can never write again.",
                "action": f"/pipelines/{name}/elements/{element}/restore",
                "fields": {"target": target},
                "back": f"/pipelines/{name}/elements/{element}",
            })  # fmt: skip
        try:
            report = orchestrator.restore(name, element, target or None)
        except FogshiftError as err:
            return failed(request, err, what)
        sampler.poll()
        return page(request, "result.html", {"title": what, "restore": report,
                                             "back": f"/pipelines/{name}"})  # fmt: skip

    @app.post("/pipelines/{name}/stop", response_class=HTMLResponse)
    def stop(
        request: Request, name: NameParam, confirmed: Annotated[bool, Form()] = False
    ) -> HTMLResponse:
        if not confirmed:
            return page(request, "confirm.html", {
                "title": f"Stop {name}?",
                "question": f"Stop every PE of {name}? Their checkpoints and output stay.",
                "action": f"/pipelines/{name}/stop", "fields": {}, "back": f"/pipelines/{name}",
            })  # fmt: skip
        try:
            result = orchestrator.stop(name)
        except FogshiftError as err:
            return failed(request, err, f"stop {name}")
        sampler.poll()
        return page(request, "result.html", {"title": f"stop {name}", "stopped": result,
                                             "back": "/pipelines"})  # fmt: skip

    @app.get("/deploy", response_class=HTMLResponse)
    def deploy_page(request: Request) -> HTMLResponse:
        return page(request, "deploy.html", {"spec_dir": config.spec_dir})

    @app.post("/deploy", response_class=HTMLResponse)
    async def deploy(
        request: Request,
        spec_file: Annotated[UploadFile | None, File()] = None,
        spec_text: Annotated[str, Form()] = "",
        confirmed: Annotated[bool, Form()] = False,
    ) -> HTMLResponse:
        if spec_file is not None and spec_file.filename:
            raw = await spec_file.read(MAX_SPEC_BYTES + 1)
            spec_text = raw.decode("utf-8", errors="replace")
            if len(raw) > MAX_SPEC_BYTES:
                err = InvalidInput(
                    "the spec file is too large", expected=f"at most {MAX_SPEC_BYTES} bytes",
                    received=f"more than {MAX_SPEC_BYTES} bytes",
                )  # fmt: skip
                return failed(request, err, "deploy")
        try:
            if not spec_text.strip():
                raise InvalidInput(
                    "no pipeline spec to deploy", expected="a YAML spec file", received="nothing",
                    hint="choose a file like examples/case1/case1.yaml",
                )  # fmt: skip
            nodes = [n.name for n in orchestrator.nodes()]
            spec = load_spec_text(spec_text, config.spec_dir, nodes, "the uploaded spec")
            if not confirmed:
                return page(request, "confirm.html", {
                    "title": f"Deploy {spec.pipeline}?",
                    "question": f"Deploy pipeline {spec.pipeline}: "
                                + ", ".join(f"{e.id} ({e.kind}) on {e.node}"
                                            for e in spec.topological_order()) + "?",
                    "action": "/deploy", "fields": {"spec_text": spec_text}, "back": "/deploy",
                })  # fmt: skip
            result = orchestrator.deploy(spec.model_dump(mode="json"))
        except FogshiftError as err:
            return failed(request, err, "deploy")
        sampler.poll()
        return page(request, "result.html", {"title": f"deploy {result.pipeline}",
                                             "deployed": result,
                                             "back": f"/pipelines/{result.pipeline}"})  # fmt: skip

    return app


def _page(
    templates: Jinja2Templates,
    request: Request,
    name: str,
    context: dict[str, Any],
    status_code: int = 200,
) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def _rates(history: History, status: PipelineStatus) -> dict[str, float | None]:
    return {e.element: history.rate(status.pipeline, e.element) for e in status.elements}


def _fmt_rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.1f}/s"
