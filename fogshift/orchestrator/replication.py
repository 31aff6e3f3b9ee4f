"""Central checkpoints: pulling each PE's node-level checkpoints into the central store, and
pushing copies to the backup nodes the planner chose."""

from __future__ import annotations

import logging
import time
from typing import Any

from fogshift.checkpoint.central import KnownBlobs, check_manifest
from fogshift.checkpoint.chunks import Chunk
from fogshift.checkpoint.spark_dir import progress_of
from fogshift.contracts import (
    CentralCheckpoint,
    CheckpointManifest,
    CopyResult,
    DroppedReplica,
    FileChunks,
    Heartbeat,
    PipelineState,
)
from fogshift.exceptions import FogshiftError
from fogshift.orchestrator.core import CentralPull, ReplicaPush
from fogshift.orchestrator.registry import NodeRecord
from fogshift.orchestrator.replanning import Replanning

log = logging.getLogger("fogshift.orchestrator")


class _SnapshotFiles:
    """A node-level snapshot's files on its node agent, whole or chunk by chunk
    (:class:`~fogshift.checkpoint.central.ChunkedSource`)."""

    def __init__(self, agent: Any, base: str) -> None:
        self.agent, self.base = agent, base

    def file(self, rel: str) -> bytes:
        return bytes(self.agent.raw("GET", f"{self.base}/files/{rel}").content)

    def chunks(self, rel: str) -> list[Chunk] | None:
        try:
            listing = self.agent.call(FileChunks, "GET", f"{self.base}/chunks/{rel}")
        except FogshiftError as exc:  # an agent without chunk lists: the file comes whole
            log.debug("no chunks of %s: %s", rel, exc.message)
            return None
        return [(int(o), int(n), str(d)) for o, n, d in listing.chunks]

    def range(self, rel: str, offset: int, length: int) -> bytes:
        response = self.agent.raw(
            "GET", f"{self.base}/files/{rel}", params={"offset": offset, "length": length}
        )
        return bytes(response.content)


def _no_snapshot_yet(node: NodeRecord, pipeline: str, pe: str) -> bool:
    """Whether ``node``'s last heartbeat reports ``pe`` running there with no node-level
    checkpoint yet."""
    return any(
        (e.pipeline, e.element) == (pipeline, pe) and e.node_checkpoint is None
        for e in node.report.elements
    )


#: How often the central loop collects the central store's files no kept checkpoint names,
#: besides the collection each expiring pull makes (those younger than the store's
#: horizon, ten minutes, are spared: a copy of another PE may be reading them).
CENTRAL_GC_S = 600.0


