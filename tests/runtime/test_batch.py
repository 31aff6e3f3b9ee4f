"""Per-event isolation in ``runtime.batch``: whatever one event does, it is a dead letter with
its reason, the others are processed, and the state is as if it had never arrived."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from fogshift.events import NOT_AN_EVENT, Event, oversize
from fogshift.runtime.api import Processor, encode_state, state
from fogshift.runtime.batch import InputRow, RecordRow, input_rows, run_batch, run_events
from fogshift.runtime.exceptions import DeadLetter, ElementError


class Boom(Exception):
    """A user-defined exception type."""


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


EXCEPTIONS: dict[str, Callable[[], Any]] = {
    "IndexError": lambda: [][1],
    "AttributeError": lambda: None.nope,  # type: ignore[attr-defined]
    "RuntimeError": lambda: RuntimeError("boom"),
    "AssertionError": lambda: AssertionError("boom"),
    "ValueError": lambda: ValueError("boom"),
    "TypeError": lambda: TypeError("boom"),
    "KeyError": lambda: KeyError("boom"),
    "ZeroDivisionError": lambda: 1 / 0,
    "RecursionError": lambda: RecursionError("boom"),
    "MemoryError": lambda: MemoryError("boom"),
    "Boom": lambda: Boom("boom"),
    "BrokenStr": lambda: BrokenStr(),
}


class Acc(Processor):
    """Changes its state first, then misbehaves as the event's ``mode`` says."""

    seen: list[int] = state(default_factory=list)
    total: float = state(0.0)

    def process(self, event: Event) -> Any:
        self.seen.append(event.seq)
        self.total += event.body.get("v", 0)
        mode = event.body.get("mode")
        if mode == "raise":
            made = EXCEPTIONS[event.body["exc"]]()  # some raise while being made
            raise made
        if mode == "dead":
            raise DeadLetter("told to")
        if mode == "nan":
            return {"total": math.nan}
        if mode == "inf":
            return {"total": -math.inf}
        if mode == "set":
            return {"total": {1, 2}}
        if mode == "int":
            return 7
        if mode == "big":
            return {"pad": "x" * event.body["size"]}
        if mode == "spoil":  # a state JSON cannot hold; the output does not show it
            self.total = math.nan
            return {"n": len(self.seen)}
        if mode == "gen":
            return self._half(event)
        if mode == "event":
            return Event(event.seq * 10, event.timestamp, "x", {"n": len(self.seen)})
        return {"total": self.total, "n": len(self.seen)}

    def _half(self, event: Event) -> Iterator[dict[str, Any]]:
        yield {"n": len(self.seen)}
        self.seen.append(-1)
        raise IndexError("half way")


def row(seq: int, **body: Any) -> InputRow:
    return (seq * 2, seq, 1000.0 + seq, "src", json.dumps(body))


def reference(rows: list[InputRow], skip: set[int]) -> tuple[list[tuple[int, int, str]], Any]:
    """Outputs ``(origin, idx, body)`` and final state of a processor fed directly, in order,
    without the events in ``skip`` (by seq): what the batch must equal."""
    proc = Acc.build({}, "p", None)
    outs = []
    for origin, seq, ts, creator, body in rows:
        if seq in skip:
            continue
        result = proc.process(Event(seq, ts, creator, json.loads(body)))
        results = [result] if isinstance(result, (dict, Event)) else list(result or [])
        for n, out in enumerate(results):
            out_body = out.body if isinstance(out, Event) else out
            outs.append((origin, n, json.dumps(out_body, separators=(",", ":"))))
    return outs, json.loads(proc.dump_state())


