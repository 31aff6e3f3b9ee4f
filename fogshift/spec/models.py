"""The pipeline spec models (frozen, validated).

An element is one member of a union discriminated by ``kind``: each built-in kind has its
element class, whose ``options`` are that kind's options model (:mod:`fogshift.spec.kinds`).
Validating a :class:`PipelineSpec` therefore validates every element's options, once; an
unknown ``kind`` is pydantic's ``union_tag_invalid`` error, which the loader words for people.
"""

from __future__ import annotations

import zlib
from graphlib import TopologicalSorter
from typing import Annotated, Any, ClassVar, Literal, Self, cast, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    SerializeAsAny,
    TypeAdapter,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from fogshift.common.names import KEY_FIELD_RE, NAME_RE
from fogshift.common.validation import Refusal
from fogshift.events import (
    DEFAULT_BATCH_TIMEOUT_S,
    DEFAULT_EVENT_TIMEOUT_S,
    MAX_BATCH_TIMEOUT_S,
    MAX_EVENT_TIMEOUT_S,
    MIN_BATCH_TIMEOUT_S,
    MIN_EVENT_TIMEOUT_S,
)
from fogshift.spec.kinds import (
    AmplifyOptions,
    BandpassOptions,
    ClassifyOptions,
    CsvSinkOptions,
    CsvSourceOptions,
    CustomOptions,
    EcgSourceOptions,
    FilterOptions,
    KindOptions,
    MapOptions,
    Role,
    WindowAggregateOptions,
)

_NAME = NAME_RE

#: The most partitions a keyed element may have (in a spec, and by `fogshift scale`).
MAX_PARTITIONS = 64
#: Body fields fogshift writes itself (a key move's control record): no ``key_by``.
RESERVED_FIELD_PREFIX = "fogshift_"


class Partition(BaseModel):
    """Which partition of a partitioned keyed PE an element is.

    Attributes:
        of: The id the spec gave the partitioned element (its partitions are ``<of>-p<i>``).
        index: This partition's number, from 0.
        count: How many partitions the element has; a key belongs to partition
            :func:`partition_of_key` of its text.
        base: How many it had when deployed, if ``fogshift scale`` changed that since
            (``None``: ``count``). Ownership starts from ``base`` at the input's start; each
            scale is a record in the input that changes it from its place on
            (:mod:`fogshift.broker.keys`), so every partition, old or new, agrees on the
            owner of every event.
        since: The input position this partition reads after: ``0``, or for a partition
            that ``scale`` added, where the input stood when it was placed, before the key
            moves of the scale's waves and its record (it owns nothing earlier); with
            several inputs, each input's position (:meth:`since_of`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    of: str = Field(pattern=_NAME)
    index: int = Field(ge=0)
    count: int = Field(ge=1)
    base: int | None = Field(default=None, ge=1)
    since: Annotated[int, Field(ge=0)] | dict[str, Annotated[int, Field(ge=0)]] = 0

    def since_of(self, name: str) -> int:
        """Where this partition starts reading its input ``name`` (see ``since``)."""
        return self.since if isinstance(self.since, int) else self.since.get(name, 0)

    @property
    def started_late(self) -> bool:
        """Whether this partition starts reading after the start of an input (``since``)."""
        return any(self.since.values()) if isinstance(self.since, dict) else self.since != 0

    @property
    def first_count(self) -> int:
        """The partition count ownership starts from at the input's start."""
        return self.base if self.base is not None else self.count


def partition_id(element_id: str, index: int) -> str:
    """The id of partition ``index`` of the partitioned element ``element_id``."""
    return f"{element_id}-p{index}"


def partitioned(partition: str, index: int) -> str:
    """The id of the partitioned element whose partition ``index`` is ``partition`` (the
    inverse of :func:`partition_id`).

    Raises:
        ValueError: ``partition`` is not the id of a partition ``index``.
    """
    suffix = f"-p{index}"
    if index < 0 or not partition.endswith(suffix) or len(partition) == len(suffix):
        raise ValueError(f"{partition!r} is not the id of a partition {index}")
    return partition[: -len(suffix)]


