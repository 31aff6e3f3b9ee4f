"""The dashboard's memory of the last minutes: rates, chart series, marks."""

from __future__ import annotations

from fogshift.contracts import (
    HopLatency,
    NodeView,
    PipelineState,
    PipelineStatus,
    RestoreReport,
    RestoreStatus,
)
from fogshift.web.history import History, Sampler, Snapshot
from tests.web.test_graph import element


def node(name: str, healthy: bool = True) -> NodeView:
    return NodeView(
        name=name, url="http://127.0.0.1:1", pid=1, pgid=1, healthy=healthy, alive=healthy,
        ready=True, error=None, last_seen_s=0.1, cpu_percent=None, replicas=[], elements=[],
        checkpoints=[],
    )  # fmt: skip


def snap(t: float, out: int, where: str = "fog-a", restored: bool = False,
         fog_b: bool = True) -> Snapshot:  # fmt: skip
    report = (
        RestoreReport(pipeline="p", element="pe", target=where, status=RestoreStatus.RESTORED)
        if restored
        else None
    )
    status = PipelineStatus(
        pipeline="p", status=PipelineState.RUNNING,
        elements=[element("pe", where, [], out=out, last_restore=report)],
    )  # fmt: skip
    return Snapshot(t, [status], [node("fog-a"), node("fog-b", fog_b)])


def test_rate_over_the_last_seconds_and_none_when_a_counter_goes_back() -> None:
    history = History()
    assert history.rate("p", "pe") is None
    for k in range(10):
        history.record(snap(100.0 + k, out=10 * k))
    assert history.rate("p", "pe", over_s=5) == 10.0
    history.record(snap(110.0, out=20))  # restored from an older checkpoint
    assert history.rate("p", "pe", over_s=5) is None


def test_series_and_marks_of_a_migration_a_restore_and_a_node_loss() -> None:
    history = History()
    history.record(snap(100.0, out=0))
    history.record(snap(101.0, out=5))
    history.record(snap(102.0, out=9, where="fog-b"))  # moved, no new restore: a migration
    history.record(snap(103.0, out=12, where="fog-b", fog_b=False))  # its node lost
    history.record(snap(104.0, out=13, where="fog-a", restored=True, fog_b=False))
    history.record(snap(105.0, out=15, where="fog-a"))
    data = history.series("p", over_s=1)
    assert data["t"] == [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    assert data["rates"] == {"pe": [None, 5.0, 4.0, 3.0, 1.0, 2.0]}
    smooth = history.series("p", over_s=5)["rates"]
    assert smooth == {"pe": [None, 5.0, 4.5, 4.0, 3.25, 3.0]}  # type: ignore[comparison-overlap]
    kinds = [(m["t"], m["kind"]) for m in data["marks"]]  # type: ignore[index]
    assert kinds == [
        (102.0, "migration"),
        (103.0, "node-lost"),
        (104.0, "restore"),
        (105.0, "node-back"),
    ]
    assert [m.kind for m in history.marks("p")][:2] == ["node-back", "restore"]  # newest first
    assert history.series("other")["rates"] == {}


def test_the_window_forgets_old_samples_and_marks() -> None:
    history = History(window_s=10)
    history.record(snap(100.0, out=0))
    history.record(snap(101.0, out=1, where="fog-b"))
    history.record(snap(120.0, out=30, where="fog-b"))
    assert history.series("p")["t"] == [120.0] and history.marks() == []


def hop(seq: int, ms: float) -> HopLatency:
    return HopLatency(element="pe", input="src", seq=seq, input_seq=seq, stored=0.0,
                      latency_ms=ms)  # fmt: skip


def test_latency_is_kept_once_per_newer_output_and_charted_at_its_poll() -> None:
    history = History(window_s=60)
    assert history.latency("p", "pe") is None
    for t, (seq, ms) in zip((100.0, 101.0, 102.0, 103.0), ((5, 210.0), (5, 210.0), (9, 480.0),
                                                          (12, 230.0)), strict=True):  # fmt: skip
        history.record(snap(t, out=seq))
        history.record_latency(t, "p", [hop(seq, ms)])
    # The second poll saw the same newest output: no new point, a gap in the chart.
    assert history.series("p")["latency"] == {"pe": [210.0, None, 480.0, 230.0]}
    assert history.latency("p", "pe") == 230.0
    # Older than the window: forgotten with the samples.
    history.record(snap(200.0, out=13))
    assert history.latency("p", "pe") is None


def test_the_sampler_asks_each_running_pipeline_for_its_latency() -> None:
    asked: list[str] = []

    def fetch_latency(name: str) -> list[HopLatency]:
        asked.append(name)
        return [hop(len(asked), 100.0 * len(asked))]

    history = History()
    stopped = PipelineStatus(pipeline="q", status=PipelineState.STOPPED, elements=[])
    sampler = Sampler(history, lambda: ([snap(0, 1).pipelines[0], stopped], [node("fog-a")]),
                      fetch_latency=fetch_latency)  # fmt: skip
    sampler.poll()
    sampler.poll()
    assert asked == ["p", "p"]  # not the stopped one
    assert history.latency("p", "pe") == 200.0


def test_an_old_latency_does_not_come_back_once_the_window_pruned_it() -> None:
    # The newest output never changed: its latency returned as a new point every window, and
    # a PE that emitted nothing for minutes showed a latency.
    history = History(window_s=60)
    for t in range(200):
        history.record(snap(100.0 + t, out=6))
        history.record_latency(100.0 + t, "p", [hop(6, 345.6)])
    assert history.latency("p", "pe") is None
    points = [v for v in history.series("p")["latency"].get("pe", []) if v is not None]
    assert points == []


def test_a_stream_made_anew_shows_its_latencies_from_its_first_output() -> None:
    # A fresh deploy makes the streams anew: seqs start over, and each new output, below
    # the old newest, was taken as old: no latency until the PE passed its old count.
    history = History(window_s=60)
    history.record(snap(100.0, out=1_000_000))
    history.record_latency(100.0, "p", [hop(1_000_000, 200.0)])
    history.record(snap(101.0, out=3))
    history.record_latency(101.0, "p", [hop(3, 120.0)])
    assert history.latency("p", "pe") == 120.0
    history.record(snap(102.0, out=3))
    history.record_latency(102.0, "p", [hop(3, 120.0)])  # (the same output: no new point)
    assert history.series("p")["latency"] == {"pe": [200.0, 120.0, None]}


def test_a_poll_after_the_clock_went_back_is_taken_and_a_gone_pe_leaves_the_legend() -> None:
    history = History(window_s=60)
    history.record(snap(1000.0, out=5))
    # The wall clock set back 100 s; the PE moved to fog-b and fog-b was lost meanwhile.
    history.record(snap(900.0, out=9, where="fog-b", fog_b=False))
    latest = history.latest
    assert latest is not None and latest.t > 1000.0  # taken, after the one before
    assert latest.pipelines[0].elements[0].node == "fog-b"
    assert not next(n for n in latest.nodes if n.name == "fog-b").healthy
    # A PE no poll names any more (a retired partition) leaves the chart after the window.
    gone = PipelineStatus(pipeline="p", status=PipelineState.RUNNING,
                          elements=[element("other", "fog-a", [], out=1)])  # fmt: skip
    for k in range(1, 80):
        history.record(Snapshot(1000.0 + k, [gone], [node("fog-a")]))
    assert set(history.series("p")["rates"]) == {"other"}
