"""The agent's runs on its machine: whether the machine went down under the last one.

Spark syncs none of a query's checkpoint files (logs, state store), so a process killed
leaves them whole in the page cache, while a machine that lost power (or crashed) may come
back with any of them empty or cut short: a PE started from such a checkpoint failed at its
start or at its first batch, for good, or read state that was never whole. An agent notes
the machine's boot id in ``<home>/run.json`` when it starts and removes the note when it
stops (after syncing the file systems): a note left by an agent of another boot says the
machine went down while it ran, and the node's local checkpoints are set aside, to be
restored from their central copies (``NodeRuntime.start``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: The kernel's id of the current boot (Linux): another after every start of the machine.
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
#: The note of the agent's run, in its home.
RUN_FILE = "run.json"
#: Where a node's checkpoints are set aside, in its home (only the last set is kept).
DISTRUSTED = "distrusted"


def boot_id(path: Path = BOOT_ID_FILE) -> str | None:
    """The machine's boot id; ``None`` where it cannot be read (not Linux)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def note_start(home: Path, boot: str | None) -> str | None:
    """Note this run of the agent in ``home``, under ``boot`` (see :func:`boot_id`).

    Returns:
        The boot id of the last run if it did not stop and the machine started again since
        (its files may not all have reached the disk); ``None`` otherwise, or if either
        boot id is not known.
    """
    note = home / RUN_FILE
    try:
        previous = json.loads(note.read_text()).get("boot_id")
    except (OSError, ValueError, AttributeError):
        previous = None  # (none: the last run stopped; an unreadable one tells nothing)
    home.mkdir(parents=True, exist_ok=True)
    tmp = note.with_name(f".{RUN_FILE}.tmp")
    with open(tmp, "w") as handle:
        json.dump({"boot_id": boot, "pid": os.getpid(), "started": time.time()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(note)
    if previous is None or boot is None or previous == boot:
        return None
    return str(previous)


def note_stop(home: Path) -> None:
    """Mark the run as stopped: what it wrote is synced to disk, then its note goes."""
    os.sync()
    (home / RUN_FILE).unlink(missing_ok=True)


def set_aside(home: Path, folders: tuple[str, ...]) -> Path | None:
    """Move the ``folders`` of ``home`` that hold anything into ``<home>/distrusted/<time>``
    (an earlier set removed first: kept for a look, not for good); where they went, or
    ``None`` if none held anything."""
    present = [home / f for f in folders if (home / f).is_dir() and any((home / f).iterdir())]
    if not present:
        return None
    shutil.rmtree(home / DISTRUSTED, ignore_errors=True)
    target = home / DISTRUSTED / time.strftime("%Y%m%dT%H%M%S")
    target.mkdir(parents=True)
    for folder in present:
        folder.rename(target / folder.name)
    return target
