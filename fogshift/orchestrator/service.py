"""What the orchestrator does: deploy, stop, report, and keep the cluster as specified.

One class, :class:`Orchestrator`, built from one module per responsibility, each adding to
the one before: ``core`` (state, node directory) → ``replanning`` (the planning loop) →
``replication`` (central checkpoints and replicas) → ``journal`` (operations journal,
exclusivity) → ``deployment`` (deploy, stop, status) → ``coordination`` (migration and
restore) → ``reconciler`` (recovery of unfinished operations, the reconcile loop) →
``history`` (trimming the streams' old records).
"""

from __future__ import annotations

from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.history import History
from fogshift.spec.models import PipelineSpec

__all__ = ["Orchestrator", "OrchestratorConfig", "PipelineSpec"]


class Orchestrator(History):
    """The central controller. Thread-safe; one instance per orchestrator process."""
