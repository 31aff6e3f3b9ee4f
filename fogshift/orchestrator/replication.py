"""Central checkpoints: pulling each PE's node-level checkpoints into the central store, and
pushing copies to the backup nodes the planner chose."""

from __future__ import annotations

import logging
import time
from typing import Any

from fogshift.checkpoint.spark_dir import progress_of
from fogshift.exceptions import FogshiftError
from fogshift.orchestrator.replanning import Replanning

log = logging.getLogger("fogshift.orchestrator")


class Replication(Replanning):
    """Central checkpoint pulls and replica pushes."""

    def pull_checkpoints(self) -> None:
        """Copy each running PE's newest node-level checkpoint into the central store."""
        nodes = {n.name: n for n in self.registry.nodes()}
        for record in self.registry.pipelines():
            if record.status != "running":
                continue
            for element in record.spec.elements:
                node = nodes.get(record.placement[element.id])
                if node is None or not self.healthy(node):
                    continue
                key = (record.name, element.id)
                try:
                    self._pull_one(record.name, element.id, node.name, key)
                except FogshiftError as exc:
                    log.info("central checkpoint of %s/%s skipped: %s", *key, exc.message)

    def _pull_one(self, pipeline: str, pe: str, node: str, key: tuple[str, str]) -> None:
        agent = self.agent(node)
        here = f"/pipelines/{pipeline}/elements/{pe}/snapshots"
        manifest = agent.get(here + "/latest")
        known = self.central.manifests(pipeline, pe)
        if known and known[0]["id"] >= manifest["id"] and known[0].get("node") == node:
            return
        manifest = {**manifest, "node": node}
        started = time.perf_counter()
        shipped = self.central.put(
            manifest,
            lambda rel: agent.raw("GET", f"{here}/{manifest['id']}/files/{rel}").content,
        )
        self.central_stats[key] = {
            "id": manifest["id"],
            "shipped_bytes": shipped,
            "bytes": manifest["bytes"],
            "took_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    def push_replicas(self) -> None:
        """Give each PE's planned backup node a copy of the PE's newest central checkpoint.

        The node fetches only the files it lacks, from the central store. Runs after each
        central pull; a node that is down or fails is retried at the next round.
        """
        nodes = {n.name: n for n in self.registry.nodes()}
        for record in self.registry.pipelines():
            if record.status != "running":
                continue
            for element in record.spec.elements:
                backup = self.planned(record.name, element.id).get("backup")
                node = nodes.get(backup or "")
                if node is None or backup == record.placement[element.id]:
                    continue
                if not self.healthy(node):
                    continue
                manifests = self.central.manifests(record.name, element.id)
                if not manifests:
                    continue
                newest = manifests[0]
                held = {
                    r["id"]
                    for r in node.report.get("replicas", [])
                    if (r["pipeline"], r["element"]) == (record.name, element.id)
                }
                if newest["id"] in held:
                    continue
                started = time.perf_counter()
                try:
                    result = self.agent(node.name).post(
                        f"/replicas/{record.name}/{element.id}", json={"manifest": newest}
                    )
                except FogshiftError as exc:
                    log.info("replica of %s/%s on %s skipped: %s",
                             record.name, element.id, node.name, exc.message)  # fmt: skip
                    continue
                self.replica_stats[(record.name, element.id)] = {
                    "node": node.name,
                    "id": newest["id"],
                    "fetched_bytes": result["fetched_bytes"],
                    "took_ms": round((time.perf_counter() - started) * 1000, 1),
                }

    def run_central(self) -> None:
        """Loop :meth:`pull_checkpoints` until :meth:`close`."""

        def step() -> None:
            self.pull_checkpoints()
            self.push_replicas()

        self._every(self.config.central_interval_s, step, "central checkpointing")

    def checkpoint_status(self, pipeline: str, pe: str) -> dict[str, Any] | None:
        """The newest central checkpoint of a PE, with its age."""
        manifests = self.central.manifests(pipeline, pe)
        if not manifests:
            return None
        newest = manifests[0]
        return {
            "id": newest["id"],
            "batch": newest["batch"],
            # The input position it resumes from: a restore reprocesses what lies beyond.
            "progress": progress_of(newest.get("offset")),
            "age_ms": round((time.time() - newest["created"]) * 1000, 1),
            "bytes": newest["bytes"],
            "shipped_bytes": newest.get("shipped_bytes"),
        }
