"""Running a processor over one micro-batch of events: the part shared by every processor.

Input rows are ``(origin, seq, timestamp, creator, body)`` (see
``fogshift.broker.datasource.EVENT_SCHEMA``); output rows follow ``RECORD_SCHEMA``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fogshift.events import Event, dump_body, load_body
from fogshift.runtime.api import Processor
from fogshift.runtime.exceptions import DeadLetter

RECORD_COLUMNS = ["origin", "idx", "seq", "timestamp", "creator", "body", "dead"]


def _outputs(result: Any) -> list[Event | Mapping[str, Any]]:
    if result is None:
        return []
    if isinstance(result, (Event, Mapping)):
        return [result]
    return list(result)


def run_events(
    processor: Processor, rows: Iterable[tuple[int, int, float, str, str]]
) -> Iterator[tuple[int, int, int, float, str, str, str | None]]:
    """Feed ``rows`` (sorted by origin) to ``processor``; yield output records.

    An event that cannot be parsed, or for which the processor raises, becomes a dead letter
    carrying the input body and the reason; processing goes on with the next event.
    """
    pe = processor.element_id
    for origin, seq, timestamp, creator, body_text in rows:
        try:
            event = Event(int(seq), float(timestamp), str(creator), load_body(body_text))
            outputs = _outputs(processor.process(event))
            encoded = []
            for out in outputs:
                if isinstance(out, Event):
                    encoded.append((out.seq, out.timestamp, dump_body(dict(out.body))))
                else:
                    encoded.append((event.seq, event.timestamp, dump_body(dict(out))))
        except DeadLetter as exc:
            yield (origin, 0, seq, timestamp, pe, body_text, exc.reason)
            continue
        except (ValueError, TypeError, KeyError, ArithmeticError, json.JSONDecodeError) as exc:
            reason = f"processor {pe!r} raised {type(exc).__name__}: {exc}"
            yield (origin, 0, seq, timestamp, pe, body_text, reason)
            continue
        for index, (out_seq, out_ts, out_body) in enumerate(encoded):
            yield (origin, index, out_seq, out_ts, pe, out_body, None)
