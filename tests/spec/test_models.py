"""Elements as a union discriminated by ``kind``: options validated once, read as a mapping."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from fogshift.events import (
    DEFAULT_BATCH_TIMEOUT_S,
    DEFAULT_EVENT_TIMEOUT_S,
    MAX_BATCH_TIMEOUT_S,
    MAX_EVENT_TIMEOUT_S,
)
from fogshift.spec import InvalidSpec, parse_spec
from fogshift.spec.kinds import CustomOptions, WindowAggregateOptions
from fogshift.spec.models import (
    KINDS,
    CsvSourceElement,
    CustomElement,
    ElementSpec,
    MapElement,
    PipelineSpec,
)


class Deploy(BaseModel):
    """A request body declaring an element, as a service's API does."""

    element: ElementSpec


def spec_data() -> dict:
    return {
        "pipeline": "p",
        "elements": [
            {"id": "src", "kind": "csv-source", "node": "cloud", "options": {"path": "in.csv"}},
            {"id": "own", "kind": "custom", "node": "fog-a", "inputs": ["src"],
             "options": {"class": "procs:Mine", "path": "lib", "options": {"k": 1}}},
            {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["own"],
             "options": {"path": "out.csv"}},
        ],
    }  # fmt: skip


def test_each_kind_is_its_own_class_with_its_options_model() -> None:
    spec = parse_spec(spec_data())
    assert [type(e) for e in spec.elements][:2] == [CsvSourceElement, CustomElement]
    assert isinstance(spec.elements[1].options, CustomOptions)
    assert [e.role for e in spec.elements] == ["source", "processor", "sink"]
    assert sorted(KINDS) == [
        "amplify", "bandpass", "classify", "csv-sink", "csv-source", "custom", "ecg-source",
        "filter", "map", "window-aggregate",
    ]  # fmt: skip


def test_constructing_an_element_spec_gives_the_class_of_its_kind() -> None:
    element = ElementSpec(id="m", kind="map", node="n", inputs=("s",), options={"set": {"y": "x"}})
    assert type(element) is MapElement
    assert element.options["keep"] is True  # the default, filled in
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        ElementSpec(id="m", kind="mapp", node="n", options={})
    with pytest.raises(ValidationError, match="at least 1 item"):
        ElementSpec(id="m", kind="map", node="n", inputs=("s",), options={"set": {}})


def test_options_read_as_a_mapping_under_their_spec_names(tmp_path: Path) -> None:
    options = parse_spec(spec_data(), tmp_path).element("own").options
    assert options["class"] == "procs:Mine" and "class" in options and "cls" not in options
    assert options.get("path") == str(tmp_path / "lib")  # resolved against the spec folder
    assert options.get("absent", 7) == 7
    assert dict(options) == {"class": "procs:Mine", "path": str(tmp_path / "lib"),
                             "options": {"k": 1}}  # fmt: skip
    with pytest.raises(KeyError):
        options["absent"]


def test_a_spec_round_trips_through_json_with_its_spec_names() -> None:
    spec = parse_spec(spec_data())
    dumped = spec.model_dump(mode="json")
    assert dumped["elements"][1]["options"]["class"] == "procs:Mine"
    assert PipelineSpec.model_validate_json(spec.model_dump_json()) == spec
    assert PipelineSpec.model_validate(dumped) == spec


def test_a_field_typed_element_spec_validates_and_serializes_any_kind() -> None:
    element = spec_data()["elements"][1]
    body = Deploy.model_validate({"element": element})
    assert type(body.element) is CustomElement
    # Serialized as what it is, not as the base model (which knows no options).
    assert body.model_dump(mode="json")["element"]["options"]["class"] == "procs:Mine"
    assert Deploy.model_validate_json(body.model_dump_json()) == body
    with pytest.raises(ValidationError):
        Deploy.model_validate({"element": {**element, "options": {"clas": "procs:Mine"}}})
    # The API schema names every kind, so a client sees what each kind's options are.
    schema = Deploy.model_json_schema()
    assert {"CustomOptions", "WindowAggregateOptions", "MapElement"} <= set(schema["$defs"])


