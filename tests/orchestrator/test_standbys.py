"""The orchestrator's side of hot standbys: starting one, raising its cap, promoting it, and
carrying on a promotion a dead orchestrator left unfinished.

A real orchestrator object and registry; stand-in agents (``standin``) record what they are
asked; the broker's fence is replaced by a recorder (the integration test fences for real).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fogshift.common.headers import INFO_HEADER, SHA_HEADER
from fogshift.common.waiting import wait_until
from fogshift.contracts import OperationKind, RestorePhase
from fogshift.exceptions import Unavailable
from fogshift.migration.exceptions import MigrationInProgress
from fogshift.orchestrator.exceptions import NodeInUse, UnknownNode
from fogshift.orchestrator.registry import StandbyRecord
from fogshift.orchestrator.service import Orchestrator
from fogshift.restoration import standby as standby_procedure
from tests.orchestrator.standin import SPEC, StandIn
from tests.orchestrator.test_recovery import (
    AGG,
    PE,
    beat,
    hosted,
    orchestrator_of,
)

OFFSET = {"type": "jetstream", "positions": {"source": 40}}


@pytest.fixture
def orch(tmp_path: Path, agents: dict[str, StandIn]) -> Iterator[Orchestrator]:
    spec = {**SPEC, "recovery": {"standby": "fog-b"}}
    with orchestrator_of(tmp_path, agents, spec) as orchestrator:
        yield orchestrator


def progress(epoch: int, position: int, **more: Any) -> dict[str, Any]:
    offset = {"type": "jetstream", "positions": {"source": position}}
    return {**PE, "state": "running", "epoch": epoch, "committed_batch": 3, "offset": offset,
            "progress": position, **more}  # fmt: skip


def serve_warm_copy(agents: dict[str, StandIn]) -> None:
    """fog-a answers the aggregate's warm checkpoint: batch 3, at :data:`OFFSET`."""
    info = '{"batch": 3, "offset": ' + str(OFFSET).replace("'", '"') + "}"
    agents["fog-a"].answer("GET", AGG + "/checkpoint", content=b"tarball",
                           headers={INFO_HEADER: info, SHA_HEADER: "abc"})  # fmt: skip


def standby_on_fog_b(orch: Orchestrator, agents: dict[str, StandIn]) -> StandbyRecord:
    """One round of the keeper: the aggregate's standby started on fog-b (epoch 2), warm
    and capped where fog-a's primary committed."""
    serve_warm_copy(agents)
    agents["fog-a"].answer("GET", AGG + "/progress", body=progress(1, 45))
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(2, 40))
    agents["fog-b"].answer("PUT", AGG + "/gate", body=progress(2, 40))
    orch.keep_standbys()
    standby = orch.registry.standby("p", "aggregate")
    assert standby is not None and (standby.node, standby.epoch) == ("fog-b", 2)
    return standby


@contextmanager
def keeper_held(
    orch: Orchestrator, agents: dict[str, StandIn], node: str, path: str, standby_epoch: int
) -> Iterator[threading.Event]:
    """``keep_standbys`` in a thread, fog-a's aggregate answering its warm copy, fog-b's its
    progress under ``standby_epoch``; ``node``'s answers to ``GET path`` held until the
    block ends (or the event it yields, once they came, is set)."""
    serve_warm_copy(agents)
    agents["fog-a"].answer("GET", AGG + "/progress", body=progress(1, 45))
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(standby_epoch, 40))
    came, release = agents[node].hold("GET", path)
    keeper = threading.Thread(target=orch.keep_standbys)
    keeper.start()
    try:
        assert came.wait(30)
        yield release
    finally:
        release.set()
        keeper.join(60)
    assert not keeper.is_alive()


