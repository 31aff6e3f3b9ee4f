"""Restoring a PE on a new node, exactly-once, with the old instance fenced.

1. **Fence**: the PE's epoch is bumped and a fence marker for it appended to the PE's output
   stream. From then on, the old instance — should it come back to life — finds a newer epoch
   at the end of the stream (or has its append rejected) and stops itself; a sink finds it in
   its marker file.
2. **Checkpoint**: the newest central checkpoint that verifies (a torn one is skipped),
   copied to the target from its nearest copy (the target's own replica, the PE's planned
   backup node, else the central store), fetching only the files the target lacks; if
   there is none yet, the PE starts from the beginning of its input, which the broker keeps.
   One whose files the PE's query cannot read (every start failing on them, the target
   reports) gives way to the next older, under the same epoch.
3. **Reprocess** the events between the checkpoint and what the old instance had already
   emitted, *without emitting*: the target runs behind a gate capped at the last emitted input
   position, and its writer skips every record up to that position.
4. **Intermediate** events (arrived while the PE was down): the cap is raised to where the
   input stood when the restore began.
5. **Live**: the gate opens; routing state is updated (by the caller).

Crash safety. The caller journals each phase (:class:`RestoreSteps`) before its side effect:
``fencing`` (the epoch is bumped with the journal entry; the marker is being written),
``installing`` (the checkpoint goes to the target), ``starting`` (the target starts behind its
cap), ``live`` (its gate opens). An orchestrator that dies mid-way finds the entry on restart
and carries the restore on (the target runs under the entry's epoch: open its gate, route) or
restarts it (``Orchestrator.recover_operations``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial

from fogshift.agent.exceptions import ElementBusy
from fogshift.broker.client import SyncJetStream, last_seq
from fogshift.broker.naming import stream_name
from fogshift.broker.publish import fence, last_position
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.spark_dir import progress_of
from fogshift.common.http import ServiceClient
from fogshift.common.progress import wait_for_progress
from fogshift.contracts import (
    CheckpointManifest,
    Gate,
    GateMode,
    InstallResult,
    Offset,
    RestorePhase,
    RestoreReport,
    RestoreStatus,
)
from fogshift.exceptions import FogshiftError
from fogshift.restoration.exceptions import CheckpointUnreadable, RestoreFailed
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.restoration")

#: Journal phases, in order; each is entered before the side effect it names (``routed``,
#: the last, is the caller's: the placement moves with it).
PHASES = tuple(RestorePhase)


def _no_phase(phase: str) -> None:
    """The default journal: records nothing."""


@dataclass(frozen=True)
class RestoreSteps:
    """What the restore asks of its caller on the way.

    Attributes:
        phase: Called with each phase of :data:`PHASES` but ``fencing`` (entered with the
            new epoch, before the call) and ``routed`` (the caller's own, with the placement),
            before its side effect; the caller journals it and may raise to stop the restore
            there.
    """

    phase: Callable[[str], None] = _no_phase


def _wait(agent: ServiceClient, path: str, at_least: int, timeout_s: float) -> float:
    """Wait until the restored PE's input progress reaches ``at_least``; return ms waited."""
    started = time.perf_counter()
    # As long as it catches up: the backlog of a late restore fits no fixed time, and a
    # restore that failed on it would fail again, with more to do, at every attempt.
    wait_for_progress(agent, path, at_least, timeout_s, RestoreFailed, "restoring",
                      while_moving=True, unreadable_error=CheckpointUnreadable)  # fmt: skip
    return round((time.perf_counter() - started) * 1000, 1)


def fence_and_locate(
    broker: SyncJetStream, pipeline: str, element: ElementSpec, epoch: int
) -> tuple[int, int]:
    """Fence the PE's output stream with ``epoch``; return the input position of its last
    stored output (what the fenced instance had emitted) and where its inputs stand (the sum
    of their last sequences: the input the new instance must reach to have caught up)."""
    broker.run(lambda js: fence(js, pipeline, element.id, epoch))
    return locate(broker, pipeline, element)


def locate(broker: SyncJetStream, pipeline: str, element: ElementSpec) -> tuple[int, int]:
    """The input position of the PE's last stored output, and the sum of its inputs' last
    sequences (see :func:`fence_and_locate`)."""
    _, (emitted, _), _ = broker.run(lambda js: last_position(js, stream_name(pipeline, element.id)))
    upstream = sum(
        int(broker.run(partial(last_seq, stream=stream_name(pipeline, name))))
        for name in element.inputs
    )
    return emitted, upstream


def _cap(element: ElementSpec, position: int, t0: float | None) -> Offset | None:
    """A gate limit at input position ``position``, if the PE's offsets allow one (the offset
    of the PE's source, in that source's own form)."""
    if element.kind == "ecg-source":
        return {"type": "ecg-windows", "event": position, "t0": t0 or time.time()}
    if element.role == "source":
        return {"type": "csv-rows", "row": position, "t0": t0 or time.time()}
    if len(element.inputs) == 1:
        return {"type": "jetstream", "positions": {element.inputs[0]: position}}
    return None  # several inputs: a sum of positions names no single offset


#: Where a checkpoint can be copied from: ``(label, source URL)``; ``None`` is the central
#: store (the orchestrator), any other URL a node agent holding a replica.
Copy = tuple[str, str | None]


def central_only(manifest: CheckpointManifest) -> list[Copy]:
    return [("central", None)]


def _install(
    agent: ServiceClient,
    here: str,
    manifest: CheckpointManifest | None,
    copies: list[Copy],
    report: RestoreReport,
) -> None:
    """Install ``manifest`` on the target from the first copy that works (the central store
    last); ``None`` clears the target's checkpoint, so the PE replays its input from the start.
    """
    if manifest is None:
        agent.post(here + "/checkpoint/install", json={"manifest": None})
        return
    if not any(source is None for _, source in copies):
        copies = [*copies, ("central", None)]
    body = manifest.model_dump(mode="json", exclude_unset=True)  # as the store wrote it
    # Without a source (the target's own copy, the central store: one request, what the
    # target lacks coming from the central store) a failure is not the last word while
    # another node's copy is left to try: it stopped the attempt before them.
    central_failed: FogshiftError | None = None
    for label, source in copies:
        if source is None and central_failed is not None:
            report.skipped_copies.append(f"{label}: {central_failed.message}")
            continue
        try:
            result = agent.call(
                InstallResult, "POST", here + "/checkpoint/install",
                json={"manifest": body, "source": source},
            )  # fmt: skip
        except ElementBusy:
            raise  # (the target runs the PE: no copy can be put in place there)
        except FogshiftError as exc:
            if source is None:
                central_failed = exc
            report.skipped_copies.append(f"{label}: {exc.message}")
            continue
        report.checkpoint_source = label
        report.fetched_bytes = result.fetched_bytes
        return
    # (The copies end with one without a source: it failed, or was skipped as one that had.)
    raise central_failed or FogshiftError(f"no copy of checkpoint {manifest.id} to install")


def _install_newest(
    agent: ServiceClient,
    here: str,
    central: CentralStore,
    pipeline: str,
    element_id: str,
    copies: Callable[[CheckpointManifest], list[Copy]],
    report: RestoreReport,
    unreadable: Collection[str] = (),
) -> CheckpointManifest | None:
    """Install the newest checkpoint of the PE a copy of which is whole, on the target; the
    one installed (``None``: none is, the target's checkpoint is cleared and the PE replays
    its input from the start). Those in ``unreadable`` (ids: the PE's query could not read
    them in this restore, said in the report already) are passed over.

    A checkpoint whose central copy is torn is tried from the other nodes' replicas of it:
    one corrupt blob that every kept checkpoint names (a long-lived state file) made all of
    them unusable, and the PE replayed its whole input (or, the input trimmed, could not
    start) while a backup node held the file whole.

    Raises:
        ElementBusy: The target runs the PE.
        FogshiftError: The newest whole central checkpoint could not be installed.
    """
    for kept in central.kept(pipeline, element_id):
        if kept["id"] in unreadable:
            continue
        problem = central.verify(kept)
        manifest = CheckpointManifest.model_validate(kept)
        if problem is not None:
            held = copies(manifest)
            if not any(label.startswith("replica@") for label, _ in held):
                report.skipped_checkpoints.append(f"{manifest.id}: {problem}")
                continue
            tried = len(report.skipped_copies)
            try:
                _install(agent, here, manifest, held, report)
            except ElementBusy:
                raise
            except FogshiftError as exc:
                why = "; ".join(report.skipped_copies[tried:]) or exc.message
                report.skipped_checkpoints.append(
                    f"{manifest.id}: {problem} (no whole copy elsewhere: {why})"
                )
                del report.skipped_copies[tried:]  # (this checkpoint's: said above)
                # An install given up on (no answer in time) may still be copying, and
                # would put this checkpoint in place after the next one was installed: the
                # PE would start from another checkpoint than the report's. A discard makes
                # the target refuse it.
                with contextlib.suppress(FogshiftError):
                    agent.delete(here, params={"discard": True})
                continue
        else:
            _install(agent, here, manifest, copies(manifest), report)
        report.checkpoint = manifest.id
        report.checkpoint_age_ms = round((time.time() - manifest.created) * 1000, 1)
        report.state_bytes = manifest.bytes
        if problem is not None:
            log.warning("restore of %s/%s: checkpoint %s's central copy is unusable (%s); "
                        "installed from %s", pipeline, element_id, manifest.id, problem,
                        report.checkpoint_source)  # fmt: skip
        return manifest
    report.skipped_checkpoints.append(
        "none usable: the input is replayed from its start"
        if report.skipped_checkpoints
        else f"none usable: no central checkpoint of {pipeline}/{element_id} was taken yet"
    )
    _install(agent, here, None, [], report)
    return None


def _catch_up(
    agent: ServiceClient, here: str, element: ElementSpec, report: RestoreReport,
    positions: tuple[int, int, int], t0: float | None, cap: Offset | None, timeout_s: float,
    started: float,
) -> None:  # fmt: skip
    """Wait until the PE started behind ``cap`` re-derived what the old instance emitted,
    then (the cap raised to where its inputs stood) what arrived since; the report's times.
    ``positions``: the input position of the old instance's last output, the checkpoint's,
    and the sum of the inputs' last sequences. Raises as :func:`_wait`."""
    emitted, start_at, upstream = positions
    if cap is not None:
        report.reprocess_ms = _wait(agent, here, max(emitted, start_at), timeout_s)
    else:
        # Nothing to re-derive behind a cap (several inputs, or nothing emitted since the
        # checkpoint): still, only a query that runs is restored.
        _wait(agent, here, 0, timeout_s)
    if element.role != "source" and upstream > max(emitted, start_at):
        report.intermediate_events = upstream - max(emitted, start_at)
        limit = _cap(element, upstream, t0)
        if limit is not None:
            raised = Gate(mode=GateMode.CAP, limit=limit)
            agent.put(here + "/gate", json={"gate": raised.model_dump(mode="json")})
        else:
            agent.put(here + "/gate", json={"gate": None})
        # Beyond what the old instance emitted: from here on it emits new output.
        report.live_ms = round((time.perf_counter() - started) * 1000, 1)
        report.intermediate_ms = _wait(agent, here, upstream, timeout_s)


def restore(
    pipeline: str,
    element: ElementSpec,
    epoch: int,
    target: tuple[str, ServiceClient],
    central: CentralStore,
    broker: SyncJetStream,
    timeout_s: float = 300.0,
    copies: Callable[[CheckpointManifest], list[Copy]] = central_only,
    steps: RestoreSteps | None = None,
) -> RestoreReport:
    """Restore ``element`` on ``target`` under ``epoch`` (already recorded by the caller).

    The target must not run the PE: the caller never restores onto the PE's own node.

    Args:
        copies: For the chosen checkpoint, where the target may copy it from, nearest first;
            the central store is always tried last. The target fetches only the files it
            does not already hold.
        steps: The caller's journal (see :class:`RestoreSteps`); default: none.

    Raises:
        RestoreFailed: With its ``report``; what this restore put on the target
            (checkpoint, instance) is discarded and the restore can be retried (on another
            node). Anything the target held before the restore touched it stays.
    """
    steps = steps or RestoreSteps()
    target_name, agent = target
    report = RestoreReport(pipeline=pipeline, element=element.id, target=target_name, epoch=epoch)
    started = time.perf_counter()
    here = f"/pipelines/{pipeline}/elements/{element.id}"
    placed = element.model_copy(update={"node": target_name}).model_dump(mode="json")
    touched = False  # whether the target holds anything of this restore's
    try:
        emitted, upstream = fence_and_locate(broker, pipeline, element, epoch)
        if element.shifts_origins:
            emitted = 0  # (its origins are no positions: caught up once it has read upstream)
        steps.phase(RestorePhase.INSTALLING)
        touched = True
        unreadable: list[str] = []  # checkpoints the PE's query could not read, by id
        while True:
            try:
                manifest = _install_newest(agent, here, central, pipeline, element.id, copies,
                                           report, unreadable)  # fmt: skip
            except ElementBusy:
                touched = False  # the target runs an instance of its own: not ours to discard
                raise
            offset = manifest.offset if manifest is not None else None
            start_at = progress_of(offset)
            t0 = offset.get("t0") if offset else None
            report.reprocessed_events = max(0, emitted - start_at)
            cap = _cap(element, max(emitted, start_at), t0)
            gate = Gate(mode=GateMode.CAP, limit=cap).model_dump(mode="json") if cap else None
            if not unreadable:
                steps.phase(RestorePhase.STARTING)
            try:
                agent.put(here, json={"element": placed, "fresh": False, "gate": gate,
                                      "epoch": epoch})  # fmt: skip
                _catch_up(agent, here, element, report, (emitted, start_at, upstream), t0, cap,
                          timeout_s, started)  # fmt: skip
                break
            except (CheckpointUnreadable, TornCheckpoint) as exc:
                if manifest is None:
                    raise
                # Torn alike in every copy (a file torn before its node's first snapshot
                # of it, pulled as it was): restored from it again at every attempt, the
                # PE never ran. An older one, or its input from the start, under the same
                # epoch: the instance could not load its state (Spark loads it at the first
                # batch, which may come only once the cap is raised) or was not started
                # from it (its files do not match Spark's checksums). Its output, if it
                # wrote any, is looked up again: the next cap covers it.
                unreadable.append(manifest.id)
                report.skipped_checkpoints.append(f"{manifest.id}: {exc.message}")
                # (The next install says its own; none at all, the input from its start.)
                report.checkpoint = report.checkpoint_source = report.checkpoint_age_ms = None
                report.state_bytes, report.live_ms = 0, None
                log.warning("restore of %s/%s on %s: %s; trying an older checkpoint", pipeline,
                            element.id, target_name, exc.message)  # fmt: skip
                agent.delete(here, params={"discard": True})
                emitted, upstream = locate(broker, pipeline, element)
                if element.shifts_origins:
                    emitted = 0
        steps.phase(RestorePhase.LIVE)
        agent.put(here + "/gate", json={"gate": None})
        if report.live_ms is None:
            report.live_ms = round((time.perf_counter() - started) * 1000, 1)
        report.status = RestoreStatus.RESTORED
    except FogshiftError as exc:
        report.status = RestoreStatus.FAILED
        report.error = exc.render()
        if touched:
            try:
                agent.delete(here, params={"discard": True})
            except FogshiftError as cleanup:
                # The target may be gone too; the next attempt fences whatever is left there,
                # and the reconciler removes it once its node answers (it is not placed there).
                log.warning("restore of %s/%s: the attempt on %s was not cleaned up: %s",
                            pipeline, element.id, target_name, cleanup.message)  # fmt: skip
        failure = RestoreFailed(
            f"restore of {pipeline}/{element.id} on {target_name} failed: {exc.message}",
            hint="retry, on another node if this one is in trouble (`fogshift restore "
            f"{pipeline} {element.id} --to NODE`)",
        )
        failure.report = report
        raise failure from exc
    finally:
        report.total_ms = round((time.perf_counter() - started) * 1000, 1)
    return report