class Counted:
    """``build`` for run_batch, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, resume: Mapping[str, Any] | None) -> Processor:
        self.calls += 1
        return Acc.build({}, "p", resume)


def batch(
    rows: list[InputRow], start: dict[str, Any] | None = None, limit: int = 1_000_000
) -> tuple[list[RecordRow], dict[str, Any], Counted]:
    build = Counted()
    text = json.dumps(start) if start is not None else None
    records, final = run_batch(
        build,
        lambda: json.loads(text) if text is not None else None,
        rows,
        finish=lambda p: json.loads(encode_state(p.snapshot())),
        pe="p",
        max_record_bytes=limit,
    )
    return records, final, build


def split(records: list[RecordRow]) -> tuple[list[tuple[int, int, str]], dict[int, str]]:
    """``(origin, idx, body)`` of the events, and ``{seq: reason}`` of the dead letters."""
    events = [(r[0], r[1], r[5]) for r in records if r[6] is None]
    dead = {r[2]: r[6] for r in records if r[6] is not None}
    return events, dead


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_any_exception_is_a_dead_letter_and_its_changes_are_undone(name: str) -> None:
    rows = [row(1, v=1), row(2, v=2), row(3, v=4, mode="raise", exc=name), row(4, v=8)]
    records, final, _ = batch(rows)
    events, dead = split(records)
    expected, expected_state = reference(rows, {3})
    assert events == expected
    assert final == expected_state == {"seen": [1, 2, 4], "total": 11.0}
    assert list(dead) == [3]
    assert dead[3].startswith(f"processor 'p' raised {name}")
    # The dead letter carries the input as received, at the input's position.
    letter = next(r for r in records if r[6] is not None)
    assert (letter[0], letter[1], letter[5]) == (6, 0, rows[2][4])


def test_a_keyboard_interrupt_from_process_is_the_events_dead_letter() -> None:
    # It ended the batch, which failed at every retry, the PE for good: a Spark worker runs in
    # its node's session, where no terminal's ^C reaches, so it is the processor's own.
    class Quits(Processor):
        n: int = state(0)

        def process(self, event: Event) -> Any:
            if event.body.get("odd"):
                raise KeyboardInterrupt
            self.n += 1
            return {"n": self.n}

    rows = [row(1), row(2, odd=True), row(3)]
    events, dead = split(list(run_events(Quits.build({}, "q", None), rows)))
    assert [body for _, _, body in events] == ['{"n":1}', '{"n":2}']
    assert list(dead) == [2] and dead[2].startswith("processor 'q' raised KeyboardInterrupt")


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("nan", "cannot be encoded (ValueError: Out of range float values"),
        ("inf", "cannot be encoded (ValueError: Out of range float values"),
        ("set", "cannot be encoded (TypeError: Object of type set is not JSON serializable"),
        ("int", "returned int and iterating it raised TypeError"),
        # (Where in the processor's code, too: a reason said what was raised, never where.)
        (
            "gen",
            "raised IndexError: half way (at test_batch.py:"
            f"{Acc._half.__code__.co_firstlineno + 3} in _half) while its outputs",
        ),
        ("dead", "told to"),
    ],
)
def test_outputs_the_encoding_refuses_are_dead_letters(mode: str, reason: str) -> None:
    rows = [row(1, v=1), row(2, v=10, mode=mode), row(3, v=100)]
    records, final, _ = batch(rows)
    events, dead = split(records)
    expected, expected_state = reference(rows, {2})
    assert events == expected
    assert final == expected_state
    assert list(dead) == [2] and reason in dead[2], dead


def test_an_output_over_the_record_limit_is_a_dead_letter_that_fits() -> None:
    limit = 4000
    # The input itself is too big to be carried whole in its dead letter.
    rows = [row(1, v=1), row(2, v=2, mode="big", size=5000, junk="é" * 1000), row(3, v=3)]
    records, final, _ = batch(rows, limit=limit)
    events, dead = split(records)
    expected, expected_state = reference(rows, {2})
    assert events == expected
    assert final == expected_state
    assert "over the limit of 4000 bytes (max_record_bytes)" in dead[2]
    letter = next(r for r in records if r[6] is not None)
    assert oversize(letter[2], letter[3], letter[4], letter[5], letter[6], limit) is None
    assert letter[5].startswith(rows[1][4][:100]) and "[cut: " in letter[5]
    # An output just under the limit goes through.
    small = [row(1, v=0, mode="big", size=limit - 200)]
    records, _, _ = batch(small, limit=limit)
    assert split(records)[1] == {}


def test_several_failures_in_one_batch_cost_one_rebuild_each() -> None:
    rows = [row(k, v=k) for k in range(1, 201)]
    bad = {7, 8, 50, 51, 52, 120, 199}
    for k in bad:
        rows[k - 1] = row(k, v=k, mode="raise", exc="RuntimeError")
    start = {"seen": [0], "total": 0.5}
    records, final, build = batch(rows, start=start)
    events, dead = split(records)
    ref = Acc.build({}, "p", dict(start))
    ref_outs = []
    for origin, seq, ts, creator, body in rows:
        if seq not in bad:
            out = ref.process(Event(seq, ts, creator, json.loads(body)))
            ref_outs.append((origin, 0, json.dumps(out, separators=(",", ":"))))
    assert events == ref_outs
    assert final == json.loads(ref.dump_state())
    assert set(dead) == bad
    # The first build, then one per failed event: each replay starts at the last recovery.
    assert build.calls == 1 + len(bad)


def test_an_event_that_leaves_a_state_json_cannot_hold_is_found_and_dead_lettered() -> None:
    # Event 3 spoils the state silently; event 5's output then shows it (an output failure,
    # whose recovery finds that the state before it cannot be stored).
    rows = [row(1, v=1), row(2, v=2), row(3, v=3, mode="spoil"), row(4, v=4), row(5, v=5)]
    records, final, _ = batch(rows)
    events, dead = split(records)
    expected, expected_state = reference(rows, {3})
    assert events == expected
    assert final == expected_state
    assert list(dead) == [3] and "left with a state that cannot be encoded" in dead[3]


def test_a_spoilt_state_found_only_at_the_end_of_the_batch() -> None:
    rows = [row(k, v=k, mode="event") for k in range(1, 40)]
    rows[25] = row(26, v=26, mode="spoil")
    records, final, _ = batch(rows)
    events, dead = split(records)
    expected, expected_state = reference(rows, {26})
    assert events == expected
    assert final == expected_state
    assert list(dead) == [26]
    # Outputs keep the Event's own header.
    assert [r[2] for r in records if r[6] is None][:2] == [10, 20]


def test_input_that_is_not_an_event_changes_nothing_and_needs_no_rebuild() -> None:
    rows = [row(1, v=1), (4, 2, 1002.0, "src", "{not json"), (6, 3, 1003.0, "src", "[1]")]
    records, final, build = batch(rows)
    events, dead = split(records)
    assert events == [(2, 0, '{"total":1.0,"n":1}')]
    assert final == {"seen": [1], "total": 1.0}
    assert set(dead) == {2, 3} and "is not an event" in dead[2]
    assert build.calls == 1
    assert next(r for r in records if r[2] == 2)[5] == "{not json"


def test_a_message_no_pe_wrote_is_a_dead_letter_even_if_its_text_is_an_object() -> None:
    # The reader passes such a message on with its raw text (broker.keys.event_fields): a
    # stranger's `{"v": 5}`, or a message naming a creator no PE has, was processed as an
    # event before.
    rows = [row(1, v=1), (4, 2, 0.0, NOT_AN_EVENT, '{"v": 5, "mode": "add"}'), row(3, v=3)]
    records, final, _ = batch(rows)
    events, dead = split(records)
    assert [body for _, _, body in events][-1] == '{"total":4.0,"n":2}'
    assert final == {"seen": [1, 3], "total": 4.0}
    assert list(dead) == [2] and "no PE wrote" in dead[2]


def test_a_processor_that_is_not_deterministic_loses_the_event_that_changed() -> None:
    class Flaky(Processor):
        n: int = state(0)
        calls: dict[int, int] = {}

        def process(self, event: Event) -> Any:
            Flaky.calls[event.seq] = Flaky.calls.get(event.seq, 0) + 1
            if event.seq == 2 and Flaky.calls[2] > 1:
                raise RuntimeError("second time")
            if event.seq == 3:
                raise RuntimeError("always")
            self.n += 1
            return {"n": self.n}

    records, final = run_batch(
        lambda resume: Flaky.build({}, "f", resume),
        lambda: None,
        [row(1), row(2), row(3), row(4)],
        finish=lambda p: p.snapshot(),
        pe="f",
    )
    events, dead = split(records)
    assert set(dead) == {2, 3}
    assert "is the processor deterministic?" in dead[2]
    # 4 was recomputed on the state without 2: n == 2, not 3.
    assert events == [(2, 0, '{"n":1}'), (8, 0, '{"n":2}')]
    assert final == {"n": 2}


def test_stateless_processors_skip_the_event_and_keep_going() -> None:
    class Picky(Processor):
        def process(self, event: Event) -> Any:
            return {"inv": 1 / event.body["v"]}

    assert not Picky.is_stateful()
    out = list(run_events(Picky.build({}, "s", None), [row(1, v=2), row(2, v=0), row(3, v=4)]))
    assert [(r[2], r[5], r[6]) for r in out] == [
        (1, '{"inv":0.5}', None),
        (
            2,
            '{"v": 0}',
            "processor 's' raised ZeroDivisionError: division by zero (at "
            f"test_batch.py:{Picky.process.__code__.co_firstlineno + 1} in process)",
        ),
        (3, '{"inv":0.25}', None),
    ]


def test_an_output_seq_below_0_is_a_dead_letter() -> None:
    """A reader takes a message with a negative seq for a stranger's and passes its whole
    wrapper on as a body (a csv-sink would take it for its header): refused at the source."""

    class Rebase(Processor):
        def process(self, event: Event) -> Any:
            return Event(event.seq - 2, event.timestamp, event.body)

    out = list(run_events(Rebase.build({}, "r", None), [row(1, v=1), row(3, v=3)]))
    assert out[0][6] is not None and "seq -1" in out[0][6] and out[0][2] == 1
    assert (out[1][2], out[1][6]) == (1, None)  # seq 3 - 2


def test_run_events_leaves_the_callers_instance_with_the_isolated_state() -> None:
    proc = Acc.build({}, "p", {"seen": [], "total": 0.0})
    rows = [row(1, v=1), row(2, v=2, mode="raise", exc="IndexError"), row(3, v=3)]
    out = list(run_events(proc, rows))
    assert len(out) == 3
    assert json.loads(proc.dump_state()) == {"seen": [1, 3], "total": 4.0}


def test_a_processor_that_cannot_be_built_is_an_element_error() -> None:
    class Picky(Processor):
        n: int = state(0)

        def restore(self, snapshot: Mapping[str, Any] | None) -> None:
            raise RuntimeError("cannot restore")

        def process(self, event: Event) -> Any:
            return None

    with pytest.raises(ElementError, match="cannot be built from its state: RuntimeError"):
        run_batch(
            lambda resume: Picky.build({}, "p", resume),
            lambda: {"n": 1},
            [row(1)],
            finish=lambda p: None,
            pe="p",
            pipeline="pl",
        )


def test_a_snapshot_that_never_encodes_is_an_element_error() -> None:
    class Opaque(Processor):
        def snapshot(self) -> dict[str, Any]:
            return {"x": object()}

        def restore(self, snapshot: Mapping[str, Any] | None) -> None:
            pass

        def process(self, event: Event) -> Any:
            return {"ok": 1}

    with pytest.raises(ElementError, match="state that cannot be encoded"):
        run_batch(
            lambda resume: Opaque.build({}, "o", resume),
            lambda: None,
            [row(1), row(2)],
            finish=lambda p: encode_state(p.snapshot()),
            pe="o",
        )


@pytest.mark.parametrize("generator", [False, True], ids=["returns", "yields"])
def test_a_processor_may_promise_its_dead_letters_change_nothing(generator: bool) -> None:
    # (A generator's DeadLetter, raised as its outputs are iterated, was reported as
    # "returned generator and iterating it raised DeadLetter" and undone by a rebuild.)
    class Careful(Acc):
        dead_letters_change_nothing = True

        def process(self, event: Event) -> Any:
            return self._outputs(event) if generator else self._output(event)

        def _output(self, event: Event) -> Any:
            if event.body.get("mode") == "dead":
                raise DeadLetter("checked first")
            return super().process(event)

        def _outputs(self, event: Event) -> Iterator[Any]:
            yield self._output(event)

    build = Counted()
    rows = [row(1, v=1), row(2, v=2, mode="dead"), row(3, v=3)]
    records, final = run_batch(
        lambda resume: (build(resume), Careful.build({}, "p", resume))[1],
        lambda: None,
        rows,
        finish=lambda p: p.snapshot(),
        pe="p",
    )
    assert build.calls == 1  # no rebuild for its dead letter
    assert final == {"seen": [1, 3], "total": 4.0}
    assert split(records)[1] == {2: "checked first"}
    # Any other failure is still undone.
    rows[1] = row(2, v=2, mode="raise", exc="IndexError")
    records, final = run_batch(
        lambda resume: Careful.build({}, "p", resume),
        lambda: None,
        rows,
        finish=lambda p: p.snapshot(),
        pe="p",
    )
    assert final == {"seen": [1, 3], "total": 4.0}


def test_a_state_that_would_not_read_back_as_it_is_makes_its_event_a_dead_letter() -> None:
    """A csv-source makes the cell "7" the int 7: a count keyed by it would read back keyed
    by "7". The instance holding it and one rebuilt from its text (after a dead letter, a
    restart, a move) would then count apart; the event that made it so is refused."""

    class Counts(Processor):
        counts: dict = state(default_factory=dict)

        def process(self, event: Event) -> Any:
            key = event.body["sensor"] if event.body.get("raw") else str(event.body["sensor"])
            self.counts[key] = self.counts.get(key, 0) + 1
            return {"n": self.counts[key]}

    rows = [row(1, sensor=7), row(2, sensor=7, raw=True), row(3, sensor=7), row(4, sensor=7)]
    records, final = run_batch(
        lambda resume: Counts.build({}, "c", resume), lambda: None, rows,
        finish=lambda p: json.loads(encode_state(p.snapshot())), pe="c",
        max_record_bytes=1_000_000,
    )  # fmt: skip
    events, dead = split(records)
    assert list(dead) == [2] and "would not read back as it is" in dead[2]
    assert [json.loads(body)["n"] for _, _, body in events] == [1, 2, 3]
    assert final == {"counts": {"7": 3}}


def test_a_state_that_reads_back_equal_but_not_the_same_makes_its_event_a_dead_letter() -> None:
    """numpy's float compares equal to the float its text reads back as, but does not round
    alike (``round(np.float64(2.675), 2)`` is 2.68, ``round(2.675, 2)`` 2.67): the instance
    holding it and one rebuilt from the text would emit different values."""
    import numpy as np

    class Mean(Processor):
        total: float = state(0.0)

        def process(self, event: Event) -> Any:
            value = event.body["x"]
            self.total = self.total + (np.float64(value) if event.body.get("np") else value)
            return {"total": round(self.total, 2)}

    rows = [row(1, x=1.0), row(2, x=1.675, np=True), row(3, x=1.675)]
    records, final = run_batch(
        lambda resume: Mean.build({}, "m", resume), lambda: None, rows,
        finish=lambda p: json.loads(encode_state(p.snapshot())), pe="m",
    )  # fmt: skip
    events, dead = split(records)
    assert (
        list(dead) == [2] and "is of type float64, which reads back as a plain float" in (dead[2])
    )
    assert [json.loads(body)["total"] for _, _, body in events] == [1.0, 2.67]
    assert final == {"total": 2.675} and type(final["total"]) is float


class Ids(Processor):
    """Counts by id, ids ints: its own snapshot() writes them as text, and its restore()
    turns them back into ints."""

    def __init__(self, options: Any, element_id: str = "") -> None:
        super().__init__(options, element_id)
        self.counts: dict[Any, int] = {}

    def snapshot(self) -> dict[str, Any]:
        return {"counts": {str(k): v for k, v in self.counts.items()}}

    def restore(self, snapshot: Mapping[str, Any] | None) -> None:
        self.counts = {} if snapshot is None else {int(k): v for k, v in snapshot["counts"].items()}

    def process(self, event: Event) -> Any:
        if event.body.get("raise"):
            raise ValueError("told to")
        self.counts[event.body["id"]] = self.counts.get(event.body["id"], 0) + 1
        return {"n": sum(self.counts.values())}


def test_an_event_after_which_a_state_of_its_own_does_not_read_back_is_a_dead_letter() -> None:
    # The text id "x" was stored as the state "x"; every rebuild from it (an event undone
    # in the next batch, a restart, a move) raised in restore(): the PE failed for good.
    build = lambda resume: Ids.build({}, "ids", resume)  # noqa: E731
    rows = [row(1, id=1), row(2, id="x"), row(3, id=2)]
    finish = lambda p: json.loads(encode_state(p.snapshot()))  # noqa: E731
    records, final = run_batch(build, lambda: None, rows, finish=finish, pe="ids")
    events, dead = split(records)
    assert list(dead) == [2] and "its restore() refuses what its snapshot() returned" in dead[2]
    assert "reads back as it is" in dead[2]
    assert [json.loads(body)["n"] for _, _, body in events] == [1, 2]
    assert final == {"counts": {"1": 1, "2": 1}}
    # The next batch, whose event is undone, rebuilds from it.
    stored = json.dumps(final)
    rows = [row(4, id=1), row(5, id=3, **{"raise": True})]
    records, final = run_batch(build, lambda: json.loads(stored), rows, finish=finish, pe="ids")
    events, dead = split(records)
    assert list(dead) == [5] and final == {"counts": {"1": 2, "2": 1}}


class Indexed(Processor):
    """Declared state only; its restore() rebuilds an index (not state) from it."""

    seen: list = state(default_factory=list)

    def restore(self, snapshot: Mapping[str, Any] | None) -> None:
        super().restore(snapshot)
        self.by_id = {item["id"]: item for item in self.seen}

    def process(self, event: Event) -> Any:
        if event.body.get("raise"):
            raise ValueError("told to")
        self.seen.append(event.body)
        self.by_id[event.body.get("id")] = event.body
        return {"n": len(self.seen)}


def test_an_event_after_which_its_own_restore_refuses_the_declared_state_is_a_dead_letter() -> None:
    # Only a class with its own snapshot() was read back: one overriding restore() alone
    # stored a state (an event without "id") that every later rebuild refused (KeyError),
    # and the PE failed for good.
    build = lambda resume: Indexed.build({}, "ix", resume)  # noqa: E731
    finish = lambda p: json.loads(encode_state(p.snapshot()))  # noqa: E731
    rows = [row(1, id=1), row(2, v=2), row(3, id=3)]
    records, final = run_batch(build, lambda: None, rows, finish=finish, pe="ix")
    _, dead = split(records)
    assert list(dead) == [2] and "its restore() refuses what its snapshot() returned" in dead[2]
    assert "KeyError: 'id'" in dead[2]
    assert final == {"seen": [{"id": 1}, {"id": 3}]}
    stored = json.dumps(final)  # the next batch undoes an event: rebuilt from it
    records, final = run_batch(
        build, lambda: json.loads(stored), [row(4, id=4), row(5, id=5, **{"raise": True})],
        finish=finish, pe="ix",
    )  # fmt: skip
    assert list(split(records)[1]) == [5] and len(final["seen"]) == 3


class Trie(Processor):
    """A state one level deeper per character of a word."""

    trie: dict = state(default_factory=dict)

    def process(self, event: Event) -> Any:
        node = self.trie
        for letter in event.body["word"]:  # (KeyError: an event without a word)
            node = node.setdefault(letter, {})
        node["$"] = 1
        return {"n": len(event.body["word"])}


def test_a_state_nested_too_deep_to_be_undone_from_is_refused_where_it_would_be_made() -> None:
    # Nested to just under Python's limit, it passed the batch's check, then every undo
    # (decoding it deeper in the stack) raised RecursionError: the batch failed for good.
    build = lambda resume: Trie.build({}, "t", resume)  # noqa: E731
    finish = lambda p: json.loads(encode_state(p.snapshot()))  # noqa: E731
    deep = "b" * (sys.getrecursionlimit() - 60)
    rows = [row(1, word="a" * 300), row(2, word=deep), row(3, word="c")]
    records, final = run_batch(build, lambda: None, rows, finish=finish, pe="t")
    events, dead = split(records)
    assert list(dead) == [2] and "cannot be encoded" in dead[2], dead
    assert [json.loads(body)["n"] for _, _, body in events] == [300, 1]
    stored = json.dumps(final)  # the next batch undoes an event: rebuilt from it
    rows = [row(4, word="d"), row(5, nothing=1), row(6, word="e")]
    records, final = run_batch(build, lambda: json.loads(stored), rows, finish=finish, pe="t")
    assert list(split(records)[1]) == [5] and set(final["trie"]) == {"a", "c", "d", "e"}


@pytest.mark.parametrize("too_much", ["outputs", "endless", "bytes"])
def test_one_event_with_too_many_outputs_is_a_dead_letter(
    too_much: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each record was limited, not an event's outputs in all: millions of them, or a
    # generator without end, were taken whole (a worker out of memory blames no event).
    from itertools import count

    from fogshift.runtime import batch

    monkeypatch.setattr(batch, "MAX_EVENT_OUTPUTS", 10)
    monkeypatch.setattr(batch, "MAX_EVENT_OUTPUT_BYTES", 1000)

    class Many(Processor):
        n: int = state(0)

        def process(self, event: Event) -> Any:
            self.n += 1
            if not event.body.get("many"):
                return {"v": event.body["v"]}
            if too_much == "outputs":
                return [{"v": k} for k in range(11)]
            if too_much == "endless":
                return ({"v": k} for k in count())
            return [{"v": "x" * 200} for _ in range(5)]  # (5 of ~210 bytes: over 1000)

    rows = [row(1, v=1), row(2, v=2, many=True), row(3, v=3)]
    records, final = run_batch(lambda resume: Many.build({}, "m", resume), lambda: None, rows,
                               finish=lambda p: p.snapshot(), pe="m")  # fmt: skip
    events, dead = split(records)
    assert [body for _, _, body in events] == ['{"v":1}', '{"v":3}']
    assert list(dead) == [2] and "the most one event may have" in dead[2], dead
    assert final == {"n": 2}  # (its state as before it)
    assert [{"v": k} for k in range(10)] == batch._outputs("m", [{"v": k} for k in range(10)])


class Explodes(Ids):
    """Its snapshot() raises once an event set it off."""

    def snapshot(self) -> dict[str, Any]:
        if "boom" in self.counts:
            raise RuntimeError("snapshot exploded")
        return super().snapshot()

    def restore(self, snapshot: Mapping[str, Any] | None) -> None:
        self.counts = {} if snapshot is None else dict(snapshot["counts"])


def test_a_snapshot_that_raises_after_an_event_is_said_as_raising() -> None:
    # A walk-through's finding: it read "a state that cannot be encoded (RuntimeError: ...)".
    build = lambda resume: Explodes.build({}, "ex", resume)  # noqa: E731
    rows = [row(1, id="a"), row(2, id="boom"), row(3, id="b")]
    finish = lambda p: json.loads(encode_state(p.snapshot()))  # noqa: E731
    records, final = run_batch(build, lambda: None, rows, finish=finish, pe="ex")
    events, dead = split(records)
    assert list(dead) == [2], dead
    assert "its snapshot() raised RuntimeError: snapshot exploded (at test_batch.py:" in dead[2]
    # Its own code failed, not the encoding: no hint at JSON values (another walk-through's).
    assert dead[2].startswith("processor 'ex' cannot take a snapshot of its state"), dead[2]
    assert "finite numbers" not in dead[2]
    assert [json.loads(body)["n"] for _, _, body in events] == [1, 2]
    assert final == {"counts": {"a": 1, "b": 1}}


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


class NoReason(DeadLetter):
    def __init__(self, what: str) -> None:  # (never calls DeadLetter's)
        Exception.__init__(self, what)


class OwnBase(BaseException):
    """A processor's own ``BaseException``."""


