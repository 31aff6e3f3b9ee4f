"""The services' shared server side: an unexpected exception is answered, not left to the
server (which would close the connection a client's next request then finds dead)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict

from fogshift.common.http import raise_for_error
from fogshift.common.service import install_error_handlers
from fogshift.exceptions import FogshiftError

TOKEN = "t" * 32


def test_a_bug_in_an_endpoint_is_answered_as_a_json_error() -> None:
    app = FastAPI()
    install_error_handlers(app, TOKEN)

    @app.get("/boom")
    def boom() -> None:
        raise KeyError("offsets/7")

    @app.get("/fine")
    def fine() -> dict[str, bool]:
        return {"ok": True}

    # raise_server_exceptions: an exception the app let through would be raised here.
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    answer = client.get("/boom")
    assert answer.status_code == 500
    body = answer.json()
    assert body["code"] == "error" and "GET /boom failed: KeyError" in body["message"]
    assert "offsets/7" in body["message"] and "log" in body["hint"]
    try:
        raise_for_error(answer, "node agent 'fog-a'")
    except FogshiftError as exc:  # a client sees a fogshift error, not an unreachable node
        assert "KeyError" in exc.message
    else:
        raise AssertionError("a 500 was not raised as an error")
    assert client.get("/fine").json() == {"ok": True}


def test_a_full_disk_under_an_endpoint_is_said_so_not_called_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastAPI()
    install_error_handlers(app, TOKEN)

    @app.put("/blobs/x")
    def store() -> None:
        raise OSError(28, "No space left on device", "/nodes/fog-a/replicas/blobs/x")

    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    with caplog.at_level("INFO", logger="fogshift"):
        answer = client.put("/blobs/x")
    assert answer.status_code == 500
    body = answer.json()
    assert "PUT /blobs/x failed: OSError: [Errno 28] No space left on device" in body["message"]
    assert "/nodes/fog-a/replicas/blobs/x" in body["message"]
    assert "full disk" in body["hint"] and "bug" not in body["hint"]
    # One line in the log, naming the file, not a traceback.
    (record,) = [r for r in caplog.records if "PUT /blobs/x failed" in r.getMessage()]
    assert record.exc_info is None and "replicas/blobs/x" in record.getMessage()

    # Other OSErrors (a file a bug looked for, a timeout) are bugs still, with a traceback.
    @app.get("/lost")
    def lost() -> None:
        raise FileNotFoundError(2, "No such file or directory", "/nodes/fog-a/x.json")

    answer = client.get("/lost")
    assert answer.status_code == 500 and "a bug in the service" in answer.json()["hint"]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


def _app_with_a_body_and_a_query() -> TestClient:
    app = FastAPI()
    install_error_handlers(app, TOKEN)

    @app.post("/things")
    def things(body: Body) -> dict[str, str]:
        return {"name": body.name}

    @app.get("/items")
    def items(limit: int = 5) -> dict[str, int]:
        return {"limit": limit}

    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})


def test_a_query_parameter_the_endpoint_does_not_take_is_refused() -> None:
    # FastAPI ignores them: `restore?target=fog-b` (the target goes in the body) restored
    # where the orchestrator chose.
    client = _app_with_a_body_and_a_query()
    assert client.get("/items", params={"limit": 2}).json() == {"limit": 2}
    answer = client.get("/items", params={"limit": 2, "bogus": 1})
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert "'bogus'" in body["message"] and body["received"] == "bogus"
    assert body["expected"] == "one of limit" and "schema" in body["hint"]
    refused = client.post("/things", params={"target": "x"}, json={"name": "a"}).json()
    assert refused["expected"] == "no query parameters", refused


@pytest.mark.parametrize(
    ("text", "received"),
    [
        ("{bad", "'{bad': Expecting property name"),
        ('{"name": ' + "1" * 5000 + "}", "a body of 5010 bytes"),
        ("[" * 100_000 + "]" * 100_000, "a body of 200000 bytes"),
    ],
)
def test_a_body_that_cannot_be_read_is_refused_with_what_was_sent(text: str, received: str) -> None:
    # A 400 with nothing filled in and a hint about methods (an integer over 4300 digits,
    # nesting deeper than Python recurses), or "received: {}" for text that is no JSON.
    client = _app_with_a_body_and_a_query()
    answer = client.post("/things", content=text, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["received"].startswith(received), body
    assert "JSON" in body["expected"] and "schema" in body["hint"], body


@pytest.mark.parametrize(
    ("kind", "content", "received"),
    [
        ("text/plain", '{"name": "a"}', "a body of type 'text/plain': '{\"name\": \"a\"}'"),
        ("application/x-www-form-urlencoded", "name=a", "a body of type "),
        ("text/plain; charset=utf-8", "", "no body"),
        (None, "", "no body"),
    ],
)
def test_a_body_sent_as_other_than_json_is_told_to_be_sent_as_json(
    kind: str | None, content: str, received: str
) -> None:
    # curl -d sends a form type, `--data-binary` with -H text/plain a text: FastAPI read
    # either as text, answered "Input should be a valid dictionary", "b'{...'" received.
    client = _app_with_a_body_and_a_query()
    headers = {"content-type": kind} if kind else {}
    answer = client.post("/things", content=content, headers=headers)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["received"].startswith(received), body
    assert "b'" not in body["received"] and "Input should" not in body["message"], body
    assert body["hint"] == "send the body as JSON, with the header Content-Type: application/json"


def test_a_json_body_of_the_wrong_shape_is_not_told_to_be_sent_as_json() -> None:
    client = _app_with_a_body_and_a_query()
    for kind in ("application/json", "application/merge-patch+json", None):
        headers = {"content-type": kind} if kind else {}
        answer = client.post("/things", content='["a"]', headers=headers)
        assert answer.status_code == 422, answer.text
        # (Without a type FastAPI does not read a body as JSON: the header is what to add.)
        told = "send the body as JSON" in answer.json()["hint"]
        assert told == (kind is None), (kind, answer.json())
