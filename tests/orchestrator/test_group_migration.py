"""Several PEs moved as one operation: refused whole before anything moves, and when one
move fails, the ones already moved are moved back (the logic of ``migrate_group``, with the
single migrations standing in)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fogshift.contracts import (
    GroupMigrationStatus,
    MigrationMode,
    MigrationReport,
    PipelineState,
)
from fogshift.exceptions import Conflict, InvalidInput
from fogshift.migration.exceptions import MigrationFailed
from fogshift.orchestrator.coordination import Coordination
from fogshift.orchestrator.deployment import Deployment


class Fake:
    """The orchestrator around ``migrate_group``: a placement, and single migrations that
    fail where the test says."""

    refuse_unless_running = staticmethod(Deployment.refuse_unless_running)

    def __init__(self, fail: set[tuple[str, str]], resumed: bool = True) -> None:
        self.placement = {"a": "n1", "b": "n1", "c": "n1"}
        self.status = PipelineState.RUNNING
        self.fail = fail
        self.resumed = resumed  # whether a failed move's own rollback runs its origin again
        self.calls: list[tuple[str, str]] = []
        #: The group's journal: each entry's (what was begun, how it ended).
        self.journal: dict[str, list[Any]] = {}
        self.run_id = "me"
        #: Each group's journaled origins (where its PEs ran as it began).
        self.origins: dict[str, dict[str, str]] = {}
        self.registry = SimpleNamespace(
            begin_group=self._begin,
            end_group=self._end,
            group_origins=lambda g: self.origins.get(g, {}),
            node=lambda name: SimpleNamespace(name=name),
        )
        #: Nodes that are not up.
        self.down: set[str] = set()

    def healthy(self, record: Any) -> bool:
        return record.name not in self.down

    def _begin(self, *entry: Any, origins: dict[str, str]) -> str:
        group_id = f"g{len(self.journal)}"
        self.journal[group_id], self.origins[group_id] = [entry, None], dict(origins)
        return group_id

    def _end(self, group_id: str, outcome: str) -> None:
        self.journal[group_id][1] = outcome

    def pipeline(self, name: str) -> Any:
        return SimpleNamespace(name=name, placement=dict(self.placement), status=self.status)

    def _element(self, record: Any, element_id: str) -> None:
        if element_id not in self.placement:
            raise InvalidInput(f"pipeline 'p' has no element {element_id!r}")

    def _refuse_current_node(self, record: Any, element_id: str, node: str, what: str) -> None:
        if record.placement[element_id] == node:
            raise InvalidInput(f"p/{element_id} already runs on node {node!r}")

    def _usable_node(self, name: str, what: str) -> None:
        pass

    def migrate(
        self, pipeline: str, element: str, target: str, mode: MigrationMode, *, group: str
    ) -> Any:
        assert group in self.journal, "a group's move not named its own: it superseded it"
        self.calls.append((element, target))
        origin = self.placement[element]
        report = MigrationReport(pipeline=pipeline, element=element, origin=origin,
                                 target=target, mode=mode)  # fmt: skip
        if (element, target) in self.fail:
            error = MigrationFailed(f"migrating {element} to {target} failed",
                                    hint=f"once {target} answers, it runs on")  # fmt: skip
            error.report = report.model_copy(
                update={"status": "failed", "rolled_back": self.resumed}
            )
            raise error
        self.placement[element] = target
        return report.model_copy(update={"status": "migrated"})

    def group(
        self,
        elements: list[str],
        target: str = "n2",
        mode: MigrationMode = MigrationMode.PRECOPY,
        resume: str | None = None,
    ) -> Any:
        self._group_report = Coordination._group_report.__get__(self)
        self._stranded_hint = Coordination._stranded_hint.__get__(self)
        self._move_pes = Coordination._move_pes.__get__(self)
        return Coordination.migrate_group(self, "p", elements, target, mode, resume)  # type: ignore[arg-type]


def test_all_move_or_none_is_tried() -> None:
    fake = Fake(fail=set())
    report = fake.group(["a", "b", "c"])
    assert report.status == GroupMigrationStatus.MIGRATED
    assert report.placement == {"a": "n2", "b": "n2", "c": "n2"} and report.undone == []
    # Journaled before its first move, ended with its status (a dead orchestrator's entry
    # stays unfinished for the next one to carry on).
    assert fake.journal == {"g0": [("p", ["a", "b", "c"], "n2", "precopy", "me"), "migrated"]}
    for bad in (["a", "zz"], ["a", "a"], []):
        fake = Fake(fail=set())
        with pytest.raises(InvalidInput):
            fake.group(bad)
        assert fake.calls == []  # refused before anything moved
    # A stopped pipeline is refused as such (it was "rolled back", the refusal's hint lost).
    fake = Fake(fail=set())
    fake.status = PipelineState.STOPPED
    with pytest.raises(Conflict) as refused:
        fake.group(["a", "b"])
    assert "is stopped, not running" in refused.value.message and fake.calls == []


def test_a_failed_move_moves_the_others_back_latest_first() -> None:
    fake = Fake(fail={("c", "n2")})
    report = fake.group(["a", "b", "c"])
    assert report.status == GroupMigrationStatus.ROLLED_BACK
    assert fake.journal["g0"][1] == "rolled_back"
    assert fake.calls == [("a", "n2"), ("b", "n2"), ("c", "n2"), ("b", "n1"), ("a", "n1")]
    assert report.placement == {"a": "n1", "b": "n1", "c": "n1"}
    assert [m.element for m in report.migrations] == ["a", "b", "c"]
    assert report.migrations[-1].status == "failed"
    assert [u.element for u in report.undone] == ["b", "a"]
    assert "migrating c to n2 failed" in (report.error or "")
    assert report.hint == "once n2 answers, it runs on"  # (the failed move's own)


def test_a_pe_put_back_on_its_origin_meanwhile_counts_as_moved_back() -> None:
    # Its target's node was lost during the group's next move and the reconciler restored
    # it on its origin: "moving a back failed: already runs there" made the group "failed"
    # where every PE ran where it ran before (a walk-through's finding).
    class Restored(Fake):
        def migrate(self, pipeline: str, element: str, target: str, mode: MigrationMode,
                    *, group: str) -> Any:  # fmt: skip
            if (element, target) == ("b", "n2"):
                self.placement["a"] = "n1"  # (restored there by the reconciler)
            return super().migrate(pipeline, element, target, mode, group=group)

    fake = Restored(fail={("b", "n2")})
    report = fake.group(["a", "b"])
    assert report.status == GroupMigrationStatus.ROLLED_BACK, report
    assert fake.calls == [("a", "n2"), ("b", "n2")]  # (nothing to move back)
    assert report.placement == {"a": "n1", "b": "n1"} and "back failed" not in (report.error or "")


def test_a_move_back_that_fails_is_reported_with_where_each_runs() -> None:
    fake = Fake(fail={("b", "n2"), ("a", "n1")})
    report = fake.group(["a", "b"])
    assert report.status == GroupMigrationStatus.FAILED
    assert report.placement == {"a": "n2", "b": "n1"}
    assert "moving a back failed" in (report.error or "")


def test_a_pe_left_on_a_node_that_is_not_up_is_said_to_be_restored() -> None:
    # The target died mid-group: a moved back from it failed, and the hint spoke of b (the
    # move that failed) only; a, stranded on the dead node, went unsaid (restored ~6 s later).
    fake = Fake(fail={("b", "n2"), ("a", "n1")})
    fake.down = {"n2"}
    report = fake.group(["a", "b"])
    assert report.status == GroupMigrationStatus.FAILED and report.placement["a"] == "n2"
    assert report.hint == (
        "once n2 answers, it runs on; a on n2, not up: restored elsewhere once silent for "
        "the pipeline's recovery.detect_after_s (`fogshift restore p ELEMENT` now)"
    )


def test_a_failed_move_whose_own_origin_does_not_run_again_is_no_rollback() -> None:
    # Nothing had moved before it (0 of 0 moved back), but the PE that failed runs nowhere:
    # the report must not say the pipeline runs as before.
    fake = Fake(fail={("a", "n2")}, resumed=False)
    report = fake.group(["a", "b"])
    assert report.status == GroupMigrationStatus.FAILED
    assert fake.calls == [("a", "n2")]


def test_a_group_whose_first_pe_is_refused_before_any_move_is_refused_as_such() -> None:
    # Another operation held the first PE: nothing was tried, yet the answer was a 200
    # "rolled back, every PE runs where it ran before" while that operation moved it.
    from fogshift.migration.exceptions import MigrationInProgress

    class Busy(Fake):
        def migrate(
            self, pipeline: str, element: str, target: str, mode: MigrationMode, *, group: str
        ) -> Any:
            self.calls.append((element, target))
            raise MigrationInProgress(f"{pipeline}/{element} is being migrated")

    fake = Busy(fail=set())
    with pytest.raises(MigrationInProgress):
        fake.group(["a", "b"])
    assert fake.calls == [("a", "n2")]
    assert fake.journal["g0"][1] == "refused: p/a is being migrated"
    # A group carried on for a dead orchestrator keeps its own entry, and leaves it to its
    # carrier (held up like this, it is tried again: ended, it would not be).
    fake = Busy(fail=set())
    with pytest.raises(MigrationInProgress):
        fake.group(["a", "b"], resume="left0")
    assert fake.journal == {}


def test_pes_on_the_target_already_stay_and_the_rest_move() -> None:
    # An orchestrator that died in a group left some PEs moved: the same group again was
    # refused ("a already runs on n2"), so finishing it took a group without them.
    fake = Fake(fail=set())
    fake.placement["a"] = "n2"
    report = fake.group(["a", "b", "c"])
    assert report.status == GroupMigrationStatus.MIGRATED and report.already_there == ["a"]
    assert fake.calls == [("b", "n2"), ("c", "n2")]
    assert [m.element for m in report.migrations] == ["b", "c"]
    assert report.placement == {"a": "n2", "b": "n2", "c": "n2"}
    # A failed move moves back only what this group moved.
    fake = Fake(fail={("c", "n2")})
    fake.placement["a"] = "n2"
    report = fake.group(["a", "b", "c"])
    assert report.status == GroupMigrationStatus.ROLLED_BACK
    assert report.placement == {"a": "n2", "b": "n1", "c": "n1"}
    # One there already is not handed over (a sink cannot be: the group was refused).
    fake = Fake(fail=set())
    fake.placement["c"] = "n2"
    fake._element = lambda record, element_id: SimpleNamespace(  # type: ignore[method-assign]
        id=element_id,
        role="sink" if element_id == "c" else "processor",
        kind="csv-sink",
        inputs=["x"],
    )
    report = fake.group(["a", "c"], mode=MigrationMode.HANDOVER)
    assert report.status == GroupMigrationStatus.MIGRATED and report.already_there == ["c"]
    # Every PE there already: nothing to do, refused naming them all (it named the first).
    fake = Fake(fail=set())
    fake.placement.update(a="n2", b="n2")
    with pytest.raises(InvalidInput) as refused:
        fake.group(["a", "b"])
    assert refused.value.message == (
        "every PE of p/{a,b} already runs on node 'n2': nothing to migrate"
    )
    assert refused.value.received == "a on n2, b on n2" and refused.value.hint
    assert fake.calls == []


def test_a_carried_on_group_that_fails_moves_back_what_it_moved_before_too() -> None:
    # An orchestrator died after moving a; the next one carried the group on, and c's move
    # failed: b went back, a stayed on the target, and the report said "rolled back".
    fake = Fake(fail=set())
    fake.placement["c"] = "n3"
    fake.group(["a", "b", "c"])  # (journals where each ran: a, b on n1, c on n3)
    fake.placement = {"a": "n2", "b": "n1", "c": "n3"}  # as the dead one left it
    fake.journal["g0"][1], fake.fail, fake.calls = None, {("c", "n2")}, []
    report = fake.group(["a", "b", "c"], resume="g0")
    assert report.status == GroupMigrationStatus.ROLLED_BACK, report
    assert fake.calls == [("b", "n2"), ("c", "n2"), ("b", "n1"), ("a", "n1")]
    assert report.placement == {"a": "n1", "b": "n1", "c": "n3"}
    assert [u.element for u in report.undone] == ["b", "a"]
    # One of them back already (restored on its origin meanwhile) is counted so; one that
    # cannot go back makes the group "failed", naming it.
    fake.placement, fake.calls = {"a": "n1", "b": "n2", "c": "n3"}, []
    fake.fail = {("c", "n2"), ("b", "n1")}
    report = fake.group(["a", "b", "c"], resume="g0")
    assert fake.calls == [("a", "n2"), ("c", "n2"), ("a", "n1"), ("b", "n1")]
    assert report.status == GroupMigrationStatus.FAILED
    assert report.placement == {"a": "n1", "b": "n2", "c": "n3"}
    assert "moving b back failed" in (report.error or "")
    # A group journaled without origins (a home from before they were) moves back only
    # what the carry-on moved, as it did.
    fake.origins.clear()
    fake.placement, fake.calls, fake.fail = {"a": "n2", "b": "n1", "c": "n1"}, [], {("c", "n2")}
    report = fake.group(["a", "b", "c"], resume="g0")
    assert report.placement == {"a": "n2", "b": "n1", "c": "n1"}
    # A new group (not carried on) leaves PEs already on the target there, as before.
    fake.calls = []
    report = fake.group(["a", "b", "c"])
    assert report.placement == {"a": "n2", "b": "n1", "c": "n1"} and ("a", "n1") not in fake.calls
