"""Least privilege on the broker: each node gets a user of its own that may touch only the
streams of the PEs it hosts and of their inputs.

The broker enforces it (nats-server accounts and user permissions), so a compromised
or stale node cannot publish into another PE's stream, fence anybody, create or delete
streams, or read pipelines it has nothing to do with. The orchestrator keeps the permissions
in step with placement (deploy, migration, restore, stop) by rewriting the server's config
and asking it to reload (SIGHUP); the admin user (the orchestrator's) keeps every right.

A node hosting PE ``e`` of pipeline ``p`` with inputs ``i…`` may:

* publish ``fs.p.e.data``, ``fs.p.e.dead`` and ``fs.p.e.cut`` (never ``.fence``: fencing is
  the orchestrator's), and, for partition ``k`` of a keyed element ``x`` (``e`` is
  ``x-pk``), ``fs.p.i.keys.e`` and ``fs.p.i.state.x.*`` of its input (the states of the
  keys it hands over, and their parts for its element's partitions; never ``fs.p.i.keys``,
  the orchestrator's key moves, nor another partition's states, nor parts for another
  element's partitions, whose read-ahead they would fill);
* read the tail of its own stream (``STREAM.INFO``, ``STREAM.MSG.GET``);
* read its inputs' streams with batched direct gets (``STREAM.INFO``, ``DIRECT.GET``),
  never through consumers: a consumer's creator names the subject the broker delivers it on,
  which could be any other stream's (a stream made before direct gets is given them by the
  orchestrator, :func:`fogshift.broker.client.ensure_subjects`);
* receive its inputs' data messages as they are stored (a plain subscription that only
  wakes a reader waiting for input, see ``broker.datasource``), and replies on its inbox.

Each node user also has a NATS account of its own (``N_<node>``); the streams, JetStream and
the admin live in account ``FS``. nats-server checks a user's right to publish a request,
never the reply subject the request names, and JetStream answers there from inside its
account: with nodes in the streams' account, a node could have any stream store a copy of a
message it may read (or its own stream's info, a publish's ack) on any subject of any
pipeline — a fence, a key move, another pipeline's data. In an account of its own a node's
replies stay there, where no stream listens. ``FS`` exports its subjects (``fs.>``) and the
JetStream calls nodes make; a node's account imports only the subjects it may publish (its
acked appends reach the streams), the calls it may make on the streams it may read, under
its own prefix :data:`NODE_API` (its account has no JetStream, whose ``$JS.API`` answers
"not enabled"), and its inputs' data subjects (the wake-ups). An account that changes
(every placement change) makes nats-server rebuild every account's imports on its reload,
and a request in flight then may find no responder for a moment: clients retry those
(``broker.client``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nkeys
from filelock import FileLock, Timeout

from fogshift.broker.exceptions import BrokerError
from fogshift.broker.naming import (
    cut_subject,
    data_subject,
    dead_subject,
    key_state_subject,
    state_subjects,
    stream_name,
)
from fogshift.common.files import PRIVATE_MODE, write_private
from fogshift.common.processes import started_at
from fogshift.spec.models import partitioned

API = "$JS.API"
#: The account of the streams, JetStream and the admin user.
STREAMS_ACCOUNT = "FS"
#: The JetStream API prefix of node users: the calls their accounts import from
#: :data:`STREAMS_ACCOUNT`'s ``$JS.API`` (``BrokerAddress.api``).
NODE_API = "fsjs.API"
#: The JetStream calls nodes make (on the streams their PEs may read, see :func:`node_imports`).
NODE_CALLS = ("STREAM.INFO", "STREAM.MSG.GET", "DIRECT.GET")
#: Beside the server's config: claimed while its users or config are rewritten.
CONFIG_LOCK = "nats.conf.lock"
#: How long a writer waits for another's claim (a rewrite and a reload take milliseconds).
CONFIG_LOCK_WAIT_S = 30.0


@dataclass(frozen=True)
class Hosted:
    """One PE a node hosts (or is about to: a migration or restore target)."""

    pipeline: str
    element: str
    inputs: tuple[str, ...] = ()
    #: A partition whose keys can move, its index: it appends its moving keys' states to its
    #: first input's ``.keys.<its id>`` subject, a large one's parts to its
    #: ``.state.<element>.<target>`` subjects (see ``broker.keys``); ``None``: not one.
    #: :attr:`element` is then the partition's id (``<element>-p<index>``).
    moves_keys: int | None = None
    #: Standing by for the PE (a warm standby): it reads what the PE reads and its stream,
    #: and writes nothing there until it is promoted (the promotion, journaled, gives the
    #: node the PE itself first). Only a moving partition's key states, which its standby
    #: sends again as the primary did (the broker and the target drop such copies).
    standby: bool = False


def node_user(node: str) -> str:
    """The name of ``node``'s broker user (its reply subjects' prefix names it)."""
    return f"node-{node}"


def node_account(node: str) -> str:
    """The NATS account of ``node``'s user."""
    return f"N_{node}"


