"""Processors kept across micro-batches and their lifecycle hooks, as pure logic."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from fogshift.common.gate import gate_mode, open_gate, read_gate, write_gate
from fogshift.events import Event
from fogshift.runtime.api import Processor, state
from fogshift.runtime.batch import run_batch
from fogshift.runtime.gate import current_run, end_run, start_run
from fogshift.runtime.instances import InstanceKey, Instances, registry


class Hooked(Processor):
    """Counts events; records every hook called on it, in order."""

    count: int = state(0)

    def __init__(self, options: dict, element_id: str = "") -> None:
        super().__init__(options, element_id)
        self.calls: list[str] = []
        self.fail: set[str] = set()

    def process(self, event: Event) -> dict:
        self.count += 1
        if event.body.get("bad"):
            raise ValueError("bad event, after changing the state")
        return {"count": self.count}

    def _hook(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise RuntimeError(f"{name} fails")

    def on_assign(self) -> None:
        self._hook("assign")

    def on_pause(self) -> None:
        self._hook("pause")

    def on_resume(self) -> None:
        self._hook("resume")

    def on_revoke(self) -> None:
        self._hook("revoke")

    def close(self) -> None:
        self._hook("close")


def instances() -> Instances:
    return Instances(keep_between_batches=lambda: True, poll_s=0)


def key(run: str = "r1", pe: str = "agg") -> InstanceKey:
    return InstanceKey("case1", pe, run, "0")


TEXTS = {"count": "3"}


def test_an_instance_is_reused_only_with_the_texts_it_holds() -> None:
    kept = instances()
    first = Hooked.build({}, "agg", {"count": 3})
    kept.keep(key(), first, TEXTS)
    assert kept.checkout(key(), TEXTS) is first
    assert kept.checkout(key(), TEXTS) is None  # checked out: a batch owns it now
    kept.keep(key(), first, TEXTS)
    # A retried batch, or a restore from an older checkpoint: other stored texts.
    assert kept.checkout(key(), {"count": "2"}) is None
    assert first.calls == ["close"]
    assert len(kept) == 0


def test_a_stateless_instance_is_reused_by_its_run_only() -> None:
    kept = instances()
    first = Hooked.build({}, "map", None)
    kept.keep(key(pe="map"), first, None)
    assert kept.checkout(key(run="r2", pe="map"), None) is None
    assert kept.checkout(key(pe="map"), None) is first


def test_a_new_run_closes_the_instances_of_the_earlier_one() -> None:
    kept = instances()
    old, new = Hooked.build({}, "agg", None), Hooked.build({}, "agg", None)
    kept.keep(key("r1"), old, TEXTS)
    kept.keep(key("r2"), new, TEXTS)
    assert old.calls == ["close"] and new.calls == []
    assert kept.checkout(key("r1"), TEXTS) is None
    assert kept.checkout(key("r2"), TEXTS) is new


def test_a_worker_that_is_not_reused_keeps_nothing() -> None:
    kept = Instances(keep_between_batches=lambda: False, poll_s=0)
    processor = Hooked.build({}, "agg", None)
    kept.keep(key(), processor, TEXTS)
    assert processor.calls == ["close"]
    assert kept.checkout(key(), TEXTS) is None


def test_the_registry_survives_pickling_by_value() -> None:
    # Spark pickles closures by value: they must reach the process's one registry.
    from pyspark import cloudpickle

    def closure() -> Instances:
        return registry()

    assert cloudpickle.loads(cloudpickle.dumps(closure))() is registry()


@pytest.fixture()
def gate(tmp_path: Path) -> str:
    return str(tmp_path / "gates" / "agg.json")


def test_pause_resume_revoke_and_close_follow_the_gate_and_the_run(gate: str) -> None:
    kept = instances()
    run = start_run(gate)
    assert current_run(gate) == run
    processor = Hooked.build({}, "agg", None)
    kept.keep(key(run), processor, TEXTS, gate)
    kept.poll()
    assert processor.calls == []
    write_gate(gate, "hold")
    kept.poll()
    kept.poll()  # a hold already seen is not seen again
    assert processor.calls == ["pause"]
    open_gate(gate)
    kept.poll()
    assert processor.calls == ["pause", "resume"]
    write_gate(gate, "cap", {"type": "jetstream", "positions": {"src": 4}})
    kept.poll()  # a capped PE runs: no pause
    write_gate(gate, "hold")
    kept.poll()
    end_run(gate)
    kept.poll()
    assert processor.calls == ["pause", "resume", "pause", "revoke", "close"]
    assert len(kept) == 0


def test_one_pes_slow_hook_holds_no_batch_of_another_pe(tmp_path: Path) -> None:
    # A reused worker runs several PEs' tasks: with every hook under the registry's lock,
    # one PE's on_pause that took long held every other PE's batches in that worker.
    kept = instances()
    slow_gate, other_gate = str(tmp_path / "slow.json"), str(tmp_path / "other.json")
    slow_run, other_run = start_run(slow_gate), start_run(other_gate)
    release, entered = threading.Event(), threading.Event()

    class Slow(Hooked):
        def on_pause(self) -> None:
            entered.set()
            release.wait(30)
            super().on_pause()

    slow, other = Slow.build({}, "slow", None), Hooked.build({}, "other", None)
    kept.keep(key(slow_run, "slow"), slow, TEXTS, slow_gate)
    kept.keep(key(other_run, "other"), other, TEXTS, other_gate)
    write_gate(slow_gate, "hold")
    watcher = threading.Thread(target=kept.poll)
    watcher.start()
    try:
        assert entered.wait(10)
        took: list[object] = []
        batch = threading.Thread(target=lambda: took.append(
            kept.checkout(key(other_run, "other"), TEXTS)))  # fmt: skip
        batch.start()
        batch.join(5)
        assert took == [other]
        # A batch of the slow PE itself waits for its hook, and then resumes it.
        mine = threading.Thread(target=lambda: took.append(
            kept.checkout(key(slow_run, "slow"), TEXTS)))  # fmt: skip
        mine.start()
        mine.join(0.3)
        assert mine.is_alive()
    finally:
        release.set()
        watcher.join(10)
    mine.join(10)
    assert took == [other, slow] and slow.calls == ["pause", "resume"]


def test_a_restart_closes_without_revoking(gate: str) -> None:
    kept = instances()
    processor = Hooked.build({}, "agg", None)
    kept.keep(key(start_run(gate)), processor, TEXTS, gate)
    start_run(gate)  # the query was restarted (failure, redeploy): the PE stays here
    kept.poll()
    assert processor.calls == ["close"]


def test_a_paused_instance_resumes_before_its_next_batch(gate: str) -> None:
    kept = instances()
    run = start_run(gate)
    processor = Hooked.build({}, "agg", None)
    kept.keep(key(run), processor, TEXTS, gate)
    write_gate(gate, "hold")
    kept.poll()
    open_gate(gate)  # a batch comes before the next poll
    assert kept.checkout(key(run), TEXTS) is processor
    assert processor.calls == ["pause", "resume"]


def test_failing_hooks_are_logged_and_a_failed_resume_drops_the_instance(gate: str) -> None:
    kept = instances()
    run = start_run(gate)
    processor = Hooked.build({}, "agg", None)
    processor.fail = {"pause", "resume", "close"}
    kept.keep(key(run), processor, TEXTS, gate)
    write_gate(gate, "hold")
    kept.poll()
    open_gate(gate)
    kept.poll()
    assert processor.calls == ["pause", "resume", "close"]
    assert kept.checkout(key(run), TEXTS) is None  # rebuilt from the stored state


def test_gate_mode_observes_without_acknowledging(gate: str) -> None:
    assert gate_mode(gate) is None
    nonce = write_gate(gate, "hold")
    assert gate_mode(gate) == "hold"
    assert not Path(f"{gate}.ack").exists()
    assert read_gate(gate) is not None  # the reader acknowledges
    assert Path(f"{gate}.ack").read_text() == nonce


def test_a_forked_child_starts_with_an_empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry(), "_keep_between_batches", lambda: True)
    monkeypatch.setattr(registry(), "_poll_s", 0)
    registry().keep(key("fork"), Hooked.build({}, "agg", None), TEXTS)
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            os.write(write, str(len(registry())).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        assert os.read(read, 16) == b"0"
        assert len(registry()) >= 1
    finally:
        registry().close_all()


def rows(*bodies: dict) -> list[tuple[int, int, float, str, str]]:
    return [(n, n, 0.0, "src", json.dumps(body)) for n, body in enumerate(bodies, 1)]


def test_a_batch_runs_on_the_live_instance_and_undoes_events_from_the_stored_state() -> None:
    live = Hooked.build({}, "agg", {"count": 5})
    built: list[Processor] = []

    def build(resume: dict | None) -> Processor:
        processor = Hooked.build({}, "agg", resume)
        built.append(processor)
        return processor

    out, final = run_batch(
        build,
        lambda: {"count": 5},
        rows({}, {}),
        finish=lambda p: p,
        pe="agg",
        live=live,
    )
    assert built == [] and final is live
    assert [json.loads(r[5])["count"] for r in out] == [6, 7]
    # An event that fails after changing the state: undone from the stored state (5), not
    # from the live instance, which now holds its change.
    live = Hooked.build({}, "agg", {"count": 5})
    out, final = run_batch(
        build,
        lambda: {"count": 5},
        rows({}, {"bad": True}, {}),
        finish=lambda p: p,
        pe="agg",
        live=live,
    )
    assert len(built) == 1 and final is built[0]
    assert [r[6] is None for r in out] == [True, False, True]
    assert json.loads(out[2][5])["count"] == 7
    assert final.count == 7


class FakeValueState:
    """A ``ValueState`` of Spark's state store, in memory."""

    def __init__(self) -> None:
        self.value: tuple[str] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[str] | None:
        return self.value  # None when nothing is stored, as Spark's ValueState.get()

    def update(self, value: tuple[str]) -> None:
        self.value = value


