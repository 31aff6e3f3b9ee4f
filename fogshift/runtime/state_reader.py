"""Reading a stateful PE's live state: the digital twin of each key, as of a committed batch.

A stateful processor keeps its snapshot in ``transformWithStateInPandas`` value states, one
per declared field (``f_<field>``) or one for a custom snapshot (``f___snapshot__``), under
the query's grouping key (see :mod:`fogshift.runtime.engine`). Spark's state data source
reader (``format("statestore")``) reads them from the PE's checkpoint as a batch query, while
the streaming query goes on writing newer versions: every field is read at the same
committed batch, so the entries are one consistent cut of the PE's state, never a batch half
applied. A read costs a Spark job (0.5 to 1 s), nothing of the running query.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fogshift.checkpoint.spark_dir import committed_batch, end_offset
from fogshift.runtime.engine import GROUP_COLUMN, KEY_PREFIX, OPAQUE_PART

#: The JVM ``window-aggregate``'s one state variable (``WindowAggregate.java``): its window.
JVM_WINDOW_VAR = "window"

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def read_state(
    spark: SparkSession,
    checkpoint: Path,
    parts: list[str] | None,
    keyed: bool,
    key: str | None = None,
    only: Collection[str] | None = None,
    at: int | None = None,
    added: Collection[str] = (),
) -> tuple[int | None, dict[str | None, Any]]:
    """Each key's snapshot as of the newest committed batch.

    Args:
        spark: A session (the node's).
        checkpoint: The PE's checkpoint folder.
        parts: The processor's declared state fields (``Processor.state_parts()``), or
            ``None`` for a processor whose own ``snapshot()`` is stored as one value.
        keyed: Whether the PE is keyed (``key_by``): keys are then its keys' texts;
            otherwise the one entry has key ``None``.
        key: Only this key (of a keyed PE).
        only: Only these keys (of a keyed PE): a page of a large state, whose other keys
            are never collected to the driver.
        at: The committed batch to read (``None``: the newest): the one ``only`` was
            listed at, so that the page is one cut.

    Returns:
        The batch read, and the snapshot of each key (fields decoded from their JSON).
    """
    from pyspark.sql import functions as F  # noqa: N812

    batch = committed_batch(checkpoint) if at is None else at
    if batch is None:
        return None, {}
    names = parts if parts is not None else [OPAQUE_PART]
    frame = _variables(
        spark, checkpoint, batch, [f"f_{n}" for n in names], F.col("value.json"), added
    )
    rows = [] if frame is None else _selected(frame, keyed, key, only).collect()
    values: dict[str, dict[str, Any]] = {}
    for group, name, text in rows:
        values.setdefault(group, {})[name.removeprefix("f_")] = json.loads(text)
    out: dict[str | None, Any] = {}
    for group, fields in values.items():
        key_text = group.removeprefix(KEY_PREFIX) if keyed else None
        out[key_text] = fields if parts is not None else fields[OPAQUE_PART]
    return batch, dict(sorted(out.items(), key=lambda kv: kv[0] or ""))


def read_waiting(
    spark: SparkSession, checkpoint: Path, batch: int | None, key: str | None = None
) -> dict[str, tuple[str, int]]:
    """The keys of a partition whose keys move (:mod:`fogshift.broker.keys`) that moved in
    and whose state has not come yet, as of committed batch ``batch`` (that of a
    :func:`read_state` just made: one cut): each with the move it waits for and how many
    of its events are held until then (the ``held`` value state and the ``held_events``
    list state of :mod:`fogshift.runtime.engine`).

    Args:
        batch: ``None``: no batch committed yet (nothing waits).
        key: Only this key.

    Returns:
        ``{key: (move, events held)}``, sorted by key.
    """
    from pyspark.sql import functions as F  # noqa: N812

    if batch is None:
        return {}
    group = F.col(f"key.{GROUP_COLUMN}").alias("k")
    held = _state_var(spark, checkpoint, batch, "held").select(group, F.col("value.json"))
    events = _state_var(spark, checkpoint, batch, "held_events").select(group)
    if key is not None:
        held, events = (f.where(F.col("k") == KEY_PREFIX + key) for f in (held, events))
    moves = {g: json.loads(text) for g, text in held.collect()}
    if not moves:
        return {}  # (no second job when nothing waits: the usual case)
    counts: dict[str, int] = dict(events.groupBy("k").count().collect())
    out: dict[str, tuple[str, int]] = {}
    for g, detail in moves.items():
        # (Events an older engine kept inline in the held value count too.)
        inline = len(detail.get("events", ()))
        out[str(g).removeprefix(KEY_PREFIX)] = (str(detail["move"]), counts.get(g, 0) + inline)
    return dict(sorted(out.items()))


def _selected(
    frame: DataFrame, keyed: bool, key: str | None, only: Collection[str] | None
) -> DataFrame:
    """``frame`` (grouping keys in column ``k``) with only key ``key``, or keys ``only``."""
    from pyspark.sql import functions as F  # noqa: N812

    if not keyed or (key is None and only is None):
        return frame
    wanted = [key] if key is not None else sorted(only or ())
    return frame.where(F.col("k").isin([KEY_PREFIX + k for k in wanted]))


def read_jvm_window(
    spark: SparkSession,
    checkpoint: Path,
    keyed: bool = False,
    key: str | None = None,
    only: Collection[str] | None = None,
    at: int | None = None,
) -> tuple[int | None, dict[str | None, Any]]:
    """The window of a ``window-aggregate`` with ``engine: jvm`` (each key's, keyed), as of
    the newest committed batch, in the Python engine's shape (``{None: {"values": [...]}}``,
    keyed ``{key: {"values": [...]}}``; nothing before a first batch with input, and no key
    whose events were all dead letters). Its one state variable holds the values as text,
    ints as digits and floats as Java writes them (with a point or an exponent).

    Args:
        keyed: Whether the PE is keyed (its grouping keys are :data:`KEY_PREFIX` + a key).
        key: Only this key (of a keyed PE).
        only: Only these keys (of a keyed PE), as :func:`read_state`'s.
        at: The committed batch to read (``None``: the newest), as :func:`read_state`'s.
    """
    from pyspark.sql import functions as F  # noqa: N812

    batch = committed_batch(checkpoint) if at is None else at
    if batch is None:
        return None, {}
    frame = _state_var(spark, checkpoint, batch, JVM_WINDOW_VAR).select(
        F.col("key.value").alias("k"), F.col("value.value").alias("v")
    )
    frame = _selected(frame, keyed, key, only)
    out: dict[str | None, Any] = {}
    for group, text in frame.collect():
        if text is None:
            continue
        values = [float(t) if "." in t or "E" in t else int(t) for t in text.split(",") if t]
        out[str(group).removeprefix(KEY_PREFIX) if keyed else None] = {"values": values}
    return batch, dict(sorted(out.items(), key=lambda kv: kv[0] or ""))


def read_jvm_key_variables(
    spark: SparkSession, checkpoint: Path
) -> tuple[int | None, dict[str, Any] | None, dict[str, dict[str, int]]]:
    """:func:`read_key_variables` of a keyed ``window-aggregate`` with ``engine: jvm``: each
    key with the length of its window's text (``{key: {"window": length}}``, as its key index
    notes say)."""
    from pyspark.sql import functions as F  # noqa: N812

    batch = committed_batch(checkpoint)
    if batch is None:
        return None, None, {}
    frame = _state_var(spark, checkpoint, batch, JVM_WINDOW_VAR).select(
        F.col("key.value"), F.coalesce(F.length("value.value"), F.lit(0))
    )
    variables: dict[str, dict[str, int]] = {}
    for group, size in frame.collect():
        if group is not None and str(group).startswith(KEY_PREFIX):
            variables[str(group).removeprefix(KEY_PREFIX)] = {JVM_WINDOW_VAR: int(size)}
    return batch, end_offset(checkpoint, batch), variables


def read_keys(
    spark: SparkSession,
    checkpoint: Path,
    parts: list[str] | None,
    movable: bool,
    added: Collection[str] = (),
) -> tuple[int | None, dict[str, Any] | None, dict[str, int]]:
    """The keys a keyed PE holds anything for (a state field, or events held for a key
    moving in), as of its newest committed batch, each with the size of what it holds
    but not its state.

    Returns:
        The batch read, its end offset (the input positions the keys are as of; ``None``
        with no batch yet), and the keys' texts, sorted, each with the length of its
        stored JSON texts (its state fields, about what its state weighs when it moves;
        a key moving in whose state has not come: its move's few bytes).
    """
    batch, end, variables = read_key_variables(spark, checkpoint, parts, movable, added)
    return batch, end, key_sizes(variables)


def key_sizes(variables: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Each key's size (its variables' lengths summed), sorted by key."""
    return {key: sum(v.values()) for key, v in sorted(variables.items())}


def read_key_variables(
    spark: SparkSession,
    checkpoint: Path,
    parts: list[str] | None,
    movable: bool,
    added: Collection[str] = (),
) -> tuple[int | None, dict[str, Any] | None, dict[str, dict[str, int]]]:
    """:func:`read_keys`, each key with the length of each variable it holds
    (``{key: {"f_<field>" or "held": length}}``, what ``checkpoint.key_index`` keeps)."""
    from pyspark.sql import functions as F  # noqa: N812

    batch = committed_batch(checkpoint)
    if batch is None:
        return None, None, {}
    names = [f"f_{n}" for n in (parts if parts is not None else [OPAQUE_PART])]
    if movable:
        names.append("held")
    # Gathered here, not by a Spark aggregation (a row per key and variable, a handful of
    # variables: its shuffle stage took a third of an idle read, 0.30 s against 0.20 s).
    lengths = F.coalesce(F.length("value.json"), F.lit(0))
    variables: dict[str, dict[str, int]] = {}
    frame = _variables(spark, checkpoint, batch, names, lengths, added)
    for group, name, size in [] if frame is None else frame.collect():
        if group is not None and group.startswith(KEY_PREFIX):
            variables.setdefault(group.removeprefix(KEY_PREFIX), {})[name] = int(size)
    return batch, end_offset(checkpoint, batch), variables


def _variables(
    spark: SparkSession,
    checkpoint: Path,
    batch: int,
    names: list[str],
    value: Column,
    added: Collection[str] = (),
) -> DataFrame | None:
    """Rows ``(k, v, value)`` of every state variable in ``names`` as of ``batch``: the
    grouping key, the variable's name and ``value`` of its stored row. One Spark job reads
    them all (a job per variable took ~0.15 s each, idle). The variable of a field
    ``added`` to the PE's class (``state(added=True)``) since that batch was written is
    left out if the batch's operator does not have it (asked for, the read failed: no
    twin shown, no key listed for a move); any other one missing fails the read, as
    ever. ``None`` if none of them is there."""
    from pyspark.sql import functions as F  # noqa: N812

    frames = []
    for name in names:
        try:
            frame = _state_var(spark, checkpoint, batch, name)
        except Exception as exc:
            if _NOT_DEFINED not in str(exc) or name.removeprefix("f_") not in added:
                raise
            continue
        frames.append(frame.select(
            F.col(f"key.{GROUP_COLUMN}").alias("k"), F.lit(name).alias("v"), value.alias("value")
        ))  # fmt: skip
    return functools.reduce(lambda a, b: a.union(b), frames) if frames else None


#: What Spark's state data source says of a state variable the operator does not have.
_NOT_DEFINED = "is not defined for the transformWithState operator"


def _state_var(spark: SparkSession, checkpoint: Path, batch: int, name: str) -> DataFrame:
    """State variable ``name`` of the PE's checkpoint as of ``batch`` (Spark's state data
    source reader; columns ``key`` and ``value``)."""
    return (
        spark.read.format("statestore")
        .option("batchId", batch)
        .option("stateVarName", name)
        .load(str(checkpoint))
    )
