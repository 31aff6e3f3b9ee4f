"""A node taken out of the cluster (``fogshift remove-node``): refused while it hosts
something, then forgotten, its token refused, and nothing placed there, even by a choice made
before its removal (real SQLite registry; the orchestrator's app in process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from fogshift.common.http import blob_token, node_token
from fogshift.contracts import Heartbeat
from fogshift.orchestrator.exceptions import NodeInUse, NodeRemoved, UnknownNode
from fogshift.orchestrator.registry import Registry
from fogshift.orchestrator.service import Orchestrator
from tests.orchestrator.conftest import OPERATOR
from tests.orchestrator.test_orchestrator_access import as_, beat
from tests.orchestrator.test_registry import spec


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "orchestrator.db")
    for node in ("cloud", "fog-a", "fog-b"):
        reg.heartbeat(node, Heartbeat(url="http://127.0.0.1:9"))
    yield reg
    reg.close()


def test_a_node_is_removed_only_once_nothing_is_placed_there_or_names_it(
    registry: Registry, tmp_path: Path
) -> None:
    def holds() -> list[tuple[str, str]]:
        return [(h.kind, h.text) for h in registry.holding("fog-a")]

    registry.put_pipeline(spec(tmp_path), "running")  # its sink on fog-a
    with pytest.raises(NodeInUse, match=r"'fog-a' still hosts or is named by PE p/sink"):
        registry.remove_node("fog-a")
    assert holds() == [("pe", "PE p/sink")]
    registry.set_placement("p", "sink", "fog-b")
    registry.add_standby("p", "source", "fog-a")
    with pytest.raises(NodeInUse, match=r"the standby of p/source"):
        registry.remove_node("fog-a")
    assert holds() == [("standby", "the standby of p/source")]
    assert registry.holding("fog-a", besides=[("p", "source")]) == []
    registry.drop_standby("p", "source")
    op = registry.begin_operation("migration", "p", "sink", "fog-b", "fog-a", "me", "preparing")
    with pytest.raises(NodeInUse, match=r"an unfinished migration of p/sink"):
        registry.remove_node("fog-a")
    assert holds() == [("operation", "an unfinished migration of p/sink")]
    registry.finish(op.id, "rolled back")
    scale = registry.begin_scale("p", "sink", 2, None, False, "me")  # it may choose any node
    with pytest.raises(NodeInUse, match=r"an unfinished scale of p/sink"):
        registry.remove_node("fog-a")
    assert holds() == [("scale", "an unfinished scale of p/sink")]
    registry.end_scale(scale.id, "failed")
    assert holds() == []
    registry.set_placement("p", "sink", "fog-a")
    for status, doing in (("deploying", "deployed"), ("stopping", "stopped")):
        # (Its own kind: a drain moves a running pipeline's PEs only.)
        registry.set_status("p", status)
        assert holds() == [("settling", f"PE p/sink of a pipeline being {doing}")]
    registry.set_placement("p", "sink", "fog-b")
    assert registry.node("fog-a") is not None  # each refusal changed nothing
    registry.set_status("p", "stopped")  # a stopped pipeline's placement does not hold it
    registry.set_placement("p", "sink", "fog-a")
    registry.remove_node("fog-a")
    assert registry.node("fog-a") is None
    assert registry.removed_nodes() == {"fog-a"}


def test_nothing_is_placed_on_a_removed_node_even_by_an_earlier_choice(
    registry: Registry, tmp_path: Path
) -> None:
    """A deploy's spec was checked, a restore's target picked, before the removal: their
    writes come after it and are refused inside their transactions."""
    registry.put_pipeline(spec(tmp_path, ("source",)), "running")  # on cloud
    registry.remove_node("fog-a")
    with pytest.raises(UnknownNode, match=r"'fog-a' was removed .* p/sink cannot be placed"):
        registry.put_pipeline(spec(tmp_path), "running")
    assert registry.get_pipeline("p").placement == {"source": "cloud"}  # rolled back
    for write in (
        lambda: registry.set_placement("p", "source", "fog-a"),
        lambda: registry.add_standby("p", "source", "fog-a"),
        lambda: registry.begin_operation("restore", "p", "source", "cloud", "fog-a", "me", "x"),
    ):
        with pytest.raises(UnknownNode, match="was removed"):
            write()
    op = registry.begin_operation("migration", "p", "source", "cloud", "fog-b", "me", "x")
    with pytest.raises(NodeInUse):
        registry.remove_node("fog-b")
    registry.finish(op.id, "done")
    assert registry.get_pipeline("p").placement == {"source": "cloud"}
    assert registry.standbys() == []
    # Its heartbeats are refused until it is admitted again.
    with pytest.raises(NodeRemoved, match="'fog-a' was removed"):
        registry.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:9"))
    assert registry.node("fog-a") is None
    assert registry.admit_node("fog-a") == 1  # its next generation
    assert registry.admit_node("fog-a") == 1  # (once: it was not removed any more)
    assert registry.admit_node("fog-b") == 0  # (never removed)
    assert registry.generations() == {"fog-a": 1}
    # A heartbeat made with the token of before (a request of the machine taken out that
    # outlasted the admission) is refused in the write itself: its address is not taken.
    with pytest.raises(NodeRemoved, match="generation 0, and the node is in its generation 1"):
        registry.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:8"), generation=0)
    assert registry.node("fog-a") is None
    registry.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:9"), generation=1)
    with pytest.raises(NodeRemoved, match="generation 0, and the node is in its generation 1"):
        registry.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:8"), generation=0)
    assert registry.node("fog-a").url == "http://127.0.0.1:9"  # type: ignore[union-attr]
    registry.heartbeat("fog-b", Heartbeat(url="http://127.0.0.1:9"), generation=0)
    registry.set_placement("p", "source", "fog-a")
    assert registry.get_pipeline("p").placement == {"source": "fog-a"}


def test_a_removed_nodes_token_opens_nothing_until_it_is_admitted(app: FastAPI) -> None:
    orchestrator: Orchestrator = app.state.orchestrator
    operator = as_(app, OPERATOR)
    node = as_(app, node_token(OPERATOR, "fog-a"))
    other = as_(app, node_token(OPERATOR, "fog-b"))
    assert node.post("/nodes/fog-a/heartbeat", json=beat()).status_code == 200
    # Every node's heartbeat is answered with the nodes removed (none yet): each node
    # refuses their blob tokens.
    assert other.post("/nodes/fog-b/heartbeat", json=beat()).json() == {
        "ok": True,
        "removed": [],
        "generations": {},
    }
    # What keeps a node is the operator's to read; a node cannot remove itself or
    # another; the operator can.
    assert operator.get("/nodes/fog-a/holds").json() == []
    assert node.get("/nodes/fog-a/holds").status_code == 403
    # A drain's lease: the operator's only, a bounded number of seconds or null.
    assert node.put("/nodes/fog-a/leaving", json={"seconds": 60}).status_code == 403
    for bad in ({"seconds": 0}, {"seconds": 1e9}, {"seconds": "x"}, {}, {"secs": 60}):
        assert operator.put("/nodes/fog-a/leaving", json=bad).status_code == 422, bad
    assert operator.put("/nodes/fog-x/leaving", json={"seconds": 60}).status_code == 404
    assert operator.put("/nodes/fog-a/leaving", json={"seconds": 60}).status_code == 200
    assert orchestrator.leaving_nodes() == {"fog-a"}
    assert operator.put("/nodes/fog-a/leaving", json={"seconds": None}).status_code == 200
    assert orchestrator.leaving_nodes() == set()
    assert node.delete("/nodes/fog-a").status_code == 403
    assert other.delete("/nodes/fog-a").status_code == 403
    assert operator.delete("/nodes/fog-a").status_code == 200
    assert [n["name"] for n in operator.get("/nodes").json()] == ["fog-b"]
    for refused in (
        node.post("/nodes/fog-a/heartbeat", json=beat()),
        node.get("/nodes/fog-a/directory"),
        node.get("/checkpoints/blobs/" + "0" * 64),
    ):
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "node_removed"
    assert orchestrator.registry.node("fog-a") is None
    answer = other.post("/nodes/fog-b/heartbeat", json=beat())  # others go on
    # Told: refuse fog-a's blob tokens.
    assert answer.json() == {"ok": True, "removed": ["fog-a"], "generations": {}}
    names = [e["name"] for e in other.get("/nodes/fog-b/directory").json()["nodes"]]
    assert names == ["fog-b"]  # no peer copies from it any more
    # Asked again: nothing changes. Admitted (`up` adding it again): it joins in its next
    # generation, with a new token; the one the machine taken out holds stays refused.
    assert operator.delete("/nodes/fog-a").status_code == 200
    assert node.post("/nodes/fog-a/admit").status_code == 403  # (the operator's only)
    assert operator.post("/nodes/fog-a/admit").json() == {"name": "fog-a", "generation": 1}
    assert operator.post("/nodes/fog-a/admit").json()["generation"] == 1  # (once)
    assert operator.post("/nodes/fog-b/admit").json()["generation"] == 0  # (never removed)
    stale = node.post("/nodes/fog-a/heartbeat", json=beat())
    assert stale.status_code == 403 and stale.json()["code"] == "node_removed", stale.text
    assert "generation 0, and the node is in its generation 1" in stale.json()["message"]
    assert node.get("/nodes/fog-a/directory").status_code == 403
    assert orchestrator.registry.node("fog-a") is None
    # A request of the machine taken out whose token was checked before the admission and
    # whose heartbeat is recorded after it: refused all the same.
    with pytest.raises(NodeRemoved, match="generation 0, and the node is in its generation 1"):
        orchestrator.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:8"), 0)
    assert orchestrator.registry.node("fog-a") is None
    renewed = as_(app, node_token(OPERATOR, "fog-a", 1))
    assert renewed.post("/nodes/fog-a/heartbeat", json=beat()).json()["removed"] == []
    assert orchestrator.registry.node("fog-a") is not None
    # Every node is told its generation (to refuse the blob tokens of before), and the
    # directory hands out blob tokens of the generations now, both ways.
    answer = other.post("/nodes/fog-b/heartbeat", json=beat()).json()
    assert answer == {"ok": True, "removed": [], "generations": {"fog-a": 1}}
    tokens = {e["name"]: e["blob_token"]
              for e in other.get("/nodes/fog-b/directory").json()["nodes"]}  # fmt: skip
    assert tokens["fog-a"] == blob_token(node_token(OPERATOR, "fog-a", 1), "fog-b")
    tokens = {e["name"]: e["blob_token"]
              for e in renewed.get("/nodes/fog-a/directory").json()["nodes"]}  # fmt: skip
    assert tokens["fog-b"] == blob_token(node_token(OPERATOR, "fog-b"), "fog-a", 1)
    # The orchestrator calls the new agent with the new token.
    sent = orchestrator.agent("fog-a")._client.headers["Authorization"]
    assert sent == f"Bearer {node_token(OPERATOR, 'fog-a', 1)}"


def test_a_fresh_up_naming_a_removed_node_lets_it_join_again(tmp_path: Path) -> None:
    """The registry's refusals outlive `down`: `up` (the orchestrator not started yet)
    admits the nodes it names, or their agents would wait for answers that never come."""
    from fogshift.supervisor.cluster import _admit_in_registry

    registry = Registry(tmp_path / "orchestrator.db")
    registry.remove_node("fog-a")
    registry.remove_node("fog-b")
    registry.close()
    # Each in its generation, which `up` writes its token of.
    assert _admit_in_registry(tmp_path, ["cloud", "fog-a"]) == {"cloud": 0, "fog-a": 1}
    registry = Registry(tmp_path / "orchestrator.db")
    try:
        assert registry.removed_nodes() == {"fog-b"}  # (not named: still out)
        assert registry.generations() == {"fog-a": 1}
        registry.heartbeat("fog-a", Heartbeat(url="http://127.0.0.1:9"))
    finally:
        registry.close()
    # No registry yet: nothing to do, every node in generation 0.
    assert _admit_in_registry(tmp_path / "none", ["fog-a"]) == {"fog-a": 0}
    assert not (tmp_path / "none").exists()
