"""Spec validation: every refusal names the element and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from fogshift.spec import InvalidSpec, load_spec, parse_spec, validate_spec


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
    with pytest.raises(InvalidSpec, match=r"source .* takes no inputs"):
        parse_spec(data)
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
