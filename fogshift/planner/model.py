"""The planner's model of Iijima et al., "Deciding Backup Location Methods for Distributed
Stream Processing System" (section IV), as frozen, validated pydantic models.

Notation of the paper and how it maps here:

* ``T`` (tasks ``τ``) -> :class:`Task`; ``S`` (servers ``s``) -> :class:`Server`;
  ``E`` (network edges ``e``) -> :class:`Link`.
* ``s_w(τ)`` (server the task works on) -> :attr:`Task.server`;
  ``s_d(τ)`` (server storing its backup) -> :attr:`Assignment.backup`;
  ``s_t(τ)`` (server it is redeployed to) -> :attr:`Assignment.redeploy`.
* ``c_τ`` -> :attr:`Task.cpu`, ``l_τ`` -> :attr:`Task.latency_ms`,
  ``d_τ^store`` = ``d(τ)`` -> :attr:`Task.backup_rate`, ``d_τ^sum`` = ``b(τ)`` ->
  :attr:`Task.transfer_size`, ``c_s`` -> :attr:`Server.cpu`, ``U(e)`` -> :attr:`Link.bandwidth`.
* ``Z(τ)``, the bandwidth reserved for the recovery transfer from ``s_d(τ)`` to ``s_t(τ)``,
  -> :attr:`Assignment.recovery_bandwidth`; it can be at most the bottleneck of that route
  (:meth:`Network.bottleneck`). ``E_1``/``E_2`` are "link on the route ``s_w(τ) -> s_d(τ)``"
  / "link on the route ``s_d(τ) -> s_t(τ)``"; beyond the paper, a task's backup data may
  come to ``s_d(τ)`` from another server (:attr:`Task.replicas_from`, fogshift's central
  store), and ``E_1`` is then the route from it.

Units: CPU in abstract units, bandwidth in Mb/s, transfer sizes in Mb (megabits), times in ms.
The paper has no link latency, so links carry only a bandwidth.

Routes are fixed: fewest hops (the paper's greedy orders servers by "the number of edges"),
ties broken by the widest bottleneck, then by server order. Links are undirected and both
directions share ``U(e)``. A failed server is assumed to stop computing, not to stop
forwarding, so routes through it stay usable.

:func:`violations` (and :meth:`Plan.check`) re-checks every constraint from the raw data so
tests can verify solver output independently of the solvers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fogshift.common.text import shown
from fogshift.common.validation import message_of
from fogshift.common.yamltext import load_yaml, read_utf8
from fogshift.planner.exceptions import InvalidTopology

#: Relative tolerance used when comparing sums of floats against capacities.
TOLERANCE = 1e-6
#: The hint of a topology that is not one.
_EXAMPLE = "see examples/planner/small.yaml for the fields a topology has"

_CONFIG = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def within(value: float, limit: float, tol: float = TOLERANCE) -> bool:
    """Whether ``value <= limit`` up to a relative tolerance (float sums are inexact)."""
    return value <= limit + tol * max(1.0, abs(limit))


class Server(BaseModel):
    """A server ``s`` of ``S``.

    Attributes:
        id: Unique name of the server.
        cpu: ``c_s``, the server's CPU capacity.
        load: CPU already used on the server by work *other than* the tasks of the topology
            (those are added from :attr:`Task.cpu`). The free CPU that redeployed tasks can use
            is ``cpu - load - sum(c_τ for τ working on s)``.
        leaving: The server is being removed (beyond the paper): its tasks are still planned
            for, but it holds no task's backup and takes no redeployed task, whatever its
            free CPU and bandwidth; its links still forward.
    """

    model_config = _CONFIG

    id: str = Field(min_length=1)
    cpu: float = Field(gt=0)
    load: float = Field(default=0.0, ge=0)
    leaving: bool = False


class Task(BaseModel):
    """A task ``τ`` of ``T`` (a stream-processing process), characterised by
    ``(c_τ, l_τ, d_τ^store, d_τ^sum)``.

    Attributes:
        id: Unique name of the task.
        server: ``s_w(τ)``, the server the task works on now (its primary).
        cpu: ``c_τ``, CPU the task needs wherever it runs.
        latency_ms: ``l_τ``, the task's latency requirement in ms. The greedy serves tasks in
            ascending ``l_τ``; the recovery transfer of the task must finish within it.
        backup_rate: ``d_τ^store`` (= ``d(τ)`` in eq. 4), Mb/s the task continuously sends
            to its backup server (snapshots plus replicated stream data). Eq. 2 and
            Algorithm 1 subtract it from the bandwidth of every link on the route.
        transfer_size: ``d_τ^sum`` (= ``b(τ)`` in eq. 3), Mb that must move from the backup
            server to the redeploy server before the redeployed task can resume.
        replicas_from: The server the task's backup data is sent to its backup server from
            (``None``: its own, the paper's model). fogshift's checkpoints are pulled to the
            central store and pushed from there to the backup node, so the live plan names
            the central node: the replication then loads the route ``from -> s_d(τ)``
            (:meth:`Network.replication_route`), not ``s_w(τ) -> s_d(τ)``. (The pull to the
            central node happens whatever the plan says: it is not the plan's to place.)
    """

    model_config = _CONFIG

    id: str = Field(min_length=1)
    server: str = Field(min_length=1)
    cpu: float = Field(ge=0)
    # (Bounded: a plan's objective sums recovery times, each within its task's latency, and
    # values near 1e308 summed to infinity, which no plan may hold: a crash, not a refusal.)
    latency_ms: float = Field(gt=0, le=1e12)
    backup_rate: float = Field(ge=0)
    transfer_size: float = Field(gt=0)
    replicas_from: str | None = Field(default=None, min_length=1)


class Link(BaseModel):
    """An undirected network edge ``e`` of ``E`` between two servers.

    Attributes:
        a: One end (a server id).
        b: The other end (a server id, different from ``a``).
        bandwidth: ``U(e)``, the bandwidth in Mb/s available to the planner on this link,
            shared by both directions.
    """

    model_config = _CONFIG

    a: str = Field(min_length=1)
    b: str = Field(min_length=1)
    bandwidth: float = Field(gt=0)


def _loc(parts: tuple[int | str, ...]) -> str:
    """Render a pydantic error location such as ``('tasks', 2, 'cpu')`` as ``tasks[2].cpu``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "topology"


class Topology(BaseModel):
    """The planner's input: servers, the tasks working on them and the links between them.

    Build it with :meth:`from_dict` / :meth:`from_yaml` to get :class:`InvalidTopology`
    errors naming the bad field; the constructor raises pydantic's ``ValidationError``.

    Invariants (checked on construction): ids are unique, every task's server and every
    link end exists, links join two different servers and at most one link joins a pair,
    and every server can hold its own tasks (``load + Σ c_τ <= c_s``).
    """

    model_config = _CONFIG

    servers: tuple[Server, ...]
    tasks: tuple[Task, ...] = ()
    links: tuple[Link, ...] = ()

    @model_validator(mode="after")
    def _references(self) -> Topology:
        # Cross-field checks live here because a field validator cannot see other fields;
        # each message starts with the field path so users can find the bad entry.
        server_ids: dict[str, int] = {}
        for k, server in enumerate(self.servers):
            if server.id in server_ids:
                raise ValueError(f"servers[{k}].id: duplicate server id {server.id!r}")
            server_ids[server.id] = k
        task_ids: set[str] = set()
        used = [s.load for s in self.servers]
        for k, task in enumerate(self.tasks):
            if task.id in task_ids:
                raise ValueError(f"tasks[{k}].id: duplicate task id {task.id!r}")
            task_ids.add(task.id)
            if task.server not in server_ids:
                raise ValueError(f"tasks[{k}].server: unknown server {task.server!r}")
            if task.replicas_from is not None and task.replicas_from not in server_ids:
                raise ValueError(f"tasks[{k}].replicas_from: unknown server {task.replicas_from!r}")
            used[server_ids[task.server]] += task.cpu
        for k, server in enumerate(self.servers):
            if not within(used[k], server.cpu):
                raise ValueError(
                    f"servers[{k}].cpu: server {server.id!r} has capacity {server.cpu:g} but "
                    f"its load plus its tasks' CPU is {used[k]:g}"
                )
        pairs: set[frozenset[str]] = set()
        for k, link in enumerate(self.links):
            for end in ("a", "b"):
                if getattr(link, end) not in server_ids:
                    raise ValueError(f"links[{k}].{end}: unknown server {getattr(link, end)!r}")
            if link.a == link.b:
                raise ValueError(f"links[{k}]: link joins server {link.a!r} to itself")
            pair = frozenset((link.a, link.b))
            if pair in pairs:
                raise ValueError(f"links[{k}]: second link between {link.a!r} and {link.b!r}")
            pairs.add(pair)
        return self

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "topology") -> Topology:
        """Validate a plain mapping (as parsed from YAML/JSON) into a topology.

        Args:
            data: A mapping with keys ``servers``, ``tasks`` and ``links``.
            source: Where the data came from, used in error messages.

        Returns:
            The validated topology.

        Raises:
            InvalidTopology: If validation fails; the message names each bad field.
        """
        if not isinstance(data, Mapping):
            raise InvalidTopology(
                f"invalid {source}: the top level must be a mapping",
                expected="a mapping with keys servers, tasks, links",
                received=type(data).__name__,
                hint=_EXAMPLE,
            )
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            errors = exc.errors()
            lines = []
            for err in errors[:10]:
                msg = message_of(err)
                # Cross-field errors carry their path in the message already.
                where = _loc(tuple(err["loc"]))
                lines.append(msg if not err["loc"] else f"{where}: {msg}")
            first = errors[0]
            raise InvalidTopology(
                f"invalid {source}: " + "; ".join(lines),
                expected=message_of(first) if first["loc"] else None,
                received=shown(first.get("input")) if first["loc"] else None,
                hint=_EXAMPLE,
            ) from exc

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        """Load and validate a topology from a YAML file.

        The file holds ``servers: [{id, cpu, load}]``, ``tasks: [{id, server, cpu,
        latency_ms, backup_rate, transfer_size, replicas_from}]`` (the last optional) and
        ``links: [{a, b, bandwidth}]``.

        Raises:
            InvalidTopology: If the file cannot be read or parsed, or fails validation.
        """
        path = Path(path)
        try:
            text = read_utf8(path)
        except OSError as exc:
            raise InvalidTopology(
                f"cannot read topology file {str(path)!r}: {exc.strerror or exc}",
                expected="a readable YAML file",
                received=repr(str(path)),
                hint="check the path (relative to the current directory) and its permissions",
            ) from exc
        except ValueError as exc:
            raise InvalidTopology(
                f"cannot read topology file: {exc}",
                expected="a YAML file in UTF-8",
                received="another encoding (Latin-1, UTF-16, ...)",
                hint="save the file as UTF-8",
            ) from None
        try:
            data = load_yaml(text)
        except yaml.YAMLError as exc:
            raise InvalidTopology(
                f"topology file {str(path)!r} is not valid YAML: {exc}",
                expected="YAML",
                received="text with a YAML syntax error (where: in the message)",
                hint=_EXAMPLE,
            ) from exc
        return cls.from_dict(data, source=f"topology {str(path)!r}")

    def network(self) -> Network:
        """Derived, read-only data (routes, free CPU) the solvers and checks share."""
        return Network(self)


class Network:
    """Indices, routes and free CPU derived from a :class:`Topology` once.

    Servers and tasks are addressed by their position in the topology. ``route(a, b)`` is the
    tuple of link indices from server ``a`` to server ``b`` (``()`` when ``a == b``, ``None``
    when unreachable).
    """

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.server_ids: tuple[str, ...] = tuple(s.id for s in topology.servers)
        self.server_index: dict[str, int] = {sid: k for k, sid in enumerate(self.server_ids)}
        self.task_ids: tuple[str, ...] = tuple(t.id for t in topology.tasks)
        self.task_index: dict[str, int] = {tid: k for k, tid in enumerate(self.task_ids)}
        self.task_server: tuple[int, ...] = tuple(
            self.server_index[t.server] for t in topology.tasks
        )
        #: Where each task's backup data is sent from (its server, or ``replicas_from``).
        self.task_source: tuple[int, ...] = tuple(
            self.server_index[t.replicas_from or t.server] for t in topology.tasks
        )
        n = len(self.server_ids)
        tasks_on: list[list[int]] = [[] for _ in range(n)]
        for k, s in enumerate(self.task_server):
            tasks_on[s].append(k)
        self.tasks_on: tuple[tuple[int, ...], ...] = tuple(tuple(ts) for ts in tasks_on)
        self.free_cpu: tuple[float, ...] = tuple(
            s.cpu - s.load - sum(topology.tasks[k].cpu for k in tasks_on[i])
            for i, s in enumerate(topology.servers)
        )
        self.link_ends: tuple[tuple[int, int], ...] = tuple(
            (self.server_index[link.a], self.server_index[link.b]) for link in topology.links
        )
        self.bandwidth: tuple[float, ...] = tuple(link.bandwidth for link in topology.links)
        #: Whether a server may hold a backup or take a redeployed task (not leaving).
        self.usable: tuple[bool, ...] = tuple(not s.leaving for s in topology.servers)
        self._routes, self._bottleneck = self._all_routes()

    def _all_routes(
        self,
    ) -> tuple[list[list[tuple[int, ...] | None]], list[list[float]]]:
        n = len(self.server_ids)
        adjacency: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for e, (a, b) in enumerate(self.link_ends):
            adjacency[a].append((b, e))
            adjacency[b].append((a, e))
        routes: list[list[tuple[int, ...] | None]] = []
        widths: list[list[float]] = []
        for src in range(n):
            # BFS gives hop distances; among shortest paths keep the widest, then the one
            # through the lowest-indexed predecessor, so routes are deterministic.
            dist = [-1] * n
            dist[src] = 0
            order = [src]
            queue = deque([src])
            while queue:
                u = queue.popleft()
                for v, _ in adjacency[u]:
                    if dist[v] < 0:
                        dist[v] = dist[u] + 1
                        order.append(v)
                        queue.append(v)
            width = [0.0] * n
            width[src] = math.inf
            row: list[tuple[int, ...] | None] = [None] * n
            row[src] = ()
            for v in order[1:]:
                best: tuple[float, int, int] | None = None
                for u, e in adjacency[v]:
                    if dist[u] == dist[v] - 1:
                        cand = min(width[u], self.bandwidth[e])
                        if best is None or (cand, -u) > (best[0], -best[1]):
                            best = (cand, u, e)
                assert best is not None  # v was reached from some u one hop closer
                width[v] = best[0]
                prev = row[best[1]]
                assert prev is not None
                row[v] = (*prev, best[2])
            routes.append(row)
            widths.append(width)
        return routes, widths

    def route(self, a: int, b: int) -> tuple[int, ...] | None:
        """Link indices on the fixed route from server ``a`` to ``b`` (None: unreachable)."""
        return self._routes[a][b]

    def replication_route(self, task: int, backup: int) -> tuple[int, ...] | None:
        """Link indices the backup data of ``task`` crosses to ``backup``: the route from
        :attr:`Task.replicas_from`, else from the task's server (None: unreachable)."""
        return self.route(self.task_source[task], backup)

    def replication_fits_links(self, task: int, backup: int) -> bool:
        """Whether ``d_τ^store`` fits every link of the replication route on its own (eq. 2
        with nothing else placed)."""
        route = self.replication_route(task, backup)
        rate = self.topology.tasks[task].backup_rate
        return route is not None and within(rate, self.replication_width(task, backup))

    def replication_width(self, task: int, backup: int) -> float:
        """The bottleneck of the replication route (``inf`` for no link, 0 when unreachable)."""
        source = self.task_source[task]
        return self.bottleneck(source, backup) if self.route(source, backup) is not None else 0.0

    def bottleneck(self, a: int, b: int) -> float:
        """``Z`` for a transfer from ``a`` to ``b``: the smallest ``U(e)`` on the route.

        Returns ``inf`` when ``a == b`` and ``0`` when ``b`` is unreachable from ``a``.
        """
        return self._bottleneck[a][b]

    def hops(self, a: int, b: int) -> int | None:
        """Number of links on the route from ``a`` to ``b`` (None: unreachable)."""
        r = self._routes[a][b]
        return None if r is None else len(r)

    def recovery_ms(self, task: int, backup: int, redeploy: int, z: float | None) -> float:
        """``b(τ)/Z(τ)`` in ms for recovery bandwidth ``z``; 0 when backup == redeploy.

        Returns ``inf`` for a remote recovery without a positive ``z``.
        """
        if backup == redeploy:
            return 0.0
        if z is None or z <= 0:
            return math.inf
        return 1000.0 * self.topology.tasks[task].transfer_size / z

    def link_name(self, e: int) -> str:
        """Human-readable name of link ``e``, such as ``s1-s2``."""
        a, b = self.link_ends[e]
        return f"{self.server_ids[a]}-{self.server_ids[b]}"


class Assignment(BaseModel):
    """Where one task's backup lives and where it is redeployed.

    Attributes:
        task: The task's id.
        backup: ``s_d(τ)``, the server storing the task's backup data.
        redeploy: ``s_t(τ)``, the server the task is redeployed to if its server fails.
        recovery_bandwidth: ``Z(τ)`` in Mb/s, reserved on every link of the route from
            ``backup`` to ``redeploy`` while the task recovers; None when they coincide (the
            backup is read locally, no transfer).
        recovery_ms: ``b(τ)/Z(τ)`` in ms, the task's term of the objective (0 if co-located).
    """

    model_config = _CONFIG

    task: str
    backup: str
    redeploy: str
    recovery_bandwidth: float | None = Field(default=None, gt=0)
    recovery_ms: float = Field(ge=0)

    @model_validator(mode="after")
    def _bandwidth_iff_remote(self) -> Assignment:
        if (self.backup == self.redeploy) != (self.recovery_bandwidth is None):
            raise ValueError("recovery_bandwidth must be None exactly when backup == redeploy")
        return self


class Plan(BaseModel):
    """A solution: one :class:`Assignment` per task plus how it was obtained.

    Attributes:
        assignments: One entry per task, in topology order.
        objective_ms: ``TL`` of eq. 3, ``Σ b(τ)/Z(τ)``, in ms.
        method: ``"exact"`` (HiGHS MILP) or ``"greedy"`` (Algorithm 1).
        status: ``"optimal"`` (proven within HiGHS' gap), ``"time_limit"`` (best plan found
            before the time limit; see ``bound_ms``) or ``"heuristic"`` (greedy).
        solve_ms: Wall-clock time of the solve in ms.
        bound_ms: For exact solves, the solver's lower bound on the optimum (ms).
    """

    model_config = _CONFIG

    assignments: tuple[Assignment, ...]
    objective_ms: float = Field(ge=0)
    method: Literal["exact", "greedy"]
    status: Literal["optimal", "time_limit", "heuristic"]
    solve_ms: float = Field(ge=0)
    bound_ms: float | None = None

    def by_task(self) -> dict[str, Assignment]:
        """The assignments keyed by task id."""
        return {a.task: a for a in self.assignments}

    def check(self, topology: Topology) -> list[str]:
        """Verify every constraint of the model against ``topology``, independently of solvers.

        Checks: each task appears exactly once (and no unknown task), eq. 5 (backup and
        redeploy server differ from ``s_w(τ)``), steady-state replication bandwidth, CPU of
        every single-server failure (CheckCPU), eq. 4 for every single-server failure,
        routes exist, the latency requirement, and that ``recovery_ms`` and ``objective_ms``
        match the data.

        Returns:
            Human-readable violations; empty when the plan is valid.
        """
        net = topology.network()
        problems: list[str] = []
        choice: dict[str, tuple[str, str, float | None]] = {}
        for a in self.assignments:
            if a.task in choice:
                problems.append(f"task {a.task} is assigned more than once")
            choice[a.task] = (a.backup, a.redeploy, a.recovery_bandwidth)
        problems += violations(net, choice)
        if problems:
            return problems
        total = 0.0
        for a in self.assignments:
            k = net.task_index[a.task]
            expect = net.recovery_ms(
                k, net.server_index[a.backup], net.server_index[a.redeploy], a.recovery_bandwidth
            )
            total += expect
            if not math.isclose(a.recovery_ms, expect, rel_tol=TOLERANCE, abs_tol=TOLERANCE):
                problems.append(
                    f"task {a.task}: recovery_ms is {a.recovery_ms:g} but b/Z gives {expect:g}"
                )
        if not math.isclose(self.objective_ms, total, rel_tol=TOLERANCE, abs_tol=TOLERANCE):
            problems.append(f"objective_ms is {self.objective_ms:g} but the sum is {total:g}")
        return problems


@dataclass(frozen=True)
class _Choice:
    task: int
    work: int
    backup: int
    redeploy: int
    z: float | None


def violations(net: Network, choice: Mapping[str, tuple[str, str, float | None]]) -> list[str]:
    """Every constraint violation of a raw assignment ``{task: (backup, redeploy, Z)}``.

    This is the constraint checker behind :meth:`Plan.check`; tests also call it directly to
    enumerate assignments by brute force without building plans.

    Args:
        net: The network of the topology to check against.
        choice: For each task id, its ``(s_d(τ), s_t(τ), Z(τ))``; ``Z`` is ignored when
            backup and redeploy server coincide.

    Returns:
        Human-readable violations; empty when every constraint holds.
    """
    topo = net.topology
    problems: list[str] = []
    chosen: list[_Choice] = []
    for tid, (backup, redeploy, z) in choice.items():
        if tid not in net.task_index:
            problems.append(f"unknown task {tid}")
            continue
        bad = [sid for sid in (backup, redeploy) if sid not in net.server_index]
        if bad:
            problems.append(f"task {tid}: unknown server {bad[0]}")
            continue
        k = net.task_index[tid]
        chosen.append(
            _Choice(k, net.task_server[k], net.server_index[backup], net.server_index[redeploy], z)
        )
    for tid in net.task_ids:
        if tid not in choice:
            problems.append(f"task {tid} has no assignment")
    if problems:
        return problems

    n_links = len(net.bandwidth)
    steady = [0.0] * n_links
    # Per failing server f: replication that stops with f, and recovery reservations of f's
    # tasks; eq. 4 for f reads steady - stopped_f + recovery_f <= U(e).
    stopped: dict[int, list[float]] = {}
    recovery: dict[int, list[float]] = {}
    cpu: dict[tuple[int, int], float] = {}
    for c in chosen:
        task = topo.tasks[c.task]
        name = task.id
        work_id = net.server_ids[c.work]
        if c.backup == c.work:
            problems.append(f"task {name}: backup server {work_id} is its own server (eq. 5)")
        if c.redeploy == c.work:
            problems.append(f"task {name}: redeploy server {work_id} is its own server (eq. 5)")
        for role, server in (("backup", c.backup), ("redeploy", c.redeploy)):
            if not net.usable[server]:
                problems.append(f"task {name}: {role} server {net.server_ids[server]} is leaving")
        rep_route = net.replication_route(c.task, c.backup)
        if rep_route is None:
            problems.append(
                f"task {name}: no route from {task.replicas_from or work_id} to backup "
                f"{net.server_ids[c.backup]}"
            )
        else:
            for e in rep_route:
                steady[e] += task.backup_rate
                stopped.setdefault(c.work, [0.0] * n_links)[e] += task.backup_rate
        key = (c.work, c.redeploy)
        cpu[key] = cpu.get(key, 0.0) + task.cpu
        if c.backup != c.redeploy:
            rec_route = net.route(c.backup, c.redeploy)
            if rec_route is None:
                problems.append(
                    f"task {name}: no route from backup {net.server_ids[c.backup]} to "
                    f"redeploy {net.server_ids[c.redeploy]}"
                )
            elif c.z is None or not c.z > 0:
                problems.append(f"task {name}: remote recovery without a positive Z(τ)")
            else:
                # Eq. 4 below also catches Z above the route's bottleneck, but this names it.
                width = net.bottleneck(c.backup, c.redeploy)
                if not within(c.z, width):
                    problems.append(
                        f"task {name}: Z(τ) = {c.z:g} Mb/s exceeds the {width:g} Mb/s bottleneck "
                        f"from {net.server_ids[c.backup]} to {net.server_ids[c.redeploy]}"
                    )
                for e in rec_route:
                    recovery.setdefault(c.work, [0.0] * n_links)[e] += c.z
                rec_ms = net.recovery_ms(c.task, c.backup, c.redeploy, c.z)
                if not within(rec_ms, task.latency_ms):
                    problems.append(
                        f"task {name}: recovery takes {rec_ms:g} ms, over its latency "
                        f"requirement {task.latency_ms:g} ms"
                    )
    for e in range(n_links):
        if not within(steady[e], net.bandwidth[e]):
            problems.append(
                f"link {net.link_name(e)}: replication needs {steady[e]:g} Mb/s of "
                f"{net.bandwidth[e]:g}"
            )
    for (f, k), need in sorted(cpu.items()):
        if k != f and not within(need, net.free_cpu[k]):
            problems.append(
                f"when {net.server_ids[f]} fails, {net.server_ids[k]} must take {need:g} CPU "
                f"but has {net.free_cpu[k]:g} free (CheckCPU)"
            )
    for f, rec in sorted(recovery.items()):
        stop = stopped.get(f, [0.0] * n_links)
        for e in range(n_links):
            load = steady[e] - stop[e] + rec[e]
            if rec[e] > 0 and not within(load, net.bandwidth[e]):
                problems.append(
                    f"when {net.server_ids[f]} fails, link {net.link_name(e)} must carry "
                    f"{load:g} Mb/s (recovery plus replication) of {net.bandwidth[e]:g} (eq. 4)"
                )
    return problems
