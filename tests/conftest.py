"""Shared fixtures: real nats-server, real local clusters (agents as separate processes)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Collection, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import psutil
import pytest
from filelock import FileLock

from fogshift.broker.client import BrokerAddress, SyncJetStream
from fogshift.broker.server import BrokerProcess, start_nats_server
from fogshift.common import waiting
from fogshift.common.processes import leads
from fogshift.supervisor.cluster import group_alive, orchestrator_client

ROOT = Path(__file__).resolve().parent.parent


#: Where to append one JSON line per test (wall clock and the machine's busy and idle CPU
#: seconds over its setup, call and teardown), to tell a test that waits from one that
#: computes; unset: nothing is recorded.
PROFILE = os.environ.get("FOGSHIFT_TEST_PROFILE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not PROFILE:
        yield
        return
    started, before = time.monotonic(), psutil.cpu_times()
    yield
    after = psutil.cpu_times()
    idle = (after.idle - before.idle) + (after.iowait - before.iowait)
    total = sum(after) - sum(before)
    record = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - started, 2),
        "busy_cpu_s": round(total - idle, 2),
        "idle_cpu_s": round(idle, 2),
        "cores": psutil.cpu_count(),
        # When it ended, and on which worker: how evenly the workers' queues ran out.
        "ended": round(time.time(), 1),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    _profiled(record)


def _profiled(record: dict[str, Any]) -> None:
    """Append ``record`` to :data:`PROFILE` as one JSON line."""
    assert PROFILE is not None
    with open(PROFILE, "a") as out:
        out.write(json.dumps(record) + "\n")


#: Phases shorter than this are not recorded: only the waits and operations a test's wall
#: clock could be looked for in.
PHASE_MIN_S = 1.0


@contextmanager
def phase(what: str) -> Iterator[None]:
    """Record (with :data:`PROFILE`) how long ``what`` took within the running test: one
    JSON line with a ``phase`` key (``scripts/test_profile.py --phases`` lists the longest)."""
    if not PROFILE:
        yield
        return
    started = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - started
        if took >= PHASE_MIN_S:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
            _profiled({"phase": what, "test": test, "wall_s": round(took, 2)})


if PROFILE:
    # Every wait of a test module (imported after this file) is a phase, named by what it
    # waits for.
    _wait_until = waiting.wait_until

    def _timed_wait_until(condition: Any, timeout_s: float, **kwargs: Any) -> Any:
        with phase(f"wait: {kwargs.get('describe', '?')}"):
            return _wait_until(condition, timeout_s, **kwargs)

    waiting.wait_until = _timed_wait_until  # type: ignore[assignment]


#: Held through a module with a test marked ``root``: those create network namespaces, veth
#: pairs and `tc` qdiscs, whose names are machine-wide (and `fogshift up --isolate` removes
#: stale ones), so under `make test`'s three workers (``-n 3 --dist loadfile``: a module runs
#: whole on one worker, with its own session broker and shared cluster) one runs at a time.
MACHINE_WIDE_LOCK = Path(tempfile.gettempdir()) / "fogshift-tests-machine-wide.lock"
_ROOT_MODULES = pytest.StashKey[set[Path]]()


#: Each long module's wall clock in a recent run (``scripts/test_profile.py --write-seconds``):
#: only the order modules run in depends on it.
MODULE_SECONDS = ROOT / "tests" / "module_seconds.json"
#: What a module missing from :data:`MODULE_SECONDS` is taken to last: an integration one
#: starts real processes, anything else is quick.
UNKNOWN_INTEGRATION_S, UNKNOWN_S = 30.0, 0.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules longest first, each module's tests in their order: a worker takes the next
    module when it is free (``--dist loadfile --no-loadscope-reorder``; xdist's own reorder
    puts the modules with most tests first, which left a 90 s module with one test for the
    end), so the long ones start early and the short unit modules fill the end instead of
    one worker finishing a long module alone."""
    integration = {item.path for item in items if item.get_closest_marker("integration")}
    config.stash[_ROOT_MODULES] = {item.path for item in items if item.get_closest_marker("root")}
    recorded = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.is_file() else {}

    def seconds(item: pytest.Item) -> float:
        default = UNKNOWN_INTEGRATION_S if item.path in integration else UNKNOWN_S
        return float(recorded.get(item.path.relative_to(ROOT).as_posix(), default))

    # A stable sort of adjacent tests: modules stay whole and keep their order.
    items.sort(key=lambda item: -seconds(item))


