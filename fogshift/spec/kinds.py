"""The options of each built-in PE kind, as a spec writes them.

Each model here is the ``options`` of one member of the element union in
:mod:`fogshift.spec.models`, so a spec's options are validated once, when it is loaded. The
runtime's processors (:mod:`fogshift.runtime.operators`) validate their own options with the
same models; what runs a kind is the runtime's business (:mod:`fogshift.runtime.kinds`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import KeysView
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fogshift.common.names import CLASS_RE
from fogshift.common.validation import Refusal
from fogshift.spec.expressions import check_expression

#: What an element does with events: produce them, transform them, or write them out.
Role = Literal["source", "processor", "sink"]

#: The aggregates ``window-aggregate`` computes (the runtime implements each).
AggregateName = Literal["avg", "sum", "min", "max", "count"]
#: What runs a built-in kind's query (see :class:`WindowAggregateOptions`).
Engine = Literal["python", "jvm"]


def _visible(value: str) -> str:
    """``value`` if it has a visible character and no control character (a newline, a tab,
    C1's, Unicode's line and paragraph separators)."""
    expected = "printable text with at least one visible character (a field name, a path)"
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in value):
        raise Refusal(
            f"{value!r} holds a control character (a newline, a tab): expected printable text",
            expected=expected,
            received=repr(value)[:200],
            hint="remove the control character (a YAML double-quoted \\t or \\n is one)",
        )
    if not value.strip():
        raise Refusal(
            f"{value!r} is blank: expected at least one visible character",
            expected=expected,
            received=repr(value)[:200],
            hint="name the field (or path) it is for",
        )
    return value


#: A field name or a path as a spec writes it: printable, not blank.
Text = Annotated[str, Field(min_length=1), AfterValidator(_visible)]


def _no_boolean(kind: str, what: str) -> Any:
    """A check that refuses ``true``/``false`` where a number is expected (pydantic takes a
    boolean for 1 or 0 there), as pydantic's own ``kind`` error (``int_type``...)."""

    def check(value: object) -> object:
        if isinstance(value, bool):
            raise PydanticCustomError(kind, "Input should be {what}, not a boolean", {"what": what})
        return value

    return BeforeValidator(check)


#: A whole number or a number as an option: a boolean is neither (``window: true`` was a
#: window of 1). A number written as text (``"5"``, or ``1e3``, which YAML reads as text) is
#: taken, as pydantic takes it.
Whole = Annotated[int, _no_boolean("int_type", "a valid integer")]
Number = Annotated[float, _no_boolean("float_type", "a valid number")]


