"""A Spark Structured Streaming checkpoint directory, seen from outside Spark.

Layout: ``offsets/N`` (the batch plan: the end offset of batch N, written before it runs),
``commits/N`` (written after batch N's output and state are committed), ``state/`` (the RocksDB
state store: snapshot zips + changelogs, each file written atomically), ``metadata`` (query id),
``sources/``. Every file is immutable once in place, which is what makes copying a running
query's checkpoint safe when ``commits/`` is read first.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Collection, Mapping
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, BinaryIO

from fogshift.checkpoint.chunks import CHUNKED_MIN_BYTES, file_chunks
from fogshift.checkpoint.exceptions import CheckpointError, TornCheckpoint
from fogshift.checkpoint.key_index import FOLDER as KEY_INDEX_FOLDER
from fogshift.checkpoint.key_index import batch_of as index_batch
from fogshift.common.exceptions import InvalidName
from fogshift.common.files import DISK_FULL
from fogshift.common.names import check_relative_path
from fogshift.exceptions import FogshiftError

log = logging.getLogger("fogshift.checkpoint")


def _batches(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


_VERSION_LINE = re.compile(r"v\d+")


def torn_checkpoint(checkpoint: Path) -> str | None:
    """What makes the checkpoint unreadable to a start of its query — its metadata, offset
    or commit log (an entry empty, without its version line, or with text that is not
    JSON), or a file the start reads that does not match the checksums Spark wrote beside
    it — or ``None`` if nothing does.

    Spark syncs none of these files: a node that lost power shortly after batches committed
    came back with entries its disk never got, and every start of the PE from them failed
    ("Log file was malformed"), the agent retrying for good; a state file emptied so failed
    every start at its first batch, and a log entry changed by a disk's fault but still
    JSON would have resumed the query elsewhere in its input. The files read are the logs,
    the sources' and operators' metadata and, of each state partition, what loading the
    version after the last commit reads (its snapshot and changelogs, :func:`_state_outside`;
    not the RocksDB SSTs, whose blocks RocksDB checks itself).
    """
    metadata = checkpoint / "metadata"
    if metadata.is_file():
        try:
            json.loads(metadata.read_text())
        except (OSError, ValueError) as exc:
            return f"its metadata does not read ({type(exc).__name__}: {exc})"
    for name in ("offsets", "commits"):
        for batch in _batches(checkpoint / name):
            entry = f"{name}/{batch}"
            try:
                lines = (checkpoint / name / str(batch)).read_text().splitlines()
            except (OSError, ValueError) as exc:
                return f"{entry} does not read ({type(exc).__name__}: {exc})"
            if not lines:
                return f"{entry} is empty"
            if not _VERSION_LINE.fullmatch(lines[0]) or len(lines) < 2:
                return f"{entry} is not a log entry (no version line and JSON)"
            try:
                for line in lines[1:]:
                    if line != "-":  # (a source without an offset yet)
                        json.loads(line)
            except ValueError:
                return f"{entry} holds text that is not JSON"
    return _unchecked_file(checkpoint) if checkpoint.is_dir() else None


def _leading_batch(name: str) -> int | None:
    """``N`` of ``N`` and ``N_<uuid>`` (an operator's metadata and schema files)."""
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def _unchecked_file(checkpoint: Path) -> str | None:
    """The first file a start from ``checkpoint`` reads that does not match its checksums
    (:func:`checksum_problem`), or ``None``."""
    committed = committed_batch(checkpoint)
    version = 0 if committed is None else committed + 1  # (the state a start loads)
    for folder, folders, names in os.walk(checkpoint):
        parts = Path(folder).relative_to(checkpoint).parts
        skipped: set[str] = set()
        if len(parts) == 3 and parts[0] == "state":
            skipped = set(_state_outside(names, version)[0])
            folders[:] = [f for f in folders if f != "SSTs"]
        elif len(parts) >= 3 and parts[0] == "state" and parts[2] in ("_metadata", "_stateSchema"):
            # An operator's metadata and schema files are written at each run's first batch,
            # named by it: one of a batch never committed (a power loss right after) is of a
            # run the start does again. (Should Spark read it all the same, a torn one fails
            # the start, which the agent reports: a slower way to the same restore.)
            skipped = {n for n in names if (b := _leading_batch(n)) is not None and b >= version}
        for name in sorted(names):
            if name.endswith(".crc") or _being_written(name) or name in skipped:
                continue
            path, rel = Path(folder) / name, "/".join((*parts, name))
            if checksum_problem(path, rel) is not None:
                time.sleep(SETTLE_S)  # (see SETTLE_S)
                problem = checksum_problem(path, rel)
                if problem is not None:
                    return problem
    return None


#: Spark's error conditions (``CANNOT_LOAD_STATE_STORE.<sub>`` or a condition of its own)
#: that say a query's checkpoint files cannot be read: the query fails on them at every
#: start. Not those of a configuration or a schema (a deploy's), nor of memory or threads
#: (which may pass).
_UNREADABLE_CONDITIONS = re.compile(
    r"\[(CANNOT_LOAD_STATE_STORE\.(?:UNCATEGORIZED|CANNOT_READ_[A-Z_]+|UNEXPECTED_FILE_SIZE"
    r"|CANNOT_FIND_BASE_SNAPSHOT_CHECKPOINT|AUTO_SNAPSHOT_REPAIR_FAILED"
    r"|SNAPSHOT_PARTITION_ID_NOT_FOUND|INVALID_CHECKPOINT_LINEAGE)"
    r"|CHECKPOINT_FILE_CHECKSUM_VERIFICATION_FAILED|STATE_STORE_ROW_CHECKSUM_VERIFICATION_FAILED"
    r"|STREAMING_CHECKPOINT_MISSING_METADATA_FILE)\]"
)
#: What Spark's metadata logs (offsets, commits) raise on an entry they cannot parse.
_UNREADABLE_LOG = re.compile(r"(Incomplete log file|Log file was malformed|Failed to read log "
                             r"file)[^\n]{0,200}")  # fmt: skip


def unreadable_checkpoint(text: str) -> str | None:
    """What Spark's failure ``text`` says of its query's checkpoint if it says the query
    cannot read it (a state file or a log entry torn, emptied or gone), else ``None``.

    A torn log entry, or a file that does not match its checksums, is refused before a
    start (:func:`torn_checkpoint`); a state file torn otherwise shows only when the query
    loads it, at its first batch, and fails it at every start: the caller, seeing it fail
    so in a row, has the PE restored from another checkpoint.
    """
    if DISK_FULL in text:
        # A state load that failed for a full disk says nothing of the checkpoint: taken
        # for unreadable, the node's checkpoint would be set aside for an older central one.
        return None
    if found := _UNREADABLE_CONDITIONS.search(text):
        return f"Spark cannot load its state: {found.group(1)}"
    if found := _UNREADABLE_LOG.search(text):
        return f"Spark cannot read its log: {found.group(0).strip()}"
    return None


#: How long a file that does not match its checksums is given before it is judged: Hadoop
#: renames a file into place, then its checksum file, and one written again under its name
#: (a late state upload of a stopped query's) meets the old checksums in between.
SETTLE_S = 0.5
#: The header of the checksum file Hadoop's local file system writes beside each file Spark
#: writes (``.NAME.crc``): then the bytes each checksum covers (a big-endian int) and a
#: big-endian CRC-32 of each such run of the file's bytes.
_CRC_HEADER = b"crc\x00"


def checksum_problem(path: Path, name: str | None = None) -> str | None:
    """How the file at ``path`` (``name`` in the answer, default its file name) differs from
    the checksums Spark wrote beside it (Hadoop's ``.NAME.crc``), or ``None`` if it matches
    them or has none to match.

    Spark syncs none of its checkpoint files, and a node-level snapshot links them: a file a
    power loss or a disk's fault left short, empty or changed before its first snapshot was
    digested as it was, pulled to the central store, and every restore from there failed
    (the query could not load it). Its checksums, written with it, tell. A checksum file
    that is not one (torn itself) is passed over, as Spark's reader does; so is a file gone
    meanwhile. One that cannot be read (an I/O error) is a problem.

    Hadoop puts a file in place, then its checksums, each by a rename: a file written again
    under its name meets its old checksums for a moment (see :data:`SETTLE_S`).
    """
    sidecar = path.with_name(f".{path.name}.crc")
    name = name or path.name
    try:
        sums = sidecar.read_bytes()
    except OSError:
        return None
    per = int.from_bytes(sums[4:8], "big") if len(sums) >= 8 else 0
    if sums[:4] != _CRC_HEADER or per <= 0 or (len(sums) - 8) % 4:
        return None
    expected = [int.from_bytes(sums[i : i + 4], "big") for i in range(8, len(sums), 4)]
    try:
        with open(path, "rb") as handle:
            return _runs_problem(handle, name, per, expected)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror or exc})"


