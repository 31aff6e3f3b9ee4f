"""The width of what the commands print into a pipe or a file."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from fogshift.cli.output import PIPED_COLUMNS, make_console


def test_a_table_piped_keeps_each_row_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = make_console(file=out)
    table = Table()
    for column in ("name", "url", "hosted"):
        table.add_column(column)
    hosted = "case1/aggregate, case1/source, ecg/band, ecg/classify, twins/classify-p0"
    table.add_row("fog-a", "http://127.0.0.1:40123", hosted)
    console.print(table)
    assert console.width == PIPED_COLUMNS
    (row,) = [line for line in out.getvalue().splitlines() if "fog-a" in line]
    assert hosted in row  # Rich's 80 columns wrapped it over three lines
    # COLUMNS still says how wide, as Rich reads it.
    monkeypatch.setenv("COLUMNS", "50")
    assert make_console(file=io.StringIO()).width == 50
