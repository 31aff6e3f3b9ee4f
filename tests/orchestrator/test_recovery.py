"""How a restarted orchestrator resolves the operations a dead one left in its journal, and how
the reconciler mends a PE left under an old epoch or held at its gate.

A real orchestrator object and registry; real HTTP servers stand in for the node agents
(``standin``) and record what they are asked; no broker, no Spark. The journal entries are
written as the dead orchestrator would have left them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fogshift.common.waiting import wait_until
from fogshift.contracts import (
    GroupMigrationReport,
    GroupMigrationStatus,
    Heartbeat,
    KeyMoveStatus,
    MigrationMode,
    MigrationReport,
    MigrationStatus,
    PipelineState,
    ScaleReport,
)
from fogshift.exceptions import Conflict, InvalidInput, Unavailable
from fogshift.migration.exceptions import MigrationInProgress
from fogshift.orchestrator import reconciler
from fogshift.orchestrator.locks import element_lock
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec
from tests.orchestrator.standin import SPEC, StandIn, offline_config

AGG = "/pipelines/p/elements/aggregate"
#: What names the aggregate in its agent's answers (fogshift.contracts.ElementProgress).
PE = {"pipeline": "p", "element": "aggregate"}


def hosted(element: str, epoch: int = 1, gated: bool = False) -> dict[str, Any]:
    return {"pipeline": "p", "element": element, "state": "running", "epoch": epoch,
            "gated": gated}  # fmt: skip


@contextmanager
def orchestrator_of(
    tmp_path: Path, agents: dict[str, StandIn], spec: dict[str, Any]
) -> Iterator[Orchestrator]:
    """An orchestrator running ``spec`` as placed (source and sink on cloud, the aggregate on
    fog-a), every stand-in having sent a heartbeat."""
    config = offline_config(tmp_path)
    orchestrator = Orchestrator(config)
    orchestrator.registry.put_pipeline(parse_spec(spec, tmp_path), "running")
    beat(orchestrator, agents, {"cloud": [hosted("source"), hosted("sink")],
                                "fog-a": [hosted("aggregate")]})  # fmt: skip
    try:
        yield orchestrator
    finally:
        orchestrator.close()


@pytest.fixture
def orch(tmp_path: Path, agents: dict[str, StandIn]) -> Iterator[Orchestrator]:
    with orchestrator_of(tmp_path, agents, SPEC) as orchestrator:
        yield orchestrator


def beat(
    orch: Orchestrator, agents: dict[str, StandIn], elements: dict[str, list[dict[str, Any]]]
) -> None:
    """A heartbeat from every stand-in, reporting ``elements`` per node."""
    for name, agent in agents.items():
        beat = {"url": agent.url, "ready": True, "elements": elements.get(name, [])}
        orch.heartbeat(name, Heartbeat.model_validate(beat))


def left_by_dead_orchestrator(
    orch: Orchestrator, kind: str, phase: str, routed: bool = False
) -> str:
    """A journal entry moving the aggregate fog-a -> fog-b, as a killed orchestrator left it."""
    op = orch.registry.begin_operation(
        kind, "p", "aggregate", "fog-a", "fog-b", "dead0rchestr", "preparing" if kind ==
        "migration" else "fencing", new_epoch=kind == "restore",
    )  # fmt: skip
    orch.registry.advance(op.id, phase)
    if routed:
        orch.registry.route(op.id, "fog-b")
    return op.id


def calls(agents: dict[str, StandIn]) -> list[tuple[str, str, str, dict[str, str]]]:
    """Every call on any stand-in, in order: ``(node, method, path, query)``."""
    everywhere = next(iter(agents.values())).everywhere
    return [(node, c.method, c.path, c.query) for node, c in everywhere]


def outcome(orch: Orchestrator, op: str) -> str:
    """How the journal entry ``op`` ended (it must have)."""
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome is not None, entry
    return entry.outcome


def test_a_migration_left_paused_is_rolled_back_target_first(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    op = left_by_dead_orchestrator(orch, "migration", "pausing")  # the origin was paused
    # A report of an earlier migration is kept: shown after this recovery, it would pass
    # for this one's outcome.
    orch.last_migration[("p", "aggregate")] = MigrationReport(
        pipeline="p", element="aggregate", origin="fog-b", target="fog-a",
        mode=MigrationMode.LITERAL, status=MigrationStatus.MIGRATED,
    )  # fmt: skip
    decisions = orch.recover_operations()
    assert ("p", "aggregate") not in orch.last_migration
    assert orch.registry.reports("migration") == {}
    assert calls(agents) == [
        ("fog-b", "DELETE", AGG, {"discard": "true"}),  # the target cannot write any more...
        ("fog-a", "POST", AGG + "/resume", {}),  # ...before the origin runs again
    ]
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome is not None
    assert entry.outcome.startswith("recovered: rolled back: fog-a runs under epoch 1"), entry
    assert orch.registry.get_pipeline("p").placement["aggregate"] == "fog-a"  # type: ignore[union-attr]
    assert len(decisions) == 1 and "left at 'pausing'" in decisions[0]
    assert orch.registry.unfinished() == []


def test_an_entry_of_a_pipeline_deployed_anew_since_is_abandoned(
    orch: Orchestrator, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    # Stopped and deployed again before a recovery round: the old entry's rollback
    # discarded the fresh instance on its target node and resumed nothing it owned.
    op = left_by_dead_orchestrator(orch, "migration", "pausing")
    moved = {**SPEC, "elements": [
        {**e, "node": "fog-b"} if e["id"] == "aggregate" else e for e in SPEC["elements"]
    ]}  # fmt: skip
    orch.registry.put_pipeline(parse_spec(moved, tmp_path), "running")
    orch.recover_operations()
    assert agents["fog-b"].received("DELETE", AGG) == []  # the fresh instance stays
    assert agents["fog-a"].received("POST", AGG + "/resume") == []
    assert outcome(orch, op) == "recovered: abandoned: the pipeline was deployed anew since"


def test_a_migration_left_switching_is_rolled_back_under_a_new_fence(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A literal migration's target start (under the origin's epoch) may have been sent and
    # be queued at its agent behind the discard: the origin resumed under that epoch wrote
    # beside a target started from nothing.
    fenced: list[int] = []

    def fence_for(op: Any) -> int:
        fenced.append(orch.registry.next_epoch(op.pipeline, op.element, operation=op.id))
        return fenced[-1]

    monkeypatch.setattr(orch, "_fence_for", fence_for)
    op = left_by_dead_orchestrator(orch, "migration", "switching")
    orch.recover_operations()
    assert calls(agents)[0] == ("fog-b", "DELETE", AGG, {"discard": "true"})
    assert len(fenced) == 1
    restarted = agents["fog-a"].received("PUT", AGG)
    assert len(restarted) == 1 and restarted[0].body["epoch"] == fenced[0] > 1
    assert agents["fog-a"].received("POST", AGG + "/resume") == []
    assert f"runs under epoch {fenced[0]}" in outcome(orch, op)


def test_a_migration_left_after_its_routing_change_is_completed(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    op = left_by_dead_orchestrator(orch, "migration", "switching", routed=True)
    orch.recover_operations()
    assert calls(agents) == [
        ("fog-b", "PUT", AGG + "/gate", {}),
        ("fog-a", "DELETE", AGG, {"discard": "true"}),
    ]
    assert agents["fog-b"].received("PUT", AGG + "/gate")[0].body == {"gate": None}
    assert orch.registry.get_pipeline("p").placement["aggregate"] == "fog-b"  # type: ignore[union-attr]
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome == (
        "recovered: completed: fog-b is the PE, the origin was removed"
    )


def test_a_restore_whose_target_runs_under_its_epoch_is_carried_on(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    restarted: list[tuple[str, str]] = []
    monkeypatch.setattr(
        orch, "restore", lambda p, e, target=None, lost=None: restarted.append((p, e))
    )
    op = left_by_dead_orchestrator(orch, "restore", "live")  # epoch 2; the gate was capped
    agents["fog-b"].answer("GET", AGG + "/progress", body={**PE, "state": "running", "epoch": 2})
    orch.recover_operations()
    assert agents["fog-b"].received("PUT", AGG + "/gate")[0].body == {"gate": None}
    assert orch.registry.get_pipeline("p").placement["aggregate"] == "fog-b"  # type: ignore[union-attr]
    assert agents["fog-b"].received("DELETE", AGG) == [] and restarted == []
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome is not None
    assert entry.outcome.startswith("recovered: carried on"), entry


@pytest.mark.parametrize(
    ("phase", "target_says"),
    [
        ("installing", None),  # fenced, the target never started
        ("starting", {**PE, "state": "running", "epoch": 1}),  # not this restore's instance
        ("live", {**PE, "state": "fenced", "epoch": 2}),  # this restore's instance, but dead
    ],
)
def test_a_restore_left_before_its_target_ran_is_restarted(
    orch: Orchestrator,
    agents: dict[str, StandIn],
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
    target_says: dict[str, Any] | None,
) -> None:
    restarted: list[tuple[str, str, str | None]] = []
    monkeypatch.setattr(
        orch, "restore", lambda p, e, target=None, lost=None: restarted.append((p, e, lost))
    )
    op = left_by_dead_orchestrator(orch, "restore", phase)
    if target_says is not None:
        agents["fog-b"].answer("GET", AGG + "/progress", body=target_says)
    orch.recover_operations()
    assert agents["fog-b"].received("DELETE", AGG)[0].query == {"discard": "true"}
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []
    assert agents["fog-a"].calls == []  # the placed instance is the restart's business
    # Only away from where it is placed now (a user's operation waiting for the PE's
    # section moved it elsewhere before the restart: it was moved again).
    assert restarted == [("p", "aggregate", "fog-a")]
    assert orch.registry.get_pipeline("p").placement["aggregate"] == "fog-a"  # type: ignore[union-attr]
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome is not None
    assert entry.outcome.startswith("recovered: restarted"), entry


def test_a_restarted_restore_does_not_hold_up_the_reconcilers_round(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Done in the round, restore after restore (minutes each, waiting for catch-up): no
    # lost node was noticed meanwhile.
    import threading

    release, restarted = threading.Event(), []

    def restore(p: str, e: str, target: str | None = None, lost: str | None = None) -> None:
        assert release.wait(30)
        restarted.append((p, e, lost))

    monkeypatch.setattr(orch, "restore", restore)
    left_by_dead_orchestrator(orch, "restore", "installing")
    orch.reconcile_once(background=True)  # (returns while the restore waits)
    assert orch._auto_restoring == {("p", "aggregate")} and restarted == []
    orch.reconcile_once(background=True)  # (no second restore of it meanwhile)
    release.set()
    wait_until(lambda: not orch._auto_restoring or None, 30, describe="the restart ended")
    assert restarted == [("p", "aggregate", "fog-a")]


@pytest.fixture
def owed(
    tmp_path: Path, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Orchestrator, list[BaseException | None], set[str]]]:
    """An orchestrator running :data:`SPEC` with its recovery not automatic, whose every
    ``restore`` is answered by the next of ``answers`` (``None``: restored; an exception:
    raised) and whose nodes in ``away`` are not healthy (fog-a, the aggregate's, at
    first), with a restore a dead orchestrator left, restarted and failed: owed. Pauses
    start at 20 s (``reconcile_s``), none passing by itself."""
    manual = {**SPEC, "recovery": {"auto": False}}
    with orchestrator_of(tmp_path, agents, manual) as orch:
        yield _owed(orch, monkeypatch)


def _owed(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> tuple[Orchestrator, list[BaseException | None], set[str]]:
    answers: list[BaseException | None] = [Unavailable("no healthy node for p/aggregate")]
    away = {"fog-a"}

    def restore(
        pipeline: str, element: str, target: str | None = None, lost: str | None = None
    ) -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    monkeypatch.setattr(orch, "restore", restore)
    monkeypatch.setattr(orch, "healthy", lambda node: node.name not in away)
    monkeypatch.setattr(orch, "config", orch.config.model_copy(update={"reconcile_s": 20.0}))
    op = left_by_dead_orchestrator(orch, "restore", "installing")
    orch.recover_operations()
    assert outcome(orch, op).startswith("recovered: restarted") and answers == []
    return orch, answers, away


def _pause_over(orch: Orchestrator) -> float:
    """End the pause of the aggregate's owed restore; how long it was."""
    _, pause, stranded = orch._restores_owed[("p", "aggregate")]
    orch._restores_owed[("p", "aggregate")] = (0.0, pause, stranded)
    return pause


