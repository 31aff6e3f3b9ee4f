"""The registry's epochs (never backwards) and its operations journal, on a real SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.orchestrator.registry import Registry
from fogshift.spec import parse_spec
from fogshift.spec.models import PipelineSpec


def spec(tmp_path: Path, elements: tuple[str, ...] = ("source", "sink")) -> PipelineSpec:
    kinds = {
        "source": {"kind": "csv-source", "node": "cloud", "options": {"path": "in.csv"}},
        "sink": {"kind": "csv-sink", "node": "fog-a", "inputs": ["source"],
                 "options": {"path": "out/o.csv"}},
    }  # fmt: skip
    return parse_spec(
        {"pipeline": "p", "elements": [{"id": e, **kinds[e]} for e in elements]}, tmp_path
    )


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "orchestrator.db")
    yield reg
    reg.close()


def test_a_redeployment_continues_above_every_epoch_given_before(
    registry: Registry, tmp_path: Path
) -> None:
    assert registry.put_pipeline(spec(tmp_path), "running") == {"source": 1, "sink": 1}
    assert registry.next_epoch("p", "sink") == 2
    assert registry.next_epoch("p", "sink") == 3
    # Redeployed under the same name: an instance of the first deployment (epoch <= 3)
    # must be older than every new one.
    assert registry.put_pipeline(spec(tmp_path), "running") == {"source": 2, "sink": 4}
    assert registry.epochs("p") == {"source": 2, "sink": 4}


def test_epochs_outlive_a_pe_missing_from_a_deployment(registry: Registry, tmp_path: Path) -> None:
    registry.put_pipeline(spec(tmp_path), "running")
    registry.next_epoch("p", "sink")
    registry.put_pipeline(spec(tmp_path, ("source",)), "running")  # no sink this time
    assert registry.epoch("p", "sink") == 2
    assert registry.put_pipeline(spec(tmp_path), "running")["sink"] == 3


def test_epochs_survive_a_restart_of_the_registry(tmp_path: Path) -> None:
    first = Registry(tmp_path / "orchestrator.db")
    first.put_pipeline(spec(tmp_path), "running")
    first.next_epoch("p", "source")
    first.close()
    again = Registry(tmp_path / "orchestrator.db")
    try:
        assert again.epochs("p") == {"source": 2, "sink": 1}
    finally:
        again.close()


def test_every_commit_is_synced_whatever_sqlites_build_defaults_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An epoch given and lost with the power would be given again: FULL (2), not the WAL
    # mode's NORMAL (1) some builds default to (a connection that starts at NORMAL here).
    connect = sqlite3.connect

    def normal_by_default(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = connect(*args, **kwargs)
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    monkeypatch.setattr(sqlite3, "connect", normal_by_default)
    registry = Registry(tmp_path / "orchestrator.db")
    try:
        assert registry._db.execute("PRAGMA synchronous").fetchone() == (2,)
        assert registry._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        registry.close()


def test_a_registry_that_kept_epochs_with_the_placements_keeps_them(tmp_path: Path) -> None:
    # The schema before the epochs table: the epoch was a column of the placements.
    db = sqlite3.connect(tmp_path / "orchestrator.db")
    db.executescript(
        "CREATE TABLE pipelines (name TEXT PRIMARY KEY, spec TEXT NOT NULL, "
        "status TEXT NOT NULL, updated REAL NOT NULL);"
        "CREATE TABLE placements (pipeline TEXT NOT NULL REFERENCES pipelines(name) "
        "ON DELETE CASCADE, element TEXT NOT NULL, node TEXT NOT NULL, updated REAL NOT NULL, "
        "epoch INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (pipeline, element));"
        f"INSERT INTO pipelines VALUES ('p', '{spec(tmp_path).model_dump_json()}', 'running', 0);"
        "INSERT INTO placements VALUES ('p', 'source', 'cloud', 0, 5);"
    )
    db.commit()
    db.close()
    registry = Registry(tmp_path / "orchestrator.db")
    try:
        assert registry.epoch("p", "source") == 5
        assert registry.next_epoch("p", "source") == 6
    finally:
        registry.close()


def test_the_journal_records_phases_and_routes_with_the_placement(
    registry: Registry, tmp_path: Path
) -> None:
    registry.put_pipeline(spec(tmp_path), "running")
    op = registry.begin_operation("migration", "p", "sink", "fog-a", "fog-b", "me", "preparing")
    assert (op.epoch, op.phase, op.outcome) == (1, "preparing", None)
    assert registry.epoch("p", "sink") == 1  # a migration keeps the PE's epoch
    registry.advance(op.id, "switching")
    assert [o.phase for o in registry.unfinished()] == ["switching"]
    assert registry.get_pipeline("p").placement["sink"] == "fog-a"  # type: ignore[union-attr]
    registry.route(op.id, "fog-b")
    routed = registry.operation(op.id)
    assert routed is not None and routed.phase == "routed"
    assert registry.get_pipeline("p").placement["sink"] == "fog-b"  # type: ignore[union-attr]
    registry.finish(op.id, "migrated")
    assert registry.unfinished() == []
    assert [(o.kind, o.outcome) for o in registry.operations("p", "sink")] == [
        ("migration", "migrated")
    ]


def test_a_restore_entry_takes_a_new_epoch_and_a_fence_records_its_own(
    registry: Registry, tmp_path: Path
) -> None:
    registry.put_pipeline(spec(tmp_path), "running")
    op = registry.begin_operation(
        "restore", "p", "source", "cloud", "fog-a", "me", "fencing", new_epoch=True
    )
    assert op.epoch == 2 and registry.epoch("p", "source") == 2
    assert registry.next_epoch("p", "source", operation=op.id) == 3
    fenced = registry.operation(op.id)
    assert fenced is not None and fenced.epoch == 3
    assert [o.id for o in registry.unfinished()] == [op.id]


def test_a_standby_writes_above_its_primary_which_keeps_its_epoch(
    registry: Registry, tmp_path: Path
) -> None:
    registry.put_pipeline(spec(tmp_path), "running")
    assert registry.add_standby("p", "source", "fog-b") == 2
    assert registry.epoch("p", "source") == 1  # the placed instance is not behind
    standby = registry.standby("p", "source")
    assert standby is not None and (standby.node, standby.epoch) == ("fog-b", 2)
    # A replacement (its node lost it) is newer than the one it replaces.
    assert registry.add_standby("p", "source", "fog-a") == 3
    assert [(s.element, s.node, s.epoch) for s in registry.standbys()] == [("source", "fog-a", 3)]


def test_a_new_epoch_for_the_pe_goes_above_its_standby_and_drops_it(
    registry: Registry, tmp_path: Path
) -> None:
    registry.put_pipeline(spec(tmp_path), "running")
    registry.add_standby("p", "source", "fog-b")
    # A handover or a fence: the standby would be refused once promoted.
    assert registry.next_epoch("p", "source") == 3
    assert registry.standby("p", "source") is None
    # Its epoch stays taken: the next standby, and a redeployment, go above it.
    registry.add_standby("p", "source", "fog-b")
    registry.drop_standby("p", "source")
    assert registry.standby("p", "source") is None
    assert registry.add_standby("p", "source", "fog-a") == 5
    assert registry.put_pipeline(spec(tmp_path), "running")["source"] == 6
    assert registry.standbys() == []


def test_promoting_a_standby_routes_the_pe_to_it_under_the_standby_epoch(
    registry: Registry, tmp_path: Path
) -> None:
    registry.put_pipeline(spec(tmp_path), "running")
    epoch = registry.add_standby("p", "source", "fog-b")
    op = registry.begin_operation(
        "restore", "p", "source", "cloud", "fog-b", "me", "starting", epoch=epoch
    )
    assert op.epoch == epoch == 2 and registry.epoch("p", "source") == 1
    registry.route(op.id, "fog-b")
    assert registry.epoch("p", "source") == 2
    assert registry.get_pipeline("p").placement["source"] == "fog-b"  # type: ignore[union-attr]
    assert registry.standby("p", "source") is None


def test_a_migration_keeps_the_standby_of_the_pe_it_moves(
    registry: Registry, tmp_path: Path
) -> None:
    registry.put_pipeline(spec(tmp_path), "running")
    registry.add_standby("p", "source", "fog-b")
    op = registry.begin_operation("migration", "p", "source", "cloud", "fog-a", "me", "preparing")
    registry.route(op.id, "fog-a")
    assert registry.epoch("p", "source") == 1
    standby = registry.standby("p", "source")
    assert standby is not None and standby.epoch == 2


def test_a_stored_spec_this_version_refuses_is_left_out_not_a_500_everywhere(
    registry: Registry, tmp_path: Path
) -> None:
    # Stored by an older fogshift, refused by this one (stricter checks): every read of the
    # registry raised, so every request of every pipeline (and the reconciler) failed.
    registry.put_pipeline(spec(tmp_path), "running")
    other = spec(tmp_path).model_copy(update={"pipeline": "q"})
    registry.put_pipeline(other, "running")
    registry._db.execute(
        """UPDATE pipelines SET spec = replace(spec, '"source"', '"bad name"')
           WHERE name = 'p'"""
    )
    assert registry.get_pipeline("p") is None
    assert [r.name for r in registry.pipelines()] == ["q"]
    registry.put_pipeline(spec(tmp_path), "running")  # deployed again: read back whole
    assert registry.get_pipeline("p") is not None
