"""A migration's rollback never raises: whatever a step fails with, it reports it (stand-in
agents over real HTTP)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fogshift.common.headers import INFO_HEADER, SHA_HEADER
from fogshift.common.http import ServiceClient
from fogshift.contracts import MigrationMode
from fogshift.exceptions import Unavailable
from fogshift.migration.exceptions import MigrationFailed, MigrationRouted
from fogshift.migration.procedure import MigrationSteps, migrate, roll_back
from fogshift.spec.models import ElementSpec
from tests.orchestrator.standin import standins

HERE = "/pipelines/p/elements/aggregate"
ELEMENT = ElementSpec.model_validate({
    "id": "aggregate", "kind": "window-aggregate", "node": "fog-a", "inputs": ["source"],
    "options": {"field": "value", "window": 3}})  # fmt: skip


def _broker_refuses() -> int:
    # What nats-py raised from a fence while JetStream answered 503 (a broker restart).
    from nats.js.errors import ServiceUnavailableError

    raise ServiceUnavailableError(code=503, description="JetStream not ready")


def _bug() -> int:
    raise KeyError("epoch")


@pytest.mark.parametrize("fence", [_broker_refuses, _bug])
def test_a_fence_that_raises_anything_is_reported_not_raised(fence: Callable[[], int]) -> None:
    with standins("fog-a", "fog-b") as agents:
        agents["fog-b"].fail("DELETE", HERE)  # the target may still write: fence
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        undone = roll_back("p", ELEMENT, ("fog-a", clients["fog-a"]),
                           ("fog-b", clients["fog-b"]), 1, fence)  # fmt: skip
    assert undone.resumed is False and undone.epoch == 1
    assert any("running the origin on fog-a again failed" in n for n in undone.notes), undone
    # Never resumed at the old epoch while the target may write.
    assert agents["fog-a"].received("POST", HERE + "/resume") == []


@pytest.mark.parametrize("origin_state", ["failed", "running"])
def test_a_rollback_that_restarts_the_origin_says_whether_its_query_runs(
    origin_state: str,
) -> None:
    # The target could not be discarded, so the origin was fenced and restarted: the agent
    # takes a start whose query fails (its answer's state), and the rollback said "runs on
    # fog-a again" of a PE that had failed there.
    with standins("fog-a", "fog-b") as agents:
        agents["fog-b"].fail("DELETE", HERE)
        error = "ValueError: no field 'value'"
        agents["fog-a"].answer("PUT", HERE, body={
            "pipeline": "p", "element": "aggregate", "state": origin_state,
            "error": error if origin_state == "failed" else None})  # fmt: skip
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        undone = roll_back("p", ELEMENT, ("fog-a", clients["fog-a"]),
                           ("fog-b", clients["fog-b"]), 1, lambda: 2)  # fmt: skip
    assert undone.resumed and undone.epoch == 2, undone
    assert len(agents["fog-a"].received("PUT", HERE)) == 1
    if origin_state == "failed":
        assert undone.halted == f"failed ({error})", undone
        assert f"the origin on fog-a is failed ({error})" in undone.notes, undone
    else:
        assert undone.halted is None, undone


class _DiesOnceTheTargetIsLive(ServiceClient):
    """The origin's agent, whose node goes down once the target's gate has opened."""

    def __init__(self, url: str, target: Any) -> None:
        super().__init__(url, "t" * 32, "fog-a")
        self.target = target

    def raw(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.target.received("PUT", HERE + "/gate"):
            raise Unavailable("node agent 'fog-a' cannot be reached: ConnectError")
        return super().raw(method, path, **kwargs)


def test_a_handover_whose_origin_dies_once_the_target_is_live_completes_on_the_target() -> None:
    # Rolled back, the live target (the one instance that ran) was discarded and the PE
    # left to a restore from an older checkpoint, or to nobody with recovery off.
    offset = {"type": "jetstream", "positions": {"source": 30}}
    pe = {"pipeline": "p", "element": "aggregate"}
    with standins("fog-a", "fog-b") as agents:
        info = json.dumps({"batch": 3, "offset": offset})
        agents["fog-a"].answer("GET", HERE + "/checkpoint", content=b"checkpoint",
                               headers={SHA_HEADER: "0" * 64, INFO_HEADER: info})  # fmt: skip
        running = {**pe, "state": "running", "offset": offset}
        agents["fog-a"].answer("GET", HERE + "/progress",
                               body={**running, "committed_batch": 3, "progress": 30})  # fmt: skip
        agents["fog-b"].answer("GET", HERE + "/progress",
                               body={**running, "committed_batch": 4, "progress": 31})  # fmt: skip
        origin = _DiesOnceTheTargetIsLive(agents["fog-a"].url, agents["fog-b"])
        target = ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b")
        calls: list[str] = []
        steps = MigrationSteps(
            route=lambda: calls.append("route"), fence=lambda: calls.append("fence") or 9,
            bump=lambda: 2, mark=lambda epoch: calls.append(f"mark {epoch}"),
        )  # fmt: skip
        report = migrate("p", ELEMENT, ("fog-a", origin), ("fog-b", target),
                         MigrationMode.HANDOVER, timeout_s=5, live_wait_s=0.1,
                         steps=steps)  # fmt: skip
    assert report.status == "migrated" and report.epoch == 2, report
    assert calls == ["mark 2", "route"]  # the origin cut off under the target's epoch
    assert agents["fog-b"].received("DELETE", HERE) == []
    assert any("took over without it" in w for w in report.warnings), report.warnings


@pytest.mark.parametrize("origin_runs", [True, False])
def test_a_handover_that_failed_before_its_target_ran_asks_whether_the_origin_runs(
    origin_runs: bool,
) -> None:
    # The origin's node died while the target was prepared (its checkpoint could not be
    # copied): the report said "rolled back, runs on fog-a again" without asking it.
    with standins("fog-a", "fog-b") as agents:
        agents["fog-a"].fail("GET", HERE + "/checkpoint")
        if origin_runs:
            agents["fog-a"].answer("GET", HERE + "/progress", body={
                "pipeline": "p", "element": "aggregate", "state": "running",
                "committed_batch": 3, "progress": 30})  # fmt: skip
        else:
            agents["fog-a"].fail("GET", HERE + "/progress")
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        bumps: list[int] = []
        steps = MigrationSteps(route=lambda: None, fence=lambda: 9,
                               bump=lambda: bumps.append(2) or 2,
                               mark=lambda epoch: None)  # fmt: skip
        with pytest.raises(MigrationFailed) as failed:
            migrate("p", ELEMENT, ("fog-a", clients["fog-a"]), ("fog-b", clients["fog-b"]),
                    MigrationMode.HANDOVER, timeout_s=5, steps=steps, epoch=1)  # fmt: skip
    report = failed.value.report  # type: ignore[attr-defined]
    assert report.rolled_back is origin_runs, report
    # No newer epoch for a target that never started: with one, the reconciler restarted
    # the healthy origin fenced under the epoch after it (downtime for nothing).
    assert bumps == [] and report.epoch == 1, report
    if not origin_runs:
        assert "does not answer" in (report.error or "") + " ".join(report.warnings), report


def test_a_pause_that_gives_up_is_answered_by_the_agent_not_cut_off_by_the_client() -> None:
    # The agent gives up pausing after timeout_s from when the request reached it, resumes
    # the PE and says why; the client's bound was the same, started at the send, so it ran
    # out first and the migration failed with "cannot be reached" instead.
    with standins("fog-a", "fog-b") as agents:
        refusal = {"code": "node_not_ready", "message": "aggregate reached no batch boundary"}
        agents["fog-a"].answer("POST", HERE + "/pause", 409, refusal)
        came, answer = agents["fog-a"].hold("POST", HERE + "/pause")
        pause_s = 0.5
        origin = ServiceClient(agents["fog-a"].url, "t" * 32, "fog-a", timeout_s=pause_s)
        target = ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b")

        def agent_gives_up() -> None:  # answers after the pause's bound, as the agent does
            came.wait(10)
            time.sleep(pause_s * 2)
            answer.set()

        threading.Thread(target=agent_gives_up, daemon=True).start()
        with pytest.raises(MigrationFailed) as failed:
            migrate("p", ELEMENT, ("fog-a", origin), ("fog-b", target),
                    MigrationMode.LITERAL, timeout_s=pause_s, steps=MigrationSteps())  # fmt: skip
    report = failed.value.report  # type: ignore[attr-defined]
    assert "no batch boundary" in (report.error or ""), report
    assert "cannot be reached" not in (report.error or ""), report


@pytest.mark.parametrize("origin_state", ["failed", "running"])
def test_a_migration_of_a_pe_whose_query_failed_does_not_say_it_runs_again(
    origin_state: str,
) -> None:
    # The origin's query had failed (a processor that breaks on every restart): its pause
    # was refused, the rollback opened its gate, and the hint said "runs on fog-a again".
    with standins("fog-a", "fog-b") as agents:
        error = "ValueError: no field 'value'"
        refusal = {"code": "node_not_ready", "message": f"aggregate cannot pause: {error}"}
        agents["fog-a"].answer("POST", HERE + "/pause", 409, refusal)
        agents["fog-a"].answer("POST", HERE + "/resume", body={
            "pipeline": "p", "element": "aggregate", "state": origin_state,
            "error": error if origin_state == "failed" else None})  # fmt: skip
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        with pytest.raises(MigrationFailed) as failed:
            migrate("p", ELEMENT, ("fog-a", clients["fog-a"]), ("fog-b", clients["fog-b"]),
                    MigrationMode.PRECOPY, timeout_s=5, steps=MigrationSteps())  # fmt: skip
    report = failed.value.report  # type: ignore[attr-defined]
    assert report.rolled_back, report  # (nothing changed: it ran nowhere else before)
    hint = failed.value.hint or ""
    if origin_state == "failed":
        assert "runs on fog-a again" not in hint, hint
        assert f"is on fog-a as before, failed ({error})" in hint, hint
        assert f"the origin on fog-a is failed ({error})" in (report.error or ""), report
    else:
        assert hint == "aggregate runs on fog-a again (epoch 1)", hint


def test_a_migration_a_full_disk_refused_points_to_a_restore() -> None:
    # The origin's full disk refused the pause's gate file: rolled back, the hint said only
    # that the PE ran there again, where a restore (which writes nothing there) moves it.
    with standins("fog-a", "fog-b") as agents:
        said = ("POST /pipelines/p/elements/aggregate/pause failed: OSError: [Errno 28] No "
                "space left on device: '/home/fog-a/gates/aggregate.tmp'")  # fmt: skip
        agents["fog-a"].answer("POST", HERE + "/pause", 500, {"code": "error", "message": said})
        agents["fog-a"].answer(
            "POST",
            HERE + "/resume",
            body={"pipeline": "p", "element": "aggregate", "state": "running", "error": None},
        )
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        with pytest.raises(MigrationFailed) as failed:
            migrate("p", ELEMENT, ("fog-a", clients["fog-a"]), ("fog-b", clients["fog-b"]),
                    MigrationMode.LITERAL, timeout_s=5, steps=MigrationSteps())  # fmt: skip
    assert failed.value.report.rolled_back  # type: ignore[attr-defined]
    assert "No space left on device" in failed.value.message
    hint = failed.value.hint or ""
    assert hint.startswith("aggregate runs on fog-a again (epoch 1); a disk is full (fog-a's or")
    assert "`fogshift restore p aggregate --to NODE`" in hint, hint


def test_a_literal_start_that_got_no_answer_is_fenced_out_not_trusted_discarded() -> None:
    # The target's start request timed out; the rollback's discard then found nothing (the
    # agent took it first) and the origin was resumed under the same epoch: the start,
    # carried out later, made a second live instance under it.
    offset = {"type": "jetstream", "positions": {"source": 30}}
    with standins("fog-a", "fog-b") as agents:
        agents["fog-a"].answer("POST", HERE + "/pause", body={
            "pipeline": "p", "element": "aggregate", "state": "paused", "committed_batch": 3,
            "offset": offset, "progress": 30})  # fmt: skip
        info = json.dumps({"batch": 3, "offset": offset})
        agents["fog-a"].answer("GET", HERE + "/checkpoint", content=b"checkpoint",
                               headers={SHA_HEADER: "0" * 64, INFO_HEADER: info})  # fmt: skip
        _, answer = agents["fog-b"].hold("PUT", HERE)  # the start gets no answer in time
        origin = ServiceClient(agents["fog-a"].url, "t" * 32, "fog-a")
        target = ServiceClient(agents["fog-b"].url, "t" * 32, "fog-b", timeout_s=1.0)
        fenced: list[int] = []
        steps = MigrationSteps(fence=lambda: fenced.append(2) or 2)
        try:
            with pytest.raises(MigrationFailed) as failed:
                migrate("p", ELEMENT, ("fog-a", origin), ("fog-b", target),
                        MigrationMode.LITERAL, timeout_s=5, steps=steps)  # fmt: skip
        finally:
            answer.set()
    report = failed.value.report  # type: ignore[attr-defined]
    assert fenced == [2] and report.epoch == 2, report
    assert agents["fog-a"].received("POST", HERE + "/resume") == []  # not under epoch 1
    (restart,) = agents["fog-a"].received("PUT", HERE)
    assert restart.body["epoch"] == 2


def test_a_literal_migrations_downtime_and_catch_up_leave_out_the_origins_removal() -> None:
    # The downtime was measured after the origin's DELETE: it counted that round trip (on a
    # 500 ms link, most of the figure). And a literal migration reported the PE's whole
    # input position as caught up: its checkpoint's offset was never looked at.
    import threading
    import time

    offset = {"type": "jetstream", "positions": {"source": 500}}
    pe = {"pipeline": "p", "element": "aggregate"}
    with standins("fog-a", "fog-b") as agents:
        agents["fog-a"].answer(
            "POST",
            HERE + "/pause",
            body={**pe, "state": "paused", "committed_batch": 3, "offset": offset, "progress": 500},
        )
        info = json.dumps({"batch": 3, "offset": offset})
        agents["fog-a"].answer("GET", HERE + "/checkpoint", content=b"checkpoint",
                               headers={SHA_HEADER: "0" * 64, INFO_HEADER: info})  # fmt: skip
        agents["fog-b"].answer("GET", HERE + "/progress", body={
            **pe, "state": "running", "committed_batch": 4, "progress": 501})  # fmt: skip
        came, answer = agents["fog-a"].hold("DELETE", HERE)  # a slow removal of the origin

        def release() -> None:
            came.wait(10)
            time.sleep(1.0)
            answer.set()

        threading.Thread(target=release, daemon=True).start()
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        report = migrate("p", ELEMENT, ("fog-a", clients["fog-a"]),
                         ("fog-b", clients["fog-b"]), MigrationMode.LITERAL, timeout_s=5,
                         live_wait_s=2, steps=MigrationSteps())  # fmt: skip
    assert report.status == "migrated", report
    assert report.phases_ms["finalize"] >= 900, report.phases_ms  # the removal took 1 s
    assert report.downtime_ms is not None and report.downtime_ms < 800, report
    assert report.caught_up_events == 0, report


def switch_at(agents: dict[str, Any], position: int) -> dict[str, Any]:
    """A literal switch of the aggregate at input ``position``: fog-a pauses there and
    serves its checkpoint, fog-b reports running there. Returns the pause's offset."""
    offset = {"type": "jetstream", "positions": {"source": position}}
    pe = {"pipeline": "p", "element": "aggregate"}
    at_pause = {"committed_batch": 3, "offset": offset, "progress": position}
    agents["fog-a"].answer("POST", HERE + "/pause", body={**pe, "state": "paused", **at_pause})
    info = json.dumps({"batch": 3, "offset": offset})
    agents["fog-a"].answer("GET", HERE + "/checkpoint", content=b"checkpoint",
                           headers={SHA_HEADER: "0" * 64, INFO_HEADER: info})  # fmt: skip
    agents["fog-b"].answer("GET", HERE + "/progress", body={**pe, "state": "running", **at_pause})
    return offset