class ClassRaises(Exception):
    """An exception whose ``__class__`` (read by isinstance) runs code that quits."""

    @property  # type: ignore[override]
    def __class__(self) -> type:
        raise KeyboardInterrupt("asked for its class")


class ReasonClassRaises:
    """A dead letter's reason whose ``__class__`` raises."""

    @property  # type: ignore[override]
    def __class__(self) -> type:
        raise ValueError("asked for its class")


class ExitsInStr(Exception):
    def __str__(self) -> str:
        raise SystemExit("a library exception whose text exits")


class ReasonRaises(DeadLetter):
    @property  # type: ignore[override]
    def reason(self) -> str:
        raise ValueError("no reason")

    @reason.setter
    def reason(self, value: str) -> None:
        pass


#: What processors have raised as a dead letter's reason besides text, and texts no UTF-8
#: encoder takes (an input's lone surrogate quoted in a message): each failed its batch at
#: every retry, in the reason's length or in Arrow.
ODD_REASONS: dict[str, Callable[[], BaseException]] = {
    "exception": lambda: DeadLetter(KeyError("v")),  # type: ignore[arg-type]
    "none": lambda: DeadLetter(None),  # type: ignore[arg-type]
    "tuple": lambda: DeadLetter(("bad", 1)),  # type: ignore[arg-type]
    "unprintable": lambda: DeadLetter(Unprintable()),  # type: ignore[arg-type]
    "surrogate": lambda: DeadLetter("bad \ud800"),
    "raised surrogate": lambda: ValueError("unknown \udcff"),
    # A subclass whose __init__ sets no reason (an AttributeError at every retry), and
    # user or library code quitting on a bad input (the batch failed at every retry).
    "no reason": lambda: NoReason("missing v"),
    "sys.exit": lambda: SystemExit(3),
    "generator closed": lambda: GeneratorExit(),
    # BaseExceptions user code raises too: they failed the PE for good (a review's finding).
    "cancelled": lambda: asyncio.CancelledError("cancelled inside a library call"),
    "group": lambda: BaseExceptionGroup("two", [asyncio.CancelledError(), ValueError("v")]),
    "own base": lambda: OwnBase("a class of the processor's own"),
    # Two that escaped while their reason was written (the batch failed at every retry).
    "exits in str": lambda: ExitsInStr(),
    "reason raises": lambda: ReasonRaises("x"),
    # Three that escaped where isinstance read their `__class__` (a review's finding).
    "class raises": lambda: ClassRaises("x"),
    "reason's class raises": lambda: DeadLetter(ReasonClassRaises()),  # type: ignore[arg-type]
    "dead letter's class raises": lambda: DeadLetterClassRaises("x"),
}


