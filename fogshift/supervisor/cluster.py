"""Starting and stopping a local cluster: broker, orchestrator and one agent per node.

Every service runs in a process group of its own, so ``down`` (or a test) can kill a whole
node — agent, JVM and Python workers — with one signal. What was started is written to
``<home>/cluster.json``; the secrets live in files created 0600: the operator token
(``<home>/token``, the CLI's), each node's own token (``<home>/nodes/<node>/token``, derived
from the operator token, see ``fogshift.common.http``) and the broker users' NKEY seeds
(each node's in its own broker file).

With ``isolate``, each node agent runs in a network namespace of its own, joined to the host
by a veth pair with the node's bandwidth (``tbf``), and reaches the broker and the
orchestrator — still bound to loopback — only through its relay, which adds the node's
delay (:mod:`fogshift.network`). The orchestrator reaches the agent through the relay too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError

from fogshift.broker.client import BrokerAddress
from fogshift.broker.naming import LOG_NAME as BROKER_LOG
from fogshift.broker.permissions import add_node_users, remove_node_users
from fogshift.broker.server import (
    DEFAULT_SYNC,
    check_external,
    check_sync,
    free_port,
    node_address,
    start_nats_server,
    store_failed,
)
from fogshift.common.exceptions import WaitTimedOut
from fogshift.common.files import PRIVATE_MODE, make_private_dir, write_atomic, write_private
from fogshift.common.http import ServiceClient, is_loopback, node_token
from fogshift.common.locks import CLUSTER_LOCK, exclusive
from fogshift.common.names import NAME_PATTERN
from fogshift.common.processes import StoppedWatch, foreign, group_alive, leads, started_at
from fogshift.common.validation import message_of
from fogshift.common.waiting import wait_until
from fogshift.contracts import (
    AgentHealth,
    NodeAdmission,
    NodeHold,
    NodeView,
    PipelineState,
    PipelineStatus,
)
from fogshift.exceptions import (
    Conflict,
    FogshiftError,
    InvalidInput,
    InvariantViolation,
    Unavailable,
)
from fogshift.network.exceptions import NetworkCommandFailed, NotIsolated
from fogshift.network.links import LinkProfile
from fogshift.network.namespaces import (
    NodeLink,
    cleanup_stale,
    create_links,
    destroy_link,
    link_state,
    require_support,
    set_link,
)
from fogshift.network.relay import (
    EchoSpec,
    RelayConfig,
    Route,
    buffer_bytes_for,
    spawn_relay,
)
from fogshift.network.rtt import RttReport, measure_rtt
from fogshift.orchestrator.exceptions import UnknownNode
from fogshift.orchestrator.planning import FogTopology
from fogshift.orchestrator.registry import Registry, node_in_use
from fogshift.supervisor.exceptions import AlreadyUp, NotUp

#: Port of an isolated node's agent inside its namespace (the namespace has nothing else).
ISOLATED_AGENT_PORT = 8700
#: Port of the RTT echo server the relay opens inside each namespace.
ISOLATED_ECHO_PORT = 8701
#: Node agents started at once; the next ones wait until these report a ready Spark session.
#: A session's start (JVM class loading and compilation, the first Python workers) is
#: CPU-bound: on a 2-core machine four at once took ~70 s, and a Python worker of a PE that
#: started meanwhile could miss Spark's fixed 10 s to connect back.
STARTING_AT_ONCE = max(1, (os.cpu_count() or 1) // 2)
#: The share of an isolated node's bandwidth its central pulls may take
#: (:func:`pull_rate_bps`): the other half stays the PEs', whose input, output and key
#: states cross the same link.
PULL_SHARE = 0.5


class ProcessInfo(BaseModel):
    """A process started by ``up``."""

    model_config = ConfigDict(frozen=True)

    pid: int
    pgid: int
    url: str | None = None
    #: The command it was started with (a node agent's: so that ``up`` can start a node
    #: that died again, on the same port, home and settings).
    argv: tuple[str, ...] = ()
    #: When it started (psutil's ``create_time``): a pid and its group are given again once
    #: the process and its group are gone, and a new session leader has both; this tells it
    #: from ours. ``None`` in an older fogshift's file (judged by pid and group alone).
    started: float | None = None

    @classmethod
    def of(cls, pid: int, **fields: Any) -> ProcessInfo:
        """A process started just now in a session (a group) of its own."""
        return cls(pid=pid, pgid=pid, started=started_at(pid), **fields)

    def runs(self) -> bool:
        """Whether this process still runs (not another that was given its pid)."""
        return leads(self.pid, self.pgid, self.started)

    def foreign(self) -> bool:
        """Whether its process group is another process's now (its pid given again)."""
        return foreign(self.pid, self.pgid, self.started)


class IsolatedNode(BaseModel):
    """An isolated node's namespace and link, and the relay that carries its traffic.

    Attributes:
        link: The namespace, veth pair, addresses and profile.
        relay: The relay process (its own process group).
        routes: Each relay route's bound ``(host, port)``: ``broker`` and ``orchestrator``
            (on the host end of the veth), ``agent`` and ``echo`` (on loopback).
    """

    model_config = ConfigDict(frozen=True)

    link: NodeLink
    relay: ProcessInfo
    routes: dict[str, tuple[str, int]]


class ClusterFile(BaseModel):
    """``<home>/cluster.json``: what ``up`` started and how to reach it."""

    model_config = ConfigDict(frozen=True)

    orchestrator: ProcessInfo
    broker: ProcessInfo | None  # None when an external broker is used
    nodes: dict[str, ProcessInfo]
    broker_url: str
    #: The isolated nodes (all of them with ``up --isolate``; none without).
    network: dict[str, IsolatedNode] = {}
    #: Nodes a `remove-node` began to take out (:func:`remove_nodes`): not waited for,
    #: not started again; the next `up` or `remove-node` finishes taking them out.
    removing: tuple[str, ...] = ()

    @property
    def members(self) -> list[str]:
        """Its nodes but those being removed: the ones `up` waits for and starts again."""
        return [n for n in self.nodes if n not in self.removing]


#: How long `down` waits for a service's leader to stop after SIGTERM before SIGKILL.
DOWN_GRACE_S = 15.0


def cluster_file(home: Path) -> Path:
    return home / "cluster.json"


def token_file(home: Path) -> Path:
    return home / "token"


def broker_file(home: Path) -> Path:
    return home / "broker.json"


def node_broker_file(home: Path, node: str) -> Path:
    """Node ``node``'s broker address: a broker user of its own, with the rights of the PEs
    it hosts only (see ``fogshift.broker.permissions``)."""
    return home / "nodes" / node / "broker.json"


def node_token_file(home: Path, node: str) -> Path:
    """Node ``node``'s token, in its own folder: all its agent holds of the cluster's keys."""
    return home / "nodes" / node / "token"


def write_tokens(home: Path, nodes: list[str], generations: Mapping[str, int]) -> str:
    """Generate a new operator token and write it and each node's token (of its generation
    in ``generations``, 0 if not there), all 0600.

    Returns:
        The operator token.
    """
    token = secrets.token_urlsafe(32)
    write_private(token_file(home), token)
    for node in nodes:
        write_private(
            node_token_file(home, node), node_token(token, node, generations.get(node, 0))
        )
    return token


def load_cluster(home: Path) -> tuple[ClusterFile, str]:
    """The running cluster's file and token.

    Raises:
        NotUp: No cluster was started under ``home``.
    """
    path = cluster_file(home)
    if not path.exists():
        raise NotUp(
            f"no fogshift cluster is up under {str(home)!r}",
            expected=f"the file {path.name}, which `fogshift up` writes in its home",
            received=f"{str(path)!r}, which does not exist",
            hint="run `fogshift up` (or pass the --home it was started with)",
        )
    cluster = read_cluster(path)
    try:
        token = token_file(home).read_text().strip()
    except OSError as exc:  # (a traceback before: e.g. a root cluster's 0600 token)
        raise InvalidInput(
            f"cannot read the operator token of the cluster under {str(home)!r}",
            expected=f"a token file {str(token_file(home))!r} this user may read",
            received=f"{type(exc).__name__}: {exc.strerror or exc}",
            hint="run the command as the user who ran `fogshift up` (root for --isolate)",
        ) from None
    return cluster, token


def read_cluster(path: Path) -> ClusterFile:
    """Read a cluster file written by :func:`save_cluster`.

    Raises:
        InvalidInput: It cannot be read, or is not a cluster file (not JSON, or not the
            fields ``up`` writes) — a file of another fogshift version, or edited by hand.
    """
    try:
        return ClusterFile.model_validate_json(path.read_text())
    except OSError as exc:
        problem = f"{type(exc).__name__}: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        problem = f"not text: {exc.reason} at byte {exc.start}"
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        problem = message_of(first) + (f" at {where}" if where else "")
        if exc.error_count() > 1:
            problem += f" (and {exc.error_count() - 1} more)"
    raise InvalidInput(
        f"cannot read the cluster file {str(path)!r}",
        expected="the JSON `fogshift up` writes: orchestrator, broker, nodes and broker_url",
        received=problem,
        hint=(
            "if no cluster runs under this home, delete the file and run `fogshift up`; "
            "if one does, stop its processes by hand (`fogshift down` needs this file)"
        ),
    )


def save_cluster(home: Path, cluster: ClusterFile) -> Path:
    """Write ``<home>/cluster.json`` atomically: a reader (``fogshift down``, another CLI
    command) never sees it half-written, even if ``up`` is killed while writing it."""
    # Private: an external broker's URL given with its credentials is kept in it.
    return write_atomic(cluster_file(home), cluster.model_dump_json(indent=2), PRIVATE_MODE)


def cluster_running(home: Path) -> bool:
    """Whether a cluster started under ``home`` still runs (its orchestrator lives)."""
    try:
        cluster = ClusterFile.model_validate_json(cluster_file(home).read_text())
    except (OSError, ValueError):
        return False
    return cluster.orchestrator.runs()


#: How long a client waits for the orchestrator's answer to an operation (a migration, a
#: group of them, a restore, a scale): minutes on a loaded node, each step bounded by the
#: orchestrator itself. A client that gives up first reports an orchestrator that cannot be
#: reached while the operation goes on.
OPERATION_TIMEOUT_S = 1800.0


def orchestrator_client(home: Path, timeout_s: float = 120) -> ServiceClient:
    """A client for the orchestrator of the cluster under ``home``: a request is given up
    (:class:`~fogshift.common.http.NoAnswer`) once the orchestrator's process is seen
    stopped, instead of after ``timeout_s``, and while it stays stopped, the next are not
    sent."""
    cluster, token = load_cluster(home)
    process = cluster.orchestrator
    assert process.url is not None
    watch = StoppedWatch(process.pid, process.pgid, process.started)
    return ServiceClient(process.url, token, "the orchestrator", timeout_s, silent=watch,
                         unsent_when_silent=True)  # fmt: skip


