"""REST plumbing shared by the orchestrator, the node agents and their clients: tokens, the
client, and errors rebuilt from their answers. The services' own half (token checks, error
handlers, path parameters) is :mod:`fogshift.common.service`; this module does not import
FastAPI, so a CLI command does not load it.

Every service requires ``Authorization: Bearer <token>``; every :class:`FogshiftError` is
sent as JSON with its HTTP status, and :func:`raise_for_error` turns such a response back
into the same error class on the client side.

Tokens. ``fogshift up`` generates one *operator token* (``<home>/token``): the CLI's, good
for every endpoint. Each node agent gets only its *node token*, derived from it with
:func:`node_token` (an HMAC, so the orchestrator, which holds the operator token, can check
any node's token without a list, and a node cannot work the operator token out of its own).
The orchestrator accepts a node token only on that node's endpoints (heartbeat, node
directory, checkpoint blobs) and calls each agent with that agent's node token, never with
the operator token: a compromised node learns nothing it did not already hold. A node that
copies checkpoint files from another node's replicas sends that node's *blob token* for
it (:func:`blob_token`), which the node directory hands out and which opens nothing but
``GET /checkpoints/blobs/{sha256}`` there. A blob token names its reader, so a node taken out
of the cluster (``fogshift remove-node``) loses what it copied with: the orchestrator tells
every node, with its heartbeats' answers, which nodes were removed, and a node refuses their
blob tokens from then on (one shared token per node could not be taken from one reader).
A name added again after its removal gets a new *generation*: its node and blob tokens are
signed with it, and the orchestrator and every node (told by the same answers) refuse those
of the earlier generations, which the machine taken out may still hold.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import logging
import re
import ssl
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from fogshift.common.exceptions import InvalidName, NoAnswer
from fogshift.common.names import NAME_RE
from fogshift.contracts import ErrorBody, MigrationReport, RestoreReport
from fogshift.exceptions import (
    Conflict,
    FogshiftError,
    InvalidInput,
    InvariantViolation,
    NotFound,
    Unauthorized,
    Unavailable,
)
from fogshift.migration.exceptions import MigrationFailed
from fogshift.restoration.exceptions import RestoreFailed

_BY_CODE: dict[str, type[FogshiftError]] = {}
#: The base error of each HTTP status the services answer with.
_BY_STATUS: dict[int, type[FogshiftError]] = {
    cls.http_status: cls for cls in (InvalidInput, NotFound, Conflict, Unauthorized, Unavailable)
}

# -- tokens --------------------------------------------------------------------------------

#: A node name inside a token (:data:`NAME_RE` without its anchors).
_TOKEN_NAME = NAME_RE.removeprefix("^").removesuffix("$")
#: ``<name>.<hex>`` (generation 0) or ``<name>.<generation>.<hex>``: names hold no dot.
_CLAIM = rf"({_TOKEN_NAME})\.(?:([1-9][0-9]{{0,8}})\.)?[0-9a-f]{{64}}"
_NODE_TOKEN = re.compile(rf"fsnode\.{_CLAIM}")
_BLOB_TOKEN = re.compile(rf"fsblob\.{_CLAIM}")


def _mac(key: str, message: str) -> str:
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


def _claimed(prefix: str, name: str, generation: int, mac: str) -> str:
    if generation < 0:
        raise ValueError(f"a node's generation is never negative: {generation}")
    return f"{prefix}.{name}.{generation}.{mac}" if generation else f"{prefix}.{name}.{mac}"


def _suffix(generation: int) -> str:
    # Generation 0 signs what tokens signed before generations existed.
    return f" generation {generation}" if generation else ""


def node_token(operator_token: str, node: str, generation: int = 0) -> str:
    """The token of node ``node`` in its ``generation``:
    ``fsnode.<node>[.<generation>].<HMAC-SHA256(operator token, node and generation)>``.

    It names its node, so a service can tell whose it is before checking it. The generation
    counts the times the name was added again after a removal (``fogshift remove-node``,
    then ``up --nodes`` naming it while the cluster runs): each admission makes the tokens
    of the node removed before it worthless, so the machine that was taken out does not get
    its access back when a new one takes the name. ``0`` (never removed) is left out.
    """
    mac = _mac(operator_token, f"fogshift node token {node}{_suffix(generation)}")
    return _claimed("fsnode", node, generation, mac)


def token_node(token: str) -> tuple[str, int] | None:
    """The node and generation a token claims to be the node token of, ``None`` if it is
    not shaped like one (the claim is worth nothing until :func:`node_token` confirms it)."""
    match = _NODE_TOKEN.fullmatch(token)
    return (match.group(1), int(match.group(2) or 0)) if match else None


def blob_token(node_tok: str, reader: str, generation: int = 0) -> str:
    """The token with which node ``reader`` (in its ``generation``, see :func:`node_token`)
    reads checkpoint blobs from the replicas of the node holding ``node_tok`` — and nothing
    else there:
    ``fsblob.<reader>[.<generation>].<HMAC-SHA256(node token, reader and generation)>``.

    It names its reader, so the node it opens can refuse one reader (a node removed from the
    cluster, or an earlier generation of one added again) and keep serving the others; only
    that node and the orchestrator can make it.
    """
    mac = _mac(node_tok, f"fogshift blob token for {reader}{_suffix(generation)}")
    return _claimed("fsblob", reader, generation, mac)


def blob_reader(token: str) -> tuple[str, int] | None:
    """The node and generation a token claims to be a blob token of, ``None`` if it is not
    shaped like one (the claim is worth nothing until :func:`blob_token` confirms it)."""
    match = _BLOB_TOKEN.fullmatch(token)
    return (match.group(1), int(match.group(2) or 0)) if match else None


def same_token(given: str, expected: str) -> bool:
    """Constant-time comparison (works for any text, unlike ``compare_digest`` on str)."""
    return hmac.compare_digest(given.encode(), expected.encode())


class DirectoryEntry(BaseModel):
    """One node of the orchestrator's node directory (``GET /nodes/{name}/directory``).

    Attributes:
        name: The node.
        url: Where its agent is reached (the URL it reports in its heartbeats).
        blob_token: What opens ``GET /checkpoints/blobs/{sha256}`` on it for the node the
            directory is of (see :func:`blob_token`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    url: str
    blob_token: str


class NodeDirectory(BaseModel):
    """The nodes a node agent may copy checkpoint files from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: list[DirectoryEntry]


def _collect(cls: type[FogshiftError]) -> None:
    _BY_CODE.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _collect(sub)


def error_body(exc: FogshiftError) -> dict[str, Any]:
    """The JSON body of ``exc`` (an :class:`ErrorBody`), with a failed operation's report."""
    report = exc.report if isinstance(exc, MigrationFailed | RestoreFailed) else None
    body = ErrorBody(
        code=exc.code,
        message=exc.message,
        expected=exc.expected,
        received=exc.received,
        hint=exc.hint,
        report=report if isinstance(report, MigrationReport | RestoreReport) else None,
    )
    # Without a report key when there is none: other errors' bodies stay as they always were.
    return body.model_dump(mode="json", exclude={"report"} if body.report is None else None)


def raise_for_error(response: httpx.Response, what: str) -> None:
    """Raise the error an unsuccessful response carries, as its own class.

    A failed migration's or restore's report comes back as the error's ``report``.
    """
    if response.is_success:
        return
    try:
        body = ErrorBody.model_validate(response.json())
    except (ValueError, ValidationError):
        # Not one of ours (a proxy, a crash): the status is all there is to say.
        body = ErrorBody(code="error", message=f"{what} answered HTTP {response.status_code}")
    if body.code not in _BY_CODE:
        _collect(FogshiftError)  # again: subclasses imported since the last look count too
    cls = _BY_CODE.get(body.code)
    if cls is None:
        # A subclass this process never imported (the CLI does not load the services'
        # modules): the kind of error its HTTP status says, with the code it was sent with.
        cls = _BY_STATUS.get(response.status_code, FogshiftError)
    error = cls(
        body.message or f"{what} answered HTTP {response.status_code}",
        expected=body.expected,
        received=body.received,
        hint=body.hint,
    )
    error.code = body.code
    if isinstance(error, MigrationFailed | RestoreFailed):
        error.report = body.report
    raise error


log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=FogshiftError)

