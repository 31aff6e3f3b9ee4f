"""Loading and checking specs: every refusal names the element and what was expected."""

from __future__ import annotations

import difflib
import math
import os
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from graphlib import CycleError
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from fogshift.common.text import has_utf8, shown
from fogshift.common.validation import expected_of, message_of, refusal_of
from fogshift.common.yamltext import load_yaml, read_utf8
from fogshift.spec.exceptions import InvalidSpec
from fogshift.spec.kinds import EcgSourceOptions, patient_name
from fogshift.spec.models import (
    KINDS,
    PLANNED_STANDBY,
    ElementSpec,
    PipelineSpec,
    partition_id,
    wants_standby,
)


def _where(loc: tuple[Any, ...], data: Any) -> str:
    """A readable location like ``elements[1] (id 'aggregate').kind``."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            label = f"[{part}]"
            if isinstance(node, list) and part < len(node) and isinstance(node[part], dict):
                if "id" in node[part]:
                    label += f" (id {node[part]['id']!r})"
                node = node[part]
            out += label
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "spec"


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to a misspelt ``word`` (``difflib``), or ``None`` if none is
    close enough to be worth suggesting.

    Case aside first: ``fog-A`` is ``fog-a`` (difflib, which tells cases apart, offered
    ``fog-b``, and nothing for ``FOG-B``).
    """
    pool = list(candidates)
    folded = word.casefold()
    same = [c for c in pool if c.casefold() == folded]
    if same:
        return same[0]
    by_folded: dict[str, str] = {}
    for candidate in pool:
        by_folded.setdefault(candidate.casefold(), candidate)
    close = difflib.get_close_matches(folded, list(by_folded), n=1, cutoff=0.6)
    return by_folded[close[0]] if close else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``tuple[ElementSpec, ...]`` -> ElementSpec)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if arg is not Ellipsis and arg is not types.NoneType:
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _is_mapping(annotation: Any) -> bool:
    """Whether an annotation is a mapping (``dict[str, NodeCapacity] | None`` is)."""
    if typing.get_origin(annotation) in (dict, Mapping):
        return True
    return any(
        _is_mapping(arg)
        for arg in typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
    )


def _field_names_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names (aliases where set) of the model found at ``loc`` below ``model``;
    empty if ``loc`` leads out of pydantic models (into a free-form dict)."""
    current: type[BaseModel] | None = model
    keyed = False  # the part is a mapping's key: its value is the model found already
    for part in loc:
        if isinstance(part, int) or keyed:
            # (An item of a tuple or list field, or a mapping's value: the model was
            # unwrapped already. A topology's `nodes.fog-a.cpuu` was not guessed.)
            keyed = False
            continue
        field = current.model_fields.get(part) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
        keyed = field is not None and _is_mapping(field.annotation)
        if current is None:
            return []
    assert current is not None
    return [f.alias or name for name, f in current.model_fields.items()]


def unknown_keys(
    errors: list[ErrorDetails], model: type[BaseModel]
) -> tuple[list[tuple[str, str | None]], list[str]]:
    """Each unknown key in ``errors`` with the known key closest to it (``None`` if none is
    close), and the known keys where the first unknown key was found."""
    unknown: list[tuple[str, str | None]] = []
    known: list[str] = []
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
            continue
        names = _field_names_at(model, loc[:-1])
        known = known or names
        unknown.append((loc[-1], did_you_mean(loc[-1], names)))
    return unknown, known


def _pydantic_error(
    errors: list[ErrorDetails], data: Any, what: str, model: type[BaseModel]
) -> InvalidSpec:
    """One refusal for every error pydantic found in ``data`` (validated as ``model``), with
    a "did you mean" for each misspelt key and the keys that would have been valid."""
    lines = [f"{_where(tuple(e['loc']), data)}: {message_of(e)}" for e in errors]
    refusal = refusal_of(errors[0])
    received = ((refusal and refusal.received) or repr(errors[0].get("input")))[:200]
    unknown, known = unknown_keys(errors, model)
    guesses = [(key, guess) for key, guess in unknown if guess is not None]
    if unknown:
        received = ("unknown key " if len(unknown) == 1 else "unknown keys ") + ", ".join(
            repr(key) for key, _ in unknown
        )
    if len(guesses) == 1:
        hint = f"did you mean {guesses[0][1]!r}?"
    elif guesses:
        hint = "did you mean " + ", ".join(f"{g!r} for {k!r}" for k, g in guesses) + "?"
    else:
        hint = (refusal and refusal.hint) or "see the spec example in the README"
    if known:
        hint += " (known keys there: " + ", ".join(known) + ")"
    return InvalidSpec(
        f"{what} is invalid: " + "; ".join(lines),
        expected=expected_of(errors[0])
        if not unknown
        else "keys known there" + (": " + ", ".join(known) if known else ""),
        received=received,
        hint=hint,
    )


def _untagged(error: ErrorDetails) -> ErrorDetails:
    """``error`` located as the spec writes it: pydantic puts the union member's tag after an
    element's index (``elements.1.map.options``); a missing tag becomes a missing ``kind``."""
    loc = tuple(error["loc"])
    if error["type"] == "union_tag_not_found":
        return {**error, "type": "missing", "loc": (*loc, "kind"), "msg": "Field required"}
    if len(loc) > 2 and loc[0] == "elements" and isinstance(loc[1], int) and loc[2] in KINDS:
        return {**error, "loc": loc[:2] + loc[3:]}
    return error


