"""The package's layers only look down (issue #11, "Layers that only look down").

Every module under ``fogshift/`` is parsed (not imported) and each of its imports of
``fogshift.*`` — at module level, inside functions, under ``TYPE_CHECKING`` — is checked
against :data:`LAYERS`: a module may import its own subpackage and anything in a lower layer;
an import of a higher layer fails the test with its ``file:line``. Subpackages of one layer
may import each other one way, never in a cycle. The known exceptions are listed, with the
reason and the issue that removes them, in :data:`ALLOWED`.
"""

from __future__ import annotations

import ast
import graphlib
import itertools
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import fogshift

ROOT = Path(fogshift.__file__).parent

#: The layers, lowest first; each names the subpackages (or top-level modules) in it. The order
#: follows the README's architecture screen: the vocabulary (errors, names, events, the spec),
#: then what moves and stores data (broker, checkpoints, links), the engine that runs a PE on
#: them, the procedures that move PEs, the two services, the supervisor that starts them, and
#: the benchmarks and CLI on top.
LAYERS: list[tuple[str, ...]] = [
    # Errors. Each subpackage's ``exceptions`` module is counted here too (see layer_of):
    # errors cross process boundaries by their code (``common.http`` rebuilds them), so a
    # client may catch a service's errors without importing the service.
    ("exceptions",),
    ("common", "events", "contracts"),
    ("spec",),
    # Transport and storage, and the self-contained computations (placement, reference).
    ("broker", "checkpoint", "network", "planner", "verify", "ecg"),
    ("runtime",),
    ("migration", "restoration"),
    ("agent", "orchestrator"),
    ("supervisor",),
    # The benchmarks and the web dashboard: clients of the services, started by the CLI.
    ("bench", "web"),
    ("cli",),
]

#: Imports that still go up a layer, as ``(importing module, imported module)``. Each must
#: go; the test fails when a new one appears, and when one listed here no longer exists (then
#: delete it from this set).
ALLOWED: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    """One import of a fogshift module by another."""

    source: str  # the importing module
    target: str  # the imported module (or package)
    where: str  # "fogshift/x/y.py:12"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    """Every import of a ``fogshift`` module in ``path``, wherever it stands in the file."""
    return imports_in(
        path.read_text(), module_name(path), path.name == "__init__.py",
        str(path.relative_to(ROOT.parent)),
    )  # fmt: skip


def imports_in(text: str, source: str, is_package: bool, where: str) -> list[Import]:
    """Every import of a ``fogshift`` module in ``text``, the code of module ``source``."""
    package = source if is_package else source.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(text, filename=where)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # "from fogshift import cli" and "from fogshift.cli import main" import the
            # submodule when there is one.
            for alias in node.names:
                candidate = ROOT.parent.joinpath(*f"{module}.{alias.name}".split("."))
                is_module = candidate.with_suffix(".py").exists() or candidate.is_dir()
                targets.append(f"{module}.{alias.name}" if is_module else module)
        for target in targets:
            if target == "fogshift" or target.startswith("fogshift."):
                found.append(Import(source, target, f"{where}:{node.lineno}"))
    return found


def all_imports() -> list[Import]:
    return [i for path in sorted(ROOT.rglob("*.py")) for i in imports_of(path)]


def unit_of(module: str) -> str:
    """The subpackage (or top-level module) a module belongs to: ``fogshift.cli.main`` -> cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fogshift"


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``; fails for a subpackage no layer names."""
    if module == "fogshift" or module.endswith(".exceptions"):
        return 0
    unit = unit_of(module)
    for index, members in enumerate(LAYERS):
        if unit in members:
            return index
    raise AssertionError(
        f"fogshift.{unit} is in no layer: add it to LAYERS in tests/test_layers.py "
        "(below everything that imports it, above everything it imports)"
    )


def upward(imports: list[Import]) -> list[str]:
    """The imports of a higher layer that :data:`ALLOWED` does not list, as messages."""
    return [
        f"{i.where}: {i.source} (layer {layer_of(i.source)}) imports {i.target} "
        f"(layer {layer_of(i.target)})"
        for i in imports
        if layer_of(i.target) > layer_of(i.source) and (i.source, i.target) not in ALLOWED
    ]


def test_every_import_looks_down() -> None:
    imports = all_imports()
    assert len({i.source for i in imports}) > 50, "the walk found the package's modules"
    problems = upward(imports)
    assert not problems, "imports that go up a layer:\n" + "\n".join(problems)


def test_no_cycle_between_subpackages() -> None:
    # Within a layer, one subpackage may use another: only one way.
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for i in all_imports():
        a, b = unit_of(i.source), unit_of(i.target)
        if a != b and (i.source, i.target) not in ALLOWED and not i.target.endswith(".exceptions"):
            graph[a].add(b)
            where.setdefault((a, b), i.where)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        # Each node of the cycle is imported by the next one.
        cycle = exc.args[1]
        steps = [f"{where[(b, a)]}: {b} -> {a}" for a, b in itertools.pairwise(cycle)]
        raise AssertionError("subpackages import each other:\n" + "\n".join(steps)) from None


def test_exceptions_modules_stay_at_the_bottom() -> None:
    # What lets anyone import a subpackage's errors: they import nothing but other errors.
    wrong = [
        f"{i.where}: {i.source} imports {i.target}"
        for i in all_imports()
        if i.source.endswith(".exceptions")
        and i.target != "fogshift"
        and not i.target.endswith(".exceptions")
    ]
    assert not wrong, "an exceptions module imports more than errors:\n" + "\n".join(wrong)


def test_allowed_exceptions_still_exist() -> None:
    present = {(i.source, i.target) for i in all_imports()}
    stale = sorted(ALLOWED - present)
    assert not stale, f"these imports are gone: delete them from ALLOWED: {stale}"


def test_the_checker_sees_upward_imports_anywhere_in_a_file() -> None:
    code = """
import fogshift.events
from fogshift.common.names import NAME_RE
from ..runtime import kinds


def later():
    from fogshift.cli.main import app
    from fogshift import supervisor
"""
    found = imports_in(code, "fogshift.spec.sample", False, "fogshift/spec/sample.py")
    assert [i.target for i in found] == [
        "fogshift.events",
        "fogshift.common.names",
        "fogshift.runtime.kinds",
        "fogshift.cli.main",
        "fogshift.supervisor",
    ]
    assert [p.split(":")[1].split()[0] for p in upward(found)] == ["4", "8", "9"]
    assert layer_of("fogshift.agent.exceptions") < layer_of("fogshift.migration.procedure")
    assert layer_of("fogshift.bench.workload") < layer_of("fogshift.cli.demo")