#: Every process :func:`_spawn` started in this interpreter, in order: what an `up` ended by
#: a signal stops (see :func:`_ended_by_signals`).
_spawned: list[ProcessInfo] = []
#: "active" while :func:`_spawn` starts and records a process (a signal then waits until it
#: ends); "ended": the first signal that ended `up` while :func:`_ended_by_signals` holds
#: (see :func:`_check_ended`).
_deferred: dict[str, int | bool] = {"active": False, "ended": 0}
#: What each process :func:`_spawn` started is (its log's name: "orchestrator", "node-fog-a"),
#: by pid; and the labels of those :func:`_kept` since, in order: what an ended `up` says.
_labels: dict[int, str] = {}
_kept_labels: list[str] = []


def _kept(*processes: ProcessInfo) -> None:
    """Keep ``processes`` (started by this `up` and answering, each recorded in the
    cluster file) whatever ends this `up` from now on: a SIGTERM during a later wait (for a
    frozen node, the next wave) stopped them with what it had started, a SIGINT not."""
    gone = {p.pid for p in processes}
    _kept_labels.extend(_labels.get(p.pid, f"pid {p.pid}") for p in _spawned if p.pid in gone)
    _spawned[:] = [p for p in _spawned if p.pid not in gone]  # (recorded as copies)


def _spawn(args: list[str], log: Path) -> ProcessInfo:
    _check_ended()  # (no more processes once `up` was told to end: see _check_ended)
    log.parent.mkdir(parents=True, exist_ok=True)
    # A signal that ends `up` waits until the process is recorded: raised inside Popen (as
    # it waits for the child's exec) or before its caller kept it, it left the child running
    # with nothing to stop it (seen under load: an agent ran on after `up` ended).
    _deferred["active"] = True
    # A ^C waits too (its KeyboardInterrupt raised inside Popen left the child, in a session
    # of its own the terminal's ^C never reaches, running unrecorded, holding its node's
    # folder): the child it met is stopped, then the interrupt goes on.
    interrupted: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, lambda s, _f: interrupted.append(s)) if main else None
    # (None: a handler not set from Python; Python's own is what ^C meant then.)
    info: ProcessInfo | None = None
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=os.getcwd(),
            )  # fmt: skip
        info = ProcessInfo.of(proc.pid, argv=tuple(args))
        _spawned.append(info)
        _labels[info.pid] = log.stem.replace("node-", "node ", 1)
        # The Popen's finaliser runs here, while a signal waits: run as this function
        # returned, a signal that came just then raised its SystemExit inside the
        # finaliser, which drops it (see _check_ended).
        del proc
    finally:
        _deferred["active"] = False
        if main:
            signal.signal(signal.SIGINT, signal.default_int_handler if before is None else before)
    if interrupted:
        if info is not None:
            kill_group(info.pgid, signal.SIGKILL)
        raise KeyboardInterrupt
    _check_ended()  # (a signal that came meanwhile)
    assert info is not None
    return info


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fogshift.cli.main", *args]


def _settings(**options: object) -> list[str]:
    """``--option value`` for each setting given; a setting left ``None`` is not passed, so
    the service takes it from its config (``FOGSHIFT_*`` in the environment it inherits,
    else the default its config class writes: ``AgentConfig``, ``OrchestratorConfig``)."""
    args: list[str] = []
    for name, value in options.items():
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def _agent_args(
    home: Path,
    name: str,
    host: str,
    port: int,
    orchestrator_url: str,
    node_broker_file: Path,
    spark_master: str | None,
    checkpoint_interval_s: float | None,
    advertise_url: str | None = None,
    trigger_ms: int | None = None,
    pull_rate_bps: int | None = None,
) -> list[str]:
    advertise = ["--advertise-url", advertise_url] if advertise_url else []
    return _cli(
        "serve-agent",
        *advertise,
        "--name",
        name,
        "--home",
        str(home / "nodes" / name),
        "--host",
        host,
        "--port",
        str(port),
        "--orchestrator",
        orchestrator_url,
        "--token-file",
        str(node_token_file(home, name)),
        "--broker-file",
        str(node_broker_file),
        *_settings(
            spark_master=spark_master,
            checkpoint_interval=checkpoint_interval_s,
            trigger_ms=trigger_ms,
            pull_rate_bps=pull_rate_bps,
        ),
    )


def start_node(
    home: Path,
    name: str,
    orchestrator_url: str,
    host: str,
    spark_master: str | None = None,
    checkpoint_interval_s: float | None = None,
    trigger_ms: int | None = None,
) -> ProcessInfo:
    """Start the agent of node ``name`` (its broker file written) in a new process group.

    ``spark_master``, ``checkpoint_interval_s`` and ``trigger_ms`` left ``None`` are the
    agent's settings (``AgentConfig``: ``FOGSHIFT_SPARK_MASTER``... or the default)."""
    port = free_port(host)
    info = _spawn(
        _agent_args(
            home, name, host, port, orchestrator_url, node_broker_file(home, name),
            spark_master, checkpoint_interval_s, trigger_ms=trigger_ms,
        ),
        home / "logs" / f"node-{name}.log",
    )  # fmt: skip
    return info.model_copy(update={"url": f"http://{host}:{port}"})


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname is None:
        raise InvalidInput(
            f"cannot relay to {url!r}: it names no host",
            expected="a URL with a host, e.g. http://127.0.0.1:8000",
            received=repr(url),
            hint="name the host in the URL",
        )
    return parts.hostname, parts.port or default_port


def pull_rate_bps(profile: LinkProfile) -> int | None:
    """How fast an isolated node behind ``profile`` sends the central store's pulls
    (``AgentConfig.pull_rate_bps``): :data:`PULL_SHARE` of its bandwidth; ``None`` (as
    fast as it goes) on a link without a limit."""
    bps = profile.bandwidth_bps
    return None if bps is None else max(8000, int(bps * PULL_SHARE))


def start_isolated_node(
    home: Path,
    link: NodeLink,
    orchestrator_url: str,
    broker: BrokerAddress,
    spark_master: str | None = None,
    checkpoint_interval_s: float | None = None,
    trigger_ms: int | None = None,
) -> tuple[ProcessInfo, IsolatedNode]:
    """Start node ``link.node``'s relay, then its agent inside the node's namespace.

    The relay listens on the host end of the veth for the broker and the orchestrator, and
    on loopback for the agent and the RTT echo; the agent gets a broker file of its own
    (its own broker user, the relay's address) and advertises its loopback route. Both run in
    process groups of their own; ``ip netns exec`` execs the agent, so the agent's pid is
    the group's leader, as without isolation.

    Returns:
        The agent's process and the node's link and relay.

    Raises:
        RelayFailed: The relay did not start (nothing of this node is left running).
    """
    name = link.node
    folder = home / "network" / name
    broker_host, broker_port = _host_port(broker.url, 4222)
    orchestrator_host, orchestrator_port = _host_port(orchestrator_url, 80)
    config = RelayConfig(
        profile=link.profile,
        buffer_bytes=buffer_bytes_for(link.profile),
        routes=[
            Route(name="broker", listen_host=link.host_ip, target_host=broker_host,
                  target_port=broker_port),
            Route(name="orchestrator", listen_host=link.host_ip,
                  target_host=orchestrator_host, target_port=orchestrator_port),
            Route(name="agent", listen_host="127.0.0.1", target_host=link.ns_ip,
                  target_port=ISOLATED_AGENT_PORT),
            Route(name="echo", listen_host="127.0.0.1", target_host=link.ns_ip,
                  target_port=ISOLATED_ECHO_PORT),
        ],
        echo=EchoSpec(namespace=link.namespace, host=link.ns_ip, port=ISOLATED_ECHO_PORT),
        watch_interface=link.host_if,
    )  # fmt: skip
    ready = spawn_relay(config, folder, home / "logs" / f"relay-{name}.log")
    relay = ProcessInfo.of(ready.pid)
    try:
        node_broker = BrokerAddress(
            url=f"nats://{link.host_ip}:{ready.routes['broker'][1]}",
            user=broker.user,
            password=broker.password,
            inbox=broker.inbox,
            api=broker.api,
            seed=broker.seed,
        ).save(node_broker_file(home, name))
        agent_url = f"http://127.0.0.1:{ready.routes['agent'][1]}"
        args = _agent_args(
            home, name, link.ns_ip, ISOLATED_AGENT_PORT,
            f"http://{link.host_ip}:{ready.routes['orchestrator'][1]}", node_broker,
            spark_master, checkpoint_interval_s, advertise_url=agent_url, trigger_ms=trigger_ms,
            pull_rate_bps=pull_rate_bps(link.profile),
        )  # fmt: skip
        agent = _spawn(["ip", "netns", "exec", link.namespace, *args],
                       home / "logs" / f"node-{name}.log")  # fmt: skip
    except BaseException:
        kill_group(relay.pgid, signal.SIGKILL)
        raise
    isolated = IsolatedNode(link=link, relay=relay, routes=ready.routes)
    return agent.model_copy(update={"url": agent_url}), isolated


