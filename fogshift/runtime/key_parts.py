"""A keyed PE's state texts per key, with the large ones kept in the worker between batches.

A keyed PE stores each key's state as one JSON text per part (declared field) in Spark's
state store, and a batch used to read, decode, encode and compare every part of every key
it touches: at 1 MiB a key, ~19 ms a key and batch (``scripts/keyed_state_cost.py``: 10
keys took a batch from ~270 to ~467 ms), whether the part changed or not. Unkeyed PEs had
been spared that since issue #13 (their kept instance and its digests,
:mod:`fogshift.runtime.instances`); one instance serves every key of a keyed PE, so here the
texts themselves are kept.

**What is stored.** Beside the parts, a key's ``part_marks`` ValueState holds the digest of
each part whose text is at least :data:`LARGE_PART_BYTES` long, and of no other part. That
is the invariant every write keeps (:meth:`KeyParts.store`, :meth:`KeyParts.install`,
:meth:`KeyParts.clear` are the only writers of a keyed PE's parts), so the digests are those
of the stored texts in every state-store version Spark commits: parts and digests are
written in one batch, committed or not together.

**What is kept.** Each worker process keeps (:class:`PartCache`, at most
:data:`KEY_CACHE_BYTES`, least recently used first out) the large parts of the keys it saw,
by query run and key: text, digest and, if it is immutable (a ``str``, a number), the
decoded value. A batch reads a key's digests (a few bytes) and takes a kept part only if its
digest is the stored one; any other part it reads from the store as before. So a retried
batch (the store back at an older version), a batch another worker ran meanwhile, or a
restart (a new run) never uses a stale text. A kept immutable value is given to
``restore()`` as is, and a ``snapshot()`` that returns that very object again takes its
text without encoding it.

Digests are only ever trusted to tell a kept text from the stored one, never to stand for
a text read from the store: a batch computes the digest of each large part it reads (a key
a fogshift without digests stored gets them so, the first time a batch reads it).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fogshift.exceptions import InvariantViolation
from fogshift.runtime.instances import workers_reused

#: A part's text at least this long is a large part: its digest is stored, and a worker
#: keeps it. Smaller parts are read from the store every batch, as before: keeping them
#: would save little beside the state call that reads the digests.
LARGE_PART_BYTES = 16 * 1024
#: The most a worker process keeps of large parts (texts and decoded strings), all keyed
#: PEs together.
KEY_CACHE_BYTES = 128 * 1024 * 1024
#: State values whose encoding can be reused while they are the same object.
IMMUTABLE_STATE = (str, int, float, bool, type(None))
#: A kept part whose decoded value is not kept (a mutable one: restore() may change it).
_NOT_KEPT = object()


def state_digest(text: str) -> str:
    """A short digest of a state text: equal digests stand for equal texts."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class KeptPart:
    """A large part as stored: its text, its digest and, if immutable, its decoded value
    (:data:`_NOT_KEPT` if not)."""

    text: str
    digest: str
    value: Any = _NOT_KEPT

    @property
    def size(self) -> int:
        """What keeping it costs, roughly (characters)."""
        return len(self.text) + (len(self.value) if isinstance(self.value, str) else 0)


#: Which query a kept key is of: pipeline, PE and run (a restart is a new run).
Scope = tuple[str, str, str]


