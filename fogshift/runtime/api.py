"""The developer API of a pipeline element (PE).

A PE declares its processing state as class attributes made with :func:`state`, the way the
thesis's ``@StateObject`` marks fields. fogshift then snapshots and restores it for free::

    class Counter(Processor):
        count: int = state(0)

        def process(self, event):
            self.count += 1
            return {"count": self.count}

The contract, after bytewax's ``snapshot()`` + ``builder(resume_state)``:

* state is never built in ``__init__``: :meth:`ProcessingElement.build` creates the instance
  and then calls :meth:`restore` with a snapshot, or with ``None`` for fresh defaults;
* :meth:`snapshot` returns a JSON-serialisable dict; override it together with
  :meth:`restore` for state that is not plain data;
* ``process`` must be deterministic: the same state and event give the same outputs, which
  is what makes re-executed batches, migration and restoration exact;
* an instance lives across micro-batches: the runtime builds one per query run (and
  partition) in the Spark Python worker that processes it and keeps it while it holds the
  state the next batch starts from (:mod:`fogshift.runtime.instances`). Load models and files
  in :meth:`ProcessingElement.on_assign`, release them in :meth:`ProcessingElement.close`;
  keep processing state only in declared fields (or :meth:`snapshot`), never in attributes
  the snapshot does not cover: an instance may be replaced by one built from the snapshot
  at any batch.

**Keyed PEs** (``key_by: FIELD`` in the spec) keep one state per value of that body field —
per patient, per sensor — in the state store, and move, checkpoint and restore with it. The
processor is still built once per query: before the events of one key, the runtime calls
:meth:`~ProcessingElement.restore` with that key's snapshot (``None`` for a key not seen yet)
and sets :attr:`~ProcessingElement.key`; after them it stores :meth:`snapshot` as that key's
state. So ``restore`` must replace *all* processing state, and events of one key never see
another key's state. Events of one key arrive in input order; across keys the runtime may
interleave them (outputs are still appended in input order).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel

from fogshift.events import Event
from fogshift.runtime.exceptions import BadState

_MISSING: Any = object()


class StateField:
    """A declared state field; see :func:`state`."""

    def __init__(
        self, default: Any, default_factory: Callable[[], Any] | None, added: bool = False
    ) -> None:
        self.default = default
        self.default_factory = default_factory
        self.added = added
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def fresh(self) -> Any:
        """The initial value of this field for a new PE instance."""
        if self.default_factory is not None:
            return self.default_factory()
        return copy.deepcopy(self.default)


def state(
    default: Any = _MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    added: bool = False,
) -> Any:
    """Declare a processing-state field of a PE class.

    Args:
        default: The initial value (deep-copied per instance).
        default_factory: Called for the initial value instead, e.g. ``list``.
        added: The field was added to the class after it had run: a snapshot taken before
            (a checkpoint, a key's stored state) lacks it and takes its initial value,
            rather than being refused (a running pipeline restored after an upgrade).
    """
    if default is _MISSING and default_factory is None:
        raise TypeError("state() needs a default or a default_factory")
    return StateField(None if default is _MISSING else default, default_factory, added)


#: How many Python frames deeper than its check a state must still read back at: an
#: event undone decodes the state deeper in the stack than a batch's end checks it, and
#: Python counts its frames and JSON's nesting against one limit. A state nested to just
#: under the limit at the check failed every undo from it (a RecursionError: the batch
#: failed at every retry).
STATE_DEPTH_MARGIN = 200


def _deeper(frames: int, read: Callable[[], Any]) -> Any:
    """``read()`` called ``frames`` Python frames deeper than here."""
    return read() if frames <= 0 else _deeper(frames - 1, read)


def encode_state(value: Any) -> str:
    """Canonical JSON text of (part of) a snapshot; NaN and infinities are refused, and so
    is a value that would not read back as it is (a tuple reads back as a list, an int key
    as text), or not :data:`STATE_DEPTH_MARGIN` frames deeper in the stack: the instance
    that holds it and one rebuilt from its text (after a dead letter, a restart, a move)
    would then go on differently, or not at all.

    Raises:
        ValueError: The value cannot be encoded, or would not read back equal.
    """
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    # Its types say whether it reads back as it is (no second parse of the text for it).
    _check_plain(value)
    if text.count("[") + text.count("{") > sys.getrecursionlimit() // 2:
        # (Fewer brackets cannot nest that deep: most states skip the margin's frames.)
        try:
            _deeper(STATE_DEPTH_MARGIN, lambda: json.loads(text))
        except RecursionError:
            raise ValueError(
                "it is nested too deep to be read back where an event is undone (keep state "
                "within a few hundred levels of lists and dicts)"
            ) from None
    return text


#: Why a tuple, or an object key that is not text, is refused.
_NOT_AS_IT_IS = (
    "it would not read back as it is: JSON has no tuples (they read back as lists) and its "
    "object keys are text (an int key reads back as a str)"
)


#: The types a state reads back as from its JSON text, exactly.
_PLAIN = (dict, list, str, int, float, bool, type(None))
_SCALARS = frozenset(_PLAIN[2:])


def _check_plain(value: Any) -> None:
    """Refuse a value that would not read back from its JSON text as it is: a tuple, an
    object key that is not text, and what reads back equal but not the same: a ``defaultdict``, a
    ``Counter``, numpy's scalars, an enum, or a list held twice within the value compare
    equal to what their text reads back as, but the instance holding them and one rebuilt
    from the text (after a dead letter, a restart, a move) go on differently: a
    ``defaultdict``'s missing key raised ``KeyError`` once rebuilt (every event after a
    dead letter dead-lettered), and ``round(np.float64(2.675), 2)`` is not
    ``round(2.675, 2)``. (Declared fields are encoded one by one: a list two fields share
    is not seen here.)

    Raises:
        ValueError: Such a value, with where it is and what it is.
    """
    seen: set[int] = set()
    # (Where each item is, as a chain of (parent, key) built as it goes: the path's text is
    # made only for a value refused — made for every item, it cost 0.17 s per 100,000.)
    stack: list[tuple[Any, Any]] = [(value, None)]
    while stack:
        item, where = stack.pop()
        kind = type(item)
        if kind is tuple or (kind is dict and not set(map(type, item)) <= {str}):
            raise ValueError(_NOT_AS_IT_IS)
        if kind not in _PLAIN:
            plain = next((t.__name__ for t in _PLAIN if isinstance(item, t)), None)
            raise ValueError(
                f"its value{_at(where)} is of type {kind.__name__}"
                + (f", which reads back as a plain {plain}" if plain else "")
                + ": keep state in dict, list, str, int, float, bool and None"
            )
        if kind is dict or kind is list:
            if id(item) in seen:
                raise ValueError(
                    f"its value{_at(where)} is held twice in it: it reads back as two "
                    "copies (a change to one would no longer change both)"
                )
            seen.add(id(item))
            values = item.values() if kind is dict else item
            if set(map(type, values)) <= _SCALARS:
                continue  # (most lists and dicts: no item of theirs walked one by one)
            pairs = item.items() if kind is dict else enumerate(item)
            stack.extend((v, (where, k)) for k, v in pairs if type(v) not in _SCALARS)


def _at(where: Any) -> str:
    """`` at ['a'][0]`` for the chain ``((None, 'a'), 0)``; ``""`` for the value itself."""
    keys = []
    while where is not None:
        where, key = where
        keys.append(f"[{key!r}]")
    return " at " + "".join(reversed(keys)) if keys else ""


class ProcessingElement:
    """Base of every PE implementation run by fogshift.

    Args:
        options: The element's validated options from the pipeline spec.
        element_id: The PE id in its pipeline.

    Lifecycle hooks (all optional), called by the runtime in the Spark Python worker that
    holds the instance, never concurrently with :meth:`Processor.process`: :meth:`on_assign`
    once per instance before its first event, :meth:`on_pause` / :meth:`on_resume` around a
    pause of its input (a migration), :meth:`on_revoke` when the PE leaves the node,
    :meth:`close` when the instance is dropped. Only ``on_assign`` is guaranteed (an
    exception from it fails the PE's start like a constructor's); the others are best
    effort: a Python worker that is killed (its node stops, Spark reaps an idle worker, a
    crash) calls nothing. What they raise is logged and otherwise ignored.
    """

    state_fields: ClassVar[dict[str, StateField]] = {}
    #: The pydantic model of the element's options; validated once, in the constructor.
    options_model: ClassVar[type[BaseModel] | None] = None
    #: A keyed PE's key field (its spec's ``key_by``), set by the runtime; ``None``: not keyed.
    key_by: str | None = None
    #: The key whose state the instance holds while it processes that key's events: the
    #: ``key_by`` field's value as text (a string as is, a number as JSON writes it).
    key: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, StateField] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, StateField):
                    fields[name] = value
        cls.state_fields = fields

    def __init__(self, options: Mapping[str, Any], element_id: str = "") -> None:
        self.options = dict(options)
        self.element_id = element_id
        self.config: Any = (
            self.options_model.model_validate(self.options) if self.options_model else None
        )

    @classmethod
    def build(
        cls, options: Mapping[str, Any], element_id: str, resume_state: Mapping[str, Any] | None
    ) -> Self:
        """Create an instance and give it its state: ``resume_state`` or fresh defaults."""
        instance = cls(options, element_id)
        instance.restore(resume_state)
        return instance

    @classmethod
    def is_stateful(cls) -> bool:
        """Whether the PE has processing state (declared fields or its own snapshot)."""
        return bool(cls.state_fields) or cls.snapshot is not ProcessingElement.snapshot

    @classmethod
    def state_parts(cls) -> list[str] | None:
        """The parts the runtime stores separately (declared fields), or ``None`` when the
        class has its own :meth:`snapshot`, whose result is stored as one blob."""
        if cls.snapshot is not ProcessingElement.snapshot:
            return None
        return list(cls.state_fields)

    @classmethod
    def added_parts(cls) -> frozenset[str]:
        """The declared fields added to the class since it ran (``state(added=True)``): a
        checkpoint written before lacks them."""
        return frozenset(n for n, f in cls.state_fields.items() if f.added)

    def snapshot(self) -> dict[str, Any]:
        """The processing state as a JSON-serialisable dict. Called once per batch."""
        return {name: getattr(self, name) for name in self.state_fields}

    def restore(self, snapshot: Mapping[str, Any] | None) -> None:
        """Set the processing state from ``snapshot`` (``None``: fresh defaults).

        Raises:
            BadState: The snapshot lacks a declared field (but one declared ``added``) or
                has unknown ones.
        """
        if snapshot is None:
            for name, declared in self.state_fields.items():
                setattr(self, name, declared.fresh())
            return
        expected, received = set(self.state_fields), set(snapshot)
        added = {n for n in expected - received if self.state_fields[n].added}
        if expected - added != received:
            raise BadState(
                f"state for PE {self.element_id!r} ({type(self).__name__}) does not match "
                "its declared fields",
                expected=", ".join(sorted(expected)) or "no fields",
                received=", ".join(sorted(received)) or "no fields",
                hint="was the snapshot taken from another version of this PE class?",
            )
        for name, declared in self.state_fields.items():
            setattr(self, name, declared.fresh() if name in added else snapshot[name])

    def dump_state(self) -> str:
        """The snapshot as JSON text (strict: NaN and infinities are refused)."""
        return encode_state(self.snapshot())

    def on_assign(self) -> None:
        """Set up the instance on the node, after :meth:`build` and before its first event.

        Called once on every instance the runtime builds to process events: once per start
        of the PE's query in the normal run, and again for each instance built from the
        stored state instead of reusing the kept one (a retried batch, a restored or
        migrated checkpoint, a worker that did not run the previous batch, an event undone
        by per-event isolation). Never called on the probe instance the driver builds to
        check the options. The place to load a model or open a file.

        Raises:
            Exception: Anything: the PE cannot be set up; it fails like a constructor that
                rejects its options (state ``failed`` after bounded restarts).
        """

    def on_revoke(self) -> None:
        """Called when the PE leaves the node: its query was stopped by the agent (the
        origin of a migration, a removed pipeline), within ~0.1 s of the stop; followed by
        :meth:`close`. Not called when the query is merely restarted here. Best effort."""

    def on_pause(self) -> None:
        """Called when the PE's input is held (``hold`` gate: a migration's pause), once the
        batch in flight has finished, within ~0.1 s of the gate. A pause shorter than that
        may go unseen, and then so does its resume. Best effort."""

    def on_resume(self) -> None:
        """Called when the input is open again after :meth:`on_pause`; always before the
        next event this instance processes."""

    def close(self) -> None:
        """Called once when the runtime drops the instance: after :meth:`on_revoke`, when
        a newer one replaces it (restart, rebuilt state) or after a failed batch. Best
        effort: not called in a Python worker that is killed."""


ProcessorOutput = Event | Mapping[str, Any] | Iterable[Event | Mapping[str, Any]] | None


class Processor(ProcessingElement):
    """A PE between a source and a sink: events in, events out.

    Whatever ``process`` does for one event — raise any exception, return an output that
    cannot be encoded or is too big — that event goes to the dead letter with the reason and
    the state is restored as if it had never arrived (see :mod:`fogshift.runtime.batch`);
    restoring it means rebuilding from the batch's last good snapshot, which costs in
    proportion to the state.
    """

    #: ``True`` promises that ``process`` raises ``DeadLetter`` only before it changes
    #: any state, so the runtime need not restore the state for those events (cheap dead
    #: letters with a large state). Any other failure is still undone.
    dead_letters_change_nothing: ClassVar[bool] = False

    def process(self, event: Event) -> ProcessorOutput:
        """Process one event; called in input order, once per event per batch execution.

        Returns:
            ``None`` for no output, a body dict for one output event with the input's ``seq``
            and ``timestamp``, an :class:`Event`, or an iterable of those.

        Raises:
            DeadLetter: The event is invalid; it goes to the dead letter with the reason.
                Any other :class:`Exception` does too, the reason naming its type; either
                way the state changes made for this event are undone.
        """
        raise NotImplementedError
