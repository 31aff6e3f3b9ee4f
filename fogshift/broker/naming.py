"""Stream and subject names: one JetStream stream per PE output.

Each PE owns one stream ``FS_<pipeline>_<pe>`` (a ``_`` in the pipeline's name doubled)
with two subjects: ``fs.<pipeline>.<pe>.data`` for its output events and
``fs.<pipeline>.<pe>.dead`` for its dead letters (plus ``.fence`` for fence markers,
``.cut`` for the batch cuts of a PE with several inputs, ``.keys`` for the orchestrator's
key moves of partitioned PEs reading it, ``.keys.<partition>`` for the key states each
partition hands over and ``.state.<element>.<partition>`` for their large states' parts).
One stream per PE makes the PE the single writer of its stream, which is what lets the
writer check the last stored message to make re-executed batches idempotent (see
``broker.datasource``).

The names that go into them are checked where they enter (the spec, ``fogshift up``) against
:data:`fogshift.common.names.NAME_PATTERN`, which keeps them valid subject tokens.
"""

from __future__ import annotations

from fogshift.spec.models import partition_id


def stream_name(pipeline: str, pe: str) -> str:
    """The JetStream stream holding the output of ``pe`` in ``pipeline``: one per PE, no two
    PEs' the same.

    ``_`` joins the two names and may be in both, so the pipeline's are doubled: pipeline
    ``a_b``'s PE ``c`` and pipeline ``a``'s PE ``b_c`` shared ``FS_a_b_c`` before, two
    writers in one stream (the single-writer chain and fencing hold only with one). A
    pipeline's name without ``_`` gives the name it always gave.
    """
    return f"FS_{pipeline.replace('_', '__')}_{pe}"


def legacy_stream_name(pipeline: str, pe: str) -> str:
    """The name fogshift gave the stream of ``pe`` before 2026-11-29 (``_`` not doubled): a
    pipeline deployed then still has it, holding the PE's subjects, until deployed again
    (which deletes it, see ``broker.client.delete_pe_stream``)."""
    return f"FS_{pipeline}_{pe}"


def data_subject(pipeline: str, pe: str) -> str:
    """The subject of ``pe``'s output events."""
    return f"fs.{pipeline}.{pe}.data"


def dead_subject(pipeline: str, pe: str) -> str:
    """The subject of ``pe``'s dead letters."""
    return f"fs.{pipeline}.{pe}.dead"


def fence_subject(pipeline: str, pe: str) -> str:
    """The subject of fence markers: the orchestrator's "epochs before N may not write"."""
    return f"fs.{pipeline}.{pe}.fence"


def cut_subject(pipeline: str, pe: str) -> str:
    """The subject of the cut log of a PE with several inputs: each micro-batch's input ranges,
    logged before the batch runs, so every re-execution cuts its input the same way."""
    return f"fs.{pipeline}.{pe}.cut"


def keys_subject(pipeline: str, pe: str) -> str:
    """The subject, in ``pe``'s stream, of the key moves of a partitioned PE reading ``pe``:
    the orchestrator's "these keys go to that partition from here on" (and its requests for
    copies, see :mod:`fogshift.broker.keys`). In the input's stream, so that they fall in
    place among the events the partitions read. Only the orchestrator may publish here: a
    partition's node that could would move or drop every key of the element."""
    return f"fs.{pipeline}.{pe}.keys"


def key_state_subject(pipeline: str, pe: str, partition: str) -> str:
    """The subject, in ``pe``'s stream, of the key states the partition PE ``partition`` (its
    id, ``<element>-p<k>``) hands over at a move (see :mod:`fogshift.broker.keys`). One per
    partition PE, so that the broker tells who sent a state: a partition's node may publish
    on its own only, and a target takes a key's state only from the key's owner before the
    move. By the partition's id, not its number: two partitioned elements reading ``pe``
    each have a partition 0, and neither may hand over the other's keys."""
    return f"{keys_subject(pipeline, pe)}.{partition}"


def key_state_subjects(pipeline: str, pe: str) -> str:
    """The wildcard of every partition's :func:`key_state_subject`."""
    return f"{keys_subject(pipeline, pe)}.*"


def key_subjects(pipeline: str, pe: str) -> list[str]:
    """The subjects of every key move, copy request and key state on ``pe``'s stream: read
    together, in stream order (``broker.client.get_ranges``)."""
    return [keys_subject(pipeline, pe), key_state_subjects(pipeline, pe)]


def key_state_origin(pipeline: str, pe: str, subject: str, element: str) -> int | None:
    """The number of the partition of ``element`` whose :func:`key_state_subject`
    ``subject`` is (``None``: not one of ``element``'s partitions)."""
    prefix = f"{keys_subject(pipeline, pe)}.{partition_id(element, 0)[:-1]}"
    if not subject.startswith(prefix):
        return None
    origin = subject[len(prefix) :]
    if not (origin.isdigit() and origin.isascii()) or str(int(origin)) != origin:
        return None  # ("-p01": not how a partition's id is written)
    return int(origin)


def state_subject(pipeline: str, pe: str, to: int | None = None, element: str | None = None) -> str:
    """The subject, in ``pe``'s stream, of the parts of large key states that the
    partitioned element ``element`` hands to its partition ``to`` (see
    :mod:`fogshift.broker.keys`): apart from ``.keys``, which every partition reading ``pe``
    reads whole, so that only the partition a state is for reads its bytes (over a fog
    node's link, a partition reading every state that passes was the cost of a key move),
    and it can fetch them as they are stored, ahead of the batch that reads their record.

    By element, as :func:`key_state_subject` is: two partitioned elements reading ``pe``
    each have a partition 0, and a node hosting one of them may publish parts for its own
    element's partitions only, so that it cannot fill another's read-ahead.

    Older fogshifts' subjects: ``element`` ``None``, ``.state.<to>`` (every element's parts
    for partition ``to``, until 2026-12-02); ``to`` ``None`` too, ``.state`` (every part)."""
    subject = f"fs.{pipeline}.{pe}.state"
    if to is None:
        return subject
    return f"{subject}.{to}" if element is None else f"{subject}.{element}.{to}"


def state_subjects(pipeline: str, pe: str, element: str | None = None) -> str:
    """The wildcard of :func:`state_subject` for every partition of ``element`` (``None``:
    the older ``.state.<to>`` of every partition, a stream's subject still)."""
    subject = state_subject(pipeline, pe)
    return f"{subject}.*" if element is None else f"{subject}.{element}.*"


def stream_subjects(pipeline: str, pe: str) -> list[str]:
    """Every subject of ``pe``'s stream."""
    return [
        data_subject(pipeline, pe),
        dead_subject(pipeline, pe),
        fence_subject(pipeline, pe),
        cut_subject(pipeline, pe),
        keys_subject(pipeline, pe),
        key_state_subjects(pipeline, pe),
        state_subject(pipeline, pe),
        state_subjects(pipeline, pe),
        state_subjects(pipeline, pe, "*"),
    ]


#: The log of a nats-server `fogshift up` started, in its folder
#: (``fogshift.broker.server.start_nats_server``).
LOG_NAME = "nats.log"
