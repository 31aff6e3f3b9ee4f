"""The dashboard's pages and actions (FastAPI, server-rendered with Jinja2).

Every figure comes from the orchestrator's REST API through :class:`Orchestrator` (typed
contracts, the operator token); the dashboard keeps nothing but its sessions and the last
minutes of samples (:mod:`fogshift.web.history`). Actions (migrate, restore, stop, deploy)
take two steps: a form, then a confirmation page naming exactly what will happen; the result
page shows the operation's report, or the refusal with what was expected, what was received
and a hint, as the CLI prints them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fogshift.common.exceptions import NoAnswer
from fogshift.common.http import ServiceClient
from fogshift.common.service import NameParam, StateKeyQuery
from fogshift.common.text import one_line
from fogshift.common.validation import request_message_of
from fogshift.contracts import (
    DeadLetter,
    DeleteResult,
    ElementStatus,
    EventPage,
    GroupMigrationReport,
    HopLatency,
    MigrationMode,
    MigrationReport,
    NodeView,
    OperationView,
    PipelineState,
    PipelineStatus,
    PlanView,
    RestoreReport,
    StopResult,
    TwinState,
)
from fogshift.exceptions import (
    Conflict,
    FogshiftError,
    InvalidInput,
    InvariantViolation,
    NotFound,
    Unavailable,
)
from fogshift.spec.loader import load_spec_text
from fogshift.spec.models import KINDS
from fogshift.supervisor.cluster import OPERATION_TIMEOUT_S
from fogshift.web.auth import Sessions, cookie_name
from fogshift.web.exceptions import CrossSiteRequest
from fogshift.web.graph import lag, layout
from fogshift.web.history import History, Sampler

log = logging.getLogger("fogshift.web")
M = TypeVar("M", bound=BaseModel)
HERE = Path(__file__).parent
#: The names of this machine a loopback dashboard answers to.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
#: In :attr:`DashboardConfig.allowed_hosts`: a Host that is an IP address is served.
ANY_ADDRESS = "<any address>"
#: How long an action's result page can be shown again (a reload), and how many are kept.
RESULT_TTL_S, RESULTS_KEPT = 600.0, 64
#: Sent with every page: nothing of it in other sites' frames or referrers, nothing cached.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; script-src 'self'; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on our own
    # form posts, which the same-origin check must refuse.
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
#: Largest spec file the deploy form takes.
MAX_SPEC_BYTES = 256 * 1024
#: The ECG view: seconds of a patient's signal drawn; messages of the band-pass's stream read
#: for it (all patients' windows: 10 s of 20 patients' half-second windows), and of the
#: classifier's (alarms only: few).
ECG_SECONDS, ECG_PATIENT_TAIL, ECG_ALARM_TAIL = 10.0, 400, 1_000


def _listed(model: type[M], data: Any, what: str) -> list[M]:
    """``data`` as a list of ``model``.

    Raises:
        InvariantViolation: It is not one (a service of another version, a broken answer).
    """
    try:
        return TypeAdapter(list[model]).validate_python(data)  # type: ignore[valid-type]
    except ValidationError as exc:
        raise InvariantViolation(
            f"the orchestrator's answer to {what} does not fit the contract",
            expected=f"a list of {model.__name__}",
            received=one_line(str(exc), 300),
            hint="are the dashboard and the orchestrator the same fogshift version?",
        ) from None


class Orchestrator:
    """The orchestrator's REST API as the dashboard uses it: typed answers only.

    Reads have the client's timeout; actions (migrations, restores, deploys, stops) wait as
    long as the CLI's do (:data:`OPERATION_TIMEOUT_S`): on a loaded node they take minutes,
    and a page that gave up first said "no answer" while the operation went on.
    """

    def __init__(self, client: ServiceClient) -> None:
        self.client = client

    def _act(self, model: type[M], path: str, **kwargs: Any) -> M:
        return self.client.call(model, "POST", path, timeout=OPERATION_TIMEOUT_S, **kwargs)

    def pipelines(self) -> list[PipelineStatus]:
        return _listed(PipelineStatus, self.client.get("/pipelines"), "GET /pipelines")

    def pipeline(self, name: str) -> PipelineStatus:
        return self.client.call(PipelineStatus, "GET", f"/pipelines/{name}")

    def nodes(self) -> list[NodeView]:
        return _listed(NodeView, self.client.get("/nodes"), "GET /nodes")

    def plan(self) -> PlanView:
        return self.client.call(PlanView, "GET", "/plan")

    def latency(self, name: str) -> list[HopLatency]:
        path = f"/pipelines/{name}/latency"
        return _listed(HopLatency, self.client.get(path), f"GET {path}")

    def element_errors(self, name: str, element: str, limit: int) -> list[DeadLetter] | str:
        """PE ``element``'s newest ``limit`` dead letters (only its stream is read), or why
        they cannot be read now (the broker away: its page shows the rest)."""
        path = f"/pipelines/{name}/errors"
        try:
            answer = self.client.get(path, params={"limit": limit, "element": element})
        except (Unavailable, InvariantViolation) as exc:
            return exc.message
        return _listed(DeadLetter, answer, f"GET {path}")

    def twin_state(
        self, name: str, element: str, kind: str, limit: int = 50
    ) -> TwinState | str | None:
        """The PE's state per key; ``None`` if it holds none, the reason if it cannot be
        read now (its node is down, still starting)."""
        known = KINDS.get(kind)
        if known is None or not known.keyable:  # sources, sinks, map, filter: no state
            return None
        try:
            return self.client.call(
                TwinState,
                "GET",
                f"/pipelines/{name}/elements/{element}/state",
                params={"limit": limit},
            )
        except Conflict:  # a custom processor without state
            return None
        except (Unavailable, InvariantViolation) as exc:
            return exc.message

    def events(self, name: str, element: str, key: str | None, tail: int, limit: int) -> EventPage:
        params: dict[str, Any] = {"tail": tail, "limit": limit}
        if key is not None:
            params["key"] = key
        return self.client.call(
            EventPage, "GET", f"/pipelines/{name}/elements/{element}/events", params=params
        )

    def operation(self, name: str, element: str) -> OperationView | None:
        try:
            return self.client.call(
                OperationView, "GET", f"/pipelines/{name}/elements/{element}/operation"
            )
        except NotFound:
            return None

    def migrate(self, name: str, element: str, target: str, mode: str) -> MigrationReport:
        return self._act(
            MigrationReport, f"/pipelines/{name}/elements/{element}/migrate",
            json={"target": target, "mode": mode},
        )  # fmt: skip

    def migrate_group(
        self, name: str, elements: list[str], target: str, mode: str
    ) -> GroupMigrationReport:
        return self._act(
            GroupMigrationReport, f"/pipelines/{name}/migrate",
            json={"elements": elements, "target": target, "mode": mode},
        )  # fmt: skip

    def restore(self, name: str, element: str, target: str | None) -> RestoreReport:
        return self._act(
            RestoreReport, f"/pipelines/{name}/elements/{element}/restore",
            json={"target": target} if target else {},
        )  # fmt: skip

    def stop(self, name: str) -> StopResult:
        return self._act(StopResult, f"/pipelines/{name}/stop")

    def start(self, name: str) -> PipelineStatus:
        return self._act(PipelineStatus, f"/pipelines/{name}/start")

    def delete(self, name: str) -> DeleteResult:
        return self.client.call(
            DeleteResult, "DELETE", f"/pipelines/{name}", timeout=OPERATION_TIMEOUT_S
        )

    def deploy(self, spec: dict[str, Any], fresh: bool = False) -> PipelineStatus:
        params = {"fresh": "true"} if fresh else None
        return self._act(PipelineStatus, "/pipelines", json=spec, params=params)


@dataclass(frozen=True)
class DashboardConfig:
    """Settings of one dashboard process.

    Attributes:
        spec_dir: Relative paths in a deployed spec are relative to it.
        interval_s: How often the orchestrator is polled for the live parts.
        window_s: How much history the charts keep.
        allowed_hosts: Host names requests may carry (a page of another site that resolves
            its own name to this machine — DNS rebinding — is refused), in
            :func:`canonical_host` form; :data:`ANY_ADDRESS` takes any IP address (a browser
            sends one only when it was given one: no other site's name is behind it).
        named_hosts: The DNS names the user said the dashboard is reached by
            (``--allow-host``), in :func:`canonical_host` form: a post from a page at one of
            them is the dashboard's own even when a proxy in front of it (TLS) sends another
            ``Host``. Only names given explicitly: no other site's page is at one of them.
        tls_proxy: Users reach the dashboard over HTTPS through a proxy (``--tls-proxy``):
            its session cookie is ``Secure`` whatever scheme the request came by (uvicorn
            takes ``X-Forwarded-Proto`` from a proxy on loopback only, so one on another
            host looked like plain HTTP), and browsers are told to keep to HTTPS (HSTS).
    """

    spec_dir: Path
    interval_s: float = 1.0
    window_s: float = 600.0
    allowed_hosts: tuple[str, ...] = LOOPBACK_NAMES
    named_hosts: tuple[str, ...] = ()
    tls_proxy: bool = False


#: How long a browser keeps to HTTPS for the dashboard's host once told (one year: what
#: HSTS preload lists ask; only sent with ``--tls-proxy``).
HSTS_MAX_AGE_S = 365 * 24 * 3600


def _finite(value: object) -> bool:
    """Whether ``value`` is a finite number (not a bool, not a text)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond a float's range (a 500 before)
        return False


#: The largest request body the dashboard takes: a spec (``MAX_SPEC_BYTES``) and a form
#: around it. The login form is open to anyone who can reach the dashboard, and a form's
#: file parts are spooled to disk whatever their size before any handler runs. A spec is
#: posted again from the confirmation's text field, where the browser sends a CR LF for
#: each line end: up to twice its size (the form is multipart, not URL-encoded, in which
#: a line end took 6 bytes and a spec of 110 KiB could come to more than the limit).
MAX_BODY_BYTES = 2 * MAX_SPEC_BYTES + 64 * 1024


class BodyLimit:
    """Refuses a request whose body is larger than ``most`` bytes (``413``), or that has a
    body of unknown length (``411``), before anything reads it; and cuts one whose body,
    as it arrives, comes to more than ``most`` bytes (the app sees the client gone).

    A ``Transfer-Encoding`` is refused even beside a ``Content-Length``: the server (h11)
    then reads the chunks and ignores the length, so a small declared length let a body of
    any size through to the login form's spooling (a browser's form never sends one)."""

    def __init__(self, app: Any, most: int) -> None:
        self.app, self.most = app, most

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        encoding = headers.get(b"transfer-encoding")
        refusal = None
        if encoding is not None:
            refusal = (
                411,
                (
                    "expected: a request body with a Content-Length and no Transfer-Encoding; "
                    f"received: Transfer-Encoding {encoding.decode('latin-1')[:20]} (hint: "
                    "send it whole, as a browser's form does)"
                ),
            )
        elif length is not None and (not length.isdigit() or int(length) > self.most):
            refusal = (
                413,
                (
                    f"expected: a request body of at most {self.most} bytes; received: "
                    f"Content-Length {length.decode('latin-1')[:20]} (hint: a spec of at most "
                    f"{MAX_SPEC_BYTES} bytes)"
                ),
            )
        if refusal is not None:
            # (Closed after: the server would otherwise read the refused body to its end to
            # keep the connection, a chunked one without end.)
            response = PlainTextResponse(
                refusal[1], status_code=refusal[0], headers={"connection": "close"}
            )
            await response(scope, receive, send)
            return
        seen = 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.most:  # (what the headers said was not so)
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)


