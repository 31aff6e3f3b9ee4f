"""A synchronous face for nats-py, for code that runs outside an event loop.

Spark calls data-source methods synchronously, in processes fogshift does not control. A
``SyncJetStream`` owns a private event loop in a thread of its own (an anyio blocking portal),
so one connection can be kept for the life of the process and used from any thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import nats
from anyio.from_thread import BlockingPortal, start_blocking_portal
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js import errors as nats_js_errors
from nats.js.api import DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from fogshift.broker.exceptions import BrokerError, BrokerUnavailable
from fogshift.broker.naming import (
    LOG_NAME,
    data_subject,
    legacy_stream_name,
    stream_name,
    stream_subjects,
)
from fogshift.common.files import write_private
from fogshift.common.names import NAME_PATTERN
from fogshift.common.text import one_line

T = TypeVar("T")
log = logging.getLogger(__name__)

DUPLICATE_WINDOW_S = 120.0


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker is and how to log in. Serialised to a 0600 file, never logged (nor
    in its ``repr``).

    Attributes:
        url: ``nats://host:port``.
        user: The NATS user (a broker of the operator's, ``up --nats-url``).
        password: The NATS password (the same).
        seed: The NKEY seed of this user (the broker ``fogshift up`` starts): the client
            signs the server's challenge with it, and the server's config names only its
            public key (``broker.permissions.BrokerUsers``).
        inbox: The prefix of this user's reply subjects (``None``: NATS's ``_INBOX``). A
            node user fogshift makes has its own (``broker.permissions.node_inbox_prefix``)
            and may subscribe to nothing else: it cannot read the replies the broker sends
            other clients (the admin's reads of any stream, other nodes' of theirs).
        api: The prefix of this user's JetStream API (``None``: ``$JS.API``). A node user
            fogshift makes is in an account of its own, which imports the calls it may make
            from the streams' account under a prefix of its own
            (``broker.permissions.NODE_API``).
    """

    url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    inbox: str | None = None
    api: str | None = None
    seed: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"url": self.url, "user": self.user, "password": self.password}
        if self.seed is not None:
            data["seed"] = self.seed
        if self.inbox is not None:
            data["inbox"] = self.inbox
        if self.api is not None:
            data["api"] = self.api
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BrokerAddress:
        return cls(url=data["url"], user=data.get("user"), password=data.get("password"),
                   inbox=data.get("inbox"), api=data.get("api"),
                   seed=data.get("seed"))  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> BrokerAddress:
        """Read a broker file written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> Path:
        """Write this address to ``path``, 0600 from the start (it holds the password or
        seed)."""
        return write_private(Path(path), json.dumps(self.to_dict()))


class SyncJetStream:
    """A NATS connection with JetStream, usable from synchronous code.

    It connects on first use. :meth:`close` (or leaving a ``with`` block) closes the
    connection and joins the loop's thread; the client cannot be used after that. A client
    still open when the interpreter exits is closed then (:func:`_close_at_exit`): the loop
    runs in a thread the interpreter joins at exit, so a process that never closed its
    client (Spark's Python workers keep theirs, :func:`shared_client`) would never exit.

    Args:
        address: Where to connect.
        connect_timeout_s: How long to try before raising :class:`BrokerUnavailable`.
    """

    def __init__(self, address: BrokerAddress, connect_timeout_s: float = 5.0) -> None:
        self.address = address
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = start_blocking_portal(
            "asyncio", name=f"nats {address.url}"
        )
        self._portal = self._portal_cm.__enter__()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._timeout = connect_timeout_s
        self._lock = threading.Lock()
        #: Refusals by the broker logged lately: when (monotonic), and how many since, by text.
        self._refusals: dict[str, tuple[float, int]] = {}
        _open_clients.add(self)

    def run(
        self,
        make: Callable[[JetStreamContext], Awaitable[T]],
        timeout: float = 30.0,
        *,
        again_if_closed: bool = False,
    ) -> T:
        """Run ``make(js)`` on the private loop and return its result.

        Args:
            again_if_closed: ``make`` may run twice (it only reads, as a status's counts,
                or it makes the same state whatever it did before, as a deploy's fresh
                streams): if the broker closed the connection under it for good (see
                :meth:`_call`), it runs again, once, on a new connection. Others fail: what
                a write did before the close is not known.

        Raises:
            BrokerUnavailable: The broker cannot be reached.
        """
        try:
            return self._submit(self._call(make), timeout)
        except BrokerUnavailable as exc:
            if not again_if_closed or not self._closed_by_broker():
                raise
            log.warning("broker %s: the broker closed the connection under a call (%s); "
                        "running it again on a new one", self.address.url, exc.message)  # fmt: skip
            return self._submit(self._call(make), timeout)

    def _closed_by_broker(self) -> bool:
        """Whether the connection in use was closed, and not by :meth:`close`."""
        with self._lock:
            return self._portal_cm is not None and self._closed() is not None

    def _closed(self) -> Client | None:
        """The connection in use if it is closed (the caller holds ``_lock``): by the broker
        unless :meth:`close` ran (it drops the portal first)."""
        nc = None if self._js is None else connection_of(self._js)
        return nc if nc is not None and nc.is_closed else None

    def submit(self, make: Callable[[JetStreamContext], Awaitable[T]]) -> Future[T]:
        """Start ``make(js)`` on the private loop and return at once (see :meth:`run`).

        For work that overlaps the caller's (a reader's next batch, read while Spark runs
        the current one). The future holds the result or the exception; :meth:`close`
        cancels it if it is still running.

        Raises:
            BrokerUnavailable: The broker cannot be reached.
        """
        return self._portal.start_task_soon(self._call(make))

    def _call(self, make: Callable[[JetStreamContext], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """``make`` bound to the connection, connecting first if need be."""
        with self._lock:
            if self._portal_cm is None:
                raise BrokerUnavailable(f"the client of the broker at {self.address.url} is closed")
            gone = self._closed()
            if gone is not None:
                # Closed by the broker, not by close(): nats-py reconnects a lost connection
                # but closes one for good on the server's "Authorization Violation" — which
                # nats-server sent a connected client during a config reload (each placement
                # change reloads the nodes' rights): every later call of the client (the
                # orchestrator's, a node's) failed as "connection closed" until its process
                # restarted. The call that met the close failed; this one connects anew.
                log.warning("broker %s: the broker closed this connection (%s); connecting "
                            "again", self.address.url, gone.last_error)  # fmt: skip
                self._js = None
            if self._js is None:
                self._js = self._submit(self._connect, self._timeout + 1)
        js = self._js

        async def call() -> T:
            return await make(js)

        return call

    def __enter__(self) -> SyncJetStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connection(self) -> Client:
        """The underlying nats-py client (use only inside :meth:`run`)."""
        if self._nc is None:
            raise BrokerUnavailable(f"not connected to the broker at {self.address.url}")
        return self._nc

    def _submit(self, call: Callable[[], Awaitable[T]], timeout: float) -> T:
        # Not portal.call: that has no timeout. On a timeout the call keeps running, as
        # before; close() cancels whatever is left.
        future = self._portal.start_task_soon(call)
        try:
            return future.result(timeout)
        except TimeoutError as exc:
            if future.done() and not future.cancelled() and future.exception() is exc:
                # The call's own timeout (nats-py's TimeoutError is a TimeoutError). Said as
                # "did not answer within 300 s", a store the broker took and never
                # acknowledged (its disk full) sent operators to the network; a request
                # buffered while the connection was down is the network's, though.
                down = self._nc is None or not self._nc.is_connected
                raise BrokerUnavailable(
                    f"the broker at {self.address.url} did not complete a request in time "
                    f"({type(exc).__module__}.{type(exc).__name__}: {exc})"
                    + ("; the connection to it is down" if down else ""),
                    hint=(
                        "is the broker reachable from here? (the client reconnects)"
                        if down
                        else "it is connected but did not acknowledge: see its log (`fogshift "
                        f"up`'s: <home>/broker/{LOG_NAME}) and the free space of its store"
                    ),
                ) from exc
            # (A broker that cannot be reached at all, too: the first connect retries.)
            raise BrokerUnavailable(
                f"the broker at {self.address.url} did not answer within {timeout:g} s",
                hint="is `fogshift up` running and the broker reachable from here?",
            ) from exc
        except _AWAY as exc:
            # Typed, as every other broker outage: callers (a rollback, the reconciler's
            # recovery) handle FogshiftError and would let nats-py's own escape.
            raise BrokerUnavailable(
                f"the broker at {self.address.url} is not serving: {type(exc).__name__}: {exc}",
                hint="is `fogshift up` running and the broker reachable from here? "
                "(right after a broker restart, JetStream needs a moment)",
            ) from exc

    async def _connect(self) -> JetStreamContext:
        """A new connection, tried for at most the connect timeout.

        nats-py's own connect retries without end (``max_reconnect_attempts=-1``: the
        reconnects this client wants once connected): a connect given up on by its caller
        ran on, each call started another, and a refusal that stayed (credentials no
        longer valid) left one more client retrying every 0.5 s per call. Given up on, the
        client is closed.
        """
        nc = _Client()
        # (nats-py types its timeouts int; it takes seconds as float as nats.connect does.)
        options: dict[str, Any] = {
            "user": self.address.user,
            "password": self.address.password,
            "nkeys_seed_str": self.address.seed,
            "inbox_prefix": self.address.inbox or "_INBOX",
            "connect_timeout": self._timeout,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            "allow_reconnect": True,
            "error_cb": self._on_error,
            # (Bound to this client: a connection closed for good is replaced, and its late
            # callback would otherwise speak of the new one.)
            "disconnected_cb": partial(self._on_disconnected, nc),
            "reconnected_cb": self._on_reconnected,
        }
        self._nc = nc
        try:
            await asyncio.wait_for(nc.connect(self.address.url, **options), self._timeout)
        except Exception as exc:  # nats raises several unrelated types here
            with contextlib.suppress(Exception):
                await nc.close()
            said = (f"no connection within {self._timeout:g} s"
                    if isinstance(exc, TimeoutError) else repr(exc))  # fmt: skip
            raise BrokerUnavailable(
                f"cannot connect to the broker at {self.address.url}: {said}",
                hint="is `fogshift up` running, and are the credentials in the home dir current?",
            ) from exc
        return nc.jetstream(prefix=self.address.api or DEFAULT_API)

    # nats-py's default callbacks print a traceback to stderr for every failed reconnect
    # attempt (every 0.5 s while the broker is down): one logged line each instead.
    async def _on_error(self, exc: Exception) -> None:
        text = one_line(str(exc))
        if PERMISSIONS_VIOLATION not in text.lower():
            log.log(error_level(exc), "broker %s: %s: %s", self.address.url,
                    type(exc).__name__, text)  # fmt: skip
            return
        # A revived zombie's every write and read is refused, each a line of nats-py's own
        # words, many a second: said once a minute per refusal, with what it means.
        now = time.monotonic()
        last, since = self._refusals.get(text, (-math.inf, 0))
        if now - last < REFUSALS_SAID_EVERY_S:
            self._refusals[text] = (last, since + 1)
            return
        if len(self._refusals) > 256:  # (a subject per PE and stream: bounded, but kept so)
            self._refusals.clear()
        self._refusals[text] = (now, 0)
        again = f" ({since} more since it last said so)" if since else ""
        log.warning("broker %s refused this node: %s%s — it holds no right to that now (as "
                    "a PE's old node, once the PE was moved or restored elsewhere)",
                    self.address.url, text, again)  # fmt: skip

    async def _on_disconnected(self, nc: Client) -> None:
        # nats-py also calls this when the client is closed (by close(), or for good by the
        # broker: replaced at the next call, said then).
        if nc is self._nc and not nc.is_closed:
            log.warning("broker %s: disconnected; reconnecting", self.address.url)

    async def _on_reconnected(self) -> None:
        log.info("broker %s: reconnected", self.address.url)

    def close(self) -> None:
        """Close the connection, stop the loop and join its thread (idempotent)."""
        with self._lock:
            portal_cm, self._portal_cm = self._portal_cm, None
        if portal_cm is None:
            return
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            # Closing a dead connection must not mask the error that killed it.
            with contextlib.suppress(Exception):
                self._submit(nc.close, 5)
        # Cancel what is still running (a call that timed out), then join the thread.
        self._portal.call(self._portal.stop, True)
        portal_cm.__exit__(None, None, None)


#: The JetStream API prefix of a user in the streams' account.
DEFAULT_API = "$JS.API"
#: How long a request that finds no responder is sent again (see :class:`_Client`).
NO_RESPONDERS_WAIT_S = 3.0


async def _pause_after_no_responders(started: float, tries: int) -> bool:
    """Wait a little before a request that found no responder is sent again; ``False``:
    :data:`NO_RESPONDERS_WAIT_S` have passed since ``started``, give up."""
    loop = asyncio.get_running_loop()
    if loop.time() - started >= NO_RESPONDERS_WAIT_S:
        return False
    await asyncio.sleep(min(0.01 * 2**tries, 0.25))
    return True


class _Client(Client):
    """nats-py's client, whose requests that find no responder are sent again for a moment.

    A node's account imports its subjects and JetStream calls from the streams' account
    (``broker.permissions``), and nats-server rebuilds every account's imports when it
    reloads a changed account (each placement change): a request in flight then may find
    nobody to answer it, the admin's too. Nothing was done with such a request (no
    responder got it), so sending it again is safe; a JetStream that stays away is still
    reported, :data:`NO_RESPONDERS_WAIT_S` later.
    """

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Any:
        started, tries = asyncio.get_running_loop().time(), 0
        while True:
            try:
                return await super().request(subject, payload, timeout, old_style, headers)
            except nats_errors.NoRespondersError:
                if not await _pause_after_no_responders(started, tries):
                    raise
                tries += 1


def api_prefix(js: JetStreamContext) -> str:
    """The JetStream API prefix ``js`` calls (``$JS.API``, or a node user's own)."""
    prefix: str = js._prefix  # nats-py's context exposes no public handle on it
    return prefix


#: What a call raises when the broker is away or JetStream does not serve (a restart):
#: :class:`BrokerUnavailable` to the caller.
_AWAY = (
    nats_js_errors.ServiceUnavailableError,
    nats_errors.NoRespondersError,
    nats_errors.ConnectionClosedError,
    nats_errors.StaleConnectionError,
    nats_errors.NoServersError,
)

#: What a client's broker connection raises while the broker is away: the disconnect is
#: logged once, each failed reconnect attempt only at debug level.
_RECONNECT_NOISE = (
    OSError,  # refused, reset, timed out (TimeoutError is an OSError)
    nats_errors.TimeoutError,
    nats_errors.StaleConnectionError,
    nats_errors.ConnectionClosedError,
    nats_errors.NoServersError,
)


#: How nats-py words the broker's refusal of a subject this connection has no right to.
PERMISSIONS_VIOLATION = "permissions violation"
#: How often the same refusal is logged (a zombie retries its writes many times a second).
REFUSALS_SAID_EVERY_S = 60.0


def error_level(exc: BaseException) -> int:
    """How loudly to log an error the broker connection reports: a failed reconnect attempt
    at debug level; anything else — a permissions violation, when the broker refuses a
    node a PE it no longer hosts (a zombie), or a protocol error — as a warning."""
    return logging.DEBUG if isinstance(exc, _RECONNECT_NOISE) else logging.WARNING


#: Clients not closed yet (weakly: a client nobody holds needs no closing at exit).
_open_clients: weakref.WeakSet[SyncJetStream] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Close every client still open. Runs when the interpreter starts to exit, before it
    joins the threads of ``concurrent.futures`` executors, one of which runs each client's
    event loop (anyio's blocking portal) and would otherwise be waited for forever."""
    for client in list(_open_clients):
        with contextlib.suppress(Exception):
            client.close()


# threading's exit hooks run before executor threads are joined (atexit's only after).
getattr(threading, "_register_atexit", atexit.register)(_close_at_exit)

_shared: dict[BrokerAddress, SyncJetStream] = {}
_shared_lock = threading.Lock()


def shared_client(address: BrokerAddress) -> SyncJetStream:
    """One connection per broker address per process (Spark reuses its Python workers)."""
    with _shared_lock:
        client = _shared.get(address)
        if client is None:
            client = _shared[address] = SyncJetStream(address)
        return client


async def ensure_pe_stream(
    js: JetStreamContext, pipeline: str, pe: str, duplicate_window_s: float = DUPLICATE_WINDOW_S
) -> None:
    """Create the output stream of ``pe`` if it does not exist yet (idempotent).

    ``duplicate_window_s`` only bounds the broker's own de-duplication by message id;
    fogshift's exactly-once does not depend on it (see ``broker.publish``).
    """
    name = stream_name(pipeline, pe)
    try:
        await js.stream_info(name)
    except NotFoundError:
        pass
    else:
        await ensure_subjects(js, pipeline, pe)
        return
    try:
        await js.add_stream(
            StreamConfig(
                name=name,
                subjects=stream_subjects(pipeline, pe),
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=duplicate_window_s,
                # Records go in atomic batches (see fogshift.broker.publish), and readers
                # take ranges with batched direct gets (get_range).
                allow_atomic=True,
                allow_direct=True,
            )
        )
    except Exception as exc:
        holder = await _stream_holding(js, pipeline, pe)
        if holder is not None and holder != name:
            raise BrokerError(
                f"cannot create stream {name} for {pipeline}/{pe}: its subjects are held by "
                f"stream {holder!r}",
                expected=f"no stream but {name} on {data_subject(pipeline, pe)}",
                received=holder,
                hint=(
                    f"{holder} is this PE's stream as an older fogshift named it: `fogshift "
                    f"stop {pipeline}`, then deploy it again with `--fresh` (its output "
                    "starts afresh)"
                    if holder == legacy_stream_name(pipeline, pe)
                    else f"remove or rename stream {holder}, which is not fogshift's"
                ),
            ) from exc
        raise BrokerError(f"cannot create stream {name} for {pipeline}/{pe}: {exc!r}") from exc


async def _stream_holding(js: JetStreamContext, pipeline: str, pe: str) -> str | None:
    """The stream that holds the output subject of ``pe``, whatever its name."""
    try:
        return await js.find_stream_name_by_subject(data_subject(pipeline, pe))
    except NotFoundError:
        return None


async def ensure_subjects(js: JetStreamContext, pipeline: str, pe: str) -> None:
    """Give the existing stream of ``pe`` every subject :func:`stream_subjects` names: a
    stream an older fogshift made lacks the newer ones (``.state`` and ``.state.*`` since
    2026-11-28, ``.keys.*`` since 2026-11-29, ``.state.*.*`` since 2026-12-02), and
    publishing on a subject no stream has fails.

    Raises:
        NotFoundError: The stream does not exist.
    """
    info = await js.stream_info(stream_name(pipeline, pe))
    have = list(info.config.subjects or [])
    missing = [s for s in stream_subjects(pipeline, pe) if s not in have]
    # Direct gets too: the nodes read their inputs with them only (no consumers, see
    # fogshift.broker.permissions), and a stream made before them answers none.
    if missing or not info.config.allow_direct:
        info.config.subjects = have + missing
        info.config.allow_direct = True
        await js.update_stream(info.config)


async def delete_pe_stream(js: JetStreamContext, pipeline: str, pe: str) -> None:
    """Delete the output stream of ``pe`` if it exists: under its name, or under the name an
    older fogshift gave it (:func:`~fogshift.broker.naming.legacy_stream_name`), which
    holds its subjects so that no stream of the current name could be created."""
    with contextlib.suppress(NotFoundError):
        await js.delete_stream(stream_name(pipeline, pe))
    legacy = legacy_stream_name(pipeline, pe)
    if legacy != stream_name(pipeline, pe) and await _stream_holding(js, pipeline, pe) == legacy:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(legacy)


async def pipeline_streams(js: JetStreamContext, pipeline: str) -> list[str]:
    """The streams of ``pipeline``'s PEs: also of PEs its spec no longer has (a partition a
    scale added), and older fogshifts' names of them.

    Only streams fogshift made: named as a PE's stream of this pipeline is (now or by an
    older fogshift) and holding that PE's subjects and nothing else. A broker may be shared
    (``broker.url``): another user's stream whose subjects only meet the pipeline's
    (``fs.*.audit``) is never listed, and so never deleted by a fresh deploy.
    """
    names: list[str] = []
    while True:
        reply = await connection_of(js).request(
            f"{api_prefix(js)}.STREAM.NAMES",
            json.dumps({"subject": f"fs.{pipeline}.>", "offset": len(names)}).encode(),
            timeout=10,
        )
        answer = json.loads(reply.data)
        if "error" in answer:
            raise BrokerError(f"cannot list the streams of pipeline {pipeline!r}: {answer}")
        page = answer.get("streams") or []
        names.extend(page)
        if not page or len(names) >= int(answer.get("total", 0)):
            return [name for name in names if await _pe_stream(js, pipeline, name)]


async def delete_pipeline_streams(
    js: JetStreamContext, pipeline: str, keep: Collection[str] = ()
) -> list[str]:
    """Delete the streams of ``pipeline``'s PEs (:func:`pipeline_streams`) but those named
    in ``keep``; the names deleted, sorted."""
    gone = sorted(name for name in await pipeline_streams(js, pipeline) if name not in keep)
    for name in gone:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    return gone


async def _pe_stream(js: JetStreamContext, pipeline: str, name: str) -> bool:
    """Whether stream ``name`` is one fogshift made for a PE of ``pipeline`` (see
    :func:`pipeline_streams`)."""
    for prefix in {stream_name(pipeline, ""), legacy_stream_name(pipeline, "")}:
        pe = name[len(prefix) :]
        if not name.startswith(prefix) or not NAME_PATTERN.fullmatch(pe):
            continue
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            return False
        subjects = set(info.config.subjects or ())
        if subjects and subjects <= set(stream_subjects(pipeline, pe)):
            return True
    return False


async def last_seq(js: JetStreamContext, stream: str) -> int:
    """The sequence of the last message in ``stream`` (0 when empty)."""
    info = await js.stream_info(stream)
    return int(info.state.last_seq or 0)


#: How many times :func:`publish_once` sends a record whose acknowledgement did not come.
PUBLISH_TRIES = 3


async def publish_once(
    js: JetStreamContext, subject: str, payload: bytes, stream: str, msg_id: str,
    tries: int = PUBLISH_TRIES,
) -> int:  # fmt: skip
    """Publish ``payload`` on ``subject`` of ``stream`` under message id ``msg_id``, sent
    again under the same id while its acknowledgement does not come (at most ``tries``
    times); the sequence it is stored at.

    A publish whose acknowledgement is late (a busy broker) may still be stored: raising
    then would report as failed what took effect. The broker drops a repeat of an id within
    its duplicate window (:data:`DUPLICATE_WINDOW_S`) and acknowledges it with the sequence
    the first was stored at, so the record is stored once whichever try it was. (A request
    nobody answered at all, during an account reload, :class:`_Client` sends again itself.)

    Raises:
        nats.errors.TimeoutError: No try was acknowledged (the caller's
            :meth:`SyncJetStream.run` makes it a :class:`BrokerUnavailable`).
    """
    headers = {"Nats-Msg-Id": msg_id}
    for attempt in range(1, tries + 1):
        try:
            ack = await js.publish(subject, payload, stream=stream, headers=headers)
        except nats_errors.TimeoutError:
            if attempt == tries:
                raise
            log.warning("%s: no acknowledgement of message %s in time; sent again under its "
                        "id", subject, msg_id)  # fmt: skip
            continue
        return int(ack.seq)
    raise AssertionError("unreachable")  # (the last try returns or raises)


async def subject_count(js: JetStreamContext, stream: str, subject: str) -> int:
    """Messages stored on ``subject`` (no wildcard) of ``stream``."""
    return (await subject_counts(js, stream, subject)).get(subject, 0)


async def subject_counts(js: JetStreamContext, stream: str, subjects: str = ">") -> dict[str, int]:
    """Messages stored per subject of ``stream`` (of those ``subjects`` matches)."""
    try:
        info = await js.stream_info(stream, subjects_filter=subjects)
    except NotFoundError:
        return {}
    return dict(info.state.subjects or {})


async def fetch_range(
    js: JetStreamContext, stream: str, subject: str, start: int, end: int, batch: int = 500
) -> list[Any]:
    """Messages on ``subject`` with stream sequence in ``(start, end]``, in order.

    Uses an ephemeral, unacknowledged pull consumer starting at ``start + 1``.
    """
    if end <= start:
        return []
    psub = await js.pull_subscribe(
        subject,
        stream=stream,
        config=nats.js.api.ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start + 1,
            ack_policy=nats.js.api.AckPolicy.NONE,
            inactive_threshold=30.0,
        ),
    )
    out: list[Any] = []
    try:
        info = await psub.consumer_info()
        pending = int(info.num_pending or 0)
        while pending > 0:
            msgs = await psub.fetch(min(batch, pending), timeout=10)
            for msg in msgs:
                seq = msg.metadata.sequence.stream
                if seq > end:
                    return out
                out.append(msg)
                pending = int(msg.metadata.num_pending)
                if seq == end:
                    return out
    finally:
        await psub.unsubscribe()
    return out


def connection_of(js: JetStreamContext) -> Client:
    """The NATS connection under a JetStream context, for what goes around the JetStream API
    (an atomic batch's plain publishes, a batched direct get's inbox): nats-py's context
    exposes no public handle on it."""
    nc: Client = js._nc
    return nc


#: The most messages one batched direct get asks for.
DIRECT_BATCH = 1000
#: How long to wait for the rest of a batched direct get's answer.
DIRECT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class StoredMessage:
    """One message as the stream stores it.

    Attributes:
        seq: Its stream sequence.
        subject: Its subject.
        data: Its payload.
        headers: Its headers (the broker's own ``Nats-*`` answer headers removed).
        stored: When the broker stored it (RFC 3339, nanoseconds; empty when not known).
    """

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    stored: str = ""

    @property
    def stored_at(self) -> float:
        """:attr:`stored` in seconds since the epoch (microsecond precision)."""
        whole, _, fraction = self.stored.rstrip("Z").partition(".")
        moment = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
        return moment.timestamp() + float(f"0.{fraction or 0}")


_DIRECT_HEADERS = frozenset(
    {"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending",
     "Nats-Last-Sequence"}
)  # fmt: skip


class _DirectGetUnavailable(Exception):
    """The stream answers no direct gets (created without ``allow_direct``)."""


async def _direct_batch(
    js: JetStreamContext, stream: str, subject: str, first: int, count: int
) -> list[StoredMessage]:
    """Up to ``count`` messages on ``subject`` from sequence ``first`` on, in one request.

    The server streams the messages to an inbox and ends with an end-of-batch status (204);
    no message at all is a 404.
    """
    request = {"seq": first, "batch": count, "next_by_subj": subject}
    return await _direct_request(js, stream, request, subject)


async def next_message(
    js: JetStreamContext, stream: str, subject: str, first: int = 1
) -> StoredMessage | None:
    """The first message on ``subject`` at sequence ``first`` or later (``None``: none)."""
    found = await _direct_batch(js, stream, subject, first, 1)
    return found[0] if found else None


async def message_since(
    js: JetStreamContext, stream: str, subject: str, when: float
) -> StoredMessage | None:
    """The first message on ``subject`` stored at ``when`` (Unix time) or later (``None``:
    none)."""
    at = datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat().replace("+00:00", "Z")
    request = {"start_time": at, "batch": 1, "next_by_subj": subject}
    found = await _direct_request(js, stream, request, subject)
    return found[0] if found else None


def stamp_nanos(stamp: str) -> int:
    """A message's ``Nats-Time-Stamp`` (RFC 3339, UTC, up to nanoseconds) in nanoseconds
    since the epoch: exact, where :attr:`StoredMessage.stored_at` is a float."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    moment = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return int(moment.timestamp()) * 10**9 + int((fraction or "0")[:9].ljust(9, "0"))


def nanos_stamp(nanos: int) -> str:
    """:func:`stamp_nanos`' inverse: the RFC 3339 time a direct get's ``start_time`` takes."""
    seconds, rest = divmod(nanos, 10**9)
    whole = datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{rest:09d}Z"


async def stored_stamp(js: JetStreamContext, stream: str, seq: int) -> str | None:
    """When the message of ``stream`` at sequence ``seq`` (or the first after it: one
    deleted) was stored, its ``Nats-Time-Stamp`` (``None``: nothing stored from there)."""
    found = await _direct_request(js, stream, {"seq": max(1, seq), "batch": 1})
    return found[0].stored if found else None


async def last_stored_by(js: JetStreamContext, stream: str, stamp: str) -> int:
    """The sequence of the last message of ``stream`` stored at ``stamp`` or before (0:
    none): the one before the first stored after it, or the stream's last."""
    after = nanos_stamp(stamp_nanos(stamp) + 1)
    found = await _direct_request(js, stream, {"start_time": after, "batch": 1})
    return found[0].seq - 1 if found else await last_seq(js, stream)


async def _direct_request(
    js: JetStreamContext, stream: str, request: dict[str, Any], subject: str = ""
) -> list[StoredMessage]:
    """The messages a batched direct get ``request`` answers (none on a 404)."""
    nc = connection_of(js)
    got: list[StoredMessage] = []
    done = asyncio.get_running_loop().create_future()

    async def on_message(msg: Any) -> None:
        headers = msg.headers or {}
        if "Nats-Sequence" not in headers:
            # The broker's own reply: the end of the batch (204), nothing (404), an error.
            # A stored message always carries its sequence, and may carry a `Status` header
            # of its own, which nats-py files where the status line goes: taken for the end,
            # one message a node may publish cut every read of its subject short.
            if not done.done():
                done.set_result(headers.get("Status"))
            return
        got.append(
            StoredMessage(
                seq=int(headers["Nats-Sequence"]),
                subject=headers.get("Nats-Subject", subject),
                data=msg.data,
                headers={k: v for k, v in headers.items() if k not in _DIRECT_HEADERS},
                stored=headers.get("Nats-Time-Stamp", ""),
            )
        )

    subject_of_call = f"{api_prefix(js)}.DIRECT.GET.{stream}"
    started, tries = asyncio.get_running_loop().time(), 0
    while True:
        inbox = nc.new_inbox()  # (a new one each time: nothing late lands in the next)
        sub = await nc.subscribe(inbox, cb=on_message)
        try:
            await nc.publish(subject_of_call, json.dumps(request).encode(), reply=inbox)
            status = await asyncio.wait_for(done, DIRECT_TIMEOUT_S)
        finally:
            await sub.unsubscribe()
        # 503: nobody answered, so nothing came before it. A stream that takes direct gets
        # had its imports being rebuilt (see _Client): ask again for a moment.
        if status != "503" or not await _takes_direct_gets(js, stream):
            break
        if not await _pause_after_no_responders(started, tries):
            break
        tries += 1
        done = asyncio.get_running_loop().create_future()
    if status == "503":
        raise _DirectGetUnavailable(stream)
    if status not in ("204", "404", None):
        first = request.get("seq")
        raise BrokerError(f"direct get of {stream} from sequence {first} answered status {status}")
    return got


async def _takes_direct_gets(js: JetStreamContext, stream: str) -> bool:
    """Whether ``stream`` exists and takes direct gets (then a 503 was a moment without
    responders, not the stream's answer)."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return False
    except nats_js_errors.ServiceUnavailableError:
        return True  # (JetStream itself away a moment longer)
    return bool(info.config.allow_direct)


#: The most bytes one :func:`read_ahead` asks for.
READ_AHEAD_BYTES = 16 * 1024 * 1024


async def read_ahead(
    js: JetStreamContext, stream: str, after: int, count: int, subject: str | None = None
) -> list[StoredMessage]:
    """Up to ``count`` messages of ``stream`` after sequence ``after``, of every subject (or
    of ``subject`` only), in order, in one request (at most :data:`READ_AHEAD_BYTES`, at
    least one message).

    Returns:
        The messages; none if nothing is stored after ``after``, or if the stream takes no
        direct gets (then ask :func:`last_seq`).
    """
    request: dict[str, Any] = {"seq": after + 1, "batch": max(1, count),
                               "max_bytes": READ_AHEAD_BYTES}  # fmt: skip
    if subject is not None:
        request["next_by_subj"] = subject
    try:
        return await _direct_request(js, stream, request, subject or "")
    except _DirectGetUnavailable:
        return []


async def get_range(
    js: JetStreamContext, stream: str, subject: str, start: int, end: int
) -> list[StoredMessage]:
    """Messages on ``subject`` with stream sequence in ``(start, end]``, in order.

    Batched direct gets (nats-server 2.11+, streams with ``allow_direct``): one request per
    :data:`DIRECT_BATCH` messages and no consumer to create and delete — about half the
    time of an ephemeral pull consumer for a large range, and one round trip instead of four
    for a small one. A stream created without ``allow_direct`` is read with
    :func:`fetch_range`.
    """
    out: list[StoredMessage] = []
    first = start + 1
    try:
        while first <= end:
            batch = await _direct_batch(
                js, stream, subject, first, min(DIRECT_BATCH, end - first + 1)
            )
            for message in batch:
                if message.seq > end:
                    return out
                out.append(message)
            if not batch:
                return out
            first = batch[-1].seq + 1
    except _DirectGetUnavailable:
        messages = await fetch_range(js, stream, subject, first - 1, end)
        out.extend(
            StoredMessage(
                int(m.metadata.sequence.stream),
                m.subject,
                m.data,
                dict(m.headers or {}),
                m.metadata.timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            )
            for m in messages
        )
    return out


async def get_ranges(
    js: JetStreamContext, stream: str, subjects: Sequence[str], start: int, end: int
) -> list[StoredMessage]:
    """Messages on any of ``subjects`` (each may be a wildcard) with stream sequence in
    ``(start, end]``, in stream order: :func:`get_range` of each at once (one round trip
    for all, not one after another), merged."""
    found = await asyncio.gather(*(get_range(js, stream, s, start, end) for s in subjects))
    return sorted((m for messages in found for m in messages), key=lambda m: m.seq)
