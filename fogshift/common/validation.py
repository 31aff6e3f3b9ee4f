"""What a refused value was expected to be, in the words of a refusal: pydantic's errors
(a spec's fields, a request's body and parameters) as fogshift's messages say them."""

from __future__ import annotations

from pydantic_core import ErrorDetails

from fogshift.common.names import EXPECTED, KEY_GROUP_RE

#: What pydantic's error types ask for, in the words of a refusal (``{...}``: its context).
_EXPECTED = {
    "greater_than": "a number above {gt}",
    "greater_than_equal": "a number of at least {ge}",
    "less_than": "a number below {lt}",
    "less_than_equal": "a number of at most {le}",
    "too_short": "at least {min_length} of them",
    "too_long": "at most {max_length} of them",
    "string_too_short": "at least {min_length} characters",
    "string_too_long": "at most {max_length} characters",
    "literal_error": "{expected}",
    "enum": "{expected}",
    "missing": "the field, which has no default",
    "tuple_type": "a list (e.g. [a, b])",
    "list_type": "a list (e.g. [a, b])",
    "dict_type": "a mapping (e.g. {{key: value}})",
    "model_type": "a mapping (e.g. {{key: value}})",
    "model_attributes_type": "a mapping (e.g. {{key: value}})",
    "dict_attributes_type": "a mapping (e.g. {{key: value}})",
    "extra_forbidden": "only the keys it knows",
    "string_type": "text",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "finite_number": "a finite number",
    "json_invalid": "a JSON document",
    "string_unicode": "text (UTF-8)",
    "union_tag_invalid": "one of {expected_tags}",
    "union_tag_not_found": "a mapping with its {discriminator}",
}


class Refusal(ValueError):
    """A value one of fogshift's own validators refuses, with what was expected, what was
    received and a hint. Raised in a pydantic validator it reaches the refusal whole:
    pydantic keeps it as its error's ``ctx["error"]`` (:func:`refusal_of`), where a plain
    ``ValueError`` left the refusal to show the whole object checked as received and a
    generic hint."""

    def __init__(
        self,
        message: str,
        *,
        expected: str | None = None,
        received: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.expected, self.received, self.hint = expected, received, hint


def refusal_of(error: ErrorDetails) -> Refusal | None:
    """The :class:`Refusal` behind pydantic's ``error``, if one is."""
    found = (error.get("ctx") or {}).get("error")
    return found if isinstance(found, Refusal) else None


#: pydantic's messages fogshift says in its own words (``{...}``: the error's context):
#: "Extra inputs are not permitted" or "Tuple should have at least 1 item after
#: validation, not 0" read as a library's, not as a refusal of what the user wrote.
_SAID = {
    "missing": "missing (required)",
    "extra_forbidden": "not a key known here",
    "too_short": "has {actual_length}, at least {min_length} expected",
    "too_long": "has {actual_length}, at most {max_length} expected",
}


def message_of(error: ErrorDetails) -> str:
    """``error``'s message in fogshift's words: a name pattern said in words (not its
    regular expression), fogshift's own checks without pydantic's prefix, and the messages
    of :data:`_SAID` reworded; any other as pydantic says it, without its "Input " (the
    caller names the field)."""
    context = dict(error.get("ctx") or {})
    pattern = str(context.get("pattern"))
    if error["type"] == "string_pattern_mismatch" and pattern in EXPECTED:
        return f"should be {EXPECTED[pattern]}"
    if error["type"] == "value_error":  # one of fogshift's own checks: its words alone
        return error["msg"].removeprefix("Value error, ")
    template = _SAID.get(error["type"])
    # (pydantic leaves a length it does not know None: "has None, ..." said nothing.)
    if template is not None and None not in context.values():
        try:
            return template.format(**context)
        except (KeyError, IndexError, ValueError):
            pass
    # (pydantic's own sentences read as a library's: "should be a valid tuple" of a list
    # the user wrote, "should be a valid dictionary or instance of FogTopology". A JSON
    # document's says where it breaks: kept.)
    expected = _EXPECTED.get(error["type"])
    if expected is not None and error["type"] != "json_invalid" and None not in context.values():
        try:
            return "should be " + expected.format(**_bounds(context))
        except (KeyError, IndexError, ValueError):
            pass
    message = error["msg"]
    return message[len("Input ") :] if message.startswith("Input should") else message


def request_message_of(error: ErrorDetails) -> str:
    """``error`` of a request's parameter or body as the services answer it: a value that
    failed a name's (or a key group's) pattern said as what it cannot be, anything else as
    :func:`message_of` says it (the REST API's and the dashboard's refusals alike)."""
    pattern = (error.get("ctx") or {}).get("pattern")
    if pattern == KEY_GROUP_RE:
        return f"{error['input']!r} is not a key group"
    if pattern in EXPECTED:
        return f"{error['input']!r} cannot be used as a name"
    return message_of(error)


def expected_of(error: ErrorDetails) -> str | None:
    """What ``error``'s field expects, in words (a name pattern as names are described,
    not its regular expression); ``None`` if that is not known."""
    refusal = refusal_of(error)
    if refusal is not None:
        return refusal.expected
    context = dict(error.get("ctx") or {})
    if error["type"] == "string_pattern_mismatch":
        return EXPECTED.get(str(context.get("pattern")))
    template = _EXPECTED.get(error["type"])
    if template is None:
        return None
    try:
        return template.format(**_bounds(context))
    except (KeyError, IndexError, ValueError):
        return None


def _bounds(context: dict[str, object]) -> dict[str, object]:
    """``context`` with a whole bound said whole: "above 0", not "above 0.0" (nor, by a
    format of its own, "at most 1e+06")."""
    return {
        k: int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 1e15 else v
        for k, v in context.items()
    }
