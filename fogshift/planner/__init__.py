"""Backup-location planner: where each task stores its backup and where it is redeployed.

Implements the model and algorithms of Iijima et al., "Deciding Backup Location Methods for
Distributed Stream Processing System": an exact MILP (HiGHS) and the paper's greedy sorting
algorithm. See docs/planner.md for the model and how the paper was read.

Example:
    >>> from fogshift.planner import Topology, plan
    >>> topo = Topology.from_dict({
    ...     "servers": [{"id": "s1", "cpu": 100}, {"id": "s2", "cpu": 100}],
    ...     "tasks": [{"id": "t1", "server": "s1", "cpu": 10, "latency_ms": 1000,
    ...                "backup_rate": 5, "transfer_size": 80}],
    ...     "links": [{"a": "s1", "b": "s2", "bandwidth": 100}],
    ... })
    >>> p = plan(topo, method="greedy")
    >>> (p.assignments[0].backup, p.assignments[0].redeploy, p.objective_ms)
    ('s2', 's2', 0.0)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

from fogshift.planner.exceptions import (
    InfeasiblePlan,
    InvalidTopology,
    PlannerError,
    SolverFailed,
)
from fogshift.planner.feasibility import DEFAULT_SHARES
from fogshift.planner.greedy import solve_greedy
from fogshift.planner.model import Assignment, Link, Plan, Server, Task, Topology

__all__ = [
    "DEFAULT_SHARES",
    "Assignment",
    "InfeasiblePlan",
    "InvalidTopology",
    "Link",
    "Plan",
    "PlannerError",
    "Server",
    "SolverFailed",
    "Task",
    "Topology",
    "plan",
]


def plan(
    topology: Topology,
    method: Literal["exact", "greedy"] = "exact",
    time_limit_s: float = 60.0,
    *,
    shares: Sequence[float] = DEFAULT_SHARES,
    warm_start: bool = True,
) -> Plan:
    """Decide backup and redeploy servers for every task of ``topology``.

    Args:
        topology: The instance.
        method: ``"exact"`` solves the MILP with HiGHS; ``"greedy"`` runs Algorithm 1.
        time_limit_s: Wall-clock limit of an exact solve (the greedy ignores it). On timeout
            the best plan found so far is returned with ``status="time_limit"``.
        shares: The grid the recovery bandwidth ``Z(τ)`` is chosen from, as shares of the
            bottleneck of the route from backup to redeploy server; both methods use it.
        warm_start: For ``"exact"``, run the greedy first and give its plan to HiGHS as the
            first incumbent; its time counts in ``solve_ms`` and against ``time_limit_s``.

    Returns:
        A plan satisfying every constraint (``plan.check(topology) == []``).

    Raises:
        InfeasiblePlan: If no plan exists (or, for the greedy, it found none); the message
            names the constraint.
        SolverFailed: If an exact solve ends with no plan (e.g. time limit, no incumbent).
        ValueError: If ``method``, ``time_limit_s`` or ``shares`` is invalid.
    """
    if method not in ("exact", "greedy"):
        raise ValueError(f"method must be 'exact' or 'greedy', not {method!r}")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, not {time_limit_s!r}")
    if method == "greedy":
        return solve_greedy(topology, shares=shares)
    start = time.perf_counter()
    initial: Plan | None = None
    if warm_start:
        try:
            initial = solve_greedy(topology, shares=shares)
        except InfeasiblePlan as exc:
            if exc.proven:
                raise
    remaining = time_limit_s - (time.perf_counter() - start)
    # Imported here: HiGHS and numpy take a tenth of a second to load, and most importers of
    # this package (every CLI command, through the orchestrator's topology) never solve.
    from fogshift.planner.milp import solve_exact

    result = solve_exact(
        topology, time_limit_s=max(remaining, 0.01), initial=initial, shares=shares
    )
    return result.model_copy(update={"solve_ms": (time.perf_counter() - start) * 1000.0})