@pytest.mark.parametrize("pending", [False, True])
def test_a_migration_waits_for_its_downtime_only_with_input_to_process(pending: bool) -> None:
    # The command waited its whole live wait (30 s) for the target to move beyond the pause
    # when no input came: a group migration's handover after the wearables' recordings had
    # ended took 30 s beyond its phases (Case 2's test on a loaded machine). A source that
    # writes every few hundred ms (E1's) has written within IDLE_INPUT_S, so its downtime is
    # measured as before.
    import time

    asked: list[Any] = []
    with standins("fog-a", "fog-b") as agents:
        offset = switch_at(agents, 500)
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        steps = MigrationSteps(pending=lambda at: asked.append(at) or pending)
        began = time.monotonic()
        report = migrate("p", ELEMENT, ("fog-a", clients["fog-a"]),
                         ("fog-b", clients["fog-b"]), MigrationMode.LITERAL, timeout_s=5,
                         live_wait_s=3 if pending else 60, steps=steps)  # fmt: skip
        took = time.monotonic() - began
        polls = len(agents["fog-b"].received("GET", HERE + "/progress"))
    assert report.status == "migrated" and report.downtime_ms is None, report
    assert asked and all(at == offset for at in asked)  # about where the origin paused
    if pending:  # input the target has not processed: waited for (to the live wait's end)
        assert took >= 3 and polls > 10, (took, polls)
    else:  # none came: given up soon after the switch, not at the live wait's end (60 s)
        assert took < 10 and asked == [offset], (took, asked)