def up(
    home: Path,
    nodes: list[str],
    host: str = "127.0.0.1",
    nats_url: str | None = None,
    nats_user: str | None = None,
    nats_password: str | None = None,
    spark_master: str | None = None,
    timeout_s: float = 180,
    on_progress: Callable[[str], None] | None = None,
    checkpoint_interval_s: float | None = None,
    central_interval_s: float | None = None,
    duplicate_window_s: float | None = None,
    trigger_ms: int | None = None,
    isolate: bool = False,
    links: dict[str, LinkProfile] | None = None,
    topology: Path | None = None,
    plan_interval_s: float | None = None,
    broker_sync: str | None = None,
) -> ClusterFile:
    """Start the broker (unless ``nats_url``), the orchestrator and the node agents.

    Returns once the orchestrator answers and every node reports a ready Spark session.
    On a cluster that runs in part, only what died is started again: the orchestrator
    (:func:`restart_orchestrator`) and the node agents (:func:`restart_nodes`, as they were
    started); when ``nodes`` names every node of a running cluster, one it lacks is added
    to it (:func:`add_nodes`, started as its first node was); the other arguments but the
    intervals are then ignored. If the broker it
    started died, the rest is stopped and the cluster started anew with these arguments
    (its pipelines carry on from the registry, streams and checkpoints on disk).

    The services' settings (``spark_master``, the intervals and ``trigger_ms``, the queries'
    micro-batch trigger) left ``None`` are theirs:
    each reads ``FOGSHIFT_<FIELD>`` from the environment it inherits, else takes the default
    its config class writes (``fogshift.agent.config.AgentConfig``,
    ``fogshift.orchestrator.config.OrchestratorConfig``).

    Args:
        isolate: Run each agent in a network namespace of its own, behind a relay (module
            docstring). Links a killed run of this home left behind are removed first.
        links: Each isolated node's profile (default: no limit, no delay); needs ``isolate``.
        topology: A fog topology (YAML) for the planner, copied to ``<home>/topology.yaml``
            (``fogshift topology set`` replaces it later); validated before anything starts.
        plan_interval_s: Interval of the orchestrator's backup/redeploy planner.
        broker_sync: When the broker it starts fsyncs stored records (default:
            :data:`fogshift.broker.server.DEFAULT_SYNC`); refused with ``nats_url``, whose
            broker fogshift does not configure.

    Raises:
        AlreadyUp: A cluster already runs whole under ``home``, with every node asked for.
        AlreadyRunning: Another `up` or `down` of ``home`` runs.
        InvalidInput: A bad node name, ``links`` without ``isolate``, a bad ``broker_sync``
            or one with ``nats_url``.
        IsolationUnsupported: ``isolate`` here is impossible (not root, no ``ip``/``tc``).
        Unavailable: Something did not become healthy within ``timeout_s``; what was started
            is stopped again (namespaces included).
    """
    say = on_progress or (lambda _msg: None)
    if broker_sync is not None and nats_url is not None:
        raise InvalidInput(
            "a broker sync for a broker fogshift does not start",
            expected="--broker-sync only without --nats-url",
            received=f"--broker-sync {broker_sync} with --nats-url {nats_url}",
            hint="set sync_interval in that nats-server's own config, and leave --broker-sync "
            "(and $FOGSHIFT_BROKER_SYNC) out",
        )
    sync = check_sync(broker_sync or DEFAULT_SYNC)
    for name in nodes:
        if not NAME_PATTERN.fullmatch(name):
            raise InvalidInput(
                f"bad node name {name!r}",
                expected="letters, digits, '_' and '-' (e.g. cloud,fog-a,fog-b)",
                received=repr(name),
                hint="rename the node",
            )
        if name == "orchestrator" or name.startswith("relay-"):
            # (`logs NAME` names a node's log by the node: a node `orchestrator` took the
            # orchestrator's log's name, `relay-X` an isolated node's relay's.)
            raise InvalidInput(
                f"node name {name!r} is the name of the cluster's own log",
                expected="a node name other than 'orchestrator' and not starting 'relay-'",
                received=repr(name),
                hint="rename the node",
            )
    if not nodes:
        raise InvalidInput(
            "no nodes to start",
            expected="--nodes cloud,fog-a,fog-b",
            received="no node names",
            hint="name at least one node",
        )
    twice = sorted({name for name in nodes if nodes.count(name) > 1})
    if twice:
        # Two agents of one name would share a home, a token and a broker user; the file
        # would record one of them, and `down` would never stop the other.
        raise InvalidInput(
            "a node named twice",
            expected="each node once (e.g. cloud,fog-a,fog-b)",
            received=",".join(nodes),
            hint=f"named more than once: {', '.join(twice)}",
        )
    _check_host(host)
    if not is_loopback(host):
        say(
            f"warning: the orchestrator and the node agents listen on {host}, not loopback, "
            "over plain HTTP: anyone on that network can read the tokens every request and "
            "heartbeat carries (put TLS in front of them, or keep them on a private network)"
        )
    if nats_url is None and (nats_user is not None or nats_password is not None):
        # (Ignored before: the cluster started its own broker, and the credentials meant
        # for another were silently unused.)
        raise InvalidInput(
            "broker credentials need the broker they are for",
            expected="--nats-url URL with --nats-user and the password ($FOGSHIFT_NATS_"
            "PASSWORD or --nats-password-file), or none of them: fogshift starts a broker of "
            "its own, with a user per node",
            received=" and ".join(
                given
                for given, value in (("a user", nats_user), ("a password", nats_password))
                if value is not None
            )
            + " without --nats-url",
            hint="give --nats-url, or drop the credentials",
        )
    if nats_url is not None:
        say(
            f"warning: every node connects to the broker at {nats_url} with the credentials "
            "given: no broker permissions per node (a node could read, write or delete any "
            "pipeline's streams those credentials reach); least privilege per node holds "
            "with the broker `fogshift up` starts itself (leave out --nats-url)"
        )
    if links and not isolate:
        raise InvalidInput(
            "link profiles need isolated nodes",
            expected="--isolate with --link",
            received=" ".join(
                f"--link {n}={p.label()}" for n, p in links.items() if p != LinkProfile()
            ),
            hint="add --isolate (needs root, for network namespaces)",
        )
    profiles = {name: (links or {}).get(name, LinkProfile()) for name in nodes}
    fog_text = FogTopology.read_text(topology) if topology is not None else None
    if isolate:
        require_support(need_tc=any(p.bandwidth for p in profiles.values()))
    if nats_url is not None:
        check_external(BrokerAddress(url=nats_url, user=nats_user, password=nats_password))
    make_private_dir(home)
    with (
        exclusive(
            home / CLUSTER_LOCK,
            f"a fogshift up or down of {str(home)!r}",
            hint="wait for the other `fogshift up` or `down` of this home to end, or use another "
            "--home",
        ),
        _ended_by_signals(say),
    ):
        return _up_claimed(
            home, nodes, host, nats_url, nats_user, nats_password, spark_master, timeout_s,
            say, checkpoint_interval_s, central_interval_s, duplicate_window_s, trigger_ms,
            isolate, profiles, fog_text, plan_interval_s, sync,
        )  # fmt: skip


def _check_ended() -> None:
    """Raise once more the ``SystemExit`` of a signal that ended `up`, if one came.

    A signal's handler runs wherever the interpreter is: inside a finaliser (a ``__del__``,
    such as an unreferenced ``Popen``'s) its ``SystemExit`` is printed as "Exception
    ignored" and dropped, and `up` went on to finish with 0, its services running (seen
    under load: `up` ended by SIGTERM as it started an agent). Called where `up` waits
    and before it starts a process (one `up` at a time per interpreter:
    :func:`_ended_by_signals` is not nested)."""
    signum = int(_deferred["ended"])
    if signum and not _deferred["active"]:
        raise SystemExit(128 + signum)


