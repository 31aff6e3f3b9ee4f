"""Key moves as stored records: parsed back, replayed into who owns each key."""

from __future__ import annotations

import base64
import json
import random
import zlib

import pytest

from fogshift.broker.keys import (
    INLINE_STATE_BYTES,
    PACKED_MOVE_BYTES,
    STATE_PART_BYTES,
    KeyCopy,
    KeyMove,
    KeyState,
    Ownership,
    body_key,
    event_fields,
    in_group,
    joined_state,
    key_refusal,
    key_text,
    parse,
    read_message,
    state_parts,
    state_payload,
)
from fogshift.broker.permissions import Hosted, node_permissions
from fogshift.events import NOT_AN_EVENT
from fogshift.spec.models import partition_of_key


def test_a_move_and_a_state_read_back_as_stored() -> None:
    move = KeyMove(0, "m1", "agg", ("s1", "s2"), 1, "backlog")
    assert parse(17, move.payload()) == KeyMove(17, "m1", "agg", ("s1", "s2"), 1, "backlog")
    state = state_payload("m1", "agg", "s1", 1, {"values": "[1.0]"})
    assert parse(18, state) == KeyState(18, "m1", "agg", "s1", 1, {"values": "[1.0]"})
    # Anything else on the subject is stepped over, never an error.
    for junk in (b"", b"not json", b"[]", b'{"type": "key-move"}', json.dumps({"a": 1}).encode(),
                 b'{"type": "key-move", "move": "m", "element": "agg", "keys": [], "to": 1e999}',
                 b'{"type": "key-state", "move": "m", "element": "agg", "key": "k", "to": 1' +
                 b"0" * 400 + b".5, \"state\": {}}",
                 b"[" * 100_000 + b"]" * 100_000):  # fmt: skip
        assert parse(1, junk) is None
    # A state whose "after" no int64 column holds (the target numbers its rows beyond it)
    # is stepped over too; one in range reads back.
    for after, read in ((-1, False), (1 << 62, False), (10**30, False), ((1 << 62) - 1, True)):
        payload = state_payload("m1", "agg", "s1", 1, {"values": "[1.0]"}, after=after)
        assert (parse(3, payload) is not None) is read, after
    # An event body nested too deep has no key (its PE dead-letters it), as one not JSON.
    assert body_key("[" * 100_000 + "]" * 100_000, "sensor") is None


def test_ownership_replays_moves_in_order_and_each_once() -> None:
    owners = Ownership(3)
    keys = [f"s{i}" for i in range(30)]
    assert [owners.owner(k) for k in keys] == [partition_of_key(k, 3) for k in keys]
    assert owners.owner(None) == 0
    away = [k for k in keys if partition_of_key(k, 3) != 2][:4]
    before = owners.apply(KeyMove(10, "m1", "agg", tuple(away), 2))
    assert before == {k: partition_of_key(k, 3) for k in away}
    assert all(owners.owner(k) == 2 for k in away)
    # A move already applied (a replayed batch reads it again) changes nothing.
    assert owners.apply(KeyMove(10, "m1", "agg", tuple(away), 0)) == {}
    assert owners.apply(KeyMove(12, "m2", "agg", (away[0],), 1)) == {away[0]: 2}
    assert owners.owner(away[0]) == 1 and owners.owner(away[1]) == 2


