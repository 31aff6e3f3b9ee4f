"""Per-node broker users, enforced by a real nats-server, following placement on reload."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from filelock import FileLock
from nats.aio.client import Client

from fogshift.broker import permissions
from fogshift.broker.client import BrokerAddress, _Client, ensure_pe_stream
from fogshift.broker.exceptions import BrokerError, BrokerUnavailable
from fogshift.broker.keys import KeyMove, state_payload
from fogshift.broker.naming import (
    data_subject,
    fence_subject,
    key_state_subject,
    keys_subject,
    state_subject,
)
from fogshift.broker.permissions import (
    CONFIG_LOCK,
    BrokerUsers,
    Hosted,
    add_node_users,
    apply_permissions,
    new_user_seed,
    remove_node_users,
    users_file,
)
from fogshift.broker.publish import Record, publish_records
from fogshift.broker.server import BrokerProcess, node_address, start_nats_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    server = start_nats_server(tmp_path_factory.mktemp("perm"), nodes=["n1", "n2"])
    yield server
    os.killpg(server.pid, signal.SIGKILL)


def login(address: BrokerAddress) -> dict[str, Any]:
    """nats-py's connect options for ``address``: its NKEY seed, or its user and password."""
    return {"user": address.user, "password": address.password, "nkeys_seed_str": address.seed}


def run(address: BrokerAddress, action: Callable[[Any], Awaitable[Any]]) -> Any:
    """``action(js)`` on a fresh connection with a short API timeout; the exception if any."""

    async def go() -> Any:
        # The admin's requests are the product's (`_Client`, as the orchestrator's): sent
        # again while a reload rebuilds the accounts' imports (no responder for a moment;
        # creating a stream just after a placement's reload failed so, once in a suite).
        # A node's are nats-py's: a call outside its imports finds no responder, and must
        # say no at once.
        nc = _Client() if address.api is None else Client()
        await nc.connect(address.url, **login(address), inbox_prefix=address.inbox or "_INBOX")
        try:
            return await action(jetstream(nc, address, timeout=1.0))
        except Exception as exc:  # a denied request times out or is refused: either says no
            return exc
        finally:
            # A reload of the broker's accounts may have cut the connection already (its
            # close then finds it lost): what the action got stands.
            with contextlib.suppress(ConnectionError, nats.errors.Error):
                await nc.close()

    return asyncio.run(go())


def jetstream(nc: Any, address: BrokerAddress, **options: Any) -> Any:
    """``address``'s JetStream on ``nc`` (a node's calls go under its account's prefix)."""
    return nc.jetstream(prefix=address.api or "$JS.API", **options)


def allowed(result: Any) -> bool:
    return not isinstance(result, Exception)