@pytest.fixture(scope="module", autouse=True)
def machine_wide(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hold :data:`MACHINE_WIDE_LOCK` through a module with a test marked ``root``."""
    if request.path not in request.config.stash.get(_ROOT_MODULES, set()):
        yield
        return
    with FileLock(MACHINE_WIDE_LOCK):
        yield


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A real nats-server with JetStream on a free port and its own store dir."""
    broker = start_nats_server(tmp_path_factory.mktemp("nats"))
    yield broker
    os.killpg(broker.pid, signal.SIGKILL)


@pytest.fixture()
def js_client(nats_server: BrokerProcess) -> Iterator[SyncJetStream]:
    client = SyncJetStream(nats_server.address)
    yield client
    client.close()


def answer_json(handler: BaseHTTPRequestHandler, data: object, status: int = 200) -> None:
    """Answer a stand-in HTTP server's request with ``data`` as JSON."""
    body = json.dumps(data).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def fogshift(
    *args: str, check: bool = True, timeout: float = 400, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (in ``env``, else this process's environment)."""
    proc = subprocess.run(
        [sys.executable, "-m", "fogshift.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    return _checked(proc, args, check)


def _checked(
    proc: subprocess.CompletedProcess, args: tuple[str, ...], check: bool
) -> subprocess.CompletedProcess:
    """``proc`` (`fogshift ARGS`); with ``check``, an AssertionError with its output if it
    failed."""
    if check and proc.returncode != 0:
        raise AssertionError(
            f"fogshift {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


#: CLI commands :meth:`Cluster.cli` runs in this process: they only talk to a cluster and
#: print. A subprocess costs ~0.7 s of CPU to import the CLI again, some ninety times a
#: run; the commands' own path (arguments, client, exit codes, messages) is the same, and
#: `fogshift` as a process is tested on its own (tests/cli). A command that starts processes
#: (`up`, `net`, `bench`, `demo`, `dashboard`) stays a subprocess: its children must not be
#: this process's, which would have to reap them (a killed node would linger as a zombie).
IN_PROCESS = frozenset({"deploy", "stop", "start", "migrate", "restore", "status", "nodes",
                        "errors", "plan", "topology", "validate", "down", "state",
                        "events"})  # fmt: skip
_in_process = threading.Lock()


def fogshift_in_process(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real CLI's entry point (:func:`fogshift.cli.main.main`) in this process, with
    its output captured: what :func:`fogshift` returns, without starting an interpreter."""
    from fogshift.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    # The standard streams are the process's: one command at a time.
    with _in_process, redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
        except Exception:  # what an uncaught exception does to the process: a traceback, 1
            traceback.print_exc()
            code = 1
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    proc = subprocess.CompletedProcess(["fogshift", *args], returncode, out.getvalue(),
                                       err.getvalue())  # fmt: skip
    return _checked(proc, args, check)


class Cluster:
    """A local cluster started with `fogshift up` under a temp home.

    Reads (status, nodes, dead letters) go to the orchestrator's REST API from this process;
    commands that change something go through the real CLI (:data:`IN_PROCESS`).
    """

    def __init__(self, home: Path, nodes: list[str], up_args: tuple[str, ...] = ()) -> None:
        self.home = home
        self.nodes = nodes
        self.up_args = up_args
        #: The nodes `up` added to the running cluster since it was last started whole.
        self.joined: set[str] = set()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        run = fogshift_in_process if args[0] in IN_PROCESS else fogshift
        with phase(f"cli: {args[0]}"):
            return run(*args, "--home", str(self.home), check=check)

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` of the orchestrator (with the operator token)."""
        with orchestrator_client(self.home, timeout_s=30) as client:
            return client.get(path, params=params or None)

    def json(self, *args: str) -> Any:
        """What `fogshift ARGS --json` prints; reads are asked of the orchestrator directly."""
        command, *rest = args
        if command == "status":
            return self.get(f"/pipelines/{rest[0]}") if rest else self.get("/pipelines")
        if command == "nodes" and not rest:
            return self.get("/nodes")
        if command == "errors" and rest:
            limit = rest[rest.index("--limit") + 1] if "--limit" in rest else "100"
            return self.get(f"/pipelines/{rest[0]}/errors", limit=int(limit))
        return json.loads(self.cli(*args, "--json").stdout)

    @property
    def pause_file(self) -> Path:
        """Where this cluster's orchestrators read their test pause point from
        (``FOGSHIFT_TEST_PAUSE_FILE``; tests/integration/control.py writes it)."""
        return self.home / "test-pause-at"

    def up_env(self) -> dict[str, str]:
        """The environment `fogshift up` starts the cluster's services in: nodes without the
        warm-up (``FOGSHIFT_WARM_UP``: ~6 s of CPU at each of the suite's ~30 node starts,
        for a first query's latency no test here times; a soak's cluster runs it, and
        tests/runtime/test_engine_lifecycle.py tests it)."""
        env = {k: v for k, v in os.environ.items() if k != "FOGSHIFT_TEST_PAUSE_AT"}
        return {
            **env,
            "FOGSHIFT_TEST_PAUSE_FILE": str(self.pause_file),
            "FOGSHIFT_WARM_UP": "false",
        }

    def up(self, nodes: Collection[str] | None = None) -> set[str]:
        """`fogshift up` of ``nodes`` (default: all the cluster's): on a running cluster,
        what died is started again and a node it lacks is added; the nodes it added."""
        broker = self._broker_pid()
        with phase("cluster: up " + ",".join(nodes or self.nodes)):
            out = fogshift("up", "--nodes", ",".join(nodes or self.nodes), *self.up_args,
                           "--home", str(self.home), env=self.up_env()).stdout  # fmt: skip
        if self._broker_pid() != broker:  # started whole (again): every node as at first
            self.joined = set()
        # (Rich wraps the line at the terminal's width: words, not lines.)
        found = re.search(r"\(([^()]+) added to the running cluster\)", " ".join(out.split()))
        added = set(found.group(1).split(", ")) if found else set()
        self.joined |= added
        return added

    def _broker_pid(self) -> int | None:
        path = self.home / "cluster.json"
        broker = json.loads(path.read_text())["broker"] if path.exists() else None
        return broker["pid"] if broker else None

    def down(self) -> None:
        if (self.home / "cluster.json").exists():
            self.cli("down")

    def heal(self, needs: Collection[str] | None = None) -> None:
        """Start again whatever of the cluster a test killed (`fogshift up` starts only what
        died, judged as here: by pid and group, since pids are given again) — unless only
        nodes outside ``needs`` (``None``: every node) died: a node start costs ~12 s of
        CPU (its agent, zygote and JVM), and the next module that needs it starts it. A
        needed node the cluster lacks (the shared cluster starts without its last) is added."""
        data = json.loads((self.home / "cluster.json").read_text())
        needed = [n for n in self.nodes if needs is None or n in needs]
        missing = [n for n in needed if n not in data["nodes"]]
        wanted = [s for name, s in data["nodes"].items() if name in needed]
        services = [data["orchestrator"], *([data["broker"]] if data["broker"] else []), *wanted]
        # What died first, with the nodes the cluster has: over a dead broker `up` starts it
        # again whole, with its own nodes only (it refuses others); then what it lacks.
        if not all(leads(s["pid"], s["pgid"]) for s in services):
            self.up(list(data["nodes"]))
        if missing:
            self.up([*data["nodes"], *missing])

    def stop_all(self) -> None:
        """Stop every running pipeline (outputs stay), so the next module starts quiet."""
        for pipeline in self.json("status"):
            if pipeline["status"] != "stopped":
                self.cli("stop", pipeline["pipeline"], check=False)

    def status(self, pipeline: str) -> dict[str, Any]:
        return dict(self.json("status", pipeline))

    def node(self, name: str) -> dict[str, Any]:
        """Node ``name`` as `fogshift nodes --json` reports it."""
        return next(n for n in self.json("nodes") if n["name"] == name)

    def hosts(self, name: str, pe: str) -> bool:
        """Whether node ``name`` lists ``pe`` (``pipeline/element``) as running; a node not
        heard lately counts as hosting it still (it lists only the PEs placed on it, and
        may run others: a zombie is known gone only once the node is heard again)."""
        node = self.node(name)
        return not node["alive"] or pe in node["elements"]

    def element(self, pipeline: str, element: str) -> dict[str, Any]:
        return next(e for e in self.status(pipeline)["elements"] if e["element"] == element)

    def wait_for(
        self, pipeline: str, element: str, count: int, timeout_s: float = 240
    ) -> dict[str, Any]:
        """Wait until ``element`` has emitted ``count`` events (sinks: lines written)."""
        deadline = time.monotonic() + timeout_s
        info: dict[str, Any] = {}
        with phase(f"wait_for: {element} emitted {count}"):
            while time.monotonic() < deadline:
                info = self.element(pipeline, element)
                if info["events_out"] >= count:
                    return info
                time.sleep(0.25)
        others = [e for e in self.status(pipeline)["elements"] if e["element"] != element]
        raise AssertionError(
            f"{pipeline}/{element} emitted {info.get('events_out')} of {count} in {timeout_s}s: "
            f"{info}\nthe other elements: {others}\n{self.logs()}"
        )

    def logs(self) -> str:
        out = []
        for log in sorted((self.home / "logs").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()
            lines = [ln for ln in text if "ERROR" in ln]
            # The exception lines say why a query died; the ERROR lines alone only say that.
            causes = [ln for ln in text if "Exception:" in ln or "Error:" in ln]
            out.append(
                f"--- {log.name}: {len(lines)} error lines\n"
                + "\n".join(lines[-5:] + sorted(set(causes))[-8:])
            )
        return "\n".join(out)


def pgids_of(home: Path, broker: bool = True) -> list[int]:
    """The process groups `fogshift up` recorded: orchestrator, nodes and (with ``broker``)
    the broker it started."""
    data = json.loads((home / "cluster.json").read_text())
    groups = [data["orchestrator"]["pgid"], *(n["pgid"] for n in data["nodes"].values())]
    if broker and data.get("broker"):
        groups.append(data["broker"]["pgid"])
    return groups


#: The cluster most integration tests share (one start-up for the session): four nodes,
#: frequent checkpoints (every 2 s on the nodes, every 4 s centrally: more would load two
#: cores with copying alone), a de-duplication window of 1 s, so exactly-once never leans on
#: the broker dropping a re-sent message, and micro-batches at most once every 2 s: a batch
#: costs ~0.3-0.5 s of CPU whatever its size, so at 200 ms the tests' pipelines kept both
#: cores busy and every operation waited for CPU; at 1 s the suite still spent 16 % more CPU
#: (README, "How long the suite takes").
SHARED_NODES = ["cloud", "fog-a", "fog-b", "fog-c"]
SHARED_TRIGGER_MS = 2000
SHARED_UP_ARGS = (
    "--checkpoint-interval",
    "2",
    "--central-interval",
    "4",
    "--duplicate-window",
    "1",
    "--trigger-ms",
    str(SHARED_TRIGGER_MS),
)


@pytest.fixture(scope="module")
def up_args() -> tuple[str, ...] | None:
    """Extra `fogshift up` options of a cluster of the module's own; None: the shared one."""
    return None


@pytest.fixture(scope="module")
def cluster_nodes() -> list[str] | None:
    """The nodes of a cluster of the module's own; None: the shared one."""
    return None


def _start(
    home: Path, nodes: list[str], up_args: tuple[str, ...], first: list[str] | None = None
) -> Iterator[Cluster]:
    """A cluster of ``nodes``, of which ``first`` (default: all) are started at once."""
    c = Cluster(home, nodes, up_args)
    c.up(first)
    try:
        yield c
    finally:
        groups = pgids_of(home) if (home / "cluster.json").exists() else []
        c.down()
        leftovers = [g for g in groups if group_alive(g)]
        for g in leftovers:
            os.killpg(g, signal.SIGKILL)
        assert not leftovers, f"`fogshift down` left process groups {leftovers} running"


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's shared cluster (:data:`SHARED_NODES`, :data:`SHARED_UP_ARGS`). Its last
    node is added to the running cluster by the first module that needs it (`fogshift up`
    with a node it lacks): a worker whose modules do not need it never starts it, and every
    one that does runs its tests on an added node."""
    yield from _start(
        tmp_path_factory.mktemp("shared"), SHARED_NODES, SHARED_UP_ARGS, SHARED_NODES[:-1]
    )


@pytest.fixture(scope="module")
def cluster_needs() -> tuple[str, ...] | None:
    """The shared cluster's nodes the module uses (``None``: all): others an earlier module
    killed are not started again for it."""
    return None


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    up_args: tuple[str, ...] | None,
    cluster_nodes: list[str] | None,
    cluster_needs: tuple[str, ...] | None,
) -> Iterator[Cluster]:
    """The module's cluster: the shared one, whole again (as far as ``cluster_needs`` asks)
    and quiet (its earlier pipelines stopped) — or, when the module overrides ``up_args`` or
    ``cluster_nodes``, one of its own. Pipeline names must be unique across the modules that
    share it."""
    if up_args is None and cluster_nodes is None:
        shared: Cluster = request.getfixturevalue("shared_cluster")
        with phase("cluster: heal"):
            shared.heal(cluster_needs)
        yield shared
        # Not healed again here: the next module that takes the cluster heals it first, and
        # a worker's last one would restart killed nodes (a JVM each) for nothing.
        with phase("cluster: stop_all"):
            shared.stop_all()
        return
    home = tmp_path_factory.mktemp("home")
    yield from _start(home, cluster_nodes or ["cloud", "fog-a", "fog-b"], up_args or ())


__all__ = ["BrokerAddress", "Cluster", "fogshift", "group_alive", "pgids_of"]


# -- the dashboard in a real browser (tests/web/browser.py has the rest) ------------------


@pytest.fixture()
def dashboard(cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    """A `fogshift dashboard` process for the cluster (its spec folder ``tmp_path/work``);
    its one-time login URL."""
    (tmp_path / "work").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fogshift.cli.main", "dashboard", "--home", str(cluster.home),
         "--port", "0", "--spec-dir", str(tmp_path / "work")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("open: "):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert found.wait(60), "".join(lines)
        url = next(line for line in lines if line.startswith("open: "))[6:].strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/login\?token=[\w-]{40,}", url), url
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture()
def browser() -> Iterator[object]:
    """Debian's chromium, driven by Playwright (imported here: only these tests need it)."""
    from playwright.sync_api import sync_playwright

    from tests.web.browser import CHROMIUM, CHROMIUM_ARGS

    assert Path(CHROMIUM).exists(), "chromium is missing: `make setup` installs it"
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()
