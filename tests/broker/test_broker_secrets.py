"""The broker's configuration holds no secret, and the files that do are their owner's only:
nats.conf names each user by its NKEY's public key; the seeds are in users.json (0600), and
each in the broker file of whom it is for."""

from __future__ import annotations

import asyncio
import json
import stat

import nats
import pytest
from nats.errors import NoServersError

from fogshift.broker.permissions import new_user_seed, user_public_key, users_file
from fogshift.broker.server import BrokerProcess


def test_the_nats_config_names_public_keys_and_holds_no_seed(nats_server: BrokerProcess) -> None:
    text = nats_server.config_file.read_text()
    seeds = json.loads(users_file(nats_server.config_file).read_text())
    admin = nats_server.address.seed
    assert admin is not None and admin == seeds["admin_seed"] and admin.startswith("SU")
    assert user_public_key(admin) in text and admin not in text
    assert nats_server.address.password is None and "password" not in text
    for path in (nats_server.config_file, users_file(nats_server.config_file)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    leftovers = [p.name for p in nats_server.config_file.parent.glob(".*.tmp")]
    assert leftovers == []


def test_a_key_the_config_does_not_name_is_refused(nats_server: BrokerProcess) -> None:
    async def connect(seed: str | None) -> None:
        nc = await nats.connect(nats_server.address.url, nkeys_seed_str=seed, connect_timeout=2,
                                allow_reconnect=False, max_reconnect_attempts=0)  # fmt: skip
        await nc.close()

    asyncio.run(connect(nats_server.address.seed))  # the admin's logs in
    for seed in (new_user_seed(), None):  # another NKEY, and no credentials at all
        with pytest.raises((NoServersError, nats.errors.Error)):
            asyncio.run(connect(seed))
