"""A checkpoint sent to a PE's backup node without what its replica holds (``PUT
.../checkpoint`` filled from ``agent.replicas``): the node agent's real app, no Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from fogshift.agent import replicas as replicas_module
from fogshift.agent.app import create_app
from fogshift.checkpoint.central import CentralStore
from fogshift.checkpoint.chunks import file_chunks
from fogshift.checkpoint.spark_dir import lean_archive, pack
from fogshift.common.headers import SHA_HEADER
from fogshift.common.http import node_token
from tests.agent.test_agent_hostile import OPERATOR, client, config, home  # noqa: F401
from tests.checkpoint.test_central import manifest
from tests.checkpoint.test_chunks import Node, sst, values

OLD_SST, NEW_SST = "state/0/0/SSTs/000008.sst", "state/0/0/SSTs/000012.sst"


def test_a_backup_node_installs_what_it_was_sent_and_its_replica_the_rest(
    home: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    vals = values(9)
    # The node's replica of p/agg: RocksDB's SST as the last central pull had it.
    replica = Node({OLD_SST: sst(vals, [1] * 6), "offsets/0": b"o0"})
    pushed = manifest(0, replica.files)
    replicas = CentralStore(home / "nodes" / "fog-a" / "replicas", keep=2)
    replicas.put(pushed, replica.fetch, replica)
    # The checkpoint a migration copies: compacted since (the same values, new counts).
    origin = tmp_path / "origin"
    compacted = sst(vals, [5] * 6)
    for rel, data in {NEW_SST: compacted, "offsets/0": b"o0", "commits/0": b"c0"}.items():
        (origin / rel).parent.mkdir(parents=True, exist_ok=True)
        (origin / rel).write_bytes(data)
    whole, digest = pack(origin)
    held = replicas.blobs_of([pushed])
    assert held is not None
    lean = lean_archive(whole, held.digests, held.chunks)
    assert lean is not None and len(lean[0]) < len(compacted) / 4
    assert lean_archive(whole, {"0" * 64}, {"f" * 64}) is None  # nothing held: send it whole

    here = "/pipelines/p/elements/moved/checkpoint"
    answer = agent.put(here, content=lean[0], headers={SHA_HEADER: lean[1]})
    assert answer.status_code == 200, answer.text
    installed = home / "nodes" / "fog-a" / "checkpoints" / "p" / "moved"
    assert (installed / NEW_SST).read_bytes() == compacted
    assert (installed / "offsets" / "0").read_bytes() == b"o0"
    # A node that no longer holds what was left out refuses (the sender sends it whole),
    # as it refuses an archive that does not match its digest; nothing is installed.
    claimed = {*held.chunks, *(digest for _, _, digest in file_chunks(compacted))}
    gone = lean_archive(whole, held.digests, claimed)
    assert gone is not None
    for content, sha in ((gone[0], gone[1]), (lean[0], digest)):
        refused = agent.put(here.replace("moved", "other"), content=content,
                            headers={SHA_HEADER: sha})  # fmt: skip
        assert refused.status_code >= 400 and refused.json()["code"] == "torn_checkpoint"
    assert not (home / "nodes" / "fog-a" / "checkpoints" / "p" / "other").exists()


def test_a_replica_no_longer_needed_is_dropped_with_its_files(
    home: Path,  # noqa: F811
) -> None:
    # Nothing removed a backup node's copies: it kept every PE it ever backed up, twice.
    agent = client(create_app(config(home)), node_token(OPERATOR, "fog-a"))
    replicas = CentralStore(home / "nodes" / "fog-a" / "replicas", keep=2)
    kept = Node({"offsets/0": b"kept"})
    replicas.put({**manifest(0, kept.files), "element": "kept"}, kept.fetch, kept)
    gone = Node({"offsets/0": b"gone", "commits/0": b"c0"})
    replicas.put(manifest(0, gone.files), gone.fetch, gone)
    # Pushed just now (every push touches the files it reuses): collected at once all the
    # same (the ten-minute horizon kept them, for good on a node backing up nothing else).
    assert [r["element"] for r in agent.get("/replicas").json()] == ["agg", "kept"]
    answer = agent.delete("/replicas/p/agg")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"pipeline": "p", "element": "agg", "held": True, "blobs": 2}
    assert [r["element"] for r in agent.get("/replicas").json()] == ["kept"]
    assert agent.delete("/replicas/p/agg").json()["held"] is False  # (again: nothing)
    assert agent.delete("/replicas/p/bad.name").status_code == 422
    assert client(create_app(config(home)), "x" * 40).delete("/replicas/p/kept").status_code == 401


def test_a_checkpoint_discarded_while_its_left_out_files_are_filled_in_is_not_installed(
    home: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The orchestrator gave up on a migration's PUT while the node filled in what the
    archive left out (from its replicas: a large state's worth of reading) and discarded the
    PE there. The install counted discards only once it began, after the fill, and put a
    whole checkpoint on a node that does not run the PE; the agent now counts them when the
    request comes, and refuses."""
    app = create_app(config(home))
    agent = client(app, node_token(OPERATOR, "fog-a"))
    origin = tmp_path / "origin"
    for rel, data in {"offsets/0": b"o0", "commits/0": b"c0"}.items():
        (origin / rel).parent.mkdir(parents=True, exist_ok=True)
        (origin / rel).write_bytes(data)
    data, digest = pack(origin)
    real = replicas_module.fill_omitted

    def discarded_meanwhile(*args: object) -> object:
        app.state.runtime.remove("p", "moved", discard=True)  # the orchestrator's roll-back
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(replicas_module, "fill_omitted", discarded_meanwhile)
    here = "/pipelines/p/elements/moved/checkpoint"
    refused = agent.put(here, content=data, headers={SHA_HEADER: digest})
    assert refused.status_code == 409 and refused.json()["code"] == "element_busy", refused.text
    assert "discarded" in refused.json()["message"]
    installed = home / "nodes" / "fog-a" / "checkpoints" / "p" / "moved"
    assert not installed.exists() and not installed.with_name("moved.incoming").exists()
    monkeypatch.setattr(replicas_module, "fill_omitted", real)
    answer = agent.put(here, content=data, headers={SHA_HEADER: digest})  # asked again
    assert answer.status_code == 200, answer.text
    assert (installed / "commits" / "0").read_bytes() == b"c0"


