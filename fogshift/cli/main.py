"""``fogshift``: the command line. Environment variables are read here and nowhere else."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.status import Status
from rich.table import Table
from rich.text import Text

from fogshift.agent.config import AgentConfig
from fogshift.broker.server import DEFAULT_SYNC
from fogshift.cli import net as net_cli
from fogshift.cli.bench import bench_app
from fogshift.cli.net import Home, usable_home
from fogshift.cli.output import escape, make_console, progress_to, visible
from fogshift.cli.topology import topology_app
from fogshift.common.exceptions import InvalidName, NoAnswer
from fogshift.common.files import make_private_dir
from fogshift.common.http import SERVER_KEEP_ALIVE_S
from fogshift.common.locks import AGENT_LOCK, ORCHESTRATOR_LOCK, claim
from fogshift.common.logfile import keep_logs
from fogshift.common.names import EXPECTED, NAME_PATTERN, NAME_RE
from fogshift.common.options import ranged
from fogshift.common.settings import check_environment, check_value
from fogshift.common.text import counted, one_line, span
from fogshift.common.validation import message_of
from fogshift.contracts import (
    DOWNTIME_FAILED,
    DeadLetter,
    DeleteResult,
    ElementStatus,
    EventPage,
    GroupMigrationReport,
    GroupMigrationStatus,
    HopLatency,
    KeyMoveReport,
    KeyMoveStatus,
    KeyOrder,
    MigrationMode,
    MigrationReport,
    NodeView,
    OperationKind,
    OperationView,
    OrchestratorHealth,
    PEState,
    PipelineStatus,
    RestoreMethod,
    RestoreReport,
    RestoreStatus,
    ScaleReport,
    StopResult,
    TwinState,
)
from fogshift.exceptions import FogshiftError, InvalidInput
from fogshift.migration.exceptions import MigrationFailed
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.restoration.exceptions import RestoreFailed
from fogshift.spec.exceptions import InvalidSpec
from fogshift.spec.loader import check_fresh, load_spec
from fogshift.spec.models import MAX_PARTITIONS, PipelineSpec
from fogshift.supervisor import cluster as cluster_ops

app = typer.Typer(
    help="fogshift: stateful stream pipelines across fog nodes (PySpark + NATS JetStream).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(bench_app, name="bench")
app.add_typer(topology_app, name="topology")
app.add_typer(net_cli.app, name="net")
console = make_console()
M = TypeVar("M", bound=BaseModel)
err_console = make_console(stderr=True)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _one_name(value: str | None) -> str | None:
    """A pipeline's or element's name as a command takes it: one name. ``p/aggregate``, as
    the CLI prints a PE, was sent as two segments of the request's path: "no endpoint GET
    /pipelines/p/aggregate" with a hint about the REST schema.

    Raises:
        InvalidName: ``value`` is not a name."""
    if value is not None and not NAME_PATTERN.fullmatch(value):
        pipeline, slash, element = value.partition("/")
        raise InvalidName(
            f"{value!r} is not the name of a pipeline or element",
            expected=EXPECTED[NAME_RE],
            received=repr(value),
            hint=f"name the pipeline and the PE as two arguments: {pipeline} {element}"
            if slash and NAME_PATTERN.fullmatch(pipeline) and NAME_PATTERN.fullmatch(element)
            else "`fogshift status` lists the pipelines and their PEs",
        )
    return value


#: A pipeline's or an element's name, checked before any request is built from it.
Pipeline = Annotated[str, typer.Argument(callback=_one_name, show_default=False)]
Element = Annotated[str, typer.Argument(callback=_one_name, show_default=False)]


def _setting(config: type[AgentConfig | OrchestratorConfig], field: str, what: str) -> str:
    """Help of an option whose default is a service's setting: where that default comes from.

    Such options default to ``None`` here: the service then reads ``FOGSHIFT_<FIELD>`` or
    takes the default its config class writes, the one place it is written."""
    # (Escaped: rich took "[default: ...]" for markup and dropped it from the help.)
    return escape(f"{what} [default: ${'FOGSHIFT_' + field.upper()}, else {config.default(field)}]")


#: A demo's own folder: not ``$FOGSHIFT_HOME``, which may name the user's cluster (the demo
#: deploys there, stops a pipeline of its name and kills a node).
DemoHome = Annotated[
    Path,
    typer.Option("--home", help="Folder of the demo's own cluster.", callback=usable_home),
]


def _given(**values: Any) -> dict[str, Any]:
    """The options given on the command line (not ``None``), to pass to a config class."""
    return {name: value for name, value in values.items() if value is not None}


def _print_json(data: Any) -> None:
    """Print ``data`` (a contract model, a list of them, or plain JSON) as JSON."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"fogshift {metadata.version('fogshift')}\n")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print the installed fogshift version and exit.",
        ),
    ] = False,
) -> None:
    """fogshift: stateful stream pipelines across fog nodes (PySpark + NATS JetStream)."""


#: Where `up` takes an existing broker's password from (or from a file: never the command line).
NATS_PASSWORD_VARIABLE = "FOGSHIFT_NATS_PASSWORD"


def _nats_password(ctx: typer.Context, given: str | None, file: Path | None) -> str | None:
    """The broker password ``up`` was given: from its variable or its file, never from the
    command line (any user of the host reads a command line in ``ps``).

    Raises:
        InvalidInput: The password on the command line, empty, from both places, or a file
            that cannot be read, that is not this user's or that others may read or write.
    """
    source = ctx.get_parameter_source("nats_password")
    expected = "the password in $FOGSHIFT_NATS_PASSWORD, or in a file of mode 0600 given by "
    expected += "--nats-password-file"
    if given is not None and source is not None and source.name == "COMMANDLINE":
        raise InvalidInput(
            "--nats-password on the command line shows to every user of this host (`ps`)",
            expected=expected,
            received="--nats-password on the command line",
            hint="FOGSHIFT_NATS_PASSWORD=... fogshift up ..., or --nats-password-file FILE",
        )
    if given is None and os.environ.get(NATS_PASSWORD_VARIABLE) == "":
        # (Click takes an empty variable for an unset one: the broker refused the user later.)
        raise InvalidInput(
            f"${NATS_PASSWORD_VARIABLE} is empty",
            expected=expected,
            received="an empty variable",
            hint=f"unset {NATS_PASSWORD_VARIABLE}, or set it to the broker user's password",
        )
    if file is None:
        return given
    if given is not None:
        raise InvalidInput(
            "the NATS password was given twice",
            expected=expected + " (one of them)",
            received="$FOGSHIFT_NATS_PASSWORD and --nats-password-file",
            hint="unset FOGSHIFT_NATS_PASSWORD or leave --nats-password-file out",
        )
    try:
        # (The file opened is the one judged: stat of the descriptor, not of the path.)
        with open(file, "rb") as handle:
            status = os.fstat(handle.fileno())
            text = handle.read().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(
            f"--nats-password-file {file} cannot be read",
            expected="a readable UTF-8 text file holding the password",
            received=one_line(str(exc)),
            hint="check the path and its permissions",
        ) from exc
    if status.st_uid != os.geteuid():
        raise InvalidInput(
            f"--nats-password-file {file} belongs to another user",
            expected=f"a file of this user's (uid {os.geteuid()}), mode 0600",
            received=f"a file of uid {status.st_uid}",
            hint="copy it to a file of your own, then chmod 600 it",
        )
    if status.st_mode & 0o077:
        raise InvalidInput(
            f"--nats-password-file {file} may be read or written by others than its owner",
            expected="a file of mode 0600 (or 0400)",
            received=f"mode {status.st_mode & 0o777:04o}",
            hint=f"chmod 600 {file}",
        )
    first = text.split("\n", 1)[0].removesuffix("\r")  # (its first line, as written)
    if not first:
        raise InvalidInput(
            f"--nats-password-file {file} is empty",
            expected="the password on the file's first line",
            received="an empty first line",
            hint="write the broker user's password on its first line",
        )
    return first


