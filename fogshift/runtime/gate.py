"""The runs of a PE's query, beside the gate of its input.

The gate itself — how a query's input is held or capped at a batch boundary — is
:mod:`fogshift.common.gate`.
Beside the gate, ``<gate>.run`` names the query's current *run* (:func:`start_run`, written
at each start of the query; removed by :func:`end_run` when the agent stops it). The Python
workers keeping the PE's processor follow both files for its lifecycle hooks
(:mod:`fogshift.runtime.instances`): ``on_pause``/``on_resume`` on the gate, ``on_revoke`` on
the end of the run.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["current_run", "end_run", "run_path", "start_run"]


def run_path(gate: str | Path) -> Path:
    """The file naming the current run of the query behind ``gate``."""
    return Path(f"{gate}.run")


def start_run(gate: str | Path) -> str:
    """Record that the query behind ``gate`` starts a new run; return its token.

    Processors kept in Python workers belong to one run: one whose token is no longer the
    current one is closed, and one whose run file is gone (:func:`end_run`) is revoked.
    """
    token = uuid.uuid4().hex
    target = run_path(gate)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{target}.{os.getpid()}.tmp")
    tmp.write_text(token)
    tmp.replace(target)
    return token


def end_run(gate: str | Path) -> None:
    """Record that the query behind ``gate`` was stopped: the PE leaves the node or stops."""
    run_path(gate).unlink(missing_ok=True)


def current_run(gate: str | Path) -> str | None:
    """The token of the current run of the query behind ``gate`` (``None``: stopped)."""
    try:
        return run_path(gate).read_text() or None
    except FileNotFoundError:
        return None
