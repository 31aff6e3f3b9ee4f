"""`fogshift plan` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, fogshift

EXAMPLE = ROOT / "examples" / "planner" / "small.yaml"


def test_plan_prints_an_assignment_that_satisfies_the_constraints() -> None:
    from fogshift.planner import Plan, Topology

    for flag in ("--exact", "--greedy"):
        result = fogshift("plan", str(EXAMPLE), flag, "--json")
        plan = Plan.model_validate(json.loads(result.stdout))
        assert plan.check(Topology.from_yaml(EXAMPLE)) == []
        assert {a.task for a in plan.assignments} == {"t1", "t2"}
        assert all(a.backup != "s1" and a.redeploy != "s1" for a in plan.assignments)
    # As a table: a backup on the redeploy server is read in place, not "0.0 ms" of transfer.
    table = fogshift("plan", str(EXAMPLE), "--greedy").stdout
    for a in plan.assignments:
        row = next(line for line in table.splitlines() if f" {a.task} " in line)
        transfer = "none (backup on it)" if a.backup == a.redeploy else f"{a.recovery_ms:.1f}"
        assert transfer in row, table
    assert "state transfers" in " ".join(table.split())


def test_infeasible_topology_names_the_constraint(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("{id: s2, cpu: 60}", "{id: s2, cpu: 10}")
    text = text.replace("{id: s3, cpu: 40}", "{id: s3, cpu: 10}")
    (tmp_path / "tight.yaml").write_text(text)
    result = fogshift("plan", str(tmp_path / "tight.yaml"), check=False)
    assert result.returncode == 2
    assert "s1" in result.stderr and "cpu" in result.stderr.lower()


def test_a_time_limit_that_is_no_time_is_refused_without_a_traceback() -> None:
    for limit in ("0", "-1", "nan"):
        result = fogshift("plan", str(EXAMPLE), "--time-limit", limit, check=False)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert "above 0" in result.stderr and f"received: {limit}" in result.stderr.lower()
