"""`fogshift demo` (what `make demo` runs), end to end on real processes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, Cluster, fogshift

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def test_demo_kills_restores_migrates_and_is_consistent(cluster: Cluster, tmp_path: Path) -> None:
    # A copy of the example, so the run writes its output under tmp_path, not the checkout.
    shutil.copytree(ROOT / "examples" / "case1", tmp_path / "case1")
    # Twice the example's rate: 25 s of input still outlasts the kill and the restore, and the
    # test waits half as long for the rest.
    spec = tmp_path / "case1" / "case1.yaml"
    spec.write_text(spec.read_text().replace("rate: 30}", "rate: 60}"))
    assert "rate: 60}" in spec.read_text()
    # On the session's running cluster (`make demo` starts one of its own: the same code
    # path but for `up` and `down`, which every cluster fixture runs through the CLI).
    home = cluster.home
    result = fogshift(
        "demo", "--home", str(home), "--spec", str(tmp_path / "case1" / "case1.yaml"),
        check=False, timeout=900,
    )  # fmt: skip
    out = result.stdout + result.stderr
    text = " ".join(out.split())  # the console wraps long lines
    assert result.returncode == 0, out
    assert "killed node fog-a" in text and "while the input still flows" in text, out
    # The restore had work to prove itself on: events the killed instance had emitted since
    # the checkpoint (reprocessed, not emitted again) and events that arrived meanwhile.
    restored = re.search(
        r"restored aggregate on (\S+) \(epoch (\d+)\): reprocessed (\d+) events without "
        r"emitting in \d+ ms, then (\d+) intermediate",
        text,
    )
    assert restored is not None, out
    node, epoch, reprocessed, intermediate = restored.group(1), *map(int, restored.groups()[1:])
    assert node != "fog-a" and epoch == 2, out
    assert reprocessed > 0 and intermediate > 0, out
    migrated = re.search(r"live-migrated aggregate (\S+) -> (\S+):", text)
    assert migrated is not None and migrated.group(1) == node != migrated.group(2), out
    assert migrated.group(2) != "fog-a", out
    assert "CONSISTENT" in text and "INCONSISTENT" not in text, out
    # A cluster the demo did not start, it leaves running.
    assert (home / "cluster.json").exists() and cluster.node("cloud")["healthy"], out
