"""Which node may touch which PE's streams, as placement and operations change."""

from __future__ import annotations

from pathlib import Path

from fogshift.broker.permissions import Hosted, node_permissions
from fogshift.orchestrator.permissions import BrokerPermissions, hosted_by_node
from fogshift.orchestrator.registry import Registry
from fogshift.spec import parse_spec


def spec() -> dict:
    return {
        "pipeline": "p",
        "elements": [
            {"id": "src", "kind": "csv-source", "node": "cloud", "options": {"path": "in.csv"}},
            {"id": "agg", "kind": "window-aggregate", "node": "fog-a", "inputs": ["src"],
             "options": {"field": "value", "window": 3, "function": "avg"}},
        ],
    }  # fmt: skip


def names(hosted: dict[str, list[Hosted]]) -> dict[str, list[str]]:
    return {node: [h.element for h in pes] for node, pes in hosted.items() if pes}


def test_rights_follow_placement_operations_and_status(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "o.db")
    registry.put_pipeline(parse_spec(spec(), tmp_path), "running")
    assert names(hosted_by_node(registry)) == {"cloud": ["src"], "fog-a": ["agg"]}
    assert hosted_by_node(registry)["fog-a"] == [Hosted("p", "agg", ("src",))]

    # A migration: origin and target both hold the PE until it ends.
    op = registry.begin_operation("migration", "p", "agg", "fog-a", "fog-b", "me", "preparing")
    assert names(hosted_by_node(registry)) == {
        "cloud": ["src"], "fog-a": ["agg"], "fog-b": ["agg"]
    }  # fmt: skip
    registry.route(op.id, "fog-b")
    registry.finish(op.id, "migrated")
    assert names(hosted_by_node(registry)) == {"cloud": ["src"], "fog-b": ["agg"]}

    # A restore: the node it leaves loses the PE at once.
    registry.begin_operation("restore", "p", "agg", "fog-b", "fog-a", "me", "fencing", True)
    assert names(hosted_by_node(registry)) == {"cloud": ["src"], "fog-a": ["agg"]}

    registry.set_status("p", "stopped")
    assert names(hosted_by_node(registry)) == {"fog-a": ["agg"]}  # the restore still runs
    registry.close()


def test_a_pipeline_whose_streams_are_being_made_gives_no_node_rights(tmp_path: Path) -> None:
    # A deploy withholds them until each stream and its fence marker is made: a round's
    # sync meanwhile let a node that missed the last stop append ahead of a marker.
    registry = Registry(tmp_path / "o.db")
    registry.put_pipeline(parse_spec(spec(), tmp_path), "deploying")
    registry.begin_operation("restore", "p", "agg", "fog-a", "fog-b", "me", "fencing", True)
    assert names(hosted_by_node(registry)) == {"cloud": ["src"], "fog-b": ["agg"]}
    assert names(hosted_by_node(registry, {"p"})) == {}
    permissions = BrokerPermissions(None, None)
    with permissions.withholding("p"):
        assert permissions._withheld == {"p"}
    assert permissions._withheld == set()
    registry.close()


def test_a_standby_node_holds_the_rights_of_the_pe_it_stands_by_for(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "o.db")
    registry.put_pipeline(parse_spec(spec(), tmp_path), "running")
    registry.add_standby("p", "agg", "fog-b")
    assert names(hosted_by_node(registry)) == {"cloud": ["src"], "fog-a": ["agg"], "fog-b": ["agg"]}
    # Standing by, it reads (its inputs, the PE's stream) and writes nothing of the PE's.
    (standing,) = hosted_by_node(registry)["fog-b"]
    assert standing.standby and not hosted_by_node(registry)["fog-a"][0].standby
    allow = node_permissions("fog-b", [standing])["publish"]["allow"]
    assert not {"fs.p.agg.data", "fs.p.agg.dead", "fs.p.agg.cut"} & set(allow)
    assert {"fsjs.API.STREAM.MSG.GET.FS_p_agg", "fsjs.API.DIRECT.GET.FS_p_src"} <= set(allow)
    # Promoted: the lost node loses the PE at once, the standby's node holds it (before
    # its gate opens: the promotion is journaled first).
    epoch = registry.add_standby("p", "agg", "fog-b")
    op = registry.begin_operation("restore", "p", "agg", "fog-a", "fog-b", "me", "starting",
                                  epoch=epoch)  # fmt: skip
    assert names(hosted_by_node(registry)) == {"cloud": ["src"], "fog-b": ["agg"]}
    (promoted,) = hosted_by_node(registry)["fog-b"]
    assert not promoted.standby
    allow = node_permissions("fog-b", [promoted])["publish"]["allow"]
    assert {"fs.p.agg.data", "fs.p.agg.dead", "fs.p.agg.cut"} <= set(allow)
    registry.route(op.id, "fog-b")
    registry.finish(op.id, "restored")
    assert names(hosted_by_node(registry)) == {"cloud": ["src"], "fog-b": ["agg"]}
    registry.drop_standby("p", "agg")
    registry.close()


