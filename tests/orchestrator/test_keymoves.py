"""How a key move goes in waves and a precopy in steps, and when a scale must rescale (the
orchestrator's side, with the broker stood in for; the moves themselves run on real agents
in ``tests/integration/test_partitioned.py``)."""

from __future__ import annotations

import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from fogshift.broker.keys import KeyCopy, KeyMove, Ownership, parse, state_payload
from fogshift.contracts import KeyOrder
from fogshift.events import MAX_KEY_CHARS
from fogshift.orchestrator.exceptions import UnknownNode
from fogshift.orchestrator.keymoves import (
    FIRST_WAVE_BYTES,
    FIRST_WAVE_KEYS,
    MAX_KEYS,
    PRECOPY_STEP_BYTES,
    WAVE_BYTES,
    WAVE_KEYS,
    KeyMoves,
    Listing,
    _check_keys,
    _next_step,
    _target_partition,
)
from fogshift.orchestrator.scaling import _rescaled_to

KIB, MIB = 1024, 1024 * 1024
TARGET: Any = SimpleNamespace(id="agg-p1", partition=SimpleNamespace(index=1), inputs=("in",))


class Waves(KeyMoves):
    """The waves a move appends, each wave's states stored at once with the ``sizes`` given
    (a key in ``lost`` never sends one: its origin is down)."""

    def __init__(
        self, sizes: dict[str, int], lost: frozenset[str] = frozenset(), sending: bool = True
    ) -> None:
        self.sizes, self.lost, self.sending = sizes, lost, sending
        self.moves: list[KeyMove] = []
        self.log: list[tuple[str, list[str]]] = []
        self.broker: Any = SimpleNamespace(run=lambda make, timeout=30, **_: 0)  # parts counted

    def _append_key_record(self, pipeline: str, source: str, payload: bytes, msg_id: str) -> int:
        move = parse(0, payload)
        assert isinstance(move, KeyMove)
        self.moves.append(move)
        self.log.append(("append", list(move.keys)))
        return 1000 * len(self.moves)

    def _await_sending(self, *args: Any, **kwargs: Any) -> bool:
        self.log.append(("sending", []))
        return self.sending

    def _await_states(
        self, pipeline: str, source: str, move: str, at: int, keys: list[str], deadline: float,
        empty: set[str] | None = None,
    ) -> tuple[dict[str, tuple[Any, int]], float | None]:  # fmt: skip
        self.log.append(("stored", keys))
        states = {}
        for index, key in enumerate(k for k in keys if k not in self.lost):
            data = state_payload(move, "agg", key, 1, {"v": "x"})
            message = SimpleNamespace(seq=at + index + 1, stored_at=at + 0.01 * (index + 1),
                                      data=data)  # fmt: skip
            states[key] = (message, self.sizes[key])
        return states, float(at)

    def run(self, moving: list[str], **options: Any) -> Any:
        return self._move_waves("p", "agg", "in", moving, TARGET, KeyOrder.BACKLOG, 5.0,
                                **options)  # fmt: skip


def keys(count: int, size: int, prefix: str = "k") -> dict[str, int]:
    return {f"{prefix}{i}": size for i in range(count)}


def test_waves_start_at_one_key_and_grow_fourfold_up_to_the_key_cap() -> None:
    sizes = keys(100, KIB)
    waves = Waves(sizes)
    settled, appended, last = waves.run(list(sizes), wave_keys=None)
    assert (
        [len(w.keys) for w in appended] == [1, 4, 16, 64, 15] == [len(m.keys) for m in waves.moves]
    )
    assert [k for w in appended for k in w.keys] == list(sizes)  # in the order listed
    assert [w.seq for w in appended] == [1000, 2000, 3000, 4000, 5000]
    assert settled.error is None and settled.left == [] and len(settled.stoppage_ms) == 100
    assert settled.state_bytes == 100 * KIB and last == {1: 5015}
    # Each key's stoppage counts from its own wave: the third key of a wave, 30 ms.
    assert settled.stoppage_ms["k7"] == 30.0


def test_large_states_move_about_a_wave_s_bytes_at_a_time() -> None:
    sizes = keys(10, MIB)
    _, appended, _ = Waves(sizes).run(list(sizes), wave_keys=None)
    assert [len(w.keys) for w in appended] == [1, 2, 2, 2, 2, 1]
    assert WAVE_BYTES // MIB == 2