def test_a_restore_restart_that_fails_is_owed_until_its_pe_has_a_node_again(
    owed: tuple[Orchestrator, list[BaseException | None], set[str]],
) -> None:
    """The restart of a restore a dead orchestrator left was tried once: if it failed (no
    healthy node yet), its PE stayed on its dead node, with recovery off for good."""
    orch, answers, away = owed
    assert orch._restores_owed[("p", "aggregate")][2] == "fog-a"
    orch.reconcile_once()  # not before its pause (nothing to answer: it would raise)
    answers.append(Unavailable("still none"))
    assert _pause_over(orch) == 20.0
    orch.reconcile_once()  # fails again: a longer pause
    assert answers == [] and _pause_over(orch) == 40.0
    answers.append(None)
    orch.reconcile_once()
    assert answers == [] and orch._restores_owed == {}  # restored
    # One whose node is heard from again is owed nothing more (the reconciler starts it
    # there): no restore asked.
    answers.append(Unavailable("none"))
    orch._restart_restore("p", "aggregate")
    assert ("p", "aggregate") in orch._restores_owed
    away.clear()
    _pause_over(orch)
    orch.reconcile_once()
    assert orch._restores_owed == {}


def test_an_owed_restore_outlasts_a_busy_pe_and_the_unforeseen_and_ends_once_moved(
    owed: tuple[Orchestrator, list[BaseException | None], set[str]],
) -> None:
    """A round holding the PE for a moment (a standby's follow-up) ended the debt for good,
    and an error that is not fogshift's would have ended every reconcile round after."""
    orch, answers, _ = owed
    pause = _pause_over(orch)
    answers.append(MigrationInProgress("p/aggregate is held by a standby's follow-up"))
    orch.reconcile_once()
    due, again, _ = orch._restores_owed[("p", "aggregate")]
    assert answers == [] and again == pause and due <= time.monotonic()  # next round, as long
    answers.append(RuntimeError("something unforeseen"))
    orch.reconcile_once()  # logged, not raised
    assert answers == [] and _pause_over(orch) == 2 * pause
    # Placed elsewhere meanwhile (someone restored it): owed no more, nothing asked.
    orch.registry.set_placement("p", "aggregate", "fog-c")
    orch.reconcile_once()
    assert orch._restores_owed == {}


