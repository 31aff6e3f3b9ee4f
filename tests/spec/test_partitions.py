"""Partitioned keyed PEs in the spec: one element written, its partitions validated."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from fogshift.spec import InvalidSpec, parse_spec
from fogshift.spec.loader import check_fresh
from fogshift.spec.models import PipelineSpec, partition_id, partition_of_key, partitioned


def data(**aggregate: Any) -> dict[str, Any]:
    element = {
        "id": "agg",
        "kind": "window-aggregate",
        "inputs": ["src"],
        "key_by": "sensor",
        "partitions": ["a", "b", "c"],
        "options": {"field": "value", "window": 5, "function": "avg"},
    }
    element.update(aggregate)
    return {
        "pipeline": "p",
        "elements": [
            {"id": "src", "kind": "csv-source", "node": "a", "options": {"path": "in.csv"}},
            {k: v for k, v in element.items() if v is not None},
            {"id": "sink", "kind": "csv-sink", "node": "c", "inputs": ["agg"],
             "options": {"path": "out.csv"}},
        ],
    }  # fmt: skip


def test_a_partitioned_element_becomes_its_partitions_and_its_readers_read_them_all() -> None:
    spec = parse_spec(data())
    assert [(e.id, e.node) for e in spec.elements] == [
        ("src", "a"), ("agg-p0", "a"), ("agg-p1", "b"), ("agg-p2", "c"), ("sink", "c")
    ]  # fmt: skip
    parts = spec.partitions_of("agg")
    assert [(p.partition.index, p.partition.count) for p in parts if p.partition] == [
        (0, 3), (1, 3), (2, 3)
    ]  # fmt: skip
    assert all(p.inputs == ("src",) and p.key_by == "sensor" for p in parts)
    assert spec.element("sink").inputs == ("agg-p0", "agg-p1", "agg-p2")
    # The sink meets a key's records in input order whichever partition holds it.
    assert spec.element("sink").merged == (("agg-p0", "agg-p1", "agg-p2"),)
    # Stored and read back, the same spec (merged runs of inputs are checked).
    assert PipelineSpec.model_validate_json(spec.model_dump_json()) == spec
    apart = spec.element("sink").model_copy(update={"merged": (("agg-p0", "agg-p2"),)})
    with pytest.raises(ValueError, match="next to each other"):
        type(apart).model_validate(apart.model_dump(mode="json"))
    assert spec.partitions_of("sink") == []
    # As the registry keeps it: read back, the same spec (nothing is partitioned twice).
    assert PipelineSpec.model_validate_json(spec.model_dump_json()) == spec


def test_keys_spread_over_the_partitions_as_crc32_says() -> None:
    owners = [partition_of_key(f"s{k}", 3) for k in range(300)]
    assert owners == [zlib.crc32(f"s{k}".encode()) % 3 for k in range(300)]
    assert all(owners.count(i) > 60 for i in range(3))
    assert partition_of_key(None, 3) == 0  # keyless events: dead letters of partition 0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"key_by": None}, "add key_by"),
        ({"node": "b"}, "remove node: b"),
        ({"partitions": []}, "has 0, at least 1 expected"),
        ({"partitions": ["a", "bad node"]}, "partitions"),
        ({"id": "x" * 62}, "longer than 63 characters"),
        # A key move's record carries fogshift_key_move beside the key: the key was lost.
        ({"key_by": "fogshift_key_move"}, "are fogshift's own"),
    ],
)
def test_a_bad_partitioned_element_is_refused_with_what_to_write(
    change: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(data(**change))
    assert says in refused.value.render()
    if "partitions" not in change:  # (fogshift's own checks, not a field's type)
        assert refused.value.expected and refused.value.received and refused.value.hint
        assert refused.value.hint != "see the spec example in the README"


def test_partitions_written_by_hand_must_own_every_key_once() -> None:
    spec = parse_spec(data()).model_dump(mode="json")
    missing = {**spec, "elements": [e for e in spec["elements"] if e["id"] != "agg-p1"]}
    missing["elements"][-1]["inputs"] = ["agg-p0", "agg-p2"]
    missing["elements"][-1]["merged"] = [["agg-p0", "agg-p2"]]
    with pytest.raises(InvalidSpec, match="do not own every key once"):
        parse_spec(missing)
    unlike = parse_spec(data()).model_dump(mode="json")
    unlike["elements"][2]["options"]["window"] = 6
    with pytest.raises(InvalidSpec, match="differ in more than their node") as refused:
        parse_spec(unlike)
    assert refused.value.received == "'agg-p0' and 'agg-p1' differ in options"
    taken = data()
    taken["elements"].append(
        {"id": "agg-p1", "kind": "map", "node": "a", "inputs": ["src"],
         "options": {"set": {"v": "value"}}}
    )  # fmt: skip
    # (Not "two elements with id 'agg-p1'": the spec wrote it once; fogshift made the other.)
    with pytest.raises(InvalidSpec, match="'agg-p1' is named as a partition of the partitioned"):
        parse_spec(taken)
    # Nor one a later `scale` would add: it would share its stream, placement and epoch.
    ahead = data()
    ahead["elements"].append(
        {"id": "agg-p3", "kind": "map", "node": "a", "inputs": ["src"],
         "options": {"set": {"v": "value"}}}
    )  # fmt: skip
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(ahead)
    assert "element 'agg-p3' is named as a partition of the partitioned element 'agg'" in (
        refused.value.message
    )
    assert refused.value.hint == "rename element 'agg-p3'"
    # Ownership from another count than its siblings': keys with two owners, or none.
    based = parse_spec(data()).model_dump(mode="json")
    (p0,) = [e for e in based["elements"] if e["id"] == "agg-p0"]
    p0["partition"]["base"] = 1
    with pytest.raises(InvalidSpec, match="differ in more than their node") as refused:
        parse_spec(based)
    assert refused.value.received == "'agg-p0' and 'agg-p1' start from different counts"


def test_merged_inputs_are_only_one_elements_partitions_read_together() -> None:
    # Written by hand over a partitioned input, merged named ids the expansion replaced: the
    # spec was accepted and stored, and every read of the registry failed after (a 500 for
    # every pipeline) as the stored spec did not validate.
    two = data()
    two["elements"].append({"id": "src2", "kind": "csv-source", "node": "a",
                            "options": {"path": "in2.csv"}})  # fmt: skip
    two["elements"][2].update(inputs=["agg", "src2"], merged=[["agg", "src2"]])
    with pytest.raises(InvalidSpec, match="are not the partitions of one element"):
        parse_spec(two)
    # Nor may it merge one partitioned element's records with another input's.
    spec = parse_spec(data()).model_dump(mode="json")
    spec["elements"].append({"id": "src2", "kind": "csv-source", "node": "a",
                             "options": {"path": "in2.csv"}})  # fmt: skip
    sink = spec["elements"][-2]
    sink.update(inputs=[*sink["inputs"], "src2"], merged=[[*sink["inputs"], "src2"]])
    with pytest.raises(InvalidSpec, match="are not the partitions of one element"):
        parse_spec(spec)
    # Partitions listed one by one are read in order, not merged: a moved key's records
    # reached the reader out of their input order.
    apart = parse_spec(data()).model_dump(mode="json")
    apart["elements"][-1].update(inputs=["agg-p2", "agg-p0", "agg-p1"], merged=[])
    with pytest.raises(InvalidSpec, match="one by one"):
        parse_spec(apart)
    # Nor one alone: it would see only that partition's keys, a moved one vanishing.
    alone = parse_spec(data()).model_dump(mode="json")
    alone["elements"][-1].update(inputs=["agg-p1"], merged=[])
    with pytest.raises(InvalidSpec, match="reads partition 'agg-p1' of 'agg' alone"):
        parse_spec(alone)
    # What the expansion writes is valid, stored and read back.
    spec = parse_spec(data())
    assert parse_spec(spec.model_dump(mode="json")) == spec


def test_a_fresh_deployment_starts_every_partition_at_the_input_s_start() -> None:
    """``since`` and ``base`` are what `scale` stores; deployed afresh (new streams), a
    partition reading after ``since`` would skip events."""
    check_fresh(parse_spec(data()))
    for field, value in (("since", 1000), ("since", {"src": 0, "more": 7}), ("base", 1)):
        spec = parse_spec(data()).model_dump(mode="json")
        for element in spec["elements"]:
            if element.get("partition"):
                element["partition"][field] = value
        with pytest.raises(InvalidSpec, match="deployed afresh from where a scale left it"):
            check_fresh(parse_spec(spec))  # (a stored spec: parsed, and refused to deploy)


def test_the_case2_twins_example_splits_the_classifier_and_can_move_its_keys() -> None:
    from fogshift.spec import load_spec
    from fogshift.spec.examples import example_path

    spec = load_spec(example_path("case2", "case2-twins.yaml"))
    parts = spec.partitions_of("classify")
    assert [(p.id, p.node) for p in parts] == [
        ("classify-p0", "gateway-a"), ("classify-p1", "gateway-b")
    ]  # fmt: skip
    # One input each (bandpass): where a key changes owner is one position in it.
    assert all(p.inputs == ("bandpass",) and p.key_by == "patient" for p in parts)
    assert spec.element("alarms").inputs == ("classify-p0", "classify-p1")


@pytest.mark.parametrize("partitions", [3, [], "a"])
def test_partitions_that_are_no_list_of_nodes_are_refused_for_what_they_are(
    partitions: Any,
) -> None:
    # (A count, as `scale --partitions 3` takes, was refused for a node the spec never wrote.)
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(data(partitions=partitions))
    text = refused.value.render()
    assert "partitions" in text and ".node" not in text and "'-'" not in text, text


def test_a_partitions_id_gives_back_its_element_and_only_for_its_index() -> None:
    # (The broker's rights of a partition's node name its element's subjects.)
    for element in ("agg", "a-p1", "x-p"):
        assert partitioned(partition_id(element, 12), 12) == element
    for partition, index in (
        ("agg-p1", 2),
        ("agg-p12", 2),
        ("-p0", 0),
        ("agg", 0),
        ("agg-p-1", -1),
    ):
        with pytest.raises(ValueError, match="not the id of a partition"):
            partitioned(partition, index)
