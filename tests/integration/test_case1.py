"""Case 1 end to end: real nats-server, real Spark, three real node-agent processes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from fogshift.spec.exceptions import InvalidSpec
from fogshift.supervisor.cluster import orchestrator_client
from fogshift.verify.reference import case1_reference, compare, read_sink
from tests.conftest import Cluster
from tests.integration.helpers import (
    keyed_windows,
    pipeline_stream_names,
    write_case1_csv,
    write_spec,
)

pytestmark = pytest.mark.integration

AGGREGATES = [  # (function, window, node, engine, key_by)
    ("avg", 3, "fog-a", "python", None),
    ("sum", 1, "fog-b", "jvm", None),
    ("min", 10, "fog-a", "python", None),
    ("max", 25, "fog-b", "jvm", None),
    ("count", 7, "fog-a", "python", None),
    ("avg", 4, "fog-b", "jvm", "sensor"),
]
ROWS = 400


@pytest.fixture(scope="module")
def fan(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One source feeding five aggregates (all functions, several windows), five sinks."""
    work = tmp_path_factory.mktemp("fan")
    data = write_case1_csv(work / "data" / "in.csv", ROWS, seed=7)
    elements: list[dict] = [
        {"id": "source", "kind": "csv-source", "node": "cloud", "options": {"path": "data/in.csv"}}
    ]
    for function, window, node, engine, key_by in AGGREGATES:
        name = f"{function}{window}"
        options = {"field": "value", "window": window, "function": function, "engine": engine}
        elements.append(
            {
                "id": name,
                "kind": "window-aggregate",
                "node": node,
                "inputs": ["source"],
                "options": options,
                **({"key_by": key_by} if key_by else {}),
            }
        )
        elements.append(
            {
                "id": f"sink-{name}",
                "kind": "csv-sink",
                "node": "cloud",
                "inputs": [name],
                "options": {"path": f"out/{name}.csv"},
            }
        )
    spec = write_spec(work / "fan.yaml", "fan", elements)
    cluster.cli("deploy", str(spec))
    return {"work": work, "data": data, "spec": spec}


def test_all_functions_and_windows_match_the_reference(cluster: Cluster, fan: dict) -> None:
    # Both engines: the JVM operator's outputs and dead letters are the Python processor's,
    # keyed (a window per sensor, each output carrying its sensor) or not.
    for function, window, _, _, key_by in AGGREGATES:
        name = f"{function}{window}"
        ref = case1_reference(fan["data"], "value", window, function, key_field=key_by)
        cluster.wait_for("fan", f"sink-{name}", len(ref.rows))
        verdict = compare(ref.rows, read_sink(fan["work"] / "out" / f"{name}.csv", "value"))
        assert verdict.consistent, f"{name}: {verdict.summary()}"
        letters = cluster.json("errors", "fan", "--limit", "10000")
        dead = [d for d in letters if d["element"] == name]
        malformed = [d for d in letters if d["element"] == "source"]
        assert len(dead) == ref.dropped - len(malformed), name
        assert all("not a finite number" in d["reason"] for d in dead), name
    # A JVM window's state reads as the Python engine's: the last 25 valid values.
    frame = pd.read_csv(fan["data"], dtype=str, keep_default_na=False, on_bad_lines="skip")
    values = pd.to_numeric(frame["value"], errors="coerce")
    window = values[values.notna() & values.abs().lt(float("inf"))].tolist()[-25:]
    state = cluster.json("state", "fan", "max25")
    assert [e["state"]["values"] for e in state["entries"]] == [window]
    # A keyed JVM window's state is each sensor's last 4 valid values (its twins), one key too.
    state = cluster.json("state", "fan", "avg4")
    expected = keyed_windows(fan["data"], "sensor", "value", 4)
    assert state["key_by"] == "sensor" and state["keys"] == len(expected) == 4
    assert {e["key"]: e["state"]["values"] for e in state["entries"]} == expected
    one = cluster.json("state", "fan", "avg4", "s2")
    assert [(e["key"], e["state"]["values"]) for e in one["entries"]] == [("s2", expected["s2"])]
    # A page: the first keys only (read by the key index, the others never collected),
    # every key counted.
    page = cluster.json("state", "fan", "avg4", "--limit", "2")
    first = sorted(expected)[:2]
    assert page["keys"] == len(expected)
    assert [(e["key"], e["state"]["values"]) for e in page["entries"]] == [
        (k, expected[k]) for k in first
    ]


