"""What a stateful PE's batch reads and writes of its state, with the state store replaced by a
recording stand-in (the real store is exercised in ``test_engine_lifecycle``).

A field that a batch leaves as it was must cost that batch nothing: not read from the store,
not encoded, not written (issue #13: a PE holding 50 MiB spent seconds a batch on it). The
stored digests (``marks``) must always be those of the stored texts, and a kept instance that
does not hold the stored state (a retried batch, another worker) must not be trusted.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import fogshift.runtime.engine as engine
from fogshift.broker.keys import (
    CONTROL_FIELD,
    KEY_COPY_IN,
    KEY_INDEX,
    KEY_MOVE_IN,
    KEY_MOVE_OUT,
    KEY_STATE,
)
from fogshift.runtime import key_parts
from fogshift.runtime.engine import _stateful_processor, state_digest
from fogshift.runtime.instances import registry
from fogshift.runtime.key_parts import LARGE_PART_BYTES

HERE = Path(__file__).resolve().parent
BALLAST = 200_000
_runs = itertools.count()


class Value:
    """One ValueState of the stand-in store; every call is recorded as ``(call, name)``."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name, self.calls, self.value = name, calls, None

    def get(self) -> tuple[str] | None:
        self.calls.append(("get", self.name))
        return None if self.value is None else (self.value,)

    def update(self, row: tuple[str]) -> None:
        self.calls.append(("update", self.name))
        self.value = row[0]

    def clear(self) -> None:
        self.calls.append(("clear", self.name))
        self.value = None


class Items:
    """One ListState of the stand-in store; every call is recorded as ``(call, name)``."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name, self.calls, self.items = name, calls, list[tuple[Any, ...]]()

    def get(self) -> Any:
        self.calls.append(("get", self.name))
        return iter(list(self.items))

    def appendList(self, rows: list[tuple[Any, ...]]) -> None:  # noqa: N802
        self.calls.append(("appendList", self.name))
        assert rows, "an empty append (Spark refuses one)"
        self.items += rows

    def clear(self) -> None:
        self.calls.append(("clear", self.name))
        self.items = []


class Store:
    """The state of one grouping key, as TWS's handle gives it to each batch."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.values: dict[str, Value] = {}
        self.lists: dict[str, Items] = {}

    def getValueState(self, name: str, schema: str) -> Value:  # noqa: N802
        return self.values.setdefault(name, Value(name, self.calls))

    def getListState(self, name: str, schema: str) -> Items:  # noqa: N802
        return self.lists.setdefault(name, Items(name, self.calls))

    def texts(self) -> dict[str, str | None]:
        return {n: v.value for n, v in self.values.items()}


def notes_checked(frames: list[pd.DataFrame], store: Store, key: str) -> list[pd.DataFrame]:
    """A keyed batch's output without its key index note (the writer never appends one),
    which must name each variable a key listing reads that the batch wrote or cleared, with
    its length as now stored (``None``: cleared), and be the batch's only one for ``key``."""
    listed = {n for call, n in store.calls
              if call in ("update", "clear") and (n.startswith("f_") or n == "held")}  # fmt: skip
    notes, kept = [], []
    for frame in frames:
        note = frame["creator"] == KEY_INDEX
        notes += [json.loads(body) for body in frame.loc[note, "body"]]
        if (~note).any():
            kept.append(frame[~note].reset_index(drop=True))
    stored = store.texts()
    expected = {n: None if stored[n] is None else len(stored[n]) for n in listed}
    assert notes == ([{"key": key, "vars": expected}] if listed else []), (notes, expected)
    return kept


class Pe:
    """A ``Ballasted`` PE run batch by batch as Spark would: a new processor per batch."""

    def __init__(self, tmp_path: Path) -> None:
        self.run = f"run{next(_runs)}"
        self.store = Store()
        self.seq = 0
        self.options = {
            "class": "lifecycle_procs:Ballasted",
            "path": str(HERE),
            "options": {"log": str(tmp_path / "hooks.log"), "ballast_bytes": BALLAST},
        }

    def batch(self, *bodies: dict[str, Any]) -> list[dict[str, Any]]:
        processor = _stateful_processor(
            "custom", self.options, "p", "pe", 1 << 20, run=self.run, gate=""
        )
        processor.init(self.store)
        self.store.calls.clear()
        rows = []
        for body in bodies:
            self.seq += 1
            rows.append((self.seq, self.seq, 1000.0 + self.seq, "src", json.dumps(body)))
        frame = pd.DataFrame(rows, columns=["origin", "seq", "timestamp", "creator", "body"])
        out = list(processor.handleInputRows(("all",), iter([frame]), None))
        return [json.loads(b) for f in out for b in f["body"]]


