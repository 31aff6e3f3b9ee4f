"""Turning a pipeline element into a running Structured Streaming query.

* source (``csv-source``): CSV data source → JetStream writer;
* processor: JetStream reader → the processor → JetStream writer. A stateful processor runs
  in ``transformWithStateInPandas`` with its snapshot in ``ValueState`` s (RocksDB state
  store), so its state is versioned with Spark's checkpoint — one grouping key for the whole
  PE, or, for a keyed PE (``key_by``), one per value of its key field, each key's snapshot
  under its own key; a stateless one in ``mapInPandas``;
* sink (``csv-sink``): JetStream reader → exactly-once CSV writer.

Every query has a single partition end to end: a PE's events keep their order.

A processor is built once per query run and partition in the Python worker that runs it, and
kept across micro-batches while it provably holds the state the next batch starts from
(:mod:`fogshift.runtime.instances`); every instance the runtime builds gets ``on_assign``
before its first event and ``close`` when it is dropped.

What one event does never stops a query (see :mod:`fogshift.runtime.batch`). What no event
does — a processor class that cannot be imported, a constructor, options or ``restore()``
that fail — raises :class:`~fogshift.runtime.exceptions.ElementError` naming the pipeline and
PE: in the driver, from :func:`start_query`, for what can be checked there (import,
constructor, options); else in the first batch (``restore()`` of the stored state). The node
agent knows such a failure by that type and restarts it only a bounded number of times.
"""

from __future__ import annotations

import functools
import json
import reprlib
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fogshift.broker.datasource import EVENT_SCHEMA, RECORD_SCHEMA
from fogshift.broker.keys import (
    CONTROL_FIELD,
    KEY_COPY_IN,
    KEY_COPY_OUT,
    KEY_INDEX,
    KEY_MOVE_IN,
    KEY_MOVE_OUT,
    KEY_STATE,
    KeyState,
    key_refusal,
)
from fogshift.checkpoint import key_index
from fogshift.events import (
    DEFAULT_EVENT_TIMEOUT_S,
    DEFAULT_MAX_RECORD_BYTES,
    NOT_AN_EVENT,
    NOT_AN_EVENT_WHY,
)
from fogshift.exceptions import InvariantViolation
from fogshift.runtime import crashes
from fogshift.runtime.api import Processor, encode_state
from fogshift.runtime.batch import (
    RECORD_COLUMNS,
    dead_letter,
    input_rows,
    raised_at,
    run_batch,
    run_events,
    split_refused,
    unkeyed_dead_letters,
)
from fogshift.runtime.crashes import watch_for
from fogshift.runtime.exceptions import ElementError
from fogshift.runtime.gate import start_run
from fogshift.runtime.instances import InstanceKey, call_hook, registry
from fogshift.runtime.key_parts import IMMUTABLE_STATE, KeyParts, state_digest
from fogshift.runtime.kinds import processor_for
from fogshift.spec.kinds import WindowAggregateOptions
from fogshift.spec.models import ElementSpec, WindowAggregateElement, runs_on_jvm

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery


#: With trigger 0, how long a reader waits for input before Spark asks again (see
#: ``JetStreamReader.latestOffset``): idle, a query then costs a call every ~0.1 s instead
#: of one every 10 ms (Spark's polling delay), ~11 % of a core each on the 2-core machine.
IDLE_WAIT_MS = 100

#: The grouping column of a stateful PE's query, and how its values read: a keyed PE's
#: key is :data:`KEY_PREFIX` + the ``key_by`` field's value as text; events whose field is
#: missing or null (or whose body is not JSON) share :data:`NO_KEY`, which no key can equal.
GROUP_COLUMN = "pe_key"
KEY_PREFIX = "k:"
NO_KEY = "none"
#: The one state part of a processor with its own ``snapshot()`` (declared fields are
#: stored one part per field; see :func:`_stateful_processor`).
OPAQUE_PART = "__snapshot__"
#: ``creator`` of the rows of a movable partition that are not events (see ``_moving``).
CONTROL_CREATORS = (KEY_MOVE_OUT, KEY_MOVE_IN, KEY_STATE, KEY_COPY_OUT, KEY_COPY_IN)
#: An event held for a key moving in until its state comes (one element of the
#: ``held_events`` ListState, :func:`_stateful_processor`): its input row as is.
HELD_EVENT_SCHEMA = "origin long, seq long, at double, creator string, body string"


@dataclass(frozen=True)
class QueryPlan:
    """What a node needs to run one PE.

    Attributes:
        pipeline: The pipeline id.
        element: The element's spec (paths already absolute).
        broker_file: The node's broker file.
        checkpoint_dir: The query's checkpoint location on the node's disk.
        trigger_ms: The micro-batch trigger interval; 0 starts the next batch as soon as the
            previous one ended and input is there.
        gate_file: The gate of the query's input (pause/resume, see ``runtime.gate``).
        epoch: The epoch this instance writes under (fencing).
        max_record_bytes: The largest record the PE may append (encoded, without headers);
            an output over it is a dead letter instead of an append the broker refuses.
        location: The path Spark is given for ``checkpoint_dir``: a link to it made for this
            start alone (see :mod:`fogshift.checkpoint.locations`); empty: the folder itself.
    """

    pipeline: str
    element: ElementSpec
    broker_file: str
    checkpoint_dir: str
    trigger_ms: int = 200
    gate_file: str = ""
    epoch: int = 0
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    location: str = ""

    @property
    def query_name(self) -> str:
        return f"{self.pipeline}.{self.element.id}"


