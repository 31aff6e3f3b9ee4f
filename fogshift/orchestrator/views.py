"""Response models of the orchestrator's read-only views that the CLI parses too.

They live with every other contract in :mod:`fogshift.contracts` (which the CLI reads without
importing the server: FastAPI, Spark); this module keeps the old import path.
"""

from __future__ import annotations

from fogshift.contracts import OperationView

__all__ = ["OperationView"]
