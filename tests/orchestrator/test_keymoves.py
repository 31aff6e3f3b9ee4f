"""How a key move's waves and a precopy's steps grow (pure logic; the moves themselves run
on real agents in ``tests/integration/test_partitioned.py``)."""

from __future__ import annotations

from fogshift.orchestrator.keymoves import WAVE_BYTES, WAVE_KEYS, _next_step


def steps(largest: int, count: int, most_bytes: int = WAVE_BYTES, most_keys: int = WAVE_KEYS):
    """The first ``count`` step sizes at states of ``largest`` bytes."""
    sizes, step = [1], 1
    while len(sizes) < count:
        step = _next_step(step, largest, most_bytes, most_keys)
        sizes.append(step)
    return sizes


def test_waves_grow_fourfold_up_to_the_key_cap_at_small_states() -> None:
    assert steps(1024, 6) == [1, 4, 16, 64, 64, 64]


def test_waves_hold_about_their_bytes_at_large_states() -> None:
    assert steps(1024 * 1024, 4) == [1, 2, 2, 2]
    assert steps(WAVE_BYTES // 10, 4) == [1, 4, 10, 10]


def test_a_state_larger_than_a_wave_still_moves_one_key_at_a_time() -> None:
    assert steps(3 * WAVE_BYTES, 3) == [1, 1, 1]


def test_a_precopy_step_is_not_capped_by_keys_only_by_bytes() -> None:
    assert steps(100, 7, most_bytes=1024 * 1024, most_keys=1000) == [1, 4, 16, 64, 256, 1000, 1000]
