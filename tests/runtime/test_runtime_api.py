"""The PE developer API and the built-in processors, as pure logic."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from fogshift.events import Event, parse_value
from fogshift.runtime.api import Processor, state
from fogshift.runtime.batch import run_events
from fogshift.runtime.exceptions import BadState, DeadLetter
from fogshift.runtime.kinds import processor_for
from fogshift.runtime.operators.expr import Filter, Map
from fogshift.runtime.operators.window import WindowAggregate


class Counter(Processor):
    count: int = state(0)
    seen: list[int] = state(default_factory=list)

    def process(self, event: Event) -> dict:
        if event.body.get("bad"):
            raise DeadLetter("bad flag set")
        self.count += 1
        self.seen.append(event.seq)
        return {"count": self.count}


def ev(seq: int, **body: object) -> Event:
    return Event(seq, 1000.0 + seq, "source", dict(body))


def test_declared_state_snapshot_and_restore_round_trip() -> None:
    first = Counter.build({}, "c", None)
    assert Counter.is_stateful()
    for k in range(1, 4):
        first.process(ev(k))
    snap = json.loads(first.dump_state())
    assert snap == {"count": 3, "seen": [1, 2, 3]}
    second = Counter.build({}, "c", snap)
    assert second.process(ev(4)) == {"count": 4}
    # Fresh instances never share mutable defaults.
    assert Counter.build({}, "c", None).seen == []


def test_restore_refuses_a_snapshot_of_another_shape() -> None:
    with pytest.raises(BadState) as err:
        Counter.build({}, "c", {"count": 1})
    assert err.value.expected == "count, seen"
    assert err.value.received == "count"


def test_a_field_added_to_a_class_since_takes_its_initial_value_from_an_older_snapshot() -> None:
    # A running pipeline restored after an upgrade that added a field to its PE: every
    # checkpoint and key's stored state lacked it, and each restore was refused.
    class Later(Counter):
        last: int | None = state(None, added=True)
        marks: list[int] = state(default_factory=list, added=True)

    restored = Later.build({}, "c", {"count": 2, "seen": [1, 2]})
    assert (restored.count, restored.seen, restored.last, restored.marks) == (2, [1, 2], None, [])
    assert Later.build({}, "c", {"count": 2, "seen": [], "last": 7, "marks": [1]}).last == 7
    # A field not declared added, lacking, or an unknown one: refused as ever.
    with pytest.raises(BadState, match="does not match"):
        Later.build({}, "c", {"count": 2, "last": 7})
    with pytest.raises(BadState, match="does not match"):
        Later.build({}, "c", {"count": 2, "seen": [], "other": 1})


def test_state_needs_a_default() -> None:
    with pytest.raises(TypeError):
        state()


def window(function: str, size: int) -> WindowAggregate:
    proc = WindowAggregate.build({"field": "v", "window": size, "function": function}, "agg", None)
    assert isinstance(proc, WindowAggregate)
    return proc


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        ("avg", [1.0, 1.5, 2.0, 3.0, 4.0]),
        ("sum", [1.0, 3.0, 6.0, 9.0, 12.0]),
        ("min", [1, 1, 1, 2, 3]),
        ("max", [1, 2, 3, 4, 5]),
        ("count", [1, 2, 3, 3, 3]),
    ],
)
def test_window_aggregate_over_last_three(function: str, expected: list[float]) -> None:
    proc = window(function, 3)
    assert [proc.process(ev(k, v=k))["v"] for k in range(1, 6)] == expected


@pytest.mark.parametrize("value", ["n/a", None, math.nan, math.inf, True, "3"])
def test_invalid_values_are_dead_letters_and_leave_the_window_alone(value: object) -> None:
    proc = window("sum", 2)
    proc.process(ev(1, v=5))
    with pytest.raises(DeadLetter, match="not a finite number"):
        proc.process(ev(2, v=value))
    assert proc.values == [5]
    with pytest.raises(DeadLetter, match="missing"):
        proc.process(ev(3, w=1))
    assert proc.process(ev(4, v=1)) == {"v": 6.0}


def test_extreme_values_average_or_are_dead_letters_alike_for_every_function() -> None:
    # Two of 1e308 average 1e308 (the sum overflowed: the second was a dead letter).
    avg = window("avg", 2)
    assert [avg.process(ev(k, v=1e308))["v"] for k in (1, 2)] == [1e308, 1e308]
    # An integer beyond a float's range: no aggregate of it is a number (sum and avg
    # overflowed, min and max emitted it): a dead letter for each, the window as before.
    for function in ("avg", "sum", "min", "max", "count"):
        proc = window(function, 2)
        proc.process(ev(1, v=5))
        with pytest.raises(DeadLetter, match="beyond a float's range"):
            proc.process(ev(2, v=10**309))
        assert proc.values == [5]


def test_map_and_filter() -> None:
    m = Map.build({"set": {"double": "v * 2", "big": "v > 2"}}, "m", None)
    assert m.process(ev(1, v=3)) == {"v": 3, "double": 6, "big": True}
    only = Map.build({"set": {"double": "v * 2"}, "keep": False}, "m", None)
    assert only.process(ev(1, v=3)) == {"double": 6}
    with pytest.raises(DeadLetter, match="expression 'v \\* 2' failed"):
        m.process(ev(2, w=1))
    f = Filter.build({"where": "v >= 2 and seq % 2 == 0"}, "f", None)
    assert f.process(ev(2, v=3)) == {"v": 3}
    assert f.process(ev(3, v=3)) is None
    assert not Map.is_stateful()


def test_expressions_cannot_reach_python() -> None:
    # No attribute: simpleeval 1.0 allows method calls, and `name.ljust(w)` built a string
    # as wide as an event said (the worker could be killed for memory at every retry).
    for text in ("().__class__", "name.ljust(w)", "str(w).zfill(w)"):
        with pytest.raises(ValueError, match="reads an attribute"):
            Map.build({"set": {"x": text}}, "m", None)
    with pytest.raises(ValueError, match="format spec"):
        Map.build({"set": {"x": "f'{name:>{w}}'"}}, "m", None)
    # Nor % formatting of a text: a dead letter; % of numbers as ever.
    m = Map.build({"set": {"x": "'%*s' % (w, name)", "r": "w % 7"}}, "m", None)
    with pytest.raises(DeadLetter, match="% formats no text"):
        m.process(ev(1, w=5_000_000, name="a"))
    assert Map.build({"set": {"r": "w % 7"}}, "m", None).process(ev(1, w=9))["r"] == 2


def test_no_event_value_makes_an_expression_run_for_minutes() -> None:
    # round(x, d) of an integer computes 10 ** -d, and an integer power of millions of
    # digits took minutes: the query processed nothing meanwhile, and nothing was raised.
    m = Map.build({"set": {"r": "round(x, d)"}}, "m", None)
    started = time.monotonic()
    assert m.process(ev(1, x=5, d=-(10**9)))["r"] == 0
    assert m.process(ev(2, x=-1234, d=-(10**12)))["r"] == 0
    assert m.process(ev(3, x=1234, d=-2))["r"] == 1200  # as Python rounds
    assert m.process(ev(4, x=2.675, d=-(10**9)))["r"] == 0.0
    p = Map.build({"set": {"p": "b ** e"}}, "m", None)
    with pytest.raises(DeadLetter, match="digits"):
        p.process(ev(5, b=3_999_999, e=3_999_999))
    with pytest.raises(DeadLetter, match="digits"):
        p.process(ev(6, b=-2, e=100_000))
    assert time.monotonic() - started < 5
    assert p.process(ev(7, b=2, e=10))["p"] == 1024
    assert p.process(ev(8, b=2.0, e=0.5))["p"] == pytest.approx(2**0.5)
    assert p.process(ev(9, b=1, e=3_999_999))["p"] == 1


def test_run_events_turns_bad_input_into_dead_letters() -> None:
    proc = Counter.build({}, "c", None)
    rows = [
        (1, 1, 1.0, "src", json.dumps({"a": 1})),
        (2, 2, 2.0, "src", "{not json"),
        (3, 3, 3.0, "src", json.dumps({"bad": True})),
        (4, 4, 4.0, "src", json.dumps({"a": 2})),
    ]
    out = list(run_events(proc, rows))
    assert [(r[0], r[1], r[6] is None) for r in out] == [
        (1, 0, True),
        (2, 0, False),
        (3, 0, False),
        (4, 0, True),
    ]
    assert out[2][6] == "bad flag set"
    assert out[1][5] == "{not json"  # the input is kept as received
    assert json.loads(out[3][5]) == {"count": 2}


def test_processor_for_custom_classes() -> None:
    cls, opts = processor_for("window-aggregate", {"field": "v", "window": 1})
    assert cls is WindowAggregate and opts == {"field": "v", "window": 1}
    cls, opts = processor_for(
        "custom", {"class": "tests.runtime.test_runtime_api:Counter", "options": {"k": 1}}
    )
    assert cls.__name__ == "Counter" and opts == {"k": 1}


def test_parse_value() -> None:
    assert parse_value("12") == 12
    assert parse_value(" -1.5e3 ") == -1500.0
    assert parse_value("nan") == "nan"
    assert parse_value("inf") == "inf"
    assert parse_value("abc") == "abc"


def test_a_processor_fixed_after_it_failed_is_imported_anew(tmp_path: Path) -> None:
    # The agent imported the module once: deployed again after its file was fixed, the PE
    # ran the old code and gave up the same way until the agent was restarted.
    import os
    import sys

    from fogshift.runtime.kinds import load_class

    name = f"fixedproc_{tmp_path.name.replace('-', '_')}"
    source = tmp_path / f"{name}.py"

    def write(version: int) -> None:
        source.write_text(
            "from fogshift.runtime.api import Processor\n"
            f"class Proc(Processor):\n    VERSION = {version}\n"
            "    def process(self, event):\n        return None\n"
        )
        os.utime(source, ns=(version * 10**9, version * 10**9))  # (a newer file, surely)

    write(1)
    try:
        first = load_class(f"{name}:Proc", str(tmp_path))
        assert first.VERSION == 1  # type: ignore[attr-defined]
        assert load_class(f"{name}:Proc", str(tmp_path)) is first  # unchanged: the same
        write(2)
        assert load_class(f"{name}:Proc", str(tmp_path)).VERSION == 2  # type: ignore[attr-defined]
    finally:
        sys.modules.pop(name, None)
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


def test_a_second_folders_module_of_a_name_already_imported_is_refused(tmp_path: Path) -> None:
    # Two pipelines' `{class: revproc:Proc, path: /a}` and `{..., path: /b}` on one node: the
    # second ran the first's code (a process imports a module name once).
    import sys

    from fogshift.runtime.exceptions import ElementError
    from fogshift.runtime.kinds import load_class

    name = f"revproc_{tmp_path.name.replace('-', '_')}"
    for folder, total in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{name}.py").write_text(
            "from fogshift.runtime.api import Processor\n"
            f"class Proc(Processor):\n    TOTAL = {total}\n"
            "    def process(self, event):\n        return None\n"
        )
    try:
        first = load_class(f"{name}:Proc", str(tmp_path / "a"))
        assert first.TOTAL == 1  # type: ignore[attr-defined]
        assert load_class(f"{name}:Proc", str(tmp_path / "a")) is first
        with pytest.raises(ElementError, match="a node imports a module name once"):
            load_class(f"{name}:Proc", str(tmp_path / "b"))
    finally:
        sys.modules.pop(name, None)
        for folder in ("a", "b"):
            if str(tmp_path / folder) in sys.path:
                sys.path.remove(str(tmp_path / folder))
