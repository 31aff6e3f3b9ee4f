"""Checkpoint copies a node keeps for PEs it may have to take over (planned backups).

The orchestrator tells a PE's planned backup node to copy each new central checkpoint; the
node fetches only the files it does not hold yet (content-addressed, like the central
store), and of a large file only the chunks it holds in no file, from a *source* — the
orchestrator's central store or another node's replicas; both serve
``GET /checkpoints/blobs/{sha256}`` (with ``offset`` and ``length``: a range) and
``GET /checkpoints/blobs/{sha256}/chunks``. A restore installs a checkpoint the same way,
from the nearest copy, so a restore onto the backup node moves nothing over the network.

A token goes only where it belongs: the node's own token only to the orchestrator it was
configured with, and another node's blob token only to the URL the orchestrator's node
directory lists for that node. A ``source`` that is neither is refused before any request
is made — a request (or a compromised peer) cannot make this node send a token anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
from pydantic import ValidationError

from fogshift.agent.config import AgentConfig
from fogshift.agent.exceptions import ElementBusy, UnknownSource
from fogshift.agent.node import NodeRuntime
from fogshift.checkpoint.central import CentralStore, check_manifest
from fogshift.checkpoint.chunks import Chunk
from fogshift.checkpoint.exceptions import CheckpointError, TornCheckpoint
from fogshift.checkpoint.spark_dir import fill_omitted
from fogshift.common.http import (
    NodeDirectory,
    client_limits,
    is_loopback,
    raise_for_error,
    tls_context,
)
from fogshift.common.names import NAME_PATTERN, pipeline_folder
from fogshift.common.validation import message_of
from fogshift.contracts import (
    CheckpointManifest,
    DroppedReplica,
    FileChunks,
    InstallResult,
    ReplicaInfo,
)
from fogshift.exceptions import InvalidInput, Unavailable


def _unspecified(host: str) -> bool:
    """Whether ``host`` is "every address" (``0.0.0.0``, ``::``)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return host == ""


def _local_only(host: str) -> bool:
    """Whether a URL's ``host`` reaches only the machine it is used on: its loopback
    (``localhost``, ``127.0.0.0/8``, ``::1``, IPv4-mapped ``::ffff:127.0.0.1``) or every
    address (a node listening on ``0.0.0.0`` without an advertised URL)."""
    host = host.strip("[]").rstrip(".").lower()
    if is_loopback(host) or _unspecified(host):
        return True
    try:
        mapped = ipaddress.ip_address(host)
    except ValueError:
        return False
    return isinstance(mapped, ipaddress.IPv6Address) and bool(
        mapped.ipv4_mapped and mapped.ipv4_mapped.is_loopback
    )


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


class _BlobSource:
    """The blobs of one checkpoint at a source (the orchestrator or a node), whole or chunk
    by chunk (:class:`~fogshift.checkpoint.central.ChunkedSource`): RocksDB rewrites a
    state's large file whole at each compaction, the same values in a new file, and a backup
    node copied each one whole over its link (a 6.5 MB state every ~20 s behind 10 Mbit/s).
    """

    def __init__(
        self, client: httpx.Client, manifest: CheckpointManifest, base: str, node: str
    ) -> None:
        self.client, self.manifest, self.base, self.node = client, manifest, base, node

    def _get(self, rel: str, suffix: str = "", **params: int) -> httpx.Response:
        sha = self.manifest.files[rel].sha256
        what = f"checkpoint file {rel} of {self.manifest.pipeline}/{self.manifest.element}"
        try:
            response = self.client.get(f"/checkpoints/blobs/{sha}{suffix}", params=params)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"node {self.node!r} cannot fetch {what} from {self.base}: {exc}"
            ) from exc
        if response.status_code != 200:
            raise Unavailable(f"{self.base} answered {response.status_code} for {what}{suffix}")
        return response

    def file(self, rel: str) -> bytes:
        return self._get(rel).content

    def chunks(self, rel: str) -> list[Chunk] | None:
        try:
            listing = FileChunks.model_validate_json(self._get(rel, "/chunks").content)
        except (Unavailable, ValueError):  # a source without chunk lists: the file comes whole
            return None
        return [(int(o), int(n), str(d)) for o, n, d in listing.chunks]

    def range(self, rel: str, offset: int, length: int) -> bytes:
        return self._get(rel, offset=offset, length=length).content


