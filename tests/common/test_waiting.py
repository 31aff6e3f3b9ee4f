"""wait_until: the condition's value, or an error naming what was awaited and the last value."""

from __future__ import annotations

import itertools

import pytest

from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.waiting import wait_until
from fogshift.exceptions import FogshiftError


def test_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, [], {"state": "running"}, {"state": "later"}])
    assert wait_until(lambda: next(answers), 5, interval_s=0, describe="x") == {"state": "running"}


def test_a_condition_already_true_is_not_slept_on() -> None:
    calls = itertools.count()
    assert wait_until(lambda: next(calls) + 1, 0, describe="x") == 1


def test_timeout_names_what_was_awaited_and_the_last_value() -> None:
    answers = itertools.count()
    with pytest.raises(WaitTimedOut) as caught:
        wait_until(lambda: next(answers) < 0, 0.05, interval_s=0.01, describe="node fog-a up")
    assert isinstance(caught.value, FogshiftError)
    assert caught.value.what == "node fog-a up"
    assert caught.value.last is False
    assert "node fog-a up" in str(caught.value)
    assert "last seen: False" in str(caught.value)


def test_zero_timeout_still_asks_once() -> None:
    calls: list[int] = []
    with pytest.raises(WaitTimedOut):
        wait_until(lambda: calls.append(1), 0, describe="x")
    assert calls == [1]


def test_retry_on_errors_count_as_not_yet_and_are_reported_last() -> None:
    attempts = itertools.count()

    def flaky() -> str:
        if next(attempts) < 2:
            raise ConnectionError("refused")
        return "up"

    assert wait_until(flaky, 5, interval_s=0, describe="x", retry_on=(ConnectionError,)) == "up"

    def down() -> str:
        raise ConnectionError("refused")

    with pytest.raises(WaitTimedOut) as caught:
        wait_until(down, 0.02, interval_s=0.01, describe="x", retry_on=(ConnectionError,))
    assert isinstance(caught.value.last, ConnectionError)


def test_other_errors_end_the_wait_at_once() -> None:
    calls = itertools.count()

    def broken() -> None:
        next(calls)
        raise ValueError("query failed")

    with pytest.raises(ValueError, match="query failed"):
        wait_until(broken, 5, interval_s=0, describe="x", retry_on=(ConnectionError,))
    assert next(calls) == 1
