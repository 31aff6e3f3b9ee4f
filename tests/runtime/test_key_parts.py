"""The large key parts a worker keeps between batches (``runtime.key_parts.PartCache``): how
much, which first out, and nothing in a worker that runs one task."""

from __future__ import annotations

import pytest

from fogshift.runtime.key_parts import KeptPart, PartCache, state_digest

SCOPE = ("p", "pe", "run1")


def part(size: int, value: str | None = None) -> dict[str, KeptPart]:
    """One part of ``size`` characters (with ``value``, its decoded string kept too)."""
    text = "x" * size
    kept = KeptPart(text, state_digest(text))
    return {"f": kept if value is None else KeptPart(text, kept.digest, value)}


@pytest.fixture(autouse=True)
def reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")


def test_the_least_recently_used_keys_go_first_beyond_the_limit() -> None:
    cache = PartCache(limit=300)
    for key in ("a", "b", "c"):
        cache.put(SCOPE, key, part(100))
    assert cache.size == 300
    assert cache.get(SCOPE, "a") is not None  # used: "b" is now the oldest
    cache.put(SCOPE, "d", part(100))
    assert cache.get(SCOPE, "b") is None
    assert [k for k in "acd" if cache.get(SCOPE, k) is not None] == ["a", "c", "d"]
    assert cache.size == 300
    # Kept again under the same key: replaced, counted once.
    cache.put(SCOPE, "a", part(50))
    assert cache.size == 250 and cache.get(SCOPE, "a")["f"].text == "x" * 50  # type: ignore[index]
    # Nothing to keep: dropped.
    cache.put(SCOPE, "a", {})
    assert cache.get(SCOPE, "a") is None and cache.size == 200


def test_a_key_larger_than_the_limit_and_a_decoded_text_count() -> None:
    cache = PartCache(limit=300)
    cache.put(SCOPE, "big", part(301))
    assert cache.get(SCOPE, "big") is None and cache.size == 0
    # A decoded string costs its length too.
    cache.put(SCOPE, "both", part(100, value="y" * 98))
    assert cache.size == 198
    # Another run's (a restart) is another key.
    assert cache.get(("p", "pe", "run2"), "both") is None


def test_a_worker_that_runs_one_task_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_REUSE_WORKER")
    cache = PartCache(limit=300)
    cache.put(SCOPE, "a", part(10))
    assert cache.get(SCOPE, "a") is None and cache.size == 0
