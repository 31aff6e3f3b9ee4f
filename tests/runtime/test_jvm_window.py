"""``window-aggregate`` with ``engine: jvm`` gives what the Python processor gives.

The JVM operator (``fogshift/runtime/java/WindowAggregate.java``) runs in a real Spark
streaming query over input files, in several batches and across a restart from its
checkpoint; the reference is the Python processor (``runtime/operators/window.py``) run
over the same rows by ``run_events``. Every output must be the same value of the same type
(an int stays an int, -0.0 stays -0.0), and every dead letter the same event.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fogshift.events import (
    DEFAULT_MAX_RECORD_BYTES,
    NOT_AN_EVENT,
    NOT_AN_EVENT_WHY,
    fit_dead_letter,
)
from fogshift.runtime.batch import run_events
from fogshift.runtime.engine import not_printable
from fogshift.runtime.jvm_classes import jar_path
from fogshift.runtime.operators.window import WindowAggregate

pytestmark = pytest.mark.integration

EVENT_SCHEMA = "origin long, seq long, timestamp double, creator string, body string"

#: Bodies no aggregate may take (each a dead letter, the window as before it).
BAD = [
    '{"v": "7"}', '{"v": null}', '{"v": true}', '{"v": NaN}', '{"v": Infinity}',
    '{"v": -Infinity}', '{"v": 1e400}', '{"v": [1]}', '{"v": {"w": 1}}', '{"w": 1}', "{}",
    "[1, 2]", '"text"', "7", "", "not json", '{"v": 1} trailing', '{"v": 1,}',
    '{"v": ' + "9" * 400 + "}", '{"v": ' + "[" * 3000 + "]" * 3000 + "}",
    '{"v": 1, "w": +Infinity}', '{"v": -INF}', '{"v": 1, "w": INF}',
    '{"w": ' + "7" * 5000 + ', "v": 1}', '{"v": "it\'s"}', r'{"v": "a\u0000b\u00e9"}',
    r'{"\u00e9": 1, "\ud83d\ude00": 2, "\uffff": 3, "z": 4}', '{"v": {"k": [1.5, null]}}',
    '{"v": "\U0001fae0"}', '{"\U0001fae0": 1}',
]  # fmt: skip
#: Valid events Jackson's defaults would refuse: Python reads any length of float, name and
#: string.
LONG = ['{"v": 1.' + "0" * 5000 + "}", '{"v": 2, "' + "n" * 60_000 + '": 0}',
        '{"v": 3, "w": "' + "s" * 100_000 + '"}']  # fmt: skip


def corpus(seed: int, count: int) -> list[str]:
    """Event bodies: valid values of every kind Python tells apart, and bad ones."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.12:
            bodies.append(rng.choice(BAD))
            continue
        if pick < 0.13:
            bodies.append(rng.choice(LONG))
            continue
        if pick < 0.35:
            value: Any = rng.randint(-1000, 1000)
        elif pick < 0.45:
            value = rng.choice([10**20, -(10**19) - 7, 2**63, 0, 10**300])
        elif pick < 0.55:
            value = rng.choice([1e308, -1e308, 1.7e308, 5e-324, -0.0, 0.0, 1e16, 0.1])
        else:
            value = rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-8, 8)
        extra = {"w": rng.random()} if rng.random() < 0.3 else {}
        bodies.append(json.dumps({**extra, "v": value, "v2": 1}))
    return bodies


def rows_of(bodies: list[str], first: int = 1) -> list[tuple[int, int, float, str, str]]:
    return [(first + n, first + n, 1000.0 + n, "src", b) for n, b in enumerate(bodies)]


def typed(body: str) -> str:
    """The output's value as Python reads it, type and sign included."""
    return repr(json.loads(body)["v"])


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fogshift.runtime.session import build_session

    assert jar_path().is_file(), "make setup compiles fogshift's JVM classes"
    session = build_session("jvm-window", "local[2]", str(tmp_path_factory.mktemp("local")))
    yield session
    session.stop()


