"""Keeping each node's broker rights in step with placement (least privilege).

A node may touch only the streams of the PEs placed on it, of their inputs, and — while a
migration or restore moves a PE to it — of the PE being moved (see
:mod:`fogshift.broker.permissions`). The orchestrator calls :meth:`BrokerPermissions.sync`
whenever placement may have changed (deploy, stop, each operation's start, each reconcile
round); it rewrites the server's config and makes it reload only when the rights changed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path

from fogshift.broker.exceptions import BrokerError
from fogshift.broker.permissions import Hosted, apply_permissions
from fogshift.common.processes import started_at
from fogshift.orchestrator.registry import Registry
from fogshift.spec.models import ElementSpec

log = logging.getLogger("fogshift.orchestrator")

#: Pipelines whose PEs hold broker rights (a stopped or failed pipeline's nodes lose them).
ACTIVE = ("deploying", "running", "stopping")


def _hosted(pipeline: str, element: ElementSpec) -> Hosted:
    movable = element.partition.index if element.partition and element.moves_keys else None
    return Hosted(pipeline, element.id, tuple(element.inputs), moves_keys=movable)


def hosted_by_node(registry: Registry, withheld: Collection[str] = ()) -> dict[str, list[Hosted]]:
    """Node → the PEs it may serve: placed there, or standing by for them there, or the
    target of an unfinished migration or restore, or the origin of an unfinished migration
    (it runs until the handover); the node a restore moves a PE away from loses its rights
    to it at once. None of the pipelines ``withheld`` (a deploy making their streams)."""
    hosted: dict[str, set[Hosted]] = defaultdict(set)
    specs = {}
    standbys = {(s.pipeline, s.element): s.node for s in registry.standbys()}
    for record in registry.pipelines():
        specs[record.name] = record.spec
        if record.status not in ACTIVE or record.name in withheld:
            continue
        for element in record.spec.elements:
            node = record.placement.get(element.id, element.node)
            pe = _hosted(record.name, element)
            hosted[node].add(pe)
            if (record.name, element.id) in standbys:  # (read rights: see Hosted.standby)
                hosted[standbys[(record.name, element.id)]].add(replace(pe, standby=True))
    for op in registry.unfinished():
        spec = specs.get(op.pipeline)
        if spec is None or op.pipeline in withheld:
            continue
        try:
            pe = _hosted(op.pipeline, spec.element(op.element))
        except KeyError:
            continue
        hosted[op.target].add(pe)
        if op.kind == "migration":
            hosted[op.origin].add(pe)
        elif op.origin != op.target:
            hosted[op.origin].discard(pe)  # a restore: the node it leaves is presumed lost
    return {
        node: sorted(
            # (Standing by for a PE it also serves whole: the rights of the PE itself.)
            (h for h in pes if not (h.standby and replace(h, standby=False) in pes)),
            key=lambda h: (h.pipeline, h.element),
        )
        for node, pes in hosted.items()
    }


class BrokerPermissions:
    """The broker rights the orchestrator manages (a cluster whose broker ``fogshift up``
    started); ``config_file=None`` (an external broker) manages none.

    Args:
        config_file: The nats-server config (with ``users.json`` beside it).
        pid: The nats-server process, signalled to reload.
        started: When it started (``fogshift up`` records it); ``None``: read now.
    """

    def __init__(
        self, config_file: Path | None, pid: int | None, started: float | None = None
    ) -> None:
        self.config_file = config_file
        self.pid = pid
        if started is None and pid is not None:
            started = started_at(pid)  # (None: gone already, never signalled)
        self.started = started
        self._applied: dict[str, list[Hosted]] | None = None
        self._lock = threading.Lock()
        #: Pipelines no node gets rights to yet (see :meth:`withholding`).
        self._withheld: set[str] = set()

    @property
    def managed(self) -> bool:
        return self.config_file is not None and self.pid is not None

    def sync(self, registry: Registry) -> bool:
        """Apply the rights placement implies now; True if they changed.

        Raises:
            BrokerError: The config could not be rewritten or the server is gone.
        """
        if not self.managed:
            return False
        assert self.config_file is not None and self.pid is not None
        with self._lock:
            wanted = hosted_by_node(registry, self._withheld)
            if wanted == self._applied:
                return False
            if self.started is None:
                raise BrokerError(
                    f"nats-server (pid {self.pid}) was gone when this orchestrator started: "
                    "cannot apply permissions"
                )
            apply_permissions(self.config_file, self.pid, wanted, self.started)
            self._applied = wanted
            log.info(
                "broker rights: %s",
                {n: [f"{h.pipeline}/{h.element}" for h in pes] for n, pes in wanted.items()},
            )
            return True

    @contextlib.contextmanager
    def withholding(self, pipeline: str) -> Iterator[None]:
        """No sync gives a node rights to ``pipeline`` while the block runs (a deploy making
        its streams and their fence markers: a round's sync meanwhile let a node that missed
        the last stop append its old instance's records ahead of a marker)."""
        with self._lock:
            self._withheld.add(pipeline)
        try:
            yield
        finally:
            with self._lock:
                self._withheld.discard(pipeline)

    def sync_quietly(self, registry: Registry) -> None:
        """:meth:`sync` for loops that must go on: a failure is logged and retried later."""
        try:
            self.sync(registry)
        except BrokerError as exc:
            log.error("cannot update the broker's per-node rights: %s", exc.message)