def test_a_standby_starts_from_a_warm_copy_capped_under_a_newer_epoch(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    standby_on_fog_b(orch, agents)
    assert orch.registry.epoch("p", "aggregate") == 1  # the primary is not behind
    assert agents["fog-a"].received("GET", AGG + "/checkpoint")[0].query == {"warm": "true"}
    assert agents["fog-b"].received("PUT", AGG + "/checkpoint")[0].body is not None
    (deploy,) = agents["fog-b"].received("PUT", AGG)
    assert deploy.body["epoch"] == 2 and deploy.body["element"]["node"] == "fog-b"
    assert deploy.body["gate"] == {"mode": "cap", "limit": OFFSET}
    # Warm, it follows once: capped where the primary has committed, not beyond.
    (cap,) = agents["fog-b"].received("PUT", AGG + "/gate")
    assert cap.body["gate"]["limit"]["positions"] == {"source": 45}
    # Sinks get none; the source's standby failed here (its checkpoint is not answered) and
    # was forgotten, to be tried again next round.
    assert [s.element for s in orch.registry.standbys()] == ["aggregate"]


def test_a_warm_standby_whose_primary_dies_before_its_first_follow_stays(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # The primary answers the copy, then stops answering (its node dies while the standby
    # warms up): the warm standby was discarded, and the PE restored from an older central
    # checkpoint instead of promoting it.
    serve_warm_copy(agents)
    agents["fog-a"].fail("GET", AGG + "/progress")
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(2, 40))
    orch.keep_standbys()
    standby = orch.registry.standby("p", "aggregate")
    assert standby is not None and (standby.node, standby.epoch) == ("fog-b", 2)
    assert agents["fog-b"].received("DELETE", AGG) == []  # not discarded
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []  # capped at the copy


def test_the_copy_of_a_primary_for_its_standby_holds_no_section_and_is_dropped_if_the_pe_changed(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # The copy is a read of the primary: a primary that freezes during it must not hold
    # the PE's exclusive section (its restore waited for the copy's request timeout).
    with keeper_held(orch, agents, "fog-a", AGG + "/checkpoint", 3):
        assert ("p", "aggregate") not in orch._migrating  # free while the copy is taken
        with orch._exclusive("p", "aggregate", "migration"):
            # A migration (or restore) meanwhile: the copy is of the PE before it.
            orch.registry.next_epoch("p", "aggregate")
    assert orch.registry.standby("p", "aggregate") is None
    assert agents["fog-b"].received("PUT", AGG) == []  # nothing started from the old copy
    # The next round copies the PE as it is now and starts its standby.
    del agents["fog-a"].holds[("GET", AGG + "/checkpoint")]
    orch.keep_standbys()
    standby = orch.registry.standby("p", "aggregate")
    assert standby is not None and (standby.node, standby.epoch) == ("fog-b", 3)
    assert len(agents["fog-a"].received("GET", AGG + "/checkpoint")) == 2
    (deploy,) = agents["fog-b"].received("PUT", AGG)
    assert deploy.body["epoch"] == 3


def test_a_standby_warms_up_outside_the_pes_section_and_a_promotion_meanwhile_keeps_it_open(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # A warm-up takes seconds, up to two minutes (a node's first stateful query, a large
    # state): inside the PE's exclusive section it held off the PE's restore as long. A
    # restore meanwhile promotes the standby as it is; its gate, then the PE's own, is not
    # capped again when the warm-up ends.
    with keeper_held(orch, agents, "fog-b", AGG + "/progress", 2):  # started, warming up
        assert ("p", "aggregate") not in orch._migrating
        with orch._exclusive("p", "aggregate", "restore"):  # as a promotion does
            standby = orch.registry.standby("p", "aggregate")
            assert standby is not None and (standby.node, standby.epoch) == ("fog-b", 2)
            op = orch.registry.begin_operation(
                OperationKind.RESTORE, "p", "aggregate", "fog-a", "fog-b", orch.run_id,
                RestorePhase.STARTING, epoch=standby.epoch,
            )  # fmt: skip
            orch.registry.route(op.id, "fog-b")
            orch.registry.finish(op.id, "restored")
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []  # not capped again
    assert ("p", "aggregate") not in orch.standby_ready_ms
    assert agents["fog-b"].received("DELETE", AGG) == []  # the PE now: never discarded


def test_a_warm_standby_waits_for_the_follower_round_holding_its_pe_then_follows(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # Back from the warm-up, the keeper found the section held by another round (the
    # follower's, a few requests long): refused at once, it neither raised the cap nor
    # recorded the standby ready.
    agents["fog-b"].answer("PUT", AGG + "/gate", body=progress(2, 40))
    held, free = threading.Event(), threading.Event()

    def follower_round() -> None:
        with orch._exclusive("p", "aggregate", "standby follow"):
            held.set()
            free.wait(30)

    follower = threading.Thread(target=follower_round)
    try:
        with keeper_held(orch, agents, "fog-b", AGG + "/progress", 2) as release:
            follower.start()
            assert held.wait(30)
            release.set()  # warm now: the keeper comes back to a held section
            time.sleep(0.5)
            assert agents["fog-b"].received("PUT", AGG + "/gate") == []
            free.set()
    finally:
        free.set()
        follower.join(30)
    (cap,) = agents["fog-b"].received("PUT", AGG + "/gate")
    assert cap.body["gate"]["limit"]["positions"] == {"source": 45}
    assert ("p", "aggregate") in orch.standby_ready_ms


def test_a_warm_standby_a_promotion_left_unresolved_meanwhile_is_not_capped(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """A promotion that failed unforeseen while the standby warmed up may have opened its
    gate (it is the PE): the keeper, back, capped it at the fenced primary's position."""
    agents["fog-b"].answer("PUT", AGG + "/gate", body=progress(2, 40))
    with keeper_held(orch, agents, "fog-b", AGG + "/progress", 2) as release:
        orch.registry.begin_operation(
            "restore", "p", "aggregate", "fog-a", "fog-b", orch.run_id, "live", epoch=2
        )
        release.set()
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []
    assert ("p", "aggregate") not in orch.standby_ready_ms


def test_a_standby_that_never_gets_warm_is_dropped(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_warm_copy(agents)
    agents["fog-a"].answer("GET", AGG + "/progress", body=progress(1, 45))
    # Its node gave up on it: failed with no restart to come.
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(2, 12, state="failed"))
    orch.keep_standbys()
    assert orch.registry.standby("p", "aggregate") is None
    assert agents["fog-b"].received("DELETE", AGG)[0].query == {"discard": "true"}


def followed_standby(orch: Orchestrator, agents: dict[str, StandIn]) -> None:
    """The aggregate's standby on fog-b (epoch 2, at 41) for the follower; its primary on
    fog-a committed up to 45."""
    orch.registry.add_standby("p", "aggregate", "fog-b")
    reports = {"cloud": [hosted("source"), hosted("sink")], "fog-a": [hosted("aggregate")],
               "fog-b": [hosted("aggregate", 2)]}  # fmt: skip
    beat(orch, agents, reports)
    agents["fog-a"].answer("GET", AGG + "/progress", body=progress(1, 45))
    agents["fog-b"].answer("PUT", AGG + "/gate", body=progress(2, 41))


def test_the_follower_raises_the_cap_only_when_the_primary_committed(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    followed_standby(orch, agents)
    orch.follow_standbys()
    orch.follow_standbys()  # nothing committed since: the gate is left as it is
    (cap,) = agents["fog-b"].received("PUT", AGG + "/gate")
    limit = {"type": "jetstream", "positions": {"source": 45}}
    assert cap.body == {"gate": {"mode": "cap", "limit": limit}}
    status = orch.standby_status("p", "aggregate")
    assert status is not None and status.lag_events == 4 and status.state == "running"
    # The primary idle, the standby caught up: seen again (its progress read, its gate
    # left as it is), the lag it showed is 0, not the 4 it had when capped.
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(2, 45))
    orch.follow_standbys()
    status = orch.standby_status("p", "aggregate")
    assert status is not None and status.lag_events == 0
    assert len(agents["fog-b"].received("PUT", AGG + "/gate")) == 1
    reads = len(agents["fog-b"].received("GET", AGG + "/progress"))
    orch.follow_standbys()  # caught up and nothing new: not read again
    assert len(agents["fog-b"].received("GET", AGG + "/progress")) == reads
    agents["fog-a"].answer("GET", AGG + "/progress", body=progress(1, 50))
    orch.follow_standbys()
    assert len(agents["fog-b"].received("PUT", AGG + "/gate")) == 2


def test_a_new_standby_is_followed_anew_not_as_the_one_an_epoch_dropped(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """An epoch's bump (a fenced restart, a handover) drops the PE's standby but not what the
    follower saw of it: the next standby showed that one's lag, and, the primary idle, its
    cap stayed where its start put it."""
    followed_standby(orch, agents)
    orch.follow_standbys()
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(2, 45))
    orch.follow_standbys()  # the first standby caught up: lag 0
    assert len(agents["fog-b"].received("PUT", AGG + "/gate")) == 1
    orch.registry.next_epoch("p", "aggregate")  # (epoch 3: the standby dropped)
    assert orch.registry.standby("p", "aggregate") is None
    epoch = orch.registry.add_standby("p", "aggregate", "fog-b")
    status = orch.standby_status("p", "aggregate")
    assert status is not None and status.epoch == epoch == 4
    assert status.lag_events is None  # nothing seen of this one yet, not the first one's 0
    agents["fog-b"].answer("PUT", AGG + "/gate", body=progress(epoch, 41))
    orch.follow_standbys()  # the primary committed nothing since: capped all the same
    gates = agents["fog-b"].received("PUT", AGG + "/gate")
    assert len(gates) == 2 and gates[1].body["gate"]["limit"]["positions"] == {"source": 45}
    status = orch.standby_status("p", "aggregate")
    assert status is not None and status.lag_events == 4


def test_a_standby_promoted_while_the_follower_waited_for_its_pe_is_not_capped(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower read the standby before it took the PE's section; a promotion held that
    section meanwhile: the follower then capped the PE itself at its fenced primary's
    offset, and it stalled until the next reconcile round."""
    followed_standby(orch, agents)
    exclusive = orch._exclusive

    @contextmanager
    def promoted_first(*args: Any, **kwargs: Any) -> Iterator[None]:
        # What a promotion that held the section leaves: the standby is the PE.
        orch.registry.set_placement("p", "aggregate", "fog-b")
        orch.registry.drop_standby("p", "aggregate")
        with exclusive(*args, **kwargs):
            yield

    monkeypatch.setattr(orch, "_exclusive", promoted_first)
    orch.follow_standbys()
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []


def test_a_restore_promotes_the_standby_fencing_before_it_lifts_the_cap(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = orch.registry.add_standby("p", "aggregate", "fog-b")
    order: list[str] = []

    def fence_and_locate(broker: object, pipeline: str, element: object, at: int) -> tuple:
        order.append(f"fence {pipeline} {at}")
        return 44, 44  # emitted, upstream: nothing arrived since

    monkeypatch.setattr(standby_procedure, "fence_and_locate", fence_and_locate)
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(epoch, 41, gated=True))
    report = orch.restore("p", "aggregate")
    assert order == ["fence p 2"]
    assert agents["fog-b"].received("PUT", AGG + "/gate")[0].body == {"gate": None}
    assert agents["fog-b"].received("PUT", AGG + "/checkpoint") == []  # nothing installed
    assert report.method == "standby" and report.target == "fog-b" and report.epoch == 2
    assert report.standby_lag_events == 3 and report.live_ms is not None
    record = orch.registry.get_pipeline("p")
    assert record is not None and record.placement["aggregate"] == "fog-b"
    assert orch.registry.epoch("p", "aggregate") == 2
    assert orch.registry.standby("p", "aggregate") is None
    (op,) = orch.registry.operations("p", "aggregate")
    assert (op.kind, op.epoch, op.outcome) == ("restore", 2, "restored")


def test_a_standby_that_is_not_running_under_its_epoch_is_dropped_not_promoted(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    orch.registry.add_standby("p", "aggregate", "fog-b")
    fallback: list[list[str]] = []
    monkeypatch.setattr(
        orch, "_restore_on", lambda element, p, current, candidates, attempts, *_: fallback.append(
            [a.node for a in attempts]) or "restored from a checkpoint",
    )  # fmt: skip
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(1, 41, state="fenced"))
    assert orch.restore("p", "aggregate") == "restored from a checkpoint"  # type: ignore[comparison-overlap]
    assert fallback == [["fog-b"]]  # the promotion is the first failed attempt
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []
    assert agents["fog-b"].received("DELETE", AGG)[0].query == {"discard": "true"}
    assert orch.registry.standby("p", "aggregate") is None


def test_a_promotion_left_unfinished_is_carried_on_and_fenced_first(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = orch.registry.add_standby("p", "aggregate", "fog-b")
    op = orch.registry.begin_operation(
        "restore", "p", "aggregate", "fog-a", "fog-b", "dead0rchestr", "starting", epoch=epoch
    )
    marks: list[int] = []
    monkeypatch.setattr(orch, "_mark", lambda pipeline, element, at: marks.append(at))
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(epoch, 41, gated=True))
    orch.recover_operations()
    assert marks == [2]
    assert agents["fog-b"].received("PUT", AGG + "/gate")[0].body == {"gate": None}
    assert orch.registry.epoch("p", "aggregate") == 2
    assert orch.registry.standby("p", "aggregate") is None
    entry = orch.registry.operation(op.id)
    assert entry is not None and (entry.outcome or "").startswith("recovered: carried on")


def test_a_standby_a_dead_orchestrators_promotion_left_unresolved_is_not_capped(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """The orchestrator died in a promotion after opening the standby's gate, before its
    routing change: the next one's follower capped the new PE at its fenced primary's
    position, stalled until that entry's resolution (which a broker away holds up)."""
    followed_standby(orch, agents)
    orch.registry.begin_operation(
        "restore", "p", "aggregate", "fog-a", "fog-b", "dead0rchestr", "live", epoch=2
    )
    orch.follow_standbys()
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []


def test_one_standby_whose_following_raises_stalls_no_other_standby(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    orch.registry.add_standby("p", "source", "fog-b")
    orch.registry.add_standby("p", "aggregate", "fog-b")
    reports = {"cloud": [hosted("source"), hosted("sink")], "fog-a": [hosted("aggregate")],
               "fog-b": [hosted("source", 2), hosted("aggregate", 2)]}  # fmt: skip
    beat(orch, agents, reports)
    followed: list[str] = []

    def follow_one(standby: Any, primary: str) -> None:
        followed.append(standby.element)
        if standby.element == "source":
            raise KeyError("positions")  # not a FogshiftError: it ended the round before

    monkeypatch.setattr(orch, "_follow_one", follow_one)
    orch.follow_standbys()  # logged, not raised
    assert sorted(followed) == ["aggregate", "source"]


def test_a_promotion_that_fenced_then_failed_with_no_node_left_restarts_the_pe_in_place(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fence went out under the standby's epoch, then its node failed to lift the cap,
    and no other node can take the PE: the primary (fenced by then) runs again in place
    under an epoch above the standby's, not left fenced with nobody writing."""
    epoch = orch.registry.add_standby("p", "aggregate", "fog-b")
    monkeypatch.setattr(standby_procedure, "fence_and_locate", lambda *args: (44, 44))
    fenced: list[object] = []
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30: fenced.append(make) or 9)
    monkeypatch.setattr(orch, "restore_candidates", lambda *args: [])
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(epoch, 41, gated=True))
    agents["fog-b"].fail("PUT", AGG + "/gate")
    with pytest.raises(Unavailable, match=r"runs again on fog-a .* under epoch 3"):
        orch.restore("p", "aggregate")
    (put,) = agents["fog-a"].received("PUT", AGG)
    assert (put.body["epoch"], put.body["fresh"]) == (3, False)
    assert len(fenced) == 1 and orch.registry.epoch("p", "aggregate") == 3


def test_a_promotion_onto_a_named_node_that_fenced_then_failed_restarts_the_pe_in_place(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`restore --to` the standby's node: its promotion fenced the primary and failed, then
    the node was refused as a target (draining now, not ready): the refusal escaped before
    the fallback, the primary left fenced and without its rights until the next round (a
    review's finding)."""
    epoch = orch.registry.add_standby("p", "aggregate", "fog-b")
    monkeypatch.setattr(standby_procedure, "fence_and_locate", lambda *args: (44, 44))
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30: 9)
    agents["fog-b"].answer("GET", AGG + "/progress", body=progress(epoch, 41, gated=True))
    agents["fog-b"].fail("PUT", AGG + "/gate")

    usable, asked = orch._usable_node, []

    def unusable(node: str, *args: Any) -> Any:
        asked.append(node)
        if node == "fog-b" and asked.count("fog-b") > 1:  # (its drain began meanwhile)
            raise Unavailable(f"node {node!r} is being drained")
        return usable(node, *args)

    monkeypatch.setattr(orch, "_usable_node", unusable)
    with pytest.raises(Unavailable, match=r"runs again on fog-a .* under epoch 3"):
        orch.restore("p", "aggregate", target="fog-b")
    (put,) = agents["fog-a"].received("PUT", AGG)
    assert (put.body["epoch"], put.body["fresh"]) == (3, False)


def test_a_pe_fenced_where_it_is_placed_with_no_operation_is_started_again(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left so by a promotion that fenced under the standby's epoch (above the PE's own)
    and failed: the reconciler starts it again under an epoch above every one given."""
    orch.registry.add_standby("p", "aggregate", "fog-b")  # epoch 2, reserved
    orch.registry.drop_standby("p", "aggregate")
    monkeypatch.setattr(orch.broker, "run", lambda make, timeout=30: 9)
    beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")],
                        "fog-a": [{**hosted("aggregate"), "state": "fenced"}]})  # fmt: skip
    agents["fog-a"].answer("GET", AGG + "/progress", body={**PE, "state": "fenced", "epoch": 1})
    orch.reconcile_once()
    (put,) = agents["fog-a"].received("PUT", AGG)
    assert put.body["epoch"] == 3 and orch.registry.epoch("p", "aggregate") == 3


def test_a_new_orchestrators_first_round_keeps_a_standby_whose_node_has_not_beaten_yet(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # The keeper judged the standby's node by its last heartbeat to the orchestrator before
    # the restart (a minute old): the warm standby was dropped in the first round.
    import time as clock

    orch.registry.add_standby("p", "aggregate", "fog-b")
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60")
    orch.started_at = clock.time()
    orch.keep_standbys()
    standby = orch.registry.standby("p", "aggregate")
    assert standby is not None and standby.node == "fog-b"
    assert agents["fog-b"].received("DELETE", AGG) == []
    # Still silent past its timeout after the start: judged lost, as the reconciler does.
    orch.started_at = clock.time() - 60
    orch.keep_standbys()
    assert orch.registry.standby("p", "aggregate") is None


def test_a_pe_promoted_onto_its_fixed_standby_node_gets_a_standby_elsewhere(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """``standby: fog-b`` and the PE promoted onto fog-b: it had no standby after that,
    and nothing said so. It now has one where ``planned`` would put it, until the PE runs
    elsewhere again."""
    record = orch.pipeline("p")
    element = record.spec.element("aggregate")
    assert orch.standby_node(record, element) == "fog-b"
    orch.registry.set_placement("p", "aggregate", "fog-b")  # promoted there
    beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")],
                        "fog-b": [hosted("aggregate")]})  # fmt: skip
    record = orch.pipeline("p")
    elsewhere = orch.standby_node(record, element)
    assert elsewhere is not None and elsewhere != "fog-b"
    standby = StandbyRecord("p", "aggregate", elsewhere, 2, time.time())  # just started
    assert orch._standby_sound(record, element, standby)
    # Back on fog-a: the spec's node again, the other standby no longer wanted.
    orch.registry.set_placement("p", "aggregate", "fog-a")
    record = orch.pipeline("p")
    assert orch.standby_node(record, element) == "fog-b"
    if elsewhere != "fog-a":
        assert not orch._standby_sound(record, element, standby)


def test_a_standby_whose_node_cannot_be_given_the_pes_rights_is_not_promoted(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby's node may not write the PE's records: its promotion gives it the PE's
    rights before its gate opens, and without them it is not promoted (its writes would
    wait for answers the broker never sends, batch after batch)."""
    from fogshift.broker.exceptions import BrokerError
    from fogshift.restoration.exceptions import RestoreFailed

    orch.registry.add_standby("p", "aggregate", "fog-b")
    standby = orch.registry.standby("p", "aggregate")
    assert standby is not None

    def refuse(registry: Any) -> bool:
        raise BrokerError("nats-server (pid 1) is gone")

    monkeypatch.setattr(orch.permissions, "sync", refuse)
    element = orch.pipeline("p").spec.element("aggregate")
    with pytest.raises(RestoreFailed, match="broker rights"):
        orch.promote_standby(element, "p", "fog-a", standby)
    assert agents["fog-b"].received("PUT", AGG + "/gate") == []
    assert agents["fog-b"].received("GET", AGG + "/progress") == []  # nothing was asked
    (op,) = orch.registry.operations("p")
    assert op.outcome == "failed"


def test_a_node_taken_out_gives_up_the_standbys_the_keeper_put_there(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    """`fogshift remove-node` of a node keeping a standby the keeper chose there
    (``standby: planned``): it was refused, and the only way round was to stop the
    standby's pipeline. The standby is dropped (discarded on its node), the node removed,
    and the next round starts one on a node that stays."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        standby = standby_on_fog_b(orch, agents)  # (the least busy node)
        # A PE there too: refused, and its standby stays (nothing changed).
        orch.registry.set_placement("p", "sink", "fog-b")
        with pytest.raises(NodeInUse, match=r"'fog-b' still hosts or is named by PE p/sink\n"):
            orch.remove_node("fog-b")
        assert orch.registry.standby("p", "aggregate") == standby
        assert agents["fog-b"].received("DELETE", AGG) == []
        orch.registry.set_placement("p", "sink", "cloud")

        orch.remove_node("fog-b")
        assert orch.registry.node("fog-b") is None
        assert orch.registry.standby("p", "aggregate") is None
        (discard,) = agents["fog-b"].received("DELETE", AGG)
        assert discard.query == {"discard": "true"}
        agents["cloud"].answer("GET", AGG + "/progress", body=progress(3, 40))
        agents["cloud"].answer("PUT", AGG + "/gate", body=progress(3, 40))
        orch.keep_standbys()
        standby = orch.registry.standby("p", "aggregate")
        assert standby is not None and (standby.node, standby.epoch) == ("cloud", 3)
        assert not orch._leaving


def test_a_standby_on_the_node_its_spec_names_keeps_the_node(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """``recovery.standby: fog-b``: the keeper would start it there again, so the node's
    removal is refused as before, and the refusal says how to go on."""
    standby = standby_on_fog_b(orch, agents)
    with pytest.raises(NodeInUse, match=r"pipeline p, whose spec places") as refused:
        orch.remove_node("fog-b")
    assert "recovery.standby" in refused.value.render()
    assert "the standby of p/aggregate" not in refused.value.message  # (said once)
    assert orch.registry.standby("p", "aggregate") == standby
    assert orch.registry.node("fog-b") is not None
    assert agents["fog-b"].received("DELETE", AGG) == []


def test_the_node_a_spec_names_for_its_standbys_is_kept_with_no_standby_on_it(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """The PE was promoted onto the node its spec names (``recovery.standby: fog-b``), so
    no standby stands there: the node was no longer kept, `--drain` moved the PE away and
    the removal went on, after which the PE never had a standby again. The spec's naming
    keeps it, and a drain is refused up front (the hold is no ``pe``)."""
    standby_on_fog_b(orch, agents)
    orch.registry.drop_standby("p", "aggregate", epoch=2)
    orch.registry.set_placement("p", "aggregate", "fog-b")  # promoted there
    assert {(h.kind, h.text) for h in orch.holds("fog-b")} == {
        ("pe", "PE p/aggregate"),
        ("standby", "pipeline p, whose spec places its standbys there (`recovery.standby`)"),
    }
    orch.registry.set_placement("p", "aggregate", "fog-a")  # moved away: still kept
    assert [h.kind for h in orch.holds("fog-b")] == ["standby"]
    with pytest.raises(NodeInUse, match=r"pipeline p, whose spec places"):
        orch.remove_node("fog-b")
    assert orch.registry.node("fog-b") is not None


def test_no_standby_is_started_or_kept_on_a_node_being_removed(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    """While a removal runs (between its drops and the registry's removal) the keeper's
    rounds neither choose the node nor keep a standby there: one they chose just before
    would land after the drops and keep the node."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        record = orch.pipeline("p")
        element = record.spec.element("aggregate")
        assert orch.standby_node(record, element) == "fog-b"
        standby = StandbyRecord("p", "aggregate", "fog-b", 2, time.time())  # just started
        assert orch._standby_sound(record, element, standby)
        orch._leaving["fog-b"] += 1
        assert orch.standby_node(record, element) == "cloud"
        assert not orch._standby_sound(record, element, standby)


def test_no_pe_is_migrated_restored_or_promoted_onto_a_node_being_removed(
    tmp_path: Path, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the keeper looked at the leaving mark: a migration or restore to the node, or a
    promotion of its standby there, placed a PE on it after the removal had dropped its
    standbys, and the removal was then refused with the standbys gone."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        standby_on_fog_b(orch, agents)
        assert "fog-b" in orch.restore_candidates("p", "aggregate", {"fog-a"})
        orch._leaving["fog-b"] += 1
        with pytest.raises(Unavailable, match="being removed from the cluster") as refused:
            orch.migrate("p", "aggregate", "fog-b")
        assert "choose another node (cloud healthy now)" in refused.value.render()
        with pytest.raises(Unavailable, match="being removed from the cluster"):
            orch.restore("p", "aggregate", target="fog-b")
        assert orch.restore_candidates("p", "aggregate", {"fog-a"}) == ["cloud"]
        assert orch.pipeline("p").placement["aggregate"] == "fog-a"
        # A restore naming no node, and the reconciler's of a PE whose node came back
        # without its checkpoints: its standby on fog-b is not promoted, the checkpoint's
        # restore goes elsewhere.
        promoted: list[str] = []
        restored: list[list[str]] = []
        monkeypatch.setattr(orch, "promote_standby", lambda *a: promoted.append(a[3].node))
        monkeypatch.setattr(orch, "_restore_on", lambda *a: restored.append(a[3]))
        orch.restore("p", "aggregate")
        orch._restore_lost("p", orch.pipeline("p").spec.element("aggregate"))
        assert (promoted, restored) == ([], [["cloud"], ["fog-a"]])
        orch._leaving["fog-b"] -= 1  # (the removal ended: promoted again)
        orch.restore("p", "aggregate")
        assert promoted == ["fog-b"]


def test_a_drain_lease_marks_a_node_leaving_until_it_ends_or_lapses(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    """`remove-node --drain` empties the node before its removal: emptied, it became the
    least busy node, the first choice of a restore or a new standby there meanwhile."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        record = orch.pipeline("p")
        element = record.spec.element("aggregate")
        assert orch.standby_node(record, element) == "fog-b"
        orch.drain_lease("fog-b", 60)
        assert orch.leaving_nodes() == {"fog-b"}
        assert orch.standby_node(record, element) == "cloud"
        with pytest.raises(Unavailable, match="being removed"):
            source, aggregate, sink = SPEC["elements"]
            orch.deploy({"pipeline": "q", "elements": [
                {**source, "options": {"path": str(tmp_path / "in.csv")}},
                {**aggregate, "node": "fog-b"},
                {**sink, "options": {"path": str(tmp_path / "out" / "q.csv")}}]})  # fmt: skip
        orch.drain_lease("fog-b", None)
        assert orch.leaving_nodes() == set()
        orch.drain_lease("fog-b", 0.05)  # (its drain died: it lapses)
        wait_until(lambda: not orch.leaving_nodes(), 5, describe="the lease lapsed")
        with pytest.raises(UnknownNode):
            orch.drain_lease("fog-x", 60)


def test_a_removal_that_cannot_take_every_pe_it_would_touch_drops_nothing(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    """A user's operation holds one of the PEs whose standby the removal would drop: it
    raised halfway, after dropping the standbys before that PE's. Every section is taken
    first now, and the refusal changes nothing."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        standby = standby_on_fog_b(orch, agents)
        orch.registry.add_standby("p", "source", "fog-b")  # (after the aggregate's)
        source = orch.registry.standby("p", "source")
        busy = pytest.raises(MigrationInProgress, match="its standby of p/source cannot")
        with orch._exclusive("p", "source", "migration"), busy:
            orch.remove_node("fog-b")
        assert busy.excinfo.value.message.endswith("nothing was changed")
        assert orch.registry.standby("p", "aggregate") == standby
        assert orch.registry.standby("p", "source") == source
        assert agents["fog-b"].received("DELETE", AGG) == []
        assert orch.registry.node("fog-b") is not None and not orch._leaving


def test_what_lands_on_the_node_while_the_removal_takes_the_sections_stops_it_first(
    tmp_path: Path,
    agents: dict[str, StandIn],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The holds are looked at again once every section is taken, before any drop: a PE
    placed there meanwhile refuses the removal with the standby still standing."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        standby = standby_on_fog_b(orch, agents)
        real = orch._exclusive

        def landing(*args: Any, **kwargs: Any) -> Any:
            orch.registry.set_placement("p", "sink", "fog-b")
            return real(*args, **kwargs)

        monkeypatch.setattr(orch, "_exclusive", landing)
        orch.registry.add_standby("p", "source", "fog-b")  # (two sections held at the refusal)
        refused = pytest.raises(NodeInUse, match=r"PE p/sink\n")
        with caplog.at_level(logging.WARNING, "fogshift.orchestrator"), refused:
            orch.remove_node("fog-b")
        assert orch.registry.standby("p", "aggregate") == standby
        assert agents["fog-b"].received("DELETE", AGG) == []
        # Said once, not once per PE section it held (each logged "node removal of p/… failed").
        said = [r.getMessage() for r in caplog.records if "removal" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("the removal of node fog-b was refused"), said


def test_overlapping_removals_of_a_node_do_not_end_each_others_leaving_mark(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    """The mark was a set: the first removal to end cleared it under the other, and the
    keeper could choose the node again while that one still dropped standbys there."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        orch._leaving["fog-b"] += 1  # (another removal of it, under way)
        orch.remove_node("fog-b")
        assert orch._leaving == {"fog-b": 1}


@pytest.mark.parametrize("lands", ["standby", "pe"])
def test_a_standby_that_lands_on_a_node_being_removed_is_dropped_in_a_second_pass(
    tmp_path: Path, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch, lands: str
) -> None:
    """The keeper had chosen the node before the removal marked it leaving, and its standby
    landed after the removal's drops: the registry refuses the removal, and the removal
    drops that one too and tries again. Anything else that lands there (a PE) is the
    refusal."""
    with orchestrator_of(tmp_path, agents, {**SPEC, "recovery": {"standby": "planned"}}) as orch:
        standby_on_fog_b(orch, agents)
        real = orch.registry.remove_node
        calls: list[str] = []

        def landing_first(name: str) -> None:
            calls.append(name)
            if len(calls) == 1:  # (between the first pass's drops and the registry's removal)
                if lands == "standby":
                    orch.registry.add_standby("p", "aggregate", "fog-b")
                else:
                    orch.registry.set_placement("p", "sink", "fog-b")
            real(name)

        monkeypatch.setattr(orch.registry, "remove_node", landing_first)
        if lands == "pe":
            with pytest.raises(NodeInUse, match=r"PE p/sink\n"):
                orch.remove_node("fog-b")
            assert calls == ["fog-b"] and orch.registry.node("fog-b") is not None
            # The standby, dropped before the PE landed, stays dropped: the keeper starts
            # it again on a node it may choose (fog-b too, no longer leaving).
            assert orch.registry.standby("p", "aggregate") is None
            assert len(agents["fog-b"].received("DELETE", AGG)) == 1
        else:
            orch.remove_node("fog-b")
            assert calls == ["fog-b", "fog-b"] and orch.registry.node("fog-b") is None
            assert orch.registry.standby("p", "aggregate") is None
            assert len(agents["fog-b"].received("DELETE", AGG)) == 2  # each discarded
        assert not orch._leaving


def test_status_says_why_a_pe_asked_a_standby_has_none(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # Its standby node killed: the standby cells showed "-", as for a pipeline asking none.
    def missing() -> dict[str, str | None]:
        (status,) = orch.status("p", counts=False)
        return {e.element: e.standby_missing for e in status.elements}

    # (The sink is restored from checkpoints: never a standby.)
    assert missing() == {"source": "being started on fog-b", "aggregate": "being started on fog-b",
                         "sink": None}  # fmt: skip
    standby_on_fog_b(orch, agents)
    assert missing()["aggregate"] is None
    # `nodes` tells the standby from the PE (both listed among the nodes' elements).
    reports = {"cloud": [hosted("source"), hosted("sink")], "fog-a": [hosted("aggregate")],
               "fog-b": [hosted("aggregate", 2)]}  # fmt: skip
    beat(orch, agents, reports)
    views = {n.name: n for n in orch.nodes()}
    assert (views["fog-b"].elements, views["fog-b"].standbys) == (["p/aggregate"], ["p/aggregate"])
    assert (views["fog-a"].elements, views["fog-a"].standbys) == (["p/aggregate"], [])
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-b'")
    orch.drop_standby(orch.registry.standby("p", "aggregate"))  # type: ignore[arg-type]
    assert missing() == {"source": "its node fog-b is not up",
                         "aggregate": "its node fog-b is not up", "sink": None}  # fmt: skip
    orch.drain_lease("fog-b", 60)
    assert missing()["aggregate"] == "its node fog-b is leaving"


def test_no_standby_is_started_where_an_instance_of_the_pe_still_runs(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # A rolled-back migration's target, a woken zombie: its agent refused the standby's
    # start until the reconciler removed that instance, and each try took an epoch.
    beat(orch, agents, {"cloud": [hosted("source"), hosted("sink")], "fog-a": [hosted("aggregate")],
                        "fog-b": [hosted("aggregate", epoch=1)]})  # fmt: skip
    serve_warm_copy(agents)
    orch.keep_standbys()
    assert orch.registry.standby("p", "aggregate") is None
    assert agents["fog-b"].received("PUT", AGG) == []
    assert orch.registry.epoch("p", "aggregate") == 1  # no epoch taken
    # Gone from fog-b's next heartbeat: started there.
    beat(
        orch, agents, {"cloud": [hosted("source"), hosted("sink")], "fog-a": [hosted("aggregate")]}
    )
    standby_on_fog_b(orch, agents)
