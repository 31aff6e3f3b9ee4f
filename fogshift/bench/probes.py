"""Measurements taken from outside the cluster: CPU load of process groups, sink output.

* :class:`CpuSampler` reads ``/proc/<pid>/stat`` of every process in the given process
  groups (a node agent's group holds its JVM and Python workers too) and ``/proc/stat``.
  Loads are in percent of one core (100 % = one core busy), like ``top`` and ``docker
  stats`` — the thesis monitored the PE's container; the machine's load is in percent of all
  its cores, to show how busy the shared machine was.
* :class:`SinkWatcher` tails a csv-sink's output file and notes when each line appeared.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fogshift.common.cpu import TICKS, group_ticks


def _group_ticks(groups: dict[str, int]) -> dict[str, int]:
    """CPU ticks per label of ``groups`` (label: pgid)."""
    by_pgid = group_ticks(groups.values())
    return {label: by_pgid[pgid] for label, pgid in groups.items()}


def _machine_ticks() -> tuple[int, int]:
    """``(busy, total)`` ticks of all cores since boot."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


@dataclass
class CpuSample:
    """Loads over the interval ending at ``t`` (wall clock, s)."""

    t: float
    groups: dict[str, float]
    machine: float


@dataclass
class CpuSampler:
    """Samples the CPU load of labelled process groups every ``interval_s`` in a thread.

    Use as a context manager; a killed group's load drops to 0.

    Attributes:
        samples: One per interval.
    """

    groups: dict[str, int]
    interval_s: float = 0.25
    samples: list[CpuSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last_t, last = time.time(), _group_ticks(self.groups)
        last_busy, last_total = _machine_ticks()
        while not self._stop.wait(self.interval_s):
            t, ticks = time.time(), _group_ticks(self.groups)
            busy, total = _machine_ticks()
            elapsed = max(t - last_t, 1e-6)
            loads = {
                label: max(0.0, (ticks[label] - last[label]) / TICKS / elapsed * 100.0)
                for label in self.groups
            }
            machine = 100.0 * (busy - last_busy) / max(total - last_total, 1)
            self.samples.append(CpuSample(t, loads, machine))
            last_t, last, last_busy, last_total = t, ticks, busy, total

    def mean(self, label: str, start: float, end: float) -> float | None:
        """Mean load of ``label`` over samples ending in ``[start, end]`` (``None`` if none).

        ``label`` ``"machine"`` is the whole machine (percent of all cores).
        """
        values = [
            (s.machine if label == "machine" else s.groups[label])
            for s in self.samples
            if start <= s.t <= end + self.interval_s
        ]
        return sum(values) / len(values) if values else None

    def rows(self, t0: float) -> list[dict[str, float]]:
        """The samples as CSV rows: ``t_s`` since ``t0``, ``<label>_pct`` per group, and
        ``machine_pct``."""
        return [
            {"t_s": round(s.t - t0, 2), **{f"{k}_pct": v for k, v in s.groups.items()},
             "machine_pct": s.machine}
            for s in self.samples
        ]  # fmt: skip

    def peak(self, label: str, start: float, end: float) -> float | None:
        values = [s.groups[label] for s in self.samples if start <= s.t <= end + self.interval_s]
        return max(values) if values else None


@dataclass
class SinkWatcher:
    """Tails a csv-sink's output file and notes when each ``seq`` appeared.

    Only whole lines count (the sink appends a batch and fsyncs it). The first column of the
    output is ``seq``; the header line is skipped.

    Attributes:
        seen: ``(wall-clock time, seq)`` per output line, in file order.
    """

    path: Path
    interval_s: float = 0.05
    seen: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sink-watcher", daemon=True)
        self._offset = 0
        self._header = True

    def __enter__(self) -> SinkWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def _poll(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        t = time.time()
        for line in chunk[: end + 1].splitlines():
            if self._header:
                self._header = False
                continue
            self.seen.append((t, int(line.split(b",", 1)[0])))
        self._offset += end + 1
