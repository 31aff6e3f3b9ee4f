"""The HTTP client side shared by the services."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from fogshift.common.exceptions import NoAnswer
from fogshift.common.http import (
    CLIENT_KEEP_ALIVE_S,
    SERVER_KEEP_ALIVE_S,
    ServiceClient,
    blob_reader,
    blob_token,
    client_limits,
    error_body,
    node_token,
    raise_for_error,
    tls_context,
    token_node,
)
from fogshift.common.waiting import wait_until
from fogshift.exceptions import Unavailable
from fogshift.network.links import parse_link_profile
from fogshift.network.relay import Route, ThreadedRelay


def test_every_client_shares_one_verifying_tls_context() -> None:
    context = tls_context()
    assert context is tls_context()  # built once per process, not per client
    # Shared, but not weakened: certificates and host names are still checked.
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    client = ServiceClient("https://127.0.0.1:1", "t" * 16, "node agent 'x'")
    try:
        pool = client._client._transport._pool  # type: ignore[attr-defined]
        assert pool._ssl_context is context
    finally:
        client._client.close()


@contextmanager
def _served(app: FastAPI, keep_alive_s: float) -> Iterator[int]:
    """``app`` on a real uvicorn server that closes idle connections after ``keep_alive_s``."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                       timeout_keep_alive=keep_alive_s)  # type: ignore[arg-type]
    )  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, describe="uvicorn started")
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_read_survives_a_connection_the_service_closed_while_the_link_delayed_the_news() -> None:
    """The service closes an idle connection before the client can know (the close, like
    everything, crosses a link of 0.25 s one way): a GET sent on it meanwhile dies unread.
    ServiceClient sends a GET once more on a fresh connection; other methods never."""
    app = FastAPI()
    calls = {"GET": 0, "POST": 0}

    @app.get("/thing")
    def read() -> dict[str, int]:
        calls["GET"] += 1
        return calls

    @app.post("/thing")
    def write() -> dict[str, int]:
        calls["POST"] += 1
        return calls

    # The service drops idle connections after 0.1 s, before the next request can arrive.
    with _served(app, keep_alive_s=0.1) as port:
        route = Route(name="agent", listen_host="127.0.0.1", target_host="127.0.0.1",
                      target_port=port)  # fmt: skip
        with ThreadedRelay(parse_link_profile("normal:250:0"), [route], seed=1) as relay:
            host, relayed = relay.addresses["agent"]
            url = f"http://{host}:{relayed}"
            # Without the retry the second read is lost: the failure this guards against.
            with httpx.Client(base_url=url, limits=client_limits()) as bare:
                assert bare.get("/thing").status_code == 200
                with pytest.raises(httpx.RemoteProtocolError):
                    bare.get("/thing")
            client = ServiceClient(url, "t" * 16, "node agent 'x'")
            try:
                assert client.get("/thing")["GET"] == 2
                assert client.get("/thing")["GET"] == 3  # sent twice, arrived once
                # A write on the same kind of connection is lost and reported, never repeated.
                with pytest.raises(Unavailable, match="cannot be reached: RemoteProtocolError"):
                    client.post("/thing")
                assert calls["POST"] == 0
            finally:
                client.close()


def test_services_keep_idle_connections_longer_than_clients_reuse_them() -> None:
    # Race-free while a round trip is shorter than the difference: n500's (~1 s), say, with
    # a deviation of ten sigma each way.
    n500 = parse_link_profile("n500")
    round_trip_s = 2 * (n500.mean_ms + 10 * n500.sd_ms) / 1000
    assert CLIENT_KEEP_ALIVE_S + round_trip_s < SERVER_KEEP_ALIVE_S
    assert client_limits().keepalive_expiry == CLIENT_KEEP_ALIVE_S


def test_a_request_path_made_of_something_else_than_names_is_never_sent() -> None:
    # httpx resolves dot segments: `fogshift stop 'x/../case2'` stopped case2 and printed
    # "stopped x/../case2" (the service's own name checks never saw the name).
    from fogshift.common.exceptions import InvalidName
    from tests.orchestrator.standin import standins

    with standins("orchestrator") as services:
        client = ServiceClient(services["orchestrator"].url, "t" * 32, "the orchestrator")
        for path in ("/pipelines/x/../case2/stop", "/pipelines/./stop", "/pipelines//stop",
                     "/pipelines/a#/stop", "/pipelines/a?b=1/stop", "/pipelines/a\\b"):  # fmt: skip
            with pytest.raises(InvalidName) as refused:
                client.post(path)
            assert refused.value.hint and repr(path) in refused.value.message
        assert services["orchestrator"].calls == []
        client.post("/pipelines/case2/stop")  # names only: sent
        assert [c.path for c in services["orchestrator"].calls] == ["/pipelines/case2/stop"]


def test_an_orchestrator_that_cannot_be_reached_is_not_sent_to_fogshift_nodes() -> None:
    # `fogshift nodes` asks the orchestrator: its hint sent the user to a command that
    # failed the same way.
    from fogshift.broker.server import free_port

    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nobody listens there
    for name, hint in (
        ("the orchestrator", "is the cluster up? `fogshift up` starts what is not running"),
        ("node agent 'fog-a'", "is it running? `fogshift nodes` shows the node agents"),
    ):
        with ServiceClient(url, "t" * 16, name, 5) as client, pytest.raises(Unavailable) as away:
            client.request("GET", "/health")
        assert (away.value.hint or "").startswith(hint)