def test_options_are_frozen_and_strict() -> None:
    options = WindowAggregateOptions(field="v", window=3)
    with pytest.raises(ValidationError):
        options.window = 4  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        WindowAggregateOptions.model_validate({"field": "v", "window": 3, "pad": 1})


def test_an_element_without_options_is_told_which_it_needs() -> None:
    data = spec_data()
    del data["elements"][0]["options"]
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "options of element 'src' (csv-source)" in err.value.message
    assert "path: missing (required)" in err.value.message
    assert "at least 1 item" not in err.value.message


def test_a_missing_kind_is_a_missing_field_not_a_tag_error() -> None:
    data = spec_data()
    del data["elements"][1]["kind"]
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "elements[1] (id 'own').kind: missing (required)" in err.value.message


def test_key_by_is_for_processors_that_hold_state() -> None:
    data = spec_data()
    data["elements"][1]["key_by"] = "patient"
    assert parse_spec(data).element("own").key_by == "patient"
    for index, kind in ((0, "csv-source"), (2, "csv-sink")):
        bad = spec_data()
        bad["elements"][index]["key_by"] = "patient"
        with pytest.raises(InvalidSpec) as err:
            parse_spec(bad)
        assert f"a {kind!r} element has no state to key" in str(err.value)
    for field in ("a.b", "1st", "$x", ""):
        bad = spec_data()
        bad["elements"][1]["key_by"] = field
        with pytest.raises(InvalidSpec, match="key_by"):
            parse_spec(bad)


def test_the_jvm_engine_runs_windows_on_one_node_keyed_or_not() -> None:
    data = spec_data()
    data["elements"][1] = {
        "id": "own", "kind": "window-aggregate", "node": "fog-a", "inputs": ["src"],
        "options": {"field": "v", "window": 3, "engine": "jvm"},
    }  # fmt: skip
    spec = parse_spec(data)
    assert spec.element("own").options.engine == "jvm"  # type: ignore[attr-defined]
    del data["elements"][1]["options"]["engine"]
    assert parse_spec(data).element("own").options.engine == "python"  # type: ignore[attr-defined]
    data["elements"][1]["options"]["engine"] = "jvm"
    data["elements"][1]["key_by"] = "sensor"
    assert parse_spec(data).element("own").key_by == "sensor"
    # A bound on Python code per event bounds nothing here: refused, not silently ignored.
    data["elements"][1]["event_timeout_s"] = 5
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert err.value.received == "engine: jvm, event_timeout_s: 5" and err.value.hint
    del data["elements"][1]["event_timeout_s"]
    # Partitions move keys, which hand over the Python engine's state: refused.
    del data["elements"][1]["node"]
    data["elements"][1]["partitions"] = ["fog-a", "fog-b"]
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert err.value.expected.startswith("engine: jvm on one node (node: NAME")
    assert err.value.received == "engine: jvm with partitions: ['fog-a', 'fog-b']"
    assert "remove engine: jvm" in err.value.hint
    data["elements"][1]["options"]["engine"] = "python"
    assert parse_spec(data).element("own-p1").node == "fog-b"
    data["elements"][1]["options"]["engine"] = "scala"
    with pytest.raises(InvalidSpec, match="engine"):
        parse_spec(data)


def test_a_csv_sink_may_declare_its_fields() -> None:
    data = spec_data()
    data["elements"][2]["options"]["fields"] = ["value", "sensor"]
    spec = parse_spec(data)
    assert spec.element("sink").options["fields"] == ("value", "sensor")
    assert parse_spec(spec.model_dump(mode="json")) == spec  # round-trips
    assert parse_spec(spec_data()).element("sink").options["fields"] is None
    for fields, said in (([], "fields is empty"), (["a", "b", "a"], "fields names 'a' more "
                                                                     "than once")):  # fmt: skip
        data["elements"][2]["options"]["fields"] = fields
        with pytest.raises(InvalidSpec) as err:
            parse_spec(data)
        assert said in str(err.value) and err.value.hint, err.value


