"""Stream names: one per PE, no two PEs' the same (pure logic)."""

from __future__ import annotations

import itertools

from fogshift.broker.naming import stream_name
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
