"""Spec validation: every refusal names the element and what was expected."""

from __future__ import annotations

import datetime
import itertools
import os
import re
from pathlib import Path

import pytest
import yaml

from fogshift.spec import InvalidSpec, load_spec, parse_spec, validate_spec
from fogshift.spec.loader import load_spec_text

ROOT = Path(__file__).resolve().parents[2]


def case1(**changes: object) -> dict:
    spec = {
        "pipeline": "case1",
        "elements": [
            {"id": "source", "kind": "csv-source", "node": "cloud", "options": {"path": "in.csv"}},
            {
                "id": "aggregate",
                "kind": "window-aggregate",
                "node": "fog-a",
                "inputs": ["source"],
                "options": {"field": "value", "window": 3, "function": "avg"},
            },
            {
                "id": "sink",
                "kind": "csv-sink",
                "node": "cloud",
                "inputs": ["aggregate"],
                "options": {"path": "out/o.csv"},
            },
        ],
    }
    spec.update(changes)
    return spec


def test_valid_spec_resolves_paths_against_the_spec_folder(tmp_path: Path) -> None:
    spec = parse_spec(case1(), tmp_path)
    assert spec.element("source").options["path"] == str(tmp_path / "in.csv")
    assert spec.element("sink").options["path"] == str(tmp_path / "out" / "o.csv")
    assert [e.id for e in spec.topological_order()] == ["source", "aggregate", "sink"]


def test_unknown_kind_lists_the_known_ones() -> None:
    data = case1()
    data["elements"][1]["kind"] = "window-agg"
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "'aggregate'" in err.value.message
    assert "window-aggregate" in (err.value.expected or "")
    assert err.value.received == "'window-agg'"


def test_unknown_node_is_refused_with_the_known_nodes() -> None:
    spec = parse_spec(case1())
    with pytest.raises(InvalidSpec) as err:
        validate_spec(spec, nodes=["cloud", "fog-b"])
    assert "unknown node 'fog-a'" in err.value.message
    assert err.value.expected == "one of cloud, fog-b"


def test_missing_input_names_element_and_candidates() -> None:
    data = case1()
    data["elements"][2]["inputs"] = ["agg"]
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "element 'sink' has input 'agg'" in err.value.message
    assert "aggregate" in (err.value.expected or "")


def test_cycle_is_named() -> None:
    data = case1()
    data["elements"].append(
        {
            "id": "loop",
            "kind": "map",
            "node": "cloud",
            "inputs": ["aggregate"],
            "options": {"set": {"x": "value"}},
        }
    )
    data["elements"][1]["inputs"] = ["source", "loop"]
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "cycle" in err.value.message
    assert "aggregate -> loop -> aggregate" in err.value.message or "loop -> aggregate" in (
        err.value.message
    )


def test_missing_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "pipeline: p\nelements:\n"
        "  - {id: s, kind: csv-source, node: cloud, options: {path: nowhere.csv}}\n"
    )
    with pytest.raises(InvalidSpec) as err:
        load_spec(tmp_path / "p.yaml")
    assert "nowhere.csv" in err.value.message
    assert "element 's'" in err.value.message
    assert err.value.hint == f"relative paths are relative to {tmp_path}/"
    # An uploaded spec's are relative to the dashboard's --spec-dir, and the hint says so
    # (it said "the spec file", which an upload has none of).
    specs = tmp_path / "specs"
    specs.mkdir()
    with pytest.raises(InvalidSpec) as err:
        load_spec_text((tmp_path / "p.yaml").read_text(), specs, what="the uploaded spec")
    assert str(specs / "nowhere.csv") in err.value.message
    assert err.value.hint == f"relative paths are relative to {specs}/"


