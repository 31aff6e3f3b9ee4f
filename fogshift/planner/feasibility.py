"""Recovery shares, per-task candidate options, and why a task has none.

Both solvers choose ``Z(τ)`` from a grid: a *share* ``φ`` of the bottleneck bandwidth of the
route from ``s_d(τ)`` to ``s_t(τ)`` (default 1, 1/2, 1/4, 1/8). The grid is what makes
``b(τ)/Z(τ)`` linear for the MILP; the greedy uses the same grid so both solve one problem.

An option ``(i, j, Z)`` is a candidate ``(s_d(τ), s_t(τ), Z(τ))`` for task ``τ`` when it
passes every constraint that can be checked for ``τ`` alone: eq. 5 (neither server is
``s_w(τ)``), the backup route from ``s_w(τ)`` (from ``Task.replicas_from`` if it names a
server) to ``i`` has ``U(e) >= d_τ^store`` on every link, ``j`` has ``c_τ`` free CPU, and,
unless ``i == j`` (then ``Z`` is None), a route joins ``i`` to ``j`` and ``b(τ)/Z`` meets
``l_τ``. Every plan on the grid uses candidate options only,
so a task without one proves the instance infeasible, whatever ``Z`` (the check uses the
largest share, and no ``Z`` can exceed the bottleneck).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fogshift.planner.exceptions import InfeasiblePlan
from fogshift.planner.model import Network, within

#: Default grid of recovery shares ``φ``: ``Z(τ) = φ x`` bottleneck of the recovery route.
DEFAULT_SHARES: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125)

#: A candidate ``(backup, redeploy, Z)``: server indices and ``Z(τ)`` (None if co-located).
Option = tuple[int, int, float | None]


def normalise_shares(shares: Iterable[float]) -> tuple[float, ...]:
    """Validate a share grid and return it sorted from largest to smallest, without repeats.

    Raises:
        ValueError: If the grid is empty or a share is not in ``(0, 1]``.
    """
    out = tuple(sorted({float(x) for x in shares}, reverse=True))
    if not out or not all(0.0 < x <= 1.0 for x in out):
        raise ValueError(f"recovery shares must be a non-empty set of numbers in (0, 1]: {out}")
    return out


def backup_candidates(net: Network, task: int) -> list[int]:
    """Servers other than ``s_w(τ)``, not leaving, whose replication route (from ``s_w(τ)``,
    or from :attr:`~fogshift.planner.model.Task.replicas_from`) has ``d_τ^store`` on every
    link."""
    work = net.task_server[task]
    return [
        i
        for i in range(len(net.server_ids))
        if i != work and net.usable[i] and net.replication_fits_links(task, i)
    ]


def redeploy_candidates(net: Network, task: int) -> list[int]:
    """Servers other than ``s_w(τ)``, not leaving, with at least ``c_τ`` free CPU."""
    work = net.task_server[task]
    need = net.topology.tasks[task].cpu
    return [
        j
        for j in range(len(net.server_ids))
        if j != work and net.usable[j] and within(need, net.free_cpu[j])
    ]


def candidate_options(
    net: Network, task: int, shares: tuple[float, ...] = DEFAULT_SHARES
) -> list[Option]:
    """Every ``(backup, redeploy, Z)`` option task ``task`` may use, checked on its own.

    Args:
        net: The instance.
        task: Task index.
        shares: The share grid, as returned by :func:`normalise_shares`.

    Returns:
        Co-located options first, then remote ones; each group in server order.
    """
    backups = backup_candidates(net, task)
    redeploys = redeploy_candidates(net, task)
    redeploy_set = set(redeploys)
    latency = net.topology.tasks[task].latency_ms
    options: list[Option] = [(i, i, None) for i in backups if i in redeploy_set]
    for i in backups:
        for j in redeploys:
            if i == j or net.route(i, j) is None:
                continue
            width = net.bottleneck(i, j)
            for share in shares:
                if within(net.recovery_ms(task, i, j, share * width), latency):
                    options.append((i, j, share * width))
    return options


def _has_pair(net: Network, task: int, backups: list[int], redeploys: list[int]) -> bool:
    """Whether some candidate pair exists, stopping at the first (cheaper than listing all)."""
    if set(backups) & set(redeploys):
        return True  # co-location needs no transfer, so it always meets the latency
    latency = net.topology.tasks[task].latency_ms
    return any(
        i != j and within(net.recovery_ms(task, i, j, net.bottleneck(i, j)), latency)
        for i in backups
        for j in redeploys
    )


def explain_task(net: Network, task: int) -> InfeasiblePlan | None:
    """Why task ``task`` has no candidate pair, or None if it has one.

    The returned error is ``proven``: no plan exists, whichever solver is used.
    """
    topo = net.topology
    t = topo.tasks[task]
    work = net.task_server[task]
    work_id = net.server_ids[work]
    others = [i for i in range(len(net.server_ids)) if i != work and net.usable[i]]
    if not others:
        leaving = [net.server_ids[i] for i in range(len(net.server_ids)) if not net.usable[i]]
        but = f" (leaving: {', '.join(leaving)})" if leaving else ""
        return InfeasiblePlan(
            f"task {t.id} has no server other than its primary {work_id}{but} to hold its "
            "backup or take it over",
            constraint="no_other_server",
            task_id=t.id,
            server_id=work_id,
            hint="add a server"
            + (
                ": one leaving (being removed, or its disk nearly full) takes neither"
                if leaving
                else ""
            ),
        )
    backups = backup_candidates(net, task)
    if not backups:
        source_id = t.replicas_from or work_id
        reachable = [i for i in others if net.replication_route(task, i) is not None]
        if reachable:
            best = max(reachable, key=lambda i: net.replication_width(task, i))
            received = (
                f"the widest route, {source_id} to {net.server_ids[best]}, has a "
                f"{net.replication_width(task, best):g} Mb/s bottleneck"
            )
        else:
            received = f"{source_id} has no route to any other server"
        sent = "" if source_id == work_id else f" (its replicas come from {source_id})"
        return InfeasiblePlan(
            f"no backup server for task {t.id} is reachable from its primary {work_id}{sent} "
            f"with {t.backup_rate:g} Mb/s of backup bandwidth on every link",
            constraint="replication_bandwidth",
            task_id=t.id,
            server_id=work_id,
            expected=f"a route from {source_id} with at least {t.backup_rate:g} Mb/s on each link",
            received=received,
            hint=f"add bandwidth or links at {source_id}, or lower the task's backup_rate",
        )
    redeploys = redeploy_candidates(net, task)
    if not redeploys:
        best = max(others, key=lambda j: net.free_cpu[j])
        return InfeasiblePlan(
            f"task {t.id} needs {t.cpu:g} CPU but no server other than its primary {work_id} "
            f"has {t.cpu:g} free when {work_id} fails",
            constraint="cpu",
            task_id=t.id,
            server_id=work_id,
            expected=f"a server other than {work_id} with {t.cpu:g} free CPU",
            received=f"the most free CPU is {net.free_cpu[best]:g} on {net.server_ids[best]}",
            hint="add CPU capacity or lower the load of another server",
        )
    if _has_pair(net, task, backups, redeploys):
        return None
    # Both sets are non-empty but disjoint, and every remote pair is too slow or unroutable.
    fastest: tuple[float, int, int] | None = None
    for i in backups:
        for j in redeploys:
            ms = net.recovery_ms(task, i, j, net.bottleneck(i, j))
            if fastest is None or ms < fastest[0]:
                fastest = (ms, i, j)
    assert fastest is not None
    ms, i, j = fastest
    if math.isinf(ms):
        received = "no route joins any backup candidate to any redeploy candidate"
    else:
        received = (
            f"the fastest is backup on {net.server_ids[i]}, redeploy on {net.server_ids[j]}: "
            f"{t.transfer_size:g} Mb over a {net.bottleneck(i, j):g} Mb/s bottleneck takes "
            f"{ms:g} ms even with the whole bottleneck"
        )
    names = ", ".join
    return InfeasiblePlan(
        f"no backup/redeploy pair for task {t.id} recovers within its latency requirement "
        f"{t.latency_ms:g} ms: no server both is reachable for its backup "
        f"({names(net.server_ids[i] for i in backups)}) and has {t.cpu:g} free CPU "
        f"({names(net.server_ids[j] for j in redeploys)}), and no remote recovery is fast enough",
        constraint="latency",
        task_id=t.id,
        server_id=work_id,
        expected=f"a recovery transfer of at most {t.latency_ms:g} ms",
        received=received,
        hint="raise latency_ms, lower transfer_size, or add bandwidth between those servers",
    )


def check_tasks(net: Network) -> None:
    """Raise the first per-task infeasibility, in topology order.

    Raises:
        InfeasiblePlan: If some task has no candidate pair (``proven=True``).
    """
    for task in range(len(net.task_ids)):
        err = explain_task(net, task)
        if err is not None:
            raise err