class Replication(Replanning):
    """Central checkpoint pulls and replica pushes."""

    def pull_checkpoints(self) -> None:
        """Copy each running PE's newest node-level checkpoint into the central store."""
        nodes = {n.name: n for n in self.registry.nodes()}
        tried: set[tuple[str, str]] = set()
        for record in self.registry.pipelines():
            if record.status != PipelineState.RUNNING:
                continue
            for element in record.spec.elements:
                node = nodes.get(record.placement[element.id])
                if node is None or not self.healthy(node):
                    continue
                key = (record.name, element.id)
                tried.add(key)
                if _no_snapshot_yet(node, record.name, element.id):
                    # Just started there (deployed, migrated, restored): its first snapshot
                    # comes after its first batch. Not a failure to warn of.
                    self.pull_errors.pop(key, None)
                    continue
                try:
                    self._pull_one(record.name, element.id, node.name, key, record.status_since)
                except FogshiftError as exc:
                    log.info("central checkpoint of %s/%s skipped: %s", *key, exc.message)
                    self.pull_errors[key] = (node.name, f"{type(exc).__name__}: {exc.message}")
                    continue
                except Exception as exc:
                    # One PE's trouble (the store's disk, a file in flux) ends no other PE's
                    # pull, nor the replica pushes after them: the round goes on.
                    log.exception("central checkpoint of %s/%s failed", *key)
                    self.pull_errors[key] = (node.name, f"{type(exc).__name__}: {exc}")
                    continue
                self.pull_errors.pop(key, None)
        # A PE no longer pulled (its pipeline stopped or removed, its node lost, which says
        # so itself) has no pull failing any more.
        for key in set(self.pull_errors) - tried:
            del self.pull_errors[key]

    def _pull_one(
        self, pipeline: str, pe: str, node: str, key: tuple[str, str], since: float
    ) -> None:
        """Pull ``pe``'s newest node-level checkpoint from ``node`` into the central store,
        unless the pipeline's record changed since ``since`` (its ``status_since`` when the
        round read it): stopped and deployed afresh meanwhile, the node still held the run
        before's snapshots, and one stored after the deploy forgot them would be restored
        at positions of streams that are gone. Nor once the PE is placed elsewhere: a pull
        from a node frozen through the PE's restore (or migration) that answered when it
        woke stored the superseded instance's checkpoint as the newest, which the next
        restore went back to."""
        agent = self.agent(node)
        here = f"/pipelines/{pipeline}/elements/{pe}/snapshots"
        latest = agent.call(CheckpointManifest, "GET", here + "/latest")
        known = self.central.newest(pipeline, pe)
        # Only the very checkpoint is skipped: a node's ids grow within one history, and a
        # lower one is a new history's (a standby promoted there counts from behind), which
        # the old one would otherwise shadow until its batches passed it.
        if known and known["id"] == latest.id and known.get("node") == node:
            return
        # Stored as the node wrote it (the store checks its names), with where it came from;
        # only if it is this PE's: a node answering with another PE's names (of a pipeline
        # it has no part in) would plant that PE's newest checkpoint, which a restore uses.
        manifest = {**latest.model_dump(mode="json", exclude_unset=True), "node": node}
        check_manifest(manifest, pipeline, pe)
        started = time.perf_counter()
        files = _SnapshotFiles(agent, f"{here}/{latest.id}")

        def wanted() -> bool:
            now = self.registry.get_pipeline(pipeline)
            return (
                now is not None
                and now.status == PipelineState.RUNNING
                and now.status_since == since
                and now.placement.get(pe) == node
            )

        shipped = self.central.put(manifest, files.file, files, wanted)
        if shipped is None:
            return  # (deployed afresh or stopped meanwhile: nothing stored, nothing to show)
        self.shipped.add(key, shipped)
        self.central_stats[key] = CentralPull(
            id=latest.id,
            shipped_bytes=shipped,
            bytes=latest.bytes,
            took_ms=round((time.perf_counter() - started) * 1000, 1),
        )

    def push_replicas(self) -> None:
        """Give each PE's planned backup node a copy of the PE's newest central checkpoint.

        The node fetches only the files it lacks, from the central store. Runs after each
        central pull; a node that is down or fails is retried at the next round. Copies no
        running PE needs any more are dropped first (:meth:`drop_stale_replicas`).
        """
        self.drop_stale_replicas()
        nodes = {n.name: n for n in self.registry.nodes()}
        # (A node being drained, short of disk or full takes no copy, whatever a plan kept from
        # before says: the copy would go with the node, or fail at its first write.)
        unfit = self.leaving_nodes() | self.short_of_disk() | self._full_nodes
        for record in self.registry.pipelines():
            if record.status != PipelineState.RUNNING:
                continue
            for element in record.spec.elements:
                backup = self.planned(record.name, element.id).backup
                node = nodes.get(backup or "")
                if node is None or backup == record.placement[element.id]:
                    continue
                if not self.healthy(node) or node.name in unfit:
                    continue
                newest = self.central.newest(record.name, element.id)
                if newest is None:
                    continue
                held = {
                    r.checkpoint
                    for r in node.report.replicas
                    if (r.pipeline, r.element) == (record.name, element.id)
                }
                # (By its id alone, the new history's checkpoint of a PE restored from an
                # older one was "held" where the old one's of that batch was: not pushed.)
                if (newest["id"], newest["created"]) in held:
                    continue
                started = time.perf_counter()
                try:
                    result = self.agent(node.name).call(
                        CopyResult, "POST", f"/replicas/{record.name}/{element.id}",
                        json={"manifest": newest},
                    )  # fmt: skip
                except FogshiftError as exc:
                    log.info("replica of %s/%s on %s skipped: %s",
                             record.name, element.id, node.name, exc.message)  # fmt: skip
                    continue
                except Exception:  # as for pulls: the other PEs' pushes go on
                    log.exception("replica of %s/%s on %s failed", record.name, element.id,
                                  node.name)  # fmt: skip
                    continue
                self.replica_stats[(record.name, element.id)] = ReplicaPush(
                    node=node.name,
                    id=newest["id"],
                    fetched_bytes=result.fetched_bytes,
                    took_ms=round((time.perf_counter() - started) * 1000, 1),
                )

    def drop_stale_replicas(self) -> None:
        """Ask each healthy node to drop the copies it holds of a PE no running pipeline
        has (stopped, removed, deployed afresh since, or a partition retired) or that runs
        on that node itself: nothing else removes them, and a backup node kept every PE it
        ever backed up, twice. A copy of a running PE elsewhere stays, planned backup or
        not (a restore may still take it; plans change back and forth)."""
        records = {r.name: r for r in self.registry.pipelines()}
        for node in self.registry.nodes():
            if not self.healthy(node):
                continue
            for replica in node.report.replicas:
                record = records.get(replica.pipeline)
                if record is not None and record.status in (
                    PipelineState.DEPLOYING,
                    PipelineState.STOPPING,
                ):
                    continue  # in between: judged once it settles
                running = record is not None and record.status == PipelineState.RUNNING
                placed = record.placement.get(replica.element) if running and record else None
                if placed is not None and placed != node.name:
                    continue  # a running PE elsewhere: a restore may take this copy
                try:
                    self.agent(node.name).call(
                        DroppedReplica, "DELETE", f"/replicas/{replica.pipeline}/{replica.element}"
                    )
                except FogshiftError as exc:
                    log.info("stale replica of %s/%s on %s not dropped: %s", replica.pipeline,
                             replica.element, node.name, exc.message)  # fmt: skip
                    continue
                log.info("dropped the stale replica of %s/%s on %s",
                         replica.pipeline, replica.element, node.name)  # fmt: skip

    def held_by(self, node: str, pipeline: str, pe: str) -> KnownBlobs | None:
        """The files and chunks node ``node`` holds of PE ``pipeline/pe`` as its backup: its
        newest replica (by its last heartbeat), as the central store has it (``None``: it
        holds none the store still knows)."""
        record = self.registry.node(node)
        if record is None:
            return None
        ids = {
            r.checkpoint
            for r in record.report.replicas
            if (r.pipeline, r.element) == (pipeline, pe)
        }
        held = [m for m in self.central.manifests(pipeline, pe) if (m["id"], m["created"]) in ids]
        return self.central.blobs_of(held) if held else None

    def heartbeat(self, name: str, report: Heartbeat, generation: int | None = None) -> None:
        """Record the heartbeat; wake the central pull when it reports a new node-level
        checkpoint of a PE placed there that brought ``pull_new_state_bytes`` or more."""
        super().heartbeat(name, report, generation)
        threshold = self.config.pull_new_state_bytes
        if threshold <= 0:
            return
        for info in report.elements:
            snap = info.node_checkpoint
            if snap is None or (snap.new_bytes or 0) < threshold:
                continue
            key = (info.pipeline, info.element)
            # Once per checkpoint: a pull that failed, or left the store's newest elsewhere
            # (a PE moved to a node whose batches trail), is retried at the interval, not at
            # every heartbeat.
            if self._early_pulls.get(key) == (name, snap.id):
                continue
            record = self.registry.get_pipeline(info.pipeline)
            if record is None or record.placement.get(info.element) != name:
                continue  # a standby's or a superseded instance's checkpoint
            central = self.central.newest(*key)
            if central is None or central["id"] != snap.id or central.get("node") != name:
                log.debug("%s/%s: %d new bytes in node-level checkpoint %s, pulled at once",
                          *key, snap.new_bytes, snap.id)  # fmt: skip
                self._early_pulls[key] = (name, snap.id)
                self._pull_now.set()

    def streams_upkeep(self) -> None:
        """Bring the streams of running pipelines up to what this fogshift uses; run by the
        central loop, not the reconciler's: a broker that is away holds it up for its
        connect timeout, which must not delay noticing a lost node. (The reconciler's, see
        ``Reconciler._streams_current``; nothing here.)"""

    def trim_streams(self, at: float | None = None) -> None:
        """Trim the streams' old records (``History.trim_streams``; nothing here)."""

    def run_central(self) -> None:
        """Pull and push every ``central_interval_s``, or at once when a heartbeat asks
        (:meth:`heartbeat`), until :meth:`close`."""

        collected = [time.monotonic()]

        def step() -> None:
            self.streams_upkeep()
            self.pull_checkpoints()
            self.push_replicas()
            if time.monotonic() - collected[0] >= CENTRAL_GC_S:
                # The files no kept checkpoint names: a pull that expires one collects
                # them, but with nothing running (a pipeline stopped, or deleted) none does.
                collected[0] = time.monotonic()
                self.central.collect_garbage()
            # Last: a broker that is away holds it up for its connect timeout, which must
            # not delay the pulls (a node's large state change wakes this loop for them).
            self.trim_streams()

        self._every(self.config.central_interval_s, step, "central checkpointing",
                    wake=self._pull_now)  # fmt: skip

    def checkpoint_status(self, pipeline: str, pe: str) -> CentralCheckpoint | None:
        """The newest central checkpoint of a PE, with its age."""
        newest = self.central.newest(pipeline, pe)
        if newest is None:
            return None
        return CentralCheckpoint(
            id=newest["id"],
            batch=newest["batch"],
            progress=progress_of(newest.get("offset")),
            age_ms=round((time.time() - newest["created"]) * 1000, 1),
            bytes=newest["bytes"],
            shipped_bytes=newest.get("shipped_bytes"),
        )
