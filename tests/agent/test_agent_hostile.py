"""Hostile requests to a node agent: names that try to leave the PE's folders, tokens that
open more than they should, checkpoint sources that would receive a token.

The agent's real FastAPI app, without Spark (its lifespan does not run): in process through
FastAPI's TestClient, and through a real uvicorn server where the path must reach the agent
byte for byte (an HTTP client normalises a literal ``..`` away before sending).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fogshift.agent.app import REMOVED_NODES_FILE, create_app, heartbeat_loop
from fogshift.agent.config import AgentConfig
from fogshift.agent.replicas import Replicas
from fogshift.common.http import blob_token, node_token
from fogshift.common.waiting import wait_until

OPERATOR = "operator-token-" + "o" * 32
SECRET = "broker-password-s3cr3t"
SNAPSHOT = "b000000000001"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A cluster home: the broker's password file, two nodes' folders, one PE's snapshot."""
    (tmp_path / "broker.json").write_text(json.dumps({"url": "nats://x", "password": SECRET}))
    node = tmp_path / "nodes" / "fog-a"
    snap = node / "node-checkpoints" / "p" / "agg" / SNAPSHOT
    (snap / "offsets").mkdir(parents=True)
    (snap / "offsets" / "0").write_text("offset zero")
    (node / "checkpoints" / "p" / "agg").mkdir(parents=True)
    (node / "checkpoints" / "p" / "agg" / "metadata").write_text("{}")
    sentinel = tmp_path / "nodes" / "fog-b" / "checkpoints" / "q" / "x"
    sentinel.mkdir(parents=True)
    (sentinel / "keep").write_text("must survive")
    (tmp_path / "nodes" / "fog-b" / "token").write_text(SECRET)  # another node's secret
    return tmp_path


def config(
    home: Path,
    orchestrator_url: str = "http://127.0.0.1:9",
    host: str = "127.0.0.1",
    advertise_url: str | None = None,
) -> AgentConfig:
    return AgentConfig(
        name="fog-a",
        host=host,
        advertise_url=advertise_url,
        port=1,
        home=home / "nodes" / "fog-a",
        token=node_token(OPERATOR, "fog-a"),
        orchestrator_url=orchestrator_url,
        broker_file=home / "broker.json",
    )


def client(app: FastAPI, token: str) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


def intact(home: Path) -> bool:
    """Nothing outside the PE's folders was deleted."""
    return (
        (home / "broker.json").read_text().count(SECRET) == 1
        and (home / "nodes" / "fog-b" / "token").read_text() == SECRET
        and (home / "nodes" / "fog-b" / "checkpoints" / "q" / "x" / "keep").exists()
        and (home / "nodes" / "fog-a" / "node-checkpoints" / "p" / "agg" / SNAPSHOT).is_dir()
    )