def run_batches(
    spark: Any, work: Path, batches: list[list[tuple]], output: Callable[[Any], Any]
) -> list[tuple[int, Any]]:
    """``(batch, row)`` of each row ``output`` makes of the input events (a streaming
    DataFrame of ``EVENT_SCHEMA`` rows) over ``batches``: one input file each, the query
    started again from its checkpoint for each."""
    from pyspark.sql import functions as F  # noqa: N812

    inbox = work / "in"
    inbox.mkdir(parents=True)
    got: list[tuple[int, Any]] = []
    for n, batch in enumerate(batches):
        lines = [
            json.dumps(dict(zip(("origin", "seq", "timestamp", "creator", "body"), r, strict=True)))
            for r in batch
        ]
        (inbox / f"{n:03d}.json").write_text("\n".join(lines) + "\n")
        events = spark.readStream.schema(EVENT_SCHEMA).json(str(inbox))
        query = (
            output(events).withColumn("batch", F.lit(n))
            .writeStream.foreachBatch(lambda df, _: got.extend((r.batch, r) for r in df.collect()))
            .option("checkpointLocation", str(work / "checkpoint"))
            .start()
        )  # fmt: skip
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    return got


def run_jvm(
    spark: Any,
    work: Path,
    batches: list[list[tuple]],
    function: str,
    window: int,
    field: str = "v",
    limit: int = DEFAULT_MAX_RECORD_BYTES,
) -> list[Any]:
    """The JVM operator's output rows over ``batches``, one batch each, restarted from its
    checkpoint after the first."""
    from pyspark.sql import DataFrame

    def output(events: Any) -> Any:
        operator = spark._jvm.fogshift.ops.WindowAggregate
        processor = operator(
            "agg", field, window, function, NOT_AN_EVENT, NOT_AN_EVENT_WHY, limit, not_printable()
        )
        return DataFrame(operator.apply(events._jdf, processor), spark)

    return [row for _, row in run_batches(spark, work, batches, output)]


@pytest.mark.parametrize(
    ("function", "window", "seed"),
    [("avg", 3, 1), ("sum", 4, 2), ("min", 5, 3), ("max", 2, 4), ("count", 3, 5), ("avg", 1, 6)],
)
def test_jvm_window_matches_the_python_processor(
    spark: Any, tmp_path: Path, function: str, window: int, seed: int
) -> None:
    bodies = corpus(seed, 240)
    rows = rows_of(bodies)
    rows.insert(57, (58, 57, 1057.0, NOT_AN_EVENT, "raw bytes"))  # a foreign message
    rows = [(n + 1, *r[1:]) for n, r in enumerate(rows)]
    # Three batches, the second's rows out of input order (Spark does not keep it).
    batches = [rows[:100], list(reversed(rows[100:180])), rows[180:]]
    got = {r.origin: r for r in run_jvm(spark, tmp_path, batches, function, window)}
    options = {"field": "v", "window": window, "function": function}
    expected = {r[0]: r for r in run_events(WindowAggregate.build(options, "agg", None), rows)}
    assert sorted(got) == sorted(expected) == [r[0] for r in rows]
    dead = [o for o, r in expected.items() if r[6] is not None]
    assert [o for o, r in got.items() if r.dead is not None] == dead
    assert len(dead) >= 20  # the corpus's bad events, and overflowing sums
    same_as_python(got, expected)


def same_as_python(
    got: dict[int, Any], expected: dict[int, tuple], limit: int = DEFAULT_MAX_RECORD_BYTES
) -> None:
    """The JVM's rows are Python's: the same text of every output and dead letter, and the
    same reason but where Python's JSON parser words its own (its errors, its recursion).
    (The JVM's dead letters carry their input whole: cut here as the writer cuts them.)"""
    for origin, want in expected.items():
        row = got[origin]
        assert (row.seq, row.timestamp, row.creator, row.idx) == (want[2], want[3], "agg", 0)
        body, dead = row.body, row.dead
        if dead is not None:
            body, dead = fit_dead_letter(row.seq, row.timestamp, "agg", body, dead, limit)
        assert body == want[5], (origin, body[:200], want[5][:200])
        if want[6] is not None and ("JSONDecodeError" in want[6] or "RecursionError" in want[6]):
            assert dead.startswith("input of 'agg' is not an event: "), (origin, dead)
        else:
            assert dead == want[6], origin


