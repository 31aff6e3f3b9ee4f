"""Poison events end to end: odd CSV bytes, a ``1e999`` cell and a custom PE that raises,
returns a non-finite number, never returns (its ``event_timeout_s`` is 1 s; once swallowing
the alarm every time) or kills its Python worker with a segmentation fault on some events.
Each bad event is a dead letter with its reason, the output equals a reference computed
without them, and no query restarts but for the two crashes it takes to condemn each event
that kills its worker (the stubborn one's worker is killed by its node). A PE whose
class cannot be imported is ``failed`` with the error after a bounded number of restarts."""

from __future__ import annotations

import csv
import math
import random
import re
from pathlib import Path

import pytest

from tests.conftest import Cluster
from tests.integration.helpers import write_spec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster_needs() -> tuple[str, ...]:
    """The pipelines run on cloud and fog-a. Other nodes an earlier module killed stay down
    (tests/conftest.py)."""
    return ("cloud", "fog-a")


ROWS = 300
ODD = ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
#: seq -> (element, what its dead letter's reason says)
BAD = {
    40: ("poison", "cannot be encoded (ValueError: Out of range float values"),
    60: ("poison", "processor 'poison' raised IndexError: list index out of range"),
    61: ("poison", "processor 'poison' raised IndexError: list index out of range"),
    90: ("source", "row 90 is not valid UTF-8"),
    110: ("source", "row 110 cannot be read as CSV: field larger than field limit"),
    130: ("poison", "processor 'poison' raised RuntimeError: sensor boom-runtime is cursed"),
    200: ("poison", "processor 'poison' took longer than 1 s for one event (event_timeout_s"),
    201: ("poison", "processor 'poison' took longer than 1 s for one event (event_timeout_s"),
    230: ("poison", "running processor 'poison' crashed 2 times on this event"),
    260: ("poison", "killed by its node after 4 s in process()"),
    150: ("source", "row 150 has 2 columns, the header has 3"),
}


def write_input(path: Path) -> None:
    """A CSV of ROWS data rows with the bad rows of BAD, odd characters in many sensor names,
    a CRLF line and no newline after the last row (its writer has finished)."""
    rnd = random.Random(5)
    lines: list[bytes] = [b"timestamp,sensor,value"]
    for k in range(1, ROWS + 1):
        sensor = f"s{k % 4}"
        if k % 7 == 0:
            odd = ODD[k % len(ODD)]
            sensor = f"{odd}s{odd}{k % 4}{odd}"
        value = f"{rnd.uniform(-50, 150):.4f}"
        line = f"{1_700_000_000 + k},{sensor},{value}".encode()
        if k == 40:
            line = f"{1_700_000_000 + k},s0,1e999".encode()
        elif k in (60, 61):
            line = f"{1_700_000_000 + k},boom-index,{value}".encode()
        elif k == 130:
            line = f"{1_700_000_000 + k},boom-runtime,{value}".encode()
        elif k == 230:
            line = f"{1_700_000_000 + k},crash-segv,{value}".encode()
        elif k == 260:
            line = f"{1_700_000_000 + k},hang-stubborn,{value}".encode()
        elif k in (200, 201):
            line = f"{1_700_000_000 + k},{('hang-loop', 'hang-sleep')[k - 200]},{value}".encode()
        elif k == 90:
            line = f"{1_700_000_000 + k},s\xff,{value}".encode("latin-1")
        elif k == 110:
            line = f"{1_700_000_000 + k},{'x' * (csv.field_size_limit() + 1)},{value}".encode()
        elif k == 150:
            line = f"{1_700_000_000 + k},{value}".encode()
        elif k == 170:
            line += b"\r"
        lines.append(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines))  # no final newline


def reference(path: Path) -> list[tuple[int, int, float, str]]:
    """``(seq, count, total, sensor)`` the pipeline must write, computed here from the bytes:
    rows split at b"\\n" only, the PE fed only the rows it can process."""
    out = []
    count, total = 0, 0.0
    for k, raw in enumerate(path.read_bytes().split(b"\n")[1:], start=1):
        try:
            cells = next(csv.reader([raw.removesuffix(b"\r").decode("utf-8")], strict=True))
        except (UnicodeDecodeError, csv.Error):
            continue
        if len(cells) != 3 or cells[1] in (
            "boom-index",
            "boom-runtime",
            "hang-loop",
            "hang-sleep",
            "crash-segv",
            "hang-stubborn",
        ):
            continue
        value = float(cells[2])
        if not math.isfinite(total + value):
            continue
        count, total = count + 1, total + value
        out.append((k, count, total, cells[1]))
    return out


