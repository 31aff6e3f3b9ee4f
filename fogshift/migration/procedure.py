"""The migration procedure, run by the orchestrator against two node agents.

Two modes, both exactly-once (outputs are idempotent by input position, see
``broker.publish``), both with rollback (target discarded, origin resumed):

``literal`` — the thesis's procedure: pause the origin at a batch boundary, take its
operator state (the Spark checkpoint: processing state in the RocksDB state store + buffer
state in the offset log), ship it through the orchestrator, invoke the target with it, detach
the origin. The downtime includes starting the target's query (~3 s for a Python stateful
operator on this hardware).

``precopy`` (default) — the same four phases, with the expensive part moved before the pause:
a copy of the origin's latest checkpoint starts on the target *behind a capped gate*; it
re-executes the last committed batch (emitting nothing: those records are already stored),
which starts its workers, then idles. Only then is the origin paused; the target's gate
opens and it reads the few events since the copy from the broker — re-processing the ones
the origin already emitted without emitting them — and goes live.

``handover`` — make-before-break: as precopy, a copy of the origin's latest checkpoint starts
on the target behind a capped gate and follows the origin; but under the *next* epoch, and
then its gate opens while the origin still runs. Both process the same input; the output is
idempotent by input position, so whichever appends a record first stores it and the other
skips it — and once the target has appended, the origin's next append is refused (its epoch
is older). Once the target has committed as far as the origin, the stream is fenced with the
target's epoch, so the origin is cut off for sure, and then removed. No pause, no query start
and no state shipped on the output's critical path. Only for PEs whose output the broker holds
(not sinks). A PE with several inputs hands over its cut log too: whichever instance logs the
next cut first, the other replays it (the reader follows a cut logged by a racing writer), and
a cut logged under the target's epoch fences the origin like an output does.

``downtime_ms`` runs from the pause until the target commits its first batch beyond the
origin's pause position (for ``handover``: from the fence until the target commits beyond
where the origin had got; the target is live all along, so it is at most a batch).

Crash safety. The caller journals each phase (:class:`MigrationSteps`) before its side effect:
``preparing`` (the target gets a copy), ``pausing`` (the origin's gate closes), ``switching``
(the origin is paused; the target takes over its input), ``routed`` (the placement points at
the target — recorded with the placement itself). An operation found unfinished before
``routed`` is rolled back, after it completed (``Orchestrator.recover_operations``).

Never two writers under one epoch. Before the routing change, a failure rolls back: the
target is discarded and only then the origin resumed; if the target cannot be discarded (its
node does not answer) it may still write, so the PE is fenced under a new epoch and the origin
restarted under that one instead. After the routing change nothing rolls back: the target is
the PE; an origin that cannot be removed stays held at its gate, and the reconciler removes
it as superseded.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fogshift.agent.exceptions import UnknownElement
from fogshift.checkpoint.central import KnownBlobs
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.spark_dir import fill_omitted, lean_archive, progress_of
from fogshift.common.exceptions import NoAnswer, WaitTimedOut
from fogshift.common.files import DISK_FULL, QUOTA_EXCEEDED
from fogshift.common.headers import INFO_HEADER, SHA_HEADER
from fogshift.common.http import ServiceClient
from fogshift.common.progress import progress_params, wait_for_progress
from fogshift.common.waiting import wait_until
from fogshift.contracts import (
    DOWNTIME_FAILED,
    CheckpointInfo,
    ElementProgress,
    Gate,
    GateMode,
    MigrationMode,
    MigrationPhase,
    MigrationReport,
    MigrationStatus,
    Offset,
    PEState,
)
from fogshift.exceptions import FogshiftError
from fogshift.migration.exceptions import MigrationFailed, MigrationRouted
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.migration")

#: Journal phases, in order; each is entered before the side effect it names.
PHASES = tuple(MigrationPhase)


#: How long after a migration's switch the downtime is waited for if no input beyond the
#: pause has come (a source writing every few hundred ms has written by then): the command
#: answered only after its whole live wait (30 s) when none came (Case 2's handovers once
#: the recordings had ended).
IDLE_INPUT_S = 2.0
#: The longest one request for the target's progress after the switch waits at its agent
#: (a long poll): short enough that whether input is pending is asked every half second
#: once :data:`IDLE_INPUT_S` has passed.
MOVED_ON_POLL_S = 0.5
#: How much longer than the pause's own bound its request waits for the agent's answer:
#: the agent gives up pausing (and resumes the PE) after ``timeout_s`` from when the request
#: reached it, and says why; a client bound equal to it ran out first (its clock starts at
#: the send) and reported "no answer" instead, while the agent's resume could still come.
PAUSE_ANSWER_MARGIN_S = 30.0
#: Capped rounds a handover's target follows the origin before its gate opens. One brings
#: it from the copy's batch to where the origin got meanwhile (the seconds its start took);
#: more only chase the origin's next batches, which the target's open gate does anyway (the
#: ``follow`` phase): with 3, a 50 MiB handover's prepare spent 1.5 s chasing.
HANDOVER_ROUNDS = 1


def _no_phase(phase: str) -> None:
    """The default journal: records nothing."""


def _no_route() -> None:
    """The default routing change: none (the caller keeps no routing state)."""


@dataclass(frozen=True)
class MigrationSteps:
    """What the migration asks of its caller on the way.

    Attributes:
        phase: Called with each phase of :data:`PHASES` but ``routed``, before its side
            effect (the caller journals it; it may raise to stop the migration there).
        route: The routing change: the caller points the PE's placement at the target (and
            journals ``routed`` with it). Called once the target is live, before the origin
            is detached; from then on the migration never rolls back. What fails after its
            change is in place, it raises as :class:`MigrationRouted` (anything else it
            raises is taken to have changed nothing, and is rolled back).
        fence: Bumps the PE's epoch and fences its output stream with it; returns the new
            epoch. Used when a rollback cannot make sure the target stopped: the origin is
            then restarted under the new epoch. ``None``: the origin is resumed regardless.
        bump: Bumps the PE's epoch (recorded with the journal entry) without fencing;
            returns it: the epoch a ``handover`` target writes under beside the origin.
        mark: Fences the PE's output stream with the given epoch (no bump): a ``handover``
            cuts the origin off with the target's epoch.
        pending: Whether the PE's inputs hold anything beyond the given offset (the
            position at the switch). Without any :data:`IDLE_INPUT_S` after the switch, the
            downtime is not waited for further: nothing is down while no input comes, and
            the command would have answered only after ``live_wait_s`` (30 s). ``None``:
            waited for to the end.
    """

    phase: Callable[[str], None] = _no_phase
    route: Callable[[], None] = _no_route
    fence: Callable[[], int] | None = None
    bump: Callable[[], int] | None = None
    mark: Callable[[int], None] | None = None
    pending: Callable[[Offset | None], bool] | None = None


class Stopwatch:
    """Named phase timings in milliseconds, into ``laps`` (default: the report's phases)."""

    def __init__(self, report: MigrationReport, laps: dict[str, float] | None = None) -> None:
        self.laps = report.phases_ms if laps is None else laps
        self.started = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.laps[phase] = round((now - self.started) * 1000, 1)
        self.started = now


def _path(pipeline: str, element: str, tail: str = "") -> str:
    return f"/pipelines/{pipeline}/elements/{element}{tail}"


def _wait_progress(
    agent: ServiceClient,
    path: str,
    at_least: int,
    timeout_s: float,
    what: str,
    report: MigrationReport,
) -> ElementProgress:
    """Wait for the target PE (``path`` is its element path) to reach ``at_least``."""
    return wait_for_progress(
        agent,
        path,
        at_least,
        timeout_s,
        MigrationFailed,
        what,
        lambda info: report.observe(report.target, info),
    )


def migrate(
    pipeline: str,
    element: ElementSpec,
    origin: tuple[str, ServiceClient],
    target: tuple[str, ServiceClient],
    mode: MigrationMode = MigrationMode.PRECOPY,
    timeout_s: float = 120.0,
    live_wait_s: float = 30.0,
    steps: MigrationSteps | None = None,
    precopy_rounds: int = 3,
    epoch: int = 1,
    known: KnownBlobs | None = None,
    held: KnownBlobs | None = None,
) -> MigrationReport:
    """Move a running PE from ``origin`` to ``target``; see the module docstring.

    Args:
        steps: The caller's journal, routing change and fencing (see
            :class:`MigrationSteps`); default: none.
        epoch: The PE's current epoch; the target writes under the same one (the origin is
            paused, then detached: the two never write concurrently).
        known: The central store's files of this PE: not shipped from the origin again
            (:func:`fetch_checkpoint`).
        held: The files (and chunks) of the target's backup copy of this PE: not sent to
            the target again (:func:`install_checkpoint`).

    Returns:
        The report (status ``migrated``; ``warnings`` if the origin could not be removed).

    Raises:
        MigrationFailed: The migration failed before the routing change and was rolled
            back; its ``report`` says whether the origin runs again (``rolled_back``) and
            under which epoch.
    """
    steps = steps or MigrationSteps()
    if mode == MigrationMode.HANDOVER:
        return _handover(pipeline, element, origin, target, timeout_s, live_wait_s, steps,
                         HANDOVER_ROUNDS, epoch, known, held)  # fmt: skip
    origin_name, origin_agent = origin
    target_name, target_agent = target
    report = MigrationReport(
        pipeline=pipeline,
        element=element.id,
        origin=origin_name,
        target=target_name,
        mode=MigrationMode(mode),
        epoch=epoch,
    )
    watch = Stopwatch(report)
    here = _path(pipeline, element.id)
    placed = element.model_copy(update={"node": target_name}).model_dump(mode="json")
    paused_at: float | None = None
    info = CheckpointInfo()
    started = False  # whether the target was asked to run (it may write from then on)
    unanswered = False  # whether the request starting it got no answer
    try:
        steps.phase(MigrationPhase.PREPARING)
        if mode == MigrationMode.PRECOPY:
            prepare = Stopwatch(report, report.prepare_ms)
            info = _copy_warm(report, here, origin_agent, target_agent, (known, held), prepare)
            started = True
            _follow_capped(report, here, origin_agent, target_agent, placed, info, epoch,
                           timeout_s, precopy_rounds, prepare)  # fmt: skip
            watch.lap("prepare")
        steps.phase(MigrationPhase.PAUSING)
        paused_at = time.perf_counter()
        position = origin_agent.call(
            ElementProgress,
            "POST",
            here + "/pause",
            params={"timeout_s": timeout_s},
            timeout=timeout_s + PAUSE_ANSWER_MARGIN_S,
        )
        report.observe(origin_name, position)
        watch.lap("pause")
        steps.phase(MigrationPhase.SWITCHING)
        if mode == MigrationMode.LITERAL:
            fetched = fetch_checkpoint(origin_agent, here, warm=False, known=known)
            info = fetched.info  # (where the target resumes: nothing to catch up on)
            report.state_bytes, report.shipped_bytes = len(fetched.data), fetched.shipped
            watch.lap("state")
            report.sent_bytes = install_checkpoint(
                target_agent, here, fetched.data, fetched.digest, held
            )
            started = True
            try:
                target_agent.put(here, json={"element": placed, "fresh": False, "epoch": epoch})
            except NoAnswer:
                # Sent, no answer: the start may still be carried out after the rollback's
                # discard (the agent takes either first), a second instance under ``epoch``.
                unanswered = True
                raise
        else:
            watch.lap("state")  # the position is in the pause answer: nothing to ship
            target_agent.put(here + "/gate", json={"gate": None})
        live = _wait_progress(target_agent, here, position.progress, timeout_s,
                              "catching up", report)  # fmt: skip
        watch.lap("invoke")
        steps.route()
    except MigrationRouted:  # the target is the PE: a rollback would discard it
        raise
    except Exception as exc:  # whatever failed before the routing change: roll back
        message = exc.message if isinstance(exc, FogshiftError) else f"{type(exc).__name__}: {exc}"
        report.error = exc.render() if isinstance(exc, FogshiftError) else message
        report.status = MigrationStatus.FAILED
        undone = roll_back(
            pipeline,
            element,
            origin,
            target,
            report.epoch,
            steps.fence if started else None,
            unanswered=unanswered,
        )
        report.rolled_back, report.epoch = undone.resumed, undone.epoch
        if undone.notes:
            report.error = "; ".join([report.error, *undone.notes])
        if report.rolled_back and undone.halted:
            outcome = "was rolled back"
            hint = (
                f"{element.id} is on {origin_name} as before, {undone.halted}: `fogshift "
                "restore` it if its node is at fault, else mend it and `fogshift deploy` again"
            )
        elif report.rolled_back:
            outcome = "was rolled back"
            hint = f"{element.id} runs on {origin_name} again (epoch {report.epoch})"
            if DISK_FULL in message or QUOTA_EXCEEDED in message:
                # (The origin's full disk refused the pause's gate: a migration needs the
                # origin to write, a restore does not.)
                hint += (
                    f"; a disk is full ({origin_name}'s or {target_name}'s: `fogshift nodes` "
                    f"warns of it): free space there, or `fogshift restore {pipeline} "
                    f"{element.id} --to NODE` moves it off a full node from its checkpoints, "
                    "writing nothing there"
                )
        else:
            outcome = "could not be rolled back"
            hint = (
                f"see the error; once {origin_name} answers, the reconciler resumes the PE "
                "held at its gate there (or restarts it under its newest epoch); if "
                f"{origin_name} stays silent, the PE is restored elsewhere as any PE of a "
                "lost node (`recovery.auto`; else `fogshift restore` it)"
            )
        failure = MigrationFailed(
            f"migration of {pipeline}/{element.id} from {origin_name} to {target_name} failed "
            f"and {outcome}: {message}",
            hint=hint,
        )
        failure.report = report
        raise failure from exc
    # Routed: the target is the PE now. Nothing below may undo that.
    assert paused_at is not None
    _finish(report, watch, here, origin_agent, target_agent, (info, position, live),
            paused_at, live_wait_s, steps.pending)  # fmt: skip
    return report


def _handover(
    pipeline: str,
    element: ElementSpec,
    origin: tuple[str, ServiceClient],
    target: tuple[str, ServiceClient],
    timeout_s: float,
    live_wait_s: float,
    steps: MigrationSteps,
    rounds: int,
    epoch: int,
    known: KnownBlobs | None = None,
    held: KnownBlobs | None = None,
) -> MigrationReport:
    """The ``handover`` mode (module docstring): make-before-break under the next epoch."""
    if steps.bump is None or steps.mark is None or steps.fence is None:
        raise ValueError("a handover needs the caller's bump, mark and fence steps")
    origin_name, origin_agent = origin
    target_name, target_agent = target
    report = MigrationReport(
        pipeline=pipeline, element=element.id, origin=origin_name, target=target_name,
        mode=MigrationMode.HANDOVER, epoch=epoch,
    )  # fmt: skip
    watch = Stopwatch(report)
    here = _path(pipeline, element.id)
    placed = element.model_copy(update={"node": target_name}).model_dump(mode="json")
    started = False
    try:
        steps.phase(MigrationPhase.PREPARING)
        prepare = Stopwatch(report, report.prepare_ms)
        info = _copy_warm(report, here, origin_agent, target_agent, (known, held), prepare)
        # The next epoch only once the copy is in place, for the target about to start: a
        # copy that failed left the origin behind a newer epoch, which the reconciler
        # mends by restarting the healthy origin fenced (downtime for nothing).
        report.epoch = steps.bump()
        started = True
        _follow_capped(report, here, origin_agent, target_agent, placed, info, report.epoch,
                       timeout_s, rounds, prepare)  # fmt: skip
        watch.lap("prepare")
        # Live beside the origin: from here on the target may append (under the new epoch).
        steps.phase(MigrationPhase.SWITCHING)
        target_agent.put(here + "/gate", json={"gate": None})
        now = _origin_progress(report, here, origin_agent)
        if now is not None:
            _wait_progress(target_agent, here, now.progress, timeout_s, "following", report)
        watch.lap("follow")
        # The origin is not paused: it may already be refused (the target appended first
        # under its newer epoch). The fence makes that certain; its position before is as
        # far as it can have got.
        position = _origin_progress(report, here, origin_agent) if now is not None else None
        if position is None:
            # The origin stopped answering with the target live: the target takes over
            # (fenced out below, the origin can never append again). A rollback would
            # discard the one instance that runs and leave the PE to a restore.
            position = target_agent.call(ElementProgress, "GET", here + "/progress")
            report.warnings.append(
                f"the origin on {origin_name} stopped answering once the target was live: "
                "the target took over without it"
            )
        paused_at = time.perf_counter()
        steps.mark(report.epoch)
        watch.lap("fence")
        live = _wait_progress(target_agent, here, position.progress, timeout_s, "taking over",
                              report)  # fmt: skip
        watch.lap("invoke")
        steps.route()
    except MigrationRouted:  # the target is the PE: a rollback would discard it
        raise
    except Exception as exc:  # before the routing change: roll back
        message = exc.message if isinstance(exc, FogshiftError) else f"{type(exc).__name__}: {exc}"
        report.error = exc.render() if isinstance(exc, FogshiftError) else message
        report.status = MigrationStatus.FAILED
        undone = _undo_handover(pipeline, element, origin, target, epoch, steps.fence,
                                started)  # fmt: skip
        report.rolled_back, report.epoch = undone.resumed, undone.epoch
        if undone.notes:
            report.error = "; ".join([report.error, *undone.notes])
        if report.rolled_back and undone.halted:
            # (Restarted fenced, its query failed there: not "runs again", as the pause
            # path says it.)
            hint = (
                f"{element.id} is on {origin_name} as before, {undone.halted}: `fogshift "
                "restore` it if its node is at fault, else mend it and `fogshift deploy` again"
            )
        elif report.rolled_back:
            hint = f"{element.id} runs on {origin_name} again (epoch {report.epoch})"
        else:
            hint = "see the error; the reconciler restarts the PE under its newest epoch"
        failure = MigrationFailed(
            f"handover of {pipeline}/{element.id} from {origin_name} to {target_name} failed "
            f"and {'was' if report.rolled_back else 'could not be'} rolled back: {message}",
            hint=hint,
        )
        failure.report = report
        raise failure from exc
    _finish(report, watch, here, origin_agent, target_agent, (info, position, live),
            paused_at, live_wait_s, steps.pending)  # fmt: skip
    return report


def _origin_progress(
    report: MigrationReport, here: str, origin: ServiceClient
) -> ElementProgress | None:
    """The origin's progress during a handover's switch; ``None`` if it does not answer
    (its node went down or its agent forgot the PE)."""
    try:
        now = origin.call(ElementProgress, "GET", here + "/progress")
    except FogshiftError as exc:
        log.warning("handover of %s/%s: the origin on %s does not answer: %s",
                    report.pipeline, report.element, report.origin, exc.message)  # fmt: skip
        return None
    report.observe(report.origin, now)
    return now


def _copy_warm(
    report: MigrationReport,
    here: str,
    origin: ServiceClient,
    target: ServiceClient,
    holders: tuple[KnownBlobs | None, KnownBlobs | None],
    laps: Stopwatch,
) -> CheckpointInfo:
    """Install a warm copy of the origin's latest checkpoint on the target (not started),
    without what ``holders`` hold: the central store (not shipped from the origin) and the
    target (not sent to it); laps ``copy`` on ``laps``."""
    central, target_holds = holders
    fetched = fetch_checkpoint(origin, here, warm=True, known=central)
    report.state_bytes, report.shipped_bytes = len(fetched.data), fetched.shipped
    report.sent_bytes = install_checkpoint(target, here, fetched.data, fetched.digest, target_holds)
    laps.lap("copy")
    return fetched.info


def _follow_capped(
    report: MigrationReport,
    here: str,
    origin: ServiceClient,
    target: ServiceClient,
    placed: dict,
    info: CheckpointInfo,
    epoch: int,
    timeout_s: float,
    rounds: int,
    laps: Stopwatch,
) -> None:
    """Start the installed copy behind a gate capped at the copy's offset (it re-executes
    its last batch without emitting: workers up, state loaded), then let it follow the
    origin for a few rounds (:func:`_converge`); laps ``warm`` and ``converge`` on ``laps``."""
    limit = info.offset
    gate = Gate(mode=GateMode.CAP, limit=limit) if limit else Gate(mode=GateMode.HOLD)
    target.put(
        here,
        json={"element": placed, "fresh": False, "gate": gate.model_dump(mode="json"),
              "epoch": epoch},
    )  # fmt: skip
    if info.batch is not None:
        _wait_progress(target, here, progress_of(limit), timeout_s, "warming up", report)
    laps.lap("warm")
    _converge(report, here, origin, target, timeout_s, rounds)
    laps.lap("converge")


def _finish(
    report: MigrationReport,
    watch: Stopwatch,
    here: str,
    origin: ServiceClient,
    target: ServiceClient,
    where: tuple[CheckpointInfo, ElementProgress, ElementProgress],
    paused_at: float,
    live_wait_s: float,
    pending: Callable[[Offset | None], bool] | None = None,
) -> None:
    """After the routing change: remove the origin (left to the reconciler if its node does
    not answer: it writes nothing any more) while measuring the downtime — until the target
    has processed input beyond ``where``'s position (the pause, or the fence), or no input
    came (``pending``, see :func:`_measure_downtime`). Measured after the removal, the
    downtime counted its round trip (on a 500 ms link, most of it)."""
    info, position, live = where
    refused: list[FogshiftError] = []

    def remove() -> None:
        try:
            origin.delete(here, params={"discard": True})
        except FogshiftError as exc:
            refused.append(exc)
        watch.lap("finalize")

    removal = threading.Thread(target=remove, name=f"remove {here}", daemon=True)
    removal.start()
    try:
        _measure_downtime(report, here, target, live, position, paused_at, live_wait_s,
                          pending)  # fmt: skip
    except FogshiftError as exc:
        report.warnings.append(f"{DOWNTIME_FAILED}: {exc.message}")
    removal.join()
    for error in refused:
        report.warnings.append(f"the origin on {report.origin} was not removed: {error.message}")
        log.warning("migration of %s/%s: the origin on %s was not removed (left to the "
                    "reconciler): %s", report.pipeline, report.element, report.origin,
                    error.message)  # fmt: skip
    report.status = MigrationStatus.MIGRATED
    report.caught_up_events = max(0, position.progress - progress_of(info.offset))


def _undo_handover(
    pipeline: str,
    element: ElementSpec,
    origin: tuple[str, ServiceClient],
    target: tuple[str, ServiceClient],
    epoch: int,
    fence: Callable[[], int],
    started: bool,
) -> Rollback:
    """Roll a handover back; never raises.

    The target is discarded. If it was ever asked to run it may have appended under its
    epoch, which would refuse the origin's appends: the PE is fenced under a newer epoch still
    and the origin restarted under it (from its own checkpoint). If it never ran, the origin
    (never paused) just goes on under ``epoch``, its own (the handover takes its epoch only
    once the target is about to start).
    """
    origin_name, (target_name, target_agent) = origin[0], target
    path = _path(pipeline, element.id)
    result = Rollback(resumed=False, epoch=epoch)
    try:
        target_agent.delete(path, params={"discard": True})
    except UnknownElement:
        pass
    except Exception as exc:  # (a rollback never raises: it reports what it could not do)
        result.notes.append(f"discarding the target on {target_name} failed: {_said(exc)}")
    if not started:
        # Never paused, the origin runs on, if its node does: asked, not assumed (a handover
        # whose origin's node died while the target was prepared reported "runs again").
        try:
            now = origin[1].call(ElementProgress, "GET", path + "/progress", timeout=10.0)
        except Exception as exc:
            result.notes.append(f"the origin on {origin_name} does not answer: {_said(exc)}")
            return result
        if now.state not in (PEState.RUNNING, PEState.PAUSED):
            result.notes.append(f"the origin on {origin_name} is {now.state}: {now.error}")
            return result
        result.resumed = True
        return result
    try:
        _restart_fenced(element, origin, path, fence, result)
    except Exception as exc:
        result.notes.append(f"running the origin on {origin_name} again failed: {_said(exc)}")
        return result
    result.resumed = True
    return result


def _said(exc: Exception) -> str:
    """What a step of a rollback failed with, for its notes."""
    return exc.message if isinstance(exc, FogshiftError) else f"{type(exc).__name__}: {exc}"


def _restart_fenced(
    element: ElementSpec,
    origin: tuple[str, ServiceClient],
    path: str,
    fence: Callable[[], int],
    result: Rollback,
) -> None:
    """Fence the PE under a new epoch and start the origin again under it, from its own
    checkpoint (a running or paused query keeps its epoch: it is stopped first; unknown
    there, its agent restarted and forgot it, and it is started afresh). A start the agent
    took but whose query failed (its answer's state) is ``result.halted``, as a resume's
    is: the report said "runs on the origin again" of a PE that had failed there."""
    origin_name, origin_agent = origin
    result.epoch = fence()
    with contextlib.suppress(UnknownElement):
        origin_agent.delete(path)
    placed = element.model_copy(update={"node": origin_name}).model_dump(mode="json")
    said = origin_agent.put(path, json={"element": placed, "fresh": False, "epoch": result.epoch})
    result.notes.append(
        f"the PE was fenced under epoch {result.epoch} and the origin restarted under it"
    )
    state = said.get("state") if isinstance(said, dict) else None
    if state in (PEState.FAILED, PEState.FENCED, PEState.STOPPED):
        result.halted = f"{state} ({said.get('error')})"
        result.notes.append(f"the origin on {origin_name} is {result.halted}")


class _NoInput(Exception):
    """No input beyond a migration's pause came soon after its switch (see
    :func:`_measure_downtime`)."""


def _measure_downtime(
    report: MigrationReport,
    here: str,
    target: ServiceClient,
    live: ElementProgress,
    position: ElementProgress,
    paused_at: float,
    live_wait_s: float,
    pending: Callable[[Offset | None], bool] | None = None,
) -> None:
    """Set ``downtime_ms`` once the target commits input beyond the pause position (``None``
    if no new input arrives within ``live_wait_s``, or, as ``pending`` tells, none has come
    within :data:`IDLE_INPUT_S` of the switch: nothing is down while no input comes, and
    the command would answer only at the end of the wait)."""
    switched = time.monotonic()
    looked = switched
    last: ElementProgress | None = None

    def moved_on() -> bool:
        nonlocal looked, last
        # Each request but the first waits at the target until its answer differs (a long
        # poll): the commit is seen when Spark reports it, which is what the downtime is.
        wait_s = min(MOVED_ON_POLL_S, switched + live_wait_s - time.monotonic())
        info_now = last = (
            live
            if live.progress > position.progress
            else target.call(
                ElementProgress, "GET", here + "/progress", params=progress_params(last, wait_s)
            )
        )
        report.observe(report.target, info_now)
        if info_now.progress > position.progress:
            return True
        now = time.monotonic()
        if pending is not None and now - switched >= IDLE_INPUT_S and now - looked >= 0.5:
            looked = now
            if not pending(position.offset):
                raise _NoInput
        return False

    with contextlib.suppress(WaitTimedOut, _NoInput):  # no new input: the downtime stays unknown
        wait_until(moved_on, live_wait_s, interval_s=0.02, describe=f"{here} beyond the pause")
        report.downtime_ms = round((time.perf_counter() - paused_at) * 1000, 1)


def _converge(
    report: MigrationReport,
    path: str,
    origin: ServiceClient,
    target: ServiceClient,
    timeout_s: float,
    rounds: int,
) -> None:
    """Let the warm standby follow the origin for a few rounds before the pause.

    Each round raises the standby's cap to where the origin has committed and waits for the
    standby to get there (re-processing, not emitting). What is left for the downtime is what
    the origin processes during the last round — like iterative pre-copy of VM migration.
    """
    for _ in range(rounds):
        now = origin.call(ElementProgress, "GET", path + "/progress")
        report.observe(report.origin, now)
        current = target.call(ElementProgress, "GET", path + "/progress")
        if now.offset is None or now.progress <= current.progress:
            return
        cap = Gate(mode=GateMode.CAP, limit=now.offset)
        target.put(path + "/gate", json={"gate": cap.model_dump(mode="json")})
        _wait_progress(target, path, now.progress, timeout_s, "following",
                       report)  # fmt: skip


class Fetched(NamedTuple):
    """A PE's checkpoint as :func:`fetch_checkpoint` got it: the whole archive, its sha256,
    what it holds, and the bytes that came from the node (fewer when a store held files)."""

    data: bytes
    digest: str
    info: CheckpointInfo
    shipped: int


def fetch_checkpoint(
    agent: ServiceClient, path: str, warm: bool, known: KnownBlobs | None = None
) -> Fetched:
    """A PE's checkpoint from its agent (``path`` is its element path); ``warm`` takes it
    from the running query without pausing it.

    With ``known`` (the central store's files of this PE), the agent leaves out the files
    the store holds and they are taken from it here (checked by digest): over a slow link a
    large state is not shipped again, only what changed since the store's last pull. Of a
    large file the store lacks, only the chunks it holds in none of the PE's files cross
    (RocksDB rewrites its files whole). A file or chunk the store no longer has makes it ask
    for the whole checkpoint instead.
    """
    digests = sorted(known.digests) if known is not None else []
    if digests:
        asked: dict[str, Any] = {"warm": warm, "known": digests}
        if known is not None and known.chunks:
            asked["known_chunks"] = sorted(known.chunks)
        response = agent.raw("POST", path + "/checkpoint", json=asked)
    else:
        response = agent.raw("GET", path + "/checkpoint", params={"warm": warm})
    data, digest = response.content, response.headers[SHA_HEADER]
    info = CheckpointInfo.model_validate_json(response.headers[INFO_HEADER])
    if known is None or not digests:
        return Fetched(data, digest, info, len(data))
    if hashlib.sha256(data).hexdigest() != digest:
        raise TornCheckpoint(f"checkpoint of {path} changed in transit")
    try:
        filled = fill_omitted(data, known.path, known.chunk)
    except TornCheckpoint as exc:
        log.info("checkpoint of %s: %s; fetching it whole", path, exc.message)
        return fetch_checkpoint(agent, path, warm)
    whole, whole_digest = filled if filled is not None else (data, digest)
    return Fetched(whole, whole_digest, info, len(data))


def install_checkpoint(
    agent: ServiceClient, path: str, data: bytes, digest: str, held: KnownBlobs | None = None
) -> int:
    """Put a checkpoint from :func:`fetch_checkpoint` in place on an agent (the PE must not
    run there); returns the bytes sent.

    With ``held`` (what the agent holds as the PE's backup: its replica's files and their
    chunks), those are left out and the agent takes them from its replicas: a whole-PE move
    to the planned backup node sends what changed since the replica, not the state. If the
    agent no longer holds one of them, the checkpoint goes whole.
    """
    lean = lean_archive(data, held.digests, held.chunks) if held is not None else None
    if lean is not None:
        try:
            agent.raw("PUT", path + "/checkpoint", content=lean[0], headers={SHA_HEADER: lean[1]})
            return len(lean[0])
        except TornCheckpoint as exc:
            log.info("checkpoint of %s without its backup's files: %s; sent whole", path,
                     exc.message)  # fmt: skip
    agent.raw("PUT", path + "/checkpoint", content=data, headers={SHA_HEADER: digest})
    return len(data)


@dataclass
class Rollback:
    """What :func:`roll_back` achieved.

    Attributes:
        resumed: The origin runs again (its gate open, or restarted).
        epoch: The epoch it runs under (new if the PE had to be fenced).
        notes: What went wrong on the way, for the report.
        halted: The state (and error) the resumed origin said it is in, if it does not
            run for all that (failed, fenced or stopped before the migration began).
    """

    resumed: bool
    epoch: int
    notes: list[str] = field(default_factory=list)
    halted: str | None = None


def roll_back(
    pipeline: str,
    element: ElementSpec,
    origin: tuple[str, ServiceClient],
    target: tuple[str, ServiceClient],
    epoch: int,
    fence: Callable[[], int] | None,
    unanswered: bool = False,
) -> Rollback:
    """Discard the target instance, then run the origin again; never raises.

    If the target cannot be discarded it may still write (its gate may have opened): the PE
    is fenced under a new epoch and the origin restarted under it, so exactly one instance
    writes under the newest epoch. Used by a failing migration and by the orchestrator's
    recovery of a migration it left unfinished before the routing change.

    Args:
        fence: See :attr:`MigrationSteps.fence`; ``None`` when the target was never asked to
            run (nothing of it can write): the origin is resumed whatever the discard did.
        unanswered: The request starting the target got no answer: it may be carried out
            after the discard, so the PE is fenced under a new epoch whatever the discard
            said.
    """
    (origin_name, origin_agent), (target_name, target_agent) = origin, target
    path = _path(pipeline, element.id)
    result = Rollback(resumed=False, epoch=epoch)
    try:
        target_agent.delete(path, params={"discard": True})
        target_stopped = True
    except UnknownElement:
        target_stopped = True  # it never started there: nothing can write from it
    except Exception as exc:  # (never raises: whatever failed is reported)
        target_stopped = False
        result.notes.append(f"discarding the target on {target_name} failed: {_said(exc)}")
        log.warning("rollback of %s/%s: the target on %s could not be discarded: %s",
                    pipeline, element.id, target_name, _said(exc))  # fmt: skip
    try:
        if fence is None or (target_stopped and not unanswered):
            said = origin_agent.post(path + "/resume")
            # Its gate is open again, but a query that had failed (a processor that breaks
            # on every restart) or was fenced does not run for that: said so, not "runs on
            # the origin again" (the pause of a failed query is what failed).
            state = said.get("state") if isinstance(said, dict) else None
            if state in (PEState.FAILED, PEState.FENCED, PEState.STOPPED):
                result.halted = f"{state} ({said.get('error')})"
                result.notes.append(f"the origin on {origin_name} is {result.halted}")
        else:
            _restart_fenced(element, origin, path, fence, result)
    except Exception as exc:
        result.notes.append(f"running the origin on {origin_name} again failed: {_said(exc)}")
        log.warning("rollback of %s/%s: the origin on %s does not run again: %s",
                    pipeline, element.id, origin_name, _said(exc))  # fmt: skip
        return result
    result.resumed = True
    return result
