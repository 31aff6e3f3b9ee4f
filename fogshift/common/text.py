"""Text for people: error messages shortened to one line, counts of things."""

from __future__ import annotations


def one_line(text: str | None, limit: int = 200) -> str:
    """``text`` on one line (whitespace runs become one space), at most ``limit`` characters."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one ("1 key", "3 keys", "0 keys")."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
