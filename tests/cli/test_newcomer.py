"""The CLI's newcomer touches, without a cluster: ``--version``, ``validate``, ``status`` with
nothing deployed, ``logs``, the demo's copy of the example, and the phases ``migrate`` and
``restore`` show while they run (against a stand-in orchestrator client)."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.main import get_command
from typer.testing import CliRunner

from fogshift.cli import logs as cli_logs
from fogshift.cli import main as cli
from fogshift.cli.demo import demo_copy, run_demo
from fogshift.cli.demo_ecg import _partitions, run_ecg
from fogshift.common.exceptions import NoAnswer
from fogshift.common.waiting import wait_until
from fogshift.contracts import (
    GroupMigrationReport,
    KeyMoveReport,
    KeyMoveStatus,
    KeyOrder,
    KeyWave,
    MigrationReport,
    RestoreReport,
    ScaleReport,
)
from fogshift.exceptions import Conflict, InvalidInput, NotFound
from fogshift.spec import load_spec
from fogshift.verify.case2 import case2_parts
from tests.conftest import fogshift_in_process

ROOT = Path(__file__).resolve().parents[2]
CASE1 = ROOT / "examples" / "case1" / "case1.yaml"
runner = CliRunner()


def flat(text: str) -> str:
    """The console wraps long lines: compare with every run of whitespace as one space."""
    return " ".join(text.split())


def real_cli(*args: str, cwd: str | Path = "/tmp") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fogshift.cli.main", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# -- --version ------------------------------------------------------------------------------


def silent_orchestrator(error: Any) -> Any:
    """``error``, a NoAnswer, as the CLI's client of the orchestrator raises it: the
    orchestrator's own silence (not one it passed on from a node in its answer)."""
    error.service = "the orchestrator"
    return error


def test_version_is_the_installed_packages() -> None:
    result = real_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"fogshift {metadata.version('fogshift')}\n"


# -- validate -------------------------------------------------------------------------------


def write_spec(folder: Path, aggregate: str) -> Path:
    (folder / "in.csv").write_text("timestamp,value\n1,2\n")
    spec = folder / "p.yaml"
    spec.write_text(
        "pipeline: p\nelements:\n"
        "  - {id: source, kind: csv-source, node: cloud, options: {path: in.csv}}\n"
        f"  - {{id: aggregate, node: fog-a, inputs: [source], {aggregate}}}\n"
        "  - {id: sink, kind: csv-sink, node: cloud, inputs: [aggregate],"
        " options: {path: out.csv}}\n"
    )
    return spec


def test_validate_summarises_a_valid_spec_offline() -> None:
    result = runner.invoke(cli.app, ["validate", str(CASE1)])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "valid: pipeline case1, 3 PEs on 2 nodes (cloud, fog-a)" in text
    assert "aggregate │ window-aggregate │ fog-a │ source" in text
    result = runner.invoke(cli.app, ["validate", str(CASE1), "--json"])
    summary = json.loads(result.stdout)
    assert summary["valid"] is True and summary["nodes"] == ["cloud", "fog-a"]
    assert [(e["id"], e["inputs"]) for e in summary["elements"]] == [
        ("source", []), ("aggregate", ["source"]), ("sink", ["aggregate"]),
    ]  # fmt: skip


def test_validate_refuses_with_expected_received_and_a_guess(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, "kind: window-aggregate, options: {field: value, window: 2, fucntion: avg}"
    )
    result = runner.invoke(cli.app, ["validate", str(spec)])
    assert result.exit_code == 2  # as `deploy` exits for it
    text = flat(result.stderr)
    assert "refused (invalid_spec): options of element 'aggregate'" in text
    assert "received: unknown key 'fucntion'" in text
    assert "hint: did you mean 'function'?" in text
    result = runner.invoke(cli.app, ["validate", str(spec), "--json"])
    assert result.exit_code == 2
    answer = json.loads(result.stdout)
    assert answer["valid"] is False and answer["error"]["code"] == "invalid_spec"
    assert answer["error"]["hint"].startswith("did you mean 'function'?")


def test_validate_exits_2_from_the_real_cli_and_checks_nodes_when_given(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "kind: window-agregate, options: {field: value, window: 2}")
    result = real_cli("validate", str(spec))
    assert result.returncode == 2
    assert "did you mean 'window-aggregate'?" in result.stderr
    fixed = write_spec(tmp_path, "kind: window-aggregate, options: {field: value, window: 2}")
    assert real_cli("validate", str(fixed)).returncode == 0
    result = runner.invoke(cli.app, ["validate", str(fixed), "--nodes", "cloud,fog-b"])
    assert result.exit_code == 2
    assert "unknown node 'fog-a'" in flat(result.stderr)


# -- a stand-in orchestrator ----------------------------------------------------------------


class StandInClient:
    """Answers the CLI's requests from a table; records them."""

    def __init__(self, gets: dict[str, Any], post: Any = None) -> None:
        self.gets = gets
        self.post_answer = post
        self.requests: list[tuple[str, str]] = []

    def get(self, path: str, **kwargs: Any) -> Any:
        self.requests.append(("GET", path))
        answer = self.gets[path]
        return answer() if callable(answer) else answer

    def post(self, path: str, **kwargs: Any) -> Any:
        self.requests.append(("POST", path))
        return self.post_answer() if callable(self.post_answer) else self.post_answer

    def __enter__(self) -> StandInClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def use(monkeypatch: pytest.MonkeyPatch, client: StandInClient) -> None:
    monkeypatch.setattr(cli.cluster_ops, "orchestrator_client", lambda home, timeout_s=0: client)


def test_status_with_no_pipelines_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, StandInClient({"/pipelines": []}))
    result = runner.invoke(cli.app, ["status"])
    assert result.exit_code == 0
    assert (
        result.stdout.strip()
        == "no pipelines are deployed (`fogshift deploy SPEC.yaml` starts one)"
    )
    result = runner.invoke(cli.app, ["status", "--json"])
    assert json.loads(result.stdout) == []