def test_a_path_that_cannot_be_the_file_it_names_is_refused(tmp_path: Path) -> None:
    # A sink's path naming a folder passed, and the deploy failed on the node with a 500
    # (after the previous run's streams were deleted); a source's folder failed in Spark.
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "data.csv").write_text("")
    for sink, received in (("out", "is a directory"), ("data.csv/o.csv", "is a file, not a")):
        sink_spec = case1()
        sink_spec["elements"][2]["options"]["path"] = sink
        spec = parse_spec(sink_spec, tmp_path)
        validate_spec(spec)  # the files are checked only when asked
        with pytest.raises(InvalidSpec) as err:
            validate_spec(spec, check_files=True)
        assert "sink 'sink'" in err.value.message and sink in err.value.message
        assert err.value.received is not None and received in err.value.received
        assert err.value.hint == "name a file, e.g. out/results.csv"
    source_spec = case1()
    source_spec["elements"][0]["options"]["path"] = "out"
    with pytest.raises(InvalidSpec) as err:
        validate_spec(parse_spec(source_spec, tmp_path), check_files=True)
    assert "(option `path`) is not a file" in err.value.message
    # A custom processor's `path` is a folder to import its class from.
    custom = case1()
    options = {"class": "m:C", "path": "out"}
    custom["elements"][1] = {"id": "aggregate", "kind": "custom", "node": "fog-a",
                             "inputs": ["source"], "options": options}  # fmt: skip
    validate_spec(parse_spec(custom, tmp_path), check_files=True)
    # A FIFO: emptying it at the deploy waited for a reader, holding the node's lock.
    os.mkfifo(tmp_path / "fifo")
    fifo = case1()
    fifo["elements"][2]["options"]["path"] = "fifo"
    with pytest.raises(InvalidSpec) as err:
        validate_spec(parse_spec(fifo, tmp_path), check_files=True)
    assert "is no regular file" in err.value.message and err.value.hint
    # A sink's file and folders that do not exist yet are fine: the deploy makes them.
    fine = case1()
    fine["elements"][2]["options"]["path"] = "out/new/o.csv"
    validate_spec(parse_spec(fine, tmp_path), check_files=True)


def test_a_path_the_os_will_not_look_up_is_refused_not_raised(tmp_path: Path) -> None:
    # Path.exists() raises for anything but a missing file: a name over 255 bytes gave
    # `fogshift validate` a traceback and the dashboard's deploy a 500.
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    for index, option in ((0, "path"), (2, "path")):
        data = case1()
        data["elements"][index]["options"][option] = "x" * 300 + ".csv"
        with pytest.raises(InvalidSpec) as err:
            validate_spec(parse_spec(data, tmp_path), check_files=True)
        element = data["elements"][index]["id"]
        assert f"element {element!r}" in err.value.message and "cannot be used" in err.value.message
        assert err.value.received is not None and "OSError" in err.value.received
        assert err.value.expected is not None and err.value.hint is not None


def test_bad_options_name_the_field() -> None:
    data = case1()
    data["elements"][1]["options"] = {"field": "value", "window": 0, "function": "median"}
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "options of element 'aggregate'" in err.value.message
    assert "window" in err.value.message and "function" in err.value.message


def test_source_with_inputs_and_processor_without() -> None:
    data = case1()
    data["elements"][0]["inputs"] = ["sink"]
    with pytest.raises(InvalidSpec, match=r"source .* takes no inputs") as refused:
        parse_spec(data)
    assert refused.value.hint and "remove 'source''s inputs" in refused.value.hint
    data = case1()
    data["elements"][1]["inputs"] = []
    with pytest.raises(InvalidSpec, match=r"'aggregate' .* has no inputs"):
        parse_spec(data)


def test_a_sink_cannot_feed_anything() -> None:
    data = case1()
    data["elements"].append(
        {
            "id": "s2",
            "kind": "csv-sink",
            "node": "cloud",
            "inputs": ["sink"],
            "options": {"path": "x"},
        }
    )
    with pytest.raises(InvalidSpec, match="'sink', which is a sink"):
        parse_spec(data)


def test_duplicate_ids_and_bad_names() -> None:
    data = case1()
    data["elements"][2]["id"] = "aggregate"
    with pytest.raises(InvalidSpec, match="two elements with id 'aggregate'"):
        parse_spec(data)
    with pytest.raises(InvalidSpec, match="pipeline"):
        parse_spec(case1(pipeline="has space"))


