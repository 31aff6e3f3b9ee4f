"""Reading a Case 1 spec's input, window and output (shared by the demo and the bench)."""

from __future__ import annotations

import pytest

from fogshift.exceptions import InvalidInput
from fogshift.spec.examples import example_path
from fogshift.spec.loader import load_spec
from fogshift.spec.models import ElementSpec, PipelineSpec
from fogshift.verify.case1 import case1_parts


def test_parts_of_the_case1_example() -> None:
    spec = load_spec(example_path("case1") / "case1.yaml")
    source, aggregate, sink = case1_parts(spec)
    assert source.endswith(".csv") and sink.endswith(".csv") and source != sink
    assert {"field", "window"} <= set(aggregate)


def test_a_pipeline_that_is_not_case1_is_refused_by_name() -> None:
    spec = PipelineSpec(
        pipeline="other",
        elements=[
            ElementSpec(id="src", kind="csv-source", node="cloud", options={"path": "in.csv"}),
            ElementSpec(
                id="out", kind="csv-sink", node="cloud", inputs=("src",),
                options={"path": "out.csv"},
            ),
        ],
    )  # fmt: skip
    with pytest.raises(InvalidInput) as caught:
        case1_parts(spec)
    assert "'other'" in caught.value.message
    assert caught.value.received == "csv-source, csv-sink"


def test_a_padded_custom_aggregate_counts_as_the_window_aggregate() -> None:
    # The benchmarks' padded aggregate (`fogshift.bench.padded`) is a custom processor.
    padded = {
        "class": "fogshift.bench.padded:PaddedWindowAggregate",
        "options": {"field": "value", "window": 5, "function": "avg", "pad_bytes": 64},
    }
    spec = PipelineSpec(
        pipeline="heavy",
        elements=[
            ElementSpec(id="source", kind="csv-source", node="cloud", options={"path": "in.csv"}),
            ElementSpec(id="aggregate", kind="custom", node="fog-a", inputs=("source",),
                        options=padded),
            ElementSpec(id="sink", kind="csv-sink", node="cloud", inputs=("aggregate",),
                        options={"path": "out.csv"}),
        ],
    )  # fmt: skip
    source, aggregate, sink = case1_parts(spec)
    assert (source, sink) == ("in.csv", "out.csv")
    assert (aggregate["field"], aggregate["window"], aggregate["function"]) == ("value", 5, "avg")
    # A custom processor without a window's options is not taken for one.
    other = spec.model_copy(
        update={
            "elements": [
                *spec.elements[:1],
                spec.elements[1].model_copy(
                    update={"options": {"class": "m:C", "options": {"x": 1}}}
                ),
                spec.elements[2],
            ]
        }
    )
    with pytest.raises(InvalidInput, match="not a Case 1 pipeline"):
        case1_parts(other)


@pytest.mark.parametrize("change", ["key_by", "stage"])
def test_a_shape_the_reference_does_not_compute_is_refused(change: str) -> None:
    # Accepted before: the reference of the plain chain then judged a correct run
    # inconsistent.
    data = load_spec(example_path("case1") / "case1.yaml").model_dump(mode="json")
    elements = data["elements"]
    aggregate = next(e for e in elements if e["kind"] == "window-aggregate")
    if change == "key_by":
        aggregate["key_by"] = "sensor"
    else:
        elements.insert(1, {"id": "scale", "kind": "map", "node": aggregate["node"],
                            "inputs": list(aggregate["inputs"]),
                            "options": {"set": {"value": "value * 1000"}}})  # fmt: skip
        aggregate["inputs"] = ["scale"]
    spec = PipelineSpec.model_validate(data)
    with pytest.raises(InvalidInput) as caught:
        case1_parts(spec)
    assert "is not a Case 1 pipeline the reference computes" in caught.value.message
