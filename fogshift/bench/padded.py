"""A window aggregate that carries extra state, to emulate a PE with a large state.

The benchmarks (and the tests that move megabytes of state) need a Case 1 aggregate whose
checkpoint is as large as they say; the production ``window-aggregate`` has no such option.
This subclass runs as a ``custom`` processor: nodes import it by name, as they would a
user's class, so nothing in the runtime depends on the benchmarks.
"""

from __future__ import annotations

import base64
import random
from typing import Any

from pydantic import Field

from fogshift.runtime.api import state
from fogshift.runtime.operators.window import WindowAggregate, WindowAggregateOptions

#: ``class`` of the custom processor (``module:ClassName``).
PADDED_CLASS = "fogshift.bench.padded:PaddedWindowAggregate"


class PaddedOptions(WindowAggregateOptions):
    """``window-aggregate``'s options and ``pad_bytes``, the state added (bytes)."""

    pad_bytes: int = Field(default=0, ge=0, le=512 * 1024 * 1024)


class PaddedWindowAggregate(WindowAggregate):
    """:class:`WindowAggregate` with ``pad_bytes`` of incompressible state carried along."""

    options_model = PaddedOptions
    padding: str = state("")

    def restore(self, snapshot: dict | None) -> None:  # type: ignore[override]
        super().restore(snapshot)
        wanted = self.config.pad_bytes
        if len(self.padding) != wanted:
            # Incompressible, like real model state: a transfer of it costs its size.
            noise = random.Random(wanted).randbytes(wanted)
            self.padding = base64.b64encode(noise).decode()[:wanted]


def aggregate_element(
    node: str, pad_bytes: int = 0, window: int = 10, element_id: str = "aggregate"
) -> dict[str, Any]:
    """Case 1's aggregate (avg of ``value`` over ``window``) on ``node`` as a spec element:
    the built-in ``window-aggregate``, or this padded one when ``pad_bytes`` > 0."""
    options = {"field": "value", "window": window, "function": "avg"}
    base: dict[str, Any] = {"id": element_id, "node": node, "inputs": ["source"]}
    if pad_bytes == 0:
        return {**base, "kind": "window-aggregate", "options": options}
    padded = {"class": PADDED_CLASS, "options": {**options, "pad_bytes": pad_bytes}}
    return {**base, "kind": "custom", "options": padded}
