"""A migration's checkpoint sent to the target without what the target holds as the PE's
backup (``migration.procedure.install_checkpoint``), and sent whole when the target no longer
holds it: a stand-in agent over real HTTP."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

import pytest

from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.exceptions import TornCheckpoint
from fogshift.checkpoint.spark_dir import OMITTED, pack
from fogshift.common.http import ServiceClient
from fogshift.migration.procedure import install_checkpoint
from tests.checkpoint.test_central import manifest
from tests.orchestrator.standin import standins

HERE = "/pipelines/p/elements/agg"
SST = "state/0/0/SSTs/000012.sst"


def names(archive: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return tar.getnames()


def test_the_target_gets_what_its_replica_lacks_and_the_whole_once_it_lacks_more(
    tmp_path: Path,
) -> None:
    state = random.Random(3).randbytes(2 * 1024 * 1024)
    origin = tmp_path / "origin"
    (origin / SST).parent.mkdir(parents=True)
    (origin / SST).write_bytes(state)
    (origin / "commits").mkdir()
    (origin / "commits" / "4").write_bytes(b"v1\n{}")
    whole, digest = pack(origin)
    # The central store's copy of what the target holds as the PE's backup: the state file.
    central = CentralStore(tmp_path / "central")
    files = {SST: state}
    central.put(manifest(3, files), files.__getitem__)
    held = central.blobs_of(central.manifests("p", "agg"))
    assert held is not None
    with standins("fog-b") as agents, ServiceClient(agents["fog-b"].url, "t", "fog-b", 10) as c:
        sent = install_checkpoint(c, HERE, whole, digest, held)
        (lean,) = agents["fog-b"].received("PUT", HERE + "/checkpoint")
        assert sent == len(lean.body) < len(state) // 100 and OMITTED in names(lean.body)
        assert install_checkpoint(c, HERE, whole, digest) == len(whole)  # nothing held
        # The target collected its replica since: it refuses, and gets the whole archive.
        agents["fog-b"].answer("PUT", HERE + "/checkpoint", 422,
                               {"code": "torn_checkpoint", "message": "gone"})  # fmt: skip
        with pytest.raises(TornCheckpoint):
            install_checkpoint(c, HERE, whole, digest, held)
        *_, again, fallback = agents["fog-b"].received("PUT", HERE + "/checkpoint")
        assert again.body == lean.body and fallback.body == whole
        assert hashlib.sha256(fallback.body).hexdigest() == digest