def test_a_wave_of_large_states_is_appended_once_the_origin_sends_the_one_before() -> None:
    # 0.8 MB states (in parts): from the second wave on, the next goes in as soon as the
    # origin sends a wave's parts (its batch runs), for the batch after, as a precopy's
    # requests do; never more than one wave ahead of the one being sent.
    waves = Waves(keys(5, 800 * KIB))
    settled, appended, _ = waves.run(list(waves.sizes), wave_keys=None)
    assert [w.keys for w in appended] == [["k0"], ["k1", "k2"], ["k3", "k4"]]
    assert waves.log == [
        ("append", ["k0"]), ("stored", ["k0"]),
        ("append", ["k1", "k2"]), ("sending", []), ("append", ["k3", "k4"]),
        ("stored", ["k1", "k2"]), ("stored", ["k3", "k4"]),
    ]  # fmt: skip
    assert settled.error is None and len(settled.stoppage_ms) == 5
    # Not seen sending (stored before a part was seen): each wave after the one before.
    alone = Waves(keys(5, 800 * KIB), sending=False)
    alone.run(list(alone.sizes), wave_keys=None)
    assert [what for what, _ in alone.log if what != "sending"] == ["append", "stored"] * 3
    # Small states come inline (no parts to see): one wave at a time, as ever.
    small = Waves(keys(10, KIB))
    small.run(list(small.sizes), wave_keys=None)
    assert ("sending", []) not in small.log


def test_a_wave_that_fails_with_the_next_already_appended_leaves_only_later_keys() -> None:
    # k2's origin never sends it; the wave after k2's was appended while k2's was being
    # sent: its keys are moving (their states came), only the waves never appended stay.
    waves = Waves(keys(9, 800 * KIB), lost=frozenset({"k2"}))
    settled, appended, last = waves.run(list(waves.sizes), wave_keys=None)
    assert [w.keys for w in appended] == [["k0"], ["k1", "k2"], ["k3", "k4"]]
    assert settled.left == ["k5", "k6", "k7", "k8"]
    assert settled.error.startswith("no state yet for 1 key (k2)")
    assert "4 keys of later waves did not move" in settled.error
    assert set(settled.stoppage_ms) == {"k0", "k1", "k3", "k4"}
    assert last == {1: 3002}  # the later wave's states are awaited to their commits too


def test_a_key_group_with_no_key_holding_state_appends_no_wave() -> None:
    waves = Waves({})
    settled, appended, last = waves.run([], wave_keys=None, sizes={})
    assert appended == [] and waves.log == [] and last == {}
    assert settled.error is None and settled.left == []


def test_copied_keys_go_first_and_the_sizing_starts_again_at_whole_states() -> None:
    # Three precopied keys send a few bytes each; the three not copied their whole MiB.
    sizes = {**keys(3, 100, "c"), **keys(3, MIB, "w")}
    listed = ["w0", "c0", "c1", "w1", "c2", "w2"]
    waves = Waves(sizes)
    _, appended, _ = waves.run(listed, wave_keys=None, copy="cp1",
                               copied=frozenset({"c0", "c1", "c2"}))  # fmt: skip
    assert [w.keys for w in appended] == [["c0"], ["c1", "c2"], ["w0"], ["w1", "w2"]]
    assert {m.copy for m in waves.moves} == {"cp1"}


def test_a_wave_whose_state_does_not_come_leaves_the_later_keys_where_they_are() -> None:
    sizes = keys(10, KIB)
    waves = Waves(sizes, lost=frozenset({"k2"}))
    settled, appended, _ = waves.run(list(sizes), wave_keys=None)
    assert [w.keys for w in appended] == [["k0"], ["k1", "k2", "k3", "k4"]]
    assert settled.left == ["k5", "k6", "k7", "k8", "k9"]
    assert "k2" in settled.error and "5 keys of later waves did not move" in settled.error
    assert set(settled.stoppage_ms) == {"k0", "k1", "k3", "k4"}


