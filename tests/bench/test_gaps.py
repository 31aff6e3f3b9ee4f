"""The output gap and added latency of a reconfiguration (``fogshift.bench.gaps``)."""

from __future__ import annotations

from typing import Any

import pytest

from fogshift.bench import gaps
from fogshift.bench.gaps import Output


def _steady(first: float, last: float, latency_ms: float) -> list[Output]:
    """An output every 300 ms from ``first`` to ``last`` (s), each ``latency_ms`` late."""
    count = round((last - first) / 0.3) + 1
    return [Output(round(first + 0.3 * k, 3), latency_ms) for k in range(count)]


def test_a_stop_of_the_output_is_its_gap_beyond_the_steady_interval() -> None:
    # The first outputs paid the query's start (5 s and 3 s late, and 1.4 s apart);
    # then one every 300 ms, 100 ms late; the reconfiguration from 10 to 12 s stopped the
    # output from 9.9 to 11.4 s, and the events that waited came out 1.6 and 0.9 s late.
    emitted = [
        Output(0.0, 5000.0),
        Output(0.7, 3000.0),
        *_steady(2.1, 9.9, 100.0),
        Output(11.4, 1600.0),
        Output(11.7, 900.0),
        *_steady(12.0, 20.1, 100.0),
    ]
    found = gaps.disruption(emitted, start=10.0, end=12.0, settle_s=1.0)
    assert found.steady_gap_ms == pytest.approx(300.0)
    assert found.max_gap_ms == pytest.approx(1500.0)
    assert found.output_gap_ms == pytest.approx(1200.0)
    # Outside the window every output was 100 ms late (the first second is left out).
    assert found.steady_p99_ms == pytest.approx(100.0)
    # Inside [10, 13]: 1600, 900 and four at 100: the nearest-rank p99 of six is the worst.
    assert found.window_p99_ms == pytest.approx(1600.0)
    assert found.added_p99_ms == pytest.approx(1500.0)
    assert found.as_row()["output_gap_ms"] == 1200.0


def test_the_first_output_after_a_quick_reconfiguration_counts_as_in_its_window() -> None:
    # Batches 1 s apart; the reconfiguration took 0.8 s from 10.0 s, its window ends at
    # 11.8 s, and the output that carried the events that waited came at 12.4 s.
    emitted = [
        *[Output(float(t), 100.0) for t in range(1, 10)],
        Output(12.4, 2500.0),
        *[Output(float(t) + 0.4, 100.0) for t in range(13, 20)],
    ]
    found = gaps.disruption(emitted, start=10.0, end=10.8, settle_s=1.0)
    assert found.window_p99_ms == pytest.approx(2500.0)
    assert found.steady_p99_ms == pytest.approx(100.0)
    assert found.added_p99_ms == pytest.approx(2400.0)


def test_a_reconfiguration_nobody_noticed_costs_nothing() -> None:
    emitted = [Output(0.0, 100.0), *_steady(0.3, 30.0, 100.0)]
    found = gaps.disruption(emitted, start=10.0, end=12.0)
    assert found.output_gap_ms == pytest.approx(0.0, abs=1e-6)
    assert found.added_p99_ms == pytest.approx(0.0)


def test_too_few_outputs_say_nothing_rather_than_zero() -> None:
    found = gaps.disruption([Output(0.0, 10.0), Output(1.0, None)], start=5.0, end=6.0)
    assert found.max_gap_ms is None and found.output_gap_ms is None
    assert gaps.disruption([], start=5.0, end=6.0) == found
    assert found.window_p99_ms is None and found.added_p99_ms is None
    assert set(found.as_row().values()) == {None}


class _Pages:
    """The events endpoint of two streams, three sequences a page."""

    def __init__(self, streams: dict[str, list[dict[str, Any]]]) -> None:
        self.streams = streams
        self.calls: list[tuple[str, int]] = []

    def get(self, path: str, params: dict[str, int]) -> dict[str, Any]:
        element = path.split("/")[4]
        events = self.streams[element]
        after = params["after"]
        self.calls.append((element, after))
        stop = min(len(events), after + 3)
        return {
            "events": [e for e in events if after < e["seq"] <= stop],
            "scanned_to": stop,
            "last_seq": len(events),
        }


def test_outputs_are_joined_with_the_input_events_they_came_from() -> None:
    source = [{"seq": n, "stored": 100.0 + n} for n in range(1, 8)]
    # The aggregate's outputs name their input by origin; one names an input the stream no
    # longer holds (no latency), and the stream's sequences are its own.
    aggregate = [
        {"seq": n, "stored": 100.5 + origin, "origin": origin}
        for n, origin in enumerate([1, 2, 3, 5, 6, 99, 7], start=1)
    ]
    client = _Pages({"source": source, "aggregate": aggregate})
    emitted = gaps.outputs(client, "p", "aggregate", "source")  # type: ignore[arg-type]
    assert [o.stored for o in emitted] == [e["stored"] for e in aggregate]
    assert [o.latency_ms for o in emitted] == [500.0] * 5 + [None, 500.0]
    # Every page was read, forward from the last one.
    assert [a for e, a in client.calls if e == "aggregate"] == [0, 3, 6]