def test_a_request_to_a_service_gone_silent_is_given_up_before_its_timeout() -> None:
    """A stopped process (SIGSTOP) keeps its listening socket: the connection is made and
    the request waits for an answer that never comes. A migration onto such a node waited
    the client's whole timeout (120 s) per call before its rollback."""
    stopped = socket.socket()
    stopped.bind(("127.0.0.1", 0))
    stopped.listen(8)  # (never accepted: the kernel completes the connection, nobody reads)
    gone = threading.Event()
    url = f"http://127.0.0.1:{stopped.getsockname()[1]}"
    reason = "node 'fog-a' has sent no heartbeat for 21 s"
    client = ServiceClient(url, "t" * 16, "node agent 'fog-a'", 60,
                           silent=lambda: reason if gone.is_set() else None)  # fmt: skip
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            client.post("/pipelines/p/elements/e/pause")
        except BaseException as exc:
            outcome.append(exc)

    asking = threading.Thread(target=ask)
    started = time.monotonic()
    asking.start()
    asking.join(1.5)
    assert asking.is_alive()  # (waits while the node is not called silent)
    gone.set()
    asking.join(30)
    try:
        assert not asking.is_alive() and time.monotonic() - started < 30
        (error,) = outcome
        assert isinstance(error, NoAnswer)
        assert "stopped answering POST /pipelines/p/elements/e/pause" in error.message
        assert error.service == "node agent 'fog-a'"
        assert reason in error.message
    finally:
        client.close()
        stopped.close()


def test_tokens_name_their_node_and_generation_and_each_generation_differs() -> None:
    operator = "operator-secret"
    first, third = node_token(operator, "fog-a"), node_token(operator, "fog-a", 2)
    assert first.startswith("fsnode.fog-a.") and first.count(".") == 2  # (as before)
    assert third.startswith("fsnode.fog-a.2.") and third.count(".") == 3
    assert token_node(first) == ("fog-a", 0) and token_node(third) == ("fog-a", 2)
    # Every generation signs anew: its mac is not an earlier one's with a number added.
    macs = {node_token(operator, "fog-a", g).rpartition(".")[2] for g in range(4)}
    assert len(macs) == 4
    # A generation written into an earlier token does not make it the later one's.
    assert first.replace("fsnode.fog-a.", "fsnode.fog-a.2.") != third
    reader = blob_token(third, "fog-b", 1)
    assert reader.startswith("fsblob.fog-b.1.") and blob_reader(reader) == ("fog-b", 1)
    assert blob_token(third, "fog-b") != reader and blob_reader(blob_token(third, "fog-b")) == (
        "fog-b",
        0,
    )
    zeros = "0" * 64
    for shape in (f"fsnode.fog-a.0.{zeros}", f"fsnode.fog-a.01.{zeros}",
                  f"fsnode.fog-a.x.{zeros}", f"fsnode.fog.a.{zeros}", "fsnode.fog-a"):  # fmt: skip
        assert token_node(shape) is None, shape  # (generation 0 is written without a number)
    with pytest.raises(ValueError, match="never negative"):
        node_token(operator, "fog-a", -1)


def test_a_service_that_takes_a_request_and_never_answers_is_said_to_be_frozen() -> None:
    # A frozen orchestrator (SIGSTOP) still accepts connections (the kernel does): "cannot
    # be reached ... is the cluster up?" sent `fogshift up` looking for what was not running.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = ServiceClient(f"http://127.0.0.1:{port}", "t" * 16, "the orchestrator", 0.5)
        try:
            with pytest.raises(NoAnswer) as silent:
                client.get("/nodes")
        finally:
            client.close()
    assert "took the request and did not answer in time (ReadTimeout)" in silent.value.message
    assert "frozen" in (silent.value.hint or "") and "is the cluster up" not in (
        silent.value.hint or ""
    )


def test_no_answer_travels_as_its_own_code_apart_from_a_refusal() -> None:
    # A client tells "may still be under way" from "cannot be reached, nothing started".
    for sent, kind in ((NoAnswer("agent took it, no answer"), NoAnswer),
                       (Unavailable("node 'fog-b' is not healthy"), Unavailable)):  # fmt: skip
        body = error_body(sent)
        response = httpx.Response(sent.http_status, json=body)
        with pytest.raises(Unavailable) as got:
            raise_for_error(response, "the orchestrator")
        assert type(got.value) is kind and got.value.code == body["code"]
        # Passed on in an answer: not the answering service's own silence.
        assert getattr(got.value, "service", None) is None
    assert error_body(NoAnswer("x"))["code"] == "no_answer"
    assert error_body(Unavailable("x"))["code"] == "unavailable"


def test_a_proxy_in_the_environment_is_not_taken_for_the_clusters_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Set where the machine reaches PyPI through a proxy: every call to a node, the
    # orchestrator or the broker's peers went to the proxy (a socks5:// one raised at once).
    from fogshift.common.http import ServiceClient
    from tests.orchestrator.standin import standins

    for variable in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")  # (nothing listens there)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with standins("fog-b") as agents:
        agents["fog-b"].answer("GET", "/health", body={"node": "fog-b"})
        with ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b", 10) as client:
            assert client.get("/health") == {"node": "fog-b"}
