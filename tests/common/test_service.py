"""The services' shared server side: an unexpected exception is answered, not left to the
server (which would close the connection a client's next request then finds dead)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

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
