"""A standby's promotion judges how far it is behind by what it has read, not by the origin
of the PE's last output, when those are no positions: a partition with several inputs whose
keys move numbers its outputs beyond the sum of its positions (see
``broker.datasource.JetStreamReader._partition_rows``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fogshift.contracts import ElementProgress
from fogshift.restoration import standby as standby_procedure
from fogshift.spec import parse_spec

SPEC = {
    "pipeline": "p",
    "elements": [
        {"id": "a", "kind": "csv-source", "node": "cloud", "options": {"path": "a.csv"}},
        {"id": "b", "kind": "csv-source", "node": "cloud", "options": {"path": "b.csv"}},
        {"id": "agg", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b"],
         "key_by": "k", "inputs": ["a", "b"], "options": {"field": "v", "window": 2}},
    ],
}  # fmt: skip


class Agent:
    """A standby's agent: its progress grows by one answer at a time along ``answers``."""

    def __init__(self, answers: list[int]) -> None:
        self.answers, self.puts = answers, []  # type: ignore[var-annotated]

    def call(self, model: Any, method: str, path: str, **kwargs: Any) -> ElementProgress:
        position = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        offset = {"type": "jetstream", "positions": {"a": position // 2, "b": position // 2}}
        return ElementProgress(pipeline="p", element="agg-p0", state="running", epoch=2,
                               committed_batch=3, offset=offset, progress=position)  # fmt: skip

    def put(self, path: str, **kwargs: Any) -> None:
        self.puts.append((path, kwargs.get("json")))


def test_a_shifted_partition_is_waited_for_until_it_has_read_what_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (element,) = [e for e in parse_spec(SPEC, tmp_path).elements if e.id == "agg-p0"]
    assert element.shifts_origins
    # Its last output's origin (500) is beyond the sum of its positions; 150 are stored.
    monkeypatch.setattr(standby_procedure, "fence_and_locate", lambda *args: (500, 150))
    agent = Agent([100, 100, 120, 150])
    report = standby_procedure.promote("p", element, 2, ("fog-b", agent), broker=None,  # type: ignore[arg-type]
                                       timeout_s=30)  # fmt: skip
    assert report.status == "restored" and report.error is None
    # Behind by what it had not read (not 0: 500 > 100), and caught up once it read it.
    assert report.standby_lag_events == 50 and report.intermediate_events == 50
    assert report.intermediate_ms is not None and agent.answers == [150]
