"""Gate files written while read: every gate a reader sees is one that was written whole."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fogshift.common.gate import read_gate, write_gate


def test_gates_written_at_once_are_each_whole_and_never_read_as_open(tmp_path: Path) -> None:
    # Two cap requests of a standby ran at once: they shared one temporary file, the
    # shorter text landed over the longer, and the reader took the torn gate for an open
    # one (the standby ran ahead of its primary).
    gate = tmp_path / "pe.gate"
    write_gate(gate, "hold")
    seen: list[object] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(limit: dict[str, int]) -> None:
        try:
            for _ in range(300):
                write_gate(gate, "cap", limit)
        except BaseException as exc:  # reported below
            errors.append(exc)

    def reader() -> None:
        while not done.is_set():
            seen.append(read_gate(str(gate)))

    limits = ({"positions": {"src": 7}}, {"positions": {"src": 123456789, "other": 1}})
    writers = [threading.Thread(target=writer, args=(limit,)) for limit in limits]
    watching = threading.Thread(target=reader)
    watching.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    done.set()
    watching.join()
    assert errors == []
    assert seen and all(g is not None for g in seen)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_gate_a_full_disk_refused_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A probe's full node left an empty `.pe.json.<nonce>.tmp` per refused pause.
    gate = tmp_path / "gates" / "pe.json"
    real = Path.write_text

    def full(self: Path, text: str, *args: object, **kwargs: object) -> int:
        real(self, "")
        raise OSError(28, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space left"):
        write_gate(gate, "hold")
    monkeypatch.undo()
    assert list(gate.parent.iterdir()) == []
    assert read_gate(str(gate)) is None  # (still open)
