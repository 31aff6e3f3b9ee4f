"""Node-level snapshots link every file: from the previous snapshot when it has it (its
digest reused), else from the live checkpoint (digested). Pure file-system logic on a
synthetic checkpoint laid out as Spark writes one."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from fogshift.checkpoint import spark_dir
from fogshift.checkpoint import store as store_module
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.store import KEEP, SnapshotPins, known_digests, take_snapshot
from tests.checkpoint.hadoop_checksums import checksummed


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _batch(live: Path, b: int) -> None:
    """Batch ``b`` of a one-partition stateful query: its plan, commit and changelog."""
    _write(live / "offsets" / str(b), f'v1\n{{}}\n{{"row": {b + 1}}}')
    _write(live / "commits" / str(b), "v1\n{}")
    _write(live / "state" / "0" / "0" / f"{b + 1}.changelog", f"changes of batch {b}")


def _checkpoint(live: Path, batches: int) -> None:
    _write(live / "metadata", '{"id": "q"}')
    _write(live / "state" / "0" / "_metadata" / "v2" / "0", "operator metadata")
    for b in range(batches):
        _batch(live, b)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_snapshot_links_new_files_from_the_live_checkpoint_and_the_rest_from_the_last(
    tmp_path: Path,
) -> None:
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 3)
    first = take_snapshot(live, store, "p", "agg")
    assert first is not None and first["batch"] == 2
    one = store / first["id"]
    changelog = "state/0/0/3.changelog"
    # A new file is the live file itself (no data written), and digested.
    assert os.path.samefile(one / changelog, live / changelog)
    assert first["files"][changelog]["sha256"] == _digest(live / changelog)
    assert first["new_bytes"] == sum(f["size"] for f in first["files"].values())

    _batch(live, 3)
    # Spark replaces a file by renaming a new one over its name: a snapshot keeps the old.
    replaced = live / "metadata.tmp"
    replaced.write_text('{"id": "other"}')
    replaced.replace(live / "metadata")
    second = take_snapshot(live, store, "p", "agg")
    assert second is not None and second["batch"] == 3
    two = store / second["id"]
    assert (one / "metadata").read_text() == '{"id": "q"}'
    # Unchanged: the previous snapshot's file, its digest reused; new: from live, digested.
    assert os.path.samefile(two / changelog, one / changelog)
    assert second["files"][changelog] == first["files"][changelog]
    new = "state/0/0/4.changelog"
    assert os.path.samefile(two / new, live / new)
    assert second["files"][new]["sha256"] == _digest(live / new)
    # Another file under an old name (another size): from live, digested again.
    assert os.path.samefile(two / "metadata", live / "metadata")
    assert second["files"]["metadata"]["sha256"] == _digest(live / "metadata")
    fresh = ("offsets/3", "commits/3", new, "metadata")
    assert second["new_bytes"] == sum((live / rel).stat().st_size for rel in fresh)
    for rel, entry in second["files"].items():
        assert entry["sha256"] == _digest(two / rel), rel


def test_a_file_rewritten_under_its_name_with_the_same_size_is_the_new_one(
    tmp_path: Path,
) -> None:
    """A batch run again (after a restart) writes its changelog and checksum anew under the
    same names, a checksum always with the same size: the snapshot holds what is live, with
    its digest, and never the previous snapshot's file of that name."""
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 3)
    first = take_snapshot(live, store, "p", "agg")
    assert first is not None
    changelog = live / "state" / "0" / "0" / "3.changelog"
    redone = changelog.with_name(".3.changelog.tmp")
    redone.write_text("changes of batch X")  # as long as "changes of batch 2"
    redone.replace(changelog)
    _batch(live, 3)
    second = take_snapshot(live, store, "p", "agg")
    assert second is not None
    rel = "state/0/0/3.changelog"
    frozen = store / second["id"] / rel
    assert frozen.read_text() == "changes of batch X"
    assert second["files"][rel]["sha256"] == _digest(changelog) != first["files"][rel]["sha256"]
    # What did not change is shared with the first snapshot, its digest not taken again.
    assert os.path.samefile(
        frozen.parent / "2.changelog", store / first["id"] / "state/0/0/2.changelog"
    )
    assert second["new_bytes"] == sum(
        (live / r).stat().st_size for r in ("offsets/3", "commits/3", "state/0/0/4.changelog", rel)
    )