def _read_inputs(spark: SparkSession, plan: QueryPlan, max_events: int = 10_000) -> DataFrame:
    return (
        spark.readStream.format("fogshift-jetstream")
        .option("broker", plan.broker_file)
        .option("pipeline", plan.pipeline)
        .option("pe", plan.element.id)
        .option("epoch", str(plan.epoch))
        .option("inputs", ",".join(plan.element.inputs))
        .option("max_events_per_batch", str(max_events))
        .option("gate", plan.gate_file)
        # Triggered continuously, the reader waits for input instead of being polled.
        .option("idle_wait_ms", str(IDLE_WAIT_MS if plan.trigger_ms == 0 else 0))
        .option("partition", _movable(plan.element))
        .option("since", _since(plan.element))
        .option("merged", ";".join("|".join(group) for group in plan.element.merged))
        .option("key_by", plan.element.key_by or "")
        .schema(EVENT_SCHEMA)
        .load()
    )


def _since(element: ElementSpec) -> str:
    """Where a partition added by ``fogshift scale`` starts reading: one position, or with
    several inputs each input's as JSON (``0``: from the start)."""
    since = element.partition.since if element.partition is not None else 0
    return json.dumps(since) if isinstance(since, dict) else str(since)


def _movable(element: ElementSpec) -> str:
    """``element:index:count`` for a partition whose keys can move (its inputs are not
    partitioned: the reader keeps its keys and places the moves in each input, see
    :mod:`fogshift.broker.keys`), else ``""``.
    ``count`` is the one ownership starts from (scale records in the input change it)."""
    part = element.partition
    if part is None or not element.moves_keys:
        return ""
    return f"{part.of}:{part.index}:{part.first_count}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _processor_class(
    pipeline: str, pe: str, kind: str, options: dict[str, Any]
) -> tuple[type[Processor], dict[str, Any]]:
    """The processor class and its options, or an ElementError naming pipeline and PE."""
    try:
        return processor_for(kind, options)
    except ElementError as exc:
        raise ElementError(
            f"PE {pe!r} of pipeline {pipeline!r}: {exc.message}",
            expected=exc.expected,
            received=exc.received,
            hint=exc.hint,
        ) from exc


def _build(
    pipeline: str,
    pe: str,
    cls: type[Processor],
    options: dict[str, Any],
    resume: Any,
) -> Processor:
    """``cls.build``; whatever it raises is an ElementError (nothing an event did)."""
    try:
        return cls.build(options, pe, resume)
    except (Exception, SystemExit) as exc:  # (sys.exit() there ended the agent's monitor)
        what = "from its stored state" if resume is not None else "with its options"
        raise ElementError(
            f"processor {pe!r} ({cls.__name__}) of pipeline {pipeline!r} cannot be built "
            f"{what}: {raised_at(exc)}",
            hint="check the element's options, and that its constructor and restore() accept "
            "them" + (" and the state its snapshot() stored" if resume is not None else ""),
        ) from exc


def _assign(pipeline: str, pe: str, processor: Processor) -> Processor:
    """``on_assign()`` of a new instance; what it raises is an ElementError (set-up failed)."""
    try:
        processor.on_assign()
    except (Exception, SystemExit) as exc:
        call_hook(processor, "close", f"processor {pe!r} of pipeline {pipeline!r}")
        raise ElementError(
            f"processor {pe!r} ({type(processor).__name__}) of pipeline {pipeline!r} cannot be "
            f"set up: on_assign() raised {raised_at(exc)}",
            hint="check what on_assign() loads (files, models) on the node",
        ) from exc
    return processor


def _drop(instances: list[Processor], keep: Processor | None, key: InstanceKey) -> None:
    """``close()`` every instance a batch used or built, except the one kept."""
    for instance in instances:
        if instance is not keep:
            call_hook(instance, "close", key)


#: How long the driver's check of a processor (:func:`check_processor`: its module's import,
#: its constructor and ``close()``) may take before its start fails.
PROBE_TIMEOUT_S = 30.0


