"""The broker's configuration (it holds the password) is readable by its owner only."""

from __future__ import annotations

import stat

from fogshift.broker.server import BrokerProcess


def test_the_nats_config_is_0600(nats_server: BrokerProcess) -> None:
    text = nats_server.config_file.read_text()
    assert nats_server.address.password and nats_server.address.password in text
    assert stat.S_IMODE(nats_server.config_file.stat().st_mode) == 0o600
    leftovers = [p.name for p in nats_server.config_file.parent.glob(".*.tmp")]
    assert leftovers == []