def test_a_removal_refused_at_a_later_node_says_what_the_removed_ones_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `remove-node fog-a fog-b`: fog-a went, fog-b was refused. fog-a stays removed, so the
    # stopped pipeline's PE it leaves is said (as after a whole removal), then the refusal.
    def remove_nodes(home: Path, names: list[str], say: Any, drain: bool, removed: Any) -> Any:
        removed(names[0])
        raise Conflict(f"node {names[1]!r} hosts PE p/source (fog-a removed before it)")

    asked: list[list[str]] = []

    def stopped_on(home: Path, names: list[str]) -> dict[str, list[str]]:
        asked.append(names)
        return {"fog-a": ["q/aggregate"], "fog-b": ["q/sink"]}

    monkeypatch.setattr(cli.cluster_ops, "remove_nodes", remove_nodes)
    monkeypatch.setattr(cli.cluster_ops, "stopped_on", stopped_on)
    result = runner.invoke(cli.app, ["remove-node", "fog-a", "fog-b"])
    said = " ".join(result.stdout.split())
    assert asked == [["fog-a"]]
    assert "q/aggregate of stopped pipeline q was placed on fog-a: `fogshift start q`" in said
    assert "q/sink" not in said
    # (The refusal itself is `main`'s to print, as for every command.)
    assert isinstance(result.exception, Conflict), result.output
    assert "(fog-a removed before it)" in str(result.exception)


# -- migrate / restore phases ---------------------------------------------------------------

OPERATION = "/pipelines/p/elements/aggregate/operation"
MIGRATED = MigrationReport(pipeline="p", element="aggregate", origin="fog-a", target="fog-b",
                           mode="precopy", state_bytes=10,
                           phases_ms={"prepare": 9.0, "pause": 1.0},
                           prepare_ms={"copy": 4.0, "warm": 3.0, "converge": 2.0},
                           downtime_ms=2.0, rolled_back=False).model_dump(mode="json")  # fmt: skip


class Phases:
    """A migration journaled phase after phase: each poll sees the next phase; the POST
    answers once every phase has been polled."""

    def __init__(self, kind: str, phases: list[str]) -> None:
        self.kind = kind
        self.phases = phases
        self.polls = 0
        self.all_seen = threading.Event()

    def view(self) -> dict[str, Any]:
        phase = self.phases[min(self.polls, len(self.phases) - 1)]
        self.polls += 1
        if self.polls >= len(self.phases):
            self.all_seen.set()
        return {"id": "op1", "kind": self.kind, "pipeline": "p", "element": "aggregate",
                "origin": "fog-a", "target": "fog-b", "epoch": 1, "phase": phase,
                "started": 0.0, "updated": 0.0, "outcome": None, "running": True}  # fmt: skip

    def answer(self, report: dict[str, Any]) -> Any:
        def post() -> dict[str, Any]:
            assert self.all_seen.wait(30), "the CLI did not poll the operation's phases"
            return report

        return post


@contextmanager
def recorded_status(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every text the CLI's rich status line shows."""
    shown: list[str] = []

    class Line:
        def update(self, text: str) -> None:
            shown.append(text)

    @contextmanager
    def status(text: str) -> Iterator[Line]:
        shown.append(text)
        yield Line()

    monkeypatch.setattr(cli.console, "status", status)
    monkeypatch.setattr(cli.console, "_force_terminal", True)  # (the spinner's case)
    yield shown


def test_migrate_shows_each_phase_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    phases = Phases("migration", ["preparing", "pausing", "switching"])
    use(monkeypatch, StandInClient({OPERATION: phases.view}, phases.answer(MIGRATED)))
    with recorded_status(monkeypatch) as shown:
        result = runner.invoke(cli.app, ["migrate", "p", "aggregate", "--to", "fog-b"])
    assert result.exit_code == 0, result.output
    assert "migrated p/aggregate: fog-a -> fog-b" in flat(result.stdout)
    assert "prepare 9 ms (copy 4, warm 3, converge 2), pause 1 ms" in flat(result.stdout)
    seen = [phase for phase in phases.phases if any(f"[bold]{phase}[/]" in s for s in shown)]
    assert seen == phases.phases, shown
    assert all("migration of p/aggregate" in s for s in shown)


def test_migrate_without_a_terminal_says_each_phase_once_on_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Run from a script (no spinner), a migration waiting on a stopped node printed nothing
    # for minutes.
    phases = Phases("migration", ["preparing", "pausing", "switching"])
    use(monkeypatch, StandInClient({OPERATION: phases.view}, phases.answer(MIGRATED)))
    result = runner.invoke(cli.app, ["migrate", "p", "aggregate", "--to", "fog-b"])
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "migration of p/aggregate" in line]
    assert said == [f"migration of p/aggregate fog-a -> fog-b: {p}" for p in phases.phases]
    assert "migrated p/aggregate: fog-a -> fog-b" in flat(result.stdout)


def test_a_migration_with_no_input_after_its_pause_says_its_downtime_was_not_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It printed "downtime None ms".
    phases = Phases("migration", ["preparing"])
    unmeasured = {**MIGRATED, "downtime_ms": None}
    use(monkeypatch, StandInClient({OPERATION: phases.view}, phases.answer(unmeasured)))
    result = runner.invoke(cli.app, ["migrate", "p", "aggregate", "--to", "fog-b"])
    assert result.exit_code == 0, result.output
    assert "downtime not measured (no input came after the pause)" in flat(result.stdout)
    assert "None" not in result.stdout
    # One whose measurement failed (the target's node did not answer) says only why: "no
    # input came" was said beside it while input flowed (a walk-through).
    failed = {**unmeasured, "warnings": ["downtime not measured: node agent 'fog-b' at "
                                         "http://127.0.0.1:9 cannot be reached"]}  # fmt: skip
    use(monkeypatch, StandInClient({OPERATION: phases.view}, phases.answer(failed)))
    result = runner.invoke(cli.app, ["migrate", "p", "aggregate", "--to", "fog-b"])
    assert result.exit_code == 0, result.output
    assert "no input came" not in result.stdout
    assert "downtime not measured: node agent 'fog-b'" in flat(result.stdout)


