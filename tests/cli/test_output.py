"""What the CLI prints is what it was told: data and messages are never read as Rich markup."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fogshift.cli.main import _plain
from tests.conftest import fogshift_in_process


def test_an_error_naming_brackets_is_printed_as_it_is(tmp_path: Path) -> None:
    # The message names the home "…/x[/tmp]": read as markup, it ended the CLI with a
    # MarkupError traceback instead of the error.
    home = tmp_path / "x[/tmp]"
    result = fogshift_in_process("status", "--home", str(home), check=False)
    assert result.returncode in (1, 2), result.stderr
    # (The console wraps long lines, anywhere in a path as long as pytest's folders make it.)
    assert "x[/tmp]" in "".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr and "MarkupError" not in result.stderr


def test_table_cells_show_a_reason_with_brackets_as_it_is() -> None:
    # A dead letter's reason "missing key [patient] in event" printed as "missing key  in
    # event"; "KeyError: [/tmp]" failed the command.
    table = Table()
    table.add_column("reason")
    table.add_column("event")
    table.add_row(*_plain("missing key [patient] in event", "KeyError: [/tmp]"))
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    assert "missing key [patient] in event" in out.getvalue()
    assert "KeyError: [/tmp]" in out.getvalue()