def check_processor(plan: QueryPlan, timeout_s: float = PROBE_TIMEOUT_S) -> type[Processor]:
    """Import and build the processor of ``plan`` once, in the driver.

    A PE that cannot be built at all then fails at its start with a clear error, instead of
    in a Python worker, batch after batch. The instance is closed at once; it is never
    assigned (``on_assign`` runs only where events are processed).

    The check runs in a thread of its own, waited for ``timeout_s`` at most: user code (a
    module's import, a constructor) that never returns would otherwise hold the caller — the
    agent's only Spark thread and its lock, so every other PE's supervision, deploy and
    removal on the node — for good. One that does not return in time is left running there,
    and the start fails as for a constructor that raised.

    Raises:
        ElementError: The class cannot be imported, its constructor rejects the options, or
            the two did not return within ``timeout_s``.
    """
    done: list[type[Processor] | BaseException] = []

    def probe() -> None:
        try:
            done.append(_probe(plan))
        except BaseException as exc:  # handed to the caller's thread
            done.append(exc)

    thread = threading.Thread(target=probe, name=f"probe {plan.query_name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not done:
        element = plan.element
        raise ElementError(
            f"processor {element.id!r} of pipeline {plan.pipeline!r}: importing and building "
            f"it did not return within {timeout_s:g} s",
            expected=f"its module's import and its constructor done within {timeout_s:g} s",
            received=f"still running after {timeout_s:g} s",
            hint="a constructor checks the options only: load models and files, and open "
            "connections, in on_assign()",
        )
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def _probe(plan: QueryPlan) -> type[Processor]:
    """:func:`check_processor`'s work, in its own thread."""
    element = plan.element
    cls, opts = _processor_class(plan.pipeline, element.id, element.kind, dict(element.options))
    probe = _build(plan.pipeline, element.id, cls, opts, None)
    try:
        _check_defaults(plan, cls, probe)
    finally:
        call_hook(probe, "close", plan.query_name)
    if element.key_by is not None and not cls.is_stateful():
        raise ElementError(
            f"PE {element.id!r} of pipeline {plan.pipeline!r} has key_by: {element.key_by} but "
            f"its processor {cls.__name__} declares no state",
            expected="a processor with state (state() fields or snapshot()) when key_by is set",
            received=f"{cls.__module__}.{cls.__qualname__}, stateless",
            hint="remove key_by, or declare the state to keep per key",
        )
    return cls


def _check_defaults(plan: QueryPlan, cls: type[Processor], probe: Processor) -> None:
    """Refuse a processor whose declared state fields' fresh values cannot be stored as they
    are (a ``defaultdict``, a ``Counter``, numpy's numbers): every event would otherwise be
    a dead letter for it (:func:`encode_state`). A class with its own ``snapshot()`` is
    checked at its first batch (its snapshot may need ``on_assign()``).

    Raises:
        ElementError: Such a field, what it holds and what would do.
    """
    if cls.state_parts() is None:
        return
    for name in cls.state_fields:
        value = getattr(probe, name)
        try:
            encode_state(value)
        except (TypeError, ValueError) as exc:
            raise ElementError(
                f"processor {plan.element.id!r} ({cls.__name__}) of pipeline "
                f"{plan.pipeline!r}: its state field {name!r} cannot be stored as it is: {exc}",
                expected="state fields of JSON's types: dict, list, str, int, float, bool, None",
                received=f"{name} = {type(value).__name__} ({reprlib.repr(value)})",
                hint="e.g. state(default_factory=dict) and counts.get(key, 0) + 1 for a "
                "defaultdict(int); float(x) for numpy's numbers",
            ) from None


def _partition() -> str:
    """The Spark partition this task processes (``0`` outside a task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return str(context.partitionId()) if context is not None else "0"


def _stateless(  # type: ignore[no-untyped-def]
    kind: str,
    options: dict[str, Any],
    pipeline: str,
    pe: str,
    limit: int,
    run: str,
    gate: str,
    event_timeout_s: float = DEFAULT_EVENT_TIMEOUT_S,
):
    """A ``mapInPandas`` function running a stateless processor (must be picklable).

    The processor is kept across batches in the worker's registry (reached through
    :func:`~fogshift.runtime.instances.registry`, never a pickled copy).
    """

    def run_frames(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        key = InstanceKey(pipeline, pe, run, _partition())
        processor = registry().checkout(key, None)
        if processor is None:
            cls, opts = _processor_class(pipeline, pe, kind, options)
            processor = _assign(pipeline, pe, _build(pipeline, pe, cls, opts, None))
        try:
            for frame in frames:
                rows = input_rows([frame])
                out = list(
                    run_events(
                        processor, rows,
                        max_record_bytes=limit, event_timeout_s=event_timeout_s,
                        watch=watch_for(gate, run),
                    )
                )  # fmt: skip
                if out:
                    yield pd.DataFrame(out, columns=RECORD_COLUMNS)
        except BaseException:
            _drop([processor], None, key)
            raise
        registry().keep(key, processor, None, gate)

    return run_frames


def _stateful_processor(  # type: ignore[no-untyped-def]
    kind: str,
    options: dict[str, Any],
    pipeline: str,
    pe: str,
    limit: int,
    run: str,
    gate: str,
    event_timeout_s: float = DEFAULT_EVENT_TIMEOUT_S,
    key_by: str | None = None,
    movable: bool = False,
):
    """A ``StatefulProcessor`` keeping the PE's snapshot in the state store.

    Each declared state field is a ValueState of its own, written only when its JSON text
    changed: a PE with a large, rarely changing field pays for it once, not every batch.
    The processor instance is kept in the worker across batches, and reused for a batch only
    if the texts it encoded at the end of its last batch equal the stored ones (see
    :mod:`fogshift.runtime.instances`); otherwise it is built from the stored texts.

    A large field costs nothing in a batch that leaves it as it was (issue #13: 50 MiB of
    state made every batch take seconds). Beside the texts, an unkeyed PE stores their
    digests (``marks``, a few bytes each): a batch reads those, and reads the texts
    themselves only if they differ from the digests its kept instance holds (a restart,
    a retried batch, another worker). A field whose value is still the very immutable object
    encoded at the end of the last batch (a ``str``, a number) is not encoded again.
    Events are isolated (:func:`~fogshift.runtime.batch.run_batch`): to undo a failed
    event, the processor is rebuilt from the batch's last good state.

    With ``key_by`` the grouping key is the event's key, and one processor instance serves
    every key of the query: built and assigned once, then given each key's stored state
    with ``restore()`` before that key's events (see :mod:`fogshift.runtime.api`). Its
    large parts, unchanged, cost a batch nothing either: the worker keeps them, checked
    against digests stored beside them (``part_marks``, :mod:`fogshift.runtime.key_parts`).

    With ``movable`` (a partition whose keys can move, :mod:`fogshift.broker.keys`), a key's
    rows may also be its move out (its stored state becomes a ``key-state`` record and is
    cleared), its move in (its events are held from there on: the move in a ``held``
    ValueState, the events appended to a ``held_events`` ListState, never rewritten)
    and its state arriving (installed, then the held events processed, their outputs at the
    state's place in the input). A precopied move adds two: a copy out (the stored state
    sent as a copy, its parts' digests kept in ``copied``; the key stays) and a copy in (the
    copy kept in ``shadow``, out of the key's state, until the move's state completes it).
    """
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    opaque_part = OPAQUE_PART

    class SnapshotProcessor(StatefulProcessor):
        def init(self, handle) -> None:  # type: ignore[no-untyped-def]
            self.cls, self.opts = _processor_class(pipeline, pe, kind, options)
            self.parts = self.cls.state_parts()
            names = self.parts if self.parts is not None else [opaque_part]
            # A keyed PE's writes to the variables a key listing reads are noted per key
            # (checkpoint.key_index); ``written`` holds the current key's.
            self.written: dict[str, int | None] = {}
            noted = key_by is not None
            self.values = {
                n: _noted(handle.getValueState(f"f_{n}", "json string"), f"f_{n}",
                          self.written, noted)
                for n in names
            }  # fmt: skip
            self.held = (
                _noted(handle.getValueState("held", "json string"), "held", self.written, noted)
                if movable
                else None
            )
            self.held_events = (
                handle.getListState("held_events", HELD_EVENT_SCHEMA) if movable else None
            )
            self.copied = handle.getValueState("copied", "json string") if movable else None
            self.shadow = handle.getValueState("shadow", "json string") if movable else None
            unkeyed = key_by is None
            self.marks = handle.getValueState("marks", "json string") if unkeyed else None
            # A keyed PE's: the digests of each key's large parts (runtime.key_parts).
            self.part_marks = None if unkeyed else handle.getValueState("part_marks", "json string")
            #: A keyed PE's instance for this batch's keys: taken from the registry at its
            #: first key, put back at its end (:meth:`close`) — put back after each key, it
            #: sat in the registry between keys, where a gate written meanwhile had its
            #: on_pause() and on_resume() called in the middle of the batch.
            self.shared: Processor | None = None

        def _stored(self) -> dict[str, str]:
            """The current grouping key's stored state texts, by part (one call to the
            state server per part: ``get()`` answers ``None`` for a part never stored)."""
            got = {n: v.get() for n, v in self.values.items()}
            return {n: value[0] for n, value in got.items() if value is not None}

        def _decoded(self, stored: dict[str, str], parts: KeyParts | None = None) -> Any:
            """The resume state of stored texts (``None``: nothing stored, fresh); with a
            keyed PE's ``parts``, their kept values where they may be used."""
            if not stored:
                return None
            decoded = (
                parts.decoded(stored) if parts is not None
                else {n: json.loads(text) for n, text in stored.items()}
            )  # fmt: skip
            return decoded if self.parts is not None else decoded[opaque_part]

        def _texts(
            self, processor: Processor, encoded: dict[str, tuple[Any, str]] | None = None
        ) -> dict[str, str]:
            """The processor's snapshot as texts, by part.

            Args:
                encoded: Earlier encodings, part -> (value, text): a part whose value is
                    that very object, immutable, takes that text (equal by construction).
                    Updated with this snapshot's immutable values.
            """
            snapshot = processor.snapshot()
            values = {opaque_part: snapshot} if self.parts is None else snapshot
            names = self.parts if self.parts is not None else [opaque_part]
            texts = {}
            for name in names:
                value = values[name]
                earlier = encoded.get(name) if encoded is not None else None
                if earlier is not None and earlier[0] is value:
                    texts[name] = earlier[1]
                    continue
                texts[name] = encode_state(value)
                if encoded is not None:
                    if isinstance(value, IMMUTABLE_STATE):
                        encoded[name] = (value, texts[name])
                    else:
                        encoded.pop(name, None)
            return texts

        def _read_marks(self) -> dict[str, str] | None:
            """The digests stored with the current key's texts (``None``: none yet)."""
            assert self.marks is not None
            saved = self.marks.get()
            return json.loads(saved[0]) if saved is not None else None

        def _store_marks(
            self, before: dict[str, str] | None, changed: set[str], fresh: dict[str, str]
        ) -> dict[str, str]:
            """Store the digests of ``fresh`` and return them: a part not ``changed`` keeps
            the digest stored with it (``before``), the others are computed."""
            assert self.marks is not None
            kept = before or {}
            marks = {
                name: kept[name] if name in kept and name not in changed else state_digest(text)
                for name, text in fresh.items()
            }
            if marks != before:
                self.marks.update((json.dumps(marks),))
            return marks

        def _store(self, stored: dict[str, str], fresh: dict[str, str]) -> set[str]:
            """Write the parts whose text changed; return their names."""
            changed = {name for name, text in fresh.items() if stored.get(name) != text}
            for name in changed:
                self.values[name].update((fresh[name],))
            return changed

        def handleInputRows(self, key, rows, timerValues):  # type: ignore[no-untyped-def]  # noqa: N802, N803
            import pandas as pd

            tuples = input_rows(rows)
            if key_by is not None:
                yield from self._keyed(str(key[0]), tuples)
                return
            instance = InstanceKey(pipeline, pe, run, repr(key))
            before = self._read_marks()
            known, encoded = registry().marked(instance, before)
            stored = dict(known) if known is not None else self._stored()
            live = registry().checkout(instance, known if known is not None else stored)
            # Every instance this batch uses: the ones not kept at its end are closed.
            used: list[Processor] = [live] if live is not None else []

            def build(resume: Any) -> Processor:
                # The instance before it is never used again (an event undone is rebuilt
                # from the known-good state): closed first, not at the batch's end — K
                # dead letters held K + 1 instances and what their on_assign() loaded at
                # once, and one holding a lock failed its successor's on_assign().
                _drop(used, None, instance)
                used.clear()
                processor = _assign(pipeline, pe, _build(pipeline, pe, self.cls, self.opts,
                                                         resume))  # fmt: skip
                used.append(processor)  # (not before: _assign closes one that fails)
                return processor

            def finish(processor: Processor) -> tuple[dict[str, str], Processor]:
                return self._texts(processor, encoded), processor

            try:
                out, (fresh, final) = run_batch(
                    build,
                    lambda: self._decoded(stored),
                    tuples,
                    finish=finish,
                    pe=pe,
                    pipeline=pipeline,
                    max_record_bytes=limit,
                    live=live,
                    event_timeout_s=event_timeout_s,
                    watch=watch_for(gate, run),
                )
                marks = self._store_marks(before, self._store(stored, fresh), fresh)
            except BaseException:
                _drop(used, None, instance)
                raise
            _drop(used, final, instance)
            # Kept with the texts just stored: the next batch reuses it only if its stored
            # texts are these (not if this batch is retried, or an older checkpoint restored).
            registry().keep(instance, final, fresh, gate, marks=marks, encoded=encoded)
            if out:
                yield pd.DataFrame(out, columns=RECORD_COLUMNS)

        def _keyed(self, group: str, tuples: Any) -> Iterator[pd.DataFrame]:
            """One key's events of a keyed PE, on the query's one shared instance."""
            import pandas as pd

            assert key_by is not None
            if not group.startswith(KEY_PREFIX):  # NO_KEY: the events have no key
                out = unkeyed_dead_letters(tuples, pe, key_by, limit)
                yield pd.DataFrame(out, columns=RECORD_COLUMNS)
                return
            value = group[len(KEY_PREFIX) :]
            # An event whose key has no one text (a float, a repeated field) would be routed
            # by one and kept under another: never processed (broker.keys.key_refusal).
            tuples, refused = split_refused(
                tuples,
                pe,
                lambda row: None if row[3] in CONTROL_CREATORS
                else key_refusal(row[4], key_by, value, pe),
                limit,
            )  # fmt: skip
            self.written.clear()
            # Holds no state between keys (each key's is restored into it): any instance
            # of this run will do, like a stateless processor's.
            instance = InstanceKey(pipeline, pe, run, "keyed")
            shared = self.shared if self.shared is not None else registry().checkout(instance, None)
            if shared is None:
                shared = _build(pipeline, pe, self.cls, self.opts, None)
                shared.key_by = key_by
                shared = _assign(pipeline, pe, shared)
            self.shared = shared

            parts = KeyParts(self.values, self.part_marks, (pipeline, pe, run), value,
                             f"PE {pe!r} of pipeline {pipeline!r}")  # fmt: skip

            def build(resume: Any) -> Processor:
                shared.key = value
                try:
                    shared.restore(resume)
                except Exception as exc:
                    raise ElementError(
                        f"processor {pe!r} ({self.cls.__name__}) of pipeline {pipeline!r} "
                        f"cannot take the stored state of key {value!r}: {_describe(exc)}",
                        hint="restore() must accept what snapshot() returned, and None",
                    ) from exc
                return shared

            def process(rows: Any, before: dict[str, str]) -> tuple[list[Any], dict[str, str]]:
                # (A large part kept in the worker, unchanged, is neither decoded nor
                # encoded: the very value restored comes back from snapshot().)
                encoded: dict[str, tuple[Any, str]] = {}

                def finish(processor: Processor) -> dict[str, str]:
                    encoded.clear()
                    encoded.update(parts.encoded())
                    return self._texts(processor, encoded)

                got, fresh = run_batch(
                    build, lambda: self._decoded(before, parts),
                    rows, finish=finish, pe=pe,
                    pipeline=pipeline, max_record_bytes=limit, event_timeout_s=event_timeout_s,
                    watch=watch_for(gate, run),
                )  # fmt: skip
                if not before and sum(r[6] is not None for r in got) == len(rows):
                    # Every event was a dead letter: the key is as before them, which is no
                    # state at all (storing the fresh one let bad events of random keys
                    # grow the store, and list keys that never had an event processed).
                    return got, before
                parts.store(before, fresh, encoded)
                return got, fresh

            def refusal(state: dict[str, str]) -> str | None:
                """Why ``state`` (a moved key's) cannot be taken, ``None`` if it can: the
                processor's ``restore()`` refuses it, or the processor restored from it
                cannot store it again (every batch of the key would then fail with no
                event to blame: a state from other code, say)."""
                try:
                    restored = build(self._decoded(state))
                except Exception as exc:  # ElementError, or a text that is no JSON
                    return str(exc) if isinstance(exc, ElementError) else _describe(exc)
                try:
                    self._texts(restored)
                except Exception as exc:  # snapshot() raised, or gave what cannot be encoded
                    return (f"processor {pe!r} ({self.cls.__name__}) restored from it cannot "
                            f"store it again: its snapshot() fails ({_describe(exc)})")  # fmt: skip
                return None

            try:
                if self.held is None:
                    # (none left: the key's state is neither read nor made)
                    out = process(tuples, parts.read())[0] if tuples else []
                else:
                    out = self._moving(value, list(tuples), process, refusal, parts)
            except BaseException:
                self.shared = None
                _drop([shared], None, instance)
                raise
            shared.key = None
            out = [*refused, *out]
            if self.written:
                # What the key's stored state is now, for the key listing: never appended.
                note = json.dumps({"key": value, "vars": self.written})
                out.append((0, 0, 0, 0.0, KEY_INDEX, note, None))
            if out:
                yield pd.DataFrame(out, columns=RECORD_COLUMNS)

        def _moving(
            self, key: str, rows: list[Any], process: Any, refusal: Any, parts: KeyParts
        ) -> list[Any]:
            """One key's rows of a partition whose keys move: events, and its moves.

            The key's stored state is read only once something needs it: a key moving in,
            or whose state arrives, has none here (that saves a state call per part and
            key when hundreds of keys move at once).

            A state that arrives and that the processor's ``restore()`` refuses, or that
            the processor restored from it cannot store again (``refusal`` says why: its
            code differs from the origin's, say), is a dead letter, the whole
            state in it (cut, as any dead letter's body, beyond a record's size), and the
            key goes on as before it came, without state: one record never stops the
            partition (raised, it failed the batch at every retry)."""
            assert self.held is not None and self.held_events is not None
            out: list[Any] = []
            saved = self.held.get()
            held = json.loads(saved[0]) if saved is not None else None
            # Events held in earlier batches stay in the list store, appended to and never
            # rewritten: a key whose state is slow to come (its origin being restored, say)
            # holds thousands. (``events`` inline: as stored before the list was.)
            inline: list[Any] = held.pop("events", []) if held is not None else []
            fresh: list[Any] = []  # held in this batch, appended at its end
            dropped = False  # the events stored in the list are spent (or dropped)
            segment: list[Any] = []
            stored: dict[str, str] | None = None

            def current() -> dict[str, str]:
                nonlocal stored
                if stored is None:
                    stored = parts.read()
                return stored

            def flush() -> None:
                nonlocal stored
                if segment:
                    got, stored = process(list(segment), current())
                    out.extend(got)
                    segment.clear()

            for row in rows:
                creator = row[3]
                if creator not in CONTROL_CREATORS:
                    if held is not None:  # its state has not come yet: never processed
                        fresh.append((int(row[0]), int(row[1]), float(row[2]), str(creator),
                                      str(row[4])))  # fmt: skip
                    else:
                        segment.append(row)
                    continue
                flush()
                detail = json.loads(row[4])[CONTROL_FIELD]
                if creator == KEY_COPY_OUT:
                    # A copy ahead of a move: sent, and its parts' digests kept, so that
                    # the move sends only what changed since. The key stays here.
                    record = {"key": key, **detail, "state": current()}
                    out.append((int(row[0]), 0, 0, 0.0, KEY_STATE, json.dumps(record), None))
                    marks = {n: parts.digest(n, t) for n, t in current().items()}
                    self._copied().update((json.dumps({"copy": detail["move"], "marks": marks}),))
                elif creator == KEY_COPY_IN:
                    # Kept aside: the key is not this partition's until its move.
                    state = {n: t for n, t in detail["state"].items() if n in self.values}
                    kept = {"copy": detail["move"], "state": state}
                    self._shadow().update((json.dumps(kept),))
                elif creator == KEY_MOVE_OUT:
                    # The state as of the move, for the target; the writer sends it. (A key
                    # still waiting here for an earlier move's state cannot move on: the
                    # orchestrator refuses such a move, see orchestrator.keymoves.)
                    base = detail.pop("base", None)
                    now = current()
                    record = {"key": key, **detail, "state": now}
                    # (A move that names no copy leaves an older copy's digests be: a later
                    # move names its own copy. One state call less per key moved.)
                    sent = self._copied().get() if base is not None else None
                    copy = json.loads(sent[0]) if sent is not None else None
                    if copy is not None and copy["copy"] == base:
                        # Precopied: the parts as the copy had them are named, not sent.
                        keep = sorted(n for n, t in now.items()
                                      if copy["marks"].get(n) == parts.digest(n, t))  # fmt: skip
                        changed = {n: t for n, t in now.items() if n not in keep}
                        record.update(state=changed, base=base, keep=keep)
                    if sent is not None:
                        self._copied().clear()
                    out.append((int(row[0]), 0, 0, 0.0, KEY_STATE, json.dumps(record), None))
                    parts.clear()
                    stored = {}
                elif creator == KEY_MOVE_IN:
                    held, inline, fresh, dropped = {"move": detail["move"]}, [], [], True
                elif held is not None and detail["move"] == held["move"]:
                    # (The key's parts here were cleared when it last left, if it ever was.)
                    state = self._arrived(key, detail)
                    why = refusal(state)
                    if why is not None:
                        reason = (f"the state of key {key!r} that move {detail['move']} "
                                  f"brought to {pe!r} of pipeline {pipeline!r} is refused: "
                                  f"{why}; the key goes on without it")  # fmt: skip
                        # The whole state in it (a precopied move's row names only what
                        # changed since the copy, which is dropped with the state).
                        whole = {**detail, "state": state}
                        body = json.dumps({key_by: key, CONTROL_FIELD: whole})
                        out.append(dead_letter((*row[:4], body), pe, reason, limit))
                        state = {}
                    parts.install(state)
                    stored = state
                    before = [] if dropped else [tuple(e) for e in self.held_events.get()]
                    events = [*(tuple(e) for e in inline), *before, *fresh]
                    held, inline, fresh, dropped = None, [], [], True
                    got, stored = process(events, stored)
                    # Their outputs take the state's place in the input (origins grow),
                    # after its dead letter if it is one.
                    first = 0 if why is None else 1
                    out.extend((int(row[0]), first + n, *r[2:]) for n, r in enumerate(got))
                # Another key-state (a copy the origin sent again): already installed.
            flush()
            if dropped and saved is not None:
                self.held_events.clear()
            if held is not None:
                if inline or fresh:
                    self.held_events.appendList([*(tuple(e) for e in inline), *fresh])
                if saved is None or json.loads(saved[0]) != held:  # (a new move, or inline)
                    self.held.update((json.dumps(held),))
            elif saved is not None:
                self.held.clear()
            return out

        def _copied(self) -> Any:
            assert self.copied is not None
            return self.copied

        def _shadow(self) -> Any:
            assert self.shadow is not None
            return self.shadow

        def _arrived(self, key: str, detail: dict[str, Any]) -> dict[str, str]:
            """The whole state of ``key`` its move's state row (``detail``) gives: as sent,
            or (a precopied move) completed from the copy kept in ``shadow``, dropped then.

            Raises:
                InvariantViolation: The state completes a copy that is not here (the copy
                    is stored in the input before the move, so this partition read it).
            """
            # Only a precopied move's state reads the kept copy (one state call less per key
            # otherwise; a copy whose move never came stays until the key's next copy).
            saved = self._shadow().get() if detail.get("base") is not None else None
            kept = json.loads(saved[0]) if saved is not None else None
            # Parts this code does not declare are left out of the copy kept aside (and of
            # the state installed): a move that keeps one goes on without it, as a move
            # without a copy does (the origin ran other code: a redeploy between the two).
            keep = tuple(n for n in detail.get("keep") or () if n in self.values)
            sent = KeyState(0, detail["move"], pe, key, 0, detail["state"],
                            base=detail.get("base"), keep=keep)  # fmt: skip
            copied = kept["state"] if kept is not None and kept["copy"] == sent.base else None
            try:
                whole = sent.complete(copied)
            except ValueError as exc:
                raise InvariantViolation(
                    f"partition {pe!r} of pipeline {pipeline!r}: {exc}",
                    hint="a copy is stored in the input before its move; it can be missing "
                    "only if something other than the orchestrator appended to the input's "
                    ".keys subject, or a partition ran an older fogshift that knows no copies",
                ) from exc
            if saved is not None:
                self._shadow().clear()
            return {n: t for n, t in whole.items() if n in self.values}

        def close(self) -> None:
            # (Spark calls it once the partition's keys are done: a keyed PE's instance goes
            # back to the registry for the next batch, and its hooks.)
            shared, self.shared = getattr(self, "shared", None), None
            if shared is not None:
                registry().keep(InstanceKey(pipeline, pe, run, "keyed"), shared, None, gate)

    return SnapshotProcessor()


