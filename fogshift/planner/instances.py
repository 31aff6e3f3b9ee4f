"""Random fog instances for the planner (its tests and its benchmark).

The paper (Iijima et al.) does not publish its instance generator; :func:`random_topology`
is ours: servers with spare CPU are few, so co-locating backup and redeploy server pulls
replication traffic across the network.
"""

from __future__ import annotations

import math
import random

from fogshift.planner.model import Link, Server, Task, Topology

#: Link bandwidths (Mb/s) drawn for the random network: edge-grade links, as in the paper's
#: experiment with 10 and 100 Mb/s between servers.
BANDWIDTHS: tuple[float, ...] = (20.0, 50.0, 100.0)


def _floor1(x: float) -> float:
    # Round down, never up, so load + tasks stays within capacity.
    return math.floor(x * 10.0) / 10.0


def random_topology(
    n_tasks: int,
    n_servers: int,
    seed: int,
    *,
    fog_fraction: float = 0.1,
    extra_links: float = 1.5,
) -> Topology:
    """A random fog instance in the spirit of the paper's Fig. 5/6 experiments.

    The paper does not publish its generator; this one makes the trade-off of section V
    appear: servers with spare CPU are few, so co-locating backup and redeploy server pulls
    replication traffic across the network, and when links fill up tasks must keep their
    backup nearby and recover remotely.

    * Servers: ``fog_fraction`` of them (at least one) are fog servers, ``c_s = 200`` with a
      background load uniform in ``[0, 50]``; the others are edge servers, ``c_s = 100``,
      hosting the tasks and loaded so that only 0-5 CPU stays free.
    * Network: a random spanning tree plus ``extra_links * n_servers`` random extra links
      (connected, multi-hop), each with a bandwidth drawn from :data:`BANDWIDTHS`.
    * Tasks: ``c_τ`` uniform in ``[5, 20]`` on a random edge server with room;
      ``d_τ^store`` uniform in ``[1, 8]`` Mb/s; ``d_τ^sum`` uniform in ``[40, 400]`` Mb (the
      paper's experiment moves about 20 MB = 160 Mb); ``l_τ`` uniform in ``[2, 30]`` s.

    More tasks on the same servers leave less bandwidth, so, as in Fig. 5, the problem gets
    harder with the number of tasks. Some instances are infeasible.

    Args:
        n_tasks: Number of tasks (>= 0).
        n_servers: Number of servers (>= 1).
        seed: Seed of the private random generator; equal arguments give equal topologies.
        fog_fraction: Share of fog servers, in ``[0, 1]``.
        extra_links: Extra links per server on top of the spanning tree.

    Raises:
        ValueError: If the sizes are invalid or the tasks do not fit the servers' CPU.
    """
    if n_servers < 1 or n_tasks < 0 or not 0.0 <= fog_fraction <= 1.0:
        raise ValueError(
            f"need n_servers >= 1, n_tasks >= 0, 0 <= fog_fraction <= 1; got "
            f"{n_tasks}, {n_servers}, {fog_fraction}"
        )
    rng = random.Random(seed)
    ids = [f"s{k + 1}" for k in range(n_servers)]
    fog = set(rng.sample(range(n_servers), max(1, round(fog_fraction * n_servers))))
    edge = [i for i in range(n_servers) if i not in fog]
    capacity = [200.0 if i in fog else 100.0 for i in range(n_servers)]
    used = [0.0] * n_servers
    tasks = []
    for k in range(n_tasks):
        cpu = float(rng.randint(5, 20))
        room = [i for i in edge if used[i] + cpu <= capacity[i] - 5.0]
        if not room:  # edge servers full: spill onto any server with room
            room = [i for i in range(n_servers) if used[i] + cpu <= capacity[i]]
        if not room:
            raise ValueError(f"{n_tasks} tasks do not fit on {n_servers} servers")
        host = rng.choice(room)
        used[host] += cpu
        tasks.append(
            Task(
                id=f"t{k + 1}",
                server=ids[host],
                cpu=cpu,
                latency_ms=float(rng.randint(2000, 30000)),
                backup_rate=float(rng.randint(1, 8)),
                transfer_size=float(rng.randint(40, 400)),
            )
        )
    load = []
    for i in range(n_servers):
        if i in fog:
            load.append(_floor1(min(rng.uniform(0.0, 50.0), capacity[i] - used[i])))
        else:
            free = rng.uniform(0.0, 5.0)
            load.append(_floor1(max(0.0, capacity[i] - used[i] - free)))
    pairs: set[tuple[int, int]] = set()
    for k in range(1, n_servers):
        pairs.add((rng.randrange(k), k))
    wanted = min(len(pairs) + int(extra_links * n_servers), n_servers * (n_servers - 1) // 2)
    while len(pairs) < wanted:
        a, b = sorted(rng.sample(range(n_servers), 2))
        pairs.add((a, b))
    links = tuple(
        Link(a=ids[a], b=ids[b], bandwidth=rng.choice(BANDWIDTHS)) for a, b in sorted(pairs)
    )
    servers = tuple(Server(id=sid, cpu=capacity[k], load=load[k]) for k, sid in enumerate(ids))
    return Topology(servers=servers, tasks=tuple(tasks), links=links)
