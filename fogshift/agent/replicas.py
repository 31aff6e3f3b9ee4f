"""Checkpoint copies a node keeps for PEs it may have to take over (planned backups).

The orchestrator tells a PE's planned backup node to copy each new central checkpoint; the
node fetches only the files it does not hold yet (content-addressed, like the central
store) from a *source* — the orchestrator's central store or another node's replicas; both
serve ``GET /checkpoints/blobs/{sha256}``. A restore installs a checkpoint the same way,
from the nearest copy, so a restore onto the backup node moves nothing over the network.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from fogshift.agent.config import AgentConfig
from fogshift.agent.node import NodeRuntime
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.exceptions import CheckpointError, TornCheckpoint
from fogshift.exceptions import Unavailable


class Replicas:
    """The replica store of one node agent (``<home>/replicas``)."""

    def __init__(self, config: AgentConfig, runtime: NodeRuntime) -> None:
        self.config = config
        self.runtime = runtime
        self.store = CentralStore(config.home / "replicas", keep=2)

    def _fetcher(self, manifest: dict[str, Any], source: str | None) -> Callable[[str], bytes]:
        base = source or self.config.orchestrator_url
        client = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {self.config.token}"}, timeout=120
        )

        def fetch(rel: str) -> bytes:
            sha = manifest["files"][rel]["sha256"]
            try:
                response = client.get(f"/checkpoints/blobs/{sha}")
            except httpx.HTTPError as exc:
                raise Unavailable(
                    f"node {self.config.name!r} cannot fetch checkpoint file {rel} of "
                    f"{manifest['pipeline']}/{manifest['element']} from {base}: {exc}"
                ) from exc
            if response.status_code != 200:
                raise Unavailable(
                    f"{base} answered {response.status_code} for checkpoint file {rel} of "
                    f"{manifest['pipeline']}/{manifest['element']}"
                )
            return response.content

        fetch.close = client.close  # type: ignore[attr-defined]
        return fetch

    def copy(self, manifest: dict[str, Any], source: str | None) -> int:
        """Hold a whole copy of checkpoint ``manifest``, fetching missing files from ``source``
        (default: the orchestrator). Returns the bytes fetched.

        Raises:
            TornCheckpoint: A fetched file does not match its digest.
            Unavailable: The source cannot be reached.
        """
        fetch = self._fetcher(manifest, source)
        try:
            return self.store.put(manifest, fetch)
        finally:
            fetch.close()  # type: ignore[attr-defined]

    def install(
        self, pipeline: str, pe: str, manifest: dict[str, Any] | None, source: str | None
    ) -> dict[str, Any]:
        """Make checkpoint ``manifest`` the local checkpoint of ``pipeline/pe`` (not running
        here), copying what is missing from ``source``; ``None`` clears it (start over).

        Raises:
            CheckpointError: The copy does not verify after the fetch.
        """
        fetched = 0
        if manifest is not None:
            fetched = self.copy(manifest, source)
            problem = self.store.verify(manifest)
            if problem is not None:
                raise TornCheckpoint(
                    f"copy of checkpoint {manifest['id']} of {pipeline}/{pe} on node "
                    f"{self.config.name!r} is not whole: {problem}"
                )
        self.runtime.install_from_store(pipeline, pe, self.store, manifest)
        return {"fetched_bytes": fetched, "source": source or "central"}

    def held(self) -> list[dict[str, Any]]:
        """The newest whole-looking copy per PE: ``{pipeline, element, id, batch, created}``."""
        root = self.store.root / "checkpoints"
        out: list[dict[str, Any]] = []
        if not root.is_dir():
            return out
        for pipeline in sorted(p.name for p in root.iterdir() if p.is_dir()):
            for pe in sorted(p.name for p in (root / pipeline).iterdir() if p.is_dir()):
                manifests = self.store.manifests(pipeline, pe)
                if manifests:
                    m = manifests[0]
                    out.append(
                        {"pipeline": pipeline, "element": pe, "id": m["id"],
                         "batch": m["batch"], "created": m["created"]}
                    )  # fmt: skip
        return out


__all__ = ["CheckpointError", "Replicas"]