def test_event_timeout_s_bounds_a_processors_events_only() -> None:
    spec = parse_spec(spec_data())
    assert spec.element("own").event_timeout_s is None
    assert spec.element("own").event_timeout == DEFAULT_EVENT_TIMEOUT_S
    data = spec_data()
    data["elements"][1]["event_timeout_s"] = 2.5
    timed = parse_spec(data)
    assert timed.element("own").event_timeout == 2.5
    assert parse_spec(timed.model_dump(mode="json")) == timed  # round-trips
    for index, kind in ((0, "csv-source"), (2, "csv-sink")):
        bad = spec_data()
        bad["elements"][index]["event_timeout_s"] = 5
        with pytest.raises(InvalidSpec) as err:
            parse_spec(bad)
        assert f"a {kind!r} element" in str(err.value) and "runs none" in str(err.value)
        # What was expected, received and what to do, each in its place (the received was
        # the whole element, the hint the README's example).
        role = kind.split("-")[1]
        assert err.value.expected == "event_timeout_s on a processor only"
        assert err.value.received == f"event_timeout_s: 5 on a {role}"
        assert err.value.hint == "remove event_timeout_s"
    # (true passed for 1 s, and 1e-300 for a timer that fired at once: every event dead.)
    for value in (0, -1, 1e-300, MAX_EVENT_TIMEOUT_S * 2, "soon", True, "30"):
        bad = spec_data()
        bad["elements"][1]["event_timeout_s"] = value
        with pytest.raises(InvalidSpec, match="event_timeout_s"):
            parse_spec(bad)


def test_batch_timeout_s_is_any_elements_with_a_default_and_bounds() -> None:
    spec = parse_spec(spec_data())
    assert [e.batch_timeout for e in spec.elements] == [DEFAULT_BATCH_TIMEOUT_S] * 3
    data = spec_data()
    for element, seconds in zip(data["elements"], (1, 2.5, 600), strict=True):
        element["batch_timeout_s"] = seconds  # a source, a processor and a sink alike
    timed = parse_spec(data)
    assert [e.batch_timeout for e in timed.elements] == [1, 2.5, 600]
    assert parse_spec(timed.model_dump(mode="json")) == timed  # round-trips
    for value in (0, 0.5, -1, MAX_BATCH_TIMEOUT_S * 2, "soon", True, "30"):
        bad = spec_data()
        bad["elements"][1]["batch_timeout_s"] = value
        with pytest.raises(InvalidSpec, match="batch_timeout_s"):
            parse_spec(bad)


def test_the_steps_that_keep_a_patients_state_need_key_by() -> None:
    data = {"pipeline": "p", "elements": [
        {"id": "w", "kind": "ecg-source", "node": "n"},
        {"id": "b", "kind": "bandpass", "node": "n", "inputs": ["w"]},
    ]}  # fmt: skip
    with pytest.raises(InvalidSpec, match="keeps its state per patient") as err:
        parse_spec(data)
    assert err.value.expected and "key_by: patient" in err.value.expected
    assert (err.value.received, err.value.hint) == ("no key_by", "add key_by: patient")
    data["elements"][1]["key_by"] = "patient"
    assert parse_spec(data).element("b").options["high_hz"] == 40.0


