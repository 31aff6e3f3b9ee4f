"""Hot standbys (``recovery: {standby: NODE | planned}``): a PE's second instance on another
node, warm and capped, that takes over when the PE's node is lost.

**Following.** The standby starts from a warm copy of the primary's latest checkpoint (as a
migration target does), under an epoch newer than the primary's, behind a gate capped at the
primary's committed offset; the orchestrator raises the cap as the primary commits
(:func:`follow`). Every batch the standby plans ends at or before an offset the primary has
committed, and the primary appends a batch's output before it commits the batch: whatever
the standby derives is in the stream already, so its writer skips all of it by position and
appends nothing. Its newer epoch never shows in the stream while the primary lives, and the
primary is never refused. (With several inputs it replays the primary's logged cuts, which
reach at least as far as the cap.)

**Promotion** (:func:`promote`): the output stream is fenced with the standby's epoch — a
primary still appending is refused, one that comes back finds the marker and stops — and
the standby's gate opens. Its next batch reads everything from its position: what the
primary had emitted is reprocessed without emitting (skipped by position), the rest is new
output. No checkpoint moves and no query starts on the critical path; what is left to
reprocess is what the primary committed since the cap was last raised (a batch or two).

Sinks have no standby: they write outside the broker, where nothing would skip a standby's
writes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from fogshift.broker.client import SyncJetStream
from fogshift.checkpoint.spark_dir import progress_of
from fogshift.common.http import ServiceClient
from fogshift.common.progress import wait_for_progress
from fogshift.contracts import (
    ElementProgress,
    Gate,
    GateMode,
    PEState,
    RestoreMethod,
    RestorePhase,
    RestoreReport,
    RestoreStatus,
)
from fogshift.exceptions import FogshiftError
from fogshift.migration.procedure import Fetched, fetch_checkpoint, install_checkpoint
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.restoration.procedure import RestoreSteps, fence_and_locate
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.restoration")

#: The states in which a standby instance can be promoted.
PROMOTABLE = (PEState.RUNNING, PEState.STARTING, PEState.PAUSED)


def _path(pipeline: str, element: str) -> str:
    return f"/pipelines/{pipeline}/elements/{element}"


@dataclass(frozen=True)
class WarmCopy:
    """A primary's checkpoint taken for its standby (:func:`warm_copy`)."""

    fetched: Fetched
    started: float  # ``time.perf_counter()`` when the copy began


def warm_copy(pipeline: str, element: ElementSpec, primary: ServiceClient) -> WarmCopy:
    """The primary's checkpoint, taken from its running query without pausing it: the first
    step of a standby's start (then :func:`start_standby`, :func:`warm_up`,
    :func:`first_follow`), which needs nothing of the PE but a read of its primary — so the
    caller runs it outside the PE's exclusive section (a primary that freezes during the
    copy would hold the section, and with it the PE's restore, for a whole request
    timeout).

    Raises:
        FogshiftError: The primary did not answer the copy.
    """
    started = time.perf_counter()
    return WarmCopy(fetch_checkpoint(primary, _path(pipeline, element.id), warm=True), started)


def start_standby(
    pipeline: str,
    element: ElementSpec,
    standby: tuple[str, ServiceClient],
    epoch: int,
    copy: WarmCopy,
) -> None:
    """Install ``copy`` on ``standby``'s node and start the PE there under ``epoch``, behind
    a gate capped at the copy's offset (held, for a copy with no batch).

    Raises:
        FogshiftError: The install or the start was refused; whatever was started is left
            for the caller to discard.
    """
    name, agent = standby
    here = _path(pipeline, element.id)
    data, digest, info, _ = copy.fetched
    install_checkpoint(agent, here, data, digest)
    gate = Gate(mode=GateMode.CAP, limit=info.offset) if info.offset else Gate(mode=GateMode.HOLD)
    placed = element.model_copy(update={"node": name}).model_dump(mode="json")
    agent.put(
        here,
        json={"element": placed, "fresh": False, "gate": gate.model_dump(mode="json"),
              "epoch": epoch},
    )  # fmt: skip


def warm_up(
    pipeline: str,
    element: ElementSpec,
    standby: tuple[str, ServiceClient],
    copy: WarmCopy,
    timeout_s: float = 120.0,
) -> None:
    """Wait until the standby started from ``copy`` has re-executed the copy's last batch
    (its workers up, its state loaded): it runs, warm, at its cap. Only reads the standby:
    a caller need not hold the PE's exclusive section (a restore meanwhile may promote the
    standby while it warms up: it then catches up live).

    Raises:
        RestoreFailed: It did not get there within ``timeout_s``, was fenced, or its node
            gave up on it.
    """
    name, agent = standby
    info = copy.fetched[2]
    if info.batch is not None:
        what = f"standby of {pipeline}/{element.id} on {name} warming up"
        wait_for_progress(
            agent, _path(pipeline, element.id), progress_of(info.offset), timeout_s,
            RestoreFailed, what,
        )  # fmt: skip


