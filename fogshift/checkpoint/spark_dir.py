"""A Spark Structured Streaming checkpoint directory, seen from outside Spark.

Layout: ``offsets/N`` (the batch plan: the end offset of batch N, written before it runs),
``commits/N`` (written after batch N's output and state are committed), ``state/`` (the RocksDB
state store: snapshot zips + changelogs, each file written atomically), ``metadata`` (query id),
``sources/``. Every file is immutable once in place, which is what makes copying a running
query's checkpoint safe when ``commits/`` is read first.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

from fogshift.checkpoint.exceptions import CheckpointError, TornCheckpoint


def _batches(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def committed_batch(checkpoint: Path) -> int | None:
    """The last batch whose output and state are committed, if any."""
    batches = _batches(checkpoint / "commits")
    return batches[-1] if batches else None


def planned_batch(checkpoint: Path) -> int | None:
    """The last batch written to the offset log (it may still be running)."""
    batches = _batches(checkpoint / "offsets")
    return batches[-1] if batches else None


def end_offset(checkpoint: Path, batch: int) -> dict[str, Any]:
    """The source's end offset of ``batch`` (fogshift queries have exactly one source)."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    if len(lines) < 3 or lines[0] != "v1":
        raise CheckpointError(f"offset log entry {batch} of {checkpoint} is not a v1 entry")
    return dict(json.loads(lines[2]))


def progress_of(offset: dict[str, Any] | None) -> int:
    """A number that grows with a source offset (sum of positions / rows read)."""
    if not offset:
        return 0
    if "positions" in offset:
        return sum(int(v) for v in offset["positions"].values())
    return int(offset.get("row", 0))


def committed_offset(checkpoint: Path) -> tuple[int | None, dict[str, Any] | None]:
    """The last committed batch and its end offset."""
    batch = committed_batch(checkpoint)
    return batch, (end_offset(checkpoint, batch) if batch is not None else None)


def copy_checkpoint(source: Path, target: Path, warm: bool = False) -> dict[str, Any]:
    """Copy a (possibly running) query's checkpoint consistently.

    ``commits/`` is listed first: everything that batch's commit depends on is already in
    place, and what is newer is dropped, so the copy is the checkpoint as of one committed
    batch N. With ``warm``, commit N is dropped too: a query started on the copy re-executes
    batch N (its outputs are already in the stream, so it emits nothing) and so warms up
    its workers without getting ahead of the original.

    Returns:
        ``{"batch": N, "offset": end offset of N}`` (``batch`` None for an empty checkpoint).
    """
    if target.exists():
        shutil.rmtree(target)
    commits = _batches(source / "commits")
    if not commits:
        target.mkdir(parents=True)
        return {"batch": None, "offset": None}
    batch = commits[-1]
    keep_commit = batch - 1 if warm else batch

    def ignore(folder: str, names: list[str]) -> list[str]:
        limit = {"commits": keep_commit, "offsets": batch}.get(Path(folder).name)
        if limit is None:
            return [n for n in names if n.endswith(".tmp")]
        return [n for n in names if (_batch_name(n) or -1) > limit]

    shutil.copytree(source, target, ignore=ignore)
    return {"batch": batch, "offset": end_offset(source, batch)}


def _batch_name(name: str) -> int | None:
    """``N`` for ``N`` and ``.N.crc``, else None."""
    stripped = name[1:-4] if name.startswith(".") and name.endswith(".crc") else name
    return int(stripped) if stripped.isdigit() else None


def pack(folder: Path) -> tuple[bytes, str]:
    """A gzipped tar of ``folder`` and its sha256 (a shipped checkpoint)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        tar.add(folder, arcname=".")
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def unpack(data: bytes, digest: str, target: Path) -> None:
    """Install a shipped checkpoint at ``target`` (replacing it), after checking its digest.

    Raises:
        TornCheckpoint: The bytes do not match the digest or are not a valid archive.
    """
    if hashlib.sha256(data).hexdigest() != digest:
        raise TornCheckpoint(
            f"checkpoint for {target} is damaged: its sha256 does not match",
            expected=digest,
            received=hashlib.sha256(data).hexdigest(),
        )
    staging = target.with_name(target.name + ".incoming")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise TornCheckpoint(f"checkpoint archive for {target} cannot be read: {exc}") from exc
    if target.exists():
        shutil.rmtree(target)
    staging.replace(target)