def test_listed_sizes_make_the_first_wave_as_many_keys_as_fit() -> None:
    # A key group of ten 1 KiB keys (sizes from the state stores' listing): one wave, not
    # the three (1, 4, 5) that learn the sizes as the states come.
    sizes = keys(10, KIB)
    _, appended, _ = Waves(sizes).run(list(sizes), wave_keys=None, sizes=sizes)
    assert [w.keys for w in appended] == [list(sizes)]
    # Many small keys: at most FIRST_WAVE_KEYS first, then fourfold within WAVE_KEYS.
    sizes = keys(100, KIB)
    _, appended, _ = Waves(sizes).run(list(sizes), wave_keys=None, sizes=sizes)
    assert [len(w.keys) for w in appended] == [FIRST_WAVE_KEYS, WAVE_KEYS, 20] == [16, 64, 20]
    assert [k for w in appended for k in w.keys] == list(sizes)  # in the order listed


def test_listed_sizes_bound_each_wave_s_bytes_from_the_first() -> None:
    # FIRST_WAVE_BYTES, then four times as much each wave within WAVE_BYTES; a key larger
    # than a wave's bytes still moves, alone.
    assert FIRST_WAVE_BYTES == 64 * KIB
    sizes = {"a": 30 * KIB, "b": 30 * KIB, "c": 30 * KIB, "d": MIB, **keys(8, MIB, "m")}
    _, appended, _ = Waves(sizes).run(list(sizes), wave_keys=None, sizes=sizes)
    assert [w.keys for w in appended] == [
        ["a", "b"],  # 60 KiB of 64
        ["c"],  # 256 KiB: c and d would be 1,054
        ["d"],  # 1 MiB
        ["m0", "m1"],  # 2 MiB from here
        ["m2", "m3"],
        ["m4", "m5"],
        ["m6", "m7"],
    ]


def test_without_every_key_s_size_the_first_wave_is_one_key() -> None:
    sizes = keys(10, KIB)
    partly = dict(list(sizes.items())[:9])  # k9 gained state after the listing
    _, appended, _ = Waves(sizes).run(list(sizes), wave_keys=None, sizes=partly)
    assert [len(w.keys) for w in appended] == [1, 4, 5]
    # Precopied keys send what changed since their copies, not what the listing says.
    _, appended, _ = Waves(sizes).run(list(sizes), wave_keys=None, sizes=sizes, copy="cp1",
                                      copied=frozenset({"k0", "k1"}))  # fmt: skip
    assert [len(w.keys) for w in appended][:2] == [1, 1]


def test_fixed_waves_take_as_many_keys_each_whatever_the_sizes() -> None:
    sizes = keys(7, 4 * MIB)
    _, appended, _ = Waves(sizes).run(list(sizes), wave_keys=3)
    assert [len(w.keys) for w in appended] == [3, 3, 1]


