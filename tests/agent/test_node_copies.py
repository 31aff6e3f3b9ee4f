"""What a node holds of a PE besides its live checkpoint — node-level snapshots, a copy
being installed — goes with the PE, or with the checkpoint it stood for (the agent's
``NodeRuntime``, no Spark: the queries are never started)."""

from __future__ import annotations

import errno
import io
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fogshift.agent import node as node_module
from fogshift.agent.exceptions import ElementBusy
from fogshift.agent.node import NodeRuntime
from fogshift.checkpoint import central, spark_dir
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.spark_dir import pack
from fogshift.contracts import PEState
from fogshift.runtime.engine import QueryPlan
from tests.agent.test_node_restarts import hosted
from tests.checkpoint.test_central import manifest


def _live(rt: NodeRuntime, batches: int, history: str = "q") -> Path:
    """A committed checkpoint of x/p with ``batches`` batches where the node keeps it."""
    live = rt.checkpoint_dir("x", "p")
    for b in range(batches):
        for folder, text in (("offsets", f'v1\n{{}}\n{{"row": {b + 1}}}'), ("commits", "v1\n{}")):
            (live / folder).mkdir(parents=True, exist_ok=True)
            (live / folder / str(b)).write_text(text)
    (live / "metadata").write_text(f'{{"id": "{history}"}}')
    return live


def _host(rt: NodeRuntime, tmp_path: Path) -> None:
    """x/p running on the node, on its checkpoint folder."""
    h = hosted(tmp_path)
    h.plan = QueryPlan("x", h.plan.element, h.plan.broker_file, str(rt.checkpoint_dir("x", "p")))
    h.state = PEState.RUNNING
    rt._elements[h.key] = h


def test_a_discarded_pe_leaves_no_snapshot_and_no_half_installed_copy(
    runtime: NodeRuntime,
    tmp_path: Path,
) -> None:
    for hosted_here in (True, False):  # the PE ran here; a migration target that never ran it
        live = _live(runtime, 3)
        if hosted_here:
            _host(runtime, tmp_path)
            runtime.snapshot_all()
        else:
            runtime.snapshot_store("x", "p").mkdir(parents=True)
        half = live.with_name("p.incoming")
        (half / "offsets").mkdir(parents=True)
        assert runtime.snapshot_store("x", "p").exists()
        runtime.remove("x", "p", discard=True)
        for gone in (live, runtime.snapshot_store("x", "p"), half):
            assert not gone.exists(), gone
    # Without discard (a stop), the checkpoint and its snapshots stay, to go on from.
    _live(runtime, 3)
    _host(runtime, tmp_path)
    runtime.snapshot_all()
    runtime.remove("x", "p")
    assert runtime.latest_snapshot("x", "p") is not None


def test_an_install_replaces_the_snapshots_of_the_checkpoint_it_replaced(
    runtime: NodeRuntime,
    tmp_path: Path,
) -> None:
    # The PE ran here up to batch 5 (its snapshots stay after a stop), then elsewhere; a
    # checkpoint of batch 2 of another history comes back (a promoted standby trails).
    _live(runtime, 6)
    _host(runtime, tmp_path)
    runtime.snapshot_all()
    assert runtime.latest_snapshot("x", "p").batch == 5  # type: ignore[union-attr]
    runtime.remove("x", "p")
    other = tmp_path / "other"
    other.mkdir()
    for b in range(3):
        for folder in ("offsets", "commits"):
            (other / folder).mkdir(exist_ok=True)
            (other / folder / str(b)).write_text('v1\n{}\n{"row": 1}')
    runtime.install_checkpoint("x", "p", *pack(other))
    assert runtime.latest_snapshot("x", "p") is None
    _host(runtime, tmp_path)
    runtime.snapshot_all()  # the installed history's, at once: not shadowed by batch 5
    assert runtime.latest_snapshot("x", "p").batch == 2  # type: ignore[union-attr]


