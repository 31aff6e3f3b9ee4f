"""Events: a header (``seq``, ``timestamp``, ``creator``) and a body of named values.

On the broker an event is a JSON payload; the headers ``Fogshift-Origin`` and
``Fogshift-Index`` carry the input position it was derived from, which makes every output
record's identity deterministic across re-executions.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

ORIGIN_HEADER = "Fogshift-Origin"
INDEX_HEADER = "Fogshift-Index"
EPOCH_HEADER = "Fogshift-Epoch"
MSG_ID_HEADER = "Nats-Msg-Id"

#: nats-server's default ``max_payload``: the largest message it accepts, headers included.
BROKER_MAX_PAYLOAD = 1024 * 1024
#: Room left for a record's headers (message id, origin, index, epoch, expected sequence),
#: which count against ``max_payload`` on the server but not in the client's own check.
HEADER_MARGIN = 16 * 1024
#: The default limit of one encoded record (see :func:`oversize`); a larger output is a
#: dead letter instead of an append the broker refuses (which would fail the batch for good).
DEFAULT_MAX_RECORD_BYTES = BROKER_MAX_PAYLOAD - HEADER_MARGIN
#: The longest key a keyed PE processes (its ``key_by`` field's text, in characters): an
#: event with a longer one is a dead letter (:func:`~fogshift.broker.keys.key_refusal`), so
#: every key held can be asked for (``GET .../state?key=``) and moved by name.
MAX_KEY_CHARS = 1024
#: The longest dead-letter reason kept: a reason must never be what makes a record too big.
MAX_REASON_CHARS = 2000

#: How long a processor's ``process()`` may take for one event (its outputs iterated too)
#: before that event is a dead letter, unless its element sets ``event_timeout_s``: an
#: endless loop or a call that never returns would otherwise hold the PE's batch, and every
#: retry of it, for good. Generous: it bounds a stuck event, not a slow one.
DEFAULT_EVENT_TIMEOUT_S = 30.0
#: The longest and the shortest ``event_timeout_s`` an element may set (below 10 ms, the
#: alarm's own cost and the scheduler's grain would make every event a dead letter).
MAX_EVENT_TIMEOUT_S = 3600.0
MIN_EVENT_TIMEOUT_S = 0.01
#: How long one micro-batch of a PE may run without committing before its node stops the
#: query and starts it again (the batch runs again: its output, appended only beyond what
#: is stored, stays exactly-once), unless its element sets ``batch_timeout_s``; doubled for
#: each such restart in a row, so a batch that only needs longer gets it. For a batch held
#: up outside any one event, which the event time limit does not see: once seen, a query
#: restarted after a crashed Python worker sat 3 minutes in a batch with no event running.
DEFAULT_BATCH_TIMEOUT_S = 300.0
#: The longest and the shortest ``batch_timeout_s`` an element may set (below a second, a
#: query start itself would count as a stall).
MAX_BATCH_TIMEOUT_S = 86_400.0
MIN_BATCH_TIMEOUT_S = 1.0

#: ``creator`` of an input row that is no fogshift event (someone else's message on a data
#: subject, or one that names itself as the reader's own control rows): dead-lettered.
NOT_AN_EVENT = "?"
#: Why such a row is dead-lettered (by a processor, and by a sink).
NOT_AN_EVENT_WHY = (
    "a message on its input's subject that no PE wrote (no seq, timestamp, creator and body, "
    "or a creator no PE has)"
)
#: Creators no PE has (PE ids are names): the reader's control rows of key moves.
CONTROL_PREFIX = "fogshift:"

# ASCII digits only: "١٢" is no number to JSON, Spark or pandas.
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$", re.ASCII)
_INTEGER = re.compile(r"^[+-]?\d+$", re.ASCII)


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
    aggregate sees them as invalid instead of poisoning its window. So is a literal that
    overflows a float (``1e999``) — it would be infinity, which no event body may hold — and
    an integer with more digits than Python converts (``sys.get_int_max_str_digits``).
    """
    stripped = text.strip()
    if _INTEGER.match(stripped):
        try:
            return int(stripped)
        except ValueError:  # over the interpreter's digit limit: JSON readers refuse it too
            return text
    if _NUMBER.match(stripped):
        value = float(stripped)
        return value if math.isfinite(value) else text
    return text