def _runs_problem(handle: BinaryIO, name: str, per: int, expected: list[int]) -> str | None:
    """:func:`checksum_problem` for an open file, read a few thousand runs at a time (a
    RocksDB SST is tens of MB)."""
    size = os.fstat(handle.fileno()).st_size
    if -(-size // per) != len(expected):  # (an empty file: no run)
        covered = (
            f"{(len(expected) - 1) * per + 1} to {len(expected) * per} bytes"
            if expected
            else "0 bytes"
        )
        return f"{name} has {size} bytes, its checksums are of {covered}"
    k = 0
    for block in iter(lambda: handle.read(per * 2048), b""):
        view = memoryview(block)
        for at in range(0, len(block), per):
            if k >= len(expected) or zlib.crc32(view[at : at + per]) != expected[k]:
                return (f"{name}'s bytes {k * per} to {min(size, (k + 1) * per) - 1} do not "
                        "match their checksum")  # fmt: skip
            k += 1
    return None


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
    if "event" in offset:  # an ecg-source's windows
        return int(offset["event"])
    return int(offset.get("row", 0))


def clear_orphan_state(checkpoint: Path) -> bool:
    """Remove state files a checkpoint holds without any offset log entry; True if any.

    Spark refuses to start batch 0 on a non-empty ``state/`` folder
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), and such files belong to no batch: they
    are left by a state store's background upload that finished after its checkpoint was
    discarded. Without an offset log the query starts from its first input anyway.
    """
    state = checkpoint / "state"
    if planned_batch(checkpoint) is not None:
        return False
    # (Notes of a key index are of no batch either: a base among them would stand for
    # batches this query has not run.)
    shutil.rmtree(checkpoint / KEY_INDEX_FOLDER, ignore_errors=True)
    if not state.is_dir():
        return False
    shutil.rmtree(state)
    return True


def committed_offset(checkpoint: Path) -> tuple[int | None, dict[str, Any] | None]:
    """The last committed batch and its end offset."""
    batch = committed_batch(checkpoint)
    return batch, (end_offset(checkpoint, batch) if batch is not None else None)


def copy_checkpoint(
    source: Path,
    target: Path,
    warm: bool = False,
    link_from: Path | None = None,
    link: bool = False,
    placed: dict[str, int | None] | None = None,
) -> dict[str, Any]:
    """Copy a (possibly running) query's checkpoint consistently.

    ``commits/`` is listed first: everything a committed batch depends on is already in
    place, and what is newer is dropped, so the copy is the checkpoint as of one committed
    batch N.

    With ``warm``, N is the last committed batch that read input, and its commit is dropped
    together with state versions after it: a query started on the copy re-executes batch N —
    emitting nothing, its outputs are already in the stream — which starts its workers and
    loads its state without getting ahead of the original.

    Args:
        link_from: An earlier copy: a file present there with the same size is the same
            immutable file, and is hard-linked instead of copied.
        link: Hard-link the other files from ``source`` too instead of copying them (where
            the file system allows; else they are copied). Only for a copy nobody writes
            into: a link is the live file itself, which Spark never changes in place (it
            writes a temporary file and renames it over the name).
        placed: Filled with every file of the copy: its POSIX path relative to ``target``,
            and the inode of what was placed there when it is a link (to the live file, or
            to ``link_from``'s), ``None`` for a copy. A snapshot tells by it which files it
            shares with the previous one without a ``stat`` per file.

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
    keep_commit = batch
    if warm:
        ends = _ends(source, commits)
        busy = [b for b in ends if ends[b] > ends.get(b - 1, 0)]
        if busy:
            batch = busy[-1]
            keep_commit = batch - 1

    def ignore(folder: str, parts: tuple[str, ...], names: list[str]) -> list[str]:
        # Files Spark is still writing (renamed when done): never part of a checkpoint, and
        # a link to one would keep changing after the copy's digests were taken.
        writing = [n for n in names if _being_written(n)]
        if writing:
            names = [n for n in names if not _being_written(n)]
        return writing + _outside(folder, parts, names)

    # The SSTs each state partition's kept snapshot names ({partition's parts: names}; None:
    # unknown, keep them all). A partition folder is listed before its SSTs/.
    snapshot_ssts: dict[tuple[str, ...], frozenset[str] | None] = {}

    def _outside(folder: str, parts: tuple[str, ...], names: list[str]) -> list[str]:
        # Folders are told by where they lie in the checkpoint (``parts``: the path below
        # it), not by their names alone: a PE may be named "offsets" or "state". The offset
        # and commit logs are taken by name (``walk``).
        if parts == (KEY_INDEX_FOLDER,):
            # The key index as of the copy's commit: the notes and bases of later batches
            # are of a run the copy does not hold (a warm copy runs its last batch again and
            # notes it anew), and a file of no batch is none of the index's.
            return [n for n in names if (b := index_batch(n)) is None or b > keep_commit]
        if len(parts) == 3 and parts[0] == "state":
            # state/<op>/<partition>/<version>.changelog|zip: version v is after batch v-1,
            # so resuming after commit C loads version C + 1.
            dropped, base = _state_outside(names, keep_commit + 1)
            if any(n.endswith(".zip") and _state_version(n) is None for n in names):
                snapshot_ssts[parts] = None  # snapshots named otherwise: keep every SST
            else:
                snapshot_ssts[parts] = (
                    frozenset() if base is None else _sst_names(Path(folder) / base)
                )
            return dropped
        if len(parts) == 4 and parts[0] == "state" and parts[3] == "SSTs":
            needed = snapshot_ssts.get(parts[:3])
            if needed is None:
                return []
            return [n for n in names if _sst_name(n) not in needed]
        return []

    # Plain strings, one walk and no stat per linked file: a snapshot freezes ~50 files of
    # ~500 (Spark's offset and commit history) every few seconds; shutil.copytree, which
    # this replaced, also set each folder's times and modes and read its extended
    # attributes, and the snapshot then walked and stat'ed its copy again (~8 ms in all).
    earlier_root = str(link_from) if link_from is not None else None
    found: dict[str, int | None] = {} if placed is None else placed

    def copy(src: str, dst: str, rel: str, entry: os.DirEntry[str] | None = None) -> None:
        try:
            if link:
                try:
                    os.link(src, dst)
                    found[rel] = entry.inode() if entry is not None else os.stat(dst).st_ino
                    return
                except FileNotFoundError:
                    raise
                except OSError as exc:  # another file system, or links not allowed
                    log.debug("checkpoint copy of %s: cannot link %s (%s)", source, rel, exc)
            if earlier_root is not None:
                # Across file systems: the earlier copy's file of the same name, size and
                # modification time is this one (a copy keeps the time; a file Spark wrote
                # again under its name, as a batch run again does, has another).
                earlier = os.path.join(earlier_root, rel)
                here = entry.stat() if entry is not None else os.stat(src)
                try:
                    there = os.stat(earlier)
                    same = (there.st_size, there.st_mtime_ns) == (here.st_size, here.st_mtime_ns)
                except FileNotFoundError:
                    same = False
                if same:
                    os.link(earlier, dst)
                    found[rel] = os.stat(dst).st_ino
                    return
            shutil.copy2(src, dst)
            found[rel] = None
        except FileNotFoundError:
            # Purged by Spark's log cleanup meanwhile: older than what batch N needs (the
            # files batch N does need are checked below).
            log.debug("checkpoint copy of %s: %s was purged meanwhile, skipped", source, rel)

    # The offset and commit logs hold Spark's last 100 batches; a copy keeps a few, by name
    # (listing and filtering ~500 names took longer than linking what is kept).
    logs = {"commits": keep_commit, "offsets": batch}

    def walk(folder: str, into: str, prefix: str) -> None:
        # A folder's names are filtered before its subfolders are walked: the SSTs a state
        # partition's snapshot names are known before its SSTs/ folder is.
        os.mkdir(into)
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except FileNotFoundError:
            return  # removed meanwhile (a state partition's cleanup): nothing of batch N
        parts = tuple(prefix.split("/")[:-1])
        left_out = set(ignore(folder, parts, [e.name for e in entries if e.name not in logs]))
        for entry in entries:
            if entry.name in left_out:
                continue
            rel = prefix + entry.name
            dst = os.path.join(into, entry.name)
            if not prefix and entry.name in logs and entry.is_dir():
                os.mkdir(dst)
                limit = logs[entry.name]
                for b in range(max(0, limit - LOG_HISTORY), limit + 1):
                    for name in (str(b), f".{b}.crc"):
                        copy(os.path.join(entry.path, name), os.path.join(dst, name),
                             f"{rel}/{name}")  # fmt: skip
            elif entry.is_dir():
                walk(entry.path, dst, rel + "/")
            else:
                copy(entry.path, dst, rel, entry)

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        walk(str(source), str(target), "")
    except OSError as exc:
        raise CheckpointError(f"cannot copy checkpoint {source}: {exc}") from exc
    for needed in (f"commits/{keep_commit}" if keep_commit >= 0 else None, f"offsets/{batch}"):
        if needed and not (target / needed).exists():
            raise CheckpointError(
                f"checkpoint {source} moved on while it was copied: {needed} was purged",
                hint="the query ran more batches than Spark retains during the copy; retry",
            )
    return {
        "batch": batch,
        "offset": end_offset(target, batch),
        "resume_floor": resume_floor(target, batch),
    }


def resume_floor(checkpoint: Path, batch: int) -> dict[str, Any] | None:
    """Where a query resumed from ``checkpoint`` (at commit ``batch``) may read its input
    again, at the lowest: a warm copy of it re-executes its last batch that read input
    (``copy_checkpoint``), from that batch's start — the end offset of the batch before.

    Found among the offset log entries a copy keeps (:data:`LOG_HISTORY` before ``batch``);
    a warm copy of a later checkpoint of the same history starts there too unless a batch
    since read input (then it starts later). ``None``: no batch among them read input (or
    it is the first), so where one would start is not known here.
    """
    ends: dict[int, dict[str, Any]] = {}
    for b in range(max(0, batch - LOG_HISTORY), batch + 1):
        try:
            ends[b] = end_offset(checkpoint, b)
        except FileNotFoundError:
            continue
    for b in range(batch, max(0, batch - LOG_HISTORY), -1):
        if b in ends and b - 1 in ends and progress_of(ends[b]) > progress_of(ends[b - 1]):
            return ends[b - 1]
    return None


def _ends(checkpoint: Path, commits: list[int]) -> dict[int, int]:
    """The progress at the end of each committed batch whose offsets are there.

    The oldest commits may have none: a warm copy keeps the offsets of its batch N and the
    commits up to N - 1 (each :data:`LOG_HISTORY` back), so a query started on it has a commit
    older than any offset file until Spark purges it, 100 batches later; and a running
    query's log cleanup may remove one while it is read.
    """
    ends = {}
    for b in commits:
        try:
            ends[b] = progress_of(end_offset(checkpoint, b))
        except FileNotFoundError:
            continue
    return ends


#: Offset and commit log entries a copy keeps before its batch. Resuming reads the newest of
#: each, and the offsets of the batch before (where a batch run again starts); the rest is
#: history Spark keeps for itself (``minBatchesToRetain``, 100 batches), which a copy has no
#: use for: with it, every node-level snapshot of a query that had run 100 batches copied,
#: hashed and shipped ~650 files instead of ~40.
LOG_HISTORY = 2


def _state_outside(names: list[str], version: int) -> tuple[list[str], str | None]:
    """What of a RocksDB state partition folder loading ``version`` does not read.

    Loading reads the newest snapshot (``.zip``) at or before ``version``, then replays the
    changelogs after it (``base + 1 .. version``; Spark's ``RocksDB.replayChangelog``): older
    versions, and the changelog of the snapshot's own version, are not read. Versions after
    ``version`` are not either: the copy is as of the batch before it, and what a running
    query wrote beyond (a batch committing, a snapshot uploaded, while the copy was made) is
    of a history the query resumed on the copy does not share; it writes those versions
    anew. Anything not named by a version, and any other kind of state file, is kept.

    Returns:
        The names left out, and the name of the snapshot loading starts from (None: no
        snapshot, loading starts from an empty store).
    """
    versions = {n: _state_version(n) for n in names}
    snapshots = [v for n, v in versions.items()
                 if v is not None and v <= version and n.endswith(".zip")]  # fmt: skip
    base = max(snapshots, default=0)
    dropped = [
        n for n, v in versions.items()
        if v is not None and (v < base or (v == base and ".changelog" in n) or v > version)
    ]  # fmt: skip
    return dropped, (f"{base}.zip" if snapshots else None)


def _sst_names(snapshot: Path) -> frozenset[str] | None:
    """The ``SSTs/`` files a RocksDB snapshot zip loads (its ``metadata`` member: a version
    line, then JSON whose ``sstFiles`` name each ``dfsSstFileName``); None when they cannot
    be told (an unknown format: then every SST is kept)."""
    try:
        stat = os.stat(snapshot)
    except OSError:
        return None
    # A zip is written once under its name: every snapshot of the node between two of
    # RocksDB's reads the same one, which is opened once.
    return _sst_names_of(str(snapshot), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=256)
def _sst_names_of(snapshot: str, inode: int, size: int, mtime_ns: int) -> frozenset[str] | None:
    """:func:`_sst_names` of one version of a file (the arguments after the path: its key)."""
    try:
        with zipfile.ZipFile(snapshot) as archive:
            text = archive.read("metadata").decode()
        listed = json.loads(text.partition("\n")[2])["sstFiles"]
        return frozenset(str(f["dfsSstFileName"]) for f in listed)
    except (OSError, EOFError, KeyError, TypeError, ValueError, zipfile.BadZipFile,
            zlib.error) as exc:  # fmt: skip
        log.debug("cannot read the SSTs of snapshot %s (%s): all are kept", snapshot, exc)
        return None


def _sst_name(name: str) -> str:
    """``x.sst`` for ``x.sst`` and its checksum ``.x.sst.crc``."""
    return name[1:-4] if name.startswith(".") and name.endswith(".crc") else name


def _being_written(name: str) -> bool:
    """A temporary file of Spark's (``.x.<uuid>.tmp``) or its checksum (``..x.<uuid>.tmp.crc``)."""
    return name.endswith((".tmp", ".tmp.crc"))


def _state_version(name: str) -> int | None:
    """``v`` for ``v.changelog``, ``v.zip`` and their ``.crc`` files, else None."""
    core = name[1:-4] if name.startswith(".") and name.endswith(".crc") else name
    stem, _, ext = core.partition(".")
    return int(stem) if stem.isdigit() and ext in ("changelog", "zip") else None


def _batch_name(name: str) -> int | None:
    """``N`` for ``N`` and ``.N.crc``, else None."""
    stripped = name[1:-4] if name.startswith(".") and name.endswith(".crc") else name
    return int(stripped) if stripped.isdigit() else None


#: The archive member of a checkpoint packed with ``known`` digests: ``{path: entry}`` of
#: the files left out because the receiver holds their content (:func:`fill_omitted`); an
#: entry with ``chunks`` is a large file rebuilt from those chunks, each one the receiver
#: holds or one shipped as a member of :data:`CHUNKS_FOLDER`.
OMITTED = "fogshift-omitted.json"
#: The archive folder of the chunks of partly known files, each named by its sha256.
CHUNKS_FOLDER = "fogshift-chunks"


def pack(
    folder: Path,
    known: Collection[str] = (),
    hashed: Mapping[tuple[int, int], str] | None = None,
    known_chunks: Collection[str] = (),
) -> tuple[bytes, str]:
    """A tar of ``folder`` and its sha256 (a shipped checkpoint).

    Not compressed: Spark compresses the state files (LZ4, the bulk of a checkpoint) as it
    writes them, and gzip on top cost more than it saved. A 50 MiB state took 1.1 s to pack
    and 0.23 s to unpack with gzip (level 1) to ship 23 % fewer bytes, against 33 and 39 ms
    without: time on the critical path of every literal migration and precopy or handover
    prepare, to save a quarter of a fast link's transfer (:func:`unpack` still reads gzip).

    Args:
        known: sha256 digests of files the receiver holds (the central store's blobs): a
            file with one of them is left out and listed in :data:`OMITTED` instead, for
            :func:`fill_omitted` to put back. Over a slow link most of a large state then
            stays put: the central store has all but the newest files.
        hashed: sha256 digests already known by file identity (``(st_dev, st_ino)``: a
            node-level snapshot's manifest, whose files are hard links to the same immutable
            files ``folder`` links to): not computed again.
        known_chunks: sha256 digests of content-defined chunks the receiver holds
            (:func:`~fogshift.checkpoint.chunks.file_chunks` of its large files): a large
            file with unknown content but some known chunks ships only its other chunks.
            RocksDB rewrites a small key space's state into a new file at each compaction,
            with the same values: over a slow link that file is most of a migration's bytes.
    """
    lean = _Leaner(known, known_chunks)

    def digest_of(path: Path) -> str:
        if hashed:
            stat = path.stat()
            sha = hashed.get((stat.st_dev, stat.st_ino))
            if sha is not None:
                return sha
        return _file_sha256(path)

    def leave_known(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if lean.asks and member.isfile():
            path = folder / member.name
            if lean.leaves_out(member, digest_of(path), path.read_bytes):
                return None
        return member

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(folder, arcname=".", filter=leave_known)
        lean.close(tar)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def lean_archive(
    data: bytes, known: Collection[str], known_chunks: Collection[str] = ()
) -> tuple[bytes, str] | None:
    """A whole archive of :func:`pack` (or :func:`fill_omitted`) without the files and chunks
    the receiver holds, as :func:`pack` with ``known`` and ``known_chunks`` makes it, with
    its sha256; ``None`` if the receiver holds none of it."""
    lean = _Leaner(known, known_chunks)
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as whole,
        tarfile.open(fileobj=buffer, mode="w") as tar,
    ):
        for member in whole.getmembers():
            handle = whole.extractfile(member) if member.isfile() else None
            content = handle.read() if handle is not None else None
            if content is not None and lean.leaves_out(
                member, hashlib.sha256(content).hexdigest(), partial(bytes, content)
            ):
                continue
            tar.addfile(member, io.BytesIO(content) if content is not None else None)
        if not lean.omitted:
            return None
        lean.close(tar)
    out = buffer.getvalue()
    return out, hashlib.sha256(out).hexdigest()


class _Leaner:
    """What an archive leaves out for a receiver holding files ``known`` and chunks
    ``known_chunks`` (see :func:`pack`): the :data:`OMITTED` listing, and the chunks of
    partly known files it carries."""

    def __init__(self, known: Collection[str], known_chunks: Collection[str]) -> None:
        self.known, self.known_chunks = known, known_chunks
        self.asks = bool(known or known_chunks)
        self.omitted: dict[str, dict[str, Any]] = {}
        self.carried: dict[str, bytes] = {}  # chunks of partly known files, by digest

    def leaves_out(self, member: tarfile.TarInfo, sha: str, read: Callable[[], bytes]) -> bool:
        """Whether file ``member`` (content digest ``sha``, bytes ``read()``) is left out."""
        # As the file was (Spark's state store ages files by their times).
        entry: dict[str, Any] = {"sha256": sha, "mode": member.mode, "mtime": member.mtime}
        if sha in self.known:
            self.omitted[os.path.normpath(member.name)] = entry
            return True
        if self.known_chunks and member.size >= CHUNKED_MIN_BYTES:
            data = read()
            chunks = file_chunks(data)
            if any(digest in self.known_chunks for _, _, digest in chunks):
                for offset, length, digest in chunks:
                    if digest not in self.known_chunks:
                        self.carried[digest] = data[offset : offset + length]
                self.omitted[os.path.normpath(member.name)] = {**entry, "chunks": chunks}
                return True
        return False

    def close(self, tar: tarfile.TarFile) -> None:
        """Add the carried chunks and the listing to ``tar``."""
        for digest, content in self.carried.items():
            member = tarfile.TarInfo(f"{CHUNKS_FOLDER}/{digest}")
            member.size = len(content)
            tar.addfile(member, io.BytesIO(content))
        if self.omitted:
            listing = json.dumps(self.omitted, sort_keys=True).encode()
            member = tarfile.TarInfo(OMITTED)
            member.size = len(listing)
            tar.addfile(member, io.BytesIO(listing))


def fill_omitted(
    data: bytes,
    blob: Callable[[str], Path],
    chunk: Callable[[str], bytes | None] | None = None,
) -> tuple[bytes, str] | None:
    """The whole archive of one :func:`pack` made with ``known`` digests: its files, and the
    ones it left out taken from ``blob(sha256)`` (checked), or rebuilt from their chunks (the
    archive's, else ``chunk(sha256)``); ``None`` if it left none out.

    Raises:
        TornCheckpoint: A blob or chunk is missing or does not match its digest, or a file
            rebuilt does not match its own (the caller then asks for the whole checkpoint);
            or the archive or its listing cannot be read.
    """
    try:
        return _filled(data, blob, chunk)
    except (tarfile.TarError, KeyError, TypeError, ValueError, AttributeError) as exc:
        # (AttributeError: a listing that is no mapping; answered 500, nobody sent it whole)
        raise TornCheckpoint(f"a checkpoint archive that left files out cannot be read: {exc}",
                             expected="an archive of fogshift's pack()") from exc  # fmt: skip


def _filled(
    data: bytes, blob: Callable[[str], Path], chunk: Callable[[str], bytes | None] | None
) -> tuple[bytes, str] | None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        listed = tar.extractfile(OMITTED) if OMITTED in tar.getnames() else None
        if listed is None:
            return None
        omitted: dict[str, dict[str, Any]] = json.loads(listed.read())
        carried: dict[str, tarfile.TarInfo] = {}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as whole:
            for member in tar.getmembers():
                if member.name == OMITTED:
                    continue
                if member.name.startswith(f"{CHUNKS_FOLDER}/"):
                    carried[member.name.removeprefix(f"{CHUNKS_FOLDER}/")] = member
                    continue
                whole.addfile(member, tar.extractfile(member) if member.isfile() else None)
            for rel, entry in sorted(omitted.items()):
                sha = entry["sha256"]
                if "chunks" in entry:
                    content = b"".join(
                        _chunk_of(rel, digest, tar, carried.get(digest), chunk)
                        for _, _, digest in entry["chunks"]
                    )
                else:
                    try:
                        content = blob(sha).read_bytes()
                    except (OSError, FogshiftError) as exc:
                        raise TornCheckpoint(
                            f"checkpoint file {rel} ({sha[:12]}…) is gone: {exc}"
                        ) from exc
                if hashlib.sha256(content).hexdigest() != sha:
                    raise TornCheckpoint(f"checkpoint file {rel} does not match {sha[:12]}…")
                member = tarfile.TarInfo(f"./{rel}")
                member.size, member.mode, member.mtime = len(content), entry["mode"], entry["mtime"]
                whole.addfile(member, io.BytesIO(content))
    out = buffer.getvalue()
    return out, hashlib.sha256(out).hexdigest()


def _chunk_of(
    rel: str,
    digest: str,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo | None,
    held: Callable[[str], bytes | None] | None,
) -> bytes:
    """Chunk ``digest`` of file ``rel``: shipped in the archive, or held by the receiver."""
    handle = tar.extractfile(member) if member is not None else None
    content = handle.read() if handle is not None else held(digest) if held else None
    if content is None or hashlib.sha256(content).hexdigest() != digest:
        raise TornCheckpoint(f"chunk {digest[:12]}… of checkpoint file {rel} is gone")
    return content


def _file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def unpack(
    data: bytes, digest: str, target: Path, place: Callable[[Path, Path], None] | None = None
) -> None:
    """Install a shipped checkpoint at ``target`` (replacing it), after checking its digest.

    Args:
        place: Puts the unpacked staging folder in place at ``target``; :func:`install`
            by default.

    Raises:
        TornCheckpoint: The bytes do not match the digest or are not a valid archive.
    """
    if hashlib.sha256(data).hexdigest() != digest:
        raise TornCheckpoint(
            f"checkpoint for {target} is damaged: its sha256 does not match",
            expected=digest,
            received=hashlib.sha256(data).hexdigest(),
        )
    staging = incoming(target)
    staging.mkdir()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            _refuse_strangers(tar.getmembers(), target)
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, OSError, TornCheckpoint) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, TornCheckpoint):
            raise
        raise TornCheckpoint(f"checkpoint archive for {target} cannot be read: {exc}") from exc
    (place or install)(staging, target)