def test_status_counts_and_dead_letters(cluster: Cluster, fan: dict) -> None:
    ref = case1_reference(fan["data"], "value", 3, "avg")
    cluster.wait_for("fan", "sink-avg3", len(ref.rows))
    # Counters reach the orchestrator with the next monitor pass and heartbeat.
    deadline = time.monotonic() + 20
    while True:
        status = cluster.status("fan")
        by_id = {e["element"]: e for e in status["elements"]}
        settled = by_id["avg3"]["events_in"] == by_id["source"]["events_out"]
        if (settled and by_id["source"]["events_in"] == ROWS) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status["status"] == "running"
    assert all(e["state"] == "running" for e in status["elements"]), status
    source, agg = by_id["source"], by_id["avg3"]
    assert source["events_in"] == ROWS
    assert source["events_out"] + source["dead_letters"] == ROWS
    assert agg["events_in"] == source["events_out"]
    assert source["dead_letters"] + agg["dead_letters"] == ref.dropped
    assert by_id["sink-avg3"]["events_out"] == len(ref.rows)
    assert (by_id["avg3"]["node"], by_id["sink-avg3"]["node"]) == ("fog-a", "cloud")

    letters = cluster.json("errors", "fan", "--limit", "10000")
    from_source = [d for d in letters if d["element"] == "source"]
    from_avg = [d for d in letters if d["element"] == "avg3"]
    assert len(from_source) == source["dead_letters"]
    assert all("columns, the header has 3" in d["reason"] for d in from_source)
    assert len(from_avg) == agg["dead_letters"]
    assert all("not a finite number" in d["reason"] for d in from_avg)
    # --limit is per PE: the title says so when a PE reached it (it said "(2)" of more).
    assert (
        letters and "the newest 1 of each PE" in cluster.cli("errors", "fan", "--limit", "1").stdout
    )

    # Each single-input PE's newest hop: its output against the input event it came from.
    hops = {h["element"]: h for h in cluster.json("latency", "fan")}
    inputs = {e["element"]: e["inputs"] for e in status["elements"]}
    assert hops["avg3"]["input"] == "source" and "source" not in hops  # (a sink has no stream)
    for element, hop in hops.items():
        assert [hop["input"]] == inputs[element] and hop["latency_ms"] >= 0, hop
        assert hop["input_seq"] >= 1 and hop["seq"] >= 1, hop
    assert "newest per-hop latency of fan" in cluster.cli("latency", "fan").stdout


