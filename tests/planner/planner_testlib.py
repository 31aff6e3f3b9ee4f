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
from typing import Any

from hypothesis import strategies as st

from fogshift.planner import DEFAULT_SHARES, Topology
from fogshift.planner.model import violations

Choice = tuple[str, str, float | None]


def topo(
    servers: list[tuple[str, float, float]],
    tasks: list[dict[str, Any]],
    links: list[tuple[str, str, float]],
) -> Topology:
    """Build a topology from ``(id, cpu, load)``, task dicts and ``(a, b, bandwidth)``."""
    return Topology.from_dict(
        {
            "servers": [{"id": i, "cpu": c, "load": ld} for i, c, ld in servers],
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
) -> dict[str, Any]:
    """A task dict with defaults that rarely bind."""
    return {
        "id": tid,
        "server": server,
        "cpu": cpu,
        "latency_ms": latency_ms,
        "backup_rate": backup_rate,
        "transfer_size": transfer_size,
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
def topologies(draw: st.DrawFn, max_servers: int = 4, max_tasks: int = 3) -> Topology:
    """Small random topologies with integer data; some are infeasible, some disconnected."""
    n = draw(st.integers(2, max_servers))
    ids = [f"s{k + 1}" for k in range(n)]
    capacity = [float(draw(st.sampled_from([40, 60, 100]))) for _ in ids]
    used = [0.0] * n
    tasks = []
    for k in range(draw(st.integers(1, max_tasks))):
        host = draw(st.integers(0, n - 1))
        cpu = float(draw(st.integers(0, 30)))
        if used[host] + cpu > capacity[host]:
            cpu = 0.0
        used[host] += cpu
        tasks.append(
            task(
                f"t{k + 1}",
                ids[host],
                cpu=cpu,
                latency_ms=float(draw(st.sampled_from([500, 2000, 5000, 20_000]))),
                backup_rate=float(draw(st.integers(0, 20))),
                transfer_size=float(draw(st.integers(10, 200))),
            )
        )
    load = [float(draw(st.integers(0, int(capacity[i] - used[i])))) for i in range(n)]
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True, min_size=1)) if pairs else []
    links = [
        (ids[a], ids[b], float(draw(st.sampled_from([5, 10, 20, 40, 100])))) for a, b in chosen
    ]
    return topo([(ids[i], capacity[i], load[i]) for i in range(n)], tasks, links)


def close(a: float, b: float) -> bool:
    """Objective equality up to the planner's tolerance."""
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