def test_yaml_errors_and_non_mappings(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("pipeline: [unclosed\n")
    with pytest.raises(InvalidSpec, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")
    with pytest.raises(InvalidSpec, match="must be a mapping"):
        parse_spec(["a", "list"])
    with pytest.raises(InvalidSpec, match="cannot read spec file"):
        load_spec(tmp_path / "absent.yaml")


def test_map_expression_is_checked_at_load() -> None:
    data = case1()
    data["elements"][1] = {
        "id": "aggregate",
        "kind": "map",
        "node": "fog-a",
        "inputs": ["source"],
        "options": {"set": {"double": "value *"}},
    }
    with pytest.raises(InvalidSpec, match="not a valid expression"):
        parse_spec(data)


@pytest.mark.parametrize(
    ("where", "said"),
    [
        # simpleeval took `status = 'ok'` for 'ok', true for every event; of `a; b` the first.
        ("status = 'ok'", "one expression"),
        ("value > 0; value < 9", "one expression"),
        ("import os", "one expression"),
        ("name.startswith('x')", "reads an attribute"),
        # The listed functions only: simpleeval added dict, list, set and tuple to them.
        ("len(list(name)) > 2", "calls list: expressions call only abs"),
        ("shout(name)", "calls shout"),
        # Parsed, then failed at every event (each a dead letter): no rule in the evaluator.
        ("(x := 1)", "uses NamedExpr, which expressions do not have"),
        ("lambda: 1", "uses Lambda"),
        ("max(*values)", "uses Starred"),
        ("{v for v in values}", "uses SetComp"),
    ],
)
def test_a_filter_that_is_not_one_expression_is_refused_at_load(where: str, said: str) -> None:
    data = case1()
    data["elements"][1] = {"id": "aggregate", "kind": "filter", "node": "fog-a",
                           "inputs": ["source"], "options": {"where": where}}  # fmt: skip
    with pytest.raises(InvalidSpec, match=said) as refused:
        parse_spec(data)
    # What expressions have, the expression, and where they are told (they had neither an
    # expected nor a hint but "see the spec example in the README").
    assert (refused.value.expected or "").startswith("one expression of fields, constants")
    assert refused.value.received == repr(where)
    assert "Pipeline spec" in (refused.value.hint or "")


@pytest.mark.parametrize(("field", "said"), [("  ", "is blank"), ("a\tb", "control character")])
def test_a_blank_field_or_one_with_a_control_character_says_what_was_expected(
    field: str, said: str
) -> None:
    data = case1()
    data["elements"][1]["options"]["field"] = field
    with pytest.raises(InvalidSpec, match=said) as refused:
        parse_spec(data)
    assert (refused.value.expected or "").startswith("printable text with at least one")
    assert refused.value.received == repr(field)
    assert "see the spec example" not in (refused.value.hint or "")


def test_shapes_that_could_not_be_exactly_once_are_refused(tmp_path: Path) -> None:
    data = case1()
    data["elements"].append(
        {
            "id": "sink2",
            "kind": "csv-sink",
            "node": "fog-b",
            "inputs": ["source"],
            "options": {"path": "out/../out/o.csv"},
        }
    )
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data, tmp_path)
    assert "sinks 'sink' and 'sink2'" in err.value.message
    assert err.value.expected == "one sink per output file"
    loop = case1()
    loop["elements"][2]["options"]["path"] = "in.csv"
    with pytest.raises(InvalidSpec, match="which sink 'sink' writes"):
        parse_spec(loop, tmp_path)
    twice = case1()
    twice["elements"][1]["inputs"] = ["source", "source"]
    with pytest.raises(InvalidSpec, match="same input twice"):
        parse_spec(twice, tmp_path)


def test_one_file_under_two_names_is_one_file_to_the_exactly_once_checks(tmp_path: Path) -> None:
    # `ln out/o.csv out/b.csv`: the paths differed, both sinks were taken, and the second's
    # append cut the file to its own marker's length (the first's committed rows gone).
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "o.csv").write_text("")
    (tmp_path / "out" / "b.csv").hardlink_to(tmp_path / "out" / "o.csv")
    (tmp_path / "in.csv").write_text("")
    data = case1()
    data["elements"].append({"id": "sink2", "kind": "csv-sink", "node": "fog-b",
                             "inputs": ["source"], "options": {"path": "out/b.csv"}})  # fmt: skip
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data, tmp_path)
    assert "sinks 'sink' and 'sink2'" in err.value.message
    assert err.value.received.startswith("sink.path and sink2.path: one file under two names")
    # Both names said (it named the second twice: "both write 'out/b.csv'").
    assert "o.csv' and '" in err.value.message and err.value.message.endswith("b.csv'")
    (tmp_path / "out" / "b.csv").unlink()
    # A symbolic link: it said "sink.path == sink2.path", the paths written differing.
    (tmp_path / "out" / "b.csv").symlink_to(tmp_path / "out" / "o.csv")
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data, tmp_path)
    assert "==" not in err.value.received and "links followed" in err.value.received
    (tmp_path / "out" / "b.csv").unlink()
    (tmp_path / "out" / "b.csv").write_text("")  # (its own file now: taken)
    assert parse_spec(data, tmp_path) is not None
    (tmp_path / "in.csv").unlink()
    (tmp_path / "in.csv").hardlink_to(tmp_path / "out" / "o.csv")
    loop = case1()  # the source reads in.csv: the sink's o.csv under another name
    with pytest.raises(InvalidSpec, match="which sink 'sink' writes"):
        parse_spec(loop, tmp_path)


