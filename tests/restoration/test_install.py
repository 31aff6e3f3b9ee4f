"""A restore's checkpoint install tries every copy before it gives up: the target's own copy
and the central store are one request (no source: what the target lacks comes from the
central store), and its failure no longer ends the attempt while another node's copy is
left."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fogshift.agent.exceptions import ElementBusy
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.contracts import (
    CheckpointManifest,
    ElementProgress,
    InstallResult,
    PEState,
    RestoreReport,
)
from fogshift.exceptions import FogshiftError, Unavailable
from fogshift.restoration.procedure import _install, _install_newest

HERE = "/pipelines/p/elements/agg"
COPIES = [("replica@fog-c", None), ("replica@fog-b", "http://fog-b"), ("central", None)]


class Agent:
    """The target's agent: each install answers as ``answers`` says for its source."""

    def __init__(self, answers: dict[str | None, FogshiftError | None]) -> None:
        self.answers = answers
        self.sources: list[str | None] = []

    def call(self, model: Any, method: str, path: str, json: dict[str, Any]) -> InstallResult:
        assert (method, path, json["manifest"]["id"]) == ("POST", HERE + "/checkpoint/install",
                                                          "b000000000007")  # fmt: skip
        self.sources.append(json["source"])
        failure = self.answers.get(json["source"])
        if failure is not None:
            raise failure
        return InstallResult(fetched_bytes=42, source=json["source"] or "central")


def manifest(checkpoint: str = "b000000000007") -> CheckpointManifest:
    return CheckpointManifest(id=checkpoint, pipeline="p", element="agg", batch=7,
                              created=time.time(), files={})  # fmt: skip


def report() -> RestoreReport:
    return RestoreReport(pipeline="p", element="agg", target="fog-c", epoch=3)


def test_the_targets_own_copy_failing_leaves_another_nodes_copy_to_try() -> None:
    agent = Agent({None: Unavailable("the central store cannot be reached")})
    done = report()
    _install(agent, HERE, manifest(), COPIES, done)  # type: ignore[arg-type]
    assert agent.sources == [None, "http://fog-b"]
    assert (done.checkpoint_source, done.fetched_bytes) == ("replica@fog-b", 42)
    assert done.skipped_copies == ["replica@fog-c: the central store cannot be reached"]


def test_every_copy_failing_raises_the_failure_without_a_source_once_asked() -> None:
    central = Unavailable("the central store cannot be reached")
    agent = Agent({None: central, "http://fog-b": Unavailable("fog-b is gone")})
    done = report()
    with pytest.raises(Unavailable) as failed:
        _install(agent, HERE, manifest(), COPIES, done)  # type: ignore[arg-type]
    assert failed.value is central
    assert agent.sources == [None, "http://fog-b"]  # (the same request is not sent twice)
    assert [s.split(":")[0] for s in done.skipped_copies] == ["replica@fog-c", "replica@fog-b",
                                                               "central"]  # fmt: skip


def test_a_target_running_the_pe_ends_the_install_at_once() -> None:
    agent = Agent({None: ElementBusy("p/agg runs on fog-c")})
    with pytest.raises(ElementBusy):
        _install(agent, HERE, manifest(), COPIES, report())  # type: ignore[arg-type]
    assert agent.sources == [None]


class Central:
    """A central store keeping ``ids`` (newest first), those in ``torn`` unusable here."""

    def __init__(self, ids: list[str], torn: set[str]) -> None:
        self.ids, self.torn = ids, torn

    def kept(self, pipeline: str, pe: str) -> list[dict[str, Any]]:
        return [manifest(i).model_dump(mode="json") for i in self.ids]

    def verify(self, kept: dict[str, Any]) -> str | None:
        return "file offsets/7 is corrupt" if kept["id"] in self.torn else None


class Installs:
    """The target's agent: an install from a node in ``whole`` works, from ``central``
    (no source) only for a checkpoint not in ``torn``."""

    def __init__(self, whole: dict[str, set[str]], torn: set[str]) -> None:
        self.whole, self.torn = whole, torn
        self.tried: list[tuple[str, str | None]] = []

    def call(self, model: Any, method: str, path: str, json: dict[str, Any]) -> InstallResult:
        checkpoint, source = json["manifest"]["id"], json["source"]
        self.tried.append((checkpoint, source))
        if source is None and checkpoint in self.torn:
            raise FogshiftError(f"file offsets/7 of {checkpoint} is missing")
        if source is not None and checkpoint not in self.whole.get(source, set()):
            raise FogshiftError(f"{source} holds no copy of {checkpoint}")
        return InstallResult(fetched_bytes=1, source=source or "central")

    def post(self, path: str, json: dict[str, Any]) -> None:
        self.tried.append(("cleared", None))

    def delete(self, path: str, params: dict[str, Any]) -> None:
        assert (path, params) == (HERE, {"discard": True})
        self.tried.append(("discarded", None))


