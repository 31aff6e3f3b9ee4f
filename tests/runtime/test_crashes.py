"""An event that kills its Python worker: marked, blamed, condemned, then a dead letter
(fogshift.runtime.crashes, fogshift.runtime.batch). Real forked workers that really die:
``os._exit``, a segmentation fault, SIGKILL."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fogshift.events import Event
from fogshift.runtime import crashes
from fogshift.runtime.api import Processor
from fogshift.runtime.batch import run_batch, run_events
from fogshift.runtime.crashes import Watch, blame, condemned_events, prepare, watch_for
from fogshift.runtime.gate import start_run
from tests.runtime.test_batch import Acc, reference, row, split

SPARK_SAYS = (
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). "
    "Consider setting 'spark.python.worker.faulthandler.enabled'"
)


@pytest.fixture
def gate(tmp_path: Path) -> str:
    path = tmp_path / "gates" / "pipe" / "pe.json"
    path.parent.mkdir(parents=True)
    prepare(crashes.folder_of(path))
    return str(path)


def die_in(
    gate: str, event: tuple[Any, ...], how: Callable[[], object], leave: bool = False
) -> int:
    """Fork a worker that marks ``event``, then dies by ``how`` (after clearing its mark if
    ``leave``); reap it and return its pid."""
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            watch = watch_for(gate)
            watch.enter(event)
            if leave:
                watch.leave()
            how()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return pid


def stuck_worker(gate: str, event: tuple[Any, ...]) -> int:
    """Fork a worker that marks ``event`` and then sleeps in it for good; its pid once its
    mark is set (the caller kills it)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            watch_for(gate).enter(event)
            os.write(ready_w, b"x")
            while True:
                time.sleep(60)
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    return pid


def exit_7() -> None:
    os._exit(7)


def segfault() -> None:
    faulthandler.disable()  # (pytest's, inherited: its dump of every thread is noise here)
    ctypes.string_at(0)


def sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("how", [exit_7, segfault, sigkill], ids=["exit", "segv", "kill"])
def test_an_event_that_kills_its_worker_twice_is_condemned(gate: str, how: Any) -> None:
    folder = crashes.folder_of(gate)
    bad, good = row(5, v=1), row(6, v=2)
    die_in(gate, bad, how)
    [(event, count)] = blame(folder, SPARK_SAYS, "pe").items()
    assert count == 1 and event.startswith("10:5:")  # origin 10, seq 5
    assert condemned_events(folder) == {}  # once may be bad luck
    assert not any(p.name.isdigit() for p in folder.iterdir())  # the gone worker's mark

    die_in(gate, bad, how)
    assert blame(folder, SPARK_SAYS, "pe") == {event: 2}
    reason = condemned_events(folder)[event]
    assert "the Python worker running processor 'pe' crashed 2 times on this event" in reason

    watch = Watch(folder)
    watch.refresh()
    assert watch.condemned(bad) == reason
    assert watch.condemned(good) is None
    # Same origin and seq, another body (a fresh deploy's event there): not this one.
    assert watch.condemned((10, 5, 0.0, "src", json.dumps({"v": 9}))) is None


def test_only_a_crash_is_blamed_and_only_on_a_set_mark_of_a_gone_worker(gate: str) -> None:
    folder = crashes.folder_of(gate)
    # A worker that finished its event before it died: not blamed.
    die_in(gate, row(1), exit_7, leave=True)
    assert blame(folder, SPARK_SAYS, "pe") == {}
    # A failure that is not a crashed worker (broker trouble, a stop): marks not read.
    die_in(gate, row(2), exit_7)
    assert blame(folder, "java.io.IOException: No space left on device", "pe") == {}
    assert any(p.name.isdigit() for p in folder.iterdir())
    # ... and a start of the query drops every mark: never blamed later.
    prepare(folder)
    assert blame(folder, SPARK_SAYS, "pe") == {}
    # A worker that still runs, mid-event (this process): not blamed.
    watch = Watch(folder)
    watch.enter(row(3))
    assert blame(folder, SPARK_SAYS, "pe") == {}
    watch.leave()
    assert (folder / str(os.getpid())).exists()


def test_a_worker_spark_reuses_marks_again_after_a_start_or_a_fresh_deploy(gate: str) -> None:
    folder = crashes.folder_of(gate)
    watch = watch_for(gate)
    for forget in (prepare, lambda f: (crashes.reset(f), prepare(f))):
        forget(folder)
        assert not (folder / str(os.getpid())).exists()
        watch.refresh()  # (the next batch)
        watch.enter(row(4))
        assert (folder / str(os.getpid())).read_bytes()[0] == 1
        watch.leave()