def node_inbox_prefix(node: str) -> str:
    """The prefix of ``node``'s reply subjects (``BrokerAddress.inbox``): its own, so that
    it may subscribe to its replies only, not to every client's ``_INBOX.>``, which would
    let it read every reply the broker sends (the admin's reads of any stream)."""
    return f"_INBOX_{node_user(node)}"


def node_inbox(node: str) -> str:
    """The subjects of ``node``'s replies."""
    return f"{node_inbox_prefix(node)}.>"


def _node_rights(node: str, hosted: Iterable[Hosted]) -> tuple[set[str], set[str], set[str]]:
    """What ``node`` hosting ``hosted`` may publish on the streams' subjects, which
    JetStream calls (``<call>.<stream>``) it may make, and which subjects it may subscribe
    to (its inbox included)."""
    publish: set[str] = set()
    calls: set[str] = set()
    subscribe: set[str] = {node_inbox(node)}
    for pe in hosted:
        own = stream_name(pe.pipeline, pe.element)
        calls |= {f"STREAM.INFO.{own}", f"STREAM.MSG.GET.{own}"}
        if not pe.standby:
            publish |= {
                data_subject(pe.pipeline, pe.element),
                dead_subject(pe.pipeline, pe.element),
                cut_subject(pe.pipeline, pe.element),
            }
        for name in pe.inputs:
            source = stream_name(pe.pipeline, name)
            subscribe.add(data_subject(pe.pipeline, name))
            if pe.moves_keys is not None and name == pe.inputs[0]:
                # (Key states travel on the first input only, see broker.keys.)
                publish |= {
                    key_state_subject(pe.pipeline, name, pe.element),
                    state_subjects(pe.pipeline, name, partitioned(pe.element, pe.moves_keys)),
                }
            # No consumers: whoever may create one chooses its deliver subject, and the
            # broker would copy the input into any stream's subjects for it (another
            # pipeline's), which no permission can stop.
            calls |= {f"STREAM.INFO.{source}", f"DIRECT.GET.{source}"}
    return publish, calls, subscribe


def node_permissions(node: str, hosted: Iterable[Hosted]) -> dict[str, Any]:
    """The nats-server permissions of ``node`` hosting ``hosted`` (nothing hosted: no
    rights but its inbox). Subjects in the node's own account (JetStream calls under
    :data:`NODE_API`)."""
    publish, calls, subscribe = _node_rights(node, hosted)
    allowed = publish | {f"{NODE_API}.{call}" for call in calls}
    return {
        "publish": {"allow": sorted(allowed) or ["_INBOX.none"]},
        "subscribe": {"allow": sorted(subscribe)},
    }


def node_imports(node: str, hosted: Iterable[Hosted]) -> list[dict[str, Any]]:
    """The imports of ``node``'s account from :data:`STREAMS_ACCOUNT`: the subjects it may
    publish (services: its acked appends reach the streams and are answered), the
    JetStream calls it may make (services, from ``$JS.API`` to :data:`NODE_API`), and its
    inputs' data subjects (streams: the wake-ups its readers subscribe to)."""
    publish, calls, subscribe = _node_rights(node, hosted)
    imports: list[dict[str, Any]] = [
        {"service": {"account": STREAMS_ACCOUNT, "subject": subject}} for subject in sorted(publish)
    ]
    imports += [
        {"service": {"account": STREAMS_ACCOUNT, "subject": f"{API}.{call}"},
         "to": f"{NODE_API}.{call}"}
        for call in sorted(calls)
    ]  # fmt: skip
    imports += [
        {"stream": {"account": STREAMS_ACCOUNT, "subject": subject}}
        for subject in sorted(subscribe - {node_inbox(node)})
    ]
    return imports


