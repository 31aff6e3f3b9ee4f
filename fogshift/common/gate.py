"""The gate of a PE's input: how a running query is paused at a batch boundary.

A gate is a small JSON file on the node, named in the reader's ``gate`` option. Spark asks the
reader for the latest offset before every micro-batch; the reader consults the gate:

* no file — open: read whatever is available;
* ``{"mode": "hold"}`` — return the start offset: no new batch is planned, so once the batch in
  flight commits the query sits idle at a batch boundary, warm, ready to resume;
* ``{"mode": "cap", "limit": <offset>}`` — read up to ``limit`` and no further (a warm standby
  that must not run ahead of the PE it is going to replace).

Each gate carries a ``nonce``; the reader writes it to ``<gate>.ack`` when it first obeys that
gate, so the agent knows every later batch plan honours it. The reader runs in a Python
worker of the node's driver, which shares no memory with the agent: a file on the node's disk
is the channel that reaches it.

Both sides live here, below the broker and the runtime, because both kinds of reader obey it:
the JetStream reader (:mod:`fogshift.broker.datasource`) and the CSV source
(:mod:`fogshift.runtime.csv_io`); the agent writes it. The query's *run* files beside the gate
are the runtime's (:mod:`fogshift.runtime.gate`).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any


def ack_path(gate: str | Path) -> Path:
    return Path(f"{gate}.ack")


def write_gate(gate: str | Path, mode: str, limit: dict[str, Any] | None = None) -> str:
    """Close the gate (``hold``) or cap it at ``limit``; return the nonce to wait for."""
    nonce = uuid.uuid4().hex
    target = Path(gate)
    target.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file of this write's own: two writes at once (a standby's cap requests
    # that timed out, then ran when its node thawed) shared one, the shorter text landing
    # over the longer, and the torn gate read as open.
    tmp = target.with_name(f".{target.name}.{nonce}.tmp")
    try:
        tmp.write_text(json.dumps({"mode": mode, "limit": limit, "nonce": nonce}))
        tmp.replace(target)
    except BaseException:
        # (A full disk left an empty temporary file per refused pause.)
        with contextlib.suppress(OSError):  # (the write's error is the one to tell)
            tmp.unlink(missing_ok=True)
        raise
    return nonce


def open_gate(gate: str | Path) -> None:
    """Open the gate: the query reads freely again."""
    Path(gate).unlink(missing_ok=True)
    ack_path(gate).unlink(missing_ok=True)


def acknowledged(gate: str | Path, nonce: str) -> bool:
    """Whether the reader has obeyed the gate written with ``nonce``."""
    try:
        return ack_path(gate).read_text() == nonce
    except FileNotFoundError:
        return False


def gate_nonce(gate: str | Path) -> str | None:
    """The nonce of the gate in force (``None``: open), without acknowledging it."""
    try:
        return str(json.loads(Path(gate).read_text())["nonce"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        return None


def read_gate(gate: str | None) -> dict[str, Any] | None:
    """The gate in force (``None``: open). Called by readers, once per batch plan."""
    if not gate:
        return None
    try:
        state = json.loads(Path(gate).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    ack = ack_path(gate)
    try:
        seen = ack.read_text()
    except FileNotFoundError:
        seen = ""
    if seen != state["nonce"]:
        tmp = Path(f"{ack}.{os.getpid()}.tmp")
        tmp.write_text(state["nonce"])
        tmp.replace(ack)
    return dict(state)


def gate_mode(gate: str | Path) -> str | None:
    """The mode of the gate in force (``None``: open), without acknowledging it.

    For observers (the lifecycle hooks of kept processors, see
    :mod:`fogshift.runtime.instances`): only the reader acknowledges a gate, because an
    acknowledgement promises that every later batch plan honours it.
    """
    try:
        return str(json.loads(Path(gate).read_text())["mode"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        return None
