"""The paper's greedy "combination decision algorithm" (Algorithm 1), as section V describes it.

Reading of Algorithm 1 (its pseudo-code has typos; see docs/planner.md for the details):

1. Sort tasks by ``l_τ`` ascending, so the most latency-critical task chooses first
   (ties keep topology order).
2. Phase 1, co-location: for each task, the candidate servers ``S'`` are the servers other
   than ``s_w(τ)`` whose route from ``s_w(τ)`` (from :attr:`Task.replicas_from` if it names
   a server: fogshift's central store) still has ``d_τ^store`` free on every link.
   They are tried by hop count from ``s_w(τ)`` ascending ("sort B with the number of edges"),
   ties by the widest residual bottleneck, then server order. The first one that passes
   CheckCPU becomes both backup and redeploy server (recovery time 0), the route's residual
   bandwidth drops by ``d_τ^store`` and the task is done (the pseudo-code lacks this break).
3. Phase 2, for tasks phase 1 could not place, in the same order: among remote pairs
   ``(i, j)`` whose backup route still has room for ``d_τ^store`` and whose ``j`` passes
   CheckCPU, take the one with the highest bandwidth between backup and redeploy server,
   where "bandwidth" is the ``Z`` the pair can still get: the largest share of its route's
   bottleneck that fits eq. 4 when ``s_w(τ)`` fails and meets ``l_τ``. Highest ``Z`` means
   the shortest recovery ``b(τ)/Z``. Ties go to fewer hops ``i -> j``, then fewer hops
   ``s_w(τ) -> i``, then server order.

Every acceptance test keeps all the model's constraints (including eq. 4 for every other
failing server), so a plan the greedy returns is always feasible. The greedy can fail on a
feasible instance; it then raises :class:`InfeasiblePlan` with ``proven=False``.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Sequence

from fogshift.planner.exceptions import ConstraintKind, InfeasiblePlan
from fogshift.planner.feasibility import (
    DEFAULT_SHARES,
    Option,
    explain_task,
    normalise_shares,
)
from fogshift.planner.model import Assignment, Network, Plan, Topology, within


class _State:
    """Bandwidth and CPU already promised to placed tasks."""

    def __init__(self, net: Network) -> None:
        self.net = net
        n_links = len(net.bandwidth)
        self.replication = [0.0] * n_links  # steady-state Σ d_τ^store on each link
        # rep_of[e][f]: replication on e by tasks working on f (it stops when f fails);
        # rec_of[e][f]: recovery reservations on e when f fails. Eq. 4 for f on e is
        # replication[e] - rep_of[e][f] + rec_of[e][f] <= U(e).
        self.rep_of: list[dict[int, float]] = [defaultdict(float) for _ in range(n_links)]
        self.rec_of: list[dict[int, float]] = [defaultdict(float) for _ in range(n_links)]
        self.cpu: dict[tuple[int, int], float] = defaultdict(float)  # (failing f, target k)

    def residual(self, route: tuple[int, ...]) -> float:
        """Smallest steady-state residual bandwidth along ``route``."""
        return min(
            (self.net.bandwidth[e] - self.replication[e] for e in route), default=float("inf")
        )

    def replication_fits(self, work: int, route: tuple[int, ...], rate: float) -> bool:
        """Whether ``rate`` more replication from ``work`` fits every link of ``route``.

        It must fit without failures and in every failure of a server other than ``work``
        that has recovery reservations on the link (``work``'s failure stops the stream).
        """
        for e in route:
            worst = 0.0
            for f, rec in self.rec_of[e].items():
                if f != work:
                    worst = max(worst, rec - self.rep_of[e].get(f, 0.0))
            if not within(self.replication[e] + rate + worst, self.net.bandwidth[e]):
                return False
        return True

    def cpu_fits(self, work: int, target: int, need: float) -> bool:
        """CheckCPU: ``target`` can take ``need`` more CPU when ``work`` fails."""
        return within(self.cpu[(work, target)] + need, self.net.free_cpu[target])

    def recovery_fits(self, work: int, route: tuple[int, ...], z: float) -> bool:
        """Eq. 4 for the failure of ``work`` after reserving ``z`` on every link of ``route``."""
        for e in route:
            load = (
                self.replication[e] - self.rep_of[e].get(work, 0.0) + self.rec_of[e].get(work, 0.0)
            )
            if not within(load + z, self.net.bandwidth[e]):
                return False
        return True

    def place(self, task: int, backup: int, redeploy: int, z: float | None) -> None:
        """Commit task ``task`` to ``(backup, redeploy, Z)``; the caller checked it fits."""
        net = self.net
        t = net.topology.tasks[task]
        work = net.task_server[task]
        route = net.replication_route(task, backup)
        assert route is not None
        for e in route:
            self.replication[e] += t.backup_rate
            self.rep_of[e][work] += t.backup_rate
        self.cpu[(work, redeploy)] += t.cpu
        if z is not None:
            rec_route = net.route(backup, redeploy)
            assert rec_route is not None
            for e in rec_route:
                self.rec_of[e][work] += z


def _by_hops(net: Network, task: int) -> list[list[int]]:
    """Servers other than the task's own, not leaving, its backup data reaches, grouped by
    hop count from the task's server ascending (the paper's "number of edges": where it is
    redeployed matters, however its backup data gets there), then those its server has no
    route to: backup data sent from another server (``replicas_from``) may still reach
    them, and a co-located backup and redeploy server needs no other route (dropped, a
    task on a server without links was never co-located; the exact solver did)."""
    work = net.task_server[task]
    layers: dict[int, list[int]] = defaultdict(list)
    apart = []
    for s in range(len(net.server_ids)):
        if s == work or not net.usable[s] or net.replication_route(task, s) is None:
            continue
        hops = net.hops(work, s)
        if hops is None:
            apart.append(s)
        else:
            layers[hops].append(s)
    return [layers[h] for h in sorted(layers)] + ([apart] if apart else [])


def _colocate(net: Network, state: _State, task: int, layers: list[list[int]]) -> int | None:
    """Phase 1 for one task: the co-located backup/redeploy server, or None."""
    t = net.topology.tasks[task]
    work = net.task_server[task]
    for layer in layers:
        fitting = []
        for s in layer:
            route = net.replication_route(task, s)
            assert route is not None
            if state.replication_fits(work, route, t.backup_rate):
                fitting.append((-state.residual(route), s))
        for _, s in sorted(fitting):
            if state.cpu_fits(work, s, t.cpu):
                return s
    return None


class _PairOrder:
    """Per backup server ``i``, the other servers ``j`` not leaving by ``Z(i, j)`` descending
    (cached)."""

    def __init__(self, net: Network) -> None:
        self.net = net
        self._lists: dict[int, list[tuple[float, int, int]]] = {}

    def of(self, i: int) -> list[tuple[float, int, int]]:
        got = self._lists.get(i)
        if got is None:
            net = self.net
            got = []
            for j in range(len(net.server_ids)):
                hops = net.hops(i, j)
                if j != i and hops is not None and net.usable[j]:
                    got.append((-net.bottleneck(i, j), hops, j))
            got.sort()
            self._lists[i] = got
        return got


def _remote(
    net: Network, state: _State, task: int, order: _PairOrder, shares: tuple[float, ...]
) -> tuple[Option | None, ConstraintKind]:
    """Phase 2 for one task: the remote option with the largest ``Z`` that fits now.

    Returns:
        The option, or None and the constraint that blocked the most promising pairs.
    """
    t = net.topology.tasks[task]
    work = net.task_server[task]
    backups = []
    for i in range(len(net.server_ids)):
        route = net.replication_route(task, i)
        if (i != work and net.usable[i] and route is not None
                and state.replication_fits(work, route, t.backup_rate)):  # fmt: skip
            backups.append(i)
    if not backups:
        return None, "replication_bandwidth"
    if not any(j != work and net.usable[j] and state.cpu_fits(work, j, t.cpu)
               for j in range(len(net.server_ids))):  # fmt: skip
        return None, "cpu"

    def meets(z: float) -> bool:
        # l_τ as the plan's check tests it (recovery time within the latency, relatively):
        # comparing Z with b/l_τ instead let a Z far below it pass under 1 Mb/s, where the
        # tolerance is absolute.
        return z > 0 and within(1000.0 * t.transfer_size / z, t.latency_ms)

    # k-way merge of the per-backup lists pops pairs by bottleneck descending, so the search
    # stops as soon as no remaining pair can beat the best Z found (branch and bound).
    heap: list[tuple[float, int, int, int, int, int]] = []
    for i in backups:
        lst = order.of(i)
        if lst:
            neg_z, hops, j = lst[0]
            # (A backup its data reaches from elsewhere may have no route from s_w(τ): last.)
            hops_wi = net.hops(work, i)
            if hops_wi is None:
                hops_wi = len(net.server_ids)
            heap.append((neg_z, hops, hops_wi, i, j, 0))
    heapq.heapify(heap)
    best: Option | None = None
    best_z = 0.0
    while heap:
        neg_z, hops, hops_wi, i, j, pos = heapq.heappop(heap)
        width = -neg_z
        if shares[0] * width <= best_z or not meets(shares[0] * width):
            break  # no remaining pair can get a larger Z, or any Z meeting l_τ
        lst = order.of(i)
        if pos + 1 < len(lst):
            nz, nh, nj = lst[pos + 1]
            heapq.heappush(heap, (nz, nh, hops_wi, i, nj, pos + 1))
        if j == work or not state.cpu_fits(work, j, t.cpu):
            continue
        rec_route = net.route(i, j)
        assert rec_route is not None
        for share in shares:
            z = share * width
            if z <= best_z or not meets(z):
                break
            if state.recovery_fits(work, rec_route, z):
                best, best_z = (i, j, z), z
                break
    if best is not None:
        return best, "latency"
    return None, _blocker(net, state, task, backups)


def _blocker(net: Network, state: _State, task: int, backups: list[int]) -> ConstraintKind:
    """Why phase 2 found nothing although backup and CPU candidates exist.

    If some pair of a usable backup server and a server with CPU left could meet ``l_τ``
    with its route's whole bottleneck, eq. 4 (what is left of it) is to blame; else latency.
    """
    t = net.topology.tasks[task]
    work = net.task_server[task]
    targets = [
        j
        for j in range(len(net.server_ids))
        if j != work and net.usable[j] and state.cpu_fits(work, j, t.cpu)
    ]
    for i in backups:
        for j in targets:
            if i != j and within(net.recovery_ms(task, i, j, net.bottleneck(i, j)), t.latency_ms):
                return "recovery_bandwidth"
    return "latency"


_WHY: dict[str, str] = {
    "replication_bandwidth": "every route its backup data could take to another server "
    "(from its primary, or from where its replicas come from) is already full of backup "
    "replication traffic",
    "cpu": "every server with CPU left when its primary fails is taken or unusable",
    "latency": "no remaining backup/redeploy pair recovers within its latency requirement",
    "recovery_bandwidth": "the recovery transfers of every remaining pair would overload a "
    "link when its primary fails (eq. 4)",
}


def solve_greedy(topology: Topology, *, shares: Sequence[float] = DEFAULT_SHARES) -> Plan:
    """Run the greedy sorting algorithm (Algorithm 1) on ``topology``.

    Args:
        topology: The instance.
        shares: The grid ``Z(τ)`` is chosen from (see :mod:`fogshift.planner.feasibility`).

    Returns:
        A feasible plan with ``method="greedy"`` and ``status="heuristic"``.

    Raises:
        InfeasiblePlan: ``proven=True`` if some task has no admissible pair at all (the
            instance is infeasible), ``proven=False`` if the greedy got stuck (an exact
            solve may still find a plan).
        ValueError: If ``shares`` is not a valid grid.
    """
    start = time.perf_counter()
    grid = normalise_shares(shares)
    net = topology.network()
    tasks = sorted(range(len(net.task_ids)), key=lambda k: topology.tasks[k].latency_ms)
    state = _State(net)
    chosen: dict[int, Option] = {}
    layers_of: dict[tuple[int, int], list[list[int]]] = {}
    left = []
    for task in tasks:
        # (Tasks of one server, their data sent from one server, share their layers.)
        where = (net.task_server[task], net.task_source[task])
        if where not in layers_of:
            layers_of[where] = _by_hops(net, task)
        s = _colocate(net, state, task, layers_of[where])
        if s is None:
            left.append(task)
        else:
            state.place(task, s, s, None)
            chosen[task] = (s, s, None)
    order = _PairOrder(net)
    for task in left:
        option, blocked = _remote(net, state, task, order, grid)
        if option is None:
            # A task with no admissible option on its own makes the instance infeasible:
            # say so (proven) rather than blame the greedy.
            err = explain_task(net, task)
            if err is not None:
                raise err
            t = topology.tasks[task]
            raise InfeasiblePlan(
                f"greedy could not place task {t.id} (on {t.server}): {_WHY[blocked]}",
                constraint=blocked,
                task_id=t.id,
                server_id=t.server,
                proven=False,
                hint="the greedy is not complete; method='exact' may still find a plan",
            )
        state.place(task, *option)
        chosen[task] = option
    assignments = tuple(
        Assignment(
            task=tid,
            backup=net.server_ids[chosen[k][0]],
            redeploy=net.server_ids[chosen[k][1]],
            recovery_bandwidth=chosen[k][2],
            recovery_ms=net.recovery_ms(k, *chosen[k]),
        )
        for k, tid in enumerate(net.task_ids)
    )
    return Plan(
        assignments=assignments,
        objective_ms=sum(a.recovery_ms for a in assignments),
        method="greedy",
        status="heuristic",
        solve_ms=(time.perf_counter() - start) * 1000.0,
    )
