"""Central-level checkpoints: content-addressed copies of node-level snapshots.

The same store holds the extra copies a node keeps as a PE's planned backup
(``fogshift.agent.replicas``).

The orchestrator pulls each PE's newest node-level snapshot at its own interval. Files are
stored once per content (``blobs/<sha256>``), so a pull ships only the files that changed
since any earlier pull — what is shipped grows with what changed, not with the state. A
checkpoint becomes visible when its manifest is written (atomically, after every blob it
names is in place). Reading verifies every blob's size and digest; a checkpoint that fails is
torn, and the previous one is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fogshift.checkpoint.exceptions import CheckpointError, TornCheckpoint
from fogshift.exceptions import InvalidInput, NotFound

_SHA = re.compile(r"^[0-9a-f]{64}$")


class CentralStore:
    """The central checkpoint store of one orchestrator.

    Args:
        root: Its folder.
        keep: How many checkpoints to keep per PE.
    """

    def __init__(self, root: Path, keep: int = 3) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def _folder(self, pipeline: str, pe: str) -> Path:
        return self.root / "checkpoints" / pipeline / pe

    def manifests(self, pipeline: str, pe: str) -> list[dict[str, Any]]:
        """Every visible checkpoint of a PE, newest first."""
        folder = self._folder(pipeline, pe)
        if not folder.is_dir():
            return []
        out = []
        for path in sorted(folder.glob("*.json"), reverse=True):
            try:
                out.append(dict(json.loads(path.read_text())))
            except (OSError, ValueError):
                continue  # a manifest that cannot be read is as good as absent
        return out

    def put(self, manifest: dict[str, Any], fetch: Callable[[str], bytes]) -> int:
        """Store a node-level snapshot, fetching only unknown files; returns bytes shipped.

        Args:
            manifest: The snapshot's manifest.
            fetch: Returns the bytes of one file of the snapshot, by relative path.

        Raises:
            TornCheckpoint: A fetched file does not match the manifest's digest.
        """
        shipped = 0
        for rel, entry in manifest["files"].items():
            blob = self.blobs / entry["sha256"]
            if blob.exists() and blob.stat().st_size == entry["size"]:
                os.utime(blob)  # in use again: out of reach of a concurrent collection
                continue
            data = fetch(rel)
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise TornCheckpoint(
                    f"file {rel} of checkpoint {manifest['id']} of "
                    f"{manifest['pipeline']}/{manifest['element']} changed in transit"
                )
            tmp = blob.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(blob)
            shipped += len(data)
        folder = self._folder(manifest["pipeline"], manifest["element"])
        folder.mkdir(parents=True, exist_ok=True)
        stored = {**manifest, "stored": time.time(), "shipped_bytes": shipped}
        tmp = folder / f".{manifest['id']}.tmp"
        tmp.write_text(json.dumps(stored))
        tmp.replace(folder / f"{manifest['id']}.json")
        expired = sorted(folder.glob("*.json"), reverse=True)[self.keep :]
        for old in expired:
            old.unlink(missing_ok=True)
        if expired:
            self.collect_garbage()
        return shipped

    def collect_garbage(self) -> int:
        """Delete blobs no kept checkpoint names; returns how many.

        Without it the store would grow with every changed file forever. A blob is written
        before the manifest naming it, so one that is being stored right now (its manifest
        not yet visible) is spared by age.
        """
        referenced: set[str] = set()
        for manifest_file in (self.root / "checkpoints").glob("*/*/*.json"):
            try:
                files = json.loads(manifest_file.read_text())["files"]
            except (OSError, ValueError, KeyError):
                continue
            referenced.update(entry["sha256"] for entry in files.values())
        removed = 0
        horizon = time.time() - 600
        for blob in self.blobs.iterdir():
            if blob.name in referenced:
                continue
            try:
                if blob.stat().st_mtime < horizon:
                    blob.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def blob_path(self, sha: str) -> Path:
        """The file of blob ``sha`` (served to nodes that copy a checkpoint).

        Raises:
            InvalidInput: ``sha`` is not a sha256 in hex.
            NotFound: The store does not hold it.
        """
        if not _SHA.match(sha):
            raise InvalidInput(
                "bad checkpoint blob name", expected="a sha256 in hex", received=repr(sha)[:80]
            )
        path = self.blobs / sha
        if not path.is_file():
            raise NotFound(f"no checkpoint blob {sha[:12]}… in {self.root}")
        return path

    def verify(self, manifest: dict[str, Any]) -> str | None:
        """Why a checkpoint is unusable (missing or corrupt blob), or ``None`` if it is whole."""
        for rel, entry in manifest["files"].items():
            blob = self.blobs / entry["sha256"]
            if not blob.exists():
                return f"file {rel} is missing"
            if blob.stat().st_size != entry["size"]:
                return f"file {rel} has {blob.stat().st_size} bytes, not {entry['size']}"
            digest = hashlib.sha256(blob.read_bytes()).hexdigest()
            if digest != entry["sha256"]:
                return f"file {rel} is corrupt (sha256 {digest[:12]}…)"
        return None

    def latest_whole(self, pipeline: str, pe: str) -> tuple[dict[str, Any], list[str]]:
        """The newest checkpoint that verifies, and why newer ones were skipped.

        Raises:
            CheckpointError: No whole checkpoint exists.
        """
        skipped: list[str] = []
        for manifest in self.manifests(pipeline, pe):
            problem = self.verify(manifest)
            if problem is None:
                return manifest, skipped
            skipped.append(f"{manifest['id']}: {problem}")
        raise CheckpointError(
            f"no usable central checkpoint of {pipeline}/{pe}"
            + (f" (skipped: {'; '.join(skipped)})" if skipped else ""),
            hint="central checkpoints are pulled every 15 s from the node; none was taken yet",
        )

    def materialize(self, manifest: dict[str, Any], target: Path) -> None:
        """Rebuild a checkpoint directory from its blobs."""
        if target.exists():
            shutil.rmtree(target)
        for rel, entry in manifest["files"].items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.blobs / entry["sha256"], path)
