"""Which instances the reconciler removes as superseded.

A real orchestrator object and registry, and a real HTTP server standing in for the node
agent that hosts the instance (it records the removals it is asked for); no Spark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fogshift.broker.naming import stream_name
from fogshift.broker.server import BrokerProcess
from fogshift.contracts import Heartbeat
from fogshift.exceptions import Conflict
from fogshift.orchestrator import reconciler
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.registry import Registry
from fogshift.orchestrator.service import Orchestrator
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.spec import parse_spec
from tests.conftest import answer_json
from tests.orchestrator.standin import SPEC, offline_config


class _Agent(BaseHTTPRequestHandler):
    removed: list[str] = []
    gone: list[bool] = []  # [True]: the instance is gone already (the agent answers 404)
    idle: list[bool] = []  # [True]: only its checkpoint is there (discarded, none ran)

    def do_DELETE(self) -> None:
        self.removed.append(self.path)
        if self.gone:
            error = {"code": "unknown", "message": "no PE p/aggregate on fog-c"}
            answer_json(self, {**error, "expected": None, "received": None, "hint": None}, 404)
            return
        answer_json(self, {"state": "discarded" if self.idle else "stopped"})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def agent() -> Iterator[tuple[str, list[str]]]:
    removed: list[str] = []
    handler = type("Agent", (_Agent,), {"removed": removed})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", removed
    server.shutdown()
    server.server_close()


@pytest.fixture
def orchestrator(tmp_path: Path, agent: tuple[str, list[str]]) -> Iterator[Orchestrator]:
    config = offline_config(tmp_path)
    orch = Orchestrator(config)
    orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
    # fog-c hosts an instance of the aggregate (e.g. the one a restore just started).
    url, _ = agent
    report = {"url": url, "ready": True, "elements": [{"pipeline": "p", "element": "aggregate"}]}
    orch.heartbeat("fog-c", Heartbeat.model_validate(report))
    yield orch
    orch.close()


def test_the_instance_a_restore_just_placed_is_kept(
    orchestrator: Orchestrator, agent: tuple[str, list[str]]
) -> None:
    # The restore moved the placement after the reconcile round began: the round must
    # judge by the placement as it is now, not by the view it started with.
    orchestrator.registry.set_placement("p", "aggregate", "fog-c")
    orchestrator._remove_strays()
    assert agent[1] == []


def test_an_instance_under_migration_or_restore_is_kept(
    orchestrator: Orchestrator, agent: tuple[str, list[str]]
) -> None:
    orchestrator._migrating[("p", "aggregate")] = "migration"
    orchestrator._remove_strays()
    assert agent[1] == []


def test_an_instance_off_its_placement_is_removed_with_its_checkpoint(
    orchestrator: Orchestrator, agent: tuple[str, list[str]]
) -> None:
    orchestrator._remove_strays()  # placed on fog-a, running on fog-c: a leftover
    assert agent[1] == ["/pipelines/p/elements/aggregate?discard=true"]
    assert ("p", "aggregate") not in orchestrator._migrating


def _said_by_a_round(
    orchestrator: Orchestrator, caplog: pytest.LogCaptureFixture, answer: list[bool] | None
) -> list[tuple[int, str]]:
    """What a round of stray removals logged of p/aggregate, the stand-in agent answering
    as ``answer`` says (``_Agent.gone``, ``_Agent.idle``; ``None``: removed)."""
    caplog.clear()
    if answer is not None:
        answer.append(True)
    try:
        with caplog.at_level(logging.INFO, "fogshift.orchestrator"):
            orchestrator._remove_strays()
    finally:
        if answer is not None:
            answer.clear()
    return [(r.levelno, r.getMessage()) for r in caplog.records if "p/aggregate" in r.getMessage()]


def test_a_removal_is_logged_as_a_warning_only_if_something_was_removed(
    orchestrator: Orchestrator, agent: tuple[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    # A heartbeat sent before a migration removed its origin lists the instance still: the
    # round asks for a removal the agent answers with "no such PE". Logged as "removing
    # superseded ..." at WARNING, that read as a stray found after every such migration.
    said = _said_by_a_round(orchestrator, caplog, _Agent.gone)
    assert agent[1] == ["/pipelines/p/elements/aggregate?discard=true"]
    assert [level for level, _ in said] == [logging.INFO], said
    assert said[0][1].startswith("superseded p/aggregate on fog-c not removed: no PE")
    said = _said_by_a_round(orchestrator, caplog, None)
    assert said == [(logging.WARNING, "removed superseded p/aggregate from fog-c")]
    # Only a checkpoint there (a handover's origin, a dropped standby's copy): the agent
    # discarded it, no instance ran; warned of after almost every handover.
    said = _said_by_a_round(orchestrator, caplog, _Agent.idle)
    assert said == [
        (logging.INFO, "discarded the checkpoint fog-c held of superseded p/aggregate")
    ], said


def test_instances_of_stopped_pipelines_are_stopped_with_their_checkpoints_kept(
    orchestrator: Orchestrator, agent: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One a restore started while `stop` ran, or that an unreachable node kept: a stopped
    # pipeline runs nowhere, and `stop` keeps checkpoints.
    orchestrator.registry.set_status("p", "stopping")
    orchestrator._remove_strays()
    assert agent[1] == []  # `stop` itself is still at work
    orchestrator.registry.set_status("p", "stopped")
    orchestrator._remove_strays()
    assert agent[1] == []  # told by a heartbeat from before the stop: not yet
    monkeypatch.setattr(reconciler, "STOPPED_HEARD_S", 0.0)
    url, _ = agent
    report = {"url": url, "ready": True, "elements": [{"pipeline": "p", "element": "aggregate"}]}
    orchestrator.heartbeat("fog-c", Heartbeat.model_validate(report))  # after the stop
    orchestrator._remove_strays()
    assert agent[1] == ["/pipelines/p/elements/aggregate"]


def test_one_pe_whose_reconcile_raises_leaves_the_other_pes_and_the_strays_to_it(
    orchestrator: Orchestrator, agent: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    def reconcile_element(pipeline: str, element_id: str, background: bool = False) -> None:
        seen.append(element_id)
        if element_id == "source":  # e.g. an auto-restore whose store raised OSError
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(orchestrator, "_reconcile_element", reconcile_element)
    orchestrator.reconcile_once()  # logged, not raised
    assert seen == ["source", "aggregate", "sink"]
    assert agent[1] == ["/pipelines/p/elements/aggregate?discard=true"]  # strays too


def test_the_input_of_partitions_gets_the_key_state_subjects_an_older_fogshift_lacked(
    tmp_path: Path, nats_server: BrokerProcess
) -> None:
    # A pipeline deployed by a fogshift before 2026-11-29 keeps its streams across `down` and
    # `up`: its partitions' input lacks `.keys.*`, where a partition now hands key states
    # over, and a move stored before the upgrade could never be answered. The reconciler's
    # first round adds the subjects, once.
    from fogshift.broker.client import SyncJetStream
    from fogshift.broker.naming import key_state_subjects, stream_name, stream_subjects

    (tmp_path / "in.csv").write_text("value\n")
    spec = {**SPEC, "pipeline": "old"}
    spec["elements"] = [
        SPEC["elements"][0],
        {**SPEC["elements"][1], "key_by": "sensor", "partitions": ["fog-a", "fog-b"]},
        SPEC["elements"][2],
    ]
    del spec["elements"][1]["node"]
    stream = stream_name("old", "source")
    admin = SyncJetStream(nats_server.address)
    new = key_state_subjects("old", "source")
    older = [s for s in stream_subjects("old", "source") if s != new]
    admin.run(lambda js: js.add_stream(name=stream, subjects=older, allow_direct=True))
    # Older still: a stream made before direct gets, which the nodes now read with only.
    sink = stream_name("old", "aggregate-p0")
    direct_less = {"subjects": stream_subjects("old", "aggregate-p0"), "allow_direct": False}
    admin.run(lambda js: js.add_stream(name=sink, **direct_less))
    broker = nats_server.address.save(tmp_path / "broker.json")
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orch = Orchestrator(config)
    try:
        orch.registry.put_pipeline(parse_spec(spec, tmp_path), "running")
        orch._streams_current(orch.registry.pipelines())
        info = admin.run(lambda js: js.stream_info(stream))
        assert new in info.config.subjects
        assert admin.run(lambda js: js.stream_info(sink)).config.allow_direct is True
        assert "old" in orch._streams_checked
    finally:
        orch.close()
        admin.close()


@pytest.mark.parametrize(
    ("central", "node_snapshot", "left", "standby", "expected"),
    [
        (True, False, False, False, "restore"),  # the node came back without its disk
        # Its last restore there failed (there and elsewhere): it has no instance there
        # since, which the log says, not that the node came back without its checkpoints.
        (True, False, False, False, "restore again"),
        (True, True, False, False, "restart"),  # its own checkpoints are there
        # Its heartbeat lists the PE's checkpoint there: an install (a migration's, a
        # restore's) deleted the snapshots and the node restarted before the next one.
        (True, False, True, False, "restart"),
        # ... but not an unfinished install's copy alone: nothing to resume from.
        (True, False, "partial", False, "restore"),
        (False, False, False, False, "restart"),  # nothing pulled: from its input's start
        (True, False, False, True, "promote"),  # its hot standby stands: it takes over
        (True, False, False, "fails", "restore"),  # ... unless that fails: in place then
    ],
)
def test_a_node_back_without_the_pes_checkpoints_gets_it_restored_there(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    central: bool,
    node_snapshot: bool,
    left: bool | str,
    standby: bool | str,
    expected: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The aggregate's node answers again and hosts nothing. Restarted from its own
    # checkpoint when it holds one; restored in place from the central store when it holds
    # none (a wiped disk: from nothing it would read its input from the start, past
    # trimmed records), or its standby promoted; restarted when nothing was ever pulled.
    from tests.orchestrator.standin import standins

    config = offline_config(tmp_path)
    orch = Orchestrator(config)
    done: list[tuple[str, ...]] = []
    monkeypatch.setattr(
        orch, "_restore_on", lambda e, p, current, candidates, attempts, *_: done.append(
            ("restore", current, *candidates, *(a.node for a in attempts)))
    )  # fmt: skip
    monkeypatch.setattr(orch, "_restart_fenced", lambda p, e, node: done.append(("restart", node)))

    def promote(element: object, pipeline: str, current: str, standby: object) -> None:
        done.append(("promote", current))
        if standby_fails:
            raise RestoreFailed("the standby is not running under its epoch")

    standby_fails = standby == "fails"
    monkeypatch.setattr(orch, "promote_standby", promote)
    monkeypatch.setattr(
        orch.central, "newest", lambda p, pe: {"snapshot": "s"} if central else None
    )
    here = "/pipelines/p/elements/aggregate"
    unknown = {"code": "unknown_element", "message": "fog-a does not host p/aggregate"}
    with standins("fog-a", "fog-b") as agents:
        agent = agents["fog-a"]
        agent.answer("GET", here + "/progress", 404, unknown)
        if not node_snapshot:
            agent.answer("GET", here + "/snapshots/latest", 404, unknown)
        else:
            agent.answer("GET", here + "/snapshots/latest", 200, {
                "id": "s", "pipeline": "p", "element": "aggregate", "batch": 3,
                "created": 1.0, "files": {},
            })  # fmt: skip
        try:
            orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
            kept = [{"pipeline": "p", "element": "aggregate", "partial": left == "partial"}]
            kept = kept if left else []
            orch.heartbeat("fog-a", Heartbeat.model_validate(
                {"url": agent.url, "ready": True, "elements": [], "left": kept}))  # fmt: skip
            orch.heartbeat("fog-b", Heartbeat.model_validate(
                {"url": agents["fog-b"].url, "ready": True, "elements": []}))  # fmt: skip
            if standby:
                orch.registry.add_standby("p", "aggregate", "fog-b")
            if expected == "restore again":
                orch._in_place_failed[("p", "aggregate")] = "fog-a"
            with caplog.at_level(logging.WARNING, logger="fogshift.orchestrator"):
                orch._reconcile_element("p", "aggregate")
            assert ("p", "aggregate") not in orch._in_place_failed  # (restored)
        finally:
            orch.close()
    tried = [("promote", "fog-a")] if standby else []
    if expected.startswith("restore") and not standby:
        why = ("has had no instance of it since restoring it there failed"
               if expected == "restore again" else "came back without the checkpoints")  # fmt: skip
        assert f"fog-a {why} of p/aggregate: restoring it there" in caplog.text
    if expected.startswith("restore"):
        # (A failed promotion is the restore's first attempt in its report.)
        failed = ("fog-b",) if standby == "fails" else ()
        assert done == [*tried, ("restore", "fog-a", "fog-a", *failed)]
    else:
        assert done == [(expected, "fog-a")]


@pytest.mark.parametrize("now", ["failed", "running"])
def test_a_pe_whose_query_cannot_read_its_checkpoint_is_restored_there_from_central(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, now: str
) -> None:
    # Its node reports it failed in a row on a state file Spark cannot read: every start
    # failed on it, the agent retrying for good. Discarded there and restored in place from
    # the central checkpoint; not if the agent says it runs again by the time it is judged.
    from tests.orchestrator.standin import standins

    said = "Spark cannot load its state: CANNOT_LOAD_STATE_STORE.UNCATEGORIZED"
    orch = Orchestrator(offline_config(tmp_path))
    done: list[tuple[str, ...]] = []
    monkeypatch.setattr(
        orch, "_restore_on", lambda e, p, current, candidates, attempts, *_: done.append(
            ("restore", current, *candidates))
    )  # fmt: skip
    monkeypatch.setattr(orch, "_restart_fenced", lambda p, e, node: done.append(("restart", node)))
    here = "/pipelines/p/elements/aggregate"
    failed = {"pipeline": "p", "element": "aggregate", "state": "failed", "epoch": 1,
              "unreadable": said}  # fmt: skip
    answered = failed if now == "failed" else {**failed, "state": "running", "unreadable": None}
    with standins("fog-a") as agents, caplog.at_level(logging.WARNING, "fogshift.orchestrator"):
        agent = agents["fog-a"]
        agent.answer("GET", here + "/progress", 200, answered)
        try:
            orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
            orch.heartbeat("fog-a", Heartbeat.model_validate(
                {"url": agent.url, "ready": True, "elements": [failed]}))  # fmt: skip
            orch._reconcile_element("p", "aggregate")
        finally:
            orch.close()
        discards = [c.query for c in agent.received("DELETE", here)]
    if now == "failed":
        assert discards == [{"discard": "true"}], discards
        assert done == [("restore", "fog-a", "fog-a")]
        assert f"fog-a holds a checkpoint its query cannot read ({said})" in caplog.text
    else:
        assert (discards, done) == ([], [])


def test_a_restore_in_place_runs_beside_the_round_not_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restore waits until its PE caught up (minutes after a long outage): in the round,
    # it held up every other PE's turn (a silent node unnoticed, a standby unpromoted).
    from tests.orchestrator.standin import standins

    orch = Orchestrator(offline_config(tmp_path))
    release, started = threading.Event(), threading.Event()
    done: list[str] = []

    def restore_on(e: object, p: str, current: str, candidates: list[str], *_: object) -> None:
        started.set()
        assert release.wait(30)
        done.append(current)

    monkeypatch.setattr(orch, "_restore_on", restore_on)
    here = "/pipelines/p/elements/aggregate"
    failed = {"pipeline": "p", "element": "aggregate", "state": "failed", "epoch": 1,
              "unreadable": "Spark cannot load its state: CANNOT_LOAD_STATE_STORE.X"}  # fmt: skip
    with standins("fog-a") as agents:
        agents["fog-a"].answer("GET", here + "/progress", 200, failed)
        try:
            orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
            orch.heartbeat("fog-a", Heartbeat.model_validate(
                {"url": agents["fog-a"].url, "ready": True, "elements": [failed]}))  # fmt: skip
            orch._reconcile_element("p", "aggregate", background=True)
            assert started.wait(30), "the restore did not start"
            assert done == [] and ("p", "aggregate") in orch._auto_restoring
            orch._reconcile_element("p", "aggregate", background=True)  # not a second one
            release.set()
            deadline = time.monotonic() + 30
            while ("p", "aggregate") in orch._auto_restoring:
                assert time.monotonic() < deadline, "the restore's thread did not end"
                time.sleep(0.01)
        finally:
            release.set()
            orch.close()
        assert done == ["fog-a"]
        assert len(agents["fog-a"].received("DELETE", here)) == 1


def test_a_failure_on_a_node_does_not_put_off_the_restore_away_from_it_once_silent(
    tmp_path: Path,
) -> None:
    # A restore in place (or a restart) failed as the node froze: its back-off, up to 30 s,
    # delayed the restore away from the silent node past the pipeline's detect_after_s.
    orch = Orchestrator(offline_config(tmp_path))
    try:
        orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
        key = ("p", "aggregate")
        newest = orch.registry.epoch(*key)
        orch.registry.next_epoch(*key)  # (the failed try fenced anew)
        orch._back_off(key, 0, newest, "fog-a")
        epoch = orch.registry.epoch(*key)
        assert orch._backed_off(key, epoch, "fog-a") is None  # the next try here waits
        assert orch._backed_off(key, epoch, "fog-a", away=True) == 0  # not away from it
        # ... and a failed restore away from it puts the next one off.
        orch.registry.next_epoch(*key)
        orch._back_off(key, 0, epoch, "fog-a", away=True)
        epoch = orch.registry.epoch(*key)
        assert orch._backed_off(key, epoch, "fog-a", away=True) is None
    finally:
        orch.close()


def test_a_restore_in_place_that_fails_is_tried_on_another_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its node's disk full or failing: every round restored the PE there again, for good.
    from tests.orchestrator.standin import standins

    orch = Orchestrator(offline_config(tmp_path))
    tried: list[list[str]] = []

    def restore_on(e: object, p: str, current: str, candidates: list[str], *_: object) -> None:
        tried.append([current, *candidates])
        if candidates == ["fog-a"] or everywhere:
            raise RestoreFailed(f"restore of p/aggregate on {candidates[0]} failed: No space left")

    everywhere = False

    monkeypatch.setattr(orch, "_restore_on", restore_on)
    with standins("fog-a", "fog-b") as agents:
        try:
            orch.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")
            for name, agent in agents.items():
                orch.heartbeat(name, Heartbeat.model_validate(
                    {"url": agent.url, "ready": True, "elements": []}))  # fmt: skip
            element = orch.pipeline("p").spec.element("aggregate")
            orch._restore_lost("p", element.model_copy(update={"node": "fog-a"}))
            assert ("p", "aggregate") not in orch._in_place_failed
            # Failed everywhere: the next round is told why the PE has no instance there.
            everywhere = True
            with pytest.raises(RestoreFailed):
                orch._restore_lost("p", element.model_copy(update={"node": "fog-a"}))
            assert orch._in_place_failed[("p", "aggregate")] == "fog-a"
        finally:
            orch.close()
    assert tried == [["fog-a", "fog-a"], ["fog-a", "fog-b"]] * 2, tried


def test_start_is_refused_unless_the_pipeline_is_stopped_and_its_streams_stand(
    orchestrator: Orchestrator, agent: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Put in the registry as running, as a fogshift before the mark of a run that ran left
    # it: a registry opened again marks it (it ran, or it would not be running).
    assert not orchestrator.registry.ran("p")
    assert Registry(orchestrator.config.home / "orchestrator.db").ran("p")
    for status, hint in (("running", "it runs already"), ("failed", "`fogshift deploy SPEC`"),
                         ("stopping", "wait until that has ended")):  # fmt: skip
        orchestrator.registry.set_status("p", status)
        with pytest.raises(Conflict, match=f"cannot start pipeline 'p': it is {status}") as no:
            orchestrator.start("p")
        assert hint in (no.value.hint or ""), no.value
        assert no.value.expected == (
            "a stopped pipeline (`fogshift stop`) whose deploy had completed"
        )
    # Stopped after a deploy that failed: its PEs hold checkpoints of no stream of this run
    # (the deploy made them anew), and started so, they read from positions of the last.
    orchestrator.registry.set_status("p", "failed", "a PE could not be started")
    orchestrator.registry.set_status("p", "stopping")
    orchestrator.registry.set_status("p", "stopped")
    with pytest.raises(Conflict, match="it is stopped, and its deploy never completed") as no:
        orchestrator.start("p")
    assert "`fogshift deploy SPEC` starts it afresh" in (no.value.hint or "")
    orchestrator.registry.set_status("p", "running")  # (as a deploy that completed does)
    assert orchestrator.registry.ran("p")
    orchestrator.registry.set_status("p", "stopped")
    # The node of its aggregate was removed while it was stopped (which nothing refuses),
    # and no node can take the PE now: fog-c, the only one heard, is being drained.
    orchestrator.remove_node("fog-a")
    orchestrator.drain_lease("fog-c", 60)
    with pytest.raises(Conflict, match="no healthy node can take aggregate, placed on a node "
                       "removed from the cluster while it was stopped") as no:  # fmt: skip
        orchestrator.start("p")
    assert no.value.received == "aggregate on removed fog-a; healthy nodes: fog-c"
    assert "`fogshift up --nodes ...`" in (no.value.hint or "")
    orchestrator.drain_lease("fog-c", None)
    url, _ = agent
    orchestrator.heartbeat("cloud", Heartbeat.model_validate({"url": url, "ready": True}))
    # An operation a dead orchestrator left on a PE of it: the next round ends it first.
    op = orchestrator.registry.begin_operation(
        "migration", "p", "aggregate", "fog-a", "fog-c", "dead0rchestr", "preparing"
    )
    with pytest.raises(Conflict, match="left unfinished holds aggregate"):
        orchestrator.start("p")
    orchestrator.registry.finish(op.id, "rolled back")
    # The broker lost a stream (its store wiped): started on streams made anew, a PE would
    # read from positions they do not hold.
    held = [stream_name("p", "source"), stream_name("p", "sink")]
    monkeypatch.setattr(orchestrator.broker, "run", lambda _call, **_: held)
    with pytest.raises(Conflict, match="no longer holds its streams") as gone:
        orchestrator.start("p")
    assert stream_name("p", "aggregate") in gone.value.message
    assert "`fogshift delete p`" in (gone.value.hint or "")
    assert orchestrator.registry.get_pipeline("p").status == "stopped"  # type: ignore[union-attr]
    # Another pipeline took its files meanwhile (a registry older than the deploy's refusal
    # of a stopped pipeline's files): started, its sink would find its file another's.
    record = orchestrator.registry.get_pipeline("p")
    assert record is not None
    everything = [stream_name("p", e.id) for e in record.spec.elements]
    monkeypatch.setattr(orchestrator.broker, "run", lambda _call, **_: everything)
    on_c = [e.model_copy(update={"node": "fog-c"}) for e in record.spec.elements]
    orchestrator.registry.put_pipeline(
        record.spec.model_copy(update={"pipeline": "q", "elements": on_c}), "running"
    )
    with pytest.raises(Conflict) as taken:
        orchestrator.start("p")
    said = taken.value.message
    assert said.startswith("cannot start pipeline 'p': sink 'sink' of pipeline 'p' writes")
    assert "which sink 'sink' of running pipeline 'q' writes" in said, said
    assert "`fogshift delete p` and deploy its spec with other paths" in (taken.value.hint or "")
    assert "stop" not in (taken.value.hint or "")
    assert orchestrator.registry.get_pipeline("p").status == "stopped"  # type: ignore[union-attr]


def test_a_pe_placed_on_a_removed_node_is_restored_elsewhere_whatever_its_recovery(
    orchestrator: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stopped pipeline's PE on a node removed meanwhile, started again (`start`): it can
    # never run there, nor write. Restored elsewhere though its recovery is not automatic
    # (that waits for a user's word on a silence, which may be a partition).
    restores: list[tuple[str, str, str | None]] = []
    monkeypatch.setattr(orchestrator, "restore", lambda p, e, target=None, *, lost=None:
                        restores.append((p, e, lost)))  # fmt: skip
    manual = parse_spec({**SPEC, "recovery": {"auto": False}}, orchestrator.config.home)
    orchestrator.registry.put_pipeline(manual, "running")
    orchestrator._reconcile_element("p", "aggregate")
    assert restores == []  # (fog-a never heard: not lost, and not removed)
    orchestrator.registry.set_status("p", "stopped")
    orchestrator.remove_node("fog-a")
    orchestrator.registry.set_status("p", "running")
    orchestrator._reconcile_element("p", "aggregate")
    assert restores == [("p", "aggregate", "fog-a")]
    # Stopped before it could be restored: nothing of it runs on the removed node, which
    # is not asked (nor told as a node not reached).
    assert "fog-a" not in orchestrator.stop("p").unreachable_nodes
    orchestrator.registry.set_status("p", "running")
    # A node added again (`fogshift up`) but not heard yet: its PEs wait to start there.
    orchestrator.admit_node("fog-a")
    orchestrator._reconcile_element("p", "aggregate")
    assert restores == [("p", "aggregate", "fog-a")]
