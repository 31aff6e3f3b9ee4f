"""How the node agent follows its queries: it restarts a failed one with backoff (a PE that
cannot be built only a bounded number of times, with the error in its status), and counts
their progress, also into its node-level checkpoints. No Spark: the query is faked."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fogshift.agent import node
from fogshift.agent.node import (
    ELEMENT_ERROR_RESTARTS,
    METRICS_FILE,
    RESTART_BACKOFF_MAX_S,
    UNREADABLE_FAILURES,
    HostedElement,
    NodeRuntime,
    PEState,
    python_error,
    spark_failure,
    spark_head,
)
from fogshift.checkpoint.spark_dir import unpack
from fogshift.runtime.engine import QueryPlan
from fogshift.runtime.exceptions import ElementError
from fogshift.spec.models import ElementSpec

# What Spark 4 reports for an exception raised in a Python worker (abridged).
WORKER_FAILURE = """[PYTHON_EXCEPTION] An exception was thrown from the Python worker: \
Traceback (most recent call last):
  File "/x/engine.py", line 7, in handleInputRows
    raise ValueError("inner")
ValueError: inner

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/batch.py", line 9, in _rebuild
    raise ElementError(...)
fogshift.runtime.exceptions.ElementError: processor 'p' of pipeline 'x' cannot be built \
from its state: BadState: no
hint: its restore() must accept what snapshot() returned
 SQLSTATE: 38000