#: Reads that reach a secret when names are not checked (another node's token two levels
#: up, the broker's password file three levels up, any absolute path), and reads that are
#: merely malformed; ``422`` where the route matches and the name is refused, ``404`` where
#: an encoded separator makes the path match no route at all.
HOSTILE_READS = [
    ("/pipelines/%2e%2e/elements/%2e%2e/snapshots/%2e%2e/files/fog-b/token", 422),
    ("/pipelines/%2e%2e/elements/%2e%2e/snapshots/%2e%2e/files/..%2Fbroker.json", 422),
    ("/pipelines/%2E%2E/elements/%2E%2E/snapshots/%2E%2E/files/fog-b/token", 422),
    (f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/..%2F..%2F..%2F..%2F..%2Fbroker.json",
     422),
    (f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/offsets/%2e%2e/%2e%2e/%2e%2e/%2e%2e/"
     "%2e%2e/%2e%2e/broker.json", 422),
    (f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/%2F{{home}}/broker.json", 422),
    (f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/..%5C..%5Cbroker.json", 422),
    (f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/offsets%00", 422),
    ("/pipelines/%2e%2e/elements/%2e%2e/progress", 422),
    ("/pipelines/%2e%2e/elements/%2e%2e/snapshots/latest", 422),
    (f"/pipelines/p%2F..%2F..%2F../elements/agg/snapshots/{SNAPSHOT}/files/broker.json", 404),
    ("/checkpoints/blobs/..%2F..%2F..%2F..%2Fbroker.json", 404),
    ("/checkpoints/blobs/%2e%2e", 422),
]  # fmt: skip

#: Deletes that remove the node's folders (``..`` twice is ``<home>/nodes``) when names are
#: not checked.
HOSTILE_DELETES = [
    ("/pipelines/%2e%2e/elements/%2e%2e?discard=true", 422),
    ("/pipelines/p/elements/%2e%2e?discard=true", 422),
    ("/pipelines/%2e%2e/elements/fog-b?discard=true", 422),
    ("/pipelines/%2e%2e%2F%2e%2e/elements/fog-b?discard=true", 404),
    ("/pipelines/%2Ftmp/elements/x?discard=true", 404),
    ("/pipelines/p%5C..%5C../elements/agg?discard=true", 422),
    ("/pipelines/%2e%2e", 422),
]


def test_a_missing_node_level_checkpoint_is_refused_with_what_was_asked(home: Path) -> None:
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    response = c.get("/pipelines/p/elements/other/snapshots/latest")
    assert response.status_code == 404
    body = response.json()
    assert (body["code"], body["received"]) == ("unknown_element", "p/other")
    assert body["expected"] and body["hint"]


def test_a_legitimate_snapshot_file_is_served(home: Path) -> None:
    # The control for the tests below: their 4xx is the validation, not a broken route.
    # (The client is not entered as a context: that would run the lifespan, i.e. Spark.)
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    response = c.get(f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/offsets/0")
    assert response.status_code == 200 and response.text == "offset zero"


def test_a_snapshot_being_read_is_pinned_against_the_clean_up(home: Path) -> None:
    app = create_app(config(home))
    assert app.state.runtime.pins.held("p", "agg") == frozenset()
    c = client(app, node_token(OPERATOR, "fog-a"))
    assert c.get(f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/offsets/0").is_success
    assert app.state.runtime.pins.held("p", "agg") == {SNAPSHOT}


@pytest.mark.parametrize(("path", "status"), HOSTILE_READS)
def test_hostile_names_read_nothing(home: Path, path: str, status: int) -> None:
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    response = c.get(path.replace("{home}", quote(str(home).lstrip("/"), safe="")))
    assert response.status_code == status, response.text
    assert SECRET not in response.text
    assert intact(home)


@pytest.mark.parametrize(("path", "status"), HOSTILE_DELETES)
def test_hostile_names_delete_nothing(home: Path, path: str, status: int) -> None:
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    response = c.delete(path)
    assert response.status_code == status, response.text
    assert intact(home)
    assert (home / "nodes" / "fog-a" / "checkpoints" / "p" / "agg" / "metadata").exists()


def test_a_name_error_says_what_was_expected(home: Path) -> None:
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    body = c.delete("/pipelines/%2e%2e/elements/%2e%2e?discard=true").json()
    assert body["code"] == "invalid_name"
    assert "letters, digits" in body["expected"] and body["received"] == "'..'"
    assert body["hint"]


def test_a_symbolic_link_out_of_a_snapshot_is_not_followed(home: Path) -> None:
    snap = home / "nodes" / "fog-a" / "node-checkpoints" / "p" / "agg" / SNAPSHOT
    (snap / "offsets" / "1").symlink_to(home / "broker.json")
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    response = c.get(f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/offsets/1")
    assert response.status_code == 422 and response.json()["code"] == "path_escape"
    assert SECRET not in response.text


@contextmanager
def serve(app: FastAPI) -> Iterator[int]:
    """``app`` on a real uvicorn server (no lifespan: no Spark); yields its port."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def raw(port: int, method: str, path: str, token: str) -> tuple[int, str]:
    """Send ``path`` exactly as given (``..`` included), as curl --path-as-is would."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def test_literal_dot_dot_reaches_the_agent_and_is_refused(home: Path) -> None:
    token = node_token(OPERATOR, "fog-a")
    with serve(create_app(config(home))) as port:
        status, _ = raw(port, "GET", f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/"
                        "offsets/0", token)  # fmt: skip
        assert status == 200  # the control: the same server serves a legitimate file
        attacks = [
            ("GET", "/pipelines/../elements/../snapshots/../files/fog-b/token"),
            ("GET", "/pipelines/../elements/../snapshots/../files/../broker.json"),
            ("GET", f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/../../../../../x"),
            ("GET", f"/pipelines/p/elements/agg/snapshots/{SNAPSHOT}/files/{'../' * 5}broker.json"),
            ("GET", "/pipelines/p/elements/agg/snapshots/../files/../../broker.json"),
            ("DELETE", "/pipelines/../elements/..?discard=true"),
            ("DELETE", "/pipelines/p/elements/..?discard=true"),
            ("DELETE", "/pipelines/.."),
        ]
        for method, path in attacks:
            status, body = raw(port, method, path, token)
            assert 400 <= status < 500, (method, path, status, body)
            assert SECRET not in body
    assert intact(home)
    assert (home / "nodes" / "fog-a" / "checkpoints" / "p" / "agg" / "metadata").exists()


# -- tokens -------------------------------------------------------------------------------


def test_the_agent_accepts_its_node_token_and_the_operator_token_only(home: Path) -> None:
    app = create_app(config(home))
    assert client(app, node_token(OPERATOR, "fog-a")).get("/elements").status_code == 200
    assert client(app, OPERATOR).get("/elements").status_code == 200
    assert client(app, node_token(OPERATOR, "fog-b")).get("/elements").status_code == 401
    assert client(app, "fsnode.fog-a." + "0" * 64).get("/elements").status_code == 401
    assert TestClient(app).get("/elements").status_code == 401


def test_the_blob_token_reads_blobs_and_nothing_else(home: Path) -> None:
    app = create_app(config(home))
    blobs = client(app, blob_token(node_token(OPERATOR, "fog-a"), "fog-b"))
    data = b"replica bytes"
    sha = hashlib.sha256(data).hexdigest()
    (home / "nodes" / "fog-a" / "replicas" / "blobs" / sha).write_bytes(data)
    assert blobs.get(f"/checkpoints/blobs/{sha}").content == data
    # And its chunks and a range of it (a node copying it that holds most of it).
    assert blobs.get(f"/checkpoints/blobs/{sha}/chunks").json()["size"] == len(data)
    assert blobs.get(f"/checkpoints/blobs/{sha}?offset=8&length=5").content == b"bytes"
    assert blobs.get("/elements").status_code == 403
    assert blobs.get("/elements").json()["received"] == (
        "GET /elements with node 'fog-b''s blob token"
    )
    assert blobs.delete("/pipelines/p/elements/agg?discard=true").status_code == 403
    assert (home / "nodes" / "fog-a" / "checkpoints" / "p" / "agg" / "metadata").exists()
    # A blob token made with another node's token, or naming another reader, opens nothing.
    other = client(app, blob_token(node_token(OPERATOR, "fog-c"), "fog-b"))
    assert other.get(f"/checkpoints/blobs/{sha}").status_code == 401
    forged = blob_token(node_token(OPERATOR, "fog-a"), "fog-b").replace("fog-b", "fog-c")
    assert client(app, forged).get(f"/checkpoints/blobs/{sha}").status_code == 401


def test_a_removed_nodes_blob_token_is_refused_once_a_heartbeat_says_so(home: Path) -> None:
    data = b"replica bytes"
    sha = hashlib.sha256(data).hexdigest()
    removed = json.dumps({"ok": True, "removed": ["fog-b"]}).encode()
    with recorder({"/nodes/fog-a/heartbeat": (200, removed)}) as orchestrator:
        cfg = config(home, orchestrator.url)
        app = create_app(cfg)
        (home / "nodes" / "fog-a" / "replicas" / "blobs" / sha).write_bytes(data)
        fog_b = client(app, blob_token(cfg.token, "fog-b"))
        fog_c = client(app, blob_token(cfg.token, "fog-c"))
        assert fog_b.get(f"/checkpoints/blobs/{sha}").content == data
        # The agent's own heartbeat loop, against an orchestrator whose answer says fog-b
        # was removed from the cluster.
        stop = threading.Event()
        runtime = app.state.runtime
        beat = threading.Thread(
            target=heartbeat_loop, args=(cfg, runtime, Replicas(cfg, runtime), stop,
                                         app.state.removed), daemon=True,
        )  # fmt: skip
        beat.start()
        try:
            wait_until(lambda: "fog-b" in app.state.removed, 30, describe="fog-b refused")
        finally:
            stop.set()
            beat.join(30)
        assert [p for p, _ in orchestrator.seen] == ["/nodes/fog-a/heartbeat"] * len(
            orchestrator.seen
        )
    refused = fog_b.get(f"/checkpoints/blobs/{sha}")
    assert refused.status_code == 403, refused.text
    assert "node 'fog-b' was removed from the cluster" in refused.json()["message"]
    assert refused.json()["received"] == "the blob token of removed node 'fog-b'"
    assert refused.json()["expected"]
    assert fog_c.get(f"/checkpoints/blobs/{sha}").content == data  # the others read on
    # A token naming the removed reader but not made with this node's token: not its own.
    forged = blob_token(node_token(OPERATOR, "fog-c"), "fog-b")
    assert client(app, forged).get(f"/checkpoints/blobs/{sha}").status_code == 401
    # Kept in the node's folder (0600): the agent started again refuses fog-b from its
    # first request, before any heartbeat (`up` starts the agents before the orchestrator).
    kept = home / "nodes" / "fog-a" / REMOVED_NODES_FILE
    assert json.loads(kept.read_text()) == {"removed": ["fog-b"], "generations": {}}
    assert kept.stat().st_mode & 0o777 == 0o600

    def read_as(app_: FastAPI, reader: str, generation: int = 0) -> Any:
        """A blob read of ``app_`` with ``reader``'s blob token of ``generation``."""
        return client(app_, blob_token(cfg.token, reader, generation)).get(
            f"/checkpoints/blobs/{sha}"
        )

    again = create_app(cfg)
    assert read_as(again, "fog-b").status_code == 403
    assert read_as(again, "fog-c").content == data
    # Added again (the orchestrator's answers stop naming it and give its generation): the
    # token of its new generation opens blobs, the one the removed machine held does not,
    # and the kept file says so.
    app.state.removed.update([], {"fog-b": 1})
    assert read_as(app, "fog-b", 1).content == data
    stale = read_as(app, "fog-b")
    assert stale.status_code == 403, stale.text
    assert (
        "of node 'fog-b' in its generation 0, and the node is in its generation 1"
        in (stale.json()["message"])
    )
    assert read_as(app, "fog-c").content == data
    assert json.loads(kept.read_text()) == {"removed": [], "generations": {"fog-b": 1}}
    assert read_as(create_app(cfg), "fog-b").status_code == 403  # (kept: refused at once)
    # An older agent's file (the removed names only) is read too.
    kept.write_text(json.dumps(["fog-c"]))
    older = create_app(cfg)
    assert read_as(older, "fog-c").status_code == 403
    assert read_as(older, "fog-b").content == data


def test_a_node_in_a_later_generation_knows_the_operator_token_and_not_its_old_token(
    home: Path,
) -> None:
    # fog-a removed and added again twice: its token is of generation 2.
    cfg = config(home).model_copy(update={"token": node_token(OPERATOR, "fog-a", 2)})
    app = create_app(cfg)
    assert client(app, OPERATOR).get("/elements").status_code == 200
    assert client(app, cfg.token).get("/elements").status_code == 200
    for earlier in (0, 1):
        assert (
            client(app, node_token(OPERATOR, "fog-a", earlier)).get("/elements").status_code == 401
        )


# -- checkpoint sources -------------------------------------------------------------------


class Recorder(BaseHTTPRequestHandler):
    """A stand-in HTTP service that records every request (path, Authorization)."""

    seen: list[tuple[str, str]]
    answers: dict[str, tuple[int, bytes]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization", "")))
        status, body = self.answers.get(self.path, (404, b'{"code": "not_found"}'))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def recorder(answers: dict[str, tuple[int, bytes]] | None = None) -> Iterator[Any]:
    seen: list[tuple[str, str]] = []
    answers = {} if answers is None else answers
    handler = type("R", (Recorder,), {"seen": seen, "answers": answers})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.seen = seen  # type: ignore[attr-defined]
    server.answers = answers  # type: ignore[attr-defined]
    server.url = f"http://127.0.0.1:{server.server_port}"  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def manifest(files: dict[str, bytes]) -> dict[str, Any]:
    return {
        "id": SNAPSHOT, "pipeline": "p", "element": "agg", "batch": 1, "created": time.time(),
        "bytes": sum(map(len, files.values())),
        "files": {rel: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                  for rel, d in files.items()},
    }  # fmt: skip


def test_an_unknown_source_gets_no_request_and_no_token(home: Path) -> None:
    data = b"offset zero"
    m = manifest({"offsets/0": data})
    with recorder() as attacker, recorder() as peer:
        directory = {"nodes": [{"name": "fog-b", "url": peer.url, "blob_token": "fsblob.peer"}]}
        answers = {"/nodes/fog-a/directory": (200, json.dumps(directory).encode())}
        with recorder(answers) as orchestrator:
            c = client(create_app(config(home, orchestrator.url)), node_token(OPERATOR, "fog-a"))
            for path in ("/replicas/p/agg", "/pipelines/p/elements/agg/checkpoint/install"):
                response = c.post(path, json={"manifest": m, "source": attacker.url})
                assert response.status_code == 422, response.text
                assert response.json()["code"] == "unknown_source"
                assert peer.url in response.json()["expected"]
            assert attacker.seen == []
            # The agent asked only its own orchestrator, with its own token.
            assert {a for _, a in orchestrator.seen} == {f"Bearer {node_token(OPERATOR, 'fog-a')}"}
            # A listed node gets that node's blob token, never this node's own token.
            peer.answers[f"/checkpoints/blobs/{hashlib.sha256(data).hexdigest()}"] = (200, data)
            response = c.post("/replicas/p/agg", json={"manifest": m, "source": peer.url + "/"})
            assert response.status_code == 200, response.text
            assert response.json() == {"fetched_bytes": len(data)}
            assert [a for _, a in peer.seen] == ["Bearer fsblob.peer"]
    assert attacker.seen == []


@pytest.mark.parametrize(
    ("host", "advertised"),
    [("10.197.0.2", "http://127.0.0.1:41000"), ("0.0.0.0", "http://192.0.2.7:8101")],
)
def test_a_peer_on_the_hosts_loopback_gets_nothing_from_a_node_in_a_namespace(
    home: Path, host: str, advertised: str
) -> None:
    # Under `up --isolate` a node listens on its namespace's address, and its peers
    # advertise the host's loopback (their relays' ports): asked for one's copy, it
    # connected to its own loopback — the fetch failed, and the peer's blob token went to
    # whatever listened on that port in its namespace.
    data = b"offset zero"
    m = manifest({"offsets/0": data})
    with recorder() as peer:
        peer.answers[f"/checkpoints/blobs/{hashlib.sha256(data).hexdigest()}"] = (200, data)
        directory = {"nodes": [{"name": "fog-b", "url": peer.url, "blob_token": "fsblob.peer"}]}
        answers = {"/nodes/fog-a/directory": (200, json.dumps(directory).encode())}
        with recorder(answers) as orchestrator:
            # (As `up --isolate` starts a node: on its namespace's address, advertised at
            # its relay's port on the host's loopback; or on another machine.)
            app = create_app(config(home, orchestrator.url, host=host, advertise_url=advertised))
            c = client(app, node_token(OPERATOR, "fog-a"))
            response = c.post("/replicas/p/agg", json={"manifest": m, "source": peer.url})
            assert response.status_code == 503, response.text
            assert "that names the host's loopback" in response.json()["message"]
            assert peer.seen == []
            # From the central store, as ever.
            orchestrator.answers[f"/checkpoints/blobs/{hashlib.sha256(data).hexdigest()}"] = (
                200, data)  # fmt: skip
            response = c.post("/replicas/p/agg", json={"manifest": m})
            assert response.status_code == 200, response.text


def test_a_source_that_is_not_a_url_is_refused(home: Path) -> None:
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    m = manifest({"offsets/0": b"x"})
    for source in ("file:///etc/passwd", "http://a b", "gopher://x", ""):
        response = c.post("/replicas/p/agg", json={"manifest": m, "source": source})
        assert response.status_code == 422, (source, response.text)


@pytest.mark.parametrize(
    "bad",
    [
        {"files": {"../x": None}},
        {"files": {"/abs/x": None}},
        {"files": {"a\\..\\..\\x": None}},
        {"files": {"offsets/../../../../x": None}},
        {"id": "../../../x"},
        {"pipeline": ".."},
        {"element": "../../fog-b"},
    ],
)
def test_a_manifest_naming_paths_outside_is_refused_before_any_fetch(
    home: Path, bad: dict[str, Any]
) -> None:
    data = b"payload"
    m = manifest({"offsets/0": data})
    if "files" in bad:
        rel = next(iter(bad["files"]))
        m["files"] = {rel: m["files"]["offsets/0"]}
    else:
        m.update(bad)
    with recorder() as orchestrator:
        c = client(create_app(config(home, orchestrator.url)), node_token(OPERATOR, "fog-a"))
        for path in ("/replicas/p/agg", "/pipelines/p/elements/agg/checkpoint/install"):
            response = c.post(path, json={"manifest": m})
            assert response.status_code == 422, response.text
        assert orchestrator.seen == []  # nothing fetched
    written = [p for p in home.rglob("*") if p.is_file() and p.read_bytes() == data]
    assert written == []
    assert not (home / "x").exists() and not (home / "nodes" / "x").exists()
    assert intact(home)


def test_a_manifest_missing_fields_or_naming_a_file_as_a_folder_is_a_422(home: Path) -> None:
    # (A 500 before: the shape was checked only after the names; the second was stored, and
    # every install of it failed writing the file out.)
    data = b"payload"
    unwhole = manifest({"offsets/0": data})
    del unwhole["created"], unwhole["batch"]
    both = manifest({"offsets/0": data, "offsets/0/x": data})
    with recorder() as orchestrator:
        c = client(create_app(config(home, orchestrator.url)), node_token(OPERATOR, "fog-a"))
        response = c.post("/replicas/p/agg", json={"manifest": unwhole})
        assert response.status_code == 422, response.text
        assert "is not whole" in response.json()["message"]
        for path in ("/replicas/p/agg", "/pipelines/p/elements/agg/checkpoint/install"):
            response = c.post(path, json={"manifest": both})
            assert response.status_code == 422, response.text
            assert "as a file and a folder" in response.json()["message"]
        assert orchestrator.seen == []  # nothing fetched


def test_a_shipped_archive_with_members_outside_writes_nothing_there(home: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("offsets/0", "../../../../planted", "/tmp/fogshift-planted"):
            info = tarfile.TarInfo(name)
            info.size = len(b"planted")
            tar.addfile(info, io.BytesIO(b"planted"))
    data = buffer.getvalue()
    c = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    response = c.put(
        "/pipelines/p/elements/agg/checkpoint",
        content=data,
        headers={"X-Fogshift-Sha256": hashlib.sha256(data).hexdigest()},
    )
    assert not response.is_success
    assert response.json()["code"] == "torn_checkpoint"
    assert not (home / "planted").exists() and not (home / "nodes" / "planted").exists()
    assert not Path("/tmp/fogshift-planted").exists()
    assert intact(home)


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1", "1e9"])
def test_a_pause_that_would_never_wait_or_never_end_is_refused(home: Path, timeout: str) -> None:
    # A NaN gave up at once; an inf held one of the agent's worker threads for good.
    app = create_app(config(home))
    answer = client(app, OPERATOR).post("/pipelines/p/elements/agg/pause",
                                        params={"timeout_s": timeout})  # fmt: skip
    assert answer.status_code == 422 and "timeout_s" in answer.json()["message"], answer.text


@pytest.mark.parametrize(
    "query",
    [{"wait_s": "nan"}, {"wait_s": "inf"}, {"wait_s": "-1"}, {"wait_s": "6"},
     {"wait_s": "1", "seen": "x", "state": "running"}, {"wait_s": "1", "state": "asleep"}],
)  # fmt: skip
def test_a_progress_wait_that_would_hold_a_worker_too_long_is_refused(
    home: Path, query: dict[str, str]
) -> None:
    # A long poll holds one of the agent's worker threads: bounded, and only with what the
    # caller saw in the agent's own terms.
    app = create_app(config(home))
    answer = client(app, OPERATOR).get("/pipelines/p/elements/agg/progress", params=query)
    assert answer.status_code == 422, answer.text
    assert any(name in answer.json()["message"] for name in query), answer.text


def test_a_pe_whose_input_file_is_not_on_this_node_is_refused_before_it_starts(
    home: Path,
) -> None:
    # `POST /pipelines` checks no file (the orchestrator's host is not the node's): the
    # source started, failed on the missing file and was started again, over and over.
    app = create_app(config(home))
    source = {"id": "src", "kind": "csv-source", "node": "fog-a",
              "options": {"path": str(home / "no-such.csv")}}  # fmt: skip
    answer = client(app, OPERATOR).put("/pipelines/p/elements/src",
                                       json={"element": source, "fresh": True})  # fmt: skip
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_spec", answer.text
    body = answer.json()
    assert "does not exist on node 'fog-a'" in body["message"] and "no-such.csv" in body["message"]
    assert body["received"] == "no such file" and "node 'fog-a'" in body["hint"]
    # A sink whose file would be a folder is refused there too.
    (home / "out").mkdir()
    sink = {"id": "sink", "kind": "csv-sink", "node": "fog-a", "inputs": ["src"],
            "options": {"path": str(home / "out")}}  # fmt: skip
    answer = client(app, OPERATOR).put("/pipelines/p/elements/sink",
                                       json={"element": sink, "fresh": True})  # fmt: skip
    assert answer.status_code == 422 and "cannot be written as a file" in answer.json()["message"]


def test_a_deploy_asks_the_node_to_check_its_files_before_anything_starts(home: Path) -> None:
    # What a PE's start refuses, asked of all the node's PEs before the deploy changes
    # anything (the orchestrator's `_check_on_nodes`): nothing is started or emptied by it.
    app = create_app(config(home))
    (home / "in.csv").write_text("timestamp,sensor,value\n")
    (home / "kept.csv").write_text("precious\n")
    source = {"id": "src", "kind": "csv-source", "node": "fog-a",
              "options": {"path": str(home / "in.csv")}}  # fmt: skip
    sink = {"id": "sink", "kind": "csv-sink", "node": "fog-a", "inputs": ["src"],
            "options": {"path": str(home / "kept.csv")}}  # fmt: skip
    fine = client(app, OPERATOR).post("/pipelines/p/check",
                                      json={"elements": [source, sink]})  # fmt: skip
    assert fine.status_code == 200 and fine.json() == {"node": "fog-a", "elements": ["src", "sink"]}
    gone = {**source, "options": {"path": str(home / "no-such.csv")}}
    refused = client(app, OPERATOR).post("/pipelines/p/check",
                                         json={"elements": [sink, gone]})  # fmt: skip
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_spec", refused.text
    assert "does not exist on node 'fog-a'" in refused.json()["message"]
    assert (home / "kept.csv").read_text() == "precious\n"
    assert client(app, OPERATOR).get("/elements").json() == []
    empty = client(app, OPERATOR).post("/pipelines/p/check", json={"elements": []})
    assert empty.status_code == 422, empty.text
    # A processor is imported and built with its options there: one that cannot be, refused.
    (home / "walk_pe.py").write_text(
        "from fogshift.runtime.api import Processor\n"
        "class Fine(Processor):\n    def process(self, event):\n        return event.body\n"
        "class Typo(Processor):\n    def proces(self, event):\n        return None\n"
    )

    def custom(cls: str) -> dict:
        return {"id": "pe", "kind": "custom", "node": "fog-a", "inputs": ["src"],
                "options": {"class": f"walk_pe:{cls}", "path": str(home)}}  # fmt: skip

    built = client(app, OPERATOR).post("/pipelines/p/check", json={"elements": [custom("Fine")]})
    assert built.status_code == 200, built.text
    for cls, says in (("Typo", "has no process() method"), ("Gone", "has no class 'Gone'")):
        refused = client(app, OPERATOR).post("/pipelines/p/check", json={"elements": [custom(cls)]})
        body = refused.json()
        assert refused.status_code == 422 and body["code"] == "cannot_build", refused.text
        assert body["message"].startswith("p/pe cannot be built on node 'fog-a': ")
        assert says in body["message"] and body["hint"], body
    assert client(app, OPERATOR).get("/elements").json() == []


def test_a_request_no_route_takes_is_answered_in_fogshifts_form(home: Path) -> None:
    # Starlette's bare {"detail": "Not Found"} left the CLI with "answered HTTP 404".
    app = create_app(config(home))
    missing = client(app, OPERATOR).get("/no/such/route")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found", missing.text
    assert "GET /no/such/route" in missing.json()["message"] and missing.json()["hint"]
    assert missing.json()["received"] == "GET /no/such/route" and missing.json()["expected"]
    wrong = client(app, OPERATOR).delete("/health")
    assert wrong.status_code == 405 and "DELETE /health" in wrong.json()["message"], wrong.text
    assert "GET" in wrong.headers["allow"]
    assert "GET" in wrong.json()["expected"] and wrong.json()["received"] == "DELETE"
    bad = client(app, OPERATOR).post("/pipelines/p/elements/agg/pause",
                                     params={"timeout_s": "soon"})  # fmt: skip
    assert bad.json()["expected"] and bad.json()["hint"], bad.text


def test_a_checkpoint_sent_without_its_digest_is_refused_as_the_callers_mistake(
    home: Path,
) -> None:
    # Answered 500 "changed in transit" (a torn copy, which a sender sends again) before.
    app = create_app(config(home))
    for headers in ({}, {"X-Fogshift-Sha256": "abc"}):
        answer = client(app, OPERATOR).put("/pipelines/p/elements/agg/checkpoint",
                                           content=b"archive", headers=headers)  # fmt: skip
        assert answer.status_code == 422 and answer.json()["code"] == "invalid", answer.text
        assert "sha256" in answer.json()["expected"] and answer.json()["hint"]
    assert intact(home)
