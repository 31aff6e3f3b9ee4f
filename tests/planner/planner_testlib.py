"""Shared helpers for the planner tests: tiny topologies and a brute-force optimum.

Imported by the test modules as ``planner_testlib`` (conftest.py puts this directory on
``sys.path``, whatever pytest's import mode).

The brute force enumerates every ``(backup, redeploy, Z)`` choice on the share grid and keeps
those :func:`fogshift.planner.model.violations` accepts, so it shares no code with the MILP
or the greedy; ``violations`` itself is tested against hand-made plans in
test_planner_model.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from fogshift.planner import DEFAULT_SHARES, Topology
from fogshift.planner.model import violations

Choice = tuple[str, str, float | None]


def topo(
    servers: Sequence[tuple[str, float, float] | tuple[str, float, float, bool]],
    tasks: Sequence[dict[str, Any]],
    links: Sequence[tuple[str, str, float]],
) -> Topology:
    """Build a topology from ``(id, cpu, load[, leaving])``, task dicts and ``(a, b,
    bandwidth)``."""
    return Topology.from_dict(
        {
            "servers": [
                {"id": i, "cpu": c, "load": ld, "leaving": bool(rest and rest[0])}
                for i, c, ld, *rest in servers
            ],
            "tasks": tasks,
            "links": [{"a": a, "b": b, "bandwidth": bw} for a, b, bw in links],
        }
    )


def task(
    tid: str,
    server: str,
    cpu: float = 10,
    latency_ms: float = 10_000,
    backup_rate: float = 1,
    transfer_size: float = 100,
    replicas_from: str | None = None,
) -> dict[str, Any]:
    """A task dict with defaults that rarely bind."""
    return {
        "id": tid,
        "server": server,
        "cpu": cpu,
        "latency_ms": latency_ms,
        "backup_rate": backup_rate,
        "transfer_size": transfer_size,
        **({"replicas_from": replicas_from} if replicas_from else {}),
    }


def brute_force(
    topology: Topology, shares: tuple[float, ...] = DEFAULT_SHARES
) -> tuple[float, dict[str, Choice]] | None:
    """The optimum ``(objective_ms, choice)`` over the share grid, or None if infeasible.

    Options exclude the task's own server (eq. 5 is checked in the model tests); remote
    options take ``Z`` = share x bottleneck, or ``Z = 1`` when no route exists so that
    ``violations`` rejects them rather than this helper.
    """
    net = topology.network()
    ids = net.server_ids
    per_task: list[list[Choice]] = []
    for t in topology.tasks:
        opts: list[Choice] = []
        for i in ids:
            for j in ids:
                if t.server in (i, j):
                    continue
                if i == j:
                    opts.append((i, j, None))
                    continue
                width = net.bottleneck(net.server_index[i], net.server_index[j])
                if width <= 0:
                    opts.append((i, j, 1.0))
                else:
                    opts.extend((i, j, s * width) for s in shares)
        per_task.append(opts)
    best: tuple[float, dict[str, Choice]] | None = None
    tids = [t.id for t in topology.tasks]
    for combo in itertools.product(*per_task):
        choice = dict(zip(tids, combo, strict=True))
        if violations(net, choice):
            continue
        cost = 0.0
        for t, (i, j, z) in zip(topology.tasks, combo, strict=True):
            if i != j:
                assert z is not None
                cost += 1000.0 * t.transfer_size / z
        if best is None or cost < best[0] - 1e-9:
            best = (cost, choice)
    return best


@st.composite
def generic_topologies(draw: st.DrawFn, max_servers: int = 4, max_tasks: int = 3) -> Topology:
    """Small random topologies with integer data.

    Free CPU per server is drawn from a few levels including "none", so that co-location is
    often impossible and remote recoveries (and their bandwidth shares) get exercised; some
    instances are infeasible and some networks disconnected. Some tasks' backup data comes
    from another server (``replicas_from``, as fogshift's from its central store), and now
    and then a server is leaving (it may hold none of them).
    """
    n = draw(st.integers(min(3, max_servers), max_servers))
    ids = [f"s{k + 1}" for k in range(n)]
    used = [0.0] * n
    tasks = []
    for k in range(draw(st.integers(1, max_tasks))):
        host = draw(st.integers(0, n - 1))
        cpu = float(draw(st.integers(0, 30)))
        used[host] += cpu
        tasks.append(
            task(
                f"t{k + 1}",
                ids[host],
                cpu=cpu,
                latency_ms=float(draw(st.sampled_from([1000, 5000, 20_000, 60_000]))),
                backup_rate=float(draw(st.integers(0, 10))),
                transfer_size=float(draw(st.integers(10, 200))),
                replicas_from=draw(st.sampled_from([None, None, *ids])),
            )
        )
    servers = []
    for i in range(n):
        free = float(draw(st.sampled_from([0, 15, 40, 100])))
        servers.append((ids[i], used[i] + free, 0.0))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    # Usually connected (a path through all servers plus extras), sometimes not.
    chain = [(k, k + 1) for k in range(n - 1)] if draw(st.integers(0, 4)) else []
    extra = draw(st.lists(st.sampled_from(pairs), unique=True, min_size=0 if chain else 1))
    chosen = sorted(set(chain) | set(extra))
    links = [
        (ids[a], ids[b], float(draw(st.sampled_from([5, 10, 20, 40, 100])))) for a, b in chosen
    ]
    # A server's capacity must be positive; an idle server with no free CPU gets load instead.
    leaving = [draw(st.sampled_from([False, False, False, False, True])) for _ in ids]
    shaped = [
        (sid, cap, 0.0, away) if cap > 0 else (sid, 1.0, 1.0, away)
        for (sid, cap, _), away in zip(servers, leaving, strict=True)
    ]
    return topo(shaped, tasks, links)


@st.composite
def fog_topologies(draw: st.DrawFn, max_servers: int = 4, max_tasks: int = 3) -> Topology:
    """Small instances shaped so that remote recovery is often the only or the best plan.

    s1 hosts most tasks. "Near" servers have no free CPU but fat links to s1; "far" servers
    have CPU but at most a 5 Mb/s direct link to s1 (too thin for most backups), so backups
    go near and recoveries travel near -> far at a share of the near-far bottleneck. Tasks
    may also run on near servers, whose replication then competes with the recoveries.
    """
    n = draw(st.integers(3, max(3, max_servers)))
    ids = [f"s{k + 1}" for k in range(n)]
    roles = ["host", "near", "far"] + [draw(st.sampled_from(["near", "far"])) for _ in ids[3:]]
    near = [k for k in range(n) if roles[k] == "near"]
    used = [0.0] * n
    tasks = []
    for k in range(draw(st.integers(1, max_tasks))):
        host = draw(st.sampled_from([0, 0, *near]))
        cpu = float(draw(st.integers(0, 30)))
        used[host] += cpu
        tasks.append(
            task(
                f"t{k + 1}",
                ids[host],
                cpu=cpu,
                latency_ms=float(draw(st.sampled_from([5000, 20_000, 60_000]))),
                backup_rate=float(draw(st.integers(4, 10))),
                transfer_size=float(draw(st.integers(10, 200))),
            )
        )
    servers = []
    for k in range(n):
        free = 0.0 if roles[k] == "near" else float(draw(st.sampled_from([15, 40, 100])))
        cap = used[k] + free
        servers.append((ids[k], cap, 0.0) if cap > 0 else (ids[k], 1.0, 1.0))
    links = []
    for a in range(n):
        for b in range(a + 1, n):
            kinds = {roles[a], roles[b]}
            if kinds == {"host", "near"}:
                bw = draw(st.sampled_from([20, 40, 100]))
            elif kinds == {"host", "far"}:
                bw = draw(st.sampled_from([0, 5, 5]))
            else:
                bw = draw(st.sampled_from([0, 5, 10, 20, 40]))
            if bw:
                links.append((ids[a], ids[b], float(bw)))
    return topo(servers, tasks, links)


def topologies(max_servers: int = 4, max_tasks: int = 3) -> st.SearchStrategy[Topology]:
    """Generic or fog-shaped small topologies (see the two strategies)."""
    return st.one_of(
        generic_topologies(max_servers, max_tasks), fog_topologies(max_servers, max_tasks)
    )


def close(a: float, b: float) -> bool:
    """Objective equality up to the planner's tolerance."""
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
