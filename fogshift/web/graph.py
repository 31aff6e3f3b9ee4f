"""A pipeline drawn as a graph: PEs left to right in data-flow order, one lane per node.

A PE's column is its depth (a source 0; else one more than its deepest input); its lane is the
node it runs on, so a migration shows as a box changing lane. Edges are the streams between
PEs. The template turns the layout into SVG; the same figures are in the table beside it.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass

from fogshift.contracts import ElementStatus, PipelineStatus

BOX_W, BOX_H = 168, 58
COL_GAP, LANE_PAD, LABEL_W = 64, 12, 96


@dataclass(frozen=True)
class Box:
    """One PE on the drawing."""

    element: str
    kind: str
    node: str
    state: str
    x: int
    y: int
    rate: float | None
    lag: int | None
    dead_letters: int

    @property
    def healthy(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class Lane:
    """One node's band."""

    node: str
    y: int
    height: int
    healthy: bool


@dataclass(frozen=True)
class Layout:
    """Everything the template draws; sizes in SVG units."""

    boxes: list[Box]
    edges: list[str]  # SVG path data, one per stream
    lanes: list[Lane]
    width: int
    height: int
    box_w: int = BOX_W
    box_h: int = BOX_H


def lag(element: ElementStatus, by_id: dict[str, ElementStatus]) -> int | None:
    """Events its inputs emitted that it has not read yet (``None`` for a source, and for a
    partition of a partitioned PE, which reads only its keys' share of them: its input's
    count less its own grew without end)."""
    if not element.inputs or element.partition_of is not None:
        return None
    offered = sum(by_id[i].events_out for i in element.inputs if i in by_id)
    return max(offered - element.events_in, 0)


def depths(elements: list[ElementStatus]) -> dict[str, int]:
    """Each PE's column: 0 for a source, else one more than its deepest input (inputs not in
    the pipeline are ignored; a cycle, which a valid spec cannot have, puts every PE in 0)."""
    by_id = {e.element: e for e in elements}
    graph = {e.element: [i for i in e.inputs if i in by_id] for e in elements}
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return {name: 0 for name in graph}
    out: dict[str, int] = {}
    for name in order:
        out[name] = 1 + max((out[i] for i in graph[name]), default=-1)
    return out


def layout(
    status: PipelineStatus,
    rates: dict[str, float | None],
    healthy_nodes: set[str],
) -> Layout:
    """The drawing of ``status``; ``rates`` by PE (events out per second)."""
    elements = status.elements
    by_id = {e.element: e for e in elements}
    column = depths(elements)
    lanes_of: dict[str, list[ElementStatus]] = {}
    for e in sorted(elements, key=lambda e: (column[e.element], e.element)):
        lanes_of.setdefault(e.node, []).append(e)
    order = sorted(lanes_of, key=lambda n: (min(column[e.element] for e in lanes_of[n]), n))
    boxes: list[Box] = []
    lanes: list[Lane] = []
    y = 0
    for node in order:
        stacked: dict[int, int] = {}
        for e in lanes_of[node]:
            row = stacked.get(column[e.element], 0)
            stacked[column[e.element]] = row + 1
            boxes.append(
                Box(
                    element=e.element,
                    kind=e.kind,
                    node=node,
                    state=str(e.state),
                    x=LABEL_W + column[e.element] * (BOX_W + COL_GAP),
                    y=y + LANE_PAD + row * (BOX_H + LANE_PAD),
                    rate=rates.get(e.element),
                    lag=lag(e, by_id),
                    dead_letters=e.dead_letters,
                )
            )
        rows = max(stacked.values())
        height = LANE_PAD + rows * (BOX_H + LANE_PAD)
        lanes.append(Lane(node, y, height, node in healthy_nodes))
        y += height
    at = {b.element: b for b in boxes}
    edges = []
    for e in elements:
        for source in e.inputs:
            if source not in at:
                continue
            a, b = at[source], at[e.element]
            x1, y1 = a.x + BOX_W, a.y + BOX_H // 2
            x2, y2 = b.x, b.y + BOX_H // 2
            bend = max((x2 - x1) // 2, 24)
            edges.append(f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}")
    columns = 1 + max(column.values(), default=0)
    width = LABEL_W + columns * (BOX_W + COL_GAP)
    return Layout(boxes, edges, lanes, width, max(y, BOX_H))