def test_stateless_and_custom_processors(cluster: Cluster, tmp_path: Path) -> None:
    data = write_case1_csv(tmp_path / "in.csv", 200, seed=11)
    procs = Path(__file__).resolve().parent
    spec = write_spec(
        tmp_path / "ops.yaml",
        "ops",
        [
            {"id": "src", "kind": "csv-source", "node": "fog-b", "options": {"path": "in.csv"}},
            {
                "id": "hot",
                "kind": "filter",
                "node": "fog-b",
                "inputs": ["src"],
                "options": {"where": "isfinite(value) and value > 20"},
            },
            {
                "id": "double",
                "kind": "map",
                "node": "fog-a",
                "inputs": ["hot"],
                "options": {"set": {"value2": "value * 2"}, "keep": False},
            },
            {"id": "out", "kind": "csv-sink", "node": "cloud", "inputs": ["double"],
             "options": {"path": "out/double.csv"}},
            {
                "id": "stats",
                "kind": "custom",
                "node": "fog-a",
                "inputs": ["src"],
                "options": {"class": "procs:RunningStats", "path": str(procs)},
            },
            # (Its header declared, in an order of its own: the events' is count, total.)
            {"id": "out-stats", "kind": "csv-sink", "node": "cloud", "inputs": ["stats"],
             "options": {"path": "out/stats.csv", "fields": ["total", "count"]}},
        ],
    )  # fmt: skip
    cluster.cli("deploy", str(spec))
    # Independent reference with pandas: valid rows only.
    frame = pd.read_csv(data, on_bad_lines="skip", dtype=str, keep_default_na=False)
    frame.index = range(1, len(frame) + 1)
    lines = data.read_text().splitlines()[1:]
    seqs = [k for k, line in enumerate(lines, start=1) if line.count(",") == 2]
    values = pd.to_numeric(pd.Series([ln.split(",")[2] for ln in lines if ln.count(",") == 2],
                                     index=seqs), errors="coerce")  # fmt: skip
    finite = values[values.notna() & values.abs().lt(float("inf"))]
    hot = finite[finite > 20]
    cluster.wait_for("ops", "out", len(hot))
    doubled = pd.read_csv(tmp_path / "out" / "double.csv")
    assert doubled["seq"].tolist() == hot.index.tolist()
    assert doubled["value2"].tolist() == pytest.approx((hot * 2).tolist(), rel=1e-12)
    cluster.wait_for("ops", "out-stats", len(finite))
    stats = pd.read_csv(tmp_path / "out" / "stats.csv")
    assert stats.columns.tolist() == ["seq", "total", "count"]
    assert stats["seq"].tolist() == finite.index.tolist()
    assert stats["count"].tolist() == list(range(1, len(finite) + 1))
    assert stats["total"].tolist() == pytest.approx(finite.cumsum().tolist(), rel=1e-9)


