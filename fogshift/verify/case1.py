"""Where a Case 1 spec keeps what its verdict needs: the input, the window and the output.

Both ``fogshift demo`` and the bench compare a Case 1 run with
:func:`fogshift.verify.reference.case1_reference`; this is the part of that comparison that
reads the spec. It lives here, below both of them, so that the bench does not import the CLI.
It loads no pandas: callers import :mod:`fogshift.verify.reference` only when they compare.
"""

from __future__ import annotations

from typing import Any

from fogshift.exceptions import InvalidInput
from fogshift.spec.models import PipelineSpec


def case1_parts(spec: PipelineSpec) -> tuple[str, dict[str, Any], str]:
    """The source file, the aggregate's options and the sink file of a Case 1 spec.

    The aggregate is a ``window-aggregate``, or a ``custom`` processor given a window
    aggregate's options (``field``, ``window``; the benchmarks' padded aggregate): the
    reference then says whether it computed what a window aggregate does.

    Raises:
        InvalidInput: The pipeline lacks a csv-source, such an aggregate or a csv-sink.
    """
    by_kind = {e.kind: e for e in spec.elements}
    aggregate: dict[str, Any] | None = None
    if "window-aggregate" in by_kind:
        aggregate = dict(by_kind["window-aggregate"].options)
    elif "custom" in by_kind:
        inner = by_kind["custom"].options.get("options")
        if isinstance(inner, dict) and {"field", "window"} <= set(inner):
            aggregate = dict(inner)
    expected = "a csv-source, a window aggregate (one, without key_by) and a csv-sink, in a chain"
    if aggregate is None or not {"csv-source", "csv-sink"} <= set(by_kind):
        raise InvalidInput(
            f"pipeline {spec.pipeline!r} is not a Case 1 pipeline",
            expected=expected,
            received=", ".join(e.kind for e in spec.elements),
            hint="start from examples/case1/case1.yaml",
        )
    source, sink = by_kind["csv-source"], by_kind["csv-sink"]
    middle = by_kind.get("window-aggregate") or by_kind["custom"]
    chain = (
        len(spec.elements) == 3
        and middle.inputs == (source.id,)
        and sink.inputs == (middle.id,)
        and middle.key_by is None
    )
    if not chain:
        # The reference is of that chain alone: another stage, a key or partitions would
        # make a correct run's verdict "inconsistent".
        raise InvalidInput(
            f"pipeline {spec.pipeline!r} is not a Case 1 pipeline the reference computes",
            expected=expected,
            received=" -> ".join(
                f"{e.id} ({e.kind}{', key_by ' + e.key_by if e.key_by else ''})"
                for e in spec.topological_order()
            ),
            hint="the demo and the benches verify the Case 1 chain; check another pipeline "
            "with `fogshift events` against a reference of your own",
        )
    return source.options["path"], aggregate, sink.options["path"]
