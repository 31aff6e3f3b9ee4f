"""Text for people: error messages shortened to one line, counts of things."""

from __future__ import annotations


def one_line(text: str | None, limit: int = 200) -> str:
    """``text`` on one line (whitespace runs become one space), at most ``limit`` characters."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one ("1 key", "3 keys", "0 keys")."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def has_utf8(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate): JSON's ``"\\ud800"`` reads as
    one, which no UTF-8 writer, and no key's routing (its bytes are hashed), takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a refusal's "received"; never raises.

    Python writes no integer of over 4300 digits as text (``ValueError``), nor a container
    holding one: a refusal that quoted such a value (a topology's ``cpu: 0xfff…``, a spec's
    mapping key) failed itself, a 500 or a traceback instead of the refusal."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # (ValueError: a huge integer inside; a user object's own __repr__)
        return f"a {type(value).__name__} that cannot be written as text"
    return text[:limit]


def span(seconds: float) -> str:
    """``seconds`` in the unit a reader takes in: ms below a second, s below two minutes,
    min below two hours, h."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