class _NotedValue:
    """A ``ValueState`` of one JSON text whose writes are noted: its variable's name to the
    text's length (``update``) or ``None`` (``clear``), in ``written``."""

    def __init__(self, state: Any, name: str, written: dict[str, int | None]) -> None:
        self._state = state
        self._name = name
        self._written = written

    def get(self) -> Any:
        return self._state.get()

    def update(self, value: tuple[str]) -> None:
        self._state.update(value)
        self._written[self._name] = len(value[0])

    def clear(self) -> None:
        self._state.clear()
        self._written[self._name] = None


def _noted(state: Any, name: str, written: dict[str, int | None], noted: bool) -> Any:
    """``state``, its writes noted in ``written`` if ``noted`` (a keyed PE's)."""
    return _NotedValue(state, name, written) if noted else state


def _key_group(key_by: str) -> Column:
    """A keyed PE's grouping key: :data:`KEY_PREFIX` + the ``key_by`` field's text as Spark
    reads it, :data:`NO_KEY` for an event without one."""
    from pyspark.sql import functions as F  # noqa: N812

    field = F.get_json_object("body", f"$.{key_by}")
    return F.when(field.isNull(), F.lit(NO_KEY)).otherwise(F.concat(F.lit(KEY_PREFIX), field))


def _jvm_window(spark: SparkSession, plan: QueryPlan, events: DataFrame) -> DataFrame:
    """``window-aggregate`` with ``engine: jvm``: fogshift's JVM operator over ``events``
    (``fogshift/runtime/java/WindowAggregate.java``; its outputs and dead letters are the
    Python processor's, ``tests/runtime/test_jvm_window.py``).

    Raises:
        ElementError: This environment has no fogshift JVM classes (no JDK at setup).
    """
    from fogshift.runtime.jvm_classes import jar_path

    element = plan.element
    assert isinstance(element, WindowAggregateElement)
    jar = jar_path()
    if not jar.is_file():
        raise ElementError(
            f"PE {element.id!r} of pipeline {plan.pipeline!r} runs with engine: jvm, and this "
            f"node has no fogshift JVM classes ({jar})",
            hint="install a JDK 17 (openjdk-17-jdk-headless) and run `make setup`, or "
            "deploy it with engine: python",
        )
    return jvm_window(
        spark, events, element.id, element.options, plan.max_record_bytes, element.key_by
    )


