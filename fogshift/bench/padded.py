"""PEs that carry extra state, to emulate PEs with a large state.

The benchmarks (and the tests that move megabytes of state) need a Case 1 aggregate whose
checkpoint is as large as they say; the production ``window-aggregate`` has no such option.
``bench pam --inputs 2`` needs a keyed PE with two inputs whose output tells by itself
whether every key's state and events went through exactly once (:class:`PaddedTally`).
They run as ``custom`` processors: nodes import them by name, as they would a user's class,
so nothing in the runtime depends on the benchmarks.
"""

from __future__ import annotations

import base64
import random
from typing import Annotated, Any

from pydantic import Field

from fogshift.events import Event
from fogshift.runtime.api import Processor, state
from fogshift.runtime.operators.window import WindowAggregate, WindowAggregateOptions
from fogshift.spec.kinds import KindOptions

#: ``class`` of the custom processor (``module:ClassName``).
PADDED_CLASS = "fogshift.bench.padded:PaddedWindowAggregate"
#: ``class`` of the padded tally (a keyed PE with several inputs).
TALLY_CLASS = "fogshift.bench.padded:PaddedTally"
#: The most padding a PE carries per key (bytes).
MAX_PAD_BYTES = 512 * 1024 * 1024
#: A PE's ``pad_bytes`` option: the state it carries (per key, if keyed), in bytes.
PadBytes = Annotated[int, Field(ge=0, le=MAX_PAD_BYTES)]


def _noise(size: int) -> str:
    """``size`` characters of incompressible padding, the same for the same size: like real
    model state, a transfer of it costs its size."""
    return base64.b64encode(random.Random(size).randbytes(size)).decode()[:size]


class PaddedOptions(WindowAggregateOptions):
    """``window-aggregate``'s options and ``pad_bytes``, the state added (bytes)."""

    pad_bytes: PadBytes = 0


class PaddedWindowAggregate(WindowAggregate):
    """:class:`WindowAggregate` with ``pad_bytes`` of incompressible state carried along."""

    options_model = PaddedOptions
    padding: str = state("")

    def restore(self, snapshot: dict | None) -> None:  # type: ignore[override]
        super().restore(snapshot)
        if len(self.padding) != self.config.pad_bytes:
            self.padding = _noise(self.config.pad_bytes)


class TallyOptions(KindOptions):
    """Options of :class:`PaddedTally`: ``pad_bytes``, the state carried per key (bytes)."""

    pad_bytes: PadBytes = 0


class PaddedTally(Processor):
    """Numbers each key's events as processed, whichever input each comes from, with
    ``pad_bytes`` of state per key carried along: output ``n`` of a key is its event's place
    among the key's events, with the event's input (``src``) and sequence there
    (``src_seq``). So a key's state lost or taken twice at a move shows in its numbers, and
    an event lost, repeated or out of its input's order in the output set beside the inputs
    (:func:`tally_problems`): the check needs no merge order of the inputs."""

    options_model = TallyOptions
    seen: int = state(0)
    padding: str = state("")

    def restore(self, snapshot: dict | None) -> None:  # type: ignore[override]
        super().restore(snapshot)
        if len(self.padding) != self.config.pad_bytes:
            self.padding = _noise(self.config.pad_bytes)

    def process(self, event: Event) -> dict[str, object]:
        self.seen += 1
        return {"sensor": event.body["sensor"], "n": self.seen, "src": event.creator,
                "src_seq": event.seq}  # fmt: skip


def tally_problems(
    inputs: dict[str, list[tuple[int, str]]], outputs: list[dict[str, Any]]
) -> list[str]:
    """What is wrong with a :class:`PaddedTally`'s ``outputs`` (its records' bodies, in any
    order) given its ``inputs`` (each input's events: ``(seq, key)`` in input order): every
    key's ``n`` must be 1..N without a gap or a repeat, its events each output once, and each
    input's in that input's order. Empty: exactly once."""
    expected: dict[str, set[tuple[str, int]]] = {}
    for name, events in inputs.items():
        for seq, key in events:
            expected.setdefault(key, set()).add((name, seq))
    got: dict[str, list[tuple[int, str, int]]] = {}
    for body in outputs:
        got.setdefault(str(body["sensor"]), []).append(
            (int(body["n"]), str(body["src"]), int(body["src_seq"]))
        )
    problems = []
    if set(got) != set(expected):
        problems.append(f"keys output {sorted(set(got) ^ set(expected))[:5]} differ from input")
    for key in sorted(expected.keys() & got.keys()):
        rows = sorted(got[key])
        numbers = [n for n, _, _ in rows]
        if numbers != list(range(1, len(rows) + 1)):
            problems.append(f"key {key}: numbered {numbers[:10]}..., not 1..{len(rows)}")
        taken = [(src, seq) for _, src, seq in rows]
        if len(taken) != len(set(taken)) or set(taken) != expected[key]:
            missing = len(expected[key] - set(taken))
            extra = len(taken) - len(expected[key]) + missing
            problems.append(f"key {key}: {missing} events missing, {extra} extra or repeated")
        for name in inputs:
            seqs = [seq for src, seq in taken if src == name]
            if seqs != sorted(seqs):
                problems.append(f"key {key}: input {name}'s events out of their order")
    return problems


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


def tally_element(
    inputs: list[str], pad_bytes: int = 0, element_id: str = "aggregate"
) -> dict[str, Any]:
    """A :class:`PaddedTally` reading ``inputs`` as a spec element (no node: the caller
    places it)."""
    options = {"class": TALLY_CLASS, "options": {"pad_bytes": pad_bytes}}
    return {"id": element_id, "kind": "custom", "inputs": inputs, "options": options}
