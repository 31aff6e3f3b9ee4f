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


def test_rows_are_numbered_by_newlines_only_as_the_source_numbers_them(tmp_path: Path) -> None:
    # str.splitlines broke rows at U+2028, a form feed or a lone \r (ordinary characters to
    # the csv-source): every later seq shifted and an honest run was called inconsistent;
    # a byte that is not UTF-8 made the reference fail instead of dropping its row.
    data = tmp_path / "in.csv"
    data.write_bytes("timestamp,sensor,value\n1,s1,1.0\n2,s2\u2028x,2.0\n3,s\f3,3.0\r\n".encode()
                     + b"4,s\xff,4.0\n5,s1\rq,5.0\n6,s1,6.0\n")  # fmt: skip
    ref = case1_reference(data, "value", 2, "sum")
    assert ref.rows == [(1, 1.0), (2, 3.0), (3, 5.0), (6, 9.0)]
    assert ref.dropped == 2  # row 4 is not UTF-8, row 5 cannot be read as CSV (its \r)


def test_a_keyed_comparison_fails_on_rows_whose_key_is_unknown(tmp_path: Path) -> None:
    # An unclosed quote made the csv module read several lines as one row: those seqs had
    # no key, and their expected rows were compared by nobody (lost rows passed).
    from fogshift.verify.reference import compare_per_key, keys_by_seq

    data = tmp_path / "in.csv"
    data.write_text('timestamp,sensor,value\n1,s1,1.0\n2,s2,"2.0\n3,s1,3.0\n4,s2,4.0\n')
    key_of = keys_by_seq(data, "sensor")
    # (Row 2 itself cannot be read, as the csv-source reads it: a dead letter there.)
    assert key_of == {1: "s1", 3: "s1", 4: "s2"}
    expected = [(1, 1.0), (3, 3.0), (4, 4.0)]
    assert compare_per_key(expected, expected, key_of).consistent
    assert not compare_per_key(expected, expected[:1], key_of).consistent
    verdict = compare_per_key(expected, expected, {1: "s1"})
    assert not verdict.consistent
    assert any("2 expected seq of no known key" in p for p in verdict.problems), verdict


def test_windows_are_summed_exactly_as_the_window_pe_sums(tmp_path: Path) -> None:
    # pandas' rolling sum kept a running total: 0.625 where the exact sum is 0.6, and a
    # correct output was judged wrong.
    data = tmp_path / "in.csv"
    data.write_text("v\n1e15\n-1e15\n0.1\n0.2\n0.3\n")
    assert case1_reference(data, "v", 3, "sum").rows[-1] == (5, 0.6)
    assert case1_reference(data, "v", 3, "avg").rows[-1] == (5, 0.6 / 3)


def test_keys_and_columns_are_read_as_the_source_and_a_keyed_pe_read_them(
    tmp_path: Path,
) -> None:
    data = tmp_path / "in.csv"
    # "01" and "1" are one key (the number 1), " a" and "a" two; a decimal key is refused
    # (a dead letter); of a column named twice the body holds the last cell.
    data.write_text('k,v,v\n1,0,1\n01,0,2\n1,0,3\n" a",0,4\na,0,5\n1.5,0,6\n')
    ref = case1_reference(data, "v", 10, "sum", key_field="k")
    assert ref.rows == [(1, 1.0), (2, 3.0), (3, 6.0), (4, 4.0), (5, 5.0)]
    assert ref.dropped == 1
    # A key column the header lacks: every row is keyless, a dead letter.
    assert case1_reference(data, "v", 10, "sum", key_field="nope").rows == []
