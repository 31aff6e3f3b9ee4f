"""SyncJetStream: calls from synchronous code; close() ends the connection and its thread."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from nats import errors as nats_errors
from nats.js import errors as nats_js_errors

from fogshift.broker.client import (
    BrokerAddress,
    SyncJetStream,
    ensure_pe_stream,
    error_level,
    last_seq,
)
from fogshift.broker.exceptions import BrokerUnavailable
from fogshift.broker.naming import stream_name
from fogshift.broker.server import BrokerProcess, start_nats_server
from tests.broker.reload_moments import NOBODY, redirect
from tests.orchestrator.standin import dead_url

pytestmark = pytest.mark.integration  # a real nats-server (no Spark, no agents)


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("nats nats://")}


def test_run_then_close_joins_the_loop_thread_and_refuses_more(
    nats_server: BrokerProcess,
) -> None:
    before = loop_threads()
    with SyncJetStream(nats_server.address) as client:
        client.run(lambda js: ensure_pe_stream(js, "sync-client", "pe"))
        assert client.run(lambda js: last_seq(js, stream_name("sync-client", "pe"))) == 0
        ours = loop_threads() - before
        assert len(ours) == 1
    assert not next(iter(ours)).is_alive()
    client.close()  # a second close is a no-op
    with pytest.raises(BrokerUnavailable, match="closed"):
        client.run(lambda js: last_seq(js, stream_name("sync-client", "pe")))


def test_close_cancels_a_call_that_timed_out(nats_server: BrokerProcess) -> None:
    before = loop_threads()
    client = SyncJetStream(nats_server.address)
    ours = loop_threads() - before

    async def forever(_js: object) -> None:
        await anyio.sleep(3600)

    with pytest.raises(BrokerUnavailable, match=r"did not answer within 0\.2 s"):
        client.run(forever, timeout=0.2)
    client.close()  # does not wait an hour for the call
    assert len(ours) == 1 and not next(iter(ours)).is_alive()


def test_a_request_the_broker_never_completed_is_not_said_to_be_the_calls_wait(
    nats_server: BrokerProcess,
) -> None:
    # nats-py's own timeout (a store the broker took and never acknowledged: its disk full)
    # is a TimeoutError too: it was reported as the whole call's 300 s wait, seconds in.
    async def unacknowledged(_js: object) -> None:
        raise nats_errors.TimeoutError

    with SyncJetStream(nats_server.address) as client, pytest.raises(BrokerUnavailable) as caught:
        client.run(unacknowledged, timeout=300)
    said = str(caught.value)
    assert "did not complete a request in time (nats.errors.TimeoutError" in said, said
    assert "within 300 s" not in said and "connection to it is down" not in said, said
    assert "nats.log" in (caught.value.hint or ""), caught.value.hint


def test_a_broker_nobody_answers_at_is_unavailable_not_a_timeout() -> None:
    nowhere = BrokerAddress(dead_url().replace("http", "nats"))
    with SyncJetStream(nowhere, connect_timeout_s=0.5) as client:
        tried = []
        for _ in range(2):
            with pytest.raises(BrokerUnavailable, match=r"cannot connect .*: no connection "
                               r"within 0\.5 s"):  # fmt: skip
                client.run(lambda js: last_seq(js, stream_name("sync-client", "pe")), timeout=5)
            tried.append(client._nc)
        # Each connect given up on is closed: nats-py's retried without end, one more
        # client retrying every 0.5 s per call (credentials refused for good, say).
        assert tried[0] is not tried[1]
        assert all(nc is not None and nc.is_closed for nc in tried)


@pytest.mark.parametrize(
    "away",
    [
        lambda: nats_js_errors.ServiceUnavailableError(code=503, description="no JetStream"),
        nats_errors.NoRespondersError,
        nats_errors.ConnectionClosedError,
    ],
)
def test_a_broker_that_does_not_serve_is_unavailable_not_nats_pys_error(
    nats_server: BrokerProcess, away: Callable[[], Exception]
) -> None:
    # A rollback and the reconciler's recovery handle FogshiftError: JetStream's 503 right
    # after a broker restart escaped them untyped (a migration's 500, every round aborted).
    async def refused(_js: object) -> None:
        raise away()

    with SyncJetStream(nats_server.address) as client:
        with pytest.raises(BrokerUnavailable, match="is not serving"):
            client.run(refused)

        # A refusal of another kind stays what it is (callers tell them apart).
        async def missing(js: Any) -> None:
            await js.stream_info("FS_nowhere_at_all")

        with pytest.raises(nats_js_errors.NotFoundError):
            client.run(missing)


def test_a_connection_the_broker_closed_for_good_is_made_again(
    nats_server: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # nats-server refused a connected client during a config reload (placement changes
    # reload the nodes' rights) with "Authorization Violation", on which nats-py closes
    # the connection for good instead of reconnecting: the orchestrator's every broker
    # call then failed ("connection closed") until it was restarted. nats-py's own
    # handling of the server's -ERR line, as it came.
    async def names(js: Any) -> list[str]:
        return [info.config.name for info in await js.streams_info()]

    async def refused(_js: Any) -> None:
        await client.connection._process_err("'Authorization Violation'")
        while not client.connection.is_closed:
            await asyncio.sleep(0.01)

    with SyncJetStream(nats_server.address) as client:
        client.run(names)
        first = client.connection
        client.run(refused)  # (a call under way then failed: "connection closed")
        with caplog.at_level(logging.WARNING, logger="fogshift.broker.client"):
            assert isinstance(client.run(names), list)  # connected anew
        assert client.connection is not first and client.connection.is_connected
        assert "the broker closed this connection" in caplog.text


def test_a_call_that_may_run_twice_runs_again_on_a_new_connection(
    nats_server: BrokerProcess,
) -> None:
    # A deploy's fresh streams met a connection the broker closed under them (at the
    # rights' reload the deploy had just made): the deploy failed. A call that makes the
    # same state whatever it did before may run again; others fail, as before.
    from fogshift.broker.client import connection_of

    runs: list[Any] = []

    async def closed_under(js: Any) -> list[str]:
        runs.append(connection_of(js))
        if len(runs) == 1:
            await client.connection._process_err("'Authorization Violation'")
            while not client.connection.is_closed:
                await asyncio.sleep(0.01)
        return [info.config.name for info in await js.streams_info()]

    with SyncJetStream(nats_server.address) as client:
        with pytest.raises(BrokerUnavailable, match="ConnectionClosedError"):
            client.run(closed_under)
        runs.clear()
        assert isinstance(client.run(closed_under, again_if_closed=True), list)
        assert len(runs) == 2 and runs[0] is not runs[1]


def test_a_readers_arrivals_are_subscribed_again_on_the_new_connection(
    nats_server: BrokerProcess,
) -> None:
    # Its subscriptions went with a connection the broker closed for good: the reader's
    # every idle poll then waited its whole time, for the worker's life.
    from fogshift.broker.datasource import InputArrivals

    async def refused(_js: Any) -> None:
        await client.connection._process_err("'Authorization Violation'")
        while not client.connection.is_closed:
            await asyncio.sleep(0.01)

    async def arrive(js: Any) -> None:
        await client.connection.publish("fs-test.arrivals", b"x")

    with SyncJetStream(nats_server.address) as client:
        arrivals = InputArrivals(client, ["fs-test.arrivals"])
        try:
            client.run(arrive)
            assert arrivals.wait(10)
            client.run(refused)
            arrivals.wait(0)  # (subscribed again: said as an arrival, to look)
            client.run(arrive)
            assert arrivals.wait(10)
        finally:
            arrivals.close()


#: A process that uses a client (a shared one and one of its own) and never closes either.
NEVER_CLOSES = """
import sys
from fogshift.broker.client import BrokerAddress, SyncJetStream, ensure_pe_stream, shared_client
address = BrokerAddress.load(sys.argv[1])
shared_client(address).run(lambda js: ensure_pe_stream(js, "sync-exit", "a"))
SyncJetStream(address).run(lambda js: ensure_pe_stream(js, "sync-exit", "b"))
print("used", flush=True)
"""


def test_a_process_that_never_closes_its_clients_still_exits(
    nats_server: BrokerProcess, tmp_path: Path
) -> None:
    # The loop runs in an executor thread the interpreter joins at exit: without closing the
    # clients first, the process waited forever (a whole pytest run hung after its summary).
    address = nats_server.address.save(tmp_path / "broker.json")
    proc = subprocess.run(
        [sys.executable, "-c", NEVER_CLOSES, str(address)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "used"


#: A client whose broker dies under it: what it prints while it tries to reconnect.
BROKER_DIES = """
import logging, os, signal, sys, time
from fogshift.broker.client import BrokerAddress, SyncJetStream, ensure_pe_stream
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
client = SyncJetStream(BrokerAddress.load(sys.argv[1]))
client.run(lambda js: ensure_pe_stream(js, "sync-dies", "a"))
os.killpg(int(sys.argv[2]), signal.SIGKILL)
time.sleep(2.5)  # several reconnect attempts, 0.5 s apart
client.close()
print("closed", flush=True)
"""


def test_a_broker_that_dies_is_one_logged_line_not_a_traceback_per_reconnect(
    tmp_path: Path,
) -> None:
    # nats-py's default callbacks print a traceback for every failed reconnect attempt: an
    # agent's log filled with them while its broker was down.
    broker = start_nats_server(tmp_path / "nats")
    address = broker.address.save(tmp_path / "broker.json")
    proc = subprocess.run(
        [sys.executable, "-c", BROKER_DIES, str(address), str(broker.pid)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "closed"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("disconnected; reconnecting") == 1, proc.stderr


def test_a_refusal_by_the_broker_is_a_warning_a_failed_reconnect_is_not() -> None:
    # The broker refusing a node a PE it no longer hosts is how a revived zombie is stopped:
    # it must stay visible in the node's log (the frozen-node restore test looks for it).
    refused = nats_errors.Error('nats: permissions violation for publish to "$js.api.x"')
    assert error_level(refused) == logging.WARNING
    for noise in (ConnectionRefusedError(111, "refused"), TimeoutError(),
                  nats_errors.NoServersError(), nats_errors.UnexpectedEOF()):  # fmt: skip
        assert error_level(noise) == logging.DEBUG, noise


def test_a_zombies_refusals_are_said_once_a_minute_with_what_they_mean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A revived zombie's writes are refused many times a second: each was a line of
    # nats-py's own words.
    client = SyncJetStream.__new__(SyncJetStream)  # (no connection: only its callback)
    client.address, client._refusals = BrokerAddress("nats://127.0.0.1:9"), {}
    text = 'nats: permissions violation for publish to "$js.api.x"'
    with caplog.at_level(logging.DEBUG, "fogshift.broker"):
        for _ in range(5):
            asyncio.run(client._on_error(nats_errors.Error(text)))
        last, since = client._refusals[text]
        client._refusals[text] = (last - 61, since)  # a minute on
        asyncio.run(client._on_error(nats_errors.Error(text)))
    said = [r.getMessage() for r in caplog.records if "refused this node" in r.getMessage()]
    assert len(said) == 2, said
    meant = "it holds no right to that now (as a PE's old node, once the PE was moved"
    assert said[0].startswith(f"broker nats://127.0.0.1:9 refused this node: {text} — {meant}")
    assert "(4 more since it last said so)" in said[1], said


def test_a_request_nobody_answers_yet_is_sent_again_until_someone_does(
    nats_server: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker reloading its accounts (each placement change) rebuilds every account's
    imports: for a moment a request finds nobody to answer it (nothing was done with it).
    It is sent again; a subject nobody ever answers is still reported."""
    from fogshift.broker import client as client_module
    from fogshift.broker.client import connection_of

    with SyncJetStream(nats_server.address) as client, SyncJetStream(nats_server.address) as late:

        async def answer(js: Any) -> None:
            async def reply(msg: Any) -> None:
                await msg.respond(b"here")

            await connection_of(js).subscribe("fs-test.late", cb=reply)
            await connection_of(js).flush()

        timer = threading.Timer(0.3, lambda: late.run(answer))
        timer.start()
        try:
            asked = client.run(lambda js: connection_of(js).request("fs-test.late", b"?", 2))
        finally:
            timer.join()
        assert asked.data == b"here"
        monkeypatch.setattr(client_module, "NO_RESPONDERS_WAIT_S", 0.3)
        with pytest.raises(BrokerUnavailable, match="is not serving"):
            client.run(lambda js: connection_of(js).request("fs-test.nobody", b"?", 2))


