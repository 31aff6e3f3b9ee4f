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


def test_an_empty_operator_token_logs_nobody_in() -> None:
    # (A token file emptied by hand or damage: an empty form field logged in.)
    sessions = Sessions(operator_token="")
    for token in ("", " "):
        with pytest.raises(BadLogin):
            sessions.login(token)
    assert sessions.valid(sessions.login(sessions.login_token))  # the link still works


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


def test_an_unused_login_link_expires_and_any_login_spends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A link left in a log or a terminal's scrollback logged anyone in for as long as the
    dashboard ran, if the operator had logged in with the operator token instead."""
    clock = [1000.0]
    monkeypatch.setattr("fogshift.web.auth.time.monotonic", lambda: clock[0])
    late = Sessions(operator_token="t" * 32, link_s=600)
    clock[0] += 601
    with pytest.raises(BadLogin, match="within 10 minutes"):
        late.login(late.login_token)
    assert late.valid(late.login("t" * 32))  # the operator token still logs in
    spent = Sessions(operator_token="t" * 32, link_s=600)
    spent.login("t" * 32)
    with pytest.raises(BadLogin):
        spent.check_link(spent.login_token)
    fresh = Sessions(operator_token="t" * 32, link_s=600)
    clock[0] += 599
    fresh.check_link(fresh.login_token)  # opening the link spends nothing
    fresh.check_link(fresh.login_token)
    assert fresh.valid(fresh.login(fresh.login_token))
    with pytest.raises(BadLogin):
        fresh.check_link(fresh.login_token)
    with pytest.raises(BadLogin, match="works once"):  # the operator token: never in a URL
        fresh.check_link("t" * 32)


def test_a_session_in_use_still_ends_at_its_lifetime(monkeypatch: pytest.MonkeyPatch) -> None:
    """An open page's live parts use its session every few seconds: the idle bound alone
    never ended a forgotten tab's session, nor a stolen cookie kept in use."""
    sessions = Sessions(operator_token="t" * 32, idle_s=60, lifetime_s=3600)
    clock = [1000.0]
    monkeypatch.setattr("fogshift.web.auth.time.monotonic", lambda: clock[0])
    session = sessions.login("t" * 32)
    while clock[0] <= 1000.0 + 3600:
        assert sessions.valid(session)
        clock[0] += 30
    assert not sessions.valid(session)  # 3,630 s after its login, used 30 s before
    assert sessions.valid(sessions.login("t" * 32))  # a new login starts a new lifetime
