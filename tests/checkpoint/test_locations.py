"""A query's checkpoint location leads to the PE's folder only while that query runs.

The failure this guards against (see ``fogshift.checkpoint.locations``): Spark's state store
uploads a stopped query's pending snapshot late, to the path the query was given. Here a
late upload is played by writing through a closed location the way Hadoop does (making the
missing folders on the way); the PE's folder must not receive it.
"""

from __future__ import annotations

import json
from pathlib import Path

from fogshift.checkpoint.locations import close_location, open_location, sweep_locations


def late_upload(location: Path, name: str = "state/0/0/11.zip") -> Path:
    """Write a file under ``location`` as Hadoop's local file system does."""
    path = location / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"a snapshot of another history")
    return path


def test_each_start_gets_a_location_of_its_own_that_leads_to_the_checkpoint(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "checkpoints" / "p" / "agg"
    root = tmp_path / "query-locations"
    first = open_location(root, checkpoint, "p.agg")
    second = open_location(root, checkpoint, "p.agg")
    assert first != second
    assert first.parent == second.parent == root
    assert first.name.startswith("p.agg.")
    late_upload(first, "commits/0")
    assert (checkpoint / "commits" / "0").read_bytes() == b"a snapshot of another history"


def test_a_write_through_a_closed_location_never_reaches_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / "p" / "agg"
    root = tmp_path / "query-locations"
    old = open_location(root, checkpoint, "p.agg")
    close_location(old)
    # Another history installed in the PE's folder, and a query running on it.
    (checkpoint / "state" / "0" / "0").mkdir(parents=True)
    current = open_location(root, checkpoint, "p.agg")
    stray = late_upload(old)
    assert stray.exists()
    assert not (checkpoint / "state" / "0" / "0" / "11.zip").exists()
    # The sweep removes the stray folder and keeps the running query's location.
    assert sweep_locations(root, keep={current}) == 1
    assert sorted(root.iterdir()) == [current]
    assert current.resolve() == checkpoint.resolve()
    close_location(current)
    close_location(current)  # idempotent
    assert not current.exists() and checkpoint.is_dir()


def test_a_sweep_with_nothing_kept_cuts_every_link_and_spares_the_checkpoints(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "checkpoints" / "p" / "agg"
    root = tmp_path / "query-locations"
    left = [open_location(root, checkpoint, "p.agg") for _ in range(2)]
    late_upload(checkpoint, "offsets/0")
    assert sweep_locations(root, keep=set()) == 0  # links only, no late writes
    assert not any(p.exists() or p.is_symlink() for p in left)
    assert (checkpoint / "offsets" / "0").exists()
    assert sweep_locations(tmp_path / "missing", keep=set()) == 0


def test_opening_a_location_points_the_state_schema_references_at_it(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / "p" / "agg"
    meta = checkpoint / "state" / "0" / "_metadata" / "v2" / "9"
    meta.parent.mkdir(parents=True)
    schema = "file:/elsewhere/query-locations/p.agg.0123/state/0/_stateSchema/default/0_x"
    meta.write_text("v2\n" + json.dumps({"stateSchemaFilePaths": [schema]}))
    location = open_location(tmp_path / "query-locations", checkpoint, "p.agg")
    paths = json.loads(meta.read_text().split("\n", 1)[1])["stateSchemaFilePaths"]
    assert paths == [f"file:{location}/state/0/_stateSchema/default/0_x"]
