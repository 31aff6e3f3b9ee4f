"""Pydantic's errors said in fogshift's words (``fogshift.common.validation``)."""

from __future__ import annotations

from datetime import date

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fogshift.common.validation import message_of


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    window: int = Field(default=1, gt=0)
    fields: tuple[str, ...] = Field(default=("v",), min_length=1, max_length=2)


def _messages(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ValidationError) as err:
        _Options.model_validate(data)
    return {".".join(map(str, e["loc"])): message_of(e) for e in err.value.errors()}


def test_pydantic_wording_does_not_reach_a_refusal() -> None:
    said = _messages({"window": 0, "pad": 1, "fields": []})
    assert said == {
        "path": "missing (required)",
        "pad": "not a key known here",
        "window": "should be a number above 0",
        "fields": "has 0, at least 1 expected",
    }
    assert _messages({"path": "p", "fields": ["a", "b", "c"]}) == {
        "fields": "has 3, at most 2 expected"
    }


def test_other_messages_keep_pydantic_words_without_its_subject() -> None:
    # Said in fogshift's words where it has some ("should be a valid tuple" of a list the
    # user wrote), else pydantic's without its "Input ".
    assert _messages({"path": 3}) == {"path": "should be text"}

    class Dated(BaseModel):
        at: float = Field(allow_inf_nan=False)
        day: date

    with pytest.raises(ValidationError) as err:
        Dated.model_validate({"at": 1e999, "day": "soon"})
    said = [message_of(e) for e in err.value.errors()]
    assert said[0] == "should be a finite number"
    assert said[1].startswith("should be a valid date")


def test_a_length_pydantic_does_not_know_is_not_said_as_none() -> None:
    class Tags(BaseModel):
        tags: frozenset[str] = Field(max_length=2)

    with pytest.raises(ValidationError) as err:
        Tags.model_validate_json('{"tags": ["a", "b", "c"]}')
    said = message_of(err.value.errors()[0])
    assert "None" not in said and "at most 2" in said


def test_a_requests_name_or_key_group_is_said_as_what_it_cannot_be() -> None:
    # One place for the REST API's and the dashboard's words (each had its own copy).
    from fogshift.common.names import KEY_GROUP_RE, NAME_PATTERN
    from fogshift.common.validation import request_message_of

    class Ask(BaseModel):
        name: str = Field(pattern=NAME_PATTERN)
        group: str = Field(default="1/2", pattern=KEY_GROUP_RE)

    with pytest.raises(ValidationError) as err:
        Ask.model_validate({"name": "caf\u00e9", "group": "x"})
    said = {e["loc"][0]: request_message_of(e) for e in err.value.errors()}
    assert said == {"name": "'café' cannot be used as a name", "group": "'x' is not a key group"}
    with pytest.raises(ValidationError) as err:
        Ask.model_validate({})
    assert request_message_of(err.value.errors()[0]) == "missing (required)"
