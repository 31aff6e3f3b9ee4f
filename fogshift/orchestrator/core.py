"""The orchestrator's state and its node directory: who the nodes are, whether they are alive,
and a client for each node's agent (with that node's own token)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from fogshift.broker.client import (
    BrokerAddress,
    SyncJetStream,
)
from fogshift.broker.server import StoreFailures
from fogshift.checkpoint.central import CentralStore
from fogshift.common.http import ServiceClient, node_token
from fogshift.common.names import NAME_PATTERN
from fogshift.common.text import span
from fogshift.contracts import (
    ElementInfo,
    ElementProgress,
    Heartbeat,
    LeftCheckpoint,
    MigrationReport,
    PipelineState,
    PlanView,
    ReplicaInfo,
    RestoreReport,
    StoppedCounts,
)
from fogshift.orchestrator.config import OrchestratorConfig
from fogshift.orchestrator.exceptions import UnknownNode, stale_generation
from fogshift.orchestrator.permissions import BrokerPermissions
from fogshift.orchestrator.planning import RATE_WINDOW_PULLS, Recent
from fogshift.orchestrator.registry import NodeRecord, PipelineRecord, Registry, StandbyRecord
from fogshift.orchestrator.reports import KeptReports
from fogshift.planner.model import Topology
from fogshift.spec.loader import did_you_mean

log = logging.getLogger("fogshift.orchestrator")


#: How much more than the nearly-full threshold a node counted short of disk needs free to
#: count as having room again (:meth:`OrchestratorCore.short_of_disk`).
SHORT_OF_DISK_MARGIN = 1.25
#: How often :meth:`OrchestratorCore.run_pause_watch` looks at the clock.
PAUSE_TICK_S = 0.5


@dataclass(frozen=True)
class CentralPull:
    """The last pull of a PE's node-level checkpoint into the central store."""

    id: str
    shipped_bytes: int
    bytes: int
    took_ms: float


@dataclass(frozen=True)
class ReplicaPush:
    """The last copy of a PE's central checkpoint to its planned backup node."""

    node: str
    id: str
    fetched_bytes: int
    took_ms: float


@dataclass
class Followed:
    """What the standby follower last saw of a PE's standby: the primary's progress it capped
    the standby at, and the standby's own progress then."""

    primary: ElementProgress
    standby: ElementProgress | None = None


def unknown_node(message: str, name: str, names: list[str], hint: str) -> UnknownNode:
    """:class:`UnknownNode` for ``name``, among the registered ``names``: the one it
    misspells as the hint (``FOG-B`` for ``fog-b``: a pipeline's or element's typo was
    guessed, a node's not), else ``hint``; "one of " with nothing after when none has
    registered."""
    same = [n for n in names if n.lower() == name.lower()]
    guess = same[0] if same else did_you_mean(name, names)
    return UnknownNode(
        message,
        expected="one of " + (", ".join(names) or "(no node has registered)"),
        received=repr(name),
        hint=f"did you mean {guess!r}?" if guess else hint,
    )


def last_plan(path: Path) -> PlanView:
    """The plan an orchestrator starts with: the assignments of the last one's latest plan
    (``path``), not computed by this process yet. A PE whose node is down keeps its
    assignment through the planning rounds (the plan for the failure at hand): started
    again while a node was down, the orchestrator had none for its PEs, restored then on
    the least busy node whatever the CPU and links."""
    try:
        kept = PlanView.model_validate_json(path.read_bytes()).assignments
    except FileNotFoundError:
        kept = {}
    except (OSError, ValueError) as exc:
        log.warning("the last plan (%s) cannot be read, planning afresh: %s", path, exc)
        kept = {}
    return PlanView(error="not computed yet", assignments=kept)