def read_output(path: Path) -> list[tuple[int, int, float, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [(int(r["seq"]), int(r["count"]), float(r["total"]), r["sensor"]) for r in rows]


def test_poison_events_are_dead_letters_and_the_rest_is_exact(
    cluster: Cluster, tmp_path: Path
) -> None:
    data = tmp_path / "in.csv"
    write_input(data)
    ref = reference(data)
    assert len(ref) == ROWS - len(BAD)
    assert any(ch in sensor for _, _, _, sensor in ref for ch in ODD)
    spec = write_spec(
        tmp_path / "poison.yaml",
        "poison",
        [
            {"id": "source", "kind": "csv-source", "node": "cloud",
             "options": {"path": "in.csv", "rate": 0}},
            {"id": "poison", "kind": "custom", "node": "fog-a", "inputs": ["source"],
             "event_timeout_s": 1,
             "options": {"class": "procs_poison:Poisoned", "path": str(Path(__file__).parent)}},
            {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["poison"],
             "options": {"path": "out/poison.csv"}},
        ],
    )  # fmt: skip
    cluster.cli("deploy", str(spec))
    cluster.wait_for("poison", "sink", len(ref), timeout_s=180)
    assert read_output(tmp_path / "out" / "poison.csv") == ref

    letters = cluster.json("errors", "poison", "--limit", "10000")
    got = {d["seq"]: (d["element"], d["reason"]) for d in letters}
    assert sorted(got) == sorted(BAD), got
    for seq, (element, reason) in BAD.items():
        assert got[seq][0] == element and reason in got[seq][1], (seq, got[seq])
    # Where in the processor's code (a reason said what was raised, never where).
    assert " (at procs_poison.py:" in got[130][1] and " in process)" in got[130][1], got[130]

    by_id = {e["element"]: e for e in cluster.status("poison")["elements"]}
    # The worker killer and the stubborn event each crashed a batch twice (the stubborn one's
    # worker killed by its node); then they were condemned, and nothing since.
    restarts = {"source": 0, "poison": 4, "sink": 0}
    for element in ("source", "poison", "sink"):
        got = (by_id[element]["state"], by_id[element]["restarts"])
        assert got == ("running", restarts[element]), by_id
    assert by_id["source"]["dead_letters"] == 3 and by_id["poison"]["dead_letters"] == 8


def test_a_class_that_cannot_be_imported_is_refused_at_deploy_and_says_why(
    cluster: Cluster, tmp_path: Path
) -> None:
    # It was deployed ("deployed", exit 0, the pipeline "running") and given up on after
    # bounded restarts (those restarts: tests/agent/test_node_restarts.py). Its node checks
    # it before the deploy changes anything.
    (tmp_path / "in.csv").write_text("value\n1\n2\n")
    spec = write_spec(
        tmp_path / "broken.yaml",
        "broken",
        [
            {"id": "source", "kind": "csv-source", "node": "cloud",
             "options": {"path": "in.csv"}},
            {"id": "ghost", "kind": "custom", "node": "fog-a", "inputs": ["source"],
             "options": {"class": "fogshift_no_such_module:Missing"}},
        ],
    )  # fmt: skip
    refused = cluster.cli("deploy", str(spec), check=False)
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2, said
    assert "broken/ghost cannot be built on node 'fog-a'" in said
    assert "cannot import processor class 'fogshift_no_such_module:Missing'" in said
    assert "broken" not in [p["pipeline"] for p in cluster.json("status")]
    assert not any(e.startswith("broken/") for n in cluster.json("nodes")
                   for e in n["elements"])  # fmt: skip


def test_a_batch_held_up_outside_any_event_is_run_again_after_its_time_limit(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Once seen: a query restarted after a crashed Python worker sat 3 minutes in a batch
    with no event running, its status "running", its output stopped. The batch now has a
    time limit (``batch_timeout_s``): past it, the node starts the query again, the batch
    runs again, and the output is exact."""
    rows = 40
    (tmp_path / "in.csv").write_text("value\n" + "".join(f"{k}\n" for k in range(1, rows + 1)))
    flag = tmp_path / "stall-once"
    flag.touch()
    spec = write_spec(
        tmp_path / "stalled.yaml",
        "stalled",
        [
            {"id": "source", "kind": "csv-source", "node": "cloud",
             "options": {"path": "in.csv", "rate": 0}},
            {"id": "counter", "kind": "custom", "node": "fog-a", "inputs": ["source"],
             "batch_timeout_s": 3,
             "options": {"class": "procs_poison:StallsOnce", "path": str(Path(__file__).parent),
                         "options": {"stall": str(flag)}}},
            {"id": "sink", "kind": "csv-sink", "node": "cloud", "inputs": ["counter"],
             "options": {"path": "out/stalled.csv"}},
        ],
    )  # fmt: skip
    cluster.cli("deploy", str(spec))
    cluster.wait_for("stalled", "sink", rows, timeout_s=180)
    assert not flag.exists()  # the batch did stall
    with open(tmp_path / "out" / "stalled.csv", newline="") as handle:
        out = [(int(r["count"]), r["value"]) for r in csv.DictReader(handle)]
    assert out == [(k, str(k)) for k in range(1, rows + 1)]  # each once, in order
    counter = cluster.element("stalled", "counter")
    assert (counter["state"], counter["restarts"], counter["dead_letters"]) == (
        "running", 1, 0), counter  # fmt: skip
    logged = (cluster.home / "logs" / "node-fog-a.log").read_text()
    assert re.search(
        r"PE 'counter' of pipeline 'stalled' on node 'fog-a': its batch after "
        r"batch -?\d+ ran 3 s without committing \(batch_timeout_s 3 s",
        logged,
    )
    cluster.cli("stop", "stalled")