def _element_at(data: dict[str, Any], index: int | str) -> dict[str, Any]:
    """The raw element at ``elements[index]`` of ``data`` (``{}`` if there is none)."""
    elements = data.get("elements")
    if not isinstance(elements, list) or not isinstance(index, int) or index >= len(elements):
        return {}
    element = elements[index]
    return element if isinstance(element, dict) else {}


def _refusal(exc: ValidationError, data: dict[str, Any]) -> InvalidSpec:
    """The refusal of a spec pydantic rejected, most fundamental problem first: the spec's
    shape, then an unknown kind, then the options of one element (as their own model)."""
    errors = [_untagged(e) for e in exc.errors()]
    if any(len(e["loc"]) > 1 and e["loc"][0] == "elements" for e in errors):
        # pydantic counts an element that failed as missing, and adds "elements: should have
        # at least 1 item" when it was the only one: noise beside that element's own error.
        errors = [e for e in errors if not (e["type"] == "too_short" and e["loc"] == ("elements",))]
    bad_kinds = [e for e in errors if e["type"] == "union_tag_invalid"]
    in_options = [
        e
        for e in errors
        if len(e["loc"]) > 3 and e["loc"][0] == "elements" and e["loc"][2] == "options"
    ]
    shape = [e for e in errors if e not in bad_kinds and e not in in_options]
    if shape:
        return _pydantic_error(shape, data, "the pipeline spec", PipelineSpec)
    if bad_kinds:
        element = _element_at(data, bad_kinds[0]["loc"][1])
        kind = str(element.get("kind"))
        guess = did_you_mean(kind, KINDS)
        return InvalidSpec(
            f"element {element.get('id')!r} has an unknown kind",
            expected="one of " + ", ".join(sorted(KINDS)),
            received=repr(element.get("kind")),
            hint=f"did you mean {guess!r}?" if guess else "see the kinds in the README",
        )
    index = in_options[0]["loc"][1]
    element = _element_at(data, index)
    options_model = KINDS[element["kind"]].model_fields["options"].annotation
    assert isinstance(options_model, type) and issubclass(options_model, BaseModel)
    return _pydantic_error(
        [{**e, "loc": e["loc"][3:]} for e in in_options if e["loc"][1] == index],
        element.get("options"),
        f"options of element {element.get('id')!r} ({element['kind']})",
        options_model,
    )


def _resolved(element: ElementSpec, base_dir: Path) -> ElementSpec:
    """``element`` with its path options made absolute against ``base_dir``."""
    paths = {
        name: str((base_dir / value).resolve())
        for name in element.path_options
        if isinstance(value := element.options.get(name), str)
    }
    if not paths:
        return element
    return element.model_copy(update={"options": element.options.model_copy(update=paths)})


#: Upper bounds of source options, checked where a spec enters (not in the models: a spec
#: stored by an older fogshift is read back through them, and must still read): a rate near
#: a float's limit overflowed the pacing's arithmetic within seconds, stopping the source.
OPTION_BOUNDS = {
    "rate": 1_000_000.0,  # events a second (0: as fast as it can)
    "speed": 1_000.0,  # an ecg-source's signal seconds a second (0: unpaced)
    "max_events_per_batch": 10_000_000,
}
#: What to do instead of an option above its bound, by option.
_BOUND_HINTS = {
    "rate": "0 means 'as fast as it can'",
    "speed": "0 means 'as fast as it can'",
    "max_events_per_batch": "a source reads as many events as it has, up to this, per "
    "micro-batch: a smaller bound only makes more batches",
}


def _check_bounds(spec: PipelineSpec) -> None:
    """Refuse a source option above :data:`OPTION_BOUNDS`."""
    for element in spec.elements:
        for name, most in OPTION_BOUNDS.items():
            value = element.options.get(name) if element.role == "source" else None
            if isinstance(value, int | float) and value > most:
                raise InvalidSpec(
                    f"element {element.id!r} of pipeline {spec.pipeline!r}: {name} {value} "
                    "is more than any source takes",
                    expected=f"{name} at most {most:,.0f}",
                    received=str(value),
                    hint=_BOUND_HINTS[name],
                )


#: How deep a spec's values may nest (a spec's own nesting is a handful of levels; custom
#: options may add some).
MAX_SPEC_DEPTH = 32


#: What JSON carries (and so a spec, on its way to the orchestrator).
_JSON_VALUES = (type(None), bool, int, float, str, dict, list, tuple)


