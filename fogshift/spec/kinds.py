"""The options of each built-in PE kind, as a spec writes them.

Each model here is the ``options`` of one member of the element union in
:mod:`fogshift.spec.models`, so a spec's options are validated once, when it is loaded. The
runtime's processors (:mod:`fogshift.runtime.operators`) validate their own options with the
same models; what runs a kind is the runtime's business (:mod:`fogshift.runtime.kinds`).
"""

from __future__ import annotations

from collections.abc import KeysView
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fogshift.spec.expressions import check_expression

#: What an element does with events: produce them, transform them, or write them out.
Role = Literal["source", "processor", "sink"]

#: The aggregates ``window-aggregate`` computes (the runtime implements each).
AggregateName = Literal["avg", "sum", "min", "max", "count"]


class KindOptions(BaseModel):
    """Base of every kind's options: frozen, no unknown key, and readable as a mapping.

    The mapping view (``options["path"]``, ``options.get("rate")``, ``"path" in options``,
    ``dict(options)``) shows the options under their spec names (``class``, not ``cls``), every
    default filled in. It exists because a processor's contract takes its options as a mapping
    (:class:`fogshift.runtime.api.Processor`): the engine hands ``dict(element.options)`` on.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
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


class CsvSourceOptions(KindOptions):
    """Options of ``csv-source``.

    Attributes:
        path: The CSV file (header row, then one record per line). Relative to the spec file.
        rate: Events per second; 0 reads as fast as possible.
        max_events_per_batch: Upper bound of one micro-batch.
    """

    path: str = Field(min_length=1)
    rate: float = Field(default=0, ge=0)
    max_events_per_batch: int = Field(default=10_000, ge=1)


class CsvSinkOptions(KindOptions):
    """Options of ``csv-sink``.

    Attributes:
        path: The output CSV file. Relative to the spec file; its folder is created.
    """

    path: str = Field(min_length=1)


class WindowAggregateOptions(KindOptions):
    """Options of ``window-aggregate``.

    Attributes:
        field: The body field to aggregate.
        window: How many of the latest valid values the aggregate covers (count window).
        function: avg, sum, min, max or count.
    """

    field: str = Field(min_length=1)
    window: int = Field(ge=1, le=1_000_000)
    function: AggregateName = "avg"


class MapOptions(KindOptions):
    """Options of ``map``.

    Attributes:
        set: Field name → expression; the results are written into the body.
        keep: Keep the input's other fields (default) or emit only the ``set`` fields.
    """

    set: dict[str, str] = Field(min_length=1)
    keep: bool = True

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

    cls: str = Field(alias="class", pattern=r"^[\w.]+:\w+$")
    path: str | None = None
    options: dict[str, object] = Field(default_factory=dict)
