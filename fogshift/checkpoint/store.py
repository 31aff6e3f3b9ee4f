"""Node-level checkpoints: periodic, incremental snapshots of a query's checkpoint.

Spark checkpoints every micro-batch into the query's live directory. Every few seconds the
node agent freezes a consistent copy of it (as of one committed batch, see
``spark_dir.copy_checkpoint``) into the node's own store. Files Spark writes are immutable
once in place (offset and commit log entries, RocksDB SSTs, changelogs, snapshot zips: each
written to a temporary file and renamed), so every file is hard-linked, not copied: one
already in the previous snapshot from there (its digest is known), a new one from the live
directory (then checked against the checksums Spark wrote beside it, and digested). A
snapshot writes no data; it costs a link per file and the digests of what changed. The
manifest — every file with its size and sha256 — is written last and atomically: a snapshot
without one is incomplete and ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.spark_dir import (
    SETTLE_S,
    checksum_problem,
    committed_batch,
    copy_checkpoint,
    progress_of,
)
from fogshift.common.names import check_relative_path, check_snapshot_id, contained

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
KEEP = 2
#: How long a snapshot someone is reading stays, after their last read, beyond the newest
#: :data:`KEEP` (see :class:`SnapshotPins`). A read pins it as it starts and once it is
#: sent: a file of 8 MB among eight read at once over an 8 Mbit/s link takes ~64 s, and at
#: 60 s the snapshot went from under it (the pull lost, the next one again).
PIN_S = 300.0


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def snapshot_id(batch: int) -> str:
    """Snapshot ids sort by batch."""
    return f"b{batch:012d}"


def latest_manifest(store: Path) -> dict[str, Any] | None:
    """The newest complete snapshot's manifest in ``store`` (a PE's folder), if any."""
    if not store.is_dir():
        return None
    for folder in sorted(store.iterdir(), reverse=True):
        if folder.name.startswith("."):
            continue  # a snapshot being written (``.staging-*``), renamed away any moment
        try:
            return dict(json.loads((folder / MANIFEST).read_text()))
        except FileNotFoundError:
            continue  # incomplete, or removed by the clean-up meanwhile
        except (OSError, ValueError, TypeError) as exc:
            # A manifest that cannot be read (empty after a power loss: it is renamed into
            # place unsynced; a storage fault) is no snapshot: the one before it is the
            # newest. Raised, it failed every heartbeat of the node (declared lost, its PEs
            # restored elsewhere while running here) and every later snapshot of the PE.
            log.warning("snapshot %s cannot be read (%s): skipped", folder, exc)
            continue
    return None


def known_digests(store: Path) -> dict[tuple[int, int], str]:
    """The digests of the newest snapshot's files in ``store``, by file identity
    (``(st_dev, st_ino)``): a copy that links the same files needs not hash them again
    (``spark_dir.pack``). Files gone meanwhile are left out."""
    manifest = latest_manifest(store)
    if manifest is None:
        return {}
    folder = store / manifest["id"]
    found = {}
    for rel, entry in manifest["files"].items():
        try:
            stat = os.stat(folder / rel)
        except OSError:
            continue  # the snapshot was pruned meanwhile: those files are hashed instead
        found[(stat.st_dev, stat.st_ino)] = str(entry["sha256"])
    return found


def take_snapshot(
    live: Path,
    store: Path,
    pipeline: str,
    pe: str,
    state_metrics: Mapping[int, dict[str, Any]] | None = None,
    pinned: Callable[[], Collection[str]] = frozenset,
    epoch: int | None = None,
    complete: Callable[[Path, int], bool] | None = None,
) -> dict[str, Any] | None:
    """Snapshot the live checkpoint of a PE into ``store`` if it committed a newer batch.

    Besides the files, the manifest records what the snapshot cost: ``took_ms`` (all of
    it), ``copy_ms`` (freezing the committed batch: hard links and copies) and ``hash_ms``
    (digests of the new files), and ``state_store``: Spark's state-store metrics of the batch
    the snapshot freezes (where the operator state was serialised), if known.

    Args:
        state_metrics: State-store metrics by batch id (see the agent's ``snapshot_all``);
            the entry of the snapshotted batch goes into the manifest, ``None`` if absent.
        pinned: The ids of the snapshots being read now (:class:`SnapshotPins`): kept even
            when older than the newest :data:`KEEP`. Asked when the old ones go, after the
            copy and its digests (read before them, a pull that began meanwhile lost its
            snapshot).
        epoch: The epoch of the instance whose checkpoint this is (in the manifest: the
            orchestrator trims a stream only once its readers' current instances have a
            central checkpoint, ``orchestrator.history``).
        complete: Called with the staged copy and the batch it froze: ``False`` drops it
            (``None`` is returned; a later call takes it again). The agent's: whether the
            copy's counters cover that batch.

    Returns:
        The new manifest, or ``None`` when there was nothing new to snapshot (or the copy
        was not ``complete``).
    """
    batch = committed_batch(live)
    previous = latest_manifest(store)
    if batch is not None and previous is not None and previous["batch"] > batch:
        # The live checkpoint went back: another history was installed under the PE's name
        # (the agent clears the store when it installs one). Its snapshots would stand in
        # for this one's until it passed their batch, a snapshot is taken only past it.
        log.warning(
            "%s/%s: the node-level snapshots (up to batch %s) are ahead of the live "
            "checkpoint (batch %s), of another history: removed", pipeline, pe,
            previous["batch"], batch,
        )  # fmt: skip
        for old in store.iterdir():
            shutil.rmtree(old, ignore_errors=True)
        previous = None
    if batch is None or (previous is not None and previous["batch"] >= batch):
        return None
    started = time.perf_counter()
    staging = store / f".staging-{os.getpid()}"
    old_dir = store / previous["id"] if previous else None
    # Links, not copies: a snapshot's file is the live file itself (Spark never rewrites one
    # in place), so a snapshot writes no data at all.
    placed: dict[str, int | None] = {}
    try:
        info = copy_checkpoint(live, staging, link_from=old_dir, link=True, placed=placed)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if info["batch"] is None or (previous is not None and previous["batch"] >= info["batch"]):
        # The live checkpoint went away under the copy (the PE discarded meanwhile: no
        # lock is shared with it) or back: nothing to freeze. The staging folder made its
        # store again after the discard, reported as left until discarded once more.
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            store.rmdir()  # (only if empty: a store with snapshots stays)
        return None
    if complete is not None and not complete(staging, info["batch"]):
        shutil.rmtree(staging, ignore_errors=True)
        return None
    copied_at = time.perf_counter()
    folder = store / snapshot_id(info["batch"])
    if folder.exists():
        shutil.rmtree(staging)
        return None
    old_files: dict[str, dict[str, Any]] = previous["files"] if previous else {}
    # A file linked into the previous snapshot too is the same inode there: its digest is
    # known. Inodes from the folders' listings (no stat per file), compared only within one
    # file system.
    old_inodes = _inodes(old_dir) if old_dir is not None and _same_device(old_dir, staging) else {}
    # What was linked, as the snapshot's own listing has it: a file replaced under its name
    # between the live folder's listing and its link (the agent's counters, rewritten after
    # each batch) is another inode than the one listed, and took the previous digest.
    staged = _inodes(staging) if old_inodes else {}
    files: dict[str, dict[str, Any]] = {}
    copied_bytes = 0
    for rel in sorted(placed):
        inode = staged.get(rel) if placed[rel] is not None else None
        before = old_files.get(rel)
        if before is not None and inode is not None and old_inodes.get(rel) == inode:
            files[rel] = before
        else:
            path = staging / rel
            problem = None if rel.endswith(".crc") else checksum_problem(path, rel)
            if problem is not None and _in_flux(live / rel, path, rel):
                # Linked between Hadoop's two renames: a later round takes it.
                log.info("%s/%s: %s was being written as batch %s was frozen: put off",
                         pipeline, pe, rel, info["batch"])  # fmt: skip
                shutil.rmtree(staging, ignore_errors=True)
                return None
            if problem is not None:
                # Frozen, it would be pulled to the central store, and every restore from
                # there would fail as the PE's next start here will: the snapshots stay at
                # the last batch whose files were whole.
                shutil.rmtree(staging, ignore_errors=True)
                raise TornCheckpoint(
                    f"the checkpoint of {pipeline}/{pe} at batch {info['batch']} is torn: "
                    f"{problem}: not frozen",
                    hint="its disk lost or changed what Spark wrote (a power loss, a "
                    "disk's fault); a start from it fails, and the PE is then restored from "
                    "its central checkpoint",
                )
            size = os.stat(path).st_size
            files[rel] = {"size": size, "sha256": sha256_file(path)}
            copied_bytes += size
    hashed_at = time.perf_counter()
    manifest = {
        "type": "fogshift-checkpoint",
        "id": snapshot_id(info["batch"]),
        "pipeline": pipeline,
        "element": pe,
        "batch": info["batch"],
        "offset": info["offset"],
        "resume_floor": info.get("resume_floor"),
        "epoch": epoch,
        "progress": progress_of(info["offset"]),
        "created": time.time(),
        "bytes": sum(f["size"] for f in files.values()),
        "new_bytes": copied_bytes,
        "took_ms": 0.0,
        "copy_ms": round((copied_at - started) * 1000, 1),
        "hash_ms": round((hashed_at - copied_at) * 1000, 1),
        "state_store": (state_metrics or {}).get(info["batch"]),
        "files": files,
    }
    manifest["took_ms"] = round((time.perf_counter() - started) * 1000, 1)
    tmp = staging / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest))
    tmp.replace(staging / MANIFEST)
    staging.replace(folder)
    held = pinned()
    for old in sorted(store.iterdir(), reverse=True)[KEEP:]:
        if old.name not in held:
            shutil.rmtree(old, ignore_errors=True)
    return manifest


def _in_flux(live: Path, staged: Path, rel: str) -> bool:
    """Whether the live file whose link ``staged`` does not match its checksums was being
    written when it was linked: after :data:`~spark_dir.SETTLE_S`, the live file is another
    one, or matches its checksums (its checksum file was renamed into place since)."""
    time.sleep(SETTLE_S)
    try:
        if not os.path.samefile(live, staged):
            return True
    except OSError:
        return True  # (replaced or gone since: of a later history than the batch frozen)
    return checksum_problem(live, rel) is None


class SnapshotPins:
    """Snapshots being read, which the clean-up of :func:`take_snapshot` must leave alone.

    A central pull reads a snapshot's manifest, then its files, one request each; over a slow
    link a first pull of a large state outlives :data:`KEEP` snapshots, and found its files
    gone ("no file offsets/3 in snapshot ...": the whole pull was lost). Every read pins the
    snapshot until :data:`PIN_S` after the last one. Thread-safe.
    """

    def __init__(self, hold_s: float = PIN_S) -> None:
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._read: dict[tuple[str, str], dict[str, float]] = {}

    def touch(self, pipeline: str, pe: str, snapshot: str) -> None:
        """A snapshot of the PE was read now."""
        with self._lock:
            self._read.setdefault((pipeline, pe), {})[snapshot] = time.monotonic()

    def held(self, pipeline: str, pe: str) -> frozenset[str]:
        """The PE's snapshots read within the last ``hold_s`` (older pins are dropped)."""
        now = time.monotonic()
        with self._lock:
            reads = self._read.get((pipeline, pe), {})
            for old in [s for s, at in reads.items() if now - at > self.hold_s]:
                del reads[old]
            if not reads:
                self._read.pop((pipeline, pe), None)
            return frozenset(reads)


def _inodes(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` (relative POSIX path) and its inode, as listed: no stat per
    file. Files and folders removed meanwhile are left out."""
    found: dict[str, int] = {}

    def walk(here: str, prefix: str) -> None:
        try:
            with os.scandir(here) as listing:
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False):
                        walk(entry.path, f"{prefix}{entry.name}/")
                    else:
                        found[prefix + entry.name] = entry.inode()
        except FileNotFoundError:
            return

    walk(str(folder), "")
    return found


def _same_device(one: Path, other: Path) -> bool:
    """Whether two existing paths are on one file system (inodes compare)."""
    try:
        return os.stat(one).st_dev == os.stat(other).st_dev
    except FileNotFoundError:
        return False


def snapshot_file(store: Path, snapshot: str, rel: str) -> Path:
    """The path of one file of a snapshot in ``store`` (a PE's folder of snapshots).

    Both names come from a request: the snapshot must be a snapshot id and ``rel`` a
    normalised relative path, and the resolved file must lie inside the snapshot, which
    must lie inside ``store`` (a ``..`` or a symbolic link reads nothing elsewhere).

    Raises:
        InvalidName: ``snapshot`` or ``rel`` is not a valid id or relative path.
        PathEscape: The file resolves outside the snapshot.
    """
    check_snapshot_id(snapshot)
    check_relative_path(rel, f"file path in snapshot {snapshot}")
    folder = contained(store, snapshot, what=f"snapshot {snapshot}")
    return contained(folder, *rel.split("/"), what=f"file of snapshot {snapshot}")
