"""The content-addressed checkpoint store (central store and node replicas)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.checkpoint.central import TMP_LEFT_S, CentralStore
from fogshift.checkpoint.exceptions import CheckpointError, TornCheckpoint
from fogshift.exceptions import InvalidInput, NotFound


def manifest(batch: int, files: dict[str, bytes]) -> dict:
    return {
        "id": f"b{batch:012d}", "pipeline": "p", "element": "agg", "batch": batch,
        "created": time.time(), "bytes": sum(map(len, files.values())), "offset": None,
        "files": {rel: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                  for rel, d in files.items()},
    }  # fmt: skip


def test_put_ships_only_new_files_and_materializes_whole(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store")
    first = {"offsets/0": b"o0", "state/0/1.changelog": b"x" * 1000}
    second = {**first, "offsets/1": b"o1"}
    asked: list[str] = []

    def fetch_from(files: dict[str, bytes]):  # type: ignore[no-untyped-def]
        return lambda rel: asked.append(rel) or files[rel]

    assert store.put(manifest(0, first), fetch_from(first)) == 1002
    assert store.put(manifest(1, second), fetch_from(second)) == 2
    assert asked == ["offsets/0", "state/0/1.changelog", "offsets/1"]
    newest, skipped = store.latest_whole("p", "agg")
    assert newest["id"] == "b000000000001" and skipped == []
    store.materialize(newest, tmp_path / "out")
    assert (tmp_path / "out" / "offsets" / "1").read_bytes() == b"o1"
    assert (tmp_path / "out" / "state" / "0" / "1.changelog").stat().st_size == 1000


def test_a_corrupt_shared_blob_is_shipped_again_by_the_next_checkpoint(tmp_path: Path) -> None:
    # Spark writes many identical small files: one blob serves every checkpoint holding that
    # content. A copy damaged on disk must not be trusted for its name by later checkpoints.
    store = CentralStore(tmp_path / "store")
    common = {"commits/0": b"v1\n{}"}
    store.put(manifest(0, {**common, "offsets/0": b"o0"}), lambda rel: {**common,
              "offsets/0": b"o0"}[rel])  # fmt: skip
    blob = store.blobs / hashlib.sha256(b"v1\n{}").hexdigest()
    blob.write_bytes(b"v2\n{}")  # same size, other bytes
    asked: list[str] = []
    files = {**common, "offsets/1": b"o1"}
    shipped = store.put(manifest(1, files), lambda rel: asked.append(rel) or files[rel])
    assert sorted(asked) == ["commits/0", "offsets/1"] and shipped == len(b"v1\n{}o1")
    newest, skipped = store.latest_whole("p", "agg")
    assert newest["id"] == "b000000000001" and skipped == []
    # Damaged after the last put: the restore skips it, and the blob goes, so the next
    # checkpoint ships it again instead of counting on it.
    blob.write_bytes(b"v3\n{}")
    with pytest.raises(CheckpointError, match="commits/0 is corrupt"):
        store.latest_whole("p", "agg")
    assert not blob.exists()
    files = {**common, "offsets/2": b"o2"}
    store.put(manifest(2, files), files.__getitem__)
    assert store.latest_whole("p", "agg")[0]["id"] == "b000000000002"


def test_a_blob_rotten_in_place_is_found_by_a_later_check_not_trusted_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bytes a bad disk changed keep the file's size and times: the check of its digest,
    # remembered by (size, mtime), was trusted for the process's life, each new checkpoint
    # naming the blob was stored torn, and the count-based expiry removed the whole ones.
    import fogshift.checkpoint.central as central

    store = CentralStore(tmp_path / "store", keep=2)
    common = {"commits/0": b"v1\n{}"}
    files = {**common, "offsets/0": b"o0"}
    store.put(manifest(0, files), files.__getitem__)
    blob = store.blobs / hashlib.sha256(b"v1\n{}").hexdigest()
    times = blob.stat()
    blob.write_bytes(b"v2\n{}")  # same size, other bytes, the times set back
    os.utime(blob, ns=(times.st_atime_ns, times.st_mtime_ns))
    monkeypatch.setattr(central, "RECHECK_S", 0.0, raising=False)  # (its interval passed)
    asked: list[str] = []
    for batch in (1, 2, 3):
        files = {**common, f"offsets/{batch}": f"o{batch}".encode()}
        store.put(manifest(batch, files), lambda rel, f=files: asked.append(rel) or f[rel])
    assert "commits/0" in asked  # found and shipped again
    newest, skipped = store.latest_whole("p", "agg")
    assert newest["id"] == "b000000000003" and skipped == []


def test_a_checkpoint_no_longer_wanted_is_not_stored_nor_said_shipped(tmp_path: Path) -> None:
    # A pull whose pipeline was deployed afresh meanwhile: its bytes were returned, and the
    # orchestrator showed it as the PE's last pull (its pull error cleared).
    store = CentralStore(tmp_path / "store")
    files = {"offsets/0": b"o0"}
    assert store.put(manifest(0, files), files.__getitem__, wanted=lambda: False) is None
    assert store.newest("p", "agg") is None
    assert store.put(manifest(0, files), files.__getitem__, wanted=lambda: True) == 0


def test_newest_is_the_first_readable_manifest_newest_first(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store")
    assert store.newest("p", "agg") is None
    for batch in (0, 1, 2):
        files = {f"offsets/{batch}": f"o{batch}".encode()}
        store.put(manifest(batch, files), files.__getitem__)
    assert store.newest("p", "agg") == store.manifests("p", "agg")[0]
    assert store.newest("p", "agg")["batch"] == 2  # type: ignore[index]
    # A manifest that cannot be read is as good as absent: the next older one is the newest.
    folder = tmp_path / "store" / "checkpoints" / "p" / "agg"
    sorted(folder.glob("*.json"))[-1].write_text("{torn")
    assert store.newest("p", "agg")["batch"] == 1  # type: ignore[index]
    assert [m["batch"] for m in store.manifests("p", "agg")] == [1, 0]


def test_a_promoted_standbys_checkpoints_are_newer_than_the_primarys_higher_batches(
    tmp_path: Path,
) -> None:
    """A standby trails its primary: once promoted, its batches count from behind the
    primary's last. Its checkpoints are the PE's newest, and the primary's go first."""
    store = CentralStore(tmp_path / "store", keep=3)
    primary = {"offsets/18000": b"a"}
    store.put({**manifest(18000, primary), "node": "fog-a"}, primary.__getitem__)
    for batch in range(7200, 7206):
        files = {f"offsets/{batch}": f"s{batch}".encode()}
        store.put({**manifest(batch, files), "node": "fog-b"}, files.__getitem__)
        newest = store.newest("p", "agg")
        assert newest is not None and (newest["batch"], newest["node"]) == (batch, "fog-b")
        whole, _ = store.latest_whole("p", "agg")
        assert whole is not None and whole["batch"] == batch  # what a restore starts from
    assert [m["batch"] for m in store.manifests("p", "agg")] == [7205, 7204, 7203]


