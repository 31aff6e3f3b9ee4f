"""Key moves of a partitioned element with several inputs, against a real nats-server: each
move is stored in every input (the first first), a move an orchestrator left stored in some
only is appended to the others, and rescales and key groups are refused (no one append
lists every key of several inputs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fogshift.broker.client import (
    SyncJetStream,
    ensure_pe_stream,
    get_range,
    last_seq,
)
from fogshift.broker.keys import KeyMove, parse
from fogshift.broker.naming import keys_subject, stream_name
from fogshift.broker.server import BrokerProcess
from fogshift.exceptions import Conflict, FogshiftError, InvalidInput
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec

pytestmark = pytest.mark.integration

SPEC = {
    "pipeline": "two",
    "elements": [
        {"id": "s1", "kind": "csv-source", "node": "cloud", "options": {"path": "in1.csv"}},
        {"id": "s2", "kind": "csv-source", "node": "cloud", "options": {"path": "in2.csv"}},
        {"id": "agg", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b"],
         "key_by": "sensor", "inputs": ["s1", "s2"],
         "options": {"field": "value", "window": 3, "function": "avg"}},
        {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["agg"],
         "options": {"path": "out/o.csv"}},
    ],
}  # fmt: skip


@pytest.fixture
def orch(
    tmp_path: Path, nats_server: BrokerProcess, js_client: SyncJetStream
) -> Iterator[Orchestrator]:
    broker = nats_server.address.save(tmp_path / "broker.json")
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orchestrator = Orchestrator(config)
    orchestrator.registry.put_pipeline(parse_spec(SPEC, tmp_path), "running")  # type: ignore[arg-type]
    orchestrator.permissions = SimpleNamespace(sync=lambda registry: None)  # type: ignore[assignment]
    for name in ("s1", "s2"):
        js_client.run(lambda js, n=name: ensure_pe_stream(js, "two", n))
    try:
        yield orchestrator
    finally:
        orchestrator.close()


def moves(js: SyncJetStream, name: str) -> list[str]:
    """The ids of the key moves stored in input ``name``, in order."""
    stream = stream_name("two", name)

    async def read(j: Any) -> Any:
        return await get_range(j, stream, keys_subject("two", name), 0, await last_seq(j, stream))

    parsed = (parse(m.seq, m.data) for m in js.run(read))
    return [m.move for m in parsed if isinstance(m, KeyMove)]


def test_a_move_is_stored_in_every_input_and_one_left_half_way_is_completed(
    orch: Orchestrator, js_client: SyncJetStream
) -> None:
    first = KeyMove(0, "m1", "agg", ("k1",), 1)
    at = orch._append_move("two", ("s1", "s2"), first)
    assert moves(js_client, "s1") == ["m1"] and moves(js_client, "s2") == ["m1"]
    assert at == js_client.run(lambda j: last_seq(j, stream_name("two", "s1")))
    # An orchestrator died after storing m2 in the first input only: its key would wait at
    # its target for good, its origin for the move's place in s2.
    orch._append_key_record("two", "s1", KeyMove(0, "m2", "agg", ("k2",), 1).payload())
    orch._moves_complete.discard(("two", "agg"))  # (a new orchestrator knows none complete)
    records = orch.registry.pipelines()
    orch.complete_key_moves(records)
    assert moves(js_client, "s2") == ["m1", "m2"]
    orch.complete_key_moves(records)  # known complete now: nothing read or appended
    orch._moves_complete.discard(("two", "agg"))
    orch.complete_key_moves(records)  # checked again: nothing missing
    assert moves(js_client, "s1") == ["m1", "m2"] and moves(js_client, "s2") == ["m1", "m2"]


@pytest.mark.parametrize("request_kind", ["scale", "key group"])
def test_a_rescale_or_key_group_of_several_inputs_is_refused(
    orch: Orchestrator, request_kind: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        if request_kind == "scale":
            orch.scale("two", "agg", 3, ["fog-a"], timeout_s=0.1)
        else:
            orch.migrate_keys("two", "agg", [], "fog-b", group=(0, 2), timeout_s=0.1)
    assert "its partitions read 2 inputs" in refused.value.message
    assert refused.value.hint and "--keys" in refused.value.hint


def test_an_element_a_partitioned_reader_moved_keys_on_is_not_scaled_out_of_one_partition(
    tmp_path: Path, nats_server: BrokerProcess, js_client: SyncJetStream
) -> None:
    # Its reader would read two partitions merged, where keys cannot move: the keys moved
    # before would go back to their CRC-32 partitions, which hold no state for them. Before
    # any key of the reader moved, the scale goes ahead (here: to a node it does not know).
    spec = {
        "pipeline": "chain",
        "elements": [
            {"id": "src", "kind": "csv-source", "node": "cloud", "options": {"path": "i.csv"}},
            {"id": "up", "kind": "window-aggregate", "partitions": ["fog-a"], "key_by": "k",
             "inputs": ["src"], "options": {"field": "v", "window": 2}},
            {"id": "down", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b"],
             "key_by": "k", "inputs": ["up"], "options": {"field": "v", "window": 2}},
        ],
    }  # fmt: skip
    broker = nats_server.address.save(tmp_path / "broker.json")
    config = OrchestratorConfig(home=tmp_path, port=1, token="t" * 16, broker_file=broker)
    orchestrator = Orchestrator(config)
    js_client.run(lambda js: ensure_pe_stream(js, "chain", "up-p0"))
    try:
        orchestrator.registry.put_pipeline(parse_spec(spec, tmp_path), "running")  # type: ignore[arg-type]
        with pytest.raises(FogshiftError) as unmoved:
            orchestrator.scale("chain", "up", 2, ["fog-b"], timeout_s=0.1)
        assert "unknown node 'fog-b'" in unmoved.value.message
        orchestrator._append_key_record(
            "chain", "up-p0", KeyMove(0, "m1", "down", ("k1",), 1).payload()
        )
        with pytest.raises(InvalidInput) as refused:
            orchestrator.scale("chain", "up", 2, ["fog-b"], timeout_s=0.1)
        assert "the partitions of down read it, and keys of theirs moved" in refused.value.message
        assert refused.value.hint and "afresh" in refused.value.hint
        record = orchestrator.registry.get_pipeline("chain")
        assert record is not None and [e.id for e in record.spec.partitions_of("up")] == ["up-p0"]
    finally:
        orchestrator.close()


def test_a_key_move_planned_before_its_partitions_inputs_changed_is_refused(
    orch: Orchestrator,
) -> None:
    # A scale of an element the partitions read (merged from then on, where keys no longer
    # move) ran while the move waited for the element's lock: appended to the inputs it
    # planned on, it was ignored, and the command waited for states that never came.
    record = orch.registry.get_pipeline("two")
    assert record is not None
    parts = record.spec.partitions_of("agg")
    orch._unchanged("two", "agg", parts, "cannot move keys")  # as planned: goes ahead
    planned = [p.model_copy(update={"inputs": ("s1",)}) for p in parts]
    with pytest.raises(Conflict, match="its partitions changed while it waited"):
        orch._unchanged("two", "agg", planned, "cannot move keys")