@pytest.mark.parametrize(
    ("kind", "options", "said"),
    [
        # Each was accepted, then every window of it a dead letter, or no window sent.
        ("bandpass", {"low_hz": 50, "high_hz": 10}, "low_hz (50) is not below high_hz (10)"),
        ("amplify", {"calibration": {"p1": 0}}, "a number above 0"),
        ("ecg-source", {"window_s": 10, "duration_s": 1}, "window_s (10) is longer"),
        # A design scipy finds singular at these rates; samples overflowing to infinity; a
        # source whose first window was ages away.
        ("bandpass", {"low_hz": 1e-9, "high_hz": 40}, "a number of at least 0.01"),
        ("amplify", {"gain": 1e300}, "a number of at most 1000000"),
        ("ecg-source", {"speed": 1e-300}, "speed 1e-300 is too slow"),
    ],
)
def test_case2_options_that_cannot_work_are_refused_at_load(
    kind: str, options: dict[str, Any], said: str
) -> None:
    elements: list[dict[str, Any]] = [
        {"id": "w", "kind": "ecg-source", "node": "n"},
        {"id": "x", "kind": kind, "node": "n", "inputs": ["w"], "key_by": "patient"},
    ]
    if kind == "ecg-source":
        elements = [{"id": "w", "kind": "ecg-source", "node": "n", "options": options}]
    else:
        elements[1]["options"] = options
    with pytest.raises(InvalidSpec, match=re.escape(said)):
        parse_spec({"pipeline": "p", "elements": elements})


def test_partitions_and_detection_beyond_what_works_are_refused_at_load() -> None:
    data = spec_data()
    data["recovery"] = {"detect_after_s": 0.5}  # (nodes beat once a second)
    with pytest.raises(InvalidSpec, match="detect_after_s"):
        parse_spec(data)
    data = spec_data()
    data["elements"][1].pop("node", None)
    data["elements"][1].update(partitions=["n"] * 65, key_by="sensor")
    with pytest.raises(InvalidSpec, match="partitions"):
        parse_spec(data)


def test_refusals_say_in_words_what_was_expected() -> None:
    for where, value, words in (
        ("key_by", "patient.id", "the name of a top-level body field"),
        ("class", "procs", "module:ClassName"),
    ):
        bad = spec_data()
        if where == "key_by":
            bad["elements"][1]["key_by"] = value
        else:
            bad["elements"][1]["options"]["class"] = value
        with pytest.raises(InvalidSpec) as err:
            parse_spec(bad)
        text = err.value.render()
        assert words in text and "String should match pattern" not in text, text
    # A check of fogshift's own speaks alone, without pydantic's "Value error, ".
    bad = spec_data()
    bad["elements"][0]["event_timeout_s"] = 5
    with pytest.raises(InvalidSpec) as err:
        parse_spec(bad)
    assert "Value error" not in err.value.render() and "runs none" in err.value.render()


@pytest.mark.parametrize(("data", "received"), [(None, "an empty document"),
                                                ([1], "a list"), ("x", "text")])  # fmt: skip
def test_a_spec_that_is_no_mapping_says_what_it_is_and_where_to_start(
    data: Any, received: str
) -> None:
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    text = err.value.render()
    assert f"received: {received}" in text and "examples/case1/case1.yaml" in text, text


@pytest.mark.parametrize(
    "names", [{"inputs": ["src.>"]}, {"inputs": ["a", "b"], "merged": [["a", "*"]]}]
)
def test_an_element_as_a_request_carries_it_refuses_inputs_that_are_no_names(
    names: dict[str, list[Any]],
) -> None:
    # The agent takes an element from a request (PUT .../elements/E), not from a spec whose
    # inputs the loader matched against its ids: each input names subjects and a stream it
    # reads ("fs.p.src.>.data").
    element = {"id": "own", "kind": "custom", "node": "fog-a",
               "options": {"class": "procs:Mine"}, **names}  # fmt: skip
    with pytest.raises(ValidationError, match="should match pattern"):
        Deploy.model_validate({"element": element})
    element.update(inputs=["src"], merged=[])
    assert Deploy.model_validate({"element": element}).element.inputs == ("src",)
