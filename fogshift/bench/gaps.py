"""What a reconfiguration costs the output, as its consumers see it: the output gap and the
added latency of one PE (issue #13's measures), from the broker's store times.

A reconfiguration's own ``downtime_ms`` is the procedure's view (from the pause, or the fence,
to the target committing beyond the origin). Its consumers see something else: outputs that
stop for a while, and events that take longer to get through. Both are read here from the
PE's output stream and its input stream, through the orchestrator's events endpoint, on the
broker's clock alone:

* the **output gap**: how much longer than usual the output stopped. Each interval between
  two consecutive outputs that touches the reconfiguration's window, less the steady interval
  of the writer that emitted its first output (the nearest-rank p99 of that writer's
  intervals outside the window: with micro-batches, the interval between two of its
  batches); the largest of these. A PE that emits every 300 ms and stopped for 1.2 s has a
  gap of 0.9 s. The steady interval is the writer's own because origin and target may run
  at different rhythms: over a link of 1 s RTT the origin's batches come ~2.3 s apart, the
  target's next to the broker 0.4 s; the origin's own interval around a handover is no
  disruption, and a switch is measured against the rhythm its consumers saw until then;
* the **added latency**: the p99 per-hop latency (an output's store time minus its input
  event's) of the outputs stored in the window, and of the first output after the
  reconfiguration in any case (it carries the events that waited through it: a quick
  reconfiguration next to batches a second apart may have no output in its window), minus
  the p99 of the others;
* the **switch gap**: the interval between the last output of the old writer and the first
  of the new one (the first output under a newer epoch) — what the change of writer itself
  cost. It differs from the output gap when the origin's own interval between outputs is
  long: over a link of 1 s RTT the origin's batches, each a few broker round trips, come
  seconds apart, and the longest interval in the window is one of them.

The window is ``[start, end + settle_s]``; outputs outside it are the steady ones, but for
the first ``warm_s`` of output: it pays the query's first batches and drains the input that
queued while the query started (in E1 its latency was twice the steady p99). A writer with
no steady interval of its own (none outside the window) is measured against the steady
interval of all outputs; :func:`batches_after_warm` tells a benchmark when the first writer
has shown its rhythm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from fogshift.bench.base import percentile
from fogshift.common.http import ServiceClient

#: The most stream sequences one read of the events endpoint asks for.
PAGE = 5_000


@dataclass(frozen=True)
class Output:
    """One output of the PE: when the broker stored it, and its per-hop latency (``None``
    when its input event is not known)."""

    stored: float
    latency_ms: float | None
    epoch: int | None = None


@dataclass(frozen=True)
class Disruption:
    """The output gap and added latency of one reconfiguration (ms; ``None`` when there
    were too few outputs to tell). ``max_gap_ms`` is the window's interval that exceeded its
    writer's usual one most, ``steady_gap_ms`` that usual one (:func:`disruption`)."""

    steady_gap_ms: float | None
    max_gap_ms: float | None
    output_gap_ms: float | None
    steady_p99_ms: float | None
    window_p99_ms: float | None
    added_p99_ms: float | None
    switch_gap_ms: float | None = None

    def as_row(self) -> dict[str, float | None]:
        return {k: None if v is None else round(v, 1) for k, v in self.__dict__.items()}


def stream_events(client: ServiceClient, pipeline: str, element: str) -> list[dict]:
    """Every event of ``element``'s output stream, page by page, in stream order."""
    out: list[dict] = []
    after = 0
    while True:
        page = client.get(
            f"/pipelines/{pipeline}/elements/{element}/events",
            params={"after": after, "limit": PAGE},
        )
        out.extend(page["events"])
        after = page["scanned_to"]
        if after >= page["last_seq"]:
            return out


def outputs(client: ServiceClient, pipeline: str, element: str, source: str) -> list[Output]:
    """``element``'s outputs (a single-input PE reading ``source``), each with its per-hop
    latency against the input event it came from."""
    stored_in = {e["seq"]: e["stored"] for e in stream_events(client, pipeline, source)}
    out = []
    for event in stream_events(client, pipeline, element):
        came = stored_in.get(event.get("origin"))
        latency = None if came is None else (event["stored"] - came) * 1000.0
        out.append(Output(stored=event["stored"], latency_ms=latency, epoch=event.get("epoch")))
    return out