def test_a_sink_may_not_write_another_sinks_exactly_once_marker(tmp_path: Path) -> None:
    # sink2 writing sink's marker would overwrite it (and sink's atomic replace sink2's file).
    # (And its lock: writing it was accepted.)
    for name in (".o.csv.fogshift.json", ".o.csv.fogshift.tmp", ".o.csv.fogshift.lock"):
        data = case1()
        sink = {"id": "sink2", "kind": "csv-sink", "node": "fog-b", "inputs": ["source"],
                "options": {"path": f"out/{name}"}}  # fmt: skip
        data["elements"].append(sink)
        with pytest.raises(InvalidSpec, match="exactly-once marker") as err:
            parse_spec(data, tmp_path)
        assert err.value.expected and err.value.received and err.value.hint


@pytest.mark.parametrize(
    ("place", "value", "said"),
    [
        (("elements", 0, "options", "rate"), float("inf"), "not a finite number"),
        (("elements", 0, "options", "rate"), float("nan"), "not a finite number"),
        (("elements", 0, "options", "rate"), 1e308, "more than any source takes"),
        (("recovery",), {"detect_after_s": float("inf")}, "not a finite number"),
        (("elements", 1, "options", "field"), "val\x00ue", "NUL character"),
        (("elements", 0, "options", "path"), "in\x00.csv", "NUL character"),
        # JSON cannot carry these to the orchestrator: a 500 there, a traceback in the CLI.
        (("elements", 1, "options", "field"), "val\ud800ue", "lone surrogate"),
        (("elements", 1, "options", "field"), b"\xff", "a bytes, which a spec cannot hold"),
        (("elements", 1, "options", "field"), datetime.date(2020, 1, 1), "a date, which"),
        (("elements", 1, "options"), {1: "a"}, "has key 1, which is not text"),
        # YAML's 0x… builds an integer of any size: the refusal's text, JSON and the deploy
        # failed on one of over 4300 digits.
        pytest.param(
            ("elements", 0, "options", "max_events_per_batch"),
            16**4000,
            "of 16001 bits",
            id="an-integer-of-4817-digits",
        ),
        (("elements", 1, "options", "window"), -(2**63), "of 64 bits"),
        (
            ("elements", 1, "options", "window"),
            [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
            "nests deeper",
        ),
    ],
)
def test_values_no_spec_can_hold_are_refused_at_load(
    place: tuple[object, ...], value: object, said: str
) -> None:
    # Each got through (a source then failed at its first batch, a deploy ended in a
    # traceback: JSON carries no inf), or ended in a traceback at load.
    data = case1()
    target: object = data
    for step in place[:-1]:
        target = target[step]  # type: ignore[index]
    target[place[-1]] = value  # type: ignore[index]
    with pytest.raises(InvalidSpec, match=said):
        parse_spec(data)


def test_text_that_nests_too_deep_is_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("pipeline: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(InvalidSpec, match="nests"):
        load_spec(tmp_path / "deep.yaml")
    data = case1()
    deep = "1+" * 100_000 + "1"
    data["elements"][1] = {"id": "aggregate", "kind": "map", "node": "fog-a",
                           "inputs": ["source"], "options": {"set": {"v": deep}}}  # fmt: skip
    with pytest.raises(InvalidSpec, match="nests too deep"):
        parse_spec(data)


def test_a_misspelt_kind_or_key_gets_a_did_you_mean() -> None:
    data = case1()
    data["elements"][1]["kind"] = "window-agregate"
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert err.value.hint == "did you mean 'window-aggregate'?"
    data = case1()
    data["elements"][1]["options"] = {"field": "value", "window": 3, "fucntion": "avg"}
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "options of element 'aggregate'" in err.value.message
    assert (err.value.hint or "").startswith("did you mean 'function'?")
    assert err.value.received == "unknown key 'fucntion'"
    assert err.value.expected == "keys known there: field, window, function, engine"
    data = case1()
    data["elements"][2]["input"] = data["elements"][2].pop("inputs")
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert (err.value.hint or "").startswith("did you mean 'inputs'?")
    data = case1(recovery={"detect_after": 3})
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert (err.value.hint or "").startswith("did you mean 'detect_after_s'?")


def test_several_misspelt_options_each_get_their_guess_and_far_ones_none() -> None:
    data = case1()
    data["elements"][1]["options"] = {"feild": "value", "windw": 3}
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "'field' for 'feild'" in (err.value.hint or "")
    assert "'window' for 'windw'" in (err.value.hint or "")
    data["elements"][1]["options"] = {"field": "value", "window": 3, "zzzz": 1}
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "did you mean" not in (err.value.hint or "")
    assert "field, window, function" in (err.value.hint or "")
    data = case1()
    data["elements"][1]["kind"] = "quantum"
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "did you mean" not in (err.value.hint or "")


def test_a_misspelt_input_or_node_gets_a_did_you_mean() -> None:
    data = case1()
    data["elements"][2]["inputs"] = ["agregate"]
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert err.value.hint == "did you mean 'aggregate'?"
    spec = parse_spec(case1())
    with pytest.raises(InvalidSpec) as err:
        validate_spec(spec, nodes=["cloud", "fog-b"])
    assert (err.value.hint or "").startswith("did you mean 'fog-b'?")
    # Case aside: `fog-A` is `fog-a`, not the `fog-b` difflib found closer, and `FOG-B`
    # (no suggestion at all) is `fog-b`.
    for placed, meant in (("fog-A", "fog-a"), ("FOG-B", "fog-b")):
        data = case1()
        data["elements"][1]["node"] = placed
        with pytest.raises(InvalidSpec) as err:
            validate_spec(parse_spec(data), nodes=["cloud", "fog-a", "fog-b"])
        assert (err.value.hint or "").startswith(f"did you mean {meant!r}?"), err.value.hint


def test_a_longer_cycle_is_named_in_the_direction_events_flow() -> None:
    data = case1()
    data["elements"] += [
        {"id": "m1", "kind": "map", "node": "cloud", "inputs": ["m3"],
         "options": {"set": {"x": "1"}}},
        {"id": "m2", "kind": "map", "node": "cloud", "inputs": ["m1"],
         "options": {"set": {"x": "1"}}},
        {"id": "m3", "kind": "filter", "node": "cloud", "inputs": ["m2"],
         "options": {"where": "x > 0"}},
    ]  # fmt: skip
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    named = err.value.message.split("has a cycle: ")[1]
    steps = named.split(" -> ")
    assert steps[0] == steps[-1] and sorted(steps[:-1]) == ["m1", "m2", "m3"]
    # m1 feeds m2, m2 feeds m3, m3 feeds m1: each step follows the data.
    inputs = {e["id"]: e.get("inputs", []) for e in data["elements"]}
    assert all(a in inputs[b] for a, b in itertools.pairwise(steps))
    # The hint names an input to remove, and removing it breaks the cycle.
    hint = re.fullmatch(r"remove one input along the cycle, e\.g\. '(\w+)' from '(\w+)''s "
                        r"inputs", err.value.hint or "")  # fmt: skip
    assert hint is not None
    (element,) = [e for e in data["elements"] if e["id"] == hint[2]]
    element["inputs"].remove(hint[1])
    element["inputs"].append("source")
    parse_spec(data)
    loop = case1()
    loop["elements"][1]["inputs"] = ["aggregate"]
    with pytest.raises(InvalidSpec, match="aggregate -> aggregate") as err:
        parse_spec(loop)
    assert err.value.hint and "'aggregate' from 'aggregate''s inputs" in err.value.hint


def test_topological_order_is_by_level_then_spec_order() -> None:
    data = case1()
    data["elements"][2]["inputs"] = ["aggregate", "side"]
    data["elements"].insert(
        0,
        {"id": "side", "kind": "map", "node": "cloud", "inputs": ["source"],
         "options": {"set": {"x": "1"}}},
    )  # fmt: skip
    spec = parse_spec(data)
    assert [e.id for e in spec.topological_order()] == ["source", "side", "aggregate", "sink"]


def test_a_standby_node_must_exist_and_host_no_pe_it_would_stand_by_for() -> None:
    def check(standby: str) -> None:
        data = case1(recovery={"standby": standby})
        data["elements"][2]["node"] = "fog-c"  # the sink
        validate_spec(parse_spec(data), nodes=["cloud", "fog-a", "fog-b", "fog-c"])

    check("planned")
    check("fog-c")  # only the sink is there: sinks have no standby
    with pytest.raises(InvalidSpec) as caught:
        check("fog-a")
    assert "hosts aggregate" in caught.value.message
    assert "standby: planned" in (caught.value.hint or "")
    with pytest.raises(InvalidSpec) as caught:
        check("fog-d")
    assert caught.value.received == "'fog-d'" and "'planned'" in (caught.value.expected or "")
    with pytest.raises(InvalidSpec):
        parse_spec(case1(recovery={"standby": "no such/node"}))


def test_the_functions_an_expression_may_call_are_those_listed() -> None:
    from fogshift.spec.expressions import FUNCTIONS, evaluator

    listed = {"abs", "min", "max", "round", "int", "float", "str", "len", "sqrt", "isfinite"}
    assert set(evaluator().functions) == listed and set(FUNCTIONS) == listed


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"pipeline": "case1.v2"}, "1 to 63 letters, digits, '_' or '-'"),
        ({"recovery": {"detect_after_s": 0.5}}, "a number of at least 2"),
    ],
)
def test_a_refused_field_says_what_was_expected_in_words(
    change: dict[str, object], expected: str
) -> None:
    # It said "String should match pattern '^[A-Za-z0-9]...'", with no expected at all.
    data = {**case1(), **change}
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(data)
    assert (refused.value.expected or "").startswith(expected)
    assert "pattern" not in refused.value.message


