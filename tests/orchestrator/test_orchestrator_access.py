"""Who may call what on the orchestrator, and names in its URLs.

The orchestrator's real FastAPI app and registry, in process (FastAPI's TestClient, no
lifespan: no background loops); its broker is never reached by these requests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fogshift.agent.replicas import _BlobSource
from fogshift.checkpoint.central import CentralStore
from fogshift.common.http import blob_token, node_token
from fogshift.contracts import CheckpointManifest
from fogshift.orchestrator.app import MAX_BODY_BYTES
from fogshift.orchestrator.service import Orchestrator
from tests.checkpoint.test_central import manifest
from tests.checkpoint.test_chunks import sst, values
from tests.orchestrator.conftest import OPERATOR

SPEC = {
    "pipeline": "p",
    "elements": [
        {"id": "s", "kind": "csv-source", "node": "fog-a", "options": {"path": "in.csv"}},
        {"id": "k", "kind": "csv-sink", "node": "fog-a", "inputs": ["s"],
         "options": {"path": "out.csv"}},
    ],
}  # fmt: skip


def as_(app: FastAPI, token: str) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


def beat(url: str = "http://127.0.0.1:8700") -> dict[str, object]:
    return {"url": url, "pid": 1, "pgid": 1, "ready": True, "elements": [], "replicas": []}


def test_a_node_token_opens_its_heartbeat_and_nothing_of_the_operator(app: FastAPI) -> None:
    orchestrator: Orchestrator = app.state.orchestrator
    node = as_(app, node_token(OPERATOR, "fog-a"))
    assert node.post("/nodes/fog-a/heartbeat", json=beat()).status_code == 200
    assert orchestrator.registry.node("fog-a") is not None
    refused = [
        node.post("/pipelines", json=SPEC),
        node.post("/pipelines/p/elements/s/migrate", json={"target": "fog-a"}),
        node.post("/pipelines/p/elements/s/restore", json={}),
        node.post("/pipelines/p/stop"),
        node.post("/pipelines/p/start"),
        node.put("/topology", content="nodes: {}", headers={"Content-Type": "text/plain"}),
        node.get("/nodes"),
        node.get("/pipelines"),
        node.get("/plan"),
        # Another node's endpoints: a node cannot speak for another one.
        node.post("/nodes/fog-b/heartbeat", json=beat("http://evil.example:1")),
        node.get("/nodes/fog-b/directory"),
    ]
    for response in refused:
        assert response.status_code == 403, (response.request.url, response.text)
        assert response.json()["code"] == "forbidden"
        # (What was expected and what was received, as every refusal says.)
        assert response.json()["expected"] == "the operator token", response.text
        assert response.json()["received"] == "node 'fog-a''s token", response.text
    assert orchestrator.registry.pipelines() == []
    assert orchestrator.registry.node("fog-b") is None
    # The same requests with the operator token pass the token check.
    operator = as_(app, OPERATOR)
    assert operator.get("/nodes").status_code == 200
    assert operator.post("/nodes/fog-b/heartbeat", json=beat()).status_code == 200


def test_a_body_over_the_bound_or_of_no_stated_length_is_not_read(app: FastAPI) -> None:
    # A node's token let it post a heartbeat of any size, which the server held in memory
    # whole before its route saw it.
    node = as_(app, node_token(OPERATOR, "fog-a"))
    big = b'{"url": "http://127.0.0.1:8700", "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    response = node.post("/nodes/fog-a/heartbeat", content=big,
                         headers={"Content-Type": "application/json"})  # fmt: skip
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["code"] == "invalid" and body["expected"] == f"at most {MAX_BODY_BYTES:,} bytes"
    assert body["received"] == f"{len(big):,} bytes" and body["hint"]

    def chunks() -> Iterator[bytes]:
        yield json.dumps(beat()).encode()

    response = node.post("/nodes/fog-a/heartbeat", content=chunks(),
                         headers={"Content-Type": "application/json"})  # fmt: skip
    assert response.status_code == 411, response.text
    assert response.json()["received"] == "Transfer-Encoding: chunked"
    # Also beside a small stated length: the server reads the chunks, whatever their size,
    # and ignores the length.
    response = node.post("/nodes/fog-a/heartbeat", content=json.dumps(beat()).encode(),
                         headers={"Content-Type": "application/json",
                                  "Transfer-Encoding": "chunked"})  # fmt: skip
    assert response.status_code == 411, response.text
    assert app.state.orchestrator.registry.node("fog-a") is None
    # The token is judged first: a stranger learns nothing of the bound.
    assert TestClient(app).post("/nodes/fog-a/heartbeat", content=big).status_code == 401
    assert node.post("/nodes/fog-a/heartbeat", json=beat()).status_code == 200  # within it


def test_wrong_and_forged_tokens_are_refused(app: FastAPI) -> None:
    forged = "fsnode.fog-a." + hashlib.sha256(b"guess").hexdigest()
    for token in ("", "nope", forged, node_token("another cluster's token", "fog-a")):
        response = as_(app, token).post("/nodes/fog-a/heartbeat", json=beat())
        assert response.status_code == 401, token
        # Said what to send and where the token is (not "the cluster file": it holds
        # the token's path only), with the scheme a 401 names.
        assert response.headers["WWW-Authenticate"] == "Bearer"
        body = response.json()
        assert body["received"] == ("a token this service does not know" if token
                                    else "no bearer token")  # fmt: skip
        assert "Authorization: Bearer" in body["expected"]
        assert "`token` in the cluster's home" in body["hint"]
        assert "nodes/NODE/token" in body["hint"]
    basic = TestClient(app).get("/nodes", headers={"Authorization": "Basic bm9wZQ=="})
    assert basic.status_code == 401 and basic.json()["received"] == "no bearer token"
    assert app.state.orchestrator.registry.node("fog-a") is None


def test_the_directory_gives_each_node_its_blob_token(app: FastAPI) -> None:
    operator = as_(app, OPERATOR)
    for name, port in (("fog-a", 1), ("fog-b", 2)):
        assert operator.post(f"/nodes/{name}/heartbeat", json=beat(f"http://h:{port}")).is_success
    response = as_(app, node_token(OPERATOR, "fog-a")).get("/nodes/fog-a/directory")
    assert response.status_code == 200
    nodes = {n["name"]: n for n in response.json()["nodes"]}
    assert nodes["fog-b"]["url"] == "http://h:2"
    # fog-b's blob token for fog-a: it names its reader, so fog-b can refuse fog-a alone.
    assert nodes["fog-b"]["blob_token"] == blob_token(node_token(OPERATOR, "fog-b"), "fog-a")
    assert nodes["fog-b"]["blob_token"].startswith("fsblob.fog-a.")
    theirs = as_(app, node_token(OPERATOR, "fog-b")).get("/nodes/fog-b/directory").json()
    assert {n["name"]: n["blob_token"] for n in theirs["nodes"]}["fog-a"] == blob_token(
        node_token(OPERATOR, "fog-a"), "fog-b"
    )
    # Neither the operator token nor a node token is handed out.
    assert OPERATOR not in response.text and node_token(OPERATOR, "fog-b") not in response.text


def test_a_node_token_reads_central_blobs(app: FastAPI) -> None:
    data = b"central blob"
    sha = hashlib.sha256(data).hexdigest()
    (app.state.orchestrator.central.blobs / sha).write_bytes(data)
    node = as_(app, node_token(OPERATOR, "fog-a"))
    assert node.get(f"/checkpoints/blobs/{sha}").content == data
    assert node.get("/checkpoints/blobs/%2e%2e").status_code == 422


def test_a_backup_node_copies_a_rewritten_blob_chunk_by_chunk(app: FastAPI, tmp_path: Path) -> None:
    central: CentralStore = app.state.orchestrator.central
    node = as_(app, node_token(OPERATOR, "fog-a"))
    replicas = CentralStore(tmp_path / "replicas", keep=2)  # the backup node's
    vals = values(8)
    sent: list[int] = []
    for batch, counts in enumerate(([1] * 6, [2, 3, 4, 5, 6, 7])):  # compacted: counts new
        files = {f"state/0/0/SSTs/{batch:06d}.sst": sst(vals, counts), f"offsets/{batch}": b"o"}
        m = manifest(batch, files)
        central.put(m, files.__getitem__)
        source = _BlobSource(node, CheckpointManifest.model_validate(m), "central", "fog-a")
        sent.append(replicas.put(m, source.file, source))
        copied, _ = replicas.latest_whole("p", "agg")
        replicas.materialize(copied, tmp_path / f"copy{batch}")
        for rel, data in files.items():
            assert (tmp_path / f"copy{batch}" / rel).read_bytes() == data
    whole = len(sst(vals, [1] * 6))
    assert sent[0] >= whole and 0 < sent[1] < whole / 4, (sent, whole)
    # A range is both bounds, within the blob; chunks of a blob not held are not found.
    sha = manifest(0, {"x": sst(vals, [1] * 6)})["files"]["x"]["sha256"]
    assert (
        node.get(f"/checkpoints/blobs/{sha}", params={"offset": 3, "length": 4}).content
        == (sst(vals, [1] * 6)[3:7])
    )
    refused = node.get(f"/checkpoints/blobs/{sha}", params={"offset": 3})
    assert refused.status_code == 422 and "offset and length together" in refused.text
    assert node.get(f"/checkpoints/blobs/{'0' * 64}/chunks").status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/pipelines/%2e%2e",
        "/pipelines/%2e%2e/errors",
        "/pipelines/a%5Cb",
        "/pipelines/a%00",
        "/pipelines/" + "x" * 64,
    ],
)
def test_hostile_names_in_operator_urls_are_refused(app: FastAPI, path: str) -> None:
    response = as_(app, OPERATOR).get(path)
    assert response.status_code == 422, response.text
    assert response.json()["expected"]


def test_a_heartbeat_needs_an_http_url_and_a_valid_node_name(app: FastAPI) -> None:
    operator = as_(app, OPERATOR)
    for url in ("file:///etc/passwd", "javascript:x", "http://a b", ""):
        assert operator.post("/nodes/fog-a/heartbeat", json=beat(url)).status_code == 422, url
    assert operator.post("/nodes/%2e%2e/heartbeat", json=beat()).status_code == 422
    assert app.state.orchestrator.registry.nodes() == []


def test_a_heartbeat_with_a_number_beyond_64_bits_is_a_422(app: FastAPI) -> None:
    # SQLite keeps 64-bit integers: a larger pid was a 500 (OverflowError).
    node = as_(app, node_token(OPERATOR, "fog-a"))
    for field in ("pid", "pgid", "disk_free_bytes"):
        answer = node.post("/nodes/fog-a/heartbeat", json={**beat(), field: 2**63})
        assert answer.status_code == 422, (field, answer.text)
    assert node.post("/nodes/fog-a/heartbeat", json=beat()).status_code == 200


def test_request_bodies_take_json_types_as_they_are(app: FastAPI) -> None:
    # A refusal review: {"partitions": true} was read as 1 and scaled the element in,
    # "no" as false; refusals showed Python's True and said pydantic's sentences.
    operator = as_(app, OPERATOR)
    scale = "/pipelines/p/elements/agg/scale"
    for body, field, sent in (
        ({"partitions": True}, "partitions", "true"),
        ({"partitions": "2"}, "partitions", '"2"'),
        ({"partitions": 2, "waves": "no"}, "waves", '"no"'),
    ):
        answer = operator.post(scale, json=body)
        assert answer.status_code == 422, answer.text
        refused = answer.json()
        assert f"body.{field}: should be " in refused["message"], refused
        assert refused["received"] == sent and refused["expected"] in (
            "a whole number", "true or false")  # fmt: skip
    keys = {"keys": ["a"], "target": "fog-a", "precopy": "yes"}
    assert operator.post("/pipelines/p/elements/agg/keys/migrate", json=keys).status_code == 422
    for seconds in ("true", "NaN"):
        answer = operator.put("/nodes/fog-a/leaving", content=f'{{"seconds": {seconds}}}',
                              headers={"Content-Type": "application/json"})  # fmt: skip
        assert answer.status_code == 422 and answer.json()["received"] == seconds, answer.text
    # A body sent without its type is shown as its text (not b'...' quoted again).
    answer = operator.post(scale, content='{"partitions": 2}')
    assert answer.json()["received"] == "a body without a Content-Type: '{\"partitions\": 2}'"
    assert answer.json()["hint"].startswith("send the body as JSON, with the header")
    # A body that is not JSON is said so (it was "body.1: JSON decode error").
    answer = operator.post(scale, content="{bad", headers={"Content-Type": "application/json"})
    assert answer.json()["message"] == f"bad request to {scale}: the body is not JSON"
    # A bad name in a list is named by its field, not by its index.
    answer = operator.post(scale, json={"partitions": 3, "nodes": ["fog b"]})
    assert answer.json()["expected"].startswith("nodes: 1 to 63 letters"), answer.json()


def test_an_unknown_node_is_guessed_as_elements_are(app: FastAPI) -> None:
    operator = as_(app, OPERATOR)
    answer = operator.put("/nodes/fog-a/leaving", json={"seconds": 5})
    assert answer.json()["expected"] == "one of (no node has registered)", answer.json()
    beat = {"url": "http://127.0.0.1:9", "ready": True, "elements": []}
    assert operator.post("/nodes/fog-b/heartbeat", json=beat).status_code == 200
    answer = operator.put("/nodes/FOG-B/leaving", json={"seconds": 5})
    assert answer.status_code == 404 and answer.json()["hint"] == "did you mean 'fog-b'?"
    answer = operator.put("/nodes/fgo-b/leaving", json={"seconds": 5})
    assert answer.json()["hint"] == "did you mean 'fog-b'?"
    answer = operator.put("/nodes/cloud/leaving", json={"seconds": 5})
    assert answer.json()["hint"] == "`fogshift nodes` lists the nodes"


def test_a_json_body_naming_a_key_twice_is_refused(app: FastAPI) -> None:
    # The last one was taken without a word: {"target": "fog-b", "target": "cloud"}
    # migrated to cloud; a spec naming `pipeline` twice deployed the second.
    operator = as_(app, OPERATOR)
    twice = '{"pipeline": "p", "pipeline": "q", "elements": []}'
    answer = operator.post("/pipelines", content=twice,
                           headers={"Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert answer.json()["received"] == "'pipeline' twice"
    nested = '{"target": "fog-b", "mode": {"a": 1, "a": 2}}'
    answer = operator.post("/pipelines/p/elements/s/migrate", content=nested,
                           headers={"Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 422 and answer.json()["received"] == "'a' twice"
    # Each once: on to the route (no such pipeline here).
    once = '{"target": "fog-b"}'
    answer = operator.post("/pipelines/p/elements/s/migrate", content=once,
                           headers={"Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 404, answer.text
    # Nested past what JSON reads: refused as before, not a 500.
    deep = '{"target": ' + "[" * 5_000 + "]" * 5_000 + "}"
    answer = operator.post("/pipelines/p/elements/s/migrate", content=deep,
                           headers={"Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 422, answer.text
