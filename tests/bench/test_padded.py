"""The benchmarks' padded window aggregate: large state, outside the production operator."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fogshift.bench.padded import PADDED_CLASS, PaddedWindowAggregate, aggregate_element
from fogshift.events import Event
from fogshift.runtime.kinds import processor_for
from fogshift.runtime.operators.window import WindowAggregate


def ev(seq: int, v: float) -> Event:
    return Event(seq=seq, timestamp=0.0, creator="source", body={"v": v})


def test_padding_emulates_large_state_and_leaves_the_aggregate_alone() -> None:
    options = {"field": "v", "window": 2, "function": "avg"}
    padded = PaddedWindowAggregate.build({**options, "pad_bytes": 1000}, "agg", None)
    plain = WindowAggregate.build(options, "agg", None)
    assert len(padded.dump_state()) > 1000 > len(plain.dump_state())
    for seq, value in enumerate([1.0, 5.0, 9.0], start=1):
        assert padded.process(ev(seq, value)) == plain.process(ev(seq, value))
    again = PaddedWindowAggregate.build({**options, "pad_bytes": 1000}, "agg", padded.snapshot())
    assert again.snapshot() == padded.snapshot()  # restored, not padded anew


def test_the_production_operator_has_no_padding_option() -> None:
    with pytest.raises(ValidationError, match="pad_bytes"):
        WindowAggregate.build({"field": "v", "window": 2, "pad_bytes": 10}, "agg", None)


def test_aggregate_element_is_built_in_unless_padded() -> None:
    plain = aggregate_element("fog-a")
    assert plain["kind"] == "window-aggregate" and "pad_bytes" not in plain["options"]
    padded = aggregate_element("fog-b", pad_bytes=4096, window=5)
    assert padded["kind"] == "custom" and padded["node"] == "fog-b"
    cls, options = processor_for(padded["kind"], padded["options"])
    assert cls is PaddedWindowAggregate and padded["options"]["class"] == PADDED_CLASS
    assert options == {"field": "value", "window": 5, "function": "avg", "pad_bytes": 4096}
