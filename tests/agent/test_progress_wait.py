"""The agent's long-polled ``GET .../progress``: an answer that asks to wait for a change
comes when Spark reports a batch or the PE's state changes, and reads the PE's position once
per report, not once per poll. No Spark: the position and the reports are faked."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fogshift.agent.exceptions import UnknownElement
from fogshift.agent.node import HostedElement, NodeRuntime, PEState
from fogshift.common.progress import progress_params
from fogshift.contracts import ElementProgress
from fogshift.runtime.progress import ProgressFeed
from tests.agent.test_node_restarts import hosted


class Positions:
    """The PE's position as the agent would read it (from its checkpoint and query), and
    how many times it was read."""

    def __init__(self, runtime: NodeRuntime) -> None:
        self.progress = 5
        self.reads = 0
        self.runtime = runtime

    def __call__(self, hosted: HostedElement) -> ElementProgress:
        self.reads += 1
        info = self.runtime.describe(hosted)
        return ElementProgress(**info.model_dump(), progress=self.progress)


@pytest.fixture
def setup(runtime: NodeRuntime, tmp_path: Path) -> tuple[NodeRuntime, HostedElement, Positions]:
    element = hosted(tmp_path)
    element.state = PEState.RUNNING
    runtime._elements[("x", "p")] = element
    positions = Positions(runtime)
    runtime._position = positions  # type: ignore[method-assign]
    return runtime, element, positions


def later(seconds: float, action: object) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()))  # type: ignore[operator]
    thread.start()
    return thread


def test_the_feed_wakes_a_waiter_when_a_report_comes() -> None:
    feed = ProgressFeed()
    assert feed.wait_beyond(0, 0.05) == 0  # none came: the wait ran out
    thread = later(0.1, lambda: feed.put('{"name": "q", "batchId": 0}'))
    assert feed.wait_beyond(0, 30) == 1
    thread.join()
    assert feed.wait_beyond(0, 0) == 1  # one came before: no wait at all
    assert feed.drain() == {"q": [{"name": "q", "batchId": 0}]}  # and it is still queued


def test_an_answer_that_differs_from_what_the_caller_saw_comes_at_once(setup) -> None:  # type: ignore[no-untyped-def]
    runtime, _, positions = setup
    started = time.monotonic()
    info = runtime.progress("x", "p", changed_from=(4, PEState.RUNNING), wait_s=30)
    assert info.progress == 5 and positions.reads == 1
    info = runtime.progress("x", "p", changed_from=(5, PEState.STARTING), wait_s=30)
    assert info.state == PEState.RUNNING and positions.reads == 2
    assert time.monotonic() - started < 10  # neither waited for its 30 s


def test_without_a_change_the_answer_waits_and_reads_the_position_once(setup) -> None:  # type: ignore[no-untyped-def]
    runtime, _, positions = setup
    started = time.monotonic()
    info = runtime.progress("x", "p", changed_from=(5, PEState.RUNNING), wait_s=0.5)
    assert time.monotonic() - started >= 0.5
    # Polled every 20 ms, that would have been ~25 reads of checkpoint files and the query.
    assert (info.progress, positions.reads) == (5, 1)
    # No wait asked: the answer is at once, whatever the caller saw.
    assert runtime.progress("x", "p").progress == 5


def test_a_report_of_a_commit_ends_the_wait_with_the_new_position(setup) -> None:  # type: ignore[no-untyped-def]
    runtime, _, positions = setup

    def commit() -> None:
        positions.progress = 9
        runtime.progress_feed.put('{"name": "x.p", "batchId": 3}')

    thread = later(0.2, commit)
    info = runtime.progress("x", "p", changed_from=(5, PEState.RUNNING), wait_s=30)
    thread.join()
    assert info.progress == 9 and positions.reads == 2


def test_another_queries_report_does_not_end_the_wait_by_itself(setup) -> None:  # type: ignore[no-untyped-def]
    runtime, _, positions = setup
    thread = later(0.1, lambda: runtime.progress_feed.put('{"name": "x.other", "batchId": 1}'))
    started = time.monotonic()
    info = runtime.progress("x", "p", changed_from=(5, PEState.RUNNING), wait_s=0.6)
    thread.join()
    # Read again at the report (it might have been this PE's), then waited on.
    assert time.monotonic() - started >= 0.6
    assert (info.progress, positions.reads) == (5, 2)


def test_a_state_change_without_a_report_ends_the_wait(setup) -> None:  # type: ignore[no-untyped-def]
    runtime, hosted, _ = setup

    def fail() -> None:
        hosted.state = PEState.FAILED
        hosted.error = "broker away"

    thread = later(0.2, fail)
    info = runtime.progress("x", "p", changed_from=(5, PEState.RUNNING), wait_s=30)
    thread.join()
    assert (info.state, info.error) == (PEState.FAILED, "broker away")


def test_a_pe_removed_during_the_wait_ends_it_as_unknown(setup) -> None:  # type: ignore[no-untyped-def]
    runtime, _, _ = setup
    thread = later(0.2, lambda: runtime._elements.pop(("x", "p")))
    with pytest.raises(UnknownElement, match="does not host x/p") as gone:
        runtime.progress("x", "p", changed_from=(5, PEState.RUNNING), wait_s=30)
    thread.join()
    # (What it hosts, and what was asked: the node-facing refusals said neither.)
    assert (gone.value.expected, gone.value.received) == ("none: it hosts no PE", "x/p")


def test_the_callers_query_names_what_it_saw_only_when_it_waits() -> None:
    seen = ElementProgress(pipeline="x", element="p", kind="map", inputs=["s"],
                           state=PEState.RUNNING, epoch=1, progress=7)  # fmt: skip
    assert progress_params(None, 1.0) == {}  # the first question is answered at once
    assert progress_params(seen, 0.0) == {}
    assert progress_params(seen, 0.25) == {"wait_s": 0.25, "seen": 7, "state": "running"}