@app.command()
def up(
    ctx: typer.Context,
    home: Home = Path(".fogshift"),
    nodes: Annotated[str, typer.Option(help="Comma-separated node names.")] = "cloud,fog-a,fog-b",
    host: Annotated[str, typer.Option(help="Interface the services bind.")] = "127.0.0.1",
    nats_url: Annotated[
        str | None, typer.Option(envvar="FOGSHIFT_NATS_URL", help="Use this NATS server.")
    ] = None,
    nats_user: Annotated[
        str | None,
        typer.Option(
            envvar="FOGSHIFT_NATS_USER", help="The user fogshift connects as (with --nats-url)."
        ),
    ] = None,
    nats_password: Annotated[
        str | None,
        typer.Option(
            envvar=NATS_PASSWORD_VARIABLE,
            help="Only from $FOGSHIFT_NATS_PASSWORD (on the command line it would show in "
            "`ps` to every user of the host).",
        ),
    ] = None,
    nats_password_file: Annotated[
        Path | None,
        typer.Option(help="A file holding the NATS password, readable by its owner only."),
    ] = None,
    spark_master: Annotated[
        str | None,
        typer.Option(help=_setting(AgentConfig, "spark_master", "Spark master of every node.")),
    ] = None,
    timeout: Annotated[
        float,
        ranged("--timeout", "Seconds to wait for health.", 1, 86_400),
    ] = 240,
    checkpoint_interval: Annotated[
        float | None,
        typer.Option(
            help=_setting(
                AgentConfig, "checkpoint_interval_s", "Seconds between node-level checkpoints."
            )
        ),
    ] = None,
    trigger_ms: Annotated[
        int | None,
        typer.Option(
            help=_setting(
                AgentConfig,
                "trigger_ms",
                "Micro-batch trigger of every query (ms): longer means fewer batches, so less "
                "CPU on a small node, for more latency.",
            )
        ),
    ] = None,
    central_interval: Annotated[
        float | None,
        typer.Option(
            help=_setting(
                OrchestratorConfig, "central_interval_s", "Seconds between central pulls."
            )
        ),
    ] = None,
    duplicate_window: Annotated[
        float | None,
        typer.Option(
            help=_setting(
                OrchestratorConfig,
                "duplicate_window_s",
                "The broker's de-duplication window of new streams (s).",
            )
        ),
    ] = None,
    isolate: Annotated[
        bool,
        typer.Option(
            help="Run each node agent in a network namespace of its own, behind a link "
            "(veth + tbf + delaying relay) that `fogshift net` can partition. Needs root."
        ),
    ] = False,
    link: Annotated[
        list[str] | None,
        typer.Option(
            "--link",
            metavar="NODE=PROFILE",
            help="NODE=PROFILE (repeatable; *=PROFILE for every node): bandwidth and/or "
            "one-way delay of an isolated node's link, e.g. fog-a=10mbit,n100; delays n0, "
            "n100 (100±10 ms), n500 (500±50 ms) or normal:MEAN:SD (ms).",
        ),
    ] = None,
    topology: Annotated[
        Path | None,
        typer.Option(help="Fog topology for the planner (see examples/fog/topology.yaml)."),
    ] = None,
    plan_interval: Annotated[
        float | None,
        typer.Option(
            help=_setting(
                OrchestratorConfig, "plan_interval_s", "Seconds between backup/redeploy plans."
            )
        ),
    ] = None,
    broker_sync: Annotated[
        str | None,
        typer.Option(
            envvar="FOGSHIFT_BROKER_SYNC",
            help="When the broker fsyncs the records it stores: always (each batch before it "
            "is acknowledged, so acknowledged records survive a power loss of its host) or an "
            "interval such as 2m (nats-server's own default: a little faster, and up to that "
            "long of acknowledged records lost with the host's power). Not with --nats-url. "
            f"\\[default: {DEFAULT_SYNC}]",
        ),
    ] = None,
) -> None:
    """Start the broker, the orchestrator and one node agent per node; wait until healthy.

    On a running cluster: starts again what died, and adds the nodes named that it lacks."""
    from fogshift.network.links import parse_link_assignments

    # The services read their settings from the environment they inherit: refuse a bad one
    # here, before anything starts, rather than let a service die at start-up.
    check_environment(AgentConfig)
    check_environment(OrchestratorConfig)
    # And the options, which reach the services as their command lines.
    for settings, field, option, value in (
        (AgentConfig, "trigger_ms", "--trigger-ms", trigger_ms),
        (AgentConfig, "spark_master", "--spark-master", spark_master),
        (AgentConfig, "checkpoint_interval_s", "--checkpoint-interval", checkpoint_interval),
        (OrchestratorConfig, "central_interval_s", "--central-interval", central_interval),
        (OrchestratorConfig, "duplicate_window_s", "--duplicate-window", duplicate_window),
        (OrchestratorConfig, "plan_interval_s", "--plan-interval", plan_interval),
    ):
        if value is not None:
            check_value(settings, field, value, f"option {option}", "leave it out (the default)")
    nats_password = _nats_password(ctx, nats_password, nats_password_file)
    # Read: not handed down to the services `up` starts (the nodes take it from their 0600
    # broker file), their JVMs and every Python worker — a processor's code read it there.
    os.environ.pop(NATS_PASSWORD_VARIABLE, None)
    names = [n.strip() for n in nodes.split(",") if n.strip()]
    profiles = parse_link_assignments(link, names) if link else None
    before = _cluster_nodes(home.resolve())
    with console.status("starting fogshift") as status:
        cluster = cluster_ops.up(
            home.resolve(),
            names,
            host=host,
            nats_url=nats_url,
            nats_user=nats_user,
            nats_password=nats_password,
            spark_master=spark_master,
            timeout_s=timeout,
            on_progress=progress_to(status, console),
            checkpoint_interval_s=checkpoint_interval,
            central_interval_s=central_interval,
            duplicate_window_s=duplicate_window,
            trigger_ms=trigger_ms,
            isolate=isolate,
            links=profiles,
            topology=topology,
            plan_interval_s=plan_interval,
            broker_sync=broker_sync,
        )
    isolated = " in network namespaces" if isolate else ""
    # (The nodes that run: an `up` over a cluster whose nodes died starts its own ones again,
    # whatever --nodes says.)
    running = ", ".join(cluster.nodes)
    added = [n for n in cluster.nodes if before and n not in before]
    joined = f" ({', '.join(added)} added to the running cluster)" if added else ""
    console.print(f"[green]up[/]: nodes {running} healthy{isolated}{joined} "
                  f"(home {escape(str(home.resolve()))})")  # fmt: skip


def _cluster_nodes(home: Path) -> set[str]:
    """The nodes of the cluster under ``home`` if some of it runs (what `up` adds to);
    none if none does (`up` starts anew) or its file cannot be read (`up` says why)."""
    try:
        cluster = cluster_ops.read_cluster(cluster_ops.cluster_file(home))
    except (FogshiftError, OSError):
        return set()
    services = [cluster.orchestrator, *cluster.nodes.values()]
    return set(cluster.nodes) if any(p.runs() for p in services) else set()


@app.command()
def down(home: Home = Path(".fogshift")) -> None:
    """Stop everything `up` started. Pipelines, checkpoints and outputs are kept."""
    report = cluster_ops.down(home.resolve())
    running = [label for label in report.stopped if label not in report.gone]
    console.print(f"[green]down[/]: stopped {', '.join(running) or 'nothing'}")
    if report.gone:
        # (Killed or crashed before: said apart, not as if this stopped them.)
        console.print(f"{', '.join(report.gone)}: had stopped already")
    if report.killed:
        # (A frozen node was stopped as if it had ended cleanly: nothing said it was not.)
        err_console.print(
            f"warning: {', '.join(report.killed)} did not stop within "
            f"{cluster_ops.DOWN_GRACE_S:g} s of SIGTERM (frozen or hung?): killed with SIGKILL",
            highlight=False,
        )