def test_node_permissions_name_only_the_hosted_streams() -> None:
    perms = node_permissions("fog-a", [Hosted("p", "agg", ("src",))])
    allow = perms["publish"]["allow"]
    assert "fs.p.agg.data" in allow and "fs.p.agg.cut" in allow
    assert "fs.p.agg.fence" not in allow and "fs.p.src.data" not in allow
    # Direct gets only: a consumer's creator names the subject it is delivered on (any
    # other stream's), which no permission can confine.
    assert not any(a.startswith("fsjs.API.CONSUMER") for a in allow)
    assert "fsjs.API.DIRECT.GET.FS_p_src" in allow and "fsjs.API.DIRECT.GET.FS_p_agg" not in allow
    assert not any(a.startswith("fsjs.API.STREAM.DELETE") for a in allow)
    # Its own inbox (not every client's: the broker's replies to others), and its input's
    # data as it is stored (what wakes a reader waiting for it).
    assert perms["subscribe"]["allow"] == ["_INBOX_node-fog-a.>", "fs.p.src.data"]
    assert node_permissions("fog-a", [])["publish"]["allow"] == ["_INBOX.none"]


def test_an_external_broker_is_not_managed(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "o.db")
    assert BrokerPermissions(None, None).sync(registry) is False
    registry.close()


def test_a_broker_pid_another_process_has_now_is_never_signalled(tmp_path: Path) -> None:
    """The broker's start is the one ``fogshift up`` recorded (or read when the orchestrator
    starts): SIGHUP, which ends most processes, went to whatever had a dead broker's pid."""
    import signal
    import subprocess

    import pytest

    from fogshift.broker.exceptions import BrokerError
    from fogshift.broker.permissions import BrokerUsers, new_user_seed, users_file
    from fogshift.common.processes import started_at

    config = tmp_path / "nats.conf"
    config.write_text("listen: 127.0.0.1:1\n")
    BrokerUsers(new_user_seed(), {"fog-a": new_user_seed()}).save(users_file(config))
    registry = Registry(tmp_path / "o.db")
    registry.put_pipeline(parse_spec(spec(), tmp_path), "running")
    other = subprocess.Popen(  # has the dead broker's pid, say; ends on SIGHUP
        ["sleep", "60"], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)
    )  # (under nohup, SIGHUP is ignored and stays so in every child)
    try:
        ours = started_at(other.pid)
        assert ours is not None
        for recorded in (ours + 1.0, None):
            permissions = BrokerPermissions(config, other.pid, recorded)
            if recorded is None:
                permissions.started = None  # (gone when the orchestrator started)
            with pytest.raises(BrokerError, match="gone"):
                permissions.sync(registry)
            assert other.poll() is None  # not signalled
        # The very process: signalled (sleep ends on SIGHUP).
        assert BrokerPermissions(config, other.pid, ours).sync(registry) is True
        assert other.wait(10) == -1
    finally:
        other.kill()
        other.wait()
        registry.close()


def test_a_nodes_account_imports_exactly_what_its_user_may_publish_and_read() -> None:
    """A node's account sees only what it imports from the streams' account: the subjects
    it may publish (so its appends are stored and acked), its JetStream calls under its own
    prefix, and its inputs' data (the wake-ups); nothing of another PE or pipeline."""
    from fogshift.broker.permissions import NODE_API, STREAMS_ACCOUNT, node_imports

    hosted = [Hosted("p", "agg-p1", ("src", "aux"), moves_keys=1)]
    allow = node_permissions("fog-a", hosted)["publish"]["allow"]
    imports = node_imports("fog-a", hosted)
    assert {i["service"]["account"] for i in imports if "service" in i} == {STREAMS_ACCOUNT}
    services = {i.get("to", i["service"]["subject"]) for i in imports if "service" in i}
    assert services == set(allow)
    calls = {i["to"]: i["service"]["subject"] for i in imports if "to" in i}
    assert calls[f"{NODE_API}.DIRECT.GET.FS_p_src"] == "$JS.API.DIRECT.GET.FS_p_src"
    assert set(calls) == {a for a in allow if a.startswith(NODE_API)}
    streams = {i["stream"]["subject"] for i in imports if "stream" in i}
    assert streams == {"fs.p.src.data", "fs.p.aux.data"}
    assert "fs.p.agg-p1.fence" not in services and "fs.p.src.keys" not in services
    assert node_imports("fog-a", []) == []