def holders(of: dict[str, list[str]]) -> Any:
    return lambda m: [*((f"replica@{n}", f"http://{n}") for n in of.get(m.id, [])),
                      ("central", None)]  # fmt: skip


def test_a_checkpoint_torn_centrally_is_installed_from_a_backup_nodes_replica() -> None:
    # One corrupt blob every kept checkpoint named made them all unusable: the PE replayed
    # its whole input while a backup node held the checkpoint whole.
    torn = {"b9", "b8"}
    agent = Installs({"http://fog-b": {"b9"}}, torn)
    done = report()
    chosen = _install_newest(agent, HERE, Central(["b9", "b8"], torn), "p", "agg",  # type: ignore[arg-type]
                             holders({"b9": ["fog-b"]}), done)  # fmt: skip
    assert chosen is not None and chosen.id == "b9"
    assert (done.checkpoint, done.checkpoint_source) == ("b9", "replica@fog-b")
    assert done.skipped_checkpoints == [] and agent.tried == [("b9", "http://fog-b")]


def test_a_torn_checkpoint_no_node_holds_whole_falls_back_to_an_older_one() -> None:
    torn = {"b9"}
    agent = Installs({"http://fog-b": set()}, torn)
    done = report()
    chosen = _install_newest(agent, HERE, Central(["b9", "b8"], torn), "p", "agg",  # type: ignore[arg-type]
                             holders({"b9": ["fog-b"]}), done)  # fmt: skip
    assert chosen is not None and chosen.id == "b8" and done.checkpoint_source == "central"
    # The replica's reason, not only the central store's (which the install raises).
    assert done.skipped_checkpoints == [
        "b9: file offsets/7 is corrupt (no whole copy elsewhere: replica@fog-b: "
        "http://fog-b holds no copy of b9; central: file offsets/7 of b9 is missing)"
    ]
    assert done.skipped_copies == []  # (the torn one's attempts are said in its line)
    # Discarded on the target before the next one: an install given up on (no answer in
    # time) and still copying would be put in place after b8's.
    assert agent.tried == [("b9", "http://fog-b"), ("b9", None), ("discarded", None),
                           ("b8", None)]  # fmt: skip
    # Not tried from the central store alone when no node holds a copy: nothing to gain.
    agent = Installs({}, torn)
    done = report()
    chosen = _install_newest(agent, HERE, Central(["b9", "b8"], torn), "p", "agg",  # type: ignore[arg-type]
                             holders({}), done)  # fmt: skip
    assert chosen is not None and chosen.id == "b8" and agent.tried == [("b8", None)]
    assert done.skipped_checkpoints == ["b9: file offsets/7 is corrupt"]


def test_no_whole_checkpoint_anywhere_replays_the_input_and_says_so() -> None:
    torn = {"b9"}
    agent = Installs({}, torn)
    done = report()
    assert _install_newest(agent, HERE, Central(["b9"], torn), "p", "agg",  # type: ignore[arg-type]
                           holders({}), done) is None  # fmt: skip
    assert agent.tried == [("cleared", None)] and done.checkpoint is None
    assert done.skipped_checkpoints[-1] == "none usable: the input is replayed from its start"
    done = report()
    assert _install_newest(Installs({}, set()), HERE, Central([], set()), "p", "agg",  # type: ignore[arg-type]
                           holders({}), done) is None  # fmt: skip
    assert done.skipped_checkpoints == ["none usable: no central checkpoint of p/agg was taken yet"]


TORN = "state/0/0/10.changelog has 0 bytes, its checksums are of 1 to 512 bytes"


