"""Event encoding: cells that are not finite numbers stay text; records are measured as the
writer encodes them, and a dead letter is cut to fit."""

from __future__ import annotations

import json
import sys

import pytest

from fogshift.events import (
    DEFAULT_MAX_RECORD_BYTES,
    MAX_REASON_CHARS,
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
