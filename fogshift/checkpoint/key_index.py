"""The keys a keyed PE holds state for, kept beside its live checkpoint batch by batch.

A key group's move and a rescale list the keys in every partition's state store as of a
committed batch, with each key's size (``agent.node.NodeRuntime.state_keys``). Spark's state
reader answers that with a batch job on the node, beside its running queries: 0.2 s on an
idle node, 1.5-3.5 s on a busy one, and the operation waits for it. The index answers it
from a few files instead:

* Each batch of a keyed PE's query notes, for every key whose stored state variables it
  wrote or cleared, each such variable's new length (``None``: cleared) — the processor
  sees every write (``runtime.engine``), and the query's writer stores the batch's notes as
  ``<batch>.json`` here when the batch commits its output (``broker.datasource``), before
  Spark writes the batch's commit. A batch run again writes the same notes.
* ``base-<batch>.json`` holds every key's variables' lengths as of that batch: from a
  fold of the notes once enough have piled up (:func:`compact`, at the
  agent's snapshot rounds), or from a state reader's listing (:func:`write_base`).
* The keys as of the committed batch ``C`` are the newest base at or below ``C`` with the
  notes of every batch after it up to ``C`` applied (:func:`read`). A missing note (a
  checkpoint copied by an older fogshift, or during a compaction) makes the index unusable
  until a state reader's listing writes a base: never a guess.
* A copy of the checkpoint (a migration's, a snapshot, a central one) takes the index as of
  its commit: the notes and bases of later batches are left out
  (``spark_dir.copy_checkpoint``), so a query resumed from the copy goes on noting from
  there and its listings need no state read either.

Notes of batches after ``C`` (not committed yet, or of a run that was cut off) are never
read: a batch's notes are written before its commit, by the run that commits it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

#: The index's folder in a PE's checkpoint.
FOLDER = "fogshift-keys"
#: How many notes :func:`compact` lets pile up before it folds them into a new base.
COMPACT_AFTER = 16
#: ... and how many bytes of notes, as a share of the newest base's: a base holds every key
#: (~40 bytes each), so with many keys a fold every :data:`COMPACT_AFTER` notes rewrote
#: megabytes for a few kilobytes of changes (100,000 keys of two variables: a 4.3 MB base,
#: 1.3 s of CPU a fold here, every 16 batches). A base is rewritten at most once per this
#: share of it in notes.
COMPACT_SHARE = 0.25
#: ... unless this many notes piled up (what a listing reads, and each copy carries).
COMPACT_MOST = 512

#: ``{key: {state variable: length of its stored text}}``.
KeyVars = dict[str, dict[str, int]]
#: One batch's notes: ``{key: {state variable: new length, or None if cleared}}``.
Changes = Mapping[str, Mapping[str, int | None]]

_BATCH = re.compile(r"(\d+)\.json")
_BASE = re.compile(r"base-(\d+)\.json")


def folder_of(checkpoint: Path) -> Path:
    """The index folder of the PE whose live checkpoint is ``checkpoint``."""
    return checkpoint / FOLDER


def write_batch(folder: Path, batch: int, changes: Changes) -> None:
    """Store one batch's notes (atomically: a reader sees them whole or not at all)."""
    _write(folder, f"{batch}.json", {"batch": batch, "changes": changes})


def write_base(folder: Path, batch: int, keys: Mapping[str, Mapping[str, int]]) -> None:
    """Store every key's variables as of ``batch`` (read from the state store itself)."""
    _write(folder, f"base-{batch}.json", {"batch": batch, "keys": keys})


def read(folder: Path, committed: int | None) -> KeyVars | None:
    """Every key's stored variables as of batch ``committed``; ``None`` when the index
    cannot tell (no base at or below it and not every note since the first batch, a note
    missing, or a file that cannot be read)."""
    if committed is None:
        return None
    return _read(folder, committed, *_listing(folder))


def _read(folder: Path, committed: int, batches: set[int], bases: set[int]) -> KeyVars | None:
    """:func:`read`, with the folder's listing (:func:`_listing`) already taken."""
    below = [b for b in bases if b <= committed]
    if below:
        start = max(below)
        keys = _load(folder / f"base-{start}.json", "keys")
        if keys is None:
            return None
        state: KeyVars = {k: dict(v) for k, v in keys.items()}
    else:
        start, state = -1, {}  # only if every batch since the first noted here
    for batch in range(start + 1, committed + 1):
        if batch not in batches:
            return None
        changes = _load(folder / f"{batch}.json", "changes")
        if changes is None:
            return None
        apply(state, changes)
    return state