def first_follow(
    pipeline: str,
    element: ElementSpec,
    primary: tuple[str, ServiceClient],
    standby: tuple[str, ServiceClient],
) -> None:
    """Raise a warm standby's cap to where its primary has committed since the copy
    (:func:`follow`). A primary that does not answer leaves it capped at the copy: it
    stands — its primary not answering now (its node just died) is what the standby is for;
    discarded, the PE's restore came from an older central checkpoint instead of promoting
    it."""
    try:
        follow(_path(pipeline, element.id), primary[1], standby[1])
    except FogshiftError as exc:
        log.warning("standby of %s/%s on %s is warm but could not follow its primary yet: %s",
                    pipeline, element.id, standby[0], exc.message)  # fmt: skip


def follow(
    here: str,
    primary: ServiceClient,
    standby: ServiceClient,
    last: ElementProgress | None = None,
    timeout_s: float = 5.0,
) -> tuple[ElementProgress, ElementProgress | None]:
    """Raise the standby's cap to the primary's committed offset.

    Args:
        here: The PE's element path on both agents.
        last: The primary's progress when the cap was last raised: the gate is rewritten only
            if the primary committed since.
        timeout_s: Per request: a frozen node must not hold the follower (and the PE's
            exclusive section, which its promotion needs) for long.

    Returns:
        The primary's progress now, and the standby's answer if its gate was rewritten.
    """
    now = primary.call(ElementProgress, "GET", here + "/progress", timeout=timeout_s)
    if now.offset is None or (last is not None and last.offset == now.offset):
        return now, None
    cap = Gate(mode=GateMode.CAP, limit=now.offset).model_dump(mode="json")
    answer = standby.call(
        ElementProgress, "PUT", here + "/gate", json={"gate": cap}, timeout=timeout_s
    )
    return now, answer


def promote(
    pipeline: str,
    element: ElementSpec,
    epoch: int,
    standby: tuple[str, ServiceClient],
    broker: SyncJetStream,
    timeout_s: float = 60.0,
    steps: RestoreSteps | None = None,
) -> RestoreReport:
    """Make the standby on ``standby``'s node the PE: fence, then lift its cap.

    The caller has journaled the promotion (phase ``starting``: the instance already runs)
    and moves the placement once this returns.

    Args:
        epoch: The standby's epoch (it must be running under it).

    Raises:
        RestoreFailed: The standby is not running under ``epoch`` (nothing was changed: the
            report's ``epoch`` is 0), or the fence or what came after failed (its gate is
            still capped: nothing of it is live, but the primary may be fenced already).
            Once the gate is open the promotion has happened: a slow catch-up is only a
            warning in the report.
    """
    steps = steps or RestoreSteps()
    name, agent = standby
    here = _path(pipeline, element.id)
    report = RestoreReport(
        pipeline=pipeline, element=element.id, target=name, epoch=epoch,
        method=RestoreMethod.STANDBY,
    )  # fmt: skip
    started = time.perf_counter()
    fencing = False
    try:
        info = agent.call(ElementProgress, "GET", here + "/progress")
        if info.epoch != epoch or info.state not in PROMOTABLE:
            raise RestoreFailed(
                f"the standby of {pipeline}/{element.id} on {name} cannot take over: it is "
                f"{info.state} under epoch {info.epoch}",
                expected=f"running under epoch {epoch}",
                received=f"{info.state} under epoch {info.epoch}",
                hint="the PE is restored from its checkpoint instead",
            )
        steps.phase(RestorePhase.FENCING)
        fencing = True
        emitted, upstream = fence_and_locate(broker, pipeline, element, epoch)
        if len(element.inputs) == 1 or element.role == "source":
            # Positions are input sequences (or rows): the gap is what it skips re-deriving.
            report.reprocessed_events = max(0, emitted - info.progress)
        if element.shifts_origins:
            # Its origins are no positions: it is as far behind as what it has not read,
            # and caught up once it has read the input stored now.
            report.standby_lag_events = max(0, upstream - info.progress)
            emitted = 0
        else:
            report.standby_lag_events = max(0, emitted - info.progress)
        steps.phase(RestorePhase.LIVE)
        agent.put(here + "/gate", json={"gate": None})
    except FogshiftError as exc:
        report.status = RestoreStatus.FAILED
        report.error = exc.render()
        report.total_ms = round((time.perf_counter() - started) * 1000, 1)
        if not fencing:
            report.epoch = 0  # nothing was fenced: the primary was not touched
        failure = RestoreFailed(
            f"promotion of the standby of {pipeline}/{element.id} on {name} failed: {exc.message}",
            hint="the PE is restored from its checkpoint instead",
        )
        failure.report = report
        raise failure from exc
    report.status = RestoreStatus.RESTORED
    report.live_ms = round((time.perf_counter() - started) * 1000, 1)
    if element.role != "source" and upstream > max(emitted, info.progress):
        report.intermediate_events = upstream - max(emitted, info.progress)
        caught = time.perf_counter()
        try:
            what = f"promoted standby of {pipeline}/{element.id} catching up"
            wait_for_progress(agent, here, upstream, timeout_s, RestoreFailed, what)
            report.intermediate_ms = round((time.perf_counter() - caught) * 1000, 1)
        except FogshiftError as exc:
            report.error = f"live, but not caught up yet: {exc.message}"
    report.total_ms = round((time.perf_counter() - started) * 1000, 1)
    return report
