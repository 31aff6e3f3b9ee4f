"""Dashboard login: a one-time link, the operator token, sessions that end."""

from __future__ import annotations

import pytest

from fogshift.web.auth import Sessions
from fogshift.web.exceptions import BadLogin


def test_the_login_link_works_once_and_the_operator_token_always() -> None:
    sessions = Sessions(operator_token="operator-token-" + "x" * 20)
    first = sessions.login(sessions.login_token)
    assert sessions.valid(first)
    with pytest.raises(BadLogin, match="works once") as refused:
        sessions.login(sessions.login_token)
    assert refused.value.hint and "<home>/token" in refused.value.hint
    again = sessions.login("operator-token-" + "x" * 20)
    assert sessions.valid(again) and again != first
    with pytest.raises(BadLogin):
        sessions.login("")
    with pytest.raises(BadLogin):
        sessions.login("operator-token-" + "x" * 19 + "y")


def test_sessions_end_at_logout_and_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = Sessions(operator_token="t" * 32, idle_s=60)
    clock = [1000.0]
    monkeypatch.setattr("fogshift.web.auth.time.monotonic", lambda: clock[0])
    kept, idle = sessions.login("t" * 32), sessions.login("t" * 32)
    assert not sessions.valid(None) and not sessions.valid("made-up")
    sessions.logout(kept)
    assert not sessions.valid(kept)
    clock[0] += 59
    assert sessions.valid(idle)  # use renews it
    clock[0] += 59
    assert sessions.valid(idle)
    clock[0] += 61
    assert not sessions.valid(idle)