@app.command("remove-node")
def remove_node(
    nodes: Annotated[
        list[str], typer.Argument(help="The nodes to take out of the running cluster.")
    ],
    home: Home = Path(".fogshift"),
    drain: Annotated[
        bool,
        typer.Option(
            "--drain",
            help="Move each node's PEs away first (a migration each, to the PE's planned "
            "redeploy node if it is healthy and stays, else to the healthy node that stays "
            "running the fewest PEs).",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Change nothing: say what keeps each node in the cluster (what a removal "
            "would be refused for, and which of it `--drain` moves).",
        ),
    ] = False,
) -> None:
    """Take nodes out of the running cluster once they host no PE.

    Move a node's PEs first (`migrate`), or let `--drain` move them. Standbys the
    orchestrator placed there start again on other nodes; a spec naming it as the standby
    node (`recovery.standby: NODE`) keeps it; a stopped pipeline's PEs there do not
    (`start` restores them on other nodes). Its agent stops, its broker user and token stop
    working; its folder stays. To add it again, run `up --nodes` with every node of the
    cluster and it."""
    if dry_run:
        held = cluster_ops.node_holds(home.resolve(), nodes)
        stopped = _stopped_on(home, nodes)
        for name, holds in held.items():
            if not holds:
                console.print(f"{name}: nothing keeps it; `fogshift remove-node {name}` "
                              "removes it")  # fmt: skip
            else:
                console.print(f"{name} is kept by:")
                for hold in holds:
                    console.print(Text(f"  {hold.text}{_HOLD_WAYS.get(hold.kind, '')}"))
            _say_stopped(name, stopped.get(name, []))
        return
    with console.status("removing nodes") as status:

        def say(message: str) -> None:
            status.update(message)
            if message.startswith("moving "):  # (a drain's moves stay on the screen)
                console.print(Text(message))

        gone: list[str] = []
        try:
            cluster = cluster_ops.remove_nodes(home.resolve(), nodes, say, drain=drain,
                                               removed=gone.append)  # fmt: skip
        except FogshiftError:
            # The nodes removed before the one refused stay removed: what they leave of
            # stopped pipelines is said as after a whole removal, then the refusal.
            _say_left(home, gone)
            raise
    console.print(f"[green]removed[/] {', '.join(nodes)}: nodes {', '.join(cluster.nodes)} remain")
    _say_left(home, nodes)


def _say_left(home: Path, removed: list[str]) -> None:
    """Say the stopped pipelines' PEs the ``removed`` nodes leave placed on them."""
    if not removed:
        return
    stopped = _stopped_on(home, removed)
    for name in removed:
        _say_stopped(name, stopped.get(name, []), removed=True)


def _stopped_on(home: Path, nodes: list[str]) -> dict[str, list[str]]:
    """:func:`cluster_ops.stopped_on`; if the orchestrator cannot tell now, said so and
    nothing listed (it is only said: the removal's outcome is not)."""
    try:
        return cluster_ops.stopped_on(home.resolve(), nodes)
    except (FogshiftError, ValueError) as exc:  # (ValueError: an answer not understood)
        console.print(Text(f"  (the stopped pipelines' PEs on {', '.join(nodes)} cannot be "
                           f"listed now: {one_line(str(exc))[:200]}; `fogshift status` "
                           "shows where each is placed)"))  # fmt: skip
        return {}


def _say_stopped(node: str, pes: list[str], removed: bool = False) -> None:
    """Say the stopped pipelines' PEs placed on ``node`` (``removed``, or to be): its
    removal leaves them there, and `start` restores them elsewhere."""
    for pipeline in dict.fromkeys(pe.split("/")[0] for pe in pes):
        mine = [pe for pe in pes if pe.split("/")[0] == pipeline]
        one = len(mine) == 1
        placed = ("was" if one else "were") if removed else ("is" if one else "are")
        console.print(Text(f"  {', '.join(mine)} of stopped pipeline {pipeline} {placed} "
                           f"placed on {node}: `fogshift start {pipeline}` restores "
                           f"{'it' if one else 'them'} on other nodes from the central "
                           "checkpoints (one whose deploy never completed is deployed "
                           "again instead)"))  # fmt: skip


#: How `remove-node --dry-run` says each kind of hold is ended (``NodeHold.kind``).
_HOLD_WAYS = {
    "pe": " (`--drain` moves it)",
    "settling": " (not moved: wait for the deploy or stop to end)",
    "standby": " (not moved: `--drain` is refused while it keeps the node)",
    "operation": " (not moved: wait for it to end)",
    "group": " (not moved: wait for it to end)",
    "scale": " (not moved: wait for it to end)",
}


@app.command()
def deploy(
    spec: Annotated[Path, typer.Argument(help="The pipeline spec (YAML).")],
    home: Home = Path(".fogshift"),
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start over a stopped pipeline of the spec's name: its streams, checkpoints "
            "and sinks' files begin empty (without it, refused: `fogshift start` goes on "
            "where it stopped).",
        ),
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Validate a pipeline spec and start it on its nodes, fresh."""
    with cluster_ops.orchestrator_client(home.resolve(), cluster_ops.OPERATION_TIMEOUT_S) as client:
        nodes = [NodeView.model_validate(n).name for n in client.get("/nodes")]
        pipeline = load_spec(spec, nodes)
        result = PipelineStatus.model_validate(
            client.post(
                "/pipelines",
                json=pipeline.model_dump(mode="json"),
                params={"fresh": "true"} if fresh else None,
            )
        )
    if as_json:
        _print_json(result)
    else:
        console.print(f"[green]deployed[/] {pipeline.pipeline}")
        _status_table([result])


def _spec_summary(spec: PipelineSpec) -> dict[str, Any]:
    """What ``validate`` reports of a valid spec: its PEs in topological order."""
    return {
        "valid": True,
        "pipeline": spec.pipeline,
        "elements": [
            {"id": e.id, "kind": e.kind, "node": e.node, "inputs": list(e.inputs)}
            for e in spec.topological_order()
        ],
        "nodes": sorted({e.node for e in spec.elements}),
    }


@app.command()
def validate(
    spec: Annotated[Path, typer.Argument(help="The pipeline spec (YAML).")],
    nodes: Annotated[
        str | None,
        typer.Option(help="Comma-separated node names the PEs must be placed on (default: any)."),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Check a spec offline with the checks `deploy` makes first; exit 2 if refused."""
    names = [n.strip() for n in nodes.split(",") if n.strip()] if nodes is not None else None
    bad = [n for n in names or [] if not NAME_PATTERN.fullmatch(n)]
    if names == [] or bad:
        # (An empty list was refused as "no node is up", and a name no node can have, such
        # as fog.a, was taken and even offered as a guess.)
        raise InvalidInput(
            "--nodes names the nodes to check the placement against",
            expected="comma-separated node names: letters, digits, '_' and '-' (e.g. "
            "cloud,fog-a,fog-b)",
            received=repr(nodes),
            hint="leave --nodes out to accept any node",
        )
    try:
        pipeline = load_spec(spec, names)
        check_fresh(pipeline)
    except InvalidSpec as exc:
        if as_json:
            _print_json({"valid": False, "error": exc.to_dict()})
        else:
            err_console.print(f"[red]refused[/] ({exc.code}): {escape(exc.render())}")
        raise typer.Exit(2) from None  # (as `deploy` exits for the same spec)
    summary = _spec_summary(pipeline)
    if as_json:
        _print_json(summary)
        return
    elements = summary["elements"]
    console.print(
        f"[green]valid[/]: pipeline [bold]{escape(pipeline.pipeline)}[/], {len(elements)} PEs "
        f"on {len(summary['nodes'])} nodes ({escape(', '.join(summary['nodes']))})"
    )
    table = Table()
    for column in ("element", "kind", "node", "inputs"):
        table.add_column(column)
    for e in elements:
        table.add_row(*_plain(e["id"], e["kind"], e["node"], ", ".join(e["inputs"]) or "-"))
    console.print(table)


def _standby_cell(element: ElementStatus) -> str:
    """``fog-c (running, 3 behind)``; without one, why (its pipeline asks for one) or ``-``."""
    standby = element.standby
    if standby is None:
        return f"none: {element.standby_missing}" if element.standby_missing else "-"
    lag = "" if standby.lag_events is None else f", {standby.lag_events} behind"
    return f"{standby.node} ({standby.state}{lag})"


def _status_table(pipelines: list[PipelineStatus]) -> None:
    for pipeline in pipelines:
        table = Table(title=f"{pipeline.pipeline} ({pipeline.status})")
        columns = ("element", "kind", "node", "state", "in", "out", "dead letters", "backup",
                   "redeploy", "standby")  # fmt: skip
        for column in columns:
            table.add_column(column)
        for e in pipeline.elements:
            state = e.state if not e.error else f"{e.state}: {e.error[:90]}"  # (a _plain cell)
            kind = e.kind
            if e.partition_of is not None:
                kind += f" ({e.partition_of}, p{e.partition} of {e.partitions})"
            table.add_row(
                *_plain(e.element, kind, e.node, state, str(e.events_in), str(e.events_out),
                        str(e.dead_letters), e.planned_backup or "-", e.planned_redeploy or "-"),
                _standby_cell(e),
            )  # fmt: skip
        console.print(table)
        if pipeline.error:
            console.print(f"[red]failed[/]: {escape(pipeline.error)}", highlight=False)
        for warning in pipeline.warnings:
            console.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False)


@app.command()
def status(
    pipeline: Annotated[str | None, typer.Argument(callback=_one_name)] = None,
    home: Home = Path(".fogshift"),
    as_json: AsJson = False,
) -> None:
    """Per PE: node, state, events in/out, dead letters."""
    with cluster_ops.orchestrator_client(home.resolve()) as client:
        answer = [client.get(f"/pipelines/{pipeline}")] if pipeline else client.get("/pipelines")
    data = [PipelineStatus.model_validate(p) for p in answer]
    if as_json:
        _print_json(data if not pipeline else data[0])
    elif not data:
        console.print("no pipelines are deployed (`fogshift deploy SPEC.yaml` starts one)")
    else:
        _status_table(data)


@app.command()
def nodes(home: Home = Path(".fogshift"), as_json: AsJson = False) -> None:
    """Per node: name, url, pid, pgid, healthy, free disk and its PEs; then what is wrong.

    What is wrong is told of a node, or of the orchestrator, even while it answers: checkpoints
    failing or stopped, disk nearly full; the orchestrator's: its own disk, a broker
    `fogshift up` started whose store failed."""
    with cluster_ops.orchestrator_client(home.resolve()) as client:
        data = [NodeView.model_validate(n) for n in client.get("/nodes")]
        health = OrchestratorHealth.model_validate(client.get("/health"))
    if as_json:
        _print_json(data)
        return
    table = Table(title="nodes")
    for column in ("name", "url", "pid", "pgid", "healthy", "disk", "elements"):
        table.add_column(column)
    for n in data:
        table.add_row(
            *_plain(n.name, n.url, str(n.pid), str(n.pgid)),
            "[green]yes[/]" if n.healthy else "[red]no[/]",
            # (A silent node's figure is its last heartbeat's: said, not shown as now.)
            *_plain(_disk(n), ", ".join(
                f"{e} (standby)" if e in n.standbys else e for e in n.elements
            )),
        )  # fmt: skip
    console.print(table)
    for n in data:
        for warning in n.warnings:
            console.print(f"[yellow]warning[/] {n.name}: {escape(warning)}")
    for warning in health.warnings:
        console.print(f"[yellow]warning[/] orchestrator: {escape(warning)}")


def _disk(node: NodeView) -> str:
    """Node ``node``'s free disk as a cell: ``-`` if it did not say; a silent node's as
    last heard."""
    if node.disk_text is None:
        return "-"
    return node.disk_text if node.healthy else f"{node.disk_text} (when last heard)"


def _plain(*cells: str) -> list[Text]:
    """Table cells shown as they are: data (a dead letter's reason, an event, a key) is never
    read as Rich markup, which dropped ``[patient]`` from a reason and failed on ``[/tmp]``,
    and its control characters are shown, not acted on by the terminal (:func:`visible`)."""
    return [Text(visible(cell)) for cell in cells]