def jvm_window(
    spark: SparkSession,
    events: DataFrame,
    pe: str,
    options: WindowAggregateOptions,
    max_record_bytes: int,
    key_by: str | None = None,
) -> DataFrame:
    """The JVM operator of a ``window-aggregate`` named ``pe`` over ``events``: its output
    records (and, keyed, its key index notes). The session must have fogshift's JVM classes
    (``jvm_classes.jar_path()``; a node's warm-up runs it too).

    Args:
        events: Rows of ``EVENT_SCHEMA``; keyed, with their grouping key as a sixth column
            (:data:`GROUP_COLUMN`, as :func:`start_query` groups a keyed PE).
        key_by: The body field the PE is keyed by (``None``: one window).
    """
    from pyspark.sql import DataFrame as Frame

    operator = spark._jvm.fogshift.ops.WindowAggregate  # type: ignore[union-attr]
    processor = operator(
        pe, options.field, options.window, options.function, NOT_AN_EVENT, NOT_AN_EVENT_WHY,
        max_record_bytes, not_printable(),
    )  # fmt: skip
    if key_by is None:
        return Frame(operator.apply(events._jdf, processor), spark)
    processor = processor.keyedBy(key_by, NO_KEY, KEY_PREFIX, KEY_INDEX)
    return Frame(operator.applyKeyed(events._jdf, processor), spark)