def test_a_rescale_gives_every_key_its_partition_of_the_new_count() -> None:
    owners = Ownership(2)
    keys = [f"s{i}" for i in range(40)]
    owners.apply(KeyMove(5, "m1", "agg", ("s0", "s1"), 1))
    for key in ("s0", "s1"):
        owners.settle(KeyState(6, "m1", "agg", key, 1, {}))
    stored = KeyMove(0, "r1", "agg", ("s0", "s7"), -1, "backlog", 3).payload()
    rescale = parse(9, stored)
    assert rescale == KeyMove(9, "r1", "agg", ("s0", "s7"), -1, "backlog", 3)
    assert isinstance(rescale, KeyMove)
    assert [rescale.target(k) for k in keys] == [partition_of_key(k, 3) for k in keys]
    before = owners.apply(rescale)
    assert before == {"s0": 1, "s7": partition_of_key("s7", 2)}
    # The earlier moves are forgotten: every key is where CRC-32 of three puts it.
    assert owners.count == 3 and owners.moved == {}
    assert [owners.owner(k) for k in keys] == [partition_of_key(k, 3) for k in keys]
    # Its listed keys wait for their states where their partition changed.
    assert set(owners.pending) == {k for k in ("s0", "s7") if before[k] != partition_of_key(k, 3)}
    assert all(owners.pending[k] == "r1" for k in owners.pending)
    # A count below one is no rescale.
    assert parse(10, stored.replace(b'"count": 3', b'"count": 0')) is None


def test_a_rescale_of_many_keys_is_stored_packed_and_read_back_whole() -> None:
    # A rescale lists every key holding state that changes partition: 100,000 keys were
    # 1.8 MB of JSON, over what one record may hold (the orchestrator refused the scale).
    keys = tuple(f"patient-{n:06d}" for n in range(100_000))
    stored = KeyMove(0, "r1", "agg", keys, -1, "backlog", 3).payload()
    plain = json.dumps({"keys": list(keys)}).encode()
    assert len(stored) < len(plain) / 5 and len(stored) < 900 * 1024
    assert parse(9, stored) == KeyMove(9, "r1", "agg", keys, -1, "backlog", 3)
    # A small one stays plain JSON, as an older fogshift stored it.
    small = KeyMove(0, "m1", "agg", ("s1",), 1).payload()
    assert small.startswith(b"{") and len(small) < PACKED_MOVE_BYTES
    # A packed record cut short, or one that would unpack without bound, is stepped over.
    assert parse(9, stored[: len(stored) // 2]) is None
    assert parse(9, zlib.compress(b"{" + b" " * (80 * 1024 * 1024))) is None
    assert parse(9, b"x not zlib") is None


def test_a_key_group_moves_its_keys_seen_and_unseen_over_their_earlier_moves() -> None:
    owners = Ownership(2)
    keys = [f"s{i}" for i in range(60)]
    grouped = [k for k in keys if in_group(k, 1, 4)]
    assert grouped and len(grouped) < len(keys)
    # One key of the group had moved alone before; the group's move wins over that.
    owners.apply(KeyMove(3, "m1", "agg", (grouped[0],), 1 - partition_of_key(grouped[0], 2)))
    owners.settle(KeyState(4, "m1", "agg", grouped[0], 0, {}))
    stored = KeyMove(0, "g1", "agg", tuple(grouped[:2]), 0, "backlog", group=(1, 4)).payload()
    move = parse(8, stored)
    assert move == KeyMove(8, "g1", "agg", tuple(grouped[:2]), 0, "backlog", group=(1, 4))
    assert isinstance(move, KeyMove)
    owners.apply(move)
    assert all(owners.owner(k) == 0 for k in grouped)  # listed or not: the whole group
    assert all(owners.owner(k) == partition_of_key(k, 2) for k in keys if k not in grouped)
    # A later single move of a key of the group still moves it; a rescale forgets groups.
    owners.apply(KeyMove(9, "m2", "agg", (grouped[1],), 1))
    assert owners.owner(grouped[1]) == 1 and owners.owner(grouped[2]) == 0
    owners.apply(KeyMove(12, "r", "agg", (), -1, "backlog", 3))
    assert [owners.owner(k) for k in keys] == [partition_of_key(k, 3) for k in keys]
    # A group outside its count is no move.
    assert parse(13, stored.replace(b"[1, 4]", b"[4, 4]")) is None


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"patient": "p01", "t": 0.5}, "p01"),
        ({"patient": 7}, "7"),  # Spark's get_json_object gives a number's JSON text
        ({"patient": 123456789012345678901234567890}, "123456789012345678901234567890"),
        ({"patient": True}, "true"),
        # No key: Spark writes these otherwise (1.0E7, {"a":1}) or reads none (a lone
        # surrogate); key_refusal dead-letters them.
        ({"patient": 1e7}, None),
        ({"patient": 2.5}, None),
        ({"patient": {"a": 1}}, None),
        ({"patient": [1]}, None),
        ({"patient": "p\ud800"}, None),
        ({"patient": "é"}, "é"),
        ({"patient": None}, None),  # no key: such events are dead letters, never output
        ({"other": "p01"}, None),
        ("not an object", None),
        (["p01"], None),
    ],
)
def test_a_key_is_the_field_as_text_as_the_runtime_groups_by_it(
    body: object, key: str | None
) -> None:
    # Also which events of a keyed PE `GET .../events?key=` selects.
    assert key_text(body, "patient") == key