def test_a_file_that_cannot_be_linked_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 2)

    def cross_device(src: str, dst: str) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(spark_dir.os, "link", cross_device)
    manifest = take_snapshot(live, store, "p", "agg")
    assert manifest is not None
    copied = store / manifest["id"] / "state/0/0/2.changelog"
    assert copied.read_text() == "changes of batch 1"
    assert not os.path.samefile(copied, live / "state/0/0/2.changelog")


def test_a_snapshot_being_read_outlives_the_clean_up_until_its_reads_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 1)
    clock = [1000.0]
    monkeypatch.setattr(store_module.time, "monotonic", lambda: clock[0])
    pins = SnapshotPins(hold_s=60.0)
    first = take_snapshot(live, store, "p", "agg")
    assert first is not None
    pins.touch("p", "agg", first["id"])  # a slow central pull starts reading it
    for b in range(1, 5):  # the node snapshots on while the pull goes on
        _batch(live, b)
        clock[0] += 5.0
        assert take_snapshot(live, store, "p", "agg", pinned=lambda: pins.held("p", "agg"))
    kept = sorted(p.name for p in store.iterdir())
    assert kept[0] == first["id"] and len(kept) == 1 + KEEP  # the newest two + the pinned
    assert pins.held("q", "agg") == frozenset()  # pins are per PE
    clock[0] += 61.0  # the reads stopped a minute ago: the pin lapses
    assert pins.held("p", "agg") == frozenset()
    _batch(live, 5)
    assert take_snapshot(live, store, "p", "agg", pinned=lambda: pins.held("p", "agg"))
    assert first["id"] not in {p.name for p in store.iterdir()}
    assert len(list(store.iterdir())) == KEEP


def test_a_pull_that_begins_while_a_snapshot_is_taken_keeps_what_it_reads(
    tmp_path: Path,
) -> None:
    # The pins were read as the snapshot began: a pull pinning the oldest kept snapshot
    # while the new one was copied and hashed lost it to that snapshot's clean-up.
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 1)
    pins = SnapshotPins(hold_s=60.0)
    first = take_snapshot(live, store, "p", "agg")
    assert first is not None
    for b in range(1, KEEP):
        _batch(live, b)
        assert take_snapshot(live, store, "p", "agg", pinned=lambda: pins.held("p", "agg"))
    _batch(live, KEEP)

    def pull_begins(staged: Path, batch: int) -> bool:  # (between the copy and the clean-up)
        pins.touch("p", "agg", first["id"])
        return True

    assert take_snapshot(
        live, store, "p", "agg", pinned=lambda: pins.held("p", "agg"), complete=pull_begins
    )
    assert first["id"] in {p.name for p in store.iterdir()}


def test_the_newest_snapshot_tells_the_digests_of_the_live_files_it_links(tmp_path: Path) -> None:
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 2)
    manifest = take_snapshot(live, store, "p", "agg")
    assert manifest is not None
    digests = known_digests(store)
    changelog = live / "state" / "0" / "0" / "2.changelog"
    stat = changelog.stat()
    assert digests[(stat.st_dev, stat.st_ino)] == _digest(changelog)
    assert len(digests) == len(manifest["files"])
    assert known_digests(tmp_path / "none") == {}


