"""The broker makes what it acknowledges durable: with ``sync_interval: always`` (fogshift's
default) nats-server fsyncs the stream's message block once per stored batch before its
acknowledgement; with an interval it does not. Watched with ``strace`` on a real nats-server,
since a power loss cannot be staged here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fogshift.broker.client import SyncJetStream, ensure_pe_stream
from fogshift.broker.permissions import Hosted, apply_permissions
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import DEFAULT_SYNC, BrokerProcess, check_sync, start_nats_server
from fogshift.common.waiting import wait_until
from fogshift.exceptions import InvalidInput

BATCHES = 6


@pytest.mark.parametrize("value", ["always", "2m", "500ms", "10s", "1h"])
def test_a_sync_nats_server_takes_is_kept(value: str) -> None:
    assert check_sync(value) == value


@pytest.mark.parametrize("value", ["", "never", "0s", "2", "2 m", "-1s", 'always" }\nfoo: 1'])
def test_a_sync_nats_server_would_not_take_is_refused_with_what_it_takes(value: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_sync(value)
    assert caught.value.expected and "always" in caught.value.expected
    assert caught.value.received == repr(value) and caught.value.hint


StartBroker = Callable[[str], BrokerProcess]


@pytest.fixture()
def broker_of(tmp_path: Path) -> Iterator[StartBroker]:
    """Starts a real nats-server with a given sync (each killed at the end)."""
    started: dict[str, BrokerProcess] = {}

    def start(sync: str) -> BrokerProcess:
        started[sync] = start_nats_server(tmp_path / sync, sync=sync, nodes=["n1"])
        return started[sync]

    yield start
    for broker in started.values():
        os.killpg(broker.pid, signal.SIGKILL)


def _fsyncs_of_message_blocks(broker: BrokerProcess, trace: Path) -> int:
    """Publish :data:`BATCHES` batches of 50 records into a new stream while ``strace``
    watches the broker; how many fsyncs were of the stream's message blocks."""
    tracer = subprocess.Popen(
        ["strace", "-f", "-y", "-e", "trace=fsync,fdatasync", "-p", str(broker.pid),
         "-o", str(trace)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert tracer.stderr is not None
    try:
        # strace says "attached" once it follows every thread of the server.
        wait_until(lambda: b"attached" in tracer.stderr.peek(4096), 10, describe="strace")
        with SyncJetStream(broker.address) as js:
            js.run(lambda j: ensure_pe_stream(j, "p", "a"))
            for n in range(BATCHES):
                records = [
                    Record(n * 50 + i, 0, n * 50 + i, time.time() * 1e3, "a", json.dumps({"i": i}))
                    for i in range(50)
                ]
                assert js.run(lambda j, r=records: publish_records(j, "p", "a", r)) == 50
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=10)
    lines = trace.read_text().splitlines()
    return sum(1 for line in lines if "sync(" in line and "/FS_p_a/msgs/" in line)


def test_by_default_each_stored_batch_is_fsynced_and_with_an_interval_none_is(
    broker_of: StartBroker, tmp_path: Path
) -> None:
    # (strace is installed by `make setup`: scripts/check-test-tools.sh)
    durable = broker_of(DEFAULT_SYNC)
    assert f'sync_interval: "{DEFAULT_SYNC}"' in durable.config_file.read_text()
    assert _fsyncs_of_message_blocks(durable, tmp_path / "always.trace") >= BATCHES
    lazy = broker_of("2m")
    assert _fsyncs_of_message_blocks(lazy, tmp_path / "2m.trace") == 0


def test_a_permissions_reload_keeps_the_sync(broker_of: StartBroker) -> None:
    broker = broker_of("10s")
    apply_permissions(broker.config_file, broker.pid, {"n1": [Hosted("p", "pe1", ("src",))]})
    text = broker.config_file.read_text()
    assert 'sync_interval: "10s"' in text and "fs.p.pe1" in text
    # and the server took the reloaded config (it still answers JetStream)
    with SyncJetStream(broker.address) as js:
        js.run(lambda j: ensure_pe_stream(j, "p", "b"))
