"""The data-plane bench: its plain-PySpark floor computes the same job as the fogshift PE
(checked against a reference computed here), and its report compares the two.

Real nats-server and a real local SparkSession; a few seconds of input at a low rate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from fogshift.bench import dataplane
from fogshift.broker.client import get_range
from fogshift.broker.naming import data_subject, stream_name
from fogshift.events import ORIGIN_HEADER

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dataplane.Bench]:
    settings = dataplane.Settings(steady_rate=100, steady_s=1.5, rates=(), backlog=500)
    run = dataplane.Bench(tmp_path_factory.mktemp("dataplane"), settings)
    yield run
    run.close()


def outputs(bench: dataplane.Bench) -> dict[int, dict]:
    """The last measured pipeline's outputs by input sequence."""
    pipeline = f"dp{bench._count}"
    messages = bench.js.run(
        lambda js: get_range(
            js, stream_name(pipeline, "pe"), data_subject(pipeline, "pe"), 0, 10**9
        )
    )
    bodies = {}
    for message in messages:
        payload = json.loads(message.data)
        body = payload["body"] if "creator" in payload else message.data.decode()
        bodies[int(message.headers[ORIGIN_HEADER])] = json.loads(body)
    return bodies


def reference_window(count: int, window: int) -> dict[int, float]:
    """The windowed average after each of the inputs 1..count (the bench's values)."""
    values = [float(n % 97) for n in range(1, count + 1)]
    return {
        n: math.fsum(values[max(0, n - window) : n]) / len(values[max(0, n - window) : n])
        for n in range(1, count + 1)
    }


@pytest.mark.parametrize(
    ("system", "case"),
    [("fogshift", "window-aggregate"), ("plain", "window-aggregate"),
     ("fogshift", "window-aggregate-jvm")],
)  # fmt: skip
def test_both_systems_compute_the_reference_window_average(
    bench: dataplane.Bench, system: str, case: str
) -> None:
    row = bench.steady(system, case, 100, 1.5)
    got = outputs(bench)
    count = 1 + 150  # the warm-up event, then the fed ones
    expected = reference_window(count, dataplane.OPTIONS[case]["window"])
    assert sorted(got) == list(range(1, count + 1))
    assert all(math.isclose(got[n]["value"], expected[n]) for n in got)
    assert row["events"] == 150 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert row["batch_ms"] > 0


def test_the_report_compares_fogshift_with_the_floor(
    bench: dataplane.Bench, tmp_path: Path
) -> None:
    rows = dataplane.RunLog(tmp_path / "dataplane.csv", dataplane.FIELDS)
    (tmp_path / "settings.json").write_text(json.dumps({"quick": True}))
    for system in dataplane.SYSTEMS:
        row = bench.steady(system, "map", 100, 1.0)
        got = outputs(bench)
        assert all(body["y"] == body["value"] * 2 + 1 for body in got.values()), system
        rows.append({"system": system, "case": "map", "measure": "steady", **row})
        again = bench.reprocess(system, "map", 500)
        assert again["events"] == 500 and again["events_per_s"] > 0, again
        rows.append({"system": system, "case": "map", "measure": "reprocess", **again})
    text = dataplane.render(tmp_path).read_text()
    mine = dataplane.summary(dataplane.read_rows(tmp_path / "dataplane.csv"), "fogshift", "map")
    floor = dataplane.summary(dataplane.read_rows(tmp_path / "dataplane.csv"), "plain", "map")
    assert mine["p50_ms"] and floor["p50_ms"]
    ratio = mine["p50_ms"] / floor["p50_ms"]
    assert (
        f"| per-hop p50 (ms) | {mine['p50_ms']:,.0f} | {floor['p50_ms']:,.0f} | {ratio:.2f}x |"
        in text
    )
    assert (tmp_path / "dataplane.png").stat().st_size > 0