def test_only_a_partition_may_append_key_states_to_its_input() -> None:
    plain = node_permissions("n1", [Hosted("p", "agg", ("src",))])
    moving = node_permissions("n1", [Hosted("p", "agg-p1", ("src",), moves_keys=1)])
    assert not {"fs.p.src.keys", "fs.p.src.keys.agg-p1"} & set(plain["publish"]["allow"])
    assert {"fs.p.src.keys.agg-p1", "fs.p.src.state.agg.*"} <= set(moving["publish"]["allow"])
    # Never the orchestrator's moves, nor another partition's states.
    assert not {"fs.p.src.keys", "fs.p.src.keys.agg-p0", "fs.p.src.keys.*", "fs.p.src.keys.>",
                "fs.p.src.keys.1"} & set(moving["publish"]["allow"])  # fmt: skip
    assert not [s for s in plain["publish"]["allow"] if s.startswith("fs.p.src.state")]
    # Only its element's partitions' parts: not .state (only older fogshifts wrote it), nor
    # .state.<index> (every element's, until 2026-12-02), nor any element's.
    assert not {"fs.p.src.state", "fs.p.src.state.*", "fs.p.src.state.*.*",
                "fs.p.src.state.>"} & set(moving["publish"]["allow"])  # fmt: skip
    assert "fs.p.src.data" not in moving["publish"]["allow"]


def test_two_partitioned_elements_on_one_input_share_no_key_state_subject() -> None:
    # agg and other both read src, each in partitions: partition 0 of one may not hand over
    # the keys of the other's partition 0 (they shared ``.keys.0``).
    agg = node_permissions("n1", [Hosted("p", "agg-p0", ("src",), moves_keys=0)])
    other = node_permissions("n2", [Hosted("p", "other-p0", ("src",), moves_keys=0)])
    # Nor their large states' parts: one's node could fill the other's read-ahead.
    for prefix in ("fs.p.src.keys", "fs.p.src.state"):
        mine = [s for s in agg["publish"]["allow"] if s.startswith(prefix)]
        assert mine and not set(mine) & set(other["publish"]["allow"]), prefix


def test_a_message_is_taken_for_what_its_sender_may_send() -> None:
    """Moves and copy requests from ``.keys`` (the orchestrator's) only; a state from
    ``.keys.<element>-p<origin>`` carries that origin, whatever its body claims."""
    move = KeyMove(0, "m1", "agg", ("s1",), 1).payload()
    request = KeyCopy(0, "c1", "agg", ("s1",), 1).payload()
    state = state_payload("m1", "agg", "s1", 1, {"n": "1"})
    assert read_message("p", "src", "fs.p.src.keys", 5, move) == parse(5, move)
    assert read_message("p", "src", "fs.p.src.keys", 6, request) == parse(6, request)
    for forged in (move, request):  # a partition's node forging the orchestrator's
        assert read_message("p", "src", "fs.p.src.keys.agg-p0", 7, forged) is None
    sent = read_message("p", "src", "fs.p.src.keys.agg-p3", 8, state)
    assert isinstance(sent, KeyState) and sent.origin == 3 and sent.key == "s1"
    # On .keys: the orchestrator's, or an older fogshift's partitions' (no origin known).
    legacy = read_message("p", "src", "fs.p.src.keys", 9, state)
    assert isinstance(legacy, KeyState) and legacy.origin is None
    for subject in ("fs.p.src.keys.x", "fs.p.src.keys.agg-p-1", "fs.p.src.keys.agg-p٣",
                    "fs.p.src.data", "fs.p.other.keys.agg-p1", "fs.p.src.keysx.agg-p1",
                    "fs.p.src.keys.agg-p01", "fs.p.src.keys.agg-p", "fs.p.src.keys.3",
                    # another element's partition 3, naming agg in the body
                    "fs.p.src.keys.other-p3", "fs.p.src.keys.xagg-p3"):  # fmt: skip
        assert read_message("p", "src", subject, 10, state) is None, subject


