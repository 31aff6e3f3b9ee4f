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

``downtime_ms`` runs from the pause until the target commits its first batch beyond the
origin's pause position.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from fogshift.agent.app import INFO_HEADER, SHA_HEADER
from fogshift.checkpoint.spark_dir import progress_of
from fogshift.common.http import ServiceClient
from fogshift.common.progress import wait_for_progress
from fogshift.exceptions import FogshiftError
from fogshift.migration.exceptions import MigrationFailed
from fogshift.spec.models import ElementSpec

Mode = Literal["precopy", "literal"]


@dataclass
class MigrationReport:
    """What ``fogshift migrate --json`` prints."""

    pipeline: str
    element: str
    origin: str
    target: str
    mode: Mode
    status: str = "running"
    state_bytes: int = 0
    phases_ms: dict[str, float] = field(default_factory=dict)
    downtime_ms: float | None = None
    caught_up_events: int = 0
    error: str | None = None
    rolled_back: bool = False
    #: ``[ms since start, node, committed batch, input progress, last batch ms]`` as observed.
    trace: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._t0 = time.perf_counter()

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def observe(self, node: str, info: dict[str, Any]) -> None:
        """Add a progress observation to the trace when it differs from the last one."""
        row = [node, info.get("committed_batch"), info.get("progress"), info.get("last_batch_ms")]
        if not self.trace or self.trace[-1][1:] != row:
            self.trace.append([round((time.perf_counter() - self._t0) * 1000, 1), *row])


class Stopwatch:
    """Named phase timings in milliseconds."""

    def __init__(self, report: MigrationReport) -> None:
        self.report = report
        self.started = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.report.phases_ms[phase] = round((now - self.started) * 1000, 1)
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
) -> dict[str, Any]:
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
    mode: Mode = "precopy",
    timeout_s: float = 120.0,
    live_wait_s: float = 30.0,
    on_routing_change: Any = None,
    precopy_rounds: int = 3,
    epoch: int = 1,
) -> MigrationReport:
    """Move a running PE from ``origin`` to ``target``; see the module docstring.

    Args:
        on_routing_change: Called with no argument once the target is live and before the
            origin is detached: the caller updates the routing state there.
        epoch: The PE's current epoch; the target writes under the same one (the origin is
            paused, then detached: the two never write concurrently).

    Returns:
        The report (status ``migrated``). On failure a :class:`MigrationFailed` carries
        the report in its ``report`` attribute, after the rollback.
    """
    origin_name, origin_agent = origin
    target_name, target_agent = target
    report = MigrationReport(pipeline, element.id, origin_name, target_name, mode)
    watch = Stopwatch(report)
    here = _path(pipeline, element.id)
    placed = element.model_copy(update={"node": target_name}).model_dump(mode="json")
    paused_at: float | None = None
    info: dict[str, Any] = {}
    try:
        if mode == "precopy":
            data, digest, info = _fetch_checkpoint(origin_agent, here, warm=True)
            report.state_bytes = len(data)
            _install(target_agent, here, data, digest)
            limit = info["offset"]
            gate = {"mode": "cap", "limit": limit} if limit else {"mode": "hold"}
            target_agent.put(
                here, json={"element": placed, "fresh": False, "gate": gate, "epoch": epoch}
            )
            if info["batch"] is not None:
                # The re-executed batch commits: workers are up, state is loaded.
                _wait_progress(target_agent, here, progress_of(limit), timeout_s,
                               "warming up", report)  # fmt: skip
            _converge(report, here, origin_agent, target_agent, timeout_s, precopy_rounds)
            watch.lap("prepare")
        paused_at = time.perf_counter()
        position = origin_agent.post(here + "/pause", params={"timeout_s": timeout_s})
        report.observe(origin_name, position)
        watch.lap("pause")
        if mode == "literal":
            data, digest, info = _fetch_checkpoint(origin_agent, here, warm=False)
            report.state_bytes = len(data)
            watch.lap("state")
            _install(target_agent, here, data, digest)
            target_agent.put(here, json={"element": placed, "fresh": False, "epoch": epoch})
        else:
            watch.lap("state")  # the position is in the pause answer: nothing to ship
            target_agent.put(here + "/gate", json={"gate": None})
        live = _wait_progress(target_agent, here, position["progress"], timeout_s,
                              "catching up", report)  # fmt: skip
        watch.lap("invoke")
        if on_routing_change is not None:
            on_routing_change()
        origin_agent.delete(here, params={"discard": True})
        watch.lap("finalize")
        report.status = "migrated"
        report.caught_up_events = max(0, position["progress"] - progress_of(info.get("offset")))
    except FogshiftError as exc:
        report.error = exc.render()
        report.status = "failed"
        _rollback(report, here, origin_agent, target_agent)
        failure = MigrationFailed(
            f"migration of {pipeline}/{element.id} from {origin_name} to {target_name} failed "
            f"and was rolled back: {exc.message}",
            hint=f"{element.id} runs on {origin_name} again",
        )
        failure.report = report  # type: ignore[attr-defined]
        raise failure from exc
    # Downtime ends when the target has processed input beyond the pause position.
    assert paused_at is not None
    deadline = time.monotonic() + live_wait_s
    while time.monotonic() < deadline:
        info_now = (
            live
            if live["progress"] > position["progress"]
            else target_agent.get(here + "/progress")
        )
        report.observe(target_name, info_now)
        if info_now["progress"] > position["progress"]:
            report.downtime_ms = round((time.perf_counter() - paused_at) * 1000, 1)
            break
        time.sleep(0.02)
    return report


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
        now = origin.get(path + "/progress")
        report.observe(report.origin, now)
        current = target.get(path + "/progress")
        if now["offset"] is None or now["progress"] <= current["progress"]:
            return
        target.put(path + "/gate", json={"gate": {"mode": "cap", "limit": now["offset"]}})
        _wait_progress(target, path, now["progress"], timeout_s, "following",
                       report)  # fmt: skip


def _fetch_checkpoint(
    agent: ServiceClient, path: str, warm: bool
) -> tuple[bytes, str, dict[str, Any]]:
    response = agent.raw("GET", path + "/checkpoint", params={"warm": warm})
    return response.content, response.headers[SHA_HEADER], json.loads(response.headers[INFO_HEADER])


def _install(agent: ServiceClient, path: str, data: bytes, digest: str) -> None:
    agent.raw("PUT", path + "/checkpoint", content=data, headers={SHA_HEADER: digest})


def _rollback(
    report: MigrationReport, path: str, origin: ServiceClient, target: ServiceClient
) -> None:
    """Discard the target instance and resume the origin; never raises."""
    with contextlib.suppress(FogshiftError):  # the target may be gone: nothing to discard
        target.delete(path, params={"discard": True})
    try:
        origin.post(path + "/resume")
    except FogshiftError as exc:
        report.error = f"{report.error}; resuming the origin failed too: {exc.message}"
        return
    report.rolled_back = True
