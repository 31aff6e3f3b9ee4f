"""The server side of fogshift's REST services: token checks, error answers, path parameters.

The agents, the orchestrator and the dashboard build their FastAPI apps with these; clients
need only :mod:`fogshift.common.http` (tokens, :class:`~fogshift.common.http.ServiceClient`),
which does not import FastAPI, so that a CLI command starts in a fraction of the time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from fogshift.common.exceptions import InvalidName
from fogshift.common.files import STORAGE_ERRNOS
from fogshift.common.http import error_body, same_token
from fogshift.common.names import (
    EXPECTED,
    KEY_GROUP_RE,
    MAX_REL_PATH,
    NAME_RE,
    REL_PATH_RE,
    SHA256_RE,
    SNAPSHOT_RE,
)
from fogshift.common.validation import (
    expected_of,
    message_of,
    refusal_of,
    request_message_of,
)
from fogshift.contracts import ErrorBody, FileChunks
from fogshift.events import MAX_KEY_CHARS
from fogshift.exceptions import FogshiftError, InvalidInput, NotFound, Unauthorized

log = logging.getLogger("fogshift.service")

# -- path parameters -----------------------------------------------------------------------
# Checked by FastAPI before any handler runs (422 with expected/received/hint); the storage
# layer checks again (fogshift.common.names).

#: A pipeline, element or node name in a URL.
NameParam = Annotated[str, PathParam(pattern=NAME_RE)]
#: A snapshot id in a URL.
SnapshotParam = Annotated[str, PathParam(pattern=SNAPSHOT_RE)]
#: A checkpoint blob's sha256 in a URL.
ShaParam = Annotated[str, PathParam(pattern=SHA256_RE)]
#: A file path inside a snapshot, in a URL (``{rel:path}``).
RelPathParam = Annotated[str, PathParam(pattern=REL_PATH_RE, max_length=MAX_REL_PATH)]

# -- query parameters of ``GET .../elements/{element}/state`` (orchestrator and agent) ---

#: One key of a keyed PE (free text: it is only compared with the stored keys).
StateKeyQuery = Annotated[str | None, Query(max_length=MAX_KEY_CHARS)]
#: The most keys one answer lists.
StateLimitQuery = Annotated[int, Query(ge=1, le=100_000)]
#: A byte range of a checkpoint file (``GET .../snapshots/{id}/files/{path}``).
OffsetQuery = Annotated[int | None, Query(ge=0)]
#: How long a pause may wait for its batch to end (a NaN gave up at once, an inf held a
#: worker thread for good).
PauseTimeoutQuery = Annotated[float, Query(gt=0, le=3600, allow_inf_nan=False)]
LengthQuery = Annotated[int | None, Query(ge=1)]

# -- query parameters of a long-polled ``GET .../elements/{element}/progress`` (agent) -----

#: The most an agent holds a progress request that asks to wait for a change: a caller
#: waiting longer asks again (a held request is one of the agent's worker threads).
PROGRESS_WAIT_MAX_S = 5.0
#: How long to wait for the PE's progress or state to differ from the caller's last answer.
ProgressWaitQuery = Annotated[float, Query(ge=0, le=PROGRESS_WAIT_MAX_S, allow_inf_nan=False)]
#: The progress of the caller's last answer (with its ``state``: both, or no long poll).
ProgressSeenQuery = Annotated[int | None, Query()]

# -- query parameters of ``GET .../elements/{element}/events`` (orchestrator) -------------

#: Read the events after this stream sequence (forward paging).
EventsAfterQuery = Annotated[int | None, Query(ge=0)]
#: Read the stream's newest this-many messages (the tail) instead.
EventsTailQuery = Annotated[int | None, Query(ge=1, le=20_000)]
#: The most messages one page scans.
EventsLimitQuery = Annotated[int, Query(ge=1, le=5_000)]
#: The most dead letters ``GET /pipelines/{name}/errors`` gives of each PE (its newest).
ErrorsLimitQuery = Annotated[int, Query(ge=1, le=10_000)]
#: ``GET /pipelines/{name}/errors?element=``: one PE's dead letters only.
ElementQuery = Annotated[str | None, Query(pattern=NAME_RE)]
#: ``POST /pipelines?fresh=true``: start over a stopped pipeline of the name, its streams,
#: checkpoints and sinks' files emptied (without it such a deploy is refused).
FreshQuery = Annotated[bool, Query()]

# -- responses ---------------------------------------------------------------------------


def _shown(error: Any) -> str:
    """What a request sent where ``error`` is, as it was sent: a body's value in JSON (its
    ``true``, ``null``, not Python's ``True``, ``None``), a parameter's quoted."""
    value = error.get("input")
    if isinstance(value, bytes):  # (a body FastAPI took as bytes: its text)
        return repr(value.decode("utf-8", "replace"))[:200]
    if tuple(error.get("loc", ()))[:1] == ("body",):
        try:
            return json.dumps(value, default=str)[:200]
        except (TypeError, ValueError):
            pass
    return repr(value)[:200]


def _field(error: Any) -> str:
    """The field ``error`` is about: the last name of its location (a list's item was named
    by its index: "0: 1 to 63 letters...")."""
    names = [part for part in error.get("loc", ()) if isinstance(part, str)]
    return names[-1] if names else "value"


def read_range(path: Path, offset: int | None, length: int | None, what: str) -> bytes:
    """The bytes of the file at ``path`` (``what`` names it in errors), or ``length`` of them
    from ``offset`` (both or neither: a copier fetching the chunks it lacks).

    Raises:
        InvalidInput: Only one of them, or a range past the file's end.
        NotFound: The file is gone.
    """
    try:
        if offset is None and length is None:
            return path.read_bytes()
        size = path.stat().st_size
        if offset is None or length is None or offset + length > size:
            raise InvalidInput(
                f"no such range of {what}",
                expected=f"offset and length together, within its {size} bytes",
                received=f"offset {offset}, length {length}",
                hint="ask for its chunks (…/chunks/…) to learn its size",
            )
        with open(path, "rb") as file:
            file.seek(offset)
            return file.read(length)
    except OSError as exc:
        raise NotFound(f"{what} is gone: {exc}") from None


def add_blob_routes(
    app: FastAPI,
    blob_path: Callable[[str], Path],
    blob_chunks: Callable[[str], tuple[int, list[tuple[int, int, str]]]],
    where: str,
) -> None:
    """``GET /checkpoints/blobs/{sha}`` (a content-addressed checkpoint file, or a byte range
    of it) and ``GET /checkpoints/blobs/{sha}/chunks`` (its size and content-defined chunks)
    on ``app``: the orchestrator's central store and each node's replicas (``where``)."""

    @app.get("/checkpoints/blobs/{sha}")
    def blob(sha: ShaParam, offset: OffsetQuery = None, length: LengthQuery = None) -> Response:
        """A checkpoint blob, or a byte range of it."""
        path = blob_path(sha)
        if offset is None and length is None:
            return FileResponse(path, media_type="application/octet-stream")
        data = read_range(path, offset, length, f"checkpoint blob {sha[:12]}… {where}")
        return Response(content=data, media_type="application/octet-stream")

    @app.get("/checkpoints/blobs/{sha}/chunks")
    def chunks_of_blob(sha: ShaParam) -> FileChunks:
        """A checkpoint blob's size and content-defined chunks."""
        size, chunks = blob_chunks(sha)
        return FileChunks(size=size, chunks=chunks)