def streams_exports() -> list[dict[str, Any]]:
    """What :data:`STREAMS_ACCOUNT` offers node accounts (each imports its own part)."""
    exports: list[dict[str, Any]] = [{"service": "fs.>"}, {"stream": "fs.>"}]
    for call in NODE_CALLS:
        # A batched direct get answers with many messages.
        kind = {"response_type": "stream"} if call == "DIRECT.GET" else {}
        exports.append({"service": f"{API}.{call}.*", **kind})
    return exports


def new_user_seed() -> str:
    """A new NATS user NKEY (an Ed25519 key pair), as its seed (``SU...``)."""
    return nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode()


def user_public_key(seed: str) -> str:
    """The public key (``U...``) of the user NKEY ``seed``: what nats.conf names."""
    return str(nkeys.from_seed(seed.encode()).public_key.decode())


@dataclass
class BrokerUsers:
    """The broker's users: the admin and one per node, each an NKEY. nats.conf names only
    their public keys; a client proves it holds a seed by signing the server's challenge.
    So the server's config holds no secret, and one user's seed is in two places only: this
    0600 file (the orchestrator's, which grants the rights) and the 0600 broker file of the
    process it is for (``BrokerAddress.seed``).

    Attributes:
        admin_seed: The orchestrator's (and operator's) user's seed: every right.
        nodes: Node name → its user's seed.
    """

    admin_seed: str
    nodes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> BrokerUsers:
        """Read the users ``save`` wrote.

        Raises:
            BrokerError: The file is an older fogshift's (passwords, no seeds).
        """
        data = json.loads(path.read_text())
        if "admin_seed" not in data:
            raise BrokerError(
                f"the broker's users in {path} are an older fogshift's (passwords): the "
                "accounts fogshift writes now log in with NKEYs",
                expected="users with NKEY seeds (fogshift since 2026-11-30)",
                received="users with passwords",
                hint="restart the cluster: `fogshift down`, then `fogshift up` (the streams on "
                "disk are carried over)",
            )
        return cls(data["admin_seed"], dict(data["nodes"]))

    def save(self, path: Path) -> Path:
        return write_private(path, json.dumps({"admin_seed": self.admin_seed,
                                               "nodes": self.nodes}))  # fmt: skip

    def add_node(self, node: str) -> str:
        """The seed of ``node``'s user, made on first use."""
        if node not in self.nodes:
            self.nodes[node] = new_user_seed()
        return self.nodes[node]

    def accounts(self, hosted: Mapping[str, Iterable[Hosted]]) -> str:
        """The ``accounts`` block of nats.conf for ``hosted`` (node → its PEs): the streams'
        account with the admin, and one account per node user (see the module's doc); each
        user by its public key."""
        accounts: dict[str, Any] = {
            STREAMS_ACCOUNT: {
                "jetstream": "enabled",
                "users": [{"nkey": user_public_key(self.admin_seed)}],
                "exports": streams_exports(),
            }
        }
        for node, seed in sorted(self.nodes.items()):
            accounts[node_account(node)] = _node_entry(node, seed, list(hosted.get(node, ())))
        return _accounts_block(accounts)


def _node_entry(node: str, seed: str, hosted: list[Hosted]) -> dict[str, Any]:
    """The account of ``node``'s user (by its public key) hosting ``hosted``."""
    return {
        "users": [{"nkey": user_public_key(seed), "permissions": node_permissions(node, hosted)}],
        "imports": node_imports(node, hosted),
    }


def _accounts_block(accounts: dict[str, Any]) -> str:
    # nats.conf is a superset of JSON: a JSON object is a valid value.
    return f"accounts {json.dumps(accounts, indent=2)}\n"