def test_a_direct_get_nobody_answers_yet_is_asked_again(
    nats_server: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a batched direct get, which is a publish answered on an inbox: a 503
    (nobody answered) from a stream that takes direct gets is asked again; a stream that
    takes none, or none at all, is answered at once (no wait on the reader's path)."""
    from nats.js.api import StreamConfig

    from fogshift.broker import client as client_module
    from fogshift.broker.client import ensure_pe_stream, read_ahead

    pauses: list[int] = []
    pause = client_module._pause_after_no_responders

    async def counted(started: float, tries: int) -> bool:
        pauses.append(tries)
        return await pause(started, tries)

    with SyncJetStream(nats_server.address) as client:
        client.run(lambda js: ensure_pe_stream(js, "t", "late"))
        client.run(lambda js: js.publish("fs.t.late.data", b"{}"))
        # The first direct get goes where nobody answers (a reload's moment).
        lost = redirect(monkeypatch, client_module,
                        lambda subject, _: NOBODY if ".DIRECT.GET." in subject and not lost
                        else subject)  # fmt: skip
        monkeypatch.setattr(client_module, "_pause_after_no_responders", counted)
        got = client.run(lambda js: read_ahead(js, stream_name("t", "late"), 0, 1))
        assert lost and [m.data for m in got] == [b"{}"] and pauses == [0]
        # No direct gets, or no stream: the 503 is the answer.
        config = StreamConfig(name="FS_t_plain", subjects=["fs.t.plain.data"])
        client.run(lambda js: js.add_stream(config))
        for stream in ("FS_t_plain", "FS_t_nowhere"):
            assert client.run(lambda js, s=stream: read_ahead(js, s, 0, 1)) == []
        assert pauses == [0]


def test_the_broker_listens_on_its_client_port_alone(nats_server: BrokerProcess) -> None:
    """No HTTP monitoring port: nats-server's has no authentication and would show anyone
    on the host its connections, subjects and streams; readiness is a JetStream request."""
    listening = [
        c.laddr
        for c in psutil.Process(nats_server.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    client_port = int(nats_server.address.url.rsplit(":", 1)[1])
    assert [addr.port for addr in listening] == [client_port], listening
    assert all(addr.ip == "127.0.0.1" for addr in listening)
    assert "http" not in nats_server.config_file.read_text().split("accounts ", 1)[0]
