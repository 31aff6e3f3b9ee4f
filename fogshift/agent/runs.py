"""The agent's runs on its machine: whether the machine went down under the last one.

Spark syncs none of a query's checkpoint files (logs, state store), so a process killed
leaves them whole in the page cache, while a machine that lost power (or crashed) may come
back with any of them empty or cut short: a PE started from such a checkpoint failed at its
start or at its first batch, for good, or read state that was never whole. An agent notes
the machine's boot id in ``<home>/run.json`` when it starts and removes the note when it
stops (after syncing the file systems): a note left by an agent of another boot says the
machine went down while it ran (or that the agent was killed, and the machine restarted
since: told alike), and the node's local checkpoints are set aside, to be restored from
their central copies (``NodeRuntime.start``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from fogshift.common.files import sync_folder, write_atomic

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


def last_run_went_down(home: Path, boot: str | None) -> str | None:
    """Whether the machine went down under the agent's last run in ``home``: its note's
    boot id if it did not stop (its note is there) and the machine started again since
    (``boot``, see :func:`boot_id`, is another); ``None`` otherwise, or if either boot id is
    not known. Its files may not all have reached the disk then; so may they after a kill
    of the agent followed by a clean restart of the machine, which is told alike (its
    checkpoints are distrusted for nothing: costly, never wrong)."""
    try:
        previous = json.loads((home / RUN_FILE).read_text()).get("boot_id")
    except (OSError, ValueError, AttributeError):
        return None  # (none: the last run stopped; an unreadable one tells nothing)
    if previous is None or boot is None or previous == boot:
        return None
    return str(previous)


def note_start(home: Path, boot: str | None) -> None:
    """Note this run of the agent in ``home``, under ``boot``: on disk (the file and its
    folder synced) before the run writes anything. Called once what a last run that went
    down left is dealt with (:func:`last_run_went_down`, :func:`set_aside`): noted first, an
    agent that stopped in between (a set-aside that failed, a kill) forgot the crash, and the
    next start trusted the checkpoints."""
    note = {"boot_id": boot, "pid": os.getpid(), "started": time.time()}
    write_atomic(home / RUN_FILE, json.dumps(note))
    sync_folder(home)


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
        try:
            folder.rename(target / folder.name)
        except OSError:
            # (A mount point, another file system: what it holds goes instead; a failure
            # here raises, and the next start tries again, its note not yet rewritten.)
            for child in folder.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    return target