class Unreadable:
    """The target's agent: a PE started from a checkpoint in ``unreadable`` fails as Spark
    cannot load its state at its first batch — which comes only once its gate's cap is
    raised past the checkpoint's position (30) — and is reported so; from any other, it
    runs up to its cap, or to the inputs' end (40) with its gate open."""

    def __init__(self, unreadable: set[str], refused: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.unreadable, self.refused, self.installed = unreadable, refused, None
        self.limit: int | None = None  # (None: open)
        self.done: list[tuple[str, str | int | None]] = []

    def call(self, model: Any, method: str, path: str, **kwargs: Any) -> Any:
        if method == "POST":
            self.installed = kwargs["json"]["manifest"]["id"]
            self.done.append(("installed", self.installed))
            return InstallResult(fetched_bytes=1, source="central")
        assert (method, path) == ("GET", HERE + "/progress")
        if self.installed in self.unreadable and (self.limit is None or self.limit > 30):
            return ElementProgress(
                pipeline="p", element="agg", state=PEState.FAILED, retry_in_s=1.0, epoch=3,
                unreadable="Spark cannot load its state: CANNOT_LOAD_STATE_STORE.UNCATEGORIZED",
            )  # fmt: skip
        return ElementProgress(pipeline="p", element="agg", state=PEState.RUNNING, epoch=3,
                               committed_batch=9, progress=min(self.limit or 40, 40))  # fmt: skip

    def post(self, path: str, json: dict[str, Any]) -> None:
        self.installed = None
        self.done.append(("cleared", None))

    def put(self, path: str, json: dict[str, Any]) -> None:
        gate = json["gate"]
        if path == HERE and self.installed in self.refused:
            self.done.append(("refused", self.installed))
            raise TornCheckpoint(f"the checkpoint of p/agg on node 'fog-c' is torn: {TORN}")
        self.limit = None if gate is None else int(gate["limit"]["positions"]["source"])
        self.done.append(("started" if path == HERE else "gate", self.limit))

    def delete(self, path: str, params: dict[str, Any]) -> None:
        assert (path, params) == (HERE, {"discard": True})
        self.done.append(("discarded", self.installed))


def _restored(agent: Unreadable, monkeypatch: pytest.MonkeyPatch) -> RestoreReport:
    """A Case 1 aggregate restored on fog-c through ``agent``, the central store keeping b9
    and b8: its last output at input position 30, its input at 40 (31 and 40 once an
    instance was discarded: as if it had written one more)."""
    from fogshift.restoration import procedure
    from fogshift.spec import parse_spec

    spec = parse_spec({"pipeline": "p", "elements": [
        {"id": "source", "kind": "csv-source", "node": "cloud", "options": {"path": "a.csv"}},
        {"id": "agg", "kind": "window-aggregate", "node": "fog-b", "inputs": ["source"],
         "options": {"field": "v", "window": 2}},
    ]})  # fmt: skip
    monkeypatch.setattr(procedure, "fence_and_locate", lambda *args: (30, 40))
    monkeypatch.setattr(procedure, "locate", lambda *args: (31, 40))
    return procedure.restore("p", spec.element("agg"), 3, ("fog-c", agent),  # type: ignore[arg-type]
                             Central(["b9", "b8"], set()), None, timeout_s=5)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("unreadable", [{"b9"}, {"b9", "b8"}])
def test_a_checkpoint_the_pes_query_cannot_read_gives_way_to_an_older_one(
    unreadable: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node's state file torn before its first snapshot of it was pulled as it was: whole
    # by its digest, every restore from it failed (on every node in turn: the first batch,
    # which loads the state, ran once the cap was raised), the PE never running again. The
    # restore takes the next older one, or the input from its start, capped at what was
    # written meanwhile.
    agent = Unreadable(unreadable)
    report = _restored(agent, monkeypatch)
    assert report.status == "restored"
    why = ("restoring: the PE's query cannot read the checkpoint it was given (Spark cannot "
           "load its state: CANNOT_LOAD_STATE_STORE.UNCATEGORIZED)")  # fmt: skip
    if unreadable == {"b9"}:
        assert report.checkpoint == "b8" and report.skipped_checkpoints == [f"b9: {why}"]
        assert agent.done == [
            ("installed", "b9"), ("started", 30), ("gate", 40), ("discarded", "b9"),
            ("installed", "b8"), ("started", 31), ("gate", 40), ("gate", None),
        ]  # fmt: skip
    else:
        assert report.checkpoint is None
        assert report.skipped_checkpoints == [
            f"b9: {why}",
            f"b8: {why}",
            "none usable: the input is replayed from its start",
        ]
        assert agent.done[-5:] == [("discarded", "b8"), ("cleared", None), ("started", 31),
                                   ("gate", 40), ("gate", None)]  # fmt: skip
    assert (report.reprocessed_events, report.intermediate_events) == (31, 9)


def test_a_checkpoint_the_target_refuses_as_torn_gives_way_to_an_older_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its files do not match the checksums Spark wrote (frozen before snapshots checked
    # them): the target refuses to start from it, at every attempt as it was.
    agent = Unreadable(set(), refused={"b9"})
    report = _restored(agent, monkeypatch)
    assert report.status == "restored" and report.checkpoint == "b8"
    assert report.skipped_checkpoints == [
        f"b9: the checkpoint of p/agg on node 'fog-c' is torn: {TORN}"
    ]
    assert agent.done == [("installed", "b9"), ("refused", "b9"), ("discarded", "b9"),
                          ("installed", "b8"), ("started", 31), ("gate", 40),
                          ("gate", None)]  # fmt: skip
