"""The name and path checks every name from a request or a manifest goes through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fogshift.common.exceptions import InvalidName, PathEscape
from fogshift.common.names import (
    MAX_REL_PATH,
    check_name,
    check_relative_path,
    check_sha256,
    check_snapshot_id,
    contained,
    pe_folder,
)

GOOD_NAMES = ["cloud", "fog-a", "case1", "A_b-9", "x" * 63]
BAD_NAMES = ["", "..", ".", "a/b", "a\\b", "-a", "_a", "a.b", "a\n", "a\x00", "x" * 64, "é", 3]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_pass(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_with_expected_received_hint(name: object) -> None:
    with pytest.raises(InvalidName) as caught:
        check_name(name, "pipeline name")
    assert "pipeline name" in caught.value.message
    assert caught.value.expected and caught.value.received == repr(name)[:120]
    assert caught.value.hint


GOOD_PATHS = [
    "offsets/0", "commits/.3.crc", "commits/..29.60313f6c-fc8c.tmp.crc", "metadata",
    "state/0/0/SSTs/000008-3d7e.sst", "a...b", "...", "fogshift-metrics.json",
]  # fmt: skip
BAD_PATHS = [
    "", ".", "..", "../x", "a/../b", "a/..", "./a", "a/./b", "/etc/passwd", "//x", "a//b",
    "a/", "a\\b", "..\\x", "a\x00b", "a\nb", "x?y", "x#y", "%2e%2e", "x" * (MAX_REL_PATH + 1),
    None, 7,
]  # fmt: skip


@pytest.mark.parametrize("rel", GOOD_PATHS)
def test_spark_checkpoint_file_paths_pass(rel: str) -> None:
    assert check_relative_path(rel) == rel


@pytest.mark.parametrize("rel", BAD_PATHS)
def test_paths_that_leave_or_are_not_normalised_are_refused(rel: object) -> None:
    with pytest.raises(InvalidName):
        check_relative_path(rel)


def test_snapshot_ids_and_digests() -> None:
    assert check_snapshot_id("b000000000042") == "b000000000042"
    assert check_sha256("a" * 64) == "a" * 64
    for bad in ("..", "b42", "b000000000042/..", "b000000000042\n", "B000000000042"):
        with pytest.raises(InvalidName):
            check_snapshot_id(bad)
    for bad in ("A" * 64, "a" * 63, "../" + "a" * 61):
        with pytest.raises(InvalidName):
            check_sha256(bad)


def test_contained_follows_symbolic_links_before_judging(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "inside").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)
    assert contained(root, "inside", "x") == root / "inside" / "x"
    with pytest.raises(PathEscape):
        contained(root, "out", "secret")
    with pytest.raises(PathEscape):
        contained(root, "..", "x")
    with pytest.raises(PathEscape):
        contained(root, "/etc/passwd")
    with pytest.raises(PathEscape):
        contained(root)  # the root itself is no PE's folder


def test_pe_folder_checks_names_and_place(tmp_path: Path) -> None:
    assert pe_folder(tmp_path, "p", "agg") == tmp_path / "p" / "agg"
    with pytest.raises(InvalidName):
        pe_folder(tmp_path, "..", "..")
    with pytest.raises(InvalidName):
        pe_folder(tmp_path, "p", "../../x")
    os.symlink(tmp_path.parent, tmp_path / "q")
    with pytest.raises(PathEscape):
        pe_folder(tmp_path, "q", "agg")
