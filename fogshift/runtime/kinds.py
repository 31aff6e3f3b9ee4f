"""What runs each PE kind: the processor class of every built-in processor kind, and the
loading of ``custom`` ones.

The kinds themselves — their role and options — are the spec's
(:data:`fogshift.spec.models.KINDS`; an element's role is ``element.role``);
this module adds only what the runtime needs, and imports no Spark.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from pathlib import Path

from fogshift.runtime.api import Processor
from fogshift.runtime.exceptions import ElementError
from fogshift.runtime.operators.ecg import Amplify, Bandpass, Classify
from fogshift.runtime.operators.expr import Filter, Map
from fogshift.runtime.operators.window import WindowAggregate
from fogshift.spec.kinds import CustomOptions
from fogshift.spec.models import KINDS

__all__ = ["PROCESSORS", "load_class", "processor_for"]

#: The processor class of each built-in processor kind (``custom`` names its own).
PROCESSORS: dict[str, type[Processor]] = {
    "window-aggregate": WindowAggregate,
    "map": Map,
    "filter": Filter,
    "amplify": Amplify,
    "bandpass": Bandpass,
    "classify": Classify,
}


def processor_for(kind: str, options: Mapping[str, object]) -> tuple[type[Processor], dict]:
    """The processor class of a processor element and the options to build it with.

    Raises:
        ElementError: The kind is not a processor, or a custom class cannot be imported.
    """
    entry = KINDS.get(kind)
    if entry is None or entry.role != "processor":
        raise ElementError(f"kind {kind!r} is not a processor kind")
    if kind in PROCESSORS:
        return PROCESSORS[kind], dict(options)
    custom = CustomOptions.model_validate(dict(options))
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