def test_an_install_that_fails_leaves_the_checkpoint_and_no_half_copy(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = _live(runtime, 2)
    store = CentralStore(tmp_path / "central")
    files = {f"state/0/0/{v}.changelog": bytes([v]) * 100 for v in range(1, 6)}
    checkpoint = manifest(4, files)
    store.put(checkpoint, files.__getitem__)
    copied = []
    real = central.shutil.copyfile

    def filling(src: str, dst: str) -> None:
        if len(copied) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        copied.append(real(src, dst))

    monkeypatch.setattr(central.shutil, "copyfile", filling)
    with pytest.raises(OSError, match="No space left"):
        runtime.install_from_store("x", "p", store, checkpoint)
    assert not live.with_name("p.incoming").exists()
    assert (live / "metadata").read_text() == '{"id": "q"}'  # the one it had


def test_two_copies_of_one_pe_at_once_do_not_share_a_folder(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request sent again while the first is still packed: each packs its own copy."""
    _live(runtime, 3)
    _host(runtime, tmp_path)
    real = node_module.pack
    inner: list[tuple[bytes, str]] = []
    calls: list[Path] = []

    def packing_twice(staging: Path, *args: object) -> tuple[bytes, str]:
        calls.append(staging)
        if len(calls) == 1:  # the second request comes while the first packs
            inner.append(runtime.checkpoint("x", "p", warm=False)[:2])
        return real(staging, *args)

    monkeypatch.setattr(node_module, "pack", packing_twice)
    data, _, info = runtime.checkpoint("x", "p", warm=False)
    assert info.batch == 2 and len(calls) == 2 and calls[0] != calls[1]
    assert _members(data) == _members(inner[0][0]) and "./commits/2" in _members(data)
    assert list((runtime.config.home / "outgoing" / "x").iterdir()) == []  # both removed


def _members(archive: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return set(tar.getnames())


def _stored(tmp_path: Path, files: dict[str, bytes]) -> tuple[CentralStore, dict[str, Any]]:
    """A central store holding a checkpoint of ``files``, and the checkpoint."""
    store = CentralStore(tmp_path / "central")
    checkpoint = manifest(4, files)
    store.put(checkpoint, files.__getitem__)
    return store, checkpoint


def _held_at_second_copy(
    monkeypatch: pytest.MonkeyPatch, thread: str | None = None
) -> tuple[threading.Event, threading.Event, list[str]]:
    """Installs from a central store (of thread ``thread`` only, if named) held before their
    second file: set once one is held there, what lets it go on, and the files copied."""
    real = central.shutil.copyfile
    midway, go_on = threading.Event(), threading.Event()
    copied: list[str] = []

    def slow(src: str, dst: str) -> None:
        copied.append(dst)
        if len(copied) == 2 and thread in (None, threading.current_thread().name):
            midway.set()
            go_on.wait(10)
        real(src, dst)

    monkeypatch.setattr(central.shutil, "copyfile", slow)
    return midway, go_on, copied


def _second_install_waiting(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, bytes],
) -> tuple[threading.Event, list[threading.Thread], dict[str, BaseException], list[str]]:
    """Two installs of ``files`` into x/p from a central store: the first held after its
    second file, the second started then and found waiting. What lets the first go on,
    the two threads, each one's error by name, and the files copied."""
    store, checkpoint = _stored(tmp_path, files)
    first_midway, go_on, copied = _held_at_second_copy(monkeypatch, "first")
    errors: dict[str, BaseException] = {}

    def install() -> None:
        try:
            runtime.install_from_store("x", "p", store, checkpoint)
        except BaseException as exc:  # reported by the caller
            errors[threading.current_thread().name] = exc

    threads = [threading.Thread(target=install, name=name) for name in ("first", "second")]
    threads[0].start()
    assert first_midway.wait(10)
    threads[1].start()
    threads[1].join(0.5)
    assert threads[1].is_alive(), "the second install ran beside the first"
    return go_on, threads, errors, copied


def test_an_install_sent_again_waits_for_the_first_and_each_installs_whole(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The orchestrator's client gave up on a slow install and sent it again: both shared
    one staging folder, each emptying it, and the PE could start on a checkpoint missing
    files."""
    files = {f"state/0/0/{v}.changelog": bytes([v]) * 100 for v in range(1, 6)}
    go_on, threads, errors, copied = _second_install_waiting(runtime, tmp_path, monkeypatch,
                                                             files)  # fmt: skip
    assert len(copied) == 2  # it copied nothing meanwhile
    go_on.set()
    for thread in threads:
        thread.join(10)
    assert errors == {}
    live = runtime.checkpoint_dir("x", "p")
    for name, data in files.items():
        assert (live / name).read_bytes() == data, name
    assert not live.with_name("p.incoming").exists()


def test_an_install_sent_again_is_refused_once_the_pe_runs_meanwhile(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sent again while the first ran, the second install waited for it; meanwhile the
    orchestrator gave up and deployed the PE. The second then replaced the checkpoint of a
    running query (it had found the PE not running before it waited)."""
    files = {f"state/0/0/{v}.changelog": bytes([v]) * 100 for v in range(1, 4)}
    go_on, threads, errors, _ = _second_install_waiting(runtime, tmp_path, monkeypatch, files)
    _host(runtime, tmp_path)  # the PE deployed meanwhile
    go_on.set()
    for thread in threads:
        thread.join(10)
    assert "first" not in errors
    assert isinstance(errors.get("second"), ElementBusy), errors
    live = runtime.checkpoint_dir("x", "p")
    assert {p.name for p in (live / "state/0/0").iterdir()} == {
        f"{v}.changelog" for v in range(1, 4)
    }


def _in_thread(action: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """``action`` run in a thread of its own, started; what it raises lands in ``errors``."""

    def go() -> None:
        try:
            action()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_a_discard_during_an_install_returns_at_once_and_the_install_is_refused(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The orchestrator discards a PE (a failed target, a copy left on a node) while an
    install of its checkpoint is under way: removed under it, the install failed half-way,
    or renamed into place a copy the discard had begun to remove (a torn checkpoint the
    node reported to resume from); a discard that waited for the install held the
    orchestrator's request as long as the copy took. The discard now returns at once, the
    install is refused, and nothing of either stays."""
    files = {f"state/0/0/{v}.changelog": bytes([v]) * 100 for v in range(1, 6)}
    store, checkpoint = _stored(tmp_path, files)
    midway, go_on, _ = _held_at_second_copy(monkeypatch)
    errors: list[BaseException] = []
    install = _in_thread(lambda: runtime.install_from_store("x", "p", store, checkpoint), errors)
    assert midway.wait(10)
    discard = _in_thread(lambda: runtime.remove("x", "p", discard=True), errors)
    discard.join(10)
    assert not discard.is_alive(), "the discard waited for the install"
    go_on.set()
    install.join(10)
    assert len(errors) == 1 and isinstance(errors[0], ElementBusy), errors
    assert "discarded" in str(errors[0])
    live = runtime.checkpoint_dir("x", "p")
    assert not live.exists() and not live.with_name("p.incoming").exists()
    assert runtime.left() == []
    # An install after the discard (the orchestrator asking again) goes in.
    runtime.install_from_store("x", "p", store, checkpoint)
    assert (live / "state/0/0/5.changelog").read_bytes() == bytes([5]) * 100


def test_a_shipped_checkpoint_a_discard_overtook_is_refused(
    runtime: NodeRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A migration's shipped checkpoint (``install_checkpoint``) unpacked while the
    orchestrator gave up on the target and discarded the PE there: the copy is not put in
    place (it stood on a node not running the PE, found later as left)."""
    source = _live(runtime, 2)
    data, digest = pack(source)
    runtime.remove("x", "p", discard=True)  # (what was live was only the packed source)
    real = spark_dir.incoming
    held, go_on = threading.Event(), threading.Event()

    def slow(target: Path) -> Path:
        held.set()
        go_on.wait(10)
        return real(target)

    monkeypatch.setattr(spark_dir, "incoming", slow)
    errors: list[BaseException] = []
    install = _in_thread(lambda: runtime.install_checkpoint("x", "p", data, digest), errors)
    assert held.wait(10)
    runtime.remove("x", "p", discard=True)
    go_on.set()
    install.join(10)
    assert len(errors) == 1 and isinstance(errors[0], ElementBusy), errors
    live = runtime.checkpoint_dir("x", "p")
    assert not live.exists() and not live.with_name("p.incoming").exists()
    monkeypatch.setattr(spark_dir, "incoming", real)
    runtime.install_checkpoint("x", "p", data, digest)  # nothing overtook this one
    assert (live / "offsets" / "1").exists()


def test_an_install_whose_copy_a_discard_overtook_is_refused(
    runtime: NodeRuntime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restore's install fetches its copy before it takes the PE's install lock; the
    orchestrator gave up on it meanwhile (its request timed out) and discarded the PE here.
    The install then put the whole checkpoint in place on a node that does not run the PE,
    there until the orchestrator found it left. Now it is refused, and nothing stays."""
    from fogshift.agent.replicas import Replicas

    files = {"offsets/0": b"o0", "commits/0": b"c0"}
    replicas = Replicas(runtime.config, runtime)
    checkpoint = manifest(4, files)
    replicas.store.put(checkpoint, files.__getitem__)

    def fetched_while_discarded(wanted: dict[str, Any], source: str | None) -> int:
        runtime.remove("x", "p", discard=True)  # (the orchestrator's, during the fetch)
        return 0

    monkeypatch.setattr(replicas, "copy", fetched_while_discarded)
    with pytest.raises(ElementBusy, match="discarded"):
        replicas.install("x", "p", checkpoint, None)
    live = runtime.checkpoint_dir("x", "p")
    assert not live.exists() and not live.with_name("p.incoming").exists()
    # An install nothing overtook goes in as before.
    monkeypatch.setattr(replicas, "copy", lambda wanted, source: 0)
    replicas.install("x", "p", checkpoint, None)
    assert (live / "offsets" / "0").read_bytes() == b"o0"


def test_an_install_waits_for_no_other_pes_deploy_and_leaves_no_old_copy(
    runtime: NodeRuntime,
    tmp_path: Path,
) -> None:
    """An install put its copy in place under the node's lock, which a deploy holds while
    its query starts (seconds, tens under load): an install of another PE waited that long
    (and the orchestrator, timing it out, discarded it). It now takes only the lock a
    discard counts itself under, and removes the checkpoint it replaced after."""
    files = {f"state/0/0/{v}.changelog": bytes([v]) * 100 for v in range(1, 4)}
    store, checkpoint = _stored(tmp_path, files)
    live = _live(runtime, 2)  # the checkpoint the install replaces
    with runtime._lock:  # (another PE's deploy, starting its query)
        errors: list[BaseException] = []
        install = _in_thread(
            lambda: runtime.install_from_store("x", "p", store, checkpoint), errors
        )
        install.join(10)
        assert not install.is_alive(), "the install waited for the node's lock"
    assert errors == []
    assert (live / "state/0/0/3.changelog").read_bytes() == bytes([3]) * 100
    assert not (live / "offsets").exists()  # the old checkpoint's files went with it
    assert not live.with_name("p.replaced").exists()
    assert not live.with_name("p.incoming").exists()
