"""What the CLI prints is what it was told: data and messages are never read as Rich markup."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
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


def test_a_state_read_says_when_it_shows_part_of_the_keys_or_none_for_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A walk-through's findings: "4 keys" over 2 rows (cut by --limit, unsaid), "1 keys",
    # and an empty table for a key with no state.
    from fogshift.cli import main as cli
    from fogshift.contracts import TwinEntry, TwinState

    answers: list[TwinState] = []
    monkeypatch.setattr(cli, "_element_read", lambda *args: answers.pop(0))

    def read(count: int, shown: list[str], *args: str) -> str:
        answers.append(TwinState(
            pipeline="p", element="agg", node="fog-a", batch=7, key_by="sensor", keys=count,
            entries=[TwinEntry(key=k, state={"n": 1}) for k in shown],
        ))  # fmt: skip
        return " ".join(fogshift_in_process("state", "p", "agg", *args).stdout.split())

    assert "keyed by sensor, 4 keys, the first 2 shown (--limit, or their state's size)" in read(
        4, ["s1", "s2"], "--limit", "2"
    )
    # Fewer than --limit, cut by the agent's page size (their state long): said too.
    assert "keyed by sensor, 3 keys, the first 2 shown (--limit, or their state's size)" in read(
        3, ["s1", "s2"]
    )
    assert "keyed by sensor, 1 key)" in read(1, ["s1"])
    assert "keyed by sensor, 2 keys)" in read(2, ["s1", "s2"])
    missing = read(2, [], "s9")
    assert missing.endswith("no state for key 's9' (no valid event of it has come to agg)"), missing
    assert "┃" not in missing and "key" in missing  # (no empty table)


def test_a_pipeline_without_dead_letters_is_said_to_have_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It printed an empty table.
    from contextlib import contextmanager
    from types import SimpleNamespace

    from fogshift.cli import main as cli

    @contextmanager
    def client(home: Path) -> Any:
        yield SimpleNamespace(get=lambda path, params: [])

    monkeypatch.setattr(cli.cluster_ops, "orchestrator_client", client)
    out = " ".join(fogshift_in_process("errors", "w2").stdout.split())
    assert out == "no dead letters in w2 (none stored in its streams)"


@pytest.mark.parametrize(
    ("report", "says"),
    [
        (
            {"checkpoint": "c1", "checkpoint_age_ms": 312_000.0},
            "from checkpoint c1 (5 min old; its input had nothing newer): reprocessed 0",
        ),
        (
            {"checkpoint": "c1", "checkpoint_age_ms": 2_400.0, "reprocessed_events": 12},
            "from checkpoint c1 (2.4 s old): reprocessed 12",
        ),
        ({}, "from no checkpoint (its input from its start): reprocessed 0"),
    ],
    ids=["idle", "busy", "none"],
)
def test_a_restore_says_how_old_its_checkpoint_is_and_whether_that_is_stale(
    monkeypatch: pytest.MonkeyPatch, report: dict[str, Any], says: str
) -> None:
    # An idle pipeline's restore read "(312000.0 ms old)", as if its checkpoint were stale;
    # one without a checkpoint "from checkpoint None (None ms old)".
    from fogshift.cli import main as cli
    from fogshift.contracts import RestoreReport, RestoreStatus

    answer = RestoreReport(pipeline="p", element="agg", target="fog-b", epoch=3,
                           status=RestoreStatus.RESTORED, **report)  # fmt: skip
    monkeypatch.setattr(cli, "_run_operation", lambda *args: answer.model_dump(mode="json"))
    out = " ".join(fogshift_in_process("restore", "p", "agg").stdout.split())
    assert out.startswith("restored p/agg on fog-b (epoch 3) " + says), out


def test_a_restore_of_a_running_pe_says_it_replaced_that_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An operator's walk-through: `restore` of a healthy PE moved it without a word.
    from fogshift.cli import main as cli
    from fogshift.contracts import RestoreReport, RestoreStatus

    answer = RestoreReport(pipeline="p", element="agg", target="cloud", epoch=3,
                           status=RestoreStatus.RESTORED)  # fmt: skip
    monkeypatch.setattr(cli, "_run_operation", lambda *args: answer.model_dump(mode="json"))
    monkeypatch.setattr(cli, "_running_on", lambda home, p, e: "fog-a")
    out = " ".join(fogshift_in_process("restore", "p", "agg").stdout.split())
    assert (
        "note: p/agg was running on fog-a (as last heard): that instance is fenced (it "
        "cannot emit) and removed once its node answers" in out
    ), out
    monkeypatch.setattr(cli, "_running_on", lambda home, p, e: None)  # lost, or not told
    assert "note" not in fogshift_in_process("restore", "p", "agg").stdout


def test_an_answer_outside_its_contract_is_said_as_a_version_mismatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fogshift.cli import main as cli

    monkeypatch.setattr(cli, "_run_operation", lambda *args: {"element": "agg"})
    result = fogshift_in_process("restore", "p", "agg", check=False)
    said = " ".join(result.stderr.split())
    assert result.returncode == 1, said
    assert "the cluster's answer is not a RestoreReport: ('pipeline',): missing (required)" in said
    assert "of one fogshift version?" in said and "Traceback" not in said


def test_a_failed_pipeline_is_shown_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import contextmanager
    from types import SimpleNamespace

    from fogshift.cli import main as cli

    failed = {"pipeline": "w3", "status": "failed", "elements": [],
              "error": "a PE could not be started: [fog-a] is gone"}  # fmt: skip

    @contextmanager
    def client(home: Path) -> Any:
        yield SimpleNamespace(get=lambda path: failed)

    monkeypatch.setattr(cli.cluster_ops, "orchestrator_client", client)
    out = " ".join(fogshift_in_process("status", "w3").stdout.split())
    assert out.endswith("failed: a PE could not be started: [fog-a] is gone"), out


def test_a_pipelines_warnings_are_printed_under_its_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from contextlib import contextmanager
    from types import SimpleNamespace

    from fogshift.cli import main as cli

    shared = "fog-a runs 2 partitions of 'agg' now (agg-p0, agg-p1): [a hint]"
    running = {"pipeline": "w3", "status": "running", "elements": [], "warnings": [shared]}

    @contextmanager
    def client(home: Path) -> Any:
        yield SimpleNamespace(get=lambda path: running)

    monkeypatch.setattr(cli.cluster_ops, "orchestrator_client", client)
    out = " ".join(fogshift_in_process("status", "w3").stdout.split())
    assert out.endswith(f"warning: {shared}"), out


def test_no_events_of_a_key_says_where_it_looked_not_an_empty_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A walk-through's finding: an empty table, over "no events of key 'p01' there", with a
    # partitioned page's header "stream sequences 1-0 of 0".
    from fogshift.cli import main as cli
    from fogshift.contracts import EventPage

    pages = [EventPage(pipeline="p", element="band", key="p01", events=[], scanned_after=900,
                       scanned_to=1000, last_seq=1000),
             EventPage(pipeline="p", element="band", key=None, events=[], scanned_after=0,
                       scanned_to=0, last_seq=0)]  # fmt: skip
    monkeypatch.setattr(cli, "_element_read", lambda *args: pages.pop(0))
    keyed = " ".join(fogshift_in_process("events", "p", "band", "p01").stdout.split())
    assert keyed == (
        "no events of p/band of key 'p01' among the newest 100 messages; a larger --tail "
        "looks further back"
    )
    empty = " ".join(fogshift_in_process("events", "p", "band").stdout.split())
    assert empty == "no events of p/band there"


def test_a_silent_nodes_disk_is_said_as_last_heard() -> None:
    # An operator's walk-through: a dead node's disk column kept its figure, as if now.
    from fogshift.cli.main import _disk
    from tests.web.test_history import node

    up = node("fog-a").model_copy(update={"disk_free_bytes": 2**31, "disk_total_bytes": 2**35})
    assert _disk(up) == "2.0 of 32 GiB free"
    assert _disk(up.model_copy(update={"healthy": False})) == "2.0 of 32 GiB free (when last heard)"
    assert _disk(node("fog-b")) == "-"  # (it did not say)


def test_control_characters_in_data_are_shown_not_acted_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A key holding ESC [ 2 J (read from an event: data) cleared the operator's screen as
    # `fogshift state` listed it; ESC ] 0 ; ... retitled the window. Rich passes ESC on.
    from fogshift.cli import main as cli
    from fogshift.contracts import TwinEntry, TwinState

    hostile = "s1\x1b[2J\x1b]0;owned\x07\x9b31m"
    monkeypatch.setattr(cli, "_element_read", lambda *args: TwinState(
        pipeline="p", element="agg", node="fog-a", batch=7, key_by="sensor", keys=1,
        entries=[TwinEntry(key=hostile, state={"last": hostile})],
    ))  # fmt: skip
    out = fogshift_in_process("state", "p", "agg").stdout
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, repr(out)
    assert "s1\\x1b[2J\\x1b]0;owned\\x07\\x9b31m" in out.replace("\n", ""), out
    # An error quoting what it was given, the same.
    result = fogshift_in_process("state", "p", "agg\x1b[2J", check=False)
    assert "\x1b" not in result.stderr and "\\x1b" in result.stderr, repr(result.stderr)


def test_visible_keeps_tabs_line_feeds_and_text_and_escapes_markup() -> None:
    from fogshift.cli.output import escape, visible

    assert visible("a\tb\nc é ✓") == "a\tb\nc é ✓"
    assert visible("\x00\x1f\x7f\x85") == "\\x00\\x1f\\x7f\\x85"
    assert escape("[red]x\x1b[/]") == "\\[red]x\\x1b\\[/]"
