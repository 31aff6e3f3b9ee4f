"""The pipeline drawing: columns by data flow, lanes by node, lag from the counters."""

from __future__ import annotations

from typing import Any

from fogshift.contracts import ElementStatus, PipelineState, PipelineStatus
from fogshift.web.graph import BOX_W, COL_GAP, LABEL_W, depths, lag, layout


def element(name: str, node: str, inputs: list[str], events_in: int = 0, out: int = 0,
            **extra: Any) -> ElementStatus:  # fmt: skip
    fields: dict[str, Any] = {
        "element": name, "kind": "filter", "node": node, "state": "running",
        "events_in": events_in, "events_out": out, "dead_letters": 0, "restarts": 0,
        "error": None, "planned_backup": None, "planned_redeploy": None, "last_restore": None,
        "inputs": inputs,
    }  # fmt: skip
    return ElementStatus(**{**fields, **extra})


def pipeline() -> PipelineStatus:
    return PipelineStatus(
        pipeline="p",
        status=PipelineState.RUNNING,
        elements=[
            element("sink", "cloud", ["merge"], events_in=90, out=90),
            element("a", "cloud", [], out=70),
            element("b", "fog-b", [], out=50),
            element("merge", "fog-a", ["a", "b"], events_in=100, out=95),
        ],
    )


def test_columns_follow_the_data_flow() -> None:
    assert depths(pipeline().elements) == {"a": 0, "b": 0, "merge": 1, "sink": 2}


def test_lag_is_what_the_inputs_offered_and_was_not_read() -> None:
    by_id = {e.element: e for e in pipeline().elements}
    assert lag(by_id["merge"], by_id) == 70 + 50 - 100
    assert lag(by_id["sink"], by_id) == 95 - 90
    assert lag(by_id["a"], by_id) is None  # a source reads no stream
    # A partition reads only its keys' share of its input: no lag of its own to tell (it
    # showed half the input's events as lag, growing without end).
    band = element("band", "fog-a", [], out=1000)
    parts = [element(f"cls-p{k}", "fog-a", ["band"], events_in=500, partition_of="cls",
                     partition=k, partitions=2) for k in (0, 1)]  # fmt: skip
    shared = {e.element: e for e in (band, *parts)}
    assert [lag(p, shared) for p in parts] == [None, None]


def test_a_lane_per_node_boxes_in_their_column_and_an_edge_per_stream() -> None:
    drawing = layout(pipeline(), {"merge": 12.5}, healthy_nodes={"cloud", "fog-a"})
    # Lanes in the order data reaches them: cloud and fog-b hold sources, fog-a the merge.
    assert [lane.node for lane in drawing.lanes] == ["cloud", "fog-b", "fog-a"]
    assert [lane.healthy for lane in drawing.lanes] == [True, False, True]
    boxes = {b.element: b for b in drawing.boxes}
    assert boxes["sink"].x == LABEL_W + 2 * (BOX_W + COL_GAP)
    assert boxes["a"].y == boxes["sink"].y  # same lane, different columns: one row
    lane_of = {lane.node: lane for lane in drawing.lanes}
    for b in boxes.values():
        lane = lane_of[b.node]
        assert lane.y <= b.y < lane.y + lane.height
    assert boxes["merge"].rate == 12.5 and boxes["a"].rate is None
    assert len(drawing.edges) == 3
    assert drawing.width >= boxes["sink"].x + BOX_W
