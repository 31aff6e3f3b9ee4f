"""`fogshift demo` (what `make demo` runs), end to end on real processes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, fogshift

pytestmark = pytest.mark.integration


def test_demo_migrates_kills_restores_and_is_consistent(tmp_path: Path) -> None:
    # A copy of the example, so the run writes its output under tmp_path, not the checkout.
    shutil.copytree(ROOT / "examples" / "case1", tmp_path / "case1")
    home = tmp_path / "home"
    result = fogshift(
        "demo", "--home", str(home), "--spec", str(tmp_path / "case1" / "case1.yaml"),
        check=False, timeout=900,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "live-migrated aggregate fog-a -> fog-b" in out, out
    assert "killed node fog-b" in out, out
    assert "restored aggregate on " in out, out
    assert "CONSISTENT" in out and "INCONSISTENT" not in out, out
    assert not (home / "cluster.json").exists(), "the demo did not bring its cluster down"