def until(check: Callable[[], bool], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def record(origin: int) -> list[Record]:
    return [Record(origin, 0, origin, 0.0, "pe1", json.dumps({"v": origin}))]


def test_a_node_may_touch_only_the_streams_of_the_pes_it_hosts(broker: BrokerProcess) -> None:
    admin, n1, n2 = broker.address, broker.node_addresses["n1"], broker.node_addresses["n2"]
    assert oct(users_file(broker.config_file).stat().st_mode & 0o777) == "0o600"
    assert oct(broker.config_file.stat().st_mode & 0o777) == "0o600"
    for pe in ("src", "pe1", "pe2"):
        assert allowed(run(admin, lambda js, pe=pe: ensure_pe_stream(js, "p", pe)))
    assert allowed(run(admin, lambda js: js.publish(data_subject("p", "src"), b"{}")))
    # No PE placed yet: a node can do nothing.
    assert not allowed(run(n1, lambda js: js.stream_info("FS_p_src")))

    apply_permissions(broker.config_file, broker.pid, {"n1": [Hosted("p", "pe1", ("src",))]})
    assert until(lambda: allowed(run(n1, lambda js: js.stream_info("FS_p_src"))))
    # n1 reads its input and appends to its own stream ...
    sub = run(n1, lambda js: consume_one(js, "FS_p_src", data_subject("p", "src")))
    assert sub == b"{}"
    # ... never through a consumer, whose deliver subject could be another pipeline's
    # stream (the broker would copy the input there).
    copy = {"deliver_subject": data_subject("q", "x"), "ack_policy": "none"}
    assert not allowed(run(n1, lambda js: js.add_consumer("FS_p_src", **copy)))
    assert not allowed(
        run(n1, lambda js: js.pull_subscribe(data_subject("p", "src"), stream="FS_p_src"))
    )
    assert run(n1, lambda js: publish_records(js, "p", "pe1", record(1), epoch=1)) == 1
    # ... but cannot write another PE's stream, fence, or delete streams.
    assert not allowed(run(n1, lambda js: js.publish(data_subject("p", "pe2"), b"x")))
    assert not allowed(run(n1, lambda js: js.publish(fence_subject("p", "pe1"), b"{}")))
    assert not allowed(run(n1, lambda js: js.delete_stream("FS_p_pe2")))
    assert not allowed(run(n2, lambda js: publish_records(js, "p", "pe1", record(2), epoch=1)))

    # pe1 moves to n2: n2 gains the rights, n1 loses them.
    apply_permissions(broker.config_file, broker.pid, {"n2": [Hosted("p", "pe1", ("src",))]})
    assert until(lambda: not allowed(run(n1, lambda js: js.stream_info("FS_p_pe1"))))
    assert run(n2, lambda js: publish_records(js, "p", "pe1", record(2), epoch=1)) == 1
    assert not allowed(run(n1, lambda js: publish_records(js, "p", "pe1", record(3), epoch=1)))
    info = run(admin, lambda js: js.stream_info("FS_p_pe1"))
    assert info.state.messages == 2


def test_a_partition_hands_over_key_states_on_its_own_subject_only(
    broker: BrokerProcess,
) -> None:
    """A partition's node may append the states of the keys it hands over, on its own
    ``.keys.<index>``, but neither the orchestrator's key moves (which would move or drop
    every key of the element) nor another partition's states."""
    admin, n1 = broker.address, broker.node_addresses["n1"]
    assert allowed(run(admin, lambda js: ensure_pe_stream(js, "k", "src")))
    apply_permissions(broker.config_file, broker.pid,
                      {"n1": [Hosted("k", "agg-p1", ("src",), moves_keys=1)]})  # fmt: skip
    state = state_payload("m1", "agg", "s1", 0, {"n": "1"})

    def publish(address: BrokerAddress, subject: str, body: bytes) -> Any:
        return run(address, lambda js: js.publish(subject, body, stream="FS_k_src"))

    assert until(lambda: allowed(publish(n1, key_state_subject("k", "src", "agg-p1"), state)))
    assert allowed(publish(n1, state_subject("k", "src", 0, "agg"), b"part"))
    move = KeyMove(0, "m2", "agg", ("s1",), 1).payload()
    for subject, body in ((keys_subject("k", "src"), move), (keys_subject("k", "src"), state),
                          (key_state_subject("k", "src", "agg-p0"), state),
                          # another element's partitions' parts, and the older subjects
                          (state_subject("k", "src", 0, "other"), b"part"),
                          (state_subject("k", "src", 0), b"part"),
                          (state_subject("k", "src"), b"part")):  # fmt: skip
        assert not allowed(publish(n1, subject, body)), subject
    assert allowed(publish(admin, keys_subject("k", "src"), move))  # the orchestrator's


def test_a_node_reads_no_reply_but_its_own(broker: BrokerProcess) -> None:
    """Every client's replies come on its own inbox: n2, which hosts nothing, can neither
    subscribe to the admin's nor to every inbox, where the admin's reads of any stream (and
    other nodes' reads of their inputs) would reach it."""
    admin, n2 = broker.address, broker.node_addresses["n2"]
    assert admin.inbox is None and n2.inbox == "_INBOX_node-n2"  # the admin's: _INBOX
    assert allowed(run(admin, lambda js: ensure_pe_stream(js, "p", "secret")))
    assert allowed(run(admin, lambda js: js.publish(data_subject("p", "secret"), b"s3cret")))

    async def overhear() -> tuple[list[bytes], Any]:
        heard: list[bytes] = []

        async def note(msg: Any) -> None:
            heard.append(msg.data)

        async def denied(exc: Exception) -> None:
            pass  # (the broker reports each subscription it refuses)

        nc = await nats.connect(n2.url, **login(n2),
                                inbox_prefix=n2.inbox, error_cb=denied)  # fmt: skip
        try:
            for inbox in ("_INBOX.>", ">"):
                await nc.subscribe(inbox, cb=note)
            await nc.flush()
            await asyncio.sleep(0.3)
            read = await asyncio.get_running_loop().run_in_executor(
                None, lambda: run(admin, lambda js: js.get_msg("FS_p_secret", 1))
            )
            await asyncio.sleep(0.5)
            return heard, read
        finally:
            await nc.close()

    heard, read = asyncio.run(overhear())
    assert read.data == b"s3cret" and heard == []  # the admin read it; n2 heard nothing


async def consume_one(js: Any, stream: str, subject: str) -> bytes:
    from fogshift.broker.client import get_range

    msgs = await get_range(js, stream, subject, 0, 1)
    return bytes(msgs[0].data)


def test_the_config_keeps_the_listen_and_store_lines(broker: BrokerProcess) -> None:
    text = Path(broker.config_file).read_text()
    assert text.startswith("listen: 127.0.0.1:")
    assert "jetstream" in text and text.count("accounts {") == 1


def test_a_reused_pid_is_not_signalled(broker: BrokerProcess, tmp_path: Path) -> None:
    """The broker's pid given again after it died: SIGHUP (which ends most processes)
    went to whatever had it now."""
    import shutil
    import subprocess

    from fogshift.broker.exceptions import BrokerError
    from fogshift.common.processes import started_at

    config = tmp_path / "nats.conf"
    shutil.copy(broker.config_file, config)
    shutil.copy(users_file(Path(broker.config_file)), users_file(config))
    started = started_at(broker.pid)
    assert started is not None
    other = subprocess.Popen(["sleep", "60"])  # has the dead broker's pid, say
    try:
        with pytest.raises(BrokerError, match="is gone"):
            apply_permissions(config, other.pid, {}, started=started)
        assert other.poll() is None  # not signalled
        # The server itself, as it started, is.
        apply_permissions(config, broker.pid, {}, started=started)
    finally:
        other.kill()
        other.wait()


def test_a_standby_reads_its_primarys_stream_and_writes_nothing_there(
    broker: BrokerProcess,
) -> None:
    """A warm standby follows its primary: its writer finds every record it makes stored
    already, and may append none of the PE's (least privilege: it wrote them before)."""
    admin, n1, n2 = broker.address, broker.node_addresses["n1"], broker.node_addresses["n2"]
    for pe in ("src", "pe1"):
        assert allowed(run(admin, lambda js, pe=pe: ensure_pe_stream(js, "sb", pe)))
    apply_permissions(broker.config_file, broker.pid, {
        "n1": [Hosted("sb", "pe1", ("src",))],
        "n2": [Hosted("sb", "pe1", ("src",), standby=True)],
    })  # fmt: skip
    assert until(lambda: allowed(run(n2, lambda js: js.stream_info("FS_sb_pe1"))))
    assert not allowed(run(n2, lambda js: js.publish(data_subject("sb", "pe1"), b"x")))

    def records(*origins: int) -> list[Record]:
        return [Record(o, 0, o, 0.0, "pe1", json.dumps({"v": o})) for o in origins]

    async def primary(*origins: int) -> int:
        nc = await nats.connect(n1.url, **login(n1),
                                inbox_prefix=n1.inbox or "_INBOX")  # fmt: skip
        try:
            return await publish_records(jetstream(nc, n1), "sb", "pe1", records(*origins), 1)
        finally:
            await nc.close()

    async def follow(js: Any) -> list[int]:
        # One connection, as a standby's writer keeps: its batches one after the other,
        # each behind the primary's.
        appended = [await primary(1, 2)]
        appended.append(await publish_records(js, "sb", "pe1", records(1, 2), epoch=1))
        appended.append(await primary(3, 4))
        appended.append(await publish_records(js, "sb", "pe1", records(3), epoch=1))
        return appended

    assert run(n2, follow) == [2, 0, 2, 0]
    info = run(admin, lambda js: js.stream_info("FS_sb_pe1"))
    assert info.state.messages == 4


def test_a_node_cannot_have_the_broker_store_its_answers_on_other_subjects(
    broker: BrokerProcess,
) -> None:
    """nats-server checks the subject of a request, not the reply subject it names, and
    JetStream answers there: in the streams' account any stream on that subject would store
    the answer (a copy of an input, a stream's info, an ack), so a node could write on
    subjects it may not publish (another pipeline's data, a fence). In an account of its
    own, its answers stay there."""
    admin, n1 = broker.address, broker.node_addresses["n1"]
    for pe in ("src", "pe1"):
        assert allowed(run(admin, lambda js, pe=pe: ensure_pe_stream(js, "inj", pe)))
    assert allowed(run(admin, lambda js: ensure_pe_stream(js, "victim", "x")))
    assert allowed(run(admin, lambda js: js.publish(data_subject("inj", "src"), b"{}")))
    apply_permissions(broker.config_file, broker.pid, {"n1": [Hosted("inj", "pe1", ("src",))]})
    assert until(lambda: allowed(run(n1, lambda js: js.stream_info("FS_inj_src"))))
    api = n1.api or "$JS.API"

    async def inject(js: Any) -> list[bytes]:
        nc = js._nc
        targets = (data_subject("victim", "x"), fence_subject("victim", "x"))
        for target in targets:
            get = json.dumps({"seq": 1, "batch": 1}).encode()
            await nc.publish(f"{api}.DIRECT.GET.FS_inj_src", get, reply=target)
            await nc.publish(f"{api}.STREAM.INFO.FS_inj_pe1", b"", reply=target)
            await nc.publish(data_subject("inj", "pe1"), b"{}", reply=target)  # an ack
        await nc.flush()
        # The same requests with an inbox of its own are answered (they were allowed).
        answers = [await nc.request(f"{api}.STREAM.INFO.FS_inj_pe1", b"", timeout=2)]
        answers.append(await nc.request(f"{api}.DIRECT.GET.FS_inj_src",
                                        json.dumps({"seq": 1}).encode(), timeout=2))  # fmt: skip
        return [answer.data for answer in answers]

    answered = run(n1, inject)
    assert not isinstance(answered, Exception), answered
    assert json.loads(answered[0])["config"]["name"] == "FS_inj_pe1"
    assert answered[1] == b"{}"
    time.sleep(0.5)  # (had it stored anything, it would have by now)
    victim = run(admin, lambda js: js.stream_info("FS_victim_x"))
    assert victim.state.messages == 0


def test_a_node_works_on_through_rights_reloads(broker: BrokerProcess) -> None:
    """Every placement change reloads the broker's accounts, which rebuilds every node
    account's imports: a request in flight may find no responder for a moment. A node's
    appends and reads go on (sent again, never twice) while another node's rights change."""
    from fogshift.broker.client import SyncJetStream, get_range

    admin, n1 = broker.address, broker.node_addresses["n1"]
    for pe in ("src", "pe1", "other"):
        assert allowed(run(admin, lambda js, pe=pe: ensure_pe_stream(js, "rl", pe)))
    assert allowed(run(admin, lambda js: js.publish(data_subject("rl", "src"), b'{"v": 1}')))
    mine = [Hosted("rl", "pe1", ("src",))]
    apply_permissions(broker.config_file, broker.pid, {"n1": mine})
    assert until(lambda: allowed(run(n1, lambda js: js.stream_info("FS_rl_pe1"))))
    done = threading.Event()
    failures: list[str] = []
    appended: list[int] = []

    def work() -> None:
        client = SyncJetStream(n1)

        def append(batch: list[Record]) -> int:
            return client.run(lambda js: publish_records(js, "rl", "pe1", batch, 1))

        def read_input() -> list[bytes]:
            got = client.run(lambda js: get_range(js, "FS_rl_src", data_subject("rl", "src"), 0, 1))
            return [m.data for m in got]

        try:
            origin = 0
            while not done.is_set() and len(failures) <= 20:
                origin += 3
                batch = [Record(o, 0, o, 0.0, "pe1", "{}") for o in range(origin - 2, origin + 1)]
                while len(failures) <= 20:  # as the runtime does: the batch again after an outage
                    try:
                        appended.append(append(batch))
                        if (read := read_input()) != [b'{"v": 1}']:
                            failures.append(f"the input read as {read}")  # (told, not raised)
                        break
                    except BrokerUnavailable as exc:
                        # A request the reload lost times out (an outage to the runtime,
                        # which retries); no responder is never one.
                        if "did not answer" not in exc.message:
                            failures.append(exc.message)
        finally:
            client.close()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        for reload in range(20):
            other = [Hosted("rl", "other", ("src",))] if reload % 2 else []
            apply_permissions(broker.config_file, broker.pid, {"n1": mine, "n2": other})
            time.sleep(0.1)
    finally:
        done.set()
        worker.join(60)
    assert failures == []
    assert len(appended) > 20 and set(appended) <= {0, 3}
    stored = run(admin, lambda js: get_range(js, "FS_rl_pe1", data_subject("rl", "pe1"), 0, 10**6))
    values = [json.loads(m.data)["seq"] for m in stored]
    assert values == list(range(1, len(values) + 1))  # each once, in order
    assert len(values) == 3 * appended.count(3)


def test_an_older_fogshifts_streams_are_carried_into_the_streams_account(
    tmp_path: Path,
) -> None:
    """Before 2026-11-30 every user was in nats-server's default account, whose streams
    are stored in a folder of their own: ``down`` then ``up`` with this fogshift carries
    on with them (not with empty streams); a running older broker's config is refused, not
    rewritten under its clients."""
    import subprocess

    from fogshift.broker.exceptions import BrokerError
    from fogshift.broker.server import nats_server_binary

    home = tmp_path / "broker"
    home.mkdir()
    older = home / "nats.conf"  # as an older fogshift wrote it
    older.write_text(
        f'listen: 127.0.0.1:-1\njetstream {{ store_dir: "{home / "jetstream"}" }}\n'
        'authorization {\n  users = [{"user": "fogshift", "password": "pw"}]\n}\n'
    )
    proc = subprocess.Popen([nats_server_binary(), "-c", str(older), "--ports_file_dir",
                             str(tmp_path)], stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        assert until(lambda: any(tmp_path.glob("*.ports")))
        url = json.loads(next(tmp_path.glob("*.ports")).read_text())["nats"][0]
        then = BrokerAddress(url, "fogshift", "pw")
        assert until(lambda: allowed(run(then, lambda js: ensure_pe_stream(js, "old", "pe"))))
        assert allowed(run(then, lambda js: js.publish(data_subject("old", "pe"), b"kept")))
        users = {"admin_user": "fogshift", "admin_password": "pw", "nodes": {}}
        (home / "users.json").write_text(json.dumps(users))
        with pytest.raises(BrokerError, match="older fogshift") as refused:
            apply_permissions(older, proc.pid, {})
        assert "fogshift down" in (refused.value.hint or "")
        assert "authorization" in older.read_text()  # left as it was
    finally:
        proc.terminate()
        proc.wait()
    broker = start_nats_server(home)
    try:
        info = run(broker.address, lambda js: js.stream_info("FS_old_pe"))
        assert not isinstance(info, Exception), info
        assert info.state.messages == 1
    finally:
        os.killpg(broker.pid, signal.SIGKILL)


def test_a_config_that_cannot_be_written_is_a_broker_error(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plain OSError (a full disk) passed every handler that catches the broker's errors:
    # each reconcile round of the orchestrator ended there, before its restores and repairs.
    import errno

    from fogshift.broker import permissions
    from fogshift.broker.exceptions import BrokerError

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(permissions, "write_private", full)
    with pytest.raises(BrokerError, match=r"cannot write the broker's config .*No space left"):
        apply_permissions(broker.config_file, broker.pid, {"n1": []})


def logs_in(address: BrokerAddress) -> bool:
    """Whether ``address``'s user is let in by the broker at all."""

    async def go() -> bool:
        try:
            nc = await nats.connect(address.url, **login(address), allow_reconnect=False,
                                    connect_timeout=2, max_reconnect_attempts=0,
                                    inbox_prefix=address.inbox or "_INBOX")  # fmt: skip
        except Exception:  # (refused: "Authorization Violation", or no connection)
            return False
        await nc.close()
        return True

    return asyncio.run(go())


def test_a_node_added_to_the_running_broker_logs_in_with_no_rights(
    broker: BrokerProcess,
) -> None:
    """`fogshift up` of a node a running cluster lacks gives it a user of its own: no rights
    until a PE is placed there, the others' rights untouched, and kept by the next grant."""
    admin, n1 = broker.address, broker.node_addresses["n1"]
    for pe in ("src", "pe1", "pe2"):
        assert allowed(run(admin, lambda js, pe=pe: ensure_pe_stream(js, "ad", pe)))
    mine = {"n1": [Hosted("ad", "pe1", ("src",))]}
    apply_permissions(broker.config_file, broker.pid, mine)
    assert until(lambda: allowed(run(n1, lambda js: js.stream_info("FS_ad_pe1"))))
    url = broker.address.url
    stranger = node_address(url, "n3", new_user_seed())
    assert not logs_in(stranger)  # (what "logs in" tells apart)

    seeds = add_node_users(broker.config_file, broker.pid, ["n1", "n3"])
    assert seeds["n1"] == n1.seed  # a node that has a user keeps it
    n3 = node_address(url, "n3", seeds["n3"])
    assert until(lambda: logs_in(n3))
    assert not allowed(run(n3, lambda js: js.stream_info("FS_ad_src")))
    assert not allowed(run(n3, lambda js: js.publish(data_subject("ad", "pe2"), b"x")))
    assert allowed(run(n1, lambda js: js.stream_info("FS_ad_pe1")))  # n1's rights stand
    assert oct(users_file(broker.config_file).stat().st_mode & 0o777) == "0o600"
    assert oct(broker.config_file.stat().st_mode & 0o777) == "0o600"
    # Adding it again changes nothing; the orchestrator's next grant keeps the new user.
    assert add_node_users(broker.config_file, broker.pid, ["n3"]) == {"n3": seeds["n3"]}
    apply_permissions(broker.config_file, broker.pid,
                      {**mine, "n3": [Hosted("ad", "pe2", ("src",))]})  # fmt: skip
    assert until(lambda: allowed(run(n3, lambda js: js.stream_info("FS_ad_src"))))
    assert run(n3, lambda js: publish_records(js, "ad", "pe2", record(1), epoch=1)) == 1
    assert logs_in(n1)


def test_a_node_whose_user_was_saved_without_its_account_is_added(
    broker: BrokerProcess,
) -> None:
    """An add that ended between saving the users and writing the config (they go in that
    order) left a user the server does not know: the next add writes its account."""
    users = BrokerUsers.load(users_file(broker.config_file))
    seed = users.add_node("n5")
    users.save(users_file(broker.config_file))
    n5 = node_address(broker.address.url, "n5", seed)
    assert not logs_in(n5)
    assert add_node_users(broker.config_file, broker.pid, ["n5"]) == {"n5": seed}
    assert until(lambda: logs_in(n5))


def test_an_add_waits_for_the_config_claimed_by_another_writer(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever rewrites the users or config holds ``nats.conf.lock`` (the orchestrator's
    grants, an `up` adding a node): an add waits while another holds it, and one held past
    the wait is a BrokerError saying who may hold it."""
    held = FileLock(broker.config_file.with_name(CONFIG_LOCK))
    done = threading.Event()

    def add() -> None:
        add_node_users(broker.config_file, broker.pid, ["n6"])
        done.set()

    with held:
        adding = threading.Thread(target=add, daemon=True)
        adding.start()
        assert not done.wait(1.0)  # (the claim is what holds it: released below, it goes on)
        assert "n6" not in BrokerUsers.load(users_file(broker.config_file)).nodes
    assert done.wait(30)
    adding.join()
    assert "n6" in BrokerUsers.load(users_file(broker.config_file)).nodes

    monkeypatch.setattr(permissions, "CONFIG_LOCK_WAIT_S", 0.2)
    with held, pytest.raises(BrokerError, match=r"stayed claimed for 0\.2 s by another"):
        apply_permissions(broker.config_file, broker.pid, {"n1": []})


def test_a_config_that_cannot_be_claimed_is_a_broker_error(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock file that cannot be opened or locked (no rights, a full disk, a file system
    without locks) is the BrokerError the reconcile loop and coordination catch, never a
    plain OSError that would end their rounds."""

    class NoLocks(FileLock):
        def acquire(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(permissions, "FileLock", NoLocks)
    with pytest.raises(BrokerError, match=r"cannot claim the broker's config .*No locks"):
        apply_permissions(broker.config_file, broker.pid, {"n1": []})
    with pytest.raises(BrokerError, match=r"cannot claim"):
        add_node_users(broker.config_file, broker.pid, ["n7"])


def test_a_removed_nodes_user_is_dropped_and_its_connection_closed(
    broker: BrokerProcess,
) -> None:
    """`fogshift remove-node`: the node's user can no longer log in, the connection it holds
    is closed by the reload, and the other users keep their rights."""
    url = broker.address.url
    seeds = add_node_users(broker.config_file, broker.pid, ["n8"])
    n8 = node_address(url, "n8", seeds["n8"])
    assert until(lambda: logs_in(n8))
    connected, closed = threading.Event(), threading.Event()

    async def hold() -> None:
        async def gone() -> None:
            closed.set()

        nc = await nats.connect(n8.url, **login(n8), inbox_prefix=n8.inbox or "_INBOX",
                                allow_reconnect=False, closed_cb=gone)  # fmt: skip
        connected.set()
        await asyncio.get_running_loop().run_in_executor(None, closed.wait, 30)
        await nc.close()

    holder = threading.Thread(target=asyncio.run, args=(hold(),), daemon=True)
    holder.start()
    assert connected.wait(30)
    remove_node_users(broker.config_file, broker.pid, ["n8", "never-added"])
    assert closed.wait(30), "the removed user's connection stayed open"
    holder.join(30)
    assert not logs_in(n8)
    assert "n8" not in BrokerUsers.load(users_file(broker.config_file)).nodes
    assert "N_n8" not in broker.config_file.read_text()
    assert logs_in(broker.node_addresses["n1"])
    remove_node_users(broker.config_file, broker.pid, ["n8"])  # again: nothing to do
