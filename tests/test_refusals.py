"""Every refusal says what was expected, what was received, and what to do.

Every module under ``fogshift/`` is parsed (not imported only for its classes) and each call
that builds an :class:`~fogshift.exceptions.InvalidInput` (a bad spec, command, option or
request) is checked: it passes ``expected`` and ``received``, and ``hint`` unless its class
has a ``default_hint``. The few families that are not about what a user typed are listed, with
the reason, in :data:`NOT_ABOUT_INPUT`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import fogshift
from fogshift.exceptions import FogshiftError, InvalidInput

ROOT = Path(fogshift.__file__).parent

#: Refusals of something no user typed: their message names the computation that failed.
NOT_ABOUT_INPUT = {
    # A window the ECG simulator or a filter could not handle: a dead letter's reason.
    "BadSignal",
    # No placement satisfies the constraints: it names the constraint and the task.
    "InfeasiblePlan",
}


def _refusals() -> dict[str, type[FogshiftError]]:
    """The classes of :class:`InvalidInput`'s family, by name (one name, one class)."""
    found: dict[str, type[FogshiftError]] = {"InvalidInput": InvalidInput}
    for module in pkgutil.walk_packages(fogshift.__path__, "fogshift."):
        for name, value in vars(importlib.import_module(module.name)).items():
            if inspect.isclass(value) and issubclass(value, InvalidInput):
                assert found.setdefault(name, value) is value, f"two classes named {name}"
    return found


def test_every_refusal_says_what_was_expected_received_and_what_to_do() -> None:
    refusals = _refusals()
    assert {"InvalidSpec", "BadBenchOption", "BadLinkProfile"} <= set(refusals)
    lacking: list[str] = []
    calls = 0
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            cls = refusals.get(node.func.id)
            if cls is None or node.func.id in NOT_ABOUT_INPUT:
                continue
            calls += 1
            given = {k.arg for k in node.keywords}
            if None in given:  # (**fields: what they hold is the caller's)
                continue
            wanted = {"expected", "received"} | ({"hint"} if cls.default_hint is None else set())
            if missing := sorted(wanted - given):
                where = path.relative_to(ROOT.parent)
                lacking.append(f"{where}:{node.lineno} {node.func.id} without {missing}")
    assert calls > 150, calls  # (the walk found the refusals)
    assert not lacking, "\n".join(lacking)


def test_a_default_hint_is_given_unless_one_is_passed() -> None:
    from fogshift.bench.exceptions import BadBenchOption

    assert BadBenchOption("bad --rate", expected="a", received="b").hint == (
        BadBenchOption.default_hint
    )
    assert BadBenchOption("bad", hint="this one").hint == "this one"
    assert InvalidInput("bad").hint is None
