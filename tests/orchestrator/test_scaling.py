"""A scale-out that failed midway is finished by the same request again, or by the
reconciler: its added partition started, its consumers reading it; and what a stop or a
deploy that meets a failing node or broker leaves.

A real orchestrator object and registry; real HTTP servers stand in for the node agents
(``standin``) and record what they are asked; the broker is stubbed (no stream is made).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fogshift.broker.keys import KeyMove, KeyState, Ownership
from fogshift.common.text import one_line
from fogshift.contracts import Heartbeat, KeyMoveStatus, KeyWave, ScaleReport, StoppedCounts
from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, Unavailable
from fogshift.orchestrator.keymoves import Listing, Settled
from fogshift.orchestrator.reports import KeptReports
from fogshift.orchestrator.scaling import Scaling
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec
from fogshift.spec.models import ElementSpec, partition_of_key
from tests.orchestrator.standin import StandIn, offline_config, standins

SPEC = {
    "pipeline": "p",
    "elements": [
        {"id": "source", "kind": "csv-source", "node": "cloud", "options": {"path": "in.csv"}},
        {"id": "aggregate", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b"],
         "key_by": "sensor", "inputs": ["source"],
         "options": {"field": "value", "window": 3, "function": "avg"}},
        {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["aggregate"],
         "options": {"path": "out/o.csv"}},
    ],
}  # fmt: skip
ADDED = "/pipelines/p/elements/aggregate-p2"
SINK = "/pipelines/p/elements/sink"


@pytest.fixture
def agents() -> Iterator[dict[str, StandIn]]:
    with standins("cloud", "fog-a", "fog-b", "fog-c") as agents:
        yield agents


@pytest.fixture
def orch(tmp_path: Path, agents: dict[str, StandIn]) -> Iterator[Orchestrator]:
    config = offline_config(tmp_path)
    orchestrator = Orchestrator(config)
    orchestrator.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
    orchestrator.broker = SimpleNamespace(run=lambda make, timeout=30, **_: 0, close=lambda: None)  # type: ignore[assignment]
    orchestrator.permissions = SimpleNamespace(  # type: ignore[assignment]
        sync=lambda registry: None,
        sync_quietly=lambda registry: None,
        withholding=lambda pipeline: contextlib.nullcontext(),
    )
    try:
        yield orchestrator
    finally:
        orchestrator.close()


def _beat(orch: Orchestrator, agents: dict[str, StandIn]) -> None:
    """Every stand-in reports what the registry places on it, each with its inputs as the
    spec had them at deployment (the sink reads partitions 0 and 1)."""
    record = orch.registry.get_pipeline("p")
    assert record is not None
    for name, agent in agents.items():
        hosted: list[dict[str, Any]] = [
            {"pipeline": "p", "element": e.id, "state": "running", "epoch": 1,
             "inputs": ["aggregate-p0", "aggregate-p1"] if e.id == "sink" else list(e.inputs)}
            for e in record.spec.elements
            if record.placement[e.id] == name and e.id != "aggregate-p2"
        ]  # fmt: skip
        orch.heartbeat(name, Heartbeat.model_validate({"url": agent.url, "ready": True,
                                                       "elements": hosted}))  # fmt: skip


def _parts(orch: Orchestrator) -> list[ElementSpec]:
    record = orch.registry.get_pipeline("p")
    assert record is not None
    return [e for e in record.spec.elements if e.partition and e.partition.of == "aggregate"]


def test_partitions_placed_on_one_node_are_a_warning_of_the_running_pipelines_status(
    orch: Orchestrator, tmp_path: Path
) -> None:
    # A spec's `partitions: [fog-a, fog-a]` is accepted (a later scale or migration may part
    # them) but said nowhere, while a key move `--to fog-a` is refused there as ambiguous.
    assert orch.status("p", counts=False)[0].warnings == []  # fog-a and fog-b
    shared = {**SPEC, "pipeline": "q", "elements": [
        {**e, "partitions": ["fog-a", "fog-a"]} if e["id"] == "aggregate" else e
        for e in SPEC["elements"]  # type: ignore[attr-defined]
    ]}  # fmt: skip
    orch.registry.put_pipeline(parse_spec(shared, tmp_path), "running")
    (status,) = orch.status("q", counts=False)
    assert len(status.warnings) == 1, status.warnings
    assert status.warnings[0].startswith(
        "fog-a runs 2 partitions of 'aggregate' now (aggregate-p0, aggregate-p1)"
    )
    assert "`--to aggregate-p0`" in status.warnings[0]
    orch.registry.set_status("q", "stopped")  # (it runs nowhere: nothing to say)
    assert orch.status("q", counts=False)[0].warnings == []


def test_a_scale_out_that_failed_midway_is_finished_by_the_same_request_again(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    _beat(orch, agents)
    record = orch.registry.get_pipeline("p")
    assert record is not None
    # A partition of that id was added once and retired since: its checkpoints go.
    old = {"offsets/9": b"o"}
    orch.central.put({"id": "b000000000009", "pipeline": "p", "element": "aggregate-p2",
                      "batch": 9, "files": {"offsets/9": {
                          "sha256": hashlib.sha256(b"o").hexdigest(), "size": 1}}},
                     old.__getitem__)  # fmt: skip
    agents["fog-c"].fail("PUT", ADDED)  # the added partition's node refuses to start it
    with pytest.raises(Unavailable):
        orch._place(record.spec, _parts(orch), 3, ["fog-c"], "source")
    assert agents["cloud"].received("PUT", SINK) == []  # the sink still reads p0 and p1
    assert orch.central.newest("p", "aggregate-p2") is None
    # And what it left on the node, before the spec named the partition there.
    (discard,) = agents["fog-c"].received("DELETE", ADDED)
    assert discard.query == {"discard": "true"}
    # The spec has the partition and the sink reads it, yet neither runs so: again.
    record = orch.registry.get_pipeline("p")
    assert record is not None
    assert "aggregate-p2" in record.spec.element("sink").inputs
    agents["fog-c"].fail("PUT", ADDED, status=200)
    _beat(orch, agents)
    added, consumers = orch._place(record.spec, _parts(orch), 3, [], "source")
    assert added == [] and [c.id for c in consumers] == ["sink"]
    (start,) = agents["fog-c"].received("PUT", ADDED)[-1:]
    assert start.body["fresh"] is False and start.body["element"]["node"] == "fog-c"
    assert len(agents["cloud"].received("DELETE", SINK)) == 1
    (restarted,) = agents["cloud"].received("PUT", SINK)
    assert "aggregate-p2" in restarted.body["element"]["inputs"]
    assert restarted.body["epoch"] == 2  # a new epoch, fenced first


@pytest.mark.parametrize("request_kind", ["key move", "scale"])
def test_a_request_queued_behind_a_scale_is_refused_when_the_partitions_changed(
    orch: Orchestrator, agents: dict[str, StandIn], request_kind: str
) -> None:
    # A key move (or another scale) planned on two partitions waited for the element's lock
    # while a scale added a third: run on what it read before, it could give keys to a
    # partition retired meanwhile (no owner), list a group's keys without the new
    # partition's (their states left behind), or add a running partition again.
    import threading

    from fogshift.exceptions import Conflict
    from fogshift.orchestrator.locks import _LOCKS

    class Told:
        """The element's lock, telling when the request comes to wait for it."""

        def __init__(self) -> None:
            self.lock, self.asked = threading.Lock(), threading.Event()

        def acquire(self, timeout: float = -1) -> bool:
            if threading.current_thread() is not threading.main_thread():
                self.asked.set()
            return self.lock.acquire(timeout=timeout)

        def release(self) -> None:
            self.lock.release()

        def __enter__(self) -> None:
            self.acquire()

        def __exit__(self, *exc: object) -> None:
            self.release()

    _beat(orch, agents)
    lock = _LOCKS[("p", "aggregate")] = Told()  # type: ignore[assignment]
    failed: list[BaseException] = []

    def send() -> None:
        try:
            if request_kind == "key move":
                orch.migrate_keys("p", "aggregate", ["s1"], "fog-b", timeout_s=0.1)
            else:
                orch.scale("p", "aggregate", 3, ["fog-c"], timeout_s=0.1)
        except BaseException as exc:  # (asserted below)
            failed.append(exc)

    with lock:  # the scale ahead of it
        waiting = threading.Thread(target=send)
        waiting.start()
        assert lock.asked.wait(30)  # planned on two partitions, now waiting
        record = orch.registry.get_pipeline("p")
        assert record is not None
        agents["fog-c"].fail("PUT", ADDED, status=200)
        orch._place(record.spec, _parts(orch), 3, ["fog-c"], "source")
    waiting.join(30)
    assert not waiting.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], Conflict), failed
    assert "partitions changed while it waited" in failed[0].message
    assert [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1", "aggregate-p2"]
    del _LOCKS[("p", "aggregate")]


@pytest.mark.parametrize("request_kind", ["key move", "scale"])
def test_a_key_move_or_scale_of_a_stopped_pipeline_is_refused_before_anything_runs(
    orch: Orchestrator, agents: dict[str, StandIn], request_kind: str
) -> None:
    # A scale stored a third partition and started it (and restarted the sink) on a stopped
    # pipeline before failing; a key move appended its records and waited a minute for
    # partitions nobody ran.

    _beat(orch, agents)
    orch.registry.set_status("p", "stopped")  # type: ignore[arg-type]
    with pytest.raises(Conflict) as refused:
        if request_kind == "key move":
            orch.migrate_keys("p", "aggregate", ["s1"], "fog-b", timeout_s=0.1)
        else:
            orch.scale("p", "aggregate", 3, ["fog-c"], timeout_s=0.1)
    assert "pipeline 'p' is stopped, not running" in refused.value.message
    # (Not "deploy starts a stopped pipeline": it read as a resume, and emptied a sink.)
    assert refused.value.hint and "`fogshift start p` starts a stopped one again" in (
        refused.value.hint
    )
    assert "`fogshift deploy SPEC --fresh` starts it over" in refused.value.hint
    assert "sinks' files begin empty" in refused.value.hint
    assert [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1"]
    assert all(agent.calls == [] for agent in agents.values())


def test_a_state_that_cannot_be_read_now_is_unavailable_with_the_reason(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # The dashboard's PE page showed a 404 error page instead of itself when the node did
    # not run the PE (being restarted), or the pipeline was stopped.
    from fogshift.exceptions import Unavailable

    _beat(orch, agents)
    here = "/pipelines/p/elements/aggregate-p0/state"
    gone = {"code": "unknown_element", "message": "node 'fog-a' does not host p/aggregate-p0"}
    agents["fog-a"].answer("GET", here, 404, gone)
    with pytest.raises(Unavailable) as unread:
        orch.twin_state("p", "aggregate")
    assert "node 'fog-a' does not run it" in unread.value.message
    assert "does not host p/aggregate-p0" in unread.value.message and unread.value.hint
    # A lost node is not asked (a partitioned one held the read for the client's timeout).
    orch.registry._db.execute("UPDATE nodes SET last_seen = last_seen - 60 WHERE name = 'fog-a'")
    asked = len(agents["fog-a"].calls)
    with pytest.raises(Unavailable) as unread:
        orch.twin_state("p", "aggregate")
    assert "its node 'fog-a' is lost" in unread.value.message
    assert len(agents["fog-a"].calls) == asked
    orch.registry.set_status("p", "stopped")  # type: ignore[arg-type]
    asked = len(agents["fog-a"].calls)
    with pytest.raises(Unavailable) as unread:
        orch.twin_state("p", "aggregate", "s1")
    assert "pipeline 'p' is stopped" in unread.value.message
    assert (unread.value.expected, unread.value.received) == ("a running pipeline", "stopped")
    assert unread.value.hint and "`fogshift start p` starts a stopped one" in unread.value.hint
    assert len(agents["fog-a"].calls) == asked  # no node asked


def _twins(part: str, node: str, entries: dict[str, Any]) -> dict[str, Any]:
    """A partition's answer to a state read: ``entries`` key -> state."""
    return {"pipeline": "p", "element": part, "node": node, "batch": 7, "key_by": "sensor",
            "keys": len(entries), "entries": [{"key": k, "state": v}
                                              for k, v in entries.items()]}  # fmt: skip


def test_a_listing_of_partitions_ends_where_a_partitions_page_was_cut(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Partition 0's page ends at s8 (its node's page size: its keys' state is long), one of
    # its keys past it; partition 1's s9 after s8 would have shown a listing with a hole.
    _beat(orch, agents)
    monkeypatch.setattr(orch, "_read_owners", lambda *args: None)
    cut = _twins("aggregate-p0", "fog-a", {"s1": {"n": 1}, "s8": {"n": 8}})
    agents["fog-a"].answer("GET", "/pipelines/p/elements/aggregate-p0/state",
                           body={**cut, "keys": 3})  # fmt: skip
    agents["fog-b"].answer(
        "GET",
        "/pipelines/p/elements/aggregate-p1/state",
        body=_twins("aggregate-p1", "fog-b", {"s2": {"n": 2}, "s9": {}}),
    )
    every = orch.twin_state("p", "aggregate")
    assert ([e.key for e in every.entries], every.keys) == (["s1", "s2", "s8"], 5)


def test_a_key_is_read_where_its_moves_put_it_not_from_an_older_copy_or_as_never_seen(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # s1 (CRC-32's partition 0) moved to partition 1 by move m1; partition 0, restored from
    # a checkpoint before the move, holds its older state until it replays the move: the
    # read answered that, and the listing showed s1 twice.

    assert partition_of_key("s1", 2) == partition_of_key("s8", 2) == 0
    _beat(orch, agents)
    owners = Ownership(2)
    owners.apply(KeyMove(30, "m1", "aggregate", ("s1", "s8"), 1))
    monkeypatch.setattr(orch, "_ownership", lambda *args: owners)
    p0, p1 = ("/pipelines/p/elements/aggregate-p0/state",
              "/pipelines/p/elements/aggregate-p1/state")  # fmt: skip
    agents["fog-a"].answer(
        "GET", p0, body=_twins("aggregate-p0", "fog-a", {"s1": {"n": 1}, "s2": {"n": 4}})
    )
    agents["fog-b"].answer("GET", p1, body=_twins("aggregate-p1", "fog-b", {"s1": {"n": 9}}))
    one = orch.twin_state("p", "aggregate", "s1")
    assert [(e.key, e.partition, e.state) for e in one.entries] == [
        ("s1", "aggregate-p1", {"n": 9})
    ]
    assert agents["fog-a"].received("GET", p0) == []  # (its owner answered: nobody else)
    every = orch.twin_state("p", "aggregate")
    assert [(e.key, e.partition, e.state) for e in every.entries] == [
        ("s1", "aggregate-p1", {"n": 9}),
        ("s2", "aggregate-p0", {"n": 4}),
    ]
    assert every.keys == 2  # (not p0's older copy of s1)
    # In flight: its origin sent the state it held (stored at 40), its target has not taken
    # it in yet (committed up to 35). It was "no state (it has had no valid event yet)".
    owners.settle(KeyState(40, "m1", "aggregate", "s1", 1, {"n": "9"}))
    owners.settle(KeyState(41, "m1", "aggregate", "s8", 1, {}))  # (s8 had none to send)
    agents["fog-a"].answer("GET", p0, body=_twins("aggregate-p0", "fog-a", {}))
    agents["fog-b"].answer("GET", p1, body=_twins("aggregate-p1", "fog-b", {}))
    progress = "/pipelines/p/elements/aggregate-p1/progress"
    at = {"pipeline": "p", "element": "aggregate-p1", "state": "running", "epoch": 1}
    agents["fog-b"].answer("GET", progress, body={**at, "offset": {"positions": {"source": 35}}})
    moving = orch.twin_state("p", "aggregate", "s1")
    (entry,) = moving.entries
    assert entry.key == "s1" and entry.state is None and entry.partition == "aggregate-p1"
    assert entry.waiting is not None and entry.waiting.move == "m1"
    assert (moving.element, moving.node, moving.waiting) == ("aggregate-p1", "fog-b", 1)
    # So does the whole element's listing (the key was in neither partition's answer: gone
    # from the listing while it moved), s8 not (it carried no state).
    every = orch.twin_state("p", "aggregate")
    assert [(e.key, e.partition, e.waiting and e.waiting.move) for e in every.entries] == [
        ("s1", "aggregate-p1", "m1")
    ]
    assert every.waiting == 1 and every.keys == 0
    # A move stored after the listing's look at the owners (while it asked the partitions)
    # is seen all the same.
    looks: list[object] = []

    def stored_meanwhile(*args: object) -> Ownership:
        looks.append(args)
        if len(looks) == 2:
            owners.apply(KeyMove(50, "m2", "aggregate", ("s2",), 1))
            owners.settle(KeyState(51, "m2", "aggregate", "s2", 0, {"n": "4"}))
        return owners

    monkeypatch.setattr(orch, "_ownership", stored_meanwhile)
    assert [e.key for e in orch.twin_state("p", "aggregate").entries] == ["s1", "s2"]
    monkeypatch.setattr(orch, "_ownership", lambda *args: owners)
    owners = Ownership(2)
    owners.apply(KeyMove(30, "m1", "aggregate", ("s1", "s8"), 1))
    owners.settle(KeyState(40, "m1", "aggregate", "s1", 1, {"n": "9"}))
    owners.settle(KeyState(41, "m1", "aggregate", "s8", 1, {}))
    # A key moved without state waits for nothing: it has had no event yet (it was "waiting
    # for key move m1" until one came), and its owner's node says so.
    unseen = orch.twin_state("p", "aggregate", "s8")
    assert unseen.entries == [] and unseen.node == "fog-b"
    # Taken in (committed past 40), its state dropped by the PE since: no state, not waiting.
    agents["fog-b"].answer("GET", progress, body={**at, "offset": {"positions": {"source": 40}}})
    assert orch.twin_state("p", "aggregate", "s1").entries == []
    # Its origin, restored from before the move, holds its older state again until it
    # replays the move: that was the answer, and listed, though the move's state was sent.
    agents["fog-a"].answer("GET", p0, body=_twins("aggregate-p0", "fog-a", {"s1": {"n": 1}}))
    assert orch.twin_state("p", "aggregate", "s1").entries == []
    assert orch.twin_state("p", "aggregate").entries == []
    agents["fog-a"].answer("GET", p0, body=_twins("aggregate-p0", "fog-a", {}))
    # A key that never moved and is held nowhere has had no event yet, says its owner.
    assert partition_of_key("s3", 2) == 0
    never = orch.twin_state("p", "aggregate", "s3")
    assert never.entries == [] and never.node == "fog-a"


def test_checkpoints_left_on_a_node_are_discarded_only_where_the_pe_is_not_placed(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # A node that came back with a new agent after its PEs were restored elsewhere kept
    # their checkpoints for good: nothing ran them, so nothing reported or removed them.
    _beat(orch, agents)
    left = {"fog-c": [("p", "aggregate-p0"), ("p", "source"), ("other", "x")],
            "fog-a": [("p", "aggregate-p0")]}  # fmt: skip
    record = orch.registry.get_pipeline("p")
    assert record is not None and record.placement["aggregate-p0"] == "fog-a"
    for name, entries in left.items():
        orch.heartbeat(name, Heartbeat.model_validate({
            "url": agents[name].url, "ready": True,
            "left": [{"pipeline": p, "element": e} for p, e in entries]}))  # fmt: skip
    orch._discard_left(set())
    gone = [(c.path, c.query) for c in agents["fog-c"].calls if c.method == "DELETE"]
    assert gone == [("/pipelines/p/elements/aggregate-p0", {"discard": "true"}),
                    ("/pipelines/p/elements/source", {"discard": "true"})]  # fmt: skip
    assert [c for c in agents["fog-a"].calls if c.method == "DELETE"] == []  # placed there
    # A PE with an unfinished operation is its operation's (a target being set up).
    agents["fog-c"].calls.clear()
    orch._discard_left({("p", "source")})
    assert [c.path for c in agents["fog-c"].calls] == ["/pipelines/p/elements/aggregate-p0"]


def test_a_scale_whose_added_partition_would_take_another_elements_id_is_refused(
    orch: Orchestrator, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    # A spec deployed before such ids were refused may hold an element `aggregate-p2`: the
    # added partition took its stream, placement and epoch, and its checkpoints went.
    from fogshift.exceptions import InvalidInput
    from fogshift.spec.models import PipelineSpec

    record = orch.registry.get_pipeline("p")
    assert record is not None
    extra = {"id": "aggregate-p2", "kind": "map", "node": "fog-c", "inputs": ["source"],
             "options": {"set": {"v": "value"}}}  # fmt: skip
    clashing = PipelineSpec.model_validate(
        {**record.spec.model_dump(mode="json"),
         "elements": [*record.spec.model_dump(mode="json")["elements"], extra]}
    )  # fmt: skip
    orch.registry.put_pipeline(clashing, "running")  # type: ignore[arg-type]
    _beat(orch, agents)
    epoch = orch.registry.epoch("p", "aggregate-p2")
    with pytest.raises(InvalidInput) as refused:
        orch.scale("p", "aggregate", 3, ["fog-c"], timeout_s=0.1)
    assert "'aggregate-p2' is another element's" in refused.value.message
    assert orch.registry.epoch("p", "aggregate-p2") == epoch
    assert all(c.method == "GET" for a in agents.values() for c in a.calls)


def _keys_to_p1(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch,
    committed: int,
) -> None:  # fmt: skip
    """Set up key moves to partition 1 of two (on fog-b): the input holds 7 messages, of
    which partition 1 has committed ``committed``."""
    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(count=2))
    monkeypatch.setattr(orch, "_key_subjects", lambda *args: None)
    orch.broker = SimpleNamespace(run=lambda make, timeout=30, **_: 7, close=lambda: None)  # type: ignore[assignment]
    _p1_committed(agents, committed)


def _p1_committed(agents: dict[str, StandIn], position: int) -> None:
    """Partition 1's node answers that it has committed its input up to ``position``."""
    body = {"pipeline": "p", "element": "aggregate-p1", "state": "running", "epoch": 1,
            "offset": {"positions": {"source": position}}}  # fmt: skip
    agents["fog-b"].answer("GET", "/pipelines/p/elements/aggregate-p1/progress", body=body)


def test_a_key_move_asked_again_is_moved_only_once_its_target_committed(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call's wait for the commit ran out (the target's node died after the
    states were stored); the same command again said "moved" at once, with nobody having
    committed the key."""
    key = next(f"s{k}" for k in range(100) if partition_of_key(f"s{k}", 2) == 1)
    _keys_to_p1(orch, agents, monkeypatch, committed=3)
    report = orch.migrate_keys("p", "aggregate", [key], "fog-b", timeout_s=0.3)
    assert report.status == "pending" and "has not committed" in (report.error or "")
    _p1_committed(agents, 7)
    report = orch.migrate_keys("p", "aggregate", [key], "fog-b", timeout_s=5)
    assert report.status == "moved" and report.already == [key]
    assert report.unseen == []  # (the stand-in's keys are no StateKeys: it cannot tell)


def test_a_key_already_on_its_target_that_it_never_saw_is_said_unseen(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A typo's key whose hash names the target was reported "already" there, exit 0, no
    # word: the user took the key for moved.
    seen, typo = [k for k in (f"s{n}" for n in range(100)) if partition_of_key(k, 2) == 1][:2]
    _keys_to_p1(orch, agents, monkeypatch, committed=7)
    keys = {"pipeline": "p", "element": "aggregate-p1", "node": "fog-b", "batch": 4,
            "positions": {"source": 7}, "keys": [seen]}  # fmt: skip
    agents["fog-b"].answer("GET", "/pipelines/p/elements/aggregate-p1/keys", body=keys)
    report = orch.migrate_keys("p", "aggregate", [seen, typo], "fog-b", timeout_s=5)
    assert (report.status, report.already, report.unseen) == ("moved", [seen, typo], [typo])


def test_no_key_moves_to_a_partition_a_stored_rescale_retires(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scaled in to one partition, the rescale stored and its retirement not done yet (the
    scale returned pending, or died): keys were moved to partition 1, which then could not
    be retired."""
    from fogshift.exceptions import InvalidInput

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(count=1, rescaled=5))
    monkeypatch.setattr(orch, "_key_subjects", lambda *args: None)
    with pytest.raises(InvalidInput) as refused:
        orch.migrate_keys("p", "aggregate", ["s1"], "fog-b", timeout_s=0.3)
    error = refused.value
    assert "its partition aggregate-p1 is being retired" in error.message
    assert error.received == "fog-b (aggregate-p1)" and error.hint is not None
    assert "fogshift scale p aggregate --partitions 1" in error.hint


def test_a_refused_rescale_record_says_which_added_partitions_run(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rescale record is appended after the added partitions started: its refusal
    (too many keys, an input that never stood still) said "nothing changed" then."""
    from fogshift.broker.keys import Ownership
    from fogshift.exceptions import InvalidInput

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(2))
    monkeypatch.setattr(orch, "_listed_keys", lambda *args: Listing(set(), {}))

    def refuse(*args: Any) -> None:
        raise InvalidInput("cannot scale p/aggregate: 5000 keys would move",
                           hint="move fewer keys at a time")  # fmt: skip

    monkeypatch.setattr(orch, "_append_listed", refuse)
    with pytest.raises(InvalidInput) as refused:
        orch.scale("p", "aggregate", 3, ["fog-c"])
    error = refused.value
    assert agents["fog-c"].received("PUT", ADDED)  # it was started
    assert "5000 keys would move" in error.message and "aggregate-p2" in error.message
    assert error.hint is not None and "move fewer keys" in error.hint
    assert "fogshift scale p aggregate --partitions 2" in error.hint
    # Journaled from its start to its end: a refusal is an end (nothing to carry on).
    (entry,) = [orch.registry.scale(i) for (i,) in orch.registry._db.execute(
        "SELECT id FROM scales").fetchall()]  # fmt: skip
    assert entry is not None and (entry.partitions, entry.nodes) == (3, ("fog-c",))
    assert entry.outcome == "failed: " + one_line(error.message)
    assert orch.registry.unfinished_scales() == []


def test_a_rescale_record_whose_append_met_the_broker_away_is_carried_on(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored in the first of several inputs, or acknowledged too late, the record may
    stand: ended as failed, the partitions its rescale retires stayed placed, running and
    owning nothing (a review's finding). Left open, the reconciler carries it on."""
    from fogshift.broker.exceptions import BrokerUnavailable
    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(2))
    monkeypatch.setattr(orch, "_listed_keys", lambda *args: Listing(set(), {}))

    def away(*args: Any) -> None:
        raise BrokerUnavailable("the broker cannot be reached")

    monkeypatch.setattr(orch, "_append_listed", away)
    with pytest.raises(BrokerUnavailable) as failed:
        orch.scale("p", "aggregate", 3, ["fog-c"])
    message = failed.value.message
    assert "to 3 partitions may be stored (its append met the broker away)" in message
    assert "carries the scale on by itself" in message
    (entry,) = orch.registry.unfinished_scales()  # left open, not ended as failed
    assert (entry.partitions, entry.outcome) == (3, None)


def test_a_scale_carried_on_while_keys_wait_for_their_states_is_tried_again(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys waiting for a move's state (the scale's own waves' or rescale's, crossing when
    its orchestrator died) are a wait, not a refusal: the recovery ended such a scale as
    refused, and a scale-in's partitions were never retired."""
    from fogshift.exceptions import Conflict

    _beat(orch, agents)
    waiting = Ownership(2)
    waiting.pending["s1"] = "m1"
    monkeypatch.setattr(orch, "_owners", lambda *args: waiting)
    left = orch.registry.begin_scale("p", "aggregate", 3, None, True, "dead0rchestr")
    assert orch.recover_scales() == []
    entry = orch.registry.scale(left.id)
    assert entry is not None and entry.outcome is None  # left open: tried again later
    assert left.id in orch._scale_retries
    # Asked by a user meanwhile: told to wait (409), with what waits.
    with pytest.raises(Conflict) as refused:
        orch.scale("p", "aggregate", 3)
    assert "still wait for the state of an earlier key move" in refused.value.message
    assert refused.value.received == "1 keys waiting" and refused.value.http_status == 409
    assert refused.value.hint is not None and "scale again" in refused.value.hint
    # ... and the scale it superseded is not lost: this one stays open in its place (ended
    # as failed, nothing carried the rescale on, its partitions never retired).
    assert f"takes the place of scale {left.id}, left open" in refused.value.message
    (open_now,) = orch.registry.unfinished_scales()
    assert open_now.id != left.id and open_now.partitions == 3


def test_a_scale_whose_listing_or_start_fails_says_which_partitions_it_added(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node away when the old partitions' keys are listed, or the added partition's node
    refusing to start it: the error named only the agent, while the spec had the added
    partition (and it ran)."""
    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(2))
    agents["fog-a"].fail("GET", "/pipelines/p/elements/aggregate-p0/keys")
    # (fog-b answers: the listing raises its first failure as it comes, fog-a's then.)
    agents["fog-b"].answer("GET", "/pipelines/p/elements/aggregate-p1/keys", body={
        "pipeline": "p", "element": "aggregate-p1", "node": "fog-b", "batch": None,
        "positions": {}, "keys": [],
    })  # fmt: skip
    with pytest.raises(Unavailable) as away:
        orch.scale("p", "aggregate", 3, ["fog-c"])
    assert agents["fog-c"].received("PUT", ADDED)  # it was started
    assert "aggregate-p2 were added and run" in away.value.message, away.value.message
    assert away.value.hint and "fogshift scale p aggregate --partitions 2" in away.value.hint
    assert orch.registry.unfinished_scales() == []  # asked by a user, who was told
    # Carried on for an orchestrator that died, it stays for the next round to try again.
    # (The added partition answers: fog-a's failure is the one raised.)
    agents["fog-c"].answer("GET", "/pipelines/p/elements/aggregate-p2/keys", body={
        "pipeline": "p", "element": "aggregate-p2", "node": "fog-c", "batch": None,
        "positions": {}, "keys": [],
    })  # fmt: skip
    left = orch.registry.begin_scale("p", "aggregate", 3, ["fog-c"], False, "dead0rchestr")
    with pytest.raises(Unavailable):
        orch.scale("p", "aggregate", 3, ["fog-c"], resume=left)
    assert [e.id for e in orch.registry.unfinished_scales()] == [left.id]
    orch.registry.end_scale(left.id, "test")
    # Retired again; then the added partition's node refuses to start it.
    spec = parse_spec(SPEC, orch.config.home)
    orch.registry.remove_elements("p", lambda stored: spec, ["aggregate-p2"])
    agents["fog-c"].fail("PUT", ADDED)
    with pytest.raises(Unavailable) as refused:
        orch.scale("p", "aggregate", 3, ["fog-c"])
    assert "aggregate-p2 were added to the spec (not all started)" in refused.value.message
    assert refused.value.hint and "the same scale again completes it" in refused.value.hint


def test_a_broker_away_fails_a_scale_out_before_the_spec_changes(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """Placed without a stream, the added partition could not be started, and its
    consumers, restarted by the reconciler with it as an input, failed reading it (the
    broker answered the input's tail, then went away)."""
    from fogshift.broker.exceptions import BrokerUnavailable

    _beat(orch, agents)
    calls: list[Any] = []

    def away(make: Any, timeout: float = 30) -> Any:
        calls.append(make)
        if len(calls) > 1:  # (the input's tail was read: the broker went away after)
            raise BrokerUnavailable("the broker cannot be reached")
        return 0

    orch.broker = SimpleNamespace(run=away, close=lambda: None)  # type: ignore[assignment]
    record = orch.registry.get_pipeline("p")
    assert record is not None
    with pytest.raises(BrokerUnavailable):
        orch._place(record.spec, _parts(orch), 3, ["fog-c"], "source")
    after = orch.registry.get_pipeline("p")
    assert after is not None and [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1"]
    assert "aggregate-p2" not in after.spec.element("sink").inputs
    assert agents["fog-c"].received("PUT", ADDED) == []


def test_a_node_that_cannot_discard_an_earlier_partition_of_the_id_fails_the_scale_first(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """A partition retired while its node was away left its checkpoint there: placed again
    under its id, every start but the scale's first (carried on after a crash, restarted
    by the reconciler) resumed the retired one's state and offsets."""
    _beat(orch, agents)
    agents["fog-c"].fail("DELETE", ADDED)
    record = orch.registry.get_pipeline("p")
    assert record is not None
    with pytest.raises(FogshiftError):
        orch._place(record.spec, _parts(orch), 3, ["fog-c"], "source")
    assert [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1"]
    assert agents["fog-c"].received("PUT", ADDED) == []


def test_a_node_answering_an_error_does_not_stop_the_stop_half_way(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """Only an unreachable node was tolerated: one answering 500 left the pipeline
    "stopping", the nodes after it not asked, and nothing took the rest down."""
    _beat(orch, agents)
    agents["cloud"].answer("DELETE", "/pipelines/p", 500, {"code": "error", "message": "bug"})
    result = orch.stop("p")
    assert result.status == "stopped" and result.unreachable_nodes == ["cloud"]
    for name in ("fog-a", "fog-b"):  # (sorted after cloud: asked all the same)
        assert agents[name].received("DELETE", "/pipelines/p"), name
    record = orch.registry.get_pipeline("p")
    assert record is not None and record.status == "stopped"


def test_a_stopped_pipelines_status_shows_the_counts_its_nodes_gave_at_the_stop(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # The counts came from the nodes' reports only, gone with the instances: every PE of a
    # stopped pipeline showed `in 0`, and its sink `out 0`.
    _beat(orch, agents)
    info = {"pipeline": "p", "state": "stopped", "epoch": 1}
    agents["cloud"].answer("DELETE", "/pipelines/p", body=[
        {**info, "element": "source", "events_in": 0},
        {**info, "element": "sink", "events_in": 40, "lines_written": 38, "restarts": 1},
    ])  # fmt: skip
    agents["fog-a"].answer("DELETE", "/pipelines/p", body=[
        {**info, "element": "aggregate-p0", "events_in": 120},
        {**info, "element": "aggregate-p1", "events_in": 999},  # (a standby's: not kept)
    ])  # fmt: skip
    agents["fog-b"].answer("DELETE", "/pipelines/p", 200, {"unexpected": "answer"})
    orch.stop("p")
    record = orch.registry.get_pipeline("p")
    assert record is not None
    for name, agent in agents.items():  # (heard after the stop: they run none of it)
        orch.heartbeat(name, Heartbeat.model_validate({"url": agent.url, "ready": True}))
    shown = {e.element: e for e in orch.status("p", counts=False)[0].elements}
    assert (shown["sink"].events_in, shown["sink"].events_out, shown["sink"].restarts) == (
        40, 38, 1,
    )  # fmt: skip
    assert shown["aggregate-p0"].events_in == 120
    assert shown["aggregate-p1"].events_in == 0  # (fog-b's answer kept nothing: unknown)
    # Kept in the registry (an orchestrator started again shows them); gone with a deploy.
    kept = KeptReports(orch.registry, "stopped", StoppedCounts)
    assert sorted(k[1] for k in kept) == ["aggregate-p0", "sink", "source"]
    orch._forget_runs("p")
    assert not KeptReports(orch.registry, "stopped", StoppedCounts)


def test_a_stop_waits_for_a_key_move_or_scale_under_way(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scale holds its partitions only while it changes them: a stop then ran beside its
    waits, and the scale went on appending waves and a rescale record to a stopped
    pipeline's input. It waits for the element's key-move lock now, as for a migration."""
    import threading
    import time

    from fogshift.exceptions import Conflict
    from fogshift.orchestrator import deployment
    from fogshift.orchestrator.locks import element_lock

    _beat(orch, agents)
    held, release = threading.Event(), threading.Event()

    def scale() -> None:
        with element_lock("p", "aggregate", "test"):  # as a scale or key move holds it
            held.set()
            release.wait(30)

    thread = threading.Thread(target=scale)
    thread.start()
    assert held.wait(30)
    monkeypatch.setattr(deployment, "STOP_WAIT_S", 0.3)
    with pytest.raises(Conflict) as refused:
        orch.stop("p")
    assert "a key move or scale of aggregate is under way" in refused.value.message
    assert not any(agents[n].received("DELETE", "/pipelines/p") for n in agents)
    record = orch.registry.get_pipeline("p")
    assert record is not None and record.status == "running"  # nothing stopped
    monkeypatch.setattr(deployment, "STOP_WAIT_S", 30.0)
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    assert orch.stop("p").status == "stopped"
    assert time.monotonic() - started >= 0.4  # (it waited for the scale to end)
    thread.join(30)
    assert agents["fog-a"].received("DELETE", "/pipelines/p")


def test_a_deploy_whose_counts_cannot_be_read_is_still_reported_deployed(
    orch: Orchestrator, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    """Running, yet answered 503 when the broker did not answer the status's counts: the
    CLI said the deploy failed, and deploying again was refused as running."""
    from fogshift.broker.client import subject_counts

    _beat(orch, agents)

    def run(make: Any, timeout: float = 30, **_: Any) -> Any:
        if getattr(make, "func", None) is subject_counts:
            raise Unavailable("the broker did not answer in time")
        return 0

    orch.broker = SimpleNamespace(run=run, close=lambda: None)  # type: ignore[assignment]
    data = {**SPEC, "pipeline": "q"}
    data["elements"] = [
        {**e, "options": {**e["options"], "path": str(tmp_path / "q" / e["options"]["path"])}}
        if "path" in e["options"] else e
        for e in SPEC["elements"]  # type: ignore[attr-defined]
    ]  # fmt: skip
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "in.csv").write_text("timestamp,sensor,value\n")
    deployed = orch.deploy(data)
    assert deployed.pipeline == "q" and deployed.status == "running"
    assert all(e.events_out == 0 for e in deployed.elements)
    with pytest.raises(Unavailable):  # (a status asked later still says the broker is away)
        orch.status("q")


def test_a_scale_in_whose_fence_fails_discards_nothing_still_placed(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retiring partition was discarded before its stream was fenced: a broker away then
    left it in the spec and placement with nothing running it, and the reconciler restored
    it from the central store."""
    import time

    from fogshift.broker.exceptions import BrokerUnavailable
    from fogshift.broker.keys import Ownership
    from fogshift.broker.publish import fence

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(1))
    monkeypatch.setattr(orch, "_committed_past", lambda *args: True)

    def run(make: Any, timeout: float = 30) -> Any:
        if getattr(make, "func", None) is fence:
            raise BrokerUnavailable("the broker cannot be reached")
        return 0

    orch.broker = SimpleNamespace(run=run, close=lambda: None)  # type: ignore[assignment]
    retiring = "/pipelines/p/elements/aggregate-p1"
    with pytest.raises(BrokerUnavailable):
        orch._retire("p", _parts(orch), 1, "source", 5, time.monotonic() + 5)
    assert agents["fog-b"].received("DELETE", retiring) == []
    assert [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1"]
    orch.broker = SimpleNamespace(run=lambda make, timeout=30, **_: 0, close=lambda: None)  # type: ignore[assignment]
    retired, why = orch._retire("p", _parts(orch), 1, "source", 5, time.monotonic() + 5)
    assert retired == {"aggregate-p1": "fog-b"} and why is None
    (discarded,) = agents["fog-b"].received("DELETE", retiring)
    assert discarded.query == {"discard": "true"}, discarded
    assert [p.id for p in _parts(orch)] == ["aggregate-p0"]


def test_a_scale_that_fails_once_its_rescale_stands_is_carried_on_by_the_reconciler(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's scale-in whose retirement met a broker away after the rescale was stored
    was ended as failed: its partition stayed placed, running and owning nothing (fenced,
    then restarted by the reconciler) until someone asked the same scale again."""
    from fogshift.broker.exceptions import BrokerUnavailable
    from fogshift.broker.keys import Ownership
    from fogshift.broker.publish import fence

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(1))  # rescaled to 1
    monkeypatch.setattr(orch, "_committed_now", lambda *args: None)
    monkeypatch.setattr(orch, "_committed_past", lambda *args: True)
    away = [True]

    def run(make: Any, timeout: float = 30) -> Any:
        if away[0] and getattr(make, "func", None) is fence:
            raise BrokerUnavailable("the broker cannot be reached")
        return 0

    orch.broker = SimpleNamespace(run=run, close=lambda: None)  # type: ignore[assignment]
    with pytest.raises(BrokerUnavailable) as failed:
        orch.scale("p", "aggregate", 1)
    assert "carries the scale on by itself" in failed.value.message
    (entry,) = orch.registry.unfinished_scales()  # left open, not ended as failed
    assert [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1"]
    away[0] = False  # the broker is back: the reconciler's round retires the partition
    orch.recover_scales()
    done = orch.registry.scale(entry.id)
    assert done is not None and done.outcome == "moved", done
    assert [p.id for p in _parts(orch)] == ["aggregate-p0"]
    (discarded,) = agents["fog-b"].received("DELETE", "/pipelines/p/elements/aggregate-p1")
    assert discarded.query == {"discard": "true"}, discarded


def test_a_scale_in_whose_partition_is_slow_to_process_the_rescale_is_carried_on(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its partition's node lost (restored meanwhile), the retirement's wait ran out: the
    scale ended `pending`, and the partition stayed placed, running, owning nothing, for
    good (the reconciler ended a carried-on one the same way)."""
    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(1))  # rescaled to 1
    monkeypatch.setattr(orch, "_committed_now", lambda *args: None)
    processed = [False]
    monkeypatch.setattr(orch, "_committed_past", lambda *args: processed[0])
    orch.broker = SimpleNamespace(run=lambda make, timeout=30: 0,  # type: ignore[assignment]
                                  close=lambda: None)  # fmt: skip
    report = orch.scale("p", "aggregate", 1, timeout_s=0.1)
    assert report.status == KeyMoveStatus.PENDING
    assert report.error is not None and "carries the scale on by itself" in report.error
    (entry,) = orch.registry.unfinished_scales()  # left open, not ended as pending
    orch.recover_scales()  # (still not processed: open, tried again after a pause)
    assert orch.registry.scale(entry.id).outcome is None  # type: ignore[union-attr]
    assert entry.id in orch._scale_retries
    processed[0] = True
    orch._scale_retries.clear()  # (its pause over)
    orch.recover_scales()
    done = orch.registry.scale(entry.id)
    assert done is not None and done.outcome == "moved", done
    assert [p.id for p in _parts(orch)] == ["aggregate-p0"]


def test_a_scale_that_fails_before_anything_changed_is_ended_as_failed(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fogshift.broker.exceptions import BrokerUnavailable

    _beat(orch, agents)

    def away(*args: Any) -> Ownership:
        raise BrokerUnavailable("the broker cannot be reached")

    monkeypatch.setattr(orch, "_owners", away)
    with pytest.raises(BrokerUnavailable) as failed:
        orch.scale("p", "aggregate", 1)
    assert "carries the scale on" not in failed.value.message
    assert orch.registry.unfinished_scales() == []


def test_a_retired_partitions_standby_is_discarded_by_the_scale_itself(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The standbys were read after the partitions' fences, whose new epochs had dropped
    their records: the scale never discarded a standby's instance (left to the reconciler's
    removal of strays)."""
    import time

    from fogshift.broker.exceptions import BrokerError
    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(1))
    monkeypatch.setattr(orch, "_committed_past", lambda *args: True)
    orch.registry.add_standby("p", "aggregate-p1", "fog-c")

    def refuse(registry: object) -> None:
        raise BrokerError("nats-server did not reload its config (test)")

    orch.permissions = SimpleNamespace(sync=refuse, sync_quietly=refuse)  # type: ignore[assignment]
    with pytest.raises(BrokerError):
        orch._retire("p", _parts(orch), 1, "source", 5, time.monotonic() + 5)
    assert orch.registry.standby("p", "aggregate-p1") is None
    (discarded,) = agents["fog-c"].received("DELETE", "/pipelines/p/elements/aggregate-p1")
    assert discarded.query == {"discard": "true"}, discarded


def test_a_scale_holds_its_partitions_only_while_it_changes_them(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scale held every partition's exclusive section through its waits for states and
    commits: a partition whose node was lost then was restored only once the scale gave up
    waiting for it (found by the keyed soak: 80 s after its node went silent)."""
    from fogshift.broker.keys import Ownership
    from fogshift.migration.exceptions import MigrationInProgress

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(2))
    monkeypatch.setattr(orch, "_listed_keys", lambda *args: Listing(set(), {}))
    free: dict[str, bool] = {}

    def waits(where: str) -> None:
        if where != "scale:placed":
            return
        for pe in ("aggregate-p0", "aggregate-p1", "aggregate-p2", "sink"):
            try:
                with orch._exclusive("p", pe, "restore"):
                    free[pe] = True
            except MigrationInProgress:
                free[pe] = False
        raise Unavailable("stopped here by the test")

    monkeypatch.setattr(orch, "_test_pause", waits)
    with pytest.raises(Unavailable):
        orch.scale("p", "aggregate", 3, ["fog-c"])
    assert agents["fog-c"].received("PUT", ADDED)  # placed, then the sections were let go
    assert free == dict.fromkeys(("aggregate-p0", "aggregate-p1", "aggregate-p2", "sink"), True)


def test_a_scale_in_removes_a_partition_once_its_restore_ended(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retirement takes the retiring partitions' sections again for their removal:
    it waits for a restore of one under way (until the phase's deadline), and removes
    nothing while it holds one."""
    import threading
    import time

    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(1))
    monkeypatch.setattr(orch, "_committed_past", lambda *args: True)
    retiring = "/pipelines/p/elements/aggregate-p1"
    held, release = threading.Event(), threading.Event()

    def restore() -> None:
        with orch._exclusive("p", "aggregate-p1", "restore"):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=restore)
    thread.start()
    assert held.wait(30)
    retired, why = orch._retire("p", _parts(orch), 1, "source", 5, time.monotonic() + 0.5)
    assert retired == {} and why is not None and "a restore is under way" in why, why
    assert agents["fog-b"].received("DELETE", retiring) == []
    assert [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1"]
    threading.Timer(0.5, release.set).start()
    retired, why = orch._retire("p", _parts(orch), 1, "source", 5, time.monotonic() + 30)
    thread.join(30)
    assert retired == {"aggregate-p1": "fog-b"} and why is None
    assert agents["fog-b"].received("DELETE", retiring)
    assert [p.id for p in _parts(orch)] == ["aggregate-p0"]


def test_the_partitions_state_stores_are_listed_at_once(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """A key group's move or a rescale lists the keys in every partition's state store (a
    state-reader job in each node's Spark session: a second or more beside a busy query):
    every node is asked before any has answered."""
    import threading

    from fogshift.common.waiting import wait_until

    _beat(orch, agents)
    paths = {}
    stores = (("fog-a", "aggregate-p0", {"s1": 100, "s2": 10}, 40),
              ("fog-b", "aggregate-p1", {"s2": 5, "s3": 7}, 25))  # fmt: skip
    for node, pe, sizes, position in stores:
        paths[node] = f"/pipelines/p/elements/{pe}/keys"
        agents[node].answer("GET", paths[node], body={
            "pipeline": "p", "element": pe, "node": node, "batch": 3,
            "positions": {"source": position}, "keys": list(sizes), "sizes": sizes,
        })  # fmt: skip
    came, release = agents["fog-a"].hold("GET", paths["fog-a"])
    listed: list[Any] = []

    def ask() -> None:
        try:
            listed.append(orch._listed_keys("p", _parts(orch)))
        except Exception as exc:  # (shown by the assertion below, not lost in a thread)
            listed.append(exc)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    try:
        assert came.wait(10), "fog-a was not asked"
        wait_until(lambda: agents["fog-b"].received("GET", paths["fog-b"]), 10,
                   describe="fog-b asked while fog-a's answer is held")  # fmt: skip
    finally:
        release.set()
        asking.join(30)
    # The union of the keys, and each input from the oldest position the batches end at;
    # a key in two stores (one holds its move in, its state not come yet) weighs both.
    assert listed == [Listing({"s1", "s2", "s3"}, {"source": 25}, {"s1": 100, "s2": 15, "s3": 7})]


def test_a_partition_whose_listing_fails_fails_it_without_waiting_for_the_others(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """One node's refusal ends the listing at once: another's request may run to its
    timeout (two minutes), and the key group's move or rescale fails either way."""
    import threading

    _beat(orch, agents)
    held = "/pipelines/p/elements/aggregate-p0/keys"
    came, release = agents["fog-a"].hold("GET", held)
    agents["fog-a"].answer("GET", held, body={
        "pipeline": "p", "element": "aggregate-p0", "node": "fog-a", "batch": 3,
        "positions": {"source": 4}, "keys": [],
    })  # fmt: skip
    agents["fog-b"].answer("GET", "/pipelines/p/elements/aggregate-p1/keys", 409,
                           {"code": "no_state", "message": "fog-b holds no state"})  # fmt: skip
    outcome: list[Any] = []
    ended = threading.Event()

    def ask() -> None:
        try:
            outcome.append(orch._listed_keys("p", _parts(orch)))
        except Exception as exc:  # (shown by the assertions below, not lost in a thread)
            outcome.append(exc)
        ended.set()

    threading.Thread(target=ask, daemon=True).start()
    try:
        assert came.wait(10), "fog-a was not asked"
        # Ended while fog-a's answer is still held (waiting for it: not until released).
        assert ended.wait(30), "the listing waited for fog-a after fog-b had failed"
    finally:
        release.set()
    (failure,) = outcome
    assert isinstance(failure, FogshiftError) and "fog-b holds no state" in str(failure)


def test_two_scales_of_different_elements_keep_each_others_change_of_the_spec(
    tmp_path: Path, agents: dict[str, StandIn]
) -> None:
    """Each scale read the whole spec, waited on the broker, then wrote back what it had
    read with its own change: a scale of another element that wrote meanwhile was lost
    (its added partition placed, but no longer in the spec; its consumer's inputs back)."""
    spec = {
        "pipeline": "p",
        "elements": [
            *SPEC["elements"],  # type: ignore[misc]
            {"id": "count", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b"],
             "key_by": "sensor", "inputs": ["source"],
             "options": {"field": "value", "window": 3, "function": "count"}},
            {"id": "counts", "kind": "csv-sink", "node": "cloud", "inputs": ["count"],
             "options": {"path": "out/c.csv"}},
        ],
    }  # fmt: skip
    config = offline_config(tmp_path)
    orch = Orchestrator(config)
    try:
        orch.registry.put_pipeline(parse_spec(spec, tmp_path), "running")
        orch.permissions = SimpleNamespace(  # type: ignore[assignment]
            sync=lambda registry: None,
            sync_quietly=lambda registry: None,
            withholding=lambda pipeline: contextlib.nullcontext(),
        )
        record = orch.registry.get_pipeline("p")
        assert record is not None
        for name, agent in agents.items():
            hosted = [{"pipeline": "p", "element": e.id, "state": "running", "epoch": 1,
                       "inputs": list(e.inputs)}
                      for e in record.spec.elements if record.placement[e.id] == name]  # fmt: skip
            orch.heartbeat(name, Heartbeat.model_validate({"url": agent.url, "ready": True,
                                                           "elements": hosted}))  # fmt: skip
        read_before = orch.registry.get_pipeline("p")
        assert read_before is not None
        interleaved: list[str] = []

        def run(make: Any, timeout: float = 30) -> Any:
            # While the first scale waits on the broker (its input's tail, read before
            # anything is written), the other element's scale places its partition and
            # changes its consumer.
            if getattr(make, "func", None) is not None and not interleaved:
                interleaved.append("count")
                parts = [e for e in read_before.spec.elements
                         if e.partition and e.partition.of == "count"]  # fmt: skip
                orch._place(read_before.spec, parts, 3, ["fog-c"], "source")
            return 0

        orch.broker = SimpleNamespace(run=run, close=lambda: None)  # type: ignore[assignment]
        parts = [e for e in read_before.spec.elements
                 if e.partition and e.partition.of == "aggregate"]  # fmt: skip
        orch._place(read_before.spec, parts, 3, ["fog-c"], "source")
        assert interleaved == ["count"]
        after = orch.registry.get_pipeline("p")
        assert after is not None
        ids = {e.id for e in after.spec.elements}
        assert {"aggregate-p2", "count-p2"} <= ids, sorted(ids)
        assert "aggregate-p2" in after.spec.element("sink").inputs
        assert "count-p2" in after.spec.element("counts").inputs
        assert {"aggregate-p2", "count-p2"} <= set(after.placement)
        assert [e.partition.count for e in after.spec.elements if e.partition] == [3] * 6
    finally:
        orch.close()


def test_an_element_deployed_with_one_partition_is_not_scaled_out_under_its_plain_readers(
    orch: Orchestrator, agents: dict[str, StandIn], tmp_path: Path
) -> None:
    """Its sink read aggregate-p0 as a plain input, numbering its records by stream
    sequence; the scale made it read aggregate-p0|aggregate-p1 merged, numbered densely: a
    batch run again across the scale numbered the same records lower, and the writer
    skipped those at or below what it had stored (a review's finding)."""
    one = {**SPEC, "pipeline": "q", "elements": [
        {**e, "partitions": ["fog-a"]} if e["id"] == "aggregate" else e
        for e in SPEC["elements"]  # type: ignore[attr-defined]
    ]}  # fmt: skip
    orch.registry.put_pipeline(parse_spec(one, tmp_path), "running")
    with pytest.raises(InvalidInput) as refused:
        orch.scale("q", "aggregate", 2, ["fog-b"], timeout_s=0.1)
    assert "sink reads aggregate-p0 as a plain input" in refused.value.message
    assert refused.value.expected and "two partitions or more" in refused.value.expected
    assert refused.value.hint and "afresh" in refused.value.hint
    record = orch.registry.get_pipeline("q")
    assert record is not None and [e.id for e in record.spec.partitions_of("aggregate")] == [
        "aggregate-p0"
    ]
    assert all(agent.calls == [] or all(c.method == "GET" for c in agent.calls)
               for agent in agents.values())  # nothing started or stopped  # fmt: skip


def test_a_scale_whose_pipeline_was_deployed_afresh_meanwhile_changes_nothing(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    """The change is applied to the spec stored when it is written: a deployment that
    replaced the pipeline meanwhile, with other partitions, is not the one it was for."""
    from fogshift.exceptions import Conflict

    _beat(orch, agents)
    record = orch.registry.get_pipeline("p")
    assert record is not None
    one = {**SPEC, "elements": [
        {**e, "partitions": ["fog-a"]} if e["id"] == "aggregate" else e
        for e in SPEC["elements"]  # type: ignore[attr-defined]
    ]}  # fmt: skip
    redeployed: list[bool] = []

    def run(make: Any, timeout: float = 30) -> Any:
        if not redeployed:  # (while the scale reads its input's tail)
            orch.registry.put_pipeline(parse_spec(one, orch.config.home), "running")
            redeployed.append(True)
        return 0

    orch.broker = SimpleNamespace(run=run, close=lambda: None)  # type: ignore[assignment]
    with pytest.raises(Conflict, match="its partitions changed while the scale placed them"):
        orch._place(record.spec, _parts(orch), 3, ["fog-c"], "source")
    after = orch.registry.get_pipeline("p")
    assert after is not None
    assert [p.id for p in _parts(orch)] == ["aggregate-p0"]
    assert "aggregate-p2" not in after.placement and after.spec.element("sink").inputs == (
        "aggregate-p0",
    )
    assert agents["fog-c"].received("PUT", ADDED) == []


def test_a_retirement_waits_for_a_round_holding_a_partition_only_until_its_deadline(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round of the orchestrator's own (a standby's follow-up) holding a retiring
    partition was waited for 60 s per PE, whatever the phase's deadline."""
    import threading
    import time

    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(1))
    monkeypatch.setattr(orch, "_committed_past", lambda *args: True)
    held, release = threading.Event(), threading.Event()

    def follow() -> None:
        with orch._exclusive("p", "aggregate-p1", "standby follow"):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        assert held.wait(30)
        started = time.monotonic()
        retired, why = orch._retire("p", _parts(orch), 1, "source", 5, time.monotonic() + 1.0)
        assert time.monotonic() - started < 10, "waited past the deadline"
        assert retired == {} and why is not None and "follow-up" in why, why
        assert [p.id for p in _parts(orch)] == ["aggregate-p0", "aggregate-p1"]
    finally:
        release.set()
        thread.join(30)


def test_a_scale_waits_for_the_rounds_holding_its_pes_one_budget_in_all(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scale's sections gave each PE ``BACKGROUND_WAIT_S`` of its own: with rounds
    holding them in turn, a scale of two partitions and three readers could wait five
    minutes before it began. Now each PE gets what is left of one budget."""
    import contextlib
    import time

    from fogshift.orchestrator import journal

    budgets: list[float | None] = []

    @contextlib.contextmanager
    def exclusive(pipeline: str, pe: str, what: str, wait_s: float | None = None) -> Iterator[None]:
        budgets.append(wait_s)
        time.sleep(0.05)  # a round held it that long
        yield

    monkeypatch.setattr(journal, "BACKGROUND_WAIT_S", 5.0)
    monkeypatch.setattr(orch, "_exclusive", exclusive)
    with orch._sections("p", ["aggregate-p0", "aggregate-p1", "sink"]):
        pass
    assert len(budgets) == 3 and all(b is not None for b in budgets), budgets
    first, *later = budgets
    assert first is not None and first <= 5.0
    for before, after in zip(budgets, later, strict=False):
        assert before is not None and after is not None and after <= before - 0.05, budgets


def test_a_scale_to_the_count_it_has_changes_nothing(
    orch: Orchestrator, agents: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked again (a script's retry, say), a scale to the partitions there are is done at
    once: nothing placed, restarted, retired or stored in the partitions' input."""
    from fogshift.broker.keys import Ownership

    _beat(orch, agents)
    monkeypatch.setattr(orch, "_owners", lambda *args: Ownership(2))
    before = orch.registry.get_pipeline("p")
    report = orch.scale("p", "aggregate", 2)
    assert (report.status, report.before, report.after) == ("moved", 2, 2), report
    assert (report.added, report.retired, report.consumers, report.moved) == ({}, {}, [], 0)
    assert report.scale_seq == 0 and report.error is None, report
    after = orch.registry.get_pipeline("p")
    assert after is not None and before is not None
    assert (after.spec, after.placement) == (before.spec, before.placement)
    changes = [c for a in agents.values() for c in a.calls if c.method != "GET"]
    assert changes == [], changes
    assert orch.registry.unfinished_scales() == []


def test_a_scale_s_failed_wave_leaves_its_keys_though_a_later_wave_was_appended() -> None:
    # Waves of large states go one ahead: the wave after the failed one was appended while
    # it was sent, and its states came. The failed wave's key without a state is left.
    moving = sorted(k for k in (f"k{i}" for i in range(40)) if partition_of_key(k, 2) == 1)[:7]

    class Ahead(Scaling):
        def __init__(self) -> None:
            pass

        def pipeline(self, name: str) -> Any:
            parts = [SimpleNamespace(partition=SimpleNamespace(index=i)) for i in (0, 1)]
            return SimpleNamespace(spec=SimpleNamespace(partitions_of=lambda element: parts))

        def _move_waves(self, *args: Any, **kwargs: Any) -> Any:
            keys = args[3]
            came = dict.fromkeys([keys[0], keys[1], keys[3], keys[4]], 1.0)
            waves = [KeyWave(seq=1, keys=keys[:1]), KeyWave(seq=2, keys=keys[1:3]),
                     KeyWave(seq=3, keys=keys[3:5])]  # fmt: skip
            return Settled(came, 4, error="no state yet", left=keys[5:]), waves, {}

    report = ScaleReport(pipeline="p", element="aggregate", status=KeyMoveStatus.MOVED,
                         before=2, after=2)  # fmt: skip
    done, _ = Ahead()._ahead("p", "aggregate", "source", set(moving), 2, Ownership(1), 5.0,
                             report)  # fmt: skip
    assert done.status == KeyMoveStatus.PENDING and done.moved == 4
    assert done.left == [moving[2], *moving[5:]]


def test_a_key_move_of_an_unknown_element_suggests_the_partitioned_element(
    orch: Orchestrator, agents: dict[str, StandIn]
) -> None:
    # "did you mean 'aggregate-p2'?": a partition, which no key move names.
    from fogshift.agent.exceptions import UnknownElement

    _beat(orch, agents)
    with pytest.raises(UnknownElement) as refused:
        orch.migrate_keys("p", "aggregat", ["s1"], "fog-b", timeout_s=0.1)
    assert refused.value.message == "pipeline 'p' has no element 'aggregat'"
    assert refused.value.expected == (
        "one of its partitioned elements (keys move between their partitions): aggregate"
    )
    assert (refused.value.received, refused.value.hint) == (
        "'aggregat'",
        "did you mean 'aggregate'?",
    )
    assert all(agent.calls == [] for agent in agents.values())


def test_a_partition_named_for_a_key_move_or_scale_names_its_element(orch: Orchestrator) -> None:
    # A walk-through's finding: "'aggregate-p0' is not partitioned", of a partition.
    from fogshift.exceptions import InvalidInput

    for attempt in (
        lambda: orch.migrate_keys("p", "aggregate-p0", ["s1"], "fog-b", timeout_s=0.1),
        lambda: orch.scale("p", "aggregate-p0", 3, ["fog-c"], timeout_s=0.1),
    ):
        with pytest.raises(InvalidInput) as refused:
            attempt()
        assert "'aggregate-p0' is a partition of 'aggregate'" in refused.value.message
        assert refused.value.hint is not None and "name 'aggregate' instead" in refused.value.hint


def test_an_unknown_element_is_guessed_among_the_partitioned_elements_too(
    orch: Orchestrator,
) -> None:
    # "classfy" was guessed to be "classify-p1", and "classify" was left out of the list
    # though `state`, `events` and key moves take it.
    from fogshift.agent.exceptions import UnknownElement

    record = orch.registry.get_pipeline("p")
    assert record is not None
    with pytest.raises(UnknownElement) as unknown:
        orch._element(record, "agregate")
    assert unknown.value.hint == "did you mean 'aggregate'?"
    assert unknown.value.expected is not None
    assert unknown.value.expected.endswith("(partitions of aggregate)")