def partition_of_key(key: str | None, count: int) -> int:
    """The partition that owns ``key`` (a keyed PE's key text) among ``count``: CRC-32 of its
    UTF-8 bytes modulo ``count``, which Spark computes alike (``pmod(crc32(key), count)``), so
    the query's filter and the orchestrator's routing agree. Events without a key (``None``)
    belong to partition 0, which dead-letters them."""
    if key is None:
        return 0
    return zlib.crc32(key.encode("utf-8")) % count


class ElementSpec(BaseModel):
    """One pipeline element (PE): the fields every kind shares.

    Each kind subclasses it (:data:`KINDS`); constructing or validating an ``ElementSpec``
    gives an instance of the subclass its ``kind`` names, so code and tests may write
    ``ElementSpec(kind="map", ...)`` and fields may be typed ``ElementSpec``.

    Attributes:
        id: Unique in the pipeline; letters, digits, ``_`` and ``-``.
        kind: A key of :data:`KINDS`.
        node: The node that hosts it.
        inputs: The ids of the elements feeding it, in order.
        options: The kind's options (a model that also reads as a mapping).
        key_by: For a stateful processor: the body field whose value keys its state (one
            state per key, e.g. per patient), ``None`` for one state for the whole PE.
        partitions: For a keyed processor, instead of ``node``: the nodes of its partitions,
            one partition per entry. Each partition is a PE of its own, ``<id>-p<i>``, that
            owns the keys :func:`partition_of_key` gives it; elements naming ``<id>`` as an
            input read every partition. :class:`PipelineSpec` replaces such an element by
            its partitions, so no validated spec holds one.
        partition: Set on each partition (:class:`Partition`); ``None`` on any other PE.
        merged: On an element reading a partitioned one: its partitions' ids (each such
            group a run of ``inputs``). Within a batch their records are merged by the input
            position they carry (``origin``), so that a key moved between partitions meets
            this element in its input order (:mod:`fogshift.broker.datasource`).
        event_timeout_s: For a processor: how long ``process()`` may take for one event
            before that event is a dead letter (a stuck event must not hold the PE);
            ``None``: :data:`~fogshift.events.DEFAULT_EVENT_TIMEOUT_S` (see
            :attr:`event_timeout`). Sources and sinks run no ``process()``: they refuse it.
        batch_timeout_s: How long one micro-batch of the PE may run without committing
            before its node starts its query again; ``None``:
            :data:`~fogshift.events.DEFAULT_BATCH_TIMEOUT_S` (see :attr:`batch_timeout`).
        role: (class) source, processor or sink.
        path_options: (class) Option names that are file paths, resolved against the spec's
            folder when a spec file is loaded.
        must_exist: (class) Path options that must exist at deploy time (a source's: a file).
        keyable: (class) Whether the kind may have ``key_by`` (it can hold state).
        needs_key: (class) Whether it must: its state only makes sense per key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: ClassVar[Role]
    path_options: ClassVar[tuple[str, ...]] = ()
    must_exist: ClassVar[tuple[str, ...]] = ()
    keyable: ClassVar[bool] = False
    needs_key: ClassVar[bool] = False

    id: str = Field(pattern=_NAME)
    kind: str
    node: str = Field(pattern=_NAME)
    # (Checked here too, not only against the spec's element ids: an agent takes an element
    # from a request, and each input names the subjects and stream it reads.)
    inputs: tuple[Annotated[str, Field(pattern=_NAME)], ...] = ()
    # Serialized as what it is: a field typed ElementSpec holds a kind's element, whose
    # options the base model does not know.
    options: SerializeAsAny[KindOptions]
    key_by: str | None = Field(default=None, pattern=KEY_FIELD_RE)
    partitions: tuple[Annotated[str, Field(pattern=_NAME)], ...] | None = Field(
        default=None, min_length=1, max_length=MAX_PARTITIONS
    )
    partition: Partition | None = None
    merged: tuple[tuple[Annotated[str, Field(pattern=_NAME)], ...], ...] = ()
    event_timeout_s: float | None = Field(
        default=None, ge=MIN_EVENT_TIMEOUT_S, le=MAX_EVENT_TIMEOUT_S, strict=True
    )

    batch_timeout_s: float | None = Field(
        default=None, ge=MIN_BATCH_TIMEOUT_S, le=MAX_BATCH_TIMEOUT_S, strict=True
    )

    @property
    def batch_timeout(self) -> float:
        """The seconds one micro-batch of this element may run without committing."""
        return DEFAULT_BATCH_TIMEOUT_S if self.batch_timeout_s is None else self.batch_timeout_s

    @property
    def event_timeout(self) -> float:
        """The seconds ``process()`` has for one event of this element."""
        return DEFAULT_EVENT_TIMEOUT_S if self.event_timeout_s is None else self.event_timeout_s

    @property
    def moves_keys(self) -> bool:
        """Whether this is a partition whose keys can move: its reader places the moves
        stored in its inputs (see :mod:`fogshift.broker.keys`). A partition reading the
        partitions of another element (``merged``, whose records meet in an order of their
        own) keeps the keys CRC-32 gives it: its keys do not move, nor is it rescaled. One
        reading elements of a single partition each moves keys on several inputs as on one
        (see :func:`~fogshift.broker.keys.listed_unions`)."""
        return self.partition is not None and not self.merged

    @property
    def shifts_origins(self) -> bool:
        """Whether this partition's output origins may run ahead of the sum of its inputs'
        positions (keys move, several inputs: see
        :meth:`fogshift.broker.datasource.JetStreamReader._partition_rows`), so that its
        last output's origin says nothing of how far it has read."""
        return self.moves_keys and len(self.inputs) > 1

    def __new__(cls, *args: Any, **data: Any) -> Self:
        # Python then runs the chosen subclass's __init__, which validates with its schema.
        # An unknown kind keeps the base class, whose validator raises pydantic's tag error.
        target = KINDS.get(str(data.get("kind")), cls) if cls is ElementSpec else cls
        return cast(Self, super().__new__(target))

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # An API declaring an ElementSpec takes any kind's element: describe the union.
        if cls is ElementSpec:
            return handler(ELEMENT.core_schema)
        return handler(core_schema)

    @model_validator(mode="wrap")
    @classmethod
    def _as_its_kind(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # The base class validates as the union; each kind's class validates as itself.
        if isinstance(data, dict) and "options" not in data:
            # No options: each kind's own model says which it needs ("path: Field required").
            data = {**data, "options": {}}
        if isinstance(data, dict) and data.get("partitions") is not None:
            nodes = data["partitions"]
            # (Not a list of nodes, say a count: its own error says so, not a placeholder's.)
            first = nodes[0] if isinstance(nodes, (list, tuple)) and nodes else "unplaced"
            if data.get("node", first) != first:
                raise Refusal(
                    "a partitioned element is placed by `partitions` (one node per partition), "
                    "not by `node`",
                    expected="`partitions` alone (or `node` the same as its first node)",
                    received=f"node: {data['node']} beside partitions: {nodes}",
                    hint=f"remove node: {data['node']}",
                )
            # Its partitions take their nodes from the list; node is only a placeholder.
            data = {**data, "node": first}
        if cls is not ElementSpec or isinstance(data, ElementSpec):
            return handler(data)
        return cast(Self, ELEMENT.validate_python(data))

    @model_validator(mode="after")
    def _timed_only_if_processing(self) -> Self:
        if self.event_timeout_s is not None and self.role != "processor":
            raise Refusal(
                f"event_timeout_s bounds a processor's process() for one event; a {self.kind!r} "
                f"element ({self.role}) runs none",
                expected="event_timeout_s on a processor only",
                received=f"event_timeout_s: {self.event_timeout_s:g} on a {self.role}",
                hint="remove event_timeout_s",
            )
        return self

    @model_validator(mode="after")
    def _keyed_only_if_stateful(self) -> Self:
        if self.key_by is not None and not self.keyable:
            keyable = ", ".join(k for k, c in KINDS.items() if c.keyable)
            raise Refusal(
                f"key_by is for processors that hold state; a {self.kind!r} element has no "
                "state to key",
                expected=f"key_by on a processor with state ({keyable})",
                received=f"key_by: {self.key_by} on a {self.kind!r} element",
                hint="remove key_by",
            )
        if self.key_by is None and self.needs_key:
            raise Refusal(
                f"a {self.kind!r} element keeps its state per patient, and this one names no key",
                expected="key_by: patient (the field naming whose signal an event carries)",
                received="no key_by",
                hint="add key_by: patient",
            )
        if self.key_by is not None and self.key_by.startswith(RESERVED_FIELD_PREFIX):
            raise Refusal(
                f"key_by {self.key_by!r}: fields named {RESERVED_FIELD_PREFIX}... are "
                "fogshift's own (a key move's record carries one)",
                expected=f"a field whose name does not start with {RESERVED_FIELD_PREFIX}",
                received=f"key_by: {self.key_by}",
                hint="key by another field",
            )
        if (self.partitions is not None or self.partition is not None) and self.key_by is None:
            raise Refusal(
                "partitions split a keyed PE's keys between instances, and this one names no key",
                expected="key_by: FIELD (the field whose value keys the state) beside partitions",
                received=(
                    f"partitions: {list(self.partitions)} without key_by"
                    if self.partitions is not None
                    else "a partition without key_by"
                ),
                hint="add key_by: FIELD, or place it on one node (node: NAME, no partitions)",
            )
        for group in self.merged:
            runs = [n for n, i in enumerate(self.inputs) if i in group]
            if (
                len(group) < 2
                or len(runs) != len(group)
                or runs != list(range(runs[0], runs[0] + len(runs)))
            ):
                raise Refusal(
                    f"merged inputs {list(group)} are not two or more of the inputs next to "
                    "each other",
                    expected="two or more adjacent inputs per merged group",
                    received=f"merged: {list(group)}; inputs: {list(self.inputs)}",
                    hint="merged is written for `partitions`: name the partitioned element as "
                    "the input instead",
                )
        if self.partition is not None and self.partition.index >= self.partition.count:
            raise Refusal(
                f"partition {self.partition.index} of {self.partition.of!r} is beyond its "
                f"{self.partition.count} partitions",
                expected=f"an index below {self.partition.count}",
                received=f"index {self.partition.index}",
                hint="a partition is written by `partitions`, not by hand",
            )
        return self


class CsvSourceElement(ElementSpec):
    """A ``csv-source``: reads a CSV file into events."""

    role = "source"
    path_options = ("path",)
    must_exist = ("path",)
    kind: Literal["csv-source"]
    options: CsvSourceOptions


class WindowAggregateElement(ElementSpec):
    """A ``window-aggregate``: an aggregate over the last N values of one field."""

    role = "processor"
    keyable = True
    kind: Literal["window-aggregate"]
    options: WindowAggregateOptions

    @model_validator(mode="after")
    def _jvm_unpartitioned(self) -> Self:
        if self.options.engine == "jvm" and (
            self.partitions is not None or self.partition is not None
        ):
            placed = (
                f"partitions: {list(self.partitions)}"
                if self.partitions is not None
                else f"partition {self.id!r}"
            )
            raise Refusal(
                f"window-aggregate {self.id!r}: the JVM engine runs a PE on one node; "
                "partitions move keys, and key moves hand over the Python engine's state",
                expected="engine: jvm on one node (node: NAME, with or without key_by), or "
                "partitions with engine: python",
                received=f"engine: jvm with {placed}",
                hint="remove engine: jvm (the default is python), or place it on one node",
            )
        if self.options.engine == "jvm" and self.event_timeout_s is not None:
            # (It bounds Python code for one event; it was accepted, and bounded nothing.)
            raise Refusal(
                f"window-aggregate {self.id!r}: event_timeout_s bounds Python code, and the "
                "JVM engine runs none per event (a window bounds its work)",
                expected="event_timeout_s with engine: python, or engine: jvm without it",
                received=f"engine: jvm, event_timeout_s: {self.event_timeout_s:g}",
                hint="remove event_timeout_s, or engine: jvm",
            )
        return self


def runs_on_jvm(element: ElementSpec) -> bool:
    """Whether ``element`` runs on the JVM engine (a ``window-aggregate`` with ``engine:
    jvm``): its query and its state are the JVM operator's."""
    return isinstance(element, WindowAggregateElement) and element.options.engine == "jvm"


class MapElement(ElementSpec):
    """A ``map``: computes fields from expressions."""

    role = "processor"
    kind: Literal["map"]
    options: MapOptions


class FilterElement(ElementSpec):
    """A ``filter``: passes the events an expression holds for."""

    role = "processor"
    kind: Literal["filter"]
    options: FilterOptions


class CustomElement(ElementSpec):
    """A ``custom`` processor: a user-written class, loaded on its node."""

    role = "processor"
    path_options = ("path",)
    must_exist = ("path",)
    keyable = True
    kind: Literal["custom"]
    options: CustomOptions


class CsvSinkElement(ElementSpec):
    """A ``csv-sink``: appends events to a CSV file, exactly once."""

    role = "sink"
    path_options = ("path",)
    kind: Literal["csv-sink"]
    options: CsvSinkOptions


class EcgSourceElement(ElementSpec):
    """An ``ecg-source``: simulated patients' wearables (Case 2)."""

    role = "source"
    kind: Literal["ecg-source"]
    options: EcgSourceOptions


class AmplifyElement(ElementSpec):
    """An ``amplify``: gain with a per-patient calibration (Case 2)."""

    role = "processor"
    kind: Literal["amplify"]
    options: AmplifyOptions


class BandpassElement(ElementSpec):
    """A ``bandpass``: a Butterworth band-pass, its state per patient (Case 2)."""

    role = "processor"
    keyable = True
    needs_key = True
    kind: Literal["bandpass"]
    options: BandpassOptions


class ClassifyElement(ElementSpec):
    """A ``classify``: beats, a neural network, alarms, its state per patient (Case 2)."""

    role = "processor"
    keyable = True
    needs_key = True
    kind: Literal["classify"]
    options: ClassifyOptions


#: Any element, validated as the class its ``kind`` names.
AnyElement = Annotated[
    CsvSourceElement
    | WindowAggregateElement
    | MapElement
    | FilterElement
    | CustomElement
    | CsvSinkElement
    | EcgSourceElement
    | AmplifyElement
    | BandpassElement
    | ClassifyElement,
    Field(discriminator="kind"),
]
ELEMENT: TypeAdapter[AnyElement] = TypeAdapter(AnyElement)

#: The built-in kinds: ``kind`` -> its element class (``role``, ``options`` model, paths).
KINDS: dict[str, type[ElementSpec]] = {
    get_args(cls.model_fields["kind"].annotation)[0]: cls
    for cls in (
        CsvSourceElement,
        WindowAggregateElement,
        MapElement,
        FilterElement,
        CustomElement,
        CsvSinkElement,
        EcgSourceElement,
        AmplifyElement,
        BandpassElement,
        ClassifyElement,
    )
}


#: ``recovery.history_s`` unless the spec says otherwise: a day.
DEFAULT_HISTORY_S = 86_400.0
#: The longest ``recovery.history_s`` (ten years; ``null`` keeps records for good).
MAX_HISTORY_S = 315_360_000.0


class RecoverySpec(BaseModel):
    """What happens when a node hosting the pipeline goes silent.

    Attributes:
        auto: Restore its PEs elsewhere automatically.
        detect_after_s: How long a node may stay silent before it is declared lost (2 s
            at least: nodes beat once a second, and a shorter one restored PEs of healthy
            nodes between their heartbeats).
        latency_ms: How long moving a PE's checkpoint to its redeploy node may take (the
            planner's latency requirement ``l_τ``).
        standby: Keep a hot standby of every source and processor: on this node, or
            ``planned`` (the planner's redeploy node of each PE, else the least busy healthy
            node). A lost node's PEs are then taken over by their standbys (fence, lift the
            cap) instead of being restored from checkpoints. Sinks write outside the broker
            and are always restored from checkpoints. ``None``: no standbys.
        history_s: How long the data records of a PE's stream are kept once every reader
            of it has checkpointed past them (every checkpoint it keeps starts later): older
            ones are deleted (``fogshift.broker.history``), so streams do not fill the
            broker's disk. A stream nobody in the pipeline reads is kept whole. ``None``:
            every record is kept for good.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    auto: bool = True
    detect_after_s: float = Field(default=10.0, ge=2.0)
    # (At most ~31 years: a plan sums its PEs' recovery times, each within its latency, and
    # values near 1e308 summed to infinity, which failed every plan.)
    latency_ms: float = Field(default=30_000.0, gt=0, le=1e12)
    standby: str | None = Field(default=None, pattern=_NAME)
    history_s: float | None = Field(default=DEFAULT_HISTORY_S, ge=1.0, le=MAX_HISTORY_S)


#: ``recovery.standby`` asking for each PE's planned redeploy node.
PLANNED_STANDBY = "planned"


def wants_standby(element: ElementSpec) -> bool:
    """Whether ``element`` may have a hot standby: a sink writes outside the broker, where
    nothing would skip the standby's writes, so it is restored from checkpoints."""
    return element.role != "sink"


def _check_merged(elements: list[ElementSpec]) -> None:
    """Each merged group is partitions of one element, and an element reading two or more
    partitions of one element reads them as one merged group.

    ``merged`` is what :class:`PipelineSpec` writes for ``partitions``; one written by hand
    could name other inputs (their positions mean nothing to each other), and a reader of
    partitions listed one by one would read a moved key's records out of their order.
    (Ids of no element are a scale's retired partitions, which their readers drain.)
    """
    of = {e.id: e.partition.of for e in elements if e.partition is not None}
    ids = {e.id for e in elements}
    for element in elements:
        for group in element.merged:
            sources = {of.get(i) for i in group if i in ids}
            if len(sources) > 1 or None in sources:
                raise Refusal(
                    f"element {element.id!r}: merged inputs {list(group)} are not the "
                    "partitions of one element",
                    expected="the partitions of one partitioned element",
                    received=f"merged: {list(group)}",
                    hint="merged is written for `partitions`, not by hand: name the "
                    "partitioned element as the input",
                )
        grouped = {i for group in element.merged for i in group}
        read: dict[str, list[str]] = {}
        for i in element.inputs:
            if i in of and i not in grouped:
                read.setdefault(of[i], []).append(i)
        for source, parts in read.items():
            if len(parts) == 1 and sum(1 for o in of.values() if o == source) > 1:
                # (It would see only the keys that partition owns: a key moved away would
                # vanish from its input, and a scale would give it every partition's whole
                # history from the start. An element of one partition is read so.)
                raise Refusal(
                    f"element {element.id!r} reads partition {parts[0]!r} of {source!r} "
                    "alone (a key moved to another partition would vanish from its input)",
                    expected=f"{source!r} as one input (its partitions read together)",
                    received=f"inputs: {list(element.inputs)}",
                    hint=f"name {source!r} as its input instead",
                )
            if len(parts) > 1:
                raise Refusal(
                    f"element {element.id!r} reads partitions {parts} of {source!r} one by one "
                    "(a moved key's records would reach it out of order)",
                    expected=f"{source!r} as one input (its partitions read together)",
                    received=f"inputs: {list(element.inputs)}",
                    hint=f"name {source!r} as its input instead",
                )


class PipelineSpec(BaseModel):
    """A pipeline: a DAG of elements placed on nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pipeline: str = Field(pattern=_NAME)
    elements: tuple[AnyElement, ...] = Field(min_length=1)
    recovery: RecoverySpec = RecoverySpec()

    @model_validator(mode="after")
    def _partitioned(self) -> Self:
        # Each partitioned element becomes its partitions, and every element that named it
        # as an input reads them all (a key's events then come from one input only).
        if not any(e.partitions is not None for e in self.elements):
            _check_merged(list(self.elements))  # (a stored spec: expanded already)
            return self
        parts: dict[str, list[str]] = {}
        elements: list[ElementSpec] = []
        for element in self.elements:
            if element.partitions is None:
                elements.append(element)
                continue
            count = len(element.partitions)
            ids = [partition_id(element.id, i) for i in range(count)]
            if len(ids[-1]) > 63:
                raise Refusal(
                    f"element {element.id!r}: its partitions' ids ({ids[-1]!r}) would be "
                    "longer than 63 characters",
                    expected="an id that leaves room for its partitions' suffix (-pN)",
                    received=f"{len(element.id)} characters, {count} partitions",
                    hint="shorten the id",
                )
            parts[element.id] = ids
            elements.extend(
                element.model_copy(
                    update={"id": pid, "node": node, "partitions": None,
                            "partition": Partition(of=element.id, index=i, count=count)}
                )
                for i, (pid, node) in enumerate(zip(ids, element.partitions, strict=True))
            )  # fmt: skip
        elements = [
            e.model_copy(update={
                "inputs": tuple(p for i in e.inputs for p in parts.get(i, [i])),
                "merged": (*e.merged, *(tuple(parts[i]) for i in e.inputs
                                        if i in parts and len(parts[i]) > 1)),
            })
            if any(i in parts for i in e.inputs)
            else e
            for e in elements
        ]  # fmt: skip
        _check_merged(elements)
        # Validation only: the frozen model gets its final elements before anyone sees it.
        object.__setattr__(self, "elements", tuple(elements))
        return self

    def partitions_of(self, element_id: str) -> list[ElementSpec]:
        """The partitions of the partitioned element ``element_id``, in order (``[]``: it
        is not one)."""
        found = [e for e in self.elements if e.partition and e.partition.of == element_id]
        return sorted(found, key=lambda e: e.partition.index if e.partition else 0)

    def retired_partitions_of(self, element_id: str) -> list[str]:
        """The partitions of the partitioned element ``element_id`` that a scale-in retired
        and its readers still drain: ids in a reader's merged group of its partitions that
        are no element now (their streams stay, fenced), in index order."""
        current = {e.id for e in self.partitions_of(element_id)}
        ids = {e.id for e in self.elements}
        retired = {
            i
            for e in self.elements
            for group in e.merged
            if current & set(group)
            for i in group
            if i not in ids
        }
        return sorted(retired, key=lambda i: (len(i), i))  # (p9 before p10)

    def element(self, element_id: str) -> ElementSpec:
        """The element with id ``element_id`` (KeyError if none)."""
        for element in self.elements:
            if element.id == element_id:
                return element
        raise KeyError(element_id)

    def topological_order(self) -> list[ElementSpec]:
        """Elements with every element after its inputs, level by level, each level in spec
        order (so the order is the same on every call and every Python).

        Raises:
            graphlib.CycleError: The elements form a cycle; ``args[1]`` lists it, in the
                direction events flow, its first element repeated at its end.
        """
        index = {e.id: i for i, e in enumerate(self.elements)}
        sorter = TopologicalSorter({e.id: e.inputs for e in self.elements})
        sorter.prepare()
        order: list[ElementSpec] = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready(), key=lambda i: index.get(i, len(index)))
            # An input naming no element is the loader's to refuse; it has no place here.
            order.extend(self.elements[index[i]] for i in ready if i in index)
            sorter.done(*ready)
        return order