class ExitingBody(Mapping[str, Any]):
    """An output mapping whose reading calls sys.exit() (the processor's code runs while
    its outputs are encoded)."""

    def __getitem__(self, key: str) -> Any:
        raise SystemExit("bad value")

    def __iter__(self) -> Iterator[str]:
        return iter(["v"])

    def __len__(self) -> int:
        return 1


class DeadLetterClassRaises(DeadLetter):
    @property  # type: ignore[override]
    def __class__(self) -> type:
        raise SystemExit("asked for its class")


class ClassRaisingBody(dict):  # type: ignore[type-arg]
    """An output, a dict of the processor's own, whose ``__class__`` quits."""

    @property  # type: ignore[override]
    def __class__(self) -> type:
        raise KeyboardInterrupt("asked for its class")


class ExitingSeq:
    def __int__(self) -> int:
        raise SystemExit(3)


@pytest.mark.parametrize("stateful", [True, False])
@pytest.mark.parametrize("output", ["mapping", "event seq", "class"])
def test_an_output_whose_encoding_exits_is_a_dead_letter(output: str, stateful: bool) -> None:
    # Only Exception was caught there: the SystemExit escaped the batch, which failed at
    # every retry, the event never dead-lettered.
    class Exits(Processor):
        def process(self, event: Event) -> Any:
            if not event.body.get("odd"):
                return {"v": event.body["v"]}
            if output == "mapping":
                return ExitingBody()
            if output == "class":
                return [ClassRaisingBody(v=0)]  # (one output alone is asked for its type first)
            return Event(seq=ExitingSeq(), timestamp=0.0, creator="x", body={"v": 0})  # type: ignore[arg-type]

    class ExitsKept(Exits):
        n: int = state(0)

    rows = [row(1, v=1), row(2, v=2, odd=True), row(3, v=3)]
    if stateful:
        records, _ = run_batch(lambda resume: ExitsKept.build({}, "x", resume), lambda: None,
                               rows, finish=lambda p: {}, pe="x")  # fmt: skip
    else:
        records = list(run_events(Exits.build({}, "x", None), rows))
    events, dead = split(records)
    assert [body for _, _, body in events] == ['{"v":1}', '{"v":3}']
    assert list(dead) == [2], dead
    if output == "class":
        assert "returned output 0 of type ClassRaisingBody; expected a dict" in dead[2], dead
    else:
        assert "cannot be encoded (SystemExit" in dead[2], dead