#: Where the users' block of a config fogshift wrote begins: all before it is the head.
_USERS_BLOCK = re.compile(r"^accounts ", re.MULTILINE)
#: An older fogshift's users' block (every user in one account).
_OLDER_USERS = re.compile(r"^authorization ", re.MULTILINE)


def users_file(config_file: Path) -> Path:
    """Where the users of the server configured by ``config_file`` are kept."""
    return config_file.with_name("users.json")


def _config_lock(config_file: Path) -> FileLock:
    """The claim whoever rewrites the server's users or config holds while reading, writing
    and reloading them: the orchestrator granting rights and an `up` adding a node. Without
    it, a grant that read the users before a node was added would write the config without
    that node's user, and the node could not log in until the next change of placement."""
    return FileLock(config_file.with_name(CONFIG_LOCK), timeout=CONFIG_LOCK_WAIT_S,
                    mode=PRIVATE_MODE, preserve_lock_file=True)  # fmt: skip


def write_config(config_file: Path, head: str, users: BrokerUsers, hosted: Mapping) -> None:
    """Write nats.conf: ``head`` (listen, jetstream) and the accounts block."""
    write_private(config_file, head + users.accounts(hosted))


def apply_permissions(
    config_file: Path,
    pid: int,
    hosted: Mapping[str, Iterable[Hosted]],
    started: float | None = None,
) -> None:
    """Rewrite the server's permissions for ``hosted`` and make it reload them.

    Args:
        started: When the server started (:func:`~fogshift.common.processes.started_at`):
            ``pid`` is signalled only if it is still that process. A pid is given again
            once its process is gone, and SIGHUP ends most processes: a dead broker's pid
            would have ended whatever had it now.

    Raises:
        BrokerError: The config or its users cannot be read, the config cannot be written,
            or the server is gone.
    """
    with _locked(config_file):
        _apply(config_file, pid, hosted, started)


@contextlib.contextmanager
def _locked(config_file: Path) -> Iterator[None]:
    lock = _config_lock(config_file)
    try:
        lock.acquire()
    except Timeout as exc:
        raise BrokerError(
            f"the broker's config {config_file} stayed claimed for {CONFIG_LOCK_WAIT_S:g} s "
            "by another writer (the orchestrator granting rights, or an `up` adding a node)",
            hint="try again; a process stopped while holding it lets go when it ends",
        ) from exc
    except OSError as exc:
        # (Typed as every other failure here: the reconcile loop and the coordination catch
        # BrokerError, and a full disk, lost rights or a file system without locks would
        # otherwise end their rounds with a plain OSError.)
        raise BrokerError(
            f"cannot claim the broker's config {config_file} "
            f"({config_file.with_name(CONFIG_LOCK)}): {exc}",
            hint="give back the write rights on its folder, free space on its disk, or keep "
            "the cluster's home on a file system with file locks",
        ) from exc
    try:
        yield
    finally:
        lock.release()


def _read(config_file: Path) -> tuple[str, BrokerUsers]:
    """The server's config (checked to be this fogshift's) and its users."""
    try:
        text = config_file.read_text()
        users = BrokerUsers.load(users_file(config_file))
    except (OSError, ValueError, KeyError) as exc:  # (an older fogshift's users: raised as is)
        raise BrokerError(f"cannot read the broker's config {config_file}: {exc}") from exc
    if _OLDER_USERS.search(text):
        raise BrokerError(
            f"the broker's config {config_file} is an older fogshift's: its users share one "
            "account, whose streams the accounts fogshift writes now would not see",
            expected="an `accounts` block (fogshift since 2026-11-30)",
            received="an `authorization` block",
            hint="restart the cluster: `fogshift down`, then `fogshift up` (the streams on "
            "disk are carried over)",
        )
    return text, users


def _apply(
    config_file: Path, pid: int, hosted: Mapping[str, Iterable[Hosted]], started: float | None
) -> None:
    text, users = _read(config_file)
    head = _USERS_BLOCK.split(text, 1)[0]
    _write_and_reload(config_file, head + users.accounts(hosted), pid, started)


