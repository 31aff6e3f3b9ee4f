"""Spark checkpoint folders seen from outside Spark (pure file logic)."""

from __future__ import annotations

from pathlib import Path

from fogshift.checkpoint.spark_dir import clear_orphan_state


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
