"""The exact planner: the paper's eq. 3-5 plus CheckCPU as a MILP solved by HiGHS.

Formulation (see docs/planner.md):

* ``z[τ,i,j,Z]`` binary: task ``τ`` stores its backup on ``i``, is redeployed to ``j`` and
  reserves ``Z`` for the recovery transfer (``Z`` from the share grid of
  :mod:`fogshift.planner.feasibility`; none when ``i == j``). Only the candidate options of
  :func:`~fogshift.planner.feasibility.candidate_options` get a column, which already
  enforces eq. 5, the latency requirement and the single-task bounds. Merging the paper's
  ``x(τ,i)``, ``y(τ,j)`` and ``Z(τ)`` into one variable makes ``b(τ)/Z(τ)`` linear.
* Objective (eq. 3): ``min Σ z[τ,i,j,Z] · 1000 b(τ)/Z`` (0 when ``i == j``), in ms.
* Assignment: ``Σ z[τ,·,·,·] = 1`` for every task.
* ``r[e]`` continuous in ``[0, U(e)]``: steady-state replication load
  ``Σ d_τ^store z`` over the pairs whose route ``s_w(τ) -> i`` uses ``e`` (from
  ``Task.replicas_from`` instead, if it names a server: fogshift's central store).
* CheckCPU, for every failing server ``f`` and other server ``k``:
  ``Σ_{τ on f, pairs (i,k)} c_τ z <= free CPU of k``.
* Eq. 4, for every failing server ``f`` and link ``e``:
  ``r[e] - (replication of f's tasks on e) + Σ_{τ on f, i != j, e on route i->j} Z z
  <= U(e)``.

The optimum is exact for ``Z`` on the share grid; with ``Z`` free in ``(0, bottleneck]`` the
objective ``b/Z`` is not linear and HiGHS cannot solve it exactly.

Rows that cannot bind (a CPU row whose worst case fits, a link no recovery of ``f`` can use)
are left out; they are implied by the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import highspy
import numpy as np

from fogshift.exceptions import InvariantViolation
from fogshift.planner.exceptions import InfeasiblePlan, SolverFailed
from fogshift.planner.feasibility import (
    DEFAULT_SHARES,
    Option,
    candidate_options,
    explain_task,
    normalise_shares,
)
from fogshift.planner.model import TOLERANCE, Assignment, Network, Plan, Topology, violations

_Group = tuple[Literal["replication", "cpu", "recovery_bandwidth"], int]


@dataclass
class _Milp:
    """The MILP in row-wise sparse form plus what is needed to read a solution back."""

    net: Network
    columns: list[tuple[int, Option]] = field(default_factory=list)  # (task, (i, j, Z))
    cost: list[float] = field(default_factory=list)
    rows: list[dict[int, float]] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    groups: dict[_Group, list[int]] = field(default_factory=dict)
    link_col0: int = 0  # r[e] is column link_col0 + e

    def add_row(
        self, coefs: dict[int, float], lower: float, upper: float, group: _Group | None = None
    ) -> None:
        if group is not None:
            self.groups.setdefault(group, []).append(len(self.rows))
        self.rows.append(coefs)
        self.row_lower.append(lower)
        self.row_upper.append(upper)


def _build(net: Network, options: Sequence[Sequence[Option]]) -> _Milp:
    topo = net.topology
    m = _Milp(net)
    n_links = len(net.bandwidth)
    cols_of: list[list[int]] = []
    for task, task_options in enumerate(options):
        cols = []
        for option in task_options:
            cols.append(len(m.columns))
            m.columns.append((task, option))
            m.cost.append(net.recovery_ms(task, *option))
        cols_of.append(cols)
    m.link_col0 = len(m.columns)

    for task in range(len(options)):
        m.add_row({c: 1.0 for c in cols_of[task]}, 1.0, 1.0)

    replication: list[dict[int, float]] = [{m.link_col0 + e: 1.0} for e in range(n_links)]
    recovery: dict[tuple[int, int], dict[int, float]] = {}
    for col, (task, (i, j, z)) in enumerate(m.columns):
        t = topo.tasks[task]
        work = net.task_server[task]
        route = net.replication_route(task, i)
        assert route is not None  # candidate options have routes
        if t.backup_rate > 0:
            for e in route:
                replication[e][col] = -t.backup_rate
        if z is not None:
            rec_route = net.route(i, j)
            assert rec_route is not None
            for e in rec_route:
                recovery.setdefault((work, e), {})[col] = z
    for e in range(n_links):
        m.add_row(replication[e], 0.0, 0.0)

    for f, tasks in enumerate(net.tasks_on):
        per_target: dict[int, dict[int, float]] = {}
        for task in tasks:
            need = topo.tasks[task].cpu
            if need <= 0:
                continue
            for col in cols_of[task]:
                per_target.setdefault(m.columns[col][1][1], {})[col] = need
        for k, coefs in sorted(per_target.items()):
            worst = sum({m.columns[c][0]: v for c, v in coefs.items()}.values())
            if worst > _slack(net.free_cpu[k]):
                m.add_row(coefs, -math.inf, _slack(net.free_cpu[k]), ("cpu", f))

    # The replication of f's own tasks stops when f fails, so it leaves eq. 4 for f; only
    # links that some recovery of f can use get a row (the rest is implied by r[e] <= U(e)).
    for col, (task, (i, _, _)) in enumerate(m.columns):
        rate = topo.tasks[task].backup_rate
        work = net.task_server[task]
        route = net.replication_route(task, i)
        if rate <= 0 or route is None:
            continue
        for e in route:
            row = recovery.get((work, e))
            if row is not None:
                row[col] = row.get(col, 0.0) - rate
    for (f, e), coefs in sorted(recovery.items()):
        coefs[m.link_col0 + e] = 1.0
        m.add_row(coefs, -math.inf, _slack(net.bandwidth[e]), ("recovery_bandwidth", f))
    return m


def _slack(capacity: float) -> float:
    """A capacity as the plan's check reads it (:func:`~fogshift.planner.model.within`): the
    greedy and the check allow float sums that much over, and an exact solver held to the
    bare capacity found a worse plan than the greedy's, or called a feasible task
    infeasible."""
    return capacity + TOLERANCE * max(1.0, abs(capacity))


def _to_highs(m: _Milp, time_limit_s: float) -> highspy.Highs:
    n_cols = m.link_col0 + len(m.net.bandwidth)
    starts = [0]
    index: list[int] = []
    value: list[float] = []
    for row in m.rows:
        for col, coef in sorted(row.items()):
            index.append(col)
            value.append(coef)
        starts.append(len(index))
    cost = m.cost + [0.0] * len(m.net.bandwidth)
    lower = [0.0] * n_cols
    upper = [1.0] * m.link_col0 + [_slack(u) for u in m.net.bandwidth]
    integrality = [1] * m.link_col0 + [0] * len(m.net.bandwidth)
    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    # Tight tolerances: the solution is re-checked against the raw data afterwards, and a
    # binary at 1 - 1e-6 times a Z of 1000 Mb/s would otherwise hide a 1e-3 overload.
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.setOptionValue("mip_abs_gap", 1e-6)
    h.setOptionValue("time_limit", max(time_limit_s, 0.01))
    status = h.passModel(
        n_cols,
        len(m.rows),
        len(index),
        2,  # row-wise matrix
        1,  # minimise
        0.0,
        np.asarray(cost, dtype=np.float64),
        np.asarray(lower, dtype=np.float64),
        np.asarray(upper, dtype=np.float64),
        np.asarray([max(v, -inf) for v in m.row_lower], dtype=np.float64),
        np.asarray([min(v, inf) for v in m.row_upper], dtype=np.float64),
        np.asarray(starts[:-1], dtype=np.int32),
        np.asarray(index, dtype=np.int32),
        np.asarray(value, dtype=np.float64),
        np.asarray(integrality, dtype=np.int32),
    )
    if status == highspy.HighsStatus.kError:
        raise SolverFailed("HiGHS rejected the planner's MILP")
    return h


def _warm_start(h: highspy.Highs, m: _Milp, initial: Plan) -> None:
    """Hand a known plan (normally the greedy's) to HiGHS as its first incumbent."""
    net = m.net
    wanted = {
        net.task_index[a.task]: (
            net.server_index[a.backup],
            net.server_index[a.redeploy],
            a.recovery_bandwidth,
        )
        for a in initial.assignments
        if a.task in net.task_index
        and a.backup in net.server_index
        and a.redeploy in net.server_index
    }
    values = [0.0] * (m.link_col0 + len(net.bandwidth))
    hits = 0
    for col, (task, option) in enumerate(m.columns):
        if wanted.get(task) == option:
            values[col] = 1.0
            hits += 1
    if hits != len(net.task_ids):
        return  # not a plan of this topology; solve cold rather than guess
    for e in range(len(net.bandwidth)):
        row = m.rows[len(net.task_ids) + e]
        values[m.link_col0 + e] = -sum(
            coef * values[col] for col, coef in row.items() if col != m.link_col0 + e
        )
    h.setSolution(
        len(values), np.arange(len(values), dtype=np.int32), np.asarray(values, dtype=np.float64)
    )


def _describe(m: _Milp, groups: list[_Group]) -> InfeasiblePlan:
    """Turn the conflicting constraint groups the filter kept into one readable error."""
    net = m.net
    topo = net.topology
    parts: list[str] = []
    for kind, f in groups:
        if kind == "replication":
            parts.append("the steady-state backup replication bandwidth of the links")
        elif kind == "cpu":
            parts.append(f"free CPU when {net.server_ids[f]} fails (CheckCPU)")
        else:
            parts.append(
                f"link bandwidth for recovery transfers plus replication when "
                f"{net.server_ids[f]} fails (eq. 4)"
            )
    if len(groups) == 1:
        kind, f = groups[0]
        if kind == "cpu":
            tasks = net.tasks_on[f]
            needs = ", ".join(f"{topo.tasks[k].id} {topo.tasks[k].cpu:g}" for k in tasks)
            free = ", ".join(
                f"{sid} {net.free_cpu[j]:g}"
                for j, sid in enumerate(net.server_ids)
                if j != f and net.usable[j]  # (one leaving takes none)
            )
            return InfeasiblePlan(
                f"when {net.server_ids[f]} fails, its tasks cannot all be redeployed: their "
                f"CPU needs ({needs}) do not fit the free CPU of the servers they may use",
                constraint="cpu",
                server_id=net.server_ids[f],
                expected=f"room for {sum(topo.tasks[k].cpu for k in tasks):g} CPU in total",
                received=f"free CPU: {free}",
                hint="add CPU capacity, or move a task off " + net.server_ids[f],
            )
        if kind == "replication":
            return InfeasiblePlan(
                "the links cannot carry the backup replication traffic (d_τ^store) of all "
                "tasks at once, whichever backup servers are chosen",
                constraint="replication_bandwidth",
                hint="add link bandwidth or lower backup_rate of some tasks",
            )
        return InfeasiblePlan(
            f"when {net.server_ids[f]} fails, no choice of backup and redeploy servers fits "
            "every recovery transfer (at a bandwidth from the share grid) next to the ongoing "
            "replication traffic on the links (eq. 4)",
            constraint="recovery_bandwidth",
            server_id=net.server_ids[f],
            hint="add link bandwidth or CPU so more tasks can recover where their backup is",
        )
    return InfeasiblePlan(
        "no plan meets these constraints together: " + "; ".join(parts),
        constraint="combination",
        hint="relax any one of them (bandwidth, CPU capacity, task needs)",
    )


def _explain_infeasible(h: highspy.Highs, m: _Milp, budget_s: float) -> InfeasiblePlan:
    """Deletion filter over constraint groups: drop every group the infeasibility survives.

    What remains is a set of groups that is infeasible on its own and, when every sub-solve
    was conclusive, minimal. A sub-solve that runs out of time counts as "feasible", which
    keeps the group: the answer may then be larger than minimal but is still infeasible.
    """
    deadline = time.perf_counter() + budget_s
    n_cols = m.link_col0 + len(m.net.bandwidth)
    h.changeColsCost(n_cols, np.arange(n_cols, dtype=np.int32), np.zeros(n_cols, dtype=np.float64))
    inf = highspy.kHighsInf

    def set_group(group: _Group, on: bool) -> None:
        if group[0] == "replication":
            cols = np.arange(m.link_col0, n_cols, dtype=np.int32)
            upper = np.asarray(m.net.bandwidth if on else [inf] * len(cols), dtype=np.float64)
            h.changeColsBounds(len(cols), cols, np.zeros(len(cols), dtype=np.float64), upper)
            return
        for r in m.groups[group]:
            h.changeRowBounds(r, -inf, m.row_upper[r] if on else inf)

    order: list[_Group] = sorted(
        m.groups, key=lambda g: ({"recovery_bandwidth": 0, "cpu": 1}.get(g[0], 2), g[1])
    )
    order.append(("replication", -1))
    kept: list[_Group] = []
    for group in order:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            kept.append(group)
            continue
        set_group(group, on=False)
        h.setOptionValue("time_limit", remaining)
        h.clearSolver()
        h.run()
        if h.getModelStatus() in (
            highspy.HighsModelStatus.kInfeasible,
            highspy.HighsModelStatus.kUnboundedOrInfeasible,
        ):
            continue  # still infeasible without it: not needed for the conflict
        set_group(group, on=True)
        kept.append(group)
    return _describe(m, kept)


def solve_exact(
    topology: Topology,
    *,
    time_limit_s: float = 60.0,
    initial: Plan | None = None,
    shares: Sequence[float] = DEFAULT_SHARES,
) -> Plan:
    """Solve the planner's MILP with HiGHS.

    Args:
        topology: The instance.
        shares: The grid ``Z(τ)`` is chosen from, as shares of the recovery route's
            bottleneck (see :mod:`fogshift.planner.feasibility`).
        time_limit_s: Wall-clock limit for the solve. If it runs out, the best plan found is
            returned with ``status="time_limit"`` and the solver's bound in ``bound_ms``.
            Explaining an infeasible instance uses what is left of it (at least 1 s more).
        initial: A plan to start from (normally the greedy's); ignored if it does not fit.

    Returns:
        A plan with ``method="exact"`` and ``status`` ``"optimal"`` or ``"time_limit"``.

    Raises:
        InfeasiblePlan: If no plan exists (with ``Z`` on the grid); the message names the
            constraint(s).
        SolverFailed: If the time limit passes before any plan is found, or HiGHS fails.
        ValueError: If ``shares`` is not a valid grid.
    """
    start = time.perf_counter()
    grid = normalise_shares(shares)
    net = topology.network()
    options: list[list[Option]] = []
    for task in range(len(net.task_ids)):
        task_options = candidate_options(net, task, grid)
        if not task_options:
            # explain_task judges a pair by its whole bottleneck: with a grid below 1.0 a
            # pair it finds can still miss the latency at every share of the grid.
            raise explain_task(net, task) or InfeasiblePlan(
                f"task {net.task_ids[task]} has no backup and redeploy pair whose recovery "
                f"meets its latency at a share of the grid {list(grid)}",
                constraint="latency",
                task_id=net.task_ids[task],
                expected="a recovery bandwidth Z on the grid that meets the latency",
                received=f"shares {list(grid)} of each pair's bottleneck",
                hint="add 1.0 (the whole bottleneck) to the shares, or relax the latency",
            )
        options.append(task_options)
    if not options:
        return Plan(
            assignments=(),
            objective_ms=0.0,
            method="exact",
            status="optimal",
            solve_ms=(time.perf_counter() - start) * 1000.0,
            bound_ms=0.0,
        )
    # Each task alone cannot do better than its cheapest option: if the initial plan reaches
    # that bound it is optimal, and HiGHS' presolve (seconds on big models) can be skipped.
    bound = sum(min(net.recovery_ms(k, *o) for o in opts) for k, opts in enumerate(options))
    if (
        initial is not None
        and initial.objective_ms <= bound + 1e-9 * max(1.0, bound)
        and not initial.check(topology)
    ):
        return Plan(
            assignments=initial.assignments,
            objective_ms=initial.objective_ms,
            method="exact",
            status="optimal",
            solve_ms=(time.perf_counter() - start) * 1000.0,
            bound_ms=bound,
        )
    m = _build(net, options)
    h = _to_highs(m, time_limit_s - (time.perf_counter() - start))
    if initial is not None:
        _warm_start(h, m, initial)
    h.run()
    model_status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    if model_status in (
        highspy.HighsModelStatus.kInfeasible,
        highspy.HighsModelStatus.kUnboundedOrInfeasible,
    ):
        budget = max(time_limit_s - (time.perf_counter() - start), 1.0)
        raise _explain_infeasible(h, m, budget)
    if model_status == highspy.HighsModelStatus.kOptimal:
        status: Literal["optimal", "time_limit"] = "optimal"
    elif model_status == highspy.HighsModelStatus.kTimeLimit and has_solution:
        status = "time_limit"
    elif model_status == highspy.HighsModelStatus.kTimeLimit:
        raise SolverFailed(
            f"HiGHS found no plan within the time limit of {time_limit_s:g} s",
            hint="raise time_limit_s, or use method='greedy'",
        )
    else:
        raise SolverFailed(f"HiGHS stopped with status {h.modelStatusToString(model_status)}")

    values = h.getSolution().col_value
    chosen: dict[int, Option] = {}
    for col, (task, option) in enumerate(m.columns):
        if values[col] > 0.5:
            chosen[task] = option
    assignments = []
    for task, tid in enumerate(net.task_ids):
        i, j, z = chosen[task]
        assignments.append(
            Assignment(
                task=tid,
                backup=net.server_ids[i],
                redeploy=net.server_ids[j],
                recovery_bandwidth=z,
                recovery_ms=net.recovery_ms(task, i, j, z),
            )
        )
    problems = violations(
        net, {a.task: (a.backup, a.redeploy, a.recovery_bandwidth) for a in assignments}
    )
    if problems:
        raise InvariantViolation(
            "HiGHS returned a plan that violates the planner's constraints: "
            + "; ".join(problems[:5])
        )
    dual = info.mip_dual_bound
    return Plan(
        assignments=tuple(assignments),
        objective_ms=sum(a.recovery_ms for a in assignments),
        method="exact",
        status=status,
        solve_ms=(time.perf_counter() - start) * 1000.0,
        bound_ms=max(0.0, dual) if math.isfinite(dual) else None,
    )