def test_across_file_systems_a_snapshot_links_the_last_ones_unchanged_files_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live checkpoint on another file system: its files are copied into the first
    snapshot, and a later one links from that what did not change (same name, size and
    time) and copies the rest — a file rewritten with the same size too."""
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 3)
    real_link = os.link

    def link(src: str, dst: str) -> None:
        if str(src).startswith(str(live)):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_link(src, dst)

    monkeypatch.setattr(spark_dir.os, "link", link)
    first = take_snapshot(live, store, "p", "agg")
    assert first is not None
    changelog = live / "state" / "0" / "0" / "3.changelog"
    redone = changelog.with_name(".3.changelog.tmp")
    redone.write_text("changes of batch X")  # as long as "changes of batch 2"
    os.utime(redone, ns=(changelog.stat().st_atime_ns, changelog.stat().st_mtime_ns + 10**6))
    redone.replace(changelog)
    _batch(live, 3)
    second = take_snapshot(live, store, "p", "agg")
    assert second is not None
    one, two = store / first["id"], store / second["id"]
    assert (two / "state/0/0/3.changelog").read_text() == "changes of batch X"
    assert not os.path.samefile(two / "state/0/0/3.changelog", one / "state/0/0/3.changelog")
    assert os.path.samefile(two / "state/0/0/2.changelog", one / "state/0/0/2.changelog")
    assert second["files"]["state/0/0/2.changelog"] == first["files"]["state/0/0/2.changelog"]
    for rel, entry in second["files"].items():
        assert entry["sha256"] == _digest(two / rel), rel


def test_snapshots_ahead_of_the_live_checkpoint_are_of_another_history(tmp_path: Path) -> None:
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 6)
    assert take_snapshot(live, store, "p", "agg")["batch"] == 5  # type: ignore[index]
    # Another history under the PE's name (put there by hand: the agent clears the store
    # when it installs one), behind the snapshots: snapshotted all the same, and the only.
    shutil.rmtree(live)
    _checkpoint(live, 4)
    _write(live / "metadata", '{"id": "other"}')
    again = take_snapshot(live, store, "p", "agg")
    assert again is not None and again["batch"] == 3
    assert [f.name for f in store.iterdir()] == [again["id"]]
    assert (store / again["id"] / "metadata").read_text() == '{"id": "other"}'
    assert take_snapshot(live, store, "p", "agg") is None  # nothing new since


def test_a_file_replaced_between_the_listing_and_its_link_is_digested_as_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent rewrites its counters file (by a rename) after each batch, while a snapshot
    # may be copying: listed as the old file, linked as the new one, it kept the previous
    # snapshot's digest, and a central copy or a migration then carried the old content.
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 3)
    _write(live / "fogshift-metrics.json", '{"events_in": 20}')
    assert take_snapshot(live, store, "p", "agg") is not None
    _batch(live, 3)
    link = os.link

    def replacing_first(src: str, dst: str, *args: object, **kwargs: object) -> None:
        if src.endswith("fogshift-metrics.json"):
            fresh = Path(src).with_name(".metrics.tmp")
            fresh.write_text('{"events_in": 30}')
            fresh.replace(src)
        link(src, dst, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(spark_dir.os, "link", replacing_first)
    second = take_snapshot(live, store, "p", "agg")
    assert second is not None
    frozen = store / second["id"]
    assert (frozen / "fogshift-metrics.json").read_text() == '{"events_in": 30}'
    for rel, entry in second["files"].items():
        assert entry["sha256"] == _digest(frozen / rel), rel


def test_a_manifest_that_cannot_be_read_is_no_snapshot(tmp_path: Path) -> None:
    # Renamed into place unsynced, a manifest can come back empty after a power loss: it
    # was raised, which failed every heartbeat of the node and every later snapshot.
    from fogshift.checkpoint.store import MANIFEST, latest_manifest

    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 2)
    first = take_snapshot(live, store, "p", "agg")
    assert first is not None
    _batch(live, 2)
    second = take_snapshot(live, store, "p", "agg")
    assert second is not None
    (store / second["id"] / MANIFEST).write_text("")
    assert latest_manifest(store) == first
    _batch(live, 3)
    third = take_snapshot(live, store, "p", "agg")
    assert third is not None and third["batch"] == 3 and latest_manifest(store) == third


def test_a_file_that_does_not_match_the_checksums_spark_wrote_is_not_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node killed between a batch's commit and its snapshot came back with that batch's
    # state file emptied (its disk never got it): the snapshot taken then digested it as it
    # was, the central store pulled it, and every restore from there failed as the PE's
    # start on the node did. Spark's checksums, written with the file, tell.
    monkeypatch.setattr(store_module, "SETTLE_S", 0.0)
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 2)
    for path in live.rglob("*"):
        if path.is_file():
            checksummed(path, per=4)
    first = take_snapshot(live, store, "p", "agg")  # (each file matches its checksums)
    assert first is not None and first["batch"] == 1
    _batch(live, 2)
    changelog = live / "state" / "0" / "0" / "3.changelog"
    checksummed(changelog, per=4)
    whole = changelog.read_bytes()
    changelog.write_bytes(b"")
    with pytest.raises(TornCheckpoint) as refused:
        take_snapshot(live, store, "p", "agg")
    runs = (len(whole) + 3) // 4  # (of 4 bytes each: the file's length to within 4)
    assert "at batch 2 is torn: state/0/0/3.changelog has 0 bytes, its checksums are of " \
           f"{runs * 4 - 3} to {runs * 4} bytes: not frozen" in refused.value.message  # fmt: skip
    assert [f.name for f in store.iterdir()] == [first["id"]]  # (no staging left either)
    # Changed, not cut: the run of bytes that differs is named.
    changelog.write_bytes(whole[:5] + b"?" + whole[6:])
    with pytest.raises(TornCheckpoint, match=r"3\.changelog's bytes 4 to 7 do not match"):
        take_snapshot(live, store, "p", "agg")
    # Whole again (or a checksum file that is none, as Spark's reader passes it over).
    changelog.write_bytes(whole)
    assert take_snapshot(live, store, "p", "agg")["batch"] == 2  # type: ignore[index]
    _batch(live, 3)
    (live / "state" / "0" / "0" / ".4.changelog.crc").write_bytes(b"")
    assert take_snapshot(live, store, "p", "agg")["batch"] == 3  # type: ignore[index]


def test_a_file_linked_between_hadoops_two_renames_is_taken_a_round_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hadoop renames a file into place, then its checksums: one written again under its
    # name (a stopped query's late state upload) meets its old checksums in between, and
    # is no torn file for that.
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 3)
    changelog = live / "state" / "0" / "0" / "3.changelog"
    checksummed(changelog, per=4)
    fresh = changelog.with_name(".3.changelog.tmp")
    fresh.write_text("changes of batch 2, written again")
    fresh.replace(changelog)
    monkeypatch.setattr(store_module.time, "sleep", lambda s: checksummed(changelog, per=4))
    assert take_snapshot(live, store, "p", "agg") is None  # (the second rename came)
    assert not list(store.iterdir())  # (no staging left)
    taken = take_snapshot(live, store, "p", "agg")
    assert taken is not None and taken["batch"] == 2


def test_a_pe_discarded_while_its_snapshot_is_taken_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent's discard deletes the live checkpoint and the snapshot store, sharing no
    # lock with the snapshot thread: its copy found no commit, made the store's folder
    # again (reported as left until discarded once more) and failed on a batch `None`.
    live, store = tmp_path / "live", tmp_path / "store"
    _checkpoint(live, 3)
    copy = spark_dir.copy_checkpoint

    def discarded_first(source: Path, target: Path, **options: object) -> dict[str, object]:
        shutil.rmtree(live)
        shutil.rmtree(store, ignore_errors=True)
        return copy(source, target, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module, "copy_checkpoint", discarded_first)
    assert take_snapshot(live, store, "p", "agg") is None
    assert not store.exists()
