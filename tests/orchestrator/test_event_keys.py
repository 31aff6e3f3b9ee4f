"""Which events of a keyed PE belong to a key (``GET .../events?key=``): the key as the
runtime groups by it, the field's value as text."""

from __future__ import annotations

import pytest

from fogshift.orchestrator.deployment import _key_text


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"patient": "p01", "t": 0.5}, "p01"),
        ({"patient": 7}, "7"),  # Spark's get_json_object gives a number's JSON text
        ({"patient": 2.5}, "2.5"),
        ({"patient": True}, "true"),
        ({"patient": None}, None),  # no key: such events were dead letters, never output
        ({"other": "p01"}, None),
        ("not an object", None),
    ],
)
def test_the_key_of_an_output_body(body: object, key: str | None) -> None:
    assert _key_text(body, "patient") == key


def test_an_unkeyed_pe_has_no_key() -> None:
    assert _key_text({"patient": "p01"}, None) is None
