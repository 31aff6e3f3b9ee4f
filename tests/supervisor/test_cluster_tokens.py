"""The tokens `fogshift up` writes: 0600 from the start, one per node, derived."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fogshift.common.http import node_token, token_node
from fogshift.supervisor.cluster import _agent_args, node_token_file, token_file, write_tokens


def test_up_writes_the_operator_token_and_one_token_per_node_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[int] = []
    real_open = os.open

    def spy(path: str, flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        created.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", spy)
    old = os.umask(0)
    try:
        operator = write_tokens(tmp_path, ["cloud", "fog-a"])
    finally:
        os.umask(old)
    assert created == [0o600, 0o600, 0o600]
    assert token_file(tmp_path).read_text() == operator
    for name in ("cloud", "fog-a"):
        path = node_token_file(tmp_path, name)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = path.read_text()
        assert token == node_token(operator, name) and token_node(token) == name
        assert operator not in token
    # A new `up` makes new tokens: the old node tokens stop working.
    assert write_tokens(tmp_path, ["cloud"]) != operator


def test_an_agent_is_started_with_its_own_token_not_the_operators(tmp_path: Path) -> None:
    args = _agent_args(tmp_path, "fog-a", "127.0.0.1", 1, "http://o", tmp_path / "b", "local", 5)
    assert args[args.index("--token-file") + 1] == str(node_token_file(tmp_path, "fog-a"))
    assert str(token_file(tmp_path)) not in args
