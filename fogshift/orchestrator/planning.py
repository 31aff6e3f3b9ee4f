"""Where each PE's backup lives and where it is redeployed: the planner, fed live.

The orchestrator turns what it knows into the planner's model (:mod:`fogshift.planner`)
every ``plan_interval_s``:

* **servers** are the healthy nodes; their capacity comes from the fog topology file
  (``<home>/topology.yaml``, see :class:`FogTopology`), their load from the CPU use the node
  agents report with every heartbeat, averaged over the last planning interval
  (:class:`Recent`: one second's reading swung the plan, or made it infeasible);
* **links** and their bandwidths come from the topology file (a full mesh at the default
  bandwidth when it names none);
* **tasks** are the running PEs: CPU need from the file (``pe_cpu``), latency requirement
  from the pipeline's ``recovery.latency_ms``, backup rate from the bytes the central pulls
  shipped over the last :data:`RATE_WINDOW_PULLS` intervals (early pulls of a busy PE
  included; an idle PE's falls to 0), transfer size from the newest checkpoint's size.

The plan decides two nodes per PE: its *backup* node, which keeps an extra copy of each
central checkpoint (pushed incrementally after each pull: the planner counts that traffic on
the route from the central node to the backup), and its *redeploy* node, the
first candidate of a restore. A restore then fetches the checkpoint from the nearest copy —
the target's own, the backup node's, or the central store's — by the route bandwidth of
the topology.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fogshift.common.names import NAME_RE
from fogshift.common.text import shown
from fogshift.common.validation import Refusal, expected_of, message_of, refusal_of
from fogshift.common.yamltext import load_yaml, read_utf8
from fogshift.contracts import Assignment, PlannedServer, PlanView
from fogshift.exceptions import InvalidInput
from fogshift.planner.model import Link, Server, Task, Topology
from fogshift.spec.loader import unknown_keys

#: Megabits per byte, for the planner's units (Mb, Mb/s).
MB_PER_BYTE = 8 / 1_000_000
#: A PE's backup rate counts the bytes its central pulls shipped over this many central
#: intervals. The last pull's bytes over one interval undercounted a PE whose checkpoints
#: bring enough to be pulled early (every checkpoint: ~3 times as often), and kept a burst's
#: rate for good once the PE went idle (an unchanged checkpoint is not pulled again).
RATE_WINDOW_PULLS = 3

K = TypeVar("K", bound=Hashable)


class Recent(Generic[K]):
    """Values seen per key within the last ``window_s`` seconds (monotonic), for a rate or
    a mean of what came lately rather than the last value alone. Thread-safe: heartbeats
    and pulls add, the planning round reads."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: dict[K, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def add(self, key: K, value: float, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        with self._lock:
            seen = self._seen.setdefault(key, deque())
            seen.append((at, value))
            self._trim(seen, at)

    def _trim(self, seen: deque[tuple[float, float]], now: float) -> None:
        while seen and seen[0][0] < now - self.window_s:
            seen.popleft()

    def _values(self, key: K, now: float | None) -> list[float]:
        now = time.monotonic() if now is None else now
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                return []
            self._trim(seen, now)
            return [value for _, value in seen]

    def per_s(self, key: K, now: float | None = None) -> float:
        """The sum of the values within the window, per second of it (0: none)."""
        return sum(self._values(key, now)) / self.window_s

    def mean(self, key: K, now: float | None = None) -> float | None:
        """The mean of the values within the window (``None``: none)."""
        values = self._values(key, now)
        return sum(values) / len(values) if values else None

    def forget(self, gone: Callable[[K], bool]) -> None:
        """Drop every key ``gone`` says is."""
        with self._lock:
            for key in [k for k in self._seen if gone(k)]:
                del self._seen[key]


