"""Processor instances kept across micro-batches, and the lifecycle hooks they receive.

Spark runs a PE's processor in a Python worker process of the node's Spark driver, a new
task per micro-batch. The worker process outlives its tasks (``spark.python.worker.reuse``,
on by default), so a registry at module level keeps each query's processor from one batch
to the next: it is built — and a model or file loaded in its set-up — once per query, not
once per batch.

**Reuse is an optimisation, never a premise.** An instance is handed to a batch only if it
provably holds the state the batch starts from: the JSON texts of its state, as encoded at
the end of its last batch, equal the texts Spark's state store gives this batch (a stateless
processor holds no state: any instance of the same query run will do). On any mismatch — a
retried batch, a restore from an older checkpoint, a batch run by another worker meanwhile —
the kept instance is closed and a new one is built from the stored state, exactly as without
the registry. An instance is taken *out* of the registry while a batch uses it and put back
only when the batch succeeded, so a failed batch leaves nothing behind. Workers that are not
reused (``SPARK_REUSE_WORKER`` unset) keep nothing: every batch builds and closes its own.

Keys are :class:`InstanceKey`: pipeline, PE, the *run* (a token :func:`~fogshift.runtime.
engine.start_query` draws per start of the query, see :func:`fogshift.runtime.gate.start_run`)
and the partition. A registry is per process: a fork starts with an empty one.

Hooks (see :class:`~fogshift.runtime.api.ProcessingElement`) are called in the worker, where
the instance lives. ``on_pause``/``on_resume`` follow the PE's gate and ``on_revoke`` the end
of its run: a daemon thread of the worker looks at both every :data:`POLL_S` seconds, and
only at instances no batch is using. A failing ``on_pause``, ``on_revoke`` or ``close`` is
logged and otherwise ignored (hooks manage resources, never processing state); an instance
whose ``on_resume`` fails is dropped and rebuilt.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fogshift.common.gate import gate_mode
from fogshift.runtime.api import Processor
from fogshift.runtime.batch import ends_batch
from fogshift.runtime.gate import current_run

log = logging.getLogger("fogshift.runtime.instances")

#: How often a worker looks at the gates and runs of the instances it keeps.
POLL_S = 0.1


@dataclass(frozen=True)
class InstanceKey:
    """Which query's processor an instance is.

    Attributes:
        pipeline: The pipeline id.
        pe: The PE id.
        run: The token of the query's current start (a restart is a new run).
        partition: The partition (or grouping key) the instance processes.
    """

    pipeline: str
    pe: str
    run: str
    partition: str

    def __str__(self) -> str:
        return f"processor {self.pe!r} of pipeline {self.pipeline!r}"


@dataclass
class _Kept:
    processor: Processor
    texts: Mapping[str, str] | None
    gate: str
    paused: bool = False
    #: The digests of ``texts`` as stored beside them (``None``: not known).
    marks: Mapping[str, str] | None = None
    #: Encodings to reuse: part -> (the immutable value encoded, its text).
    encoded: dict[str, tuple[Any, str]] = field(default_factory=dict)
    #: Held while the watcher calls a hook of this instance: a batch that takes it waits
    #: for that hook, and no other (see :meth:`Instances.poll`).
    hooking: threading.Lock = field(default_factory=threading.Lock)


def call_hook(processor: Processor, hook: str, who: object) -> bool:
    """Call one lifecycle hook; log what it raises. ``True`` if it returned normally."""
    try:
        getattr(processor, hook)()
    except BaseException as exc:  # a hook manages resources; its failure (a sys.exit(),
        # an asyncio.CancelledError in it too) must not stop the query
        if ends_batch(exc):  # (the caller's own alarm, as in a batch)
            raise
        log.warning("%s: %s() raised", who, hook, exc_info=True)
        return False
    return True


def workers_reused() -> bool:
    """Whether this Spark Python worker runs further tasks after this one."""
    return os.environ.get("SPARK_REUSE_WORKER") == "1"


class Instances:
    """The processors kept in this process, by :class:`InstanceKey`. Thread-safe.

    Args:
        keep_between_batches: Whether instances may outlive their batch (default: this is
            a reused Spark worker).
        poll_s: The period of the thread that calls the gate and run hooks; ``0`` starts no
            thread (call :meth:`poll` yourself).
    """

    def __init__(
        self,
        keep_between_batches: Callable[[], bool] = workers_reused,
        poll_s: float = POLL_S,
    ) -> None:
        self._keep_between_batches = keep_between_batches
        self._poll_s = poll_s
        self._kept: dict[InstanceKey, _Kept] = {}
        self._lock = threading.RLock()
        self._watcher_pid = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def checkout(self, key: InstanceKey, texts: Mapping[str, str] | None) -> Processor | None:
        """Take the kept instance of ``key`` for a batch, if it holds exactly ``texts``.

        Args:
            key: The query run and partition.
            texts: The state texts the batch starts from (``None``: a stateless processor).

        Returns:
            The instance, now owned by the caller (put it back with :meth:`keep`), or
            ``None``: build a new one from the stored state. A kept instance that does not
            hold ``texts`` is closed; a paused one gets ``on_resume`` first (a batch runs,
            so the gate is open).
        """
        with self._lock:
            kept = self._kept.pop(key, None)
        if kept is None:
            return None
        with kept.hooking:  # waits for a hook the watcher is calling on this instance
            pass
        if kept.texts != texts:
            call_hook(kept.processor, "close", key)
            return None
        if kept.paused and not call_hook(kept.processor, "on_resume", key):
            call_hook(kept.processor, "close", key)
            return None
        return kept.processor

    def marked(
        self, key: InstanceKey, marks: Mapping[str, str] | None
    ) -> tuple[Mapping[str, str] | None, dict[str, tuple[Any, str]]]:
        """What the kept instance of ``key`` knows of its state, without taking it.

        Returns:
            Its state texts if the digests stored with the batch's state (``marks``) are
            those kept with it, so the texts need not be read from the store (else
            ``None``); and its encodings to reuse (empty without a kept instance).
        """
        with self._lock:
            kept = self._kept.get(key)
        if kept is None:
            return None, {}
        same = marks is not None and kept.marks == marks
        return (kept.texts if same else None), kept.encoded

    def keep(
        self,
        key: InstanceKey,
        processor: Processor,
        texts: Mapping[str, str] | None,
        gate: str = "",
        marks: Mapping[str, str] | None = None,
        encoded: dict[str, tuple[Any, str]] | None = None,
    ) -> None:
        """Keep ``processor`` (holding ``texts``) for the next batch of ``key``.

        Instances of earlier runs of the same PE and partition are closed: their query was
        restarted. In a worker that is not reused, ``processor`` is closed instead.

        Args:
            gate: The PE's gate file, followed for ``on_pause``/``on_resume``/``on_revoke``
                (``""``: none).
            marks: The digests of ``texts`` as stored (see :meth:`marked`).
            encoded: Encodings of immutable state values to reuse (see :meth:`marked`).
        """
        if not self._keep_between_batches():
            call_hook(processor, "close", key)
            return
        with self._lock:
            stale = [
                k
                for k in self._kept
                if (k.pipeline, k.pe, k.partition) == (key.pipeline, key.pe, key.partition)
                and k != key
            ]
            dropped = [self._kept.pop(k) for k in stale]
            self._kept[key] = _Kept(
                processor, dict(texts) if texts is not None else None, gate,
                marks=dict(marks) if marks is not None else None, encoded=dict(encoded or {}),
            )  # fmt: skip
            self._ensure_watcher()
        for old in dropped:
            call_hook(old.processor, "close", key)

    def poll(self) -> None:
        """Apply every kept instance's gate and run: the hooks their changes call.

        * the run file is gone (the agent stopped the query: the PE leaves the node, or
          stops): ``on_revoke`` then ``close``, and the instance is dropped;
        * another run started (a restart): ``close``, dropped;
        * the gate holds and the instance is not paused: ``on_pause``;
        * the gate no longer holds and the instance is paused: ``on_resume``.

        Each hook runs under its instance's own lock, not the registry's: one PE's hook that
        takes long (a model unloaded, a connection closed) holds back only a batch of that
        PE, where it held every batch of every PE this worker runs.
        """
        with self._lock:
            listed = list(self._kept.items())
        for key, kept in listed:
            if not kept.gate:
                continue
            with kept.hooking:
                with self._lock:
                    if self._kept.get(key) is not kept:
                        continue  # a batch took it meanwhile (or it was dropped)
                    run = current_run(kept.gate)
                    hold = gate_mode(kept.gate) == "hold"
                    if run != key.run:
                        del self._kept[key]
                # From here a batch that takes the instance waits for its hook.
                if run != key.run:
                    if run is None:
                        call_hook(kept.processor, "on_revoke", key)
                    call_hook(kept.processor, "close", key)
                elif hold and not kept.paused:
                    kept.paused = True
                    call_hook(kept.processor, "on_pause", key)
                elif not hold and kept.paused:
                    kept.paused = False
                    if not call_hook(kept.processor, "on_resume", key):
                        with self._lock:
                            if self._kept.get(key) is kept:
                                del self._kept[key]
                                dropped = True
                            else:
                                # A batch took it: it calls on_resume again, and drops it
                                # if that fails too.
                                kept.paused, dropped = True, False
                        if dropped:
                            call_hook(kept.processor, "close", key)

    def close_all(self) -> None:
        """Close every kept instance and forget it (no ``on_revoke``: nothing left the node)."""
        with self._lock:
            dropped = list(self._kept.items())
            self._kept.clear()
        for key, kept in dropped:
            call_hook(kept.processor, "close", key)

    def forget(self) -> None:
        """Drop every entry without a hook: in a forked child, the instances are the
        parent's (their hooks are the parent's to call)."""
        self._kept = {}
        self._lock = threading.RLock()
        self._watcher_pid = 0

    def _ensure_watcher(self) -> None:
        # One thread per process: a fork does not inherit the parent's thread.
        if self._poll_s <= 0 or self._watcher_pid == os.getpid():
            return
        self._watcher_pid = os.getpid()
        threading.Thread(target=self._watch, name="fogshift-hooks", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(self._poll_s)
            try:
                self.poll()
            except Exception:  # a broken gate file must not end the hooks of the others
                log.warning("polling the gates of kept processors failed", exc_info=True)


#: The registry of this process (a Spark Python worker, for the queries' processors).
INSTANCES = Instances()
os.register_at_fork(after_in_child=INSTANCES.forget)


def registry() -> Instances:
    """This process's registry.

    Code that Spark pickles *by value* (closures, classes defined in a function) must reach
    the registry through this function, which is pickled by reference: a reference to
    :data:`INSTANCES` itself would be pickled as a copy, a new empty registry every task.
    """
    return INSTANCES