class KindOptions(BaseModel):
    """Base of every kind's options: frozen, no unknown key, and readable as a mapping.

    The mapping view (``options["path"]``, ``options.get("rate")``, ``"path" in options``,
    ``dict(options)``) shows the options under their spec names (``class``, not ``cls``), every
    default filled in. It exists because a processor's contract takes its options as a mapping
    (:class:`fogshift.runtime.api.Processor`): the engine hands ``dict(element.options)`` on.

    A boolean is no number here (``window: true`` is not a window of 1), nor a number a
    boolean (``keep: 1`` is not true): see :data:`Whole`, :data:`Number`.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    def as_dict(self) -> dict[str, Any]:
        """The options as a spec writes them (keys by alias), defaults included."""
        return self.model_dump(by_alias=True)

    def keys(self) -> KeysView[str]:
        return self.as_dict().keys()

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_dict().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict()


#: The slowest pace a source may be given (0 aside: as fast as possible); slower, its first
#: event was days or ages away and the source looked stuck.
MIN_PACE = 0.001
#: ``amplify``'s largest gain.
MAX_GAIN = 1e6
#: ``bandpass``'s lowest cut-off (Hz).
MIN_LOW_HZ = 0.01


def _paced(value: float, option: str, unit: str) -> float:
    """``value`` if it is 0 (as fast as possible) or at least :data:`MIN_PACE`."""
    if 0 < value < MIN_PACE:
        raise Refusal(
            f"{option} {value:g} is too slow: the source would seem stuck (its events "
            f"hours to ages apart)",
            expected=f"0 (as fast as possible) or at least {MIN_PACE:g} {unit}",
            received=f"{option}: {value:g}",
            hint=f"raise {option}, or set it to 0",
        )
    return value


class CsvSourceOptions(KindOptions):
    """Options of ``csv-source``.

    Attributes:
        path: The CSV file (header row, then one record per line). Relative to the spec file.
        rate: Events per second; 0 reads as fast as possible.
        max_events_per_batch: Upper bound of one micro-batch.
    """

    path: Text
    rate: Number = Field(default=0, ge=0)
    max_events_per_batch: Whole = Field(default=10_000, ge=1)

    @field_validator("rate")
    @classmethod
    def _emits(cls, value: float) -> float:
        return _paced(value, "rate", "events per second")


class CsvSinkOptions(KindOptions):
    """Options of ``csv-sink``.

    Attributes:
        path: The output CSV file. Relative to the spec file; its folder is created.
        fields: The events' fields, in the columns' order: the file's header from the
            start, so an event with other fields is a dead letter whichever comes first.
            ``None``: the first event's fields make the header (one event of other fields
            first, a stranger's message in fogshift's form say, made every later event a
            dead letter).
    """

    path: Text
    fields: tuple[Text, ...] | None = None

    @field_validator("fields")
    @classmethod
    def _fields(cls, fields: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if fields is None:
            return None
        if not fields:
            raise Refusal(
                "fields is empty: a CSV row needs at least one",
                expected="the events' field names, e.g. [sensor, value]",
                received="[]",
                hint="list the fields, or leave fields out (the first event's make the header)",
            )
        repeated = sorted({f for f in fields if fields.count(f) > 1})
        if repeated:
            raise Refusal(
                f"fields names {', '.join(map(repr, repeated))} more than once",
                expected="each field once",
                received=repr(list(fields))[:200],
                hint="remove the repeated names",
            )
        return fields


class WindowAggregateOptions(KindOptions):
    """Options of ``window-aggregate``.

    Attributes:
        field: The body field to aggregate.
        window: How many of the latest valid values the aggregate covers (count window).
        function: avg, sum, min, max or count.
        engine: ``python`` (the default: a ``transformWithStateInPandas`` query running
            :mod:`fogshift.runtime.operators.window`) or ``jvm`` (the same outputs and dead
            letters from a JVM operator, ``fogshift/runtime/java/WindowAggregate.java``,
            without a Python worker on the batch's path; keyed or not, on one node: not
            partitioned). A PE keeps its engine for its life: its checkpoint holds that
            engine's state.
    """

    field: Text
    window: Whole = Field(ge=1, le=1_000_000)
    function: AggregateName = "avg"
    engine: Engine = "python"


class MapOptions(KindOptions):
    """Options of ``map``.

    Attributes:
        set: Field name → expression; the results are written into the body.
        keep: Keep the input's other fields (default) or emit only the ``set`` fields.
    """

    set: dict[Text, str] = Field(min_length=1)
    keep: StrictBool = True

    @field_validator("set")
    @classmethod
    def _valid(cls, value: dict[str, str]) -> dict[str, str]:
        for expression in value.values():
            check_expression(expression)
        return value


class FilterOptions(KindOptions):
    """Options of ``filter``.

    Attributes:
        where: An expression; events for which it is true pass unchanged.
    """

    where: str = Field(min_length=1)

    @field_validator("where")
    @classmethod
    def _valid(cls, value: str) -> str:
        return check_expression(value)


class CustomOptions(KindOptions):
    """Options of ``custom``: a user-written processor.

    Attributes:
        cls: ``module:ClassName`` of the processor, importable on every node (``class`` in YAML).
        path: A folder added to ``sys.path`` before importing (relative to the spec file).
        options: Passed to the processor as its options; the processor validates them.
    """

    cls: str = Field(alias="class", pattern=CLASS_RE)
    path: Text | None = None
    options: dict[str, object] = Field(default_factory=dict)


# -- Case 2: ECG digital twins ------------------------------------------------------------


def patient_name(n: int) -> str:
    """The name an ``ecg-source`` gives its ``n``-th patient (1-based): ``p01``, ``p02``…
    Here, below the simulator, so that a spec can be checked against it (an ``amplify``'s
    ``calibration``)."""
    return f"p{n:02d}"


class EcgSourceOptions(KindOptions):
    """Options of ``ecg-source``: simulated wearables (neurokit2), one per patient.

    Event *k* is one window of one patient's recording (patients in turn): the body is
    ``{patient, t, fs, samples}`` (``t``: the window's start in seconds), the creator is the
    patient's wearable. Every ``abnormal_every``-th patient's rhythm turns abnormal around
    ``onset_s`` (seeded), the ground truth of the alarms.

    Attributes:
        patients: How many patients.
        sampling_rate: Samples per second (Hz).
        window_s: Seconds of signal per event.
        duration_s: Seconds of signal per patient; the source ends after them.
        seed: Seeds the patients (heart rates, gains, onsets) and their signals.
        abnormal_every: Every n-th patient develops an abnormal rhythm (0: none).
        onset_s: Around when it starts (± 20 %).
        speed: Signal seconds per wall-clock second (1: real time; 0: as fast as possible).
        max_events_per_batch: Upper bound of one micro-batch.
    """

    patients: Whole = Field(default=4, ge=1, le=99)
    sampling_rate: Whole = Field(default=250, ge=250, le=2000)
    window_s: Number = Field(default=0.5, ge=0.5, le=10)
    duration_s: Number = Field(default=120.0, gt=0, le=3600)
    seed: Whole = Field(default=1, ge=0, le=1_000_000)
    abnormal_every: Whole = Field(default=2, ge=0)
    onset_s: Number = Field(default=30.0, gt=0)
    speed: Number = Field(default=1.0, ge=0)
    max_events_per_batch: Whole = Field(default=1_000, ge=1)

    @field_validator("speed")
    @classmethod
    def _emits(cls, value: float) -> float:
        return _paced(value, "speed", "signal seconds per second")

    @model_validator(mode="after")
    def _one_window_at_least(self) -> Self:
        if self.window_s > self.duration_s:
            raise Refusal(
                f"window_s ({self.window_s:g}) is longer than duration_s "
                f"({self.duration_s:g}): no window would be sent",
                expected="window_s at most duration_s",
                received=f"window_s: {self.window_s:g}, duration_s: {self.duration_s:g}",
                hint="shorten window_s or lengthen duration_s",
            )
        return self


class AmplifyOptions(KindOptions):
    """Options of ``amplify``: ``samples`` times ``gain``, divided by the patient's wearable
    calibration (``calibration[patient]``, 1 if absent).

    Attributes:
        gain: The amplifier's gain.
        calibration: Per patient, the gain of their wearable to undo.
    """

    # (Above, a window's samples overflow to infinity: each a dead letter.)
    gain: Number = Field(default=1.0, gt=0, le=MAX_GAIN)
    # (0 would divide every window of the patient by zero: each a dead letter.)
    calibration: dict[str, Annotated[Number, Field(gt=0)]] = Field(default_factory=dict)


class BandpassOptions(KindOptions):
    """Options of ``bandpass``: a Butterworth band-pass in second-order sections, its state
    per patient (``key_by: patient``), so windows join without a transient.

    Attributes:
        low_hz: Lower cut-off.
        high_hz: Upper cut-off (below half the sampling rate).
        order: The filter's order.
    """

    # (Below, the filter's design is singular at ECG sampling rates: every window a dead
    # letter.)
    low_hz: Number = Field(default=0.5, ge=MIN_LOW_HZ)
    high_hz: Number = Field(default=40.0, gt=0)
    order: Whole = Field(default=4, ge=1, le=10)

    @model_validator(mode="after")
    def _a_band(self) -> Self:
        if self.low_hz >= self.high_hz:
            raise Refusal(
                f"low_hz ({self.low_hz:g}) is not below high_hz ({self.high_hz:g}): no band "
                "passes (every window would be a dead letter)",
                expected="low_hz below high_hz",
                received=f"low_hz: {self.low_hz:g}, high_hz: {self.high_hz:g}",
                hint="swap them, or widen the band (e.g. low_hz: 0.5, high_hz: 40)",
            )
        return self


class ClassifyOptions(KindOptions):
    """Options of ``classify``: beats found in the filtered signal, the rhythm classified by
    a small neural network (``fogshift/ecg/model.json``), an alarm raised after ``confirm``
    abnormal windows in a row (and cleared after as many normal ones).

    Attributes:
        threshold: The network's probability above which a window is abnormal.
        confirm: Abnormal windows in a row before an alarm.
    """

    threshold: Number = Field(default=0.5, gt=0, lt=1)
    confirm: Whole = Field(default=3, ge=1, le=100)