def create_app(orchestrator: Orchestrator, sessions: Sessions, config: DashboardConfig) -> FastAPI:
    """The dashboard app: pages behind a session cookie, a sampler thread while it serves."""
    history = History(config.window_s)
    sampler = Sampler(
        history,
        lambda: (orchestrator.pipelines(), orchestrator.nodes()),
        config.interval_s,
        orchestrator.latency,
    )
    results = Results()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sampler.start()
        yield
        sampler.close()

    app = FastAPI(title="fogshift dashboard", lifespan=lifespan, openapi_url=None)
    app.add_middleware(BodyLimit, most=MAX_BODY_BYTES)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.globals["fmt_rate"] = _fmt_rate
    templates.env.globals["fmt_time"] = _time_tag
    templates.env.tests["finite"] = _finite

    def page(
        request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> HTMLResponse:
        # A page answered without a session (the login pages, a refusal under /static or
        # /login) shows neither the orchestrator's troubles nor the dashboard's menu.
        authed = getattr(request.state, "authed", False)
        context.setdefault("poll_error", sampler.error if authed else None)
        context.setdefault("authed", authed)
        return _page(templates, request, name, context, status_code)

    def error_page(request: Request, err: FogshiftError, title: str) -> HTMLResponse:
        context = _outcome(err, title)
        if request.method in ("GET", "HEAD") and not {"migration", "restore"} & set(context):
            # A page asked for, not an action: "Refused: nothing was changed, the pipelines
            # run on" answered an unknown pipeline's address as if something had been tried.
            context["outcome"] = "This page cannot be shown: see why below."
        return page(request, "result.html", context, err.http_status)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        response = await _guarded(request, call_next)
        response.headers.update(SECURITY_HEADERS)
        if config.tls_proxy:
            response.headers["Strict-Transport-Security"] = f"max-age={HSTS_MAX_AGE_S}"
        return response

    async def _guarded(request: Request, call_next: Any) -> Response:
        path = request.scope["path"]  # what the router routes by (see common.service)
        if not _allowed(_hostname(request), config.allowed_hosts):
            return PlainTextResponse("unknown host name", status_code=400)
        if path.startswith("/static/") or path == "/login":
            return await call_next(request)
        if not sessions.valid(request.cookies.get(cookie_name(request.url.port))):
            if "hx-request" in request.headers:  # a live part: htmx moves the page itself
                return Response(status_code=401, headers={"HX-Redirect": "/login"})
            if path.startswith("/api/"):
                return JSONResponse({"code": "not_logged_in", "message": "log in first"}, 401)
            return RedirectResponse("/login", status_code=303)
        request.state.authed = True
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            if foreign_origin(origin, request.headers.get("host"), config.named_hosts) or (
                request.headers.get("sec-fetch-site") == "cross-site"
            ):
                err = CrossSiteRequest(
                    "this request came from another site's page: nothing was done",
                    expected=f"a form of this dashboard ({request.headers.get('host')})",
                    received=origin or "a cross-site request",
                )
                return error_page(request, err, "refused")
        return await call_next(request)

    @app.exception_handler(FogshiftError)
    async def on_error(request: Request, exc: FogshiftError) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse(exc.to_dict(), exc.http_status)
        return error_page(request, exc, "error")

    @app.exception_handler(RequestValidationError)
    async def on_bad_request(request: Request, exc: RequestValidationError) -> Response:
        # (A name in the address said as the REST API says it, not as its pattern.)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {request_message_of(e)}" for e in exc.errors()
        )
        looked = request.method in ("GET", "HEAD")
        err = InvalidInput(
            "this address names no page of the dashboard"
            if looked
            else "this request does not fit the dashboard's forms",
            expected="names of letters, digits, '-' and '_'"
            + ("" if looked else "; the form's own fields"),
            received=one_line(problems, 300),
            hint="check the address, or follow the dashboard's links"
            if looked
            else "go back, reload the page and send its form again",
        )
        return await on_error(request, err)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # No such page, a method a page does not take, a form that cannot be read (no
        # multipart boundary, a field over 1 MB): the refusal page, not Starlette's bare
        # {"detail": ...}.
        what = f"{request.method} {request.url.path}"
        err: FogshiftError
        if exc.status_code == 404:
            err = NotFound(f"the dashboard has no page {what}",
                           hint="the overview (/) links every page")  # fmt: skip
        else:
            err = InvalidInput(
                f"{what}: {exc.detail}",
                expected="a page's own links and forms"
                + (" (this page takes another method)" if exc.status_code == 405 else ""),
                received=f"{what} ({exc.status_code}: {exc.detail})",
                hint="use the dashboard's links and buttons",
            )
        response = await on_error(request, err)
        response.status_code = exc.status_code
        response.headers.update(exc.headers or {})  # (a 405's Allow names the methods)
        return response

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("dashboard request %s failed", request.url.path)
        err = InvariantViolation(
            f"the dashboard failed: {type(exc).__name__}: {one_line(str(exc), 300)}",
            hint="see the dashboard's output; the pipelines are not affected",
        )
        response = await on_error(request, err)
        response.headers.update(SECURITY_HEADERS)  # past the middleware
        return response

    # -- login ----------------------------------------------------------------------------------

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request, token: str | None = None) -> Response:
        if token is None:
            return page(request, "login.html", {"poll_error": None})
        # Opening the link is not a login: link previews, mail scanners and prefetching
        # open a link before its user does, and a GET that logged in gave them a session and
        # spent the link. The page's button posts the token from the dashboard's own page,
        # so the SameSite=Strict cookie its answer sets comes along with the next request
        # wherever the link was opened (another site's page included).
        try:
            sessions.check_link(token)
        except FogshiftError as err:
            return page(request, "login.html", {"error": err, "poll_error": None},
                        err.http_status)  # fmt: skip
        return page(request, "login.html", {"link_token": token, "poll_error": None})

    @app.post("/login", response_class=HTMLResponse)
    def login_form(request: Request, token: Annotated[str, Form()] = "") -> Response:
        return _log_in(request, token.strip())

    def _log_in(request: Request, token: str) -> Response:
        try:
            session = sessions.login(token)
        except FogshiftError as err:
            return page(request, "login.html", {"error": err, "poll_error": None},
                        err.http_status)  # fmt: skip
        # The session this browser had ends: a login again (a cookie thought leaked) left
        # the old one valid for its 12 hours.
        sessions.logout(request.cookies.get(cookie_name(request.url.port)))
        response = page(request, "welcome.html", {"poll_error": None})
        # Secure when reached over TLS (a proxy in front that says so: uvicorn takes its
        # X-Forwarded-Proto from a local one; one elsewhere: --tls-proxy), so the browser
        # never sends it over plain HTTP.
        secure = config.tls_proxy or request.url.scheme == "https"
        response.set_cookie(cookie_name(request.url.port), session, httponly=True,
                            samesite="strict", path="/", secure=secure)  # fmt: skip
        return response

    @app.post("/logout")
    def logout(request: Request) -> Response:
        sessions.logout(request.cookies.get(cookie_name(request.url.port)))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(cookie_name(request.url.port), path="/")
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
        rates = _rates(history, status)
        return {
            "status": status,
            "shape": _shape(status),
            "targets": sorted(healthy),
            "modes": [m.value for m in MigrationMode],
            "drawing": layout(status, rates, healthy),
            "rates": rates,
            "latencies": {e.element: history.latency(name, e.element) for e in status.elements},
            "lags": {e.element: lag(e, by_id) for e in status.elements},
            "marks": history.marks(name)[:20],
        }

    @app.get("/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_page(request: Request, name: NameParam) -> HTMLResponse:
        return page(request, "pipeline.html", pipeline_context(name))

    @app.get("/fragments/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_fragment(
        request: Request, name: NameParam, shape: ShapeQuery = None
    ) -> HTMLResponse:
        # (oob: the move form's "on NODE" too, out of band: it said "on fog-a" after a
        # migration to fog-b, while the table beside it had moved on.)
        context = pipeline_context(name)
        answer = page(request, "_pipeline.html", {**context, "oob": True})
        if shape is not None and shape != context["shape"]:
            # What the page around the live part shows (its state, why it failed, the
            # actions it offers, the PEs the move form lists) is no longer so: a pipeline
            # stopped or failed went on saying "running" and offering "Stop".
            answer.headers["HX-Refresh"] = "true"
        return answer

    @app.get("/api/pipelines/{name}/series")
    def series(name: NameParam) -> dict[str, object]:
        return history.series(name)

    def element_of(name: str, element: str) -> tuple[PipelineStatus, ElementStatus]:
        status = orchestrator.pipeline(name)
        mine = next((e for e in status.elements if e.element == element), None)
        if mine is None:
            raise NotFound(
                f"pipeline {name!r} has no element {element!r}",
                expected="one of " + ", ".join(e.element for e in status.elements),
                received=element,
            )
        return status, mine

    def element_context(name: str, element: str, more: bool = True) -> dict[str, Any]:
        """What a PE's page shows; ``more``: its state and dead letters too (a read on its
        node, and of the pipeline's dead letters: not for the part polled every 3 s)."""
        status, mine = element_of(name, element)
        nodes = orchestrator.nodes()
        key = f"{name}/{element}"
        # Its own node's report first; while that node is lost, another's (the central
        # checkpoint is what a restore needs, exactly then).
        reports = [c for n in sorted(nodes, key=lambda n: n.name != mine.node)
                   for c in n.checkpoints if c.element == key]  # fmt: skip
        by_id = {e.element: e for e in status.elements}
        return {
            "status": status,
            "e": mine,
            "rate": history.rate(name, element),
            "latency": history.latency(name, element),
            "lag": lag(mine, by_id),
            "checkpoints": reports[0] if reports else None,
            "operation": orchestrator.operation(name, element),
            "letters": orchestrator.element_errors(name, element, 50) if more else [],
            "twins": orchestrator.twin_state(name, element, mine.kind) if more else None,
            "targets": sorted(n.name for n in nodes if n.healthy and n.name != mine.node),
            "modes": [m.value for m in MigrationMode],
        }

    @app.get("/pipelines/{name}/elements/{element}", response_class=HTMLResponse)
    def element_page(request: Request, name: NameParam, element: NameParam) -> HTMLResponse:
        return page(request, "element.html", element_context(name, element))

    @app.get("/fragments/pipelines/{name}/elements/{element}", response_class=HTMLResponse)
    def element_fragment(request: Request, name: NameParam, element: NameParam) -> HTMLResponse:
        # Its facts, checkpoints and operations: the page showed them as they were when it
        # was loaded. Its forms stay as the user left them.
        return page(request, "_element.html", element_context(name, element, more=False))

    @app.get("/fragments/pipelines/{name}/elements/{element}/more", response_class=HTMLResponse)
    def element_more(request: Request, name: NameParam, element: NameParam) -> HTMLResponse:
        return page(request, "_element_more.html", element_context(name, element))

    # -- Case 2: a patient's ECG and alarms ---------------------------------------------------

    def ecg_elements(
        name: str,
    ) -> tuple[PipelineStatus, list[ElementStatus], list[ElementStatus]]:
        """The pipeline, its band-pass (the filtered signal) and its classifier (the alarms),
        each as its instances: a partitioned element's partitions each hold some patients,
        and a patient whose twin moved has events on both."""
        status = orchestrator.pipeline(name)
        signals = [e for e in status.elements if e.kind == "bandpass"]
        if not signals:
            raise NotFound(
                f"pipeline {name!r} has no ECG signal to show",
                expected="a Case 2 pipeline (a bandpass element, and a classify one)",
                received=", ".join(e.kind for e in status.elements),
                hint="examples/case2/case2.yaml is one",
            )
        return status, signals, [e for e in status.elements if e.kind == "classify"]

    def patient_events(
        name: str, elements: list[ElementStatus], patient: str | None, tail: int, limit: int
    ) -> list[Any]:
        """The bodies ``elements`` emitted for ``patient`` (all patients: ``None``), in the
        recording's time order where they have one (``t``), the newest ``limit``."""
        pages = [orchestrator.events(name, e.element, patient, tail, limit) for e in elements]
        bodies = [event.body for page_ in pages for event in page_.events]
        placed = [b for b in bodies if isinstance(b, dict) and _finite(b.get("t"))]
        if len(elements) > 1:
            placed.sort(key=lambda b: float(b["t"]))
        return placed[-limit:]

    def alarms_of(name: str, classifiers: list[ElementStatus], patient: str) -> list[Any]:
        # (An alarm is shown at its time: one without a number there is not an alarm the
        # view can place; it failed the page and its fragment with it.)
        return patient_events(name, classifiers, patient, ECG_ALARM_TAIL, 50)

    @app.get("/pipelines/{name}/ecg", response_class=HTMLResponse)
    def ecg_page(request: Request, name: NameParam, patient: StateKeyQuery = None) -> Response:
        status, signals, classifiers = ecg_elements(name)
        patients = sorted({str(e.body["patient"]) for s in signals
                           for e in orchestrator.events(name, s.element, None, ECG_PATIENT_TAIL,
                                                        5_000).events
                           if isinstance(e.body, dict) and "patient" in e.body})  # fmt: skip
        chosen = patient if patient is not None else (patients[0] if patients else None)
        return page(request, "ecg.html", {
            "status": status, "signals": signals, "classifiers": classifiers,
            "patients": patients, "patient": chosen, "seconds": ECG_SECONDS,
            "alarms": alarms_of(name, classifiers, chosen) if chosen else [],
        })  # fmt: skip

    @app.get("/fragments/pipelines/{name}/ecg", response_class=HTMLResponse)
    def ecg_fragment(request: Request, name: NameParam, patient: StateKeyQuery = None) -> Response:
        _, _, classifiers = ecg_elements(name)
        alarms = alarms_of(name, classifiers, patient) if patient else []
        return page(request, "_alarms.html", {"alarms": alarms, "patient": patient})

    @app.get("/api/pipelines/{name}/ecg")
    def ecg_series(name: NameParam, patient: StateKeyQuery = None) -> dict[str, object]:
        """The patient's newest filtered signal (``t`` in seconds of the recording, ``y``)
        and their alarms (``marks``), for the chart."""
        _, signals, classifiers = ecg_elements(name)
        if not patient:
            return {"t": [], "y": [], "marks": []}
        t: list[float] = []
        y: list[float] = []
        for body in patient_events(name, signals, patient, ECG_PATIENT_TAIL, 5_000):
            if (
                not isinstance(body, dict)
                or not isinstance(body.get("samples"), list)
                or not all(_finite(v) for v in (body.get("t"), body.get("fs"), *body["samples"]))
                or body["fs"] <= 0
            ):
                continue  # (not a window of signal: a zero rate or a text failed the chart)
            start, fs = float(body["t"]), float(body["fs"])
            t.extend(start + i / fs for i in range(len(body["samples"])))
            y.extend(body["samples"])
        if t:  # the last ECG_SECONDS of it
            first = next(i for i, x in enumerate(t) if x >= t[-1] - ECG_SECONDS)
            t, y = t[first:], y[first:]
        marks = [{"t": a["t"], "kind": str(a.get("class")), "text": str(a.get("class"))}
                 for a in alarms_of(name, classifiers, patient)]  # fmt: skip
        return {"t": t, "y": y, "marks": marks}

    def nodes_context() -> dict[str, Any]:
        nodes, plan = orchestrator.nodes(), orchestrator.plan()
        backups: dict[str, list[str]] = {}
        for key, assignment in plan.assignments.items():
            if assignment.backup:
                backups.setdefault(assignment.backup, []).append(key)
        return {"nodes": nodes, "backups": backups, "plan": plan}

    @app.get("/nodes", response_class=HTMLResponse)
    def nodes_page(request: Request) -> HTMLResponse:
        return page(request, "nodes.html", nodes_context())

    @app.get("/fragments/nodes", response_class=HTMLResponse)
    def nodes_fragment(request: Request) -> HTMLResponse:
        # (Its "last heard 0.7 s ago" stood still until a reload.)
        return page(request, "_nodes.html", nodes_context())

    # -- actions --------------------------------------------------------------------------------
    # Post, then redirect to the result (post/redirect/get): reloading a result page shows it
    # again and never repeats the action.

    def done(title: str, run: Any, back: str) -> Response:
        try:
            context = {"title": title, "back": back, **run()}
        except FogshiftError as err:
            context = {**_outcome(err, title), "back": back}
        sampler.poll()
        return RedirectResponse(f"/results/{results.put(context)}", status_code=303)

    @app.get("/results/{result}", response_class=HTMLResponse)
    def result_page(request: Request, result: str) -> HTMLResponse:
        context = results.get(result)
        if context is None:
            err = NotFound(
                "this result is no longer kept",
                hint=f"results are kept {RESULT_TTL_S / 60:.0f} minutes; the pipeline's page "
                "shows each PE's last migration and restore",
            )
            return error_page(request, err, "result")
        status = int(context.get("status_code", 200))
        return page(request, "result.html", dict(context), status)

    @app.post("/pipelines/{name}/elements/{element}/migrate", response_class=HTMLResponse)
    def migrate(
        request: Request,
        name: NameParam,
        element: NameParam,
        target: Annotated[str, Form()] = "",
        mode: Annotated[str, Form()] = MigrationMode.PRECOPY.value,
        confirmed: Annotated[bool, Form()] = False,
    ) -> Response:
        what = f"migrate {name}/{element}"
        _check_move(what, target, mode)
        if not confirmed:
            _, mine = element_of(name, element)
            return page(request, "confirm.html", {
                "title": f"Migrate {element}?",
                "question": f"Migrate {name}/{element} from {mine.node} to {target} ({mode})?",
                "action": f"/pipelines/{name}/elements/{element}/migrate",
                "fields": {"target": target, "mode": mode},
                "back": f"/pipelines/{name}/elements/{element}",
            })  # fmt: skip
        return done(
            what,
            lambda: {"migration": orchestrator.migrate(name, element, target, mode)},
            f"/pipelines/{name}",
        )

    @app.post("/pipelines/{name}/migrate", response_class=HTMLResponse)
    def migrate_several(
        request: Request,
        name: NameParam,
        elements: Annotated[list[str], Form()] = [],  # noqa: B006 (FastAPI copies defaults)
        target: Annotated[str, Form()] = "",
        mode: Annotated[str, Form()] = MigrationMode.PRECOPY.value,
        confirmed: Annotated[bool, Form()] = False,
    ) -> Response:
        status = orchestrator.pipeline(name)
        by_id = {e.element: e for e in status.elements}
        chosen = list(dict.fromkeys(elements))  # in the order given, each once
        unknown = [e for e in chosen if e not in by_id]
        if not chosen or unknown:
            raise InvalidInput(
                f"no PEs of {name} to migrate" if not chosen
                else f"pipeline {name!r} has no element {unknown[0]!r}",
                expected="one or more of " + ", ".join(by_id),
                received=", ".join(unknown or chosen) or "nothing",
                hint="tick the PEs to move",
            )  # fmt: skip
        _check_move(f"migrate PEs of {name}", target, mode)
        there = [e for e in chosen if by_id[e].node == target]
        if len(there) == len(chosen):  # (some there already stay: the rest move)
            raise InvalidInput(
                f"{name}/{there[0]} already runs on node {target!r}",
                expected=f"PEs that run elsewhere than {target!r}",
                received=", ".join(there), hint="untick them, or choose another node",
            )  # fmt: skip
        if not confirmed:
            moving = [e for e in chosen if e not in there]
            moves = ", ".join(f"{e} (on {by_id[e].node})" for e in moving)
            several = f"{len(moving)} PEs" if len(moving) > 1 else moving[0]
            staying = f" ({', '.join(there)} there already)" if there else ""
            return page(request, "confirm.html", {
                "title": f"Migrate {several}?",
                "question": f"Migrate {moves} of {name} to {target} ({mode}) as one operation"
                            f"{staying}? They move one after another; if one fails, those "
                            "already moved are moved back.",
                "action": f"/pipelines/{name}/migrate",
                "fields": {"elements": chosen, "target": target, "mode": mode},
                "back": f"/pipelines/{name}",
            })  # fmt: skip
        return done(
            f"migrate {len(chosen)} PE{'s' if len(chosen) > 1 else ''} of {name} to {target}",
            lambda: {"group": orchestrator.migrate_group(name, chosen, target, mode)},
            f"/pipelines/{name}",
        )

    @app.post("/pipelines/{name}/elements/{element}/restore", response_class=HTMLResponse)
    def restore(
        request: Request,
        name: NameParam,
        element: NameParam,
        target: Annotated[str, Form()] = "",
        confirmed: Annotated[bool, Form()] = False,
    ) -> Response:
        if not confirmed:
            _, e = element_of(name, element)
            standby = e.standby.node if e.standby is not None else None
            if standby is not None and target in ("", standby):
                # (What the restore does then: the standby is promoted, not a checkpoint
                # installed; the page said "from its central checkpoint" either way.)
                how = f"by promoting its hot standby on {standby}"
            else:
                how = "from its central checkpoint " + (
                    f"on {target}" if target else "on the best healthy node"
                )
            return page(request, "confirm.html", {
                "title": f"Restore {element}?",
                "question": f"Restore {name}/{element} {how}? "
                            "Its current instance is fenced: it can never write again.",
                "action": f"/pipelines/{name}/elements/{element}/restore",
                "fields": {"target": target},
                "back": f"/pipelines/{name}/elements/{element}",
            })  # fmt: skip
        return done(
            f"restore {name}/{element}",
            lambda: {"restore": orchestrator.restore(name, element, target or None)},
            f"/pipelines/{name}",
        )

    @app.post("/pipelines/{name}/stop", response_class=HTMLResponse)
    def stop(
        request: Request, name: NameParam, confirmed: Annotated[bool, Form()] = False
    ) -> Response:
        if not confirmed:
            orchestrator.pipeline(name)
            return page(request, "confirm.html", {
                "title": f"Stop {name}?",
                "question": f"Stop every PE of {name}? Their checkpoints and output stay.",
                "action": f"/pipelines/{name}/stop", "fields": {}, "back": f"/pipelines/{name}",
            })  # fmt: skip
        return done(f"stop {name}", lambda: {"stopped": orchestrator.stop(name)}, "/pipelines")

    @app.post("/pipelines/{name}/start", response_class=HTMLResponse)
    def start(name: NameParam) -> Response:
        # (Not confirmed first: a start changes nothing the stop kept, and undoes nothing.)
        return done(f"start {name}", lambda: {"started": orchestrator.start(name)},
                    f"/pipelines/{name}")  # fmt: skip

    @app.post("/pipelines/{name}/delete", response_class=HTMLResponse)
    def delete(
        request: Request, name: NameParam, confirmed: Annotated[bool, Form()] = False
    ) -> Response:
        if not confirmed:
            orchestrator.pipeline(name)
            return page(request, "confirm.html", {
                "title": f"Delete {name}?",
                "question": f"Delete {name}? Its streams (records and dead letters) and "
                "checkpoints go for good; its output files stay.",
                "action": f"/pipelines/{name}/delete", "fields": {},
                "back": f"/pipelines/{name}",
            })  # fmt: skip
        return done(f"delete {name}", lambda: {"deleted": orchestrator.delete(name)},
                    "/pipelines")  # fmt: skip

    @app.get("/deploy", response_class=HTMLResponse)
    def deploy_page(request: Request) -> HTMLResponse:
        return page(request, "deploy.html", {"spec_dir": config.spec_dir})

    @app.post("/deploy", response_class=HTMLResponse)
    async def deploy(
        request: Request,
        spec_file: Annotated[UploadFile | None, File()] = None,
        spec_text: Annotated[str, Form()] = "",
        confirmed: Annotated[bool, Form()] = False,
        fresh: Annotated[bool, Form()] = False,
    ) -> Response:
        if spec_file is not None and spec_file.filename:
            raw = await spec_file.read(MAX_SPEC_BYTES + 1)
            if len(raw) > MAX_SPEC_BYTES:
                raise InvalidInput(
                    "the spec file is too large", expected=f"at most {MAX_SPEC_BYTES} bytes",
                    received=f"more than {MAX_SPEC_BYTES} bytes",
                    hint="choose the pipeline's YAML spec, not a data file",
                )  # fmt: skip
            spec_text = raw.decode("utf-8", errors="replace")
        if not spec_text.strip():
            raise InvalidInput(
                "no pipeline spec to deploy", expected="a YAML spec file", received="nothing",
                hint="choose a file like examples/case1/case1.yaml",
            )  # fmt: skip
        nodes = [n.name for n in orchestrator.nodes()]
        spec = load_spec_text(spec_text, config.spec_dir, nodes, "the uploaded spec")
        if not confirmed:
            question = f"Deploy pipeline {spec.pipeline}: " + ", ".join(
                f"{e.id} ({e.kind}) on {e.node}" for e in spec.topological_order()
            ) + "?"  # fmt: skip
            fields: dict[str, Any] = {"spec_text": spec_text}
            try:
                kept: PipelineState | None = orchestrator.pipeline(spec.pipeline).status
            except NotFound:
                kept = None  # a new name
            if kept == PipelineState.STOPPED:
                # Confirmed, the deploy starts it over (the orchestrator refuses it unasked).
                fields["fresh"] = "true"
                question += (
                    f" Pipeline {spec.pipeline} is stopped, its output kept: deployed again, "
                    "it starts over, its streams and its sinks' files emptied (Start, on its "
                    "page, goes on where it stopped)."
                )
            return page(request, "confirm.html", {
                "title": f"Deploy {spec.pipeline}?", "question": question,
                "action": "/deploy", "fields": fields, "back": "/deploy",
            })  # fmt: skip
        return done(
            f"deploy {spec.pipeline}",
            lambda: {"deployed": orchestrator.deploy(spec.model_dump(mode="json"), fresh)},
            f"/pipelines/{spec.pipeline}",
        )

    return app


class Results:
    """Actions' results by a random id, for the page the action redirects to (a few minutes,
    the newest few dozen)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def put(self, context: dict[str, Any]) -> str:
        key = secrets.token_urlsafe(12)
        now = time.monotonic()
        with self._lock:
            self._kept[key] = (now, context)
            for stale in [k for k, (t, _) in self._kept.items() if now - t > RESULT_TTL_S]:
                del self._kept[stale]
            while len(self._kept) > RESULTS_KEPT:
                del self._kept[next(iter(self._kept))]
        return key

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            kept = self._kept.get(key)
        if kept is None or time.monotonic() - kept[0] > RESULT_TTL_S:
            return None
        return kept[1]


def _check_move(what: str, target: str, mode: str) -> None:
    """Refuse a migration form without a target node or with an unknown mode."""
    if not target:
        raise InvalidInput(f"no target node to {what} to", expected="a node name",
                           received="nothing", hint="choose a node in the form")  # fmt: skip
    if mode not in {m.value for m in MigrationMode}:
        raise InvalidInput(
            f"unknown migration mode to {what}",
            expected=" or ".join(m.value for m in MigrationMode), received=mode,
            hint="choose a mode in the form",
        )  # fmt: skip


def _outcome(err: FogshiftError, title: str) -> dict[str, Any]:
    """What a result page says of ``err``: what became of the pipeline, and the report a
    failed migration or restore carries."""
    report = getattr(err, "report", None)
    context: dict[str, Any] = {"title": title, "error": err, "status_code": err.http_status}
    if isinstance(report, MigrationReport):
        context["migration"] = report
        context["outcome"] = (
            f"The migration failed and was rolled back: {report.element} runs on "
            f"{report.origin} again (epoch {report.epoch})."
            if report.rolled_back
            else "The migration failed; see its report and the PE's page."
        )
    elif isinstance(report, RestoreReport):
        context["restore"] = report
        context["outcome"] = "The restore failed" + (
            f": {report.fallback}." if report.fallback else "; see its report and the PE's page."
        )
    elif isinstance(err, NoAnswer):
        # (Only an unanswered request may still be under way: a node the orchestrator has
        # not heard from, say, is refused before the operation starts.)
        context["outcome"] = (
            "No answer in time: the operation may still be running. The PE's page shows its "
            "last migration or restore and the operations journal."
        )
    elif isinstance(err, Unavailable):
        context["outcome"] = (
            "Refused: a node, the broker or the orchestrator it needs cannot be reached now "
            "(below); the pipelines run on."
        )
    else:
        context["outcome"] = "Refused: nothing was changed, the pipelines run on."
    return context


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address ``name`` is (an IPv6 one with or without brackets), if it is one."""
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        return None


def canonical_host(name: str) -> str:
    """``name`` (a Host header's name, or an address or name given to the dashboard) as
    browsers send it: lower case without the root's trailing dot; an IP address in its
    compressed form, an IPv6 one in brackets (``[2001:db8::1]``)."""
    address = _address(name)
    if address is None:
        return name.lower().removesuffix(".")
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def foreign_origin(origin: str | None, host: str | None, named: tuple[str, ...]) -> bool:
    """Whether a post's ``Origin`` is another site's: neither the ``host`` it was sent to
    nor ``https://`` one of the ``named`` hosts (:attr:`DashboardConfig.named_hosts`) on its
    default port; no ``Origin`` (an older browser's same-site form) is not."""
    if origin is None:
        return False
    try:
        parts = urlsplit(origin)
        name = parts.hostname  # (None for "null": a sandboxed or privacy-hidden page)
        port = parts.port
    except ValueError:  # an unparseable authority ("https://[::1", a port of 99999): a 500
        return True
    if parts.netloc == host:
        return False
    # A named host's page only over TLS on its default port (a proxy in front, as the
    # README asks): another port of that host, or plain HTTP, may be another service's.
    return not (
        parts.scheme == "https"
        and port in (None, 443)
        and name is not None
        and canonical_host(name) in named
    )


def _allowed(name: str, allowed: tuple[str, ...]) -> bool:
    """Whether a request's host ``name`` is one the dashboard serves (``allowed``: see
    :attr:`DashboardConfig.allowed_hosts`)."""
    if canonical_host(name) in allowed:
        return True
    return ANY_ADDRESS in allowed and _address(name) is not None


def _hostname(request: Request) -> str:
    host = request.headers.get("host", "")
    return host.rsplit(":", 1)[0] if not host.endswith("]") else host


#: ``?shape=`` of a pipeline page's polls: what the page was drawn for (:func:`_shape`).
ShapeQuery = Annotated[str | None, Query(max_length=64, pattern=r"^[0-9a-f]+$")]


def _time_tag(t: float) -> Markup:
    """A ``<time>`` of ``t`` (epoch seconds): UTC here, the browser's own time once its
    script runs (the charts' axes are in it: the timeline beside them said the dashboard
    server's local time, with no zone)."""
    when = datetime.fromtimestamp(t, tz=UTC)
    return Markup('<time datetime="{}">{} UTC</time>').format(
        when.isoformat(timespec="seconds").replace("+00:00", "Z"), when.strftime("%H:%M:%S")
    )


def _shape(status: PipelineStatus) -> str:
    """A short digest of what a pipeline's page shows outside its live part: its state, its
    error and warnings, and its PEs (a scale adds or retires partitions)."""
    text = json.dumps([status.status, status.error, status.warnings,
                       sorted(e.element for e in status.elements)])  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