#: How long a client keeps an idle connection for reuse. Not httpx's 5 s: a new connection
#: costs a round trip before the request, a whole second over a link of 1 s RTT, and the
#: orchestrator's calls to a node come seconds apart (a migration's first request to its
#: origin opened a new one). A connection whose peer closed it (a node killed or restarted)
#: is seen closed before reuse and dropped; an idle one costs a socket on each side.
CLIENT_KEEP_ALIVE_S = 60.0
#: How long a fogshift service keeps an idle connection open (uvicorn's
#: ``timeout_keep_alive``). It must exceed the clients' :data:`CLIENT_KEEP_ALIVE_S` by more
#: than a round trip: the service's close reaches the client half a round trip late, and a
#: request sent meanwhile on that connection dies unread ("server disconnected"). With
#: uvicorn's default (5 s, then the same as the client's) any request after 4-5 s of quiet
#: across a link of 1 s RTT was lost that way (a 50 MiB handover over ``n500`` failed on it).
SERVER_KEEP_ALIVE_S = 75
#: Methods whose request :class:`ServiceClient` sends again once when the connection breaks
#: before an answer: reading twice changes nothing. Others are never repeated (a migration
#: or a deploy sent twice is not the same as once).
_REPEATABLE = frozenset({"GET", "HEAD"})
#: The connection broke before any answer arrived (a pooled connection the server had
#: closed meanwhile is the usual cause).
_BROKEN = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
#: How often a watched request (:class:`ServiceClient`'s ``silent``) checks its service.
WATCH_S = 0.5