def test_jvm_avg_overflow_takes_the_mean_of_quotients(spark: Any, tmp_path: Path) -> None:
    # fsum of two 1e308s overflows: Python averages the quotients, and so must the JVM;
    # sum has no fallback, so the second event is a dead letter there.
    # Then ints whose quotients Python rounds once, exactly (a 34-digit quotient rounded
    # again gave 1.5e+308 for the third, against Python's 1.5000000000000004e+308).
    big = int("15000000000000001661566186592646690003353381229225701501110047762066793937647155"
              "55848341824849725267357766156993495169434857367570584244622857454267491715245906"
              "95983890635193178588781682525412446540487531969905637540522023398847716423215207"
              "086589103850590468618007803961344505907982122227151042800725409136641")  # fmt: skip
    bodies = ['{"v": 1e308}', '{"v": 1e308}', '{"v": 1.5e308}', '{"v": 2}']
    bodies += [json.dumps({"v": big})] * 3
    rows = rows_of(bodies)
    for function in ("avg", "sum"):
        work = tmp_path / function
        got = {r.origin: r for r in run_jvm(spark, work, [rows], function, 3)}
        options = {"field": "v", "window": 3, "function": function}
        want = {r[0]: r for r in run_events(WindowAggregate.build(options, "agg", None), rows)}
        assert [got[o].dead is None for o in sorted(got)] == [
            want[o][6] is None for o in sorted(want)
        ]
        same_as_python(got, want)
    assert typed(got[1].body) == "1e+308"


def test_jvm_window_writes_what_python_writes_for_any_field_name(
    spark: Any, tmp_path: Path
) -> None:
    field = 'ü"x'
    bodies = [json.dumps({field: 1}), json.dumps({field: 2.5}), json.dumps({"other": 1}),
              json.dumps({field: 1e-7}), json.dumps({field: 10**40})]  # fmt: skip
    rows = rows_of(bodies)
    got = {r.origin: r for r in run_jvm(spark, tmp_path / "a", [rows], "max", 2, field)}
    options = {"field": field, "window": 2, "function": "max"}
    want = {r[0]: r for r in run_events(WindowAggregate.build(options, "agg", None), rows)}
    same_as_python(got, want)
    assert got[2].body == r'{"\u00fc\"x":2.5}'
    # An output over the record size limit is a dead letter there too.
    limit = 110
    got = {r.origin: r for r in run_jvm(spark, tmp_path / "b", [rows], "max", 2, field, limit)}
    want = {
        r[0]: r
        for r in run_events(WindowAggregate.build(options, "agg", None), rows,
                            max_record_bytes=limit)
    }  # fmt: skip
    assert [o for o, r in want.items() if r[6] is not None] == [3, 5]  # 5: its output too big
    same_as_python(got, want, limit)


def test_python_texts_of_the_jvm_engine(spark: Any) -> None:
    # Floats of every magnitude and bit pattern, and strings with every kind of character,
    # written by the JVM as CPython writes them (repr and json.dumps).
    import struct

    text = spark._jvm.fogshift.ops.PyText
    text.useNotPrintable(not_printable())  # (as every JVM window does at its start)
    rng = random.Random(12)
    floats = [1e16, 1e15, 0.0001, 1e-05, 5e-324, 1.7976931348623157e308, 2e23, 9007199254740993.0,
              0.1, 1 / 3, 123456789.125, -2.5e-7, 100.0, 1e22]  # fmt: skip
    floats += [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(3000)]
    floats += [rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30) for _ in range(2000)]
    floats = [f for f in floats if math.isfinite(f)]
    assert [text.floatRepr(f) for f in floats] == [repr(f) for f in floats]
    # (with characters of Unicode 14, which Python 3.11 knows and Java 17 does not)
    alphabet = (
        "a'\"\\\t\n\r\x00\x1f\x7f\x80\xa0\xad é€\u2028\ufeff\uffff😀\U000e0001"
        "\U0001fae0\u061d\u0870"
    )
    strings = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(500)]
    assert [text.strRepr(s) for s in strings] == [repr(s) for s in strings]