class OrchestratorCore:
    """The orchestrator's shared state and its node directory (the base of
    :class:`~fogshift.orchestrator.service.Orchestrator`)."""

    def __init__(self, config: OrchestratorConfig) -> None:
        self.config = config
        self.registry = Registry(config.home / "orchestrator.db")
        self.broker = SyncJetStream(BrokerAddress.load(config.broker_file))
        #: Each node's broker rights follow placement (least privilege).
        self.permissions = BrokerPermissions(
            config.broker_config, config.broker_pid, config.broker_started
        )
        #: Whether the broker's store failed, searched on at each `GET /health`.
        self.store_failures = StoreFailures()
        #: Per node: a client of its agent, and the agent process it was made for.
        self._agents: dict[str, tuple[ServiceClient, int | None]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        #: Set when a central pull should not wait for its interval (see ``Replication``).
        self._pull_now = threading.Event()
        #: Set when the plan should not wait for its interval: a PE moved (its planned
        #: backup and redeploy nodes named the node it moved to, for up to an interval).
        self.plan_soon = threading.Event()
        #: Per PE: the (node, node-level checkpoint) a heartbeat last woke a pull for.
        self._early_pulls: dict[tuple[str, str], tuple[str, str]] = {}
        #: Owner of the journal entries this process writes: an unfinished entry of another
        #: owner was left by an orchestrator that died (see :meth:`recover_operations`).
        self.run_id = uuid.uuid4().hex[:12]
        # PEs under migration or restoration: those operations own their instances. By PE,
        # what holds it (see ``Journal._exclusive``), and a condition to wait for its end.
        self._migrating: dict[tuple[str, str], str] = {}
        self._released = threading.Condition(self._lock)
        #: Per pipeline name: held by a deploy and a stop for their whole length (a stop
        #: during a deploy waits for it, then stops what it started).
        self._pipeline_locks: dict[str, threading.Lock] = {}
        #: Held while a deploy checks that its name and output files are free and claims
        #: them (two deploys of one name, or writing one file, would both pass the check).
        self._admission = threading.Lock()
        #: ``active`` in a thread running one of the orchestrator's own rounds (the
        #: reconciler's): what it starts never waits for a PE someone holds.
        self._in_round = threading.local()
        #: Per PE whose restart by the reconciler failed once fenced anew: how many times
        #: in a row, when (monotonic) the next try may come, the epoch and node it failed
        #: at, and whether it was a restore away from that node (``Reconciler._back_off``).
        self._restart_backoff: dict[tuple[str, str], tuple[int, float, int, str, bool]] = {}
        #: Why the last automatic restore of each PE failed, as logged (said in full once).
        self._restore_failures: dict[tuple[str, str], str] = {}
        #: Per PE whose last restore on its own node by the reconciler failed (there and
        #: elsewhere): that node. The next round finds it with no instance there, for that
        #: reason, not because the node came back without its checkpoints.
        self._in_place_failed: dict[tuple[str, str], str] = {}
        #: PEs a reconcile round's thread is restoring now (under ``_lock``).
        self._auto_restoring: set[tuple[str, str]] = set()
        #: Per PE being restored, the node its restore tries now (under ``_lock``), until
        #: its placement is written: counted by :meth:`load` (restores running at once saw
        #: the same counts and all chose the least busy node), and a partition's siblings'
        #: targets as its siblings' nodes (:meth:`best_nodes`: a lost node's partitions
        #: restored at once all went to one planned node).
        self._restoring_pe: dict[tuple[str, str], str] = {}
        #: Why a restore of each PE on each node failed, as last logged (said in full once;
        #: the PE's entries go when a restore of it succeeds).
        self._attempts_said: dict[tuple[str, str, str], str] = {}
        #: Per PE whose restore a dead orchestrator left, restarted by the recovery and
        #: failed there (no healthy node yet, say): when (monotonic) it is tried again, the
        #: pause before that, and the node it was stranded on (``Reconciler.restores_owed``).
        self._restores_owed: dict[tuple[str, str], tuple[float, float, str]] = {}
        #: Whether the restores the journal owes were read into ``_restores_owed`` (once).
        self._owed_read = False
        #: Per scale carried on for a dead orchestrator that a node or the broker was away
        #: for: when (monotonic) it may be tried again, and the pause before that
        #: (``Reconciler.recover_scales``).
        self._scale_retries: dict[str, tuple[float, float]] = {}
        #: Scales a thread of this process carries on for a dead orchestrator, by journal
        #: id, under ``_scales_lock``.
        self._scales_carried: set[str] = set()
        self._scales_lock = threading.Lock()
        #: The same for group migrations (``Reconciler.recover_groups``), under
        #: ``_scales_lock`` too.
        self._group_retries: dict[str, tuple[float, float]] = {}
        self._groups_carried: set[str] = set()
        #: Pipelines whose key moves' streams this process has seen have every subject
        #: (``Reconciler._streams_current``).
        self._streams_checked: set[str] = set()
        #: Partitioned elements with several inputs each of which holds every key move
        #: appended (``KeyMoves.complete_key_moves``): checked once per orchestrator, and
        #: again after an append that failed half-way.
        self._moves_complete: set[tuple[str, str]] = set()
        #: When (monotonic) each pipeline's streams were last looked at for records to trim
        #: (``History.trim_streams``).
        self._trimmed_at: dict[str, float] = {}
        #: Per PE's stream held from trimming (``History._trim_one``): since when (wall
        #: clock) in a row, why, and when last noted: :meth:`trim_warnings`.
        self._trim_held: dict[tuple[str, str], tuple[float, str, float]] = {}
        #: PEs whose standby's copy is being taken or started, outside their section (under
        #: ``_lock``): their inputs are not trimmed meanwhile (``History._copying``).
        self._standby_copies: set[tuple[str, str]] = set()
        self.central = CentralStore(config.home / "central")
        #: The nodes removed from the cluster (the registry's, kept here too: every request
        #: with a node's token asks, on the server's event loop, which must not wait for
        #: the registry's lock).
        self._removed = frozenset(self.registry.removed_nodes())
        #: Each name's generation, where it is not 0 (the registry's, kept here for the
        #: same reason; replaced whole under ``_lock``): its tokens are signed with it.
        self._generations: dict[str, int] = self.registry.generations()
        #: The nodes a removal is taking out now, each with how many removals of it run
        #: (under ``_lock``; counted: two overlapping ``DELETE /nodes/{name}`` must not end
        #: each other's mark): no standby is started or kept there meanwhile, nor a PE
        #: migrated, restored or promoted there (``Standbys.remove_node``).
        self._leaving: Counter[str] = Counter()
        #: The nodes :meth:`short_of_disk` counted short at its last call.
        self._short_of_disk: set[str] = set()
        #: The nodes a drain is emptying before their removal (``PUT
        #: /nodes/{name}/leaving``), each with the monotonic time its lease ends (under
        #: ``_lock``): a lease, not a mark, so a drain whose caller died ends by itself.
        self._draining: dict[str, float] = {}
        #: Each PE's last central pull: checkpoint id, bytes shipped and the time it took.
        self.central_stats: dict[tuple[str, str], CentralPull] = {}
        #: Each PE's bytes shipped by its recent central pulls: its backup rate to plan with.
        self.shipped: Recent[tuple[str, str]] = Recent(
            RATE_WINDOW_PULLS * self.config.central_interval_s
        )
        #: Each node's CPU use as its recent heartbeats gave it: its load to plan with.
        self.cpu_seen: Recent[str] = Recent(self.config.plan_interval_s)
        #: Per PE: why its last central pull failed, from which node (cleared when one
        #: succeeds): a warning in ``GET /nodes``.
        self.pull_errors: dict[tuple[str, str], tuple[str, str]] = {}
        #: Each PE's last replica push: node, checkpoint id, bytes fetched, time it took.
        self.replica_stats: dict[tuple[str, str], ReplicaPush] = {}
        #: The report of each PE's last restore (manual or automatic).
        self.last_restore = KeptReports(self.registry, "restore", RestoreReport)
        #: The report of each PE's last migration (migrated, rolled back or failed).
        self.last_migration = KeptReports(self.registry, "migration", MigrationReport)
        #: Each PE's counts when its pipeline was stopped, as its node gave them.
        self.stopped_counts = KeptReports(self.registry, "stopped", StoppedCounts)
        #: Per PE: what the standby follower last capped its standby at.
        self.followed: dict[tuple[str, str], Followed] = {}
        #: Per PE: how long starting its current standby took (ms).
        self.standby_ready_ms: dict[tuple[str, str], float] = {}
        self.started_at = time.time()
        #: When this process last received each node's heartbeat (monotonic): what a call
        #: to the node's agent is given up by (:meth:`_silence`). Not the registry's
        #: ``last_seen``: written by an earlier process, it made every node look silent
        #: after an orchestrator restart, and a clock step made all of them so at once.
        self._beats: dict[str, float] = {}
        self._beats_since = time.monotonic()
        #: When :meth:`run_pause_watch` last ran (monotonic; ``None``: it does not run).
        self._ticked_at: float | None = None
        #: The wall clock's time then: a step of it, or a suspend (which the monotonic
        #: clock does not count), shows as the two clocks' advances differing.
        self._ticked_wall = time.time()
        self._tick_lock = threading.Lock()
        #: The latest plan (``planning.describe_plan``), ``computed_at`` and ``error``.
        self.plan = last_plan(config.plan_file)
        self._topology: Topology | None = None
        #: The nodes the latest planning round counted full (their PEs need more CPU than
        #: their capacity): warned of once, when one is newly so.
        self._full_nodes: set[str] = set()
        #: The central node of the fog topology ``_topology`` was built from.
        self._central: str | None = None

    def heartbeat(self, name: str, report: Heartbeat, generation: int | None = None) -> None:
        """Record that node ``name`` is alive and what it runs; sent with its token of
        ``generation`` (``None``: the operator's), refused unless that is its generation
        when the registry records it (:meth:`check_generation`).

        A PE or copy it names with a pipeline or element name no spec can have is left out
        (and logged): every view of the nodes builds paths and subjects from those names,
        and one bad entry would fail them all (``GET /nodes`` answered 422 for good)."""

        def named(entry: ElementInfo | ReplicaInfo | LeftCheckpoint) -> bool:
            # (fullmatch: with match, "$" lets a final newline through)
            return bool(
                NAME_PATTERN.fullmatch(entry.pipeline) and NAME_PATTERN.fullmatch(entry.element)
            )

        entries: list[ElementInfo | ReplicaInfo | LeftCheckpoint] = [
            *report.elements,
            *report.replicas,
            *report.left,
        ]
        bad = [f"{e.pipeline}/{e.element}" for e in entries if not named(e)]
        if bad:
            log.warning("node %s reported PEs or copies under names no spec can have, left "
                        "out: %s", name, ", ".join(repr(b) for b in bad[:5]))  # fmt: skip
            report = report.model_copy(update={
                "elements": [e for e in report.elements if named(e)],
                "replicas": [r for r in report.replicas if named(r)],
                "left": [c for c in report.left if named(c)],
            })  # fmt: skip
        self.registry.heartbeat(name, report, generation)
        self.heard(name)
        if report.cpu_percent is not None:
            self.cpu_seen.add(name, report.cpu_percent)

    def heard(self, name: str) -> None:
        """Note that node ``name``'s heartbeat has just arrived (what :meth:`_silence` goes
        by): called as the request comes in, before it waits for a thread to be recorded."""
        self._beats[name] = time.monotonic()

    def pipeline_lock(self, name: str) -> threading.Lock:
        """The lock a deploy and a stop of pipeline ``name`` hold (see ``_pipeline_locks``)."""
        with self._lock:
            return self._pipeline_locks.setdefault(name, threading.Lock())

    def healthy(self, node: NodeRecord) -> bool:
        return time.time() - node.last_seen <= self.config.node_timeout_s

    def broken(self, node: NodeRecord) -> str | None:
        """Why ``node``, though it heartbeats, can run no PE (its Spark session failed to
        start: its agent does not try again), or ``None`` (ready, or still starting)."""
        report = node.report
        if report.ready or not report.error:
            return None
        return f"its Spark session did not start ({report.error})"

    def trim_warnings(self, record: PipelineRecord) -> list[str]:
        """The streams of ``record`` held from trimming for longer than its
        ``recovery.history_s`` and half again: the broker keeps their records, and nothing
        else bounds its disk (appends are refused once it is full, the pipeline stops)."""
        keep = record.spec.recovery.history_s
        if keep is None:
            return []
        now = time.time()
        with self._lock:
            ids = {e.id for e in record.spec.elements}
            held = [(pe, since, why) for (p, pe), (since, why, _) in self._trim_held.items()
                    if p == record.name and pe in ids and now - since > 1.5 * keep]  # fmt: skip
        return [
            f"the stream of {record.name}/{pe} has not been trimmed for {span(now - since)} "
            f"(recovery.history_s {keep:g} s): {why}; the broker keeps its records meanwhile"
            for pe, since, why in sorted(held)
        ]

    def followed_of(self, standby: StandbyRecord) -> Followed | None:
        """What the standby follower last saw of ``standby``: ``None`` if nothing, or only
        of an earlier standby of its PE (one an epoch's bump dropped — a handover, a
        restore, a fenced restart — keeps its entry: taken for the next one's, it showed
        that one's lag in ``status`` and left its cap unraised while the pipeline was idle).
        """
        seen = self.followed.get((standby.pipeline, standby.element))
        if seen is None or seen.standby is None or seen.standby.epoch != standby.epoch:
            return None
        return seen

    def node_names(self) -> list[str]:
        return [n.name for n in self.registry.nodes()]

    def load(self) -> Counter[str]:
        """How many instances the registry places on each node: the PEs of running
        pipelines and the standbys. What ranks nodes for a restore or a standby, rather
        than each node's own heartbeat: a node that reported no PE drew every one (and,
        with it, the broker rights of each PE placed there). Restores in flight count on
        the node each chose (:meth:`Coordination.restore_candidates`)."""
        busy = Counter(s.node for s in self.registry.standbys())
        for record in self.registry.pipelines():
            if record.status == PipelineState.RUNNING:
                busy.update(record.placement.values())
        busy.update(self._restoring_to)
        return busy

    @property
    def _restoring_to(self) -> Counter[str]:
        """Per node, the restores in flight trying it now (see ``_restoring_pe``)."""
        with self._lock:
            return Counter(self._restoring_pe.values())

    def run_pause_watch(self) -> None:
        """Until :meth:`close`, every :data:`PAUSE_TICK_S`: notice this process not
        running for longer than a node takes to be counted silent (:meth:`check_paused`)."""
        self._ticked_at, self._ticked_wall = time.monotonic(), time.time()
        while not self._stop.wait(PAUSE_TICK_S):
            self.check_paused()

    def check_paused(self) -> None:
        """If this process did not run (SIGSTOPped, its machine suspended) for longer than a
        node takes to be counted silent, the heartbeats of that time never reached it: node
        silences count from now, as after a restart of the orchestrator. Paused 50 s, it
        restored a healthy node's PEs as soon as it ran again, before reading their
        heartbeats. Told by :meth:`run_pause_watch`'s ticks (not the reconciler's rounds,
        which may be long); the reconciler asks too before it judges a silence (both wake
        together after a pause). Nothing while the watch does not run (tests).

        The same when the wall clock (what the registry's ``last_seen`` is on) moved that
        much more or less than the monotonic one: a suspend (Linux's monotonic clock stands
        still meanwhile: the pause went unseen, and every node was silent for as long), or
        a step of the clock (forward: every node silent at once; back: ``last_seen`` in the
        future, a node lost then noticed only that much later, so it is brought back to
        now)."""
        # (A lock of its own: waiting for the orchestrator's would count as a pause.)
        with self._tick_lock:
            if self._ticked_at is None:
                return
            now, wall = time.monotonic(), time.time()
            away, self._ticked_at = now - self._ticked_at, now
            stepped, self._ticked_wall = (wall - self._ticked_wall) - away, wall
            limit = self.config.node_timeout_s
            if away <= limit and abs(stepped) <= limit:
                return
        if stepped < -limit:
            self.registry.seen_no_later_than(wall)
        with self._lock:
            self.started_at = max(self.started_at, wall) if stepped >= -limit else wall
            self._beats = dict.fromkeys(self._beats, now)
            self._beats_since = now
        if abs(stepped) > limit:
            log.warning("the wall clock moved %+.1f s beside %.1f s of this orchestrator's "
                        "run (a suspend, or the clock set): node silences count from now",
                        stepped + away, away)  # fmt: skip
        else:
            log.warning("this orchestrator did not run for %.1f s (paused, or its machine "
                        "suspended): node silences count from now", away)  # fmt: skip

    def _silence(self, name: str) -> str | None:
        """Why a request to node ``name`` is to be given up: it has sent this process no
        heartbeat for ``call_silence_s`` (stopped, cut off; counted from this process's
        start for a node not heard yet), or ``None``."""
        quiet = time.monotonic() - self._beats.get(name, self._beats_since)
        if quiet <= self.config.call_silence_s:
            return None
        return (f"node {name!r} has sent no heartbeat for {quiet:.1f} s (more than "
                f"{self.config.call_silence_s:g} s)")  # fmt: skip

    def remove_node(self, name: str) -> None:
        """Take node ``name`` out of the cluster (``fogshift remove-node``): forgotten, its
        heartbeats and every request with its token refused, and nothing placed there from
        now on (the registry refuses it in the write's own transaction: a choice made just
        before cannot land after). Whoever asked stops its agent and drops its broker user.

        A name never heard from is removed too (its agent may still be starting: its first
        heartbeat is refused), and one removed already again (nothing changes).

        Raises:
            NodeInUse: It still hosts a PE or standby of a deployed pipeline, or an
                unfinished operation names it (see :meth:`Registry.remove_node`).
        """
        self.registry.remove_node(name)
        with self._lock:
            self._removed = self._removed | {name}
            self._beats.pop(name, None)
            # Dropped, not closed: a thread may be sending on it now (a closed client would
            # raise what no caller catches); its agent is stopped next anyway.
            self._agents.pop(name, None)
        log.warning("node %s was removed from the cluster", name)

    def leaving_nodes(self) -> set[str]:
        """The nodes being taken out of the cluster now (a removal under way, or a drain's
        lease): no PE is placed, restored, promoted or migrated there, and no standby is
        started or kept there."""
        now = time.monotonic()
        with self._lock:
            removing = {n for n, count in self._leaving.items() if count > 0}
            return removing | {n for n, end in self._draining.items() if end > now}

    def short_of_disk(self) -> set[str]:
        """The healthy, ready nodes whose disk is nearly full by their last heartbeat (what
        ``fogshift nodes`` warns of): no PE's backup or redeploy node in the plan, and the
        last a PE is restored or a standby started on — a restore there failed at its first
        checkpoint, and a replica pushed there at its first write.

        None while fewer than two healthy nodes have disk to spare: nodes sharing one full
        disk, or all of them full, would only leave every PE unplanned, not placed better.
        """
        limits = self.config.warning_limits
        live = [n for n in self.registry.nodes() if self.healthy(n) and n.report.ready]
        with self._lock:
            before = self._short_of_disk
            # A node counted short stays so until a quarter more than the threshold is free:
            # free space hovering about it changed the plan (and the backups pushed) every
            # round.
            short = {
                n.name
                for n in live
                if n.report.disk_free_bytes is not None
                and limits.disk_warning(
                    int(n.report.disk_free_bytes / (SHORT_OF_DISK_MARGIN if n.name in before
                                                    else 1.0)),
                    n.report.disk_total_bytes,
                )
            }  # fmt: skip
            self._short_of_disk = short
        spare = {n.name for n in live} - short - self.leaving_nodes()
        return short if len(spare) >= 2 else set()

    def drain_lease(self, name: str, seconds: float | None) -> None:
        """Mark node ``name`` leaving for ``seconds`` from now (a drain of it, before its
        removal: ``fogshift remove-node --drain``); ``None`` ends the lease.

        Raises:
            UnknownNode: ``name`` is not one of the cluster's nodes (only when marking).
        """
        if seconds is None:
            with self._lock:
                self._draining.pop(name, None)
            return
        if self.registry.node(name) is None:
            raise unknown_node(f"cannot drain unknown node {name!r}", name, self.node_names(),
                               "`fogshift nodes` lists the nodes")  # fmt: skip
        with self._lock:
            self._draining[name] = time.monotonic() + seconds
        log.info("node %s is being drained (for %.0f s at most)", name, seconds)

    def admit_node(self, name: str) -> int:
        """Let node ``name`` join again after :meth:`remove_node` (`fogshift up` adding it);
        a name that was removed gets its next generation, so the tokens of the machine
        taken out open nothing (``common.http.node_token``). Returns its generation."""
        was_removed = name in self._removed
        generation = self.registry.admit_node(name)
        with self._lock:
            self._removed = self._removed - {name}
            if generation:
                self._generations = {**self._generations, name: generation}
            # Dropped: a client made with the earlier generation's token would be refused.
            self._agents.pop(name, None)
        if was_removed:
            log.info("node %s may join the cluster again (generation %d)", name, generation)
        return generation

    def check_generation(self, name: str, generation: int) -> None:
        """Refuse a request made with node ``name``'s token of ``generation`` unless that is
        its generation now.

        Raises:
            NodeRemoved: It is not (the name was added again since: the machine taken out).
        """
        now = self.generation(name)
        if generation != now:
            raise stale_generation(name, generation, now)

    def generation(self, name: str) -> int:
        """Node ``name``'s generation: how many times it was added again after a removal."""
        return self._generations.get(name, 0)

    def generations(self) -> dict[str, int]:
        """The generations that are not 0, by node."""
        return dict(self._generations)

    def removed(self, name: str) -> bool:
        """Whether node ``name`` was removed (its token opens nothing)."""
        return name in self._removed

    def removed_nodes(self) -> list[str]:
        """The nodes removed and not admitted again, sorted (every node refuses their blob
        tokens once a heartbeat's answer told it)."""
        return sorted(self._removed)

    def agent(self, name: str) -> ServiceClient:
        """A client for node ``name``'s agent."""
        node = self.registry.node(name)
        if node is None:
            raise UnknownNode(
                f"node {name!r} has never registered",
                expected="one of " + (", ".join(self.node_names()) or "(none)"),
                received=repr(name),
                hint="`fogshift nodes` lists the nodes",
            )
        with self._lock:
            client, pid = self._agents.get(name, (None, None))
            if client is None or client.url != node.url or pid != node.pid:
                # A new agent process (or address): none of the old one's pooled connections
                # is reused. Its close may not have reached this side (a partition, a link
                # removed), and a request sent on one would be lost.
                if client is not None:
                    client.close()
                # The node's own token: a node never receives the operator token.
                token = node_token(self.config.token, name, self.generation(name))
                client = ServiceClient(node.url, token, f"node agent {name!r}", 120,
                                       silent=partial(self._silence, name))  # fmt: skip
                self._agents[name] = (client, node.pid)
            return client

    def _every(
        self,
        interval_s: float,
        step: Callable[[], object],
        what: str,
        wake: threading.Event | None = None,
    ) -> None:
        """Run ``step`` every ``interval_s`` until :meth:`close`; a failure is logged, not fatal.

        Args:
            wake: Set to run ``step`` at once rather than at the end of the interval (cleared
                as the step starts; :meth:`close` sets it too).
        """
        while True:
            (wake or self._stop).wait(interval_s)
            if wake is not None:
                wake.clear()
            if self._stop.is_set():
                return
            try:
                step()
            except Exception:  # the loop must outlive any one failure
                log.exception("%s failed", what)

    def close(self) -> None:
        self._stop.set()
        self._pull_now.set()  # wakes the central loop, which then sees the stop
        self.plan_soon.set()  # and the planning loop
        for client, _ in self._agents.values():
            client.close()
        self.broker.close()
        self.registry.close()
