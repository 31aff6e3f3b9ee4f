"""Central-level checkpoints: content-addressed copies of node-level snapshots.

The same store holds the extra copies a node keeps as a PE's planned backup
(``fogshift.agent.replicas``).

The orchestrator pulls each PE's newest node-level snapshot at its own interval. Files are
stored once per content (``blobs/<sha256>``), so a pull ships only the files that changed
since any earlier pull — what is shipped grows with what changed, not with the state. Of a
large file that changed, only the chunks held in no stored file cross
(:mod:`fogshift.checkpoint.chunks`): RocksDB rewrites its files whole. A
checkpoint becomes visible when its manifest is written (atomically, after every blob it
names is in place). Reading verifies every blob's size and digest; a checkpoint that fails is
torn, and the previous one is used.

A manifest comes from another process (a node's snapshot, a restore request), so every
name in it — pipeline, element, id, each file's path and digest — is checked
(:func:`check_manifest`) before anything is fetched or written, and every path built from
it must resolve inside its folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from fogshift.checkpoint.chunks import CHUNKED_MIN_BYTES, Chunk, file_chunks
from fogshift.checkpoint.exceptions import CheckpointError, TornCheckpoint
from fogshift.common.files import sync_folder
from fogshift.common.names import (
    check_name,
    check_relative_path,
    check_sha256,
    check_snapshot_id,
    contained,
    pe_folder,
    pipeline_folder,
)
from fogshift.exceptions import InvalidInput, NotFound

log = logging.getLogger(__name__)

#: What a refused manifest's sender can do: it is written by a node's snapshot, and one
#: refused here was changed on its way or was not written by fogshift.
_MANIFEST_HINT = "send the manifest as the node's snapshot wrote it, unchanged"


def check_manifest(
    manifest: Any, pipeline: str | None = None, pe: str | None = None
) -> dict[str, Any]:
    """Return ``manifest`` once every name in it is safe to turn into a path.

    Args:
        pipeline, pe: The PE the manifest must belong to, if known.

    Raises:
        InvalidName: The pipeline, element or id is not a valid name, or a file path is not
            a normalised relative path (``../x``, ``/etc/x``, ``a\\b``...), or a digest is
            not a sha256.
        InvalidInput: It is not a manifest (no ``files`` mapping, a size that is not a
            count), or belongs to another PE than ``pipeline/pe``.
    """
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise InvalidInput(
            "not a checkpoint manifest",
            expected="an object with id, pipeline, element and files",
            received=repr(manifest)[:120],
            hint=_MANIFEST_HINT,
        )
    owner_pipeline = check_name(manifest.get("pipeline"), "pipeline name in a manifest")
    owner_pe = check_name(manifest.get("element"), "element name in a manifest")
    owner = f"{owner_pipeline}/{owner_pe}"
    if pipeline is not None and pe is not None and owner != f"{pipeline}/{pe}":
        raise InvalidInput(
            f"checkpoint manifest for {pipeline}/{pe} belongs to another PE",
            expected=f"{pipeline}/{pe}",
            received=owner,
            hint=f"send {pipeline}/{pe}'s own manifest",
        )
    check_snapshot_id(manifest.get("id"), f"checkpoint id of {owner}")
    for rel, entry in manifest["files"].items():
        check_relative_path(rel, f"file path in checkpoint {manifest['id']} of {owner}")
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(
                f"file {rel} of checkpoint {manifest['id']} of {owner} has no valid size",
                expected="a byte count (an integer >= 0)",
                received=repr(entry)[:120],
                hint=_MANIFEST_HINT,
            )
        check_sha256(entry.get("sha256"), f"digest of file {rel} of {owner}")
    folders = {str(parent) for rel in manifest["files"] for parent in PurePosixPath(rel).parents}
    if clash := sorted(folders & set(manifest["files"])):
        # (Both a file and a folder: it could never be written out, and every install of it
        # failed.)
        raise InvalidInput(
            f"checkpoint {manifest['id']} of {owner} names {clash[0]!r} as a file and a folder",
            expected="file paths none of which is another's folder",
            received=clash[0],
            hint=_MANIFEST_HINT,
        )
    return manifest


#: A temporary file (a blob's, a chunk list's, a manifest's) this old was left by a write
#: cut short (younger, a write may be under way).
TMP_LEFT_S = 600.0

#: Files of one checkpoint fetched at a time (:meth:`CentralStore.put`).
FETCH_WORKERS = 8
#: How long a blob's digest check is trusted while its size and mtime stay the same: a bad
#: disk changes bytes, not the inode's times, and a stable file (an SST, Spark's metadata)
#: is named by every checkpoint of its PE, so one flipped bit trusted for good tore each
#: new one, until the count-based expiry had removed the last whole one. Read again after
#: this, a blob costs one read per interval however often checkpoints name it.
RECHECK_S = 600.0


class ChunkedSource(Protocol):
    """Where a snapshot's large files can be read chunk by chunk (a node agent)."""

    def chunks(self, rel: str) -> list[Chunk] | None:
        """The :func:`~fogshift.checkpoint.chunks.file_chunks` of file ``rel``; ``None``
        if the source lists none (then the file is fetched whole)."""

    def range(self, rel: str, offset: int, length: int) -> bytes:
        """``length`` bytes of file ``rel`` from ``offset``."""