@pytest.mark.parametrize(
    ("element", "options", "said", "expected"),
    [
        # A boolean is no number, nor a number a boolean (it was `window: true`, a window
        # of one; `keep: 1`, true).
        (1, {"field": "value", "window": True}, "window", "a whole number"),
        (0, {"path": "in.csv", "rate": True}, "rate", "a number"),
        # A blank field name, or a path with a newline, is a typing mistake, not a name.
        (1, {"field": "  ", "window": 3}, "is blank", None),
        (2, {"path": "out/o.csv\n"}, "control character", None),
        (2, {"path": "out/\to.csv"}, "control character", None),
        (2, {"path": "out/\x85o.csv"}, "control character", None),
        (1, {"field": "val\u2028ue", "window": 3}, "control character", None),
    ],
)
def test_options_of_the_wrong_type_or_invisible_text_are_refused(
    element: int, options: dict[str, object], said: str, expected: str | None
) -> None:
    data = case1()
    data["elements"][element]["options"] = options
    with pytest.raises(InvalidSpec, match=said) as refused:
        parse_spec(data)
    if expected is not None:
        assert refused.value.expected == expected
    assert refused.value.received


def test_a_map_may_not_set_a_blank_field_nor_keep_a_number() -> None:
    data = case1()
    data["elements"][1] = {"id": "aggregate", "kind": "map", "node": "fog-a",
                           "inputs": ["source"], "options": {"set": {" ": "value"}}}  # fmt: skip
    with pytest.raises(InvalidSpec, match="is blank"):
        parse_spec(data)
    data["elements"][1]["options"] = {"set": {"double": "value * 2"}, "keep": 1}
    with pytest.raises(InvalidSpec, match="keep") as refused:
        parse_spec(data)
    assert refused.value.expected == "true or false"