class NodeCapacity(BaseModel):
    """A node's entry in the fog topology file."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # (Strict: YAML's `yes` was read as 1.)
    cpu: float = Field(
        gt=0, le=1e9, strict=True, description="CPU capacity, in percent of one core"
    )


#: A fog topology file's fields, as a refusal's hint shows them (`topology show` prints
#: a plan, not a file to give `topology set`).
_EXAMPLE = (
    "`central: cloud`, `nodes: {fog-a: {cpu: 50}}`, "
    "`links: [{a: cloud, b: fog-a, bandwidth: 10}]` (CPU in % of a core, bandwidth in Mb/s)"
)


class FogLink(BaseModel):
    """A link of the fog topology file (undirected, Mb/s)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    a: str = Field(pattern=NAME_RE)
    b: str = Field(pattern=NAME_RE)
    bandwidth: float = Field(gt=0, le=1e9, strict=True)


class FogTopology(BaseModel):
    """The operator's description of the fog: node capacities and link bandwidths.

    Attributes:
        central: The node the central checkpoint store sits beside (the orchestrator's
            host); ``None``: the node named ``cloud`` if there is one, else as far from every
            node as the narrowest link.
        default_cpu: Capacity of a node the file does not name (percent of one core).
        default_bandwidth: Bandwidth of every pair of nodes when ``links`` is empty (Mb/s).
        pe_cpu: CPU a PE needs wherever it runs (percent of one core).
        nodes: Capacities by node name.
        links: The network; empty means a full mesh at ``default_bandwidth``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # (Names as nodes have them: a typo like `fog_a` for `fog-a` still reads as a node the
    # cluster does not have, and its links are left out of the plan.)
    central: str | None = Field(default=None, pattern=NAME_RE)
    # (Strict, as the nodes' and links': `pe_cpu: yes` was read as 1.)
    default_cpu: float = Field(default=100.0, gt=0, le=1e9, strict=True)
    default_bandwidth: float = Field(default=1000.0, gt=0, le=1e9, strict=True)
    pe_cpu: float = Field(default=10.0, ge=0, le=1e9, strict=True)
    nodes: dict[Annotated[str, Field(pattern=NAME_RE)], NodeCapacity] = Field(default_factory=dict)
    links: tuple[FogLink, ...] = ()

    @model_validator(mode="after")
    def _links_are_pairs(self) -> FogTopology:
        """Refuse a link from a node to itself, or a pair linked twice (either way round):
        accepted and stored before, they failed every plan after."""
        seen: set[frozenset[str]] = set()
        for index, link in enumerate(self.links):
            pair = frozenset((link.a, link.b))
            if len(pair) == 1 or pair in seen:
                raise Refusal(
                    f"link {index} (a: {link.a}, b: {link.b}) "
                    + ("links a node to itself" if len(pair) == 1 else "links a pair twice"),
                    expected="links between two different nodes, each pair once",
                    received=f"a: {link.a}, b: {link.b}",
                    hint="name another node at one end, or remove that link"
                    if len(pair) == 1
                    else "keep one link of that pair (either way round is the same)",
                )
            seen.add(pair)
        return self

    def names(self) -> set[str]:
        """Every node the file names: in ``nodes``, in ``links`` and as ``central``."""
        named = {*self.nodes, *(end for link in self.links for end in (link.a, link.b))}
        return named | ({self.central} if self.central else set())

    @classmethod
    def load(cls, path: Path) -> FogTopology:
        """The topology in ``path``, or the defaults when the file does not exist.

        Raises:
            InvalidInput: The file is not valid YAML or not a valid fog topology.
        """
        if not path.exists():
            return cls()
        return cls.parse(path.read_text(), source=str(path))

    @staticmethod
    def read_text(path: Path) -> str:
        """The text of a fog topology file given by a user, once it validates.

        Raises:
            InvalidInput: The file cannot be read or is not a valid fog topology.
        """
        try:
            text = read_utf8(path)
        except OSError as exc:
            raise InvalidInput(
                f"cannot read fog topology {str(path)!r}: {exc.strerror or exc}",
                expected="a readable YAML file",
                received=repr(str(path)),
                hint="pass the path of a YAML file (see examples/fog/topology.yaml)",
            ) from None
        except ValueError as exc:
            raise InvalidInput(
                f"cannot read fog topology: {exc}",
                expected="a YAML file in UTF-8",
                received="another encoding (Latin-1, UTF-16, ...)",
                hint="save the file as UTF-8",
            ) from None
        FogTopology.parse(text, source=repr(str(path)))
        return text

    @classmethod
    def parse(cls, text: str, source: str = "topology") -> FogTopology:
        """Validate a fog topology given as YAML text.

        Raises:
            InvalidInput: Naming the bad field, what was expected and what was received.
        """
        try:
            data = load_yaml(text) or {}
        except yaml.YAMLError as exc:
            raise InvalidInput(
                f"fog topology {source} is not valid YAML: {exc}",
                expected="a YAML mapping with `nodes` and `links`, each key once, without "
                "anchors or aliases",
                received=f"{len(text)} characters",
                hint="check the line named above; a valid one reads: " + _EXAMPLE,
            ) from None
        except RecursionError:
            raise InvalidInput(
                f"fog topology {source} nests too deep to read",
                expected="nodes and links, a few levels deep",
                received="YAML nested hundreds of levels deep",
                hint="a valid one reads: " + _EXAMPLE,
            ) from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors()
            # (A misspelt key explains the field it leaves missing: `nodes: {fog-a: {cpuu:
            # 50}}` was refused as "nodes.fog-a.cpu: missing", its misspelling unsaid.)
            first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            refusal = refusal_of(first)
            said = refusal.hint if refusal and refusal.hint else None
            received = refusal.received if refusal and refusal.received else None
            unknown, known = unknown_keys([first], cls)
            if unknown:
                # (The key, not its value: `centrl: cloud` was "received: 'cloud'".)
                key, guess = unknown[0]
                received = repr(key)
                said = f"did you mean {guess!r}?" if guess else None
            # (What this field expects, and its value: every refusal gave the list of the
            # file's fields, and the whole file as received for a link to itself. The
            # README's section it named gives no format: the commented example does.)
            raise InvalidInput(
                f"invalid fog topology {source}: {where}: {message_of(first)}",
                expected=(expected_of(first) if first["type"] != "extra_forbidden" else None)
                or (", ".join(known) if unknown and len(first["loc"]) > 1 else None)
                or "central, default_cpu, default_bandwidth, pe_cpu, "
                "nodes: {NAME: {cpu}}, links: [{a, b, bandwidth}]",
                received=received or shown(first.get("input")),
                hint=(f"{said}{' ' if said.endswith('?') else '; '}" if said else "")
                + "a valid one reads: "
                + _EXAMPLE
                + "; examples/fog/topology.yaml gives every field, commented",
            ) from None

    def central_node(self, nodes: list[str]) -> str | None:
        if self.central is not None:
            return self.central
        return "cloud" if "cloud" in nodes else None


@dataclass(frozen=True)
class LiveNode:
    """What the orchestrator knows of a healthy node when it plans (``leaving``: being
    removed or drained, so it holds no backup and takes no redeployed PE)."""

    name: str
    cpu_percent: float
    leaving: bool = False


@dataclass(frozen=True)
class LivePE:
    """What the orchestrator knows of a running PE when it plans."""

    key: str  # "pipeline/element"
    node: str
    latency_ms: float
    checkpoint_bytes: int
    shipped_bytes_per_s: float


def build_topology(
    fog: FogTopology,
    nodes: list[LiveNode],
    pes: list[LivePE],
    central: str | None = None,
    full: set[str] | None = None,
) -> Topology:
    """The planner's instance for the current cluster.

    A PE's backup data is its node's checkpoints, pulled to the central store and pushed
    from there to its backup node: its replication crosses the route from ``central`` (the
    node beside the store, :meth:`FogTopology.central_node`) to its backup, not the route
    from its node (the paper's model, used when the central node is not among ``nodes``).
    The pull happens whatever the plan says: it is not the plan's to place.

    A node's load is its measured CPU use minus what its PEs are assumed to need, kept
    within ``[0, capacity - PE needs]`` (the planner refuses an overloaded server; a node
    running hotter than its capacity simply has no spare CPU). A node whose PEs alone need
    more than its capacity (restores brought them there) is full: planned as a leaving
    node, taking no backup and no redeployed PE, its own PEs planned elsewhere; its name is
    added to ``full``. (It was refused, and with it every round's plan, for good: every PE
    kept the plan naming the node that failed.)

    Raises:
        InvalidInput: A link names a node twice.
    """
    names = [n.name for n in nodes]
    placed = [pe for pe in pes if pe.node in names]
    servers = []
    for node in nodes:
        capacity = fog.nodes[node.name].cpu if node.name in fog.nodes else fog.default_cpu
        needs = fog.pe_cpu * sum(1 for pe in placed if pe.node == node.name)
        if needs > capacity:
            if full is not None:
                full.add(node.name)
            servers.append(Server(id=node.name, cpu=needs, load=0.0, leaving=True))
            continue
        load = min(max(node.cpu_percent - needs, 0.0), capacity - needs)
        servers.append(Server(id=node.name, cpu=capacity, load=load, leaving=node.leaving))
    if fog.links:
        links = [
            Link(a=link.a, b=link.b, bandwidth=link.bandwidth)
            for link in fog.links
            if link.a in names and link.b in names
        ]
    else:
        links = [
            Link(a=a, b=b, bandwidth=fog.default_bandwidth)
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        ]
    source = central if central in names else None
    tasks = [
        Task(
            id=pe.key,
            server=pe.node,
            replicas_from=source,
            cpu=fog.pe_cpu,
            latency_ms=pe.latency_ms,
            backup_rate=pe.shipped_bytes_per_s * MB_PER_BYTE,
            # The planner needs a size > 0; a PE without a checkpoint yet moves ~nothing.
            transfer_size=max(pe.checkpoint_bytes * MB_PER_BYTE, 1e-6),
        )
        for pe in placed
    ]
    return Topology.from_dict(
        {
            "servers": [s.model_dump() for s in servers],
            "tasks": [t.model_dump() for t in tasks],
            "links": [link.model_dump() for link in links],
        },
        source="the live fog topology",
    )


def route_bandwidth(topology: Topology, a: str, b: str) -> float:
    """The bottleneck bandwidth (Mb/s) between nodes ``a`` and ``b``; ``inf`` if a == b,
    0 if either is unknown or they are not connected."""
    if a == b:
        return math.inf
    net = topology.network()
    if a not in net.server_index or b not in net.server_index:
        return 0.0
    i, j = net.server_index[a], net.server_index[b]
    return net.bottleneck(i, j) if net.route(i, j) is not None else 0.0


def nearest_first(
    topology: Topology, target: str, holders: list[str], central: str | None
) -> list[str]:
    """Copies of a checkpoint ordered nearest to ``target`` first, central last on ties.

    Args:
        holders: Nodes holding a whole copy (replicas).
        central: The node beside the central store, or ``None`` when it is not in the fog
            topology (then the central copy comes after every replica).

    Returns:
        Node names, and ``"central"`` for the central store.
    """
    ranked: list[tuple[float, int, str]] = [
        (-route_bandwidth(topology, node, target), 0, node) for node in holders
    ]
    away = -route_bandwidth(topology, central, target) if central else 0.0
    ranked.append((away, 1, "central"))
    return [name for _, _, name in sorted(ranked)]


def describe_plan(plan: Any, topology: Topology) -> PlanView:
    """A plan as the orchestrator reports it (``GET /plan``, ``status --json``)."""
    return PlanView(
        method=plan.method,
        status=plan.status,
        objective_ms=round(plan.objective_ms, 3),
        solve_ms=round(plan.solve_ms, 1),
        servers=[
            PlannedServer(node=s.id, cpu=s.cpu, load=round(s.load, 1)) for s in topology.servers
        ],
        assignments={
            a.task: Assignment(
                backup=a.backup, redeploy=a.redeploy, recovery_ms=round(a.recovery_ms, 3)
            )
            for a in plan.assignments
        },
    )
