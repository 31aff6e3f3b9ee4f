"""The cluster file: written whole or not at all; a bad one is a clear error, not a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fogshift.exceptions import InvalidInput
from fogshift.supervisor.cluster import (
    ClusterFile,
    ProcessInfo,
    cluster_file,
    cluster_running,
    load_cluster,
    save_cluster,
    token_file,
)
from fogshift.supervisor.exceptions import NotUp


def a_cluster(orchestrator_pid: int = 4242) -> ClusterFile:
    return ClusterFile(
        orchestrator=ProcessInfo(
            pid=orchestrator_pid, pgid=orchestrator_pid, url="http://127.0.0.1:1"
        ),
        broker=None,
        nodes={"fog-a": ProcessInfo(pid=4243, pgid=4243, url="http://127.0.0.1:2")},
        broker_url="nats://127.0.0.1:3",
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    token_file(tmp_path).write_text("secret\n")
    return tmp_path


def test_saved_cluster_loads_back_and_leaves_no_temporary_file(home: Path) -> None:
    save_cluster(home, a_cluster())
    cluster, token = load_cluster(home)
    assert cluster == a_cluster() and token == "secret"
    assert sorted(p.name for p in home.iterdir()) == ["cluster.json", "token"]
    # Private: an external broker's URL may carry its user and password.
    assert cluster_file(home).stat().st_mode & 0o777 == 0o600


def test_a_write_that_fails_midway_leaves_the_previous_file_whole(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_cluster(home, a_cluster(1))
    before = cluster_file(home).read_text()

    def crash(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_cluster(home, a_cluster(2))
    assert cluster_file(home).read_text() == before
    assert sorted(p.name for p in home.iterdir()) == ["cluster.json", "token"]


@pytest.mark.parametrize(
    ("content", "received"),
    [
        (b'{"orchestrator": {"pid": 1', "Invalid JSON"),
        (b"", "Invalid JSON"),
        (b'{"orchestrator": {"pid": 1, "pgid": 1}}', "missing (required)"),
        (b"\xff\xfe\x00garbage", "not text"),
    ],
    ids=["truncated", "empty", "wrong-shape", "binary"],
)
def test_a_corrupt_file_names_itself_what_was_expected_and_what_to_do(
    home: Path, content: bytes, received: str
) -> None:
    cluster_file(home).write_bytes(content)
    with pytest.raises(InvalidInput) as caught:
        load_cluster(home)
    error = caught.value
    assert str(cluster_file(home)) in error.message
    assert error.expected is not None and "fogshift up" in error.expected
    assert error.received is not None and received in error.received
    assert error.hint is not None and "delete the file" in error.hint
    assert not cluster_running(home)  # the liveness probe just says "no"


def test_an_unreadable_file_is_the_same_clear_error(home: Path) -> None:
    cluster_file(home).mkdir()  # reading it fails with an OSError
    with pytest.raises(InvalidInput, match="cannot read the cluster file") as caught:
        load_cluster(home)
    assert caught.value.received is not None and "IsADirectoryError" in caught.value.received


def test_no_file_still_means_no_cluster(home: Path) -> None:
    with pytest.raises(NotUp) as caught:
        load_cluster(home)
    # What was expected and received, as every refusal says (a review found only a hint).
    assert caught.value.expected == "the file cluster.json, which `fogshift up` writes in its home"
    assert caught.value.received == f"{str(home / 'cluster.json')!r}, which does not exist"


def test_a_token_this_user_cannot_read_is_a_refusal_not_a_traceback(home: Path) -> None:
    # `sudo fogshift up --isolate`, then `fogshift net show` as an ordinary user: the 0600
    # token raised PermissionError through the CLI.
    save_cluster(home, a_cluster())
    token_file(home).unlink()
    token_file(home).mkdir()  # unreadable as a file, whoever runs the test (root too)
    with pytest.raises(InvalidInput) as caught:
        load_cluster(home)
    assert "operator token" in caught.value.message and caught.value.hint


def test_an_isolated_node_that_died_is_told_to_come_back_isolated_with_its_links(
    home: Path,
) -> None:
    # "`fogshift down`, then `fogshift up`" brought the cluster back without isolation.
    from fogshift.network.links import parse_link_profile
    from fogshift.network.namespaces import NodeLink
    from fogshift.supervisor.cluster import IsolatedNode, restart_nodes

    def isolated(node: str, profile: str) -> IsolatedNode:
        link = NodeLink(node=node, home=str(home), namespace=f"ns-{node}", host_if="h",
                        ns_if="n", subnet="10.0.0.0/30", host_ip="10.0.0.1", ns_ip="10.0.0.2",
                        profile=parse_link_profile(profile, node))  # fmt: skip
        return IsolatedNode(link=link, relay=ProcessInfo(pid=1, pgid=1), routes={})

    cluster = a_cluster().model_copy(update={
        "nodes": {n: ProcessInfo(pid=9, pgid=9) for n in ("cloud", "fog-a")},
        "network": {"cloud": isolated("cloud", "n0"), "fog-a": isolated("fog-a", "10mbit,n100")},
    })  # fmt: skip
    with pytest.raises(InvalidInput, match="cannot be started alone") as refused:
        restart_nodes(home, cluster, ["fog-a"], 1.0, lambda _: None)
    assert refused.value.hint == (
        "`fogshift down`, then `fogshift up --nodes cloud,fog-a --isolate --link fog-a=10mbit,n100`"
    )


def test_a_fresh_isolated_run_says_which_links_it_starts_otherwise_than_the_last(
    home: Path,
) -> None:
    # A plain `up --isolate` after `down` started every link at n0, without a word.
    from fogshift.network.links import parse_link_profile
    from fogshift.supervisor.cluster import LAST_LINKS, _say_changed_links

    said: list[str] = []
    first = {"cloud": parse_link_profile("n0"), "fog-a": parse_link_profile("10mbit,n100")}
    _say_changed_links(home, first, said.append)
    assert said == []  # (no run before)
    again = {"cloud": parse_link_profile("n0"), "fog-a": parse_link_profile("n0"),
             "fog-b": parse_link_profile("n100")}  # fmt: skip
    _say_changed_links(home, again, said.append)
    assert said == [
        "warning: this home's last isolated run had the links fog-a=10mbit,n100; this one "
        "starts them as fog-a=n0 (give --link NODE=PROFILE to set them as before)"
    ]
    (home / LAST_LINKS).write_text("not json")  # (unreadable: as if none)
    _say_changed_links(home, again, said.append)
    assert len(said) == 1
