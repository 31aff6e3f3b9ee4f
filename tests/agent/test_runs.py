"""An agent's runs: a machine that went down under the last one is told from a process that
died (pure file logic; the whole path, a node back after it, in
tests/integration/test_restoration.py)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from fogshift.agent import node as node_module
from fogshift.agent.node import NodeRuntime
from fogshift.agent.runs import (
    RUN_FILE,
    boot_id,
    last_run_went_down,
    note_start,
    note_stop,
    set_aside,
)


def test_a_run_that_did_not_stop_under_another_boot_is_told(tmp_path: Path) -> None:
    assert last_run_went_down(tmp_path, "boot-1") is None  # the first run
    note_start(tmp_path, "boot-1")
    # Killed, started again on the same boot: its files were in the page cache.
    assert last_run_went_down(tmp_path, "boot-1") is None
    # The machine went down under it (power loss, a crash): another boot id. Told until
    # the next run is noted (a start cut short before that tells it again).
    assert last_run_went_down(tmp_path, "boot-2") == "boot-1"
    assert last_run_went_down(tmp_path, "boot-2") == "boot-1"
    note_start(tmp_path, "boot-2")
    assert json.loads((tmp_path / RUN_FILE).read_text())["boot_id"] == "boot-2"
    assert last_run_went_down(tmp_path, "boot-2") is None
    # Stopped, then the machine started again: nothing to distrust.
    note_stop(tmp_path)
    assert not (tmp_path / RUN_FILE).exists()
    assert last_run_went_down(tmp_path, "boot-3") is None
    # Unknown boot ids (not Linux) or an unreadable note tell nothing.
    note_start(tmp_path, None)
    assert last_run_went_down(tmp_path, "boot-4") is None
    note_start(tmp_path, "boot-4")
    assert last_run_went_down(tmp_path, None) is None
    (tmp_path / RUN_FILE).write_text("{not json")
    assert last_run_went_down(tmp_path, "boot-5") is None


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


def test_a_folder_that_cannot_be_moved_is_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A mount point (EBUSY), another file system (EXDEV): what it holds goes instead.
    (tmp_path / "checkpoints" / "p" / "agg").mkdir(parents=True)
    (tmp_path / "checkpoints" / "file").write_text("x")

    def refuse(self: Path, target: Path) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(Path, "rename", refuse)
    assert set_aside(tmp_path, ("checkpoints",)) is not None
    assert (tmp_path / "checkpoints").is_dir() and not any((tmp_path / "checkpoints").iterdir())


def test_a_start_cut_short_before_the_set_aside_distrusts_again(
    runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run was noted before the set-aside: one that failed (or an agent killed in it)
    # forgot the crash, and the next start trusted the torn checkpoints.
    home = runtime.config.home
    (home / "checkpoints" / "p" / "agg").mkdir(parents=True)
    (home / RUN_FILE).write_text(json.dumps({"boot_id": "a boot before this one"}))
    monkeypatch.setattr(node_module, "set_aside", lambda *a: (_ for _ in ()).throw(OSError("cut")))
    with pytest.raises(OSError):
        runtime._distrust_after_a_machine_stop()
    assert last_run_went_down(home, boot_id()) == "a boot before this one"  # still told
    monkeypatch.undo()
    runtime._distrust_after_a_machine_stop()
    assert not (home / "checkpoints").exists() and (home / "distrusted").is_dir()
    assert last_run_went_down(home, boot_id()) is None  # noted once set aside