@app.command()
def errors(
    pipeline: Pipeline,
    home: Home = Path(".fogshift"),
    limit: Annotated[
        int,
        ranged("--limit", "At most this many per PE (its newest).", 1, 10_000),
    ] = 100,
    as_json: AsJson = False,
) -> None:
    """The pipeline's dead letters, with their reasons."""
    with cluster_ops.orchestrator_client(home.resolve()) as client:
        answer = client.get(f"/pipelines/{pipeline}/errors", params={"limit": limit})
    data = [DeadLetter.model_validate(d) for d in answer]
    if as_json:
        _print_json(data)
        return
    if not data:
        console.print(f"no dead letters in {escape(pipeline)} (none stored in its streams)",
                      highlight=False)  # fmt: skip
        return
    # (With --limit 2 it said "(4)" of a pipeline with 8: the limit is per PE.)
    full = Counter(d.element for d in data).most_common(1)[0][1] >= limit
    cut = f"; at most the newest {limit} of each PE" if full else ""
    table = Table(title=f"dead letters of {pipeline} ({len(data)}{cut})")
    for column in ("element", "seq", "reason", "event"):
        table.add_column(column)
    for d in data:
        table.add_row(*_plain(d.element, str(d.seq), d.reason or "", str(d.event)[:60]))
    console.print(table)


@app.command()
def latency(pipeline: Pipeline, home: Home = Path(".fogshift"), as_json: AsJson = False) -> None:
    """Each PE's newest per-hop latency, by the broker's clock.

    Its newest output against the input event it came from (PEs with one input and an
    output stream; `GET /pipelines/{p}/latency`)."""
    with cluster_ops.orchestrator_client(home.resolve()) as client:
        answer = client.get(f"/pipelines/{pipeline}/latency")
    hops = [HopLatency.model_validate(h) for h in answer]
    if as_json:
        _print_json(hops)
        return
    if not hops:
        console.print(f"no hop of {escape(pipeline)} has an output yet (or its PEs read several "
                      "inputs each)", highlight=False)  # fmt: skip
        return
    table = Table(title=f"newest per-hop latency of {pipeline}")
    for column in ("element", "input", "output seq", "from input seq", "latency", "stored"):
        table.add_column(column)
    for hop in hops:
        stored = time.strftime("%H:%M:%S", time.localtime(hop.stored))
        table.add_row(*_plain(hop.element, hop.input, str(hop.seq), str(hop.input_seq),
                              f"{hop.latency_ms:.0f} ms", stored))  # fmt: skip
    console.print(table)


def _element_read(
    home: Path,
    pipeline: str,
    element: str,
    what: str,
    model: type[M],
    key: str | None,
    params: dict[str, object],
) -> M:
    """``GET /pipelines/{pipeline}/elements/{element}/{what}`` (with ``key`` if given) as
    ``model``."""
    if key is not None:
        params = {**params, "key": key}
    with cluster_ops.orchestrator_client(home.resolve()) as client:
        answer = client.get(f"/pipelines/{pipeline}/elements/{element}/{what}", params=params)
    return model.model_validate(answer)


@app.command()
def state(
    pipeline: Pipeline,
    element: Element,
    key: Annotated[
        str | None, typer.Argument(help="One key of a keyed PE (default: every key).")
    ] = None,
    home: Home = Path(".fogshift"),
    # (At most the orchestrator's bound: beyond it, its refusal hinted at the REST schema.)
    limit: Annotated[
        int,
        ranged("--limit", "At most this many keys.", 1, 100_000),
    ] = 1000,
    as_json: AsJson = False,
) -> None:
    """A stateful PE's state per key (its digital twins), as of its last committed batch."""
    data = _element_read(home, pipeline, element, "state", TwinState, key, {"limit": limit})
    if as_json:
        _print_json(data)
        return
    batch = "no batch committed yet" if data.batch is None else f"batch {data.batch}"
    keys = f"{data.keys} key" + ("" if data.keys == 1 else "s")
    if key is None and len(data.entries) < data.keys + data.waiting:
        # (Fewer than --limit when their state passes the agent's page size.)
        keys += f", the first {len(data.entries)} shown (--limit, or their state's size)"
    keyed = f"keyed by {data.key_by}, {keys}" if data.key_by else "not keyed"
    if data.waiting:
        keyed += f", {data.waiting} waiting for a key move's state"
    table = Table(title=f"state of {pipeline}/{element} on {data.node} ({batch}; {keyed})")
    # (A partitioned element's keys each in the partition holding them: a moved key is not
    # where its hash puts it.)
    held = any(entry.partition is not None for entry in data.entries)
    for column in ("key", "partition", "state") if held else ("key", "state"):
        table.add_column(column)
    for entry in data.entries:
        text = json.dumps(entry.state, separators=(",", ":"))
        if entry.waiting is not None:
            text = (f"(moving in: waiting for key move {entry.waiting.move}'s state, "
                    f"{entry.waiting.events} events held)")  # fmt: skip
        where = [entry.partition or "-"] if held else []
        table.add_row(*_plain("-" if entry.key is None else entry.key, *where, text[:200]))
    if key is not None and not data.entries:
        # (Not an empty table under the title: the key has none.)
        # ("it has had no valid event yet" of a key whose events go to another partition.)
        console.print(f"{table.title}: no state for key {escape(repr(key))} (no valid event "
                      f"of it has come to {escape(element)})", highlight=False)  # fmt: skip
        return
    console.print(table)


@app.command()
def events(
    pipeline: Pipeline,
    element: Element,
    key: Annotated[str | None, typer.Argument(help="Only this key's events (a keyed PE).")] = None,
    home: Home = Path(".fogshift"),
    tail: Annotated[
        int,
        ranged("--tail", "Look at the newest this-many messages.", 1, 20_000),
    ] = 100,
    limit: Annotated[
        int,
        ranged("--limit", "At most this many events.", 1, 5_000),
    ] = 20,
    as_json: AsJson = False,
) -> None:
    """The newest events a PE emitted, as its output stream holds them."""
    params: dict[str, object] = {"tail": tail, "limit": limit}
    data = _element_read(home, pipeline, element, "events", EventPage, key, params)
    if as_json:
        _print_json(data)
        return
    # (A partitioned element's page merges its partitions' streams: each event names its.)
    parts = any(e.partition is not None for e in data.events)
    table = Table(
        title=f"events of {pipeline}/{element} ("
        + ("its partitions' newest, by when stored" if parts else
           f"stream sequences {data.scanned_after + 1}-{data.scanned_to} of {data.last_seq}")
        + ")"
    )  # fmt: skip
    for column in ("partition", "seq", "epoch", "creator", "body")[0 if parts else 1 :]:
        table.add_column(column)
    for event in data.events:
        text = json.dumps(event.body, separators=(",", ":"))
        cells = (str(event.seq), str(event.epoch), event.creator, text[:160])
        table.add_row(*_plain(*((event.partition or "",) if parts else ()), *cells))
    if not data.events:
        # (Not an empty table, nor a partitioned page's "stream sequences 1-0 of 0".)
        among = f"among the newest {tail} messages" if data.last_seq else "there"
        console.print(
            f"no events of {escape(pipeline)}/{escape(element)}"
            + (f" of key {escape(repr(key))}" if key is not None else "")
            + f" {among}"
            + ("; a larger --tail looks further back" if key is not None and data.last_seq
               else ""),
            highlight=False,
        )  # fmt: skip
        return
    console.print(table)


@app.command()
def logs(
    node: Annotated[
        str | None,
        typer.Argument(help="A node, `orchestrator`, or another log's name (default: all)."),
    ] = None,
    home: Home = Path(".fogshift"),
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until Ctrl-C.")
    ] = False,
    lines: Annotated[
        int,
        ranged("--lines", "Lines of each tail.", 0, None, "--lines", "-n"),
    ] = 20,
) -> None:
    """The tail of a node's log (<home>/logs/node-NODE.log), the orchestrator's, or all."""
    from fogshift.cli.logs import follow as follow_logs
    from fogshift.cli.logs import positions, select_logs, tail

    files = select_logs(home.resolve(), node)
    several = len(files) > 1
    # Where the tails end and the follow starts: taken first, so that a line appended while
    # the tails are printed is followed rather than lost between the two.
    ends = positions(files)

    def write(line: str) -> None:
        # (A log line may quote data, an event's or a key's text: shown, not acted on.)
        sys.stdout.write(visible(line) + "\n")
        sys.stdout.flush()  # a pipe (`| grep`) sees each line as it comes

    for name, path in files.items():
        if several:
            write(f"==> {name} ({path}) <==")
        for line in tail(path, lines, end=ends[name].offset):
            write(line)
    if not follow:
        return
    # Ctrl-C ends the follow at its next poll, whatever the process was doing when it came
    # (and even if it was started with SIGINT ignored, as background jobs are).
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    follow_logs(files, write, prefix=several, start=ends, keep_going=lambda: not stop.is_set())


def _watch_phases(
    home: Path,
    pipeline: str,
    elements: list[str],
    kind: OperationKind,
    status: Status,
    stop: threading.Event,
) -> None:
    """Show the phase of the running ``kind`` of ``pipeline``'s ``elements`` (a group's
    moves run one at a time: the one running) in ``status`` until ``stop`` is set, polling
    the orchestrator's view of their journal. A poll that fails is skipped: the line only
    informs, the POST the CLI waits for decides."""
    started = time.monotonic()
    shown: tuple[str, str] | None = None
    try:
        client = cluster_ops.orchestrator_client(home, timeout_s=5)
    except FogshiftError:
        return
    with client:
        while not stop.wait(0.5):
            for element in elements:
                try:
                    view = OperationView.model_validate(
                        client.get(f"/pipelines/{pipeline}/elements/{element}/operation")
                    )
                except (FogshiftError, ValueError):
                    continue
                if not (view.running and view.kind == kind):
                    continue
                line = f"{kind} of {pipeline}/{element} {view.origin} -> {view.target}: "
                if console.is_terminal:
                    status.update(f"{line}[bold]{escape(view.phase)}[/] "
                                  f"({time.monotonic() - started:.0f} s)")  # fmt: skip
                elif (element, view.phase) != shown:
                    # (No spinner without a terminal: each phase once, on stderr, so a
                    # script or a log shows where a long operation is; a group's said
                    # nothing.)
                    shown = (element, view.phase)
                    err_console.print(f"{escape(line)}{escape(view.phase)}", highlight=False)
                break