@functools.cache
def not_printable() -> str:
    """The code points ``str.isprintable`` refuses in this Python, as ``"a-b,..."`` ranges in
    hex (~700, ~7 KB; 0.3 s once per process): the JVM engine writes ``repr`` texts by this
    Python's Unicode tables, not by the JVM's older ones."""
    ranges: list[str] = []
    start: int | None = None
    for code in range(sys.maxunicode + 1):
        if not chr(code).isprintable():
            if start is None:
                start = code
        elif start is not None:
            ranges.append(f"{start:x}-{code - 1:x}")
            start = None
    if start is not None:
        ranges.append(f"{start:x}-{sys.maxunicode:x}")
    return ",".join(ranges)


def start_query(spark: SparkSession, plan: QueryPlan) -> StreamingQuery:
    """Start the streaming query of one PE; it resumes from ``plan.checkpoint_dir`` if present."""
    element = plan.element
    options = dict(element.options)
    if element.kind == "ecg-source":
        frame = (
            spark.readStream.format("fogshift-ecg-source")
            .option("options", element.options.model_dump_json())
            .option("pe", element.id)
            .option("max_record_bytes", str(plan.max_record_bytes))
            .option("gate", plan.gate_file)
            .load()
        )
        writer = frame.writeStream.format("fogshift-jetstream")
    elif element.role == "source":
        frame = (
            spark.readStream.format("fogshift-csv-source")
            .option("path", options["path"])
            .option("pe", element.id)
            .option("rate", str(options.get("rate", 0)))
            .option("max_events_per_batch", str(options.get("max_events_per_batch", 10_000)))
            .option("max_record_bytes", str(plan.max_record_bytes))
            .option("gate", plan.gate_file)
            .load()
        )
        writer = frame.writeStream.format("fogshift-jetstream")
    elif element.role == "processor":
        from pyspark.sql import functions as F  # noqa: N812

        cls = check_processor(plan)
        events = _read_inputs(spark, plan)
        # A new run: processors kept by the workers for an earlier start are closed.
        run = start_run(plan.gate_file) if plan.gate_file else uuid.uuid4().hex
        if plan.gate_file:
            # Again, now that the run is this one's: a worker still in a batch of the run
            # before made its mark anew between the node's drop of them and the new token
            # (it checks the token; the old one stood until here), blamed later.
            crashes.prepare(crashes.folder_of(plan.gate_file))
        args = (
            element.kind,
            options,
            plan.pipeline,
            element.id,
            plan.max_record_bytes,
            run,
            plan.gate_file,
            element.event_timeout,
        )
        if runs_on_jvm(element):
            if element.key_by is not None:
                events = events.withColumn(GROUP_COLUMN, _key_group(element.key_by))
            out = _jvm_window(spark, plan, events)
        elif cls.is_stateful():
            if element.key_by is None:
                group = F.lit(element.id)
            else:
                field = F.get_json_object("body", f"$.{element.key_by}")
                group = _key_group(element.key_by)
                if element.partition is not None and not element.moves_keys:
                    # A partition reads every input event and keeps those of its keys (as
                    # spec.partition_of_key: CRC-32 of the key's text, keyless ones to 0).
                    # Its outputs' origins stay the input positions, so the filter changes
                    # nothing about exactly-once; it is evaluated in the JVM.
                    owner = F.when(field.isNull(), F.lit(0)).otherwise(
                        F.pmod(F.crc32(field.cast("binary")), F.lit(element.partition.count))
                    )
                    events = events.where(owner == F.lit(element.partition.index))
            out = (
                events.withColumn(GROUP_COLUMN, group)
                .groupBy(GROUP_COLUMN)
                .transformWithStateInPandas(
                    statefulProcessor=_stateful_processor(
                        *args, key_by=element.key_by, movable=element.moves_keys
                    ),
                    outputStructType=RECORD_SCHEMA,
                    outputMode="Append",
                    timeMode="None",
                )
            )
        else:
            out = events.mapInPandas(_stateless(*args), RECORD_SCHEMA)
        # (The limit fits a JVM operator's dead letters, which carry their input whole.)
        writer = (
            out.coalesce(1)
            .writeStream.format("fogshift-jetstream")
            .option("max_record_bytes", str(plan.max_record_bytes))
        )
        if cls.is_stateful() and element.key_by is not None:
            writer = writer.option("key_index", str(key_index.folder_of(Path(plan.checkpoint_dir))))
    else:
        writer = (
            _read_inputs(spark, plan)
            .writeStream.format("fogshift-csv-sink")
            .option("path", options["path"])
            .option("max_record_bytes", str(plan.max_record_bytes))
        )
        if options.get("fields") is not None:
            writer = writer.option("fields", json.dumps(list(options["fields"])))
    return (
        writer.option("broker", plan.broker_file)
        .option("pipeline", plan.pipeline)
        .option("pe", element.id)
        .option("epoch", str(plan.epoch))
        .option("partition", _movable(element))
        .option("checkpointLocation", plan.location or plan.checkpoint_dir)
        .queryName(plan.query_name)
        .outputMode("append")
        .trigger(processingTime=f"{plan.trigger_ms} milliseconds")
        .start()
    )
