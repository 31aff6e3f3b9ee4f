"""What the dashboard remembers of the last minutes: per-PE samples, rates and marks.

The orchestrator reports counters (events in and out, dead letters) and placements as of now;
the dashboard samples them every ``interval_s`` and keeps ``window_s`` of samples, from which
come each PE's rate and the charts. A change between two samples becomes a mark on the
timeline: a PE on another node (a migration or a restore: its last restore report tells which),
a node lost or back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise

from fogshift.contracts import ElementStatus, HopLatency, NodeView, PipelineStatus
from fogshift.exceptions import FogshiftError

log = logging.getLogger("fogshift.web")

#: One poll of the orchestrator: every pipeline's status and every node.
Fetch = Callable[[], tuple[list[PipelineStatus], list[NodeView]]]
#: One pipeline's newest per-hop latencies (``GET /pipelines/{name}/latency``).
FetchLatency = Callable[[str], list[HopLatency]]


@dataclass(frozen=True)
class Sample:
    """One PE as one poll saw it."""

    t: float
    events_in: int
    events_out: int
    dead_letters: int
    node: str
    state: str


@dataclass(frozen=True)
class Mark:
    """Something that happened between two polls.

    Attributes:
        t: When it was seen (the later poll; wall clock, seconds).
        kind: ``migration``, ``restore``, ``node-lost`` or ``node-back``.
        pipeline: The pipeline concerned (``None``: a node event).
        text: What happened, for a person.
    """

    t: float
    kind: str
    pipeline: str | None
    text: str


@dataclass(frozen=True)
class Snapshot:
    """What one poll of the orchestrator returned."""

    t: float
    pipelines: list[PipelineStatus]
    nodes: list[NodeView]


class History:
    """The samples of the last ``window_s`` seconds and the marks found in them.

    Thread-safe: one thread records, request handlers read.
    """

    def __init__(self, window_s: float = 600.0) -> None:
        self.window_s = window_s
        self.latest: Snapshot | None = None
        self._samples: dict[tuple[str, str], deque[Sample]] = {}
        # Per PE: (poll time, output seq, latency ms), one entry per newer output seen.
        self._latency: dict[tuple[str, str], deque[tuple[float, int, float]]] = {}
        self._marks: deque[Mark] = deque()
        #: Each PE's newest output seen by :meth:`record_latency` (kept past the window).
        self._seen_seq: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def record(self, snapshot: Snapshot) -> None:
        """Add one poll; find what changed since the previous one. A poll stamped no later
        than the one before (the wall clock was set back) is taken at a moment after it:
        samples stay in time order, and the pages show it (dropped, the overview froze on
        the poll before, with no warning, until the clock caught up)."""
        with self._lock:
            previous = self.latest
            if previous is not None and snapshot.t <= previous.t:
                snapshot = replace(snapshot, t=previous.t + 1e-3)
            self.latest = snapshot
            if previous is not None:
                self._marks.extend(_changes(previous, snapshot))
            for status in snapshot.pipelines:
                for e in status.elements:
                    samples = self._samples.setdefault((status.pipeline, e.element), deque())
                    samples.append(_sample(snapshot.t, e))
            horizon = snapshot.t - self.window_s
            for key, samples in list(self._samples.items()):
                while samples and samples[0].t < horizon:
                    samples.popleft()
                if not samples:  # a PE gone (a partition retired): not a legend entry forever
                    del self._samples[key]
            for key, points in list(self._latency.items()):
                while points and points[0][0] < horizon:
                    points.popleft()
                if not points:
                    del self._latency[key]
            while self._marks and self._marks[0].t < horizon:
                self._marks.popleft()

    def record_latency(self, t: float, pipeline: str, hops: list[HopLatency]) -> None:
        """Add one poll's newest per-hop latencies of ``pipeline`` (as of poll time ``t``); a
        PE whose newest output is the one seen before adds nothing (no new event, no new
        latency: the chart shows a gap rather than a repeated value)."""
        with self._lock:
            for hop in hops:
                key = (pipeline, hop.element)
                # (The newest seq apart from the points: once the window pruned them, an old
                # output came back as a new point every window. One below it is a stream made
                # anew — a fresh deploy, a partition added again — whose seqs start over:
                # taken as old, the PE showed no latency until it passed its old count.)
                if self._seen_seq.get(key, -1) == hop.seq:
                    continue
                self._seen_seq[key] = hop.seq
                self._latency.setdefault(key, deque()).append((t, hop.seq, hop.latency_ms))

    def latency(self, pipeline: str, element: str) -> float | None:
        """The newest per-hop latency (ms) of the PE in the window, if any."""
        with self._lock:
            points = self._latency.get((pipeline, element))
            return points[-1][2] if points else None

    def rate(self, pipeline: str, element: str, over_s: float = 5.0) -> float | None:
        """Events out per second over the last ``over_s`` seconds (``None``: too few samples).

        A counter that went down (a PE restored from an older checkpoint counts from there)
        gives no rate rather than a negative one.
        """
        with self._lock:
            samples = list(self._samples.get((pipeline, element), ()))
        if len(samples) < 2:
            return None
        last = samples[-1]
        span = [s for s in samples if s.t >= last.t - over_s]
        if len(span) < 2:
            span = samples[-2:]
        if any(a.events_out > b.events_out for a, b in pairwise(span)):
            return None
        return (last.events_out - span[0].events_out) / (last.t - span[0].t)

    def series(self, pipeline: str, over_s: float = 5.0) -> dict[str, object]:
        """Per PE of ``pipeline``, its rate at each sample over the ``over_s`` seconds before
        it (counters move once per micro-batch: a shorter span shows the batches, not the
        flow), and the marks: the chart's data (times in seconds since the epoch). A counter
        that went down in the span gives no rate there."""
        with self._lock:
            mine = {e: list(s) for (p, e), s in self._samples.items() if p == pipeline}
            marks = [m for m in self._marks if m.pipeline in (pipeline, None)]
            hops = {e: {t: ms for t, _, ms in points}
                    for (p, e), points in self._latency.items() if p == pipeline}  # fmt: skip
        times = sorted({s.t for samples in mine.values() for s in samples})
        rates: dict[str, list[float | None]] = {}
        for element, samples in sorted(mine.items()):
            at = {s.t: k for k, s in enumerate(samples)}
            # drops[k]: how many decreases of the counter up to sample k (prefix sums), so a
            # span with a decrease (a restore from an older checkpoint) shows no rate.
            drops = [0]
            for a, b in pairwise(samples):
                drops.append(drops[-1] + (b.events_out < a.events_out))
            row: list[float | None] = []
            first = 0
            for t in times:
                k = at.get(t)
                if k is None:
                    row.append(None)
                    continue
                while samples[first].t < t - over_s:
                    first += 1
                start = min(first, k - 1) if k > 0 else k
                if start == k or drops[k] != drops[start]:
                    row.append(None)
                    continue
                a, b = samples[start], samples[k]
                row.append(round((b.events_out - a.events_out) / (b.t - a.t), 2))
            rates[element] = row
        return {
            "t": times,
            "rates": rates,
            # Per single-input PE, the per-hop latency (ms) of a newer output seen at that
            # sample, else None.
            "latency": {e: [by_t.get(t) for t in times] for e, by_t in sorted(hops.items())},
            "marks": [{"t": m.t, "kind": m.kind, "text": m.text} for m in marks],
        }

    def marks(self, pipeline: str | None = None) -> list[Mark]:
        """The marks of the window, newest first (of ``pipeline`` and every node event)."""
        with self._lock:
            return [m for m in reversed(self._marks) if pipeline is None or m.pipeline in
                    (pipeline, None)]  # fmt: skip


def _sample(t: float, e: ElementStatus) -> Sample:
    return Sample(t, e.events_in, e.events_out, e.dead_letters, e.node, str(e.state))


def _changes(before: Snapshot, after: Snapshot) -> list[Mark]:
    marks: list[Mark] = []
    was = {n.name: n.healthy for n in before.nodes}
    for node in after.nodes:
        if node.name in was and was[node.name] != node.healthy:
            kind = "node-back" if node.healthy else "node-lost"
            marks.append(Mark(after.t, kind, None, f"node {node.name} "
                              + ("is back" if node.healthy else "lost")))  # fmt: skip
    placed = {
        (p.pipeline, e.element): e for p in before.pipelines for e in p.elements
    }  # fmt: skip
    for status in after.pipelines:
        for e in status.elements:
            old = placed.get((status.pipeline, e.element))
            if old is None or old.node == e.node:
                continue
            restored = e.last_restore is not None and e.last_restore != old.last_restore
            kind = "restore" if restored else "migration"
            marks.append(Mark(after.t, kind, status.pipeline,
                              f"{e.element}: {old.node} → {e.node} ({kind})"))  # fmt: skip
    return marks


class Sampler:
    """Polls the orchestrator into a :class:`History` every ``interval_s`` (a thread).

    Args:
        fetch: One poll (raises on failure: the error is kept for the pages to show).
        fetch_latency: A running pipeline's newest per-hop latencies, asked after each poll
            (``None``: none are kept).
    """

    def __init__(
        self,
        history: History,
        fetch: Fetch,
        interval_s: float = 1.0,
        fetch_latency: FetchLatency | None = None,
    ) -> None:
        self.history = history
        self.fetch = fetch
        self.fetch_latency = fetch_latency
        self.interval_s = interval_s
        self.error: str | None = None
        self._stop = threading.Event()
        self._poll_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """One poll now (the pages call it after an action, so its result shows at once).

        Polls never overlap, and each is stamped when its answer is in hand, so the history
        stays in time order. A failure is kept in :attr:`error` for the pages to show.
        """
        with self._poll_lock:
            try:
                pipelines, nodes = self.fetch()
            except FogshiftError as exc:
                self.error = exc.message
                return
            self.error = None
            now = time.time()
            self.history.record(Snapshot(now, pipelines, nodes))
            if self.fetch_latency is None:
                return
            for status in pipelines:
                if status.status != "running":
                    continue
                try:
                    hops = self.fetch_latency(status.pipeline)
                except FogshiftError:
                    continue  # the counters were read; the latency waits for the next poll
                self.history.record_latency(now, status.pipeline, hops)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:  # a bug must not end the live views for good
                log.exception("the dashboard's poll of the orchestrator failed")
                self.error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
