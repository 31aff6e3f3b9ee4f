"""``GET /pipelines/{name}/elements/{element}/operation``: the phase the CLI shows while a
migration or restore runs, read from the operations journal.

The orchestrator's real FastAPI app and registry, in process (no lifespan: no background
loops); the journal is written through the registry as the migration and restore code does.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from fogshift.common.http import node_token
from fogshift.contracts import OperationView
from fogshift.orchestrator.registry import Registry
from tests.orchestrator.conftest import OPERATOR

URL = "/pipelines/p/elements/aggregate/operation"


def operator(app: FastAPI) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"})


def test_the_running_operations_journaled_phase_is_reported(app: FastAPI) -> None:
    registry: Registry = app.state.orchestrator.registry
    client = operator(app)
    op = registry.begin_operation(
        "migration", "p", "aggregate", "fog-a", "fog-b", "me", "preparing"
    )
    view = OperationView.model_validate(client.get(URL).json())
    assert (view.id, view.kind, view.phase, view.running) == (op.id, "migration", "preparing", True)
    assert (view.origin, view.target, view.outcome) == ("fog-a", "fog-b", None)
    for phase in ("pausing", "state", "invoking"):
        registry.advance(op.id, phase)
        assert client.get(URL).json()["phase"] == phase
    registry.finish(op.id, "migrated")
    done = OperationView.model_validate(client.get(URL).json())
    assert (done.phase, done.outcome, done.running) == ("invoking", "migrated", False)


def test_the_latest_operation_of_the_pe_is_the_one_reported(app: FastAPI) -> None:
    registry: Registry = app.state.orchestrator.registry
    first = registry.begin_operation("migration", "p", "aggregate", "fog-a", "fog-b", "me", "x")
    registry.finish(first.id, "rolled_back")
    registry.begin_operation("migration", "p", "other", "fog-a", "fog-b", "me", "preparing")
    second = registry.begin_operation(
        "restore", "p", "aggregate", "fog-a", "cloud", "me", "fencing", new_epoch=True
    )
    view = OperationView.model_validate(operator(app).get(URL).json())
    assert (view.id, view.kind, view.phase, view.epoch) == (second.id, "restore", "fencing", 1)
    assert view.running


def test_no_operation_is_404_and_the_view_is_operator_only(app: FastAPI) -> None:
    response = operator(app).get(URL)
    assert response.status_code == 404
    assert "p/aggregate" in response.json()["message"]
    node = TestClient(app, headers={"Authorization": f"Bearer {node_token(OPERATOR, 'fog-a')}"})
    assert node.get(URL).status_code == 403
    assert TestClient(app).get(URL).status_code == 401
    # The response model is in the OpenAPI schema, so the schema describes the real answer.
    schema = operator(app).get("/openapi.json").json()
    answer = schema["paths"][URL.replace("p/elements/aggregate", "{name}/elements/{element}")]
    assert "OperationView" in str(answer["get"]["responses"]["200"])
