"""The typed contracts of ``fogshift.contracts``: the strings on the wire stay what they were,
and a payload that does not fit is refused where it arrives, naming the field."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from fogshift.common.http import ServiceClient, error_body, raise_for_error
from fogshift.contracts import (
    ElementProgress,
    ElementStatus,
    ErrorBody,
    GateMode,
    Heartbeat,
    MigrationMode,
    MigrationPhase,
    MigrationReport,
    MigrationStatus,
    OperationKind,
    PEState,
    PipelineState,
    PlacementState,
    RestorePhase,
    RestoreReport,
    RestoreStatus,
)
from fogshift.exceptions import (
    Conflict,
    FogshiftError,
    InvalidInput,
    InvariantViolation,
    NotFound,
    Unavailable,
)
from fogshift.migration.exceptions import MigrationFailed
from fogshift.restoration.exceptions import RestoreFailed

#: Each enum and the strings the API, the journal and ``--json`` have always used.
WIRE_STRINGS = [
    (PEState, {"starting", "running", "paused", "failed", "fenced", "stopped", "discarded"}),
    (PipelineState, {"deploying", "running", "stopping", "stopped", "failed"}),
    (PlacementState, {"node-lost", "pending"}),
    (GateMode, {"hold", "cap"}),
    (MigrationMode, {"precopy", "literal", "handover"}),
    (OperationKind, {"migration", "restore"}),
    (MigrationStatus, {"running", "migrated", "failed"}),
    (RestoreStatus, {"running", "restored", "failed"}),
]

HEARTBEAT = {
    "url": "http://127.0.0.1:8701",
    "pid": 10,
    "pgid": 10,
    "ready": True,
    "error": None,
    "elements": [{"pipeline": "p", "element": "agg", "kind": "window-aggregate",
                  "state": "running", "epoch": 2, "gated": False}],
    "replicas": [{"pipeline": "p", "element": "src", "id": "b000000007", "batch": 7,
                  "created": 1.5}],
    "cpu_percent": 12.5,
}  # fmt: skip


@pytest.mark.parametrize(
    ("enum", "strings"), WIRE_STRINGS, ids=lambda v: getattr(v, "__name__", "")
)
def test_enum_values_are_the_strings_on_the_wire(enum: type, strings: set[str]) -> None:
    assert {member.value for member in enum} == strings  # type: ignore[attr-defined]
    for text in strings:
        member = enum(text)
        # A member is its string: in JSON, in f-strings, in comparisons with old code.
        assert json.dumps(member) == json.dumps(text) and f"{member}" == text == member


def test_phases_are_in_journal_order() -> None:
    assert [p.value for p in MigrationPhase] == ["preparing", "pausing", "switching", "routed"]
    assert [p.value for p in RestorePhase] == ["fencing", "installing", "starting", "live",
                                               "routed"]  # fmt: skip


def test_a_heartbeat_round_trips_and_its_states_are_enums() -> None:
    beat = Heartbeat.model_validate(HEARTBEAT)
    assert beat.elements[0].state is PEState.RUNNING and beat.elements[0].epoch == 2
    assert beat.element("p", "agg") is beat.elements[0] and beat.element("p", "src") is None
    again = Heartbeat.model_validate_json(beat.model_dump_json())
    assert again == beat
    assert json.loads(beat.model_dump_json())["elements"][0]["state"] == "running"


def test_status_states_keep_their_strings() -> None:
    row = {"element": "agg", "kind": "map", "node": "fog-a", "events_in": 1, "events_out": 1,
           "dead_letters": 0, "restarts": 0, "error": None, "planned_backup": None,
           "planned_redeploy": None, "last_restore": None}  # fmt: skip
    for state, member in (("node-lost", PlacementState.NODE_LOST), ("paused", PEState.PAUSED),
                          ("deploying", PipelineState.DEPLOYING)):  # fmt: skip
        status = ElementStatus.model_validate({**row, "state": state})
        assert status.state == member and status.model_dump(mode="json")["state"] == state


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"url": None}, "url", "string_type"),
        ({"url": "ftp://x"}, "url", "string_pattern_mismatch"),
        ({"elements": [{"element": "agg"}]}, "elements.0.pipeline", "missing"),
        ({"elements": [{"pipeline": "p", "element": "a", "state": "sleeping"}]},
         "elements.0.state", "enum"),
        ({"cpu": 3}, "cpu", "extra_forbidden"),
    ],
)  # fmt: skip
def test_a_malformed_heartbeat_is_refused_naming_the_field(
    change: dict[str, object], field: str, problem: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Heartbeat.model_validate({**HEARTBEAT, **change})
    errors = refused.value.errors()
    assert [(".".join(map(str, e["loc"])), e["type"]) for e in errors] == [(field, problem)]
    assert field.split(".")[0] in str(refused.value)


def test_a_migration_report_traces_only_changes() -> None:
    report = MigrationReport(pipeline="p", element="agg", origin="a", target="b",
                             mode="literal")  # fmt: skip
    info = ElementProgress(pipeline="p", element="agg", committed_batch=3, progress=30)
    report.observe("a", info)
    report.observe("a", info)
    report.observe("b", info.model_copy(update={"progress": 31}))
    assert [row[1:] for row in report.trace] == [["a", 3, 30, None], ["b", 3, 31, None]]
    report.status = "migrated"  # type: ignore[assignment]
    assert report.status is MigrationStatus.MIGRATED  # assignments are validated
    with pytest.raises(ValidationError):
        report.status = "teleported"  # type: ignore[assignment]


def test_a_failed_operations_report_crosses_the_wire_as_a_typed_field() -> None:
    report = RestoreReport(pipeline="p", element="agg", target="fog-b", status="failed",
                           error="boom")  # fmt: skip
    failure = RestoreFailed("restore of p/agg on fog-b failed: boom")
    failure.report = report
    body = error_body(failure)
    assert ErrorBody.model_validate(body).report == report
    response = httpx.Response(502, json=body)
    with pytest.raises(RestoreFailed) as rebuilt:
        raise_for_error(response, "the orchestrator")
    assert rebuilt.value.report == report and rebuilt.value.message == failure.message
    # Errors without a report keep the body they always had.
    assert error_body(NotFound("no pipeline named 'x'")) == {
        "code": "not_found", "message": "no pipeline named 'x'", "expected": None,
        "received": None, "hint": None,
    }  # fmt: skip
    migration = MigrationFailed("failed")
    assert migration.report is None and "report" not in error_body(migration)


def test_an_answer_that_does_not_fit_its_contract_is_an_invariant_violation() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"state": "running", "epoch": 2})  # names no PE

    client = ServiceClient("http://agent", "token", "node agent 'fog-a'")
    client._client = httpx.Client(base_url=client.url, transport=httpx.MockTransport(answer))
    with client, pytest.raises(InvariantViolation) as refused:
        client.call(ElementProgress, "GET", "/pipelines/p/elements/agg/progress")
    err = refused.value
    assert "node agent 'fog-a' answered GET /pipelines/p/elements/agg/progress" in err.message
    assert err.expected is not None and "ElementProgress" in err.expected
    assert err.received is not None and err.received.startswith("pipeline: ")


@pytest.mark.parametrize(
    ("status", "kind"),
    [(422, InvalidInput), (404, NotFound), (409, Conflict), (503, Unavailable),
     (500, FogshiftError)],
)  # fmt: skip
def test_an_error_of_a_class_this_process_never_imported_keeps_its_code_and_kind(
    status: int, kind: type[FogshiftError]
) -> None:
    # The CLI does not import the services' modules: their own error classes reach it only
    # as a code, and the HTTP status says what kind of error it is (and so the exit code).
    body = {"code": "not_keyed_in_this_test", "message": "m", "expected": "e",
            "received": "r", "hint": "h"}  # fmt: skip
    with pytest.raises(FogshiftError) as raised:
        raise_for_error(httpx.Response(status, json=body), "the orchestrator")
    assert type(raised.value) is kind
    assert raised.value.code == "not_keyed_in_this_test" and raised.value.hint == "h"