@pytest.mark.parametrize("stateful", [True, False])
@pytest.mark.parametrize("name", sorted(ODD_REASONS))
def test_any_reason_a_processor_gives_is_a_dead_letter_arrow_carries(
    name: str, stateful: bool
) -> None:
    import pandas as pd
    import pyarrow as pa

    from fogshift.runtime.batch import RECORD_COLUMNS

    class Odd(Processor):
        def process(self, event: Event) -> Any:
            if event.body.get("odd"):
                raise ODD_REASONS[name]()
            return {"v": event.body["v"]}

    class OddKept(Odd):
        n: int = state(0)

    kind = OddKept if stateful else Odd
    rows = [row(1, v=1), row(2, v=2, odd=True), row(3, v=3)]
    if stateful:
        records, _ = run_batch(lambda resume: kind.build({}, "o", resume), lambda: None, rows,
                               finish=lambda p: {}, pe="o")  # fmt: skip
    else:
        records = list(run_events(kind.build({}, "o", None), rows))
    events, dead = split(records)
    assert [body for _, _, body in events] == ['{"v":1}', '{"v":3}']
    assert list(dead) == [2] and isinstance(dead[2], str) and dead[2], dead
    pa.Table.from_pandas(pd.DataFrame(records, columns=RECORD_COLUMNS))  # what Spark does


