"""Random instances like the paper's evaluation and a benchmark of exact vs greedy.

The paper (section VI-B) times CBC against the greedy with 30 servers and 30..120 tasks
(Fig. 5) and with 30 tasks and 30..60 servers (Fig. 6), averaging 10 trials, but does not
publish its instance generator. :func:`random_topology` is ours; its parameters are
documented below and every number the benchmark reports is measured, never copied.

Run from the command line::

    python -m fogshift.planner.bench --out bench-out --tasks 30,40,50 --servers 30 \\
        --trials 3 --time-limit 60
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

from fogshift.planner.exceptions import InfeasiblePlan, SolverFailed
from fogshift.planner.greedy import solve_greedy
from fogshift.planner.milp import solve_exact
from fogshift.planner.model import Link, Plan, Server, Task, Topology

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class BenchRow:
    """One run of one method on one instance.

    Attributes:
        method: ``"exact"`` or ``"greedy"``.
        tasks: Number of tasks.
        servers: Number of servers.
        trial: Trial number (0-based); the instance seed is derived from it.
        seed: Seed passed to :func:`random_topology`.
        status: ``"optimal"``, ``"time_limit"``, ``"heuristic"``, ``"infeasible"`` (proven),
            ``"failed"`` (greedy stuck) or ``"no_solution"`` (exact found none in time).
        time_ms: Wall-clock time of the run in ms.
        objective_ms: ``TL`` of the plan in ms, or None without a plan.
        gap_ms: ``objective_ms`` minus the exact optimum, when the exact run is optimal.
        gap_rel: ``gap_ms`` relative to the optimum (0 if both are 0, inf if only it is).
    """

    method: Literal["exact", "greedy"]
    tasks: int
    servers: int
    trial: int
    seed: int
    status: str
    time_ms: float
    objective_ms: float | None
    gap_ms: float | None
    gap_rel: float | None


def _seed(tasks: int, servers: int, trial: int) -> int:
    # A fixed function of the cell and trial so reruns and partial reruns see the same
    # instances.
    return tasks * 1_000_003 + servers * 1_009 + trial


def _run(
    method: Literal["exact", "greedy"], topo: Topology, time_limit_s: float
) -> tuple[str, float, float | None]:
    """Run one method; return ``(status, time_ms, objective_ms)``."""
    start = time.perf_counter()
    result: Plan | None = None
    status: str
    try:
        if method == "greedy":
            result = solve_greedy(topo)
        else:
            # Cold start: the benchmark times the solver alone, as the paper times CBC.
            result = solve_exact(topo, time_limit_s=time_limit_s)
        status = result.status
    except InfeasiblePlan as exc:
        status = "infeasible" if exc.proven else "failed"
    except SolverFailed:
        status = "no_solution"
    elapsed = (time.perf_counter() - start) * 1000.0
    return status, elapsed, None if result is None else result.objective_ms


def run_bench(
    out_dir: str | Path,
    task_counts: Sequence[int],
    server_counts: Sequence[int],
    trials: int,
    time_limit_s: float,
    progress: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """Time exact and greedy on random instances of every ``tasks x servers`` combination.

    Writes ``bench.csv`` (one line per run, the fields of :class:`BenchRow`) and, if
    matplotlib is importable, ``bench.png`` (mean time per method against the number of
    tasks, one line per server count, log scale) into ``out_dir``.

    Args:
        out_dir: Directory for the outputs (created if missing).
        task_counts: Task counts to try (the paper's Fig. 5: 30..120 step 10).
        server_counts: Server counts to try (Fig. 6: 30..60 step 6).
        trials: Instances per combination (the paper averages 10).
        time_limit_s: Time limit of each exact solve.
        progress: Called with each row as soon as it is measured.

    Returns:
        Every row, in run order.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[BenchRow] = []
    for n_servers in server_counts:
        for n_tasks in task_counts:
            for trial in range(trials):
                seed = _seed(n_tasks, n_servers, trial)
                topo = random_topology(n_tasks, n_servers, seed)
                exact = _run("exact", topo, time_limit_s)
                greedy = _run("greedy", topo, time_limit_s)
                optimum = exact[2] if exact[0] == "optimal" else None
                for method, (status, ms, obj) in (("exact", exact), ("greedy", greedy)):
                    gap = gap_rel = None
                    if optimum is not None and obj is not None:
                        gap = obj - optimum
                        if optimum > 0:
                            gap_rel = gap / optimum
                        else:
                            gap_rel = 0.0 if gap <= 1e-9 else math.inf
                    row = BenchRow(
                        method="exact" if method == "exact" else "greedy",
                        tasks=n_tasks,
                        servers=n_servers,
                        trial=trial,
                        seed=seed,
                        status=status,
                        time_ms=ms,
                        objective_ms=obj,
                        gap_ms=gap,
                        gap_rel=gap_rel,
                    )
                    rows.append(row)
                    if progress is not None:
                        progress(row)
    _write_csv(out / "bench.csv", rows)
    _plot(out / "bench.png", rows)
    return rows


def _write_csv(path: Path, rows: Sequence[BenchRow]) -> None:
    names = [f.name for f in fields(BenchRow)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})


def _plot(path: Path, rows: Sequence[BenchRow]) -> bool:
    """Draw ``bench.png``; return False (and log why) if matplotlib is missing.

    The x axis is the number of tasks, one line per server count and method (Fig. 5); when
    only the server count varies it is the number of servers instead (Fig. 6).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on servers and CI
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: skipped %s (the CSV has all the data)", path)
        return False
    by_servers = len({r.tasks for r in rows}) == 1 and len({r.servers for r in rows}) > 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, style in (("exact", "o-"), ("greedy", "s--")):
        groups = sorted({r.tasks if by_servers else r.servers for r in rows})
        for group in groups:
            cell: dict[int, list[float]] = {}
            for r in rows:
                if r.method == method and (r.tasks if by_servers else r.servers) == group:
                    cell.setdefault(r.servers if by_servers else r.tasks, []).append(r.time_ms)
            xs = sorted(cell)
            label = f"{method}, {group} {'tasks' if by_servers else 'servers'}"
            ax.plot(xs, [statistics.fmean(cell[x]) for x in xs], style, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("servers" if by_servers else "tasks")
    ax.set_ylabel("mean time per run (ms)")
    ax.set_title("Backup-location planning: exact (HiGHS) vs greedy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints one line per run and returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--tasks", type=_ints, default=[30], help="comma-separated task counts")
    parser.add_argument("--servers", type=_ints, default=[30], help="comma-separated counts")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per exact run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def show(row: BenchRow) -> None:
        obj = "-" if row.objective_ms is None else f"{row.objective_ms:.1f}"
        print(
            f"{row.method:6} tasks={row.tasks:4} servers={row.servers:4} trial={row.trial:2} "
            f"{row.status:11} {row.time_ms:10.1f} ms  objective={obj}",
            flush=True,
        )

    run_bench(args.out, args.tasks, args.servers, args.trials, args.time_limit, show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