def disruption(
    emitted: Sequence[Output],
    start: float,
    end: float,
    settle_s: float = 1.0,
    warm_s: float = 1.0,
    near_s: float = 5.0,
) -> Disruption:
    """The output gap and added latency of a reconfiguration from ``start`` to ``end``
    (seconds, the broker's clock; module doc). ``emitted`` is in stream order.

    ``steady_gap_ms`` and ``max_gap_ms`` are the pair that gave the output gap: the window's
    interval that exceeded its writer's steady interval most, and that steady interval. The
    steady intervals are those within ``near_s`` of the window: the rhythm around the
    reconfiguration, not the query's first batches (over a slow link a reader's first few
    batches, while it learns its link, come a round trip further apart)."""
    if not emitted:
        return Disruption(None, None, None, None, None, None)
    stop, warm = end + settle_s, emitted[0].stored + warm_s
    steady_gaps: list[float] = []
    own_gaps: dict[int | None, list[float]] = {}
    window_gaps: list[tuple[float, int | None]] = []
    switches = []
    for a, b in pairwise(emitted):
        interval = (b.stored - a.stored) * 1000.0
        if b.stored >= start and a.stored <= stop:
            window_gaps.append((interval, a.epoch))
            if a.epoch is not None and b.epoch is not None and b.epoch > a.epoch:
                switches.append(interval)
        elif a.stored >= max(warm, start - near_s) and b.stored <= stop + near_s:
            steady_gaps.append(interval)
            if a.epoch == b.epoch:
                own_gaps.setdefault(a.epoch, []).append(interval)
    overall = percentile(steady_gaps, 99)
    steady = {w: percentile(g, 99) for w, g in own_gaps.items()}
    steady_gap, max_gap = _worst(window_gaps, steady, overall)
    # The latency window reaches the first output after the reconfiguration at least.
    first_after = next((o.stored for o in emitted if o.stored > end), stop)
    latency_stop = max(stop, first_after)
    inside, outside = [], []
    for o in emitted:
        if o.latency_ms is None:
            continue
        if start <= o.stored <= latency_stop:
            inside.append(o.latency_ms)
        elif o.stored >= warm:
            outside.append(o.latency_ms)
    steady_p99, window_p99 = percentile(outside, 99), percentile(inside, 99)
    return Disruption(
        steady_gap_ms=steady_gap,
        max_gap_ms=max_gap,
        output_gap_ms=_minus(max_gap, steady_gap),
        steady_p99_ms=steady_p99,
        window_p99_ms=window_p99,
        added_p99_ms=_minus(window_p99, steady_p99),
        switch_gap_ms=max(switches, default=None),
    )


def _worst(
    window_gaps: Sequence[tuple[float, int | None]],
    steady: dict[int | None, float | None],
    overall: float | None,
) -> tuple[float | None, float | None]:
    """``(steady interval, interval)`` of the window's interval that exceeds its writer's
    steady interval (``steady``, else ``overall``) most; with no steady interval at all,
    ``(None, longest interval)``."""
    if not window_gaps:
        return overall, None
    scored = [(interval, steady.get(writer, overall)) for interval, writer in window_gaps]
    known = [(i, s) for i, s in scored if s is not None]
    if not known:
        return None, max(i for i, _ in scored)
    interval, usual = max(known, key=lambda pair: pair[0] - pair[1])
    return usual, interval


def batches_after_warm(
    emitted: Sequence[Output], warm_s: float = 1.0, apart_ms: float = 50.0
) -> int:
    """How many intervals between batches ``emitted`` shows after its first ``warm_s``: the
    steady intervals :func:`disruption` can take from a writer before a reconfiguration
    (outputs closer than ``apart_ms`` belong to one batch)."""
    if not emitted:
        return 0
    warm = emitted[0].stored + warm_s
    return sum(
        1
        for a, b in pairwise(emitted)
        if a.stored >= warm and (b.stored - a.stored) * 1000.0 >= apart_ms
    )


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