@contextlib.contextmanager
def _ended_by_signals(say: Callable[[str], None] = lambda line: None) -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit`` while this holds (in the main thread), as
    Ctrl-C raises ``KeyboardInterrupt``: an `up` ended by `timeout`, a service manager or
    a closed terminal stops what it started. By default they end the interpreter at once:
    its broker and agents ran on with no cluster file for `down` to find them by, and the
    next `up` waited out its timeout on a node folder an orphaned agent still held. What
    it stopped and what it kept running is said (``say``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, frame: object) -> None:
        _deferred["ended"] = _deferred["ended"] or signum
        if _deferred["active"]:  # (raised once the process is recorded: see _spawn)
            return
        raise SystemExit(128 + signum)

    mark, kept_mark = len(_spawned), len(_kept_labels)
    before = {sig: signal.signal(sig, end) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
        # A SystemExit dropped (see _check_ended) after the last wait: what this `up`
        # started is stopped all the same, as a crash would leave it.
        _check_ended()
    except SystemExit:
        if _deferred["ended"]:
            # Whatever this `up` started, recorded by the caller or not (each path's own
            # clean-up stops what it recorded; a process started just as the signal came
            # was not, yet).
            for info in _spawned[mark:]:
                kill_group(info.pgid, signal.SIGKILL)
            # (It ended without a word of what it had started, stopped or left running.)
            stopped = [_labels.get(i.pid, f"pid {i.pid}") for i in _spawned[mark:]]
            kept = _kept_labels[kept_mark:]
            say(f"warning: `up` ended by {signal.Signals(int(_deferred['ended'])).name}: "
                f"stopped {', '.join(stopped) or 'nothing'} of what it had started"
                + (f"; kept {', '.join(kept)} running (in the cluster file: `fogshift down` "
                   "stops the cluster)" if kept else ""))  # fmt: skip
        raise
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        _deferred["ended"] = 0
        del _spawned[mark:]
        del _kept_labels[kept_mark:]
        for pid in set(_labels) - {p.pid for p in _spawned}:  # (the kept ones' were copied)
            del _labels[pid]


def _up_claimed(
    home: Path,
    nodes: list[str],
    host: str,
    nats_url: str | None,
    nats_user: str | None,
    nats_password: str | None,
    spark_master: str | None,
    timeout_s: float,
    say: Callable[[str], None],
    checkpoint_interval_s: float | None,
    central_interval_s: float | None,
    duplicate_window_s: float | None,
    trigger_ms: int | None,
    isolate: bool,
    profiles: dict[str, LinkProfile],
    fog_text: str | None,
    plan_interval_s: float | None,
    broker_sync: str,
) -> ClusterFile:
    """:func:`up`'s work once its arguments are checked and it holds the home's claim."""
    stale_network = False
    # (A broker that died is not started alone: the cluster is stopped, then started anew.)
    if cluster_file(home).exists() and not _broker_died(home, nodes, isolate, say):
        cluster, _ = load_cluster(home)
        finished = bool(cluster.removing) and cluster.orchestrator.runs()
        if finished:
            cluster = _finish_removals(home, cluster, say, timeout_s)
        # A pid alone could be a new process's by now (pids are given again): its group too.
        dead = [n for n in cluster.members if not cluster.nodes[n].runs()]
        # Nodes asked for that the cluster lacks join it (they were silently not started),
        # when every node of the cluster is asked for too: a plain `up` (its default nodes)
        # over a cluster of other names restarts what died, as it always did, and adds none.
        members = cluster.members
        asked_all = set(members) <= set(nodes)
        missing = [n for n in nodes if n not in cluster.nodes] if asked_all else []
        runs = cluster.orchestrator.runs() or len(dead) < len(members)
        if missing and runs:
            _check_addable(home, cluster, missing, isolate)
        if cluster.orchestrator.runs():
            if not dead and not missing and finished:
                # (Its caller says the nodes are healthy: checked, not assumed.)
                _living_heard(home, cluster.members, time.monotonic() + timeout_s, say,
                              "the removals are finished")  # fmt: skip
                return cluster
            if not dead and not missing:
                running = ", ".join(cluster.nodes)
                # (Its processes run, so `up` has nothing to start; a frozen node among them
                # went unsaid, and "already up" read as all is well.)
                silent = _silent_now(home, members)
                said = (
                    f"; {', '.join(silent)} {'runs' if len(silent) == 1 else 'run'} but "
                    "the orchestrator does not hear from "
                    f"{'it' if len(silent) == 1 else 'them'} (frozen or hung?)"
                    if silent
                    else ""
                )
                raise AlreadyUp(
                    f"a fogshift cluster is already up under {str(home)!r}, with nodes "
                    f"{running}{said}",
                    expected="a home where no cluster is up, or a node the cluster lacks",
                    received=f"a cluster up with nodes {running}{said}",
                    hint=(
                        "a node that runs but does not answer is frozen or hung (`kill -CONT` "
                        "it, or stop it: the orchestrator restores its PEs elsewhere once it "
                        "is silent; `fogshift nodes` shows each node's health); "
                        if silent
                        else ""
                    )
                    + (
                        f"`fogshift up --nodes {','.join(members)},NEW` (every node it has "
                        "and the new one) adds node NEW"
                        if not cluster.network
                        else "an isolated cluster takes no node while it runs: `fogshift "
                        f"down`, then `{_up_again(cluster, ',NEW')}` adds node NEW"
                    )
                    + "; `fogshift down` stops the cluster (pipelines, checkpoints and "
                    "outputs are kept); or use another --home",
                )
            # Some nodes died (killed, crashed): start them again, as they were started.
            deadline = time.monotonic() + timeout_s
            if dead:
                cluster = restart_nodes(home, cluster, dead, timeout_s, say)
            cluster = add_nodes(home, cluster, missing, timeout_s, say) if missing else cluster
            living = [n for n in members if n not in dead]
            again = (f"{', '.join(dead)} {'runs' if len(dead) == 1 else 'run'} again"
                     if dead else f"{', '.join(missing)} joined")  # fmt: skip
            _living_heard(home, living, deadline, say, again)
            return cluster
        if len(dead) < len(members):
            # The orchestrator died while agents run: start it again where the agents look
            # for it, then the nodes that died too.
            deadline = time.monotonic() + timeout_s
            living = [n for n in members if n not in dead]
            cluster = restart_orchestrator(
                home, cluster, central_interval_s, duplicate_window_s, plan_interval_s,
                timeout_s, say,
            )  # fmt: skip
            cluster = _finish_removals(home, cluster, say, timeout_s)
            if dead:
                cluster = restart_nodes(home, cluster, dead, timeout_s, say)
            cluster = add_nodes(home, cluster, missing, timeout_s, say) if missing else cluster
            again = (
                "the orchestrator"
                + "".join(f", {n}" for n in dead[:-1])
                + (f" and {dead[-1]} run again" if dead else " runs again")
            )
            _living_heard(home, living, deadline, say, again)
            return cluster
        stale_network = bool(cluster.network)
        # Nothing of it answers any more, but some of it may still run (its broker on the
        # store the next broker would open, a relay, a dead agent's Spark JVM): stopped, or
        # it would run beside the next cluster with nothing to stop it.
        _stop_leftovers(cluster)
        cluster_file(home).unlink()
    if isolate or (stale_network and os.geteuid() == 0):
        # A killed isolated run leaves namespaces, veths and routes; relays follow their
        # veth. Nothing of this home runs now (checked above), so they all go.
        cleanup_stale(home, cluster_running)
    make_private_dir(home)
    # Nodes named here that a `remove-node` took out join again (its refusals outlive
    # `down` in the registry; the agents would wait for an answer that never comes), each
    # in its next generation, which its token is of.
    write_tokens(home, nodes, _admit_in_registry(home, nodes))
    if fog_text is not None:
        (home / "topology.yaml").write_text(fog_text)
    started: list[ProcessInfo] = []
    made_links: dict[str, NodeLink] = {}
    stack = contextlib.ExitStack()
    try:
        broker_info: ProcessInfo | None = None
        if nats_url is None:
            say("starting nats-server (JetStream)")
            broker = start_nats_server(
                home / "broker", host="127.0.0.1", nodes=nodes, sync=broker_sync
            )
            broker_info = ProcessInfo.of(broker.pid, url=broker.address.url)
            started.append(broker_info)
            address = broker.address
            per_node = broker.node_addresses
        else:
            # An external broker: fogshift does not manage its users; every node gets the
            # credentials given (no per-node least privilege).
            address = BrokerAddress(url=nats_url, user=nats_user, password=nats_password)
            per_node = {}
        address.save(broker_file(home))
        for name in nodes:
            per_node.get(name, address).save(node_broker_file(home, name))
        # The agents first, a wave at a time, then the orchestrator: an orchestrator that
        # runs while agents are still starting would find them silent and restore their PEs
        # elsewhere (after a whole cluster was killed, its registry still places them there).
        # Agents keep sending heartbeats until the orchestrator answers.
        # Its port is held (bound, not listening) while the agents start, so nothing else
        # that binds meanwhile (Spark opens many sockets) takes it.
        reservation = stack.enter_context(socket.socket())
        reservation.bind((host, 0))
        port = int(reservation.getsockname()[1])
        orchestrator_url = f"http://{host}:{port}"
        node_infos: dict[str, ProcessInfo] = {}
        isolated: dict[str, IsolatedNode] = {}
        if isolate:
            _say_changed_links(home, profiles, say)
            say("creating a network namespace per node")
            made_links = create_links(home, profiles)
        for k, name in enumerate(nodes):
            if k and k % STARTING_AT_ONCE == 0:
                wait_agents_ready(home, node_infos, timeout_s, say)
            say(f"starting node agent {name}")
            if isolate:
                node_infos[name], isolated[name] = start_isolated_node(
                    home, made_links[name], orchestrator_url, per_node.get(name, address),
                    spark_master, checkpoint_interval_s, trigger_ms,
                )  # fmt: skip
                started.append(isolated[name].relay)
            else:
                node_infos[name] = start_node(
                    home, name, orchestrator_url, host, spark_master, checkpoint_interval_s,
                    trigger_ms,
                )  # fmt: skip
            started.append(node_infos[name])
        say("starting the orchestrator")
        reservation.close()
        orchestrator = start_orchestrator(
            home, host, port, central_interval_s, duplicate_window_s, plan_interval_s,
            broker_info,
        )  # fmt: skip
        started.append(orchestrator)
        cluster = ClusterFile(
            orchestrator=orchestrator,
            broker=broker_info,
            nodes=node_infos,
            broker_url=address.url,
            network=isolated,
        )
        save_cluster(home, cluster)
        wait_healthy(home, nodes, timeout_s, say)
        # A signal whose SystemExit was dropped after the wait's last poll: stopped here,
        # where the broker and the links are known too (see _check_ended).
        _check_ended()
        return cluster
    except BaseException:
        for info in started:
            kill_group(info.pgid, signal.SIGKILL)
        for link in made_links.values():
            with contextlib.suppress(FogshiftError):
                destroy_link(link)
        cluster_file(home).unlink(missing_ok=True)
        raise
    finally:
        stack.close()


#: The free space under a broker whose store failed (:func:`_broker_died`) below which `up`
#: does not start it again: on a disk still full it would fail at once again.
BROKER_MIN_FREE_BYTES = 64 << 20


def _broker_died(home: Path, nodes: list[str], isolate: bool, say: Callable[[str], None]) -> bool:
    """Whether the broker `up` started for the cluster under ``home`` died while some of
    the rest runs, or runs with a store it failed to write (:func:`store_failed`: it refuses
    every store until it starts again); if so, the rest (and that broker) is stopped as
    `down` stops it.

    Every agent's and the orchestrator's connections are to that broker, and its users and
    the rights the orchestrator gave are in its config: the cluster is started again whole,
    as after `down` (it carries on from the registry, the streams and the checkpoints on
    disk), with ``nodes`` and ``isolate`` as it ran. Before, `up` said the cluster was up,
    and nothing ran until a `down`.

    Raises:
        InvalidInput: ``nodes`` or ``isolate`` are not the cluster's (nothing was stopped:
            a plain `fogshift up`, with its default nodes, would have started another).
        Unavailable: The broker's store failed and its disk is still full (nothing was
            stopped).
    """
    cluster, _ = load_cluster(home)
    services = [cluster.orchestrator, *cluster.nodes.values()]
    if cluster.broker is None or not any(p.runs() for p in services):
        return False  # (an external broker is not ours to judge; all dead: a fresh start)
    # A broker whose store failed (its disk full) runs on refusing every store until it
    # starts again: taken as dead (a probe's only way out was `down`, then `up`).
    failed = store_failed(home / "broker" / BROKER_LOG) if cluster.broker.runs() else None
    if cluster.broker.runs() and failed is None:
        return False
    had = sorted(cluster.nodes)
    if sorted(nodes) != had or isolate != bool(cluster.network):
        again = f"--nodes {','.join(had)}" + (" --isolate" if cluster.network else "")
        raise InvalidInput(
            f"the broker of the cluster under {str(home)!r} "
            + ("failed to write its store" if failed else "is not running")
            + ", and `up` starts the cluster again whole: with its own nodes",
            expected=again,
            received=f"--nodes {','.join(nodes)}" + (" --isolate" if isolate else ""),
            hint=f"fogshift up {again} --home {home} (or `fogshift down` first for another "
            "cluster)",
        )
    if failed is not None:
        folder = home / "broker"
        free = shutil.disk_usage(folder).free
        if free < BROKER_MIN_FREE_BYTES:
            # (Started again on a full disk, it fails again: each `up` would stop the
            # cluster for nothing.)
            raise Unavailable(
                f"the broker of the cluster under {str(home)!r} failed to write its store "
                f"(its log: {failed!r}), and its disk is still full",
                expected=f"at least {BROKER_MIN_FREE_BYTES >> 20} MiB free under {folder}",
                received=f"{free >> 20} MiB free",
                hint="free space there, then `fogshift up` again: it starts the cluster "
                "again whole (pipelines, streams and checkpoints are kept)",
            )
        say(f"the cluster's broker (nats-server) failed to write its store and refuses "
            f"every store until it starts again (its log: {failed!r}; its disk, under "
            f"{folder}, full?): stopping the cluster to start it again whole")  # fmt: skip
    else:
        say("the cluster's broker (nats-server) is not running: stopping the cluster to "
            "start it again whole")  # fmt: skip
    try:
        _down_claimed(home, DOWN_GRACE_S)
    except NetworkCommandFailed as exc:  # the isolated start's clean-up removes them
        say(f"warning: {exc.message}")
    return True


def start_orchestrator(
    home: Path,
    host: str,
    port: int,
    central_interval_s: float | None,
    duplicate_window_s: float | None,
    plan_interval_s: float | None,
    broker: ProcessInfo | None = None,
) -> ProcessInfo:
    """Start the orchestrator on ``host:port`` in a new process group (it logs to
    ``<home>/logs/orchestrator.log``). With ``broker`` (the broker `up` started), it
    manages each node's broker rights through the server's config. The intervals left
    ``None`` are the orchestrator's settings (``OrchestratorConfig``)."""
    managed = (
        ["--broker-config", str(home / "broker" / "nats.conf"), "--broker-pid", str(broker.pid)]
        + (["--broker-started", repr(broker.started)] if broker.started is not None else [])
        if broker is not None
        else []
    )
    return _spawn(
        _cli(
            "serve-orchestrator",
            "--home",
            str(home),
            "--host",
            host,
            "--port",
            str(port),
            "--token-file",
            str(token_file(home)),
            "--broker-file",
            str(broker_file(home)),
            *_settings(
                central_interval=central_interval_s,
                duplicate_window=duplicate_window_s,
                plan_interval=plan_interval_s,
            ),
            *managed,
        ),
        home / "logs" / "orchestrator.log",
    ).model_copy(update={"url": f"http://{host}:{port}"})


def restart_orchestrator(
    home: Path,
    cluster: ClusterFile,
    central_interval_s: float | None,
    duplicate_window_s: float | None,
    plan_interval_s: float | None,
    timeout_s: float,
    say: Callable[[str], None],
) -> ClusterFile:
    """Start the orchestrator of a cluster whose orchestrator died and whose agents run.

    Same address (the agents and relays know no other), token and broker; the registry on
    disk carries on, and the new orchestrator resolves the operations the dead one left
    unfinished. Returns once it answers (the caller checks the nodes: :func:`_living_heard`);
    nodes that died too are left to it (they are silent, so their PEs are restored).

    Raises:
        Unavailable: The cluster's broker is gone too (``fogshift down`` first), or the
            orchestrator did not answer within ``timeout_s`` (it is stopped again). Once it
            answers it is kept, whatever comes after (a frozen node's PEs are restored
            elsewhere by it; a cluster without its orchestrator has nothing to do so).
    """
    if cluster.broker is not None and not cluster.broker.runs():
        raise Unavailable(
            f"the cluster under {str(home)!r} lost its orchestrator and its broker",
            hint="`fogshift down`, then `fogshift up`",
        )
    assert cluster.orchestrator.url is not None
    host, port = _host_port(cluster.orchestrator.url, 80)
    say("restarting the orchestrator")
    info = start_orchestrator(
        home, host, port, central_interval_s, duplicate_window_s, plan_interval_s,
        cluster.broker,
    )  # fmt: skip
    cluster = cluster.model_copy(update={"orchestrator": info})
    save_cluster(home, cluster)
    try:
        wait_healthy(home, [], timeout_s, say)  # (it answers)
    except BaseException:
        kill_group(info.pgid, signal.SIGKILL)
        raise
    # Kept from here on, whatever ends this `up` (a SIGTERM during a later wait stopped it
    # with what this `up` started, and the pipelines ran on unsupervised).
    _kept(info)
    return cluster


def _silent_now(home: Path, members: list[str]) -> list[str]:
    """Which of ``members`` the cluster's orchestrator has not heard from within its node
    timeout, each with for how long (``[]`` too if it cannot be asked now: this only
    informs)."""
    try:
        with orchestrator_client(home, timeout_s=3) as client:
            views = [NodeView.model_validate(n) for n in client.get("/nodes")]
    except Exception:  # (whatever it is: this only informs a refusal)
        return []
    return [f"{v.name} (silent {v.last_seen_s:.0f} s)" for v in views
            if v.name in members and not v.alive]  # fmt: skip


def _living_heard(
    home: Path, living: list[str], deadline: float, say: Callable[[str], None], started: str
) -> None:
    """After ``started`` (what this `up` started again, for the message): wait until the
    nodes whose processes ran all along (``living``) are healthy to the orchestrator, until
    ``deadline``; kills nothing.

    Raises:
        Unavailable: One stayed silent (frozen, hung): what was started is kept.
    """
    try:
        wait_healthy(home, living, max(1.0, deadline - time.monotonic()), say)
    except Unavailable as exc:
        # (Once, the orchestrator started again was killed here after it had restored that
        # node's PEs, and nodes started again likewise: the pipelines ran on with nothing
        # to supervise them, and every `up` while the node was frozen did the same.)
        raise Unavailable(
            f"{started}, but not every node whose processes run answers: {exc.message}",
            expected=f"nodes {', '.join(living)} healthy",
            received=exc.message,
            hint="a node that runs but does not answer is frozen or hung (`kill -CONT`, or "
            "stop it: the orchestrator restores its PEs elsewhere once it is silent); "
            "`fogshift nodes` shows each node's health",
        ) from None


#: The link profiles of a home's last isolated run (``up --isolate``), by node: a fresh
#: one says which links it starts otherwise (the cluster file goes with `down`, and a plain
#: `up --isolate` after it started every link at n0 without a word).
LAST_LINKS = "last-links.json"


def _say_changed_links(
    home: Path, profiles: dict[str, LinkProfile], say: Callable[[str], None]
) -> None:
    """Warn (``say``) of each node whose link ``profiles`` gives otherwise than the home's
    last isolated run did, then keep these as the last."""
    path = home / LAST_LINKS
    try:
        last = json.loads(path.read_text())
    except (OSError, ValueError):
        last = {}
    now = {name: profile.label() for name, profile in profiles.items()}
    changed = sorted(n for n in now if isinstance(last, dict) and last.get(n, now[n]) != now[n])
    if changed:
        say(
            "warning: this home's last isolated run had the links "
            + ", ".join(f"{n}={last[n]}" for n in changed)
            + "; this one starts them as "
            + ", ".join(f"{n}={now[n]}" for n in changed)
            + " (give --link NODE=PROFILE to set them as before)"
        )
    path.write_text(json.dumps(now, sort_keys=True) + "\n")


def _up_again(cluster: ClusterFile, more: str = "") -> str:
    """The `fogshift up` that starts ``cluster`` again as it was started: its nodes (and
    ``more``), and if isolated, ``--isolate`` with each link's profile (a fresh `up` makes
    namespaces and links anew, from its own arguments only)."""
    command = f"fogshift up --nodes {','.join(cluster.members)}{more}"
    if not cluster.network:
        return command
    links = [
        f" --link {name}={node.link.profile.label()}"
        for name, node in sorted(cluster.network.items())
        if node.link.profile != LinkProfile()
    ]
    return command + " --isolate" + "".join(links)


def restart_nodes(
    home: Path,
    cluster: ClusterFile,
    nodes: list[str],
    timeout_s: float,
    say: Callable[[str], None],
) -> ClusterFile:
    """Start the agents of ``nodes`` (dead members of a running cluster) again.

    Each starts with the command ``up`` started it with (same port, home, token and
    broker user), so the orchestrator finds it where it was; the PEs it hosted were
    restored elsewhere or are restarted by the reconciler, and an instance the node still
    remembers is fenced. Returns once every node of the cluster is healthy again.

    Raises:
        InvalidInput: A node runs isolated (its namespace and relay are not restarted here),
            or was started by an older fogshift that did not record its command.
        Unavailable: A node did not become healthy within ``timeout_s`` (it is stopped
            again).
    """
    fresh = dict(cluster.nodes)
    for name in nodes:
        info = cluster.nodes[name]
        if name in cluster.network or not info.argv:
            raise InvalidInput(
                f"node {name!r} of the cluster under {str(home)!r} died and cannot be "
                "started alone",
                expected="a node started without --isolate by this version of `fogshift up`",
                received="an isolated node" if name in cluster.network else "no start command",
                # (A plain `up` after `down` brought the cluster back without isolation.)
                hint=f"`fogshift down`, then `{_up_again(cluster)}`",
            )
    started: list[str] = []
    try:
        for k, name in enumerate(nodes):
            if k and k % STARTING_AT_ONCE == 0:
                wait_healthy(home, started, timeout_s, say, _pids(fresh, started))
            say(f"restarting node agent {name}")
            info = cluster.nodes[name]
            if not info.foreign():
                # What is left of its dead agent's group (its JVM): the file records only
                # the new group from here on, and `down` could not reach it any more.
                kill_group(info.pgid, signal.SIGKILL)
            fresh[name] = _spawn(list(info.argv), home / "logs" / f"node-{name}.log").model_copy(
                update={"url": info.url}
            )
            started.append(name)
            save_cluster(home, cluster.model_copy(update={"nodes": fresh}))
        cluster = cluster.model_copy(update={"nodes": fresh})
        # (The restarted nodes only: waiting for every member, a frozen one made `up` kill
        # the nodes it had just started again, after its whole --timeout; `add_nodes` waits
        # for its own likewise. The others are checked by the caller, killing nothing.)
        wait_healthy(home, started, timeout_s, say, _pids(fresh, started))
    except BaseException:
        for name in started:
            kill_group(fresh[name].pgid, signal.SIGKILL)
        raise
    _kept(*(fresh[name] for name in started))
    return cluster


def _check_addable(home: Path, cluster: ClusterFile, nodes: list[str], isolate: bool) -> None:
    """Refuse adding ``nodes`` to the cluster under ``home`` before anything starts.

    Raises:
        InvalidInput: The cluster (or this `up`) is isolated: a new node would need a
            namespace, a link and a relay of its own; or no node of the cluster records the
            command it was started with (an older fogshift's), which a new node copies.
    """
    named = ", ".join(nodes)
    if isolate or cluster.network:
        raise InvalidInput(
            f"cannot add {named} to the isolated cluster under {str(home)!r}",
            expected="a cluster started without --isolate (a running one takes new nodes)",
            received="--isolate" if isolate and not cluster.network else "an isolated cluster",
            hint="`fogshift down` (pipelines, checkpoints and outputs are kept), then "
            f"`fogshift up --isolate --nodes` with {named} among the nodes",
        )
    if not any(info.argv for info in cluster.nodes.values()):
        raise InvalidInput(
            f"cannot add {named} to the cluster under {str(home)!r}: a new node is started "
            "as its others were, and none records how",
            expected="a cluster started by this version of `fogshift up`",
            received="nodes with no start command recorded",
            hint="`fogshift down`, then `fogshift up` with every node",
        )


def add_nodes(
    home: Path,
    cluster: ClusterFile,
    nodes: list[str],
    timeout_s: float,
    say: Callable[[str], None],
) -> ClusterFile:
    """Start ``nodes`` (names the cluster lacks) as new members of the running cluster.

    Each gets what `up` gives a node: its token (0600), a broker user of its own with no
    rights until the orchestrator places a PE there (the broker `up` started; an external
    broker's credentials otherwise, as its other nodes have), and an agent started as the
    cluster's first node was (its host, orchestrator and settings). The orchestrator
    registers a node on its first heartbeat; from then on deploys, migrations, restores and
    the planner may place PEs on it. Returns once every new node is healthy.

    Raises:
        InvalidInput: As :func:`_check_addable`.
        BrokerError: The broker's users could not be added (nothing was started).
        Unavailable: A new node did not become healthy within ``timeout_s``: the new nodes
            are stopped and left out of the cluster (their broker users, with no rights,
            stay for a next try).
    """
    template = next(info.argv for info in cluster.nodes.values() if info.argv)
    _, token = load_cluster(home)
    if cluster.broker is not None:
        seeds = add_node_users(
            home / "broker" / "nats.conf", cluster.broker.pid, nodes, cluster.broker.started
        )
        addresses = {n: node_address(cluster.broker_url, n, seeds[n]) for n in nodes}
    else:
        shared = BrokerAddress.load(broker_file(home))
        addresses = dict.fromkeys(nodes, shared)
    # Admitted first: a name removed before is in its next generation, which its token is of.
    generations = _admit(home, nodes)
    for name in nodes:
        addresses[name].save(node_broker_file(home, name))
        write_private(node_token_file(home, name), node_token(token, name, generations[name]))
    host = _flag(template, "--host")
    fresh = dict(cluster.nodes)
    started: list[str] = []
    try:
        for k, name in enumerate(nodes):
            if k and k % STARTING_AT_ONCE == 0:
                wait_agents_ready(home, {n: fresh[n] for n in started}, timeout_s, say)
            say(f"adding node agent {name}")
            port = free_port(host)
            argv = _with_flags(template, {
                "--name": name,
                "--home": str(home / "nodes" / name),
                "--port": str(port),
                "--token-file": str(node_token_file(home, name)),
                "--broker-file": str(node_broker_file(home, name)),
            })  # fmt: skip
            fresh[name] = _spawn(argv, home / "logs" / f"node-{name}.log").model_copy(
                update={"url": f"http://{host}:{port}"}
            )
            started.append(name)
            # Recorded at once: a `down` meanwhile stops it too.
            save_cluster(home, cluster.model_copy(update={"nodes": fresh}))
        # The new nodes only: a sick node of the cluster is not theirs to fail on.
        wait_healthy(home, started, timeout_s, say, _pids(fresh, started))
        if cluster.broker is not None:
            # Again, now that any grant begun before the users were saved has ended: an
            # orchestrator older than the config's lock (upgraded in place, still running)
            # may have written the config from the users it read before, without theirs.
            add_node_users(home / "broker" / "nats.conf", cluster.broker.pid, nodes,
                           cluster.broker.started)  # fmt: skip
    except BaseException:
        for name in started:
            kill_group(fresh[name].pgid, signal.SIGKILL)
        save_cluster(home, cluster)
        raise
    _kept(*(fresh[name] for name in started))
    return cluster.model_copy(update={"nodes": fresh})


def _admit_in_registry(home: Path, nodes: list[str]) -> dict[str, int]:
    """:func:`_admit` for an orchestrator that does not run yet: in its registry."""
    if not (home / "orchestrator.db").exists():
        return dict.fromkeys(nodes, 0)
    registry = Registry(home / "orchestrator.db")
    try:
        return {name: registry.admit_node(name) for name in nodes}
    finally:
        registry.close()


def _admit(home: Path, nodes: list[str]) -> dict[str, int]:
    """Have the orchestrator take ``nodes`` again if they were removed from the cluster
    (:func:`remove_nodes`): their heartbeats and tokens were refused. Returns each node's
    generation, which its token must be of (``common.http.node_token``)."""
    generations: dict[str, int] = {}
    with orchestrator_client(home, timeout_s=30) as client:
        for name in nodes:
            answer = client.post(f"/nodes/{name}/admit")
            generations[name] = NodeAdmission.model_validate(answer).generation
    return generations


def _flag(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _with_flags(argv: tuple[str, ...], values: Mapping[str, str]) -> list[str]:
    """``argv`` with the value after each flag in ``values`` replaced."""
    out = list(argv)
    for flag, value in values.items():
        out[out.index(flag) + 1] = value
    return out


def _pids(infos: Mapping[str, ProcessInfo], names: list[str]) -> dict[str, int]:
    return {name: infos[name].pid for name in names}


def wait_agents_ready(
    home: Path, agents: dict[str, ProcessInfo], timeout_s: float, say: Callable[[str], None]
) -> None:
    """Wait until each agent in ``agents`` (name: process) says its Spark session is ready,
    asking the agents themselves (with each node's token): no orchestrator is needed.

    Raises:
        Unavailable: An agent reported that its session failed, or one was not ready within
            ``timeout_s``.
    """
    clients = {}
    for name, info in agents.items():
        token = node_token_file(home, name).read_text().strip()
        clients[name] = ServiceClient(str(info.url), token, f"node agent {name!r}", timeout_s=5)
    waiting = set(clients)

    def ready() -> bool:
        _check_ended()
        for name in sorted(waiting):
            try:
                health = clients[name].call(AgentHealth, "GET", "/health")
            except Unavailable:  # still starting its web server, unless it has exited
                if not agents[name].runs():
                    raise Unavailable(
                        f"node {name!r}'s agent exited while starting"
                        + _last_line(home / "logs" / f"node-{name}.log"),
                        hint=f"see its log, {home / 'logs' / f'node-{name}.log'}",
                    ) from None
                continue
            if health.error:
                raise Unavailable(f"node {name!r} failed to start: {health.error}")
            if health.ready:
                waiting.discard(name)
        if waiting:
            say("waiting for Spark on " + ", ".join(sorted(waiting)))
        return not waiting

    try:
        wait_until(ready, timeout_s, interval_s=0.3, describe="ready agents")
    except WaitTimedOut:
        raise Unavailable(
            f"node agents {sorted(waiting)} under {str(home)!r} had no Spark session after "
            f"{timeout_s:.0f} s",
            hint=f"see the logs in {home / 'logs'}",
        ) from None
    finally:
        for client in clients.values():
            client.close()


def _last_line(log: Path) -> str:
    """``": "`` and the last line of ``log`` that is not empty, or ``""``."""
    try:
        with log.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
            lines = [x for x in file.read().decode("utf-8", "replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return f": {lines[-1].strip()[:500]}" if lines else ""


def wait_healthy(
    home: Path,
    nodes: list[str],
    timeout_s: float,
    say: Callable[[str], None],
    pids: Mapping[str, int] | None = None,
) -> list[NodeView]:
    """Wait until the orchestrator reports every node in ``nodes`` healthy; every node it
    reports then.

    Args:
        pids: Nodes just started again, by the pid of their new agent: each counts only once
            the orchestrator heard from that process. The dead agent's last heartbeat keeps
            a node "healthy" for up to the orchestrator's node timeout after a kill.
    """
    pids = pids or {}
    client = orchestrator_client(home, timeout_s=5)
    last: Any = None
    healthy: list[NodeView] = []

    def all_healthy() -> bool:
        nonlocal last, healthy
        _check_ended()
        try:
            views = [NodeView.model_validate(n) for n in client.get("/nodes")]
        except Unavailable as exc:  # the orchestrator is still starting
            last = exc
            return False
        reports = {view.name: view for view in views}
        errors = [f"{n}: {reports[n].error}" for n in nodes if n in reports and reports[n].error]
        if errors:
            raise Unavailable("node failed to start: " + "; ".join(errors))
        waiting = [
            n
            for n in nodes
            if n not in reports
            or not reports[n].healthy
            or (n in pids and reports[n].pid != pids[n])
        ]
        if not waiting:
            healthy = list(reports.values())  # may be empty: no node to wait for
            return True
        say("waiting for Spark on " + ", ".join(waiting))
        last = waiting
        return False

    try:
        wait_until(all_healthy, timeout_s, interval_s=0.3, describe="healthy nodes")
        return healthy
    except WaitTimedOut:
        raise Unavailable(
            f"the cluster under {str(home)!r} did not become healthy in {timeout_s:.0f} s "
            f"(still waiting for: {last})",
            hint=f"see the logs in {home / 'logs'}",
        ) from None
    finally:
        client.close()


def kill_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a whole process group, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _stop_tier(tier: dict[str, ProcessInfo], grace_s: float) -> list[str]:
    """SIGTERM each leader of ``tier``, SIGKILL their groups after ``grace_s`` (at once if
    the leaders are gone before), then give the groups up to 5 s more to disappear; the
    labels of those whose leader still ran at the SIGKILL (frozen or hung: a SIGSTOPped
    process leaves SIGTERM pending).

    A process whose pid (and group) another process has now is left alone: the services
    lead sessions of their own, and so do many others (another cluster's, a shell's jobs).
    """
    infos = [i for i in tier.values() if not i.foreign()]
    for info in infos:
        if info.runs():
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(WaitTimedOut):  # the stragglers get SIGKILL below
        wait_until(
            lambda: not any(i.runs() for i in infos),
            grace_s,
            interval_s=0.1,
            describe="the leaders of " + ", ".join(tier) + " to exit",
        )
    killed = [label for label, info in tier.items() if not info.foreign() and info.runs()]
    for info in infos:
        kill_group(info.pgid, signal.SIGKILL)
    with contextlib.suppress(WaitTimedOut):
        wait_until(
            lambda: not any(group_alive(i.pgid) for i in infos),
            max(0.0, deadline + 5 - time.monotonic()),
            interval_s=0.05,
            describe="the process groups of " + ", ".join(tier) + " to end",
        )
    return killed


def _check_host(host: str) -> None:
    """Refuse a ``--host`` the orchestrator and the agents could not listen on, before
    anything starts (it failed with a traceback once the broker ran)."""
    try:
        with socket.socket() as probe:  # IPv4, as the services listen
            probe.bind((host, 0))
    except (OSError, UnicodeError) as exc:
        raise InvalidInput(
            f"cannot listen on host {host!r}",
            expected="an IPv4 address or name of this machine (default 127.0.0.1)",
            received=f"{host!r}: {exc.strerror or exc}" if isinstance(exc, OSError) else host,
            hint="`ip -4 addr` lists this machine's addresses",
        ) from None


def _stop_leftovers(cluster: ClusterFile, grace_s: float = 5) -> None:
    """Stop whatever still runs of a cluster whose orchestrator and nodes are dead."""
    for tier in (
        {"orchestrator": cluster.orchestrator},
        {f"node {n}": p for n, p in cluster.nodes.items()},
        {f"relay {n}": i.relay for n, i in cluster.network.items()},
        {"broker": cluster.broker} if cluster.broker is not None else {},
    ):
        _stop_tier(tier, grace_s)


class Stopped(NamedTuple):
    """What :func:`down` stopped.

    Attributes:
        stopped: The services and links it stopped, in order.
        gone: Those of them that had stopped before (killed, crashed): nothing of their
            process groups was left to stop.
        killed: Those of them that did not stop within the grace time of SIGTERM (frozen
            or hung), killed with SIGKILL: their PEs stopped without a clean end (their
            checkpoints hold what they committed).
    """

    stopped: list[str]
    gone: list[str]
    killed: list[str] = []


def down(home: Path, grace_s: float = DOWN_GRACE_S) -> Stopped:
    """Stop everything ``up`` started.

    Each service's leader gets SIGTERM (the agents stop their queries cleanly); whatever is
    left of its process group (JVM, Python workers) gets SIGKILL after ``grace_s``.

    Isolated nodes' relays stop after the nodes (which may still talk through them while
    they stop), then their namespaces, veths and routes are removed.

    Returns:
        What was stopped, and which of it had stopped already. The registry, checkpoints
        and outputs stay, so a later ``up`` carries on with the pipelines that were running.

    Raises:
        NetworkCommandFailed: A namespace or veth could not be removed (everything else was
            stopped; the next ``up`` of this home removes the leftovers).
        NotUp: No cluster was started under ``home``.
        AlreadyRunning: Another `up` or `down` of ``home`` runs.
    """
    try:
        load_cluster(home)  # a home without a cluster is refused, and nothing made in it
    except NotUp:
        if (home / CLUSTER_LOCK).exists():
            # A first `up` records its cluster once all of it started (minutes on two
            # cores): "no cluster is up, run `fogshift up`" of one starting read as if
            # nothing ran. Said as the `up` under way it is.
            with exclusive(
                home / CLUSTER_LOCK,
                f"a fogshift up or down of {str(home)!r}",
                hint="a `fogshift up` of this home is starting its cluster: wait for it to "
                "end, then `fogshift down`",
            ):
                pass
        raise
    with exclusive(
        home / CLUSTER_LOCK,
        f"a fogshift up or down of {str(home)!r}",
        hint="wait for the other `fogshift up` or `down` of this home to end",
    ):
        return _down_claimed(home, grace_s)


def remove_nodes(
    home: Path,
    names: list[str],
    say: Callable[[str], None],
    grace_s: float = DOWN_GRACE_S,
    drain: bool = False,
    removed: Callable[[str], None] | None = None,
) -> ClusterFile:
    """Take ``names`` out of the running cluster, one after the other: the orchestrator
    forgets each (refused while it hosts something: nothing changes for it, nor for the
    ones after it), then its agent is stopped as `down` stops one, it leaves the cluster
    file, and its broker user is dropped (the broker `up` started). Its folder (logs,
    checkpoints) stays. `up --nodes` naming every node and it adds it again.

    Args:
        drain: Move each node's PEs of running pipelines away first (:func:`drain_node`);
            without it a node that runs one is refused. A node that something a drain
            does not move would keep anyway is refused before any of its PEs moves.
        removed: Told each node's name once it is out (before a later one is refused,
            the caller can still say what the removed ones left).

    Returns:
        The cluster as it is now.

    Raises:
        InvalidInput: A name is not one of the cluster's nodes, they are all its nodes
            (`down` stops a cluster), or the cluster is isolated (its namespaces and links
            are made and removed whole).
        Unavailable: The orchestrator does not run (it must forget a node before its
            agent stops, or it would restore the node's PEs).
        NodeInUse: (from the orchestrator) A node still hosts a PE, a deployed
            pipeline's spec names it as its standby node, or an unfinished operation names
            it (see ``GET /nodes/{name}/holds``); the nodes before it are removed.
        AlreadyRunning: Another `up` or `down` of ``home`` runs.
    """
    names = list(dict.fromkeys(names))
    load_cluster(home)
    with exclusive(
        home / CLUSTER_LOCK,
        f"a fogshift up or down of {str(home)!r}",
        hint="wait for the other `fogshift up` or `down` of this home to end",
    ):
        cluster, _ = load_cluster(home)
        _check_removable(home, cluster, names)
        for k, name in enumerate(names):
            try:
                # (Marked leaving for the whole drain: emptied, the node became the least
                # busy, the first choice of a restore or a new standby. Looked at before
                # the mark too: marked, the keeper would drop a standby the spec puts
                # there, for a drain then refused.)
                if drain:
                    _refuse_undrainable(home, name)
                with _draining(home, name) if drain else contextlib.nullcontext():
                    if drain:
                        _refuse_undrainable(home, name)
                        drain_node(home, name, set(names), say)
                    say(f"removing node {name}")
                    cluster = _remove_node(home, cluster, name, grace_s)
                if removed is not None:
                    removed(name)
            except FogshiftError as exc:
                if k:  # (said, or the user would take the error for the whole command's)
                    exc.message += f" ({', '.join(names[:k])} removed before it)"
                    exc.args = (exc.render(),)
                raise
        return cluster


def node_holds(home: Path, names: list[str]) -> dict[str, list[NodeHold]]:
    """What keeps each of ``names`` in the running cluster now (``remove-node --dry-run``):
    what its removal would be refused for. Nothing changes.

    Raises:
        InvalidInput, Unavailable: As :func:`remove_nodes` refuses ``names``.
    """
    names = list(dict.fromkeys(names))
    cluster, _ = load_cluster(home)
    _check_removable(home, cluster, names)
    with orchestrator_client(home, timeout_s=30) as client:
        return {name: _holds(client, name) for name in names}


def stopped_on(home: Path, names: list[str]) -> dict[str, list[str]]:
    """The PEs of stopped pipelines placed on each of ``names`` (``pipeline/element``): they
    keep no node (its removal is not refused for them), and `fogshift start` restores them
    on other nodes. Said by ``remove-node``, which would otherwise leave them unmentioned.

    Raises:
        Unavailable: The orchestrator does not answer.
    """
    with orchestrator_client(home, timeout_s=30) as client:
        statuses = [PipelineStatus.model_validate(s) for s in client.get("/pipelines")]
    return {
        name: [f"{s.pipeline}/{e.element}" for s in statuses
               if s.status == PipelineState.STOPPED for e in s.elements if e.node == name]
        for name in names
    }  # fmt: skip


def _holds(client: ServiceClient, name: str) -> list[NodeHold]:
    """What the orchestrator (``client``) says keeps node ``name`` in the cluster."""
    return [NodeHold.model_validate(h) for h in client.get(f"/nodes/{name}/holds")]


#: How long the orchestrator counts a node being drained as leaving after the drain's last
#: renewal (every third of it, by a thread): a drain whose process died ends by itself.
DRAIN_LEASE_S = 60.0


@contextlib.contextmanager
def _draining(home: Path, name: str) -> Iterator[None]:
    """Have the orchestrator count node ``name`` as leaving while the block runs (``PUT
    /nodes/{name}/leaving``: nothing is deployed, restored, promoted, migrated or scaled
    there, no standby started there), renewed by a thread, ended when the block ends.

    Raises:
        UnknownNode: (from the orchestrator) No such node.
    """
    here = f"/nodes/{name}/leaving"
    stop = threading.Event()
    with orchestrator_client(home, timeout_s=30) as client:
        client.put(here, json={"seconds": DRAIN_LEASE_S})

        def renew() -> None:
            while not stop.wait(DRAIN_LEASE_S / 3):
                # (A renewal that fails is tried again; the lease outlasts two of them.)
                with contextlib.suppress(FogshiftError):
                    client.put(here, json={"seconds": DRAIN_LEASE_S})

        renewing = threading.Thread(target=renew, name=f"drain lease of {name}", daemon=True)
        renewing.start()
        try:
            yield
        finally:
            stop.set()
            renewing.join()
            with contextlib.suppress(FogshiftError):  # (it ends by itself otherwise)
                client.put(here, json={"seconds": None})


def _refuse_undrainable(home: Path, name: str) -> None:
    """Refuse, before any PE is moved, to drain node ``name`` when something a drain does
    not move would keep it in the cluster anyway (a PE of a pipeline being deployed or
    stopped, a pipeline whose spec names it as its standby node, an unfinished operation
    naming it): the PEs were moved, then the removal refused.

    Raises:
        NodeInUse: Such a hold (nothing changed).
    """
    with orchestrator_client(home, timeout_s=30) as client:
        kept = [h for h in _holds(client, name) if h.kind != "pe"]
    if kept:
        raise node_in_use(name, kept)


def drain_node(home: Path, name: str, leaving: set[str], say: Callable[[str], None]) -> list[str]:
    """Move every PE that a running pipeline places on node ``name`` away, one migration at
    a time, each as `fogshift migrate` makes it (its default mode; rolled back if the target
    fails); the PEs moved, as ``pipeline/element``. Each goes to its redeploy node in the
    planner's latest plan (its status's ``planned_redeploy``: where a restore would put it,
    chosen for its recovery time) if that node is healthy and stays, else to the healthy
    node outside ``leaving`` that runs the fewest PEs; never to the node of its own hot
    standby, nor a partition to a node running another partition of its element, while
    another node will do (its standby stays warm; partitions stay apart). Standbys are not moved
    here: the orchestrator's removal drops the ones its keeper chose there, which it starts again
    elsewhere; a pipeline whose spec names the node as its standby node
    (``recovery.standby: NODE``) still keeps it.

    Raises:
        Unavailable: No other healthy node to move to.
        FogshiftError: A migration failed (the PE runs where it was; those moved before
            stay moved).
    """
    moved: list[str] = []
    with orchestrator_client(home, timeout_s=OPERATION_TIMEOUT_S) as client:
        while True:  # one at a time: each move changes how busy the nodes are
            running = [
                status for status in map(PipelineStatus.model_validate, client.get("/pipelines"))
                if status.status == PipelineState.RUNNING
            ]  # fmt: skip
            here_planned = {f"{s.pipeline}/{e.element}": (e.planned_redeploy,
                                                          e.standby and e.standby.node)
                            for s in running for e in s.elements if e.node == name}  # fmt: skip
            here = list(here_planned)
            if not here:
                return moved
            if here[0] in moved:  # (it migrated, yet is placed there: never loop on it)
                raise InvariantViolation(
                    f"{here[0]} is still placed on node {name!r} after it was moved away"
                )
            busy = Counter(e.node for s in running for e in s.elements)
            targets = [n.name for n in map(NodeView.model_validate, client.get("/nodes"))
                       if n.healthy and n.name not in leaving]  # fmt: skip
            if not targets:
                raise Unavailable(
                    f"no healthy node to move {', '.join(here)} to from node {name!r}",
                    hint="`fogshift nodes` shows node health; `fogshift up --nodes` adds one",
                )
            pipeline, element = here[0].split("/", 1)
            planned, warm = here_planned[here[0]]
            # (Not onto the node of the PE's own standby while another will do: the
            # migration drops that standby and the keeper starts it again elsewhere, a
            # warm copy and a query start for nothing, the PE without one meanwhile. With
            # `standby: planned` that node is the planned one.)
            fits = [n for n in targets if n != warm] or targets
            # (Nor onto a node running another partition of its element while another will
            # do: two partitions on one node split no work, and a key move `--to` that node
            # is refused as ambiguous.)
            status = next(s for s in running if s.pipeline == pipeline)
            this = next(e for e in status.elements if e.element == element)
            siblings = {e.node for e in status.elements
                        if this.partition_of is not None and e.element != element
                        and e.partition_of == this.partition_of}  # fmt: skip
            fits = [n for n in fits if n not in siblings] or fits
            target = planned if planned in fits else min(fits, key=lambda n: (busy[n], n))
            say(f"moving {here[0]} from {name} to {target}")
            client.post(f"/pipelines/{pipeline}/elements/{element}/migrate",
                        json={"target": target})  # fmt: skip
            moved.append(here[0])


def _remove_node(
    home: Path, cluster: ClusterFile, name: str, grace_s: float,
    timeout_s: float = OPERATION_TIMEOUT_S,
) -> ClusterFile:  # fmt: skip
    """One node of :func:`remove_nodes`. Marked ``removing`` in the cluster file first:
    one cut short (a crash, ^C) is finished by the next `up` or `remove-node`, and until
    then `up` does not wait for it (its heartbeats are refused). ``timeout_s``: how long
    the orchestrator's answer is waited for."""
    before = cluster
    cluster = cluster.model_copy(update={"removing": (*cluster.removing, name)})
    save_cluster(home, cluster)
    try:
        with orchestrator_client(home, timeout_s=timeout_s) as client:
            client.delete(f"/nodes/{name}")
    except Conflict:  # refused (it hosts something): nothing changed, nothing to finish
        save_cluster(home, before.model_copy(update={
            "removing": tuple(n for n in before.removing if n != name)
        }))  # fmt: skip
        raise
    _stop_tier({f"node {name}": cluster.nodes[name]}, grace_s)
    if cluster.broker is not None:
        # Before it leaves the cluster file: a failure here leaves it there, to try again.
        remove_node_users(home / "broker" / "nats.conf", cluster.broker.pid, [name],
                          cluster.broker.started)  # fmt: skip
    cluster = cluster.model_copy(update={
        "nodes": {n: p for n, p in cluster.nodes.items() if n != name},
        "removing": tuple(n for n in cluster.removing if n != name),
    })  # fmt: skip
    save_cluster(home, cluster)
    return cluster


def _finish_removals(
    home: Path, cluster: ClusterFile, say: Callable[[str], None], timeout_s: float
) -> ClusterFile:
    """Finish the removals a `remove-node` cut short (see :func:`_remove_node`), each
    waiting for the orchestrator at most ``timeout_s`` (`up`'s --timeout: a frozen
    orchestrator held `up`, and the home's lock, for the 30 minutes an operation may take).
    One the orchestrator does not answer stays marked, for the next `up`."""
    for name in cluster.removing:
        say(f"finishing the removal of node {name}")
        try:
            cluster = _remove_node(home, cluster, name, DOWN_GRACE_S, timeout_s)
        except Conflict as exc:  # (cut short before the orchestrator took it: it stays)
            say(f"node {name} stays in the cluster: {exc.message}")
            cluster, _ = load_cluster(home)
        except Unavailable as exc:  # (no answer in time: NoAnswer is one)
            say(f"the removal of node {name} is finished by a later `up`: {exc.message}")
            cluster, _ = load_cluster(home)
    return cluster


def _check_removable(home: Path, cluster: ClusterFile, names: list[str]) -> None:
    """Refuse, before anything changes, what :func:`remove_nodes` cannot do."""
    have = ", ".join(cluster.nodes)
    unknown = [n for n in names if n not in cluster.nodes]
    if unknown:
        raise UnknownNode(  # (as `migrate --to` and `scale --on` name a node not there: exit 1)
            f"cannot remove {', '.join(unknown)} from the cluster under {str(home)!r}: not "
            "one of its nodes",
            expected=f"one or more of {have}",
            received=", ".join(names),
            hint="`fogshift nodes` lists the cluster's nodes",
        )
    if len(names) >= len(cluster.nodes):
        raise InvalidInput(
            f"cannot remove every node of the cluster under {str(home)!r}",
            expected=f"some of {have}, not all",
            received=", ".join(names),
            hint="`fogshift down` stops the whole cluster (pipelines, checkpoints and "
            "outputs are kept)",
        )
    if cluster.network:
        raise InvalidInput(
            f"cannot remove {', '.join(names)} from the isolated cluster under {str(home)!r}: "
            "its namespaces, links and relays are made and removed whole",
            expected="a cluster started without --isolate",
            received="--isolate",
            hint="`fogshift down`, then `fogshift up --isolate` with the nodes to keep",
        )
    if not cluster.orchestrator.runs():
        raise Unavailable(
            f"the orchestrator of the cluster under {str(home)!r} is not running: it must "
            "forget a node before its agent stops (or it would restore the node's PEs)",
            hint="`fogshift up` starts it again, then remove the node",
        )


def _down_claimed(home: Path, grace_s: float) -> Stopped:
    """:func:`down`'s work once it holds the home's claim."""
    cluster, _ = load_cluster(home)
    # The orchestrator first: it must not take stopping nodes for lost ones and restore them.
    tiers: list[dict[str, ProcessInfo]] = [
        {"orchestrator": cluster.orchestrator},
        {f"node {n}": p for n, p in cluster.nodes.items()},
    ]
    if cluster.network:
        tiers.append({f"relay {n}": i.relay for n, i in cluster.network.items()})
    if cluster.broker is not None:
        tiers.append({"broker": cluster.broker})
    # Then the nodes (they stop their queries cleanly), then the broker.
    gone = [
        label
        for tier in tiers
        for label, info in tier.items()
        if info.foreign() or not (info.runs() or group_alive(info.pgid))
    ]
    killed = [label for tier in tiers for label in _stop_tier(tier, grace_s)]
    failures: list[NetworkCommandFailed] = []
    for isolated in cluster.network.values():
        try:
            destroy_link(isolated.link)
        except NetworkCommandFailed as exc:
            failures.append(exc)
    cluster_file(home).unlink(missing_ok=True)
    if failures:
        raise NetworkCommandFailed(
            f"stopped the cluster under {str(home)!r}, but {len(failures)} link(s) remain",
            received="; ".join(f.render() for f in failures),
            hint="the next `fogshift up --isolate` of this home removes them",
        )
    stopped = [label for tier in tiers for label in tier]
    return Stopped(stopped + [f"network {n}" for n in cluster.network], gone, killed)


# -- isolated nodes' links -----------------------------------------------------------------


def isolated_node(home: Path, node: str) -> IsolatedNode:
    """Node ``node``'s link and relay in the cluster under ``home``.

    Raises:
        NotUp: No cluster runs there.
        NotIsolated: The cluster was not started with ``--isolate``.
        UnknownNode: It has no node ``node``.
    """
    cluster, _ = load_cluster(home)
    if not cluster.network:
        raise NotIsolated(
            f"the cluster under {str(home)!r} runs its nodes without isolation: they have no "
            "links to partition or measure",
            expected="a cluster started with --isolate",
            received="nodes without isolation",
            hint="`fogshift down`, then `fogshift up --isolate`",
        )
    if node not in cluster.network:
        # (A name not there is the user's typo, not the cluster's lack of isolation: exit
        # 1 and `unknown_node`, as `remove-node` and `migrate --to` say it.)
        raise UnknownNode(
            f"no isolated node {node!r} in the cluster under {str(home)!r}",
            expected="one of " + ", ".join(cluster.network),
            received=repr(node),
            hint="`fogshift nodes` lists the nodes",
        )
    return cluster.network[node]


def partition(home: Path, node: str) -> NodeLink:
    """Cut node ``node`` off: its link drops every packet until :func:`heal`.

    The node keeps running (unlike a SIGSTOP): its connections stall, its heartbeats stop
    arriving, and the orchestrator's requests to it fail.
    """
    link = isolated_node(home, node).link
    set_link(link, up=False)
    return link


def heal(home: Path, node: str) -> NodeLink:
    """Restore node ``node``'s link after :func:`partition`."""
    link = isolated_node(home, node).link
    set_link(link, up=True)
    return link


def node_rtt(home: Path, node: str, samples: int = 5, timeout_s: float = 5.0) -> RttReport:
    """The round-trip time node ``node``'s link gives now: relay delay both ways, veth, tbf.

    Raises:
        LinkDown: The link is partitioned or its relay is gone.
        NotUp / NotIsolated / UnknownNode: See :func:`isolated_node`.
    """
    isolated = isolated_node(home, node)
    host, port = isolated.routes["echo"]
    return measure_rtt(host, port, samples, timeout_s, what=f"the link of node {node!r}")


def network_status(home: Path, samples: int = 5, timeout_s: float = 3.0) -> list[dict[str, Any]]:
    """Per isolated node: namespace, addresses, profile, link state, relay, measured RTT.

    A link that is down, or whose RTT cannot be measured, has ``rtt`` ``None`` and the
    reason in ``rtt_error``.
    """
    cluster, _ = load_cluster(home)
    if not cluster.network:
        isolated_node(home, "")  # raises NotIsolated with the explanation
    rows = []
    for name, isolated in cluster.network.items():
        link = isolated.link
        state = link_state(link)
        rtt: RttReport | None = None
        error: str | None = None
        if state != "up":
            error = "partitioned" if state == "down" else "the link does not exist"
        else:
            try:
                rtt = node_rtt(home, name, samples, timeout_s)
            except FogshiftError as exc:
                error = exc.message
        rows.append(
            {
                "node": name,
                "namespace": link.namespace,
                "host_if": link.host_if,
                "host_ip": link.host_ip,
                "ns_ip": link.ns_ip,
                "profile": link.profile.label(),
                "bandwidth": link.profile.bandwidth,
                "delay_mean_ms": link.profile.mean_ms,
                "delay_sd_ms": link.profile.sd_ms,
                "link": state,
                "relay_pid": isolated.relay.pid,
                "relay_alive": isolated.relay.runs(),
                "rtt": rtt.model_dump() if rtt else None,
                "rtt_error": error,
            }
        )
    return rows
