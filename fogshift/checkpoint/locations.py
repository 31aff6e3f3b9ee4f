"""Where Spark is told a PE's checkpoint is: a path of its own for every query start.

Spark's RocksDB state store keeps a stopped query's store provider loaded until its
maintenance (every ``maintenanceInterval``) finds the query inactive and closes the provider;
closing uploads a snapshot the provider still had pending, to the checkpoint path its query
was given. If another history of the PE has been installed at that path meanwhile (it
migrated back to a node it ran on before, or was restored there), the upload lands in that
history: ``N.zip`` of the old run beside the new run's changelogs of version ``N``, and every
later load of the state (a restart, a copy, a state read) starts from that snapshot. Seen in
``test_migration``: a PE handed back to its first node held windows missing updates that its
outputs had, and a query restarted from that checkpoint would have lost them too.

So Spark never gets the PE's folder itself, but a symlink to it made for one query start
(:func:`open_location`) and removed when that query stops (:func:`close_location`). A late
upload of a stopped query then resolves through a path that no longer leads anywhere: the
file system makes plain folders there, which :func:`sweep_locations` removes. The PE's own
folder only ever receives files of queries running on its current history.

Spark records the absolute paths of the state-schema files in the operator metadata, so
opening a location also points those references at it
(:func:`~fogshift.checkpoint.spark_dir.relocate`).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from fogshift.checkpoint.spark_dir import relocate


def open_location(root: Path, checkpoint: Path, name: str) -> Path:
    """A new path for Spark that leads to ``checkpoint``, for one query start.

    Args:
        root: The folder holding the node's query locations.
        checkpoint: The PE's checkpoint folder (created if missing).
        name: Readable part of the location's name (e.g. ``pipeline.pe``).

    Returns:
        The location: a symlink in ``root`` to ``checkpoint``, unique to this call.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    location = root / f"{name}.{uuid.uuid4().hex[:12]}"
    location.symlink_to(checkpoint.resolve(), target_is_directory=True)
    relocate(checkpoint, location)
    return location


def close_location(location: Path) -> None:
    """Cut a query's location off its checkpoint once the query has stopped (idempotent)."""
    if location.is_symlink():
        location.unlink()
    elif location.is_dir():  # a late upload already came through a closed location
        shutil.rmtree(location, ignore_errors=True)


def sweep_locations(root: Path, keep: set[Path]) -> int:
    """Remove what ``root`` holds besides the locations in ``keep``: closed locations that
    late uploads recreated as plain folders, and symlinks a stopped process left.

    Returns:
        How many plain folders were removed: late writes of stopped queries, kept away from
        the checkpoints.
    """
    if not root.is_dir():
        return 0
    diverted = 0
    for entry in root.iterdir():
        if entry in keep:
            continue
        diverted += not entry.is_symlink() and entry.is_dir()
        close_location(entry)
    return diverted
