"""`up` and `down` act on the processes a cluster started, never on others that took their
pids, and leave none of theirs running (real processes, no cluster)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from fogshift.common.exceptions import AlreadyRunning, NoAnswer
from fogshift.common.http import node_token
from fogshift.common.locks import CLUSTER_LOCK
from fogshift.common.processes import alive
from fogshift.exceptions import FogshiftError, InvalidInput, Unavailable
from fogshift.supervisor import cluster as cluster_ops
from fogshift.supervisor.cluster import ClusterFile, ProcessInfo, save_cluster, token_file
from tests.common.test_locks import holder

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process leading a session of its own, as every service `up` starts does."""
    proc = subprocess.Popen(SLEEPER, start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def gone_process() -> ProcessInfo:
    """A process that ran and ended (its pid free again)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    info = ProcessInfo.of(proc.pid)
    proc.wait()
    return info


def two_node_cluster(home: Path, sleeper: subprocess.Popen[bytes], **info: Any) -> ClusterFile:
    """A cluster file under ``home`` of nodes cloud and fog-b, its orchestrator and both
    agents the running ``sleeper`` (``info``: more of their records), no broker of its own."""
    running = ProcessInfo.of(sleeper.pid).model_copy(update={"url": "http://127.0.0.1:9", **info})
    token_file(home).write_text("secret\n")
    cluster = ClusterFile(orchestrator=running, broker=None,
                          nodes={"cloud": running, "fog-b": running},
                          broker_url="nats://127.0.0.1:9")  # fmt: skip
    save_cluster(home, cluster)
    return cluster


def write_cluster(
    home: Path, orchestrator: ProcessInfo, broker: ProcessInfo | None,
    url: str = "http://127.0.0.1:9",
) -> None:  # fmt: skip
    token_file(home).write_text("secret\n")
    save_cluster(
        home,
        ClusterFile(
            orchestrator=orchestrator.model_copy(update={"url": url}),
            broker=broker,
            nodes={"fog-a": gone_process()},
            broker_url="nats://127.0.0.1:9",
        ),
    )


def test_down_leaves_alone_a_session_leader_that_took_a_recorded_pid(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    ours = ProcessInfo.of(sleeper.pid)
    assert ours.started is not None
    # What `up` recorded: this pid, when another process (now gone) had it.
    recorded = ours.model_copy(update={"started": ours.started - 60})
    write_cluster(tmp_path, recorded, broker=None)
    report = cluster_ops.down(tmp_path, grace_s=1)
    assert sleeper.poll() is None, "down killed a process that only had a recorded pid"
    assert report.gone == ["orchestrator", "node fog-a"]  # (the recorded one is not ours)


def test_down_stops_what_the_cluster_started(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    write_cluster(tmp_path, ProcessInfo.of(sleeper.pid), broker=None)
    report = cluster_ops.down(tmp_path, grace_s=1)
    sleeper.wait(timeout=10)
    assert not alive(sleeper.pid)
    # Node fog-a's agent had died before: said apart from what down stopped.
    assert report == cluster_ops.Stopped(["orchestrator", "node fog-a"], ["node fog-a"])


def test_down_says_which_process_it_had_to_kill(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # A frozen node (SIGSTOP: its SIGTERM stays pending) was killed after the grace time,
    # and `down` said "stopped" as for a clean end.
    os.kill(sleeper.pid, signal.SIGSTOP)
    write_cluster(tmp_path, ProcessInfo.of(sleeper.pid), broker=None)
    report = cluster_ops.down(tmp_path, grace_s=0.5)
    sleeper.wait(timeout=10)
    assert sleeper.returncode == -signal.SIGKILL
    assert report == cluster_ops.Stopped(["orchestrator", "node fog-a"], ["node fog-a"],
                                          ["orchestrator"])  # fmt: skip


class BrokerStarted(Exception):
    """Raised by :func:`_start_nats_server`: `up` came to start a broker."""


def _start_nats_server(*args: object, **kwargs: object) -> None:
    """In place of ``start_nats_server``: the fresh start's first step, stopped there."""
    raise BrokerStarted


def test_up_over_a_dead_cluster_stops_its_broker_that_still_runs(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_cluster(tmp_path, gone_process(), broker=ProcessInfo.of(sleeper.pid))

    monkeypatch.setattr(cluster_ops, "start_nats_server", _start_nats_server)
    with pytest.raises(BrokerStarted):
        cluster_ops.up(tmp_path, ["fog-a"])
    sleeper.wait(timeout=10)  # a broker left running would hold the store the next one opens


def test_up_refuses_a_node_named_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def start_nats_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("started something")

    monkeypatch.setattr(cluster_ops, "start_nats_server", start_nats_server)
    with pytest.raises(InvalidInput) as caught:
        cluster_ops.up(tmp_path, ["cloud", "fog-a", "cloud"])
    assert caught.value.received == "cloud,fog-a,cloud"
    assert "cloud" in (caught.value.hint or "")
    # A node named as one of the cluster's own logs: `logs orchestrator` showed the node's.
    for taken in ("orchestrator", "relay-fog-a"):
        with pytest.raises(InvalidInput, match="the name of the cluster's own log") as caught:
            cluster_ops.up(tmp_path, ["cloud", taken])
        assert caught.value.received == repr(taken)


@pytest.mark.parametrize(
    ("sync", "nats_url", "received"),
    [
        ("never", None, "'never'"),
        ("always", "nats://127.0.0.1:4222", "--broker-sync always with --nats-url "
         "nats://127.0.0.1:4222"),
    ],
)  # fmt: skip
def test_up_refuses_a_broker_sync_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str, nats_url: str | None,
    received: str,
) -> None:  # fmt: skip
    def start_nats_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("started something")

    monkeypatch.setattr(cluster_ops, "start_nats_server", start_nats_server)
    with pytest.raises(InvalidInput) as caught:
        cluster_ops.up(tmp_path, ["fog-a"], nats_url=nats_url, broker_sync=sync)
    assert caught.value.received == received
    assert caught.value.expected and caught.value.hint
    assert not cluster_ops.cluster_file(tmp_path).exists()


@pytest.mark.parametrize("host", ["192.0.2.7", "::1", "no-such-host.invalid"])
def test_up_refuses_a_host_it_cannot_listen_on_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    def start_nats_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("started something")

    monkeypatch.setattr(cluster_ops, "start_nats_server", start_nats_server)
    with pytest.raises(InvalidInput) as caught:
        cluster_ops.up(tmp_path, ["fog-a"], host=host)
    assert caught.value.message == f"cannot listen on host {host!r}"
    assert caught.value.expected and caught.value.hint


def test_a_process_is_still_itself_after_the_wall_clock_is_stepped(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # psutil's create_time adds the boot time, read again at each call from the wall clock:
    # after a step (NTP, a resumed VM) every recorded service looked like another process,
    # `down` left them all running and `up` started a second cluster beside them.
    import psutil

    ours = ProcessInfo.of(sleeper.pid)
    assert ours.runs() and not ours.foreign()
    booted = psutil.boot_time()
    monkeypatch.setattr(psutil, "boot_time", lambda: booted + 1.0)
    import psutil._pslinux as linux

    monkeypatch.setattr(linux, "boot_time", lambda: booted + 1.0)
    assert ours.runs() and not ours.foreign()


def test_up_and_down_beside_another_of_the_same_home_are_refused_and_change_nothing(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An `up` beside another wrote new tokens under the running cluster and started a
    # second broker on its store.
    def start_nats_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("started something")

    monkeypatch.setattr(cluster_ops, "start_nats_server", start_nats_server)
    # A cluster whose orchestrator died and whose broker runs: an `up` would stop the broker
    # and start everything anew, a `down` would stop the broker.
    write_cluster(tmp_path, gone_process(), broker=ProcessInfo.of(sleeper.pid))
    other = holder(tmp_path / CLUSTER_LOCK)  # another `up` or `down` of this home, running
    try:
        with pytest.raises(AlreadyRunning) as err:
            cluster_ops.up(tmp_path, ["fog-a", "fog-b"])
        assert f"a fogshift up or down of {str(tmp_path)!r}" in err.value.message
        with pytest.raises(AlreadyRunning):
            cluster_ops.down(tmp_path, grace_s=1)
    finally:
        other.kill()
        other.wait()
    assert token_file(tmp_path).read_text() == "secret\n"
    assert cluster_ops.cluster_file(tmp_path).exists()
    assert sleeper.poll() is None, "the broker was stopped while another held its home"
    cluster_ops.down(tmp_path, grace_s=1)  # once the other has ended
    sleeper.wait(timeout=10)


def test_up_with_the_broker_dead_stops_the_rest_and_starts_the_cluster_anew(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The orchestrator and an agent ran on without their broker: `up` said the cluster
    # was up, and nothing ran until a `down`.
    monkeypatch.setattr(cluster_ops, "start_nats_server", _start_nats_server)
    agent = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        token_file(tmp_path).write_text("secret\n")
        save_cluster(tmp_path, ClusterFile(
            orchestrator=ProcessInfo.of(sleeper.pid).model_copy(update={"url": "http://127.0.0.1:9"}),
            broker=gone_process(),
            nodes={"fog-a": ProcessInfo.of(agent.pid)},
            broker_url="nats://127.0.0.1:9",
        ))  # fmt: skip
        said: list[str] = []
        # Not with other nodes than it ran (a plain `up` has its default ones): nothing stops.
        with pytest.raises(InvalidInput) as refused:
            cluster_ops.up(tmp_path, ["cloud", "fog-a"], on_progress=said.append)
        assert refused.value.expected == "--nodes fog-a" and said == []
        assert sleeper.poll() is None and agent.poll() is None
        with pytest.raises(BrokerStarted):  # the fresh start's first step: a broker
            cluster_ops.up(tmp_path, ["fog-a"], on_progress=said.append)
        sleeper.wait(timeout=30)
        agent.wait(timeout=30)
        assert any("broker (nats-server) is not running" in line for line in said), said
    finally:
        agent.kill()
        agent.wait()


@pytest.fixture
def failed_store(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A cluster file under ``tmp_path`` whose broker (a sleeper) runs and whose log says its
    store failed since it started, with an orchestrator and an agent (sleepers): the three."""
    broker = subprocess.Popen(SLEEPER, start_new_session=True)
    agent = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        token_file(tmp_path).write_text("secret\n")
        (tmp_path / "broker").mkdir()
        (tmp_path / "broker" / "nats.log").write_text(
            "[1] [INF] Starting nats-server\n[1] [INF] Server is ready\n"
            "[1] [ERR] Filestore [FS_p_agg] Critical write error: write /s/1.blk: no space "
            "left on device\n"
        )
        save_cluster(tmp_path, ClusterFile(
            orchestrator=ProcessInfo.of(sleeper.pid).model_copy(update={"url": "http://127.0.0.1:9"}),
            broker=ProcessInfo.of(broker.pid),
            nodes={"fog-a": ProcessInfo.of(agent.pid)},
            broker_url="nats://127.0.0.1:9",
        ))  # fmt: skip
        yield [broker, sleeper, agent]
    finally:
        for proc in (broker, agent):
            proc.kill()
            proc.wait()


def test_up_with_a_broker_whose_store_failed_starts_the_cluster_anew(
    tmp_path: Path, failed_store: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A probe filled the broker's disk: nats-server ran on refusing every store after the
    # disk was freed, each PE failing at every restart, and `up` said "already up".
    monkeypatch.setattr(cluster_ops, "start_nats_server", _start_nats_server)
    said: list[str] = []
    with pytest.raises(BrokerStarted):  # the fresh start's first step: a broker
        cluster_ops.up(tmp_path, ["fog-a"], on_progress=said.append)
    for stopped in failed_store:
        stopped.wait(timeout=30)
    told = " ".join(said)
    assert "failed to write its store and refuses every store until it starts" in told
    assert "Critical write error" in told and "full?" in told, said


def test_up_leaves_a_broker_whose_store_failed_alone_while_its_disk_is_full(
    tmp_path: Path, failed_store: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Started again on a disk still full, it fails again: every `up` stopped the cluster.
    from collections import namedtuple

    from fogshift.exceptions import Unavailable

    usage = namedtuple("usage", "total used free")
    full = usage(200 << 20, 197 << 20, 3 << 20)
    monkeypatch.setattr(cluster_ops.shutil, "disk_usage", lambda path: full)
    with pytest.raises(Unavailable) as refused:
        cluster_ops.up(tmp_path, ["fog-a"])
    assert "its disk is still full" in refused.value.message
    assert refused.value.received == "3 MiB free"
    assert refused.value.expected == f"at least 64 MiB free under {tmp_path / 'broker'}"
    assert all(p.poll() is None for p in failed_store)  # nothing stopped


@pytest.mark.parametrize("kept", [False, True], ids=["once", "kept"])
def test_a_store_failure_is_of_the_brokers_run_since_its_last_start(
    tmp_path: Path, kept: bool
) -> None:
    # ``kept``: each question to one StoreFailures (`GET /health`'s), which searches each
    # file on from where it stopped: every answer must be the same as a search afresh.
    from fogshift.broker.server import SCAN_BYTES, StoreFailures
    from fogshift.broker.server import store_failed as afresh
    from fogshift.common.logfile import rotate

    store_failed = StoreFailures() if kept else afresh
    log = tmp_path / "nats.log"
    assert store_failed(log) is None  # (none yet)
    log.write_text("")
    assert store_failed(log) is None  # (an empty log cannot be mapped)
    failed = "[1] [ERR] JetStream out of File resources, will be DISABLED"
    log.write_text(f"[1] [INF] Starting nats-server\n{failed}\n[1] [INF] JetStream Shutdown\n")
    assert store_failed(log) == failed
    # Lines after it (a zombie's refused writes log one each) do not hide it.
    spam = '[1] [ERR] Publish Violation - User "fog-a", Subject "fs.p.x.data"\n'
    log.write_text(log.read_text() + spam * 40_000)
    assert store_failed(log) == failed
    log.write_text(log.read_text() + "[2] [INF] Starting nats-server\n[2] [INF] ready\n")
    assert store_failed(log) is None  # an earlier run's
    # Rotated since (fogshift.common.logfile): the run's start and failure are in the copy.
    log.write_text(f"[3] [INF] Starting nats-server\n{failed}\n")
    rotate(log)
    assert log.read_text() == "" and store_failed(log) == failed
    log.write_text(spam)  # its refusals after the rotation
    assert store_failed(log) == failed
    log.write_text(spam + "[4] [INF] Starting nats-server\n")  # a run since: its own
    assert store_failed(log) is None
    # Rotated twice since its start: the start and the failure in the older copy.
    log.write_text(f"[5] [INF] Starting nats-server\n{failed}\n")
    rotate(log)
    log.write_text(spam)
    rotate(log)
    log.write_text(spam)
    assert store_failed(log) == failed
    # Read a block at a time: a marker across two blocks is found, as is an earlier
    # failure's line cut off by a later start across them.
    for at in (SCAN_BYTES - 5, SCAN_BYTES - 40):
        log.write_text(f"{failed}\n" + "x" * (at - len(failed) - 1) + "Starting nats-server\n")
        assert store_failed(log) is None  # (the failure was an earlier run's)
        log.write_text(log.read_text() + spam + failed + "\n")
        assert store_failed(log) == failed


def test_store_failures_search_a_log_on_from_where_they_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fogshift.broker import server
    from fogshift.common.logfile import rotate

    searched: list[int] = []
    search_on = server._search_on
    monkeypatch.setattr(server, "_search_on", lambda handle, known: (
        searched.append(known.read), search_on(handle, known))[1])  # fmt: skip
    log = tmp_path / "nats.log"
    started = "[1] [INF] Starting nats-server\n"
    log.write_text(started)
    failures = server.StoreFailures()
    assert failures(log) is None and searched == [0]
    failed = "[1] [ERR] JetStream out of File resources, will be DISABLED"
    with open(log, "a") as handle:
        handle.write(f"{failed}\n")
    assert failures(log) == failed and searched == [0, len(started)]
    assert failures(log) == failed and searched[-1] == log.stat().st_size  # nothing new
    # Emptied by a rotation and grown past where it stopped: the log is searched whole
    # again (its bytes there changed), the copy afresh (another file).
    rotate(log)
    log.write_text("[2] [INF] Starting nats-server\n" + "[2] [INF] ready\n" * 10)
    searched.clear()
    assert failures(log) is None and searched == [0]


def test_an_agent_that_exits_while_starting_ends_the_wait_at_once(tmp_path: Path) -> None:
    # `up` waited out its whole timeout (240 s) for an agent that had exited at once (its
    # node folder held by another agent), then said it had "no Spark session".
    import time

    from fogshift.exceptions import Unavailable

    node_token_file = cluster_ops.node_token_file(tmp_path, "fog-a")
    node_token_file.parent.mkdir(parents=True)
    node_token_file.write_text("t" * 32)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-fog-a.log").write_text(
        "starting\nerror (already_running): another process holds its agent.lock\n\n"
    )
    dead = gone_process().model_copy(update={"url": "http://127.0.0.1:9"})
    started = time.monotonic()
    with pytest.raises(Unavailable) as exited:
        cluster_ops.wait_agents_ready(tmp_path, {"fog-a": dead}, 60, lambda line: None)
    assert time.monotonic() - started < 30
    assert exited.value.message == (
        "node 'fog-a''s agent exited while starting: error (already_running): another "
        "process holds its agent.lock"
    )
    assert exited.value.hint and "node-fog-a.log" in exited.value.hint


@pytest.mark.integration
def test_an_up_ended_by_sigterm_stops_what_it_started(tmp_path: Path) -> None:
    # Ended by `timeout`, a service manager or a closed terminal, `up` left its broker and
    # agents running with no cluster file: `down` said nothing was up, and the next `up`
    # waited out its timeout on the node folder an orphaned agent held.
    import os
    import signal

    import psutil

    from fogshift.common.waiting import wait_until

    home = tmp_path / "home"

    def ours() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(home) in part for part in proc.info["cmdline"] or ()):
                    found.append(proc)
        return found

    up = subprocess.Popen(
        [sys.executable, "-m", "fogshift.cli.main", "up", "--nodes", "fog-a", "--home",
         str(home), "--timeout", "120"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp",
    )  # fmt: skip
    try:
        # Its broker and the agent started (the agent's JVM starting): then ended.
        wait_until(lambda: (home / "logs" / "node-fog-a.log").exists() and len(ours()) >= 2,
                   60, describe="the broker and the agent started")  # fmt: skip
        os.kill(up.pid, signal.SIGTERM)
        assert up.wait(timeout=60) == 128 + signal.SIGTERM
        wait_until(lambda: not ours(), 30, describe="nothing of the cluster left")
    finally:
        if up.poll() is None:
            up.kill()
        for proc in ours():
            with contextlib.suppress(psutil.Error):
                proc.kill()


def test_up_over_a_running_cluster_says_which_nodes_run(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    from fogshift.supervisor.exceptions import AlreadyUp

    two_node_cluster(tmp_path, sleeper)
    with pytest.raises(AlreadyUp) as refused:
        cluster_ops.up(tmp_path, ["cloud", "fog-b"])
    assert refused.value.message.endswith("with nodes cloud, fog-b")
    assert "`fogshift up --nodes cloud,fog-b,NEW` (every node it has and the new one) adds" in (
        refused.value.hint or ""
    )
    # A plain `up` (its default nodes) over a cluster of other names adds none of them: it
    # restarts what died, and here nothing did.
    with pytest.raises(AlreadyUp):
        cluster_ops.up(tmp_path, ["cloud", "fog-a"])
    with pytest.raises(AlreadyUp):
        cluster_ops.up(tmp_path, ["fog-a", "fog-c"])
    assert sleeper.poll() is None  # nothing stopped


def test_up_over_a_running_cluster_names_a_node_the_orchestrator_does_not_hear(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every process runs, so `up` starts nothing; fog-b's is frozen: "already up" alone
    # read as all is well.
    from fogshift.supervisor.exceptions import AlreadyUp

    two_node_cluster(tmp_path, sleeper)

    def view(name: str, alive: bool, seen: float) -> dict[str, Any]:
        return {"name": name, "url": "http://127.0.0.1:1", "pid": 1, "pgid": 1,
                "healthy": alive, "alive": alive, "ready": True, "error": None,
                "last_seen_s": seen, "cpu_percent": None, "replicas": [], "elements": [],
                "checkpoints": []}  # fmt: skip

    class Orchestrator:
        heard = [view("cloud", True, 0.4), view("fog-b", False, 41.7)]

        def __enter__(self) -> Orchestrator:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def get(self, path: str) -> Any:
            assert path == "/nodes"
            return self.heard

    monkeypatch.setattr(cluster_ops, "orchestrator_client", lambda home, timeout_s: Orchestrator())
    with pytest.raises(AlreadyUp) as refused:
        cluster_ops.up(tmp_path, ["cloud", "fog-b"])
    said = refused.value.message
    assert said.endswith("with nodes cloud, fog-b; fog-b (silent 42 s) runs but the "
                         "orchestrator does not hear from it (frozen or hung?)"), said  # fmt: skip
    assert (refused.value.hint or "").startswith("a node that runs but does not answer is "
                                                 "frozen or hung (`kill -CONT` it")  # fmt: skip
    Orchestrator.heard = [view("cloud", True, 0.4), view("fog-b", True, 0.9)]
    with pytest.raises(AlreadyUp) as refused:
        cluster_ops.up(tmp_path, ["cloud", "fog-b"])
    assert refused.value.message.endswith("with nodes cloud, fog-b")
    assert sleeper.poll() is None  # nothing stopped


def test_a_node_that_cannot_join_a_running_cluster_is_refused_before_anything_starts(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # `up --nodes cloud,fog-a,fog-b` over a running cloud+fog-b cluster said only "already
    # up": fog-a was silently not started. Now it is added, except where it cannot be: nodes
    # an older fogshift started, whose command a new node copies, or an isolated cluster
    # (it would need a namespace, a link and a relay of its own).
    cluster = two_node_cluster(tmp_path, sleeper)
    running = cluster.orchestrator
    with pytest.raises(InvalidInput) as refused:
        cluster_ops.up(tmp_path, ["cloud", "fog-a", "fog-b"])
    assert refused.value.message.startswith("cannot add fog-a to the cluster under")
    assert refused.value.received == "nodes with no start command recorded"
    assert sleeper.poll() is None  # nothing stopped, nothing started
    assert not (tmp_path / "nodes").exists() and not (tmp_path / "logs").exists()
    recorded = cluster.model_copy(update={"nodes": {
        "cloud": running.model_copy(update={"argv": ("fogshift", "serve-agent")})
    }})  # fmt: skip
    with pytest.raises(InvalidInput) as refused:
        cluster_ops._check_addable(tmp_path, recorded, ["fog-a"], isolate=True)
    assert refused.value.message.startswith("cannot add fog-a to the isolated cluster")
    assert refused.value.received == "--isolate"


def test_adding_a_node_waits_for_the_new_node_only(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An add waits for the nodes it starts: a sick node of the running cluster (one that
    died after `up`, one whose Spark failed) must not fail the add and have the healthy new
    node stopped. (The wait itself is the one `up` uses, tested with real agents.)"""
    from fogshift.broker.client import BrokerAddress

    cluster = two_node_cluster(tmp_path, sleeper, argv=(
        *SLEEPER, "--name", "cloud", "--home", "h", "--host", "127.0.0.1", "--port", "9",
        "--token-file", "t", "--broker-file", "b",
    ))  # fmt: skip
    BrokerAddress("nats://127.0.0.1:9").save(cluster_ops.broker_file(tmp_path))
    waited: list[list[str]] = []
    monkeypatch.setattr(cluster_ops, "wait_healthy",
                        lambda home, nodes, *_: waited.append(list(nodes)) or [])  # fmt: skip
    # (No orchestrator: fog-c was removed before and added again once.)
    monkeypatch.setattr(cluster_ops, "_admit", lambda home, nodes: {"fog-c": 1})
    grown = cluster_ops.add_nodes(tmp_path, cluster, ["fog-c"], 5, lambda _: None)
    try:
        assert waited == [["fog-c"]]
        # Its token is of the generation the orchestrator gave it.
        _, operator = cluster_ops.load_cluster(tmp_path)
        token = cluster_ops.node_token_file(tmp_path, "fog-c").read_text()
        assert token == node_token(operator, "fog-c", 1) != node_token(operator, "fog-c")
        assert list(grown.nodes) == ["cloud", "fog-b", "fog-c"]
        assert grown.nodes["fog-c"].argv[-12:] == (
            "--name", "fog-c", "--home", str(tmp_path / "nodes" / "fog-c"),
            "--host", "127.0.0.1", "--port", grown.nodes["fog-c"].url.rsplit(":", 1)[1],
            "--token-file", str(cluster_ops.node_token_file(tmp_path, "fog-c")),
            "--broker-file", str(cluster_ops.node_broker_file(tmp_path, "fog-c")),
        )  # fmt: skip
    finally:
        cluster_ops.kill_group(grown.nodes["fog-c"].pgid, 9)


def test_removing_nodes_is_refused_before_anything_changes(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    from fogshift.exceptions import Unavailable
    from fogshift.orchestrator.exceptions import UnknownNode

    cluster = two_node_cluster(tmp_path, sleeper)
    before = cluster_ops.cluster_file(tmp_path).read_text()
    with pytest.raises(UnknownNode) as unknown:  # (exit 1, as `migrate --to` one not there)
        cluster_ops.remove_nodes(tmp_path, ["fog-a"], lambda _: None)
    assert unknown.value.message.startswith("cannot remove fog-a from the cluster under")
    assert unknown.value.expected == "one or more of cloud, fog-b"
    with pytest.raises(InvalidInput) as refused:
        cluster_ops.remove_nodes(tmp_path, ["fog-b", "cloud"], lambda _: None)
    assert "`fogshift down` stops the whole cluster" in (refused.value.hint or "")
    isolated = cluster.model_copy(update={"network": {"fog-b": object()}})
    with pytest.raises(InvalidInput) as refused:
        cluster_ops._check_removable(tmp_path, isolated, ["fog-b"])
    assert refused.value.received == "--isolate"
    gone = cluster.model_copy(update={"orchestrator": gone_process()})
    with pytest.raises(Unavailable, match="must forget a node before its agent stops"):
        cluster_ops._check_removable(tmp_path, gone, ["fog-b"])
    assert cluster_ops.cluster_file(tmp_path).read_text() == before
    assert sleeper.poll() is None  # nothing stopped


class _Orchestrator:
    """A stand-in for the orchestrator's client in :func:`cluster_ops.drain_node`: one
    running pipeline; a migration moves the PE where it is asked to."""

    def __init__(
        self,
        placed: dict[str, tuple[str, str | None]],
        healthy: list[str],
        holds: list[dict[str, str]] | None = None,
        standbys: dict[str, str] | None = None,
        partitions: dict[str, str] | None = None,
    ) -> None:
        self.placed = placed  # element -> (node, planned redeploy node)
        self.partitions = partitions or {}  # a partition's id -> the element it is of
        self.healthy = healthy
        self.standbys = standbys or {}  # element -> its standby's node
        self.holds = holds or []  # what GET /nodes/{name}/holds answers besides the PEs
        self.moves: list[tuple[str, str]] = []
        self.leases: list[tuple[str, float | None]] = []  # PUT /nodes/{name}/leaving

    def __enter__(self) -> _Orchestrator:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def get(self, path: str) -> Any:
        element = {"kind": "map", "state": "running", "events_in": 0, "events_out": 0,
                   "dead_letters": 0, "restarts": 0, "error": None, "planned_backup": None,
                   "last_restore": None}  # fmt: skip
        node = {"url": "http://127.0.0.1:9", "pid": 1, "pgid": 1, "alive": True, "ready": True,
                "error": None, "last_seen_s": 0.1, "cpu_percent": 1.0, "replicas": [],
                "elements": [], "checkpoints": []}  # fmt: skip
        if path == "/pipelines":
            return [{"pipeline": "p", "status": "running", "elements": [
                {**element, "element": e, "node": n, "planned_redeploy": r,
                 "partition_of": self.partitions.get(e), "standby":
                 {"node": self.standbys[e], "epoch": 2, "state": "running"}
                 if e in self.standbys else None}
                for e, (n, r) in self.placed.items()
            ]}]  # fmt: skip
        if path.endswith("/holds"):
            pes = [{"kind": "pe", "text": f"PE p/{e}"} for e in self.placed]
            return pes + self.holds
        assert path == "/nodes", path
        return [{**node, "name": n, "healthy": n in self.healthy}
                for n in ("cloud", "fog-a", "fog-b", "fog-c")]  # fmt: skip

    def put(self, path: str, json: dict[str, float | None]) -> None:
        assert path.endswith("/leaving"), path
        self.leases.append((path.split("/")[2], json["seconds"]))

    def post(self, path: str, json: dict[str, str]) -> None:
        element = path.split("/")[4]
        self.moves.append((element, json["target"]))
        self.placed[element] = (json["target"], self.placed[element][1])


def _same(orchestrator: _Orchestrator, *_: object, **__: object) -> _Orchestrator:
    return orchestrator


def test_a_drained_pe_goes_to_its_planned_redeploy_node_if_it_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`remove-node --drain` took the node running the fewest PEs, whatever the planner had
    chosen (for its recovery time) as the PE's redeploy node; now the planned node, if it
    is healthy and stays, else the least busy."""
    orchestrator = _Orchestrator(
        {"a": ("fog-c", "fog-b"), "b": ("fog-c", "fog-a"), "c": ("fog-c", "fog-c"),
         "d": ("fog-c", None), "e": ("fog-b", None)},
        healthy=["cloud", "fog-b", "fog-c"],
    )  # fmt: skip
    monkeypatch.setattr(cluster_ops, "orchestrator_client", lambda *_, **__: orchestrator)
    said: list[str] = []
    moved = cluster_ops.drain_node(Path("h"), "fog-c", {"fog-c"}, said.append)
    assert moved == ["p/a", "p/b", "p/c", "p/d"]
    # a: its planned node, busier than cloud; b: its planned fog-a is not healthy; c: its
    # planned node is the one leaving; d: no plan. The last three to the node with the
    # fewest PEs at their turn (cloud: 0, 1, 2 against fog-b's 2; a tie goes by name).
    assert orchestrator.moves == [("a", "fog-b"), ("b", "cloud"), ("c", "cloud"),
                                  ("d", "cloud")]  # fmt: skip
    assert said[0] == "moving p/a from fog-c to fog-b"


def test_a_drained_pe_does_not_go_where_its_own_standby_is_if_another_node_will_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With `standby: planned` the PE's standby stands on its planned redeploy node, where
    the drain moved it: the migration dropped the standby and the keeper started it again
    elsewhere. The standby's node is taken only when no other one stays."""
    orchestrator = _Orchestrator(
        {"a": ("fog-c", "fog-b"), "b": ("fog-c", "fog-b")}, healthy=["cloud", "fog-b", "fog-c"],
        standbys={"a": "fog-b", "b": "cloud"},
    )  # fmt: skip
    monkeypatch.setattr(cluster_ops, "orchestrator_client", lambda *_, **__: orchestrator)
    cluster_ops.drain_node(Path("h"), "fog-c", {"fog-c"}, lambda _: None)
    assert orchestrator.moves == [("a", "cloud"), ("b", "fog-b")]
    orchestrator.placed = {"c": ("fog-c", None)}
    orchestrator.moves = []
    with cluster_ops._draining(Path("h"), "fog-c"):
        cluster_ops.drain_node(Path("h"), "fog-c", {"fog-c"}, lambda _: None)
    # Marked leaving for the whole drain, then no more.
    assert orchestrator.leases == [("fog-c", cluster_ops.DRAIN_LEASE_S), ("fog-c", None)]
    orchestrator = _Orchestrator({"a": ("fog-c", "fog-b")}, healthy=["fog-b", "fog-c"],
                                 standbys={"a": "fog-b"})  # fmt: skip
    monkeypatch.setattr(cluster_ops, "orchestrator_client", lambda *_, **__: orchestrator)
    cluster_ops.drain_node(Path("h"), "fog-c", {"fog-c"}, lambda _: None)
    assert orchestrator.moves == [("a", "fog-b")]  # (the only node that stays)


def test_a_drained_partition_does_not_join_another_partition_of_its_element_if_it_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A walk-through's drain put aggregate-p1 beside aggregate-p2 (the least busy node by
    # name): two partitions on one node split no work, and `--keys --to` it was refused.
    parts = {"agg-p0": "agg", "agg-p1": "agg"}
    orchestrator = _Orchestrator(
        {"agg-p0": ("fog-c", None), "agg-p1": ("cloud", None), "x": ("fog-b", None)},
        healthy=["cloud", "fog-b", "fog-c"], partitions=parts,
    )  # fmt: skip
    monkeypatch.setattr(cluster_ops, "orchestrator_client", lambda *_, **__: orchestrator)
    cluster_ops.drain_node(Path("h"), "fog-c", {"fog-c"}, lambda _: None)
    assert orchestrator.moves == [("agg-p0", "fog-b")]  # (cloud: tied, first by name)
    # The only node that stays runs its sibling: it goes there all the same.
    orchestrator = _Orchestrator(
        {"agg-p0": ("fog-c", None), "agg-p1": ("cloud", None)},
        healthy=["cloud", "fog-c"], partitions=parts,
    )  # fmt: skip
    monkeypatch.setattr(cluster_ops, "orchestrator_client", lambda *_, **__: orchestrator)
    cluster_ops.drain_node(Path("h"), "fog-c", {"fog-c"}, lambda _: None)
    assert orchestrator.moves == [("agg-p0", "cloud")]


def test_a_drain_that_could_not_free_the_node_is_refused_before_any_pe_moves(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby the spec places on the node (or an unfinished operation naming it) keeps
    it whatever a drain moves: the PEs were migrated away, then the removal refused."""
    from fogshift.orchestrator.exceptions import NodeInUse

    two_node_cluster(tmp_path, sleeper)
    before = cluster_ops.cluster_file(tmp_path).read_text()
    for hold in ({"kind": "standby", "text": "pipeline p, whose spec places its standbys there"},
                 {"kind": "settling", "text": "PE q/c of a pipeline being stopped"}):  # fmt: skip
        orchestrator = _Orchestrator({"a": ("cloud", None), "b": ("fog-b", None)},
                                     healthy=["cloud", "fog-b"], holds=[hold])  # fmt: skip
        monkeypatch.setattr(cluster_ops, "orchestrator_client", partial(_same, orchestrator))
        with pytest.raises(NodeInUse) as refused:
            cluster_ops.remove_nodes(tmp_path, ["fog-b"], lambda _: None, drain=True)
        assert refused.value.message == f"node 'fog-b' still hosts or is named by {hold['text']}"
        assert "recovery.standby" in (refused.value.hint or "")
        assert orchestrator.moves == []  # nothing moved
        # Refused before it marked the node leaving: marked, the keeper would drop a
        # standby the spec places there.
        assert orchestrator.leases == []
    assert cluster_ops.cluster_file(tmp_path).read_text() == before
    assert sleeper.poll() is None


def test_a_signal_that_comes_as_a_process_starts_stops_that_process_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `up` ended by SIGTERM just as it started an agent (inside Popen, waiting for the
    # child's exec, or before its caller recorded it) left that agent running: seen under
    # load in the test above, the agent ran on after `up` had ended.
    import os
    import signal

    children: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = real(*args, **kwargs)
        children.append(child)
        os.kill(os.getpid(), signal.SIGTERM)  # (its handler runs at the next bytecode)
        return child

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(SystemExit) as ended, cluster_ops._ended_by_signals():
        cluster_ops._spawn(SLEEPER, tmp_path / "log")
    assert ended.value.code == 128 + signal.SIGTERM
    try:
        assert children[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        children[0].kill()
        children[0].wait()


def test_an_up_ended_by_a_signal_says_what_it_stopped_and_what_it_kept(tmp_path: Path) -> None:
    # It ended without a word: the nodes it had restarted and kept ran on, the others not.
    said: list[str] = []
    kept = stopped = None
    try:
        with pytest.raises(SystemExit), cluster_ops._ended_by_signals(said.append):
            kept = cluster_ops._spawn(SLEEPER, tmp_path / "logs" / "node-fog-a.log")
            cluster_ops._kept(kept)
            stopped = cluster_ops._spawn(SLEEPER, tmp_path / "logs" / "node-fog-b.log")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # (its handler runs at the next bytecode)
        assert said == ["warning: `up` ended by SIGTERM: stopped node fog-b of what it had "
                        "started; kept node fog-a running (in the cluster file: `fogshift "
                        "down` stops the cluster)"]  # fmt: skip
        assert stopped is not None and kept is not None
        assert not {stopped.pid, kept.pid} & set(cluster_ops._labels)  # (none kept past `up`)
        wait_until_gone = time.monotonic() + 10
        while stopped.runs() and time.monotonic() < wait_until_gone:
            time.sleep(0.05)
        assert not stopped.runs() and kept.runs()
    finally:
        for info in (kept, stopped):
            if info is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(info.pgid, signal.SIGKILL)


class _SignalledInFinaliser:
    """Sends this process SIGTERM from its ``__del__``: the handler's ``SystemExit`` is raised
    inside the finaliser, where Python prints it as "Exception ignored" and drops it."""

    def __del__(self) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # (its handler runs at the next bytecode: here)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the point)
def test_a_signal_dropped_inside_a_finaliser_still_ends_up(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # Seen under load: `up` ended by SIGTERM went on and finished with 0, its services
    # running: the handler's SystemExit came inside a finaliser and was dropped.
    import signal

    from fogshift.common.exceptions import WaitTimedOut

    # Where `up` waits (here for an agent that never answers), it ends at the next poll.
    agent = ProcessInfo.of(sleeper.pid, url="http://127.0.0.1:9")
    cluster_ops.node_token_file(tmp_path, "fog-a").parent.mkdir(parents=True, exist_ok=True)
    cluster_ops.node_token_file(tmp_path, "fog-a").write_text("t")
    started = time.monotonic()
    with pytest.raises(SystemExit) as ended, cluster_ops._ended_by_signals():
        _SignalledInFinaliser()  # (dropped at once: its finaliser runs here)
        with contextlib.suppress(WaitTimedOut, FogshiftError):
            cluster_ops.wait_agents_ready(tmp_path, {"fog-a": agent}, 30, lambda line: None)
    assert ended.value.code == 128 + signal.SIGTERM
    assert time.monotonic() - started < 10  # at the wait's first poll, not its timeout

    # After its last wait, `up` ends as it returns, and what it started is stopped.
    with pytest.raises(SystemExit) as ended, cluster_ops._ended_by_signals():
        cluster_ops._spawned.append(ProcessInfo.of(sleeper.pid))
        _SignalledInFinaliser()
    assert ended.value.code == 128 + signal.SIGTERM
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    # Nothing carried over: the next `up` in this interpreter is not ended by it.
    with cluster_ops._ended_by_signals():
        cluster_ops._check_ended()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_as_a_started_process_is_let_go_ends_up_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The window of the run above: `_spawn` returned, its Popen's finaliser ran, and the
    # SIGTERM the test sent as the agent started came inside it.
    import os
    import signal

    pids: list[int] = []

    class Signalling(subprocess.Popen):  # type: ignore[type-arg]
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            super().__del__()

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = Signalling(*args, **kwargs)
        pids.append(child.pid)  # (not the object: its finaliser runs as `_spawn` lets go)
        return child

    monkeypatch.setattr(subprocess, "Popen", popen)
    try:
        with pytest.raises(SystemExit) as ended, cluster_ops._ended_by_signals():
            cluster_ops._spawn(SLEEPER, tmp_path / "log")
            pytest.fail("`_spawn` returned: the signal was dropped")
        assert ended.value.code == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while alive(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pids[0])  # stopped with what that `up` started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)


def test_a_ctrl_c_as_a_process_starts_stops_it_then_interrupts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ^C raised inside Popen (as it waits for the child's exec) left the child running in
    # its own session, unrecorded, holding its node's folder: the next `up` waited it out.
    import os
    import signal

    pids: list[int] = []
    real = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = real(*args, **kwargs)
        pids.append(child.pid)
        os.kill(os.getpid(), signal.SIGINT)  # the ^C, as the child starts
        return child

    monkeypatch.setattr(subprocess, "Popen", popen)
    before = signal.getsignal(signal.SIGINT)  # (a Spark session in this worker sets its own)
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster_ops._spawn(SLEEPER, tmp_path / "log")
        deadline = time.monotonic() + 10
        while alive(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pids[0])
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)


def test_restarting_nodes_waits_for_the_restarted_ones_only(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` over a cluster with a dead node waited for every member: one frozen (SIGSTOP, a
    hung machine) failed the wait after --timeout, and the node it had just started again
    was stopped, at every `up` while the other stayed frozen. (The others are checked
    after, killing nothing: `_living_heard`.)"""
    cluster = two_node_cluster(tmp_path, sleeper)
    # The dead agent left a member of its group (its JVM): the file then recorded only the
    # new group, and `down` could not reach it.
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable,"
         " '-c', 'import time; time.sleep(120)']); time.sleep(120)"],
        start_new_session=True,
    )  # fmt: skip
    wait_for = time.monotonic() + 10
    while len(_group(leader.pid)) < 2 and time.monotonic() < wait_for:
        time.sleep(0.05)
    dead = ProcessInfo.of(leader.pid).model_copy(
        update={"url": "http://127.0.0.1:9", "argv": tuple(SLEEPER)}
    )
    leader.kill()
    leader.wait()
    (left,) = _group(dead.pgid)
    cluster = cluster.model_copy(update={"nodes": {**cluster.nodes, "fog-b": dead}})
    save_cluster(tmp_path, cluster)
    waited: list[list[str]] = []
    monkeypatch.setattr(cluster_ops, "wait_healthy",
                        lambda home, nodes, *_: waited.append(list(nodes)) or [])  # fmt: skip
    again = cluster_ops.restart_nodes(tmp_path, cluster, ["fog-b"], 5, lambda _: None)
    try:
        assert waited == [["fog-b"]]
        assert again.nodes["fog-b"].runs() and again.nodes["fog-b"].pid != dead.pid
        assert _gone_soon(left), "the dead agent's leftover was not stopped"
        # Kept whatever ends this `up` from now on (a SIGTERM during a later wait, for a
        # frozen node, stopped it with what `up` had started).
        assert again.nodes["fog-b"].pid not in [p.pid for p in cluster_ops._spawned]
    finally:
        cluster_ops.kill_group(again.nodes["fog-b"].pgid, 9)
        cluster_ops.kill_group(dead.pgid, 9)


def _group(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that run (not zombies)."""
    return [p.pid for p in psutil.process_iter(["pid"])
            if _pgid(p.pid) == pgid and alive(p.pid)]  # fmt: skip


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_nodes_that_ran_all_along_and_stay_silent_are_said_and_nothing_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def silent(home: Path, nodes: list[str], timeout_s: float, *_: Any) -> list[Any]:
        raise cluster_ops.Unavailable(f"still waiting for: {nodes}")

    monkeypatch.setattr(cluster_ops, "wait_healthy", silent)
    monkeypatch.setattr(cluster_ops, "kill_group", lambda *_: pytest.fail("killed something"))
    with pytest.raises(cluster_ops.Unavailable) as said:
        cluster_ops._living_heard(tmp_path, ["fog-a"], time.monotonic() + 1, lambda _: None,
                                  "fog-b runs again")  # fmt: skip
    assert said.value.message.startswith("fog-b runs again, but not every node whose processes")
    assert "frozen or hung" in (said.value.hint or "")


def test_down_while_a_first_up_starts_its_cluster_says_so(tmp_path: Path) -> None:
    # A first `up` records its cluster only once all of it started (minutes on two cores):
    # `down` meanwhile said "no fogshift cluster is up ... run `fogshift up`".
    with pytest.raises(cluster_ops.NotUp):
        cluster_ops.down(tmp_path, grace_s=1)  # nothing at all: as before
    assert not (tmp_path / CLUSTER_LOCK).exists()  # (and nothing made in the home)
    other = holder(tmp_path / CLUSTER_LOCK)  # the first `up`, starting
    try:
        with pytest.raises(AlreadyRunning) as err:
            cluster_ops.down(tmp_path, grace_s=1)
        assert "is starting its cluster" in (err.value.hint or "")
    finally:
        other.kill()
        other.wait()
    with pytest.raises(cluster_ops.NotUp):
        cluster_ops.down(tmp_path, grace_s=1)  # it ended without a cluster


def test_a_removal_the_orchestrator_does_not_answer_is_left_for_a_later_up(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A `remove-node` cut short, then `up` with the orchestrator frozen: it waited the 30
    # minutes an operation may take, holding the home's lock (`down` refused meanwhile).
    from fogshift.common.exceptions import NoAnswer

    cluster = two_node_cluster(tmp_path, sleeper).model_copy(update={"removing": ("fog-b",)})
    save_cluster(tmp_path, cluster)
    asked: list[float] = []

    def no_answer(home: Path, cluster: Any, name: str, grace_s: float, timeout_s: float) -> Any:
        asked.append(timeout_s)
        raise NoAnswer("the orchestrator at http://127.0.0.1:9 did not answer in time")

    monkeypatch.setattr(cluster_ops, "_remove_node", no_answer)
    said: list[str] = []
    kept = cluster_ops._finish_removals(tmp_path, cluster, said.append, 7)
    assert asked == [7] and kept.removing == ("fog-b",)  # (marked still: the next `up`'s)
    assert said[-1].startswith("the removal of node fog-b is finished by a later `up`")


def test_a_request_to_a_stopped_orchestrator_is_given_up_before_its_timeout(
    tmp_path: Path,
) -> None:
    # A stopped orchestrator's socket still takes connections (the kernel's backlog): the
    # CLI's reads waited their whole two minutes, its operations half an hour.
    listener = subprocess.Popen(
        [sys.executable, "-c", "import socket, time; s = socket.socket(); "
         "s.bind(('127.0.0.1', 0)); s.listen(8); print(s.getsockname()[1], flush=True); "
         "time.sleep(120)"],
        start_new_session=True, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        write_cluster(tmp_path, ProcessInfo.of(listener.pid), broker=None,
                      url=f"http://127.0.0.1:{port}")  # fmt: skip
        os.kill(listener.pid, signal.SIGSTOP)
        started = time.monotonic()
        with (
            cluster_ops.orchestrator_client(tmp_path, timeout_s=90) as client,
            pytest.raises(NoAnswer) as given_up,
        ):
            client.get("/pipelines")
        assert time.monotonic() - started < 45
        assert f"its process (pid {listener.pid}) is stopped" in given_up.value.message
        assert f"kill -CONT -- -{listener.pid}" in given_up.value.message
        assert "once it is continued" in (given_up.value.hint or "")
        # While it stays stopped, a client that polls (the dashboard's) sends nothing more:
        # each request had left a thread and a connection waiting out the timeout.
        with (
            cluster_ops.orchestrator_client(tmp_path, timeout_s=90) as client,
            pytest.raises(Unavailable) as unsent,
        ):
            with contextlib.suppress(NoAnswer):
                client.get("/pipelines")  # (its first: sent, given up)
            client.get("/pipelines")
        assert type(unsent.value) is Unavailable  # (not NoAnswer: nothing was asked of it)
        assert "was not sent GET /pipelines: its process" in unsent.value.message
    finally:
        listener.kill()
        listener.wait()


def test_a_link_of_a_node_not_there_is_an_unknown_node_not_a_cluster_without_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `net partition fog-z` on an isolated cluster: a typo (exit 1, `unknown_node`, as
    # `remove-node` says it), where it said `not_isolated` (exit 2) as if the cluster had
    # no links at all.
    from types import SimpleNamespace

    from fogshift.network.exceptions import NotIsolated
    from fogshift.orchestrator.exceptions import UnknownNode

    isolated = SimpleNamespace(network={"fog-a": "its link"})
    monkeypatch.setattr(cluster_ops, "load_cluster", lambda home: (isolated, None))
    with pytest.raises(UnknownNode, match="no isolated node 'fog-z'") as typo:
        cluster_ops.isolated_node(tmp_path, "fog-z")
    assert (typo.value.expected, typo.value.received) == ("one of fog-a", "'fog-z'")
    assert cluster_ops.isolated_node(tmp_path, "fog-a") == "its link"
    plain = SimpleNamespace(network={})
    monkeypatch.setattr(cluster_ops, "load_cluster", lambda home: (plain, None))
    with pytest.raises(NotIsolated, match="without isolation"):
        cluster_ops.isolated_node(tmp_path, "fog-a")