def _run_operation(
    home: Path,
    pipeline: str,
    element: str,
    kind: OperationKind,
    body: dict[str, Any],
    as_json: bool,
) -> Any:
    """POST a long operation (``migration`` or ``restore``) of ``pipeline/element``; show its
    phases as it runs (not with ``as_json``); with ``as_json`` print its report, also the
    report of a failure (then exit 1).

    Returns:
        The answer (the caller parses it into its report).
    """
    verb = "migrate" if kind == OperationKind.MIGRATION else "restore"
    path = f"/pipelines/{pipeline}/elements/{element}/{verb}"
    home = home.resolve()
    with cluster_ops.orchestrator_client(home, timeout_s=900) as client:
        try:
            if as_json:
                report = client.post(path, json=body)
            else:
                stop = threading.Event()
                with console.status(f"{kind} of {pipeline}/{element}: starting") as status:
                    watcher = threading.Thread(
                        target=_watch_phases,
                        args=(home, pipeline, [element], kind, status, stop),
                        daemon=True,  # never holds up the exit (Ctrl-C included)
                    )
                    watcher.start()
                    try:
                        report = client.post(path, json=body)
                    finally:
                        stop.set()
                        watcher.join(timeout=6)
        except (MigrationFailed, RestoreFailed) as exc:
            if as_json and exc.report is not None:
                _print_json(exc.report)
                raise typer.Exit(1) from exc
            raise
        except NoAnswer as exc:
            if exc.service != "the orchestrator":
                raise  # (its answer: a node it asked did not answer it)
            # (The orchestrator died, or its connection broke, mid-operation: "cannot be
            # reached: RemoteProtocolError" said nothing of what became of the operation.)
            raise NoAnswer(
                f"the orchestrator stopped answering during the {kind} of {pipeline}/"
                f"{element} ({exc.message}): it may have ended either way",
                hint=f"`fogshift up` starts it again if it died, and its recovery ends the "
                f"{kind} (a migration before its switch is rolled back, after it completed); "
                f"`fogshift status {pipeline}` shows where {element} runs, `fogshift logs "
                "orchestrator` how it ended",
            ) from exc
    return report


def _line_given(element: str | None, *options: tuple[str, object]) -> str:
    """What a command line gave, for a refusal's ``received``: the element, or that none was
    named, and the options given (those left out are not listed as ``None``)."""
    parts = [f"element {element!r}" if element is not None else "no ELEMENT"]
    parts += [f"{name} {value!r}" for name, value in options if value is not None]
    return ", ".join(parts)


@app.command()
def migrate(
    pipeline: Pipeline,
    element: Annotated[
        str | None,
        typer.Argument(callback=_one_name, help="The PE (or give several with --elements)."),
    ] = None,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The node to move the PE to; with --keys or --key-group, the node of the "
            "partition the keys go to, or that partition's id (two partitions on one node).",
        ),
    ] = "",
    mode: Annotated[
        str | None,
        typer.Option(
            help="precopy (warm standby, short downtime; the default), literal (the thesis's) "
            "or handover (make-before-break: the target runs live beside the origin, no pause "
            "on the output's path; not for sinks). Not with --keys or --key-group."
        ),
    ] = None,
    elements: Annotated[
        str | None,
        typer.Option(
            "--elements",
            help="Several PEs, comma-separated, moved as one operation: if one fails, the "
            "ones moved go back.",
        ),
    ] = None,
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys",
            help="Move only these keys (comma-separated, each stripped of surrounding "
            "spaces) of a partitioned ELEMENT to its partition on --to; every other key goes "
            "on where it is.",
        ),
    ] = None,
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key",
            metavar="KEY",
            help="One key to move, exactly as written (repeat; with --keys or instead): a "
            "key holding a comma or surrounding spaces.",
        ),
    ] = None,
    key_group: Annotated[
        str | None,
        typer.Option(
            "--key-group",
            help="Instead of --keys: G/N, key group G of N (keys whose CRC-32 modulo N is G), "
            "those holding state now and any that comes later.",
        ),
    ] = None,
    order: Annotated[
        str | None,
        typer.Option(
            help="With --keys: backlog (the key whose next event is nearest goes first, PAM; "
            "the default) or fifo (as listed)."
        ),
    ] = None,
    precopy: Annotated[
        bool,
        typer.Option(
            help="With --keys: copy the keys' states to the target first, while they are "
            "processed where they are; the move then sends only what changed (--no-precopy: "
            "the whole states at the move, as PAM does)."
        ),
    ] = True,
    wave_keys: Annotated[
        int | None,
        ranged(
            "--wave-keys",
            "With --keys: move them in waves of this many, each once the one before "
            "has arrived (states in parts: is being sent) (default: one key, then growing "
            "with the states' sizes up to 64; at least as many as --keys: all at one "
            "position of the input).",
            1,
            1000,
            "--wave-keys",
        ),
    ] = None,
    home: Home = Path(".fogshift"),
    as_json: AsJson = False,
) -> None:
    """Live-migrate a running PE, several, or single keys of a partitioned PE to another node.

    Exit 1 if it failed; the origin runs on."""
    if mode is not None and mode not in tuple(MigrationMode):
        raise InvalidInput(
            "unknown migration mode",
            expected=", ".join(m.value for m in MigrationMode),
            received=repr(mode),
            hint="precopy (the default) keeps the PE running while its state copies; "
            "handover starts a warm target first; literal is the thesis's procedure",
        )
    if not to:
        raise InvalidInput(
            "migrate needs the node to move to",
            expected="--to NODE",
            received="no node (--to missing or empty)",  # (its default is "": one or other)
            hint="`fogshift nodes` lists the nodes, `fogshift status PIPELINE` where each PE runs",
        )
    # (Split and stripped, a key such as " s1" or "a,b" was sent as another that does not
    # exist, moved as an empty state, and reported moved.)
    listed = (
        None
        if keys is None and not key
        else [k.strip() for k in (keys or "").split(",") if k.strip()] + list(key or [])
    )
    if listed is None and (wave_keys is not None or not precopy):
        raise InvalidInput(
            "--wave-keys and --no-precopy are for --keys",
            expected="`fogshift migrate P ELEMENT --keys K1,K2 --to N [--no-precopy] "
            "[--wave-keys N]`",
            received=(f"--wave-keys {wave_keys}" if wave_keys is not None else "--no-precopy")
            + (f" with --key-group {key_group}" if key_group else " without --keys"),
            hint="a whole PE moves by --mode (precopy, literal, handover); a key group sends "
            "whole states and sizes its waves itself",
        )
    by_keys = listed is not None or key_group is not None
    if (mode is not None and by_keys) or (order is not None and not by_keys):
        # (Either was checked, then left out of the request: silently ignored.)
        raise InvalidInput(
            # (It said "not both" of --mode beside --keys, where no --order was given.)
            "--mode moves a whole PE, not the keys --keys or --key-group name (they move by "
            "--order)"
            if by_keys
            else "--order orders the keys --keys or --key-group move, not a whole PE",
            expected="`fogshift migrate P ELEMENT --to N [--mode M]` or `fogshift migrate P "
            "ELEMENT --keys K1,K2 --to N [--order O]`",
            received=f"--mode {mode}" if by_keys else f"--order {order} without --keys",
            hint="keys move by their own procedure (their states as records in the input)",
        )
    mode = mode or MigrationMode.PRECOPY.value
    if by_keys:
        order = order or KeyOrder.BACKLOG.value
        if element is None or elements is not None or (listed is None) == (key_group is None):
            raise InvalidInput(
                "--keys or --key-group moves keys of one partitioned element",
                expected="`fogshift migrate P ELEMENT --keys K1,K2 --to N` or `... "
                "--key-group G/N --to N`",
                received=_line_given(
                    element,
                    ("--elements", elements),
                    ("--keys", keys),
                    ("--key", key or None),
                    ("--key-group", key_group),
                ),
                hint="name the partitioned element (not a partition, not --elements) and "
                "either --keys or --key-group",
            )
        if order not in tuple(KeyOrder):
            raise InvalidInput(
                "unknown key order",
                expected=", ".join(o.value for o in KeyOrder),
                received=repr(order),
                hint="backlog (the default) sends first the states of the keys whose next "
                "events come first; fifo as listed",
            )
        _migrate_keys(home, pipeline, element, listed or [], to, order,
                      as_json, key_group, precopy, wave_keys)  # fmt: skip
        return
    if (element is None) == (elements is None):
        raise InvalidInput(
            "migrate takes one PE or --elements, not both and not neither",
            expected="`fogshift migrate P ELEMENT --to N` or `fogshift migrate P --elements "
            "A,B --to N`",
            received=_line_given(element, ("--elements", elements)),
            hint="name the PE, or give --elements, but not both",
        )
    if elements is not None:
        _migrate_group(home, pipeline, _items(elements, "--elements"), to, mode, as_json)
        return
    assert element is not None
    report = MigrationReport.model_validate(
        _run_operation(
            home, pipeline, element, OperationKind.MIGRATION, {"target": to, "mode": mode},
            as_json,
        )
    )  # fmt: skip
    if as_json:
        _print_json(report)
        return
    steps = ", ".join(f"{k} {v:.0f}" for k, v in report.prepare_ms.items())
    phases = ", ".join(
        f"{k} {v:.0f} ms" + (f" ({steps})" if k == "prepare" and steps else "")
        for k, v in report.phases_ms.items()
    )
    console.print(
        f"[green]migrated[/] {pipeline}/{element}: {report.origin} -> {report.target} "
        f"({report.mode}); state {report.state_bytes} bytes; {phases}; "
        + (
            f"downtime {report.downtime_ms:.0f} ms"
            if report.downtime_ms is not None
            # (A measurement that failed says why among the warnings: "no input came" was
            # said beside "node agent 'cloud' cannot be reached" while input flowed.)
            else "downtime not measured"
            + ("" if _downtime_failed(report) else " (no input came after the pause)")
        )
    )
    for warning in report.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}")