def test_a_replica_being_installed_is_not_dropped(
    home: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A node back without its disk is restored in place from its replica of the PE; the
    # orchestrator, seeing a copy of a PE placed on its own node, dropped it meanwhile: its
    # files went while they were read, and the restore failed at every try.
    from types import SimpleNamespace

    from fogshift.agent.exceptions import ElementBusy

    cfg = config(home)
    node = Node({"offsets/0": b"o0", "commits/0": b"c0"})
    pushed = manifest(0, node.files)
    refusals: list[str] = []

    def install_from_store(pipeline: str, pe: str, store: CentralStore, m: dict, d: int) -> None:
        try:
            held.drop("p", "agg")  # the orchestrator's DELETE, while the files are read
        except ElementBusy as exc:
            refusals.append(exc.message)
        assert store.verify(m) is None  # every file still there

    runtime = SimpleNamespace(discards=lambda p, e: 0, install_from_store=install_from_store)
    held = replicas_module.Replicas(cfg, runtime)  # type: ignore[arg-type]
    held.store.put(pushed, node.fetch, node)
    monkeypatch.setattr(held, "copy", lambda manifest, source: 0)  # held here already
    held.install("p", "agg", pushed, None)
    assert len(refusals) == 1 and "installing p/agg" in refusals[0]
    dropped = held.drop("p", "agg")  # once it is over
    assert dropped.held and dropped.blobs == 2


def test_a_deleted_pipelines_copies_go_with_their_files(home: Path) -> None:  # noqa: F811
    # `fogshift delete`: its copies stayed as files until the orchestrator's next sweep of
    # stale replicas, and its emptied folder for good.
    from types import SimpleNamespace

    node = Node({"offsets/0": b"o0", "commits/0": b"c0"})
    runtime = SimpleNamespace(discards=lambda p, e: 0)
    held = replicas_module.Replicas(config(home), runtime)  # type: ignore[arg-type]
    for pipeline, pe in (("p", "agg"), ("p", "src"), ("q", "agg")):
        pushed = {**manifest(0, node.files), "pipeline": pipeline, "element": pe}
        held.store.put(pushed, node.fetch, node)
    dropped = held.drop_pipeline("p")
    assert [(d.element, d.held) for d in dropped] == [("agg", True), ("src", True)]
    assert [(r.pipeline, r.element) for r in held.held()] == [("q", "agg")]
    assert not (held.store.root / "checkpoints" / "p").exists()
    assert held.store.verify(held.store.newest("q", "agg")) is None  # q's files are kept
    assert held.drop_pipeline("never") == []