def is_finite_number(value: Any) -> bool:
    """True for an int or float that is neither NaN nor infinite (bools excluded)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def dump_body(body: dict[str, Any]) -> str:
    """The canonical JSON text of a body (strict: NaN/inf are refused).

    Raises:
        ValueError: A value is not finite, or two fields of one object, the body's or one
            nested in it, have one name as JSON names them (``1`` and ``"1"``, ``None`` and
            ``"null"``: a reader keeps only the last).
    """
    text = json.dumps(body, allow_nan=False, separators=(",", ":"))
    # Only an object (the body, or one nested in it) with a name that is not a text can
    # name two fields alike; flat bodies of text names, nearly all, are not walked.
    if not all(isinstance(name, str) for name in body) or text.find("{", 1) != -1:
        twice = _named_twice(body)
        if twice is not None:
            where, names = twice
            inside = f" (in the object at {where})" if where else ""
            raise ValueError(f"fields named {', '.join(names)} twice as JSON names them{inside}")
    return text


def _named_twice(body: dict[Any, Any]) -> tuple[str, list[str]] | None:
    """The first object in ``body`` (itself included) with two fields JSON names alike:
    where it is (``/name/0/...``, empty for the body) and those names as JSON writes them;
    ``None`` if there is none.

    Walked without recursion: ``json.dumps`` took the body, so it is at most as deep as the
    interpreter's recursion limit, which a recursive walk beside the caller's stack is not.
    """
    stack: list[tuple[Any, tuple[str, ...]]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            if not all(isinstance(name, str) for name in value):
                counts = Counter(json.dumps({name: 0})[1:-4] for name in value)
                twice = sorted(name for name, count in counts.items() if count > 1)
                if twice:
                    return "".join(f"/{part}" for part in path), twice
            children: Any = value.items()
        elif isinstance(value, (list, tuple)):
            children = enumerate(value)
        else:
            continue
        for name, child in children:
            if isinstance(child, (dict, list, tuple)):
                part = name if isinstance(name, str) else json.dumps({name: 0})[2:-5]
                stack.append((child, (*path, part)))
    return None


def load_body(text: str) -> dict[str, Any]:
    """A body from its JSON text."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"an event body must be a JSON object, got {type(value).__name__}")
    return value


def record_payload(
    seq: int, timestamp: float, creator: str, body: str, reason: str | None = None
) -> bytes:
    """The broker payload of one output record, as the writer encodes it.

    Kept beside the event encoding so that the runtime can measure a record before it is
    appended (see :func:`oversize`); ``fogshift.broker.publish`` must encode the same way.
    """
    payload: dict[str, Any] = {
        "seq": seq,
        "timestamp": timestamp,
        "creator": creator,
        "body": body,
    }
    if reason is not None:
        payload["reason"] = reason
    return json.dumps(payload).encode()


def oversize(
    seq: int, timestamp: float, creator: str, body: str, reason: str | None, limit: int
) -> int | None:
    """The size of :func:`record_payload` if it is over ``limit`` bytes, else ``None``.

    JSON with ASCII escapes spends at most 12 bytes per Python character (a character outside
    the Basic Multilingual Plane becomes two 6-byte surrogate escapes), and the rest of the
    payload is under 128 bytes: a record whose texts are short enough is not encoded twice
    just to be measured.
    """
    bound = (len(body) + len(creator) + len(reason or "")) * 12 + 128
    if bound <= limit:
        return None
    size = len(record_payload(seq, timestamp, creator, body, reason))
    return size if size > limit else None


def fit_reason(reason: str, max_chars: int = MAX_REASON_CHARS) -> str:
    """``reason`` cut to ``max_chars`` characters, saying so."""
    if len(reason) <= max_chars:
        return reason
    mark = " ...[reason cut]"
    return reason[: max(0, max_chars - len(mark))] + mark


def _fitting_prefix(text: str, budget: int) -> int:
    """The length of the longest prefix of ``text`` whose JSON escape is ``budget`` bytes at
    most (escapes make the size non-linear in the length: binary search)."""
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if len(json.dumps(text[:mid])) - 2 <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def fit_dead_letter(
    seq: int,
    timestamp: float,
    creator: str,
    body: str,
    reason: str,
    limit: int,
    total: int | None = None,
) -> tuple[str, str]:
    """``(body, reason)`` of a dead letter, cut so that the record is at most ``limit`` bytes.

    A dead letter carries the input as received; an input too big to be carried whole (a
    huge CSV line, an output that was too big itself) keeps its longest prefix that fits,
    followed by a note of how long it was: a dead letter must itself be appendable. The
    reason is cut to :data:`MAX_REASON_CHARS`, and further if the limit is that small.

    Args:
        total: How long the input was in characters, for the note, when the caller cut it
            before making ``body`` of it (``None``: ``body``'s length).
    """
    reason = fit_reason(reason)
    if oversize(seq, timestamp, creator, body, reason, limit) is None:
        return body, reason
    note = f" ...[cut: {len(body) if total is None else total} characters in all]"
    fixed = len(record_payload(seq, timestamp, creator, note, reason))
    if fixed > limit:  # the reason alone is too long for this limit
        bare = len(record_payload(seq, timestamp, creator, note, ""))
        reason = fit_reason(reason, _fitting_prefix(reason, max(0, limit - bare - 32)))
        fixed = len(record_payload(seq, timestamp, creator, note, reason))
    return body[: _fitting_prefix(body, limit - fixed)] + note, reason


def message_id(pipeline: str, pe: str, origin: int, index: int, nonce: str = "") -> str:
    """The broker message id of output ``index`` derived from input position ``origin``,
    in the append ``nonce`` names (see :func:`fogshift.broker.publish.publish_records`)."""
    return f"{pipeline}/{pe}/{origin}.{index}" + (f"/{nonce}" if nonce else "")