#: Bodies of a keyed window (key_by "k"): keys of every kind Python and Spark tell apart,
#: events without a key, and keys that have no one text (each a dead letter, no key's state
#: touched).
KEYED = [
    '{"k": "s1", "v": 1}', '{"k": 7, "v": 2.5}', '{"k": true, "v": 3}', '{"k": "é", "v": 4}',
    '{"k": "s1", "v": "x"}', '{"v": 5}', '{"k": null, "v": 6}', '{"k": 1.5, "v": 7}',
    '{"k": {"a": 1}, "v": 8}', '{"k": [1], "v": 9}', '{"k": "a", "k": "b", "v": 10}',
    r'{"k": "\ud800", "v": 11}', "not json", '{"k": 12345678901234567890, "v": 12}',
    '{"k": -0, "v": 13}', r'{"k": "a\"b", "v": 14}', '{"k": "s2", "v": 1e400}', "[1]",
    '{"k": false, "v": 1e308}', '{"k": "\U0001fae0", "v": -0.0}', '{"k": 1e2, "v": 1}',
    # The longest key taken (astral: two UTF-16 units each, one character), one too long.
    '{"k": "' + "\U0001fae0" * 1024 + '", "v": 15}', '{"k": "' + "x" * 1025 + '", "v": 16}',
    # A key Spark's JSON reader does not find in a body JSON reads (Jackson's limits): said
    # so, not "missing or null".
    '{"k": "s1", "v": 17, "w": ' + "9" * 1200 + "}", '{"k": "s2", "v": NaN}',
]  # fmt: skip


def keyed_corpus(seed: int, count: int) -> list[str]:
    """Keyed event bodies: :data:`KEYED`, and :func:`corpus`'s values under a few keys."""
    rng = random.Random(seed)
    bodies = []
    for body in corpus(seed, count):
        if rng.random() < 0.15:
            bodies.append(rng.choice(KEYED))
            continue
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            bodies.append(body)
            continue
        if isinstance(value, dict):
            value["k"] = rng.choice(["s1", "s2", "s3", 4, "ü"])
            bodies.append(json.dumps(value))
        else:
            bodies.append(body)
    return bodies


def run_keyed(
    spark: Any, work: Path, batches: list[list[tuple]], engine: str, function: str, window: int
) -> list[tuple[int, Any]]:
    """``(batch, row)`` of each output of a keyed ``window-aggregate`` PE (key_by ``k``) on
    ``engine`` over ``batches``, one batch each, restarted from its checkpoint after the
    first: the Python engine's ``transformWithStateInPandas`` processor, or the JVM's."""
    import uuid

    from fogshift.broker.datasource import RECORD_SCHEMA
    from fogshift.runtime.engine import GROUP_COLUMN, _key_group, _stateful_processor, jvm_window
    from fogshift.spec.kinds import WindowAggregateOptions

    options = {"field": "v", "window": window, "function": function}

    def output(events: Any) -> Any:
        events = events.withColumn(GROUP_COLUMN, _key_group("k"))
        if engine == "jvm":
            return jvm_window(
                spark, events, "agg", WindowAggregateOptions(**options, engine="jvm"),
                DEFAULT_MAX_RECORD_BYTES, key_by="k",
            )  # fmt: skip
        return events.groupBy(GROUP_COLUMN).transformWithStateInPandas(
            statefulProcessor=_stateful_processor(
                "window-aggregate", options, "p", "agg", DEFAULT_MAX_RECORD_BYTES,
                uuid.uuid4().hex, "", key_by="k",
            ),
            outputStructType=RECORD_SCHEMA, outputMode="Append", timeMode="None",
        )  # fmt: skip

    return run_batches(spark, work, batches, output)


