"""A CLI command loads what it needs to talk to the orchestrator, not the services' stack."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

#: Loaded by a service or a solver, never needed to send a command: FastAPI (the services'
#: half is fogshift.common.service), HiGHS and numpy (the planner solves in the orchestrator),
#: Spark and pandas (the node agents).
HEAVY = ("fastapi", "starlette", "highspy", "numpy", "pyspark", "pandas", "pyarrow")


def test_the_cli_does_not_import_the_services_solvers_or_spark() -> None:
    probe = (
        "import json, sys\n"
        "import fogshift.cli.main\n"
        f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert json.loads(out.stdout) == [], out.stdout