def add_node_users(
    config_file: Path, pid: int, nodes: Iterable[str], started: float | None = None
) -> dict[str, str]:
    """Give each of ``nodes`` a broker user (an account of its own, no rights yet: the
    orchestrator grants them as it places PEs there) on the running server, every other
    user's account left as it is; a node that has one keeps it.

    Returns:
        Each of ``nodes`` → its user's seed.

    Raises:
        BrokerError: As :func:`apply_permissions`, or the config's accounts are not the
            JSON object fogshift writes.
    """
    nodes = list(nodes)
    with _locked(config_file):
        text, users = _read(config_file)
        head, accounts = _split_accounts(config_file, text)
        unknown = [node for node in nodes if node not in users.nodes]
        for node in unknown:
            users.add_node(node)
        # A node with a user but no account is new to the server too: an add that ended
        # between saving the users and writing the config (the users go first, below).
        missing = [node for node in nodes if node_account(node) not in accounts]
        if unknown:
            # The users first: a grant that reads them next writes the new accounts too.
            _save_users(config_file, users)
        if missing:
            for node in missing:
                accounts[node_account(node)] = _node_entry(node, users.nodes[node], [])
            _write_and_reload(config_file, head + _accounts_block(accounts), pid, started)
        return {node: users.nodes[node] for node in nodes}


def remove_node_users(
    config_file: Path, pid: int, nodes: Iterable[str], started: float | None = None
) -> None:
    """Drop the broker users of ``nodes`` (taken out of the cluster) from the running
    server: they can no longer log in, and connections they hold are closed by its reload.
    Every other user's account is left as it is; a node with no user is no error.

    Raises:
        BrokerError: As :func:`add_node_users`.
    """
    nodes = list(nodes)
    with _locked(config_file):
        text, users = _read(config_file)
        head, accounts = _split_accounts(config_file, text)
        gone = [node for node in nodes if node in users.nodes]
        if gone:
            for node in gone:
                del users.nodes[node]
            # The users first, as an add does: a grant that reads them next writes none of
            # theirs, and a crash between leaves accounts that the next grant drops.
            _save_users(config_file, users)
        stale = [node for node in nodes if node_account(node) in accounts]
        if stale:
            for node in stale:
                del accounts[node_account(node)]
            _write_and_reload(config_file, head + _accounts_block(accounts), pid, started)


def _split_accounts(config_file: Path, text: str) -> tuple[str, dict[str, Any]]:
    """The config's head and its accounts (the JSON object fogshift writes)."""
    found = _USERS_BLOCK.search(text)
    head = text[: found.start()] if found else text
    try:
        accounts = json.loads(text[found.end() :] if found else "")
    except ValueError as exc:
        raise BrokerError(
            f"the accounts in the broker's config {config_file} are not the JSON "
            f"fogshift writes: {exc}",
            hint="restart the cluster: `fogshift down`, then `fogshift up` with every node",
        ) from exc
    return head, accounts


def _save_users(config_file: Path, users: BrokerUsers) -> None:
    try:
        users.save(users_file(config_file))
    except OSError as exc:
        raise BrokerError(
            f"cannot save the broker's users {users_file(config_file)}: {exc}",
            hint="free space on its disk, or give back the write rights on its folder",
        ) from exc


def _write_and_reload(config_file: Path, text: str, pid: int, started: float | None) -> None:
    try:
        write_private(config_file, text)
    except OSError as exc:
        # (Typed as every other failure here: a plain OSError ended each reconcile round
        # of the orchestrator before its restores and repairs, while the disk stayed full.)
        raise BrokerError(
            f"cannot write the broker's config {config_file}: {exc}",
            hint="free space on its disk, or give back the write rights on its folder",
        ) from exc
    if started is not None and started_at(pid) != started:
        raise BrokerError(
            f"nats-server (pid {pid}) is gone (the pid is another process's now, or none's): "
            "cannot apply permissions"
        )
    try:
        os.kill(pid, signal.SIGHUP)  # nats-server reloads its config on SIGHUP
    except ProcessLookupError as exc:
        raise BrokerError(f"nats-server (pid {pid}) is gone: cannot apply permissions") from exc