def test_a_restart_decided_that_never_succeeded_is_owed_by_the_next_orchestrator(
    tmp_path: Path, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An orchestrator that died between deciding a restore's restart and the restart's own
    entry (or while the restart was owed) left the debt in no one's memory: with recovery
    not automatic, the PE stayed on its dead node for good."""
    manual = {**SPEC, "recovery": {"auto": False}}
    with orchestrator_of(tmp_path, agents, manual) as orch:
        op = left_by_dead_orchestrator(orch, "restore", "installing")
        orch.registry.finish(op, f"recovered: {reconciler.RESTARTED}")
        # Tried once while it was owed (no healthy node then), before that one died too.
        tried = orch.registry.begin_operation(
            "restore", "p", "aggregate", "fog-a", "fog-c", "dead0rchestr", "fencing",
            new_epoch=True,
        )  # fmt: skip
        orch.registry.finish(tried.id, "failed")
        # The sink's restart did begin and succeed (an entry after it): owed nothing.
        for outcome_of in (f"recovered: {reconciler.RESTARTED}", "restored"):
            sink = orch.registry.begin_operation(
                "restore", "p", "sink", "cloud", "fog-b", "dead0rchestr", "fencing"
            )
            orch.registry.finish(sink.id, outcome_of)
        asked: list[tuple[str, str]] = []
        monkeypatch.setattr(orch, "restore", lambda pipeline, element, target=None, lost=None:
                            asked.append((pipeline, element)))  # fmt: skip
        monkeypatch.setattr(orch, "healthy", lambda node: node.name != "fog-a")
        orch.restores_owed()
        assert list(orch._restores_owed) == [("p", "aggregate")]
        due, _, stranded = orch._restores_owed[("p", "aggregate")]
        # Not before a node's silence can be judged (a node that came back is heard first).
        assert stranded == "fog-a" and due > time.monotonic() and asked == []
        _pause_over(orch)
        orch.restores_owed()
        assert asked == [("p", "aggregate")] and orch._restores_owed == {}
        # Stopped and started since (no journal entry): what the journal owed is stale.
        orch.registry.set_status("p", "stopped")  # type: ignore[arg-type]
        orch.registry.set_status("p", "running")  # type: ignore[arg-type]
        orch._owed_read = False
        orch.restores_owed()
        assert orch._restores_owed == {}


def test_an_owed_restore_is_left_to_an_automatic_recovery(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its recovery automatic, the reconciler restores the PE once its node is silent
    long enough: the debt would only restore it twice a round."""
    orch, _, _ = _owed(orch, monkeypatch)
    _pause_over(orch)
    orch.restores_owed()
    assert orch._restores_owed == {}


def test_a_handover_left_live_on_its_target_with_its_origin_gone_completes_there(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dead orchestrator's handover had made the target live under the next epoch; the
    # origin's node died too. Rolled back, the live target was discarded and the PE ran
    # nowhere (restored from an older checkpoint later, or never with recovery off).
    op = left_by_dead_orchestrator(orch, "migration", "switching")
    assert orch.registry.next_epoch("p", "aggregate", operation=op) == 2  # the handover's
    marked: list[int] = []
    monkeypatch.setattr(orch, "_mark", lambda pipeline, element, epoch: marked.append(epoch))
    agents["fog-a"].fail("GET", AGG + "/progress")
    agents["fog-b"].answer("GET", AGG + "/progress", body={**PE, "state": "running", "epoch": 2})
    (decision,) = orch.recover_operations()
    assert "took over" in decision, decision
    assert marked == [2]  # the origin (epoch 1) fenced out before the target is ungated
    assert agents["fog-b"].received("PUT", AGG + "/gate")[0].body == {"gate": None}
    assert agents["fog-b"].received("DELETE", AGG) == []
    record = orch.registry.get_pipeline("p")
    assert record is not None and record.placement["aggregate"] == "fog-b"


def test_a_handover_left_with_its_origin_running_restarts_it_fenced_above_the_target(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The target ran under the handover's epoch (2), above the origin's (1): the origin
    # was only resumed, under 1, and refused at its next append (the stream may be fenced
    # with 2), while the decision said it ran under 2.
    op = left_by_dead_orchestrator(orch, "migration", "switching")
    assert orch.registry.next_epoch("p", "aggregate", operation=op) == 2  # the handover's
    monkeypatch.setattr(orch, "_fence_for", lambda op: 3)
    agents["fog-a"].answer("GET", AGG + "/progress", body={**PE, "state": "running", "epoch": 1})
    (decision,) = orch.recover_operations()
    assert agents["fog-b"].received("DELETE", AGG), decision  # the target discarded first
    assert agents["fog-a"].received("POST", AGG + "/resume") == [], decision
    (restart,) = agents["fog-a"].received("PUT", AGG)
    assert restart.body["epoch"] == 3, restart.body
    assert "runs under epoch 3" in decision, decision


def test_an_operation_this_orchestrator_runs_is_not_recovered(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    op = left_by_dead_orchestrator(orch, "migration", "switching")
    orch._migrating[("p", "aggregate")] = "migration"  # its exclusive section is held: it runs
    assert orch.recover_operations() == []
    assert calls(agents) == []
    assert [o.id for o in orch.registry.unfinished()] == [op]


def test_an_operation_on_a_pe_with_an_unresolved_entry_is_refused_until_it_is_resolved(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # A dead orchestrator's migration made the target live; a user's migration or restore
    # asked before the new orchestrator's first round acted on the origin it had paused
    # (resumed it on failure: two writers under one epoch).
    from fogshift.migration.exceptions import MigrationInProgress

    op = left_by_dead_orchestrator(orch, "migration", "switching")
    for attempt in (lambda: orch.migrate("p", "aggregate", "cloud"),
                    lambda: orch.restore("p", "aggregate", "cloud")):  # fmt: skip
        with pytest.raises(MigrationInProgress) as refused:
            attempt()
        assert "unfinished migration (fog-a -> fog-b, phase switching)" in refused.value.message
        assert refused.value.hint and "try again" in refused.value.hint
    assert calls(agents) == []
    orch.recover_operations()
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome is not None


def test_a_migration_whose_target_cannot_be_given_its_rights_ends_its_entry(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker's config could not be rewritten for the target's rights: the entry was left
    # unfinished, and every migration and restore of the PE was refused as "unfinished"
    # until a recovery round (needing the same broker) rolled back what never began.
    from fogshift.broker.exceptions import BrokerError

    def refuse(registry: object) -> bool:
        raise BrokerError("nats-server did not reload its config (test)")

    monkeypatch.setattr(orch.permissions, "sync", refuse)
    with pytest.raises(Unavailable) as refused:
        orch.migrate("p", "aggregate", "fog-b")
    assert "could not give fog-b the PE's rights" in refused.value.message
    assert refused.value.hint and "runs on fog-a as before" in refused.value.hint
    assert orch.registry.unfinished() == []
    assert calls(agents) == []  # nothing was asked of a node: nothing paused
    assert orch.pipeline("p").placement["aggregate"] == "fog-a"


def test_a_reconcile_round_resolves_the_journal_first(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    op = left_by_dead_orchestrator(orch, "migration", "switching", routed=True)
    agents["fog-b"].fail("PUT", AGG + "/gate")  # completion goes on without it
    orch.reconcile_once()
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome is not None
    assert agents["fog-a"].received("DELETE", AGG)[0].query == {"discard": "true"}


def test_a_pe_whose_entry_cannot_be_resolved_yet_is_left_to_it(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(orch, "restore", lambda p, e, target=None, lost=None: None)
    op = left_by_dead_orchestrator(orch, "restore", "live")  # epoch 2, on fog-b
    agents["fog-b"].answer("GET", AGG + "/progress", body={**PE, "state": "running", "epoch": 2})
    agents["fog-b"].fail("PUT", AGG + "/gate")
    orch.reconcile_once()
    # fog-a's instance is under epoch 1 < 2, but the entry decides about the PE, not the
    # reconciler: nothing restarts it meanwhile.
    assert agents["fog-a"].calls == []
    assert [o.id for o in orch.registry.unfinished()] == [op]
    agents["fog-b"].answer("PUT", AGG + "/gate")
    orch.reconcile_once()
    entry = orch.registry.operation(op)
    assert entry is not None and entry.outcome is not None
    assert entry.outcome.startswith("recovered: carried on"), entry


def test_restore_onto_the_pes_own_node_is_refused_and_changes_nothing(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    with pytest.raises(InvalidInput) as refused:
        orch.restore("p", "aggregate", "fog-a")
    assert "already runs on node 'fog-a'" in refused.value.message
    assert refused.value.expected == "a node other than 'fog-a'"
    assert calls(agents) == []  # nothing fenced, installed or discarded
    assert orch.registry.epoch("p", "aggregate") == 1
    assert orch.registry.operations() == []
    assert "last heard" not in refused.value.message
    # Killed a moment ago, its node is healthy until its timeout: how long it has been
    # silent is said, and what then happens ("started there again" read as if nothing).
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 3 WHERE name = 'fog-a'")
    with pytest.raises(InvalidInput) as refused:
        orch.restore("p", "aggregate", "fog-a")
    assert re.search(r"already runs on node 'fog-a' \(last heard \d", refused.value.message)
    assert "if 'fog-a' is down, its PEs are restored elsewhere" in (refused.value.hint or "")


def test_restore_onto_the_pes_silent_node_says_it_is_not_up(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # (Not "already runs on": the PE does not run while its node is silent.)
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    with pytest.raises(InvalidInput) as refused:
        orch.restore("p", "aggregate", "fog-a")
    assert "p/aggregate is placed on node 'fog-a', which is not up" in refused.value.message
    assert "already runs" not in refused.value.message
    assert refused.value.hint is not None and "restore it on another node" in refused.value.hint
    assert calls(agents) == []
    assert orch.registry.operations() == []


@pytest.mark.parametrize("back_with", ["the old epoch", "nothing"])
def test_a_pe_behind_its_newest_epoch_is_started_again_under_a_new_one_fenced(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch,
    back_with: str,
) -> None:  # fmt: skip
    # A restore failed while fog-a was silent; fog-a is back with the PE under the old epoch,
    # or without it (its agent restarted). Epoch 2 went to the restore's target, whose last
    # step and discard got no answer: it may still write under 2. Started under 2 again,
    # fog-a's instance shared it with that one.
    fenced: list[object] = []
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30, **_: fenced.append(make) or 9)
    orch.registry.next_epoch("p", "aggregate")
    if back_with == "nothing":
        beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")], "fog-a": []})
        gone = {"code": "unknown_element", "message": "node 'fog-a' does not host p/aggregate"}
        agents["fog-a"].answer("GET", AGG + "/progress", status=404, body=gone)
        agents["fog-a"].answer("DELETE", AGG, status=404, body=gone)
    else:
        progress = {**PE, "state": "fenced", "epoch": 1}
        agents["fog-a"].answer("GET", AGG + "/progress", body=progress)
    orch.reconcile_once()
    assert [(m, q) for n, m, p, q in calls(agents) if n == "fog-a" and p == AGG] == [
        ("DELETE", {}),  # stopped (if it ran), its checkpoint kept...
        ("PUT", {}),  # ...and started again
    ]
    put = agents["fog-a"].received("PUT", AGG)[0].body
    assert (put["epoch"], put["fresh"], put["element"]["node"]) == (3, False, "fog-a")
    assert len(fenced) == 1 and orch.registry.epoch("p", "aggregate") == 3  # marker first


@pytest.mark.parametrize("state", ["fenced", "stopped"])
def test_a_pe_halted_under_its_newest_epoch_is_started_again_under_a_new_one_fenced(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    # Stopped: a stop on the node whose clean-up raised (a disk error) left the instance
    # hosted and STOPPED under the newest epoch; the reconciler took it for current, and
    # nobody wrote for good. (Fenced: a promotion that fenced, then failed.)
    fenced: list[object] = []
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30, **_: fenced.append(make) or 9)
    beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")],
                        "fog-a": [{**hosted("aggregate"), "state": state}]})  # fmt: skip
    agents["fog-a"].answer("GET", AGG + "/progress", body={**PE, "state": state, "epoch": 1})
    orch.reconcile_once()
    assert [(m, q) for n, m, p, q in calls(agents) if n == "fog-a" and p == AGG] == [
        ("DELETE", {}),
        ("PUT", {}),
    ]
    put = agents["fog-a"].received("PUT", AGG)[0].body
    assert (put["epoch"], put["fresh"]) == (2, False)
    assert len(fenced) == 1 and orch.registry.epoch("p", "aggregate") == 2


def test_a_pe_held_at_its_gate_with_no_operation_is_resumed(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")],
                        "fog-a": [hosted("aggregate", gated=True)]})  # fmt: skip
    agents["fog-a"].answer("GET", AGG + "/progress", body={**PE, "state": "paused", "epoch": 1,
                                                            "gated": True})  # fmt: skip
    orch.reconcile_once()
    assert len(agents["fog-a"].received("POST", AGG + "/resume")) == 1
    assert agents["fog-a"].received("DELETE", AGG) == []


def test_a_current_pe_is_left_alone_by_the_reconciler(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    orch.reconcile_once()
    assert calls(agents) == []


def test_a_pe_reading_other_inputs_than_its_element_is_restarted_fenced(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scale that failed between giving the sink its added partition as an input and
    starting the sink with it: the reconciler starts it again, under a new epoch fenced
    first (its output would reach nobody otherwise)."""
    fenced: list[object] = []
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30, **_: fenced.append(make) or 9)
    sink = "/pipelines/p/elements/sink"
    stale = {**hosted("sink"), "inputs": ["aggregate-p0"]}  # not the spec's ["aggregate"]
    beat(orch, agents, {"cloud": [hosted("source"), stale],
                        "fog-a": [{**hosted("aggregate"), "inputs": ["source"]}]})  # fmt: skip
    # Judged by what the agent says now: started again meanwhile, it is left alone.
    agents["cloud"].answer("GET", sink + "/progress", body={**stale, "inputs": ["aggregate"]})
    orch.reconcile_once()
    assert [(m, p) for n, m, p, q in calls(agents) if p.startswith(sink)] == [
        ("GET", sink + "/progress")
    ]
    agents["cloud"].answer("GET", sink + "/progress", body=stale)
    orch.reconcile_once()
    assert [m for n, m, p, q in calls(agents) if p == sink] == ["DELETE", "PUT"]
    put = agents["cloud"].received("PUT", sink)[0].body
    assert (put["epoch"], put["fresh"], put["element"]["inputs"]) == (2, False, ["aggregate"])
    assert len(fenced) == 1 and orch.registry.epoch("p", "sink") == 2
    # Reading what its element reads (or not telling), a PE is left alone.
    beat(orch, agents, {"cloud": [hosted("source"), {**hosted("sink", epoch=2),
                                                     "inputs": ["aggregate"]}],
                        "fog-a": [hosted("aggregate")]})  # fmt: skip
    before = len(calls(agents))
    orch.reconcile_once()
    assert len(calls(agents)) == before


def test_a_stopped_pipelines_pe_is_not_restored(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    orch.registry.set_status("p", "stopped")
    with pytest.raises(Conflict, match="'p' is stopped, not running"):
        orch.restore("p", "aggregate")
    assert calls(agents) == []


def test_a_restart_a_node_refuses_is_tried_again_after_a_growing_back_off(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each try fences anew (a new epoch, a marker in the PE's stream): a node refusing
    the start made one of each every reconcile round, for as long as it refused."""
    from fogshift.orchestrator import reconciler

    fenced: list[object] = []
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30, **_: fenced.append(make) or 9)
    import time
    from types import SimpleNamespace

    clock = [1000.0]  # the reconciler's own clock (only its module's)
    monkeypatch.setattr(reconciler, "time", SimpleNamespace(
        monotonic=lambda: clock[0], time=time.time, sleep=time.sleep))  # fmt: skip
    beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")], "fog-a": []})
    gone = {"code": "unknown_element", "message": "node 'fog-a' does not host p/aggregate"}
    agents["fog-a"].answer("GET", AGG + "/progress", status=404, body=gone)
    agents["fog-a"].fail("PUT", AGG)  # its node refuses to start it
    rounds_s = orch.config.reconcile_s
    tried = []
    for _ in range(12):  # twelve rounds, one every reconcile_s
        orch.reconcile_once()
        tried.append(len(agents["fog-a"].received("PUT", AGG)))
        clock[0] += rounds_s
    # Tried at rounds 1, 2, 4, 8 (after 1, 2, 4 rounds' wait): not at every round.
    assert tried == [1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4], tried
    assert len(fenced) == 4 and orch.registry.epoch("p", "aggregate") == 5
    # Once the node takes it, it runs, and a later failure starts from a round again.
    agents["fog-a"].answer("PUT", AGG)
    clock[0] += reconciler.RESTART_BACKOFF_MAX_S
    orch.reconcile_once()
    assert len(agents["fog-a"].received("PUT", AGG)) == 5
    assert ("p", "aggregate") not in orch._restart_backoff
    # A failure before any fencing (its node does not answer whether it runs the PE) is
    # tried again the next round, as before.
    beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")], "fog-a": []})
    agents["fog-a"].fail("GET", AGG + "/progress")
    asked = len(agents["fog-a"].received("GET", AGG + "/progress"))
    for _ in range(2):
        orch.reconcile_once()
    assert len(agents["fog-a"].received("GET", AGG + "/progress")) == asked + 2
    assert ("p", "aggregate") not in orch._restart_backoff


def test_an_automatic_restore_that_fails_is_tried_again_after_a_growing_back_off(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed try fenced anew on every candidate (an epoch, a marker, a journal entry,
    a copy) and held the whole round, every round, for as long as the node stayed away."""
    import time
    from types import SimpleNamespace

    from fogshift.restoration.exceptions import RestoreFailed

    clock = [1000.0]  # the reconciler's own clock (only its module's)
    monkeypatch.setattr(reconciler, "time", SimpleNamespace(
        monotonic=lambda: clock[0], time=time.time, sleep=time.sleep))  # fmt: skip
    orch.started_at -= 60
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    tries: list[int] = []
    succeed = [False]

    def restore(pipeline: str, element: str, *args: Any, **kwargs: Any) -> None:
        tries.append(orch.registry.next_epoch(pipeline, element))  # (it fenced)
        if not succeed[0]:
            raise RestoreFailed(f"no node could run {pipeline}/{element}")

    monkeypatch.setattr(orch, "restore", restore)
    counted = []
    with caplog.at_level("WARNING", logger="fogshift.orchestrator"):
        for _ in range(12):  # twelve rounds, one every reconcile_s
            orch.reconcile_once()
            counted.append(len(tries))
            clock[0] += orch.config.reconcile_s
    assert counted == [1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4], counted
    # Its reason in full once, then that it failed again as before (the same lines every
    # try, for as long as the node was away).
    said = [
        r.getMessage() for r in caplog.records if "auto-restore of p/aggregate" in r.getMessage()
    ]
    assert [m.count("no node could run p/aggregate") for m in said] == [1, 0, 0, 0], said
    assert said[1:] == [f"auto-restore of p/aggregate failed again, as before (try {n})"
                        for n in (2, 3, 4)]  # fmt: skip
    # Once one succeeds, the next failure starts from a round again.
    succeed[0] = True
    clock[0] += reconciler.RESTART_BACKOFF_MAX_S
    orch.reconcile_once()
    assert len(tries) == 5 and ("p", "aggregate") not in orch._restart_backoff
    # One fenced anew by someone else (a user's restore) is not held by the back-off.
    succeed[0] = False
    orch.reconcile_once()
    orch.registry.next_epoch("p", "aggregate")
    orch.reconcile_once()
    assert len(tries) == 7


def test_a_lost_pe_whose_restore_failed_says_why_in_its_status(orch: Orchestrator) -> None:
    # A walk-through's finding: while automatic restores kept failing, `status` showed
    # "node-lost" and no error; the reason was in --json's last_restore only.
    from fogshift.contracts import RestoreReport, RestoreStatus

    orch.last_restore[("p", "aggregate")] = RestoreReport(
        pipeline="p", element="aggregate", target="fog-b", status=RestoreStatus.FAILED,
        error="cannot be built from its stored state: RuntimeError: restore bug",
    )  # fmt: skip

    def aggregate() -> Any:
        (status,) = orch.status("p", counts=False)
        return next(e for e in status.elements if e.element == "aggregate")

    assert aggregate().error is None  # fog-a is up: its own report speaks
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    lost = aggregate()
    assert lost.state == "node-lost"
    assert lost.error == (
        "its last restore, onto fog-b, failed: cannot be built from its stored state: "
        "RuntimeError: restore bug"
    )


def test_a_lost_pe_says_what_is_done_about_it(orch: Orchestrator) -> None:
    # An operator's walk-through: `status` showed "node-lost" and nothing else until the
    # PE turned up on another node: whether a restore was due, under way, or manual.
    def lost() -> str:
        (status,) = orch.status("p", counts=False)
        aggregate = next(e for e in status.elements if e.element == "aggregate")
        assert aggregate.state == "node-lost" and aggregate.error is not None
        # (The seconds as the clock has it by now: a loaded machine runs slower.)
        return re.sub(r"silent \d+ s", "silent N s", aggregate.error)

    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 6 WHERE name = 'fog-a'")
    assert lost() == "node fog-a silent N s; to be restored elsewhere at 10 s of silence"
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 6 WHERE name = 'fog-a'")
    assert lost() == "node fog-a silent N s; restore due (automatic)"
    orch._migrating[("p", "aggregate")] = "restore"
    assert lost() == "node fog-a silent N s; restore under way"
    del orch._migrating[("p", "aggregate")]
    orch.registry.set_status("p", "stopped")  # (nothing restores a stopped pipeline's PEs)
    assert lost() == "node fog-a silent N s"
    manual = {**SPEC, "recovery": {"auto": False}}
    orch.registry.put_pipeline(parse_spec(manual, orch.config.home), "running")
    assert lost() == "node fog-a silent N s; recovery is manual: `fogshift restore p aggregate`"
    # Its node removed while it was stopped: `start` restores it elsewhere, and once it
    # runs, the reconciler does, whatever its recovery says.
    orch.registry.set_status("p", "stopped")
    orch.remove_node("fog-a")
    assert lost() == "node fog-a removed; `fogshift start p` restores it elsewhere"
    orch.registry.set_status("p", "running")
    assert lost() == "node fog-a removed; restore due (automatic: whatever the recovery)"
    orch.admit_node("fog-a")  # (added again: started there once heard)
    assert lost() == "node fog-a not heard yet since it was added again"


def test_a_node_the_pipeline_counts_lost_is_no_restore_candidate(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    # Lost to the pipeline after 2 s of silence, unhealthy to the orchestrator after 5 s: a
    # node silent 3 s was a candidate, and a PE restored there was restored away again the
    # next round, fenced at every move.
    quick = {**SPEC, "recovery": {"auto": True, "detect_after_s": 2}}
    with orchestrator_of(tmp_path, agents, quick) as orch:
        orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 3 WHERE name = 'fog-b'")
        node = orch.registry.node("fog-b")
        assert node is not None and orch.healthy(node)
        assert "fog-b" not in orch.restore_candidates("p", "aggregate", {"fog-a"})
        assert "cloud" in orch.restore_candidates("p", "aggregate", {"fog-a"})
    with orchestrator_of(tmp_path / "slow", agents, SPEC) as orch:  # (10 s by default)
        orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 3 WHERE name = 'fog-b'")
        assert "fog-b" in orch.restore_candidates("p", "aggregate", {"fog-a"})


def test_restore_candidates_are_ranked_by_what_the_registry_places_not_what_nodes_say(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # cloud hosts the source and the sink but reports nothing: it ranked first (by name,
    # among nodes that report no PE), and a node that lied so drew every restore.
    beat(orch, agents, {})  # (no plan: no planned redeploy node)
    assert orch.restore_candidates("p", "aggregate", {"fog-a"}) == ["fog-b", "cloud"]
    # Standbys count too.
    for element in ("source", "sink", "x"):
        orch.registry.add_standby("p", element, "fog-b")
    assert orch.restore_candidates("p", "aggregate", {"fog-a"}) == ["cloud", "fog-b"]


def _partitioned(*nodes: str) -> dict:
    """SPEC with its aggregate partitioned by sensor over ``nodes``."""
    return {**SPEC, "elements": [
        SPEC["elements"][0],
        {**{k: v for k, v in SPEC["elements"][1].items() if k != "node"},
         "partitions": list(nodes), "key_by": "sensor"},
        SPEC["elements"][2],
    ]}  # fmt: skip


def test_a_partition_is_restored_away_from_the_other_partitions_of_its_element(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    # A lost node's partitions went, each, to the node placed the fewest instances: the
    # node of another partition (one, against cloud's source and sink), where two
    # partitions split no work and a key move `--to` it is refused as ambiguous.
    with orchestrator_of(tmp_path, agents, _partitioned("fog-a", "fog-b")) as orch:
        record = orch.pipeline("p")
        (first, second) = record.spec.partitions_of("aggregate")
        assert orch.restore_candidates("p", first.id, {"fog-a"}) == ["cloud", "fog-b"]
        assert orch.restore_candidates("p", "source", {"fog-a"}) == ["fog-b", "cloud"]
        # Once every other node runs one too, the least placed first, as any PE.
        orch.registry.set_placement("p", second.id, "cloud")
        assert orch.restore_candidates("p", first.id, {"fog-a"}) == ["fog-b", "cloud"]


def test_partitions_restored_at_once_go_apart(tmp_path: Path, agents: dict[str, StandIn]) -> None:
    # Two partitions of one element on a lost node, restored at once (one thread each):
    # a sibling's node was read from the placement, written only once its restore ended,
    # so both went to the same node (a planner review's finding).
    with orchestrator_of(tmp_path, agents, _partitioned("fog-a", "fog-a")) as orch:
        (first, second) = orch.pipeline("p").spec.partitions_of("aggregate")
        with orch._choosing("p", first.id, {"fog-a"}) as (candidates, _trying):
            assert candidates[0] == "fog-b"  # (it runs nothing)
            assert orch.restore_candidates("p", second.id, {"fog-a"})[0] == "cloud"
        assert orch.restore_candidates("p", second.id, {"fog-a"})[0] == "fog-b"


def test_a_node_whose_disk_is_nearly_full_is_the_last_restore_and_standby_candidate(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    # fog-b hosts nothing and ranked first; its disk nearly full, a restore there failed
    # at its first checkpoint.
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:

        def beat_with(full: set[str]) -> None:
            for name, agent in agents.items():
                elements = {"cloud": [hosted("source"), hosted("sink")],
                            "fog-a": [hosted("aggregate")]}.get(name, [])  # fmt: skip
                orch.heartbeat(name, Heartbeat.model_validate({
                    "url": agent.url, "ready": True, "elements": elements,
                    "disk_free_bytes": 2**29 if name in full else 2**35,
                    "disk_total_bytes": 2**36}))  # fmt: skip

        beat_with(set())
        assert orch.restore_candidates("p", "aggregate", {"fog-a"}) == ["fog-b", "cloud"]
        beat_with({"fog-b"})
        assert orch.short_of_disk() == {"fog-b"}
        assert orch.restore_candidates("p", "aggregate", {"fog-a"}) == ["cloud", "fog-b"]
        record = orch.pipeline("p")
        assert orch.standby_node(record, record.spec.element("aggregate")) == "cloud"
        # And the node of a partition a scale adds (fog-b hosts fewest PEs).
        assert orch._nodes_for(record.placement, [], 1, None, "scale") == ["fog-a"]
        # Every node's disk nearly full (one disk they share): ranked as before.
        beat_with(set(agents))
        assert orch.short_of_disk() == set()
        assert orch.restore_candidates("p", "aggregate", {"fog-a"}) == ["fog-b", "cloud"]
        assert orch.standby_node(record, record.spec.element("aggregate")) == "fog-b"
        assert orch._nodes_for(record.placement, [], 1, None, "scale") == ["fog-b"]


def test_a_node_short_of_disk_counts_as_having_room_again_only_with_a_margin(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # Free space hovering about the threshold changed the plan every round (and pushed the
    # backups anew to each node it named).
    floor = orch.config.warning_limits.low_disk_bytes

    def free_on_fog_b(free: int) -> set[str]:
        for name, agent in agents.items():
            orch.heartbeat(name, Heartbeat.model_validate({
                "url": agent.url, "ready": True, "elements": [],
                "disk_free_bytes": free if name == "fog-b" else total // 2,
                "disk_total_bytes": total}))  # fmt: skip
        return orch.short_of_disk()

    total = 2**32  # (4 GiB: the bytes' bound, not the 5 % share, is the threshold)
    assert free_on_fog_b(floor + 1) == set()
    assert free_on_fog_b(floor - 1) == {"fog-b"}
    assert free_on_fog_b(floor + 1) == {"fog-b"}  # (not yet: within the margin)
    assert free_on_fog_b(int(floor * 1.2)) == {"fog-b"}
    assert free_on_fog_b(int(floor * 1.3)) == set()
    assert free_on_fog_b(floor + 1) == set()  # (from above: the threshold itself)


def test_a_node_whose_spark_failed_to_start_has_its_pes_restored(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # It heartbeats on (to say why) and was never silent: its PEs ran nowhere for good.
    def beat_of_fog_a(**how: Any) -> None:
        report = {"url": agents["fog-a"].url, "elements": [], **how}
        orch.heartbeat("fog-a", Heartbeat.model_validate(report))

    beat_of_fog_a(ready=False)  # (still starting: left alone)
    orch.reconcile_once()
    assert orch.registry.operations() == []
    beat_of_fog_a(ready=False, error="RuntimeError: Java gateway process exited")
    orch.reconcile_once()
    [op] = orch.registry.operations()
    assert (op.element, op.origin) == ("aggregate", "fog-a") and op.target != "fog-a"


def test_a_node_heard_again_before_its_restore_began_keeps_its_pe(
    orch: Orchestrator, agents: dict[str, StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    # The round judged fog-a silent; its heartbeat came before the restore's thread ran:
    # the PE was fenced and moved away from a node running it, for nothing.
    judged = time.monotonic()
    beat(orch, agents, {"fog-a": [hosted("aggregate")]})
    with caplog.at_level("WARNING", logger="fogshift.orchestrator"):
        orch._auto_restore("p", "aggregate", "fog-a", 0, 1, True, judged)
    assert orch.registry.operations() == [] and orch.registry.epoch("p", "aggregate") == 1
    assert any("fog-a was heard again" in r.getMessage() for r in caplog.records)
    # Still silent since: restored.
    orch._auto_restore("p", "aggregate", "fog-a", 0, 1, True, time.monotonic())
    [op] = orch.registry.operations()
    assert (op.element, op.origin) == ("aggregate", "fog-a")


def test_an_automatic_restore_of_a_pe_moved_meanwhile_changes_nothing(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The round saw fog-a silent; an operation moved the PE to fog-b before the restore took
    # the PE's exclusive section: the restore fenced fog-b's healthy instance and moved it.
    from fogshift.exceptions import Conflict

    orch.started_at -= 60
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    real = orch.restore

    def moved_first(pipeline: str, element: str, *args: Any, **kwargs: Any) -> Any:
        op = orch.registry.begin_operation("migration", "p", "aggregate", "fog-a", "fog-b",
                                           "someone", "preparing")  # fmt: skip
        orch.registry.route(op.id, "fog-b")
        orch.registry.finish(op.id, "done")
        return real(pipeline, element, *args, **kwargs)

    monkeypatch.setattr(orch, "restore", moved_first)
    orch.reconcile_once()
    assert [c for c in calls(agents) if c[1] != "GET"] == []
    assert orch.registry.epoch("p", "aggregate") == 1
    with pytest.raises(Conflict, match="moved to 'fog-b' meanwhile"):
        real("p", "aggregate", lost="fog-a")


def test_a_stop_is_not_held_up_by_an_entry_a_dead_orchestrator_left(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop waits for operations under way, not for the resolution of an entry nobody
    runs (one whose resolution kept failing made the pipeline unstoppable); the entry is
    abandoned once its pipeline stopped."""
    from fogshift.contracts import PipelineState
    from fogshift.orchestrator import journal

    monkeypatch.setattr(journal, "STOP_WAIT_S", 2.0)
    left_by_dead_orchestrator(orch, "migration", "preparing")
    assert orch.stop("p").status == PipelineState.STOPPED
    assert [(m, p) for n, m, p, q in calls(agents) if n == "fog-a"] == [("DELETE", "/pipelines/p")]
    (decision,) = orch.recover_operations()
    assert "abandoned" in decision


# -- a deploy or a stop an orchestrator died in ---------------------------------------------


def test_a_stop_left_half_way_is_completed_on_every_node(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    orch.registry.set_status("p", PipelineState.STOPPING)  # killed after asking no node
    decisions = orch.recover_pipelines()
    assert sorted(c[:3] for c in calls(agents)) == [
        ("cloud", "DELETE", "/pipelines/p"),
        ("fog-a", "DELETE", "/pipelines/p"),
    ]
    assert orch.registry.get_pipeline("p").status == PipelineState.STOPPED  # type: ignore[union-attr]
    assert decisions == ["pipeline p left stopping by an orchestrator that died: stopped"]
    assert orch.recover_pipelines() == []  # done once


def test_a_deploy_left_half_way_fails_and_its_started_pes_are_removed(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    orch.registry.set_status("p", PipelineState.DEPLOYING)
    agents["fog-a"].fail("DELETE", AGG)  # a node that cannot answer keeps its instance
    decisions = orch.recover_pipelines()
    removed = sorted((node, path, query) for node, method, path, query in calls(agents)
                     if method == "DELETE")  # fmt: skip
    assert removed == [  # removed, not discarded: a deploy again makes everything anew
        ("cloud", "/pipelines/p/elements/sink", {}),
        ("cloud", "/pipelines/p/elements/source", {}),
        ("fog-a", AGG, {}),
    ]
    assert orch.registry.get_pipeline("p").status == PipelineState.FAILED  # type: ignore[union-attr]
    assert orch.registry.failure("p") == (
        "its deploy was left half-way (the orchestrator running it stopped)"
    )
    assert decisions == [
        "pipeline p left deploying by an orchestrator that died: failed, the PEs it had "
        "started removed; deploy it again (not reached: fog-a; their instances are stopped "
        "once they are heard again)"
    ]
    # fog-a answers again and still reports the aggregate: the reconciler stops it.
    agents["fog-a"].answers.clear()
    orch.registry._db.execute("UPDATE pipelines SET updated = updated - 10 WHERE name = 'p'")
    beat(orch, agents, {"fog-a": [hosted("aggregate")]})
    orch.reconcile_once()
    assert agents["fog-a"].received("DELETE", AGG)[-1].query == {}  # stopped, kept


def test_a_node_not_heard_of_is_not_asked_and_stops_its_instances_once_heard(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # Partitioned: asking it would hold the round for the request's timeout per PE.
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    for status in (PipelineState.DEPLOYING, PipelineState.STOPPING):
        orch.registry.set_status("p", status)
        (decision,) = orch.recover_pipelines()
        assert decision.endswith("(not reached: fog-a; their instances are stopped once they "
                                 "are heard again)"), decision  # fmt: skip
        assert [c for c in calls(agents) if c[0] == "fog-a"] == []
        assert {c[0] for c in calls(agents)} == {"cloud"}


def test_a_deploy_or_stop_this_orchestrator_runs_is_left_to_it(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    for status in (PipelineState.DEPLOYING, PipelineState.STOPPING):
        orch.registry.set_status("p", status)
        with orch.pipeline_lock("p"):  # as deploy() and stop() hold it throughout
            assert orch.recover_pipelines() == []
        assert orch.registry.get_pipeline("p").status == status  # type: ignore[union-attr]
    assert calls(agents) == []


def test_a_reconcile_round_ends_a_deploy_a_dead_orchestrator_left(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    orch.registry.set_status("p", PipelineState.DEPLOYING)
    orch.reconcile_once()
    assert orch.registry.get_pipeline("p").status == PipelineState.FAILED  # type: ignore[union-attr]
    assert sorted((c[0], c[2]) for c in calls(agents) if c[1] == "DELETE") == [
        ("cloud", "/pipelines/p/elements/sink"),
        ("cloud", "/pipelines/p/elements/source"),
        ("fog-a", AGG),
    ]


# -- a scale an orchestrator died in -----------------------------------------------------------

#: The aggregate keyed and in two partitions (fog-a, cloud).
_AGGREGATE = {k: v for k, v in SPEC["elements"][1].items() if k != "node"}
PARTITIONED = {**SPEC, "elements": [
    SPEC["elements"][0],
    {**_AGGREGATE, "key_by": "sensor", "partitions": ["fog-a", "cloud"]},
    SPEC["elements"][2],
]}  # fmt: skip


@pytest.fixture
def scaled(
    tmp_path: Path, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Orchestrator, list[dict[str, Any]]]]:
    """An orchestrator running :data:`PARTITIONED`, its ``scale`` recording each call (and
    answering with what the test put in ``answers``, else ``moved``)."""
    asked: list[dict[str, Any]] = []
    with orchestrator_of(tmp_path, agents, PARTITIONED) as orchestrator:

        def scale(
            pipeline: str,
            element: str,
            partitions: int,
            nodes: Any = None,
            timeout_s: float = 90.0,
            waves: bool = False,
            resume: Any = None,
            lock_wait_s: float = 600.0,
        ) -> Any:
            asked.append({"pipeline": pipeline, "element": element, "partitions": partitions,
                          "nodes": nodes, "waves": waves, "resume": resume,
                          "lock_wait_s": lock_wait_s})  # fmt: skip
            if answers:
                raise answers.pop(0)
            orchestrator.registry.end_scale(resume.id, "moved")
            return ScaleReport(pipeline=pipeline, element=element, status=KeyMoveStatus.MOVED,
                               before=2, after=partitions)  # fmt: skip

        answers: list[Exception] = []
        monkeypatch.setattr(orchestrator, "scale", scale)
        orchestrator.scale_answers = answers  # type: ignore[attr-defined]
        yield orchestrator, asked


def dead_scale(orch: Orchestrator, **asked: Any) -> str:
    """A scale of the aggregate to 3 partitions, as a killed orchestrator left it."""
    entry = orch.registry.begin_scale("p", "aggregate", asked.get("partitions", 3),
                                      asked.get("nodes"), asked.get("waves", False),
                                      "dead0rchestr")  # fmt: skip
    return entry.id


def test_a_scale_a_dead_orchestrator_left_is_carried_on_as_it_was_asked(
    scaled: tuple[Orchestrator, list[dict[str, Any]]],
) -> None:
    orch, asked = scaled
    left = dead_scale(orch, nodes=["fog-b"], waves=True)
    (decision,) = orch.recover_scales()
    assert [(a["partitions"], a["nodes"], a["waves"], a["resume"].id, a["lock_wait_s"])
            for a in asked] == [(3, ["fog-b"], True, left, 0)]  # fmt: skip
    assert decision.startswith(f"scale {left} of p/aggregate to 3 partitions, left by "
                               "orchestrator dead0rchestr: carried on: moved")  # fmt: skip
    assert orch.registry.unfinished_scales() == []
    assert orch.recover_scales() == [] and len(asked) == 1  # once


def test_a_scale_this_orchestrator_runs_is_left_to_it(
    scaled: tuple[Orchestrator, list[dict[str, Any]]],
) -> None:
    orch, asked = scaled
    dead_scale(orch)
    with element_lock("p", "aggregate", "test"):  # as scale() holds it throughout
        assert orch.recover_scales() == []
    assert asked == [] and len(orch.registry.unfinished_scales()) == 1


def test_a_scale_of_a_pipeline_stopped_waits_and_one_deployed_anew_is_abandoned(
    scaled: tuple[Orchestrator, list[dict[str, Any]]],
) -> None:
    orch, asked = scaled
    # Stopped: kept for `fogshift start` (its rescale record may stand: the partitions must
    # come to match it), not carried on meanwhile.
    left = dead_scale(orch)
    assert [h.kind for h in orch.holds("fog-b")] == ["scale"]  # (no nodes named: every one)
    orch.registry.set_status("p", PipelineState.STOPPING)
    assert orch.recover_scales() == [] and asked == []
    orch.registry.set_status("p", PipelineState.STOPPED)
    assert orch.recover_scales() == [] and asked == []
    assert orch.registry.scale(left).outcome is None  # type: ignore[union-attr]
    # ... holding no node meanwhile, as its PEs do not (a removal was refused until then).
    assert orch.holds("fog-b") == []
    # Deleted: ended, not left to hold nodes should the name be deployed again.
    orch.registry.delete_pipeline("p")
    assert orch.registry.scale(left).outcome == "abandoned: the pipeline was deleted"  # type: ignore[union-attr]
    orch.registry.put_pipeline(parse_spec(PARTITIONED, orch.config.home), PipelineState.RUNNING)
    left = dead_scale(orch)
    # Failed (a deploy's end): abandoned.
    orch.registry.set_status("p", PipelineState.FAILED, "a PE could not be started")
    assert orch.registry.scale(left).outcome == "abandoned: the pipeline is failed"  # type: ignore[union-attr]
    orch.registry.set_status("p", PipelineState.RUNNING)
    # Deployed anew (same name, two partitions again) before a round carried it on: the
    # old request is not the new deployment's.
    left = dead_scale(orch)
    record = orch.registry.get_pipeline("p")
    assert record is not None
    orch.registry.put_pipeline(record.spec, PipelineState.RUNNING)
    assert orch.registry.scale(left).outcome == "abandoned: the pipeline was deployed anew"  # type: ignore[union-attr]
    # One left while the element is no longer partitioned (the registry written so).
    left = dead_scale(orch)
    orch.registry._db.execute("UPDATE scales SET element = 'sink' WHERE id = ?", (left,))
    (decision,) = orch.recover_scales()
    assert decision.endswith("abandoned: the element does not run any more"), decision
    assert asked == []


def test_a_scale_held_up_by_another_operation_is_tried_again_later(
    scaled: tuple[Orchestrator, list[dict[str, Any]]],
) -> None:
    orch, asked = scaled
    left = dead_scale(orch)
    orch.scale_answers.append(  # type: ignore[attr-defined]
        MigrationInProgress("p/aggregate-p0 is held by the start of its standby")
    )
    assert orch.recover_scales() == [] and len(asked) == 1
    assert orch.registry.scale(left).outcome is None  # type: ignore[union-attr]
    assert orch._scale_retries[left][1] == reconciler.SCALE_RETRY_S


def test_a_reconcile_round_carries_a_scale_on_in_a_thread_of_its_own(
    scaled: tuple[Orchestrator, list[dict[str, Any]]],
) -> None:
    orch, asked = scaled
    left = dead_scale(orch)
    orch.reconcile_once()
    # (Its thread ends after the entry: waited for too, not taken as ended with it.)
    wait_until(lambda: (orch.registry.scale(left).outcome == "moved"  # type: ignore[union-attr]
                        and not orch._scales_carried) or None, 30,
               describe="the scale carried on, its thread ended")  # fmt: skip
    assert [a["resume"].id for a in asked] == [left]


def test_a_scale_a_node_is_away_for_waits_and_a_refused_one_ends(
    scaled: tuple[Orchestrator, list[dict[str, Any]]],
) -> None:
    orch, asked = scaled
    left = dead_scale(orch)
    orch.scale_answers.append(Unavailable("node fog-b is not healthy"))  # type: ignore[attr-defined]
    assert orch.recover_scales() == []
    assert orch.registry.scale(left).outcome is None  # type: ignore[union-attr]  # stays
    assert orch.recover_scales() == [] and len(asked) == 1  # not before its pause
    orch._scale_retries[left] = (0.0, reconciler.SCALE_RETRY_S)  # the pause is over
    orch.scale_answers.append(Unavailable("node fog-b is not healthy"))  # type: ignore[attr-defined]
    assert orch.recover_scales() == [] and len(asked) == 2
    assert orch._scale_retries[left][1] == 2 * reconciler.SCALE_RETRY_S  # a longer one
    orch._scale_retries[left] = (0.0, reconciler.SCALE_RETRY_S)  # the pause is over
    orch.scale_answers.append(InvalidInput("cannot scale p/aggregate: 5000 keys move"))  # type: ignore[attr-defined]
    (decision,) = orch.recover_scales()
    assert len(asked) == 3 and "refused: cannot scale p/aggregate: 5000 keys move" in decision
    assert orch.registry.scale(left).outcome == "refused: cannot scale p/aggregate: 5000 keys move"  # type: ignore[union-attr]


def test_a_newer_scale_supersedes_one_left_unfinished(
    scaled: tuple[Orchestrator, list[dict[str, Any]]],
) -> None:
    orch, asked = scaled
    left = dead_scale(orch)
    newer = orch.registry.begin_scale("p", "aggregate", 2, None, False, orch.run_id)
    assert orch.registry.scale(left).outcome == f"superseded by scale {newer.id}"  # type: ignore[union-attr]
    orch.registry.end_scale(newer.id, "moved")
    orch.registry.end_scale(left, "moved")  # the first outcome stands
    assert orch.registry.scale(left).outcome == f"superseded by scale {newer.id}"  # type: ignore[union-attr]
    assert orch.recover_scales() == [] and asked == []


@pytest.fixture
def grouped(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> tuple[Orchestrator, list[tuple[Any, ...]], list[Exception]]:
    """``orch`` with its ``migrate_group`` recording each call (and raising what the test
    put in the answers, else moving every PE asked)."""
    asked: list[tuple[Any, ...]] = []
    answers: list[Exception] = []

    def migrate_group(
        pipeline: str, elements: list[str], target: str, mode: Any, resume: str | None = None
    ) -> Any:
        asked.append((pipeline, elements, target, str(mode), resume))
        if answers:
            raise answers.pop(0)
        return GroupMigrationReport(
            pipeline=pipeline, elements=elements, target=target, mode=mode,
            status=GroupMigrationStatus.MIGRATED, migrations=[],
            placement=dict.fromkeys(elements, target),
        )  # fmt: skip

    monkeypatch.setattr(orch, "migrate_group", migrate_group)
    return orch, asked, answers


def test_a_group_migration_a_dead_orchestrator_left_is_carried_on_as_asked(
    grouped: tuple[Orchestrator, list[tuple[Any, ...]], list[Exception]],
) -> None:
    # The orchestrator died between the group's moves: the aggregate on fog-b, the sink not.
    orch, asked, answers = grouped
    left = orch.registry.begin_group("p", ["aggregate", "sink"], "fog-b", "precopy",
                                     "dead0rchestr", origins={"aggregate": "fog-a",
                                                              "sink": "cloud"})  # fmt: skip
    mine = orch.registry.begin_group("p", ["source"], "fog-b", "precopy", orch.run_id)
    # Where its PEs ran as it began, kept for its carry-on (moved back there if it fails).
    assert orch.registry.group_origins(left) == {"aggregate": "fog-a", "sink": "cloud"}
    assert orch.registry.group_origins(mine) == {}
    # Held up (the target away, a PE held): tried again after a pause, not ended.
    answers.append(Unavailable("node 'fog-b' is not healthy"))
    assert orch.recover_groups() == []
    assert orch.recover_groups() == [], "tried again before its pause was over"
    assert len(asked) == 1 and {g.id for g in orch.registry.unfinished_groups()} == {left, mine}
    orch._group_retries[left] = (0.0, 5.0)  # (the pause over)
    (decision,) = orch.recover_groups()
    assert asked[-1] == ("p", ["aggregate", "sink"], "fog-b", "precopy", left)
    assert decision.endswith("left by orchestrator dead0rchestr: carried on: migrated")
    # This process's own entry is its running group's: left to it.
    assert [g.id for g in orch.registry.unfinished_groups()] == [mine] and len(asked) == 2
    assert orch.registry.group(left).outcome == "carried on: migrated"  # type: ignore[union-attr]


def test_a_group_left_done_or_refused_ends_and_a_stop_ends_it_too(
    grouped: tuple[Orchestrator, list[tuple[Any, ...]], list[Exception]],
) -> None:
    orch, asked, answers = grouped
    # Every PE on the target already (it died after the last move): done, nothing asked.
    done = orch.registry.begin_group("p", ["aggregate"], "fog-a", "precopy", "dead0rchestr")
    (decision,) = orch.recover_groups()
    assert decision.endswith("done: every PE runs on fog-a") and asked == []
    # Refused for good (a PE gone from a redeployed spec, say): ended with why.
    refused = orch.registry.begin_group("p", ["aggregate"], "fog-b", "literal", "dead0rchestr")
    answers.append(InvalidInput("pipeline 'p' has no element 'aggregate'"))
    (decision,) = orch.recover_groups()
    assert orch.registry.group(refused).outcome == (  # type: ignore[union-attr]
        "refused: pipeline 'p' has no element 'aggregate'"
    )
    assert orch.registry.group(done).outcome.startswith("done")  # type: ignore[union-attr]
    # A group the user asks now supersedes an unfinished one that shares a PE with it.
    older = orch.registry.begin_group("p", ["sink", "source"], "fog-b", "precopy", "dead0rchestr")
    other = orch.registry.begin_group("p", ["aggregate"], "fog-b", "precopy", "dead0rchestr")
    newer = orch.registry.begin_group("p", ["sink"], "fog-a", "precopy", orch.run_id)
    assert orch.registry.group(older).outcome == f"superseded by group migration {newer}"  # type: ignore[union-attr]
    assert orch.registry.group(other).outcome is None  # type: ignore[union-attr]
    orch.registry.end_group(other, "test")
    orch.registry.end_group(newer, "test")
    # A stop ends the pipeline's groups: nothing to carry on in a stopped pipeline.
    left = orch.registry.begin_group("p", ["sink"], "fog-b", "precopy", "dead0rchestr")
    orch.registry.set_status("p", PipelineState.STOPPING)
    assert orch.registry.group(left).outcome == "abandoned: the pipeline is stopping"  # type: ignore[union-attr]
    assert orch.recover_groups() == [] and len(asked) == 1


def test_a_pes_own_migration_or_restore_supersedes_a_dead_orchestrators_group_holding_it(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A group a dead orchestrator left (the aggregate and the sink to cloud) was carried on
    # by the next one's rounds after the user had moved the aggregate elsewhere: back it
    # went, to the group's target.
    from fogshift.broker.exceptions import BrokerError

    def left(elements: list[str]) -> str:
        return orch.registry.begin_group("p", elements, "cloud", "precopy", "dead0rchestr")

    holding, other = left(["aggregate", "sink"]), left(["source"])

    def refuse(registry: object) -> bool:  # (the migration ends once it has begun)
        raise BrokerError("nats-server did not reload its config (test)")

    monkeypatch.setattr(orch.permissions, "sync", refuse)
    with pytest.raises(Unavailable):
        orch.migrate("p", "aggregate", "fog-b")
    assert orch.registry.group(holding).outcome == (  # type: ignore[union-attr]
        "superseded by a migration of aggregate to fog-b"
    )
    assert [g.id for g in orch.registry.unfinished_groups()] == [other]  # (not holding it)
    # A restore the user names a node for supersedes too; the reconciler's (none) does not.
    holding = left(["aggregate"])
    restored: list[list[str]] = []
    monkeypatch.setattr(orch, "_restore_on", lambda *args: restored.append(args[3]) or "done")
    assert orch.restore("p", "aggregate", lost="fog-a") == "done"  # type: ignore[comparison-overlap]
    assert orch.registry.group(holding).outcome is None  # type: ignore[union-attr]
    assert orch.restore("p", "aggregate", "fog-b") == "done"  # type: ignore[comparison-overlap]
    assert orch.registry.group(holding).outcome == (  # type: ignore[union-attr]
        "superseded by a restore of aggregate on fog-b"
    )
    assert restored[-1] == ["fog-b"]
    assert [g.id for g in orch.registry.unfinished_groups()] == [other]


def test_an_operation_onto_a_node_not_healthy_says_what_it_expected_and_the_healthy_ones(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said only "it is not healthy": not since when, nor where else to go.
    monkeypatch.setattr(orch, "healthy", lambda node: node.name != "fog-b")
    for attempt in (lambda: orch.migrate("p", "aggregate", "fog-b"),
                    lambda: orch.restore("p", "aggregate", "fog-b")):  # fmt: skip
        with pytest.raises(Unavailable) as refused:
            attempt()
        error = refused.value
        assert error.message.endswith("node 'fog-b': it is not healthy"), error.message
        assert error.expected == "a node heard within 5 s, its Spark session ready"
        assert (error.received or "").startswith("'fog-b' last heard "), error.received
        assert error.hint == "choose another node (cloud healthy now; it is on 'fog-a' now)"
    assert orch.pipeline("p").placement["aggregate"] == "fog-a"


def test_a_key_asked_of_a_pe_without_key_by_is_refused_not_dropped(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # Its node dropped the key and answered the whole state, under no key, saying nothing.
    with pytest.raises(InvalidInput) as refused:
        orch.twin_state("p", "aggregate", "s1")
    assert refused.value.message == "p/aggregate is not keyed: it holds no state per key"
    assert refused.value.received == (
        "key='s1' for 'aggregate', kind 'window-aggregate', without key_by"
    )
    assert calls(agents) == []  # (nothing asked of its node)


def test_an_unknown_pipeline_or_element_is_refused_with_what_came_and_a_guess(
    orch: Orchestrator,
) -> None:
    # Only "expected: one of ..." was said: no received, no hint.
    from fogshift.agent.exceptions import UnknownElement
    from fogshift.orchestrator.exceptions import UnknownPipeline

    with pytest.raises(UnknownPipeline) as refused:
        orch.pipeline("pp")
    assert (refused.value.expected, refused.value.received) == ("one of p", "'pp'")
    assert refused.value.hint == "did you mean 'p'?"
    with pytest.raises(UnknownPipeline) as refused:
        orch.pipeline("zzzz")
    assert refused.value.hint == "`fogshift status` lists the pipelines"
    record = orch.pipeline("p")
    with pytest.raises(UnknownElement) as unknown:
        orch._element(record, "aggregat")
    assert unknown.value.received == "'aggregat'"
    assert unknown.value.hint == "did you mean 'aggregate'?"
    with pytest.raises(UnknownElement) as unknown:
        orch._element(record, "qqqq")
    assert unknown.value.hint == "`fogshift status p` lists its elements"


def test_scaling_an_element_without_partitions_hints_at_partitions_not_migrate(
    orch: Orchestrator,
) -> None:
    # Its hint was migrate's: "without --keys, `fogshift migrate` moves a whole PE".
    with pytest.raises(InvalidInput, match="'aggregate' is not partitioned") as refused:
        orch.scale("p", "aggregate", 2)
    assert refused.value.hint == (
        "only an element written with `partitions:` (and `key_by`) scales: deploy the spec "
        "again with them"
    )


def test_a_silent_node_does_not_list_a_pe_restored_elsewhere_as_its_own(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # `fogshift nodes` showed the dead fog-a still hosting the aggregate restored on fog-b.
    op = orch.registry.begin_operation("restore", "p", "aggregate", "fog-a", "fog-b", "me",
                                       "fencing", new_epoch=True)  # fmt: skip
    orch.registry.route(op.id, "fog-b")
    orch.registry.finish(op.id, "done")

    def fog_a() -> Any:
        return next(n for n in orch.nodes() if n.name == "fog-a")

    assert fog_a().elements == ["p/aggregate"]  # heard lately: as it says (a zombie shows)
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    silent = fog_a()
    assert (silent.elements, silent.checkpoints) == ([], [])
    # Its silence first, and none of what its last report's ageing checkpoints would say
    # ("node-level checkpoints stopped": the silence, not the node's own trouble).
    assert silent.warnings[0].startswith("no heartbeat for 6"), silent.warnings
    assert silent.warnings[0].endswith(" s (its agent is down or cut off)")
    assert silent.warnings[1:] == ["last heard holding p/aggregate, which runs on fog-b now"]
    # A copy held at its cap (a standby's, whose record went with the node) is said so:
    # "holding p/aggregate" read as the PE.
    beat(orch, {"fog-a": agents["fog-a"]}, {"fog-a": [hosted("aggregate", gated=True)]})
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    assert fog_a().warnings[1:] == [
        "last heard holding a capped copy of p/aggregate (its standby, or a migration's "
        "target), which runs on fog-b now"
    ]


def test_a_restore_held_up_does_not_hold_up_the_restores_of_other_pes(
    tmp_path: Path, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconcile loop's rounds restore each lost PE in a thread of its own: one restore
    waiting on a target that went silent held up every other one (a walk-through saw a warm
    standby promoted after 28 s of silence where its pipeline asked for 5)."""
    import threading

    with orchestrator_of(tmp_path, agents, SPEC) as orch:
        orch.started_at -= 60
        orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60")  # all lost
        release, asked = threading.Event(), []
        done = {"source": threading.Event(), "sink": threading.Event()}

        def restore(pipeline: str, element: str, *args: Any, **kwargs: Any) -> None:
            asked.append(element)
            if element == "aggregate":
                assert release.wait(30)  # held up, as by a target gone silent
            else:
                done[element].set()

        monkeypatch.setattr(orch, "restore", restore)
        orch.reconcile_once(background=True)
        assert all(event.wait(10) for event in done.values()), asked  # the others went on
        deadline = time.monotonic() + 10
        while orch._auto_restoring != {("p", "aggregate")} and time.monotonic() < deadline:
            time.sleep(0.02)  # (their threads end)
        assert orch._auto_restoring == {("p", "aggregate")}
        orch.reconcile_once(background=True)  # (the held one is not restored twice; the
        # stand-in restores of the others moved nothing: they are asked again)
        assert asked.count("aggregate") == 1 and asked.count("source") == 2, asked
        release.set()
        deadline = time.monotonic() + 10
        while orch._auto_restoring and time.monotonic() < deadline:
            time.sleep(0.02)
        assert orch._auto_restoring == set()


def test_restores_at_once_are_spread_as_one_after_the_other_would_be(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cloud lost with the source and the sink: one after the other, the source went to
    # fog-b (nothing there) and the sink to fog-a (one PE each then, the name breaking the
    # tie). Each in a thread of its own, both saw the same counts and chose fog-b.
    import threading

    both = threading.Barrier(2, timeout=10)
    chosen: dict[str, list[str]] = {}

    def restore_on(element: Any, pipeline: str, current: str, candidates: list[str],
                   attempts: list[Any], trying: Any) -> None:  # fmt: skip
        chosen[element.id] = list(candidates)
        both.wait()  # (both in flight at once, neither placed yet)

    monkeypatch.setattr(orch, "_restore_on", restore_on)
    threads = [threading.Thread(target=orch.restore, args=("p", e)) for e in ("source", "sink")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(c[0] for c in chosen.values()) == ["fog-a", "fog-b"], chosen
    assert orch.load() == {"cloud": 2, "fog-a": 1}  # (the reservations gone with them)
    assert orch._restoring_to == {}
    # An attempt on the next candidate moves the count there (it stayed on the first,
    # which had failed, and the node in use was not counted).
    with orch._choosing("p", "source", {"cloud"}) as (candidates, trying):
        assert candidates == ["fog-b", "fog-a"] and orch._restoring_to == {"fog-b": 1}
        trying("fog-a")
        assert orch._restoring_to == {"fog-a": 1}
        assert orch.load()["fog-a"] == 2 and orch.load()["fog-b"] == 0
    assert orch._restoring_to == {}


def test_a_background_restore_is_refused_at_once_by_a_pe_someone_holds(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # In its own thread it waited up to a minute for the section (a standby's follow, a
    # restart), then restored away from a node that may have answered meanwhile; in the
    # loop's round it was refused and tried again next round, its node looked at anew.
    import threading

    newest = orch.registry.epoch("p", "aggregate")
    with orch._exclusive("p", "aggregate", "standby follow"):
        thread = threading.Thread(target=orch._auto_restore,
                                  args=("p", "aggregate", "fog-a", 0, newest, True))  # fmt: skip
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "it waited for the section"
    assert "being" in orch._restore_failures[("p", "aggregate")], orch._restore_failures
    # What the failure's own handling raises (the registry closed at a shutdown) is logged
    # by the thread, not left to Python's hook on stderr; the PE may be tried again.
    monkeypatch.setattr(orch, "restore", lambda *a, **k: (_ for _ in ()).throw(
        Unavailable("node 'fog-b' is not healthy")))  # fmt: skip
    monkeypatch.setattr(orch, "_back_off", lambda *a, **k: 1 / 0)
    orch._auto_restoring.add(("p", "aggregate"))
    with caplog.at_level("ERROR", logger="fogshift.orchestrator.reconciler"):
        orch._auto_restore("p", "aggregate", "fog-a", 0, newest, True)
    assert "auto-restore of p/aggregate failed" in caplog.text
    assert "ZeroDivisionError" in caplog.text and orch._auto_restoring == set()


def test_a_restore_thread_that_cannot_start_is_tried_again_next_round(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its PE stayed marked as being restored, and was never restored by this process.
    import threading

    orch.started_at -= 60
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")

    def start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", start)
    orch.reconcile_once(background=True)
    assert orch._auto_restoring == set()


def test_an_orchestrator_that_did_not_run_counts_silences_from_its_resumption(
    orch: Orchestrator, agents: dict[str, StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    # SIGSTOPped 50 s, it restored a healthy node's PEs as soon as it ran again, before
    # reading the heartbeats that node had sent meanwhile.
    orch.started_at -= 60
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 50 WHERE name = 'fog-a'")
    # Its pause watch did not run for 50 s (by both clocks: a stop, not a suspend).
    orch._ticked_at, orch._ticked_wall = time.monotonic() - 50, time.time() - 50
    with caplog.at_level("WARNING", logger="fogshift.orchestrator"):
        orch.reconcile_once()
    assert calls(agents) == [] and orch.registry.operations() == []  # nothing restored
    assert any("did not run for 50" in r.getMessage() for r in caplog.records)
    assert orch._silence("fog-a") is None  # (nor its calls given up)
    # Still silent once a node's silence has counted from then: restored as ever.
    orch.started_at -= 60
    orch.reconcile_once()
    assert [op.element for op in orch.registry.operations()] == ["aggregate"]


def test_a_suspend_or_a_clock_step_is_no_silence_of_every_node(
    orch: Orchestrator, agents: dict[str, StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    # Suspended 60 s: the monotonic clock stood still, the wall clock (last_seen's) did
    # not; the pause went unseen and every node was silent for 60 s as it resumed.
    orch.started_at -= 120
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60")
    orch._ticked_at, orch._ticked_wall = time.monotonic(), time.time() - 60
    with caplog.at_level("WARNING", logger="fogshift.orchestrator"):
        orch.reconcile_once()
    assert calls(agents) == [] and orch.registry.operations() == []  # nothing restored
    assert any("wall clock moved +60" in r.getMessage() for r in caplog.records)
    # The clock set back 60 s: a node's last_seen, a minute ahead, is brought back to now
    # (else a node lost then was noticed a minute late).
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen + 120")
    orch._ticked_wall = time.time() + 60
    orch.check_paused()
    now = time.time()
    assert all(n.last_seen <= now for n in orch.registry.nodes())
    orch.started_at -= 60
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    orch.reconcile_once()
    assert [op.element for op in orch.registry.operations()] == ["aggregate"]


def test_a_deleted_or_fresh_pipeline_leaves_nothing_in_the_orchestrators_memory(
    orch: Orchestrator,
) -> None:
    # Each pipeline name ever deployed kept its failures, back-offs, streams checked and
    # trim times for the process's life (and a stale reason was logged for a later run).
    for name in ("p", "q"):
        orch._restart_backoff[(name, "aggregate")] = (1, 0.0, 1, "fog-a", True)
        orch._restore_failures[(name, "aggregate")] = "no node"
        orch._in_place_failed[(name, "aggregate")] = "fog-a"
        orch._attempts_said[(name, "aggregate", "fog-b")] = "busy"
        orch._streams_checked.add(name)
        orch._trimmed_at[name] = 1.0
    orch._forget_runs("p")
    for memory in (orch._restart_backoff, orch._restore_failures, orch._in_place_failed,
                   orch._attempts_said):  # fmt: skip
        assert [k[0] for k in memory] == ["q"]
    assert orch._streams_checked == {"q"} and list(orch._trimmed_at) == ["q"]