@pytest.mark.parametrize("given", ["", "   ", None])
def test_a_dead_letter_without_a_reason_says_so_and_where(given: str | None) -> None:
    # Its dead letter's reason was "" (or "None"): nothing said why.
    class Mute(Processor):
        def process(self, event: Event) -> Any:
            if event.body.get("odd"):
                raise DeadLetter(given)  # type: ignore[arg-type]
            return {"v": event.body["v"]}

    rows = [row(1, v=1), row(2, v=2, odd=True)]
    _, dead = split(list(run_events(Mute.build({}, "m", None), rows)))
    assert dead[2].startswith("processor 'm' raised DeadLetter"), dead
    assert "(at test_batch.py:" in dead[2] and dead[2].endswith("and gave no reason"), dead


def test_an_event_of_the_processors_own_whose_fields_raise_is_a_dead_letter() -> None:
    # Its fields were read outside the encoding's guard: the error escaped the batch.
    class Broken(Event):
        def __getattribute__(self, name: str) -> Any:
            if name == "body":
                raise RuntimeError("no body")
            return super().__getattribute__(name)

    class Emits(Processor):
        def process(self, event: Event) -> Any:
            if event.body.get("odd"):
                return Broken(seq=1, timestamp=0.0, creator="x", body={})
            return {"v": event.body["v"]}

    rows = [row(1, v=1), row(2, v=2, odd=True), row(3, v=3)]
    events, dead = split(list(run_events(Emits.build({}, "e", None), rows)))
    assert [body for _, _, body in events] == ['{"v":1}', '{"v":3}']
    assert "cannot be encoded (RuntimeError: no body)" in dead[2], dead