=== Streaming Query ===
Identifier: [id = 1]
\tat org.apache.spark.sql.execution.SQLExecution$.withNewExecutionId(SQLExecution.scala:317)
"""


def batch(batch_id: int, rows: int) -> dict[str, Any]:
    """The progress of a batch that ran (Spark times its ``addBatch``)."""
    return {"batchId": batch_id, "numInputRows": rows, "durationMs": {"addBatch": 3}}


def idle(next_batch: int) -> dict[str, Any]:
    """The progress of an idle trigger: it names the batch still to come."""
    return {"batchId": next_batch, "numInputRows": 0, "durationMs": {"latestOffset": 1}}


class FakeQuery:
    def __init__(self, error: str | None = None) -> None:
        self.isActive = error is None
        self.error = error
        self.runId = "run-1"
        self.lastProgress: dict[str, Any] | None = None
        self.status = {"isTriggerActive": False}

    def exception(self) -> Any:
        return RuntimeError(self.error) if self.error else None

    def stop(self) -> None:
        self.isActive = False


def hosted(tmp_path: Path) -> HostedElement:
    element = ElementSpec(id="p", kind="map", node="n1", inputs=("s",), options={"set": {"x": "1"}})
    plan = QueryPlan("x", element, str(tmp_path / "broker.json"), str(tmp_path / "cp"))
    return HostedElement(plan=plan)


def test_python_error_takes_the_outermost_exception_out_of_sparks_text() -> None:
    assert python_error(WORKER_FAILURE) == (
        "ElementError",
        "processor 'p' of pipeline 'x' cannot be built from its state: BadState: no\n"
        "hint: its restore() must accept what snapshot() returned",
    )
    assert python_error("java.io.IOException: disk full") is None


WORKER_DIED = (
    "Job aborted due to stage failure: Task 0 in stage 744.0 failed 1 times, most recent "
    "failure: Lost task 0.0 in stage 744.0 (TID 744) (127.0.0.1 executor driver): "
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handle(x.scala:1)\n"
    "Caused by: java.io.EOFException\n"
)


def test_a_failure_that_is_no_python_exception_is_said_in_one_line() -> None:
    assert spark_failure(WORKER_DIED).startswith(
        "its Python worker exited unexpectedly, not while processing an event"
    )
    assert "processing an event (a second time" in spark_failure(WORKER_DIED, in_event=True)
    nested = (
        "org.apache.spark.SparkException: boom\n\tat x\nCaused by: java.io.IOException: disk full\n"
    )
    assert spark_failure(nested) == "java.io.IOException: disk full"
    assert spark_failure("query stopped by itself") == "query stopped by itself"


def test_a_worker_that_died_outside_an_event_is_said_in_the_log_and_the_status(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A snapshot() that ended its worker: only "restarting (try n)" was logged, and the
    # status cut Spark's text before the words that said what died.
    monkeypatch.setattr(node, "start_query", lambda spark, plan: FakeQuery(WORKER_DIED))
    h = hosted(tmp_path)
    runtime._start_query(h)
    with caplog.at_level("WARNING", logger="fogshift.agent"):
        runtime._check(h)
    assert h.state == PEState.FAILED
    said = "its Python worker exited unexpectedly, not while processing an event"
    assert (h.error or "").startswith(said), h.error
    assert "Job aborted due to stage failure" in (h.error or "")  # (Spark's text after it)
    # Without Spark's stack (or plan): the node's log has it.
    assert "\tat org.apache" not in (h.error or "") and "fogshift logs NODE" in (h.error or "")
    plan = "java.io.IOException: disk full SQLSTATE: 58030\n=== Streaming Query ===\nPlan"
    assert spark_head(plan) == "java.io.IOException: disk full"
    assert any(said in r.getMessage() and "x.p failed" in r.getMessage() for r in caplog.records)
    # The same failure again is logged in one line until a batch commits (a node cut off
    # from the broker failed its PEs at every restart, each with ~200 lines of stack).
    caplog.clear()
    with caplog.at_level("WARNING", logger="fogshift.agent"):
        for _ in range(2):
            runtime._start_query(h)
            runtime._check(h)
    again = [r.getMessage() for r in caplog.records if "x.p failed" in r.getMessage()]
    assert again == [f"x.p failed again, as before: {said} (in a hook such as snapshot(), or "
                     "killed: out of memory?)"] * 2  # fmt: skip
    h.failure_said = None  # (as when a batch commits: the next failure in full again)
    caplog.clear()
    with caplog.at_level("WARNING", logger="fogshift.agent"):
        runtime._start_query(h)
        runtime._check(h)
    assert any("Job aborted" in r.getMessage() for r in caplog.records)


def run_monitor(rt: NodeRuntime, h: HostedElement, rounds: int) -> list[int]:
    """Let time pass for every scheduled restart; the delays the agent chose."""
    delays = []
    for _ in range(rounds):
        if h.retry_at == math.inf:
            break
        delays.append(round(h.retry_at - time.monotonic()))
        h.retry_at = 0.0  # the backoff has elapsed
        rt._check(h)
    return delays


def test_a_pe_that_cannot_be_built_gives_up_after_bounded_restarts(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def start_query(spark: Any, plan: QueryPlan) -> Any:
        calls.append(plan.element.id)
        raise ElementError("cannot import processor class 'nope:Missing': ModuleNotFoundError")

    monkeypatch.setattr(node, "start_query", start_query)
    h = hosted(tmp_path)
    runtime._start_query(h)
    delays = run_monitor(runtime, h, rounds=20)
    assert delays == [1, 2, 4]
    assert len(calls) == 1 + ELEMENT_ERROR_RESTARTS
    assert (h.state, h.restarts, h.retry_at) == ("failed", ELEMENT_ERROR_RESTARTS, math.inf)
    assert "ElementError: cannot import processor class 'nope:Missing'" in (h.error or "")
    assert f"gave up after {ELEMENT_ERROR_RESTARTS} restarts in a row" in (h.error or "")
    info = runtime.describe(h).model_dump()
    assert (info["state"], info["restarts"]) == ("failed", ELEMENT_ERROR_RESTARTS)
    assert info["error"] == h.error
    runtime._check(h)  # never again
    assert len(calls) == 1 + ELEMENT_ERROR_RESTARTS


def test_a_worker_side_element_error_is_bounded_too_and_reported_short(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node, "start_query", lambda spark, plan: FakeQuery(WORKER_FAILURE))
    h = hosted(tmp_path)
    runtime._start_query(h)
    runtime._check(h)  # the query died in its first batch
    assert h.state == "failed"
    assert h.error == (
        "ElementError: processor 'p' of pipeline 'x' cannot be built from its state: BadState:"
        " no\nhint: its restore() must accept what snapshot() returned"
    )
    delays = []
    for _ in range(20):
        if h.retry_at == math.inf:
            break
        delays.append(round(h.retry_at - time.monotonic()))
        h.retry_at = 0.0
        runtime._check(h)  # restart
        runtime._check(h)  # and see it fail again
    assert delays == [1, 2, 4]
    assert h.restarts == ELEMENT_ERROR_RESTARTS and "gave up" in (h.error or "")


def started_failing(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> HostedElement:
    """A PE started by ``runtime`` whose every query fails (its broker gone)."""
    monkeypatch.setattr(node, "start_query", lambda spark, plan: FakeQuery("broker gone"))
    h = hosted(tmp_path)
    runtime._start_query(h)
    return h


def test_other_failures_are_retried_with_capped_backoff_and_reset_by_progress(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = started_failing(runtime, tmp_path, monkeypatch)
    delays = []
    for _ in range(8):
        runtime._check(h)  # it fails
        delays.append(round(h.retry_at - time.monotonic()))
        h.retry_at = 0.0
        runtime._check(h)  # restart
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert max(delays) == RESTART_BACKOFF_MAX_S
    assert h.state == "running" and h.restarts == 8
    # A query that commits a batch after its restart works: the backoff starts over.
    h.query = FakeQuery()  # type: ignore[assignment]
    runtime._check(h, [batch(b, 1) for b in range(3)])
    assert h.failures == 0
    h.query = FakeQuery("broker gone again")  # type: ignore[assignment]
    runtime._check(h)
    assert round(h.retry_at - time.monotonic()) == 1
    # Failing for hours (a broker cut off): still 30 s (2 ** 1024 raised OverflowError, its
    # restart time left in the past: restarted every monitor round).
    h.failures, h.retry_at = 2000, 0.0
    runtime._check(h)  # restart
    runtime._check(h)  # it fails
    assert round(h.retry_at - time.monotonic()) == RESTART_BACKOFF_MAX_S


def test_a_pe_failing_in_a_row_on_a_checkpoint_spark_cannot_read_is_reported_so(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An emptied state file failed every start at the first batch, the agent retrying for
    # good: reported after UNREADABLE_FAILURES in a row, for the orchestrator to restore it
    # from central. Another failure between, or a committed batch, starts the count over.
    torn = "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state."
    monkeypatch.setattr(node, "start_query", lambda spark, plan: FakeQuery(torn))
    monkeypatch.setattr(node, "UNREADABLE_SPAN_S", 0.0)  # (below: the span)
    h = hosted(tmp_path)
    runtime._start_query(h)
    said = []
    for failing in [torn, torn, "broker gone", torn, torn, torn]:
        h.query = FakeQuery(failing)  # type: ignore[assignment]
        runtime._check(h)  # it fails
        said.append(runtime.describe(h).unreadable)
        h.retry_at = 0.0
        runtime._check(h)  # restart
    assert UNREADABLE_FAILURES == 3
    told = "Spark cannot load its state: CANNOT_LOAD_STATE_STORE.UNCATEGORIZED"
    assert said == [None, None, None, None, None, told], said
    # Running again (its restart's query): not said while it runs; a batch it commits ends it.
    assert h.state == "running" and runtime.describe(h).unreadable is None
    h.query = FakeQuery()  # type: ignore[assignment]
    runtime._check(h, [batch(b, 1) for b in range(3)])
    h.query = FakeQuery(torn)  # type: ignore[assignment]
    runtime._check(h)
    assert h.state == "failed" and runtime.describe(h).unreadable is None
    # Failures in a row within UNREADABLE_SPAN_S (it may pass) are not reported yet; nor
    # an exception the PE's own code raised, whatever its text says.
    monkeypatch.setattr(node, "UNREADABLE_SPAN_S", 60.0)
    for _ in range(4):
        h.retry_at = 0.0
        runtime._check(h)  # restart
        h.query = FakeQuery(torn)  # type: ignore[assignment]
        runtime._check(h)
    assert h.unreadable_failures == 5 and runtime.describe(h).unreadable is None
    h.unreadable_since -= 60
    assert runtime.describe(h).unreadable == told
    h.retry_at = 0.0
    runtime._check(h)  # restart
    h.query = FakeQuery(WORKER_FAILURE.replace("BadState: no", torn))  # type: ignore[assignment]
    runtime._check(h)
    assert h.unreadable_failures == 0 and runtime.describe(h).unreadable is None


def test_a_clock_stepped_back_delays_no_restart(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fog device without a real-time clock gets its time from NTP after it has started:
    # a step back of an hour held every failed PE of the node that hour.
    h = started_failing(runtime, tmp_path, monkeypatch)
    runtime._check(h)  # it fails: the first restart 1 s later
    assert h.state == "failed"
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    deadline = time.monotonic() + 10
    while h.restarts == 0 and time.monotonic() < deadline:
        runtime._check(h)
        time.sleep(0.05)
    assert h.restarts == 1


def test_a_fenced_query_ends_its_run_so_its_kept_processors_are_revoked(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    from fogshift.broker.exceptions import FENCED_TOKEN
    from fogshift.runtime.gate import current_run, start_run

    h = hosted(tmp_path)
    gate = runtime.gate_file("x", "p")
    gate.parent.mkdir(parents=True, exist_ok=True)
    h.plan = replace(h.plan, gate_file=str(gate))
    start_run(gate)
    h.state, h.query = PEState.RUNNING, FakeQuery(f"{FENCED_TOKEN}: epoch 3 took over")  # type: ignore[assignment]
    runtime._check(h)
    assert h.state == PEState.FENCED and h.query is None
    assert current_run(gate) is None
    assert h.error == f"{FENCED_TOKEN}: epoch 3 took over"


def test_a_fenced_pes_status_says_what_fenced_it_without_sparks_plan(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    from fogshift.broker.exceptions import FENCED_TOKEN

    fenced = (
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most "
        'recent call last):\n  File "/x/csv_io.py", line 9, in _append\n    raise Fenced(x)\n'
        f"fogshift.broker.exceptions.Fenced: {FENCED_TOKEN}: sink p/sink runs under epoch 2, "
        "but epoch 3 has written /o.csv: this instance must not write SQLSTATE: 38000\n"
        "=== Streaming Query ===\nIdentifier: [id = 1]\n\tat org.apache.spark.X(x.scala:1)\n"
    )
    h = hosted(tmp_path)
    h.state, h.query = PEState.RUNNING, FakeQuery(fenced)  # type: ignore[assignment]
    runtime._check(h)
    assert h.state == PEState.FENCED
    assert h.error == (
        f"Fenced: {FENCED_TOKEN}: sink p/sink runs under epoch 2, but epoch 3 has written "
        "/o.csv: this instance must not write"
    )


def test_a_stop_whose_clean_up_fails_leaves_the_pe_stopped_not_running(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk error while cutting the stopped query's checkpoint path: the PE stayed RUNNING
    # with no query, which the monitor never looks at again.
    def broken(path: Path) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(node, "close_location", broken)
    h = hosted(tmp_path)
    h.plan = replace(h.plan, location=str(tmp_path / "loc"))
    h.state, h.query = PEState.RUNNING, FakeQuery()  # type: ignore[assignment]
    with pytest.raises(OSError):
        runtime._stop_query(h)
    assert (h.state, h.query) == (PEState.STOPPED, None)


def test_events_in_counts_a_batch_that_follows_an_idle_trigger(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    h = hosted(tmp_path)
    h.query = FakeQuery()  # type: ignore[assignment]
    runtime._check(h, [batch(0, 2), idle(1), idle(1), batch(1, 5), idle(2)])
    assert (h.events_in, h.last_batch) == (7, 1)
    runtime._check(h, [batch(2, 4)])
    assert (h.events_in, h.last_batch) == (11, 2)


def test_a_snapshot_carries_the_state_metrics_of_the_batch_it_froze(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    h = hosted(tmp_path)
    h.state = PEState.RUNNING
    h.run_ids.add("run-1")
    runtime._elements[h.key] = h
    live = Path(h.plan.checkpoint_dir)
    (live / "offsets").mkdir(parents=True)
    (live / "commits").mkdir()
    (live / "offsets" / "0").write_text('v1\n{}\n{"row": 2}')
    (live / "commits" / "0").write_text("v1\n{}")
    # Spark reported batch 0 as it committed; the monitor has not looked since.
    report = {
        **batch(0, 2), "name": h.plan.query_name, "runId": "run-1",
        "stateOperators": [{"commitTimeMs": 4, "allUpdatesTimeMs": 5, "numRowsTotal": 1}],
    }  # fmt: skip
    runtime.progress_feed._reports.put(json.dumps(report))
    runtime.snapshot_all()
    manifest = runtime.latest_snapshot("x", "p")
    assert manifest is not None and manifest.batch == 0
    assert manifest.state_store is not None and manifest.state_store.commit_ms == 4
    assert h.events_in == 2 and h.last_batch == 0  # counted once, not again by the monitor
    runtime._check(h, [])
    assert h.events_in == 2


def _running(runtime: NodeRuntime, tmp_path: Path, resumed: int, counted: int) -> HostedElement:
    """A running PE whose query started on a checkpoint of batch ``resumed`` and has counted
    batches up to ``counted`` (its counters file, in its checkpoint folder, says so)."""
    h = hosted(tmp_path)
    live = runtime.checkpoint_dir("x", "p")
    h.plan = replace(h.plan, checkpoint_dir=str(live))
    h.state, h.resumed_batch, h.last_batch, h.events_in = PEState.RUNNING, resumed, counted, 5
    h.run_ids.add("run-1")
    runtime._elements[h.key] = h
    (live / "offsets").mkdir(parents=True)
    (live / "commits").mkdir()
    (live / METRICS_FILE).write_text(json.dumps({"events_in": 5, "last_batch": counted}))
    return h


def _commit(runtime: NodeRuntime, *batches: int) -> None:
    live = runtime.checkpoint_dir("x", "p")
    for b in batches:
        (live / "offsets" / str(b)).write_text(f'v1\n{{}}\n{{"row": {b + 2}}}')
        (live / "commits" / str(b)).write_text("v1\n{}")


def _frozen_counters(runtime: NodeRuntime) -> tuple[int, dict[str, int]]:
    manifest = runtime.latest_snapshot("x", "p")
    assert manifest is not None
    folder = runtime.snapshot_store("x", "p") / manifest.id
    return manifest.batch, json.loads((folder / METRICS_FILE).read_text())


def test_a_snapshot_waits_for_the_count_of_the_batch_it_freezes(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark hands a batch's progress report over after its commit. A snapshot taken between
    # the two froze counters a batch behind, and every instance started from it stayed short
    # of that batch's rows for good (Case 2's restored classifier: 338 of 384, its demo
    # waiting for the rest until its deadline).
    monkeypatch.setattr(node, "COUNT_WAIT_S", 0.2)
    h = _running(runtime, tmp_path, resumed=0, counted=0)
    _commit(runtime, 0, 1)  # batch 1 is this run's: its report is still to come
    runtime.snapshot_all()
    assert runtime.latest_snapshot("x", "p") is None  # put off, not frozen uncounted
    assert h.uncounted_since is not None
    # The report comes while the next round waits: counted, then frozen with its batch.
    report = {**batch(1, 7), "name": h.plan.query_name, "runId": "run-1"}
    threading.Timer(0.1, runtime.progress_feed._reports.put, [json.dumps(report)]).start()
    monkeypatch.setattr(node, "COUNT_WAIT_S", 10.0)
    runtime.snapshot_all()
    assert _frozen_counters(runtime) == (1, {"events_in": 12, "last_batch": 1, "batches": {"1": 7}})
    assert h.uncounted_since is None


def test_batches_that_came_with_the_checkpoint_are_frozen_at_once_and_a_lost_report_only_delays(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node, "COUNT_WAIT_S", 0.05)
    # Started on a copy of batch 1 whose counters lag (no report of it ever comes here).
    h = _running(runtime, tmp_path, resumed=1, counted=0)
    _commit(runtime, 0, 1)
    runtime.snapshot_all()
    assert _frozen_counters(runtime)[0] == 1
    # Batch 2 is this run's, and its report never comes: put off, then taken all the same.
    _commit(runtime, 2)
    runtime.snapshot_all()
    assert _frozen_counters(runtime)[0] == 1
    monkeypatch.setattr(node, "UNCOUNTED_LIMIT_S", 0.0)
    runtime.snapshot_all()
    assert _frozen_counters(runtime)[0] == 2
    # Given up on once: no later round waits for that report again.
    assert runtime._wait_counted(h, time.monotonic()) is None and h.uncounted_since is None


def test_a_batch_committed_while_the_snapshot_copies_is_not_frozen_uncounted(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _running(runtime, tmp_path, resumed=0, counted=1)
    _commit(runtime, 0, 1)
    real = node.take_snapshot

    def committing_first(*args: Any, **kwargs: Any) -> Any:
        _commit(runtime, 2)  # after the round found batch 1 counted, before the copy
        return real(*args, **kwargs)

    monkeypatch.setattr(node, "take_snapshot", committing_first)
    runtime.snapshot_all()
    assert runtime.latest_snapshot("x", "p") is None and h.uncounted_since is not None
    assert list(runtime.snapshot_store("x", "p").iterdir()) == []  # the staged copy dropped
    # take_snapshot's check of the staged copy: its counters must cover the batch it froze.
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / METRICS_FILE).write_text(json.dumps({"events_in": 9, "last_batch": 1}))
    assert runtime._covers(h, staged, 1) and runtime._covers(h, staged, 0)
    assert not runtime._covers(h, staged, 2)  # committed after the count: put off
    (staged / METRICS_FILE).unlink()
    assert not runtime._covers(h, staged, 1)  # this run's batch, no counters at all
    h.resumed_batch = 3
    assert runtime._covers(h, staged, 3)  # came with the checkpoint: nothing to wait for


def test_a_literal_copy_waits_for_the_count_of_its_last_batch(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    h = _running(runtime, tmp_path, resumed=0, counted=0)
    _commit(runtime, 0, 1)
    report = {**batch(1, 7), "name": h.plan.query_name, "runId": "run-1"}
    threading.Timer(0.1, runtime.progress_feed._reports.put, [json.dumps(report)]).start()
    data, digest, info = runtime.checkpoint("x", "p", warm=False)
    assert info.batch == 1 and h.last_batch == 1
    copy = tmp_path / "copy"
    unpack(data, digest, copy)
    saved = json.loads((copy / METRICS_FILE).read_text())
    assert saved == {"events_in": 12, "last_batch": 1, "batches": {"1": 7}}


def test_a_warm_copys_target_counts_the_batches_it_runs_again(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Case 2's classifier handed over, then restored from its target's copy, counted 96 of
    # its 384 windows for good: a warm copy drops its last commit, but its counters said
    # batches after it were counted already, and the target's batches of those ids (new
    # input) were never counted.
    h = _running(runtime, tmp_path, resumed=-1, counted=-1)
    live = runtime.checkpoint_dir("x", "p")
    for b, end in ((0, 2), (1, 7), (2, 7)):  # batch 2 read nothing (a no-data batch)
        (live / "offsets" / str(b)).write_text(f'v1\n{{}}\n{{"row": {end}}}')
        (live / "commits" / str(b)).write_text("v1\n{}")
    h.events_in = 0
    runtime._check(h, [batch(0, 2), batch(1, 5), batch(2, 0)])
    assert (h.events_in, h.last_batch) == (7, 2)
    data, digest, info = runtime.checkpoint("x", "p", warm=True)
    assert info.batch == 1  # run again on the copy (its commit dropped); batch 2 left out
    target = NodeRuntime(runtime.config.model_copy(update={"name": "n2", "home": tmp_path / "n2"}))
    target.spark = object()  # type: ignore[assignment]
    target.install_checkpoint("x", "p", data, digest)
    monkeypatch.setattr(node, "start_query", lambda spark, plan: FakeQuery())
    target.deploy("x", h.plan.element.model_copy(update={"node": "n2"}), fresh=False, epoch=2)
    moved = target.hosted("x", "p")
    assert (moved.events_in, moved.last_batch) == (2, 0)  # as of the copy's batch
    saved = json.loads((target.checkpoint_dir("x", "p") / METRICS_FILE).read_text())
    assert saved == {"events_in": 2, "last_batch": 0, "batches": {"0": 2}}
    # Batch 1 again (the same rows), then a batch 2 that reads new input here.
    target._check(moved, [batch(1, 5), batch(2, 9)])
    assert (moved.events_in, moved.last_batch) == (16, 2)


def test_a_warm_copy_waits_for_the_counts_of_the_batches_it_keeps_committed(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    # A warm copy keeps its commits up to the one before its last busy batch: those
    # batches never run again where it goes. Its counters, a second or more behind them
    # (the monitor counts once a second), left the target short of their rows for good.
    h = _running(runtime, tmp_path, resumed=0, counted=0)
    live = runtime.checkpoint_dir("x", "p")
    for b in range(4):
        (live / "offsets" / str(b)).write_text(f'v1\n{{}}\n{{"row": {10 * (b + 1)}}}')
        (live / "commits" / str(b)).write_text("v1\n{}")
    reports = [{**batch(b, 10), "name": h.plan.query_name, "runId": "run-1"} for b in (1, 2, 3)]

    def report_late() -> None:  # in their order, as Spark's listener bus posts them
        for report in reports:
            runtime.progress_feed._reports.put(json.dumps(report))

    threading.Timer(0.1, report_late).start()
    data, digest, info = runtime.checkpoint("x", "p", warm=True)
    assert info.batch == 3  # batches 1 and 2 stay committed in the copy
    copy = tmp_path / "copy"
    unpack(data, digest, copy)
    saved = json.loads((copy / METRICS_FILE).read_text())
    assert saved["last_batch"] >= 2 and saved["events_in"] >= 25, saved


def test_a_query_stopped_to_start_again_on_its_checkpoint_counts_its_last_batches_first(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restart on the PE's own checkpoint (the reconciler's, a scale's consumers, the
    # agent's next start) runs no committed batch again: reports still on their way when
    # the query stopped were dropped with it, and their rows never counted.
    h = _running(runtime, tmp_path, resumed=0, counted=0)
    h.query = FakeQuery()  # type: ignore[assignment]
    _commit(runtime, 0, 1)
    report = {**batch(1, 7), "name": h.plan.query_name, "runId": "run-1"}
    threading.Timer(0.1, runtime.progress_feed._reports.put, [json.dumps(report)]).start()
    runtime.remove("x", "p")
    saved = json.loads((runtime.checkpoint_dir("x", "p") / METRICS_FILE).read_text())
    assert (saved["events_in"], saved["last_batch"]) == (12, 1)
    # Redeployed there: counted as of its commit, nothing short.
    monkeypatch.setattr(node, "start_query", lambda spark, plan: FakeQuery())
    runtime.deploy("x", h.plan.element, fresh=False, epoch=2)
    assert (runtime.hosted("x", "p").events_in, runtime.hosted("x", "p").last_batch) == (12, 1)


def test_counters_without_the_rows_of_their_batches_are_taken_as_they_are(
    runtime: NodeRuntime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Written before the rows per batch were kept: the batches ahead run again and are
    # counted again (an input count over, never one short for good); a warning says so.
    h = hosted(tmp_path)
    runtime._resume(h, {"events_in": 9, "last_batch": 3}, committed=1)
    assert (h.events_in, h.last_batch) == (9, 1)
    assert "batches [2, 3]" in caplog.text
    runtime._resume(h, {"events_in": 9, "last_batch": 3, "batches": {"3": 4}}, committed=None)
    assert (h.events_in, h.last_batch) == (5, -1) and h.batch_rows == {}
    runtime._resume(h, {"events_in": 9, "last_batch": 3}, committed=5)  # behind: kept
    assert (h.events_in, h.last_batch) == (9, 3)


def test_one_pe_whose_checkpoint_went_mid_snapshot_stops_no_other_pes_snapshots(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    # A PE removed while it is snapshotted: its commit is listed, its offsets are gone.
    gone, kept = hosted(tmp_path / "gone"), hosted(tmp_path / "kept")
    gone.plan = QueryPlan("y", gone.plan.element, gone.plan.broker_file, gone.plan.checkpoint_dir)
    for h in (gone, kept):
        h.state = PEState.RUNNING
        runtime._elements[h.key] = h
        live = Path(h.plan.checkpoint_dir)
        (live / "offsets").mkdir(parents=True)
        (live / "commits").mkdir()
        (live / "commits" / "0").write_text("v1\n{}")
    (Path(kept.plan.checkpoint_dir) / "offsets" / "0").write_text('v1\n{}\n{"row": 2}')
    assert runtime.snapshots_at is None
    runtime.snapshot_all()  # the first PE's CheckpointError is logged, not raised
    assert runtime.latest_snapshot("y", "p") is None
    manifest = runtime.latest_snapshot("x", "p")
    assert manifest is not None and manifest.batch == 0
    # Heartbeats tell it: the failure, by PE, and that the round itself ended.
    error = runtime.describe(gone).snapshot_error
    assert error is not None and error.startswith("CheckpointError: ") and "purged" in error
    assert runtime.describe(kept).snapshot_error is None
    ended = runtime.snapshots_at
    assert ended is not None
    # The next snapshot that succeeds clears it.
    (Path(gone.plan.checkpoint_dir) / "offsets" / "0").write_text('v1\n{}\n{"row": 2}')
    runtime.snapshot_all()
    assert runtime.describe(gone).snapshot_error is None
    assert runtime.latest_snapshot("y", "p") is not None
    assert runtime.snapshots_at is not None and runtime.snapshots_at >= ended


def test_a_fresh_sink_whose_file_cannot_be_written_is_refused_not_a_500(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fogshift.exceptions import InvalidInput

    started: list[str] = []
    monkeypatch.setattr(node, "start_query", lambda spark, plan: started.append("no"))
    (tmp_path / "out").mkdir()
    options = {"path": str(tmp_path / "out")}
    sink = ElementSpec.model_validate(
        {"id": "sink", "kind": "csv-sink", "node": "n1", "inputs": ["a"], "options": options}
    )
    with pytest.raises(InvalidInput) as refused:
        runtime.deploy("x", sink, fresh=True, epoch=1)
    assert "sink 'sink' of pipeline 'x' cannot write" in refused.value.message
    assert "on node 'n1'" in refused.value.message and refused.value.hint
    assert refused.value.received and "IsADirectoryError" in refused.value.received
    assert started == []
    # Deployed afresh over an instance running here: that one is stopped, and no longer
    # hosted (it stayed listed STOPPED, with no query and its checkpoint gone, for good).
    h = hosted(tmp_path)
    h.plan = replace(h.plan, element=sink)
    h.state, h.query = PEState.RUNNING, FakeQuery()  # type: ignore[assignment]
    runtime._elements[("x", "sink")] = h
    with pytest.raises(InvalidInput):
        runtime.deploy("x", sink, fresh=True, epoch=2)
    assert h.state == PEState.STOPPED and ("x", "sink") not in runtime._elements


def test_checkpoints_of_pes_the_node_does_not_run_are_reported(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    # Left by an instance removed while the agent was down: reported in heartbeats, for the
    # orchestrator to discard if the PE runs elsewhere (they stayed on disk for good).
    home = tmp_path
    folders = [
        *("checkpoints/p/gone", "node-checkpoints/p/gone", "node-checkpoints/p/old"),
        *("checkpoints/q/half.incoming", "checkpoints/p/runs", "checkpoints/p/x.y"),
    ]
    for folder in folders:
        (home / folder).mkdir(parents=True)
    (home / "checkpoints" / "p" / "file").write_text("not a folder")
    runtime._elements[("p", "runs")] = hosted(tmp_path)
    assert [(c.pipeline, c.element) for c in runtime.left()] == [
        ("p", "gone"),
        ("q", "half"),
        ("p", "old"),
    ]
    # Only an unfinished install's copy: nothing to resume from (the orchestrator then
    # takes the node for one without the PE's checkpoints: restored, not started empty).
    assert {c.element: c.partial for c in runtime.left()} == {
        "gone": False, "half": True, "old": False,
    }  # fmt: skip
    (home / "node-checkpoints" / "q" / "half").mkdir(parents=True)
    assert {c.element: c.partial for c in runtime.left()}["half"] is False


def test_a_deleted_pipelines_checkpoints_go_with_its_instances(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    # `fogshift delete`: what the node ran of the pipeline before, and runs now, is
    # discarded; another pipeline's is not (nor a file that is not a PE's).
    folders = [
        *("checkpoints/p/gone", "node-checkpoints/p/gone", "node-checkpoints/p/old"),
        *("checkpoints/p/half.incoming", "checkpoints/p/runs", "checkpoints/q/kept"),
    ]
    for folder in folders:
        (tmp_path / folder).mkdir(parents=True)
    for pipeline in ("p", "q"):  # the gates and crash marks of their PEs
        (tmp_path / "gates" / pipeline / "runs.json.crashes").mkdir(parents=True)
        (tmp_path / "gates" / pipeline / "runs.json").write_text("{}")
    runtime._elements[("p", "runs")] = hosted(tmp_path)
    removed = runtime.remove_pipeline("p", discard=True)
    assert len(removed) == 4 and {"gone", "half", "old"} <= {e.element for e in removed}
    assert ("p", "runs") not in runtime._elements
    for root in ("checkpoints", "node-checkpoints", "gates"):  # nothing of p is left
        assert not (tmp_path / root / "p").exists(), root
    assert (tmp_path / "gates" / "q" / "runs.json.crashes").is_dir()
    assert [(c.pipeline, c.element) for c in runtime.left()] == [("q", "kept")]
    # One PE at a time (the reconciler's discards, a node back after the delete): its
    # folders and gates go with the pipeline's last PE here.
    (tmp_path / "checkpoints" / "q" / "other").mkdir()
    runtime.remove("q", "kept", discard=True)
    assert (tmp_path / "gates" / "q").is_dir() and (tmp_path / "checkpoints" / "q").is_dir()
    runtime.remove("q", "other", discard=True)
    assert not (tmp_path / "gates" / "q").exists()
    assert not (tmp_path / "checkpoints" / "q").exists()
    # Without discard (a stop), checkpoints stay.
    (tmp_path / "checkpoints" / "p" / "again").mkdir(parents=True)
    assert runtime.remove_pipeline("p") == []
    assert (tmp_path / "checkpoints" / "p" / "again").is_dir()


def test_a_start_whose_checkpoint_location_cannot_be_opened_fails_and_is_retried(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk at the location's set-up: the PE stayed "starting" with no query for good
    # (the monitor skips a PE without one, and a deploy again answered it as it was).
    import errno

    started: list[str] = []
    monkeypatch.setattr(
        node, "start_query", lambda spark, plan: started.append("yes") or FakeQuery(None)
    )

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(node, "open_location", full)
    h = hosted(tmp_path)
    runtime._start_query(h)
    assert h.state == "failed" and "No space left" in (h.error or "") and started == []
    assert h.retry_at < math.inf  # the monitor starts it again once its backoff elapsed
    monkeypatch.undo()
    monkeypatch.setattr(
        node, "start_query", lambda spark, plan: started.append("yes") or FakeQuery(None)
    )
    run_monitor(runtime, h, rounds=1)
    assert started == ["yes"] and h.state == "running"


def test_an_agent_whose_spark_jvm_exited_stops_so_that_its_pes_are_restored(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The JVM killed for memory: the agent answered, its heartbeats said every PE ran, and
    # nothing was ever restored.
    # No gateway of pyspark's in this process (as in the unit tests): nothing to judge.
    assert node.jvm_exit_code() is None
    exits: list[int] = []
    runtime._exit = exits.append  # type: ignore[method-assign]
    monkeypatch.setattr(node, "jvm_exit_code", lambda: None)
    runtime._monitor_round()
    assert exits == []
    monkeypatch.setattr(node, "jvm_exit_code", lambda: 137)
    runtime._monitor_round()
    assert exits == [node.JVM_GONE_EXIT]


def test_a_sink_marker_that_cannot_be_read_does_not_fail_the_nodes_report(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    # On shared storage the marker may fail to read (a fault, a folder in its place): that
    # failed every heartbeat of the node, which was then declared lost.
    out = tmp_path / "out" / "o.csv"
    marker = out.with_name(f".{out.name}.fogshift.json")
    marker.mkdir(parents=True)
    element = ElementSpec(id="sink", kind="csv-sink", node="n1", inputs=("s",),
                          options={"path": str(out)})  # fmt: skip
    h = HostedElement(plan=QueryPlan("x", element, str(tmp_path / "b.json"), str(tmp_path / "c")))
    assert runtime.describe(h).lines_written is None


def test_one_element_error_after_broker_failures_is_restarted_not_given_up(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    # Every failure in a row counted: three broker failures and then one ElementError (an
    # on_assign() whose model file was briefly away) gave up on the PE for good.
    h = hosted(tmp_path)
    for _ in range(ELEMENT_ERROR_RESTARTS):
        runtime._failed(h, "broker gone")
    runtime._failed(h, "ElementError: the model file is not there", element_error=True)
    assert math.isfinite(h.retry_at) and "gave up" not in (h.error or "")
    for _ in range(ELEMENT_ERROR_RESTARTS):
        runtime._failed(h, "ElementError: the model file is not there", element_error=True)
    said = f"gave up after {ELEMENT_ERROR_RESTARTS} restarts in a row"
    assert h.retry_at == math.inf and said in (h.error or "")


@pytest.mark.parametrize(
    "error",
    [
        "OSError: [Errno 28] No space left on device: '/h/nodes/n1/checkpoints/x/p/tmp'",
        "StreamingQueryException: java.io.IOException: No space left on device",
    ],
)
def test_a_full_disk_is_said_to_be_the_nodes_and_the_pe_retried(
    runtime: NodeRuntime, tmp_path: Path, error: str
) -> None:
    h = hosted(tmp_path)
    runtime._failed(h, error)
    said = h.error or ""
    assert said.startswith(error), said
    assert f"the disk of node {runtime.config.name!r} is full" in said, said
    assert str(runtime.config.home) in said and "`fogshift restore`" in said, said
    assert h.state == PEState.FAILED and math.isfinite(h.retry_at)
    runtime._failed(h, "broker gone")  # another failure says only what it is
    assert h.error == "broker gone"


def test_a_full_disk_under_an_element_error_never_gives_the_pe_up(
    runtime: NodeRuntime, tmp_path: Path
) -> None:
    # A restore() that wrote a file on a full disk raised an ElementError: counted as a PE
    # that cannot be built, it was given up for good after three, the disk freed or not.
    h = hosted(tmp_path)
    for _ in range(ELEMENT_ERROR_RESTARTS + 2):
        runtime._failed(h, "ElementError: its restore() raised OSError: [Errno 28] No space "
                        "left on device", element_error=True)  # fmt: skip
    assert math.isfinite(h.retry_at) and "gave up" not in (h.error or "")
    # Said only in Spark's whole text (its head cut before it): the same.
    runtime._failed(h, "query failed: IOException", text="...\nCaused by: java.io.IOException: "
                    "No space left on device\n\tat ...")  # fmt: skip
    assert f"the disk of node {runtime.config.name!r} is full" in (h.error or "")


@pytest.mark.parametrize("state", [PEState.FENCED, PEState.STOPPED, PEState.FAILED])
def test_a_pause_of_a_query_that_will_never_pause_ends_at_once(
    runtime: NodeRuntime, tmp_path: Path, state: PEState
) -> None:
    # A fenced or stopped query never acknowledges the gate: the pause waited out its
    # whole timeout (120 s in a migration, inside the PE's exclusive section).
    from fogshift.agent.exceptions import NodeNotReady

    h = hosted(tmp_path)
    h.state = state
    runtime._elements[("x", "p")] = h
    started = time.monotonic()
    with pytest.raises(NodeNotReady, match=f"cannot pause: its query is {state}"):
        runtime.pause("x", "p", timeout_s=30)
    assert time.monotonic() - started < 5


def running(runtime: NodeRuntime, tmp_path: Path) -> HostedElement:
    """PE ``x/p`` running on ``runtime`` (a stand-in query)."""
    h = hosted(tmp_path)
    h.state, h.query = PEState.RUNNING, FakeQuery()  # type: ignore[assignment]
    runtime._elements[("x", "p")] = h
    return h


def test_a_pause_that_meets_its_query_fenced_at_the_boundary_leaves_it_fenced(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The monitor fences the query between the pause's look at the boundary and its PAUSED:
    # written over FENCED, the PE was hidden from the monitor and the reconciler, and the
    # resume after made it RUNNING with no query, for good.
    from fogshift.agent.exceptions import NodeNotReady

    h = running(runtime, tmp_path)

    def fenced_meanwhile(gate: Any, nonce: Any) -> bool:
        with runtime._lock:  # (the monitor's round)
            h.state, h.query = PEState.FENCED, None
        return True

    monkeypatch.setattr(node, "acknowledged", fenced_meanwhile)
    with pytest.raises(NodeNotReady, match="cannot pause: its query is fenced"):
        runtime.pause("x", "p", timeout_s=5)
    assert h.state == PEState.FENCED
    runtime.resume("x", "p")
    assert h.state == PEState.FENCED and not h.gated


def test_a_pause_that_ends_after_its_pe_was_deployed_anew_leaves_the_new_gate_alone(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rollback's restart (remove, deploy) during a pause: the old pause's resume opened
    # the new instance's gate, which another operation may be holding.
    from fogshift.agent.exceptions import NodeNotReady
    from fogshift.common.gate import gate_mode, write_gate

    old, new = hosted(tmp_path), hosted(tmp_path)
    old.state, old.query = PEState.RUNNING, FakeQuery()  # type: ignore[assignment]
    new.state, new.query = PEState.RUNNING, FakeQuery()  # type: ignore[assignment]
    runtime._elements[("x", "p")] = old

    def replaced_meanwhile(gate: Any, nonce: Any) -> bool:
        with runtime._lock:
            old.state = PEState.STOPPED
            runtime._elements[("x", "p")] = new
            write_gate(runtime.gate_file("x", "p"), "hold")  # (another operation's)
            new.gated = True
        return False

    monkeypatch.setattr(node, "acknowledged", replaced_meanwhile)
    with pytest.raises(NodeNotReady):
        runtime.pause("x", "p", timeout_s=5)
    assert gate_mode(runtime.gate_file("x", "p")) == "hold" and new.gated


def test_a_pause_whose_gate_a_resume_opened_meanwhile_leaves_it_running(
    runtime: NodeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pause saw its boundary, then waited for the node's lock (a query start holds it
    # for seconds); the orchestrator, answered too late, resumed the PE: its gate open, the
    # pause then wrote PAUSED — a running PE reported paused, its stuck-batch watchdog off.
    from fogshift.agent.exceptions import NodeNotReady

    h = running(runtime, tmp_path)
    seen = node.acknowledged
    looks: list[bool] = []

    def resumed_meanwhile(gate: Any, nonce: Any) -> bool:
        if not looks:
            runtime.resume("x", "p")
        looks.append(seen(gate, nonce))
        return len(looks) == 1 or looks[-1]

    monkeypatch.setattr(node, "acknowledged", resumed_meanwhile)
    with pytest.raises(NodeNotReady):
        runtime.pause("x", "p", timeout_s=5)
    assert h.state == PEState.RUNNING and not h.gated
    # A pause that gave up does not open a hold written since (another operation's).
    from fogshift.common.gate import gate_mode, write_gate

    def held_anew(gate: Any, nonce: Any) -> bool:
        write_gate(gate, "hold")
        return False

    monkeypatch.setattr(node, "acknowledged", held_anew)
    with pytest.raises(NodeNotReady):
        runtime.pause("x", "p", timeout_s=5)
    assert gate_mode(runtime.gate_file("x", "p")) == "hold" and h.gated


def keyed(runtime: NodeRuntime) -> HostedElement:
    """A keyed window-aggregate ``x/agg`` as ``runtime`` hosts it (its query never started:
    nothing reads it)."""
    element = ElementSpec(id="agg", kind="window-aggregate", node="n1", inputs=("s",),
                          options={"field": "v", "window": 2}, key_by="k")  # fmt: skip
    plan = QueryPlan("x", element, str(runtime.config.broker_file),
                     str(runtime.checkpoint_dir("x", "agg")))  # fmt: skip
    return HostedElement(plan=plan)


def commit(checkpoint: Path, batch: int, position: int) -> None:
    """Spark's offset and commit log entries of ``batch``, ending at ``position`` of ``s``."""
    for log in ("offsets", "commits"):
        (checkpoint / log).mkdir(parents=True, exist_ok=True)
    offset = json.dumps({"positions": {"s": position}})
    (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{offset}')
    (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def hosted_at_batch_3(runtime: NodeRuntime) -> tuple[HostedElement, Path]:
    """:func:`keyed` hosted by ``runtime``, its checkpoint committed up to batch 3 (its
    input at 30); and that checkpoint."""
    h = keyed(runtime)
    runtime._elements[h.key] = h
    checkpoint = runtime.checkpoint_dir("x", "agg")
    commit(checkpoint, 3, 30)
    return h, checkpoint


def test_a_key_listing_reads_the_state_store_once_then_the_key_index(
    runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first listing of a PE whose index has no base (a query resumed from a copy) is
    # the state reader's, a Spark job; it gives the index its base, and a listing after
    # the next batch comes from that base and the batch's notes, with no job.
    from fogshift.checkpoint import key_index

    h, checkpoint = hosted_at_batch_3(runtime)
    index = key_index.folder_of(checkpoint)
    key_index.write_batch(index, 3, {"a": {"f_sum": 1}})  # (no base below it: unusable)
    jobs: list[int | None] = []

    def read_key_variables(spark: Any, cp: Path, parts: Any, movable: bool, added: Any = ()) -> Any:
        jobs.append(node.committed_batch(cp))
        return 3, node.end_offset(cp, 3), {"a": {"f_sum": 3, "f_count": 1}, "b": {"f_sum": 2}}

    monkeypatch.setattr(node, "read_key_variables", read_key_variables)
    first = runtime.state_keys("x", "agg")
    assert jobs == [3]
    assert (first.batch, first.keys, first.sizes, first.positions) == (
        3, ["a", "b"], {"a": 4, "b": 2}, {"s": 30})  # fmt: skip
    key_index.write_batch(index, 4, {"b": {"f_sum": None}, "c": {"f_sum": 7}})
    key_index.write_batch(index, 5, {"d": {"f_sum": 1}})  # (not committed: not listed)
    commit(checkpoint, 4, 41)
    second = runtime.state_keys("x", "agg")
    assert jobs == [3]  # no second job
    assert (second.batch, second.keys, second.sizes, second.positions) == (
        4, ["a", "c"], {"a": 4, "c": 7}, {"s": 41})  # fmt: skip
    # The snapshot round folds the notes up to the commit into a base (here after one
    # note) and the same keys; what the base before (the listing's) replaced goes.
    monkeypatch.setattr(key_index, "COMPACT_AFTER", 1)
    runtime._compact_key_index(h)
    assert sorted(p.name for p in index.iterdir()) == [
        "4.json", "5.json", "base-3.json", "base-4.json"]  # fmt: skip
    assert runtime.state_keys("x", "agg") == second and jobs == [3]


def test_a_page_of_twins_without_a_key_index_reads_only_the_pages_keys(
    runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `fogshift state --limit` of a PE resumed from a copy (no base in its key index): the
    # keys are listed from the state store's lengths (one job, which gives the index its
    # base), and only the page's keys' state is read. It read all the state before: 1000
    # keys of 1 MiB passed Spark's maxResultSize for a page of two.
    hosted_at_batch_3(runtime)
    jobs: list[str] = []

    def read_key_variables(spark: Any, cp: Path, parts: Any, movable: bool, added: Any = ()) -> Any:
        jobs.append("keys")
        return 3, node.end_offset(cp, 3), {k: {"f_sum": 9} for k in ("d", "a", "c", "b")}

    def read_state(spark: Any, cp: Any, parts: Any, keyed: bool, key: Any, only: Any,
                   at: Any, added: Any = ()) -> Any:  # fmt: skip
        jobs.append(f"state of {only} at {at}")
        keys = only if only is not None else ["a", "b", "c", "d"]
        return 3, {k: {"sum": 9} for k in keys}

    monkeypatch.setattr(node, "read_key_variables", read_key_variables)
    monkeypatch.setattr(node, "read_state", read_state)
    page = runtime.twin_state("x", "agg", limit=2)
    assert jobs == ["keys", "state of ['a', 'b'] at 3"]
    assert (page.keys, [e.key for e in page.entries], page.batch) == (4, ["a", "b"], 3)
    # The next page comes from the index alone: no key job.
    jobs.clear()
    assert runtime.twin_state("x", "agg", limit=3).keys == 4
    assert jobs == ["state of ['a', 'b', 'c'] at 3"]


def test_a_page_of_twins_holds_fewer_keys_once_their_state_passes_the_page_size(
    runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1000 keys of 1 MiB each in one page passed Spark's maxResultSize: a page is cut at
    # TWIN_PAGE_BYTES of stored state by the key index's lengths (its first key always).
    from fogshift.checkpoint import key_index

    _, checkpoint = hosted_at_batch_3(runtime)
    key_index.write_base(key_index.folder_of(checkpoint), 3, {
        "a": {"f_sum": 3, "f_count": 1}, "b": {"f_sum": 6}, "c": {"f_sum": 2},
        "d": {"held": 9},  # (waiting for its move's state: no state, no key)
    })  # fmt: skip
    reads: list[Any] = []

    def read_state(spark: Any, cp: Any, parts: Any, keyed: bool, key: Any, only: Any,
                   at: Any, added: Any = ()) -> Any:  # fmt: skip
        reads.append(only)
        return 3, {k: {"sum": 9} for k in (only if only is not None else ["a", "b", "c"])}

    monkeypatch.setattr(node, "read_state", read_state)
    monkeypatch.setattr(node, "TWIN_PAGE_BYTES", 10)
    page = runtime.twin_state("x", "agg")
    assert (reads, page.keys, [e.key for e in page.entries]) == ([["a", "b"]], 3, ["a", "b"])
    monkeypatch.setattr(node, "TWIN_PAGE_BYTES", 3)  # (less than the first key's)
    assert [e.key for e in runtime.twin_state("x", "agg").entries] == ["a"]
    monkeypatch.setattr(node, "TWIN_PAGE_BYTES", 12)  # (every key: the state read as is)
    assert runtime.twin_state("x", "agg").keys == 3 and reads[-1] is None


def test_a_key_listing_across_a_fresh_deploy_gives_the_new_history_no_base(
    runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The state store was read for the old history's batch 3; the PE was deployed afresh
    # meanwhile: a base-3 written then would stand for the new history's batch 3.
    from fogshift.checkpoint import key_index

    h, checkpoint = hosted_at_batch_3(runtime)

    def read_key_variables(spark: Any, cp: Path, parts: Any, movable: bool, added: Any = ()) -> Any:
        runtime._elements[h.key] = keyed(runtime)  # (the fresh deploy's new instance)
        return 3, node.end_offset(cp, 3), {"a": {"f_sum": 3}}

    monkeypatch.setattr(node, "read_key_variables", read_key_variables)
    listed = runtime.state_keys("x", "agg")
    assert listed.keys == ["a"]  # (what was read is still the answer to this request)
    index = key_index.folder_of(checkpoint)
    assert not index.exists() or not list(index.iterdir())


def test_the_key_index_is_folded_whether_or_not_its_snapshot_is_taken(
    runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The notes pile up one a batch: a PE whose snapshots keep failing (or are put off)
    # still has them folded; and a fold that fails is no snapshot's failure.
    from fogshift.checkpoint import key_index

    h = keyed(runtime)
    h.state = PEState.RUNNING
    runtime._elements[h.key] = h
    checkpoint = runtime.checkpoint_dir("x", "agg")
    index = key_index.folder_of(checkpoint)
    for batch in range(3):
        commit(checkpoint, batch, 10 * (batch + 1))
        key_index.write_batch(index, batch, {f"k{batch}": {"f_sum": batch + 1}})
    monkeypatch.setattr(key_index, "COMPACT_AFTER", 2)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(node, "take_snapshot", broken)
    runtime.snapshot_all()
    assert (runtime.describe(h).snapshot_error or "").startswith("OSError")
    assert (index / "base-2.json").is_file()
    assert key_index.read(index, 2) == {f"k{b}": {"f_sum": b + 1} for b in range(3)}
    monkeypatch.setattr(node, "take_snapshot", lambda *args, **kwargs: None)
    monkeypatch.setattr(key_index, "compact", broken)
    runtime.snapshot_all()
    assert runtime.describe(h).snapshot_error is None


def test_a_restarted_node_gets_back_the_checkpoint_an_interrupted_install_set_aside(
    runtime: NodeRuntime,
) -> None:
    checkpoint = runtime.checkpoint_dir("x", "p")
    aside = checkpoint.with_name("p.replaced")
    (aside / "commits").mkdir(parents=True)
    (aside / "commits" / "0").write_text("v1")
    assert runtime.left() == []  # (a folder aside is no PE's: it went unreported)
    runtime._settle_installs()
    assert (checkpoint / "commits" / "0").read_text() == "v1"
    assert not aside.exists()
    assert [(left.pipeline, left.element) for left in runtime.left()] == [("x", "p")]


def test_a_pe_without_state_is_said_as_what_it_is(runtime: NodeRuntime) -> None:
    # It read "it is a 'amplify' processor without state fields", and named no Case 2 kind
    # among the stateful ones.
    from fogshift.runtime.exceptions import NoState

    for kind, options, says in (
        ("amplify", {"calibration": {"p1": 1.0}}, "a processor of kind 'amplify', without"),
        ("csv-sink", {"path": "/tmp/o.csv"}, "a sink (csv-sink)"),
    ):
        element = ElementSpec(id="pe", kind=kind, node="n1", inputs=("s",), options=options)
        plan = QueryPlan("x", element, str(runtime.config.broker_file), "cp")
        runtime._elements[("x", "pe")] = HostedElement(plan=plan)
        with pytest.raises(NoState) as refused:
            runtime._stateful("x", "pe")
        assert f"x/pe on node 'n1' holds no state: it is {says}" in refused.value.message
        assert refused.value.expected is not None and "classify" in refused.value.expected


def test_a_node_stopping_stops_the_warm_up_queries_before_its_session(
    runtime: NodeRuntime,
) -> None:
    # A session stopped under the running warm-up queries logged ~250 lines of their errors
    # (a `down` right after an `up`); the warm-up starts on the Spark thread, so the stop
    # decides there, after it.
    order: list[str] = []

    class Stops:
        def __init__(self, name: str) -> None:
            self.name = name

        def stop(self) -> None:
            order.append(self.name)

    runtime.spark = Stops("session")  # type: ignore[assignment]
    runtime._spark_thread.submit(lambda: setattr(runtime, "_warming", Stops("warm-up")))
    runtime.close()
    assert order == ["warm-up", "session"]


def test_a_deploy_whose_start_failed_is_not_logged_as_started(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # "ERROR cannot start x.p: ..." was followed at once by "INFO started x.p under epoch 1".
    def cannot(spark: Any, plan: QueryPlan) -> Any:
        raise ElementError("cannot import processor class 'nope:Missing'")

    element = hosted(tmp_path).plan.element
    monkeypatch.setattr(node, "start_query", cannot)
    with caplog.at_level("INFO", logger="fogshift.agent"):
        runtime.deploy("x", element, fresh=True, epoch=1)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("cannot start x.p") for m in said), said
    assert not any(m.startswith("started x.p") for m in said), said
    monkeypatch.setattr(node, "start_query", lambda spark, plan: FakeQuery())
    caplog.clear()
    with caplog.at_level("INFO", logger="fogshift.agent"):
        runtime.deploy("x", element, fresh=True, epoch=2)
    assert any(r.getMessage() == "started x.p under epoch 2, fresh" for r in caplog.records)
