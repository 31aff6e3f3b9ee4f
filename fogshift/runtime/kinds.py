"""The registry of PE kinds a pipeline spec may name.

A kind says which role the element plays (source, processor, sink), how its options are
validated, and — for processors — which :class:`~fogshift.runtime.api.Processor` runs it.
This module imports no Spark, so specs can be validated anywhere.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fogshift.runtime.api import Processor
from fogshift.runtime.exceptions import ElementError
from fogshift.runtime.operators.expr import Filter, FilterOptions, Map, MapOptions
from fogshift.runtime.operators.window import WindowAggregate, WindowAggregateOptions

Role = Literal["source", "processor", "sink"]


class CsvSourceOptions(BaseModel):
    """Options of ``csv-source``.

    Attributes:
        path: The CSV file (header row, then one record per line). Relative to the spec file.
        rate: Events per second; 0 reads as fast as possible.
        max_events_per_batch: Upper bound of one micro-batch.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    rate: float = Field(default=0, ge=0)
    max_events_per_batch: int = Field(default=10_000, ge=1)


class CsvSinkOptions(BaseModel):
    """Options of ``csv-sink``.

    Attributes:
        path: The output CSV file. Relative to the spec file; its folder is created.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)


class CustomOptions(BaseModel):
    """Options of ``custom``: a user-written :class:`Processor`.

    Attributes:
        cls: ``module:ClassName`` of the processor, importable on every node (``class`` in YAML).
        path: A folder added to ``sys.path`` before importing (relative to the spec file).
        options: Passed to the processor as its options.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cls: str = Field(alias="class", pattern=r"^[\w.]+:\w+$")
    path: str | None = None
    options: dict[str, object] = Field(default_factory=dict)


@dataclass(frozen=True)
class Kind:
    """One PE kind.

    Attributes:
        name: The ``kind`` value in a spec.
        role: source, processor or sink.
        options_model: Validates the element's ``options``.
        path_options: Option names that are file paths, resolved against the spec's folder.
        must_exist: Path options that must name an existing file or folder at deploy time.
        processor: The processor class, for built-in processors.
    """

    name: str
    role: Role
    options_model: type[BaseModel]
    path_options: tuple[str, ...] = ()
    must_exist: tuple[str, ...] = ()
    processor: type[Processor] | None = None


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("csv-source", "source", CsvSourceOptions, ("path",), ("path",)),
        Kind(
            "window-aggregate",
            "processor",
            WindowAggregateOptions,
            processor=WindowAggregate,
        ),
        Kind("map", "processor", MapOptions, processor=Map),
        Kind("filter", "processor", FilterOptions, processor=Filter),
        Kind("custom", "processor", CustomOptions, ("path",), ("path",)),
        Kind("csv-sink", "sink", CsvSinkOptions, ("path",)),
    )
}


def processor_for(kind: str, options: dict[str, object]) -> tuple[type[Processor], dict]:
    """The processor class of a processor element and the options to build it with.

    Raises:
        ElementError: The kind is not a processor, or a custom class cannot be imported.
    """
    entry = KINDS.get(kind)
    if entry is None or entry.role != "processor":
        raise ElementError(f"kind {kind!r} is not a processor kind")
    if entry.processor is not None:
        return entry.processor, dict(options)
    custom = CustomOptions.model_validate(options)
    return load_class(custom.cls, custom.path), dict(custom.options)


def load_class(reference: str, path: str | None = None) -> type[Processor]:
    """Import ``module:ClassName``, a :class:`Processor` subclass.

    Raises:
        ElementError: It cannot be imported (whatever its module raises) or is not a
            Processor.
    """
    if path and path not in sys.path:
        sys.path.insert(0, str(Path(path)))
    module_name, _, class_name = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except Exception as exc:  # not found, or the module itself raises (SyntaxError...)
        raise ElementError(
            f"cannot import processor class {reference!r}: {type(exc).__name__}: {exc}",
            hint="the module must be importable on the node (set `path` in the options)",
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Processor)):
        raise ElementError(
            f"{reference!r} is not a fogshift Processor",
            expected="a subclass of fogshift.runtime.api.Processor",
            received=repr(cls),
        )
    return cls