def client_limits() -> httpx.Limits:
    """The connection-pool limits of every fogshift HTTP client (see
    :data:`SERVER_KEEP_ALIVE_S` for why the idle expiry matters)."""
    return httpx.Limits(keepalive_expiry=CLIENT_KEEP_ALIVE_S)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one verifying TLS context of this process, for every HTTP client it makes.

    httpx builds a fresh one (loading the CA bundle) for each client otherwise: 30 to 90 ms of
    CPU per client on a 2-core node, and an agent makes a client for every checkpoint copy,
    the orchestrator and the CLI one per service they call.
    """
    return httpx.create_ssl_context()


def _check_path(path: str, service: str) -> None:
    """Refuse a request path that is not the one written: its names build it, and one that
    is ``..`` (which the client resolves: ``/pipelines/x/../b/stop`` stops ``b``), empty, or
    holds ``?`` or ``#`` would send the request elsewhere.

    Raises:
        InvalidName: Naming the segment.
    """
    segments = path.split("/")[1:]
    bad = next((s for s in segments if s in ("", ".", "..") or set(s) & set("?#\\")), None)
    if not path.startswith("/") or (bad is not None and path != "/"):
        raise InvalidName(
            f"cannot ask {service}: the request path {path!r} is not made of names",
            expected="names of letters, digits, '-' and '_' (a pipeline, element or node)",
            received=repr(bad if bad is not None else path),
            hint="check the pipeline, element and node names given",
        )


class ServiceClient:
    """A small authenticated JSON client for one fogshift service.

    Args:
        url: The service's base URL.
        token: The bearer token.
        name: How the service is named in errors ("node agent fog-a").
        timeout_s: Per-request timeout.
        silent: Asked every :data:`WATCH_S` while a request waits: why the service is to be
            taken as gone (its node stopped sending heartbeats), or ``None``. With a reason
            the request is given up at once as :class:`NoAnswer` (it may still be carried
            out), instead of after ``timeout_s``: a stopped process (SIGSTOP, a frozen VM)
            keeps its connections open, and its requests would wait the whole timeout.
        unsent_when_silent: Ask ``silent`` before sending, too: a request to a service
            already taken as gone is not sent (:class:`Unavailable`), instead of one more
            request (a thread, a connection) left to wait out ``timeout_s`` at every call
            of a client that polls (the dashboard's sampler, every second).
    """

    def __init__(
        self, url: str, token: str, name: str, timeout_s: float = 30.0,
        silent: Callable[[], str | None] | None = None, unsent_when_silent: bool = False,
    ) -> None:  # fmt: skip
        self.url = url.rstrip("/")
        self.name = name
        self._silent = silent
        self._unsent_when_silent = unsent_when_silent
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            verify=tls_context(),
            # The cluster's own services only: $HTTP_PROXY or $ALL_PROXY (a machine that
            # reaches PyPI through one) sent every call to the proxy. As every client here.
            trust_env=False,
            limits=client_limits(),
        )

    def raw(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request and return the successful response itself (binary bodies).

        A ``GET`` or ``HEAD`` whose connection breaks before the answer is sent once more on
        a fresh connection; no other method is ever repeated.

        Raises:
            Unavailable: The service cannot be reached.
            FogshiftError: The service's own error, re-raised as its class.
        """
        _check_path(path, self.name)
        try:
            if self._silent is None:
                response = self._send(method, path, kwargs)
            else:
                response = self._watched(method, path, kwargs, self._silent)
        except httpx.HTTPError as exc:
            # Never connected: never sent. Otherwise the service may have it (NoAnswer).
            unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            if isinstance(exc, httpx.TimeoutException) and not unsent:
                # (Connected, and no answer: "cannot be reached ... is the cluster up?" of
                # a frozen orchestrator, whose process runs, sent `fogshift up` looking for
                # what was not running.)
                raise self._no_answer(NoAnswer(
                    f"{self.name} at {self.url} took the request and did not answer in time "
                    f"({type(exc).__name__})",
                    hint="its process may run but be frozen (SIGSTOP, a hung machine) or "
                    "overloaded: `kill -CONT` a stopped one, or stop it and `fogshift up` "
                    "starts it again"
                    if self.name == "the orchestrator"
                    else "its agent may be frozen or overloaded: `fogshift nodes` shows its health",
                )) from exc  # fmt: skip
            raise self._no_answer((Unavailable if unsent else NoAnswer)(
                f"{self.name} at {self.url} cannot be reached: {type(exc).__name__}",
                # (`fogshift nodes` asks the orchestrator: no help when it is the one away.)
                hint="is the cluster up? `fogshift up` starts what is not running, and "
                "`fogshift logs orchestrator` tells why it stopped"
                if self.name == "the orchestrator"
                else "is it running? `fogshift nodes` shows the node agents",
            )) from exc  # fmt: skip
        raise_for_error(response, self.name)
        return response

    def _no_answer(self, error: E) -> E:
        """``error``, a :class:`NoAnswer` marked as this client's service's own (not one a
        service passed on in its answer)."""
        if isinstance(error, NoAnswer):
            error.service = self.name
        return error

    def _send(self, method: str, path: str, kwargs: dict[str, Any]) -> httpx.Response:
        """The request, sent once more if it is repeatable and its connection broke."""
        try:
            return self._client.request(method, path, **kwargs)
        except _BROKEN:
            if method.upper() not in _REPEATABLE:
                raise
            return self._client.request(method, path, **kwargs)

    def _why_silent(self, silent: Callable[[], str | None]) -> str | None:
        """``silent()``; ``None`` if it fails (the check only informs: the request's own
        outcome decides)."""
        try:
            return silent()
        except Exception:
            log.debug("the silence check of %s failed", self.name, exc_info=True)
            return None

    def _watched(
        self, method: str, path: str, kwargs: dict[str, Any], silent: Callable[[], str | None]
    ) -> httpx.Response:
        """:meth:`_send` on a thread of its own, given up once ``silent`` gives a reason.

        Raises:
            NoAnswer: The service went silent while the request waited.
            Unavailable: It was silent already (with ``unsent_when_silent``): not sent.
        """
        if self._unsent_when_silent:
            reason = self._why_silent(silent)
            if reason is not None:
                raise Unavailable(
                    f"{self.name} at {self.url} was not sent {method} {path}: {reason}",
                    hint="nothing was asked of it; once it is continued it answers again (or "
                    "`fogshift down` stops the cluster and `fogshift up` starts it again)"
                    if self.name == "the orchestrator"
                    else "nothing was asked of it; `fogshift nodes` shows the node agents",
                )
        done = threading.Event()
        outcome: list[Any] = []

        def send() -> None:
            try:
                outcome.append(self._send(method, path, kwargs))
            except BaseException as exc:  # (raised below, on the caller's thread)
                outcome.append(exc)
            finally:
                done.set()

        # A daemon: one given up waits out its timeout without holding up an exit.
        threading.Thread(target=send, name=f"{method} {self.name}", daemon=True).start()
        while not done.wait(WATCH_S):
            reason = self._why_silent(silent)
            if reason is not None:
                raise self._no_answer(NoAnswer(
                    f"{self.name} at {self.url} stopped answering {method} {path}: {reason}",
                    hint="it may still carry the request out once it is continued; or "
                    "`fogshift down` stops the cluster and `fogshift up` starts it again"
                    if self.name == "the orchestrator"
                    else "it may still carry the request out if it resumes; `fogshift nodes` "
                    "shows the node agents",
                ))  # fmt: skip
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request and return its JSON body (see :meth:`raw` for the errors)."""
        response = self.raw(method, path, **kwargs)
        return response.json() if response.content else None

    def call(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        """Send a request and parse its JSON answer into ``model`` (its contract).

        Raises:
            InvariantViolation: The answer does not fit ``model``.
            Unavailable / FogshiftError: As :meth:`raw`.
        """
        answer = self.request(method, path, **kwargs)
        try:
            return model.model_validate(answer)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvariantViolation(
                f"{self.name} answered {method} {path} with what is not a {model.__name__}",
                expected=f"{model.__name__} (fogshift.contracts)",
                received=f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}",
                hint="are the services of one fogshift version?",
            ) from None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> Any:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