def test_a_group_migration_that_failed_says_each_move_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A move that failed before its first phase printed "sink: fog-a -> cloud failed; "
    # (nothing after), and the failed move's hint stayed in the orchestrator's log.
    moved = {**MIGRATED, "status": "migrated"}
    failed = {**MIGRATED, "element": "sink", "status": "failed", "phases_ms": {},
              "downtime_ms": None}  # fmt: skip
    report = GroupMigrationReport(
        pipeline="p", elements=["aggregate", "sink"], target="fog-b", mode="precopy",
        status="failed", migrations=[moved, failed], placement={"aggregate": "fog-b",
        "sink": "fog-a"}, error="migration of p/sink failed: fog-b cannot be reached",
        hint="once fog-b answers, its PEs run on; if it stays silent, they are restored",
    ).model_dump(mode="json")  # fmt: skip
    use(monkeypatch, StandInClient({}, report))
    result = runner.invoke(cli.app, ["migrate", "p", "--elements", "aggregate,sink",
                                     "--to", "fog-b"])  # fmt: skip
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert "aggregate: fog-a -> fog-b migrated; prepare 9 ms, pause 1 ms, downtime 2 ms" in lines
    assert "sink: fog-a -> fog-b failed" in lines
    assert "hint: once fog-b answers, its PEs run on; if it stays silent, they are restored" in (
        flat(result.stdout)
    )

    # The orchestrator gone mid-group: said as for one PE, not "is the cluster up?".
    class Gone(StandInClient):
        def post(self, path: str, **kwargs: Any) -> Any:
            raise silent_orchestrator(NoAnswer(
                "the orchestrator at http://127.0.0.1:9 cannot be reached: RemoteProtocolError",
                hint="is the cluster up?",
            ))  # fmt: skip

    use(monkeypatch, Gone({}))
    result = runner.invoke(cli.app, ["migrate", "p", "--elements", "aggregate,sink",
                                     "--to", "fog-b"])  # fmt: skip
    assert isinstance(result.exception, NoAnswer), result.output
    said = result.exception.message
    assert "stopped answering while migrating aggregate, sink of p to fog-b" in said, said
    assert "it may have ended either way" in said
    assert "`fogshift up` starts it again" in (result.exception.hint or "")


