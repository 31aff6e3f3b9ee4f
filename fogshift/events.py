"""Events: a header (``seq``, ``timestamp``, ``creator``) and a body of named values.

On the broker an event is a JSON payload; the headers ``Fogshift-Origin`` and
``Fogshift-Index`` carry the input position it was derived from, which makes every output
record's identity deterministic across re-executions.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

ORIGIN_HEADER = "Fogshift-Origin"
INDEX_HEADER = "Fogshift-Index"
EPOCH_HEADER = "Fogshift-Epoch"
MSG_ID_HEADER = "Nats-Msg-Id"

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_INTEGER = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True)
class Event:
    """One event of a stream.

    Attributes:
        seq: The event's sequence number, assigned by the source (CSV data row k has seq k)
            and kept by processors that derive one output from one input.
        timestamp: Creation time in epoch milliseconds, set by the source.
        creator: The id of the PE that created the event.
        body: The named values.
    """

    seq: int
    timestamp: float
    creator: str
    body: dict[str, Any] = field(default_factory=dict)


def parse_value(text: str) -> Any:
    """A CSV cell as an int, a finite float, or the original string.

    ``nan``/``inf`` are kept as strings on purpose: they are not finite numbers, so an
    aggregate sees them as invalid instead of poisoning its window.
    """
    stripped = text.strip()
    if _INTEGER.match(stripped):
        return int(stripped)
    if _NUMBER.match(stripped):
        return float(stripped)
    return text


def is_finite_number(value: Any) -> bool:
    """True for an int or float that is neither NaN nor infinite (bools excluded)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def dump_body(body: dict[str, Any]) -> str:
    """The canonical JSON text of a body (strict: NaN/inf are refused)."""
    return json.dumps(body, allow_nan=False, separators=(",", ":"))


def load_body(text: str) -> dict[str, Any]:
    """A body from its JSON text."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"an event body must be a JSON object, got {type(value).__name__}")
    return value


def message_id(pipeline: str, pe: str, origin: int, index: int) -> str:
    """The broker message id of output ``index`` derived from input position ``origin``."""
    return f"{pipeline}/{pe}/{origin}.{index}"