def test_an_input_named_twice_or_a_sink_as_input_says_expected_received_and_a_hint() -> None:
    data = case1()
    data["elements"][1]["inputs"] = ["source", "source"]
    with pytest.raises(InvalidSpec, match="names the same input twice") as refused:
        parse_spec(data)
    assert refused.value.expected == "each input once"
    assert refused.value.received == "inputs: ['source', 'source']"
    assert "'source'" in (refused.value.hint or "")
    data = case1()
    data["elements"].append({"id": "more", "kind": "csv-sink", "node": "cloud",
                             "inputs": ["sink"], "options": {"path": "out/p.csv"}})  # fmt: skip
    with pytest.raises(InvalidSpec, match="is a sink") as refused:
        parse_spec(data)
    assert refused.value.received == "'sink' (csv-sink, a sink)"
    assert refused.value.expected and refused.value.hint


def test_a_spec_file_that_cannot_be_read_says_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="cannot read spec file") as refused:
        load_spec(tmp_path / "absent.yaml")
    assert refused.value.expected == "a readable YAML file"
    assert "absent.yaml" in (refused.value.received or "")
    assert "path" in (refused.value.hint or "")


@pytest.mark.parametrize("example", ["case2.yaml", "case2-twins.yaml"])
def test_a_band_above_half_the_sources_sampling_rate_is_refused_at_load(example: str) -> None:
    # Every window would have been a dead letter, found only once the pipeline ran.
    data = yaml.safe_load((ROOT / "examples" / "case2" / example).read_text())
    bandpass = next(e for e in data["elements"] if e["kind"] == "bandpass")
    source = next(e for e in data["elements"] if e["kind"] == "ecg-source")
    parse_spec(data)  # 0.5-40 Hz under 125 Hz
    bandpass["options"] = {"low_hz": 0.5, "high_hz": 125}
    with pytest.raises(InvalidSpec, match="passes up to 125 Hz") as refused:
        parse_spec(data)
    assert (
        refused.value.expected == f"high_hz below 125 (half the sampling rate of {source['id']!r})"
    )
    assert refused.value.received == "high_hz: 125"
    source["options"]["sampling_rate"] = 500  # the hint's way out
    parse_spec(data)
    # A custom processor between them may resample: what lies beyond it is not judged.
    source["options"]["sampling_rate"] = 250
    amplify = next(e for e in data["elements"] if e["kind"] == "amplify")
    amplify.update(kind="custom", options={"class": "resample:Up"})
    parse_spec(data)


