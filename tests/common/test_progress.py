"""Waiting for a PE to reach an input position (a real HTTP stand-in for its agent)."""

from __future__ import annotations

import pytest

from fogshift.common.http import ServiceClient
from fogshift.common.progress import wait_for_progress
from fogshift.restoration.exceptions import RestoreFailed
from tests.orchestrator.standin import standins

HERE = "/pipelines/p/elements/alarms"


def test_position_0_is_reached_with_nothing_committed() -> None:
    """A sink that never got input (no batch committed, held at a cap of 0) is where a
    restore or a move needs it at once; any later position needs a committed batch."""
    with standins("fog-b") as agents:
        agents["fog-b"].answer("GET", HERE + "/progress", body={
            "pipeline": "p", "element": "alarms", "state": "running", "committed_batch": None,
            "progress": 0})  # fmt: skip
        agent = ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b")
        info = wait_for_progress(agent, HERE, 0, 5.0, RestoreFailed, "restore of p/alarms")
        assert info.committed_batch is None
        with pytest.raises(RestoreFailed, match="did not reach input position 1"):
            wait_for_progress(agent, HERE, 1, 0.3, RestoreFailed, "restore of p/alarms")
        # Position 0 still needs a query that runs: one that failed to start is not there.
        agents["fog-b"].answer("GET", HERE + "/progress", body={
            "pipeline": "p", "element": "alarms", "state": "failed", "retry_in_s": 1.0,
            "committed_batch": None, "progress": 0})  # fmt: skip
        with pytest.raises(RestoreFailed, match="did not reach input position 0"):
            wait_for_progress(agent, HERE, 0, 0.3, RestoreFailed, "restore of p/alarms")


def test_a_position_on_disk_is_not_reached_by_a_query_that_does_not_run() -> None:
    """An installed checkpoint's position is there before its query starts: a query that
    failed to start (the agent will retry it) has reached nothing, however far its files
    are (a literal move or a restore was reported done with nobody running the PE)."""
    with standins("fog-b") as agents:
        failed = {"pipeline": "p", "element": "alarms", "state": "failed", "retry_in_s": 1.0,
                  "committed_batch": 3, "progress": 40, "error": "cannot import"}  # fmt: skip
        agents["fog-b"].answer("GET", HERE + "/progress", body=failed)
        agent = ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b")
        with pytest.raises(RestoreFailed, match="did not reach input position 30"):
            wait_for_progress(agent, HERE, 30, 0.3, RestoreFailed, "restore of p/alarms")
        agents["fog-b"].answer("GET", HERE + "/progress", body={**failed, "state": "running"})
        assert wait_for_progress(agent, HERE, 30, 5.0, RestoreFailed, "restore").progress == 40


def test_a_restore_waits_as_long_as_its_pe_catches_up_and_no_longer() -> None:
    """The backlog of a late restore fits no fixed time: it waits on while the progress
    grows, and fails once a whole timeout passed without any (a restore that failed on the
    backlog failed again, with more of it, at every attempt)."""
    import threading
    import time

    with standins("fog-b") as agents:
        agent = ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b")
        done = threading.Event()

        def at(position: int) -> None:
            agents["fog-b"].answer("GET", HERE + "/progress", body={
                "pipeline": "p", "element": "alarms", "state": "running",
                "committed_batch": position, "progress": position})  # fmt: skip

        def catch_up() -> None:
            for position in range(1, 31):
                at(position)
                if done.wait(0.1):
                    return

        at(0)
        feeder = threading.Thread(target=catch_up)
        feeder.start()
        try:
            with pytest.raises(RestoreFailed, match="did not reach input position 30 in 1 s"):
                wait_for_progress(agent, HERE, 30, 0.6, RestoreFailed, "restore of p/alarms")
            started = time.monotonic()
            info = wait_for_progress(agent, HERE, 30, 0.6, RestoreFailed, "restore of p/alarms",
                                     while_moving=True)  # fmt: skip
            assert info.progress == 30 and time.monotonic() - started > 0.6
        finally:
            done.set()
            feeder.join()
        # Stuck at 30: one timeout without progress ends the wait.
        with pytest.raises(RestoreFailed, match="in 0 s without progress"):
            wait_for_progress(agent, HERE, 31, 0.4, RestoreFailed, "restore of p/alarms",
                              while_moving=True)  # fmt: skip


def test_a_pe_whose_query_cannot_read_the_checkpoint_it_was_given_ends_the_wait_at_once() -> None:
    """Every start fails on it (a restore's central checkpoint torn alike, a move's copy):
    waited for to the end of the timeout, each try of a restore took minutes."""
    with standins("fog-b") as agents:
        failed = {"pipeline": "p", "element": "alarms", "state": "failed", "retry_in_s": 4.0,
                  "committed_batch": 3, "progress": 40, "error": "[CANNOT_LOAD_STATE_STORE]",
                  "unreadable": "Spark cannot load its state: X"}  # fmt: skip
        agents["fog-b"].answer("GET", HERE + "/progress", body=failed)
        agent = ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b")
        with pytest.raises(RestoreFailed) as ended:
            wait_for_progress(agent, HERE, 50, 120.0, RestoreFailed, "restore of p/alarms")
        assert ended.value.message == (
            "restore of p/alarms: the PE's query cannot read the checkpoint it was given "
            "(Spark cannot load its state: X)"
        )