STRANGER_HINT = "the sending node is not fogshift's, or not itself"


def _refuse_strangers(members: list[tarfile.TarInfo], target: Path) -> None:
    """Refuse an archive with anything :func:`pack` never makes: a member other than a file,
    a folder or a hard link to another member, or a name that is not a normalised relative
    path. Not left to tarfile's ``data`` filter alone: interpreters before 3.11.13 let some
    links through it (CVE-2025-4517), and the archive comes from another node.

    Raises:
        TornCheckpoint: Such a member, named.
    """
    for member in members:
        name = member.name.removeprefix("./")
        if name in ("", ".") and member.isdir():
            continue  # (the archive's root, as pack() adds it)
        names = [name, member.linkname.removeprefix("./")] if member.islnk() else [name]
        try:
            for each in names:
                check_relative_path(each, f"file of the checkpoint archive for {target}")
        except InvalidName as exc:
            raise TornCheckpoint(
                exc.message, expected=exc.expected, received=exc.received, hint=STRANGER_HINT
            ) from exc
        if not (member.isfile() or member.isdir() or member.islnk()):
            raise TornCheckpoint(
                f"checkpoint archive for {target} holds {name!r}, which is no file or folder",
                expected="files, folders and hard links between them, as fogshift packs them",
                received=f"{name!r} of tar type {member.type!r}",
                hint=STRANGER_HINT,
            )


