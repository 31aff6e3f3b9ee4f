"""The csv-source's line index and reader: they agree on where rows are, whatever the bytes,
and a row that cannot be an event is a dead letter, never a failed batch."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from fogshift.events import oversize
from fogshift.runtime.csv_io import CsvSourceReader, LineIndex


def reader(path: Path, **options: Any) -> CsvSourceReader:
    return CsvSourceReader(
        {"path": str(path), "pe": "src", "rate": "0", **{k: str(v) for k, v in options.items()}}
    )


def next_batch(source: CsvSourceReader, start: dict[str, Any]) -> tuple[dict[str, Any], list]:
    """Plan and read one batch from ``start``, as Spark does: ``(end offset, rows)``."""
    end = source.latestOffset(start, source.getDefaultReadLimit())
    rows = [r for p in source.partitions(start, end) for r in source.read(p)]
    return end, rows


def fits(record: tuple, limit: int) -> bool:
    """Whether a record is within ``limit`` bytes as the writer encodes it."""
    _, _, seq, timestamp, creator, body, reason = record
    return oversize(seq, timestamp, creator, body, reason, limit) is None


def rows_of(tmp_path: Path, content: bytes) -> list[tuple]:
    """The rows one batch reads of a file ``in.csv`` holding ``content``."""
    data = tmp_path / "in.csv"
    data.write_bytes(content)
    return read_all(data)


def read_all(path: Path, **options: Any) -> list[tuple]:
    source = reader(path, **options)
    _, rows = next_batch(source, source.initialOffset())
    return rows


ODD = ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00"]


@pytest.mark.parametrize("odd", ODD, ids=[f"U+{ord(c):04X}" for c in ODD])
def test_odd_characters_are_part_of_the_cell_not_line_breaks(tmp_path: Path, odd: str) -> None:
    data = tmp_path / "in.csv"
    data.write_bytes(f"name,value\na{odd}b,1\nc,2{odd}5\n{odd},3\nd,4\n".encode())
    index = LineIndex(str(data))
    index.refresh()
    assert index.data_rows == 4
    rows = read_all(data)
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert [r[6] for r in rows] == [None] * 4
    bodies = [json.loads(r[5]) for r in rows]
    assert bodies[0] == {"name": f"a{odd}b", "value": 1}
    assert bodies[1]["value"] == f"2{odd}5"  # not a number: kept as text
    assert bodies[2] == {"name": odd, "value": 3}
    assert bodies[3] == {"name": "d", "value": 4}


def test_crlf_line_ends_and_a_lone_carriage_return(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, b"name,value\r\na,1\r\nb\rx,2\r\nc,3\n")
    assert [json.loads(r[5]) for r in rows if r[6] is None] == [
        {"name": "a", "value": 1},
        {"name": "c", "value": 3},
    ]
    dead = [r for r in rows if r[6] is not None]
    assert [r[0] for r in dead] == [2]
    assert dead[0][6].startswith("row 2 cannot be read as CSV: new-line character")


def test_a_header_that_cannot_be_read_makes_dead_letters_not_failed_batches(
    tmp_path: Path,
) -> None:
    # A bare \r in the header raised in every batch, at every restart, for good.
    rows = rows_of(tmp_path, b"sensor\rid,value\n1,2\n3,4\n")
    assert [r[0] for r in rows] == [1, 2]
    assert all("the header (line 1) cannot be read as CSV" in r[6] for r in rows), rows
    assert [json.loads(r[5]) for r in rows] == [{"line": "1,2"}, {"line": "3,4"}]


def test_a_header_naming_a_column_twice_makes_dead_letters_not_rows_short_of_a_cell(
    tmp_path: Path,
) -> None:
    # An event is a mapping: each row lost the first `a` cell, silently.
    rows = rows_of(tmp_path, b"a,a,b\n1,2,3\n")
    assert [r[0] for r in rows] == [1] and rows[0][6] == (
        "row 1 has no column names: the header (line 1) names 'a' more than once: a row's "
        "cells would not each have a field of their own"
    )
    assert json.loads(rows[0][5]) == {"line": "1,2,3"}


def test_a_quote_not_closed_or_followed_by_text_is_a_dead_letter_not_another_event(
    tmp_path: Path,
) -> None:
    # The lenient reader made `1,"unterminated` the cell `unterminated` and `3,"a" b` the
    # cell `a b`: events no row holds, without a dead letter.
    rows = rows_of(tmp_path, b'id,note\n1,"unterminated\n2,"ok, quoted"\n3,"a" b\n4,a"b\n')
    assert [json.loads(r[5]) for r in rows if r[6] is None] == [
        {"id": 2, "note": "ok, quoted"},
        {"id": 4, "note": 'a"b'},  # (a quote inside an unquoted cell is text)
    ]
    dead = {r[0]: r[6] for r in rows if r[6] is not None}
    assert list(dead) == [1, 3]
    assert dead[1].startswith("row 1 cannot be read as CSV: unexpected end of data")
    assert "a quote not closed on its line" in dead[1]
    assert dead[3] == "row 3 cannot be read as CSV: ',' expected after '\"'"


def test_invalid_utf8_is_a_dead_letter_with_the_raw_bytes_shown(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, b"name,value\na,1\nb\xff\xfe,2\nc,3\n")
    assert [(r[0], r[6] is None) for r in rows] == [(1, True), (2, False), (3, True)]
    assert rows[1][6] == "row 2 is not valid UTF-8 (invalid start byte at byte 1)"
    assert json.loads(rows[1][5]) == {"line": "b\\xff\\xfe,2"}


def test_a_field_over_the_csv_limit_is_a_dead_letter_that_fits(tmp_path: Path) -> None:
    limit = csv.field_size_limit()
    data = tmp_path / "in.csv"
    data.write_text(f"name,value\na,1\n{'x' * (limit + 10)},2\nc,3\n")
    rows = read_all(data, max_record_bytes=50_000)
    assert [(r[0], r[6] is None) for r in rows] == [(1, True), (2, False), (3, True)]
    assert rows[1][6] == f"row 2 cannot be read as CSV: field larger than field limit ({limit})"
    assert fits(rows[1], 50_000)
    assert "[cut: " in rows[1][5]


def read_measured(source: CsvSourceReader) -> tuple[list[tuple], int]:
    """Every row the source has now, and the peak of memory its read allocated."""
    import tracemalloc

    end = source.latestOffset(source.initialOffset(), source.getDefaultReadLimit())
    (partition,) = source.partitions(source.initialOffset(), end)
    tracemalloc.start()
    try:
        rows = list(source.read(partition))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return rows, peak


def test_a_huge_line_costs_a_dead_letters_size_not_many_times_its_own(tmp_path: Path) -> None:
    # The whole line was escaped as JSON, measured by escaping it again and cut by escaping
    # prefixes of it: ~9x a line of control characters (a 2 GiB line: a worker's OOM).
    size = 8 * 2**20
    data = tmp_path / "in.csv"
    data.write_bytes(b"name,value\na,1\n" + b"\x01" * size + b",2\nc,3\n")
    rows, peak = read_measured(reader(data, max_record_bytes=2**20))
    assert [(r[0], r[6] is None) for r in rows] == [(1, True), (2, False), (3, True)]
    assert fits(rows[1], 2**20) and rows[1][5].startswith('{"line": "\\u0001')
    assert f"[cut: {size + 2} characters in all]" in rows[1][5]
    # The line is held four times whatever is done with it (the file's bytes, the line's,
    # its text, its text without the line end): a dead letter's worth above that.
    assert peak < 4 * size + 16 * 2**20, peak / size


def test_a_row_many_times_the_record_limit_is_a_dead_letter_unread(tmp_path: Path) -> None:
    # A line of commas read as CSV cost ~9x its size (a cell object each): a few hundred
    # MB of it ran a worker out of memory at every retry, with no dead letter. One over
    # ROW_READ_FACTOR times the record limit could never be an event: it is not parsed.
    from fogshift.runtime.csv_io import ROW_READ_FACTOR

    limit = 2**13  # (the bound under csv's own field limit: the row below is parsed)
    size = ROW_READ_FACTOR * limit * 4
    data = tmp_path / "in.csv"
    data.write_bytes(b"name,value\na,1\n" + b"," * size + b"\nc,3\n")
    rows, peak = read_measured(reader(data, max_record_bytes=limit))
    assert [(r[0], r[6] is None) for r in rows] == [(1, True), (2, False), (3, True)]
    assert rows[1][6].startswith(f"row 2 is {size} bytes, over {ROW_READ_FACTOR} times")
    assert fits(rows[1], limit) and f"[cut: {size} characters in all]" in rows[1][5]
    assert peak < 3 * size, peak / size  # (the file's bytes and the line's: no parse)
    # Just under the bound, a row is read as CSV as ever: its cells counted.
    under = tmp_path / "under.csv"
    under.write_bytes(b"name,value\n" + b"x" * (ROW_READ_FACTOR * limit - 2) + b",1\n")
    (row,) = read_all(under, max_record_bytes=limit)
    assert "over the limit of" in row[6], row[6]  # (encoded: over the limit, not unread)


def test_a_line_far_over_the_bound_is_passed_over_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was read whole (then copied by a split) before its length made it a dead letter:
    # a file whose lines end in a lone \r is one line, a worker's OOM at every retry. Now
    # its rest is passed over in pieces of SCAN_BYTES (8 MiB; here 64 KiB).
    from fogshift.runtime import csv_io
    from fogshift.runtime.csv_io import ROW_READ_FACTOR

    monkeypatch.setattr(csv_io, "SCAN_BYTES", 2**16)
    limit = 2**12
    size = 64 * ROW_READ_FACTOR * limit
    data = tmp_path / "in.csv"
    data.write_bytes(b"name,value\na,1\n" + b"x,1\r" * (size // 4) + b"\nc,3\n")
    rows, peak = read_measured(reader(data, max_record_bytes=limit))
    assert [(r[0], r[6] is None) for r in rows] == [(1, True), (2, False), (3, True)]
    assert rows[1][6].startswith(f"row 2 is {size} bytes, over {ROW_READ_FACTOR} times")
    assert fits(rows[1], limit) and rows[1][5].startswith('{"line": "x,1\\rx,1\\r')
    assert peak < size / 8, peak / size


def test_a_reader_indexes_only_the_lines_it_may_still_read(tmp_path: Path) -> None:
    # Every line's start from byte 0 was kept for the query's life (~40 bytes a line),
    # and each new reader (a restart, a move) scanned the file from its first byte.
    data = tmp_path / "in.csv"
    data.write_bytes(b"k,v\n" + b"".join(b"%d,%d\n" % (i, i % 7) for i in range(1, 2001)))
    source = reader(data, max_events_per_batch=100)
    start, read = source.initialOffset(), []
    for _ in range(7):
        end, rows = next_batch(source, start)
        source.commit(end)
        read += rows
        start = end
        assert len(source.index.starts) <= 101
    # A new reader from the offset reached reads on as the first would have.
    again = reader(data, max_events_per_batch=100)
    end, rows = next_batch(again, start)
    assert again.index.base == start["row"] + 1
    _, expected = next_batch(source, start)
    assert [r[5] for r in rows] == [r[5] for r in expected]
    assert [r[0] for r in read + rows] == list(range(1, 801))
    assert [json.loads(r[5]) for r in read + rows] == [{"k": i, "v": i % 7} for i in range(1, 801)]


def test_the_index_scans_a_large_append_in_pieces_to_the_same_line_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file appended by gigabytes at once was read whole to find its line ends.
    from fogshift.runtime import csv_io

    monkeypatch.setattr(csv_io, "SCAN_BYTES", 7)
    data = tmp_path / "in.csv"
    text = b"name,value\n" + b"".join(b"k%d,%d\n" % (i, i * 37) for i in range(50)) + b"tail,9"
    data.write_bytes(text[:40])
    index = LineIndex(str(data), settle_s=60)
    index.refresh()
    with data.open("ab") as out:
        out.write(text[40:])
    index.refresh()
    ends = [n + 1 for n, byte in enumerate(text) if byte == ord("\n")]
    expected = [0, *ends[:-1]]
    assert list(index.starts) == expected
    assert (index.end, index.size) == (text.rindex(b"\n") + 1, len(text))


def test_a_row_over_the_record_limit_is_a_dead_letter(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text(f"name,value\na,1\n{'é' * 500},2\nc,3\n")
    rows = read_all(data, max_record_bytes=1000)
    assert [(r[0], r[6] is None) for r in rows] == [(1, True), (2, False), (3, True)]
    assert "over the limit of 1000 bytes (max_record_bytes)" in rows[1][6]
    assert fits(rows[1], 1000)


def test_overflowing_and_huge_numbers_stay_text(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    digits = "9" * 5000
    data.write_text(f"a,b,c\n1e999,-1e999,{digits}\n1e-999,2.5,7\n")
    rows = read_all(data)
    assert [r[6] for r in rows] == [None, None]
    assert json.loads(rows[0][5]) == {"a": "1e999", "b": "-1e999", "c": digits}
    assert json.loads(rows[1][5]) == {"a": 0.0, "b": 2.5, "c": 7}


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_an_unterminated_last_line_is_a_row_only_once_complete(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_bytes(b"name,value\na,1\nb,2")  # the writer is half-way through row 2
    source = reader(data, tail_settle_s=60)
    end, rows = next_batch(source, source.initialOffset())
    assert [(r[0], json.loads(r[5])) for r in rows] == [(1, {"name": "a", "value": 1})]
    assert end["row"] == 1
    assert next_batch(source, end) == (end, [])  # still half a row: nothing to read
    with open(data, "ab") as handle:
        handle.write(b"5\nc,3\n")
    end, rows = next_batch(source, end)
    assert [(r[0], json.loads(r[5])) for r in rows] == [
        (2, {"name": "b", "value": 25}),
        (3, {"name": "c", "value": 3}),
    ]
    # Nothing more: no row is read twice.
    assert next_batch(source, end) == (end, [])


def test_the_tail_of_a_finished_file_is_its_last_row_and_stays_as_read(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_bytes(b"name,value\na,1\nb,2")
    _age(data, 10)  # the writer finished without a final newline
    source = reader(data, tail_settle_s=2)
    start = source.initialOffset()
    end, rows = next_batch(source, start)
    assert [(r[0], json.loads(r[5])) for r in rows] == [
        (1, {"name": "a", "value": 1}),
        (2, {"name": "b", "value": 2}),
    ]
    # The writer was not finished after all: it carries on row 2 and adds row 3.
    with open(data, "ab") as handle:
        handle.write(b"5\nc,3\n")
    # A re-execution of the first batch (same offsets, e.g. after a crash) reads the same.
    again = reader(data, tail_settle_s=2)
    assert [r[5] for p in again.partitions(start, end) for r in again.read(p)] == [
        r[5] for r in rows
    ]
    # The next batch starts after the whole of line 2: row 2 is never read a second time.
    end2, rows2 = next_batch(source, end)
    assert [(r[0], json.loads(r[5])) for r in rows2] == [(3, {"name": "c", "value": 3})]
    assert end2["row"] == 3


def test_a_fresh_reader_resumes_after_a_tail_it_read_before(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_bytes(b"name,value\na,1\nb,2")
    _age(data, 10)
    end, _ = next_batch(reader(data, tail_settle_s=2), reader(data).initialOffset())
    assert end["row"] == 2
    data.write_bytes(data.read_bytes())  # touched again: its tail is not settled now
    restarted = reader(data, tail_settle_s=60)
    assert next_batch(restarted, end) == (end, [])


def test_blank_and_short_rows_keep_their_reasons(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, b"name,value\n\na\nb,2\n")
    assert [(r[0], r[6]) for r in rows] == [
        (1, "row 1 has 0 columns, the header has 2 (name, value)"),
        (2, "row 2 has 1 columns, the header has 2 (name, value)"),
        (3, None),
    ]
    assert json.loads(rows[1][5]) == {"line": "a"}


def test_a_file_put_in_the_place_of_the_one_read_is_an_error_not_read_on(
    tmp_path: Path,
) -> None:
    # `mv new.csv in.csv` (a rotation): the new file was read on from the old one's position,
    # its first rows skipped and the next one a piece of a line, with nothing said.
    data = tmp_path / "in.csv"
    data.write_bytes(b"name,value\na,1\nb,2\n")
    source = reader(data)
    end, rows = next_batch(source, source.initialOffset())
    assert len(rows) == 2
    new = tmp_path / "new.csv"
    new.write_bytes(b"name,value\nx,10\ny,20\nz,30\nw,40\n")
    new.replace(data)
    with pytest.raises(Exception, match="was replaced by another file while it was read"):
        next_batch(source, end)


def test_the_index_scans_on_from_where_it_stopped(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_bytes(b"h\n1\n2")
    index = LineIndex(str(data), settle_s=60)
    index.refresh()
    assert (list(index.starts), index.end, index.data_rows) == ([0, 2], 4, 1)
    with open(data, "ab") as handle:
        handle.write(b"2\n3\n")
    index.refresh()
    assert (list(index.starts), index.end, index.data_rows) == ([0, 2, 4, 7], 9, 3)
    data.write_bytes(b"h\n")
    with pytest.raises(Exception, match="shrank"):
        index.refresh()