def test_a_large_state_goes_compressed_in_parts_that_join_back() -> None:
    # Incompressible text (as bench pam's padding) spans several parts, each a broker
    # message; text that compresses well (numbers) crosses in far fewer bytes.
    noise = base64.b64encode(random.Random(1).randbytes(3 * STATE_PART_BYTES)).decode()
    big = {"padding": noise, "values": "[1.0, 2.0]"}
    made = state_parts(big)
    assert made is not None
    parts, raw = made
    assert raw == len(json.dumps(big)) and len(parts) == 4
    assert all(len(p) <= STATE_PART_BYTES for p in parts)  # each fits a broker message
    assert sum(map(len, parts)) < 0.8 * raw  # base64: 6 bits a character
    assert joined_state(parts, raw) == big
    numbers = {"values": json.dumps([round(x * 0.37, 4) for x in range(20_000)])}
    packed, text = state_parts(numbers) or ([], 0)
    assert len(packed) == 1 and len(packed[0]) < 0.5 * text
    assert joined_state(packed, text) == numbers
    # Parts an older fogshift stored: JSON objects with pieces of the text, no length.
    older = [json.dumps({"type": "key-state-part", "index": i, "text": t}).encode()
             for i, t in enumerate(('{"a": "x', 'yz"}'))]  # fmt: skip
    assert joined_state(older, 0) == {"a": "xyz"}
    record = parse(40, state_payload("m1", "agg", "s1", 1, None, [36, 37, 38, 39], size=1234,
                                     raw=5678))  # fmt: skip
    assert isinstance(record, KeyState)
    assert (record.parts, record.size, record.raw) == ((36, 37, 38, 39), 1234, 5678)
    # A state up to INLINE_STATE_BYTES goes in its record; one byte more, in parts.
    assert state_parts({"a": "b"}) is None
    edge = {"a": "x" * (INLINE_STATE_BYTES - len(json.dumps({"a": ""})))}
    assert len(json.dumps(edge)) == INLINE_STATE_BYTES and state_parts(edge) is None
    assert state_parts({"a": edge["a"] + "y"}) is not None


def test_a_key_waits_for_its_state_until_that_moves_state_is_stored() -> None:
    owners = Ownership(2)
    key = next(f"s{i}" for i in range(20) if partition_of_key(f"s{i}", 2) == 0)
    owners.apply(KeyMove(5, "m1", "agg", (key,), 1))
    assert owners.pending == {key: "m1"}
    owners.settle(KeyState(6, "other", "agg", key, 1, {}))  # another move's state: not this
    assert owners.pending == {key: "m1"}
    owners.settle(KeyState(7, "m1", "agg", key, 1, {}))
    assert owners.pending == {}
    # A move to where the key already is hands nothing over: nothing to wait for.
    owners.apply(KeyMove(8, "m2", "agg", (key,), 1))
    assert owners.pending == {}