class FakeHandle:
    def __init__(self) -> None:
        self.states: dict[str, FakeValueState] = {}

    def getValueState(self, name: str, schema: str) -> FakeValueState:  # noqa: N802
        return self.states.setdefault(name, FakeValueState())


class Built(Processor):
    """Counts its constructions in a class attribute (one process: no file needed)."""

    builds = 0
    count: int = state(0)

    def __init__(self, options: dict, element_id: str = "") -> None:
        super().__init__(options, element_id)
        type(self).builds += 1

    def process(self, event: Event) -> dict:
        self.count += 1
        if event.body.get("bad"):
            raise ValueError("after changing the state")
        return {"count": self.count}


def test_the_engine_reuses_its_instance_and_rebuilds_for_a_retried_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pandas as pd

    from fogshift.runtime.engine import _stateful_processor
    from fogshift.runtime.kinds import load_class

    monkeypatch.setattr(registry(), "_keep_between_batches", lambda: True)
    monkeypatch.setattr(registry(), "_poll_s", 0)
    options = {"class": "tests.runtime.test_instances:Built"}
    # The class the engine imports (pytest may have imported this file under another name).
    built = load_class(options["class"])
    monkeypatch.setattr(built, "builds", 0)
    handle = FakeHandle()

    def batch(*bodies: dict) -> list[dict]:
        frame = pd.DataFrame(
            rows(*bodies), columns=["origin", "seq", "timestamp", "creator", "body"]
        )
        spark_side = _stateful_processor("custom", options, "pl", "pe", 1 << 20, "run1", "")
        spark_side.init(handle)  # Spark makes a StatefulProcessor per task
        out = [f for f in spark_side.handleInputRows(("pe",), iter([frame]), None)]
        records = pd.concat(out) if out else pd.DataFrame(columns=["body", "dead"])
        return [
            json.loads(b)
            for b, d in zip(records["body"], records["dead"], strict=True)
            if d is None
        ]

    try:
        assert batch({}, {}) == [{"count": 1}, {"count": 2}]
        assert batch({}) == [{"count": 3}]
        assert built.builds == 1  # one instance over both batches
        before = {name: state.value for name, state in handle.states.items()}
        assert batch({}, {"bad": True}, {}) == [{"count": 4}, {"count": 5}]
        assert built.builds == 2  # the undone event rebuilt from the stored state
        # The last batch is retried (its commit failed): the stored state is the one before
        # it, not the kept instance's (its texts and their digests alike). The kept instance
        # must not be used.
        for name, value in before.items():
            handle.states[name].value = value
        assert batch({}, {"bad": True}, {}) == [{"count": 4}, {"count": 5}]
        assert built.builds == 4  # rebuilt from the stored state, and once more to undo
        assert batch({}) == [{"count": 6}]
        assert built.builds == 4
    finally:
        registry().close_all()