def test_keyed_jvm_window_matches_the_python_engines_keyed_pe(spark: Any, tmp_path: Path) -> None:
    # One function suffices here: the aggregates are the unkeyed tests' (above), and the
    # keyed path around them is the same for all five.
    function, window, seed = "avg", 3, 7
    from fogshift.broker.keys import KEY_INDEX
    from fogshift.runtime.state_reader import (
        read_jvm_key_variables,
        read_jvm_window,
        read_state,
    )

    rows = rows_of([*KEYED, *keyed_corpus(seed, 200)])
    rows.insert(30, (31, 30, 1030.0, NOT_AN_EVENT, "raw bytes"))  # a foreign message
    rows = [(n + 1, *r[1:]) for n, r in enumerate(rows)]
    batches = [rows[:90], list(reversed(rows[90:170])), rows[170:]]
    runs = {e: run_keyed(spark, tmp_path / e, batches, e, function, window)
            for e in ("python", "jvm")}  # fmt: skip
    outputs = {e: {r.origin: r for _, r in got if r.creator != KEY_INDEX}
               for e, got in runs.items()}  # fmt: skip
    assert sorted(outputs["jvm"]) == sorted(outputs["python"]) == [r[0] for r in rows]
    python = {o: (r.origin, r.idx, r.seq, r.timestamp, r.creator, r.body, r.dead)
              for o, r in outputs["python"].items()}  # fmt: skip
    same_as_python(outputs["jvm"], python)
    dead = {o for o, r in python.items() if r[6] is not None}
    # Keys missing, null, a float, an object, an array, repeated, a lone surrogate, -0, 1e2;
    # bodies that are no events; values no aggregate takes.
    assert len(dead) >= 20
    assert any("reads as 'b' here and as 'a' to Spark" in python[o][6] for o in dead)
    assert any("is missing or null" in python[o][6] for o in dead)
    assert any("is in the event, but Spark's JSON reader" in python[o][6] for o in dead)
    assert any("is 1,025 characters long: a key is at most 1,024" in python[o][6] for o in dead)
    # Each batch notes the same keys' stored state for the key index (the JVM's variable is
    # its window's text, the Python engine's the values' JSON).
    notes = {
        e: sorted((b, json.loads(r.body)["key"], *json.loads(r.body)["vars"])
                  for b, r in got if r.creator == KEY_INDEX)
        for e, got in runs.items()
    }  # fmt: skip
    assert [n[:2] for n in notes["jvm"]] == [n[:2] for n in notes["python"]]
    assert {n[2] for n in notes["jvm"]} == {"window"}
    assert {n[2] for n in notes["python"]} == {"f_values"}
    # And the same windows per key, read back as `fogshift state` reads each engine's.
    _, want = read_state(spark, tmp_path / "python" / "checkpoint", ["values"], keyed=True)
    _, have = read_jvm_window(spark, tmp_path / "jvm" / "checkpoint", keyed=True)
    assert {k: [repr(v) for v in s["values"]] for k, s in have.items()} == {
        k: [repr(v) for v in s["values"]] for k, s in want.items()
    }
    assert {"s1", "7", "true", "é", "12345678901234567890"} <= set(have)
    _, one = read_jvm_window(spark, tmp_path / "jvm" / "checkpoint", keyed=True, key="é")
    assert one == {"é": have["é"]}
    # A key listing without the key index (read from the state store) has each key's window
    # text as long as its last note said.
    batch, _, variables = read_jvm_key_variables(spark, tmp_path / "jvm" / "checkpoint")
    in_order = sorted(runs["jvm"], key=lambda br: br[0])
    noted = {json.loads(r.body)["key"]: json.loads(r.body)["vars"]
             for _, r in in_order if r.creator == KEY_INDEX}  # fmt: skip
    assert batch is not None and variables == noted and set(variables) == set(have)