def test_an_event_spark_finds_no_key_in_says_whether_it_has_the_field() -> None:
    # Spark's JSON reader (Jackson's limits) finds no key in a body with a number of 1,200
    # digits: it was said to have no field "k", which it has.
    from fogshift.runtime.batch import unkeyed_dead_letters

    long = (5, 2, 1002.0, "src", '{"k": "a", "w": ' + "9" * 1200 + "}")
    rows = [row(1, v=1), long, (6, 3, 1003.0, "src", '{"k": null}')]
    reasons = [r[6] for r in unkeyed_dead_letters(rows, "agg", "k")]
    assert (
        reasons[0]
        == reasons[2]
        == ("field 'k' (key_by of 'agg') is missing or null: the event has no key")
    )
    assert reasons[1].startswith(
        "field 'k' (key_by of 'agg') is in the event, but Spark's JSON reader, which finds the "
        "keys, does not read its body"
    )


def test_a_reason_found_by_bisection_quoting_a_lone_surrogate_is_carried() -> None:
    # The state stops encoding after one event, whose name snapshot() quotes in its error:
    # the dead letter's reason held the surrogate, which Arrow refused at every retry.
    import pandas as pd
    import pyarrow as pa

    from fogshift.runtime.batch import RECORD_COLUMNS

    class Picky(Processor):
        names: list[str] = state(default_factory=list)

        def process(self, event: Event) -> Any:
            self.names.append(event.body["name"])
            return {"ok": 1}

        def snapshot(self) -> dict[str, Any]:
            for name in self.names:
                if "\ud800" in name:
                    raise ValueError(f"cannot store {name}")
            return super().snapshot()

    rows = [row(1, name="a"), (4, 2, 1002.0, "src", '{"name": "bad\\ud800"}'), row(3, name="c")]
    records, final = run_batch(
        lambda resume: Picky.build({}, "k", resume), lambda: None, rows,
        finish=lambda p: json.loads(encode_state(p.snapshot())), pe="k",
    )  # fmt: skip
    events, dead = split(records)
    assert list(dead) == [2] and "cannot store bad" in dead[2], dead
    assert final == {"names": ["a", "c"]} and len(events) == 2
    pa.Table.from_pandas(pd.DataFrame(records, columns=RECORD_COLUMNS))  # what Spark does


# -- a stuck event ------------------------------------------------------------------------


