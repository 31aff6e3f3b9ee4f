"""The planning loop: the fog topology, and a backup/redeploy plan for every running PE
(the planner itself is :mod:`fogshift.planner`; the live inputs, :mod:`.planning`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from fogshift.common.files import write_atomic
from fogshift.common.text import one_line
from fogshift.contracts import Assignment, PipelineState, PlanView
from fogshift.exceptions import FogshiftError
from fogshift.orchestrator.core import OrchestratorCore
from fogshift.orchestrator.planning import (
    FogTopology,
    LiveNode,
    LivePE,
    build_topology,
    describe_plan,
)
from fogshift.orchestrator.registry import NodeRecord
from fogshift.planner import plan as plan_backups
from fogshift.planner.exceptions import InfeasiblePlan

log = logging.getLogger("fogshift.orchestrator")


#: When the planner's first round runs after the orchestrator starts: the nodes' heartbeats
#: come every second, and a plan needs them (one made before knows no live node).
FIRST_PLAN_S = 2.0


class Replanning(OrchestratorCore):
    """The backup/redeploy planning loop."""

    def planned(self, pipeline: str, element_id: str) -> Assignment:
        """The PE's planned ``backup`` and ``redeploy`` nodes (``None`` before a plan exists)."""
        return self.plan.assignments.get(f"{pipeline}/{element_id}", Assignment())

    def best_nodes(self, nodes: list[NodeRecord], pipeline: str, element_id: str) -> list[str]:
        """``nodes`` best first to place PE ``pipeline/element_id`` on (a restore, a
        standby): those with disk to spare (:meth:`short_of_disk`), then, for a partition,
        those placed no other partition of its element (two on one node split no work, and
        a key move `--to` that node is refused as ambiguous: the nodes of a lost node's
        partitions were all restored onto one; a sibling's node is where it is placed, or
        where its restore running now tries), then its planned redeploy node, then those
        the registry places the fewest instances on (:meth:`load`: not each node's own
        count), then by name."""
        planned = self.planned(pipeline, element_id).redeploy
        busy, short = self.load(), self.short_of_disk()
        record = self.registry.get_pipeline(pipeline)
        siblings: set[str] = set()
        if record is not None:
            part = next((e.partition for e in record.spec.elements if e.id == element_id), None)
            if part is not None:
                others = [e.id for e in record.spec.partitions_of(part.of) if e.id != element_id]
                with self._lock:  # (restores running at once: see Coordination._choosing)
                    siblings = {record.placement.get(o, "") for o in others} | {
                        self._restoring_pe[(pipeline, o)]
                        for o in others
                        if (pipeline, o) in self._restoring_pe
                    }
        ranked = sorted(nodes, key=lambda n: (n.name in short, n.name in siblings,
                                              n.name != planned, busy[n.name], n.name))  # fmt: skip
        return [n.name for n in ranked]

    def drain_lease(self, name: str, seconds: float | None) -> None:
        """:meth:`OrchestratorCore.drain_lease`, and a mark taken or ended plans again at
        once: the drain moves each PE to its planned redeploy node, which is then not this
        one (the last round's plan named it for up to a planning interval)."""
        before = self.leaving_nodes()
        super().drain_lease(name, seconds)
        if self.leaving_nodes() != before:
            self.replan()

    def set_topology(self, text: str) -> PlanView:
        """Validate and store a new fog topology (YAML), then plan with it at once.

        Raises:
            InvalidInput: The topology is invalid (nothing is changed).
        """
        FogTopology.parse(text, source="(uploaded)")
        tmp = self.config.topology_file.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.config.topology_file)
        return self.replan()

    def replan(self) -> PlanView:
        """Recompute the plan from the fog topology, live CPU use and checkpoint sizes.

        PEs whose node is not healthy keep their previous assignment: that is the plan for
        the failure at hand. A node leaving (:meth:`leaving_nodes`) keeps its PEs in the
        plan but is no PE's backup or redeploy node, and so is a node whose disk is nearly
        full (:meth:`short_of_disk`). A PE the planner finds no backup for
        (it names the task) keeps its previous assignment, said in ``unplanned``, and the
        others are planned without it; an instance the planner cannot satisfy otherwise
        keeps the previous plan and reports the reason in ``error``.
        """
        try:
            fog = FogTopology.load(self.config.topology_file)
        except FogshiftError as exc:
            # (One stored by an older fogshift, or edited by hand, that no longer validates:
            # every round raised before, and the plan kept its old assignments, no error.)
            self.plan = self.plan.model_copy(update={
                "error": f"the stored fog topology cannot be used: {exc.render()}",
                "computed_at": time.time(),
                "unplanned": {},
            })  # fmt: skip
            return self.plan
        unknown = sorted(fog.names() - set(self.node_names()))
        # (A node a list of links leaves out has none: it was silently no PE's backup or
        # redeploy node, and its own PEs had no backup without a central node.)
        linked = {end for link in fog.links for end in (link.a, link.b)}
        unlinked = sorted(set(self.node_names()) - linked) if fog.links else []
        live = [n for n in self.registry.nodes() if self.healthy(n) and n.report.ready]
        leaving = self.leaving_nodes()
        pes = []
        for record in self.registry.pipelines():
            if record.status != PipelineState.RUNNING:
                continue
            for element in record.spec.elements:
                key = (record.name, element.id)
                newest = self.central.newest(*key)
                pes.append(
                    LivePE(
                        key=f"{record.name}/{element.id}",
                        node=record.placement[element.id],
                        latency_ms=record.spec.recovery.latency_ms,
                        checkpoint_bytes=int(newest["bytes"]) if newest else 0,
                        shipped_bytes_per_s=self.shipped.per_s(key),
                    )
                )
        previous = self.plan.assignments
        # (A node whose disk is nearly full takes no backup and no redeployed PE, as a node
        # leaving: both would fail there at their first write.)
        short = self.short_of_disk()
        servers = [LiveNode(n.name, self._cpu_of(n), n.name in leaving | short) for n in live]
        #: PEs this round cannot plan, each with why (a latency no route meets, say).
        unplanned: dict[str, str] = {}
        full: set[str] = set()
        try:
            while True:
                topology = build_topology(
                    fog, servers, [pe for pe in pes if pe.key not in unplanned],
                    fog.central_node(self.node_names()), full,
                )  # fmt: skip
                try:
                    result = (
                        plan_backups(topology, "exact", time_limit_s=self.config.plan_time_limit_s)
                        if topology.tasks
                        else None
                    )
                    break
                except InfeasiblePlan as exc:
                    # One PE that cannot be planned kept the previous plan for every PE
                    # (none on a fresh start): it keeps its own, the others are planned.
                    if exc.task_id not in {t.id for t in topology.tasks}:
                        raise
                    unplanned[exc.task_id] = exc.render()
        except FogshiftError as exc:
            self.plan = self.plan.model_copy(
                update={"error": exc.render(), "computed_at": time.time(),
                        "unknown_nodes": unknown, "unlinked_nodes": unlinked,
                        "low_disk_nodes": sorted(short), "unplanned": {},
                        "assignments": _sound(previous, pes, leaving | short | full)}
            )  # fmt: skip
            return self.plan
        if full - self._full_nodes:  # (said once, not every round)
            log.warning("planner: node(s) %s run PEs needing more CPU than their capacity "
                        "(fog topology: cpu, pe_cpu): planned as full, taking no backup and "
                        "no redeployed PE", ", ".join(sorted(full)))  # fmt: skip
        self._full_nodes = full
        self._topology = topology
        self._central = fog.central_node(self.node_names())
        fresh = describe_plan(result, topology) if result else PlanView()
        planned_now = {t.id for t in topology.tasks}
        kept = {
            k: v
            for k, v in _sound(previous, pes, leaving | short | full).items()
            if k not in planned_now
        }
        for task, why in unplanned.items():
            # (Said once, not every round: its reason's figures change from round to round.)
            if task not in self.plan.unplanned:
                log.warning("planner: %s %s: %s", task, "keeps its previous plan" if task in
                            kept else "has no plan", one_line(why))  # fmt: skip
        assignments = {**kept, **fresh.assignments}
        if _nodes_of(assignments) != _nodes_of(previous):  # (see core.last_plan)
            self._keep_plan(assignments)
        self.plan = fresh.model_copy(
            update={
                "assignments": assignments,
                "error": None,
                "computed_at": time.time(),
                "unknown_nodes": unknown,
                "unlinked_nodes": unlinked,
                "low_disk_nodes": sorted(short),
                "unplanned": unplanned,
            }
        )
        return self.plan

    def _keep_plan(self, assignments: dict[str, Assignment]) -> None:
        """Write ``assignments`` where the next orchestrator starts from (core.last_plan)."""
        try:
            write_atomic(self.config.plan_file,
                         PlanView(assignments=assignments).model_dump_json())  # fmt: skip
        except OSError as exc:
            log.warning("cannot keep the plan in %s: %s", self.config.plan_file, exc)

    def forget_plan(self, pipeline: str) -> None:
        """Drop ``pipeline``'s PEs from the plan, and from the one kept for the next
        orchestrator: a pipeline deployed again under its name started with them while
        planning failed."""
        kept = {k: v for k, v in self.plan.assignments.items()
                if k.split("/", 1)[0] != pipeline}  # fmt: skip
        if kept != self.plan.assignments:
            self.plan = self.plan.model_copy(update={"assignments": kept})
            self._keep_plan(kept)

    def _cpu_of(self, node: NodeRecord) -> float:
        """Node ``node``'s CPU use (%) to plan with: the mean of its heartbeats over the last
        planning interval (:attr:`cpu_seen`), else its last one's."""
        seen = self.cpu_seen.mean(node.name)
        return seen if seen is not None else float(node.report.cpu_percent or 0.0)

    def run_planner(self) -> None:
        """Loop :meth:`replan` until :meth:`close`, the first round as soon as the nodes
        were heard (:data:`FIRST_PLAN_S`): an orchestrator started again showed no backup
        or redeploy node for its first interval or two."""
        if not self._stop.wait(FIRST_PLAN_S):
            self.plan_soon.set()
        self._every(self.config.plan_interval_s, self.replan, "planning", wake=self.plan_soon)


def _nodes_of(assignments: dict[str, Assignment]) -> dict[str, tuple[str | None, str | None]]:
    """Each PE's planned backup and redeploy node (not its recovery time, which moves with
    its checkpoint's size: the plan was written nearly every round)."""
    return {k: (a.backup, a.redeploy) for k, a in assignments.items()}


def _sound(
    assignments: dict[str, Assignment], pes: list[LivePE], unfit: Collection[str] = ()
) -> dict[str, Assignment]:
    """The ``assignments`` of running PEs that name neither as backup nor as redeploy node
    the node the PE runs on now (restored there since they were made: a plan redeploying a
    PE onto its own node was shown, and is none), nor a node ``unfit`` now (leaving, short
    of disk: a kept plan went on pushing backups to a node being drained, or to a nearly
    full disk, whenever a round could not plan anew)."""
    where = {pe.key: pe.node for pe in pes}
    return {k: v for k, v in assignments.items()
            if k in where and where[k] not in (v.backup, v.redeploy)
            and not {v.backup, v.redeploy} & set(unfit)}  # fmt: skip