# -- access ------------------------------------------------------------------------------


def bearer(request: Request) -> str:
    """The request's bearer token, ``""`` if it has none."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


#: Decides one request from ``(method, path, bearer token)``: ``None`` lets it through,
#: otherwise the error (401 or 403) to answer instead. ``path`` is the decoded path the
#: router matches, so a decision about a path is a decision about the route it reaches.
Access = Callable[[str, str, str], FogshiftError | None]


def wrong_token(where: str, given: str) -> Unauthorized:
    """The answer to a missing or wrong token (``given``: the bearer token sent, ``""``
    for none)."""
    return Unauthorized(
        f"missing or wrong token for {where}",
        expected="an Authorization: Bearer header with the cluster's token",
        received="a token this service does not know" if given else "no bearer token",
        # (Not "the cluster file": it holds where the token is, not the token.)
        hint="the operator's token is the file `token` in the cluster's home (`fogshift up "
        "--home`, .fogshift by default); a node's own is `nodes/NODE/token` there",
    )


def operator_only(token: str) -> Access:
    """Every endpoint needs exactly ``token``."""

    def access(method: str, path: str, given: str) -> FogshiftError | None:
        return None if same_token(given, token) else wrong_token("this service", given)

    return access


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route takes: its own and its dependencies'."""
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict, refusing a key given twice (``json.loads``'s
    ``object_pairs_hook``)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen[key] = value
    return seen


