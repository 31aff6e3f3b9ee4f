"""One operation on a PE's instances at a time: what someone asked for waits for the
orchestrator's own rounds (standby follow-ups and starts, reconciler repairs), which never
wait themselves; two operations asked for never wait for each other (pure logic on a real
orchestrator object; no agents are called)."""

from __future__ import annotations

import threading
import time

import pytest

from fogshift.migration.exceptions import MigrationInProgress
from fogshift.orchestrator import journal
from fogshift.orchestrator.journal import STANDBY_LOOK
from fogshift.orchestrator.service import Orchestrator
from tests.orchestrator.test_recovery import orch  # noqa: F401

KEY = ("p", "aggregate")


def _held(orch: Orchestrator, what: str) -> tuple[threading.Event, threading.Thread]:  # noqa: F811
    """A thread holding the aggregate's section as ``what`` until the event is set."""
    release, holding = threading.Event(), threading.Event()

    def hold() -> None:
        with orch._exclusive(*KEY, what):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(10)
    return release, thread


def test_an_operation_asked_for_waits_for_a_round_of_the_orchestrators_own(
    orch: Orchestrator,  # noqa: F811
) -> None:
    release, holder = _held(orch, "standby follow")
    threading.Timer(0.3, release.set).start()
    began = time.monotonic()
    with orch._exclusive(*KEY, "migration"):
        waited = time.monotonic() - began
    holder.join()
    assert 0.2 < waited < journal.BACKGROUND_WAIT_S


def test_rounds_never_wait_and_operations_asked_for_never_wait_for_each_other(
    orch: Orchestrator,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release, holder = _held(orch, "migration")
    try:
        for what in ("restore", "standby follow"):
            began = time.monotonic()
            with (
                pytest.raises(MigrationInProgress, match="a migration is under way") as refused,
                orch._exclusive(*KEY, what),
            ):
                pass
            assert time.monotonic() - began < 1
            # (It said neither what was expected nor what was received.)
            assert refused.value.received == f"{what} while a migration is under way"
            assert refused.value.expected and refused.value.expected.startswith("no other ")
    finally:
        release.set()
        holder.join()
    # A round that does not let go in time: the operation is refused, naming it.
    monkeypatch.setattr(journal, "BACKGROUND_WAIT_S", 0.2)
    release, holder = _held(orch, "standby")
    try:
        with (
            pytest.raises(MigrationInProgress, match="the start of its standby is under way"),
            orch._exclusive(*KEY, "migration"),
        ):
            pass
    finally:
        release.set()
        holder.join()
    with orch._exclusive(*KEY, "migration"):  # free again
        assert orch._migrating[KEY] == "migration"
    assert KEY not in orch._migrating


@pytest.mark.parametrize(
    ("holder_label", "said"),
    [
        ("standby", "the start of its standby"),
        # The keeper's round holds every PE a moment to see whether it needs a standby: a
        # restore refused meanwhile, of a pipeline without standbys, said the line above.
        (STANDBY_LOOK, "the standby keeper's look at it"),
    ],
)
def test_what_a_round_starts_itself_does_not_wait(
    orch: Orchestrator,  # noqa: F811
    holder_label: str,
    said: str,
) -> None:
    """The reconciler's auto-restore of a PE a standby's start holds is refused at once: a
    round that waited would hold up every other PE's restore."""
    assert holder_label in journal.BACKGROUND  # (waited for by what someone asked for)
    release, holder = _held(orch, holder_label)
    try:
        began = time.monotonic()
        with (
            orch._as_round(),
            pytest.raises(MigrationInProgress, match=said),
            orch._exclusive(*KEY, "restore"),
        ):
            pass
        assert time.monotonic() - began < 1
    finally:
        release.set()
        holder.join()
