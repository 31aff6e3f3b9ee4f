"""The expression language of ``map`` and ``filter`` options: what an expression may call.

Expressions are parsed here, when a spec is loaded, so that a spec with a broken expression
is refused before anything runs; :mod:`fogshift.runtime.operators.expr` evaluates them with
the same :data:`FUNCTIONS`. ``simpleeval`` allows no attribute access, no imports and no calls
but these.
"""

from __future__ import annotations

import math
from typing import Any

from simpleeval import EvalWithCompoundTypes, InvalidExpression

#: The functions an expression may call, by name.
FUNCTIONS: dict[str, Any] = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "int": int,
    "float": float,
    "str": str,
    "len": len,
    "sqrt": math.sqrt,
    "isfinite": lambda v: isinstance(v, (int, float)) and math.isfinite(v),
}


def check_expression(expression: str) -> str:
    """Return ``expression`` if it parses (names are only known per event, so unchecked).

    Raises:
        ValueError: It does not parse; pydantic reports it as the option's error.
    """
    try:
        EvalWithCompoundTypes(functions=FUNCTIONS).parse(expression)
    except (SyntaxError, InvalidExpression) as exc:
        raise ValueError(f"{expression!r} is not a valid expression: {exc}") from exc
    except (RecursionError, MemoryError):  # (Python's parser gives up on "1+1+…" or "---…1")
        raise ValueError(
            f"an expression of {len(expression)} characters nests too deep to parse"
        ) from None
    return expression