def test_a_clock_set_back_does_not_expire_each_new_checkpoint_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stored at 2000, 2015, 2030 by the host's clock, which NTP then set back to 1900: each
    # new checkpoint sorted oldest and was unlinked as it was stored.
    from fogshift.checkpoint import central

    store = CentralStore(tmp_path / "store", keep=3)
    now = [0.0]
    monkeypatch.setattr(central.time, "time", lambda: now[0])
    for batch, at in enumerate([2000.0, 2015.0, 2030.0, 1900.0, 1905.0], start=1):
        now[0] = at
        files = {f"offsets/{batch}": str(batch).encode()}
        store.put(manifest(batch, files), files.__getitem__)
        newest = store.newest("p", "agg")
        assert newest is not None and newest["batch"] == batch
    assert [m["batch"] for m in store.manifests("p", "agg")] == [5, 4, 3]


def test_a_file_changed_in_transit_is_refused(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store")
    with pytest.raises(TornCheckpoint, match="offsets/0"):
        store.put(manifest(0, {"offsets/0": b"o0"}), lambda rel: b"??")
    assert store.manifests("p", "agg") == []


def test_old_blobs_are_collected_once_no_kept_checkpoint_names_them(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store", keep=1)
    old = {"offsets/0": b"gone"}
    store.put(manifest(0, old), old.__getitem__)
    stale = store.blobs / hashlib.sha256(b"gone").hexdigest()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    new = {"offsets/1": b"kept"}
    store.put(manifest(1, new), new.__getitem__)
    assert not stale.exists()
    assert store.verify(store.manifests("p", "agg")[0]) is None


def test_blob_path_checks_its_argument(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store")
    with pytest.raises(InvalidInput):
        store.blob_path("../../etc/passwd")
    with pytest.raises(NotFound) as missing:
        store.blob_path("0" * 64)
    # Said to the nodes that copy from the store: not its path on the orchestrator's host.
    assert str(tmp_path) not in missing.value.render()
    assert (missing.value.received, missing.value.expected) == (
        "0" * 64,
        "a blob a kept checkpoint names",
    )
    with pytest.raises(NotFound) as missing:
        store.blob_chunks("0" * 64)
    assert str(tmp_path) not in missing.value.render()


def test_known_blobs_are_the_newest_checkpoints_files(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store")
    assert store.known_blobs("p", "agg") is None
    files = {"offsets/0": b"o0", "state/0/1.changelog": b"x" * 1000}
    store.put(manifest(0, files), files.__getitem__)
    known = store.known_blobs("p", "agg")
    assert known is not None
    assert known.digests == {hashlib.sha256(d).hexdigest() for d in files.values()}
    sha = hashlib.sha256(b"x" * 1000).hexdigest()
    assert known.path(sha).read_bytes() == b"x" * 1000
    with pytest.raises(NotFound):
        known.path(hashlib.sha256(b"never stored").hexdigest())


def test_put_fetches_the_missing_files_several_at_a_time(tmp_path: Path) -> None:
    # Over a slow link one file at a time costs a round trip each: the fetches overlap.
    store = CentralStore(tmp_path / "store")
    files = {f"state/0/{v}.changelog": bytes([v]) * 100 for v in range(1, 5)}
    together = threading.Barrier(2, timeout=10)

    def fetch(rel: str) -> bytes:
        together.wait()  # breaks (and the put fails) unless two fetches run at once
        return files[rel]

    assert store.put(manifest(0, files), fetch) == 400
    assert store.verify(store.newest("p", "agg")) is None  # type: ignore[arg-type]


def test_forgetting_a_pe_or_a_whole_pipeline(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store")
    for pipeline, pe in (("p", "agg"), ("p", "agg-p2"), ("q", "agg")):
        files = {"offsets/0": f"{pipeline}{pe}".encode()}
        store.put({**manifest(0, files), "pipeline": pipeline, "element": pe}, files.__getitem__)
    store.forget("p", "agg-p2")
    assert store.newest("p", "agg-p2") is None and store.newest("p", "agg") is not None
    store.forget("p")
    assert store.newest("p", "agg") is None and store.newest("q", "agg") is not None


def test_chunks_stay_served_by_kept_blobs_when_the_first_holder_is_collected(
    tmp_path: Path,
) -> None:
    # RocksDB rewrites a large file with a few bytes changed; each pull ships the chunks the
    # store lacks. The index kept each chunk at the first blob that held it: once that blob
    # was collected the kept ones were not asked, the whole file crossed again (every ~10
    # minutes), and the index grew with every pull for as long as the process ran.
    import random

    from fogshift.checkpoint.chunks import CHUNKED_MIN_BYTES, file_chunks

    store = CentralStore(tmp_path / "store", keep=2)
    rng = random.Random(1)
    base = bytearray(rng.randbytes(2 * max(CHUNKED_MIN_BYTES, 1 << 20)))

    class Source:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def chunks(self, rel: str) -> list[tuple[int, int, str]]:
            return [(o, n, d) for o, n, d in file_chunks(self.data)]

        def range(self, rel: str, offset: int, length: int) -> bytes:
            return self.data[offset : offset + length]

    shipped = []
    for batch in range(8):
        base[batch * 16 : batch * 16 + 4] = rng.randbytes(4)  # a few bytes: one chunk changes
        data = bytes(base)
        files = {"state/0/big.sst": data}
        shipped.append(store.put(manifest(batch, files), files.__getitem__, Source(data)))
        for blob in store.blobs.iterdir():  # old enough to collect once unreferenced
            os.utime(blob, (1, 1))
    assert shipped[0] >= len(base)  # the first: all of it
    assert max(shipped[1:]) < len(base) // 4, shipped
    kept = {e["sha256"] for m in store.manifests("p", "agg") for e in m["files"].values()}
    with store._chunk_lock:
        holders = {sha for sha, _, _ in store._chunks_loaded().values()}
    assert holders <= kept, (holders, kept)


def test_a_collection_at_once_spares_the_files_of_a_put_under_way(tmp_path: Path) -> None:
    # A replica dropped collects at once (every push touched its files: the ten-minute
    # horizon kept them all, for good on a node backing up nothing else); a copy under way
    # meanwhile keeps the files it reuses and fetches.
    store = CentralStore(tmp_path / "store")
    shared, other = b"shared" * 10, b"other" * 10
    first = {"offsets/1": shared, "commits/1": other}
    store.put(manifest(1, first), first.__getitem__)
    store.forget("p", "agg")
    assert store.collect_garbage(horizon_s=0) == 2  # nothing names them: gone at once
    store.put(manifest(1, first), first.__getitem__)
    second = {"offsets/1": shared, "commits/2": b"new"}
    collected: list[int] = []

    def fetch(rel: str) -> bytes:
        store.forget("p", "agg")  # (what a drop of the PE's copies does meanwhile)
        collected.append(store.collect_garbage(horizon_s=0))
        return second[rel]

    store.put({**manifest(2, second), "element": "agg"}, fetch)
    assert collected == [1]  # "other" only: "shared" is the put's, under way
    whole, _ = store.latest_whole("p", "agg")
    assert whole is not None and whole["batch"] == 2


def test_temporary_files_a_crash_left_go_once_old(tmp_path: Path) -> None:
    # A chunk list's or a manifest's write cut short (the orchestrator killed between the
    # write and the rename) left its temporary file for good; a collection at once (a
    # dropped replica's) took a blob's being written by a put beside it.
    store = CentralStore(tmp_path / "store")
    files = {"offsets/1": b"x" * 100}
    store.put(manifest(1, files), files.__getitem__)
    folder = next((store.root / "checkpoints").glob("*/*"))
    left = [store.chunk_lists / ".abc.123.tmp", folder / ".m2.tmp", store.blobs / "ab.12.tmp"]
    for path in left:
        path.write_text("{")
    kept = {p.name for p in folder.iterdir()}
    assert store.collect_garbage(horizon_s=0) == 0
    assert all(p.exists() for p in left)  # young: a write may be under way (a put's)
    for path in left:
        os.utime(path, (time.time() - TMP_LEFT_S - 1,) * 2)
    assert store.collect_garbage(horizon_s=600) == 1  # (the blob's: counted as one)
    assert not any(p.exists() for p in left)
    assert {p.name for p in folder.iterdir()} == kept - {".m2.tmp"}
    whole, _ = store.latest_whole("p", "agg")
    assert whole is not None and whole["batch"] == 1


def _forgotten(tmp_path: Path, files: dict[str, bytes]) -> tuple[CentralStore, Path]:
    """A store that held a checkpoint of ``files`` and forgot it (its blobs, unreferenced,
    left to a collection); the store and its blobs folder."""
    store = CentralStore(tmp_path / "store")
    store.put(manifest(1, files), files.__getitem__)
    store.forget("p", "agg")
    return store, store.blobs


def _listed_after(blobs: Path, before: Callable[[], None]) -> Any:
    """A stand-in for a store's blobs folder that runs ``before`` when a collection lists
    it (after the collection looked at what was in flight and at the manifests)."""

    class Listed:
        def __truediv__(self, name: str) -> Path:
            return blobs / name

        def iterdir(self) -> Iterator[Path]:
            before()
            yield from blobs.iterdir()

    return Listed()


def test_a_collection_spares_a_file_a_put_begun_during_its_scan_reuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A put that begins while a collection at once scans the blobs (after the collection
    # looked at what was in flight) finds a blob it shares there and reuses it: removed
    # anyway, its manifest named a file the store no longer had (a torn replica).
    store, blobs = _forgotten(tmp_path, {"offsets/1": b"shared" * 10})
    (sha,) = [b.name for b in blobs.iterdir()]

    def put_begins() -> None:  # (a put registers its files first)
        with store._flight_lock:
            store._in_flight.update([sha])

    monkeypatch.setattr(store, "blobs", _listed_after(blobs, put_begins))
    assert store.collect_garbage(horizon_s=0) == 0
    assert (blobs / sha).exists()


def test_a_collection_spares_the_files_of_a_put_that_ended_during_its_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole put (a replica's copy, on a node dropping another PE's with a collection at
    # once) ran while the collection read the manifests, its own written where the scan had
    # looked already: its files, no longer in flight at the unlink, were removed.
    store, blobs = _forgotten(tmp_path, {"offsets/1": b"one" * 10})
    other = {"offsets/1": b"one" * 10, "commits/1": b"c1"}

    def whole_put() -> None:
        monkeypatch.setattr(store, "blobs", blobs)
        store.put({**manifest(1, other), "element": "b"}, other.__getitem__)

    monkeypatch.setattr(store, "blobs", _listed_after(blobs, whole_put))
    store.collect_garbage(horizon_s=0)
    newest = store.newest("p", "b")
    assert newest is not None and store.verify(newest) is None
    # The next collection, with nothing ended during it, takes what no manifest names.
    store.forget("p", "b")
    assert store.collect_garbage(horizon_s=0) == 2
    assert list(blobs.iterdir()) == [] and store._checked == {}


def test_a_manifest_giving_a_shared_file_another_size_is_refused_and_the_file_kept(
    tmp_path: Path,
) -> None:
    # A node's manifest gave a commit file every PE's checkpoints share the wrong size: the
    # file was removed, then could not be fetched whole again, and every checkpoint naming it
    # failed its restore.
    store = CentralStore(tmp_path / "store")
    shared = {"commits/0": b"v1\n{}"}
    store.put(manifest(0, shared), shared.__getitem__)
    lying = {**manifest(1, shared), "element": "other"}
    lying["files"]["commits/0"]["size"] = 99
    with pytest.raises(TornCheckpoint, match="that content has 5"):
        store.put(lying, lambda rel: b"junk")
    whole, _ = store.latest_whole("p", "agg")
    assert whole is not None and whole["batch"] == 0
    assert store.verify(lying) == "file commits/0 has 5 bytes, not 99"
    assert store.verify(manifest(0, shared)) is None  # (verify kept it too)


def test_a_manifest_giving_a_new_file_another_size_is_refused(tmp_path: Path) -> None:
    # Its file new to the store: only its digest was checked, and the manifest was stored
    # among the kept ones, which restores refuse (three such expired the last usable one).
    store = CentralStore(tmp_path / "store", keep=1)
    good = {"offsets/0": b"o0"}
    store.put(manifest(0, good), good.__getitem__)
    files = {"offsets/1": b"o1"}
    lying = manifest(1, files)
    lying["files"]["offsets/1"]["size"] = 7
    with pytest.raises(TornCheckpoint, match="has 2 bytes, not the 7"):
        store.put(lying, files.__getitem__)
    assert [m["batch"] for m in store.manifests("p", "agg")] == [0]
    assert store.latest_whole("p", "agg")[0]["batch"] == 0


def one_file_stored(tmp_path: Path) -> tuple[CentralStore, dict[str, bytes], Path]:
    """A store holding one checkpoint of one file: the store, its files and the file's blob."""
    store = CentralStore(tmp_path / "store")
    files = {"offsets/0": b"o0"}
    store.put(manifest(0, files), files.__getitem__)
    return store, files, store.blobs / hashlib.sha256(b"o0").hexdigest()


def test_a_corrupt_blob_replaced_by_a_good_copy_meanwhile_is_not_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restore's check read a corrupt blob; a pull then stored a good copy under its name
    # before the check removed "it": the good copy went, and the newest checkpoint was torn.
    import fogshift.checkpoint.central as central

    store, files, blob = one_file_stored(tmp_path)
    blob.write_bytes(b"xx")
    real = central._read_digest

    def read_then_replaced(path: Path) -> str:
        digest = real(path)
        good = path.with_name("good.tmp")
        good.write_bytes(b"o0")
        good.replace(path)  # (as a pull's ship() stores it)
        return digest

    monkeypatch.setattr(central, "_read_digest", read_then_replaced)
    assert store.verify(manifest(0, files)) == "file offsets/0 is corrupt (sha256 " + (
        hashlib.sha256(b"xx").hexdigest()[:12] + "…)"
    )
    assert blob.read_bytes() == b"o0"
    monkeypatch.setattr(central, "_read_digest", real)
    assert store.verify(manifest(0, files)) is None


def test_a_manifest_that_cannot_be_read_stops_the_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Taken as absent, its blobs looked unused and were deleted (a manifest unread for too
    # many open files, an I/O error).
    store, files, blob = one_file_stored(tmp_path)
    os.utime(blob, (time.time() - 3600, time.time() - 3600))
    real = Path.read_text

    def unreadable(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.suffix == ".json":
            raise OSError(24, "Too many open files")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", unreadable)
    assert store.collect_garbage() == 0
    monkeypatch.setattr(Path, "read_text", real)
    assert blob.exists() and store.verify(manifest(0, files)) is None


def test_a_checkpoint_s_files_are_on_disk_before_its_manifest_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written to the page cache only, a power loss of the orchestrator's host left blobs
    # empty under a manifest that named them, the checkpoints before it expired.
    from fogshift.checkpoint import central

    store = CentralStore(tmp_path / "store")
    files = {"offsets/0": b"o0", "state/0/1.changelog": b"x" * 1000}
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(central.os, "fsync", fsync)
    store.put(manifest(0, files), files.__getitem__)
    blobs = {hashlib.sha256(d).hexdigest() for d in files.values()}
    names = [Path(p).name for p in synced]
    written = [n.split(".")[0] for n in names if n.endswith(".tmp") and not n.startswith(".")]
    assert sorted(written) == sorted(blobs)  # each blob's data, before its rename
    # Then the blobs' folder (the renames), then the manifest and its folder, in that order.
    assert names[len(written) :] == ["blobs", f".{manifest(0, files)['id']}.tmp", "agg"], synced
