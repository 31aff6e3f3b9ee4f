"""The expression language of ``map`` and ``filter`` options: what an expression may call.

Expressions are parsed here, when a spec is loaded, so that a spec with a broken expression
is refused before anything runs; :mod:`fogshift.runtime.operators.expr` evaluates them with
the same :data:`FUNCTIONS` and :data:`OPERATORS`. An expression is one expression (no
assignment, no ``;``), with no attribute access (``simpleeval`` 1.0 allows method calls:
``name.ljust(w)`` with ``w`` from an event would build a string of any size), no imports and
no calls but these.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from simpleeval import DEFAULT_OPERATORS, EvalWithCompoundTypes, InvalidExpression, safe_power

from fogshift.common.validation import Refusal

#: The most digits an integer an expression makes may have: Python converts no more to text
#: (``sys.get_int_max_str_digits``), so no output could hold it, and computing one of
#: millions of digits held the query for minutes.
MAX_INT_DIGITS = 4300


def _round(number: Any, ndigits: Any = None) -> Any:
    """``round(number, ndigits)``, in time whatever ``ndigits`` an event gives: Python
    rounds an integer to ``-d`` digits by computing ``10 ** d`` (minutes for d = 10**8), but
    any ``d`` past the integer's length rounds it to 0, so the same result comes from
    ``d`` = its length + 1."""
    if isinstance(number, int) and isinstance(ndigits, int) and ndigits < 0:
        ndigits = max(ndigits, -(len(str(abs(number))) + 1))
    return round(number, ndigits)


def _power(base: Any, exponent: Any) -> Any:
    """``base ** exponent`` (simpleeval's limits), refusing an integer result of more than
    :data:`MAX_INT_DIGITS` digits before computing it (``3999999 ** 3999999`` took minutes,
    and no output could hold it)."""
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent > 0
        and exponent * math.log10(abs(base)) > MAX_INT_DIGITS
    ):
        raise ValueError(
            f"the integer {base} ** {exponent} has over {MAX_INT_DIGITS} digits: no output "
            "can hold it (use float() for an approximate value)"
        )
    return safe_power(base, exponent)


#: The functions an expression may call, by name.
FUNCTIONS: dict[str, Any] = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": _round,
    "int": int,
    "float": float,
    "str": str,
    "len": len,
    "sqrt": math.sqrt,
    "isfinite": lambda v: isinstance(v, (int, float)) and math.isfinite(v),
}


def _modulo(a: Any, b: Any) -> Any:
    """``a % b`` for numbers only: ``%`` formatting of a text (``"%*s" % (w, x)``) builds a
    string as wide as an event says."""
    if isinstance(a, str | bytes):
        raise TypeError("% formats no text in an expression: use str() and +")
    return operator.mod(a, b)


#: The operators an expression may use (simpleeval's, ``%`` on numbers only, ``**`` with
#: integer results of at most :data:`MAX_INT_DIGITS` digits).
OPERATORS: dict[type[ast.AST], Any] = {
    **DEFAULT_OPERATORS,
    ast.Mod: _modulo,
    ast.Pow: _power,
}


def evaluator() -> EvalWithCompoundTypes:
    """An evaluator with :data:`FUNCTIONS` (those only) and :data:`OPERATORS`."""
    found = EvalWithCompoundTypes(operators=OPERATORS, functions=dict(FUNCTIONS))
    # simpleeval adds dict, list, set and tuple to the functions it is given (it added them
    # to FUNCTIONS itself, given that): the language is what the README lists.
    found.functions = dict(FUNCTIONS)
    return found


def _refused(expression: str, message: str) -> Refusal:
    """The refusal of ``expression`` in a spec: what expressions have, and where they are
    described (a plain ``ValueError`` left the refusal without what was expected)."""
    return Refusal(
        message,
        expected="one expression of fields, constants, operators, comparisons, `x if c else "
        "y`, lists, dicts, indexing, comprehensions and calls of " + ", ".join(sorted(FUNCTIONS)),
        received=repr(expression)[:200],
        hint="the README's \"Pipeline spec\" says what expressions have, over the body's "
        "fields and seq",
    )


def check_expression(expression: str) -> str:
    """Return ``expression`` if it parses (names are only known per event, so unchecked).

    Raises:
        ValueError: It does not parse as one expression, or reads an attribute; pydantic
            reports it as the option's error.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        # (simpleeval evaluates `status = 'ok'` as 'ok', true for every event, and of
        # `x > 0; y > 0` the first only.)
        raise _refused(
            expression,
            f"{expression!r} is not a valid expression: {exc.msg} (one expression: compare "
            "with ==; no assignments, statements or ';')",
        ) from None
    except (RecursionError, MemoryError):  # (Python's parser gives up on "1+1+…" or "---…1")
        raise _refused(
            expression, f"an expression of {len(expression)} characters nests too deep to parse"
        ) from None
    if any(isinstance(node, ast.FormattedValue) and node.format_spec is not None
           for node in ast.walk(tree)):  # fmt: skip
        raise _refused(
            expression,
            f"{expression!r} gives a format spec in an f-string (a width from an event "
            "would build a string of any size): format with str() and +",
        )
    # Syntax the evaluator has no rule for (``(x := 1)``, ``lambda: 1``, ``*a``, a set
    # comprehension) parses, then fails at every event: each one a dead letter.
    rules = evaluator().nodes
    unknown = sorted({
        type(node).__name__ for node in ast.walk(tree)
        if isinstance(node, ast.expr) and type(node) not in rules
    })  # fmt: skip
    if unknown:
        raise _refused(
            expression,
            f"{expression!r} uses {', '.join(unknown)}, which expressions do not have: they "
            "have fields, constants, operators, comparisons, `x if c else y`, lists, dicts, "
            "indexing, comprehensions and calls of the functions "
            f"{', '.join(sorted(FUNCTIONS))}",
        )
    if any(isinstance(node, ast.Attribute) for node in ast.walk(tree)):
        raise _refused(
            expression,
            f"{expression!r} reads an attribute or calls a method: expressions use fields, "
            f"operators and the functions {', '.join(sorted(FUNCTIONS))}",
        )
    called = sorted({
        node.func.id for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id not in FUNCTIONS
    })  # fmt: skip
    if called:
        raise _refused(
            expression,
            f"{expression!r} calls {', '.join(called)}: expressions call only "
            f"{', '.join(sorted(FUNCTIONS))}",
        )
    try:
        evaluator().parse(expression)
    except (SyntaxError, InvalidExpression) as exc:
        raise _refused(expression, f"{expression!r} is not a valid expression: {exc}") from exc
    except (RecursionError, MemoryError):  # (Python's parser gives up on "1+1+…" or "---…1")
        raise _refused(
            expression, f"an expression of {len(expression)} characters nests too deep to parse"
        ) from None
    return expression