def test_a_worker_of_a_stopped_run_makes_no_mark_anew(gate: str) -> None:
    """A worker still in a batch of a run stopped since (Spark kills it soon) made its mark
    again at its next batch after the new run's start dropped it: killed mid-event, a crash
    of the new run blamed its event."""
    folder = crashes.folder_of(gate)
    old = start_run(gate)
    watch_for(gate, old).refresh()
    assert (folder / str(os.getpid())).exists()
    new = start_run(gate)
    prepare(folder)
    watch = watch_for(gate, old)
    watch.refresh()
    watch.enter(row(4))
    assert not (folder / str(os.getpid())).exists()
    assert blame(folder, SPARK_SAYS, "pe") == {}
    watch_for(gate, new).refresh()  # the same worker, reused by the new run
    watch.enter(row(5))
    assert (folder / str(os.getpid())).read_bytes()[0] == 1
    watch.leave()
    # The node drops the marks before the query's start writes its run's token: in that
    # gap the old token stands, and a worker of it makes its mark again; the start drops
    # them once more after writing the token (engine.start_query), which closes the gap.
    prepare(folder)
    stale = watch_for(gate, new)
    stale.refresh()
    assert (folder / str(os.getpid())).exists()  # (made again in the gap)
    start_run(gate)
    prepare(folder)
    stale.refresh()
    assert not (folder / str(os.getpid())).exists()


def test_a_gone_worker_s_cleared_mark_is_removed(gate: str) -> None:
    # Read every second for the PE's life otherwise, one more per worker Spark ended.
    folder = crashes.folder_of(gate)
    pid = die_in(gate, row(1), exit_7, leave=True)
    assert (folder / str(pid)).exists()
    watch = watch_for(gate)
    watch.refresh()  # (a live worker between events: kept)
    assert crashes.stop_overrunning(folder, 1.0) == {}
    assert not (folder / str(pid)).exists()
    assert (folder / str(os.getpid())).exists()


