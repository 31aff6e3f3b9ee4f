"""Event encoding: cells that are not finite numbers stay text; records are measured as the
writer encodes them, and a dead letter is cut to fit."""

from __future__ import annotations

import json
import sys

import pytest

from fogshift.events import (
    DEFAULT_MAX_RECORD_BYTES,
    MAX_REASON_CHARS,
    Event,
    dump_body,
    fit_dead_letter,
    oversize,
    parse_value,
    record_payload,
)


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("1e999", "1e999"),
        ("-1e999", "-1e999"),
        ("1E400", "1E400"),
        ("1e-999", 0.0),
        ("12", 12),
        (" 2.5 ", 2.5),
        ("nan", "nan"),
        ("9" * (sys.get_int_max_str_digits() + 1), "9" * (sys.get_int_max_str_digits() + 1)),
    ],
)
def test_parse_value_keeps_what_is_not_a_finite_number_as_text(cell: str, expected: object) -> None:
    value = parse_value(cell)
    assert value == expected and type(value) is type(expected)
    dump_body({"v": value})  # whatever a cell holds, its body can be encoded


def test_the_default_record_limit_leaves_room_for_headers_under_nats_max_payload() -> None:
    assert 1024 * 1024 - 64 * 1024 <= DEFAULT_MAX_RECORD_BYTES < 1024 * 1024


@pytest.mark.parametrize("text", ["plain", "é" * 50, "\U0001f600" * 50, '"\\' * 40])
def test_oversize_is_exact_around_the_limit(text: str) -> None:
    size = len(record_payload(1, 2.5, "pe", text, "why"))
    assert oversize(1, 2.5, "pe", text, "why", size) is None
    assert oversize(1, 2.5, "pe", text, "why", size - 1) == size


@pytest.mark.parametrize("unit", ["x", "é", "\U0001f600", '"'])
@pytest.mark.parametrize("limit", [1000, 5000])
def test_a_dead_letter_is_cut_to_the_limit_and_says_so(unit: str, limit: int) -> None:
    body = json.dumps({"line": unit * 5000})
    cut, reason = fit_dead_letter(3, 1.0, "pe", body, "r" * 5000, limit)
    assert len(reason) <= MAX_REASON_CHARS and reason.endswith("[reason cut]")
    assert oversize(3, 1.0, "pe", cut, reason, limit) is None
    # As much of the input as fits: one more character would not.
    kept = cut[: cut.index(" ...[cut: ")]
    assert body.startswith(kept) and f"[cut: {len(body)} characters in all]" in cut
    assert len(kept) > 0
    longer = body[: len(kept) + 1] + cut[len(kept) :]
    assert oversize(3, 1.0, "pe", longer, reason, limit) is not None


def test_a_dead_letter_that_fits_is_left_alone() -> None:
    assert fit_dead_letter(1, 1.0, "pe", '{"a":1}', "bad", 1000) == ('{"a":1}', "bad")


@pytest.mark.parametrize(
    "body", [{1: "a", "1": "b"}, {None: 1, "null": 2}, {"a": 0, 2.5: 1, "2.5": 2}]
)
def test_fields_that_json_names_alike_are_refused(body: dict) -> None:
    # Written as {"1":"a","1":"b"}: a reader keeps only the last, so the event was read
    # otherwise than it was written.
    with pytest.raises(ValueError, match="twice as JSON names them"):
        dump_body(body)
    assert dump_body({1: "a", 2: "b"}) == '{"1":"a","2":"b"}'  # (distinct: written)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"a": {1: "x", "1": "y"}}, "/a"),
        ({"a": [{"b": {None: 1, "null": 2}}]}, "/a/0/b"),
        ({"a": ({"ok": 1}, {True: 1, "true": 2})}, "/a/1"),
        ({7: {2.5: 0, "2.5": 1}}, "/7"),
    ],
)
def test_nested_fields_that_json_names_alike_are_refused_and_located(
    body: dict, where: str
) -> None:
    # Nested objects are read back the same way: the last of two alike names wins.
    with pytest.raises(ValueError, match="twice as JSON names them") as refused:
        dump_body(body)
    assert str(refused.value).endswith(f"(in the object at {where})")
    assert json.loads(dump_body({"a": {1: "x", 2: "y"}, "s": "{1}"})) == {
        "a": {"1": "x", "2": "y"},
        "s": "{1}",
    }


def test_a_deeply_nested_body_is_checked_at_every_depth() -> None:
    deep: dict = {}
    inner = deep
    for _ in range(600):
        inner["k"] = {}
        inner = inner["k"]
    inner.update({1: 0, "1": 1})
    with pytest.raises(ValueError, match='fields named "1" twice'):
        dump_body(deep)


def test_an_output_with_fields_named_alike_is_a_dead_letter() -> None:
    from fogshift.runtime.api import Processor
    from fogshift.runtime.batch import run_events

    class Twice(Processor):
        def process(self, event: Event) -> dict:
            if event.seq == 4:
                return {"v": [{1: "a", "1": "b"}]}
            return {1: "a", "1": "b"} if event.seq == 2 else {"v": event.seq}

    rows = [(k, k, 0.0, "src", json.dumps({"v": k})) for k in (1, 2, 3, 4)]
    records = list(run_events(Twice.build({}, "t", None), rows))
    reasons = {r[2]: r[6] for r in records}
    assert reasons[1] is None and reasons[3] is None
    assert 'cannot be encoded (ValueError: fields named "1" twice' in (reasons[2] or "")
    assert 'named "1" twice as JSON names them (in the object at /v/0)' in (reasons[4] or "")