@pytest.fixture()
def pe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pe:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")  # instances are kept between batches
    return Pe(tmp_path)


def encodings_of_big_texts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the length of every state value of the ballast's size the engine encodes."""
    sizes: list[int] = []
    encode = engine.encode_state

    def counting(value: Any) -> str:
        if isinstance(value, str) and len(value) >= BALLAST:
            sizes.append(len(value))
        return encode(value)

    monkeypatch.setattr(engine, "encode_state", counting)
    return sizes


def assert_marks_match(store: Store) -> None:
    texts = store.texts()
    marks = json.loads(texts.pop("marks") or "null")
    assert marks == {n[2:]: state_digest(t) for n, t in texts.items() if t is not None}


def test_a_big_field_a_batch_leaves_alone_is_neither_read_nor_encoded_nor_written(
    pe: Pe, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = encodings_of_big_texts(monkeypatch)
    assert pe.batch({"value": 1.0}) == [{"count": 1, "total": 1.0}]
    # The first batch reads everything (nothing kept yet) and writes everything.
    assert ("get", "f_ballast") in pe.store.calls and ("update", "f_ballast") in pe.store.calls
    assert encoded == [BALLAST]
    assert_marks_match(pe.store)
    for n in range(2, 5):
        assert pe.batch({"value": float(n)}) == [{"count": n, "total": n * (n + 1) / 2}]
        assert ("get", "f_ballast") not in pe.store.calls
        assert ("update", "f_ballast") not in pe.store.calls
        assert ("update", "f_count") in pe.store.calls  # what changed is written
        assert_marks_match(pe.store)
    assert encoded == [BALLAST]
    # A batch that changes it writes it, with its new digest.
    assert pe.batch({"value": 5.0, "grow": True}) == [{"count": 5, "total": 15.0}]
    assert ("update", "f_ballast") in pe.store.calls and encoded == [BALLAST, BALLAST + 1]
    assert_marks_match(pe.store)
    assert pe.store.texts()["f_ballast"] == json.dumps("b" * BALLAST + "g")


def test_a_kept_instance_is_not_trusted_when_the_stored_state_is_another(pe: Pe) -> None:
    pe.batch({"value": 1.0})
    pe.batch({"value": 2.0})
    before = copy.deepcopy({n: v.value for n, v in pe.store.values.items()})
    pe.batch({"value": 3.0, "grow": True})
    # The store goes back to before that batch (its commit failed: Spark runs it again),
    # while the worker still keeps the instance that processed it.
    for name, value in before.items():
        pe.store.values[name].value = value
    assert pe.batch({"value": 3.0}) == [{"count": 3, "total": 6.0}]
    assert ("get", "f_ballast") in pe.store.calls  # the digests differed: read again
    assert pe.store.texts()["f_ballast"] == json.dumps("b" * BALLAST)
    assert_marks_match(pe.store)


def test_another_worker_reads_the_stored_state(pe: Pe) -> None:
    pe.batch({"value": 1.0}, {"value": 2.0})
    registry().close_all()  # a worker with nothing kept
    assert pe.batch({"value": 3.0}) == [{"count": 3, "total": 6.0}]
    assert ("get", "f_ballast") in pe.store.calls
    assert ("update", "f_ballast") not in pe.store.calls  # read, unchanged, not rewritten
    assert pe.batch({"value": 4.0}) == [{"count": 4, "total": 10.0}]
    assert ("get", "f_ballast") not in pe.store.calls
    assert_marks_match(pe.store)


def test_a_key_whose_every_event_is_a_dead_letter_gets_no_stored_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As if the events never came: bad events of random keys grew the store (and listed
    keys no event was ever processed for) before."""
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options = {"field": "value", "window": 3, "function": "sum"}
    run = f"run{next(_runs)}"

    def batch(store: Store, key: str, *values: Any) -> list[Any]:
        processor = _stateful_processor(
            "window-aggregate", options, "p", "agg", 1 << 20, run=run, gate="", key_by="sensor"
        )
        processor.init(store)
        rows = [(n, n, 1000.0 + n, "src", json.dumps({"sensor": key, "value": v}))
                for n, v in enumerate(values, start=1)]  # fmt: skip
        frame = pd.DataFrame(rows, columns=["origin", "seq", "timestamp", "creator", "body"])
        out = list(processor.handleInputRows(("k:" + key,), iter([frame]), None))
        out = notes_checked(out, store, key)
        return [(b, d) for f in out for b, d in zip(f["body"], f["dead"], strict=True)]

    bad = Store()
    got = batch(bad, "s9", "bad", None)
    assert len(got) == 2 and all(dead is not None for _, dead in got)
    assert {n: t for n, t in bad.texts().items() if t is not None} == {}
    good = Store()
    got = batch(good, "s1", "bad", 2.0)
    assert [json.loads(b) for b, d in got if d is None] == [{"sensor": "s1", "value": 2.0}]
    assert good.texts()["f_values"] == "[2.0]"


def moving_key_batch(
    store: Store, options: dict[str, Any], run: str, *rows: tuple[int, str, dict[str, Any]]
) -> list[pd.DataFrame]:
    """One batch of key ``a`` of a partition whose keys move (``custom`` processor
    ``options``, instances kept per ``run``): each row ``(origin, creator, body)``."""
    processor = _stateful_processor("custom", options, "p", "twin", 1 << 20, run=run,
                                    gate="", key_by="k", movable=True)  # fmt: skip
    processor.init(store)
    store.calls.clear()
    frame = pd.DataFrame(
        [(o, o, 1000.0 + o, creator, json.dumps(body)) for o, creator, body in rows],
        columns=["origin", "seq", "timestamp", "creator", "body"],
    )
    return notes_checked(list(processor.handleInputRows(("k:a",), iter([frame]), None)), store,
                         "a")  # fmt: skip


def counting_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., list[tuple[int, Any, Any]]]:
    """Batches of key ``a`` of a partition whose keys move, running ``CountingStats`` on one
    store (instances kept): each row ``(origin, creator, body)``, the outputs as
    ``(origin, body, dead letter's reason or None)``."""
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options = {"class": "lifecycle_procs:CountingStats", "path": str(HERE),
               "options": {"log": str(tmp_path / "hooks.log")}}  # fmt: skip
    run = f"run{next(_runs)}"
    store = Store()

    def batch(*rows: tuple[int, str, dict[str, Any]]) -> list[tuple[int, Any, Any]]:
        out = moving_key_batch(store, options, run, *rows)
        return [(o, json.loads(b), d) for f in out
                for o, b, d in zip(f["origin"], f["body"], f["dead"], strict=True)]  # fmt: skip

    return batch


def control(detail: dict[str, Any]) -> dict[str, Any]:
    """Key ``a``'s control row body with ``detail``."""
    return {"k": "a", CONTROL_FIELD: detail}


def test_a_moved_state_restore_refuses_is_a_dead_letter_and_the_key_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One record never stops a partition: a key's state that arrives by a key move and
    that the target's ``restore()`` refuses (here: it lacks a declared field, as from a
    processor whose code differs) failed the target's batch at every retry."""
    batch = counting_key(tmp_path, monkeypatch)
    # The key moves in: its events are held until its state comes.
    assert batch((1, KEY_MOVE_IN, control({"move": "m1", "to": 1})),
                 (2, "src", {"k": "a", "value": 5.0})) == []  # fmt: skip
    got = batch((3, KEY_STATE, control({"move": "m1", "state": {"total": "2.0"}})),
                (4, "src", {"k": "a", "value": 1.0}))  # fmt: skip
    dead = [(o, body, reason) for o, body, reason in got if reason is not None]
    assert len(dead) == 1 and dead[0][0] == 3
    assert "is refused" in dead[0][2] and "BadState" in dead[0][2]
    assert dead[0][1] == control({"move": "m1", "state": {"total": "2.0"}})
    # The held event and the next, from no state (as before the state came).
    assert [(o, b) for o, b, r in got if r is None] == [
        (3, {"count": 1, "total": 5.0}),
        (4, {"count": 2, "total": 6.0}),
    ]
    assert batch((5, "src", {"k": "a", "value": 1.0})) == [(5, {"count": 3, "total": 7.0}, None)]
    # Precopied, the state's row names only what changed since the copy: the dead letter
    # holds the whole state (the copy kept aside goes with it).
    got = batch((6, KEY_MOVE_OUT, control({"move": "m2", "to": 0})),
                (7, KEY_COPY_IN, control({"move": "c1", "state": {"total": "4.0"}})),
                (8, KEY_MOVE_IN, control({"move": "m3", "to": 1})),
                (9, KEY_STATE, control({"move": "m3", "state": {}, "base": "c1",
                                        "keep": ["total"]})))  # fmt: skip
    (dead,) = [(body, reason) for _, body, reason in got if reason is not None]
    assert dead[0][CONTROL_FIELD]["state"] == {"total": "4.0"} and "BadState" in dead[1]


def test_a_moved_state_whose_snapshot_cannot_be_encoded_is_a_dead_letter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state that ``restore()`` takes but the processor cannot store again (here a total of
    1e999, which JSON reads as infinity) is refused when it arrives, as one ``restore()``
    refuses: stored, it failed the target's batch at every retry (no event to blame)."""
    batch = counting_key(tmp_path, monkeypatch)
    assert batch((1, KEY_MOVE_IN, control({"move": "m1", "to": 1})),
                 (2, "src", {"k": "a", "value": 5.0})) == []  # fmt: skip
    state = {"count": "1", "total": "1e999"}
    got = batch((3, KEY_STATE, control({"move": "m1", "state": state})))
    dead = [(o, body, reason) for o, body, reason in got if reason is not None]
    assert len(dead) == 1 and dead[0][0] == 3
    assert dead[0][1] == control({"move": "m1", "state": state})
    assert "is refused" in dead[0][2] and "snapshot" in dead[0][2], dead[0][2]
    # The held event from no state, as before the state came; the key goes on.
    assert [(o, b) for o, b, r in got if r is None] == [(3, {"count": 1, "total": 5.0})]
    assert batch((4, "src", {"k": "a", "value": 1.0})) == [(4, {"count": 2, "total": 6.0}, None)]


def test_a_precopied_moved_state_keeping_a_part_not_declared_here_goes_on_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The origin's code declared a part this partition's does not (a redeploy between the
    two): the copy kept aside holds only the declared parts, and a move that names the
    undeclared one as kept is installed without it, as a move without a copy is, not an
    invariant broken at every retry."""
    batch = counting_key(tmp_path, monkeypatch)
    copied = {"count": "2", "total": "4.0", "ballast": '"bbb"'}
    got = batch(
        (1, KEY_COPY_IN, control({"move": "c1", "state": copied})),
        (2, KEY_MOVE_IN, control({"move": "m1", "to": 1})),
        (3, "src", {"k": "a", "value": 1.0}),
        (4, KEY_STATE, control({"move": "m1", "state": {"count": "3"}, "base": "c1",
                                "keep": ["ballast", "total"]})),
    )  # fmt: skip
    assert got == [(4, {"count": 4, "total": 5.0}, None)]


def test_events_held_for_a_key_moving_in_are_appended_never_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key moving in holds its events until its state comes, which may take a restore of
    its origin: each batch appends only its own events (they were one JSON text rewritten
    whole every batch, quadratic in the events held), and the state processes them all, in
    input order, as if they had come after it."""
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options = {"class": "lifecycle_procs:CountingStats", "path": str(HERE),
               "options": {"log": str(tmp_path / "hooks.log")}}  # fmt: skip
    run = f"run{next(_runs)}"
    store = Store()

    def batch(*rows: tuple[int, str, dict[str, Any]]) -> list[tuple[int, Any]]:
        out = moving_key_batch(store, options, run, *rows)
        return [(o, json.loads(b)) for f in out
                for o, b in zip(f["origin"], f["body"], strict=True)]  # fmt: skip

    def event(origin: int, value: float) -> tuple[int, str, dict[str, Any]]:
        return origin, "src", {"k": "a", "value": value}

    assert batch((1, KEY_MOVE_IN, {"k": "a", CONTROL_FIELD: {"move": "m1", "to": 1}}),
                 event(2, 1.0)) == []  # fmt: skip
    held = store.texts()["held"]
    assert held is not None and json.loads(held) == {"move": "m1"}
    values = [1.0]
    for first in range(3, 30, 3):
        assert batch(event(first, first), event(first + 1, 0.5)) == []
        values += [first, 0.5]
        # One append of this batch's two events; nothing read, nothing rewritten.
        assert store.calls == [("get", "held"), ("appendList", "held_events")]
    assert len(store.lists["held_events"].items) == len(values) == 19
    # The state comes (5 events before the move, total 10): the held events from it, in order.
    got = batch((40, KEY_STATE, {"k": "a", CONTROL_FIELD: {
        "move": "m1", "state": {"count": "5", "total": "10.0"}}}),
                event(41, 2.0))  # fmt: skip
    count, total, expected = 5, 10.0, []
    for value in [*values, 2.0]:
        count, total = count + 1, total + value
        expected.append({"count": count, "total": total})
    assert [b for _, b in got] == expected
    assert [o for o, _ in got] == [40] * len(values) + [41]  # at the state's place
    assert store.lists["held_events"].items == [] and store.texts()["held"] is None
    assert batch(event(42, 1.0)) == [(42, {"count": count + 1, "total": total + 1.0})]
    assert ("appendList", "held_events") not in store.calls


def test_events_held_inline_as_stored_before_the_list_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint from before the list holds a key's held events inside ``held``: they
    are moved to the list and processed first when the state comes."""
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options = {"class": "lifecycle_procs:CountingStats", "path": str(HERE),
               "options": {"log": str(tmp_path / "hooks.log")}}  # fmt: skip
    store = Store()
    old = [[2, 2, 1002.0, "src", json.dumps({"k": "a", "value": 3.0})]]
    store.getValueState("held", "json string").value = json.dumps({"move": "m1", "events": old})
    run = f"run{next(_runs)}"

    def batch(*rows: tuple[int, str, dict[str, Any]]) -> list[Any]:
        return [json.loads(b) for f in moving_key_batch(store, options, run, *rows)
                for b in f["body"]]  # fmt: skip

    assert batch((3, "src", {"k": "a", "value": 1.0})) == []
    assert json.loads(store.texts()["held"] or "null") == {"move": "m1"}
    assert [row[4] for row in store.lists["held_events"].items] == [
        old[0][4], json.dumps({"k": "a", "value": 1.0})
    ]  # fmt: skip
    got = batch((4, KEY_STATE, {"k": "a", CONTROL_FIELD: {"move": "m1", "state": {}}}))
    assert got == [{"count": 1, "total": 3.0}, {"count": 2, "total": 4.0}]


def test_held_events_around_a_state_in_one_batch_keep_the_input_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move in, its events and its state in one batch; events held earlier, then more
    in the state's batch before its row; a move in again drops what the earlier one held
    (the orchestrator refuses a move of a key still waiting, so none is ever lost so)."""
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options = {"class": "lifecycle_procs:CountingStats", "path": str(HERE),
               "options": {"log": str(tmp_path / "hooks.log")}}  # fmt: skip
    store, run = Store(), f"run{next(_runs)}"

    def batch(*rows: tuple[int, str, dict[str, Any]]) -> list[tuple[int, float]]:
        # (A move out's state record is for its target; a dead letter fails the test.)
        return [(o, json.loads(b)["total"]) for f in moving_key_batch(store, options, run, *rows)
                for o, b, c, d in zip(f["origin"], f["body"], f["creator"], f["dead"], strict=True)
                if c != KEY_STATE or d is not None]  # fmt: skip

    def event(value: float) -> dict[str, Any]:
        return {"k": "a", "value": value}

    # All in one batch: nothing stored in the list, the events after the state as usual.
    got = batch((1, KEY_MOVE_IN, control({"move": "m1", "to": 1})), (2, "src", event(1.0)),
                (3, KEY_STATE, control({"move": "m1", "state": {"count": "1", "total": "10.0"}})),
                (4, "src", event(2.0)))  # fmt: skip
    assert got == [(3, 11.0), (4, 13.0)]
    assert store.lists.get("held_events") is None or store.lists["held_events"].items == []
    # Held over two batches, the state's own batch holding more before its row.
    assert batch((5, KEY_MOVE_OUT, control({"move": "m2", "to": 0})),
                 (6, KEY_MOVE_IN, control({"move": "m3", "to": 1})),
                 (7, "src", event(1.0))) == []  # fmt: skip
    assert batch((8, "src", event(2.0)), (9, KEY_STATE, control({
        "move": "m3", "state": {"count": "1", "total": "100.0"}})), (10, "src", event(4.0))) == [
        (9, 101.0), (9, 103.0), (10, 107.0)
    ]  # fmt: skip
    assert store.lists["held_events"].items == []
    # A second move in while the first still waits: the first's events are dropped.
    assert batch((11, KEY_MOVE_OUT, control({"move": "m4", "to": 0})),
                 (12, KEY_MOVE_IN, control({"move": "m5", "to": 1})),
                 (13, "src", event(1.0))) == []  # fmt: skip
    assert batch((14, KEY_MOVE_IN, control({"move": "m6", "to": 1})),
                 (15, "src", event(5.0))) == []  # fmt: skip
    assert [row[4] for row in store.lists["held_events"].items] == [json.dumps(event(5.0))]
    assert batch(
        (16, KEY_STATE, control({"move": "m6", "state": {"count": "0", "total": "0.0"}}))
    ) == [(16, 5.0)]


def ballasted_options(tmp_path: Path) -> dict[str, Any]:
    return {"class": "lifecycle_procs:Ballasted", "path": str(HERE),
            "options": {"log": str(tmp_path / "hooks.log"), "ballast_bytes": BALLAST}}  # fmt: skip


def assert_part_marks_match(store: Store) -> None:
    """A keyed PE's stored digests are those of its large parts, and of no other."""
    texts = store.texts()
    marks = json.loads(texts.pop("part_marks", None) or "{}")
    large = {n[2:]: t for n, t in texts.items() if n.startswith("f_") and t is not None}
    assert marks == {n: state_digest(t) for n, t in large.items() if len(t) >= LARGE_PART_BYTES}


def keyed_events(store: Store, options: dict[str, Any], run: str, *values: Any) -> list[Any]:
    """One batch of events of key ``a`` (``{"k": "a", **value}`` each) of a keyed PE whose
    keys do not move (``custom`` processor ``options``, instances kept per ``run``)."""
    processor = _stateful_processor(
        "custom", options, "p", "twin", 1 << 20, run=run, gate="", key_by="k"
    )
    processor.init(store)
    store.calls.clear()
    frame = pd.DataFrame(
        [(n, n, 1000.0 + n, "src", json.dumps({"k": "a", **v}))
         for n, v in enumerate(values, start=1)],
        columns=["origin", "seq", "timestamp", "creator", "body"],
    )  # fmt: skip
    out = notes_checked(list(processor.handleInputRows(("k:a",), iter([frame]), None)), store, "a")
    return [json.loads(b) for f in out for b in f["body"]]


def test_a_keys_big_field_a_batch_leaves_alone_is_neither_read_nor_encoded_nor_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an unkeyed PE's (above): a key's large part that a batch does not change is taken
    from what the worker kept, by its stored digest (1 MiB cost ~14 ms a key and batch)."""
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    encoded = encodings_of_big_texts(monkeypatch)
    options, run, store = ballasted_options(tmp_path), f"run{next(_runs)}", Store()
    assert keyed_events(store, options, run, {"value": 1.0}) == [{"count": 1, "total": 1.0}]
    assert ("update", "f_ballast") in store.calls and encoded == [BALLAST]
    assert_part_marks_match(store)
    assert json.loads(store.texts()["part_marks"] or "{}").keys() == {"ballast"}
    for n in range(2, 5):
        got = keyed_events(store, options, run, {"value": float(n)})
        assert got == [{"count": n, "total": n * (n + 1) / 2}]
        assert ("get", "f_ballast") not in store.calls
        assert ("update", "f_ballast") not in store.calls
        assert ("update", "f_count") in store.calls and ("get", "f_count") in store.calls
        assert ("update", "part_marks") not in store.calls  # (the small parts have none)
        assert_part_marks_match(store)
    assert encoded == [BALLAST]  # neither decoded nor encoded again
    got = keyed_events(store, options, run, {"value": 5.0, "grow": True})
    assert got == [{"count": 5, "total": 15.0}]
    assert ("update", "f_ballast") in store.calls and ("update", "part_marks") in store.calls
    assert encoded == [BALLAST, BALLAST + 1]
    assert_part_marks_match(store)
    assert keyed_events(store, options, run, {"value": 6.0}) == [{"count": 6, "total": 21.0}]
    assert ("get", "f_ballast") not in store.calls and encoded == [BALLAST, BALLAST + 1]


def test_a_kept_key_part_is_not_trusted_when_the_stored_one_is_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options, run, store = ballasted_options(tmp_path), f"run{next(_runs)}", Store()
    keyed_events(store, options, run, {"value": 1.0})
    before = copy.deepcopy({n: v.value for n, v in store.values.items()})
    keyed_events(store, options, run, {"value": 2.0, "grow": True})
    # The store goes back to before that batch (its commit failed: Spark runs it again),
    # while the worker keeps the grown text it wrote.
    for name, value in before.items():
        store.values[name].value = value
    assert keyed_events(store, options, run, {"value": 2.0}) == [{"count": 2, "total": 3.0}]
    assert ("get", "f_ballast") in store.calls  # the digests differed: read again
    assert store.texts()["f_ballast"] == json.dumps("b" * BALLAST)
    assert_part_marks_match(store)
    # Another worker changed it meanwhile (here: behind this one's back).
    other = json.dumps("b" * BALLAST + "x")
    store.values["f_ballast"].value = other
    store.values["part_marks"].value = json.dumps({"ballast": state_digest(other)})
    assert keyed_events(store, options, run, {"value": 3.0}) == [{"count": 3, "total": 6.0}]
    assert ("get", "f_ballast") in store.calls and ("update", "f_ballast") not in store.calls
    assert store.texts()["f_ballast"] == other
    # A worker that kept nothing reads it, and rewrites neither it nor its digest.
    key_parts.cache().clear()
    assert keyed_events(store, options, run, {"value": 4.0}) == [{"count": 4, "total": 10.0}]
    assert ("get", "f_ballast") in store.calls and ("get", "part_marks") in store.calls
    assert not {c for c in store.calls if c[0] == "update"} & {
        ("update", "f_ballast"),
        ("update", "part_marks"),
    }
    assert_part_marks_match(store)


@pytest.mark.parametrize(
    "stored",
    [
        # As a checkpoint made before the digests holds the key: parts, no `part_marks`.
        None,
        # Digests of a field the PE no longer declares, of a part an older fogshift made
        # small, and a stale one of the large part (an older fogshift changed it: a
        # downgrade, then this fogshift again).
        {"count": state_digest("1"), "gone": "0" * 32, "ballast": state_digest("x")},
    ],
    ids=["none", "stale"],
)
def test_stored_digests_that_are_not_the_large_parts_are_set_right_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stored: dict[str, str] | None
) -> None:
    # A worker keeping nothing reads the parts, and stores the digests of what it read.
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options, run, store = ballasted_options(tmp_path), f"run{next(_runs)}", Store()
    keyed_events(store, options, run, {"value": 1.0})
    changed = json.dumps("b" * BALLAST + "older")
    store.values["f_ballast"].value = changed
    store.values["part_marks"].value = None if stored is None else json.dumps(stored)
    key_parts.cache().clear()
    assert keyed_events(store, options, run, {"value": 2.0}) == [{"count": 2, "total": 3.0}]
    assert ("update", "part_marks") in store.calls and ("update", "f_ballast") not in store.calls
    assert_part_marks_match(store)
    assert store.texts()["f_ballast"] == changed
    assert keyed_events(store, options, run, {"value": 3.0}) == [{"count": 3, "total": 6.0}]
    assert ("get", "f_ballast") not in store.calls


def test_a_key_moving_out_and_in_keeps_its_digests_in_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options, run, store = ballasted_options(tmp_path), f"run{next(_runs)}", Store()

    keyed_events(store, options, run, {"value": 1.0})
    out = moving_key_batch(store, options, run, (2, KEY_MOVE_OUT, control({"move": "m1", "to": 0})))
    (sent,) = [json.loads(b) for f in out for b in f["body"]]
    assert sent["state"]["ballast"] == json.dumps("b" * BALLAST)  # the kept text, sent
    assert ("get", "f_ballast") not in store.calls
    assert {n: t for n, t in store.texts().items() if t is not None and n != "copied"} == {}
    # It comes back with another state: stored with its digest, then kept.
    state = {"count": "7", "total": "70.0", "ballast": json.dumps("c" * BALLAST)}
    got = moving_key_batch(store, options, run, (3, KEY_MOVE_IN, control({"move": "m2", "to": 1})),
                           (4, KEY_STATE, control({"move": "m2", "state": state})),
                           (5, "src", {"k": "a", "value": 1.0}))  # fmt: skip
    assert [json.loads(b) for f in got for b in f["body"]] == [{"count": 8, "total": 71.0}]
    assert_part_marks_match(store)
    assert keyed_events(store, options, run, {"value": 2.0}) == [{"count": 9, "total": 73.0}]
    assert ("get", "f_ballast") not in store.calls
    assert store.texts()["f_ballast"] == json.dumps("c" * BALLAST)
