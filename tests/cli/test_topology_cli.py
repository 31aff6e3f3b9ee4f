"""`fogshift topology show`'s rendering of the orchestrator's typed plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fogshift.cli.topology import _show
from fogshift.contracts import Assignment, PlannedServer, PlanView

PLAN = PlanView(
    method="exact",
    status="optimal",
    solve_ms=12.0,
    servers=[PlannedServer(node="fog-a", cpu=100, load=40)],
    assignments={
        "p/agg": Assignment(backup="fog-b", redeploy="fog-c", recovery_ms=250.5),
        "p/sink": Assignment(),  # not placeable yet: nothing planned
    },
)


def test_the_table_names_each_pe_its_nodes_and_the_servers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _show(PLAN, as_json=False)
    out = capsys.readouterr().out
    assert "p/agg" in out and "fog-b" in out and "250.5" in out
    assert "p/sink" in out  # a PE without a plan is listed, not a crash
    assert "exact plan (optimal, 12 ms)" in out and "fog-a 40/100" in out


def test_names_no_node_has_are_told(capsys: pytest.CaptureFixture[str]) -> None:
    _show(PLAN.model_copy(update={"unknown_nodes": ["fog_a", "hub"]}), as_json=False)
    out = " ".join(capsys.readouterr().out.split())
    assert "no node of the cluster is named fog_a, hub" in out
    _show(PLAN, as_json=False)
    assert "no node of the cluster" not in capsys.readouterr().out
    # A PE the last round could not plan (the others were planned) is said with why.
    _show(PLAN.model_copy(update={"unplanned": {"p/agg": "no backup server"}}), as_json=False)
    assert "p/agg keeps its previous plan: no backup server" in capsys.readouterr().out
    # (One that had none was said to keep it.)
    _show(PLAN.model_copy(update={"unplanned": {"p/new": "no backup server"}}), as_json=False)
    assert "p/new has no plan: no backup server" in capsys.readouterr().out
    _show(PlanView(method="exact", status="optimal"), as_json=False)
    assert "no running PE to plan for" in capsys.readouterr().out
    _show(PLAN.model_copy(update={"unlinked_nodes": ["fog-c"]}), as_json=False)
    assert "its links name no link of fog-c" in " ".join(capsys.readouterr().out.split())
    _show(PLAN.model_copy(update={"low_disk_nodes": ["fog-b"]}), as_json=False)
    out = " ".join(capsys.readouterr().out.split())
    assert "the disk of fog-b is nearly full" in out and "no redeployed PE there" in out


def test_json_is_the_plan_as_the_orchestrator_sent_it(capsys: pytest.CaptureFixture[str]) -> None:
    _show(PLAN, as_json=True)
    assert PlanView.model_validate(json.loads(capsys.readouterr().out)) == PLAN


def test_topology_commands_take_the_home_from_fogshift_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As every other command does (they looked in ./.fogshift instead).
    from typer.testing import CliRunner

    from fogshift.cli.main import app
    from fogshift.supervisor.exceptions import NotUp

    monkeypatch.setenv("FOGSHIFT_HOME", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["topology", "show"])
    assert isinstance(result.exception, NotUp), result.output
    assert str(tmp_path / "elsewhere") in result.exception.message