class Replicas:
    """The replica store of one node agent (``<home>/replicas``)."""

    def __init__(self, config: AgentConfig, runtime: NodeRuntime) -> None:
        self.config = config
        self.runtime = runtime
        self.store = CentralStore(config.home / "replicas", keep=2)
        # Installs from the copies here under way, by PE: a drop of one of those PEs is
        # refused meanwhile (see drop).
        self._installs: Counter[tuple[str, str]] = Counter()
        self._installs_lock = threading.Lock()

    def directory(self) -> NodeDirectory:
        """The orchestrator's node directory: the nodes this node may copy from.

        Raises:
            Unavailable: The orchestrator cannot be reached or refuses.
        """
        what = f"the orchestrator at {self.config.orchestrator_url}"
        try:
            response = httpx.get(
                f"{self.config.orchestrator_url.rstrip('/')}/nodes/{self.config.name}/directory",
                headers={"Authorization": f"Bearer {self.config.token}"},
                timeout=30,
                verify=tls_context(),
                trust_env=False,
            )
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"node {self.config.name!r} cannot ask {what} for its node directory: {exc}"
            ) from exc
        raise_for_error(response, what)
        return NodeDirectory.model_validate(response.json())

    def credentials(self, source: str | None) -> tuple[str, str]:
        """Where to fetch from and the token to send there: ``(base URL, token)``.

        ``None`` (or the orchestrator's own URL) is the central store, reached with this
        node's token; any other source must be a node of the orchestrator's directory,
        reached with that node's blob token.

        Raises:
            UnknownSource: ``source`` is no node of the directory; nothing was sent to it.
            Unavailable: The directory cannot be read.
        """
        if source is None or _same_url(source, self.config.orchestrator_url):
            return self.config.orchestrator_url, self.config.token
        nodes = self.directory().nodes
        for node in nodes:
            if _same_url(source, node.url):
                self._reachable(node.name, node.url)
                return node.url, node.blob_token
        raise UnknownSource(
            f"node {self.config.name!r} will not fetch checkpoint files from {source!r}: "
            "it is neither the orchestrator nor a node the orchestrator knows",
            expected="one of " + ", ".join([self.config.orchestrator_url, *(n.url for n in nodes)]),
            received=repr(source)[:200],
            hint="a checkpoint source is chosen by the orchestrator among the nodes' replicas",
        )

    def _reachable(self, node: str, url: str) -> None:
        """Refuse a node's URL that names this machine only (its loopback, or every
        address) unless this node is on the host's loopback itself: advertised there and
        listening there (or on every address). Under ``up --isolate`` a node listens in a
        namespace of its own, and on another machine a node's loopback is not the peer's:
        the fetch failed after a connect, and the peer's blob token went to whatever
        listened on that port here (an isolated node's Spark binds to its loopback).

        Raises:
            Unavailable: Such a URL; nothing was sent to it.
        """
        own = self.config.host
        here = _local_only(httpx.URL(self.config.url).host) and (
            is_loopback(own) or _unspecified(own)
        )
        if _local_only(httpx.URL(url).host) and not here:
            raise Unavailable(
                f"node {self.config.name!r} cannot fetch checkpoint files from node {node!r} "
                f"at {url}: that names the host's loopback, and this node is not on it (it "
                f"listens on {own}, at {self.config.url})",
                hint="the central store serves them instead",
            )

    def _source(self, manifest: CheckpointManifest, source: str | None) -> _BlobSource:
        base, token = self.credentials(source)
        client = httpx.Client(
            base_url=base,
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
            verify=tls_context(),
            trust_env=False,
            limits=client_limits(),
        )
        return _BlobSource(client, manifest, base, self.config.name)

    def copy(self, manifest: dict[str, Any], source: str | None) -> int:
        """Hold a whole copy of checkpoint ``manifest``, fetching missing files from ``source``
        (default: the orchestrator), of a large file only the chunks no file here holds.
        Returns the bytes fetched.

        Raises:
            InvalidName / InvalidInput: The manifest names an unsafe path (nothing fetched).
            UnknownSource: ``source`` is not a known node (nothing fetched).
            TornCheckpoint: A fetched file does not match its digest.
            Unavailable: The source cannot be reached.
        """
        check_manifest(manifest)  # its names, as paths: first, with the words for each
        try:
            shaped = CheckpointManifest.model_validate(manifest)
        except ValidationError as exc:  # (a 500 before)
            first = exc.errors()[0]
            raise InvalidInput(
                f"checkpoint manifest {manifest['id']} of {manifest['pipeline']}/"
                f"{manifest['element']} is not whole",
                expected="a manifest as a node's snapshot writes it (id, pipeline, element, "
                "batch, created, files)",
                received=f"{'.'.join(map(str, first['loc'])) or 'manifest'}: {message_of(first)}",
                hint="send the manifest whole, as the central store keeps it",
            ) from None
        blobs = self._source(shaped, source)
        try:
            shipped = self.store.put(manifest, blobs.file, blobs)
            assert shipped is not None  # (stored: no ``wanted`` to refuse it)
            return shipped
        finally:
            blobs.client.close()

    def install(
        self, pipeline: str, pe: str, manifest: dict[str, Any] | None, source: str | None
    ) -> InstallResult:
        """Make checkpoint ``manifest`` the local checkpoint of ``pipeline/pe`` (not running
        here), copying what is missing from ``source``; ``None`` clears it (start over).

        Raises:
            CheckpointError: The copy does not verify after the fetch.
        """
        fetched = 0
        # (A discard while the copy is fetched — the orchestrator gave up on this install —
        # must not be followed by the install: see NodeRuntime.discards.)
        discards = self.runtime.discards(pipeline, pe)
        with self._installing(pipeline, pe):
            if manifest is not None:
                fetched = self.copy(manifest, source)
                problem = self.store.verify(manifest)
                if problem is not None:
                    raise TornCheckpoint(
                        f"copy of checkpoint {manifest['id']} of {pipeline}/{pe} on node "
                        f"{self.config.name!r} is not whole: {problem}"
                    )
            self.runtime.install_from_store(pipeline, pe, self.store, manifest, discards)
        return InstallResult(fetched_bytes=fetched, source=source or "central")

    @contextlib.contextmanager
    def _installing(self, pipeline: str, pe: str) -> Iterator[None]:
        with self._installs_lock:
            self._installs[(pipeline, pe)] += 1
        try:
            yield
        finally:
            with self._installs_lock:
                self._installs[(pipeline, pe)] -= 1
                if not self._installs[(pipeline, pe)]:
                    del self._installs[(pipeline, pe)]

    def install_packed(
        self, pipeline: str, pe: str, data: bytes, digest: str, discards: int | None = None
    ) -> None:
        """Install a packed checkpoint (``spark_dir.pack``) as the PE's local one (not running
        here), the files and chunks it left out taken from the replicas here.

        Args:
            discards: ``NodeRuntime.discards`` when the request came (before its body was
                received and its left-out files filled in, which may take long).

        Raises:
            TornCheckpoint: The archive does not match ``digest``, or a file or chunk it left
                out is not here (any more): the sender then sends it whole.
            ElementBusy: The PE runs here, or was discarded since ``discards``.
        """
        if hashlib.sha256(data).hexdigest() != digest:
            raise TornCheckpoint(
                f"checkpoint of {pipeline}/{pe} for node {self.config.name!r} changed in transit"
            )
        filled = fill_omitted(data, self.store.blob_path, self.store.held_chunk)
        if filled is not None:
            data, digest = filled
        self.runtime.install_checkpoint(pipeline, pe, data, digest, discards)

    def drop(self, pipeline: str, pe: str) -> DroppedReplica:
        """Forget every copy of ``pipeline/pe`` here, and the files no other copy names.

        At once, whatever their age: every push touches the files it reuses, so a copy
        pushed within the store's horizon (ten minutes) kept them all, and a node that backs
        up nothing else never collected them. Copies under way are this store's puts, whose
        files a collection spares (:meth:`CentralStore.collect_garbage`).

        Raises:
            ElementBusy: The PE is being installed from its copy here (a restore in place
                on a node that came back without its disk: the orchestrator, seeing the
                copy of a PE placed on its own node, dropped it while it was read, and the
                restore failed at every try); the orchestrator asks again later.
        """
        with self._installs_lock:
            if self._installs[(pipeline, pe)]:
                raise ElementBusy(
                    f"node {self.config.name!r} is installing {pipeline}/{pe} from its copy "
                    "here: not dropped",
                    hint="drop it once the install is over",
                )
            held = bool(self.store.manifests(pipeline, pe))
            self.store.forget(pipeline, pe)
            blobs = self.store.collect_garbage(horizon_s=0)
        return DroppedReplica(pipeline=pipeline, element=pe, held=held, blobs=blobs)

    def drop_pipeline(self, pipeline: str) -> list[DroppedReplica]:
        """Forget every copy of ``pipeline``'s PEs here, as :meth:`drop` does each (the
        pipeline is deleted), and its emptied folder.

        Raises:
            ElementBusy: One is being installed from its copy here (see :meth:`drop`).
        """
        root = pipeline_folder(self.store.root / "checkpoints", pipeline)
        pes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        dropped = [self.drop(pipeline, pe) for pe in pes if NAME_PATTERN.fullmatch(pe)]
        with contextlib.suppress(OSError):  # (not empty: a file no copy is, kept)
            root.rmdir()
        return dropped

    def held(self) -> list[ReplicaInfo]:
        """The newest whole-looking copy per PE."""
        root = self.store.root / "checkpoints"
        out: list[ReplicaInfo] = []
        if not root.is_dir():
            return out
        for pipeline in sorted(p.name for p in root.iterdir() if p.is_dir()):
            for pe in sorted(p.name for p in (root / pipeline).iterdir() if p.is_dir()):
                m = self.store.newest(pipeline, pe)
                if m is not None:
                    out.append(
                        ReplicaInfo(pipeline=pipeline, element=pe, id=m["id"], batch=m["batch"],
                                    created=m["created"])
                    )  # fmt: skip
        return out


__all__ = ["CheckpointError", "Replicas"]