def test_a_worker_that_moved_on_to_its_next_event_is_not_killed(
    gate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark read first can be a moment old: the worker back from that event meanwhile
    was killed in its next one, which was then blamed."""
    folder = crashes.folder_of(gate)
    pid = stuck_worker(gate, row(7))  # in one event, then (as the agent looks) in the next
    real_open = os.pidfd_open

    def moved_on(target: int, *args: Any) -> int:
        handle = real_open(target, *args)
        # (What the worker's mmap write does: the same file, the next event, since now.)
        mark = folder / str(pid)
        flag, _, _, _, _, start = crashes._MARK.unpack(mark.read_bytes())
        mark.write_bytes(crashes._MARK.pack(flag, 16, 8, 0, time.monotonic(), start))
        return handle

    monkeypatch.setattr(crashes.os, "pidfd_open", moved_on)
    try:
        later = time.monotonic() + crashes.kill_after(1.0) + 0.1
        assert crashes.stop_overrunning(folder, 1.0, now=later) == {}
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_mark_of_a_pid_given_to_another_process_is_never_its(gate: str) -> None:
    """A mark whose pid now names another process (or a thread): that process is never
    killed, and the mark counts as its worker's, gone."""
    folder = crashes.folder_of(gate)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = crashes._MARK.pack(1, 9, 4, 0, time.monotonic() - 3600, 12345)
        (folder / str(other.pid)).write_bytes(stale)
        assert crashes.stop_overrunning(folder, 1.0) == {}
        assert other.poll() is None
        [(event, count)] = blame(folder, SPARK_SAYS, "pe").items()
        assert event == "9:4:0" and count == 1
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_fresh_deploy_forgets_condemned_events(gate: str) -> None:
    folder = crashes.folder_of(gate)
    for _ in range(crashes.CRASHES_TO_CONDEMN):
        die_in(gate, row(5), exit_7)
        blame(folder, SPARK_SAYS, "pe")
    assert len(condemned_events(folder)) == 1
    crashes.reset(folder)
    assert condemned_events(folder) == {} and not folder.exists()
    # A batch run without the folder marks nothing and condemns nothing.
    watch = Watch(folder)
    watch.refresh()
    assert watch.condemned(row(5)) is None


def condemn(gate: str, event: tuple[Any, ...]) -> str:
    folder = crashes.folder_of(gate)
    for _ in range(crashes.CRASHES_TO_CONDEMN):
        die_in(gate, event, segfault)
        blame(folder, SPARK_SAYS, "p")
    [reason] = condemned_events(folder).values()
    return reason


def test_a_condemned_event_is_a_dead_letter_and_the_state_is_as_without_it(gate: str) -> None:
    rows = [row(1, v=1), row(2, v=2), row(3, v=3), row(4, v=4)]
    reason = condemn(gate, rows[1])
    watch = Watch(crashes.folder_of(gate))
    records, final = run_batch(
        lambda resume: Acc.build({}, "p", resume),
        lambda: None,
        rows,
        finish=lambda p: json.loads(p.dump_state()),
        pe="p",
        watch=watch,
    )
    events, dead = split(records)
    expected, state = reference(rows, skip={2})
    assert dead == {2: reason}
    assert events == expected and final == state
    # Each event ran marked, and the mark is clear once the batch is done.
    mark = (crashes.folder_of(gate) / str(os.getpid())).read_bytes()
    assert mark[0] == 0


def test_a_stateless_processor_skips_a_condemned_event(gate: str) -> None:
    class Echo(Processor):
        def process(self, event: Event) -> Any:
            return {"v": event.body["v"]}

    assert not Echo.is_stateful()
    rows = [row(1, v=1), row(2, v=2)]
    reason = condemn(gate, rows[0])
    out = list(run_events(Echo.build({}, "p", None), rows, watch=Watch(crashes.folder_of(gate))))
    assert [(r[2], r[5], r[6]) for r in out] == [(1, '{"v": 1}', reason), (2, '{"v":2}', None)]


class Crash(Acc):
    """Dies in ``process()`` on ``die``, in encoding its output on ``die-encoding``, and on
    ``die-again`` only when it runs the event a second time (a replay)."""

    runs: dict[int, int] = {}

    def process(self, event: Event) -> Any:
        mode = event.body.get("mode")
        Crash.runs[event.seq] = Crash.runs.get(event.seq, 0) + 1
        if mode == "die" or (mode == "die-again" and Crash.runs[event.seq] > 1):
            os._exit(3)
        if mode == "die-encoding":
            return Bomb()
        return super().process(event)


class Bomb(Mapping[str, Any]):
    """An output whose encoding kills the worker."""

    def __getitem__(self, key: str) -> Any:
        os._exit(4)

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1


def batch_in_a_worker(gate: str, rows: list[Any]) -> int:
    """Run ``rows`` through :class:`Crash` in a forked worker, as the engine would; its exit
    status once it ended."""
    pid = os.fork()
    if pid == 0:
        try:
            list(run_events(Crash.build({}, "p", None), rows, watch=watch_for(gate)))
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


@pytest.mark.parametrize(
    ("rows", "blamed"),
    [
        ([row(1, v=1), row(2, mode="die"), row(3, v=3)], "4:2:"),
        ([row(1, v=1), row(2, mode="die-encoding"), row(3, v=3)], "4:2:"),
        # Event 3 raises; undoing it replays 1 and 2, and the replay of 2 dies: blamed on
        # 3, whose failure the replay was for (2 ran fine once).
        ([row(1, v=1), row(2, mode="die-again"), row(3, mode="raise", exc="Boom")], "6:3:"),
    ],
    ids=["process", "encoding", "replay"],
)
def test_a_real_batch_marks_the_event_its_worker_dies_in(
    gate: str, rows: list[Any], blamed: str
) -> None:
    status = batch_in_a_worker(gate, rows)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (3, 4)
    [(event, count)] = blame(crashes.folder_of(gate), SPARK_SAYS, "p").items()
    assert event.startswith(blamed) and count == 1


@pytest.mark.parametrize("pidfds", [True, False])
def test_a_worker_stuck_in_one_event_past_the_limit_is_killed_and_its_event_blamed(
    gate: str, pidfds: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without pidfds (a kernel before 5.3, a container's filter) it was skipped: never
    # stopped, its event held the PE for good. Then by its pid, checked just before.
    if not pidfds:

        def no_pidfd(pid: int) -> int:
            raise OSError(errno.ENOSYS, "Function not implemented")

        monkeypatch.setattr(crashes.os, "pidfd_open", no_pidfd)
    folder = crashes.folder_of(gate)
    event = row(7, v=1)
    pid = stuck_worker(gate, event)  # stuck in native code: here, a sleep that ignores alarms
    try:
        # Within its time (2 x 1 s + 2 s), it is left alone.
        assert crashes.stop_overrunning(folder, 1.0) == {}
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
        later = time.monotonic() + crashes.kill_after(1.0) + 0.1
        [(killed, named)] = crashes.stop_overrunning(folder, 1.0, now=later).items()
        assert killed == pid and named.startswith("14:7:")
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert blame(folder, SPARK_SAYS, "pe") == {named: 1}
    # The second time (its batch retried) it is condemned, for what it was.
    # The second time (its batch retried) it is condemned, with how it died the last time.
    again = die_in(gate, event, sigkill)
    (folder / "killed.json").write_text(json.dumps({str(again): 1.0}))  # as stop_overrunning
    assert blame(folder, SPARK_SAYS, "pe") == {named: 2}
    reason = condemned_events(folder)[named]
    assert "crashed 2 times on this event" in reason
    assert "killed by its node after 4 s in process()" in reason
    assert "its event_timeout_s being 1 s" in reason


def test_a_replay_that_dies_is_told_apart_in_the_reason(gate: str) -> None:
    rows = [row(1, v=1), row(2, mode="die-again"), row(3, mode="raise", exc="Boom")]
    for _ in range(crashes.CRASHES_TO_CONDEMN):
        assert os.WEXITSTATUS(batch_in_a_worker(gate, rows)) == 3
        blame(crashes.folder_of(gate), SPARK_SAYS, "p")
    [(event, reason)] = condemned_events(crashes.folder_of(gate)).items()
    assert event.startswith("6:3:")
    assert "the last time it died undoing this event's changes" in reason