def _downtime_failed(report: MigrationReport) -> bool:
    """Whether the downtime of ``report``'s migration could not be measured (a warning says
    why), rather than not measured because no input came after the pause."""
    return any(w.startswith(DOWNTIME_FAILED) for w in report.warnings)


def _post(
    home: Path, pipeline: str, path: str, body: dict[str, Any], doing: str, answer: type[M],
    as_json: bool, watched: list[str] | None = None,
) -> M:  # fmt: skip
    """POST ``body`` to the orchestrator's ``path``, showing ``doing`` until it answers (an
    operation may take minutes: the client waits up to 30); the answer as ``answer``,
    printed as JSON with ``as_json``. ``watched``: elements whose migrations' phases are
    shown meanwhile (:func:`_watch_phases`; not with ``as_json``).

    Raises:
        NoAnswer: The orchestrator stopped answering meanwhile: said so, with what becomes
            of the operation."""
    stop = threading.Event()
    with (
        cluster_ops.orchestrator_client(home.resolve(), cluster_ops.OPERATION_TIMEOUT_S) as client,
        console.status(doing) as status,
    ):
        if watched and not as_json:
            watcher = threading.Thread(
                target=_watch_phases,
                args=(home.resolve(), pipeline, watched, OperationKind.MIGRATION, status, stop),
                daemon=True,  # never holds up the exit (Ctrl-C included)
            )
            watcher.start()
        try:
            report = answer.model_validate(client.post(path, json=body))
        except NoAnswer as exc:
            if exc.service != "the orchestrator":
                raise  # (its answer: a node it asked did not answer it)
            # (A group migration an orchestrator died in was carried on by the next one,
            # and "cannot be reached: RemoteProtocolError; is the cluster up?" said nothing
            # of it.)
            raise NoAnswer(
                f"the orchestrator stopped answering while {doing} ({exc.message}): it may "
                "have ended either way",
                hint="`fogshift up` starts it again if it died, and it carries on or rolls "
                f"back what the dead one left (`fogshift logs orchestrator` says how it "
                f"ended); `fogshift status {pipeline}` shows where each PE runs",
            ) from exc
        finally:
            stop.set()
    if as_json:
        _print_json(report)
    return report


def _migrate_keys(
    home: Path, pipeline: str, element: str, keys: list[str], to: str, order: str, as_json: bool,
    group: str | None = None, precopy: bool = True, wave_keys: int | None = None,
) -> None:  # fmt: skip
    body: dict[str, Any] = {"keys": keys, "target": to, "order": order}
    if group is not None:
        body["group"] = group.strip()
    else:
        body["precopy"] = precopy
    if wave_keys is not None:
        body["wave_keys"] = wave_keys
    moving = f"key group {group}" if group is not None else counted(len(keys), "key")
    report = _post(home, pipeline, f"/pipelines/{pipeline}/elements/{element}/keys/migrate",
                   body,
                   f"moving {moving} of {pipeline}/{element} to {to}", KeyMoveReport,
                   as_json)  # fmt: skip
    if not as_json:
        if report.precopy_ms is not None:
            console.print(
                f"precopied {len(report.precopied)} of {counted(len(report.keys), 'key')} "
                f"({report.precopy_bytes} bytes) in {report.precopy_ms:.0f} ms"
            )
        for key in report.sent:
            console.print(
                f"{escape(key)}: {report.origins.get(key)} -> {report.target_partition}, stopped "
                f"{report.stoppage_ms.get(key, float('nan')):.0f} ms"
            )
        if len(report.waves) > 1:
            # (Each wave a move record in the partitions' input, at that sequence; a key
            # group's own record last, with the keys seen since its waves: maybe none.)
            console.print(
                f"in {len(report.waves)} waves: "
                + ", ".join(
                    f"{counted(len(w.keys), 'key')} at input seq {w.seq}" for w in report.waves
                )
            )
        if report.left:
            console.print(f"not moved (no wave for them): {escape(', '.join(report.left))}")
        if report.already:
            console.print(
                f"already on {report.target_partition}: {escape(', '.join(report.already))}"
            )
        if report.unseen:
            # (A typo's key whose hash names the target was "already" there, without a word.)
            console.print(
                f"[yellow]warning[/]: {escape(', '.join(report.unseen))}: no state at "
                f"{report.target_partition} either (never seen: a typo?, or "
                f"{'its' if len(report.unseen) == 1 else 'their'} first events not committed "
                "yet)",
                highlight=False,
            )
        if report.stateless:
            # (A typo's key was reported moved like any other.)
            console.print(
                f"[yellow]warning[/]: {escape(', '.join(report.stateless))}: no state at "
                f"{'its' if len(report.stateless) == 1 else 'their'} origin (never seen "
                "there: a typo?); moved all the same",
                highlight=False,
            )
        _key_outcome(
            report.status,
            counted(len(report.keys), "key")
            + (f" (key group {report.group})" if report.group else "")
            + f" of {pipeline}/{element} to {report.target_partition} on "
            f"{report.target}{_in_ms(report.done_ms)} ({report.order}, {report.state_bytes} "
            "bytes of state)",
            report.error,
        )
    if report.status != KeyMoveStatus.MOVED:
        raise typer.Exit(1)


def _in_ms(done_ms: float | None) -> str:
    return f" in {done_ms:.0f} ms" if done_ms is not None else ""


def _key_outcome(status: KeyMoveStatus, line: str, error: str | None) -> None:
    """Print a key move's or a scale's outcome: ``status``, then ``line``, then a note."""
    colour = "green" if status == KeyMoveStatus.MOVED else "yellow"
    console.print(f"[{colour}]{status}[/] {line}")
    if error:
        console.print(f"note: {escape(error)}")


def _migrate_group(
    home: Path, pipeline: str, elements: list[str], to: str, mode: str, as_json: bool
) -> None:
    names = [e.strip() for e in elements]
    body = {"elements": names, "target": to, "mode": mode}
    report = _post(home, pipeline, f"/pipelines/{pipeline}/migrate", body,
                   f"migrating {', '.join(names)} of {pipeline} to {to}", GroupMigrationReport,
                   as_json, watched=names)  # fmt: skip
    if not as_json:
        for element in report.already_there:
            console.print(f"{element}: on {report.target} already")
        for move in report.migrations:
            told = [f"{k} {v:.0f} ms" for k, v in move.phases_ms.items()]
            if move.downtime_ms is not None:
                told.append(f"downtime {move.downtime_ms:.0f} ms")
            # (A move that failed before its first phase ended in "failed; ", nothing after.)
            console.print(f"{move.element}: {move.origin} -> {move.target} {move.status}"
                          + (f"; {', '.join(told)}" if told else ""))  # fmt: skip
        for back in report.undone:
            console.print(f"{back.element}: moved back to {back.target}")
        where = ", ".join(f"{e} on {n}" for e, n in report.placement.items())
        colour = "green" if report.status == GroupMigrationStatus.MIGRATED else "red"
        console.print(f"[{colour}]{report.status}[/]: {where}")
        if report.error:
            console.print(f"error: {escape(report.error)}")
        if report.hint:
            console.print(f"hint: {escape(report.hint)}")
    if report.status != GroupMigrationStatus.MIGRATED:
        raise typer.Exit(1)


