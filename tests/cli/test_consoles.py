"""The consoles the commands print with: as wide as a row into a pipe or a file, and what
starting a cluster says kept on the screen where it matters."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from fogshift.cli.output import PIPED_COLUMNS, make_console, progress_to


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


def test_warnings_and_restarts_stay_on_the_screen_after_the_spinner() -> None:
    # `up` on a non-loopback host warned of plain HTTP only on the spinner, gone once up.
    out = io.StringIO()
    console = make_console(file=out)
    with console.status("starting fogshift") as status:
        say = progress_to(status, console)
        for message in (
            "starting nats-server (JetStream)",
            "warning: the orchestrator and the node agents listen on 0.0.0.0",
            "restarting node agent fog-a",
            "waiting for Spark on fog-a",
        ):
            say(message)
    kept = out.getvalue()
    assert "listen on 0.0.0.0" in kept and "restarting node agent fog-a" in kept
    assert "starting nats-server" not in kept and "waiting for Spark" not in kept