def test_bad_specs_are_refused_before_anything_starts(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("value\n1\n")
    spec = write_spec(
        tmp_path / "bad.yaml",
        "bad",
        [{"id": "s", "kind": "csv-source", "node": "fog-z", "options": {"path": "in.csv"}}],
    )
    result = cluster.cli("deploy", str(spec), check=False)
    assert result.returncode == 2
    assert "unknown node 'fog-z'" in result.stderr
    assert f"expected: one of {', '.join(sorted(cluster.nodes))}" in result.stderr
    missing = write_spec(
        tmp_path / "missing.yaml",
        "missing",
        [{"id": "s", "kind": "csv-source", "node": "cloud", "options": {"path": "no.csv"}}],
    )
    result = cluster.cli("deploy", str(missing), check=False)
    assert result.returncode == 2 and "does not exist" in result.stderr
    names = [p["pipeline"] for p in cluster.json("status")]
    assert "bad" not in names and "missing" not in names
    # Straight to the API (which checks no file: its host is not the nodes'), the node that
    # would read it refuses before anything starts: the sink's file as it was, no pipeline.
    (tmp_path / "out-api.csv").write_text("precious,data\n")
    api = {"pipeline": "missing-api", "elements": [
        {"id": "s", "kind": "csv-source", "node": "cloud",
         "options": {"path": str(tmp_path / "no.csv")}},
        {"id": "k", "kind": "csv-sink", "node": "fog-a", "inputs": ["s"],
         "options": {"path": str(tmp_path / "out-api.csv")}},
    ]}  # fmt: skip
    with (
        orchestrator_client(cluster.home, timeout_s=60) as client,
        pytest.raises(InvalidSpec) as refused,
    ):
        client.post("/pipelines", json=api)
    assert "does not exist on node 'cloud'" in refused.value.message
    assert refused.value.received == "no such file" and refused.value.hint
    assert (tmp_path / "out-api.csv").read_text() == "precious,data\n"
    assert "missing-api" not in [p["pipeline"] for p in cluster.json("status")]
    assert not any(e.startswith("missing-api/") for n in cluster.json("nodes")
                   for e in n["elements"])  # fmt: skip
    result = cluster.cli("status", "nope", check=False)
    assert result.returncode == 1 and "no pipeline named 'nope'" in result.stderr


def test_redeploying_a_running_pipeline_is_a_conflict(cluster: Cluster, fan: dict) -> None:
    result = cluster.cli("deploy", str(fan["spec"]), check=False)
    assert result.returncode == 1
    assert "already running" in result.stderr and "fogshift stop fan" in result.stderr


def test_nodes_are_separate_process_groups_behind_a_token(cluster: Cluster) -> None:
    nodes = {n["name"]: n for n in cluster.json("nodes")}
    assert set(nodes) == set(cluster.nodes)
    assert all(n["healthy"] for n in nodes.values())
    assert len({n["pgid"] for n in nodes.values()}) == len(cluster.nodes)
    assert all(n["pid"] == n["pgid"] for n in nodes.values())
    assert all(n["url"].startswith("http://127.0.0.1:") for n in nodes.values())
    # The table, then any warnings (none is asserted: a CI machine's disk may be nearly full).
    table = cluster.cli("nodes").stdout
    assert all(name in table for name in nodes)
    assert all(isinstance(n["warnings"], list) for n in nodes.values())
    # Each node tells its free disk (all share this machine's).
    assert all(0 < n["disk_free_bytes"] <= n["disk_total_bytes"] for n in nodes.values())
    assert "GiB" in table  # (rich may wrap the column: one word)
    # The test clusters' nodes start without the warm-up (``FOGSHIFT_WARM_UP=false``: see
    # Cluster.up_env), and none ran one; a soak's cluster runs it (tests/bench/test_soak.py).
    for name in nodes:
        assert "warm-up" not in (cluster.home / "logs" / f"node-{name}.log").read_text(), name
    # No token, no answer: neither from an agent nor from the orchestrator.
    assert httpx.get(nodes["fog-a"]["url"] + "/elements").status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.get(nodes["cloud"]["url"] + "/health", headers=wrong).status_code == 401


def test_stop_keeps_the_output_and_start_goes_on_where_it_stopped(
    cluster: Cluster, tmp_path: Path
) -> None:
    whole = write_case1_csv(tmp_path / "whole.csv", 90, seed=3).read_text().splitlines(True)
    source = tmp_path / "in.csv"
    source.write_text("".join(whole[:51]))  # (the header and 50 rows; 40 come while stopped)
    spec = write_spec(
        tmp_path / "s.yaml",
        "short",
        [
            {"id": "s", "kind": "csv-source", "node": "cloud", "options": {"path": "in.csv"}},
            {"id": "a", "kind": "window-aggregate", "node": "fog-a", "inputs": ["s"],
             "options": {"field": "value", "window": 3, "function": "avg", "engine": "jvm"}},
            {"id": "k", "kind": "csv-sink", "node": "fog-b", "inputs": ["a"],
             "options": {"path": "out.csv"}},
        ],
    )  # fmt: skip
    cluster.cli("deploy", str(spec))
    done = cluster.wait_for("short", "k", 1)
    refused = cluster.cli("delete", "short", check=False)  # running: its streams in use
    assert refused.returncode == 1 and "fogshift stop short" in refused.stderr, refused.stderr
    running = cluster.cli("start", "short", check=False)
    assert running.returncode == 1 and "it runs already" in running.stderr, running.stderr
    assert cluster.status("short")["status"] == "running"
    epochs = {e["element"]: e["epoch"] for e in cluster.json("status", "short")["elements"]}
    cluster.cli("stop", "short")
    status = cluster.status("short")
    assert status["status"] == "stopped"
    assert (tmp_path / "out.csv").stat().st_size > 0
    assert done["events_out"] >= 1

    # Started again where it stopped (at once: the nodes' last heartbeats may still list
    # the instances the stop removed): the rows appended meanwhile are read, each output
    # once, and the aggregate's windows span the stop (its state came from its checkpoint).
    with source.open("a") as more:
        more.write("".join(whole[51:]))
    started = cluster.cli("start", "short")
    assert "started short again where it stopped" in started.stdout, started.stdout
    # Each PE was started by the start itself, under a newer epoch (fenced anew).
    for pe, node in (("s", "cloud"), ("a", "fog-a"), ("k", "fog-b")):
        log = (cluster.home / "logs" / f"node-{node}.log").read_text()
        again = [int(e) for e in re.findall(rf"started short\.{pe} under epoch (\d+), from", log)]
        assert again and max(again) > epochs[pe], (pe, epochs, again)
    ref = case1_reference(source, "value", 3, "avg")
    cluster.wait_for("short", "k", len(ref.rows))
    verdict = compare(ref.rows, read_sink(tmp_path / "out.csv", "value"))
    assert verdict.consistent, verdict.summary()
    cluster.cli("stop", "short")
    deadline = time.monotonic() + 10  # node reports arrive with the next heartbeat
    while time.monotonic() < deadline:
        hosted = [e for n in cluster.json("nodes") for e in n["elements"]]
        if not any(e.startswith("short/") for e in hosted):
            break
        time.sleep(0.5)
    assert not any(e.startswith("short/") for e in hosted), hosted
    # Its spec deployed again unasked would empty what `start` goes on with: refused.
    output = (tmp_path / "out.csv").read_text()
    unasked = cluster.cli("deploy", str(spec), check=False)
    said = " ".join(unasked.stderr.split())
    assert unasked.returncode == 1 and "pipeline 'short' is stopped" in said, said
    assert "`fogshift start short`" in said and "`fogshift deploy SPEC --fresh`" in said, said
    assert cluster.status("short")["status"] == "stopped"
    assert len(pipeline_stream_names(cluster, "short")) == 3

    # Deleted: its streams and what the nodes hold of it go, its output stays; deployed
    # again, it starts over (its PEs fenced above the deleted run's).
    held = [
        cluster.home / "nodes" / n / "checkpoints" / "short" for n in ("cloud", "fog-a", "fog-b")
    ]
    assert all(folder.is_dir() for folder in held)
    deleted = cluster.cli("delete", "short")
    assert "deleted short (3 streams; checkpoints on " in deleted.stdout, deleted.stdout
    assert "short" not in [p["pipeline"] for p in cluster.json("status")]
    assert pipeline_stream_names(cluster, "short") == []
    assert not any(folder.exists() for folder in held)
    for node in ("cloud", "fog-a", "fog-b"):  # nor its gates, snapshots or backup copies
        for kept in ("gates", "node-checkpoints", "replicas/checkpoints"):
            assert not (cluster.home / "nodes" / node / kept / "short").exists(), (node, kept)
    assert (tmp_path / "out.csv").read_text() == output
    # The nodes' logs say what ran there, and went (they said nothing of it).
    log = (cluster.home / "logs" / "node-fog-b.log").read_text()
    assert "started short.k under epoch 1, fresh" in log and "removed short.k" in log
    assert "node agent fog-b started: pid" in log
    # ... and not Spark's notes of its own start, nor a keyed query runner's.
    for noise in ("default log4j profile", "NativeCodeLoader", "TransformWithStateInPandas"):
        assert noise not in log, noise
    orchestrator_log = (cluster.home / "logs" / "orchestrator.log").read_text()
    assert "orchestrator started: pid" in orchestrator_log
    assert "deployed pipeline short: " in orchestrator_log  # (it said only broker rights)
    assert (
        "stopped pipeline short" in orchestrator_log
        and "starting pipeline short again where it stopped" in orchestrator_log
        and "deleted pipeline short" in orchestrator_log
    )
    assert cluster.cli("status", "short", check=False).returncode == 1
    cluster.cli("deploy", str(spec))
    assert cluster.wait_for("short", "k", len(ref.rows))["events_out"] == len(ref.rows)
    cluster.cli("stop", "short")
    again = cluster.json("delete", "short")
    assert len(again["streams"]) == 3 and again["unreachable_nodes"] == [], again