def test_a_precopied_move_reads_back_with_its_copy_and_completes_from_it() -> None:
    request = KeyCopy(0, "c1", "agg", ("s1", "s2"), 1)
    assert parse(20, request.payload()) == KeyCopy(20, "c1", "agg", ("s1", "s2"), 1)
    move = parse(30, KeyMove(0, "m1", "agg", ("s1",), 1, "backlog", copy="c1").payload())
    assert isinstance(move, KeyMove) and move.copy == "c1"
    assert parse(31, KeyMove(0, "m2", "agg", ("s1",), 1).payload()) == KeyMove(
        31, "m2", "agg", ("s1",), 1
    )  # no copy named: the whole states travel
    copy = parse(21, state_payload("c1", "agg", "s1", 1, {"model": "M", "n": "1"}, copy=True))
    assert isinstance(copy, KeyState) and copy.copy and copy.base is None
    # At the move: what changed, and the names of the parts as the copy had them.
    rest = parse(32, state_payload("m1", "agg", "s1", 1, {"n": "5"}, base="c1", keep=["model"]))
    assert isinstance(rest, KeyState) and not rest.copy
    assert (rest.base, rest.keep) == ("c1", ("model",))
    assert rest.complete(copy.state) == {"model": "M", "n": "5"}
    # A part in neither is gone (the origin dropped it since the copy).
    assert rest.complete({"model": "M", "n": "1", "old": "x"}) == {"model": "M", "n": "5"}
    with pytest.raises(ValueError, match="completes copy c1"):
        rest.complete(None)
    with pytest.raises(ValueError, match="completes copy c1"):
        rest.complete({"n": "1"})  # not that copy: a kept part is missing
    # Every part changed: the copy is not needed (nor missed).
    changed = parse(34, state_payload("m1", "agg", "s1", 1, {"model": "N"}, base="c1", keep=[]))
    assert isinstance(changed, KeyState) and changed.complete(None) == {"model": "N"}
    whole = parse(33, state_payload("m2", "agg", "s1", 1, {"n": "6"}))
    assert isinstance(whole, KeyState) and whole.complete(None) == {"n": "6"}


def test_a_keys_state_counts_only_from_its_owner_before_the_move() -> None:
    # Partition 2 forging partition 0's state of a key moving to 1: neither taken by the
    # target (the reader skips it) nor settling the move (the orchestrator would then let
    # the key move on while partition 1 still waits for it).
    owners = Ownership(3)
    key = next(f"s{i}" for i in range(50) if partition_of_key(f"s{i}", 3) == 0)
    owners.apply(KeyMove(5, "m1", "agg", (key,), 1))
    forged = KeyState(6, "m1", "agg", key, 1, {"n": "99"}, origin=2)
    assert not owners.sent_by_owner(forged)
    owners.settle(forged)
    assert owners.pending == {key: "m1"}
    real = KeyState(7, "m1", "agg", key, 1, {"n": "1"}, origin=0)
    assert owners.sent_by_owner(real)
    owners.settle(real)
    assert owners.pending == {}
    # A copy comes from the key's owner at the request: now partition 1.
    owners.request(KeyCopy(8, "c1", "agg", (key,), 2))
    assert owners.sent_by_owner(KeyState(9, "c1", "agg", key, 2, {}, copy=True, origin=1))
    assert not owners.sent_by_owner(KeyState(9, "c1", "agg", key, 2, {}, copy=True, origin=0))
    # A move or copy nobody asked for has no owner to send it; one on .keys (the
    # orchestrator's, or an older fogshift's partitions'), no origin to check.
    assert not owners.sent_by_owner(KeyState(10, "m9", "agg", key, 2, {}, origin=1))
    assert owners.sent_by_owner(KeyState(10, "m9", "agg", key, 2, {}))
    # A rescale's states come from each key's owner under the count before it.
    owners.apply(KeyMove(11, "r1", "agg", (key,), 0, count=1))
    assert owners.sent_by_owner(KeyState(12, "r1", "agg", key, 0, {}, origin=1))


