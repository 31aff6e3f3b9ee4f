"""Stream names: one per PE, no two PEs' the same (pure logic); a stream an older fogshift
named otherwise (a real nats-server)."""

from __future__ import annotations

import itertools
import uuid

import pytest
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from fogshift.broker.client import SyncJetStream, delete_pe_stream, ensure_pe_stream
from fogshift.broker.exceptions import BrokerError
from fogshift.broker.naming import legacy_stream_name, stream_name, stream_subjects
from fogshift.common.names import NAME_PATTERN


def test_no_two_pes_share_a_stream() -> None:
    """Every pair of (pipeline, PE) names of up to four characters of ``a``, ``_`` and ``-``
    (the characters that could blur the join) gets its own stream."""
    names = [
        "".join(chars)
        for size in range(1, 5)
        for chars in itertools.product("a_-", repeat=size)
        if NAME_PATTERN.match("".join(chars))
    ]
    seen: dict[str, tuple[str, str]] = {}
    for pipeline, pe in itertools.product(names, repeat=2):
        name = stream_name(pipeline, pe)
        assert seen.setdefault(name, (pipeline, pe)) == (pipeline, pe), name
    assert len(seen) == len(names) ** 2
    # The case that shared one before, and a name without "_" as it always was.
    assert stream_name("a_b", "c") != stream_name("a", "b_c")
    assert stream_name("case1", "aggregate_x") == "FS_case1_aggregate_x"


def _legacy_stream(js_client: SyncJetStream, pipeline: str, pe: str) -> str:
    """The stream an older fogshift made for ``pe`` (``_`` in the pipeline not doubled)."""
    name = legacy_stream_name(pipeline, pe)
    config = StreamConfig(name=name, subjects=stream_subjects(pipeline, pe))
    js_client.run(lambda js: js.add_stream(config))
    return name


def _streams(js_client: SyncJetStream) -> set[str]:
    async def names(js: JetStreamContext) -> set[str]:
        return {s.config.name for s in await js.streams_info()}

    return js_client.run(names)


def test_a_stream_an_older_fogshift_named_is_replaced_on_deploy(js_client: SyncJetStream) -> None:
    pipeline = f"old_{uuid.uuid4().hex[:6]}"
    legacy = _legacy_stream(js_client, pipeline, "c")
    assert legacy != stream_name(pipeline, "c")
    # Without a fresh deploy, the new stream cannot be made: said so, with what to do.
    with pytest.raises(BrokerError, match=f"held by stream '{legacy}'") as refused:
        js_client.run(lambda js: ensure_pe_stream(js, pipeline, "c"))
    assert refused.value.hint is not None and f"fogshift stop {pipeline}" in refused.value.hint
    # A fresh deploy (what `deploy` does to each PE's stream) deletes it, then makes the new.
    js_client.run(lambda js: delete_pe_stream(js, pipeline, "c"))
    js_client.run(lambda js: ensure_pe_stream(js, pipeline, "c"))
    streams = _streams(js_client)
    assert stream_name(pipeline, "c") in streams and legacy not in streams


def test_another_pes_stream_of_the_legacy_name_is_left_alone(js_client: SyncJetStream) -> None:
    # Pipeline `a_b`'s PE `c` had FS_a_b_c, which is pipeline `a`'s PE `b_c`'s stream now.
    suffix = uuid.uuid4().hex[:6]
    pipeline, other = f"a{suffix}_b", f"a{suffix}"
    assert legacy_stream_name(pipeline, "c") == stream_name(other, "b_c")
    js_client.run(lambda js: ensure_pe_stream(js, other, "b_c"))
    js_client.run(lambda js: delete_pe_stream(js, pipeline, "c"))
    js_client.run(lambda js: ensure_pe_stream(js, pipeline, "c"))
    streams = _streams(js_client)
    assert {stream_name(other, "b_c"), stream_name(pipeline, "c")} <= streams