class Stuck(Processor):
    """Counts events; ``hang`` says how it gets stuck on one (after changing its state)."""

    n: int = state(0)

    def process(self, event: Event) -> Any:
        self.n += 1
        hang = event.body.get("hang")
        if hang == "loop":
            while True:
                pass
        if hang == "sleep":
            time.sleep(3600)
        if hang == "swallow":  # a processor that catches whatever it can, and goes on
            while True:
                try:
                    time.sleep(3600)
                except Exception:
                    continue
        if hang == "outputs":  # stuck while its outputs are iterated
            return self._never_ending()
        # Stuck while its outputs are encoded: the user's code runs there too.
        if hang == "mapping":  # a body that is a Mapping of its own
            return EndlessMapping()
        if hang == "nested":  # a dict subclass inside a body (json reads it by items())
            return {"inner": EndlessItems(a=1)}
        if hang == "seq":  # an Event whose seq is an object of its own
            return Event(EndlessInt(), 0.0, "p", {})  # type: ignore[arg-type]
        return {"n": self.n}

    def _never_ending(self) -> Iterator[dict[str, Any]]:
        while True:
            pass
        yield {}


def _spin() -> Any:
    while True:
        pass


class EndlessMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        return _spin()

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1


class EndlessItems(dict[str, Any]):
    def items(self) -> Any:
        return _spin()


class EndlessInt:
    def __int__(self) -> int:
        return int(_spin())


@pytest.mark.timeout(120)  # (a regression would hang: fail it soon, see the test below)
@pytest.mark.parametrize(
    "hang", ["loop", "sleep", "swallow", "outputs", "mapping", "nested", "seq"]
)
def test_an_event_over_its_time_is_a_dead_letter_and_its_changes_are_undone(hang: str) -> None:
    rows = [row(1), row(2, hang=hang), row(3)]
    started = time.monotonic()
    records, final = run_batch(
        lambda resume: Stuck.build({}, "p", resume),
        lambda: None,
        rows,
        finish=lambda p: json.loads(encode_state(p.snapshot())),
        pe="p",
        event_timeout_s=0.2,
    )
    assert time.monotonic() - started < 30
    events, dead = split(records)
    assert [body for _, _, body in events] == ['{"n":1}', '{"n":2}']  # as if 2 never came
    assert final == {"n": 2}
    assert list(dead) == [2]
    assert dead[2].startswith("processor 'p' took longer than 0.2 s for one event"), dead
    assert "event_timeout_s" in dead[2]


def test_a_stateless_processor_over_its_time_skips_the_event() -> None:
    class Sleepy(Processor):
        def process(self, event: Event) -> Any:
            if event.body.get("hang"):
                time.sleep(3600)
            return {"seq": event.seq}

    out = list(run_events(Sleepy.build({}, "s", None), [row(1), row(2, hang=1), row(3)],
                          event_timeout_s=0.2))  # fmt: skip
    assert [(r[2], r[6] is None) for r in out] == [(1, True), (2, False), (3, True)]
    assert "took longer than 0.2 s" in str(out[1][6])


def test_the_callers_alarm_and_its_handler_are_given_back_after_the_batch() -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.6)
        out = list(run_events(Stuck.build({}, "p", None), [row(1), row(2, hang="loop")],
                              event_timeout_s=0.2))  # fmt: skip
        assert [r[6] is None for r in out] == [True, False]
        assert not fired  # the caller's timer did not fire into the batch ...
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 0.6  # ... and runs on with what was left of it
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fired == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class CallersTimeout(BaseException):
    """What a caller's own alarm handler raises (as pytest-timeout's does)."""


def test_the_callers_alarm_still_fires_when_due_inside_a_batch() -> None:
    def on_alarm(signum: int, frame: Any) -> None:
        raise CallersTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        with pytest.raises(CallersTimeout):  # due long before the event's own 60 s
            list(run_events(Stuck.build({}, "p", None), [row(1, hang="loop")],
                            event_timeout_s=60))  # fmt: skip
        assert time.monotonic() - started < 30
        assert signal.getsignal(signal.SIGALRM) is on_alarm  # given back on the way out
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_without_a_time_limit_or_outside_the_main_thread_nothing_is_armed() -> None:
    handler = signal.getsignal(signal.SIGALRM)
    out = list(run_events(Stuck.build({}, "p", None), [row(1)], event_timeout_s=None))
    assert out[0][6] is None and signal.getsignal(signal.SIGALRM) is handler
    seen: list[Any] = []

    def elsewhere() -> None:
        seen.extend(run_events(Stuck.build({}, "p", None), [row(1), row(2)],
                               event_timeout_s=0.2))  # fmt: skip

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(30)
    assert [r[6] for r in seen] == [None, None]
    assert signal.getsignal(signal.SIGALRM) is handler  # (signals are the main thread's)


def test_input_rows_are_plain_values_in_input_order_across_frames() -> None:
    import pandas as pd

    def frame(origins: list[int], bodies: list[str | None]) -> pd.DataFrame:
        # As Spark hands them: Arrow's types, and a column the processor does not read.
        return pd.DataFrame({
            "key": ["k"] * len(origins), "origin": pd.Series(origins, dtype="int64"),
            "seq": pd.Series([o * 10 for o in origins], dtype="int64"),
            "timestamp": [float(o) / 2 for o in origins], "creator": ["c"] * len(origins),
            "body": bodies,
        })  # fmt: skip

    rows = input_rows([frame([7, 2], ['{"v": 7}', None]), frame([5, 2], ['{"v": 5}', "x"])])
    # Sorted by origin across frames; a tie keeps the frames' order (a stable sort).
    assert rows == [(2, 20, 1.0, "c", None), (2, 20, 1.0, "c", "x"), (5, 50, 2.5, "c", '{"v": 5}'),
                    (7, 70, 3.5, "c", '{"v": 7}')]  # fmt: skip
    assert all(type(v) in (int, float, str, type(None)) for row in rows for v in row)
    assert input_rows([]) == [] and input_rows([frame([], [])]) == []
