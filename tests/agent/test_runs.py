"""An agent's runs: a machine that went down under the last one is told from a process that
died (pure file logic; the whole path, a node back after it, in
tests/integration/test_restoration.py)."""

from __future__ import annotations

import json
from pathlib import Path

from fogshift.agent.runs import RUN_FILE, boot_id, note_start, note_stop, set_aside


def test_a_run_that_did_not_stop_under_another_boot_is_told(tmp_path: Path) -> None:
    assert note_start(tmp_path, "boot-1") is None  # the first run
    # Killed, started again on the same boot: its files were in the page cache.
    assert note_start(tmp_path, "boot-1") is None
    # The machine went down under it (power loss, a crash): another boot id.
    assert note_start(tmp_path, "boot-2") == "boot-1"
    assert json.loads((tmp_path / RUN_FILE).read_text())["boot_id"] == "boot-2"
    # Stopped, then the machine started again: nothing to distrust.
    note_stop(tmp_path)
    assert not (tmp_path / RUN_FILE).exists()
    assert note_start(tmp_path, "boot-3") is None
    # Unknown boot ids (not Linux) or an unreadable note tell nothing.
    assert note_start(tmp_path, None) is None
    assert note_start(tmp_path, "boot-4") is None
    (tmp_path / RUN_FILE).write_text("{not json")
    assert note_start(tmp_path, "boot-5") is None


def test_the_machines_boot_id_is_read_where_there_is_one(tmp_path: Path) -> None:
    (tmp_path / "id").write_text("1b6a0c39-5a3c-4a5e-9a44-7f0c1a2b3c4d\n")
    assert boot_id(tmp_path / "id") == "1b6a0c39-5a3c-4a5e-9a44-7f0c1a2b3c4d"
    assert boot_id(tmp_path / "absent") is None
    assert boot_id() is not None  # (this machine: Linux)


def test_set_aside_moves_what_the_folders_hold_and_keeps_one_set(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "p" / "agg").mkdir(parents=True)
    (tmp_path / "node-checkpoints").mkdir()  # empty: left where it is
    (tmp_path / "replicas" / "x").mkdir(parents=True)  # not named: stays
    first = set_aside(tmp_path, ("checkpoints", "node-checkpoints"))
    assert first is not None and (first / "checkpoints" / "p" / "agg").is_dir()
    assert not (tmp_path / "checkpoints").exists() and (tmp_path / "node-checkpoints").is_dir()
    assert (tmp_path / "replicas" / "x").is_dir()
    assert set_aside(tmp_path, ("checkpoints", "node-checkpoints")) is None  # nothing left
    (tmp_path / "checkpoints" / "q" / "agg").mkdir(parents=True)
    second = set_aside(tmp_path, ("checkpoints",))
    assert second is not None and (second / "checkpoints" / "q" / "agg").is_dir()
    assert not first.exists() or first == second  # only the last set is kept
    assert len(list((tmp_path / "distrusted").iterdir())) == 1
