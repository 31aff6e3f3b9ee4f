"""``fogshift demo``: Case 1 (or Case 2, :mod:`fogshift.cli.demo_ecg`) across nodes, with a
consistency verdict."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fogshift.cli.output import progress_to
from fogshift.common.http import ServiceClient
from fogshift.contracts import NodeView
from fogshift.spec.examples import example_path
from fogshift.spec.loader import check_fresh, load_spec, validate_spec
from fogshift.spec.models import PipelineSpec
from fogshift.supervisor import cluster as cluster_ops
from fogshift.verify.case1 import case1_parts
from fogshift.verify.reference import Verdict, case1_reference, compare, read_sink

#: The demos: ``--case`` -> the example it runs (its folder and spec), and the nodes a
#: cluster it starts has besides the spec's (a spare to move to).
CASES = {
    "case1": ("case1", "case1.yaml", ("cloud", "fog-a", "fog-b")),
    "ecg": ("case2", "case2.yaml", ("gateway-b",)),
    "twins": ("case2", "case2-twins.yaml", ()),
}


def demo_copy(home: Path, case: str = "case1") -> Path:
    """A fresh copy of the example of ``case`` (spec and data) in ``<home>/demo/<example>``;
    returns its spec.

    The demo runs from a copy, not from the example itself: the spec's sink writes beside
    the spec, and an installed example may sit in a folder the user cannot (or should not)
    write. A previous run's output is left for the deploy, which starts the sink afresh.
    """
    example, spec, _ = CASES[case]
    source = example_path(example)
    target = home / "demo" / example
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("out"))
    return target / spec


#: In a demo's home while the cluster there is one the demo started (see :func:`run_demo`).
DEMO_MARK = "demo-started"


def run_demo(
    home: Path,
    spec_path: Path,
    timeout_s: float,
    keep: bool,
    console: Console,
    migrate_to: tuple[str, ...] | None = None,
    case: str = "case1",
) -> bool:
    """Bring a cluster up if needed, run Case 1, compare with the reference; True if consistent.

    With ``case="ecg"``, Case 2 instead (:func:`fogshift.cli.demo_ecg.run_ecg`); with
    ``case="twins"``, Case 2's twins over two gateways, one following its wearable
    (:func:`fogshift.cli.demo_ecg.run_twins`).

    On the way, early (while the source still reads its file, however long anything else
    takes), the node hosting the aggregate is killed (SIGKILL of its whole process group) and
    the aggregate restored on another node from its central checkpoint: it reprocesses what
    it had emitted since that checkpoint, without emitting it again, then the events that
    arrived while it was down. Then the restored aggregate is live-migrated to each node of
    ``migrate_to`` (default: a healthy node it is not on).
    """
    spec = load_spec(spec_path)
    # A spec the case cannot run is refused before a cluster starts for it.
    if case == "case1":
        case1_parts(spec)
    else:
        from fogshift.cli.demo_ecg import check_ecg, check_twins  # scipy: only for Case 2

        (check_twins if case == "twins" else check_ecg)(spec)
    nodes = sorted({e.node for e in spec.elements} | set(CASES[case][2]))
    # A demo that started the home's cluster and was killed before it stopped it (its
    # mark left): that cluster is the demo's, stopped at the end — taken for the user's, it
    # was left running by every later demo.
    with _ended_by_signals():
        return _run_case(home, spec, case, nodes, timeout_s, keep, console, migrate_to)


@contextmanager
def _ended_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (a CI's timeout, a terminal closed) end the demo as Ctrl-C does:
    its ``finally`` runs (Python's default ended the process there, the cluster it started
    left running)."""

    def end(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    before = {sig: signal.signal(sig, end) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _run_case(
    home: Path,
    spec: PipelineSpec,
    case: str,
    nodes: list[str],
    timeout_s: float,
    keep: bool,
    console: Console,
    migrate_to: tuple[str, ...] | None,
) -> bool:
    """:func:`run_demo`'s run, once its spec is checked."""
    mark = home / DEMO_MARK
    started = mark.exists()
    if not cluster_ops.cluster_running(home):
        # None, or one that died (its file left, as after a reboot): `up` starts it (what
        # still ran of it stopped first, or what died of it started again). One of the
        # user's, brought back, is left running.
        existed = cluster_ops.cluster_file(home).exists()
        if not existed:
            home.mkdir(parents=True, exist_ok=True)
            mark.touch()  # (before `up`: a demo killed while it starts is the next's too)
        with console.status("starting fogshift") as status:
            cluster_ops.up(home, nodes, on_progress=progress_to(status, console))
        started = started or not existed
    try:
        if case == "ecg":
            from fogshift.cli.demo_ecg import run_ecg  # scipy and the model: only for Case 2

            return run_ecg(home, spec, timeout_s, console, migrate_to[0] if migrate_to else None)
        if case == "twins":
            from fogshift.cli.demo_ecg import run_twins

            return run_twins(home, spec, timeout_s, console)
        return _run(home, spec, timeout_s, console, migrate_to)
    finally:
        if started and not keep:
            cluster_ops.down(home)
            console.print("cluster stopped (fogshift down)")
        # (Stopped; or kept, the user's from now on. A `down` that failed leaves it.)
        mark.unlink(missing_ok=True)


def redeploy(client: ServiceClient, spec: PipelineSpec) -> None:
    """Deploy ``spec`` afresh, stopping a run of its name left from before, but only once
    the spec fits the cluster: its nodes are checked against the cluster's first (a spec
    refused after the stop had stopped that run for nothing).

    Raises:
        InvalidSpec: The spec names a node the cluster lacks, or is not one to deploy
            afresh; nothing was stopped.
    """
    validate_spec(spec, nodes=[NodeView.model_validate(n).name for n in client.get("/nodes")])
    check_fresh(spec)
    existing = {p["pipeline"]: p for p in client.get("/pipelines")}
    if existing.get(spec.pipeline, {}).get("status") == "running":
        client.post(f"/pipelines/{spec.pipeline}/stop")
    # (The demo's run is anew each time: a kept run of the name is started over.)
    client.post("/pipelines", json=spec.model_dump(mode="json"), params={"fresh": "true"})


def _sink_rows(client: ServiceClient, pipeline: str, at_least: int, deadline: float) -> int:
    """Lines the pipeline's sink has written, once there are at least ``at_least``."""
    while True:
        status = client.get(f"/pipelines/{pipeline}")
        written = int(next(e["events_out"] for e in status["elements"] if e["kind"] == "csv-sink"))
        if written >= at_least or time.monotonic() > deadline:
            return written
        time.sleep(0.5)


def checkpointed(
    client: ServiceClient,
    pipeline: str,
    element: str,
    ahead: int,
    console: Console,
    deadline: float,
    ended: Callable[[dict], bool] | None = None,
) -> tuple[dict, dict, dict | None]:
    """Wait until ``element`` has a central checkpoint and has processed ``ahead`` input
    events beyond it (by its node-level checkpoints, which run ahead of the central ones):
    a restore then has events to reprocess, whatever the timing.

    ``ended(status)`` says the input has ended (the pipeline's status as
    ``GET /pipelines/{p}`` gives it): from then on a central checkpoint is enough, because
    no input is left to run ahead of it.

    Returns:
        The pipeline's status, the node hosting the PE (as ``GET /nodes`` lists it) and its
        central checkpoint (``None`` if the deadline passed without one).
    """
    key = f"{pipeline}/{element}"
    with console.status(f"waiting for a central checkpoint of {key} and input beyond it"):
        while True:
            # The placement, not the nodes' reports: those lag a heartbeat behind a move.
            status = client.get(f"/pipelines/{pipeline}")
            placed = next(e["node"] for e in status["elements"] if e["element"] == element)
            host = next(n for n in client.get("/nodes") if n["name"] == placed)
            mine: dict = next((c for c in host["checkpoints"] if c["element"] == key), {})
            central, local = mine.get("central"), mine.get("node_level")
            done = central is not None and local is not None and (
                local["progress"] >= (central.get("progress") or 0) + ahead
                or (ended is not None and ended(status))
            )  # fmt: skip
            if done or time.monotonic() > deadline:
                return status, host, central
            time.sleep(0.5)


def _input_moved_on(client: ServiceClient, pipeline: str, killed_at: float, until: float) -> bool:
    """Wait until the pipeline's source has published events after ``killed_at`` (a
    ``time.monotonic()`` instant); False if ``until`` came first.

    The source's count comes from its node's heartbeats: the first count taken from a
    heartbeat sent after the kill may still lack the batch the source was publishing at the
    kill, so the count must grow twice from there. The second growth is a batch that began
    after the kill (a source's batches run one after another).
    """
    counts: list[int] = []
    while time.monotonic() < until:
        asked = time.monotonic()
        nodes = {n["name"]: n for n in client.get("/nodes")}
        # Read after the nodes: the heartbeat behind the count is no older than theirs.
        status = client.get(f"/pipelines/{pipeline}")
        source = next(e for e in status["elements"] if e["kind"] == "csv-source")
        node = nodes.get(source["node"])
        if node is not None and asked - float(node["last_seen_s"]) > killed_at:
            count = int(source["events_out"])
            if not counts or count > counts[-1]:
                counts.append(count)
            if len(counts) >= 3:
                return True
        time.sleep(0.2)
    return False


def _kill_and_restore(
    client: ServiceClient,
    pipeline: str,
    element: str,
    window: int,
    source_rows: int,
    console: Console,
    deadline: float,
    detect_after_s: float,
) -> tuple[dict, str]:
    """Kill the node hosting ``element`` while its input flows; restore the PE.

    The kill waits for a central checkpoint of the PE and for the PE to have processed two
    windows of input beyond it (by its node-level checkpoints, which run ahead of the central
    ones): the restore then has events to reprocess, whatever the timing. While the input
    still flows, the restore waits for the source to publish events after the kill, as a
    restore after a real loss would: it then has intermediate events too.

    Returns:
        The restore's report and the name of the node killed.
    """
    status, host, central = checkpointed(client, pipeline, element, 2 * window, console, deadline)
    key = f"{pipeline}/{element}"
    cluster_ops.kill_group(int(host["pgid"]), signal.SIGKILL)
    killed_at = time.monotonic()
    source = next(e for e in status["elements"] if e["kind"] == "csv-source")
    read = int(source["events_out"]) + int(source["dead_letters"])  # malformed rows too
    flow = (
        f"while the input still flows (the source at row {read} of {source_rows})"
        if read < source_rows
        else f"after the input ended (all {source_rows} rows read): nothing new arrives"
    )
    console.print(
        f"[red]killed[/] node [bold]{host['name']}[/] (SIGKILL of its process group) "
        f"with {key} on it, {flow}; central checkpoint: "
        + (
            f"batch {central['batch']}, input position {central.get('progress')}, "
            f"{central['age_ms']:.0f} ms old"
            if central
            else "none (it replays its input from the start)"
        )
    )
    if read < source_rows:
        # A node's loss is noticed seconds after it happens; restoring at once, before the
        # input has moved on, would leave the restore no intermediate events to show.
        # Within half the silence the orchestrator allows: it restores a lost node's PEs itself.
        until = min(deadline, killed_at + detect_after_s / 2)
        with console.status("waiting for input the killed node never saw"):
            _input_moved_on(client, pipeline, killed_at, until)
    report: dict = client.post(f"/pipelines/{pipeline}/elements/{element}/restore", json={})
    console.print(
        f"restored [bold]{element}[/] on {report['target']} (epoch {report['epoch']}): "
        f"reprocessed {report['reprocessed_events']} events without emitting in "
        f"{report['reprocess_ms']:.0f} ms, then {report['intermediate_events']} intermediate "
        f"in {report['intermediate_ms']:.0f} ms; the old instance is fenced"
    )
    return report, str(host["name"])


def _migrate(
    client: ServiceClient, pipeline: str, element: str, target: str, console: Console
) -> None:
    report = client.post(
        f"/pipelines/{pipeline}/elements/{element}/migrate", json={"target": target}
    )
    phases = ", ".join(f"{k} {v:.0f}" for k, v in report["phases_ms"].items())
    console.print(
        f"live-migrated [bold]{element}[/] {report['origin']} -> {report['target']}: "
        f"phases ms: {phases}; downtime {report['downtime_ms']} ms; "
        f"state {report['state_bytes']} bytes"
    )


def _run(
    home: Path,
    spec: PipelineSpec,
    timeout_s: float,
    console: Console,
    migrate_to: tuple[str, ...] | None,
) -> bool:
    source, agg, sink = case1_parts(spec)
    reference = case1_reference(source, agg["field"], agg["window"], agg.get("function", "avg"))
    with cluster_ops.orchestrator_client(home, cluster_ops.OPERATION_TIMEOUT_S) as client:
        redeploy(client, spec)
        console.print(
            f"deployed [bold]{spec.pipeline}[/]: "
            + ", ".join(f"{e.id}@{e.node}" for e in spec.elements)
        )
        deadline = time.monotonic() + timeout_s
        aggregate = next(e.id for e in spec.elements if e.kind == "window-aggregate")
        _sink_rows(client, spec.pipeline, at_least=15, deadline=deadline)
        with open(source, "rb") as rows:
            source_rows = sum(1 for line in rows if line.strip()) - 1  # less the header
        # The kill comes first: a migration's warm-up can take longer than the input lasts.
        restored, killed = _kill_and_restore(
            client, spec.pipeline, aggregate, int(agg["window"]), source_rows, console, deadline,
            spec.recovery.detect_after_s,
        )  # fmt: skip
        if migrate_to is None:
            # Not the killed node: the orchestrator still calls it healthy until its heartbeats
            # have been missing for node_timeout_s, and a restore can be quicker than that.
            healthy = sorted(n["name"] for n in client.get("/nodes") if n["healthy"])
            migrate_to = tuple(n for n in healthy if n not in (restored["target"], killed))[:1]
        for target in migrate_to:
            _migrate(client, spec.pipeline, aggregate, target, console)
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console,
        ) as progress:  # fmt: skip
            task = progress.add_task("sink rows", total=len(reference.rows))
            written = 0
            while time.monotonic() < deadline:
                status = client.get(f"/pipelines/{spec.pipeline}")
                written = next(
                    e["events_out"] for e in status["elements"] if e["kind"] == "csv-sink"
                )
                progress.update(task, completed=written)
                if written >= len(reference.rows):
                    break
                time.sleep(0.5)
        time.sleep(1.0)  # a duplicate would show up within a batch or two: give it the chance
        status = client.get(f"/pipelines/{spec.pipeline}")
        dead = sum(e["dead_letters"] for e in status["elements"])
    verdict: Verdict = compare(reference.rows, read_sink(sink, agg["field"]))
    if dead != reference.dropped:
        verdict.consistent = False
        verdict.problems.append(f"{dead} dead letters, {reference.dropped} rows expected dropped")
    colour = "green" if verdict.consistent else "red"
    console.print(f"[{colour}]{verdict.summary()}[/]")
    console.print(f"dead letters: {dead} (reference drops {reference.dropped} invalid rows)")
    return verdict.consistent
