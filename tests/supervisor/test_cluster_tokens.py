"""The tokens `fogshift up` writes: 0600 from the start, one per node, derived."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fogshift.common.http import node_token, token_node
from fogshift.exceptions import InvalidInput
from fogshift.network.links import LinkProfile
from fogshift.supervisor.cluster import (
    _agent_args,
    node_token_file,
    token_file,
    up,
    write_tokens,
)


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
        # fog-a was removed and added again twice (the registry's generations).
        operator = write_tokens(tmp_path, ["cloud", "fog-a"], {"fog-a": 2})
    finally:
        os.umask(old)
    assert created == [0o600, 0o600, 0o600]
    assert token_file(tmp_path).read_text() == operator
    for name, generation in (("cloud", 0), ("fog-a", 2)):
        path = node_token_file(tmp_path, name)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = path.read_text()
        assert token == node_token(operator, name, generation)
        assert token_node(token) == (name, generation)
        assert operator not in token
    assert node_token_file(tmp_path, "fog-a").read_text().startswith("fsnode.fog-a.2.")
    # A new `up` makes new tokens: the old node tokens stop working.
    assert write_tokens(tmp_path, ["cloud"], {}) != operator


def test_an_agent_is_started_with_its_own_token_not_the_operators(tmp_path: Path) -> None:
    args = _agent_args(tmp_path, "fog-a", "127.0.0.1", 1, "http://o", tmp_path / "b", "local", 5)
    assert args[args.index("--token-file") + 1] == str(node_token_file(tmp_path, "fog-a"))
    assert str(token_file(tmp_path)) not in args


def test_an_external_broker_is_said_to_give_every_node_the_same_rights(tmp_path: Path) -> None:
    # Its credentials go to every node's broker file: no permissions per node. `up` said
    # nothing of it (only the README did).
    said: list[str] = []
    with pytest.raises(InvalidInput, match="link profiles need isolated nodes"):
        # (Refused right after the warning: nothing starts.)
        up(tmp_path / "home", ["a"], nats_url="nats://127.0.0.1:4222", nats_user="u",
           nats_password="s3cret-pw", on_progress=said.append,
           links={"a": LinkProfile(bandwidth="10mbit")})  # fmt: skip
    assert len(said) == 1 and said[0].startswith("warning: every node connects")
    assert "no broker permissions per node" in said[0] and "leave out --nats-url" in said[0]
    assert "nats://127.0.0.1:4222" in said[0] and "s3cret-pw" not in said[0]
    said.clear()
    with pytest.raises(InvalidInput, match="link profiles need isolated nodes"):
        up(tmp_path / "home", ["a"], on_progress=said.append,
           links={"a": LinkProfile(bandwidth="10mbit")})  # fmt: skip
    assert said == []  # its own broker: a user per node


@pytest.mark.parametrize("max_payload", [64 * 1024, None])
def test_an_external_broker_whose_messages_are_smaller_than_records_is_refused(
    tmp_path: Path, max_payload: int | None
) -> None:
    # A record of 600 KB passed the PE's check (1 MiB less room for headers); the broker,
    # at max_payload 512 KB, refused it, and the agent retried its batch for good.
    import json
    import subprocess

    from fogshift.broker.client import BrokerAddress
    from fogshift.broker.exceptions import BrokerUnavailable
    from fogshift.broker.server import _jetstream_ready, check_external, nats_server_binary
    from fogshift.common.waiting import wait_until

    config = tmp_path / "nats.conf"
    config.write_text(
        f'listen: 127.0.0.1:-1\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        + ("" if max_payload is None else f"max_payload: {max_payload}\n")
    )
    proc = subprocess.Popen([nats_server_binary(), "-c", str(config), "--ports_file_dir",
                             str(tmp_path)], stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        ports = wait_until(lambda: next(tmp_path.glob("*.ports"), None), 10,
                           describe="nats-server's ports file")  # fmt: skip
        url = json.loads(ports.read_text())["nats"][0]
        wait_until(lambda: _jetstream_ready(BrokerAddress(url)) or None, 10,
                   describe="the broker's JetStream")  # fmt: skip
        if max_payload is None:
            check_external(BrokerAddress(url))  # (nats-server's default, 1 MiB: taken)
        else:
            with pytest.raises(InvalidInput) as refused:
                up(tmp_path / "home", ["a"], nats_url=url, on_progress=lambda _: None)
            assert refused.value.received == "max_payload 65,536"
            assert "max_payload: 1MB" in (refused.value.hint or "")
            assert not (tmp_path / "home").exists()  # refused before anything was made
    finally:
        proc.terminate()
        proc.wait()
    # Nothing listens there now: said so (it said "did not answer within 6 s", the
    # client's error again in its own words, and asked whether `fogshift up` ran).
    with pytest.raises(BrokerUnavailable) as away:
        check_external(BrokerAddress(url), timeout_s=0.5)
    assert f"no broker answers at {url}: Connection refused" in away.value.message
    assert "BrokerUnavailable" not in away.value.message
    assert "is `fogshift up` running" not in (away.value.hint or "")


@pytest.mark.parametrize(
    ("url", "where"),
    [
        # Read as nats-py reads it: `broker.lan:4222` was probed at 127.0.0.1 ("broker.lan"
        # taken for a scheme), and refused.
        ("broker.lan:4222", ("broker.lan", 4222)),
        ("nats://10.0.0.5", ("10.0.0.5", 4222)),
        ("tls://broker.lan:7422", ("broker.lan", 7422)),
        ("ws://broker.lan", None),  # (a websocket: the client's own connect tells)
        ("nats://broker.lan:99999", None),  # (no port: the client's error, not a traceback)
    ],
)
def test_an_external_broker_is_probed_where_the_client_connects(
    url: str, where: tuple[str, int] | None
) -> None:
    from fogshift.broker.server import _host_port

    assert _host_port(url) == where