def _check_values(data: Any) -> None:
    """Refuse a value no spec field can hold and that would only fail later, as a
    traceback or a stopped query: a number that is not finite (YAML's ``.inf``, ``.nan``;
    JSON cannot carry it to the orchestrator), a text with a NUL character (no path or name
    holds one), nesting deeper than :data:`MAX_SPEC_DEPTH`. Walked without recursion."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        place = where or "the spec"
        if depth > MAX_SPEC_DEPTH:
            raise InvalidSpec(
                f"{place} nests deeper than {MAX_SPEC_DEPTH} levels",
                expected=f"at most {MAX_SPEC_DEPTH} levels of mappings and lists",
                received=f"more at {place}",
                hint="a spec is a mapping of elements with their options; check the brackets",
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidSpec(
                f"{place} is {value}, not a finite number",
                expected="a finite number",
                received=str(value),
                hint="rates, sizes and times are finite; 0 often means 'no limit' "
                "(see the README's spec example)",
            )
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 63:
            # (YAML's 0x… and 0b… build integers of any size: Python writes none of over
            # 4300 digits as text, and JSON, the refusal's own text and the deploy failed.)
            raise InvalidSpec(
                f"{place} is a whole number of {value.bit_length()} bits",
                expected="a whole number within ±(2**63 - 1)",
                received=f"a number of {value.bit_length()} bits",
                hint="counts, sizes and times fit in 64 bits; check the digits",
            )
        if isinstance(value, str) and "\x00" in value:
            raise InvalidSpec(
                f"{place} holds a NUL character",
                expected="text without NUL characters",
                received=repr(value[:40]),
                hint="no path, name or expression holds one; was the file written as text?",
            )
        if isinstance(value, str) and not has_utf8(value):
            raise InvalidSpec(
                f"{place} holds a lone surrogate (a \\ud800-style escape)",
                expected="text that UTF-8 can encode",
                received=repr(value[:40]),
                hint="write the character itself, or a pair of escapes that make one",
            )
        if not isinstance(value, _JSON_VALUES):
            # (YAML's dates, binaries, sets: JSON cannot carry them to the orchestrator,
            # which answered 500, and the CLI's deploy printed a traceback.)
            raise InvalidSpec(
                f"{place} is a {type(value).__name__}, which a spec cannot hold",
                expected="text, a number, true/false, null, a list or a mapping",
                received=shown(value, 60),
                hint="quote it to make it text (a YAML date or !!binary is not)",
            )
        if isinstance(value, dict):
            for k in value:
                if not isinstance(k, str) or not has_utf8(k):
                    raise InvalidSpec(
                        f"{place} has key {shown(k, 60)}, which is not text",
                        expected="mapping keys that are text",
                        received=shown(k, 60),
                        hint="quote the key",
                    )
            stack.extend((v, f"{where}.{k}" if where else str(k), depth + 1)
                         for k, v in value.items())  # fmt: skip
        elif isinstance(value, list | tuple):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))


def parse_spec(data: Any, base_dir: Path | None = None) -> PipelineSpec:
    """Validate a spec given as plain data and resolve its relative paths.

    Args:
        data: The parsed YAML/JSON.
        base_dir: Relative paths in path options are resolved against it; ``None`` keeps them.

    Raises:
        InvalidSpec: Naming the element and what was expected.
    """
    if not isinstance(data, dict):
        kinds = {type(None): "an empty document", list: "a list", str: "text"}
        raise InvalidSpec(
            "a pipeline spec must be a mapping",
            expected="keys `pipeline` and `elements`",
            received=kinds.get(type(data), type(data).__name__),
            hint="start from examples/case1/case1.yaml (`fogshift validate FILE` checks one)",
        )
    _check_values(data)
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise _refusal(exc, data) from None
    _check_bounds(spec)
    if base_dir is not None:
        elements = tuple(_resolved(element, base_dir) for element in spec.elements)
        spec = spec.model_copy(update={"elements": elements})
    validate_spec(spec)
    return spec


def require_absolute_paths(spec: PipelineSpec) -> None:
    """Refuse a spec whose path options are relative: one sent to the orchestrator, which
    has no folder to resolve them against (a node resolved them against its own working
    folder, and a missing input showed only when its query ran).

    Raises:
        InvalidSpec: Such a path.
    """
    for element in spec.elements:
        for name in element.path_options:
            value = element.options.get(name)
            if isinstance(value, str) and not Path(value).is_absolute():
                raise InvalidSpec(
                    f"element {element.id!r} of pipeline {spec.pipeline!r}: its {name} is a "
                    "relative path",
                    expected="an absolute path",
                    received=repr(value),
                    hint="`fogshift deploy SPEC.yaml` and the dashboard make a spec file's "
                    "paths absolute against its folder; a spec sent as JSON gives them so",
                )


def validate_spec(
    spec: PipelineSpec,
    nodes: Iterable[str] | None = None,
    check_files: bool = False,
    base_dir: Path | None = None,
) -> None:
    """Check the spec as a graph, and optionally its nodes and files.

    Args:
        spec: A spec whose fields already validated.
        nodes: The known node names; ``None`` skips the node check.
        check_files: Also check that input files exist.
        base_dir: The folder the spec's relative paths were resolved against (the spec
            file's, a dashboard's ``--spec-dir``), named in a missing file's hint.

    Raises:
        InvalidSpec: Unknown node, duplicate id, bad input, a cycle, a missing file.
    """
    ids = [e.id for e in spec.elements]
    seen: set[str] = set()
    for element_id in ids:
        if element_id in seen:
            of = next((e.partition.of for e in spec.elements
                       if e.id == element_id and e.partition is not None), None)  # fmt: skip
            if of is not None:  # one the spec wrote, the other a partition fogshift made
                raise _named_as_a_partition(spec, element_id, of)
            raise InvalidSpec(
                f"pipeline {spec.pipeline!r} has two elements with id {element_id!r}",
                expected="element ids unique in the pipeline",
                received=f"{element_id!r} twice",
                hint="rename one of them",
            )
        seen.add(element_id)
    known_nodes = sorted(nodes) if nodes is not None else None
    for element in spec.elements:
        if known_nodes is not None and element.node not in known_nodes:
            guess = did_you_mean(element.node, known_nodes)
            raise InvalidSpec(
                f"element {element.id!r} is placed on unknown node {element.node!r}",
                expected="one of " + (", ".join(known_nodes) or "(no node is up)"),
                received=repr(element.node),
                hint=(f"did you mean {guess!r}? " if guess else "")
                + "`fogshift nodes` lists the nodes; `fogshift up --nodes` starts them",
            )
        if element.role == "source" and element.inputs:
            raise InvalidSpec(
                f"element {element.id!r} is a source ({element.kind}) and takes no inputs",
                expected="inputs: []",
                received=f"inputs: {list(element.inputs)}",
                hint=f"remove {element.id!r}'s inputs, or use a processor kind to read them",
            )
        if element.role != "source" and not element.inputs:
            raise InvalidSpec(
                f"element {element.id!r} ({element.kind}) has no inputs",
                expected="inputs: [<id of an element feeding it>]",
                received="no inputs",
                hint="known elements: " + ", ".join(ids),
            )
        twice = sorted({name for name in element.inputs if element.inputs.count(name) > 1})
        if twice:
            raise InvalidSpec(
                f"element {element.id!r} of pipeline {spec.pipeline!r} names the same input twice",
                expected="each input once",
                received=f"inputs: {list(element.inputs)}",
                hint=f"list {twice[0]!r} once: each of its events reaches {element.id!r} once",
            )
        for name in element.inputs:
            if name not in seen:
                others = [i for i in ids if i != element.id]
                guess = did_you_mean(name, others)
                raise InvalidSpec(
                    f"element {element.id!r} has input {name!r}, which is not an element "
                    f"of pipeline {spec.pipeline!r}",
                    expected="one of " + ", ".join(others),
                    received=repr(name),
                    hint=f"did you mean {guess!r}?"
                    if guess
                    else f"name an element's id, or add an element {name!r} to the spec",
                )
            if spec.element(name).role == "sink":
                raise InvalidSpec(
                    f"element {element.id!r} has input {name!r}, which is a sink and emits "
                    "no events",
                    expected="a source or a processor as input",
                    received=f"{name!r} ({spec.element(name).kind}, a sink)",
                    hint="connect it to a source or processor instead",
                )
        if check_files:
            check_element_files(element, base_dir)
    _check_partitions(spec)
    _check_single_writer_files(spec)
    _check_standby(spec, known_nodes)
    try:
        spec.topological_order()
    except CycleError as exc:
        cycle = [str(i) for i in exc.args[1]]
        raise InvalidSpec(
            f"pipeline {spec.pipeline!r} has a cycle: " + " -> ".join(cycle),
            expected="a directed acyclic graph of elements",
            received=f"{cycle[0]} feeds itself through " + ", ".join(cycle[1:-1])
            if len(cycle) > 2
            else f"{cycle[0]} lists itself as an input",
            hint=f"remove one input along the cycle, e.g. {cycle[-2]!r} from {cycle[-1]!r}'s "
            "inputs",
        ) from None
    _check_bands(spec)
    _check_calibrations(spec)


def check_element_files(
    element: ElementSpec, base_dir: Path | None = None, node: str | None = None
) -> None:
    """Refuse ``element`` if a path it reads is missing or a path it writes cannot be a file,
    here: on the host checking it (the CLI's or dashboard's when it loads a spec, the node
    agent's when it is asked to run the PE).

    Args:
        base_dir: The folder relative paths were resolved against, named in the hint.
        node: The node checking, named in the refusal (``None``: where the spec is loaded).

    Raises:
        InvalidSpec: A missing input file, an output path that cannot be a file.
    """
    on = f" on node {node!r}" if node is not None else ""
    for option in element.must_exist:
        value = element.options.get(option)
        if not isinstance(value, str):
            continue
        # (a source reads a file; a custom processor's `path` is a folder to import from)
        wanted = element.role == "source"
        try:
            there, is_file = Path(value).exists(), Path(value).is_file()
        except OSError as exc:  # a name too long, a folder that may not be listed
            raise _unusable_path(element, option, value, exc) from None
        if node is not None and there and wanted and not os.access(value, os.R_OK):
            # (Only on the node: the node's user reads it, not the CLI's. Accepted, the PE
            # failed at its first look at the file, after "deployed".)
            raise InvalidSpec(
                f"element {element.id!r}: file {value!r} (option `{option}`) cannot be read" + on,
                expected="a file the node's user may read",
                received="no read permission",
                hint=f"give the node's user read access to it on node {node!r}",
            )
        if not there or (wanted and not is_file):
            raise InvalidSpec(
                f"element {element.id!r}: file {value!r} (option `{option}`) "
                + ("is not a file" if there else "does not exist")
                + on,
                expected="an existing file" if wanted else "an existing path",
                received="a directory or special file" if there else "no such file",
                hint=f"put the file in place on node {node!r}, or place {element.id!r} on a "
                "node that has it"
                if node is not None
                else "relative paths are relative to "
                + ("the spec file" if base_dir is None else os.path.join(base_dir, "")),
            )
    _check_output_path(element, node)


#: The kinds a window passes through with its sampling rate (``fs``) as it came.
_KEEP_FS = frozenset({"amplify", "bandpass", "filter"})


def _check_bands(spec: PipelineSpec) -> None:
    """Refuse a ``bandpass`` whose band does not fit under half the sampling rate of an
    ``ecg-source`` upstream of it: every window would be a dead letter (the runtime checks
    each window's own rate; this catches the spec's mistake before anything runs). The walk
    upstream goes only through kinds that keep a window's ``fs`` as it came: a ``map`` or a
    custom processor may resample, and what lies beyond it is not judged."""
    for element in spec.elements:
        if element.kind != "bandpass":
            continue
        high = float(element.options["high_hz"])
        for upstream in _upstream(spec, element):
            if upstream.kind != "ecg-source":
                continue
            name = upstream.id
            rate = float(upstream.options["sampling_rate"])
            if high >= rate / 2:
                raise InvalidSpec(
                    f"element {element.id!r} of pipeline {spec.pipeline!r} passes up to "
                    f"{high:g} Hz, but {name!r} samples at {rate:g} Hz",
                    expected=f"high_hz below {rate / 2:g} (half the sampling rate of {name!r})",
                    received=f"high_hz: {high:g}",
                    hint=f"lower high_hz, or raise {name!r}'s sampling_rate above {2 * high:g}",
                )


def _upstream(spec: PipelineSpec, element: ElementSpec) -> Iterator[ElementSpec]:
    """The elements upstream of ``element`` through kinds that keep a window as it came
    (``_KEEP_FS``: its rate and its patient): each one met, once; a kept kind's inputs are
    followed, another's are not (it may resample or rename)."""
    seen: set[str] = set()
    todo = list(element.inputs)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        upstream = next((e for e in spec.elements if e.id == name), None)
        if upstream is None:  # (a partitioned element's name: its partitions follow)
            todo.extend(p.id for p in spec.partitions_of(name))
            continue
        yield upstream
        if upstream.kind in _KEEP_FS:
            todo.extend(upstream.inputs)


def _check_calibrations(spec: PipelineSpec) -> None:
    """Refuse an ``amplify`` whose ``calibration`` names a patient no ``ecg-source``
    upstream of it has (``p1`` for ``p01``): that wearable's gain was silently not undone,
    every window. Judged only when everything upstream (through kinds that keep a window's
    patient: ``_KEEP_FS``) is an ``ecg-source``: any other source or processor may name
    patients its own way."""
    for element in spec.elements:
        if element.kind != "amplify" or not element.options.get("calibration"):
            continue
        names: set[str] = set()
        for upstream in _upstream(spec, element):
            if upstream.kind in _KEEP_FS:
                continue
            if upstream.kind == "ecg-source":
                count = int(upstream.options.get("patients", EcgSourceOptions().patients))
                names.update(patient_name(n) for n in range(1, count + 1))
            else:
                names.clear()
                break
        unknown = sorted(set(element.options["calibration"]) - names) if names else []
        if unknown:
            guess = did_you_mean(unknown[0], names)
            raise InvalidSpec(
                f"element {element.id!r} of pipeline {spec.pipeline!r} calibrates "
                f"{', '.join(map(repr, unknown[:5]))}, which no ecg-source upstream sends",
                expected=f"patients of its ecg-sources: {', '.join(sorted(names)[:10])}"
                + (" …" if len(names) > 10 else ""),
                received=", ".join(unknown[:10]),
                hint=(f"did you mean {guess!r}? " if guess else "")
                + "an ecg-source names its patients p01, p02, …",
            )


def _unusable_path(element: ElementSpec, option: str, value: str, exc: OSError) -> InvalidSpec:
    """The refusal of a path the OS will not look up (``Path.exists`` raises for anything
    but a missing file: a name too long, a folder it may not search)."""
    return InvalidSpec(
        f"element {element.id!r}: path {value[:200]!r} (option `{option}`) cannot be used: "
        f"{exc.strerror or exc}",
        expected="a path the OS accepts (names of at most 255 bytes, 4096 in all) in folders "
        "this user may search",
        received=f"{type(exc).__name__}: {exc.strerror or exc} ({len(value)} characters)",
        hint="name a shorter path, or one in a folder the node's user can open",
    )


def _check_output_path(element: ElementSpec, node: str | None = None) -> None:
    """Refuse a sink whose ``path`` cannot be a file: it names a directory, or a folder on
    its way is a file (the deploy, which empties the file, failed on the node); on a node
    (``node``), one its user may not write either (the file, or the nearest folder there is
    on its way): a deploy's check passed it, and its refusal came once the run before's
    streams and checkpoints were gone and another sink's file emptied."""
    path = output_file(element)
    if path is None:
        return
    target = Path(path)
    try:
        blocking = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
        is_dir = target.is_dir()
        # (A FIFO or a device: emptying it at the deploy waits for a reader, holding the
        # node's lock, and every later deploy or stop on that node waits with it.)
        special = not is_dir and target.exists() and not target.is_file()
    except OSError as exc:  # a name too long, a folder that may not be listed
        raise _unusable_path(element, "path", element.options["path"], exc) from None
    if special:
        raise InvalidSpec(
            f"sink {element.id!r}: path {element.options['path']!r} is no regular file",
            expected="a path to a regular file (made if missing, in folders made if missing)",
            received=f"{path} is a FIFO, socket or device",
            hint="name a file, e.g. out/results.csv",
        )
    if node is not None and not is_dir and blocking is None:
        # The file, and its folder (or the nearest one on its way there is): the sink makes
        # its marker, its lock and their temporary files beside it.
        folder = next(p for p in target.parents if p.exists())
        denied = [
            where
            for where, mode in ((target, os.W_OK), (folder, os.W_OK | os.X_OK))
            if where.exists() and not os.access(where, mode)
        ]
        if denied:
            existing = denied[0]
            raise InvalidSpec(
                f"sink {element.id!r}: path {element.options['path']!r} cannot be written on "
                f"node {node!r}",
                expected="a file (or a folder to make it in) the node's user may write",
                received=f"no write permission on {existing}",
                hint=f"give the node's user write access there on node {node!r}, or name "
                "another path",
            )
    if is_dir or blocking is not None:
        raise InvalidSpec(
            f"sink {element.id!r}: path {element.options['path']!r} cannot be written as a file",
            expected="a path to a file (made if missing, in folders made if missing)",
            received=f"{path} is a directory"
            if blocking is None
            else f"{blocking} is a file, not a folder",
            hint="name a file, e.g. out/results.csv",
        )


def _named_as_a_partition(spec: PipelineSpec, element_id: str, of: str) -> InvalidSpec:
    """The refusal of an element named as a partition of the partitioned element ``of``."""
    return InvalidSpec(
        f"pipeline {spec.pipeline!r}: element {element_id!r} is named as a partition of the "
        f"partitioned element {of!r} is",
        expected=f"ids other than {of}-p<number> (its partitions' names)",
        received=repr(element_id),
        hint=f"rename element {element_id!r}",
    )


def _check_partitions(spec: PipelineSpec) -> None:
    """A partitioned element's partitions are all there, alike but for their node, and its
    id names no other element: each key then has exactly one owner."""
    groups: dict[str, list[ElementSpec]] = {}
    for element in spec.elements:
        if element.partition is not None:
            groups.setdefault(element.partition.of, []).append(element)
    ids = {e.id for e in spec.elements}
    for of, parts in groups.items():
        if of in ids:
            raise InvalidSpec(
                f"pipeline {spec.pipeline!r}: {of!r} is an element and also the partitioned "
                "element of " + ", ".join(repr(p.id) for p in parts),
                expected=f"no element named {of!r} beside its partitions",
                received=f"element {of!r} and partitions of {of!r}",
                hint=f"rename element {of!r}",
            )
        # A partition `scale` adds later takes the next such id: an element holding it would
        # share its stream, placement and epoch with it.
        named = re.compile(rf"{re.escape(of)}-p[0-9]+")
        taken = [
            e.id
            for e in spec.elements
            if named.fullmatch(e.id) and (e.partition is None or e.partition.of != of)
        ]
        if taken:
            raise _named_as_a_partition(spec, taken[0], of)
        count = parts[0].partition.count if parts[0].partition else 0
        indices = sorted(p.partition.index for p in parts if p.partition)
        if indices != list(range(count)) or any(
            p.partition is None or p.partition.count != count for p in parts
        ):
            raise InvalidSpec(
                f"pipeline {spec.pipeline!r}: the partitions of {of!r} do not own every key once",
                expected=f"partitions 0 to {count - 1}, each once",
                received="partitions " + ", ".join(map(str, indices)),
                hint=f"write {of!r} once with partitions: [NODE, ...] and let fogshift "
                "make its partitions",
            )
        alike = {p.model_dump_json(exclude={"id", "node", "partition"}) for p in parts}
        # Ownership starts from one count for all (a partition that took another would
        # own keys another owns, or none would).
        starts = {p.partition.first_count for p in parts if p.partition}
        if (
            len(alike) > 1
            or len(starts) > 1
            or any(p.id != partition_id(of, p.partition.index) for p in parts if p.partition)
        ):
            raise InvalidSpec(
                f"pipeline {spec.pipeline!r}: the partitions of {of!r} differ in more than "
                "their node",
                expected=f"partitions alike but for their node, each named {of}-p<index>",
                received=_partitions_differ(of, parts),
                hint=f"write {of!r} once with partitions: [NODE, ...]",
            )


def _partitions_differ(of: str, parts: list[ElementSpec]) -> str:
    """Where the first partition that differs from the first of ``parts`` differs."""
    first = parts[0]
    for part in parts:
        if part.partition and part.id != partition_id(of, part.partition.index):
            return f"{part.id!r} is partition {part.partition.index}"
        if (
            part.partition
            and first.partition
            and (part.partition.first_count != first.partition.first_count)
        ):
            return f"{first.id!r} and {part.id!r} start from different counts"
        mine = part.model_dump(mode="json", exclude={"id", "node", "partition"})
        theirs = first.model_dump(mode="json", exclude={"id", "node", "partition"})
        fields = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        if fields:
            return f"{first.id!r} and {part.id!r} differ in " + ", ".join(fields)
    return "partitions that differ"


def check_fresh(spec: PipelineSpec) -> None:
    """Refuse a spec to deploy afresh whose partitions say where a scale left them: a fresh
    deployment's streams start over, and every partition reads them from the start, owning
    its keys by its count (``base`` and ``since`` are ``fogshift scale``'s, in the specs it
    stores; a partition reading after ``since`` would skip what the new streams hold up to
    there)."""
    for element in spec.elements:
        part = element.partition
        if part is not None and (part.started_late or part.base not in (None, part.count)):
            raise InvalidSpec(
                f"pipeline {spec.pipeline!r}: partition {element.id!r} is deployed afresh "
                "from where a scale left it",
                expected="partition: {of, index, count} (or partitions: [NODE, ...])",
                received=f"since {part.since}, base {part.base}",
                hint="leave out `since` and `base`: `fogshift scale` sets them",
            )


def _check_standby(spec: PipelineSpec, nodes: list[str] | None) -> None:
    """Refuse a standby node that does not exist, or that hosts a PE it would stand by for
    (an instance cannot stand by for itself: a node loss would take both)."""
    standby = spec.recovery.standby
    if standby is None or standby == PLANNED_STANDBY:
        return
    if nodes is not None and standby not in nodes:
        guess = did_you_mean(standby, nodes)
        raise InvalidSpec(
            f"pipeline {spec.pipeline!r} keeps its standbys on unknown node {standby!r}",
            expected=f"{PLANNED_STANDBY!r} or one of " + (", ".join(nodes) or "(no node is up)"),
            received=repr(standby),
            hint=(f"did you mean {guess!r}? " if guess else "")
            + "`fogshift nodes` lists the nodes",
        )
    placed = [e.id for e in spec.elements if e.node == standby and wants_standby(e)]
    if placed:
        raise InvalidSpec(
            f"pipeline {spec.pipeline!r} keeps its standbys on {standby!r}, which also hosts "
            + ", ".join(placed),
            expected=f"no source or processor placed on {standby!r}",
            received=f"{', '.join(placed)} on {standby!r}",
            hint=f"use `standby: {PLANNED_STANDBY}` (each PE's redeploy node), or place "
            f"{', '.join(placed)} elsewhere",
        )


def output_file(element: ElementSpec) -> str | None:
    """The file a sink writes (resolved: how two sinks' files are compared), ``None`` for
    any other PE."""
    path = element.options.get("path")
    return str(Path(path).resolve()) if element.role == "sink" and isinstance(path, str) else None


def input_file(element: ElementSpec) -> str | None:
    """The file a source reads (resolved, as :func:`output_file`), ``None`` for any other
    PE (an ``ecg-source`` reads none)."""
    path = element.options.get("path")
    return str(Path(path).resolve()) if element.role == "source" and isinstance(path, str) else None


def same_file(path: str) -> str:
    """What tells whether two of the paths :func:`output_file` and :func:`input_file` give
    are one file: its device and inode where it exists (a hard link or a bind mount is one
    file under two names, which a resolved path does not tell), else the path itself."""
    try:
        found = os.stat(path)
    except OSError:
        return path
    return f"inode {found.st_dev}:{found.st_ino}"


def _check_single_writer_files(spec: PipelineSpec) -> None:
    """Refuse shapes whose output could not be exactly-once: two sinks appending to one file
    (their exactly-once markers would overwrite each other), or a source reading a file a sink
    of the same pipeline writes (a feedback loop the broker cannot see)."""
    writers: dict[str, str] = {}
    names: dict[str, str] = {}  # (each written file's path as given, by same_file)
    for element in spec.elements:
        resolved = output_file(element)
        if resolved is None:
            continue
        path = element.options["path"]
        name = Path(resolved).name
        # (The lock too: a sink writing another's lock file was accepted, 2026-12-06.)
        if name.startswith(".") and name.endswith(
            (".fogshift.json", ".fogshift.tmp", ".fogshift.lock")
        ):
            raise InvalidSpec(
                f"sink {element.id!r} of pipeline {spec.pipeline!r} writes {path!r}, a name "
                "fogshift keeps for a sink's exactly-once marker or its lock",
                expected="an output file not named .<file>.fogshift.json, .fogshift.tmp or "
                ".fogshift.lock",
                received=repr(path),
                hint="name the output otherwise: a sink writing another's marker would undo "
                "that sink's exactly-once",
            )
        key = same_file(resolved)
        if key in writers:
            first, same = names[key], names[key] == path
            raise InvalidSpec(
                f"sinks {writers[key]!r} and {element.id!r} of pipeline {spec.pipeline!r} both "
                + (f"write {path!r}" if same else f"write one file: {first!r} and {path!r}"),
                expected="one sink per output file",
                # (Paths come here absolute, links followed: two written apart may meet.)
                received=f"{writers[key]}.path and {element.id}.path: both {path!r} made "
                "absolute, links followed"
                if same
                else f"{writers[key]}.path and {element.id}.path: one file under two names (a "
                "link, or a path written two ways)",
                hint="give each sink its own `path`, or feed one sink from both inputs",
            )
        writers[key], names[key] = element.id, path
    for element in spec.elements:
        path = element.options.get("path")
        read = input_file(element)
        if read is not None and same_file(read) in writers:
            raise InvalidSpec(
                f"source {element.id!r} of pipeline {spec.pipeline!r} reads {path!r}, "
                f"which sink {writers[same_file(read)]!r} writes",
                expected="a source file no sink of the pipeline writes",
                received=repr(path),
                hint="a pipeline is a directed acyclic graph; loops through files are not",
            )


def load_spec(path: str | Path, nodes: Iterable[str] | None = None) -> PipelineSpec:
    """Read, validate and resolve a YAML spec file, checking that input files exist.

    Raises:
        InvalidSpec: The file cannot be read or parsed, or the spec is invalid.
    """
    source = Path(path)
    try:
        text = read_utf8(source)
    except OSError as exc:
        raise InvalidSpec(
            f"cannot read spec file {str(source)!r}: {exc.strerror or exc}",
            expected="a readable YAML file",
            received=repr(str(source)),
            hint="check the path (relative to the current directory) and its permissions",
        ) from None
    except ValueError as exc:
        raise InvalidSpec(
            f"cannot read spec file: {exc}",
            expected="a YAML file in UTF-8",
            received="another encoding (Latin-1, UTF-16, ...)",
            hint="save the file as UTF-8",
        ) from None
    return load_spec_text(text, source.resolve().parent, nodes, f"spec file {str(source)!r}")


def load_spec_text(
    text: str, base_dir: Path, nodes: Iterable[str] | None = None, what: str = "the spec"
) -> PipelineSpec:
    """Validate and resolve a YAML spec given as text (e.g. uploaded), checking that input
    files exist.

    Args:
        base_dir: Relative paths in the spec are relative to it.
        what: How errors name the spec.

    Raises:
        InvalidSpec: The text is not YAML, or the spec is invalid.
    """
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise InvalidSpec(
            f"{what} is not valid YAML: {exc}",
            expected="a YAML mapping with `pipeline` and `elements`, each key once, "
            "without anchors or aliases",
            received=f"{len(text)} characters",
            hint="check the indentation, quotes and keys at the line named above",
        ) from None
    except RecursionError:
        raise InvalidSpec(
            f"{what} nests too deep to read",
            expected=f"at most {MAX_SPEC_DEPTH} levels of mappings and lists",
            received=f"{len(text)} characters",
            hint="a spec is a mapping of elements with their options; check the brackets",
        ) from None
    spec = parse_spec(data, base_dir)
    validate_spec(spec, nodes, check_files=True, base_dir=base_dir)
    return spec
