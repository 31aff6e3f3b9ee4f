"""The key index beside a keyed PE's live checkpoint (fogshift.checkpoint.key_index): the
keys as of a committed batch from a base and the notes of the batches after it, never a
guess when a note is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fogshift.checkpoint import key_index
from fogshift.checkpoint.spark_dir import clear_orphan_state, copy_checkpoint


def notes(folder: Path, *batches: dict[str, dict[str, int | None]]) -> None:
    """Store ``batches`` as the notes of batches 0, 1, ..."""
    for batch, changes in enumerate(batches):
        key_index.write_batch(folder, batch, changes)


def test_the_notes_of_every_batch_since_the_first_give_the_keys(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    notes(
        folder,
        {"a": {"f_n": 1}, "b": {"f_n": 1, "held": 9}},
        {"a": {"f_n": 2}, "b": {"held": None}},
        {"a": {"f_n": None}, "c": {"f_n": 1}},  # a moved out: every variable cleared
        {"b": {"f_n": 5}},  # not committed yet
    )
    assert key_index.read(folder, 0) == {"a": {"f_n": 1}, "b": {"f_n": 1, "held": 9}}
    assert key_index.read(folder, 1) == {"a": {"f_n": 2}, "b": {"f_n": 1}}
    # The notes of a batch after the commit are not read: batch 3 is not in it.
    assert key_index.read(folder, 2) == {"b": {"f_n": 1}, "c": {"f_n": 1}}
    assert key_index.read(folder, None) is None


def test_a_missing_note_or_base_makes_the_index_unusable(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    # A query resumed from a copied checkpoint (copies leave the index out) notes only the
    # batches it runs: the batches before them are unknown.
    key_index.write_batch(folder, 7, {"a": {"f_n": 1}})
    key_index.write_batch(folder, 8, {"b": {"f_n": 1}})
    assert key_index.read(folder, 8) is None
    # A listing of the state store as of batch 7 gives it a base: from there it tells.
    key_index.write_base(folder, 7, {"a": {"f_n": 1}, "z": {"f_n": 3}})
    assert key_index.read(folder, 8) == {"a": {"f_n": 1}, "z": {"f_n": 3}, "b": {"f_n": 1}}
    # A base after the commit is not used; a note between base and commit is needed.
    key_index.write_base(folder, 20, {"q": {"f_n": 1}})
    assert key_index.read(folder, 9) is None
    (folder / "8.json").write_text("{not json")
    assert key_index.read(folder, 8) is None
    assert key_index.read(tmp_path / "none", 3) is None


def test_compaction_folds_the_notes_into_a_base_and_keeps_the_later_ones(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    notes(folder, {"a": {"f_n": 1}}, {"b": {"f_n": 2}}, {"a": {"f_n": None}}, {"c": {"f_n": 4}})
    assert key_index.compact(folder, 2, min_notes=1)
    # No base before it: the notes it folded stay until the next fold.
    assert sorted(p.name for p in folder.iterdir()) == [
        "0.json", "1.json", "2.json", "3.json", "base-2.json"]  # fmt: skip
    assert key_index.read(folder, 2) == {"b": {"f_n": 2}}
    assert key_index.read(folder, 3) == {"b": {"f_n": 2}, "c": {"f_n": 4}}
    key_index.write_batch(folder, 4, {"b": {"f_n": None}})
    key_index.write_batch(folder, 5, {"d": {"f_n": 1}})
    assert key_index.compact(folder, 4, min_notes=2)
    # The base before (2) and the notes after it stay; what base 2 replaced goes.
    assert sorted(p.name for p in folder.iterdir()) == [
        "3.json", "4.json", "5.json", "base-2.json", "base-4.json"]  # fmt: skip
    assert key_index.read(folder, 4) == {"c": {"f_n": 4}}
    assert key_index.read(folder, 3) == {"b": {"f_n": 2}, "c": {"f_n": 4}}
    assert key_index.read(folder, 5) == {"c": {"f_n": 4}, "d": {"f_n": 1}}
    # Counted from the newest base, one note is not two: as it was.
    assert not key_index.compact(folder, 5, min_notes=2)
    assert not key_index.compact(folder, 4, min_notes=1)  # nothing new: as it was
    assert sorted(p.name for p in folder.iterdir()) == [
        "3.json", "4.json", "5.json", "base-2.json", "base-4.json"]  # fmt: skip


def test_a_warm_copy_right_after_a_compaction_lists_from_the_index(tmp_path: Path) -> None:
    # A warm copy resumes before its last busy batch: when that is the batch a compaction
    # just folded, the copy (which takes only the index's files up to its commit) still
    # finds a base and the notes after it.
    live = tmp_path / "live"
    last = 2 * key_index.COMPACT_AFTER + 1
    for batch in range(last + 1):
        for log in ("offsets", "commits"):
            (live / log).mkdir(parents=True, exist_ok=True)
            (live / log / str(batch)).write_text(log_entry(10 * batch))
    index = key_index.folder_of(live)
    notes(index, *({f"k{n}": {"f_n": n + 1}} for n in range(last + 1)))
    assert key_index.compact(index, key_index.COMPACT_AFTER)
    assert key_index.compact(index, last)
    copy = tmp_path / "copy"
    copy_checkpoint(live, copy, warm=True)
    expected = {f"k{n}": {"f_n": n + 1} for n in range(last)}
    assert key_index.read(key_index.folder_of(copy), last - 1) == expected


def test_compaction_waits_for_enough_notes(tmp_path: Path) -> None:
    # A base holds every key: it is rewritten only once COMPACT_AFTER notes piled up, not
    # at every round (each snapshot and central pull carries what changed).
    folder = tmp_path / "keys"
    few = [{f"k{n}": {"f_n": n}} for n in range(key_index.COMPACT_AFTER - 1)]
    notes(folder, *few)
    last = len(few) - 1
    assert not key_index.compact(folder, last)
    assert not any(p.name.startswith("base-") for p in folder.iterdir())
    key_index.write_batch(folder, last + 1, {"k0": {"f_n": None}})
    assert key_index.compact(folder, last + 1)
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("base-")) == [
        f"base-{last + 1}.json"]  # fmt: skip
    assert key_index.read(folder, last + 1) == {f"k{n}": {"f_n": n} for n in range(1, last + 1)}


def test_a_large_base_is_folded_anew_only_once_the_notes_add_up_to_a_share_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With many keys a base is large and each batch's notes small: folding them every
    # COMPACT_AFTER notes would rewrite the whole base for a few changes.
    folder = tmp_path / "keys"
    many = {f"key-{n:05d}": {"f_n": n} for n in range(2000)}
    key_index.write_base(folder, 0, many)
    base_bytes = (folder / "base-0.json").stat().st_size
    batch = 0
    noted = 0
    while noted + 200 < key_index.COMPACT_SHARE * base_bytes:
        batch += 1
        key_index.write_batch(folder, batch, {f"key-{batch:05d}": {"f_n": -batch}})
        noted += (folder / f"{batch}.json").stat().st_size
        assert not key_index.compact(folder, batch), batch
    assert batch > key_index.COMPACT_AFTER
    while not key_index.compact(folder, batch):  # the share is reached within a few more
        batch += 1
        key_index.write_batch(folder, batch, {f"key-{batch:05d}": {"f_n": -batch}})
    assert (folder / f"base-{batch}.json").is_file()
    expected = {**many, **{f"key-{b:05d}": {"f_n": -b} for b in range(1, batch + 1)}}
    assert key_index.read(folder, batch) == expected
    # However small the notes, at most COMPACT_MOST pile up.
    monkeypatch.setattr(key_index, "COMPACT_MOST", 3)
    for more in range(batch + 1, batch + 3):
        key_index.write_batch(folder, more, {})
        assert not key_index.compact(folder, more, min_notes=1)
    key_index.write_batch(folder, batch + 3, {})
    assert key_index.compact(folder, batch + 3, min_notes=1)
    assert key_index.read(folder, batch + 3) == expected


def test_compaction_drops_notes_no_base_can_complete(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    key_index.write_batch(folder, 5, {"a": {"f_n": 1}})
    key_index.write_batch(folder, 6, {"a": {"f_n": 2}})
    key_index.write_batch(folder, 7, {"b": {"f_n": 2}})
    assert key_index.compact(folder, 6)  # (however few: they are of no use)
    # Batch 7's note stays: a listing of batch 6 or 7 makes a base it completes.
    assert sorted(p.name for p in folder.iterdir()) == ["7.json"]
    key_index.write_base(folder, 6, {"a": {"f_n": 2}})
    assert key_index.read(folder, 7) == {"a": {"f_n": 2}, "b": {"f_n": 2}}
    assert not key_index.compact(tmp_path / "absent", 3)
    assert not key_index.compact(folder, None)


def log_entry(position: int) -> str:
    """An offset (or commit) log entry of a batch ending at ``position`` of input ``s``."""
    return 'v1\n{"batchWatermarkMs":0}\n' + json.dumps({"positions": {"s": position}})


def test_a_copy_of_the_checkpoint_takes_the_index_as_of_its_commit(tmp_path: Path) -> None:
    # A copy resumes a query elsewhere (a migration, a restore): the index comes along as of
    # the copy's commit, so the resumed query's listings need no state read; a note or base
    # of a later batch (a warm copy runs its last one again) would be of another run.
    live = tmp_path / "live"
    for batch in range(4):
        for log in ("offsets", "commits"):
            (live / log).mkdir(parents=True, exist_ok=True)
            (live / log / str(batch)).write_text(log_entry(10 * batch))
    (live / "offsets" / "4").write_text(log_entry(40))
    index = key_index.folder_of(live)
    key_index.write_base(index, 1, {"a": {"f_n": 1}})
    key_index.write_batch(index, 2, {"b": {"f_n": 2}})
    key_index.write_batch(index, 3, {"a": {"f_n": None}})
    key_index.write_batch(index, 4, {"c": {"f_n": 3}})  # batch 4: planned, not committed
    key_index.write_base(index, 4, {"z": {"f_n": 9}})  # (as no compaction writes one)
    (index / "stray.txt").write_text("none of the index's")
    (live / "metadata").write_text("{}")
    copy = tmp_path / "copy"
    copy_checkpoint(live, copy)
    copied = key_index.folder_of(copy)
    assert sorted(p.name for p in copied.iterdir()) == ["2.json", "3.json", "base-1.json"]
    assert key_index.read(copied, 3) == {"b": {"f_n": 2}} == key_index.read(index, 3)
    # A warm copy drops its last busy batch's commit (3), which its query runs again.
    copy_checkpoint(live, copy, warm=True)
    assert sorted(p.name for p in copied.iterdir()) == ["2.json", "base-1.json"]
    assert key_index.read(copied, 2) == {"a": {"f_n": 1}, "b": {"f_n": 2}}


def test_a_checkpoint_without_batches_keeps_no_index(tmp_path: Path) -> None:
    # Its query starts from its first batch: a base left there would stand for batches
    # this query has not run.
    live = tmp_path / "live"
    key_index.write_base(key_index.folder_of(live), 40, {"a": {"f_n": 1}})
    clear_orphan_state(live)
    assert not key_index.folder_of(live).exists()
