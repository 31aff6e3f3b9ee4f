"""Key moves of a partitioned keyed PE: which partition owns a key at each input position.

A partition owns the keys :func:`~fogshift.spec.models.partition_of_key` gives it, until a
*key move* says otherwise. The orchestrator appends a move (``{"type": "key-move"}``) to the
``.keys`` subject of the partitions' input stream; its stream sequence ``X`` is where the
keys change owner, for every partition and every execution, because it is stored among the
events they read. From ``X`` on, the origin partition no longer gets the keys' events and
the target holds them; the origin, on reaching ``X``, appends each key's state
(``{"type": "key-state"}``) to its own ``.keys.<origin>`` subject of that stream, in the
order the move asks (``fifo``: as
listed; ``backlog``: the key whose next event comes first, first, as PAM orders them); the
target, on reaching a key's state, installs it and processes the held events. So no key is
processed against empty state, and every other key goes on untouched (PAM, seed 004).

A *rescale* (``fogshift scale``) is a move with a ``count``: from its place on, every key
belongs to partition :func:`~fogshift.spec.models.partition_of_key` of the new count (the
moves before are forgotten), and its ``keys`` are those holding state whose owner changes
(the orchestrator lists them from the partitions' state stores and the input it scanned up
to the record, which it appends only if nothing came in meanwhile). Their states travel as
for any move; a key without state starts empty at its new owner, as it would have anywhere.
A key group's record (``group``) is listed alike. With several inputs such a *listed* move
is appended to each input in turn, each record listing the keys seen until its append that
no earlier record lists; its keys are the union of its records (:func:`listed_unions`), and
a partition reads it only once it is stored in all inputs, all its places in one batch.

A move may be *precopied* (a per-key make-before-break): the orchestrator first appends a
*key copy* (``{"type": "key-copy"}``) for some of the keys; their owner, on reaching it,
appends a copy of each key's state (a ``key-state`` with ``"copy": true``) and keeps the
keys; the target keeps the copy aside. The move then names the copy, and the origin sends at
the move only the parts of each state that changed since the copy, with the names of those
that did not (``base``, ``keep``): the target builds the state from both. Large states thus
cross before the switch, in batches of their own, and the keys wait at the switch only for
what changed.

A move listing many keys (a rescale or key group of a PE with tens of thousands of keys) is
stored compressed once its JSON passes :data:`PACKED_MOVE_BYTES` (:func:`parse` reads both).

A state of more than :data:`INLINE_STATE_BYTES` travels compressed, in parts on the input's
``.state.<element>.<to>`` subject (its target's), its ``.keys`` record naming their sequences: every
partition reads each ``.keys`` message at its place, and only the state's target reads the
parts — as they are stored, ahead of the batch that reads the record
(:mod:`fogshift.broker.parts_ahead`).

Ownership is a function of the stream: :class:`Ownership` replays the moves before a
position, which is what a restarted or restored partition does.

Who may write what is the broker's to enforce (:mod:`fogshift.broker.permissions`): only
the orchestrator publishes on ``.keys`` (a partition's node that could would move or drop
every key of the element), and each partition on its own ``.keys.<origin>`` only. So a
reader takes moves and copy requests from ``.keys`` alone (:func:`read_message`), and the
target of a key takes its state only from the partition that owned the key before the move
(the state's :attr:`KeyState.origin`, which its subject gives, never its body).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fogshift.broker.naming import key_state_origin, keys_subject
from fogshift.common.text import has_utf8
from fogshift.events import CONTROL_PREFIX, MAX_KEY_CHARS, NOT_AN_EVENT
from fogshift.spec.models import RESERVED_FIELD_PREFIX, partition_of_key

#: ``creator`` of the rows a partition's reader makes of key moves and states.
KEY_MOVE_OUT = CONTROL_PREFIX + "key-out"
KEY_MOVE_IN = CONTROL_PREFIX + "key-in"
KEY_STATE = CONTROL_PREFIX + "key-state"
KEY_COPY_OUT = CONTROL_PREFIX + "key-copy-out"
KEY_COPY_IN = CONTROL_PREFIX + "key-copy-in"
#: ``creator`` of the rows a keyed PE's processor makes of its writes to a key's stored
#: state (``checkpoint.key_index``): its writer stores them beside the checkpoint and
#: never appends them.
KEY_INDEX = CONTROL_PREFIX + "key-index"
#: The rows' body field carrying the move (beside the ``key_by`` field, which groups them).
CONTROL_FIELD = RESERVED_FIELD_PREFIX + "key_move"

Order = Literal["fifo", "backlog"]


@dataclass(frozen=True)
class KeyMove:
    """One stored key move: ``keys`` of ``element`` go to partition ``to`` from ``seq`` on.

    With ``count`` it is a rescale: from ``seq`` on the element has ``count`` partitions,
    each key goes to its partition among them (``to`` is unused), and ``keys`` are the keys
    whose state moves."""

    seq: int
    move: str
    element: str
    keys: tuple[str, ...]
    to: int
    order: Order = "fifo"
    count: int | None = None
    #: ``(g, n)``: a key group move: every key whose CRC-32 modulo ``n`` is ``g`` goes to
    #: ``to`` from ``seq`` on, seen yet or not (``keys``: those of them holding state).
    group: tuple[int, int] | None = None
    #: The :class:`KeyCopy` (its ``move``) that sent the keys' states ahead: the origin
    #: then sends only what changed since.
    copy: str | None = None
    #: A listed move with several inputs: each input's end as the orchestrator had scanned
    #: it for this record (``(input, sequence)``, by input), every key seen until there
    #: being listed in this record or an earlier one: a move left in some inputs only is
    #: completed from there, without asking the partitions for their keys again.
    scanned: tuple[tuple[str, int], ...] = ()

    @property
    def listed(self) -> bool:
        """Whether this move's rule covers keys beyond those it lists (a rescale or a key
        group): its ``keys`` are those the orchestrator found holding state. With several
        inputs each input's record lists what had been seen when it was appended and no
        earlier record lists, and the move's keys are the union of them all (see
        :func:`listed_unions`)."""
        return self.count is not None or self.group is not None

    def target(self, key: str) -> int:
        """The partition ``key`` goes to."""
        return self.to if self.count is None else partition_of_key(key, self.count)

    def payload(self) -> bytes:
        """The message body (``seq`` is where the broker stores it)."""
        body: dict[str, Any] = {
            "type": "key-move", "move": self.move, "element": self.element,
            "keys": list(self.keys), "to": self.to, "order": self.order,
        }  # fmt: skip
        if self.count is not None:
            body["count"] = self.count
        if self.group is not None:
            body["group"] = list(self.group)
        if self.copy is not None:
            body["copy"] = self.copy
        if self.scanned:
            body["scanned"] = dict(self.scanned)
        return _packed(json.dumps(body).encode())


@dataclass(frozen=True)
class KeyCopy:
    """A stored request for copies: the owner of each of ``keys`` at ``seq`` sends a copy of
    its state to partition ``to`` and keeps the key (the first half of a precopied move)."""

    seq: int
    move: str
    element: str
    keys: tuple[str, ...]
    to: int

    def payload(self) -> bytes:
        """The message body (``seq`` is where the broker stores it)."""
        return json.dumps(
            {"type": "key-copy", "move": self.move, "element": self.element,
             "keys": list(self.keys), "to": self.to}
        ).encode()  # fmt: skip


@dataclass(frozen=True)
class KeyState:
    """A key's state as the origin partition held it at its move, or at a copy request
    (``copy``); at a precopied move, only the parts that changed since the copy (``base``,
    ``keep``). ``parts``: the sequences of the messages holding it instead (on the input's
    ``.state.<element>.<to>`` subject), when it was larger than :data:`INLINE_STATE_BYTES`."""

    seq: int
    move: str
    element: str
    key: str
    to: int
    state: dict[str, str]
    parts: tuple[int, ...] = ()
    #: A copy (``move`` is a :class:`KeyCopy`'s): the key stays where it is.
    copy: bool = False
    #: The copy this state completes (``None``: the whole state): the key's state is
    #: ``state`` and the parts ``keep`` of that copy.
    base: str | None = None
    keep: tuple[str, ...] = ()
    #: With ``parts``: their bytes as sent (they are on another subject, see
    #: :func:`~fogshift.broker.naming.state_subject`), and the length of the JSON text they
    #: compress (``0``: parts an older fogshift stored, the text itself).
    size: int = 0
    raw: int = 0
    #: The parts are on a subject addressed to partition :attr:`to`, whose reader fetches
    #: them as they are stored (:attr:`scoped`); ``False``: on ``.state`` (or, with no
    #: ``raw``, on ``.keys``), where an older fogshift stored them.
    addressed: bool = False
    #: With :attr:`addressed`: the subject names the element too
    #: (``.state.<element>.<to>``); ``False``: ``.state.<to>``, an older fogshift's.
    scoped: bool = False
    #: The partition that sent it, as its subject (``.keys.<origin>``) tells; ``None``: it
    #: is on ``.keys``, where only the orchestrator may publish now and an older fogshift's
    #: partitions stored their states.
    origin: int | None = None
    #: A partition with several inputs: the origin its sender made its last rows of the key
    #: at; the target numbers its rows from the state's on beyond it (``None``: one input,
    #: where the state's place is beyond them already).
    after: int | None = None

    def complete(self, copied: dict[str, str] | None) -> dict[str, str]:
        """The key's whole state, from this one and the copy it completes (``copied``: the
        copy the target kept, of move :attr:`base`).

        Raises:
            ValueError: It keeps parts of a copy and ``copied`` is not that copy's state.
        """
        if self.base is None or not self.keep:
            return dict(self.state)
        if copied is None or any(name not in copied for name in self.keep):
            raise ValueError(
                f"the state of key {self.key!r} for move {self.move} completes copy "
                f"{self.base}, which is not here"
            )
        return {**{name: copied[name] for name in self.keep}, **self.state}


#: A move's JSON longer than this is stored compressed (zlib): a rescale's or key group's
#: record lists every key holding state that changes partition, and the broker takes ~1 MiB
#: a message (the orchestrator refuses a record over 900 KiB). 100,000 keys like
#: ``patient-000123`` are 1.8 MB of JSON and 0.25 MB compressed (7.2x; 4x for numbers,
#: 1.9x for random UUIDs), ~60 ms to compress and a few ms to read back.
PACKED_MOVE_BYTES = 64 * 1024
#: The most a packed record may unpack to (a message on ``.keys`` is the orchestrator's,
#: still: no reader inflates one without bound).
UNPACKED_MOST_BYTES = 64 * 1024 * 1024


def _packed(body: bytes) -> bytes:
    """``body``, compressed when it is long (a zlib stream: never begins with ``{``)."""
    return zlib.compress(body, 6) if len(body) > PACKED_MOVE_BYTES else body


def _unpacked(data: bytes) -> bytes:
    """The JSON a ``.keys`` message holds: ``data`` itself, or what it compresses.

    Raises:
        ValueError: Compressed but not whole, or unpacking to more than
            :data:`UNPACKED_MOST_BYTES`.
    """
    if data[:1] != b"x":  # zlib's first byte (deflate, 32 KiB window); JSON begins otherwise
        return data
    try:
        inflater = zlib.decompressobj()
        body = inflater.decompress(data, UNPACKED_MOST_BYTES)
    except zlib.error as exc:
        raise ValueError(f"not a packed record: {exc}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError("a packed record cut off, or larger than any record")
    return body


def parse(seq: int, data: bytes) -> KeyMove | KeyCopy | KeyState | None:
    """The move or state a ``.keys`` message holds; ``None`` for anything else (a foreign
    message there is stepped over, as on every subject)."""
    try:
        value = json.loads(_unpacked(data))
        if value.get("type") == "key-move":
            keys = tuple(str(k) for k in value["keys"])
            order: Order = "backlog" if value.get("order") == "backlog" else "fifo"
            count = int(value["count"]) if value.get("count") is not None else None
            if count is not None and count < 1:
                return None
            group = None
            if value.get("group") is not None:
                g, n = (int(v) for v in value["group"])
                if not 0 <= g < n:
                    return None
                group = (g, n)
            copy = str(value["copy"]) if value.get("copy") is not None else None
            scanned = tuple(sorted((str(k), int(v)) for k, v in
                                   dict(value.get("scanned") or {}).items()))  # fmt: skip
            return KeyMove(seq, str(value["move"]), str(value["element"]), keys,
                           int(value["to"]), order, count, group, copy, scanned)  # fmt: skip
        if value.get("type") == "key-copy":
            return KeyCopy(seq, str(value["move"]), str(value["element"]),
                           tuple(str(k) for k in value["keys"]), int(value["to"]))  # fmt: skip
        if value.get("type") == "key-state":
            state = {str(k): str(v) for k, v in dict(value["state"] or {}).items()}
            parts = tuple(int(p) for p in value.get("parts") or ())
            base = str(value["base"]) if value.get("base") is not None else None
            after = int(value["after"]) if value.get("after") is not None else None
            if after is not None and not 0 <= after < 1 << 62:
                # The target numbers its rows from the state on beyond it, in an Arrow int64
                # column: one beyond failed its batch at every retry (room left for them).
                return None
            return KeyState(seq, str(value["move"]), str(value["element"]), str(value["key"]),
                            int(value["to"]), state, parts, bool(value.get("copy", False)),
                            base, tuple(str(n) for n in value.get("keep") or ()),
                            int(value.get("size") or 0), int(value.get("raw") or 0),
                            bool(value.get("addressed", False)), after=after,
                            scoped=bool(value.get("scoped", False)))  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        return None  # (1e999 as an int, a number too large for a float, JSON nested too deep)
    return None


def listed_unions(moves: Iterable[KeyMove | KeyCopy]) -> dict[str, tuple[str, ...]]:
    """The keys of each listed move (:attr:`KeyMove.listed`) among ``moves`` (read from
    every input of a partition with several), by move id: the union of the lists of its
    records. The orchestrator appends a listed move to the inputs one after another, each
    record listing the keys seen holding state until its append that no earlier record
    lists (the inputs scanned up to their ends, the append refused if its input grew
    meanwhile), so the union names every key whose events reached its old owner before the
    move's place in their input; readers take the move's records only once it is stored
    in all inputs (see :meth:`~fogshift.broker.datasource.JetStreamReader._clamped`)."""
    unions: dict[str, set[str]] = {}
    for move in moves:
        if isinstance(move, KeyMove) and move.listed:
            unions.setdefault(move.move, set()).update(move.keys)
    return {move: tuple(sorted(keys)) for move, keys in unions.items()}


def widened(move: KeyMove, unions: Mapping[str, tuple[str, ...]]) -> KeyMove:
    """``move`` with the keys of its records in every input (``unions``, from
    :func:`listed_unions`), if it is a listed move found there."""
    keys = unions.get(move.move) if move.listed else None
    return move if keys is None or keys == move.keys else replace(move, keys=keys)


def read_message(
    pipeline: str, source: str, subject: str, seq: int, data: bytes
) -> KeyMove | KeyCopy | KeyState | None:
    """The move, copy request or state a message of the input ``source`` holds, by who may
    have sent it: on ``.keys`` (the orchestrator's), anything :func:`parse` reads; on
    ``.keys.<element>-p<origin>`` (that partition's), a state of ``element`` only, with its
    :attr:`~KeyState.origin`.
    ``None`` for anything else: a move or copy request on a partition's subject is a
    partition forging the orchestrator's, stepped over like a foreign message."""
    item = parse(seq, data)
    if subject == keys_subject(pipeline, source):
        return item
    if not isinstance(item, KeyState):
        return None
    # Whose subject it is, by the element the state names: a partition of another element
    # reading the same input publishes on its own, and hands over none of this one's keys.
    origin = key_state_origin(pipeline, source, subject, item.element)
    if origin is None:
        return None
    return replace(item, origin=origin)


#: A key's state larger than this (its JSON text) goes in parts, on the input's
#: ``.state.<element>.<to>`` subject: every partition reading the input reads each ``.keys``
#: message, and only the state's target needs its bytes (``bench pam --link 10mbit,n0``: each
#: partition read every state that passed, its origin its own back: 6 MB took ~45 s to move).
INLINE_STATE_BYTES = 4 * 1024
#: The largest part (the broker takes at most ~1 MiB a message).
STATE_PART_BYTES = 512 * 1024
#: How a large state's JSON text is compressed into its parts (pyarrow's codec): a fog
#: node's link carries fewer bytes (``bench pam``'s incompressible padding: 25 % fewer;
#: a window of floats: 58 %) for ~1 ms of CPU a MiB each way.
STATE_CODEC = "zstd"


def state_payload(
    move: str, element: str, key: str, to: int, state: dict[str, str] | None,
    parts: list[int] | None = None, copy: bool = False, base: str | None = None,
    keep: list[str] | None = None, size: int = 0, raw: int = 0, after: int | None = None,
) -> bytes:  # fmt: skip
    """The message with ``key``'s state for its move (on its origin's ``.keys.<origin>``); a
    large state comes in ``parts`` (the sequences of its :func:`state_parts` messages on
    the subject addressed to ``to`` by ``element``, in order, ``size`` bytes in all, ``raw``
    bytes of JSON uncompressed) instead. ``copy``, ``base``, ``keep`` and ``after``: see
    :class:`KeyState`."""
    body: dict[str, Any] = {"type": "key-state", "move": move, "element": element, "key": key,
                            "to": to, "state": state}  # fmt: skip
    if parts is not None:
        body.update(parts=parts, size=size, raw=raw, addressed=True, scoped=True)
    if copy:
        body["copy"] = True
    if base is not None:
        body.update(base=base, keep=list(keep or ()))
    if after is not None:
        body["after"] = after
    return json.dumps(body).encode()


def state_parts(state: dict[str, str]) -> tuple[list[bytes], int] | None:
    """The messages of a large state: its JSON text compressed (:data:`STATE_CODEC`) in
    pieces of at most :data:`STATE_PART_BYTES`, and the text's length; ``None`` when the
    text is at most :data:`INLINE_STATE_BYTES` (it goes in its record)."""
    text = json.dumps(state).encode()
    if len(text) <= INLINE_STATE_BYTES:
        return None
    import pyarrow as pa  # (only partitions' workers send states, and they load it anyway)

    packed = pa.compress(text, codec=STATE_CODEC, asbytes=True)
    step = STATE_PART_BYTES
    return [packed[i : i + step] for i in range(0, len(packed), step)], len(text)


def joined_state(parts: list[bytes], raw: int) -> dict[str, str]:
    """The state whose :func:`state_parts` messages are ``parts``, in order, ``raw`` bytes
    of JSON text uncompressed (``0``: parts an older fogshift stored, each a JSON object
    with a piece of the text)."""
    if raw:
        import pyarrow as pa

        text = pa.decompress(b"".join(parts), decompressed_size=raw, codec=STATE_CODEC,
                             asbytes=True)  # fmt: skip
        value = json.loads(text)
    else:
        value = json.loads("".join(str(json.loads(p)["text"]) for p in parts))
    return {str(k): str(v) for k, v in dict(value).items()}


@dataclass
class Ownership:
    """Who owns each key of a partitioned element, as of the moves applied so far."""

    count: int
    moved: dict[str, int] = field(default_factory=dict)
    applied: int = 0  # the sequence of the last move applied
    #: Keys whose last move's state has not been stored yet: key -> that move.
    pending: dict[str, str] = field(default_factory=dict)
    rescaled: int = 0  # the sequence of the last rescale applied (0: none)
    #: Key group moves applied, oldest first: ``(g, n, to)``.
    groups: list[tuple[int, int, int]] = field(default_factory=list)
    #: ``(move, key)`` -> the partition that must send the key's state for that move (its
    #: owner before the move) or copy request (its owner then): see :meth:`sent_by_owner`.
    senders: dict[tuple[str, str], int] = field(default_factory=dict)
    #: ``(key, to)`` -> the last copy request of the key for partition ``to``: the one a
    #: later move to ``to`` names (see :meth:`newest_copy`).
    copies: dict[tuple[str, int], str] = field(default_factory=dict)
    #: key -> the newest move that took it to another partition (see :meth:`last_move`).
    last: dict[str, str] = field(default_factory=dict)
    #: key -> ``(move, seq)``: the state stored for the key's last move held something, at
    #: input sequence ``seq`` (see :meth:`carried_at`).
    carried: dict[str, tuple[str, int]] = field(default_factory=dict)

    def last_move(self, key: str) -> str | None:
        """The newest move applied that took ``key`` to another partition (``None``: none)."""
        return self.last.get(key)

    def carried_at(self, key: str) -> int | None:
        """The input sequence of the state the key's newest move carried, if that state held
        something (``None``: not stored yet, or empty: the key had no state to carry)."""
        move = self.last.get(key)
        carried = self.carried.get(key)
        return carried[1] if move is not None and carried and carried[0] == move else None

    def owner(self, key: str | None) -> int:
        """The partition owning ``key`` (``None``: keyless, partition 0)."""
        if key is None:
            return 0
        if key in self.moved:
            return self.moved[key]
        for g, n, to in reversed(self.groups):
            if in_group(key, g, n):
                return to
        return partition_of_key(key, self.count)

    def apply(self, move: KeyMove) -> dict[str, int]:
        """Apply ``move`` (once: a move at or before :attr:`applied` is skipped); the
        previous owner of each key it moves."""
        if move.seq <= self.applied:
            return {}
        before = {k: self.owner(k) for k in move.keys}
        if move.count is not None:  # a rescale: every key to its partition of the new count
            self.moved.clear()
            self.groups.clear()
            self.count = move.count
            self.rescaled = move.seq
        if move.group is not None:  # the group's rule wins over its keys' earlier moves
            g, n = move.group
            self.moved = {k: p for k, p in self.moved.items() if not in_group(k, g, n)}
            self.groups.append((g, n, move.to))
        for key in move.keys:
            if move.count is None and move.group is None:
                self.moved[key] = move.to
            if before[key] != move.target(key):
                self.pending[key] = move.move
                self.senders[(move.move, key)] = before[key]
                self.last[key] = move.move
        self.applied = move.seq
        return before

    def request(self, copy: KeyCopy) -> None:
        """Note a copy request: each key's owner now sends its copy (none to itself)."""
        for key in copy.keys:
            owner = self.owner(key)
            if owner != copy.to:
                self.senders[(copy.move, key)] = owner
                self.copies[(key, copy.to)] = copy.move

    def newest_copy(self, state: KeyState) -> bool:
        """Whether ``state`` (a copy) is of the last copy request of its key for its
        target. An older one comes after a newer request only when its origin sent it
        again (restored from before it, past the broker's duplicate window); kept, it
        would replace the copy the key's next move names, which could then never complete."""
        return self.copies.get((state.key, state.to)) == state.move

    def sent_by_owner(self, state: KeyState) -> bool:
        """Whether ``state`` comes from the partition its move or copy request asks it of
        (``origin`` ``None``: on ``.keys``, the orchestrator's or an older fogshift's). A
        state from any other partition is forged: never installed, never settling."""
        return state.origin is None or self.senders.get((state.move, state.key)) == state.origin

    def settle(self, state: KeyState) -> None:
        """Note that ``state`` (a key's state for its move) is stored (a copy settles
        nothing, nor a state from a partition that did not own the key)."""
        if (
            not state.copy
            and self.pending.get(state.key) == state.move
            and self.sent_by_owner(state)
        ):
            del self.pending[state.key]
            if state.state or state.parts or state.keep:
                self.carried[state.key] = (state.move, state.seq)
            else:
                self.carried.pop(state.key, None)


def in_group(key: str, group: int, of: int) -> bool:
    """Whether ``key`` is in key group ``group`` of ``of`` (CRC-32 of its text modulo
    ``of``, as partitions split keys)."""
    return partition_of_key(key, of) == group


def key_text(body: Any, key_by: str) -> str | None:
    """An event body's key as the PE groups it: the field's value as text (a string as is,
    an integer or a boolean as JSON), ``None`` when the body has no key: it is not an
    object, or the field is missing, null, a float, an object or an array, or a string
    with a lone surrogate.

    Only these keys have one text wherever a key is read: Spark's ``get_json_object``, which
    groups a keyed PE's events, writes a float as Java's ``Double.toString`` does (``1e7``:
    ``1.0E7``, not ``10000000.0``; ``2e23``: ``1.9999999999999998E23``) and an object without
    spaces, so a partition's reader, routing by this text, would send such a key's events
    elsewhere than its state (see :func:`key_refusal`, which dead-letters them).
    """
    if not isinstance(body, dict):
        return None
    value = body.get(key_by)
    if isinstance(value, str):
        # A lone surrogate (JSON's "\\ud800") has no UTF-8 bytes to route by, and Spark
        # reads no key in it either.
        return value if value.isascii() or has_utf8(value) else None
    # (bool is an int: true / false, as Spark writes them)
    return json.dumps(value) if isinstance(value, int) else None


def key_refusal(body: str, key_by: str, grouped: str, pe: str) -> str | None:
    """Why an event of keyed PE ``pe`` that Spark grouped under key text ``grouped`` may not
    be processed under that key (``None``: it may, or its body is not JSON, which processing
    dead-letters as such).

    Refused: a ``key_by`` field that is a float, an object or an array (no one text, see
    :func:`key_text`), and any body whose key reads otherwise here than to Spark (a field
    repeated in the object: Spark takes the first, JSON parsers the last; a lone surrogate).
    Such an event would be routed by one text and kept under another, so it is never
    processed: it belongs to no key's state. So is a key longer than
    :data:`~fogshift.events.MAX_KEY_CHARS` (which could be neither asked for nor moved).
    """
    if len(grouped) > MAX_KEY_CHARS:
        return (
            f"field {key_by!r} (key_by of {pe!r}) is {len(grouped):,} characters long: a key "
            f"is at most {MAX_KEY_CHARS:,} (to be asked for and moved by name)"
        )
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    field = value.get(key_by) if isinstance(value, dict) else None
    hint = "key by a string or an integer field"
    if isinstance(field, float | dict | list):
        kind = {float: "a float", dict: "an object", list: "an array"}[type(field)]
        return (
            f"field {key_by!r} (key_by of {pe!r}) is {kind}: a key must be a string, an "
            f"integer or a boolean, whose text is the same wherever it is read ({hint})"
        )
    text = key_text(value, key_by)
    if text != grouped:
        return (
            f"field {key_by!r} (key_by of {pe!r}) reads as {text!r} here and as {grouped!r} "
            f"to Spark (is the field repeated in the body?): the event has no one key ({hint})"
        )
    return None


def event_fields(data: bytes) -> tuple[int, float, str, str]:
    """``(seq, timestamp, creator, body)`` of a stored message.

    A message that is not a fogshift event (someone else published on the subject) is passed
    on with its raw text as the body and :data:`NOT_AN_EVENT` as its creator: the consuming
    PE dead-letters it with the reason, instead of the query failing on it again and again.
    So is one that names a creator no PE has (``fogshift:...``): only the reader makes the
    control rows of key moves, and one taken from a data message could stop a partition or
    hand a key's state away; and one whose timestamp is not finite (``NaN``).
    """
    try:
        payload = json.loads(data)
        seq = int(payload["seq"])
        if not 0 <= seq < 1 << 63:
            raise ValueError(f"seq {seq} is out of range")  # (an Arrow int64 column holds it)
        creator, body = str(payload["creator"]), str(payload["body"])
        if creator.startswith(CONTROL_PREFIX) or creator == NOT_AN_EVENT:
            raise ValueError(f"creator {creator!r} is no PE's")
        # A lone surrogate (a JSON escape no writer of ours makes) has no UTF-8: Arrow
        # refused the row, and the batch failed at every retry.
        creator.encode(), body.encode()
        timestamp = float(payload["timestamp"])
        if not math.isfinite(timestamp):
            # (pandas made NaN a null on the way out: the dead letter's writer failed on it
            # at every retry, and the PE for good. A review's finding.)
            raise ValueError(f"timestamp {timestamp} is not finite")
        return (seq, timestamp, creator, body)
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        # (1e999 as an int, a number too large for a float, JSON nested too deep)
        return (0, 0.0, NOT_AN_EVENT, data.decode("utf-8", errors="replace"))


def body_key(body: str, key_by: str) -> str | None:
    """The key of an event body text as a keyed PE groups it (``None``: no key, or not
    JSON)."""
    try:
        return key_text(json.loads(body), key_by)
    except (ValueError, RecursionError):
        return None
