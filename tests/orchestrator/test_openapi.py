"""The orchestrator's OpenAPI schema: behind the token, and describing the real answers.

Every endpoint declares its contract (``fogshift.contracts``) as its response model, so the
schema a client reads (``GET /openapi.json``) is the API the CLI parses.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fogshift.broker.exceptions import BrokerError, BrokerUnavailable
from fogshift.common.http import node_token
from fogshift.contracts import Heartbeat, MigrationReport, NodeView, PipelineState, PipelineStatus
from fogshift.orchestrator import deployment
from fogshift.spec import parse_spec
from tests.orchestrator.conftest import OPERATOR
from tests.orchestrator.standin import SPEC, StandIn

#: A heartbeat's answer while no node was removed or added again.
QUIET_ANSWER = {"ok": True, "removed": [], "generations": {}}

#: ``(method, path)`` -> the contract its 200 answer is (``[...]``: a list of them).
ANSWERS = {
    ("get", "/health"): "OrchestratorHealth",
    ("post", "/nodes/{name}/heartbeat"): "HeartbeatAnswer",
    ("get", "/nodes/{name}/directory"): "NodeDirectory",
    ("post", "/nodes/{name}/admit"): "NodeAdmission",
    ("get", "/nodes"): "[NodeView]",
    ("post", "/pipelines"): "PipelineStatus",
    ("get", "/pipelines"): "[PipelineStatus]",
    ("get", "/pipelines/{name}"): "PipelineStatus",
    ("get", "/pipelines/{name}/errors"): "[DeadLetter]",
    ("get", "/pipelines/{name}/latency"): "[HopLatency]",
    ("get", "/pipelines/{name}/elements/{element}/events"): "EventPage",
    ("get", "/pipelines/{name}/elements/{element}/state"): "TwinState",
    ("post", "/pipelines/{name}/migrate"): "GroupMigrationReport",
    ("post", "/pipelines/{name}/elements/{element}/migrate"): "MigrationReport",
    ("post", "/pipelines/{name}/elements/{element}/restore"): "RestoreReport",
    ("get", "/pipelines/{name}/elements/{element}/operation"): "OperationView",
    ("get", "/plan"): "PlanView",
    ("put", "/topology"): "PlanView",
    ("post", "/pipelines/{name}/stop"): "StopResult",
    ("post", "/pipelines/{name}/start"): "PipelineStatus",
    ("delete", "/pipelines/{name}"): "DeleteResult",
}


def as_(app: FastAPI, token: str | None) -> TestClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(app, headers=headers)


def contract(schema: dict[str, Any]) -> str:
    """The model a response schema names: ``Model`` or ``[Model]``."""
    if schema.get("type") == "array":
        return f"[{contract(schema['items'])}]"
    return str(schema["$ref"]).rpartition("/")[2]


def test_the_schema_needs_the_operator_token(app: FastAPI) -> None:
    for path in ("/openapi.json",):
        assert as_(app, None).get(path).status_code == 401, path
        assert as_(app, "wrong-" + OPERATOR).get(path).status_code == 401, path
        # A node's token opens only its own endpoints.
        node = as_(app, node_token(OPERATOR, "fog-a")).get(path)
        assert node.status_code == 403 and node.json()["code"] == "forbidden", path
        assert as_(app, OPERATOR).get(path).status_code == 200, path
    # No /docs or /redoc: their pages load from a CDN and fetch the schema without a token.
    for page in ("/docs", "/redoc"):
        assert as_(app, OPERATOR).get(page).status_code == 404, page


def test_every_endpoint_answers_with_its_contract(app: FastAPI) -> None:
    schema = as_(app, OPERATOR).get("/openapi.json").json()
    found = {}
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
            if (method, path) in ANSWERS:
                found[(method, path)] = contract(ok)
    assert found == ANSWERS
    heartbeat = schema["paths"]["/nodes/{name}/heartbeat"]["post"]["requestBody"]
    assert contract(heartbeat["content"]["application/json"]["schema"]) == "Heartbeat"
    # Refusals are described too: expected / received / hint, a failed operation's report.
    migrate = schema["paths"]["/pipelines/{name}/elements/{element}/migrate"]["post"]
    for status in ("401", "404", "422", "502"):
        refusal = migrate["responses"][status]["content"]["application/json"]["schema"]
        assert contract(refusal) == "ErrorBody", status
    models = schema["components"]["schemas"]
    assert set(models["ErrorBody"]["properties"]) >= {"code", "expected", "received", "hint",
                                                     "report"}  # fmt: skip
    # The deploy's body is a pipeline spec, its models beside the API's (none shadowed).
    deploy = schema["paths"]["/pipelines"]["post"]["requestBody"]
    assert deploy["required"] is True
    assert contract(deploy["content"]["application/json"]["schema"]) == "PipelineSpec"
    from fogshift.spec.models import PipelineSpec

    spec = PipelineSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, model in {**spec.pop("$defs"), "PipelineSpec": spec}.items():
        assert models[name] == model, name
    # States are enums in the schema, with the strings the API has always used.
    assert set(models["PEState"]["enum"]) >= {"running", "paused", "failed", "fenced"}
    assert models["MigrationMode"]["enum"] == ["precopy", "literal", "handover"]


def test_a_heartbeat_comes_back_typed_in_the_node_view(app: FastAPI) -> None:
    beat = {"url": "http://127.0.0.1:8701", "pid": 7, "pgid": 7, "ready": True,
            "elements": [{"pipeline": "p", "element": "agg", "state": "paused", "epoch": 3}],
            "replicas": [{"pipeline": "p", "element": "src", "id": "b000000002", "batch": 2,
                          "created": 1.0}],
            "cpu_percent": 4.0}  # fmt: skip
    node = as_(app, node_token(OPERATOR, "fog-a"))
    assert node.post("/nodes/fog-a/heartbeat", json=beat).json() == QUIET_ANSWER
    refused = node.post("/nodes/fog-a/heartbeat", json={**beat, "elements": [{"id": "agg"}]})
    assert refused.status_code == 422 and refused.json()["code"] == "invalid"
    assert "elements.0.pipeline" in refused.json()["message"]
    (view,) = [NodeView.model_validate(n) for n in as_(app, OPERATOR).get("/nodes").json()]
    assert (view.name, view.healthy, view.elements, view.replicas) == (
        "fog-a", True, ["p/agg"], ["p/src@b000000002"],
    )  # fmt: skip
    assert [(c.element, c.epoch, c.node_level, c.central) for c in view.checkpoints] == [
        ("p/agg", 3, None, None)
    ]
    assert view.warnings == []


def test_a_heartbeat_naming_what_no_spec_can_have_does_not_break_the_node_view(
    app: FastAPI,
) -> None:
    # One node (buggy, or compromised: its own token) naming a PE "<b>../../x" made every
    # GET /nodes answer 422 from then on: fogshift nodes and the dashboard's pages with it.
    beat = {"url": "http://127.0.0.1:8701", "ready": True,
            "elements": [{"pipeline": "<b>../../x", "element": "e"},
                         {"pipeline": "p\n", "element": "e"},
                         {"pipeline": "p", "element": "agg"}],
            "replicas": [{"pipeline": "p", "element": "../y", "id": "b000000002", "batch": 2,
                          "created": 1.0}]}  # fmt: skip
    node = as_(app, node_token(OPERATOR, "fog-a"))
    assert node.post("/nodes/fog-a/heartbeat", json=beat).json() == QUIET_ANSWER
    answer = as_(app, OPERATOR).get("/nodes")
    assert answer.status_code == 200, answer.text
    (view,) = [NodeView.model_validate(n) for n in answer.json()]
    assert (view.elements, view.replicas) == (["p/agg"], [])


def test_dead_letters_are_asked_for_by_a_bounded_count_of_each_pes_newest(
    app: FastAPI, tmp_path: Path
) -> None:
    for limit in (0, -1, 10_001, "many"):
        answer = as_(app, OPERATOR).get("/pipelines/p/errors", params={"limit": limit})
        assert answer.status_code == 422 and "limit" in answer.text, (limit, answer.text)
    # Each PE's newest: 1,500 dead letters of the source's no longer hide the aggregate's
    # three, nor its newest behind its oldest. (The broker stood in for: its reads by PE.)
    orch = app.state.orchestrator
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
    stored = {"source": 1500, "aggregate": 3, "sink": 0}

    def dead(make: Any, timeout: float, **_: Any) -> list[Any]:
        pe = make.__defaults__[1]  # (Deployment.errors' read: dead(js, stream, pe))
        return [SimpleNamespace(data=json.dumps({"seq": n, "reason": "r", "body": "{}"}).encode())
                for n in range(stored[pe])]  # fmt: skip

    orch.broker.run = dead
    letters = as_(app, OPERATOR).get("/pipelines/p/errors", params={"limit": 1000}).json()
    assert [d["seq"] for d in letters if d["element"] == "source"] == list(range(500, 1500))
    assert [d["seq"] for d in letters if d["element"] == "aggregate"] == [0, 1, 2]
    # One PE's only: its stream alone read (the dashboard's PE page read them all).
    read: list[str] = []
    orch.broker.run = lambda make, timeout, **kw: (
        read.append(make.__defaults__[1]) or dead(make, timeout)
    )
    mine = as_(app, OPERATOR).get("/pipelines/p/errors", params={"element": "aggregate"})
    assert [(d["element"], d["seq"]) for d in mine.json()] == [("aggregate", n) for n in (0, 1, 2)]
    assert read == ["aggregate"]
    none = as_(app, OPERATOR).get("/pipelines/p/errors", params={"element": "nope"})
    assert none.status_code == 404 and "one of source, aggregate, sink" in none.text
    bad = as_(app, OPERATOR).get("/pipelines/p/errors", params={"element": "../x"})
    assert bad.status_code == 422


def test_a_node_whose_checkpoints_fail_or_stopped_is_flagged_in_the_node_view(
    app: FastAPI,
) -> None:
    beat = {"url": "http://127.0.0.1:8701", "ready": True, "checkpoint_interval_s": 2.0,
            "snapshots_age_s": 60.0, "disk_free_bytes": 7 * 2**30, "disk_total_bytes": 2**36,
            "elements": [{"pipeline": "p", "element": "agg", "state": "running",
                          "snapshot_error": "CheckpointError: no room"}]}  # fmt: skip
    node = as_(app, node_token(OPERATOR, "fog-a"))
    assert node.post("/nodes/fog-a/heartbeat", json=beat).json() == QUIET_ANSWER
    (view,) = [NodeView.model_validate(n) for n in as_(app, OPERATOR).get("/nodes").json()]
    assert view.healthy  # it works: flagged, not taken for lost (that would restore its PEs)
    assert (view.disk_free_bytes, view.disk_total_bytes) == (7 * 2**30, 2**36)
    assert view.disk_text == "7.0 of 64 GiB free"
    small = view.model_copy(
        update={"disk_free_bytes": 370 * 2**20, "disk_total_bytes": 400 * 2**20}
    )
    assert small.disk_text == "370 of 400 MiB free"  # (it read "0.4 of 0 GiB free")
    assert len(view.warnings) == 2
    assert view.warnings[0].startswith("node-level checkpoints stopped: the last round ended 6")
    assert view.warnings[1] == "node-level checkpoint of p/agg failed: CheckpointError: no room"


def test_the_orchestrator_tells_its_own_disk_nearly_full(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert as_(app, OPERATOR).get("/health").json()["warnings"] == []
    usage = shutil.disk_usage("/")
    low = usage._replace(free=usage.total // 100)  # 1 % free
    monkeypatch.setattr(deployment.shutil, "disk_usage", lambda path: low)
    (warning,) = as_(app, OPERATOR).get("/health").json()["warnings"]
    assert warning.startswith("disk nearly full: ") and warning.endswith(
        "(central checkpoints fail once it is full)"
    )


def test_the_orchestrator_tells_a_broker_store_that_failed(tmp_path: Path) -> None:
    # A probe filled the broker's disk: every PE failed at each restart, and nothing said
    # why but the broker's log.
    from fogshift.orchestrator.app import create_app
    from tests.orchestrator.standin import offline_config

    folder = tmp_path / "broker"
    folder.mkdir()
    (folder / "nats.conf").write_text("")
    log = folder / "nats.log"
    log.write_text("[1] [INF] Starting nats-server\n")
    app = create_app(offline_config(tmp_path, token=OPERATOR, broker_config=folder / "nats.conf"))
    try:
        assert as_(app, OPERATOR).get("/health").json()["warnings"] == []
        failed = "[1] [ERR] JetStream out of File resources, will be DISABLED"
        log.write_text(log.read_text() + failed + "\n")
        (warning,) = as_(app, OPERATOR).get("/health").json()["warnings"]
        assert warning.startswith("the broker failed to write its store and refuses every")
        assert failed in warning and "free space on its disk, then `fogshift up`" in warning
    finally:
        app.state.orchestrator.close()


def test_a_deploy_the_broker_fails_is_refused_and_left_failed_not_deploying(
    app: FastAPI, agents: dict[str, StandIn], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orch = app.state.orchestrator
    for name, agent in agents.items():
        beat = {"url": agent.url, "ready": True, "elements": []}
        assert as_(app, node_token(OPERATOR, name)).post(
            f"/nodes/{name}/heartbeat", json=beat
        ).json() == QUIET_ANSWER  # fmt: skip
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    spec = {
        **SPEC,
        "elements": [
            {**e, "options": {**e["options"], "path": str(tmp_path / p)}}
            for e, p in zip(SPEC["elements"], ("in.csv", "x", "o.csv"), strict=True)
        ],
    }
    spec["elements"][1]["options"] = SPEC["elements"][1]["options"]  # fmt: skip

    # A central checkpoint of a run before under the pipeline's name: a deploy afresh drops
    # it (its streams start over, and a restore from it would resume at positions gone).
    files = {"offsets/3000": b"o"}
    orch.central.put({"id": "b000000003000", "pipeline": "p", "element": "aggregate",
                      "batch": 3000, "files": {"offsets/3000": {
                          "sha256": hashlib.sha256(b"o").hexdigest(), "size": 1}}},
                     files.__getitem__)  # fmt: skip
    assert orch.central.newest("p", "aggregate") is not None

    withheld: list[set[str]] = []

    def refused(make: object, timeout: float = 30, **_: object) -> None:
        # (No sync, a round's included, gives a node rights to it while its streams are
        # made: the deploy withholds them.)
        withheld.append(set(orch.permissions._withheld))
        raise RuntimeError("stream limits exceeded")  # anything the broker may say

    # The run before's last migration, remembered: a fresh deploy forgets it (it showed as
    # the new run's outcome).
    orch.last_migration[("p", "aggregate")] = MigrationReport(
        pipeline="p", element="aggregate", origin="fog-a", target="fog-b", mode="precopy"
    )
    monkeypatch.setattr(orch.broker, "run", refused)
    # The nodes get their rights only once the streams are made and fenced (before, a node
    # that missed the last stop could append to a stream made anew ahead of its fence).
    synced: list[set[str]] = []
    monkeypatch.setattr(
        orch.permissions, "sync", lambda registry: synced.append(set(orch.permissions._withheld))
    )
    for _ in range(2):  # and again: not "already deploying"
        answer = as_(app, OPERATOR).post("/pipelines", json=spec)
        assert answer.status_code >= 500 and answer.json()["code"] == "broker_error", answer.text
        assert "stream limits exceeded" in answer.json()["message"]
        assert orch.registry.get_pipeline("p").status == "failed"
    # Why it failed stays with it: `status` said "failed" with no reason anywhere.
    why = orch.status("p", counts=False)[0].error
    assert why is not None and why.startswith("the broker refused its streams: ")
    assert "stream limits exceeded" in why
    assert orch.central.newest("p", "aggregate") is None
    assert ("p", "aggregate") not in orch.last_migration
    # Synced before the streams are made, the pipeline withheld: rights a node held of a
    # run before (stopping, a stop's sync that failed) are withdrawn, none given.
    assert synced == [{"p"}, {"p"}] and withheld == [{"p"}, {"p"}]
    assert orch.permissions._withheld == set()

    # The nodes' broker rights that cannot be set: failed too, not left deploying (every
    # deploy again was refused as "already deploying" until a stop).
    syncs: list[bool] = []

    def unsettable(registry: object) -> None:
        syncs.append(True)
        if len(syncs) % 2 == 0:  # (withdrawn first; given once the streams are made: not)
            raise BrokerError("cannot rewrite the broker's config")

    monkeypatch.setattr(orch.permissions, "sync", unsettable)
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30, **_: None)  # (made)
    for _ in range(2):
        answer = as_(app, OPERATOR).post("/pipelines", json=spec)
        assert answer.status_code >= 500 and answer.json()["code"] == "broker_error", answer.text
        assert orch.registry.get_pipeline("p").status == "failed"
    assert orch.registry.failure("p") == (
        "its nodes' broker rights could not be set: cannot rewrite the broker's config"
    )
    # Rights that cannot be withdrawn first: no stream is made under them.
    made: list[object] = []

    def never(registry: object) -> None:
        raise BrokerError("cannot rewrite the broker's config")

    monkeypatch.setattr(orch.permissions, "sync", never)
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30, **_: made.append(make))
    answer = as_(app, OPERATOR).post("/pipelines", json=spec)
    assert answer.status_code >= 500 and answer.json()["code"] == "broker_error", answer.text
    assert orch.registry.failure("p") == (
        "its nodes' broker rights could not be withdrawn first: cannot rewrite the broker's config"
    )
    assert made == []
    # A stop forgets it (a stopped pipeline did not fail).
    orch.registry.set_status("p", PipelineState.STOPPED)
    assert orch.registry.failure("p") is None


def test_a_sink_writing_a_running_pipelines_output_is_refused(
    app: FastAPI, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    orch = app.state.orchestrator
    for name, agent in agents.items():
        beat = {"url": agent.url, "ready": True, "elements": []}
        as_(app, node_token(OPERATOR, name)).post(f"/nodes/{name}/heartbeat", json=beat)
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    paths = (str(tmp_path / "in.csv"), "x", str(tmp_path / "out" / "o.csv"))
    spec = {
        **SPEC,
        "elements": [
            {**e, "options": {**e["options"], "path": p}}
            for e, p in zip(SPEC["elements"], paths, strict=True)
        ],
    }
    spec["elements"][1]["options"] = SPEC["elements"][1]["options"]  # fmt: skip
    orch.registry.put_pipeline(parse_spec(spec, tmp_path), "running")
    # Its own name again: refused with what was expected and received.
    answer = as_(app, OPERATOR).post("/pipelines", json=spec)
    assert answer.status_code == 409 and answer.json()["code"] == "pipeline_exists", answer.text
    assert answer.json()["received"] == "'p', running"
    assert answer.json()["expected"] == "a pipeline name no running or deploying pipeline has"
    answer = as_(app, OPERATOR).post("/pipelines", json={**spec, "pipeline": "b"})
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_spec", answer.text
    assert "which sink 'sink' of running pipeline 'p' writes" in answer.json()["message"]
    assert "fogshift stop p" in answer.json()["hint"]
    # Nor a sink writing a running pipeline's source file: the deploy would empty it.
    into = {**spec, "pipeline": "c"}
    into["elements"] = [*spec["elements"][:2],
                        {**spec["elements"][2], "options": {"path": paths[0]}}]  # fmt: skip
    into["elements"][0] = {**into["elements"][0], "options": {"path": "in.csv"}}
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "in.csv").write_text("timestamp,sensor,value\n")
    answer = as_(app, OPERATOR).post(
        "/pipelines", json=parse_spec(into, tmp_path / "c").model_dump(mode="json")
    )
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_spec", answer.text
    assert "which source 'source' of running pipeline 'p' reads" in answer.json()["message"]
    # Nor a source reading a running pipeline's output: its sink cuts a torn line and writes
    # it again when restored, and the source took the torn line for a row.
    reader = {**spec, "pipeline": "d"}
    reader["elements"] = [{**spec["elements"][0], "options": {"path": paths[2]}},
                          *spec["elements"][1:2],
                          {**spec["elements"][2], "options": {"path": "d-out.csv"}}]  # fmt: skip
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / "o.csv").write_text("seq,value\n")
    answer = as_(app, OPERATOR).post(
        "/pipelines", json=parse_spec(reader, tmp_path).model_dump(mode="json")
    )
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_spec", answer.text
    assert "which sink 'sink' of running pipeline 'p' writes" in answer.json()["message"]
    assert "reads" in answer.json()["message"]
    # Nor under another name (a hard link: one file, whose marker the two sinks would share).
    (tmp_path / "linked.csv").hardlink_to(tmp_path / "out" / "o.csv")
    linked = {**spec, "pipeline": "e"}
    linked["elements"] = [*spec["elements"][:2],
                          {**spec["elements"][2], "options": {"path": "linked.csv"}}]  # fmt: skip
    answer = as_(app, OPERATOR).post(
        "/pipelines", json=parse_spec(linked, tmp_path).model_dump(mode="json")
    )
    assert answer.status_code == 422, answer.text
    assert "which sink 'sink' of running pipeline 'p' writes" in answer.json()["message"]
    assert "linked.csv', one file with '" in answer.json()["message"]  # (its own name too)
    # Nor once it is stopped: `fogshift start p` would go on with the file the deploy
    # emptied, its sink then refused as not the file's writer, for good.
    orch.registry.set_status("p", "running")  # (its deploy completed)
    orch.registry.set_status("p", "stopped")
    answer = as_(app, OPERATOR).post("/pipelines", json={**spec, "pipeline": "b"})
    assert answer.status_code == 422, answer.text
    assert "which sink 'sink' of stopped pipeline 'p' writes" in answer.json()["message"]
    assert "`fogshift delete p` first" in answer.json()["hint"]
    # A stopped one whose deploy never completed has nothing to go on from: its file may
    # be taken over.
    orch.registry.set_status("p", "deploying")
    orch.registry.set_status("p", "stopped")
    orch.broker.close()  # (the deploy then fails at the broker, past the check)
    answer = as_(app, OPERATOR).post("/pipelines", json={**spec, "pipeline": "b"})
    assert answer.json()["code"] != "invalid_spec", answer.text


def test_a_spec_sent_with_relative_paths_is_refused_before_anything_starts(
    app: FastAPI, agents: dict[str, StandIn]
) -> None:
    """A node resolved a relative path against its own working folder: a missing input
    showed only when its query ran (the CLI and the dashboard send absolute paths)."""
    orch = app.state.orchestrator
    for name, agent in agents.items():
        orch.heartbeat(name, Heartbeat.model_validate({"url": agent.url, "ready": True}))
    answer = as_(app, OPERATOR).post("/pipelines", json={**SPEC, "pipeline": "rel"})
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert "relative path" in body["message"] and body["expected"] == "an absolute path"
    assert body["received"] == "'in.csv'"
    assert orch.registry.get_pipeline("rel") is None
    assert not any(c.method == "PUT" for a in agents.values() for c in a.calls)


def test_a_sink_writing_the_clusters_own_files_is_refused(
    app: FastAPI, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    """A deploy empties its sinks' files: a sink on the cluster's token or registry broke
    the cluster."""
    orch = app.state.orchestrator
    for name, agent in agents.items():
        orch.heartbeat(name, Heartbeat.model_validate({"url": agent.url, "ready": True}))
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    home = Path(orch.config.home)
    for own in ("token", "orchestrator.db", "nodes/fog-a/out.csv"):
        paths = (str(tmp_path / "in.csv"), None, str(home / own))
        spec = {**SPEC, "pipeline": "own", "elements": [
            {**e, "options": {**e["options"], "path": p}} if p else e
            for e, p in zip(SPEC["elements"], paths, strict=True)
        ]}  # fmt: skip
        answer = as_(app, OPERATOR).post("/pipelines", json=spec)
        assert answer.status_code == 422, answer.text
        assert f"the cluster's own {own.split('/')[0]!r}" in answer.json()["message"]
    assert orch.registry.get_pipeline("own") is None


def test_a_bad_key_group_is_refused_in_words(app: FastAPI) -> None:
    # It answered with the regular expression, under a hint about names.
    answer = as_(app, OPERATOR).post(
        "/pipelines/p/elements/aggregate/keys/migrate", json={"target": "fog-b", "group": "10000/2"}
    )
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert "'10000/2' is not a key group" in body["message"]
    assert body["expected"].startswith("group: G/N") and "3/16" in body["hint"]
    assert "^[0-9]" not in answer.text


def test_a_restore_without_a_body_takes_the_defaults(app: FastAPI) -> None:
    # Every field of its body has a default: it answered 422 "body: Field required".
    answer = as_(app, OPERATOR).post("/pipelines/nosuch/elements/aggregate/restore")
    assert answer.status_code == 404, answer.text  # refused for the pipeline, not the body
    assert "nosuch" in answer.json()["message"]


def test_a_request_value_out_of_bounds_says_what_was_expected_in_words(app: FastAPI) -> None:
    # It said pydantic's sentence again as what was expected.
    answer = as_(app, OPERATOR).post(
        "/pipelines/p/elements/aggregate/scale", json={"partitions": 0}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["expected"] == "a number of at least 1"


def test_reads_run_again_on_a_new_connection_when_the_broker_closed_theirs(
    app: FastAPI, tmp_path: Path
) -> None:
    # nats-py closes a connection for good on the broker's "Authorization Violation" (sent
    # to a connected client at a rights reload): a read met by it runs again on a new
    # connection (`SyncJetStream.run(again_if_closed=True)`), so the status and the dead
    # letters answer rather than fail once with a 503. (The broker stood in for: a call not
    # allowed to run again fails as the real one's did.)
    orch = app.state.orchestrator
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
    refused: list[Any] = []

    def closed_once(make: Any, timeout: float = 30, again_if_closed: bool = False) -> Any:
        if not again_if_closed:
            refused.append(make)
            raise BrokerUnavailable("nats: connection closed")
        return [] if getattr(make, "__name__", "") == "dead" else {}

    orch.broker.run = closed_once
    status = as_(app, OPERATOR).get("/pipelines/p")
    assert status.status_code == 200, status.text
    assert PipelineStatus.model_validate(status.json()).pipeline == "p"
    letters = as_(app, OPERATOR).get("/pipelines/p/errors")
    assert letters.status_code == 200 and letters.json() == [], letters.text
    assert refused == []
