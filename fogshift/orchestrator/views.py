"""Response models of the orchestrator's read-only views that the CLI parses too.

Kept apart from :mod:`fogshift.orchestrator.app` so that the CLI can read them without
importing the server (FastAPI, Spark).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class OperationView(BaseModel):
    """Body of ``GET /pipelines/{name}/elements/{element}/operation``: the PE's latest
    migration or restore (restore attempt) as the operations journal last recorded it.

    Attributes:
        id: The journal entry's id.
        kind: ``migration`` or ``restore``.
        pipeline: The pipeline.
        element: The PE.
        origin: Where the PE was placed when the operation began.
        target: Where the operation moves it.
        epoch: The epoch the target instance writes under.
        phase: The last phase entered (journaled before its side effect), e.g. ``pausing``.
        started: When it began (orchestrator's clock, seconds since the epoch).
        updated: When the journal entry last changed.
        outcome: ``None`` while it runs; then how it ended (``migrated``, ``restored``,
            ``rolled_back``, ``failed``, ``recovered: ...``).
        running: ``outcome is None``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: Literal["migration", "restore"]
    pipeline: str
    element: str
    origin: str
    target: str
    epoch: int
    phase: str
    started: float
    updated: float
    outcome: str | None
    running: bool
