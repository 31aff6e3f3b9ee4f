"""``fogshift-ecg-source``: simulated patients' wearables as a Spark source (Case 2).

Event *k* (1-based) is window ``(k - 1) // P`` of patient ``(k - 1) % P`` (``P`` patients,
in turn): body ``{patient, t, fs, samples}``, creator the patient's wearable, ``seq = k``.
Its offset is ``{"type": "ecg-windows", "event": k, "t0": epoch s}``: the events already
read, and when the source started — with ``speed`` > 0, window *w* of every patient becomes
available once ``(w + 1) * window_s / speed`` seconds have passed since ``t0``, which
travels in the offset so that an instance resumed elsewhere keeps the schedule. The samples
are a pure function of the options (:mod:`fogshift.ecg.simulate`), so a re-executed batch,
here or on another node, reads the same events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from fogshift.broker.datasource import RECORD_SCHEMA
from fogshift.common.gate import read_gate
from fogshift.ecg.simulate import Patient, layout, patients, samples
from fogshift.events import DEFAULT_MAX_RECORD_BYTES, dump_body, fit_dead_letter, oversize
from fogshift.exceptions import InvariantViolation
from fogshift.spec.kinds import EcgSourceOptions

WINDOWS_OFFSET = "ecg-windows"


def _events(value: dict) -> int:
    if value.get("type") != WINDOWS_OFFSET:
        raise InvariantViolation(f"not an ecg-windows offset: {value!r}")
    return int(value["event"])


class Stream:
    """What an ``ecg-source`` with these options emits, event by event."""

    def __init__(self, options: EcgSourceOptions) -> None:
        self.options = options
        self.patients: list[Patient] = patients(
            options.patients, options.seed, options.abnormal_every, options.onset_s
        )
        self.fs = options.sampling_rate
        self.window, self.windows = layout(self.fs, options.window_s, options.duration_s)
        self.total = self.windows * len(self.patients)

    def available(self, elapsed_s: float) -> int:
        """How many events exist ``elapsed_s`` after the start (all, at speed 0)."""
        if self.options.speed <= 0:
            return self.total
        done = int(elapsed_s * self.options.speed / self.options.window_s)
        return min(self.total, done * len(self.patients))

    def event(self, k: int) -> tuple[Patient, dict]:
        """Event ``k``'s patient and body."""
        patient = self.patients[(k - 1) % len(self.patients)]
        w = (k - 1) // len(self.patients)
        # Only the piece(s) of the recording this window lies in are simulated.
        signal = samples(
            patient, self.options.duration_s, self.fs, self.options.seed,
            w * self.window, (w + 1) * self.window,
        )  # fmt: skip
        t = round(w * self.window / self.fs, 6)
        return patient, {"patient": patient.name, "t": t, "fs": self.fs,
                         "samples": signal.tolist()}  # fmt: skip


class EcgPartition(InputPartition):
    """Events ``(start, end]``."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end


class EcgSourceDataSource(DataSource):
    """Options: ``options`` (the element's options as JSON), ``pe``, ``gate``,
    ``max_record_bytes``."""

    @classmethod
    def name(cls) -> str:
        return "fogshift-ecg-source"

    def schema(self) -> str:
        return RECORD_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return EcgSourceReader(dict(self.options))


class EcgSourceReader(DataSourceStreamReader):
    """Streams the simulated wearables; created by Spark once per query."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = EcgSourceOptions.model_validate(json.loads(options["options"]))
        self.pe = options["pe"]
        self.gate = options.get("gate")
        self.max_record_bytes = int(options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES))
        self.stream = Stream(self.options)

    def initialOffset(self) -> dict:  # noqa: N802
        return {"type": WINDOWS_OFFSET, "event": 0, "t0": time.time()}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.options.max_events_per_batch)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        begin = _events(start)
        gate = read_gate(self.gate)
        if gate is not None and gate["mode"] == "hold":
            return start
        t0 = float(start.get("t0", time.time()))
        latest = self.stream.available(time.time() - t0)
        if isinstance(limit, ReadMaxRows) and not isinstance(limit, ReadAllAvailable):
            latest = min(latest, begin + limit.max_rows)
        if gate is not None and gate["limit"]:
            latest = min(latest, _events(gate["limit"]))
        if latest <= begin:
            return start
        return {"type": WINDOWS_OFFSET, "event": latest, "t0": t0}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = _events(start), _events(end)
        return [EcgPartition(first, last)] if last > first else []

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, EcgPartition)
        now = time.time() * 1000.0
        for k in range(partition.start + 1, partition.end + 1):
            patient, body = self.stream.event(k)
            try:
                text = dump_body(body)
            except ValueError as exc:  # a sample JSON cannot carry (NaN, infinity)
                reason = (
                    f"window {k} of patient {patient.name!r} holds a value an event cannot "
                    f"carry ({exc}): the simulation gave a non-finite sample"
                )
            else:
                size = oversize(k, now, patient.device, text, None, self.max_record_bytes)
                if size is None:
                    yield (k, 0, k, now, patient.device, text, None)
                    continue
                reason = (
                    f"window {k} is {size} bytes as an event, over the limit of "
                    f"{self.max_record_bytes} bytes (max_record_bytes): shorten window_s"
                )
            # One window is a dead letter; the stream goes on with the next.
            text, reason = fit_dead_letter(
                k, now, self.pe, json.dumps({"patient": patient.name, "t": body["t"]}),
                reason, self.max_record_bytes,
            )  # fmt: skip
            yield (k, 0, k, now, self.pe, text, reason)
