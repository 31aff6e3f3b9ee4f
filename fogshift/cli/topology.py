"""``fogshift topology ...``: the fog topology the orchestrator plans with, and its live plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fogshift.cli.net import Home
from fogshift.cli.output import make_console
from fogshift.contracts import PlanView
from fogshift.orchestrator.planning import FogTopology
from fogshift.supervisor import cluster as cluster_ops

topology_app = typer.Typer(
    help="The fog topology (node CPU, link bandwidths) and the live backup/redeploy plan.",
    no_args_is_help=True,
)
console = make_console()

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _show(plan: PlanView, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(plan.model_dump_json(indent=2) + "\n")
        return
    if plan.error:
        console.print(f"[yellow]planner[/]: {plan.error}")
    if plan.unknown_nodes:
        console.print(
            f"[yellow]topology[/]: no node of the cluster is named {', '.join(plan.unknown_nodes)}"
            " (a typo, or a node not started yet): left out of the plan until one registers"
        )
    if plan.unlinked_nodes:
        console.print(
            f"[yellow]topology[/]: its links name no link of {', '.join(plan.unlinked_nodes)}"
            ": no backup reaches it and no PE is redeployed there (add its links)"
        )
    if plan.low_disk_nodes:
        console.print(
            f"[yellow]planner[/]: the disk of {', '.join(plan.low_disk_nodes)} is nearly full "
            "(`fogshift nodes` says how full): the plan puts no backup and no redeployed PE there"
        )
    for key, why in sorted(plan.unplanned.items()):
        # (It said "keeps its previous plan" of a PE that had none.)
        kept = "keeps its previous plan" if key in plan.assignments else "has no plan"
        console.print(f"[yellow]planner[/]: {key} {kept}: {why}")
    if not plan.assignments and not plan.unplanned and not plan.error:
        # (An empty table, no plan line: nothing said there was nothing to plan.)
        console.print("no running PE to plan for (`fogshift deploy SPEC` starts a pipeline)")
    else:
        table = Table("PE", "backup", "redeploy", "recovery ms")
        for key, choice in sorted(plan.assignments.items()):
            recovery = "-" if choice.recovery_ms is None else f"{choice.recovery_ms:.1f}"
            table.add_row(key, choice.backup or "-", choice.redeploy or "-", recovery)
        console.print(table)
    servers = ", ".join(f"{s.node} {s.load:.0f}/{s.cpu:.0f}" for s in plan.servers)
    if servers:
        solve = "" if plan.solve_ms is None else f", {plan.solve_ms:.0f} ms"
        console.print(
            f"{plan.method} plan ({plan.status}{solve}); "
            f"node load/capacity (% of a core): {servers}"
        )


@topology_app.command("set")
def set_topology(
    file: Annotated[Path, typer.Argument(help="YAML: central, nodes: {NAME: {cpu}}, links.")],
    home: Home = Path(".fogshift"),
    as_json: AsJson = False,
) -> None:
    """Give the orchestrator a fog topology; it re-plans at once and prints the plan."""
    text = FogTopology.read_text(file)  # refused before touching the cluster
    with cluster_ops.orchestrator_client(home.resolve()) as client:
        plan = client.call(
            PlanView, "PUT", "/topology", content=text, headers={"Content-Type": "text/plain"}
        )
    _show(plan, as_json)


@topology_app.command("show")
def show(home: Home = Path(".fogshift"), as_json: AsJson = False) -> None:
    """Each PE's planned backup node (extra checkpoint copy) and redeploy node."""
    with cluster_ops.orchestrator_client(home.resolve()) as client:
        _show(client.call(PlanView, "GET", "/plan"), as_json)
