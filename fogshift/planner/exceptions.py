"""Errors raised by the backup-location planner.

Every planner error is a :class:`PlannerError`, so callers can catch the whole family, and
also a subclass of the matching :mod:`fogshift.exceptions` class, so the REST layer maps it
to the right HTTP status without knowing about the planner.
"""

from __future__ import annotations

from typing import Literal

from fogshift.exceptions import FogshiftError, InvalidInput

#: The constraint families an :class:`InfeasiblePlan` can blame. ``"combination"`` means no
#: single family is impossible on its own but they cannot all hold at once.
ConstraintKind = Literal[
    "no_other_server",
    "replication_bandwidth",
    "cpu",
    "latency",
    "recovery_bandwidth",
    "combination",
]


class PlannerError(FogshiftError):
    """Base class of every error the planner raises on purpose."""

    code = "planner_error"
    http_status = 500


class InvalidTopology(PlannerError, InvalidInput):
    """A topology (servers, tasks, links) that fails validation.

    The message names the offending field as a path such as ``tasks[2].cpu``.
    """

    code = "invalid_topology"
    http_status = 422


class InfeasiblePlan(PlannerError, InvalidInput):
    """No backup/redeploy assignment satisfies the constraints (or the greedy found none).

    Args:
        message: Which constraint cannot be met and for which task or failure, in words.
        constraint: The constraint family to blame (see :data:`ConstraintKind`).
        task_id: The task the message is about, if the failure is about one task.
        server_id: The failing server of the scenario concerned, if any.
        proven: True when the instance is proven infeasible; False when only the greedy
            heuristic gave up (an exact solve may still succeed).
        expected: What a feasible instance would need.
        received: What the instance offers instead.
        hint: What the user can change.
    """

    code = "infeasible_plan"
    http_status = 422

    def __init__(
        self,
        message: str,
        *,
        constraint: ConstraintKind,
        task_id: str | None = None,
        server_id: str | None = None,
        proven: bool = True,
        expected: str | None = None,
        received: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.constraint: ConstraintKind = constraint
        self.task_id = task_id
        self.server_id = server_id
        self.proven = proven
        super().__init__(message, expected=expected, received=received, hint=hint)


class SolverFailed(PlannerError):
    """The MILP solver stopped without a usable answer (time limit with no plan, solver error)."""

    code = "solver_failed"
    http_status = 503