class SetUpFails(Hooked):
    def on_assign(self) -> None:
        super().on_assign()
        raise FileNotFoundError("model.bin")


def test_a_set_up_that_fails_is_an_element_error_and_closes_the_instance() -> None:
    from fogshift.runtime.engine import _assign
    from fogshift.runtime.exceptions import ElementError

    processor = SetUpFails.build({}, "agg", None)
    with pytest.raises(ElementError) as err:
        _assign("case1", "agg", processor)
    assert "processor 'agg' (SetUpFails) of pipeline 'case1' cannot be set up" in err.value.message
    assert "FileNotFoundError: model.bin" in err.value.message
    assert processor.calls == ["assign", "close"]


def test_the_drivers_probe_instance_is_closed_and_never_assigned(tmp_path: Path) -> None:
    from fogshift.runtime.engine import QueryPlan, check_processor
    from fogshift.runtime.kinds import load_class
    from fogshift.spec.models import ElementSpec

    reference = "tests.runtime.test_instances:Probed"
    element = ElementSpec(
        id="pe", kind="custom", node="n", inputs=("s",), options={"class": reference}
    )
    Probed = load_class(reference)  # noqa: N806 - the class the engine imports
    Probed.made.clear()
    check_processor(QueryPlan("pl", element, str(tmp_path / "b.json"), str(tmp_path / "cp")))
    assert [p.calls for p in Probed.made] == [["close"]]


class Probed(Hooked):
    made: ClassVar[list[Hooked]] = []

    def __init__(self, options: dict, element_id: str = "") -> None:
        super().__init__(options, element_id)
        self.made.append(self)


def test_a_hook_that_calls_sys_exit_fails_alone() -> None:
    # Only Exception was caught: a close() calling sys.exit() (after an event undone) ended
    # the batch, and the query was restarted over and over.
    from fogshift.runtime.instances import call_hook

    class Quits(Processor):
        def process(self, event: Event) -> None:
            return None

        def close(self) -> None:
            raise SystemExit(2)

        def on_pause(self) -> None:  # (an async client's task cancelled: it escaped)
            raise asyncio.CancelledError

    assert call_hook(Quits.build({}, "q", None), "close", "q") is False
    assert call_hook(Quits.build({}, "q", None), "on_pause", "q") is False