class _RepeatedKey(ValueError):
    """A JSON object names ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class StrictQueryRoute(APIRoute):
    """A route that refuses query parameters it does not take (FastAPI ignores them: a
    ``POST …/restore?target=fog-b``, whose target goes in the body, went unseen, and the
    restore went where the orchestrator chose), and a JSON body naming a key twice (the
    last one was taken without a word: ``{"target": "fog-b", "target": "cloud"}`` migrated
    to cloud, a spec naming ``pipeline`` twice deployed the second; a spec file's YAML
    refuses that)."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()
        taken = sorted(_query_names(self.dependant))

        async def strict(request: Request) -> Any:
            unknown = sorted(set(request.query_params) - set(taken))
            if unknown:
                raise InvalidInput(
                    f"{request.method} {request.url.path} takes no query parameter "
                    + ", ".join(repr(name) for name in unknown),
                    expected=("one of " + ", ".join(taken)) if taken else "no query parameters",
                    received=", ".join(unknown),
                    hint="the schema (GET /openapi.json) gives every parameter",
                )
            kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind == "application/json" or kind.endswith("+json"):
                body = await request.body()  # (kept by the request: the handler reads it)
                try:
                    json.loads(body, object_pairs_hook=_no_repeated_keys)
                except _RepeatedKey as twice:
                    raise InvalidInput(
                        f"{request.method} {request.url.path}: the body names {twice.key!r} twice",
                        expected="each key of a JSON object once",
                        received=f"{twice.key!r} twice",
                        hint="keep one of them (the last was taken before, silently)",
                    ) from None
                except (ValueError, RecursionError):
                    pass  # not JSON, or nested too deep: refused below, in words of their own
            return await handler(request)

        return strict


def body_refusal(request: Request, most: int) -> tuple[FogshiftError, int] | None:
    """Why ``request``'s body is not read, with the HTTP status (413: over ``most`` bytes by
    its ``Content-Length``; 411: of no stated length, as chunked bodies are), or ``None``.

    The length is judged before a byte of the body is read: the server would hold a body of
    any size in memory before the route saw it. A ``Transfer-Encoding`` is refused even
    beside a ``Content-Length``: the server (h11) then reads the chunks and ignores the
    length, so a small stated length let a body of any size through."""
    what = f"{request.method} {request.scope['path']}"
    length = request.headers.get("content-length")
    if "transfer-encoding" in request.headers:
        return InvalidInput(
            f"{what}: a body of unstated length is not read",
            expected=f"a Content-Length header, of at most {most:,} bytes",
            received="Transfer-Encoding: " + request.headers["transfer-encoding"],
            hint="send the body whole, with its length (as fogshift's clients do)",
        ), 411
    if length is None:
        return None  # no body
    try:
        size = int(length)
    except ValueError:
        return None  # the server refuses a malformed length itself
    if size <= most:
        return None
    return InvalidInput(
        f"{what}: a body of {size:,} bytes is more than this service reads",
        expected=f"at most {most:,} bytes",
        received=f"{size:,} bytes",
        hint="a spec, a command or a heartbeat is far smaller: check what sent it",
    ), 413