def apply(state: KeyVars, changes: Changes) -> None:
    """Apply one batch's notes to ``state`` in place (a key with no variable left goes)."""
    for key, variables in changes.items():
        entry = state.setdefault(key, {})
        for name, size in variables.items():
            if size is None:
                entry.pop(name, None)
            else:
                entry[name] = int(size)
        if not entry:
            del state[key]


def compact(folder: Path, committed: int | None, min_notes: int | None = None) -> bool:
    """Fold the notes up to ``committed`` into a base there once enough piled up after
    the newest base (:func:`_worth_folding`), and remove what that base replaced (the base
    before it and the notes it folded stay until the next fold).

    Notes that no base can complete (a gap after a copy) are removed as well: they could
    be used only with a base at or below them, which only a state reader's listing of an
    older batch could give. Returns whether it folded or removed anything.
    """
    if committed is None or not folder.is_dir():
        return False
    batches, bases = _listing(folder)
    newest = max((b for b in bases if b <= committed), default=-1)
    pending = [b for b in batches if newest < b <= committed]
    if not pending:
        return False  # nothing new to fold
    usable = 0 in batches or newest >= 0
    if usable and not _worth_folding(folder, pending, newest, min_notes):
        # A base holds every key: rewritten at every round, a large one would be much of
        # what each snapshot and central pull of the PE carries.
        return False
    state = _read(folder, committed, batches, bases)
    if state is not None:
        write_base(folder, committed, state)
        # The base before this one and the notes after it stay until the next fold: a warm
        # copy (a migration's, a standby's) resumes before its last busy batch, which may be
        # the one folded here, and without them it would find nothing at or below its
        # commit (its listings then ran a state reader's job). With no base before (the
        # notes since the first batch), those notes stay.
        keep_from = newest if newest >= 0 else -1
    else:
        keep_from = committed + 1  # of no use: see above
    for batch in batches:
        if batch <= min(keep_from, committed):
            _remove(folder / f"{batch}.json")
    for base in bases:
        if base < keep_from or (base == committed and state is None):
            _remove(folder / f"base-{base}.json")
    return True


def _worth_folding(folder: Path, pending: list[int], base: int, min_notes: int | None) -> bool:
    """Whether the notes of batches ``pending`` are enough to fold into a new base: at
    least ``min_notes`` (default :data:`COMPACT_AFTER`) of them and, after base ``base``
    (``-1``: none), :data:`COMPACT_SHARE` of its size, or :data:`COMPACT_MOST` of them."""
    if len(pending) < (COMPACT_AFTER if min_notes is None else min_notes):
        return False
    if base < 0 or len(pending) >= COMPACT_MOST:
        return True
    try:
        threshold = COMPACT_SHARE * (folder / f"base-{base}.json").stat().st_size
        noted = 0
        for batch in pending:
            noted += (folder / f"{batch}.json").stat().st_size
            if noted >= threshold:
                return True
    except OSError:
        return True  # a file gone meanwhile: the fold finds out what is usable
    return False


def batch_of(name: str) -> int | None:
    """The batch a file of the index is of (a note or a base), ``None`` for any other name."""
    match = _BATCH.fullmatch(name) or _BASE.fullmatch(name)
    return int(match.group(1)) if match else None


def _listing(folder: Path) -> tuple[set[int], set[int]]:
    """The batches with notes and the batches with a base in ``folder``."""
    batches: set[int] = set()
    bases: set[int] = set()
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return batches, bases
    for name in names:
        if match := _BATCH.fullmatch(name):
            batches.add(int(match.group(1)))
        elif match := _BASE.fullmatch(name):
            bases.add(int(match.group(1)))
    return batches, bases


def _load(path: Path, field: str) -> dict | None:
    try:
        value = json.loads(path.read_text())[field]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _write(folder: Path, name: str, content: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(content, separators=(",", ":")))
    tmp.replace(folder / name)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
