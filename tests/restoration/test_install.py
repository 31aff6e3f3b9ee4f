"""A restore's checkpoint install tries every copy before it gives up: the target's own copy
and the central store are one request (no source: what the target lacks comes from the
central store), and its failure no longer ends the attempt while another node's copy is
left."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fogshift.agent.exceptions import ElementBusy
from fogshift.contracts import CheckpointManifest, InstallResult, RestoreReport
from fogshift.exceptions import FogshiftError, Unavailable
from fogshift.restoration.procedure import _install

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


def manifest() -> CheckpointManifest:
    return CheckpointManifest(id="b000000000007", pipeline="p", element="agg", batch=7,
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