def _items(text: str, option: str) -> list[str]:
    """The comma-separated names of ``option``; an empty one is refused (a stray comma)."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise InvalidInput(
            f"{option} names an empty item",
            expected="names separated by single commas (e.g. a,b)",
            received=repr(text),
            hint="remove the extra comma",
        )
    return items


@app.command()
def scale(
    pipeline: Pipeline,
    element: Annotated[
        str, typer.Argument(callback=_one_name, help="A partitioned element (its id in the spec).")
    ],
    partitions: Annotated[
        int, typer.Option("--partitions", help="How many partitions it should have.")
    ],
    on: Annotated[
        str | None,
        typer.Option(
            "--on",
            help="The nodes of the added partitions, comma-separated, one each (default: the "
            "healthy nodes hosting fewest of them).",
        ),
    ] = None,
    waves: Annotated[
        bool,
        typer.Option(
            help="Move the keys holding state ahead of the rescale in waves, each key "
            "stopping only while its wave crosses, the operation longer (default: all at the "
            "rescale record; `bench pam`: waves stop a key less and disturb longer)."
        ),
    ] = False,
    home: Home = Path(".fogshift"),
    as_json: AsJson = False,
) -> None:
    """Give a partitioned keyed element more or fewer partitions while all of them run.

    Only the keys whose partition changes move, with their state (exit 1 unless all moved)."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidInput(
            f"cannot scale {pipeline}/{element} to {partitions} partitions",
            expected=f"--partitions from 1 to {MAX_PARTITIONS}",
            received=str(partitions),
            hint="1 gathers every key in one partition",
        )
    body: dict[str, Any] = {"partitions": partitions, "waves": waves}
    if on is not None:
        body["nodes"] = _items(on, "--on")
    report = _post(home, pipeline, f"/pipelines/{pipeline}/elements/{element}/scale", body,
                   f"scaling {pipeline}/{element} to {partitions} partitions", ScaleReport,
                   as_json)  # fmt: skip
    if not as_json:
        for pe, node in report.added.items():
            console.print(f"added {pe} on {node}")
        if report.consumers:
            console.print(f"restarted to read them: {', '.join(report.consumers)}")
        for pe, node in report.retired.items():
            console.print(f"retired {pe} (was on {node})")
        stopped = (
            f", the longest stopped {report.stoppage_ms:.0f} ms"
            if report.stoppage_ms is not None
            else ""
        )
        if report.waves:
            console.print(
                f"{counted(sum(len(w.keys) for w in report.waves), 'key')} moved ahead of "
                f"the rescale in {counted(len(report.waves), 'wave')}"
            )
        unchanged = report.status == KeyMoveStatus.MOVED and not (
            report.before != report.after
            or report.added
            or report.retired
            or report.moved
            or report.waves
        )
        for warning in report.warnings:
            console.print(f"[yellow]warning[/]: {escape(warning)}")
        if unchanged:  # (It said "moved ...: 3 -> 3 partitions", as if it had rescaled.)
            console.print(
                f"{pipeline}/{element}: {counted(report.after, 'partition')} already; "
                "nothing to change"
            )
        else:
            _key_outcome(
                report.status,
                f"{pipeline}/{element}: {report.before} -> {report.after} partitions"
                f"{_in_ms(report.done_ms)}; {counted(report.moved, 'key')} changed partition "
                f"({report.state_bytes} bytes of state){stopped}",
                report.error,
            )
    if report.status != KeyMoveStatus.MOVED:
        raise typer.Exit(1)


@app.command()
def restore(
    pipeline: Pipeline,
    element: Element,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="The node to restore on (default: the planner's redeploy node, then the "
            "least busy healthy one).",
        ),
    ] = None,
    home: Home = Path(".fogshift"),
    as_json: AsJson = False,
) -> None:
    """Restore a PE exactly-once, fencing the old one: from its hot standby or a checkpoint.

    Its hot standby takes over if it has one (and --to is left out or names the standby's
    node), else it starts from its latest central checkpoint."""
    was = None if as_json else _running_on(home, pipeline, element)
    report = RestoreReport.model_validate(
        _run_operation(home, pipeline, element, OperationKind.RESTORE, {"target": to}, as_json)
    )
    if as_json:
        _print_json(report)
        return
    if was is not None and report.status == RestoreStatus.RESTORED:
        # (A restore of a healthy PE went ahead without a word: it replaces the instance
        # wherever it runs, as documented, but a user may have meant a lost one.)
        console.print(f"[yellow]note[/]: {escape(pipeline)}/{escape(element)} was running on "
                      f"{escape(was)} (as last heard): that instance is fenced (it cannot emit) "
                      "and removed once its node answers (while its node is up, `fogshift "
                      "migrate` moves a running PE with less downtime)",
                      highlight=False)  # fmt: skip
    for attempt in report.attempts:
        console.print(f"[yellow]attempt on {attempt.node} failed[/]: {escape(attempt.error)}")
    if report.method == RestoreMethod.STANDBY:
        live = (
            f"live after {report.live_ms:.0f} ms" if report.live_ms is not None else "not live yet"
        )
        caught_up = (
            f"then {report.intermediate_events} new in {report.intermediate_ms:.0f} ms"
            if report.error is None
            else "and has not caught up yet"
        )
        console.print(
            f"[green]restored[/] {pipeline}/{element} on {report.target} (epoch "
            f"{report.epoch}): its standby took over, {live}; it re-derived "
            f"{report.standby_lag_events} events without emitting, {caught_up}"
        )
        if report.error is not None:  # (it runs; what it has not done yet is said)
            console.print(f"[yellow]note[/]: {escape(report.error)}")
        return
    if report.error is not None:
        console.print(f"[yellow]note[/]: {escape(report.error)}")
    if report.checkpoint is None or report.checkpoint_age_ms is None:
        source = "no checkpoint (its input from its start)"
    else:
        # A PE whose input stood still takes no checkpoint: an old one is then its newest
        # state, not a stale one.
        idle = report.reprocessed_events == 0 and report.intermediate_events == 0
        source = (
            f"checkpoint {report.checkpoint} ({span(report.checkpoint_age_ms / 1000)} old"
            + ("; its input had nothing newer" if idle else "")
            + ")"
        )
    console.print(
        f"[green]restored[/] {pipeline}/{element} on {report.target} (epoch "
        f"{report.epoch}) from {source}: reprocessed "
        f"{report.reprocessed_events} events in {report.reprocess_ms:.0f} ms, intermediate "
        f"{report.intermediate_events} in {report.intermediate_ms:.0f} ms"
    )


def _running_on(home: Path, pipeline: str, element: str) -> str | None:
    """The healthy node PE ``pipeline/element`` runs on now, if it does (``None`` too when
    this cannot be told: the operation itself then says what is wrong)."""
    try:
        with cluster_ops.orchestrator_client(home.resolve()) as client:
            status = PipelineStatus.model_validate(client.get(f"/pipelines/{pipeline}"))
    except Exception:  # (only a note hangs on it: the restore goes on and says the rest)
        return None
    found = next((e for e in status.elements if e.element == element), None)
    return found.node if found is not None and found.state == PEState.RUNNING else None


@app.command()
def stop(pipeline: Pipeline, home: Home = Path(".fogshift")) -> None:
    """Stop a pipeline's PEs (streams, checkpoints and output stay)."""
    with cluster_ops.orchestrator_client(home.resolve(), cluster_ops.OPERATION_TIMEOUT_S) as client:
        result = StopResult.model_validate(client.post(f"/pipelines/{pipeline}/stop"))
    console.print(f"[green]stopped[/] {pipeline}")
    if result.unreachable_nodes:
        console.print(f"[yellow]unreachable nodes[/]: {', '.join(result.unreachable_nodes)}")


@app.command()
def start(pipeline: Pipeline, home: Home = Path(".fogshift"), as_json: AsJson = False) -> None:
    """Start a stopped pipeline again where it stopped (its PEs from their checkpoints)."""
    with cluster_ops.orchestrator_client(home.resolve(), cluster_ops.OPERATION_TIMEOUT_S) as client:
        result = client.call(PipelineStatus, "POST", f"/pipelines/{pipeline}/start")
    if as_json:
        _print_json(result)
    else:
        console.print(f"[green]started[/] {pipeline} again where it stopped")
        _status_table([result])


@app.command()
def delete(pipeline: Pipeline, home: Home = Path(".fogshift"), as_json: AsJson = False) -> None:
    """Delete a stopped pipeline: its streams, checkpoints and entry go (its output stays)."""
    with cluster_ops.orchestrator_client(home.resolve(), cluster_ops.OPERATION_TIMEOUT_S) as client:
        result = client.call(DeleteResult, "DELETE", f"/pipelines/{pipeline}")
    if as_json:
        _print_json(result)
        return
    streams = len(result.streams)
    console.print(f"[green]deleted[/] {pipeline} ({streams} stream{'s' * (streams != 1)}; "
                  f"checkpoints on {', '.join(result.nodes) or 'no node'})")  # fmt: skip
    if result.unreachable_nodes:
        console.print(
            f"[yellow]unreachable nodes[/]: {', '.join(result.unreachable_nodes)} (what they "
            "hold of it is discarded once they are heard again)"
        )


@app.command()
def plan(
    topology: Annotated[Path, typer.Argument(help="Servers, tasks and links (YAML).")],
    greedy: Annotated[
        bool, typer.Option("--greedy/--exact", help="The paper's greedy, or the exact MILP.")
    ] = False,
    time_limit: Annotated[float, typer.Option(help="Seconds for the exact solver.")] = 60.0,
    as_json: AsJson = False,
) -> None:
    """Decide each task's backup and redeploy server (Iijima et al.; docs/planner.md)."""
    from fogshift.planner import Topology
    from fogshift.planner import plan as make_plan

    if not time_limit > 0:  # (NaN too)
        raise InvalidInput(
            "the exact solver needs time to solve",
            expected="--time-limit: a number of seconds above 0",
            received=str(time_limit),
            hint="e.g. --time-limit 60 (the default)",
        )
    result = make_plan(
        Topology.from_yaml(topology), "greedy" if greedy else "exact", time_limit_s=time_limit
    )
    if as_json:
        _print_json(result.model_dump(mode="json"))
        return
    table = Table(
        title=f"{result.method} plan ({result.status}): objective {result.objective_ms:.1f} ms "
        f"of state transfers, solved in {result.solve_ms:.0f} ms"
    )
    for column in ("task", "backup", "redeploy", "state transfer ms", "at Mb/s"):
        table.add_column(column)
    for a in result.assignments:
        # The objective counts the backup's transfer to the redeploy server only: one on
        # that server is read in place, which "0.0" alone read as an instant recovery.
        local = a.backup == a.redeploy
        transfer = "none (backup on it)" if local else f"{a.recovery_ms:.1f}"
        bandwidth = "-" if a.recovery_bandwidth is None else f"{a.recovery_bandwidth:g}"
        table.add_row(*_plain(a.task, a.backup, a.redeploy, transfer, bandwidth))
    console.print(table)