@pytest.mark.parametrize("example", ["case2.yaml", "case2-twins.yaml"])
def test_a_calibration_of_a_patient_no_source_sends_is_refused_at_load(example: str) -> None:
    # `p1` for `p01`: that wearable's gain was silently never undone, every window.
    data = yaml.safe_load((ROOT / "examples" / "case2" / example).read_text())
    amplify = next(e for e in data["elements"] if e["kind"] == "amplify")
    parse_spec(data)  # p01-p06 of its six patients
    amplify["options"]["calibration"] = {"p1": 1.4, "p02": 1.1}
    with pytest.raises(InvalidSpec, match="calibrates 'p1', which no ecg-source") as refused:
        parse_spec(data)
    assert refused.value.received == "p1"
    assert (refused.value.hint or "").startswith("did you mean 'p01'?")
    source = next(e for e in data["elements"] if e["kind"] == "ecg-source")
    source["options"]["patients"] = 1  # p02 is none of its patients now either
    amplify["options"]["calibration"] = {"p01": 1.4, "p02": 1.1}
    with pytest.raises(InvalidSpec, match="calibrates 'p02'"):
        parse_spec(data)
    # Behind another kind (a map may name patients its own way), nothing is judged.
    source["options"]["patients"] = 6
    amplify["options"]["calibration"] = {"anyone": 1.0}
    data["elements"].insert(1, {"id": "rename", "kind": "map", "node": source["node"],
                                "inputs": [source["id"]],
                                "options": {"set": {"patient": "\"x\" + patient"}}})  # fmt: skip
    amplify["inputs"] = ["rename"]
    parse_spec(data)


@pytest.mark.parametrize(
    ("option", "value", "expected", "hint"),
    [
        ("rate", 2e6, "rate at most 1,000,000", "0 means 'as fast as it can'"),
        ("max_events_per_batch", 10**9, "max_events_per_batch at most 10,000,000",
         "a smaller bound only makes more batches"),
    ],
)  # fmt: skip
def test_a_source_option_above_its_bound_says_the_bound_and_what_to_do(
    option: str, value: object, expected: str, hint: str
) -> None:
    # The batch bound's hint spoke of rates ("0 means 'as fast as it can'").
    data = case1()
    data["elements"][0]["options"][option] = value
    with pytest.raises(InvalidSpec, match="more than any source takes") as refused:
        parse_spec(data)
    assert refused.value.expected == expected
    assert hint in (refused.value.hint or "")


