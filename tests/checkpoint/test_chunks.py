"""Central pulls ship the changed chunks of a large file, not the file
(``fogshift.checkpoint.chunks`` and ``CentralStore.put``): a file RocksDB rewrote with the
same values crosses as the few chunks around what changed, a moved state's new file on its
target as the chunks its origin's files do not hold."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.chunks import CHUNKED_MIN_BYTES, Chunk, file_chunks
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.spark_dir import fill_omitted, pack, unpack
from tests.checkpoint.test_central import manifest


class Node:
    """A snapshot's files as a node agent serves them: whole, listed in chunks, by range;
    what it sent is counted."""

    def __init__(self, files: dict[str, bytes], lists: bool = True) -> None:
        self.files, self.lists, self.sent, self.ranges = files, lists, 0, 0

    def fetch(self, rel: str) -> bytes:
        self.sent += len(self.files[rel])
        return self.files[rel]

    def chunks(self, rel: str) -> list[Chunk] | None:
        return file_chunks(self.files[rel]) if self.lists else None

    def range(self, rel: str, offset: int, length: int) -> bytes:
        self.sent += length
        self.ranges += 1
        return self.files[rel][offset : offset + length]


def values(seed: int, count: int = 6, size: int = 512 * 1024) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def sst(vals: list[bytes], counts: list[int]) -> bytes:
    """A file holding ``vals`` with small records between them (a compaction's output:
    the same values, the counters beside them new)."""
    pairs = enumerate(zip(vals, counts, strict=True))
    return b"".join(b"key%d:count=%08d;" % (k, c) + v for k, (v, c) in pairs)


def test_chunks_cover_a_file_in_order_and_follow_its_content() -> None:
    data = os.urandom(3 * CHUNKED_MIN_BYTES)
    chunks = file_chunks(data)
    assert [c[0] for c in chunks] == [sum(c[1] for c in chunks[:k]) for k in range(len(chunks))]
    assert sum(c[1] for c in chunks) == len(data) and file_chunks(b"") == []
    assert all(hashlib.sha256(data[o : o + n]).hexdigest() == d for o, n, d in chunks)
    # The same bytes after an insertion make the same chunks, but for the one it hit.
    moved = file_chunks(data[:1000] + b"new" + data[1000:])
    assert len({c[2] for c in chunks} - {c[2] for c in moved}) <= 2


SST = "state/0/0/SSTs/000008.sst"
NEW_SST = "state/0/0/SSTs/000012.sst"


def pulled_once(tmp_path: Path, seed: int) -> tuple[CentralStore, list[bytes], Node]:
    """A store that pulled one snapshot: an SST of six values (and a small file)."""
    store = CentralStore(tmp_path / "store")
    vals = values(seed)
    first = Node({SST: sst(vals, [1] * 6), "offsets/0": b"o0"})
    store.put(manifest(0, first.files), first.fetch, first)
    return store, vals, first


def stored(store: CentralStore, tmp_path: Path, pe: str, rel: str) -> bytes:
    newest, _ = store.latest_whole("p", pe)
    store.materialize(newest, tmp_path / pe)
    return (tmp_path / pe / rel).read_bytes()


def test_a_rewritten_file_ships_only_the_chunks_around_what_changed(tmp_path: Path) -> None:
    store, vals, first = pulled_once(tmp_path, 1)
    whole = len(first.files[SST])
    assert first.sent == whole + 2  # nothing to share yet: as before
    # Compacted: a new file of the same values, each key's count changed.
    second = Node({NEW_SST: sst(vals, [2, 3, 4, 5, 6, 7]), "offsets/1": b"o1"})
    shipped = store.put(manifest(1, second.files), second.fetch, second)
    assert 0 < second.sent <= shipped < whole / 4, (second.sent, shipped, whole)
    assert stored(store, tmp_path, "agg", NEW_SST) == second.files[NEW_SST]


def test_a_moved_states_new_file_on_another_pe_ships_what_its_origins_files_lack(
    tmp_path: Path,
) -> None:
    store, vals, _ = pulled_once(tmp_path, 2)
    # The target partition took three of the keys, and has one of its own.
    target = Node({NEW_SST: sst([*vals[:3], *values(3, count=1)], [9, 9, 9, 1])})
    theirs = {**manifest(0, target.files), "element": "agg-p1"}
    store.put(theirs, target.fetch, target)
    assert target.sent < len(target.files[NEW_SST]) * 0.4  # the new key's value, and a bit
    assert stored(store, tmp_path, "agg-p1", NEW_SST) == target.files[NEW_SST]


def test_files_come_whole_from_a_node_that_lists_no_chunks_and_when_small(
    tmp_path: Path,
) -> None:
    store, vals, _ = pulled_once(tmp_path, 4)
    older = Node({NEW_SST: sst(vals, [2] * 6), "offsets/1": b"o" * 1000}, lists=False)
    store.put(manifest(1, older.files), older.fetch, older)
    assert older.sent == len(older.files[NEW_SST]) + 1000 and older.ranges == 0


def test_a_chunk_whose_file_is_gone_is_fetched_and_a_bad_listing_refused(
    tmp_path: Path,
) -> None:
    store, vals, first = pulled_once(tmp_path, 5)
    (store.blobs / hashlib.sha256(first.files[SST]).hexdigest()).unlink()  # a hand, a disk
    second = Node({NEW_SST: sst(vals, [2] * 6)})
    store.put(manifest(1, second.files), second.fetch, second)
    assert second.sent >= len(second.files[NEW_SST])  # all of it crossed again
    assert stored(store, tmp_path, "agg", NEW_SST) == second.files[NEW_SST]

    class Short(Node):
        def chunks(self, rel: str) -> list[Chunk] | None:
            return file_chunks(self.files[rel])[:-1]

    bad = Short({"state/0/0/SSTs/000020.sst": sst(vals, [3] * 6)})
    with pytest.raises(TornCheckpoint, match="cover"):
        store.put(manifest(2, bad.files), bad.fetch, bad)
    assert store.newest("p", "agg")["id"] == "b000000000001"  # nothing stored of it


def test_a_migrations_copy_ships_only_what_the_stores_chunks_lack(tmp_path: Path) -> None:
    # The store pulled the SST RocksDB wrote before a compaction; the migration's copy holds
    # the one after: the same values, the counters new.
    store, vals, first = pulled_once(tmp_path, 5)
    known = store.known_blobs("p", "agg")
    assert known is not None and known.chunk is not None
    assert known.chunks == {d for _, _, d in file_chunks(first.files[SST])}
    origin = tmp_path / "origin"
    (origin / NEW_SST).parent.mkdir(parents=True)
    compacted = sst(vals, [4] * 6)
    (origin / NEW_SST).write_bytes(compacted)
    (origin / "offsets").mkdir()
    (origin / "offsets" / "0").write_bytes(b"o0")
    delta, _ = pack(origin, known.digests, known_chunks=known.chunks)
    assert len(delta) < len(compacted) / 4, len(delta)
    filled = fill_omitted(delta, known.path, known.chunk)
    assert filled is not None
    unpack(*filled, tmp_path / "target")
    assert (tmp_path / "target" / NEW_SST).read_bytes() == compacted
