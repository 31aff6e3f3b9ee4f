"""Spark checkpoint folders seen from outside Spark (pure file logic)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tarfile
import zipfile
from pathlib import Path

import pytest

from fogshift.checkpoint import spark_dir
from fogshift.checkpoint.chunks import file_chunks
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.spark_dir import (
    OMITTED,
    clear_orphan_state,
    copy_checkpoint,
    fill_omitted,
    pack,
    relocate,
    replaced,
    settle_install,
    torn_checkpoint,
    unpack,
    unreadable_checkpoint,
)
from tests.checkpoint.hadoop_checksums import checksummed


def _write(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_state_without_any_offset_log_entry_is_removed(tmp_path: Path) -> None:
    # What a state store's late background upload leaves behind a discarded checkpoint.
    _write(tmp_path / "state" / "0" / "0" / "11.zip")
    _write(tmp_path / "metadata", '{"id": "q"}')
    assert clear_orphan_state(tmp_path) is True
    assert not (tmp_path / "state").exists()
    assert (tmp_path / "metadata").exists()  # only the orphaned state goes


def test_state_of_a_planned_batch_is_kept(tmp_path: Path) -> None:
    _write(tmp_path / "state" / "0" / "0" / "1.changelog")
    _write(tmp_path / "offsets" / "0", "v1\n{}\n{}")
    assert clear_orphan_state(tmp_path) is False
    assert (tmp_path / "state" / "0" / "0" / "1.changelog").exists()


def test_a_missing_or_stateless_checkpoint_is_left_alone(tmp_path: Path) -> None:
    assert clear_orphan_state(tmp_path / "absent") is False
    _write(tmp_path / "metadata")
    assert clear_orphan_state(tmp_path) is False


def test_logs_a_power_loss_tore_are_told(tmp_path: Path) -> None:
    # Spark syncs none of its log entries: a node back from a power loss may hold them
    # empty, and every start of the PE from them failed.
    _write(tmp_path / "metadata", '{"id": "q"}')
    _write(tmp_path / "offsets" / "0", 'v1\n{"batchWatermarkMs":0}\n{"positions":{"1":3}}')
    _write(tmp_path / "offsets" / "1", 'v1\n{"batchWatermarkMs":0}\n-')
    _write(tmp_path / "commits" / "0", 'v1\n{"nextBatchWatermarkMs":0}')
    assert torn_checkpoint(tmp_path) is None
    assert torn_checkpoint(tmp_path / "absent") is None  # (a fresh PE's: nothing to read)
    for entry, text, said in [
        ("commits/1", "", "commits/1 is empty"),
        ("offsets/2", '{"batchWatermarkMs":0}', "offsets/2 is not a log entry"),
        ("offsets/2", 'v1\n{"batchWat', "offsets/2 holds text that is not JSON"),
        ("metadata", "", "its metadata does not read"),
    ]:
        torn = tmp_path / entry
        before = torn.read_text() if torn.exists() else None
        _write(torn, text)
        assert (torn_checkpoint(tmp_path) or "").startswith(said), (
            entry,
            torn_checkpoint(tmp_path),
        )
        if before is None:
            torn.unlink()
        else:
            _write(torn, before)
    assert torn_checkpoint(tmp_path) is None


def test_a_file_a_start_reads_that_does_not_match_its_checksums_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An emptied state file failed every start at its first batch; a log entry a disk's
    # fault changed but left JSON would have resumed the query elsewhere in its input.
    monkeypatch.setattr(spark_dir, "SETTLE_S", 0.0)
    _write(tmp_path / "metadata", '{"id": "q"}')
    for b in range(3):
        _write(tmp_path / "offsets" / str(b), f'v1\n{{}}\n{{"positions":{{"1":{b}}}}}')
        _write(tmp_path / "commits" / str(b), "v1\n{}")
    partition = tmp_path / "state" / "0" / "0"
    for v in range(1, 5):  # (4.changelog: of a batch the kill cut before its commit)
        _write(partition / f"{v}.changelog", f"changes of version {v}")
    _write(partition / "2.zip", "snapshot of version 2")
    _write(partition / "SSTs" / "a.sst", "table")
    operator = tmp_path / "state" / "0" / "_metadata" / "v2"
    _write(operator / "0", "operator metadata of the first run")
    _write(operator / "3", "of a run whose first batch never committed")
    for path in [p for p in tmp_path.rglob("*") if p.is_file()]:
        checksummed(path)
    assert torn_checkpoint(tmp_path) is None
    # Read by a start after commit 2 (state version 3): the snapshot 2.zip and 3.changelog.
    # Not the changelogs before the snapshot nor after the version, not RocksDB's SSTs.
    for unread in ("1.changelog", "2.changelog", "4.changelog", "SSTs/a.sst"):
        (partition / unread).write_bytes(b"")
    (operator / "3").write_bytes(b"")  # (the start runs batch 3 again, and writes it anew)
    assert torn_checkpoint(tmp_path) is None
    for read, said in [
        ("state/0/_metadata/v2/0", "state/0/_metadata/v2/0 has 0 bytes, its checksums are of "),
        ("state/0/0/3.changelog", "state/0/0/3.changelog has 0 bytes, its checksums are of "),
        ("state/0/0/2.zip", "state/0/0/2.zip has 0 bytes, its checksums are of "),
    ]:
        before = (tmp_path / read).read_bytes()
        (tmp_path / read).write_bytes(b"")
        assert (torn_checkpoint(tmp_path) or "").startswith(said), torn_checkpoint(tmp_path)
        (tmp_path / read).write_bytes(before)
    # A log entry changed, still JSON: its content passes, its checksums do not.
    offsets = tmp_path / "offsets" / "1"
    text = offsets.read_text()
    offsets.write_text(text.replace(":1}", ":7}"))
    run = (text.index(":1}") + 1) // 4 * 4  # (the run of 4 bytes the digit is in)
    assert torn_checkpoint(tmp_path) == (
        f"offsets/1's bytes {run} to {min(len(text), run + 4) - 1} do not match their checksum"
    )
    # Met between Hadoop's two renames (a file, then its checksums), it is judged after.
    monkeypatch.setattr(spark_dir.time, "sleep", lambda s: checksummed(offsets))
    assert torn_checkpoint(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # An emptied state changelog (checked against pyspark 4.3.0: a power loss's).
        ("org.apache.spark.SparkException: [CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error "
         "occurred during loading state. SQLSTATE: 58030\n\tat org.apache...",
         "Spark cannot load its state: CANNOT_LOAD_STATE_STORE.UNCATEGORIZED"),
        ("[CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS] Error reading delta "
         "file", "Spark cannot load its state: CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE"
         "_NOT_EXISTS"),
        ("[CHECKPOINT_FILE_CHECKSUM_VERIFICATION_FAILED] Checksum verification failed",
         "Spark cannot load its state: CHECKPOINT_FILE_CHECKSUM_VERIFICATION_FAILED"),
        ("java.lang.IllegalStateException: Incomplete log file in the offset commit log\n\tat",
         "Spark cannot read its log: Incomplete log file in the offset commit log"),
        # Not a checkpoint that cannot be read: these may pass, or are a deploy's.
        ("[CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR] RocksDB instance could not be "
         "acquired", None),
        ("[CANNOT_LOAD_STATE_STORE.ROCKSDB_STORE_PROVIDER_OUT_OF_MEMORY] Could not load", None),
        ("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match", None),
        # Raised writing a snapshot ("please retry"), not reading one.
        ("[STATE_STORE_UNEXPECTED_EMPTY_FILE_IN_ROCKSDB_ZIP] Detected an empty file", None),
        ("fogshift.broker.exceptions.BrokerUnavailable: nats: no servers available", None),
        # A state load cut short by a full disk: the checkpoint is whole.
        ("org.apache.spark.SparkException: [CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error "
         "occurred during loading state.\nCaused by: java.io.IOException: No space left on "
         "device", None),
    ],
)  # fmt: skip
def test_a_failure_that_says_the_checkpoint_cannot_be_read_is_told(
    text: str, said: str | None
) -> None:
    assert unreadable_checkpoint(text) == said


def _checkpoint(root: Path, batches: int, snapshots: tuple[int, ...]) -> None:
    """A query's checkpoint after ``batches`` batches (0 .. batches-1), each reading one
    row, with RocksDB snapshots (zips) at ``snapshots`` and a changelog per version."""
    _write(root / "metadata", '{"id": "q"}')
    for b in range(batches):
        _write(root / "offsets" / str(b), f'v1\n{{}}\n{{"row": {b + 1}}}')
        _write(root / "offsets" / f".{b}.crc")
        _write(root / "commits" / str(b), "v1\n{}")
        _write(root / "commits" / f".{b}.crc")
        _write(root / "state" / "0" / "0" / f"{b + 1}.changelog")
        _write(root / "state" / "0" / "0" / f".{b + 1}.changelog.crc")
    for v in snapshots:
        _write(root / "state" / "0" / "0" / f"{v}.zip")
        _write(root / "state" / "0" / "0" / f".{v}.zip.crc")
    _write(root / "state" / "0" / "0" / "SSTs" / "000001-a.sst")
    _write(root / "state" / "0" / "_metadata" / "v2" / "0")


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_a_copy_holds_what_resuming_reads_not_sparks_history(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 30, snapshots=(10, 20))
    info = copy_checkpoint(live, copy)
    # A warm copy of it would run batch 29 again: from the end of batch 28.
    assert info == {"batch": 29, "offset": {"row": 30}, "resume_floor": {"row": 29}}
    # Resuming after batch 29 reads offsets 29 (and 28, for a batch run again), commit 29.
    assert _names(copy / "offsets") == {"27", "28", "29", ".27.crc", ".28.crc", ".29.crc"}
    assert _names(copy / "commits") == {"27", "28", "29", ".27.crc", ".28.crc", ".29.crc"}
    # ... and state version 30: the snapshot at 20 and the changelogs after it.
    state = _names(copy / "state" / "0" / "0")
    assert {"20.zip", ".20.zip.crc", "SSTs"} <= state
    assert {f"{v}.changelog" for v in range(21, 31)} <= state
    assert not {"10.zip", "19.changelog", ".19.changelog.crc", "1.changelog"} & state
    # The snapshot at 20 holds version 20: its own changelog is not read either.
    assert not {"20.changelog", ".20.changelog.crc"} & state
    assert (copy / "state" / "0" / "_metadata" / "v2" / "0").exists()
    assert len(list(copy.rglob("*"))) < len(list(live.rglob("*"))) / 3


def _snapshot(zip_path: Path, ssts: list[str]) -> None:
    """A RocksDB snapshot zip as Spark writes it: its ``metadata`` names the SSTs it loads."""
    listed = [{"localFileName": s.split("-")[0] + ".sst", "dfsSstFileName": s, "sizeBytes": 1}
              for s in ssts]  # fmt: skip
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.writestr("CURRENT", "MANIFEST-000005\n")
        archive.writestr("metadata", "v1\n" + json.dumps({"sstFiles": listed, "numKeys": 1}))


def test_a_copy_holds_only_the_ssts_its_snapshot_loads(tmp_path: Path) -> None:
    # RocksDB's SSTs/ holds the files of every snapshot Spark still retains, older ones and
    # (for a warm copy) newer ones; loading reads only those the base snapshot names.
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 25, snapshots=())
    part = live / "state" / "0" / "0"
    (part / "SSTs" / "000001-a.sst").unlink()
    for version, ssts in ((10, ["000001-a.sst"]), (20, ["000001-a.sst", "000002-b.sst"]),
                          (25, ["000002-b.sst", "000003-c.sst"])):  # fmt: skip
        _snapshot(part / f"{version}.zip", ssts)
        for sst in ssts:
            _write(part / "SSTs" / sst, sst * 100)
            _write(part / "SSTs" / f".{sst}.crc")
    copy_checkpoint(live, copy, warm=True)  # runs batch 24 again: loads version 24
    assert _names(copy / "state" / "0" / "0" / "SSTs") == {
        "000001-a.sst",
        ".000001-a.sst.crc",
        "000002-b.sst",
        ".000002-b.sst.crc",
    }
    copy_checkpoint(live, copy)  # loads version 25, from its own snapshot
    assert _names(copy / "state" / "0" / "0" / "SSTs") == {
        "000002-b.sst",
        ".000002-b.sst.crc",
        "000003-c.sst",
        ".000003-c.sst.crc",
    }
    assert not (copy / "state" / "0" / "0" / "25.changelog").exists()


def test_a_copy_leaves_out_what_the_batch_in_flight_wrote(tmp_path: Path) -> None:
    # Batch 25 is running (planned, not committed): it has written version 26, and RocksDB's
    # maintenance has uploaded a snapshot of it. The copy is as of batch 24: its query runs
    # batch 25 again and writes version 26 anew, of its own history.
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 25, snapshots=())
    part = live / "state" / "0" / "0"
    (part / "SSTs" / "000001-a.sst").unlink()
    _write(live / "offsets" / "25", 'v1\n{}\n{"row": 26}')
    _write(part / "26.changelog")
    for version, ssts in ((20, ["000001-a.sst"]), (26, ["000001-a.sst", "000002-b.sst"])):
        _snapshot(part / f"{version}.zip", ssts)
        for sst in ssts:
            _write(part / "SSTs" / sst, sst)
    assert copy_checkpoint(live, copy)["batch"] == 24
    state = _names(copy / "state" / "0" / "0")
    assert "20.zip" in state and not {"26.zip", "26.changelog"} & state
    assert _names(copy / "state" / "0" / "0" / "SSTs") == {"000001-a.sst"}
    assert "25" not in _names(copy / "offsets")


def test_snapshots_named_otherwise_keep_every_sst(tmp_path: Path) -> None:
    # Spark's checkpoint format 2 names a snapshot by version and id (``5_<uuid>.zip``):
    # which SSTs it loads is not told here, so none is left out.
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 8, snapshots=())
    _write(live / "state" / "0" / "0" / "5_0a1b.zip")
    copy_checkpoint(live, copy)
    assert (copy / "state" / "0" / "0" / "SSTs" / "000001-a.sst").exists()


def test_relocating_writes_a_new_file_leaving_linked_copies_as_they_were(tmp_path: Path) -> None:
    live, snapshot = tmp_path / "live", tmp_path / "snapshot"
    meta = live / "state" / "0" / "_metadata" / "v2" / "0"
    _write(meta, '{"schema": "file:/old/place/state/0/_stateSchema/default/0"}')
    os.link(meta, snapshot)  # a node-level snapshot links it
    assert relocate(live, tmp_path / "new") == 1
    assert str(tmp_path / "new") in meta.read_text()
    assert snapshot.read_text() == '{"schema": "file:/old/place/state/0/_stateSchema/default/0"}'


def test_a_copy_before_any_snapshot_needs_no_sst(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 6, snapshots=())
    copy_checkpoint(live, copy)
    assert not list((copy / "state" / "0" / "0" / "SSTs").iterdir())


def test_a_snapshot_of_an_unknown_format_keeps_every_sst(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 12, snapshots=(10,))  # its zip is no zip: cannot tell its SSTs
    copy_checkpoint(live, copy)
    assert (copy / "state" / "0" / "0" / "SSTs" / "000001-a.sst").exists()


def test_a_warm_copy_runs_its_last_batch_again_from_the_state_before_it(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 25, snapshots=(10, 20))
    info = copy_checkpoint(live, copy, warm=True)
    assert info["batch"] == 24
    assert {"23", "24"} <= _names(copy / "offsets") and "25" not in _names(copy / "offsets")
    assert "24" not in _names(copy / "commits") and "23" in _names(copy / "commits")
    state = _names(copy / "state" / "0" / "0")
    # Batch 24 runs again on version 24: snapshot 20, changelogs 21-24, nothing newer.
    assert {"20.zip", "21.changelog", "24.changelog"} <= state
    assert not {"25.changelog", "19.changelog", "10.zip"} & state


def test_a_copy_before_any_snapshot_keeps_every_changelog(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 6, snapshots=())
    copy_checkpoint(live, copy)
    assert {f"{v}.changelog" for v in range(1, 7)} <= _names(copy / "state" / "0" / "0")


def test_a_warm_copy_at_the_first_batch_keeps_no_commit(tmp_path: Path) -> None:
    # A PE migrated in its first seconds: its only busy batch is batch 0 (batch 1 read
    # nothing new). The copy runs batch 0 again from no state; a kept commit 0 would make
    # its query load state version 1, which the copy (rightly) does not hold.
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 1, snapshots=(1,))
    _write(live / "offsets" / "1", 'v1\n{}\n{"row": 1}')  # batch 1: no new input
    _write(live / "commits" / "1", "v1\n{}")
    _write(live / "state" / "0" / "0" / "2.changelog")
    info = copy_checkpoint(live, copy, warm=True)
    assert info == {"batch": 0, "offset": {"row": 1}, "resume_floor": None}
    assert not {"0", "1"} & _names(copy / "commits")
    assert "0" in _names(copy / "offsets") and "1" not in _names(copy / "offsets")
    assert not {"1.changelog", "1.zip", "2.changelog"} & _names(copy / "state" / "0" / "0")
    # Not warm: the copy is as of batch 1, commit 0 and 1 kept (0 is a batch like any).
    copy_checkpoint(live, copy)
    assert {"0", "1"} <= _names(copy / "commits")


def test_the_resume_floor_is_the_start_of_the_last_batch_that_read_input(
    tmp_path: Path,
) -> None:
    # Batches 4 and 5 read nothing new (no-data batches): a warm copy runs batch 3 again,
    # from the end of batch 2, whichever of them the checkpoint was taken at.
    live = tmp_path / "live"
    _checkpoint(live, 4, snapshots=())
    for b in (4, 5):
        _write(live / "offsets" / str(b), 'v1\n{}\n{"row": 4}')
        _write(live / "commits" / str(b), "v1\n{}")
    assert spark_dir.resume_floor(live, 3) == {"row": 3}
    assert spark_dir.resume_floor(live, 4) == {"row": 3}
    # Past the log entries a copy keeps (two no-data batches and the batch): not known.
    assert spark_dir.resume_floor(live, 5) is None
    warm = copy_checkpoint(live, tmp_path / "warm", warm=True)
    assert (warm["batch"], warm["resume_floor"]) == (3, {"row": 3})
    assert spark_dir.resume_floor(live, 0) is None  # the first batch starts at the beginning


def test_a_query_started_on_a_warm_copy_can_be_copied_warm_again(tmp_path: Path) -> None:
    # A PE migrated twice in a row: the first warm copy keeps the offsets of its batch N and
    # the commits up to N - 1, each two back, so its oldest commit has no offsets; the query
    # started on it runs on, and the next migration copies its checkpoint warm again.
    live, first, second = tmp_path / "live", tmp_path / "first", tmp_path / "second"
    _checkpoint(live, 10, snapshots=(5,))
    assert copy_checkpoint(live, first, warm=True)["batch"] == 9
    oldest = min(int(n) for n in _names(first / "commits") if n.isdigit())
    assert not (first / "offsets" / str(oldest)).exists()  # the case at hand
    for b in range(9, 12):  # the target re-runs batch 9, then two batches of its own
        _write(first / "offsets" / str(b), f'v1\n{{}}\n{{"row": {b + 1}}}')
        _write(first / "commits" / str(b), "v1\n{}")
        _write(first / "state" / "0" / "0" / f"{b + 1}.changelog")
    info = copy_checkpoint(first, second, warm=True)
    assert info == {"batch": 11, "offset": {"row": 12}, "resume_floor": {"row": 11}}
    assert "10" in _names(second / "commits") and "11" not in _names(second / "commits")


def test_a_shipped_checkpoint_arrives_whole_or_not_at_all(tmp_path: Path) -> None:
    source = tmp_path / "origin"
    _write(source / "offsets" / "0", "v1\n{}\n{}")
    (source / "state" / "0" / "0").mkdir(parents=True)
    (source / "state" / "0" / "0" / "1.changelog").write_bytes(bytes(range(256)) * 64)
    data, digest = pack(source)
    # Not compressed again (Spark's state files are): the state's bytes ship as they are.
    assert bytes(range(256)) * 64 in data
    unpack(data, digest, tmp_path / "target" / "cp")
    got = tmp_path / "target" / "cp" / "state" / "0" / "0" / "1.changelog"
    assert got.read_bytes() == bytes(range(256)) * 64
    # A damaged archive is refused and leaves the installed checkpoint as it was.
    with pytest.raises(TornCheckpoint):
        unpack(data[:-1] + b"x", digest, tmp_path / "target" / "cp")
    assert got.read_bytes() == bytes(range(256)) * 64


@pytest.mark.parametrize(
    ("kind", "name", "link"),
    [
        (tarfile.SYMTYPE, "./state/evil", "/etc/passwd"),
        (tarfile.SYMTYPE, "./state/inside", "0/0/1.changelog"),
        (tarfile.LNKTYPE, "./state/hard", "../../outside"),
        (tarfile.REGTYPE, "./../escaped", ""),
        (tarfile.REGTYPE, "/absolute", ""),
        (tarfile.FIFOTYPE, "./state/fifo", ""),
    ],
)
def test_an_archive_with_what_pack_never_makes_is_refused_whole(
    tmp_path: Path, kind: bytes, name: str, link: str
) -> None:
    """Links out, names that climb, devices: refused before anything is written, not left
    to tarfile's ``data`` filter alone (bypassed in interpreters before 3.11.13)."""
    source = tmp_path / "origin"
    _write(source / "offsets" / "0", "v1\n{}\n{}")
    data, _ = pack(source)
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data)) as good,
        tarfile.open(fileobj=buffer, mode="w") as bad,
    ):
        for member in good.getmembers():
            bad.addfile(member, good.extractfile(member) if member.isfile() else None)
        stranger = tarfile.TarInfo(name)
        stranger.type, stranger.linkname = kind, link
        bad.addfile(stranger, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    hostile = buffer.getvalue()
    with pytest.raises(TornCheckpoint) as refused:
        unpack(hostile, hashlib.sha256(hostile).hexdigest(), tmp_path / "target" / "cp")
    assert refused.value.hint is not None and "not fogshift's" in refused.value.hint
    assert not (tmp_path / "target" / "cp").exists()
    assert not (tmp_path / "target" / "cp.incoming").exists()


def test_hard_links_between_an_archives_files_still_install(tmp_path: Path) -> None:
    """``tar.add`` stores a second name of one inode as a hard link to the first."""
    source = tmp_path / "origin"
    _write(source / "offsets" / "0", "v1\n{}\n{}")
    os.link(source / "offsets" / "0", source / "offsets" / "1")
    data, digest = pack(source)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert any(m.islnk() for m in tar.getmembers())
    unpack(data, digest, tmp_path / "target" / "cp")
    assert (tmp_path / "target" / "cp" / "offsets" / "1").read_text() == "v1\n{}\n{}"


def test_a_gzipped_checkpoint_of_an_older_agent_still_installs(tmp_path: Path) -> None:
    source = tmp_path / "origin"
    _write(source / "commits" / "0", "v1\n{}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(source, arcname=".")
    data = buffer.getvalue()
    unpack(data, hashlib.sha256(data).hexdigest(), tmp_path / "cp")
    assert (tmp_path / "cp" / "commits" / "0").read_text() == "v1\n{}"


def test_files_the_receiver_holds_stay_behind_and_are_put_back_from_its_blobs(
    tmp_path: Path,
) -> None:
    source = tmp_path / "origin"
    big = source / "state" / "0" / "0" / "1.zip"
    big.parent.mkdir(parents=True)
    big.write_bytes(bytes(range(256)) * 4096)  # 1 MiB the central store already holds
    os.utime(big, (1_700_000_000, 1_700_000_000))
    _write(source / "state" / "0" / "0" / "2.changelog", "new since the last pull")
    _write(source / "commits" / "1", "v1\n{}")
    whole, _ = pack(source)
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / sha).write_bytes(big.read_bytes())
    delta, _ = pack(source, known={sha})
    assert len(delta) < len(whole) // 10  # the 1 MiB stayed behind
    assert fill_omitted(whole, lambda s: blobs / s) is None  # nothing was left out of it
    filled = fill_omitted(delta, lambda s: blobs / s)
    assert filled is not None
    data, digest = filled
    unpack(data, digest, tmp_path / "target" / "cp")
    got = tmp_path / "target" / "cp"
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    assert sorted(p.relative_to(got) for p in got.rglob("*") if p.is_file()) == files
    for rel in files:
        assert (got / rel).read_bytes() == (source / rel).read_bytes()
    assert (got / "state" / "0" / "0" / "1.zip").stat().st_mtime == 1_700_000_000
    # A blob that is gone, or not what the digest says, is refused: ask for the whole.
    (blobs / sha).write_bytes(b"something else")
    with pytest.raises(TornCheckpoint):
        fill_omitted(delta, lambda s: blobs / s)
    (blobs / sha).unlink()
    with pytest.raises(TornCheckpoint):
        fill_omitted(delta, lambda s: blobs / s)
    # A listing that is no mapping is refused the same way (it was a 500: nobody asked for
    # the whole then).
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as odd:
        listing = tarfile.TarInfo(OMITTED)
        listing.size = 2
        odd.addfile(listing, io.BytesIO(b"[]"))
    with pytest.raises(TornCheckpoint):
        fill_omitted(buffer.getvalue(), lambda s: blobs / s)


def test_a_rewritten_large_file_ships_only_the_chunks_the_receiver_lacks(
    tmp_path: Path,
) -> None:
    # RocksDB's compaction: a new SST with the old one's values and one of them changed.
    rng = random.Random(7)
    before = rng.randbytes(2 * 1024 * 1024)
    middle = len(before) // 2
    after = before[:middle] + rng.randbytes(4096) + before[middle + 4096 :]
    held = {digest: before[o : o + n] for o, n, digest in file_chunks(before)}
    source = tmp_path / "origin"
    sst = source / "state" / "0" / "0" / "SSTs" / "000012.sst"
    sst.parent.mkdir(parents=True)
    sst.write_bytes(after)
    _write(source / "commits" / "3", "v1\n{}")
    delta, _ = pack(source, known={"0" * 64}, known_chunks=set(held))
    assert len(delta) < len(after) // 4  # the chunks around the change, not the file
    filled = fill_omitted(delta, lambda s: tmp_path / "none" / s, held.get)
    assert filled is not None
    unpack(*filled, tmp_path / "target" / "cp")
    assert (tmp_path / "target" / "cp" / "state/0/0/SSTs/000012.sst").read_bytes() == after
    assert (tmp_path / "target" / "cp" / "commits" / "3").read_text() == "v1\n{}"
    # A chunk the receiver no longer holds (or holds otherwise) is refused: ask for it whole.
    lost = next(iter(held))
    with pytest.raises(TornCheckpoint):
        fill_omitted(
            delta, lambda s: tmp_path / "none" / s, lambda d: None if d == lost else held[d]
        )
    with pytest.raises(TornCheckpoint):
        fill_omitted(delta, lambda s: tmp_path / "none" / s, lambda d: held[d][:-1] + b"?")
    # Nothing in common: the file ships whole, as before.
    whole, _ = pack(source, known={"0" * 64}, known_chunks={"f" * 64})
    assert len(whole) > len(after)
    assert fill_omitted(whole, lambda s: tmp_path / "none" / s) is None


def test_files_spark_is_still_writing_are_never_copied(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    _checkpoint(live, 30, snapshots=(10, 20))
    # What a copy can meet mid-batch: a changelog, a commit and their checksums half
    # written under temporary names (renamed into place when done).
    writing = [
        "state/0/0/.31.changelog.0f1e-uuid.TID71.tmp",
        "state/0/0/..31.changelog.0f1e-uuid.TID71.tmp.crc",
        "commits/.30.5b2c-uuid.tmp",
        "commits/..30.5b2c-uuid.tmp.crc",
    ]
    for rel in writing:
        _write(live / rel, "partial")
    for link in (False, True):
        copy_checkpoint(live, copy, link=link)
        assert not [rel for rel in writing if (copy / rel).exists()]
        assert (copy / "state" / "0" / "0" / "30.changelog").exists()


def test_digests_known_by_file_identity_are_not_computed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "origin"
    big = source / "state" / "0" / "0" / "1.zip"
    big.parent.mkdir(parents=True)
    big.write_bytes(b"z" * 4096)
    _write(source / "commits" / "0", "v1\n{}")
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    stat = big.stat()
    hashed_again: list[Path] = []
    real = spark_dir._file_sha256

    def counting(path: Path) -> str:
        hashed_again.append(path)
        return real(path)

    monkeypatch.setattr(spark_dir, "_file_sha256", counting)
    delta, _ = pack(source, known={sha}, hashed={(stat.st_dev, stat.st_ino): sha})
    assert hashed_again == [source / "commits" / "0"]  # only the file of unknown digest
    assert b"z" * 4096 not in delta  # and the known one still stayed behind


@pytest.mark.parametrize("pe", ["offsets", "commits", "state", "SSTs"])
def test_a_pe_named_like_a_checkpoint_folder_is_copied_whole(tmp_path: Path, pe: str) -> None:
    """Folders are judged by where they lie in the checkpoint, not by their names alone: the
    live folder of a PE named ``offsets`` is not Spark's offset log."""
    live = tmp_path / "checkpoints" / "p" / pe
    _checkpoint(live, 5, snapshots=())
    copy = tmp_path / "copy"
    assert copy_checkpoint(live, copy)["batch"] == 4
    assert _names(copy) == {"metadata", "offsets", "commits", "state"}
    assert (copy / "state" / "0" / "0" / "5.changelog").exists()


def test_an_install_ended_between_its_renames_is_settled(tmp_path: Path) -> None:
    target = tmp_path / "p" / "pe"
    # Killed after the old checkpoint went aside, before the new one came into place: the
    # install did not happen, and the old checkpoint is the PE's again.
    _write(replaced(target) / "commits" / "3", "old")
    assert settle_install(target) is True
    assert (target / "commits" / "3").read_text() == "old"
    assert not replaced(target).exists()
    # Killed after both renames, before the old one was removed: it is removed now.
    _write(replaced(target) / "commits" / "2", "older")
    assert settle_install(target) is False
    assert (target / "commits" / "3").read_text() == "old"
    assert not replaced(target).exists()
    assert settle_install(target) is None