def test_with_micro_batches_the_steady_gap_is_the_interval_between_batches() -> None:
    # Three outputs per batch (2 ms apart), a batch a second; the batches due at 10 and 11 s
    # came at 12 s (with the one due then): the output stopped 3 s where it stops 1 s.
    batches = [0.0, *range(1, 10), *range(12, 25)]
    emitted = [Output(t + k * 0.002, 200.0) for t in batches for k in range(3)]
    found = gaps.disruption(emitted, start=10.0, end=11.5)
    assert found.steady_gap_ms == pytest.approx(996.0)
    assert found.max_gap_ms == pytest.approx(2996.0)
    assert found.output_gap_ms == pytest.approx(2000.0)


def test_the_switch_gap_is_the_wait_across_the_change_of_writer() -> None:
    # An origin over a slow link emits a batch every 6 s (epoch 1); the target takes over
    # at 12.8 s and emits every 300 ms (epoch 2). The longest interval in the window is the
    # origin's own (6 s), the writer switch itself cost 0.8 s.
    origin = [Output(t + k * 0.01, 900.0, epoch=1) for t in (0.0, 6.0, 12.0) for k in range(3)]
    target = [Output(round(12.82 + 0.3 * k, 3), 300.0, epoch=2) for k in range(30)]
    found = gaps.disruption([*origin, *target], start=10.0, end=13.0, settle_s=1.0)
    assert found.switch_gap_ms == pytest.approx(12820.0 - 12020.0)
    assert found.max_gap_ms == pytest.approx(6000.0 - 20.0)
    # Without epochs (or no change of writer) there is no switch to measure.
    plain = [Output(o.stored, o.latency_ms) for o in (*origin, *target)]
    assert gaps.disruption(plain, start=10.0, end=13.0).switch_gap_ms is None
    assert gaps.disruption(origin, start=10.0, end=13.0).switch_gap_ms is None


def test_each_writer_is_measured_against_its_own_rhythm() -> None:
    # An origin over a slow link emits a batch every 2.3 s (epoch 1), the target next to the
    # broker every 0.4 s (epoch 2). A handover from 9.5 to 11 s whose switch took 1.3 s
    # disturbed nothing: the consumers waited less than the origin made them wait anyway.
    origin = [Output(round(2.3 * k + d, 3), 900.0, epoch=1) for k in range(5) for d in (0, 0.002)]
    target = [Output(round(10.5 + 0.4 * k, 3), 300.0, epoch=2) for k in range(25)]
    found = gaps.disruption([*origin, *target], start=9.5, end=11.0)
    assert found.switch_gap_ms == pytest.approx(10500.0 - 9202.0)
    assert found.output_gap_ms == pytest.approx(0.0, abs=1e-6)
    assert found.steady_gap_ms == pytest.approx(400.0)
    # Had the switch taken 3.3 s, it exceeds the origin's 2.3 s (less its 2 ms batch) by 1 s.
    late = [Output(o.stored + 2.0, o.latency_ms, epoch=2) for o in target]
    found = gaps.disruption([*origin, *late], start=9.5, end=11.0)
    assert found.max_gap_ms == pytest.approx(12500.0 - 9202.0)
    assert found.steady_gap_ms == pytest.approx(2298.0)
    assert found.output_gap_ms == pytest.approx(12500.0 - 9202.0 - 2298.0)


def test_a_writer_without_steady_intervals_is_measured_against_all_outputs() -> None:
    # The migration came before the origin showed an interval of its own outside the window.
    origin = [Output(0.0, 100.0, epoch=1), Output(2.0, 100.0, epoch=1)]
    target = [Output(round(3.5 + 0.5 * k, 3), 100.0, epoch=2) for k in range(20)]
    found = gaps.disruption([*origin, *target], start=1.5, end=3.0, settle_s=1.0)
    assert found.steady_gap_ms == pytest.approx(500.0)
    assert found.max_gap_ms == pytest.approx(2000.0)
    assert found.output_gap_ms == pytest.approx(1500.0)


def test_batches_after_warm_count_intervals_between_batches_only() -> None:
    # Three outputs a batch, 2 ms apart, a batch every 0.5 s from 0 to 3 s: the first
    # second is left out, so the intervals counted start at 1.0 s: 1.0-1.5, ..., 2.5-3.0.
    emitted = [Output(0.5 * b + 0.002 * k, 100.0) for b in range(7) for k in range(3)]
    assert gaps.batches_after_warm(emitted) == 4
    assert gaps.batches_after_warm(emitted, warm_s=0.0) == 6
    assert gaps.batches_after_warm([]) == 0


def test_the_steady_rhythm_is_the_one_around_the_reconfiguration() -> None:
    # The origin's first batches came 2.2 s apart (its reader learning a slow link), then
    # every 1.1 s; the switch took 1.9 s: 0.8 s more than the rhythm its consumers saw.
    early = [Output(2.2 * k, 900.0, epoch=1) for k in range(4)]  # 0 ... 6.6 s
    later = [Output(round(6.6 + 1.1 * k, 3), 900.0, epoch=1) for k in range(1, 9)]  # ... 15.4
    target = [Output(round(17.3 + 0.4 * k, 3), 300.0, epoch=2) for k in range(30)]
    found = gaps.disruption([*early, *later, *target], start=15.0, end=16.0)
    assert found.steady_gap_ms == pytest.approx(1100.0)
    assert found.max_gap_ms == pytest.approx(1900.0)
    assert found.output_gap_ms == pytest.approx(800.0)
    # Measured against the whole run's intervals the first ones would have hidden it.
    assert gaps.disruption([*early, *later, *target], 15.0, 16.0, near_s=60.0).output_gap_ms < 0