def installing(target: Path) -> Path:
    """The staging folder beside ``target`` where a checkpoint for it is assembled."""
    return target.with_name(target.name + ".incoming")


def incoming(target: Path) -> Path:
    """The empty staging folder beside ``target`` where a checkpoint for it is assembled."""
    staging = installing(target)
    if staging.exists():
        shutil.rmtree(staging)
    staging.parent.mkdir(parents=True, exist_ok=True)
    return staging


def replaced(target: Path) -> Path:
    """Where :func:`install` moves the checkpoint it replaces at ``target`` until it is
    removed (not a PE's name: nothing takes it for one)."""
    return target.with_name(target.name + ".replaced")


def settle_install(target: Path) -> bool | None:
    """Settle what an install that ended between its two renames left at ``target`` (the
    process was killed there): the checkpoint it was replacing, aside as :func:`replaced`.

    If ``target`` is missing, the new copy never got into place, so the install did not
    happen (its caller never heard it did): the old checkpoint goes back, rather than the PE
    seeming to have none here (a deploy would start it over, and nothing would ever remove
    the folder aside). If ``target`` is there, the install was done but for removing the old
    one, which is removed now.

    Returns:
        ``True`` if the old checkpoint was put back, ``False`` if it was removed, ``None``
        if there was nothing to settle.
    """
    old = replaced(target)
    if not old.is_dir():
        return None
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        return False
    old.replace(target)
    return True