def test_a_source_paced_to_seem_stuck_is_refused_and_zero_is_as_fast_as_it_can() -> None:
    data = case1()
    data["elements"][0]["options"]["rate"] = 1e-300
    with pytest.raises(InvalidSpec, match="rate 1e-300 is too slow") as refused:
        parse_spec(data)
    assert refused.value.expected == "0 (as fast as possible) or at least 0.001 events per second"
    for rate in (0, 0.001, 0.5):
        data["elements"][0]["options"]["rate"] = rate
        assert parse_spec(data).element("source").options["rate"] == rate


def test_numbers_as_yaml_writes_them_are_numbers(tmp_path: Path) -> None:
    # YAML 1.1 reads `1e3` as text: a strict model refused it (it read `"3"` as text too).
    (tmp_path / "in.csv").write_text("value\n1\n")
    text = (
        "pipeline: numbers\nelements:\n"
        "  - {id: source, kind: csv-source, node: cloud, options: {path: in.csv, rate: 1e3}}\n"
        "  - {id: aggregate, kind: window-aggregate, node: fog-a, inputs: [source],\n"
        "     options: {field: value, window: 10.0}}\n"
        "  - {id: sink, kind: csv-sink, node: cloud, inputs: [aggregate],\n"
        "     options: {path: out/o.csv}}\n"
    )
    (tmp_path / "s.yaml").write_text(text)
    spec = load_spec(tmp_path / "s.yaml")
    assert spec.element("source").options["rate"] == 1000.0
    assert spec.element("aggregate").options["window"] == 10


def test_an_element_that_is_no_mapping_says_what_an_element_is() -> None:
    data = case1()
    data["elements"][0] = "source"
    with pytest.raises(InvalidSpec) as err:
        parse_spec(data)
    assert "elements[0]" in err.value.message
    assert (err.value.expected, err.value.received) == ("a mapping (e.g. {key: value})", "'source'")


def test_a_node_refuses_a_sink_it_cannot_write_and_a_source_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Passed by a node's check, a sink the node's user may not write was refused at its
    # start, after the deploy had made the streams anew and emptied other sinks' files; a
    # source it may not read failed at its first look, after "deployed". (The tests run as
    # root, whom no permission stops: the node's user is stood in for by `os.access`.)
    from fogshift.spec import loader
    from fogshift.spec.loader import check_element_files

    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    (tmp_path / "locked").mkdir()
    spec = parse_spec(case1(), tmp_path)
    source = next(e for e in spec.elements if e.role == "source")
    sink = next(e for e in spec.elements if e.role == "sink")
    locked = {**sink.options, "path": str(tmp_path / "locked" / "o.csv")}
    sink = sink.model_copy(update={"options": locked})
    denied = {str(tmp_path / "locked"), str(tmp_path / "in.csv")}
    monkeypatch.setattr(loader.os, "access", lambda path, mode: str(path) not in denied)
    with pytest.raises(InvalidSpec, match="cannot be written on node 'fog-a'") as refused:
        check_element_files(sink, node="fog-a")
    assert refused.value.received == f"no write permission on {tmp_path / 'locked'}"
    # A file it may write, in a folder it may not: the sink's marker and lock go beside it.
    (tmp_path / "locked" / "kept.csv").write_text("")
    kept = sink.model_copy(
        update={"options": {**sink.options, "path": str(tmp_path / "locked" / "kept.csv")}}
    )
    with pytest.raises(InvalidSpec, match="cannot be written on node 'fog-a'") as refused:
        check_element_files(kept, node="fog-a")
    assert refused.value.received == f"no write permission on {tmp_path / 'locked'}"
    with pytest.raises(InvalidSpec, match=r"in\.csv' \(option `path`\) cannot be read on node"):
        check_element_files(source, node="fog-a")
    # Where the spec is loaded (the CLI's host, another user), permissions are not judged.
    check_element_files(sink)
    check_element_files(source)


def test_a_number_too_long_to_write_is_refused_not_a_crash(tmp_path: Path) -> None:
    # Python writes no integer of over 4300 digits as text: the refusal quoting it failed
    # itself (a traceback from `validate`, a 500 from the dashboard's deploy).
    huge = "0x" + "f" * 3600
    text = f"pipeline: x\n? {huge}\n: 1\n"
    with pytest.raises(InvalidSpec, match="has key an integer of 14400 bits, which is not text"):
        load_spec_text(text, tmp_path)
