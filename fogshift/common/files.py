"""Writing files whole (atomically), and files that hold secrets (tokens, NKEY seeds,
passwords)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from fogshift.exceptions import InvalidInput

#: The mode of every file holding a secret: the owner reads and writes, nobody else.
PRIVATE_MODE = 0o600

#: The mode of a fogshift home: only its owner enters it.
PRIVATE_DIR_MODE = 0o700

#: What an error of a full disk says, in Python (errno 28) and in the JVM (an IOException)
#: alike: how a failure's text tells it.
DISK_FULL = "No space left on device"
#: ... and of a quota reached (errno 122).
QUOTA_EXCEEDED = "Disk quota exceeded"
#: The errors of a machine's storage (full, over quota, read-only, failing): how an
#: ``OSError`` tells it (not a bug of the code that met it).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def write_atomic(path: Path, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` (created or replaced) so that a reader sees either the
    old file or the whole new one, never a part, even if the writer dies midway.

    The text goes to a fresh file in the same folder (``O_EXCL``: never an existing file or
    a planted symbolic link), created with exactly ``mode``, synced and renamed over
    ``path``.

    Returns:
        ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        # The umask may only have removed bits; set exactly ``mode`` (still on the fd).
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1  # the file object owns it now
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return path


def sync_folder(folder: Path) -> None:
    """Put the renames made in ``folder`` on disk (where the file system can: some network
    and FUSE ones refuse a folder's fsync, and sync its entries themselves)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (created or replaced) readable by its owner only.

    The file is 0600 from its first byte: it is created 0600 under a fresh name in the same
    folder and renamed over ``path`` (:func:`write_atomic`). Writing then ``chmod``-ing
    would leave a window in which the secret is readable by others under the umask's mode;
    replacing an existing, wider file in place would keep that file's mode.

    Returns:
        ``path``.
    """
    return write_atomic(path, text, PRIVATE_MODE)


def _check_parents(path: Path, me: int) -> None:
    """Refuse a home whose folders above could be changed by another user: one of theirs
    (its owner can move the home away and put one of their own in its place, whatever the
    home's mode), or one others may write without the sticky bit (so may they). ``/tmp``
    (root's, sticky) and a folder of this user's or root's are fine; so is one its group may
    write when that group is this user's own (a user private group, as with umask 002).

    Raises:
        InvalidInput: Naming the folder.
    """
    mine = os.getegid()
    for parent in path.resolve().parents:
        try:
            found = parent.stat()
        except (FileNotFoundError, NotADirectoryError):
            continue  # (made by this user below)
        mode = stat.S_IMODE(found.st_mode)
        writers = stat.S_IWOTH | (stat.S_IWGRP if found.st_gid != mine else 0)
        others_write = mode & writers and not mode & stat.S_ISVTX
        if found.st_uid not in (me, 0) or others_write:
            theirs = found.st_uid not in (me, 0)
            whose = "another user's" if theirs else "writable by others"
            raise InvalidInput(
                f"cannot use {str(path)!r} as a fogshift home: the folder {str(parent)!r} "
                f"above it is {whose}, who could put another folder in its place",
                expected=f"folders above the home of this user's (uid {me}) or root's, "
                "written by nobody else (or sticky, as /tmp)",
                received=f"{parent}: uid {found.st_uid}, gid {found.st_gid}, mode {mode:o}",
                hint="give a --home under a folder of your own (e.g. ~/fogshift)"
                + (
                    "; as root, not under another user's folder: they could swap what root "
                    "then trusts (e.g. /root/fogshift)"
                    if me == 0 and theirs
                    else ""
                ),
            )


def make_private_dir(path: Path) -> Path:
    """Make sure folder ``path`` exists and only its owner can enter it (a fogshift home:
    its pipelines' checkpoints and twins, the central store, the registry, the logs and the
    secrets; files under it keep the umask's modes, the folder keeps others out of all).

    A new folder is created 0700 (its parents as the umask has them); an existing one of
    this user's that is wider is narrowed to 0700 (a home made by an older fogshift, or by
    hand); one of another user's is refused: its owner could rename and replace the files
    written in it (the cluster file, whose orchestrator URL then took the operator's token
    elsewhere), whatever their modes.

    Returns:
        ``path``.

    Raises:
        InvalidInput: ``path``, or a folder above it, is a file; or it, or a folder above
            it, belongs to another user (or, above it, may be written by others).
    """
    me = os.geteuid()
    _check_parents(path, me)  # (before anything is made there)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    except (FileExistsError, NotADirectoryError) as exc:
        raise InvalidInput(
            f"cannot use {str(path)!r} as a folder: {exc.strerror}",
            expected="a folder, or a path where one can be made",
            received=f"{next(p for p in (path, *path.parents) if p.exists())} is a file",
            hint="give another --home, or move that file away",
        ) from exc
    found = path.stat()
    if found.st_uid != me:
        raise InvalidInput(
            f"cannot use {str(path)!r} as a fogshift home: it belongs to another user",
            expected=f"a folder of this user's (uid {me}), or a path where one can be made",
            received=f"a folder of uid {found.st_uid}, mode {stat.S_IMODE(found.st_mode):o}",
            hint="give a --home of your own, or have its owner hand it over (`chown`)",
        )
    if stat.S_IMODE(found.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)
    return path
