"""The independent reference and the comparison."""

from __future__ import annotations

from pathlib import Path

from fogshift.verify.reference import case1_reference, compare


def test_reference_drops_invalid_rows_and_aggregates_by_hand(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("value,name\n1,a\n3,b\nx,c\n5\n8,d\ninf,e\n")
    ref = case1_reference(data, "value", 2, "avg")
    assert ref.rows == [(1, 1.0), (2, 2.0), (5, 5.5)]
    assert ref.dropped == 3
    assert case1_reference(data, "value", 5, "max").rows == [(1, 1.0), (2, 3.0), (5, 8.0)]
    assert case1_reference(data, "value", 2, "count").rows == [(1, 1.0), (2, 2.0), (5, 2.0)]


def test_keyed_reference_keeps_a_window_per_key(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("value,name\n1,a\n3,b\nx,a\n5,a\n8,b\n2,a\n")
    ref = case1_reference(data, "value", 2, "avg", key_field="name")
    # a: 1, 5, 2 -> 1, 3, 3.5; b: 3, 8 -> 3, 5.5; the bad row of a is dropped.
    assert ref.rows == [(1, 1.0), (2, 3.0), (4, 3.0), (5, 5.5), (6, 3.5)]
    assert ref.dropped == 1


def test_compare_finds_loss_duplicates_order_and_values() -> None:
    ref = [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert compare(ref, list(ref)).consistent
    assert compare(ref, [(1, 1.0), (2, 2.0 + 1e-13), (3, 3.0)]).consistent
    assert "missing" in compare(ref, ref[:2]).problems[0]
    assert "more than once" in compare(ref, [*ref, (3, 3.0)]).problems[0]
    assert "order" in compare(ref, [(2, 2.0), (1, 1.0), (3, 3.0)]).problems[0]
    assert "value" in compare(ref, [(1, 1.0), (2, 2.5), (3, 3.0)]).problems[0]
