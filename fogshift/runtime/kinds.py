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
from typing import Any

from fogshift.runtime.api import Processor
from fogshift.runtime.exceptions import ElementError
from fogshift.runtime.operators.ecg import Amplify, Bandpass, Classify
from fogshift.runtime.operators.expr import Filter, Map
from fogshift.runtime.operators.window import WindowAggregate
from fogshift.spec.kinds import CustomOptions
from fogshift.spec.loader import did_you_mean
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


def _check_origin(module: Any, name: str, path: Path) -> None:
    """Refuse a module of ``name`` imported from elsewhere than ``path`` when ``path`` holds
    one: a process imports a module name once, so two pipelines' custom classes of one
    module name from two folders ran one folder's code for both (and took its statefulness
    for the other's)."""
    relative = Path(*name.split("."))
    mine = [path / relative.with_suffix(".py"), path / relative / "__init__.py"]
    found = getattr(module, "__file__", None)
    if found is None or not any(m.exists() for m in mine):
        return
    if not any(Path(found).resolve() == m.resolve() for m in mine if m.exists()):
        raise ElementError(
            f"module {name!r} of {str(path)!r} is not the one this node imported under that "
            f"name ({found}): a node imports a module name once",
            hint="give the custom processor's module a name no other pipeline's module has",
        )


#: The source file's (mtime, size) of each custom processor module when it was imported.
_IMPORTED: dict[str, tuple[int, int] | None] = {}


def _stamp(module: Any) -> tuple[int, int] | None:
    """``module``'s source file's (mtime in ns, size); ``None`` if it has none now."""
    try:
        stat = Path(module.__file__).stat()
    except (TypeError, OSError):  # (no file: a namespace or built-in module)
        return None
    return (stat.st_mtime_ns, stat.st_size)


def _changed(module: Any) -> bool:
    """Whether ``module`` was imported here before and its source file changed since."""
    name = module.__name__
    return name in _IMPORTED and _IMPORTED[name] is not None and _stamp(module) != _IMPORTED[name]


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
        if _changed(module):
            # Its file was edited since it was imported here (a processor fixed after it
            # failed, deployed again): the node's long-lived process kept the old code, and
            # the PE failed the same way until the agent was restarted.
            module = importlib.reload(module)
        _IMPORTED[module_name] = _stamp(module)
    except (Exception, SystemExit) as exc:  # not found, or its module raises (SyntaxError...)
        raise ElementError(
            f"cannot import processor class {reference!r}: {type(exc).__name__}: {exc}",
            expected=f"a module {module_name!r} importable on the node, from `path` or the "
            "node's Python path",
            received=f"{type(exc).__name__} importing {module_name!r}"
            + (f" (path {path!r})" if path else " (no `path` in the options)"),
            hint="the module must be importable on the node (set `path` in the options)",
        ) from exc
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        # (The module imported: "must be importable" sent the user after the wrong thing.)
        found = sorted(
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, Processor) and value is not Processor
        )
        raise ElementError(
            f"module {module_name!r} has no class {class_name!r}",
            expected="a Processor class of the module: " + (", ".join(found) or "none"),
            received=repr(class_name),
            hint=f"did you mean {guess!r}?"
            if (guess := did_you_mean(class_name, found))
            else "name the class as the module defines it (`class: module:Class`)",
        ) from None
    if path:
        _check_origin(module, module_name, Path(path))
    if not (isinstance(cls, type) and issubclass(cls, Processor)):
        raise ElementError(
            f"{reference!r} is not a fogshift Processor",
            expected="a subclass of fogshift.runtime.api.Processor",
            received=repr(cls),
        )
    if cls.process is Processor.process:
        # Accepted, it ran and dead-lettered every event as "raised NotImplementedError".
        methods = sorted(n for n, v in vars(cls).items() if callable(v) and not n.startswith("__"))
        raise ElementError(
            f"processor class {reference!r} has no process() method",
            expected="a method process(self, event) returning its output",
            received="methods " + (", ".join(methods) or "none") + " of its own",
            hint=f"did you mean to name {guess!r} process?"
            if (guess := did_you_mean("process", methods))
            else "define process(self, event) (see the README's custom processors)",
        )
    return cls