@dataclass(frozen=True)
class KnownBlobs:
    """Checkpoint files a store holds: their sha256 digests, and the file of each (which
    may be gone by the time it is read: a store collects unused blobs); the content-defined
    chunks of the large ones, and the bytes of each (checked; ``None`` once gone)."""

    digests: frozenset[str]
    path: Callable[[str], Path]
    chunks: frozenset[str] = frozenset()
    chunk: Callable[[str], bytes | None] | None = None


def _write_synced(tmp: Path, data: bytes, path: Path, renamed: bool = True) -> None:
    """Write ``data`` to ``tmp``, on disk before it is renamed to ``path``; with
    ``renamed``, the rename on disk too (else the caller syncs the folder, once for many:
    :func:`~fogshift.common.files.sync_folder`). The central store is a PE's last copy once
    its node is gone: after a power loss of its host, a manifest must not name files that
    were only in the page cache (empty then), the checkpoints before it expired as kept
    ones."""
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    if renamed:
        sync_folder(path.parent)


class CentralStore:
    """The central checkpoint store of one orchestrator.

    Args:
        root: Its folder.
        keep: How many checkpoints to keep per PE.
    """

    def __init__(self, root: Path, keep: int = 3) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        # Blobs whose digest this process checked, with the (size, mtime) it saw then: a
        # blob changed on disk since (a torn write, a bad disk, a hand) is checked again
        # before a new checkpoint counts on it, instead of being trusted for its name.
        self._checked: dict[str, tuple[int, int, float]] = {}  # ... and when (monotonic)
        # The chunks of the large blobs (``chunks/<sha256>``: their lists), by chunk digest:
        # where each can be read here. Loaded at the first put; a hit is read and checked
        # before use (its blob may be gone).
        self.chunk_lists = root / "chunks"
        self.chunk_lists.mkdir(parents=True, exist_ok=True)
        self._chunk_at: dict[str, tuple[str, int, int]] | None = None
        self._indexed: set[str] = set()
        self._chunk_lock = threading.Lock()
        # A checkpoint's manifest is written (its commit) and a pipeline's are forgotten
        # one at a time: a put that checks it is still wanted is never undone by a forget it
        # raced, nor lands after one.
        self._commit_lock = threading.Lock()
        # The files of the puts under way, by digest: no collection removes them, whatever
        # their age (a put's manifest is written after its files).
        self._in_flight: Counter[str] = Counter()
        self._flight_lock = threading.Lock()
        #: Puts ended so far: one that ended during a collection's scan may have written
        #: its manifest where the scan had looked already (see collect_garbage).
        self._puts_ended = 0

    def _intact(self, blob: Path, sha: str, size: int) -> bool:
        """Whether ``blob`` holds the bytes whose digest is ``sha``.

        A blob that does not is removed, so the next checkpoint that names it ships it
        again: content is shared by every checkpoint that holds the same file (Spark
        writes many identical small files), and one corrupt copy must not make all of
        them unusable. A blob is judged by its content only: a manifest giving the digest
        another ``size`` lies (a digest has one size), and is refused, the blob kept (a
        node's wrong size removed a file every other PE's checkpoints named).

        Raises:
            TornCheckpoint: ``size`` is not the size of the content ``sha`` names.
        """
        try:
            stat = blob.stat()
        except FileNotFoundError:
            return False
        seen = (stat.st_size, stat.st_mtime_ns)
        checked = self._checked.get(sha)
        if checked is None or checked[:2] != seen or time.monotonic() - checked[2] > RECHECK_S:
            if _read_digest(blob) != sha:
                self._checked.pop(sha, None)
                _unlink_if(blob, stat.st_ino)
                return False
            self._checked[sha] = (*seen, time.monotonic())
        if stat.st_size != size:
            raise TornCheckpoint(
                f"a checkpoint manifest gives file content {sha[:12]}… {size} bytes; that "
                f"content has {stat.st_size}"
            )
        return True

    def _folder(self, pipeline: str, pe: str) -> Path:
        return pe_folder(self.root / "checkpoints", pipeline, pe)

    def manifests(self, pipeline: str, pe: str) -> list[dict[str, Any]]:
        """Every visible checkpoint of a PE, newest first."""
        return list(self._manifests(pipeline, pe))

    def forget(self, pipeline: str, pe: str | None = None) -> None:
        """Drop every checkpoint of a PE, or of every PE of ``pipeline`` (one deployed
        afresh: its streams start over, and a checkpoint of the run before, restored, would
        resume at positions of streams that are gone; a partition retired, whose id a later
        scale may give a new one); their files go with the next garbage collection."""
        folder = (
            self._folder(pipeline, pe)
            if pe is not None
            else pipeline_folder(self.root / "checkpoints", pipeline)
        )
        with self._commit_lock:
            shutil.rmtree(folder, ignore_errors=True)

    def newest(self, pipeline: str, pe: str) -> dict[str, Any] | None:
        """The newest visible checkpoint of a PE (the one stored last), if any."""
        return next(self._manifests(pipeline, pe), None)

    def known_blobs(self, pipeline: str, pe: str) -> KnownBlobs | None:
        """The files of the PE's newest checkpoint here, and the chunks of its large ones,
        to leave out of a checkpoint shipped through the orchestrator (``None``: none held)."""
        newest = self.newest(pipeline, pe)
        return self.blobs_of([newest]) if newest is not None else None

    def blobs_of(self, manifests: list[dict[str, Any]]) -> KnownBlobs | None:
        """The files of checkpoints ``manifests`` (of this store), and the chunks of their
        large files held here (``None``: no file)."""
        files = [entry for m in manifests for entry in (m.get("files") or {}).values()]
        if not files:
            return None
        chunks: set[str] = set()
        for entry in files:
            if entry["size"] < CHUNKED_MIN_BYTES or not (self.blobs / entry["sha256"]).exists():
                continue
            try:
                self._index(entry["sha256"])  # (a blob stored whole has no list yet)
                listing = json.loads((self.chunk_lists / entry["sha256"]).read_text())
            except (OSError, ValueError):
                continue  # collected meanwhile: its chunks are not offered
            chunks.update(str(digest) for _, _, digest in listing)
        return KnownBlobs(
            digests=frozenset(entry["sha256"] for entry in files),
            path=self.blob_path,
            chunks=frozenset(chunks),
            chunk=self.held_chunk,
        )

    def kept(self, pipeline: str, pe: str) -> list[dict[str, Any]]:
        """The PE's kept checkpoints' manifests, newest stored first, whole or not (see
        :meth:`verify`)."""
        return list(self._manifests(pipeline, pe))

    def _manifests(self, pipeline: str, pe: str) -> Iterator[dict[str, Any]]:
        """The PE's checkpoints, newest stored first (see :func:`_newest_first`)."""
        for _, manifest in _newest_first(self._folder(pipeline, pe)):
            yield manifest

    def _index(self, sha: str, data: bytes | None = None) -> None:
        """Add the chunks of large blob ``sha`` (its bytes ``data``, or read) to the index,
        its chunk list written beside (once per blob)."""
        with self._chunk_lock:
            at = self._chunks_loaded()
            if sha in self._indexed:
                return
            listing = self.chunk_lists / sha
            try:
                chunks = [tuple(c) for c in json.loads(listing.read_text())]
            except (OSError, ValueError):
                if data is None:
                    data = (self.blobs / sha).read_bytes()
                chunks = file_chunks(data)
                tmp = listing.with_name(f".{sha}.{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps(chunks))
                tmp.replace(listing)
            # The newest blob holding a chunk serves it: the older ones go first.
            for offset, length, digest in chunks:
                at[str(digest)] = (sha, int(offset), int(length))
            self._indexed.add(sha)

    def _chunks_loaded(self) -> dict[str, tuple[str, int, int]]:
        """The chunk index, loaded from the chunk lists at the first call (under the lock)."""
        if self._chunk_at is None:
            self._chunk_at = {}
            for listing in self.chunk_lists.iterdir():
                if listing.name.startswith("."):
                    continue
                try:
                    chunks = json.loads(listing.read_text())
                except (OSError, ValueError):
                    continue
                for offset, length, digest in chunks:
                    self._chunk_at.setdefault(str(digest), (listing.name, int(offset), int(length)))
                self._indexed.add(listing.name)
        return self._chunk_at

    def held_chunk(self, digest: str) -> bytes | None:
        """The bytes of chunk ``digest`` from a stored blob, checked; ``None`` if none holds
        it (any more)."""
        with self._chunk_lock:
            hit = self._chunks_loaded().get(digest)
        if hit is None:
            return None
        sha, offset, length = hit
        try:
            with open(self.blobs / sha, "rb") as blob:
                blob.seek(offset)
                data = blob.read(length)
        except OSError:
            data = b""
        if len(data) == length and hashlib.sha256(data).hexdigest() == digest:
            return data
        with self._chunk_lock:  # the blob went (collected) or changed: forget the chunk
            if self._chunks_loaded().get(digest) == hit:
                del self._chunks_loaded()[digest]
        return None

    def _fetch_chunked(
        self, rel: str, size: int, source: ChunkedSource
    ) -> tuple[bytes, int] | None:
        """File ``rel`` (``size`` bytes) from the chunks held here and ranges of ``source``
        for the rest; with the bytes that crossed. ``None``: ``source`` lists no chunks."""
        listing = source.chunks(rel)
        if listing is None:
            return None
        pieces: dict[int, bytes] = {}  # by offset (what a node claims is not allocated ahead)
        end = 0
        runs: list[list[int]] = []  # runs of chunks to fetch: [offset, length]
        for offset, length, digest in listing:
            if offset != end or length <= 0 or offset + length > size:
                raise TornCheckpoint(f"the chunks of file {rel} do not cover it in order")
            end = offset + length
            held = self.held_chunk(digest)
            if held is not None:
                pieces[offset] = held
            elif runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1][1] += length
            else:
                runs.append([offset, length])
        if end != size:
            raise TornCheckpoint(f"the chunks of file {rel} cover {end} of its {size} bytes")
        shipped = len(json.dumps(listing))
        for offset, length in runs:
            piece = source.range(rel, offset, length)
            if len(piece) != length:
                raise TornCheckpoint(f"file {rel} has no {length} bytes at {offset}")
            pieces[offset] = piece
            shipped += length
        return b"".join(pieces[offset] for offset in sorted(pieces)), shipped

    def put(
        self,
        manifest: dict[str, Any],
        fetch: Callable[[str], bytes],
        chunked: ChunkedSource | None = None,
        wanted: Callable[[], bool] | None = None,
    ) -> int | None:
        """Store a node-level snapshot, fetching only unknown files; returns bytes shipped
        (``None``: not stored, ``wanted`` said no).

        Args:
            manifest: The snapshot's manifest.
            fetch: Returns the bytes of one file of the snapshot, by relative path.
            chunked: Where its large files (:data:`CHUNKED_MIN_BYTES`) can be read chunk by
                chunk: then only the chunks no stored file holds are fetched.
            wanted: Asked once its files are here, before the manifest is written (and
                no :meth:`forget` runs meanwhile): ``False`` leaves the checkpoint out (its
                files go with the next garbage collection). The caller's check that its
                pipeline was not deployed afresh while the files came.

        Raises:
            InvalidName / InvalidInput: The manifest names something that cannot be a path
                here (:func:`check_manifest`); nothing was fetched or written.
            TornCheckpoint: A fetched file does not match the manifest's digest.
        """
        check_manifest(manifest)
        digests = [entry["sha256"] for entry in manifest["files"].values()]
        with self._flight_lock:  # (before any blob is looked at: see collect_garbage)
            self._in_flight.update(digests)
        try:
            return self._put(manifest, fetch, chunked, wanted)
        finally:
            with self._flight_lock:
                self._in_flight.subtract(digests)
                self._in_flight += Counter()  # (drops the counts at zero)
                self._puts_ended += 1

    def _put(
        self,
        manifest: dict[str, Any],
        fetch: Callable[[str], bytes],
        chunked: ChunkedSource | None,
        wanted: Callable[[], bool] | None,
    ) -> int | None:
        folder = self._folder(manifest["pipeline"], manifest["element"])
        missing: dict[str, str] = {}  # sha256 -> a file with that content
        for rel, entry in manifest["files"].items():
            blob = self.blobs / entry["sha256"]
            if self._intact(blob, entry["sha256"], entry["size"]):
                os.utime(blob)  # in use again: out of reach of a concurrent collection
                sha = entry["sha256"]  # (its check's time stays: see RECHECK_S)
                self._checked[sha] = (entry["size"], blob.stat().st_mtime_ns,
                                      self._checked[sha][2])  # fmt: skip
                if chunked is not None and entry["size"] >= CHUNKED_MIN_BYTES:
                    self._index(entry["sha256"])  # (stored before its chunks were listed)
                continue
            missing.setdefault(entry["sha256"], rel)
        sizes = {entry["sha256"]: entry["size"] for entry in manifest["files"].values()}

        def ship(sha: str) -> int:
            rel = missing[sha]
            large = sizes[sha] >= CHUNKED_MIN_BYTES
            got = None
            if chunked is not None and large:
                got = self._fetch_chunked(rel, sizes[sha], chunked)
            data, crossed = got if got is not None else (fetch(rel), sizes[sha])
            if hashlib.sha256(data).hexdigest() != sha:
                raise TornCheckpoint(
                    f"file {rel} of checkpoint {manifest['id']} of "
                    f"{manifest['pipeline']}/{manifest['element']} changed in transit"
                )
            if len(data) != sizes[sha]:
                # A manifest stored with a wrong size counts among the kept ones, which
                # restores refuse: three of them expired the last usable checkpoint.
                raise TornCheckpoint(
                    f"file {rel} of checkpoint {manifest['id']} of "
                    f"{manifest['pipeline']}/{manifest['element']} has {len(data)} bytes, "
                    f"not the {sizes[sha]} its manifest says (or the manifest names its "
                    "content with two sizes)"
                )
            blob = self.blobs / sha
            _write_synced(
                blob.with_name(f"{sha}.{threading.get_ident()}.tmp"), data, blob, renamed=False
            )  # (the folder once, before the manifest)
            self._checked[sha] = (len(data), blob.stat().st_mtime_ns, time.monotonic())
            if large:
                self._index(sha, data)
            return crossed

        # Several requests at a time: over a link of 1 s RTT one at a time took a second per
        # file, and a first pull of a checkpoint's 50-100 files outlived the node's snapshot.
        shipped = 0
        if missing:
            with ThreadPoolExecutor(min(FETCH_WORKERS, len(missing))) as pool:
                shipped = sum(pool.map(ship, missing))
        with self._commit_lock:
            if wanted is not None and not wanted():
                log.info("checkpoint %s of %s/%s is no longer wanted: not stored",
                         manifest["id"], manifest["pipeline"], manifest["element"])  # fmt: skip
                return None  # (a number here was taken for a pull done: shown as the PE's last)
            folder.mkdir(parents=True, exist_ok=True)
            # Stored after every checkpoint before it, whatever the clock says: a clock set
            # back (NTP, a resumed VM) made each new one the oldest, expired at once.
            before = _newest_first(folder)
            last = float(before[0][1].get("stored") or 0) if before else 0.0
            at = max(time.time(), math.nextafter(last, math.inf))
            stored = {**manifest, "stored": at, "shipped_bytes": shipped}
            # (Also with nothing shipped: a blob found here may be another put's, renamed
            # and not yet synced.)
            sync_folder(self.blobs)
            _write_synced(folder / f".{manifest['id']}.tmp", json.dumps(stored).encode(),
                          folder / f"{manifest['id']}.json")  # fmt: skip
        expired = _newest_first(folder)[self.keep :]
        for old, _ in expired:
            old.unlink(missing_ok=True)
        if expired:
            self.collect_garbage()
        return shipped

    def collect_garbage(self, horizon_s: float = 600.0) -> int:
        """Delete blobs no kept checkpoint names; returns how many.

        Without it the store would grow with every changed file forever. A blob is written
        before the manifest naming it, so one that is being stored right now (its manifest
        not yet visible) is spared: a put of this store's is known (and spared whatever its
        age), another process's only by the blob's age (``horizon_s``).
        """
        with self._flight_lock:
            in_flight = set(self._in_flight)
            ended = self._puts_ended
        referenced: set[str] = set(in_flight)
        for manifest_file in (self.root / "checkpoints").glob("*/*/*.json"):
            try:
                files = json.loads(manifest_file.read_text())["files"]
            except (FileNotFoundError, ValueError, KeyError):
                continue  # expired meanwhile, or no manifest (a torn write is a temp file)
            except OSError as exc:
                # Unread (too many open files, an I/O error): its blobs would look unused.
                log.warning("garbage collection of %s stopped: %s could not be read: %s",
                            self.root, manifest_file, exc)  # fmt: skip
                return 0
            referenced.update(entry["sha256"] for entry in files.values())
        removed = 0
        horizon = time.time() - horizon_s
        left_before = time.time() - TMP_LEFT_S
        for blob in self.blobs.iterdir():
            if blob.name in referenced:
                continue
            try:
                # (A blob being written, under its temporary name, is no put's file by
                # name: spared until older than any write takes, whatever ``horizon_s``.)
                writing = blob.name.endswith(".tmp")
                if blob.stat().st_mtime >= (left_before if writing else horizon):
                    continue
                # Asked again at the unlink: a put registers its files before it looks at
                # any, so one that began during the scan (and found this blob there) keeps
                # it, and one that begins after the unlink finds it gone and ships it.
                # A put that ended since the scan began may have written its manifest where
                # the scan had looked already, naming this blob (with ``horizon_s`` 0, a
                # replica's copy just made lost its files): spared until the next collection.
                with self._flight_lock:
                    if blob.name in self._in_flight or self._puts_ended != ended:
                        continue
                    blob.unlink()
                # (Its digest checked once no longer saves a read: a store kept one per
                # blob ever written, growing for as long as the process ran.)
                self._checked.pop(blob.name, None)
                removed += 1
            except FileNotFoundError:
                continue
        # A chunk list goes with its blob, and the index is read again from those left at
        # its next use: its entries of that blob would serve nothing, while a kept blob
        # holding the same chunk would not be asked (the whole file shipped again).
        dropped = False
        for listing in self.chunk_lists.iterdir():
            if listing.name.startswith(".") or (self.blobs / listing.name).exists():
                continue
            listing.unlink(missing_ok=True)
            dropped = True
        # What a write cut short by a crash left under its temporary name (a chunk list's,
        # a manifest's) is never renamed: it goes once older than any write takes (whatever
        # ``horizon_s``: a collection at once must not take a put's file before its rename).
        for tmp in (*self.chunk_lists.glob(".*.tmp"),
                    *(self.root / "checkpoints").glob("*/*/.*.tmp")):  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                if tmp.stat().st_mtime < left_before:
                    tmp.unlink()
        if dropped:
            with self._chunk_lock:
                self._chunk_at = None
                self._indexed.clear()
        return removed

    def blob_path(self, sha: str) -> Path:
        """The file of blob ``sha`` (served to nodes that copy a checkpoint).

        Raises:
            InvalidName: ``sha`` is not a sha256 in hex.
            NotFound: The store does not hold it.
        """
        path = self.blobs / check_sha256(sha)
        if not path.is_file():
            raise self._no_blob(sha)
        return path

    def _no_blob(self, sha: str) -> NotFound:
        # (Said to the nodes that copy from this store: the store's absolute path on its
        # host, which the refusal named, is none of theirs.)
        return NotFound(
            f"no checkpoint blob {sha[:12]}… in this store",
            expected="a blob a kept checkpoint names",
            received=sha,
            hint="the checkpoint naming it was expired or found torn since it was listed: "
            "ask for the newest checkpoint's files again",
        )

    def blob_chunks(self, sha: str) -> tuple[int, list[Chunk]]:
        """Blob ``sha``'s size and content-defined chunks (listed once, kept beside it), for
        a node copying it that holds most of its chunks already (:meth:`put` ``chunked``).

        Raises:
            InvalidName: ``sha`` is not a sha256 in hex.
            NotFound: The store does not hold it.
        """
        path = self.blob_path(sha)
        try:
            self._index(sha)
            listing = json.loads((self.chunk_lists / sha).read_text())
            size = path.stat().st_size
        except (OSError, ValueError):  # collected meanwhile
            raise self._no_blob(sha) from None
        return size, [(int(o), int(n), str(d)) for o, n, d in listing]

    def verify(self, manifest: dict[str, Any]) -> str | None:
        """Why a checkpoint is unusable (missing or corrupt blob), or ``None`` if it is whole.

        Raises:
            InvalidName / InvalidInput: See :func:`check_manifest`.
        """
        check_manifest(manifest)
        for rel, entry in manifest["files"].items():
            blob = self.blobs / entry["sha256"]
            try:
                stat = blob.stat()
                digest = _read_digest(blob)
            except FileNotFoundError:
                return f"file {rel} is missing"
            if digest == entry["sha256"]:
                if stat.st_size == entry["size"]:
                    continue
                # The manifest lies about a whole file: it is unusable, the file is not
                # (other checkpoints name it).
                return f"file {rel} has {stat.st_size} bytes, not {entry['size']}"
            problem = f"file {rel} is corrupt (sha256 {digest[:12]}…)"
            # Removed, so the next checkpoint holding this content ships it again.
            self._checked.pop(entry["sha256"], None)
            _unlink_if(blob, stat.st_ino)
            return problem
        return None

    def latest_whole(self, pipeline: str, pe: str) -> tuple[dict[str, Any], list[str]]:
        """The newest checkpoint that verifies, and why newer ones were skipped.

        Raises:
            CheckpointError: No whole checkpoint exists.
        """
        skipped: list[str] = []
        for manifest in self._manifests(pipeline, pe):
            problem = self.verify(manifest)
            if problem is None:
                return manifest, skipped
            skipped.append(f"{manifest['id']}: {problem}")
        raise CheckpointError(
            f"no usable central checkpoint of {pipeline}/{pe}"
            + (f" (skipped: {'; '.join(skipped)})" if skipped else ""),
            hint="central checkpoints are pulled from the node every --central-interval seconds "
            "(`fogshift up`); none was taken yet",
        )

    def materialize(self, manifest: dict[str, Any], target: Path) -> None:
        """Rebuild a checkpoint directory from its blobs.

        Raises:
            InvalidName / InvalidInput: The manifest names a file outside ``target``
                (:func:`check_manifest`); nothing was written.
            PathEscape: A file would resolve outside ``target`` all the same.
        """
        check_manifest(manifest)
        if target.exists():
            shutil.rmtree(target)
        for rel, entry in manifest["files"].items():
            path = contained(target, *rel.split("/"), what=f"checkpoint file {rel}")
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.blobs / entry["sha256"], path)


def _newest_first(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The checkpoints in ``folder`` (a PE's), the one stored last first, not the highest
    batch: after a standby's promotion, or a restore from an older checkpoint, the PE's
    batches count from a point behind those of the instance it replaced, whose checkpoints
    would stay "newest" (restores would start from them, replicas be pushed of them, and
    the new ones be expired first) until the new history passed them. A manifest that
    cannot be read is as good as absent."""
    found = []
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            manifest = dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        found.append((path, manifest))
    found.sort(key=lambda m: (float(m[1].get("stored") or 0), str(m[1].get("id"))), reverse=True)
    return found


def _read_digest(path: Path) -> str:
    """The sha256 of a file's bytes (hex)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _unlink_if(path: Path, inode: int) -> None:
    """Remove ``path`` if it is still the file ``inode`` (a corrupt blob found by one
    reader, which another has meanwhile replaced by a good copy under the same name)."""
    try:
        if os.stat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