def install(
    staging: Path, target: Path, renames: contextlib.AbstractContextManager[object] | None = None
) -> None:
    """Make the checkpoint assembled in ``staging`` the one at ``target`` (replacing it).

    Args:
        renames: Entered around the two renames only (the old checkpoint aside, the new one
            in place); it may refuse by raising. The old one is removed after it, so a
            caller's lock is not held while a large state's files are deleted.
    """
    relocate(staging, target)
    old = replaced(target)
    shutil.rmtree(old, ignore_errors=True)  # (one a crash left between the renames)
    with renames or contextlib.nullcontext():
        if target.exists():
            target.replace(old)
        staging.replace(target)
    shutil.rmtree(old, ignore_errors=True)


_SCHEMA_PATH = re.compile(r'"file:[^"]*?/state/(\d+)/_stateSchema/')


def relocate(checkpoint: Path, final: Path) -> int:
    """Point a copied checkpoint's state-schema references at its new place.

    Spark records the absolute paths of the state schema files in the operator metadata
    (``state/<op>/_metadata/v2/<batch>``); a copy on another node must refer to its own
    files. The checksum files of rewritten entries are dropped (Hadoop then skips the check).

    Returns:
        How many metadata files were rewritten.
    """
    rewritten = 0
    for meta in checkpoint.glob("state/*/_metadata/v2/*"):
        if meta.name.startswith("."):
            continue
        text = meta.read_text()
        fixed = _SCHEMA_PATH.sub(lambda m: f'"file:{final}/state/{m.group(1)}/_stateSchema/', text)
        if fixed != text:
            # A new file under the name, never the old one rewritten: node-level snapshots
            # hard-link it, and their manifests hold the digest of what it was. Its
            # checksums go first: a snapshot checks a file against them.
            (meta.parent / f".{meta.name}.crc").unlink(missing_ok=True)
            tmp = meta.with_name(f".{meta.name}.fogshift.tmp")
            tmp.write_text(fixed)
            tmp.replace(meta)
            rewritten += 1
    return rewritten
