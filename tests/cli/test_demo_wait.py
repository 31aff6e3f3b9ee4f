"""The demo's wait for input a killed node never saw, on scripted orchestrator answers."""

from __future__ import annotations

import time

import pytest

from fogshift.cli import demo


class _Scripted:
    """Answers ``GET /nodes`` and ``GET /pipelines/p`` from (heartbeat age, source count) pairs,
    one pair per round; the last pair repeats."""

    def __init__(self, rounds: list[tuple[float, int]]) -> None:
        self.rounds = rounds
        self.round = 0

    def get(self, path: str) -> object:
        age, count = self.rounds[min(self.round, len(self.rounds) - 1)]
        if path == "/nodes":
            return [{"name": "cloud", "last_seen_s": age}, {"name": "fog-a", "last_seen_s": 0.0}]
        self.round += 1  # the status closes a round: it is read after the nodes
        return {"elements": [
            {"kind": "csv-source", "node": "cloud", "events_out": count},
            {"kind": "window-aggregate", "node": "fog-a", "events_out": 0},
        ]}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo.time, "sleep", lambda _s: None)


def test_counts_only_from_heartbeats_after_the_kill_and_two_growths() -> None:
    killed_at = time.monotonic() - 1.0
    # Before the kill (heartbeats 1000 s old) the count grows, and must not count; after it,
    # the first count may lack the batch under way at the kill: 10, then 12 (maybe that
    # batch), then 15 (a batch begun after the kill).
    client = _Scripted([(1000.0, 1), (1000.0, 5), (1000.0, 9), (0.0, 10), (0.0, 10), (0.0, 12),
                        (0.0, 12), (0.0, 15), (0.0, 20)])  # fmt: skip
    assert demo._input_moved_on(client, "p", killed_at, time.monotonic() + 60)
    assert client.round == 8  # returned on reading 15, not before


def test_gives_up_when_the_input_stands_still() -> None:
    killed_at = time.monotonic() - 1.0
    client = _Scripted([(0.0, 10), (0.0, 11)])
    assert not demo._input_moved_on(client, "p", killed_at, time.monotonic() + 0.3)
    assert client.round > 2


def test_a_cluster_file_left_by_a_dead_cluster_is_brought_up_not_used(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a reboot the file names processes long gone: the demo took the cluster as up and
    # failed with "the orchestrator cannot be reached".
    from pathlib import Path

    from fogshift.spec.examples import example_path
    from fogshift.supervisor import cluster as cluster_ops
    from fogshift.supervisor.cluster import ClusterFile, ProcessInfo, save_cluster, token_file

    home = Path(str(tmp_path))
    token_file(home).write_text("secret\n")
    gone = ProcessInfo(pid=2**22 + 1, pgid=2**22 + 1, url="http://127.0.0.1:9")  # no such pid
    save_cluster(home, ClusterFile(orchestrator=gone, broker=None, nodes={"cloud": gone},
                                   broker_url="nats://127.0.0.1:9"))  # fmt: skip

    class Up(Exception):
        pass

    def up(*args: object, **kwargs: object) -> None:
        raise Up

    monkeypatch.setattr(cluster_ops, "up", up)
    with pytest.raises(Up):
        demo.run_demo(home, example_path("case1") / "case1.yaml", 60, False, demo.Console())


class _Cluster:
    """A cluster whose nodes are ``nodes`` and whose pipeline ``case1`` runs; records posts."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.posts: list[str] = []

    def get(self, path: str) -> object:
        if path == "/nodes":
            return [{"name": n, "url": "http://127.0.0.1:9", "pid": None, "pgid": None,
                     "healthy": True, "alive": True, "ready": True, "error": None,
                     "last_seen_s": 0.0, "cpu_percent": None, "replicas": [], "elements": [],
                     "checkpoints": []} for n in self.nodes]  # fmt: skip
        return [{"pipeline": "case1", "status": "running"}]

    def post(self, path: str, json: object = None, params: dict | None = None) -> object:
        self.posts.append(path + "".join(f"?{k}={v}" for k, v in (params or {}).items()))
        return {}


def test_a_demo_spec_the_cluster_cannot_run_stops_nothing() -> None:
    # The demo stopped the running pipeline of its name, then had its spec refused: a node
    # it names is not in the cluster. Nothing is stopped now; a spec that fits redeploys.
    from fogshift.spec.examples import example_path
    from fogshift.spec.exceptions import InvalidSpec
    from fogshift.spec.loader import load_spec

    spec = load_spec(example_path("case1") / "case1.yaml")
    placed = sorted({e.node for e in spec.elements})
    short = _Cluster(placed[1:])
    with pytest.raises(InvalidSpec, match=f"unknown node {placed[0]!r}"):
        demo.redeploy(short, spec)  # type: ignore[arg-type]
    assert short.posts == []
    whole = _Cluster(placed)
    demo.redeploy(whole, spec)  # type: ignore[arg-type]
    # Started over: the run of before, stopped, is the demo's own.
    assert whole.posts == ["/pipelines/case1/stop", "/pipelines?fresh=true"]


def test_a_demo_killed_before_it_stopped_its_cluster_has_the_next_stop_it(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Killed (SIGTERM: a CI's timeout, a terminal closed) its `finally` never ran, and every
    # later demo took the cluster it had left for a user's: left running.
    import os
    import signal
    from pathlib import Path

    from fogshift.spec.examples import example_path
    from fogshift.supervisor import cluster as cluster_ops

    home = Path(str(tmp_path))
    running = [False]
    calls: list[str] = []

    def up(*args: object, **kwargs: object) -> None:
        calls.append("up")
        cluster_ops.cluster_file(home).write_text("{}")
        running[0] = True

    def down(*args: object, **kwargs: object) -> None:
        calls.append("down")
        running[0] = False

    def killed(*args: object, **kwargs: object) -> bool:
        os.kill(os.getpid(), signal.SIGTERM)  # (as a CI's timeout sends it mid-run)
        return True

    monkeypatch.setattr(cluster_ops, "up", up)
    monkeypatch.setattr(cluster_ops, "down", down)
    monkeypatch.setattr(cluster_ops, "cluster_running", lambda h: running[0])
    monkeypatch.setattr(demo, "_run", killed)
    spec = example_path("case1") / "case1.yaml"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        demo.run_demo(home, spec, 60, False, demo.Console())
    assert ended.value.code == 128 + signal.SIGTERM and calls == ["up", "down"]
    assert signal.getsignal(signal.SIGTERM) == before  # (put back)
    # SIGKILLed instead: the cluster runs on, its mark left; the next demo stops it.
    running[0] = True
    (home / demo.DEMO_MARK).touch()
    monkeypatch.setattr(demo, "_run", lambda *a, **k: True)
    assert demo.run_demo(home, spec, 60, False, demo.Console())
    assert calls == ["up", "down", "down"] and not (home / demo.DEMO_MARK).exists()
    # A user's cluster (no mark) is left running, as ever.
    running[0] = True
    assert demo.run_demo(home, spec, 60, False, demo.Console())
    assert calls == ["up", "down", "down"] and running[0]