class DemoCase(StrEnum):
    """What ``fogshift demo`` runs."""

    case1 = "case1"
    ecg = "ecg"
    twins = "twins"


@app.command()
def demo(
    home: DemoHome = Path(".fogshift-demo"),
    case: Annotated[
        DemoCase,
        typer.Option(
            help="case1: sensors' window averages, a node killed, the aggregate restored and "
            "migrated; ecg: patients' ECG twins, the processing moved to another gateway, "
            "that gateway killed and the processing restored; twins: the twins split over "
            "two gateways, one patient's twin following its wearable to the other."
        ),
    ] = DemoCase.case1,
    spec: Annotated[
        Path | None,
        typer.Option(
            help="The case's spec (default: its packaged example, run from a fresh copy in "
            "<home>/demo/, where its output goes)."
        ),
    ] = None,
    timeout: Annotated[
        float,
        ranged("--timeout", "Seconds to wait for the output.", 1, 86_400),
    ] = 300,
    keep: Annotated[bool, typer.Option(help="Leave the cluster up afterwards.")] = False,
) -> None:
    """Run Case 1 (or Case 2: --case ecg, --case twins) and print a consistency verdict.

    Exit 1 if inconsistent."""
    from fogshift.cli.demo import demo_copy, run_demo

    home = home.resolve()
    path = spec if spec is not None else demo_copy(home, case.value)
    ok = run_demo(home, path, timeout, keep, console, case=case.value)
    raise typer.Exit(0 if ok else 1)


@app.command()
def dashboard(
    home: Home = Path(".fogshift"),
    host: Annotated[
        str, typer.Option(help="Address to listen on (loopback unless you say otherwise).")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        ranged("--port", "Port; 0 picks a free one.", 0, 65535),
    ] = 8765,
    spec_dir: Annotated[
        Path, typer.Option(help="Relative paths of specs deployed from the browser start here.")
    ] = Path("."),
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="A DNS name users reach the dashboard by (repeatable); requests naming any "
            "other host are refused (DNS rebinding). Its address, loopback names and, with "
            "--host 0.0.0.0, this machine's addresses and host names are served anyway.",
        ),
    ] = None,
    tls_proxy: Annotated[
        bool,
        typer.Option(
            help="Users reach the dashboard over HTTPS through a proxy: the session cookie "
            "is sent over HTTPS only and browsers are told to keep to HTTPS (HSTS).",
        ),
    ] = False,
) -> None:
    """Serve the web dashboard of the cluster; prints a one-time login URL."""
    from fogshift.web.serve import check_spec_dir, serve

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()  # the login URL must reach a pipe (a test, `| tee`) at once

    # (Checked before it is resolved: a symlink loop was a traceback there.)
    spec_dir = check_spec_dir(spec_dir).resolve()
    serve(home.resolve(), host, port, spec_dir, say, names=tuple(allow_host or ()),
          tls_proxy=tls_proxy)  # fmt: skip


#: How long a service started waits for its folder's claim: `up` starts one again once its
#: predecessor's leader has exited, whose last thread may still be letting go of files.
SERVICE_CLAIM_WAIT_S = 5.0


@app.command("serve-agent", hidden=True)
def serve_agent(
    name: Annotated[str, typer.Option()],
    home: Annotated[Path, typer.Option()],
    port: Annotated[int, typer.Option()],
    orchestrator: Annotated[str, typer.Option()],
    token_file: Annotated[Path, typer.Option()],
    broker_file: Annotated[Path, typer.Option()],
    host: Annotated[str | None, typer.Option()] = None,
    spark_master: Annotated[str | None, typer.Option()] = None,
    trigger_ms: Annotated[int | None, typer.Option()] = None,
    checkpoint_interval: Annotated[float | None, typer.Option()] = None,
    advertise_url: Annotated[
        str | None, typer.Option(help="The URL the orchestrator should use (isolated nodes).")
    ] = None,
    pull_rate_bps: Annotated[
        int | None, typer.Option(help="Pace the central store's checkpoint pulls (bit/s).")
    ] = None,
) -> None:
    """Run one node agent in the foreground (started by `up`).

    Settings not given here are read from ``FOGSHIFT_*`` or defaulted by
    :class:`AgentConfig`."""
    from fogshift.agent.app import create_app

    config = AgentConfig(
        name=name,
        port=port,
        home=home.resolve(),
        token=token_file.read_text().strip(),
        orchestrator_url=orchestrator,
        broker_file=broker_file.resolve(),
        **_given(
            host=host,
            spark_master=spark_master,
            trigger_ms=trigger_ms,
            checkpoint_interval_s=checkpoint_interval,
            advertise_url=advertise_url,
            pull_rate_bps=pull_rate_bps,
        ),
    )
    make_private_dir(config.home)
    _log_setup()
    claim(
        config.home / AGENT_LOCK,
        f"node agent {name!r} under {str(config.home)!r}",
        hint="one agent per node folder: stop the other (`fogshift down`), or start this one "
        "under another --home",
        wait_s=SERVICE_CLAIM_WAIT_S,
    )  # (a second agent would run the node's PEs again into the same checkpoints)
    keep_logs(config.log_max_bytes)  # (once it is the node's one agent: one keeper per log)
    _serve(create_app(config), config.host, port)


@app.command("serve-orchestrator", hidden=True)
def serve_orchestrator(
    home: Annotated[Path, typer.Option()],
    port: Annotated[int, typer.Option()],
    token_file: Annotated[Path, typer.Option()],
    broker_file: Annotated[Path, typer.Option()],
    host: Annotated[str | None, typer.Option()] = None,
    central_interval: Annotated[float | None, typer.Option()] = None,
    duplicate_window: Annotated[float | None, typer.Option()] = None,
    plan_interval: Annotated[float | None, typer.Option()] = None,
    broker_config: Annotated[Path | None, typer.Option()] = None,
    broker_pid: Annotated[int | None, typer.Option()] = None,
    broker_started: Annotated[float | None, typer.Option()] = None,
    test_pause_at: Annotated[
        str | None,
        typer.Option(
            help="Test hook: stop at this operation phase (e.g. migration:switching) and wait "
            "to be killed \\[default: $FOGSHIFT_TEST_PAUSE_AT, else the phase written in the "
            "file $FOGSHIFT_TEST_PAUSE_FILE names, else never].",
        ),
    ] = None,
) -> None:
    """Run the orchestrator in the foreground (started by `up`).

    Settings not given here are read from ``FOGSHIFT_*`` or defaulted by
    :class:`OrchestratorConfig`."""
    from fogshift.orchestrator.app import create_app

    config = OrchestratorConfig(
        home=home.resolve(),
        port=port,
        token=token_file.read_text().strip(),
        broker_file=broker_file.resolve(),
        **_given(
            host=host,
            central_interval_s=central_interval,
            duplicate_window_s=duplicate_window,
            plan_interval_s=plan_interval,
            test_pause_at=test_pause_at or None,
            broker_config=broker_config.resolve() if broker_config else None,
            broker_pid=broker_pid,
            broker_started=broker_started,
        ),
    )
    _log_setup()
    claim(
        config.home / ORCHESTRATOR_LOCK,
        f"an orchestrator of the cluster under {str(config.home)!r}",
        hint="one orchestrator per cluster home: `fogshift up` starts it only if it is gone",
        wait_s=SERVICE_CLAIM_WAIT_S,
    )  # (a second one would write the same registry: two PEs given one epoch)
    # Once it is the cluster's one orchestrator (one keeper per log); no process of the
    # broker `up` started keeps the broker's log.
    keep_logs(config.log_max_bytes, *([config.broker_log] if config.broker_log else []))
    _serve(create_app(config), config.host, port)


def _serve(service: Any, host: str, port: int) -> None:
    """Run a service (agent, orchestrator) in the foreground on ``host:port``."""
    import uvicorn

    uvicorn.run(
        service, host=host, port=port, log_level="warning", timeout_keep_alive=SERVER_KEEP_ALIVE_S
    )


def _log_setup() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("py4j", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the app on ``argv`` (default: the command line), printing fogshift
    errors as messages, not tracebacks. Ends with :class:`SystemExit` like any command."""
    try:
        app(args=argv, prog_name="fogshift")
    except FogshiftError as exc:
        err_console.print(f"[red]error[/] ({exc.code}): {escape(exc.render())}", highlight=False)
        sys.exit(2 if isinstance(exc, InvalidInput) else 1)
    except ValidationError as exc:
        # An answer that does not fit its contract (fogshift.contracts): a version mismatch
        # between the CLI and the cluster, not the user's mistake.
        err_console.print(
            f"[red]error[/] (invariant): the cluster's answer is not a {exc.title}: "
            f"{escape(str(exc.errors()[0]['loc']))}: {escape(message_of(exc.errors()[0]))}\n"
            "hint: are the CLI and the cluster of one fogshift version?",
            highlight=False,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
