"""The link lock: re-entrant in one process, exclusive between processes (no root needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import filelock
import pytest

from fogshift.network import namespaces

HOLDER = """
import sys
from pathlib import Path
from fogshift.network import namespaces
namespaces.RECORD_DIR = Path(sys.argv[1])
with namespaces._lock():
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "netns"
    monkeypatch.setattr(namespaces, "RECORD_DIR", folder)
    return folder


def test_nested_use_in_one_process_does_not_wait_for_itself(record_dir: Path) -> None:
    with namespaces._lock(), namespaces._lock():
        assert record_dir.is_dir()
    # Released entirely: another holder gets it at once.
    with filelock.FileLock(record_dir.parent / "lock", timeout=0):
        pass


def test_another_process_holding_it_keeps_this_one_out_until_it_lets_go(
    record_dir: Path,
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(record_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = filelock.FileLock(record_dir.parent / "lock", timeout=0.2)
        with pytest.raises(filelock.Timeout):
            other.acquire()
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
        with other:  # free now
            assert other.is_locked
    finally:
        holder.kill()
        holder.wait()
