"""The exactly-once CSV append, without Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import Row

from fogshift.broker.exceptions import Fenced
from fogshift.events import NOT_AN_EVENT
from fogshift.exceptions import InvariantViolation
from fogshift.runtime.csv_io import (
    CsvSinkWriter,
    SinkRows,
    append_exactly_once,
    marker_path,
    read_marker,
    reset_sink,
)


def rows(*pairs: tuple[int, float]) -> list[tuple[int, int, float, str]]:
    return [(o, o, 0.0, json.dumps({"v": v})) for o, v in pairs]


def test_reexecuted_batches_append_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    assert append_exactly_once(out, rows((1, 1.5), (2, 2.0))) == 2
    assert append_exactly_once(out, rows((2, 2.0), (1, 1.5))) == 0  # the same batch again
    assert append_exactly_once(out, rows((2, 2.0), (3, 3.25))) == 1  # overlap
    assert out.read_text() == "seq,v\n1,1.5\n2,2.0\n3,3.25\n"
    assert read_marker(out)["lines"] == 3


def test_a_torn_tail_is_cut(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    append_exactly_once(out, rows((1, 1.0)))
    with open(out, "a") as handle:
        handle.write("2,2.")  # a crash in the middle of the next append
    append_exactly_once(out, rows((2, 2.0)))
    assert out.read_text() == "seq,v\n1,1.0\n2,2.0\n"


def test_mismatched_fields_are_refused_before_the_marker_moves(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    refused: list = []
    batch = [*rows((1, 1.0)), (2, 2, 0.0, json.dumps({"w": 1}))]
    append_exactly_once(out, batch, refused.extend)
    assert [r[0][0] for r in refused] == [2]
    assert "do not match the output header" in refused[0][1]
    assert out.read_text() == "seq,v\n1,1.0\n"


def test_a_message_no_pe_wrote_is_refused_even_if_its_body_is_an_object(tmp_path: Path) -> None:
    # The reader passes a message that is no event on with its raw text as the body: a JSON
    # object, so as the file's first row it was written and made the header, and every real
    # event after it was refused as not matching.
    out = tmp_path / "o.csv"
    raw = json.dumps({"seq": -1, "timestamp": 0, "creator": "up", "body": "{}"})
    writer = CsvSinkWriter({"path": str(out), "pipeline": "p", "pe": "sink", "broker": "b"})
    sent = writer.write(iter([
        Row(origin=1, seq=0, timestamp=0.0, creator=NOT_AN_EVENT, body=raw),
        Row(origin=2, seq=2, timestamp=0.0, creator="map", body=json.dumps({"v": 2.0})),
    ]))  # fmt: skip
    assert isinstance(sent, SinkRows) and sent.not_events == [1]
    refused: list = []
    assert append_exactly_once(out, sent.rows, refused.extend, not_events=sent.not_events) == 1
    assert [r[0][0] for r in refused] == [1] and "not an event" in refused[0][1]
    assert out.read_text() == "seq,v\n2,2.0\n"
    assert read_marker(out)["origin"] == 2


def test_a_truncated_output_is_an_error_and_reset_starts_over(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    append_exactly_once(out, rows((1, 1.0)))
    out.write_text("")
    with pytest.raises(InvariantViolation, match="truncated"):
        append_exactly_once(out, rows((2, 2.0)))
    reset_sink(out)
    assert read_marker(out) == {**read_marker(tmp_path / "none.csv"), "epoch": 0, "owner": ""}
    assert append_exactly_once(out, rows((1, 1.0))) == 1


def test_an_output_whose_marker_is_gone_is_left_as_it_is(tmp_path: Path) -> None:
    # Read as a fresh marker, the file was cut to nothing at the next append: the rows of
    # batches committed long ago lost, and the fencing with them.
    out = tmp_path / "o.csv"
    append_exactly_once(out, rows((1, 1.0), (2, 2.0)), epoch=3, owner="p/sink")
    before = out.read_bytes()
    marker_path(out).unlink()
    with pytest.raises(InvariantViolation, match=r"marker .* is gone") as err:
        append_exactly_once(out, rows((3, 3.0)), epoch=3, owner="p/sink")
    assert out.read_bytes() == before
    assert err.value.received == "no marker" and "--fresh" in err.value.render()
    reset_sink(out, 4, "p/sink")  # (a fresh deploy starts it over)
    assert append_exactly_once(out, rows((1, 1.0)), epoch=4, owner="p/sink") == 1


def test_an_output_replaced_by_a_directory_is_said_so(tmp_path: Path) -> None:
    # (Its size was the directory's: "is 4096 bytes but 12 were committed to it".)
    out = tmp_path / "o.csv"
    append_exactly_once(out, rows((1, 1.0)))
    out.unlink()
    out.mkdir()
    with pytest.raises(InvariantViolation, match="is no longer a file \\(a directory\\)") as err:
        append_exactly_once(out, rows((2, 2.0)))
    assert "bytes" not in err.value.message and "put the file back" in err.value.render()


def test_a_body_that_is_not_json_is_refused_not_fatal(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    refused: list = []
    append_exactly_once(out, [*rows((1, 1.0)), (2, 2, 0.0, "garbage{")], refused.extend)
    assert [r[0][0] for r in refused] == [2] and "not an event body" in refused[0][1]
    assert out.read_text() == "seq,v\n1,1.0\n"


def test_a_body_that_cannot_be_written_is_refused_alone(tmp_path: Path) -> None:
    """Text a processor's JSON escaped but that is no UTF-8 (a lone surrogate), a body nested
    too deep to read: each is refused, the rows around it are written, and the batch ends."""
    out = tmp_path / "o.csv"
    refused: list = []
    deep = '{"v": ' + "[" * 100_000 + "]" * 100_000 + "}"
    batch = [*rows((1, 1.0)), (2, 2, 0.0, '{"v": "\\udcff"}'), (3, 3, 0.0, deep), *rows((4, 4.0))]
    assert append_exactly_once(out, batch, refused.extend) == 2
    assert [r[0][0] for r in refused] == [2, 3]
    assert "UnicodeEncodeError" in refused[0][1] and "RecursionError" in refused[1][1]
    assert out.read_text() == "seq,v\n1,1.0\n4,4.0\n"
    assert read_marker(out)["origin"] == 4
    # The first row sets the header: one that cannot be written sets none.
    other = tmp_path / "p.csv"
    assert append_exactly_once(other, [(1, 1, 0.0, '{"\\udcff": 1}'), *rows((2, 2.0))]) == 1
    assert other.read_text() == "seq,v\n2,2.0\n"


def test_a_lock_held_by_a_frozen_writer_fails_the_batch_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An earlier instance SIGSTOPped mid-append (its node frozen) on storage both share:
    # the restored sink waited for the lock for as long as the freeze lasted, silently.
    import signal
    import subprocess
    import sys

    from fogshift.runtime import csv_io
    from fogshift.runtime.exceptions import SinkBusy

    out = tmp_path / "out.csv"
    lock = marker_path(out).with_suffix(".lock")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, signal, sys\n"
        f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('locked', flush=True); os.kill(os.getpid(), signal.SIGSTOP)\n"
    )], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        monkeypatch.setattr(csv_io, "LOCK_WAIT_S", 0.3)
        with pytest.raises(SinkBusy, match="locked by another writer"):
            append_exactly_once(out, rows((1, 1.0)), epoch=2, owner="p/sink")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The holder gone, the lock is free again.
    assert append_exactly_once(out, rows((1, 1.0)), epoch=2) == 1


def test_an_empty_body_sets_no_header_and_fields_may_come_in_any_order(tmp_path: Path) -> None:
    # A first body of no field made a header of none, and every later row was refused for
    # good; rows of the header's fields in another order (a second input's) were refused.
    out = tmp_path / "o.csv"
    refused: list = []
    batch = [(1, 1, 0.0, "{}"), (2, 2, 0.0, json.dumps({"a": 1, "b": 2}))]
    assert append_exactly_once(out, batch, refused.extend) == 1
    assert [r[0][0] for r in refused] == [1] and "no fields" in refused[0][1]
    assert append_exactly_once(out, [(3, 3, 0.0, json.dumps({"b": 4, "a": 3}))]) == 1
    assert out.read_text() == "seq,a,b\n2,1,2\n3,3,4\n"


def test_events_with_a_field_named_seq_keep_it_beside_the_sinks_own(tmp_path: Path) -> None:
    # A walk-through's finding: the header read "seq,seq,a" (pandas: "seq" and "seq.1").
    out = tmp_path / "o.csv"
    batch = [(o, o, 0.0, json.dumps({"seq": 100 + o, "a": o, "_seq": 0})) for o in (1, 2)]
    assert append_exactly_once(out, batch) == 2
    assert out.read_text() == "__seq,seq,a,_seq\n1,101,1,0\n2,102,2,0\n"
    other = tmp_path / "p.csv"
    assert append_exactly_once(other, [(1, 1, 0.0, json.dumps({"seq": 7}))]) == 1
    assert other.read_text() == "_seq,seq\n1,7\n"


def test_the_markers_scratch_file_is_never_one_someone_put_there(tmp_path: Path) -> None:
    # Its fixed name, opened to write, followed a link put there over any file it named.
    out = tmp_path / "o.csv"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    marker_path(out).with_suffix(".tmp").symlink_to(victim)
    assert append_exactly_once(out, rows((1, 1.0))) == 1
    assert victim.read_text() == "precious" and read_marker(out)["lines"] == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [
        marker_path(out).with_suffix(".tmp").name  # (the link: nothing of fogshift's left)
    ]


def test_values_that_are_not_text_or_numbers_are_written_as_their_json(tmp_path: Path) -> None:
    # Written as Python's True, None and {'a': 1}: no other reader reads them back.
    out = tmp_path / "o.csv"
    body = {"ok": True, "gone": None, "tags": ["a", "é"], "at": {"x": 1}, "n": 7, "v": 0.1}
    assert append_exactly_once(out, [(1, 1, 0.0, json.dumps(body))]) == 1
    header, line = out.read_text().splitlines()
    assert header == "seq,ok,gone,tags,at,n,v"
    assert line == '1,true,null,"[""a"",""é""]","{""x"":1}",7,0.1'


def test_a_carriage_return_in_a_cell_is_quoted_so_the_row_stays_one(tmp_path: Path) -> None:
    import csv

    out = tmp_path / "o.csv"
    body = {"name": "a\rb", "line": "c\nd", "v": 1}
    assert append_exactly_once(out, [(1, 1, 0.0, json.dumps(body))]) == 1
    with open(out, newline="") as handle:
        assert list(csv.reader(handle)) == [
            ["seq", "name", "line", "v"],
            ["1", "a\rb", "c\nd", "1"],
        ]
    assert out.read_bytes().endswith(b"\n") and not out.read_bytes().endswith(b"\r\n")


def test_a_fresh_deploy_fences_the_earlier_deployments_instance(tmp_path: Path) -> None:
    # An instance of the earlier deployment (epoch 3) on a node that missed the stop: the
    # reset deleted the marker, so it read epoch 0, appended its rows (origins 4001, 4002),
    # and the new deployment's rows 1..4002 were then skipped as written.
    out = tmp_path / "o.csv"
    append_exactly_once(out, rows((1, 1.0)), epoch=3)
    reset_sink(out, epoch=4, owner="p/sink")
    assert out.read_text() == "" and read_marker(out)["epoch"] == 4
    with pytest.raises(Fenced):
        append_exactly_once(out, rows((4001, 1.0), (4002, 2.0)), epoch=3, owner="p/sink")
    assert append_exactly_once(out, rows((1, 5.0), (2, 6.0)), epoch=4) == 2
    assert out.read_text() == "seq,v\n1,5.0\n2,6.0\n"
    # A fresh deploy starts the file over whatever epoch wrote it (another cluster's).
    reset_sink(out, epoch=1)
    assert append_exactly_once(out, rows((1, 7.0)), epoch=1) == 1


def test_a_fresh_deploy_fences_another_sinks_instance_whatever_its_epoch(tmp_path: Path) -> None:
    # Epochs are counted per PE: pipeline a's sink, on a node its stop did not reach, held
    # epoch 7; pipeline b's sink deployed on the file under epoch 1. It appended its rows
    # there (and fenced b's for good), or with an equal epoch b's rows up to its origins
    # were skipped as written (a review's finding).
    out = tmp_path / "o.csv"
    append_exactly_once(out, rows((1, 1.0)), epoch=7, owner="a/sink")
    reset_sink(out, epoch=1, owner="b/sink")
    for epoch in (7, 1):
        with pytest.raises(Fenced, match="which was reset for sink b/sink"):
            append_exactly_once(out, rows((4001, 1.0)), epoch=epoch, owner="a/sink")
    assert append_exactly_once(out, rows((1, 5.0), (2, 6.0)), epoch=1, owner="b/sink") == 2
    assert out.read_text() == "seq,v\n1,5.0\n2,6.0\n"
    assert read_marker(out)["owner"] == "b/sink"
    # A renamed sink of the same pipeline is another sink.
    with pytest.raises(Fenced):
        append_exactly_once(out, rows((3, 1.0)), epoch=9, owner="b/old-sink")
    # A marker written before markers named their owner: the first writer claims it.
    legacy = tmp_path / "l.csv"
    append_exactly_once(legacy, rows((1, 1.0)), epoch=2)
    assert "owner" not in read_marker(legacy) or not read_marker(legacy)["owner"]
    assert append_exactly_once(legacy, rows((2, 2.0)), epoch=2, owner="c/sink") == 1
    assert read_marker(legacy)["owner"] == "c/sink"


def test_declared_fields_make_the_header_whatever_event_comes_first(tmp_path: Path) -> None:
    # Without them a stranger's message in fogshift's form, first, made the header `seq,zzz`
    # and every event after it a dead letter (a review's finding).
    out = tmp_path / "o.csv"
    refused: list = []
    batch = [(1, 1, 0.0, '{"zzz": 1}'), (2, 2, 0.0, '{"a": 1, "b": 2}'),
             (3, 3, 0.0, '{"b": 4, "a": 3}')]  # fmt: skip
    assert append_exactly_once(out, batch, refused.extend, fields=["b", "a"]) == 2
    assert out.read_text() == "seq,b,a\n2,2,1\n3,4,3\n"
    assert [(r[0][0], why) for r in refused for why in [r[1]]] == [
        (1, "fields ['zzz'] do not match the output header ['b', 'a']")
    ]
    # Without them, as before: the first event's fields.
    other = tmp_path / "p.csv"
    append_exactly_once(other, batch[1:])
    assert other.read_text() == "seq,a,b\n2,1,2\n3,3,4\n"


def test_a_restored_sink_replaying_what_was_written_fences_the_instance_it_replaces(
    tmp_path: Path,
) -> None:
    # The restored instance (epoch 2) replays rows 1-3, all written: nothing to append, and
    # the marker kept epoch 1, so the zombie went on appending until a new row came.
    out = tmp_path / "o.csv"
    append_exactly_once(out, rows((1, 1.0), (2, 2.0), (3, 3.0)), epoch=1)
    assert append_exactly_once(out, rows((1, 1.0), (2, 2.0), (3, 3.0)), epoch=2) == 0
    assert read_marker(out)["epoch"] == 2
    with pytest.raises(Fenced):
        append_exactly_once(out, rows((4, 4.0)), epoch=1)
    assert append_exactly_once(out, rows((4, 4.0)), epoch=2) == 1