@pytest.mark.parametrize("committed", [False, True])
def test_what_fails_after_the_routing_change_is_not_rolled_back(committed: bool) -> None:
    # The route step committed the target as the PE, then raised (the orchestrator stopped
    # at its test hold there): the rollback discarded the target the placement named and
    # resumed the origin, which the journal's recovery then took to be routed away.
    def route() -> None:
        if committed:
            raise MigrationRouted("stopped after its routing change (test)")
        raise Unavailable("the registry could not be written (test)")

    with standins("fog-a", "fog-b") as agents:
        switch_at(agents, 30)
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        steps = MigrationSteps(route=route)
        with pytest.raises(MigrationRouted if committed else MigrationFailed):
            migrate("p", ELEMENT, ("fog-a", clients["fog-a"]), ("fog-b", clients["fog-b"]),
                    MigrationMode.LITERAL, timeout_s=5, steps=steps)  # fmt: skip
        discarded = agents["fog-b"].received("DELETE", HERE)
        resumed = agents["fog-a"].received("POST", HERE + "/resume")
    if committed:  # the target runs on, the origin stays held for the recovery to remove
        assert discarded == [] and resumed == [], (discarded, resumed)
    else:  # nothing was routed: rolled back as before
        assert discarded and resumed, (discarded, resumed)
