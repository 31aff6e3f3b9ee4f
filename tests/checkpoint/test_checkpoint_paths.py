"""Checkpoint stores refuse names and file paths that would leave their folders."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from fogshift.checkpoint.central import CentralStore, check_manifest
from fogshift.checkpoint.store import snapshot_file
from fogshift.common.exceptions import InvalidName, PathEscape
from fogshift.exceptions import InvalidInput

PAYLOAD = b"written-by-an-attacker"


def manifest(files: dict[str, bytes], **override: Any) -> dict[str, Any]:
    m = {
        "id": "b000000000001", "pipeline": "p", "element": "agg", "batch": 1,
        "created": time.time(), "bytes": sum(map(len, files.values())),
        "files": {rel: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                  for rel, d in files.items()},
    }  # fmt: skip
    m.update(override)
    return m


def planted(root: Path) -> list[Path]:
    """Files under ``root`` holding the attacker's bytes."""
    return [p for p in root.rglob("*") if p.is_file() and p.read_bytes() == PAYLOAD]


HOSTILE = [
    manifest({"../../../x": PAYLOAD}),
    manifest({"/tmp/fogshift-x": PAYLOAD}),
    manifest({"offsets/../../../../x": PAYLOAD}),
    manifest({"..\\..\\x": PAYLOAD}),
    manifest({"offsets/0": PAYLOAD}, id="../../../x"),
    manifest({"offsets/0": PAYLOAD}, pipeline=".."),
    manifest({"offsets/0": PAYLOAD}, element="../../x"),
    manifest({"offsets/0": PAYLOAD}, pipeline="/tmp"),
]


@pytest.mark.parametrize("bad", HOSTILE)
def test_put_refuses_before_fetching_or_writing(tmp_path: Path, bad: dict[str, Any]) -> None:
    store = CentralStore(tmp_path / "store")
    asked: list[str] = []

    def fetch(rel: str) -> bytes:
        asked.append(rel)
        return PAYLOAD

    with pytest.raises(InvalidName):
        store.put(bad, fetch)
    assert asked == []
    assert planted(tmp_path) == []
    assert sorted((tmp_path / "store").iterdir()) == sorted([store.blobs, store.chunk_lists])
    assert [*store.blobs.iterdir(), *store.chunk_lists.iterdir()] == []


def test_a_digest_that_is_a_path_is_refused(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "store")
    bad = manifest({"offsets/0": PAYLOAD})
    bad["files"]["offsets/0"]["sha256"] = "../../../x"
    with pytest.raises(InvalidName):
        store.put(bad, lambda rel: PAYLOAD)
    assert planted(tmp_path) == []


@pytest.mark.parametrize("rel", ["../x", "../../x", "/tmp/x", "a/../../x", "a\\..\\x"])
def test_materialize_writes_nothing_outside_its_target(tmp_path: Path, rel: str) -> None:
    store = CentralStore(tmp_path / "store")
    good = manifest({"offsets/0": PAYLOAD})
    store.put(good, lambda rel: PAYLOAD)  # the blob is there: only the path is wrong
    bad = {**good, "files": {rel: good["files"]["offsets/0"]}}
    target = tmp_path / "nodes" / "n" / "checkpoints" / "p" / "agg"
    with pytest.raises(InvalidName):
        store.materialize(bad, target)
    assert [p for p in planted(tmp_path) if store.blobs not in p.parents] == []
    # The control: the same blob, named well, is written where it belongs.
    store.materialize(good, target)
    assert (target / "offsets" / "0").read_bytes() == PAYLOAD


def test_a_manifest_must_belong_to_the_pe_it_is_installed_for() -> None:
    with pytest.raises(InvalidInput, match="belongs to another PE"):
        check_manifest(manifest({"offsets/0": b"x"}), "p", "other")
    bad: Any
    for bad in (None, [], {"files": []}, manifest({"a": b"x"}) | {"files": {"a": {"size": -1}}}):
        with pytest.raises(InvalidInput):
            check_manifest(bad)


def test_snapshot_file_stays_inside_the_snapshot(tmp_path: Path) -> None:
    store = tmp_path / "node-checkpoints" / "p" / "agg"
    (store / "b000000000001" / "offsets").mkdir(parents=True)
    (store / "b000000000001" / "offsets" / "0").write_text("ok")
    (tmp_path / "secret").write_text("s3cret")
    path = snapshot_file(store, "b000000000001", "offsets/0")
    assert path.read_text() == "ok"
    attempts = [
        ("..", "secret"),
        ("../..", "secret"),
        ("b000000000001", "../../../../secret"),
        ("b000000000001", str(tmp_path / "secret")),
    ]
    for snapshot, rel in attempts:
        with pytest.raises(InvalidName):
            snapshot_file(store, snapshot, rel)
    (store / "b000000000001" / "offsets" / "1").symlink_to(tmp_path / "secret")
    with pytest.raises(PathEscape):
        snapshot_file(store, "b000000000001", "offsets/1")
