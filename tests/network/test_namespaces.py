"""Namespaces, veth pairs and tbf for real: traffic through the relay, partition, heal, clean-up.

Needs root and ``ip``/``tc``; skipped (saying why) otherwise. Every test works under a home of
its own, so its names and addresses cannot clash with a cluster running on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fogshift.network.exceptions import LinkDown, NotIsolated
from fogshift.network.links import LinkProfile, parse_link_profile
from fogshift.network.namespaces import (
    MAX_INTERFACE_NAME,
    RECORD_DIR,
    NodeLink,
    cleanup_stale,
    create_link,
    create_links,
    destroy_link,
    link_state,
    namespace_pids,
    plan_links,
    set_link,
)
from fogshift.network.relay import EchoSpec, RelayConfig, RelayReady, Route, spawn_relay
from fogshift.network.rtt import measure_rtt
from fogshift.supervisor.cluster import cluster_running

ROOT = Path(__file__).resolve().parents[2]
ECHO_PORT = 7801

_without_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="network namespaces need root and the `ip` and `tc` commands",
)


def needs_root(test: Callable[..., None]) -> Callable[..., None]:
    """Marked ``root``, and skipped with the reason where root (or iproute2) is missing."""
    return pytest.mark.root(_without_root(test))  # type: ignore[no-any-return]


def run(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def namespaces() -> set[str]:
    return {n["name"] for n in json.loads(run("ip", "-j", "netns", "list") or "[]")}


def interface_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def routes_of(subnet: str) -> list[str]:
    return [line for line in run("ip", "-4", "route").splitlines() if subnet in line]


def pid_gone(pid: int, timeout_s: float = 15) -> bool:
    """Whether ``pid`` exits (or is a zombie) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split(")")[-1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def assert_all_gone(link: NodeLink, relay_pid: int | None = None) -> None:
    assert link.namespace not in namespaces()
    assert not interface_exists(link.host_if)
    assert routes_of(link.subnet) == []
    assert not (RECORD_DIR / f"{link.namespace}.json").exists()
    if relay_pid is not None:
        assert pid_gone(relay_pid), "the relay outlived its link"


class LoopbackEcho:
    """An echo server on the host's loopback: what the broker is to a real node."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)


@pytest.fixture()
def loopback_echo() -> Iterator[LoopbackEcho]:
    echo = LoopbackEcho()
    yield echo
    echo.sock.close()


def start_relay(link: NodeLink, folder: Path, host_echo_port: int) -> RelayReady:
    """A relay like a node's: into the namespace (echo) and out of it (to a loopback echo)."""
    config = RelayConfig(
        profile=link.profile,
        routes=[
            Route(name="echo", listen_host="127.0.0.1", target_host=link.ns_ip,
                  target_port=ECHO_PORT),
            Route(name="out", listen_host=link.host_ip, target_host="127.0.0.1",
                  target_port=host_echo_port),
        ],
        echo=EchoSpec(namespace=link.namespace, host=link.ns_ip, port=ECHO_PORT),
        watch_interface=link.host_if,
    )  # fmt: skip
    return spawn_relay(config, folder, folder / "relay.log")


def rtt_from_inside(link: NodeLink, address: tuple[str, int], timeout_s: float) -> float | None:
    """A round trip measured by a process inside the namespace; ``None`` if it failed."""
    code = (
        "import sys\n"
        "from fogshift.network.rtt import measure_rtt\n"
        "from fogshift.network.exceptions import LinkDown\n"
        "try:\n"
        f"    print(measure_rtt({address[0]!r}, {address[1]}, 3, {timeout_s}).median_ms)\n"
        "except LinkDown:\n"
        "    print('down')\n"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", link.namespace, sys.executable, "-c", code],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    ).stdout.strip()  # fmt: skip
    return None if out == "down" else float(out)


def test_link_names_are_short_unique_per_home_and_use_free_subnets(tmp_path: Path) -> None:
    profiles = {f"node-{i}": LinkProfile() for i in range(5)}
    a = plan_links(tmp_path / "a", profiles)
    b = plan_links(tmp_path / "b", profiles)
    names = [n for links in (a, b) for link in links.values()
             for n in (link.host_if, link.ns_if)]  # fmt: skip
    assert all(len(n) <= MAX_INTERFACE_NAME for n in names), names
    assert len(set(names)) == len(names)
    namespaces_ = [link.namespace for links in (a, b) for link in links.values()]
    assert len(set(namespaces_)) == len(namespaces_)
    subnets = [link.subnet for links in (a, b) for link in links.values()]
    assert len(set(a[n].subnet for n in a)) == len(a)  # one /30 per node of a cluster
    assert all(s.startswith("10.197.") and s.endswith("/30") for s in subnets)
    assert plan_links(tmp_path / "a", profiles) == a  # stable: leftovers are found again


@needs_root
def test_traffic_crosses_the_link_partition_blocks_it_heal_restores_it(
    tmp_path: Path, loopback_echo: LoopbackEcho
) -> None:
    link = create_links(tmp_path / "home", {"fog-x": parse_link_profile("50mbit,n20")})["fog-x"]
    relay_pid = None
    try:
        assert link_state(link) == "up"
        ready = start_relay(link, tmp_path / "relay", loopback_echo.port)
        relay_pid = ready.pid
        # Into the namespace: relay (20 ms each way) + veth + tbf.
        into = measure_rtt(*ready.routes["echo"], samples=5, what="the test link")
        assert into.median_ms >= 2 * 20 - 10, into
        # Out of the namespace, as a node reaches the broker: only the host end is reachable.
        out = rtt_from_inside(link, ready.routes["out"], timeout_s=20)
        assert out is not None and out >= 2 * 20 - 10, out
        assert rtt_from_inside(link, ("127.0.0.1", loopback_echo.port), 5) is None

        set_link(link, up=False)
        assert link_state(link) == "down"
        with pytest.raises(LinkDown):
            measure_rtt(*ready.routes["echo"], samples=1, timeout_s=5)
        assert rtt_from_inside(link, ready.routes["out"], timeout_s=3) is None

        set_link(link, up=True)
        assert link_state(link) == "up"
        healed = measure_rtt(*ready.routes["echo"], samples=3, timeout_s=30)
        assert healed.median_ms >= 2 * 20 - 10
        assert rtt_from_inside(link, ready.routes["out"], timeout_s=20) is not None
    finally:
        destroy_link(link)
    assert_all_gone(link, relay_pid)
    with pytest.raises(NotIsolated, match="has no link"):
        set_link(link, up=False)


@needs_root
def test_tbf_limits_the_bandwidth_in_both_directions(tmp_path: Path) -> None:
    link = create_links(tmp_path / "home", {"slow": parse_link_profile("8mbit")})["slow"]
    relay_pid = None
    try:
        ready = start_relay(link, tmp_path / "relay", host_echo_port=9)  # "out" unused
        relay_pid = ready.pid
        payload = os.urandom(2_000_000)  # 16 Mbit: 2 s at 8 Mbit/s, each direction
        with socket.create_connection(ready.routes["echo"], timeout=120) as sock:
            received = bytearray()

            def read() -> None:
                while len(received) < len(payload) and (chunk := sock.recv(65536)):
                    received.extend(chunk)

            reader = threading.Thread(target=read)
            started = time.perf_counter()
            reader.start()
            sock.sendall(payload)
            reader.join(120)
            elapsed = time.perf_counter() - started
    finally:
        destroy_link(link)
    assert bytes(received) == payload
    # The echo goes through tbf twice (host -> node, node -> host), pipelined: the whole
    # takes at least one direction's 2 s. Generous margin for the bucket; no upper bound.
    assert elapsed >= 2.0 * 0.8, f"{len(payload)} bytes echoed in {elapsed:.2f} s at 8 Mbit/s"
    assert_all_gone(link, relay_pid)


@needs_root
def test_leftovers_of_a_killed_run_are_removed_before_the_next(tmp_path: Path) -> None:
    home = tmp_path / "home"
    link = plan_links(home, {"fog-a": parse_link_profile("1mbit,n5")})["fog-a"]
    create_link(link)
    # What a killed `fogshift up` leaves: a process inside the namespace, a relay.
    inside = subprocess.Popen(
        ["ip", "netns", "exec", link.namespace, "sleep", "600"], start_new_session=True
    )
    ready = start_relay(link, tmp_path / "relay", host_echo_port=9)
    try:
        assert namespace_pids(link.namespace) == [inside.pid]
        removed = cleanup_stale(home, is_live=cluster_running)
        assert link.namespace in removed
        assert inside.wait(15) == -signal.SIGKILL
        assert_all_gone(link, ready.pid)
        # The next run of this home gets the same names, and they are free again.
        again = create_links(home, {"fog-a": LinkProfile()})["fog-a"]
        assert (again.namespace, again.host_if) == (link.namespace, link.host_if)
        destroy_link(again)
        assert_all_gone(again)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(inside.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ready.pid, signal.SIGKILL)
        destroy_link(link)


@needs_root
def test_a_relay_exits_when_its_interface_is_made_anew_under_its_name(tmp_path: Path) -> None:
    # An orphaned relay (its `up` killed) watched its interface by name: the next `up` of
    # the home, making the same name again within the relay's poll, kept it for good.
    home = tmp_path / "home"
    link = plan_links(home, {"fog-a": parse_link_profile("n0")})["fog-a"]
    create_link(link)
    ready = start_relay(link, tmp_path / "relay", host_echo_port=9)
    try:
        destroy_link(link)
        create_link(link)  # (the same names, as the next run of the home makes them)
        assert pid_gone(ready.pid, 30), "the relay outlived its interface"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ready.pid, signal.SIGKILL)
        destroy_link(link)
    assert_all_gone(link, ready.pid)


@needs_root
def test_orphans_of_other_homes_go_but_live_clusters_stay(tmp_path: Path) -> None:
    other = tmp_path / "other"
    # Created by a process that is gone by now, as by a `fogshift up` that was killed.
    code = (
        "from pathlib import Path\n"
        "from fogshift.network.namespaces import create_links\n"
        "from fogshift.network.links import LinkProfile\n"
        f"print(create_links(Path({str(other)!r}), {{'n': LinkProfile()}})['n']"
        ".model_dump_json())\n"
    )
    made = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    link = NodeLink.model_validate_json(made.stdout)
    try:
        assert link.namespace in namespaces()
        # Its cluster still runs: it stays. (Other homes are judged for real: a test must
        # not remove what a cluster of someone else's uses.)
        still_running = lambda home: home == other or cluster_running(home)  # noqa: E731
        assert link.namespace not in cleanup_stale(tmp_path / "mine", still_running)
        assert link.namespace in namespaces()
        # Its cluster is gone and nothing runs inside: an orphan, removed.
        assert link.namespace in cleanup_stale(tmp_path / "mine", cluster_running)
        assert_all_gone(link)
    finally:
        destroy_link(link)


def test_isolation_is_refused_clearly_where_it_cannot_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fogshift.network import namespaces as ns_module
    from fogshift.network.exceptions import IsolationUnsupported
    from fogshift.supervisor import cluster

    monkeypatch.setattr(ns_module.os, "geteuid", lambda: 1000)
    with pytest.raises(IsolationUnsupported) as caught:
        cluster.up(tmp_path / "home", ["cloud"], isolate=True)
    assert "needs root" in caught.value.message and "uid 1000" in caught.value.message
    assert caught.value.hint and "without --isolate" in caught.value.hint
    assert not (tmp_path / "home").exists(), "nothing is started when isolation is impossible"

    monkeypatch.setattr(ns_module.os, "geteuid", lambda: 0)
    monkeypatch.setattr(ns_module.shutil, "which", lambda tool: None if tool == "tc" else tool)
    ns_module.require_support(need_tc=False)  # no bandwidth limit: tc is not needed
    with pytest.raises(IsolationUnsupported, match="needs the `tc` command"):
        ns_module.require_support(need_tc=True)
