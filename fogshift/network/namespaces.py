"""Network namespaces as "hosts": one per isolated node, joined to the host by a veth pair.

Layout of one node's link (all names derived from the cluster's home, see
:func:`plan_links`)::

    host namespace                                   namespace fogshift-<tag>-<node>
    relay ── fs<tag><i>h 10.197.x.1/30 ══ veth ══ fs<tag><i>n 10.197.x.2/30 ── agent
             tbf (host -> node)                     tbf (node -> host), lo up

* **Addresses** come from :data:`POOL`, one /30 per node, skipping any /30 the host already
  routes or owns (another cluster's links included).
* **Bandwidth**: ``tbf`` on both veth ends, so each direction is shaped on its way out.
* **Partition** = the host end set down: the namespace's packets are dropped (its
  connections stall; they time out, nothing is refused), and the host's connections to
  the namespace fail at once on an ``unreachable`` route kept for the /30 under the
  connected one — without it, they would follow the host's default route.
  **Heal** = the host end up again; the kernel restores the connected route.
* **Records**: before anything is created, a record (the :class:`NodeLink` and the creating
  process) is written to :data:`RECORD_DIR`, and it is removed last; so a link left behind
  by a killed run can always be found and removed (:func:`cleanup_stale`).

Everything here runs ``ip`` and ``tc`` and needs root (:func:`require_support`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock
from pydantic import BaseModel, ConfigDict

from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.processes import alive
from fogshift.common.waiting import wait_until
from fogshift.network.exceptions import IsolationUnsupported, NetworkCommandFailed, NotIsolated
from fogshift.network.links import LinkProfile

#: Where link records live (tmpfs: gone after a reboot, like the namespaces themselves).
RECORD_DIR = Path("/run/fogshift/netns")
#: Every namespace fogshift makes starts with this.
NAMESPACE_PREFIX = "fogshift-"
#: Every host-side interface starts with this (then the cluster tag).
INTERFACE_PREFIX = "fs"
#: The address pool: one /30 per node link.
POOL = ipaddress.IPv4Network("10.197.0.0/16")
#: Metric of the per-link ``unreachable`` route (a number nothing else is likely to use:
#: :func:`cleanup_stale` recognises orphans by it).
UNREACHABLE_METRIC = 4197
#: Longest interface name Linux accepts (IFNAMSIZ - 1).
MAX_INTERFACE_NAME = 15


class NodeLink(BaseModel):
    """One isolated node's namespace and link.

    Attributes:
        node: The node's name.
        home: The cluster home the link belongs to (absolute).
        namespace: The named network namespace (``ip netns``).
        host_if: The veth end in the host namespace.
        ns_if: The veth end in the node's namespace.
        subnet: The link's /30.
        host_ip: The host end's address: where the node reaches the relay.
        ns_ip: The node's address.
        profile: Bandwidth (``tbf`` here) and delay (the relay's).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    home: str
    namespace: str
    host_if: str
    ns_if: str
    subnet: str
    host_ip: str
    ns_ip: str
    profile: LinkProfile = LinkProfile()

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen


class _Record(BaseModel):
    """A link record file: the link and the pid of the process that created it."""

    link: NodeLink
    creator_pid: int


def cluster_tag(home: Path) -> str:
    """Six hex digits naming a cluster home in namespace and interface names."""
    return hashlib.sha1(str(home.resolve()).encode()).hexdigest()[:6]


def namespace_name(home: Path, node: str) -> str:
    return f"{NAMESPACE_PREFIX}{cluster_tag(home)}-{node}"


def require_support(need_tc: bool = False) -> None:
    """Check that namespaces can be made here: root, ``ip`` (and ``tc`` if shaping).

    Raises:
        IsolationUnsupported: Saying which is missing; nothing is pretended instead.
    """
    if os.geteuid() != 0:
        raise IsolationUnsupported(
            "node isolation needs root: network namespaces and veth pairs cannot be made "
            f"by uid {os.geteuid()}",
            hint="run `fogshift up --isolate` as root, or without --isolate",
        )
    for tool, needed in (("ip", True), ("tc", need_tc)):
        if needed and shutil.which(tool) is None:
            raise IsolationUnsupported(
                f"node isolation needs the `{tool}` command, which is not installed",
                hint="install iproute2 (`apt-get install iproute2`)",
            )


def _run(args: list[str], what: str, ok_if: tuple[str, ...] = ()) -> str:
    """Run a command; return its stdout.

    Raises:
        NetworkCommandFailed: It failed, unless its stderr contains one of ``ok_if``.
    """
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and not any(s in proc.stderr for s in ok_if):
        raise NetworkCommandFailed(
            f"{what} failed: `{' '.join(args)}` exited {proc.returncode}",
            received=proc.stderr.strip() or proc.stdout.strip() or "(no output)",
            hint="`fogshift net show` and `ip netns list` show what exists",
        )
    return proc.stdout


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = _run(["ip", "-j", *args], "listing " + " ".join(args))
    return list(json.loads(out)) if out.strip() else []


@functools.cache
def _file_lock(path: Path) -> FileLock:
    # One object per path: FileLock is re-entrant per object (a nested acquire counts up),
    # and per thread, so a second thread waits like a second process does.
    return FileLock(path)


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """Serialise allocation, creation and clean-up between concurrent ``fogshift up``s.

    Re-entrant within a thread, so a function holding it may call one that takes it.
    """
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    with _file_lock(RECORD_DIR.parent / "lock"):
        yield


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host routes (but the default route) or has an address in,
    and every /30 recorded for a link (one being created may not be routed yet)."""
    taken: list[ipaddress.IPv4Network] = []
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "default")
        if dst != "default":
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.IPv4Network(dst, strict=False))
    for iface in _ip_json("-4", "addr"):
        for addr in iface.get("addr_info", []):
            taken.append(ipaddress.IPv4Network(f"{addr['local']}/32"))
    taken += [ipaddress.IPv4Network(r.link.subnet) for r in _records()]
    return taken


def plan_links(home: Path, profiles: dict[str, LinkProfile]) -> dict[str, NodeLink]:
    """Names and a free /30 for each node's link (nothing is created).

    Names: namespace ``fogshift-<tag>-<node>``, interfaces ``fs<tag><index>h`` (host) and
    ``...n`` (node), where ``tag`` is :func:`cluster_tag` — unique per home, so clusters
    under different homes never clash, and leftovers of a home are found by prefix.

    Raises:
        IsolationUnsupported: The pool has no free /30 left.
    """
    home = home.resolve()
    tag = cluster_tag(home)
    taken = _taken_networks()
    subnets = list(POOL.subnets(new_prefix=30))
    links: dict[str, NodeLink] = {}
    for index, (node, profile) in enumerate(profiles.items()):
        # Start where the home and node hash to: concurrent clusters rarely probe the same.
        start = int(hashlib.sha1(f"{home}:{node}".encode()).hexdigest(), 16) % len(subnets)
        for step in range(len(subnets)):
            subnet = subnets[(start + step) % len(subnets)]
            if not any(subnet.overlaps(net) for net in taken):
                break
        else:
            raise IsolationUnsupported(
                f"no free /30 left in {POOL} for the link of node {node!r}",
                hint="`fogshift down` other isolated clusters, or remove stale links",
            )
        taken.append(subnet)
        host_ip, ns_ip = list(subnet.hosts())
        host_if = f"{INTERFACE_PREFIX}{tag}{index:03x}h"
        assert len(host_if) <= MAX_INTERFACE_NAME
        links[node] = NodeLink(
            node=node,
            home=str(home),
            namespace=namespace_name(home, node),
            host_if=host_if,
            ns_if=host_if[:-1] + "n",
            subnet=str(subnet),
            host_ip=str(host_ip),
            ns_ip=str(ns_ip),
            profile=profile,
        )
    return links


def _record_file(namespace: str) -> Path:
    return RECORD_DIR / f"{namespace}.json"


def _records() -> list[_Record]:
    if not RECORD_DIR.is_dir():
        return []
    records = []
    for path in sorted(RECORD_DIR.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            records.append(_Record.model_validate_json(path.read_text()))
    return records


def _tbf(profile: LinkProfile) -> list[str]:
    """``tbf`` arguments for ``profile``'s bandwidth.

    The bucket holds 4 ms of traffic but at least two full frames (a smaller one cannot
    pass a frame at all); the queue holds 100 ms but at least four buckets, so TCP sees a
    bottleneck with a modest queue, as on a real access link.
    """
    bps = profile.bandwidth_bps
    assert bps is not None
    burst = max(2 * 1514, bps // 8 // 250)
    limit = max(4 * burst, bps // 8 // 10)
    return ["tbf", "rate", f"{bps}bit", "burst", str(burst), "limit", str(limit)]


def create_link(link: NodeLink) -> None:
    """Create ``link``: namespace (with ``lo`` up), veth pair, addresses, the unreachable
    fallback route and, if the profile has a bandwidth, ``tbf`` on both ends.

    Raises:
        NetworkCommandFailed: A step failed; whatever was created is removed again.
    """
    with _lock():
        _create_link(link)


def create_links(home: Path, profiles: dict[str, LinkProfile]) -> dict[str, NodeLink]:
    """Plan (:func:`plan_links`) and create one link per node in ``profiles``.

    Raises:
        IsolationUnsupported: No free addresses.
        NetworkCommandFailed: A step failed; every link made here is removed again.
    """
    with _lock():
        links = plan_links(home, profiles)
        made: list[NodeLink] = []
        try:
            for link in links.values():
                _create_link(link)
                made.append(link)
        except BaseException:
            for link in made:
                with contextlib.suppress(NetworkCommandFailed):
                    destroy_link(link)
            raise
    return links


def _create_link(link: NodeLink) -> None:
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    record = _Record(link=link, creator_pid=os.getpid())
    _record_file(link.namespace).write_text(record.model_dump_json())
    ns = link.namespace
    prefix = f"/{link.prefixlen}"
    what = f"creating the link of node {link.node!r} (namespace {ns})"
    try:
        _run(["ip", "netns", "add", ns], what)
        _run(["ip", "link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if,
              "netns", ns], what)  # fmt: skip
        _run(["ip", "addr", "add", link.host_ip + prefix, "dev", link.host_if], what)
        _run(["ip", "-n", ns, "addr", "add", link.ns_ip + prefix, "dev", link.ns_if], what)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"], what)  # Spark's driver binds lo
        _run(["ip", "-n", ns, "link", "set", link.ns_if, "up"], what)
        _run(["ip", "route", "add", "unreachable", link.subnet, "metric",
              str(UNREACHABLE_METRIC)], what)  # fmt: skip
        if link.profile.bandwidth is not None:
            _run(["tc", "qdisc", "replace", "dev", link.host_if, "root", *_tbf(link.profile)],
                 what)  # fmt: skip
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", link.ns_if, "root",
                  *_tbf(link.profile)], what)  # fmt: skip
        _run(["ip", "link", "set", link.host_if, "up"], what)
    except BaseException:
        with contextlib.suppress(NetworkCommandFailed):
            destroy_link(link)
        raise


def namespace_pids(namespace: str) -> list[int]:
    """The processes inside ``namespace`` (none if it does not exist)."""
    proc = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
    )
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _kill_inside(namespace: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process still inside ``namespace`` and wait until they are gone."""

    def emptied() -> bool:
        pids = namespace_pids(namespace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids

    # Past the deadline the namespace is removed anyway; what still runs inside is orphaned.
    with contextlib.suppress(WaitTimedOut):
        wait_until(emptied, timeout_s, interval_s=0.1, describe=f"namespace {namespace} empty")


def destroy_link(link: NodeLink) -> None:
    """Remove ``link`` entirely: processes left inside, veth pair, namespace, route, record.

    Safe to call on a link that is partly or not at all there. The veth is deleted
    explicitly: a namespace is destroyed asynchronously by the kernel, and its veth would
    otherwise linger for a while after ``ip netns del``.

    Raises:
        NetworkCommandFailed: Something could not be removed (every step is still tried).
    """
    _kill_inside(link.namespace)
    errors: list[NetworkCommandFailed] = []
    what = f"removing the link of node {link.node!r} (namespace {link.namespace})"
    steps = [
        (["ip", "link", "del", link.host_if], ("Cannot find device",)),
        (["ip", "netns", "del", link.namespace], ("No such file",)),
        (["ip", "route", "del", "unreachable", link.subnet, "metric", str(UNREACHABLE_METRIC)],
         ("No such process", "not found")),
    ]  # fmt: skip
    for args, ok_if in steps:
        try:
            _run(args, what, ok_if)
        except NetworkCommandFailed as exc:
            errors.append(exc)
    if errors:
        raise NetworkCommandFailed(
            f"{what}: {len(errors)} step(s) failed",
            received="; ".join(e.received or e.message for e in errors),
            hint="re-run `fogshift down`, or remove them with `ip`",
        )
    _record_file(link.namespace).unlink(missing_ok=True)


def link_state(link: NodeLink) -> str:
    """``up``, ``down`` (partitioned) or ``missing`` (the host end does not exist)."""
    proc = subprocess.run(
        ["ip", "-j", "link", "show", "dev", link.host_if], capture_output=True, text=True
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        return "missing"
    flags = json.loads(proc.stdout)[0].get("flags", [])
    return "up" if "UP" in flags else "down"


def set_link(link: NodeLink, up: bool) -> None:
    """Heal (``up=True``) or partition (``up=False``) the link of ``link.node``.

    Raises:
        NotIsolated: The link does not exist (the cluster is down, or was cleaned up).
        NetworkCommandFailed: ``ip`` failed.
    """
    if link_state(link) == "missing":
        raise NotIsolated(
            f"node {link.node!r} has no link: interface {link.host_if} does not exist",
            expected=f"interface {link.host_if}",
            received="no such interface",
            hint="is the cluster up (`fogshift nodes`)? it must be started with --isolate",
        )
    verb = "healing" if up else "partitioning"
    _run(["ip", "link", "set", "dev", link.host_if, "up" if up else "down"],
         f"{verb} node {link.node!r}")  # fmt: skip


def _namespaces() -> list[str]:
    return [n["name"] for n in _ip_json("netns", "list")]


def cleanup_stale(home: Path, is_live: Callable[[Path], bool]) -> list[str]:
    """Remove links a killed run left behind; return the namespaces removed.

    Removed are: every link of ``home`` (the caller has made sure no cluster runs there:
    it is about to start one), and links of other homes that are orphans — nothing runs
    inside their namespace, the process that created them is gone and ``is_live(home)``
    says their cluster is not running. Also removed: unreachable routes of the pool with
    fogshift's metric that no record claims.

    Args:
        home: The cluster home about to be started.
        is_live: Whether a cluster runs under a given home.

    Raises:
        NetworkCommandFailed: Something could not be removed.
    """
    home = home.resolve()
    tag = cluster_tag(home)
    removed: list[str] = []
    with _lock():
        records = {r.link.namespace: r for r in _records()}
        existing = set(_namespaces())
        for namespace, record in records.items():
            ours = record.link.home == str(home)
            orphan = (
                not alive(record.creator_pid)
                and not namespace_pids(namespace)
                and not is_live(Path(record.link.home))
            )
            if ours or orphan:
                destroy_link(record.link)
                removed.append(namespace)
        # Leftovers of this home without a record (the record dir was wiped).
        for namespace in existing - set(records):
            if namespace.startswith(f"{NAMESPACE_PREFIX}{tag}-"):
                _kill_inside(namespace)
                _run(["ip", "netns", "del", namespace], "removing a stale namespace",
                     ("No such file",))  # fmt: skip
                removed.append(namespace)
        for iface in _ip_json("link", "show", "type", "veth"):
            name = str(iface.get("ifname", ""))
            if name.startswith(f"{INTERFACE_PREFIX}{tag}"):
                _run(["ip", "link", "del", name], "removing a stale veth", ("Cannot find",))
        claimed = {r.link.subnet for r in _records()}
        for route in _ip_json("-4", "route", "show", "table", "main"):
            dst = route.get("dst", "")
            if (
                route.get("type") == "unreachable"
                and route.get("metric") == UNREACHABLE_METRIC
                and dst not in claimed
                and ipaddress.IPv4Network(dst, strict=False).subnet_of(POOL)
            ):
                _run(["ip", "route", "del", "unreachable", dst, "metric",
                      str(UNREACHABLE_METRIC)], "removing a stale route", ("No such",))  # fmt: skip
    return removed