def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    """The answer to an exception an endpoint let through: answered here, so the server
    keeps the connection (left to the server, an unhandled exception closes it after its
    500, and the client's next request on it fails as "cannot be reached", which a
    migration would report as its target or origin being gone)."""
    said = f"{request.method} {request.url.path} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        # The machine's, not a bug: one line (a probe's full node logged a 95-line
        # traceback "a bug in the service" every 4 s, for each replica pushed to it).
        log.error("%s", said)
        hint = (
            "the service's machine refused to store it: a full disk (errno 28), a quota, a "
            "read-only or failing file system; free space or mend it there"
        )
    else:
        log.exception("%s %s failed", request.method, request.url.path)
        hint = "a bug in the service: its log has the traceback"
    failed = FogshiftError(said, hint=hint)
    return JSONResponse(failed.to_dict(), status_code=failed.http_status)


def install_error_handlers(
    app: FastAPI, access: str | Access, max_body_bytes: int | None = None
) -> None:
    """Check the bearer token of every request and map errors to JSON responses; the routes
    added afterwards refuse query parameters they do not take (:class:`StrictQueryRoute`).

    Args:
        access: The policy (see :data:`Access`); a plain token means "exactly this token,
            on every endpoint".
        max_body_bytes: The largest request body read (:func:`body_refusal`), judged after
            the token; ``None``: no bound.
    """
    decide = operator_only(access) if isinstance(access, str) else access
    app.router.route_class = StrictQueryRoute

    @app.middleware("http")
    async def check_token(request: Request, call_next: Callable[[Request], Any]) -> Any:
        # The path the router routes by (``request.url`` is rebuilt from the Host header,
        # which older Starlettes took as sent: ``Host: h/nodes/x/heartbeat#``).
        err = decide(request.method, request.scope["path"], bearer(request))
        if err is not None:
            # (RFC 9110: a 401 names the scheme it takes.)
            challenge = {"WWW-Authenticate": "Bearer"} if err.http_status == 401 else None
            return JSONResponse(err.to_dict(), status_code=err.http_status, headers=challenge)
        refused = body_refusal(request, max_body_bytes) if max_body_bytes is not None else None
        if refused is not None:
            return JSONResponse(refused[0].to_dict(), status_code=refused[1])
        try:
            return await call_next(request)
        except Exception as exc:
            return _unhandled(request, exc)

    @app.exception_handler(FogshiftError)
    async def fogshift_error(request: Request, exc: FogshiftError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        # A name that failed its pattern is answered in the words of fogshift.common.names,
        # not with the regular expression.
        named = [e for e in errors if e.get("ctx", {}).get("pattern") in EXPECTED]
        groups = [e for e in named if e["ctx"]["pattern"] == KEY_GROUP_RE]

        message = f"bad request to {request.url.path}: " + "; ".join(
            # (A body that is not JSON was "body.1: JSON decode error": the 1 a position.)
            "the body is not JSON"
            if e.get("type") == "json_invalid"
            else f"{'.'.join(map(str, e['loc']))}: {request_message_of(e)}"
            for e in errors
        )
        received = _shown(first)
        if first.get("type") == "json_invalid":
            # (FastAPI gives an empty dict as the "input" of a body that is not JSON.)
            body = exc.body if isinstance(exc.body, (str, bytes)) else ""
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            received = f"{text[:80]!r}: {first.get('ctx', {}).get('error', 'not JSON')}"
        hint = "the schema (GET /openapi.json) gives every parameter and body"
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        sent = first.get("input")
        # (Not a body without a type: FastAPI reads none as JSON, and "the schema gives
        # every body" did not say to send the header.)
        json_type = kind == "application/json" or kind.endswith("+json")
        if tuple(first.get("loc", ())) == ("body",) and (
            (isinstance(sent, (bytes, str)) and not json_type)
            or (sent is None and first.get("type") == "missing")
        ):
            # A JSON body sent as text (curl -d's default form type, text/plain): FastAPI
            # reads it as text, and said so in Python's bytes notation ("b'{...'"); no body
            # at all read as "None".
            shown = sent.decode("utf-8", "replace") if isinstance(sent, bytes) else sent
            received = (
                "no body"
                if sent is None
                else (f"a body of type {kind!r}" if kind else "a body without a Content-Type")
                + (f": {shown[:80]!r}" if shown else " (empty)")
            )
            hint = "send the body as JSON, with the header Content-Type: application/json"
        expected = [f"{_field(e)}: {EXPECTED[e['ctx']['pattern']]}" for e in named]
        if expected:
            err: FogshiftError = (InvalidInput if len(groups) == len(named) else InvalidName)(
                message,
                expected="; ".join(expected),
                received=received,
                hint="a key group is G/N (e.g. --key-group 3/16)"
                if len(groups) == len(named)
                else "names are letters, digits, '_' and '-'; a path may not leave its folder",
            )
        else:
            # One of fogshift's own checks says what it expected, received and suggests.
            refusal = refusal_of(errors[0]) if errors else None
            err = InvalidInput(
                message,
                expected=(expected_of(errors[0]) if errors else None)
                or (message_of(errors[0]).removeprefix("should be ") if errors else None),
                received=((refusal and refusal.received) or received)[:200],
                hint=(refusal and refusal.hint) or hint,
            )
        return JSONResponse(err.to_dict(), status_code=err.http_status)

    @app.exception_handler(StarletteHTTPException)
    async def no_route(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # No such route, or not with this method: answered in fogshift's form (code,
        # message, hint) like every other refusal, not as Starlette's bare {"detail"}.
        what = f"{request.method} {request.url.path}"
        schema = "the schema (GET /openapi.json)"
        err: FogshiftError
        status = exc.status_code
        if status == 404:
            err = NotFound(f"no endpoint {what}", expected="a path and method of the API",
                           received=what, hint=f"{schema} lists the endpoints")  # fmt: skip
        elif status == 400:
            # A body FastAPI could not parse although it is JSON by its syntax (an integer
            # of more than 4300 digits, nesting deeper than Python recurses): refused as any
            # bad body is.
            status = 422
            size = request.headers.get("content-length", "an unknown number of")
            err = InvalidInput(
                f"{what}: {exc.detail}",
                expected="a JSON body as the schema gives it (integers of at most 4300 "
                "digits, a few levels of nesting)",
                received=f"a body of {size} bytes that could not be read as one",
                hint=f"{schema} gives every body",
            )
        else:
            allowed = next(
                (
                    v
                    for k, v in (exc.headers or {}).items()
                    if k.lower() == "allow" and status == 405
                ),
                None,
            )
            err = InvalidInput(
                f"{what}: {exc.detail}",
                expected=f"one of the methods {allowed}" if allowed else None,
                received=request.method if allowed else None,
                hint=f"{schema} gives their methods",
            )
        # (A 405's Allow header names the methods the path takes.)
        return JSONResponse(err.to_dict(), status_code=status, headers=exc.headers)


#: The error answers every endpoint may give, for the OpenAPI schema (``responses=``).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (401, "missing or wrong token"),
        (403, "the token does not open this endpoint"),
        (404, "no such pipeline, element or node"),
        (409, "clashes with what runs"),
        (422, "refused input: expected / received / hint"),
        (500, "a fogshift error"),
        (502, "a migration or restore failed (with its report)"),
        (503, "a service it needs cannot be reached"),
    )
}