def test_the_step_holds_about_its_bytes_at_the_largest_state_so_far() -> None:
    assert _next_step(64, WAVE_BYTES // 10, WAVE_BYTES, WAVE_KEYS) == 10
    assert _next_step(1, 3 * WAVE_BYTES, WAVE_BYTES, WAVE_KEYS) == 1  # never none
    assert _next_step(16, KIB, WAVE_BYTES, WAVE_KEYS) == WAVE_KEYS


def test_a_precopy_step_grows_past_the_wave_cap_as_its_bytes_allow() -> None:
    # As _precopy calls it: about PRECOPY_STEP_BYTES a step, no cap of keys but the
    # largest move's.
    step, sizes = 1, [1]
    for _ in range(6):
        step = _next_step(step, 100, PRECOPY_STEP_BYTES)
        sizes.append(step)
    assert sizes == [1, 4, 16, 64, 256, 1000, 1000]


class Copies(KeyMoves):
    """A precopy's requests and what it waited for, each request's copies stored with the
    ``sizes`` given; the origin is seen sending a request's copies (``sending``) or not
    (small states come inline, no parts)."""

    def __init__(
        self, sizes: dict[str, int], sending: bool = True, unknown: frozenset[str] = frozenset()
    ) -> None:
        self.sizes, self.sending, self.unknown = sizes, sending, unknown
        self.log: list[tuple[str, list[str]]] = []
        self.broker: Any = SimpleNamespace(run=lambda make, timeout=30, **_: 0)  # parts counted

    def _append_key_record(self, pipeline: str, source: str, payload: bytes, msg_id: str) -> int:
        request = parse(0, payload)
        assert isinstance(request, KeyCopy)
        self.log.append(("ask", list(request.keys)))
        return 1000 * len(self.log)

    def _await_sending(self, *args: Any, **kwargs: Any) -> bool:
        self.log.append(("sending", []))
        return self.sending

    def _await_states(
        self, pipeline: str, source: str, move: str, at: int, keys: list[str], deadline: float,
        empty: set[str] | None = None,
    ) -> tuple[dict[str, tuple[Any, int]], float | None]:  # fmt: skip
        self.log.append(("stored", keys))
        if empty is not None:  # (the keys ``unknown`` come as empty copies)
            empty.update(k for k in keys if k in self.unknown)
        return {k: (SimpleNamespace(seq=at), self.sizes[k]) for k in keys}, float(at)

    def run(self, moving: list[str]) -> Any:
        return self._precopy("p", "agg", "in", moving, 1, time.monotonic() + 60)


def test_a_key_its_origin_holds_no_state_of_is_not_said_precopied() -> None:
    # A typo's key was reported "precopied 1 of 1 key (119 bytes)" beside the warning that
    # its origin held no state of it: its empty copy counts neither as a copy nor in bytes.
    copies = Copies({"k0": 20 * KIB, "ghost": 119, "k1": 20 * KIB}, unknown=frozenset({"ghost"}))
    done = copies.run(["k0", "ghost", "k1"])
    assert done.keys == ["k0", "k1"] and done.state_bytes == 40 * KIB
    alone = Copies({"ghost": 119}, unknown=frozenset({"ghost"})).run(["ghost"])
    assert (alone.copy, alone.keys, alone.state_bytes) == (None, [], 0)


def test_a_precopy_asks_for_the_next_copies_once_the_origin_sends_these() -> None:
    # 0.8 MB copies: one key a step. From the second request on, the next goes in as soon
    # as the origin sends a request's parts (its batch runs): the batch after answers it.
    copies = Copies(keys(4, 800 * KIB))
    done = copies.run(list(copies.sizes))
    assert done.keys == ["k0", "k1", "k2", "k3"] and done.state_bytes == 4 * 800 * KIB
    assert copies.log == [
        ("ask", ["k0"]), ("stored", ["k0"]),
        ("ask", ["k1"]), ("sending", []), ("ask", ["k2"]), ("stored", ["k1"]),
        ("sending", []), ("ask", ["k3"]), ("stored", ["k2"]), ("stored", ["k3"]),
    ]  # fmt: skip
    # Never more than one request ahead of the one being answered.
    outstanding, most = 0, 0
    for what, _ in copies.log:
        outstanding += {"ask": 1, "stored": -1}.get(what, 0)
        most = max(most, outstanding)
    assert most == 2
    # Not seen sending (its copies were stored before a part was seen): one at a time.
    alone = Copies(keys(3, 800 * KIB), sending=False)
    alone.run(list(alone.sizes))
    assert [what for what, _ in alone.log if what != "sending"] == ["ask", "stored"] * 3


def test_a_precopy_request_waits_for_its_own_keys_copies_not_a_later_requests() -> None:
    # One precopy's requests share its id; with the next request in flight, its copies may
    # be stored first, and must not count for this one (they did: "precopied 2 keys").
    stored = [state_payload("c1", "agg", key, 1, {"v": "x"}) for key in ("k1", "k2", "k0")]
    broker = SimpleNamespace(
        run=lambda make, timeout=30, **_: [
            SimpleNamespace(seq=11 + i, data=d, stored_at=1.0, subject="fs.p.in.keys.agg-p0")
            for i, d in enumerate(stored)
        ]
    )
    owners = Ownership(1)  # every key is partition 0's, which the copies came from
    owners.request(KeyCopy(10, "c1", "agg", ("k0", "k1", "k2", "k3"), 1))
    moves: Any = SimpleNamespace(broker=broker, _ownership=lambda *args: owners)
    states, _ = KeyMoves._await_states(moves, "p", "in", "c1", 10, ["k0"], 0.0)
    assert list(states) == ["k0"]
    states, _ = KeyMoves._await_states(moves, "p", "in", "c1", 10, ["k0", "k3"], 0.0)
    assert list(states) == ["k0"]  # k3's copy is not there: not done


def test_a_forged_state_does_not_end_the_wait_for_a_keys_state() -> None:
    # Partition 2 sends a copy of k3, which partition 0 owns: the target skips it, and so
    # must the wait, or the command would report the key copied (or moved) while it is not.
    forged = SimpleNamespace(
        seq=11,
        stored_at=1.0,
        subject="fs.p.in.keys.agg-p2",
        data=state_payload("c1", "agg", "k3", 1, {"v": "x"}, copy=True),
    )
    real = SimpleNamespace(
        seq=12,
        stored_at=1.0,
        subject="fs.p.in.keys.agg-p0",
        data=state_payload("c1", "agg", "k3", 1, {"v": "y"}, copy=True),
    )
    stored = [forged]
    broker = SimpleNamespace(run=lambda make, timeout=30, **_: list(stored))
    owners = Ownership(1)
    owners.request(KeyCopy(10, "c1", "agg", ("k3",), 1))
    moves: Any = SimpleNamespace(broker=broker, _ownership=lambda *args: owners)
    states, _ = KeyMoves._await_states(moves, "p", "in", "c1", 10, ["k3"], 0.0)
    assert states == {}
    stored.append(real)
    states, _ = KeyMoves._await_states(moves, "p", "in", "c1", 10, ["k3"], 0.0)
    assert list(states) == ["k3"] and states["k3"][0] is real


def test_a_moved_key_whose_origin_held_no_state_is_told_apart() -> None:
    # A walk-through's finding: `--keys p99` (never seen) was reported moved as any other.
    def sent(seq: int, key: str, state: dict[str, str], **more: Any) -> Any:
        return SimpleNamespace(seq=seq, stored_at=1.0, subject="fs.p.in.keys.agg-p0",
                               data=state_payload("m1", "agg", key, 1, state, **more))  # fmt: skip

    stored = [sent(11, "k1", {"v": "x"}), sent(12, "ghost", {}),
              sent(13, "k2", {}, base="c1", keep=["v"])]  # fmt: skip
    owners = Ownership(1)
    owners.apply(KeyMove(10, "m1", "agg", ("k1", "ghost", "k2"), 1))
    moves: Any = SimpleNamespace(
        broker=SimpleNamespace(run=lambda make, timeout=30, **_: list(stored)),
        _ownership=lambda *args: owners,
    )
    empty: set[str] = set()
    states, _ = KeyMoves._await_states(moves, "p", "in", "m1", 10, ["k1", "ghost", "k2"], 0.0,
                                       empty)  # fmt: skip
    assert sorted(states) == ["ghost", "k1", "k2"]
    assert empty == {"ghost"}  # (k2: nothing changed since its copy, which it keeps)


def test_a_scale_back_after_waves_to_an_added_partition_rescales_first() -> None:
    # A scale-out from 2 to 3 whose waves moved a key to partition 2, then failed before its
    # rescale: the count is still 2, but scaling back to 2 must rescale before partition 2
    # is retired, or that key's state and events would go with it.
    owners = Ownership(2)
    assert _rescaled_to(owners, 2) and not _rescaled_to(owners, 3)
    owners.apply(KeyMove(10, "w1", "agg", ("s1",), 2))
    assert not _rescaled_to(owners, 2) and not _rescaled_to(owners, 3)
    owners.apply(KeyMove(20, "r1", "agg", (), -1, count=2))  # a rescale clears the moves
    assert _rescaled_to(owners, 2)
    owners.apply(KeyMove(30, "g1", "agg", (), 2, group=(1, 4)))  # a key group there too
    assert not _rescaled_to(owners, 2)
    owners.apply(KeyMove(40, "r2", "agg", (), -1, count=3))
    assert _rescaled_to(owners, 3) and not _rescaled_to(owners, 2)


def test_a_listed_move_replays_the_moves_once_not_at_every_try() -> None:
    """Each try replayed every move stored so far between its look and its append: on a
    busy input with a long history of moves some event always came in between, and a scale
    or key group gave up after its tries."""
    from fogshift.orchestrator.scaling import _rescale

    class Busy(KeyMoves):
        def __init__(self) -> None:
            self.replays = 0
            self.appends = 0
            self.broker = SimpleNamespace(run=self.run)

        def _owners(
            self, pipeline: str, source: str, element_id: str, count: int, without: Any = None
        ) -> Ownership:
            self.replays += 1
            return Ownership(count)

        def run(self, make: Any, timeout: float = 30, **_: Any) -> Any:
            if make.func.__name__ == "_look":  # the input grew since the last look: one more
                return {"in": 10 + self.appends}, [], []
            self.appends += 1
            return None if self.appends < 5 else 99  # the first four appends came too late

    first = SimpleNamespace(first_count=2, since_of=lambda name: 0)
    parts: Any = [SimpleNamespace(id=f"agg-p{i}", key_by="k", partition=first, inputs=("in",))
                  for i in (0, 1)]  # fmt: skip
    busy = Busy()
    move, at, _ = busy._append_listed(  # a rescale to 3 partitions
        "p", "agg", parts, lambda owners, held, m: _rescale("agg", 3, owners, held, m),
        "scale", Listing({"a", "b"}, {"in": 0}),
    )  # fmt: skip
    assert at == 99 and busy.appends == 5 and move.count == 3
    assert busy.replays == 1


def test_a_listed_move_whose_look_was_trimmed_lists_the_state_stores_again() -> None:
    """A key group that waited on its waves longer than the history's age: the records its
    look would read from the listing's place were trimmed, and a key only they held went
    unlisted (its state stranded on the origin, the key starting empty at the target)."""

    class Trimmed(KeyMoves):
        def __init__(self) -> None:
            self.looks: list[dict[str, int]] = []
            self.listings = 0
            self.broker = SimpleNamespace(run=self.run)

        def _owners(
            self, pipeline: str, source: str, element_id: str, count: int, without: Any = None
        ) -> Ownership:
            return Ownership(count)

        def _listed_keys(self, pipeline: str, parts: list[Any]) -> Listing:
            self.listings += 1  # as of commits past the trim: "lost" is in a state store
            return Listing({"a", "lost"}, {"in": 500})

        def run(self, make: Any, timeout: float = 30, **_: Any) -> Any:
            if make.func.__name__ == "_look":
                self.looks.append(dict(make.keywords["since"]))
                return {"in": 600}, [], ["in"] if len(self.looks) == 1 else []
            return 601

    first = SimpleNamespace(first_count=2, since_of=lambda name: 0)
    parts: Any = [SimpleNamespace(id=f"agg-p{i}", key_by="k", partition=first, inputs=("in",))
                  for i in (0, 1)]  # fmt: skip
    trimmed = Trimmed()
    move, at, _ = trimmed._append_listed(
        "p", "agg", parts, lambda owners, held, m: KeyMove(0, m, "agg", tuple(sorted(held)), 1),
        "move key group 1/2", Listing({"a"}, {"in": 10}),
    )  # fmt: skip
    assert trimmed.listings == 1 and trimmed.looks == [{"in": 10}, {"in": 500}]
    assert at == 601 and move.keys == ("a", "lost")


def test_a_broker_away_for_a_moment_ends_no_wait_for_states_before_its_deadline() -> None:
    # The move is stored; one failed look (a broker restarting) raised out of the command
    # with a 503 that said nothing of the waves stored, while the states came a moment later.
    from fogshift.broker.exceptions import BrokerUnavailable

    real = SimpleNamespace(seq=12, stored_at=1.0, subject="fs.p.in.keys.agg-p0",
                           data=state_payload("m1", "agg", "k3", 1, {"v": "y"}))  # fmt: skip
    answers: list[Any] = [BrokerUnavailable("the broker did not answer"), [real]]

    def run(make: Any, timeout: float = 30, **_: Any) -> Any:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    owners = Ownership(1)
    owners.apply(KeyMove(10, "m1", "agg", ("k3",), 1))
    moves: Any = SimpleNamespace(broker=SimpleNamespace(run=run), _ownership=lambda *a: owners)
    states, _ = KeyMoves._await_states(moves, "p", "in", "m1", 10, ["k3"], time.monotonic() + 30)
    assert list(states) == ["k3"]
    answers[:] = [BrokerUnavailable("the broker did not answer")]  # past the deadline: pending
    assert KeyMoves._await_states(moves, "p", "in", "m1", 10, ["k3"], 0.0) == ({}, None)
    # Nor one failed read of who sends what, once a state came (it raised the same 503).
    looks: list[Any] = [BrokerUnavailable("the broker did not answer"), owners]

    def ownership(*args: Any) -> Ownership:
        answer = looks.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    answers[:] = [[real]]
    moves = SimpleNamespace(broker=SimpleNamespace(run=run), _ownership=ownership)
    states, _ = KeyMoves._await_states(moves, "p", "in", "m1", 10, ["k3"], time.monotonic() + 30)
    assert list(states) == ["k3"] and looks == []


def test_a_broker_away_for_a_moment_while_copies_are_awaited_raises_nothing() -> None:
    # The waves are stored; a failed count of the target's parts (a broker restarting)
    # raised out of the command with a 503 that said nothing of them.
    from fogshift.broker.exceptions import BrokerUnavailable

    answers: list[Any] = [BrokerUnavailable("the broker did not answer"), 3]

    def run(make: Any, timeout: float = 30, **_: Any) -> Any:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    moves: Any = SimpleNamespace(broker=SimpleNamespace(run=run))
    moves._parts_count = partial(KeyMoves._parts_count, moves)
    moves._await_states = lambda *args: ({}, None)
    parts = ("fs_p_in", "fs.p.in.parts.agg-p1")
    assert KeyMoves._parts_count(moves, parts) is None  # away: unknown, not raised
    assert KeyMoves._parts_count(moves, parts) == 3
    answers[:] = [BrokerUnavailable("the broker did not answer"), 3]
    sending = KeyMoves._await_sending(moves, "p", "in", "c1", 10, ["k0"], parts, 2,
                                      time.monotonic() + 30)  # fmt: skip
    assert sending is True


def test_a_key_move_queued_behind_a_long_one_is_refused_after_its_wait() -> None:
    from fogshift.exceptions import Conflict
    from fogshift.orchestrator.locks import element_lock

    with (
        element_lock("p", "agg", "cannot move keys of p/agg"),
        pytest.raises(Conflict, match="a key move or scale of p/agg has run for"),
        element_lock("p", "agg", "cannot move keys of p/agg", wait_s=0.1),
    ):
        pass
    with element_lock("p", "agg", "cannot move keys of p/agg", wait_s=0.1):
        pass  # (released by the first)


@pytest.mark.parametrize(
    ("keys", "received"),
    [
        ([], "(none)"),
        (["s1", " s2", "s1"], "listed twice: 's1'"),
        ([f"k{n}" for n in range(MAX_KEYS + 1)], f"{MAX_KEYS + 1} keys"),
        (["ok", "é" * (MAX_KEY_CHARS + 1)], repr("é" * (MAX_KEY_CHARS + 1))),
        # (No PE holds it, and routing it raised: a 500 "bug in the service".)
        (["ok", "s\ud8001"], repr("s\ud8001")),
    ],
)
def test_a_refused_key_list_says_what_is_wrong_with_it(keys: list[str], received: str) -> None:
    """A doubled key or too many were shown as the list's first five keys."""
    from fogshift.exceptions import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        _check_keys("keys of p/agg", keys)
    assert refused.value.received == received
    assert refused.value.hint is not None


def test_any_key_a_pe_can_hold_may_be_moved_by_name() -> None:
    # An empty CSV cell, or one with a tab or a NUL, is a key a PE holds (its state listed
    # and read by key, moved by a scale); by name it was refused as "not printable".
    _check_keys("keys of p/agg", ["", "a\tb", "s\x001", "é" * MAX_KEY_CHARS])


NODES = ("cloud", "fog-a", "fog-b")


def test_partitions_brought_together_say_a_key_move_there_must_name_one(
    tmp_path: Any,
) -> None:
    # A migration or a scale's `--on` putting two partitions on one node was accepted
    # silently; a later `migrate --keys K --to NODE` was then refused as ambiguous.
    from fogshift.contracts import PipelineState
    from fogshift.orchestrator.registry import PipelineRecord
    from fogshift.orchestrator.scaling import shared_node_warnings
    from fogshift.spec import parse_spec

    spec = parse_spec({
        "pipeline": "p",
        "elements": [
            {"id": "source", "kind": "csv-source", "node": "cloud", "options": {"path": "i"}},
            {"id": "agg", "kind": "window-aggregate", "partitions": ["fog-a", "fog-b", "fog-b"],
             "key_by": "sensor", "inputs": ["source"], "options": {"field": "value", "window": 3}},
        ],
    }, tmp_path)  # fmt: skip
    apart = {"source": "cloud", "agg-p0": "fog-a", "agg-p1": "fog-b", "agg-p2": "cloud"}
    record = PipelineRecord(spec, PipelineState.RUNNING, apart)
    assert shared_node_warnings(record, "agg") == []
    assert shared_node_warnings(record, "source") == []  # (not partitioned)
    together = PipelineRecord(spec, PipelineState.RUNNING, {**apart, "agg-p2": "fog-b"})
    (said,) = shared_node_warnings(together, "agg")
    assert "fog-b runs 2 partitions of 'agg' now (agg-p1, agg-p2)" in said
    assert "`--to agg-p1`" in said
    # A migration's: its target only, suggesting the partition it moved.
    assert shared_node_warnings(together, "agg", "fog-a") == []
    (said,) = shared_node_warnings(together, "agg", "fog-b", "agg-p2")
    assert "`--to agg-p2`" in said
    # ... the very refusal it announces:
    from fogshift.exceptions import InvalidInput

    parts: Any = [SimpleNamespace(id=f"agg-p{i}") for i in range(3)]
    with pytest.raises(InvalidInput, match="2 partitions of 'agg' run there"):
        _target_partition("p", "agg", parts, together.placement, "fog-b", NODES)


def test_a_key_move_s_target_is_a_node_with_one_partition_or_a_partition_s_id() -> None:
    """With two partitions on one node, ``--to NODE`` meant the first of them, silently."""
    from fogshift.exceptions import InvalidInput

    parts: Any = [SimpleNamespace(id=f"agg-p{i}") for i in range(3)]
    placement = {"agg-p0": "fog-a", "agg-p1": "fog-b", "agg-p2": "fog-b"}
    to, node = _target_partition("p", "agg", parts, placement, "fog-a", NODES)
    assert (to.id, node) == ("agg-p0", "fog-a")
    to, node = _target_partition("p", "agg", parts, placement, "agg-p2", NODES)
    assert (to.id, node) == ("agg-p2", "fog-b")
    with pytest.raises(InvalidInput, match="2 partitions of 'agg' run there") as refused:
        _target_partition("p", "agg", parts, placement, "fog-b", NODES)
    assert refused.value.expected == "one partition's id: agg-p1 or agg-p2"
    assert refused.value.hint is not None and "--to agg-p1" in refused.value.hint
    with pytest.raises(InvalidInput, match="no partition of 'agg' runs there"):
        _target_partition("p", "agg", parts, placement, "cloud", NODES)
    with pytest.raises(InvalidInput, match="no partition of 'agg' runs there"):
        _target_partition("p", "agg", parts, {"agg-p0": "fog-a"}, "agg-p1", NODES)  # (nowhere)
    # A partition the element does not have: its hint told to move a partition to a node
    # named "agg-p5".
    with pytest.raises(InvalidInput, match="'agg' has no partition 'agg-p5'") as refused:
        _target_partition("p", "agg", parts, placement, "agg-p5", NODES)
    assert refused.value.hint == (
        "name one of agg-p0, agg-p1, agg-p2, or give it more partitions first "
        "(`fogshift scale p agg --partitions N`)"
    )
    # A node that does not exist: it said "no partition of 'agg' runs there".
    with pytest.raises(UnknownNode, match="no node or partition of 'agg' has that name") as no:
        _target_partition("p", "agg", parts, placement, "nowhere", NODES)
    assert (
        no.value.expected == "a node (cloud, fog-a, fog-b) or a partition's id (agg-p0, "
        "agg-p1, agg-p2)"
    )
    assert no.value.hint is not None and "fogshift nodes" in no.value.hint


def test_a_broker_away_after_the_first_wave_says_which_keys_move_and_which_did_not() -> None:
    # The bare "broker away" came back (a 503) though the waves stored before it move:
    # a key move or `scale --waves` said nothing of what it had done.
    from fogshift.broker.exceptions import BrokerUnavailable

    class Away(Waves):
        def _append_key_record(self, pipeline: str, source: str, payload: bytes,
                               msg_id: str) -> int:  # fmt: skip
            if len(self.moves) == 2:
                raise BrokerUnavailable("broker away for a moment")
            return super()._append_key_record(pipeline, source, payload, msg_id)

    sizes = keys(30, KIB)
    waves = Away(sizes)
    settled, appended, _ = waves.run(list(sizes), wave_keys=None)
    assert [len(w.keys) for w in appended] == [1, 4]
    assert settled.left == list(sizes)[5:]
    assert (settled.error or "").startswith(
        "broker away for a moment, after 2 waves of 5 keys stored: those move as stored"
    ), settled.error
    assert "25 keys of later waves did not move (the same command again" in settled.error
    first = Away(sizes)
    first.moves = [None, None]  # type: ignore[list-item]  # (the first append fails)
    with pytest.raises(BrokerUnavailable):  # nothing stored: refused as it is
        first.run(list(sizes), wave_keys=None)