def test_up_names_the_nodes_that_run_not_the_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An `up` over a cluster whose nodes died starts that cluster's nodes again, whatever
    # --nodes says: it printed "nodes zz healthy" for a cluster of cloud and fog-b.
    from fogshift.supervisor import cluster as cluster_ops
    from fogshift.supervisor.cluster import ClusterFile, ProcessInfo

    node = ProcessInfo(pid=1, pgid=1, url="http://127.0.0.1:9")
    ran = ClusterFile(orchestrator=node, broker=None, nodes={"cloud": node, "fog-b": node},
                      broker_url="nats://127.0.0.1:9")  # fmt: skip
    monkeypatch.setattr(cluster_ops, "up", lambda *args, **kwargs: ran)
    result = runner.invoke(cli.app, ["up", "--nodes", "zz", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "up: nodes cloud, fog-b healthy" in flat(result.stdout)


def test_a_key_move_left_pending_names_its_waves_and_the_keys_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pending = KeyMoveReport(
        pipeline="p", element="aggregate", target="fog-b", target_partition="aggregate-p1",
        order=KeyOrder.FIFO, status=KeyMoveStatus.PENDING, keys=["s1", "s2", "s3", "s4"],
        origins=dict.fromkeys(["s1", "s2", "s3", "s4"], "aggregate-p0"), move_seq=40,
        waves=[KeyWave(seq=40, keys=["s1"]), KeyWave(seq=52, keys=["s2", "s3"])],
        left=["s4"], sent=["s1", "s2"], stoppage_ms={"s1": 12.0, "s2": 30.0},
        error="no state yet for 1 key (s3) in time",
    )  # fmt: skip
    sent: list[Any] = []

    class Client(StandInClient):
        def post(self, path: str, **kwargs: Any) -> Any:
            sent.append(kwargs["json"])
            return super().post(path, **kwargs)

    use(monkeypatch, Client({}, pending.model_dump(mode="json")))
    args = ["--keys", "s1,s2,s3,s4", "--to", "fog-b", "--order", "fifo", "--wave-keys", "2"]
    result = runner.invoke(cli.app, ["migrate", "p", "aggregate", *args])
    assert result.exit_code == 1, result.output
    assert sent == [{"keys": ["s1", "s2", "s3", "s4"], "target": "fog-b", "order": "fifo",
                     "precopy": True, "wave_keys": 2}]  # fmt: skip
    said = flat(result.stdout)
    assert "in 2 waves: 1 key at input seq 40, 2 keys at input seq 52" in said, said
    assert "not moved (no wave for them): s4" in said
    assert "s2: aggregate-p0 -> aggregate-p1, stopped 30 ms" in said
    assert "no state yet for 1 key (s3)" in said
    # A key with brackets is printed as it is (read as markup, "[/x]" failed the command).
    odd = pending.model_copy(update={"sent": ["a[/x]"], "stoppage_ms": {"a[/x]": 5.0},
                                     "origins": {"a[/x]": "aggregate-p0"}})  # fmt: skip
    use(monkeypatch, Client({}, odd.model_dump(mode="json")))
    result = runner.invoke(cli.app, ["migrate", "p", "aggregate", *args])
    assert result.exit_code == 1 and "a[/x]: aggregate-p0 -> aggregate-p1" in flat(result.stdout)
    # A key with a comma or surrounding spaces, exactly as written with --key (split and
    # stripped, such keys were sent as others that do not exist, and "moved"); --keys
    # items are stripped, and empty ones dropped.
    sent.clear()
    exact = ["migrate", "p", "aggregate", "--keys", "s1, s2,,", "--key", " s3", "--key", "a,b",
             "--to", "fog-b"]  # fmt: skip
    runner.invoke(cli.app, exact)
    assert sent[-1]["keys"] == ["s1", "s2", " s3", "a,b"], sent


def test_a_scale_to_the_count_it_has_says_nothing_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It said "moved p/aggregate: 3 -> 3 partitions", as if it had rescaled.
    same = ScaleReport(pipeline="p", element="aggregate", status=KeyMoveStatus.MOVED,
                       before=3, after=3, done_ms=4.0)  # fmt: skip
    use(monkeypatch, StandInClient({}, same.model_dump(mode="json")))
    result = runner.invoke(cli.app, ["scale", "p", "aggregate", "--partitions", "3"])
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert "p/aggregate: 3 partitions already; nothing to change" in said, said
    assert "->" not in said and "moved" not in said
    shared = ["fog-b runs 2 partitions of 'aggregate'"]
    rescaled = same.model_copy(
        update={"after": 2, "moved": 1, "retired": {"aggregate-p2": "x"}, "warnings": shared}
    )
    use(monkeypatch, StandInClient({}, rescaled.model_dump(mode="json")))
    result = runner.invoke(cli.app, ["scale", "p", "aggregate", "--partitions", "2"])
    said = flat(result.stdout)
    assert "moved p/aggregate: 3 -> 2 partitions in 4 ms; 1 key changed partition" in said, said
    assert "warning: fog-b runs 2 partitions of 'aggregate'" in said


KEYS_ONLY = "--wave-keys and --no-precopy are for --keys"
#: (--mode and --order were checked, then left out of the request: the move went on
#: without them.)
MODE_FOR_KEYS = "--mode moves a whole PE, not the keys --keys or --key-group name"
ORDER_FOR_PE = "--order orders the keys --keys or --key-group move, not a whole PE"


@pytest.mark.parametrize(
    ("args", "refusal", "received"),
    [
        (["aggregate", "--wave-keys", "4"], KEYS_ONLY, "--wave-keys 4 without --keys"),
        (["aggregate", "--no-precopy"], KEYS_ONLY, "--no-precopy without --keys"),
        (["aggregate", "--key-group", "1/4", "--no-precopy"], KEYS_ONLY,
         "--no-precopy with --key-group 1/4"),
        (["aggregate", "--order", "fifo"], ORDER_FOR_PE, "--order fifo without --keys"),
        (["aggregate", "--keys", "a", "--mode", "handover"], MODE_FOR_KEYS, "--mode handover"),
        (["aggregate", "--key-group", "1/4", "--mode", "literal"], MODE_FOR_KEYS,
         "--mode literal"),
    ],
)  # fmt: skip
def test_key_move_options_without_keys_are_refused_not_ignored(
    monkeypatch: pytest.MonkeyPatch, args: list[str], refusal: str, received: str
) -> None:
    said = refused_before_any_request(monkeypatch, ["migrate", "p", *args, "--to", "fog-b"])
    assert refusal in said and received in said, said


@pytest.mark.parametrize(
    ("args", "received"),
    [
        (["aggregate", "--keys", "s1", "--key-group", "1/2"],
         "received: element 'aggregate', --keys 's1', --key-group '1/2'"),
        (["--keys", "s1"], "received: no ELEMENT, --keys 's1'"),
        (["aggregate", "--elements", "a,b"], "received: element 'aggregate', --elements 'a,b'"),
    ],
)  # fmt: skip
def test_a_refused_migrate_says_what_it_was_given_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, args: list[str], received: str
) -> None:
    # It said "--elements None, ..." of what was not given.
    said = refused_before_any_request(monkeypatch, ["migrate", "p", *args, "--to", "fog-b"])
    assert received in said and "None" not in said, said


def refused_before_any_request(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> str:
    """What the CLI's refusal of ``args`` says; it must have sent no request."""
    client = StandInClient({})
    use(monkeypatch, client)
    result = runner.invoke(cli.app, args)
    assert isinstance(result.exception, InvalidInput), result.output
    assert client.requests == []
    return flat(str(result.exception))


@pytest.mark.parametrize(
    ("args", "refusal", "received"),
    [
        (["scale", "p", "agg", "--partitions", "0"], "--partitions from 1 to 64", "received: 0"),
        (["scale", "p", "agg", "--partitions", "65"], "--partitions from 1 to 64", "received: 65"),
        (["scale", "p", "agg", "--partitions", "3", "--on", "fog-a,,fog-b"], "--on names an "
         "empty item", "received: 'fog-a,,fog-b'"),
        (["migrate", "p", "--elements", "a,b,", "--to", "fog-b"], "--elements names an empty "
         "item", "received: 'a,b,'"),
    ],
)  # fmt: skip
def test_bad_counts_and_lists_are_refused_before_any_request(
    monkeypatch: pytest.MonkeyPatch, args: list[str], refusal: str, received: str
) -> None:
    # (The orchestrator refused them too, but in the words of an HTTP body, once one ran.)
    said = refused_before_any_request(monkeypatch, args)
    assert refusal in said and received in said and "hint:" in said, said


def test_restore_shows_its_phases_and_json_output_is_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    restored = RestoreReport(pipeline="p", element="aggregate", target="fog-b", epoch=2,
                             checkpoint="b1", checkpoint_age_ms=1.0, reprocessed_events=3,
                             reprocess_ms=4.0, intermediate_events=5, intermediate_ms=6.0,
                             attempts=[]).model_dump(mode="json")  # fmt: skip
    phases = Phases("restore", ["fencing", "installing", "starting", "live"])
    use(monkeypatch, StandInClient({OPERATION: phases.view}, phases.answer(restored)))
    with recorded_status(monkeypatch) as shown:
        result = runner.invoke(cli.app, ["restore", "p", "aggregate"])
    assert result.exit_code == 0, result.output
    assert all(any(f"[bold]{p}[/]" in s for s in shown) for p in phases.phases), shown
    # --json: the report alone on stdout, and no polling at all.
    client = StandInClient({}, restored)
    use(monkeypatch, client)
    with recorded_status(monkeypatch) as shown:
        result = runner.invoke(cli.app, ["restore", "p", "aggregate", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == restored
    assert client.requests == [("POST", "/pipelines/p/elements/aggregate/restore")]
    assert shown == []
    # A standby that took over and has not caught up yet: said so, with the reason (it
    # printed "then 0 new in 0 ms" and left the reason out).
    behind = RestoreReport(pipeline="p", element="aggregate", target="fog-b", epoch=2,
                           method="standby", live_ms=None, standby_lag_events=4,
                           error="no new output within 60 s").model_dump(mode="json")  # fmt: skip
    use(monkeypatch, StandInClient({}, behind))
    result = runner.invoke(cli.app, ["restore", "p", "aggregate"])
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert "not live yet" in said and "has not caught up yet" in said, said
    assert "no new output within 60 s" in said


# -- logs -----------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("node-cloud", "node-fog-a", "orchestrator"):
        lines = "".join(f"{name} line {i}\n" for i in range(1, 51))
        (logs / f"{name}.log").write_text(lines)
    return tmp_path


def test_logs_prints_the_tail_of_one_node_or_of_all(home: Path) -> None:
    result = runner.invoke(cli.app, ["logs", "fog-a", "--home", str(home), "--lines", "3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"node-fog-a line {i}" for i in (48, 49, 50)]
    result = runner.invoke(cli.app, ["logs", "orchestrator", "--home", str(home), "-n", "1"])
    assert result.stdout.splitlines() == ["orchestrator line 50"]
    result = runner.invoke(cli.app, ["logs", "--home", str(home), "-n", "2"])
    lines = result.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines if line.startswith("==> ")] == [
        "==> orchestrator", "==> cloud", "==> fog-a",
    ]  # fmt: skip
    assert lines[1:3] == ["orchestrator line 49", "orchestrator line 50"]
    assert len(lines) == 9


def test_tail_reads_from_the_end_across_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_logs, "_BLOCK", 3)  # lines span blocks
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "no end")
    assert cli_logs.tail(log, 3) == ["line 98", "line 99", "no end"]
    assert len(cli_logs.tail(log, 500)) == 101
    assert cli_logs.tail(log, 0) == []


def test_the_tail_of_a_log_just_rotated_goes_on_into_its_copy(tmp_path: Path) -> None:
    from fogshift.common.logfile import rotate

    log = tmp_path / "node-fog-a.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    rotate(log)
    log.write_text("line 10\n")
    assert cli_logs.tail(log, 3) == ["line 8", "line 9", "line 10"]
    assert cli_logs.tail(log, 1) == ["line 10"]
    assert len(cli_logs.tail(log, 50)) == 11  # not into the copies before


def test_a_line_appended_between_the_tail_and_the_follow_is_followed(tmp_path: Path) -> None:
    # `logs -f` takes the offsets first, prints the tails up to them, then follows from them:
    # whatever is appended in between (a loaded node: the follow starts late) still shows.
    log = tmp_path / "node-fog-a.log"
    log.write_text("old 1\nold 2\n")
    files = {"fog-a": log}
    ends = cli_logs.positions(files)
    with open(log, "a") as handle:
        handle.write("meanwhile\n")
    assert cli_logs.tail(log, 5, end=ends["fog-a"].offset) == ["old 1", "old 2"]
    seen: list[str] = []
    rounds = iter(range(2))
    cli_logs.follow(files, seen.append, prefix=False, interval_s=0.01, start=ends,
                    keep_going=lambda: next(rounds, None) is not None)  # fmt: skip
    assert seen == ["meanwhile"]


def append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def test_a_follow_reads_on_in_the_copy_of_a_log_rotated_between_its_looks(
    tmp_path: Path,
) -> None:
    # The service copies its log to FILE.1 and empties it in place: the lines written
    # between the follow's last look and the rotation are in the copy only.
    from fogshift.common.logfile import copy_name, rotate

    log = tmp_path / "node-fog-a.log"
    log.write_text("".join(f"old {i}\n" for i in range(5)))
    files = {"fog-a": log}
    seen: list[str] = []
    looks = 0

    def keep_going() -> bool:
        nonlocal looks
        looks += 1
        if looks == 1:
            append(log, "seen\nsplit ")
        elif looks == 2:  # the line's end and one more, unseen, then rotated away
            append(log, "across it\nunseen\n")
            rotate(log)
            append(log, "after it\n")
        elif looks == 3:  # emptied, and grown past the offset before the next look
            append(log, "gone\n")
            rotate(log)
            append(log, "x" * 200 + "\nlast\n")
        return looks <= 4

    cli_logs.follow(files, seen.append, prefix=False, interval_s=0.0, keep_going=keep_going)
    assert seen == ["seen", "split across it", "unseen", "after it", "gone", "x" * 200, "last"]
    # A log more than twice the limit has only its newest part copied, at other offsets:
    # the copy is read on after the bytes last read.
    log.write_text("".join(f"early {i}\n" for i in range(100)))
    start = cli_logs.positions(files)
    append(log, "".join(f"late {i}\n" for i in range(3)))
    rotate(log, max_bytes=300)
    assert copy_name(log, 1).stat().st_size < start["fog-a"].offset  # (not all of it)
    seen.clear()
    rounds = iter(range(2))
    cli_logs.follow(files, seen.append, prefix=False, interval_s=0.0, start=start,
                    keep_going=lambda: next(rounds, None) is not None)  # fmt: skip
    assert seen == ["late 0", "late 1", "late 2"]
    # A file replaced by another (not a rotation's copy): read from its start, nothing of
    # the copy.
    log.write_text("a\nb\n")
    start = cli_logs.positions(files)
    log.write_text("other\n")
    seen.clear()
    rounds = iter(range(2))
    cli_logs.follow(files, seen.append, prefix=False, interval_s=0.0, start=start,
                    keep_going=lambda: next(rounds, None) is not None)  # fmt: skip
    assert seen == ["other"]


def test_logs_of_an_unknown_node_names_the_ones_that_exist(home: Path, tmp_path: Path) -> None:
    result = runner.invoke(cli.app, ["logs", "fog-b", "--home", str(home)])
    # Not there, as a node `migrate --to` names: exit 1, not a bad request's 2.
    assert isinstance(result.exception, NotFound) and result.exception.code == "not_found"
    assert result.exception.expected == "one of orchestrator, cloud, fog-a"
    assert result.exception.hint == "did you mean 'fog-a'?"
    result = runner.invoke(cli.app, ["logs", "--home", str(tmp_path / "nowhere")])
    assert isinstance(result.exception, NotFound)
    assert result.exception.received is not None and "not a folder" in result.exception.received


def test_logs_follow_prints_appended_lines_until_ctrl_c(home: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fogshift.cli.main", "logs", "fog-a", "-f", "-n", "1",
         "--home", str(home)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp",
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")))
    reader.start()
    try:
        wait_until(lambda: seen == ["node-fog-a line 50\n"], 60, describe="the tail")
        with open(home / "logs" / "node-fog-a.log", "a") as log:
            log.write("appended 1\nappended")  # the second line is not complete yet
            log.flush()
            wait_until(lambda: "appended 1\n" in seen, 30, describe="the appended line")
            log.write(" 2\n")
        wait_until(lambda: "appended 2\n" in seen, 30, describe="the completed line")
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=30)
    assert seen == ["node-fog-a line 50\n", "appended 1\n", "appended 2\n"]


# -- the demo's example ---------------------------------------------------------------------


def test_demo_runs_from_a_fresh_copy_of_the_packaged_example(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec_path = demo_copy(home)
    assert spec_path == home / "demo" / "case1" / "case1.yaml"
    spec = load_spec(spec_path)
    # Its input is the example's data and its output goes to the copy, not to the example.
    source = Path(spec.element("source").options["path"])
    assert source.read_bytes() == (CASE1.parent / "data" / "case1.csv").read_bytes()
    assert Path(spec.element("sink").options["path"]).is_relative_to(home / "demo")
    # Again, after the user changed the copy: the example comes back as it is.
    spec_path.write_text("broken")
    assert demo_copy(home).read_text() == CASE1.read_text()
    shutil.rmtree(home)


@pytest.mark.parametrize(("case", "file"), [("ecg", "case2.yaml"), ("twins", "case2-twins.yaml")])
def test_the_case2_demos_run_from_a_copy_of_case2_and_read_its_parts(
    tmp_path: Path, case: str, file: str
) -> None:
    home = tmp_path / "home"
    spec_path = demo_copy(home, case)
    assert spec_path == home / "demo" / "case2" / file
    # The twins' classifier partitions count as the one classifier the spec declares.
    parts = case2_parts(load_spec(spec_path))
    assert parts.processing == ("amplify", "bandpass", "classify")
    assert parts.alarms.is_relative_to(home / "demo")  # its alarms go to the copy
    windows = parts.source.duration_s / parts.source.window_s
    assert parts.windows == windows * parts.source.patients
    # A spec of another shape is refused with what a Case 2 pipeline needs.
    with pytest.raises(InvalidInput, match="not a Case 2 pipeline") as refused:
        case2_parts(load_spec(demo_copy(home)))
    assert "a csv-sink reading the classifier" in str(refused.value.expected)


def test_the_twins_demo_needs_a_classifier_split_over_gateways(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec_path = demo_copy(home, "twins")
    spec = load_spec(spec_path)
    parted = _partitions(spec, "classify")
    assert [(e.id, e.node) for e in parted] == [
        ("classify-p0", "gateway-a"), ("classify-p1", "gateway-b")
    ]  # fmt: skip
    # Case 2 with one classifier has no twin to move between gateways.
    with pytest.raises(InvalidInput, match="not split over gateways") as refused:
        _partitions(load_spec(demo_copy(home, "ecg")), "classify")
    assert "case2-twins.yaml" in str(refused.value.hint)
    assert refused.value.received == "one classifier"
    # ... and the group-moving demo refuses a partitioned classifier before it deploys.
    with pytest.raises(InvalidInput, match="is partitioned") as refused:
        run_ecg(home, spec, 1.0, Console(), None)
    assert "--case twins" in str(refused.value.hint)
    # Either is refused before a cluster starts for it (none is up in this home).
    for case, path, says in (("twins", demo_copy(home, "ecg"), "not split over gateways"),
                             ("ecg", spec_path, "is partitioned")):  # fmt: skip
        with pytest.raises(InvalidInput, match=says):
            run_demo(home, path, 1.0, False, Console(), case=case)
    assert not (home / "cluster.json").exists()


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_a_wait_that_cannot_be_waited_is_refused_before_anything_starts(
    timeout: str, tmp_path: Path
) -> None:
    # `up --timeout -1` started every service, then gave up on them at once.
    result = runner.invoke(cli.app, ["up", "--nodes", "a", "--timeout", timeout,
                                     "--home", str(tmp_path / "home")])  # fmt: skip
    assert isinstance(result.exception, InvalidInput), result.output
    assert result.exception.message.startswith("--timeout ")
    assert result.exception.message.endswith(
        "is not a finite number" if timeout == "nan" else "is out of range"
    )
    assert result.exception.expected == "a number from 1 to 86400"
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["errors", "p", "--limit", "0"], "a number from 1 to 10000"),
        (["state", "p", "a", "--limit", "200000"], "a number from 1 to 100000"),
        (["events", "p", "a", "--tail", "0"], "a number from 1 to 20000"),
        (["logs", "-n", "-1"], "a number of at least 0"),
        (["migrate", "p", "a", "--keys", "k", "--to", "n", "--wave-keys", "0"],
         "a number from 1 to 1000"),
        (["dashboard", "--port", "70000"], "a number from 0 to 65535"),
        (["net", "show", "--samples", "0"], "a number of at least 1"),
    ],
)  # fmt: skip
def test_an_option_out_of_range_is_refused_in_fogshifts_words(
    argv: list[str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Invalid value for '--limit': Input should be greater than or equal to 1" in a usage
    # box: pydantic's words, neither what was received nor a hint.
    client = StandInClient({})
    use(monkeypatch, client)
    result = runner.invoke(cli.app, argv)
    assert isinstance(result.exception, InvalidInput), result.output
    assert result.exception.expected == expected and result.exception.hint
    assert result.exception.received == argv[-1] and client.requests == []
    # The help still gives the range (typer's own min/max showed it).
    if argv[0] == "errors":
        assert "[1 to 10000]" in runner.invoke(cli.app, ["errors", "--help"]).stdout


def test_a_dashboard_name_or_spec_folder_that_is_wrong_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    # In this process (the real entry point, its output captured): an interpreter each
    # cost ~7 s under the suite's load. A refusal that broke would not serve here either:
    # ``tmp_path`` has no cluster, which `dashboard` refuses before it binds.
    result = fogshift_in_process("dashboard", "--home", str(tmp_path), "--host", "0.0.0.0",
                                 "--allow-host", "http://dash.example.org:8765",
                                 check=False)  # fmt: skip
    out = flat(result.stdout + result.stderr)
    assert result.returncode == 2, out
    assert "is not a host name the dashboard can be reached by" in out
    assert "DNS name" in out and "no scheme, port or *" in out
    assert "Traceback" not in out
    # A mistyped spec folder was taken, and each spec deployed from the browser was then
    # refused for a missing file, under a hint that named the spec file (a symlink loop:
    # a traceback).
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    result = fogshift_in_process("dashboard", "--home", str(tmp_path), "--spec-dir",
                                 str(tmp_path / "loop"), check=False)  # fmt: skip
    out = flat(result.stdout + result.stderr)
    assert result.returncode == 2, out
    assert "is not a folder" in out and "Too many levels of symbolic links" in out
    assert "open: " not in out and "Traceback" not in out


@pytest.mark.parametrize("command", [["status"], ["down"], ["logs"], ["topology", "show"]])
def test_a_home_the_os_will_not_look_up_is_refused_not_a_traceback(command: list[str]) -> None:
    # Path.exists() raises for a name over 255 bytes: every command printed a traceback.
    with pytest.raises(InvalidInput) as err:
        runner.invoke(cli.app, [*command, "--home", "x" * 300], catch_exceptions=False)
    assert "--home" in err.value.message and "cannot be used" in err.value.message
    assert err.value.received and "File name too long" in err.value.received
    assert err.value.expected and err.value.hint


def test_broker_credentials_without_the_broker_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # They were silently unused: the cluster started a broker of its own.
    seen: list[str | None] = []
    cluster_nodes = cli._cluster_nodes

    def looked(home: Path) -> Any:
        # (What the services `up` starts inherit: the password read is not handed down to
        # the agents, their JVMs and every Python worker, a processor's code included.)
        seen.append(os.environ.get("FOGSHIFT_NATS_PASSWORD"))
        return cluster_nodes(home)

    monkeypatch.setattr(cli, "_cluster_nodes", looked)
    with pytest.raises(InvalidInput, match="broker credentials need the broker") as err:
        runner.invoke(cli.app, ["up", "--nodes", "a", "--nats-user", "u", "--home",
                                str(tmp_path / "home")],
                      env={"FOGSHIFT_NATS_PASSWORD": "p"}, catch_exceptions=False)  # fmt: skip
    assert err.value.expected and "--nats-url" in err.value.expected
    assert not (tmp_path / "home").exists()
    assert seen == [None]


def test_the_broker_password_is_never_taken_from_the_command_line(tmp_path: Path) -> None:
    # Given as --nats-password, it showed in `ps` to every user of the host while `up` ran.
    up = ["up", "--nodes", "a", "--nats-user", "u", "--home", str(tmp_path / "home")]
    with pytest.raises(InvalidInput, match="shows to every user") as err:
        runner.invoke(cli.app, [*up, "--nats-password", "p"], catch_exceptions=False)
    assert err.value.expected and "FOGSHIFT_NATS_PASSWORD" in err.value.expected
    assert err.value.hint and "--nats-password-file" in err.value.hint
    # A file others may read is refused too; one of mode 0600 is read (its first line),
    # and then the next check speaks (here: no --nats-url).
    secret = tmp_path / "password"
    secret.write_text("s3cret\nignored\n")
    secret.chmod(0o644)
    with pytest.raises(InvalidInput, match="may be read or written by others") as err:
        runner.invoke(cli.app, [*up, "--nats-password-file", str(secret)], catch_exceptions=False)
    assert err.value.received == "mode 0644" and err.value.hint == f"chmod 600 {secret}"
    secret.chmod(0o620)  # (others may write it: then choose what it says)
    with pytest.raises(InvalidInput, match="read or written by others"):
        runner.invoke(cli.app, [*up, "--nats-password-file", str(secret)], catch_exceptions=False)
    secret.chmod(0o600)
    with pytest.raises(InvalidInput, match="broker credentials need the broker"):
        runner.invoke(cli.app, [*up, "--nats-password-file", str(secret)], catch_exceptions=False)
    with pytest.raises(InvalidInput, match="given twice"):
        runner.invoke(cli.app, [*up, "--nats-password-file", str(secret)],
                      env={"FOGSHIFT_NATS_PASSWORD": "p"}, catch_exceptions=False)  # fmt: skip
    # An empty variable was taken for none (the broker refused the user later); an empty
    # first line, a file missing or not text, or one of another user, are refused too.
    with pytest.raises(InvalidInput, match="FOGSHIFT_NATS_PASSWORD is empty"):
        runner.invoke(cli.app, up, env={"FOGSHIFT_NATS_PASSWORD": ""}, catch_exceptions=False)
    secret.write_text("\nsecond\n")
    with pytest.raises(InvalidInput, match="is empty"):
        runner.invoke(cli.app, [*up, "--nats-password-file", str(secret)], catch_exceptions=False)
    secret.write_bytes(b"\xff\xfe")
    with pytest.raises(InvalidInput, match="cannot be read"):
        runner.invoke(cli.app, [*up, "--nats-password-file", str(secret)], catch_exceptions=False)
    with pytest.raises(InvalidInput, match="cannot be read") as err:
        runner.invoke(cli.app, [*up, "--nats-password-file", str(tmp_path / "none")],
                      catch_exceptions=False)  # fmt: skip
    assert err.value.received and "No such file" in err.value.received
    if os.geteuid() == 0:  # (only root can give a file away)
        secret.write_text("s3cret\n")
        os.chown(secret, 65534, -1)
        with pytest.raises(InvalidInput, match="belongs to another user"):
            runner.invoke(cli.app, [*up, "--nats-password-file", str(secret)],
                          catch_exceptions=False)  # fmt: skip
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("nodes", ["", ",", "cloud,fog.a"])
def test_validate_refuses_node_names_no_node_can_have(nodes: str, tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("pipeline: p\nelements: []\n")
    with pytest.raises(InvalidInput, match="--nodes names the nodes") as err:
        runner.invoke(cli.app, ["validate", str(spec), "--nodes", nodes], catch_exceptions=False)
    assert err.value.received == repr(nodes)


# -- --help ---------------------------------------------------------------------------------


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(get_command(cli.app)))


def _wide_help(path: tuple[str, ...]) -> str:
    # Wide enough that no cell wraps: each text is then one row of its table.
    result = runner.invoke(cli.app, [*path, "--help"], env={"COLUMNS": "2000"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(
    "path", [p for p, c in COMMANDS if getattr(c, "commands", None)], ids=" ".join
)
def test_a_command_list_shows_each_summary_on_one_line(path: tuple[str, ...]) -> None:
    # Rich help kept a summary's line breaks in the list: "nodes  Per node: …; then what is
    # wrong" with the rest of the sentence on the next rows, beside no command.
    group = dict(COMMANDS)[path]
    rows = _wide_help(path).splitlines()
    for name, sub in group.commands.items():
        if sub.hidden:
            continue
        summary = " ".join(inspect.cleandoc(sub.help or "").split("\n\n")[0].split())
        row = next((r for r in rows if f"│ {name} " in r), None)
        assert row is not None and summary in " ".join(row.split()), (name, summary, row)


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS[1:]], ids=" ".join)
def test_an_options_help_is_shown_whole(path: tuple[str, ...]) -> None:
    # Rich read "[default: $FOGSHIFT_TEST_PAUSE_AT, else …]" as markup and printed nothing of it.
    shown = " ".join(_wide_help(path).split())
    for param in dict(COMMANDS)[path].params:
        text = " ".join((getattr(param, "help", None) or "").replace("\\[", "[").split())
        assert text in shown, (param.name, text)


def test_events_of_a_partitioned_element_name_each_event_s_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A merged page's sequences are each partition's own: shown without their partition
    # (and as "stream sequences 1-0 of 0"), they named nothing.
    event = {"seq": 4, "epoch": 1, "stored": 1.0, "timestamp": 1.0, "creator": "agg",
             "body": {"sensor": "s1"}}  # fmt: skip
    merged = [{**event, "partition": "agg-p0"}, {**event, "partition": "agg-p1"}]
    page = {"pipeline": "p", "element": "agg", "key": "s1", "scanned_after": 0,
            "scanned_to": 0, "last_seq": 0, "events": merged}  # fmt: skip
    use(monkeypatch, StandInClient({"/pipelines/p/elements/agg/events": page}))
    result = runner.invoke(cli.app, ["events", "p", "agg", "s1"])
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert "its partitions' newest, by when stored" in text and "1-0 of 0" not in text
    assert "agg-p0" in text and "agg-p1" in text


def test_an_orchestrator_lost_mid_operation_is_said_with_what_becomes_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An operator's walk-through: the orchestrator killed during `migrate` left only
    # "cannot be reached: RemoteProtocolError" (its recovery's outcome in its log alone).
    from fogshift.common.exceptions import NoAnswer

    def broke() -> Any:
        raise silent_orchestrator(NoAnswer(
            "the orchestrator at http://127.0.0.1:1 cannot be reached: RemoteProtocolError"
        ))  # fmt: skip

    use(monkeypatch, StandInClient({}, broke))
    result = runner.invoke(cli.app, ["migrate", "p", "aggregate", "--to", "fog-b", "--json"])
    assert isinstance(result.exception, NoAnswer), result.output
    said = flat(str(result.exception))
    assert "stopped answering during the migration of p/aggregate" in said, said
    assert "RemoteProtocolError" in said and "`fogshift logs orchestrator` how it ended" in said
    assert "a migration before its switch is rolled back" in said

    # A node that did not answer the orchestrator, in the orchestrator's answer: said as it
    # was, not as the orchestrator's own silence.
    def passed_on() -> Any:
        raise NoAnswer("node agent 'fog-b' at http://127.0.0.1:2 took the request and did "
                       "not answer in time (ReadTimeout)")  # fmt: skip

    use(monkeypatch, StandInClient({}, passed_on))
    result = runner.invoke(cli.app, ["migrate", "p", "aggregate", "--to", "fog-b", "--json"])
    assert isinstance(result.exception, NoAnswer), result.output
    said = flat(str(result.exception))
    assert said.startswith("node agent 'fog-b' at") and "stopped answering" not in said, said


def test_a_pe_named_as_the_cli_prints_it_is_told_to_be_two_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `fogshift state p/aggregate` built GET /pipelines/p/aggregate/...: "no endpoint", with
    # a hint about the REST schema.
    client = StandInClient({})
    use(monkeypatch, client)
    for argv in (["state", "p/aggregate"], ["status", "p/aggregate"], ["restore", "p", "a/b"],
                 ["migrate", "p/aggregate", "--to", "fog-b"], ["stop", "p/x"]):  # fmt: skip
        result = runner.invoke(cli.app, argv)
        assert type(result.exception).__name__ == "InvalidName", (argv, result.output)
        assert client.requests == [], argv  # refused before any request
    result = runner.invoke(cli.app, ["state", "p/aggregate"])
    assert result.exception.hint == "name the pipeline and the PE as two arguments: p aggregate"
    result = runner.invoke(cli.app, ["events", "p", "agg regate"])
    assert result.exception.hint == "`fogshift status` lists the pipelines and their PEs"


def test_down_warns_of_a_process_it_had_to_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    # A frozen node killed after the grace time was said "stopped" as for a clean end.
    report = cli.cluster_ops.Stopped(["orchestrator", "node fog-a", "node fog-b"],
                                     ["node fog-a"], ["node fog-b"])  # fmt: skip
    monkeypatch.setattr(cli.cluster_ops, "down", lambda home: report)
    result = runner.invoke(cli.app, ["down"])
    assert result.exit_code == 0, result.output
    assert "stopped orchestrator, node fog-b" in flat(result.stdout)
    assert "node fog-a: had stopped already" in flat(result.stdout)
    assert flat(result.stderr) == (
        f"warning: node fog-b did not stop within {cli.cluster_ops.DOWN_GRACE_S:g} s of SIGTERM "
        "(frozen or hung?): killed with SIGKILL"
    )