def test_a_copy_settles_no_move_and_moves_no_key() -> None:
    owners = Ownership(2)
    key = next(f"s{i}" for i in range(20) if partition_of_key(f"s{i}", 2) == 0)
    owners.apply(KeyMove(5, "m1", "agg", (key,), 1, copy="c1"))
    owners.settle(KeyState(4, "c1", "agg", key, 1, {"n": "1"}, copy=True))
    assert owners.pending == {key: "m1"}
    owners.settle(KeyState(6, "m1", "agg", key, 1, {}, base="c1", keep=("n",)))
    assert owners.pending == {} and owners.owner(key) == 1


@pytest.mark.parametrize(
    ("body", "grouped", "refused"),
    [
        ('{"patient": "p1"}', "p1", None),
        ('{"patient": 7}', "7", None),
        ('{"patient": false}', "false", None),
        ('{"patient": 1e7}', "1.0E7", "is a float"),
        ('{"patient": 1E2}', "100.0", "is a float"),
        ('{"patient": {"a": 1}}', '{"a":1}', "is an object"),
        ('{"patient": [1, 2]}', "[1,2]", "is an array"),
        # Spark takes the first of a repeated field, Python's json the last.
        ('{"patient": "a", "patient": "b"}', "a", "reads as 'b' here and as 'a' to Spark"),
        # Spark reads single quotes and ignores what follows an object: not JSON here, which
        # processing dead-letters as such.
        ("{'patient': 'q'}", "q", None),
        # Longer than a key can be asked for or moved by name: refused, whatever it is.
        ('{"patient": "' + "é" * 1024 + '"}', "é" * 1024, None),
        ('{"patient": "' + "é" * 1025 + '"}', "é" * 1025, "is 1,025 characters long"),
    ],
)
def test_an_event_whose_key_has_no_one_text_is_refused(
    body: str, grouped: str, refused: str | None
) -> None:
    # `grouped`: what Spark 4.3's get_json_object gives for `body` (measured).
    reason = key_refusal(body, "patient", grouped, "agg")
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason, reason
        assert "'patient' (key_by of 'agg')" in reason
        assert "string or an integer" in reason or "a key is at most 1,024" in reason


def test_only_the_newest_copy_request_of_a_key_for_a_target_is_kept() -> None:
    owners = Ownership(2)
    key = next(k for k in (f"p{i}" for i in range(20)) if partition_of_key(k, 2) == 0)
    owners.request(KeyCopy(3, "c1", "agg", (key,), 1))

    def copy(move: str, to: int = 1) -> KeyState:
        return KeyState(9, move, "agg", key, to, {"count": "1"}, copy=True, origin=0)

    assert owners.newest_copy(copy("c1"))
    owners.request(KeyCopy(5, "c2", "agg", (key,), 1))
    # c1's copy sent again after c2's request: stale, whoever sent it.
    assert owners.sent_by_owner(copy("c1")) and not owners.newest_copy(copy("c1"))
    assert owners.newest_copy(copy("c2"))
    # A copy for another target is not a newer copy for this one.
    owners.request(KeyCopy(7, "c3", "agg", (key,), 0))  # its owner: no copy at all
    assert owners.newest_copy(copy("c2")) and not owners.newest_copy(copy("c3", 0))


@pytest.mark.parametrize("timestamp", ["NaN", "Infinity", "-Infinity", '"nan"'])
def test_a_message_whose_timestamp_is_not_finite_is_not_an_event(timestamp: str) -> None:
    # pandas made a NaN timestamp a null on the way out of the PE: the writer of its dead
    # letter failed on it at every retry, and the PE for good (a review's finding).
    data = f'{{"seq": 2, "timestamp": {timestamp}, "creator": "src", "body": "{{}}"}}'
    seq, when, creator, body = event_fields(data.encode())
    assert (seq, when, creator, body) == (0, 0.0, NOT_AN_EVENT, data)
    assert event_fields(data.replace(timestamp, "1.5").encode()) == (2, 1.5, "src", "{}")