class PartCache:
    """The large parts a worker process keeps, by query and key (thread-safe).

    Args:
        limit: The most it keeps (:attr:`KeptPart.size`, all keys together); a key larger
            than that alone is not kept.
    """

    def __init__(self, limit: int = KEY_CACHE_BYTES) -> None:
        self.limit = limit
        self._kept: OrderedDict[tuple[Scope, str], dict[str, KeptPart]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """What it keeps now."""
        return self._size

    def get(self, scope: Scope, key: str) -> dict[str, KeptPart] | None:
        """The parts kept of ``key`` (``None``: none)."""
        with self._lock:
            parts = self._kept.get((scope, key))
            if parts is not None:
                self._kept.move_to_end((scope, key))
            return dict(parts) if parts is not None else None

    def put(self, scope: Scope, key: str, parts: Mapping[str, KeptPart]) -> None:
        """Keep ``parts`` as ``key``'s (none: keep nothing of it), dropping the least
        recently used keys beyond :attr:`limit`."""
        size = sum(p.size for p in parts.values())
        with self._lock:
            old = self._kept.pop((scope, key), None)
            if old is not None:
                self._size -= sum(p.size for p in old.values())
            if not parts or size > self.limit or not workers_reused():
                return  # (a worker that runs one task keeps nothing, as the registry)
            self._kept[(scope, key)] = dict(parts)
            self._size += size
            while self._size > self.limit:
                _, dropped = self._kept.popitem(last=False)
                self._size -= sum(p.size for p in dropped.values())

    def clear(self) -> None:
        """Keep nothing."""
        with self._lock:
            self._kept.clear()
            self._size = 0


#: This process's cache (see :func:`cache`).
CACHE = PartCache()


def cache() -> PartCache:
    """This process's cache (through a function: code Spark pickles by value reaches it by
    reference, as :func:`~fogshift.runtime.instances.registry`)."""
    return CACHE


class KeyParts:
    """One key's parts in one batch of a keyed PE: read, decoded, encoded and written
    through this, which keeps the stored digests (``part_marks``) and the worker's kept
    parts in step.

    Args:
        values: The PE's part ValueStates (name -> state), on the current key.
        marks: The ``part_marks`` ValueState, on the current key.
        scope: The query (pipeline, PE, run).
        key: The key's text.
        where: Who this is, for errors (the PE and pipeline).
    """

    def __init__(
        self, values: Mapping[str, Any], marks: Any, scope: Scope, key: str, where: str
    ) -> None:
        self._values = values
        self._marks = marks
        self._scope = scope
        self._key = key
        self._where = where
        #: The stored digests as this batch knows them (``None``: not known yet).
        self._known: dict[str, str] | None = None
        #: The large parts of the stored state as this batch knows it.
        self._parts: dict[str, KeptPart] = {}

    def read(self) -> dict[str, str]:
        """The key's stored texts, by part: a kept part whose digest is the stored one is
        not read from the store.

        A large part read from the store has its digest computed, not taken from the stored
        ones (~2 ms a MiB, once per key and worker), and stored digests that are not those
        of the large parts as read are written anew: a key a fogshift without digests
        stored, a field the PE no longer declares, or digests an older fogshift left behind
        after changing a part (a downgrade) are set right here, never trusted.
        """
        self._parts = {}
        kept = cache().get(self._scope, self._key)
        # (Kept parts: the digests are read first. None: they are read only if a part is
        # large, since by the invariant there are none otherwise.)
        marks = self._read_marks() if kept else None
        texts: dict[str, str] = {}
        for name, state in self._values.items():
            part = kept.get(name) if kept else None
            if part is not None and marks is not None and marks.get(name) == part.digest:
                texts[name] = part.text
                self._parts[name] = part
            elif (got := state.get()) is not None:
                texts[name] = got[0]
                if len(got[0]) >= LARGE_PART_BYTES:
                    self._parts[name] = KeptPart(got[0], state_digest(got[0]))
        if marks is None:
            marks = self._read_marks() if self._parts else {}
        self._write_marks(marks, {n: p.digest for n, p in self._parts.items()})
        self._keep()
        return texts

    def decoded(self, texts: Mapping[str, str]) -> dict[str, Any]:
        """Each part's value: a kept immutable value if its text is the kept one, else its
        text decoded."""
        values = {}
        for name, text in texts.items():
            part = self._parts.get(name)
            if part is not None and part.text is text and part.value is not _NOT_KEPT:
                values[name] = part.value
            else:
                values[name] = json.loads(text)
                if part is not None and part.text == text:
                    self._parts[name] = _with_value(part, values[name])
        return values

    def encoded(self) -> dict[str, tuple[Any, str]]:
        """Encodings to reuse for ``_texts``: part -> (its kept immutable value, its
        text)."""
        return {n: (p.value, p.text) for n, p in self._parts.items() if p.value is not _NOT_KEPT}

    def store(
        self,
        before: Mapping[str, str],
        fresh: Mapping[str, str],
        encoded: Mapping[str, tuple[Any, str]] | None = None,
    ) -> set[str]:
        """Write the parts whose text changed from ``before`` to ``fresh``, and their
        digests; return their names.

        Args:
            encoded: The encodings ``_texts`` made (part -> (immutable value, text)): the
                values of the new texts, kept with them.
        """
        if self._known is None:
            raise InvariantViolation(f"{self._where}: key {self._key!r} written before read")
        changed = {n: t for n, t in fresh.items() if before.get(n) is not t and before.get(n) != t}
        for name, text in changed.items():
            self._values[name].update((text,))
            self._parts.pop(name, None)
            if len(text) >= LARGE_PART_BYTES:
                value = encoded.get(name) if encoded is not None else None
                kept = KeptPart(text, state_digest(text))
                self._parts[name] = (
                    _with_value(kept, value[0]) if value is not None and value[1] is text else kept
                )
        self._write_marks(self._known, {n: p.digest for n, p in self._parts.items()})
        self._keep()
        return set(changed)

    def install(self, texts: Mapping[str, str]) -> None:
        """Write ``texts`` as the key's state (a moved key's arriving), over none: the
        parts here were cleared when the key last left, if it ever was here."""
        self._parts = {}
        for name, text in texts.items():
            self._values[name].update((text,))
            if len(text) >= LARGE_PART_BYTES:
                self._parts[name] = KeptPart(text, state_digest(text))
        # (Written whatever was stored: unknown, and a move in is rare.)
        self._write_marks(None, {n: p.digest for n, p in self._parts.items()})
        self._keep()

    def clear(self) -> None:
        """Clear the key's parts and digests (it moves out)."""
        for state in self._values.values():
            state.clear()
        self._parts = {}
        self._write_marks(None, {})
        cache().put(self._scope, self._key, {})

    def digest(self, name: str, text: str) -> str:
        """The digest of part ``name``'s ``text``: the known one if it is the stored text."""
        part = self._parts.get(name)
        return part.digest if part is not None and part.text is text else state_digest(text)

    def _read_marks(self) -> dict[str, str]:
        saved = self._marks.get()
        return dict(json.loads(saved[0])) if saved is not None else {}

    def _write_marks(self, stored: Mapping[str, str] | None, wanted: dict[str, str]) -> None:
        """Store ``wanted`` as the key's digests unless they are already (``stored``;
        ``None``: not known)."""
        if stored is not None and dict(stored) == wanted:
            self._known = wanted
            return
        if wanted:
            self._marks.update((json.dumps(wanted, sort_keys=True),))
        else:
            self._marks.clear()
        self._known = wanted

    def _keep(self) -> None:
        cache().put(self._scope, self._key, self._parts)


def _with_value(part: KeptPart, value: Any) -> KeptPart:
    """``part`` with its decoded ``value`` kept if it is immutable."""
    if not isinstance(value, IMMUTABLE_STATE):
        return part
    return KeptPart(part.text, part.digest, value)
