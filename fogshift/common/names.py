"""Names that become paths: pipeline, element and node names, snapshot ids, file paths.

Every name a request or a checkpoint manifest carries ends up as a folder or a file on some
machine (``<node home>/checkpoints/<pipeline>/<element>``, a snapshot's files, a replica's
manifest). A name is therefore checked twice: against a strict pattern at the API edge
(the ``*_RE`` patterns below, as FastAPI path parameters), and again by the storage layer
(:func:`check_name` and friends, then :func:`contained`, which resolves the final path and
checks it lies inside its root). The second check is defence in depth: a caller that forgot
the first, or a symbolic link, must not be enough to read or delete outside a PE's folders.

The patterns avoid look-arounds so that pydantic's regex engine and Python's ``re`` accept
them alike.
"""

from __future__ import annotations

import re
from pathlib import Path

from fogshift.common.exceptions import InvalidName, PathEscape

#: Pipeline, element and node names. They also become stream and subject names
#: (``broker.naming``), hence no '.', '*' or '>'; the spec, the broker and the supervisor all
#: take the pattern from here, the lowest layer that needs it.
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
#: :data:`NAME_RE` compiled (``NAME_PATTERN.fullmatch(name)``: ``$`` also matches before a
#: final newline).
NAME_PATTERN = re.compile(NAME_RE)
#: Snapshot and checkpoint ids: ``b`` and the batch number (``checkpoint.store.snapshot_id``).
SNAPSHOT_RE = r"^b[0-9]{12,19}$"
#: Content addresses of checkpoint blobs.
SHA256_RE = r"^[0-9a-f]{64}$"

# One path component: anything but a separator, a backslash, a control character or what
# means something in a URL (?, #, %: files travel as URL paths), and not "." or ".." —
# spelled out without look-arounds: "..x" (Spark writes "..29.<uuid>.tmp.crc"), ".x", or
# not starting with ".".
_CHAR = r"[^/\\\x00-\x1f\x7f?#%]"
_NOT_DOT = r"[^/\\\x00-\x1f\x7f?#%.]"
_COMPONENT = rf"(?:\.\.{_CHAR}+|\.{_NOT_DOT}{_CHAR}*|{_NOT_DOT}{_CHAR}*)"
#: A file path inside a checkpoint: relative, normalised (no empty, "." or ".." component),
#: "/" as the only separator.
REL_PATH_RE = rf"^{_COMPONENT}(?:/{_COMPONENT})*$"
#: Longest file path accepted inside a checkpoint.
MAX_REL_PATH = 1024
#: A key group: ``G/N``, key group G of N (``migrate --key-group``).
KEY_GROUP_RE = r"^[0-9]{1,4}/[0-9]{1,4}$"
#: A body field a keyed PE's state is keyed by (``key_by``): a top-level field's name, named
#: so that it is also a JSON path step.
KEY_FIELD_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
#: A custom processor's class: ``module:ClassName``.
CLASS_RE = r"^[\w.]+:\w+$"

#: What each pattern accepts, in the words an error message uses.
EXPECTED = {
    NAME_RE: "1 to 63 letters, digits, '_' or '-', starting with a letter or digit",
    SNAPSHOT_RE: "a snapshot id: 'b' and the batch number in 12 digits (b000000000042)",
    SHA256_RE: "a sha256 in lower-case hex (64 characters)",
    KEY_GROUP_RE: "G/N, key group G of N keys' CRC-32 groups, N at most 4096 (e.g. 3/16)",
    KEY_FIELD_RE: (
        "the name of a top-level body field: 1 to 64 ASCII letters, digits or '_', not "
        "starting with a digit (e.g. patient)"
    ),
    CLASS_RE: "module:ClassName (e.g. procs:Mine, the module found in the option path)",
    REL_PATH_RE: (
        "a relative file path inside the checkpoint: '/'-separated, no '.' or '..' "
        "component, no leading '/', no backslash, control character, '?', '#' or '%'"
    ),
}

_HINT = "names and paths come from the pipeline spec and the node's own checkpoints"


def _check(value: object, pattern: str, what: str) -> str:
    # fullmatch: "$" alone would also match before a trailing newline.
    if not isinstance(value, str) or re.fullmatch(pattern, value) is None:
        raise InvalidName(
            f"bad {what}: it cannot become part of a path",
            expected=EXPECTED[pattern],
            received=repr(value)[:120],
            hint=_HINT,
        )
    return value


def check_name(value: object, what: str = "name") -> str:
    """Return ``value`` if it is a valid pipeline, element or node name.

    Args:
        what: How the error names it ("pipeline name", "element name of case1").

    Raises:
        InvalidName: It is not (``..``, ``a/b``, empty, too long, a trailing newline...).
    """
    return _check(value, NAME_RE, what)


def check_snapshot_id(value: object, what: str = "snapshot id") -> str:
    """Return ``value`` if it is a valid snapshot or checkpoint id.

    Raises:
        InvalidName: It is not.
    """
    return _check(value, SNAPSHOT_RE, what)


def check_sha256(value: object, what: str = "checkpoint blob name") -> str:
    """Return ``value`` if it is a sha256 in lower-case hex.

    Raises:
        InvalidName: It is not.
    """
    return _check(value, SHA256_RE, what)


def check_relative_path(value: object, what: str = "checkpoint file path") -> str:
    """Return ``value`` if it is a normalised relative path (see ``REL_PATH_RE``).

    Raises:
        InvalidName: It is absolute, has a ``..``, ``.`` or empty component, a backslash, a
            NUL or other control character, or is longer than ``MAX_REL_PATH``.
    """
    if isinstance(value, str) and len(value) > MAX_REL_PATH:
        raise InvalidName(
            f"bad {what}: longer than {MAX_REL_PATH} characters",
            expected=EXPECTED[REL_PATH_RE],
            received=repr(value)[:120] + "…",
            hint=_HINT,
        )
    return _check(value, REL_PATH_RE, what)


def contained(root: Path, *parts: str, what: str = "path") -> Path:
    """``root / parts``, once checked that it resolves to a path strictly inside ``root``.

    The parts should already have passed the checks above; this catches what they cannot
    see (a symbolic link inside ``root`` pointing out of it, a caller that skipped them).
    The returned path is the unresolved join, so callers keep the paths they always used.

    Raises:
        PathEscape: The resolved path is ``root`` itself or lies outside it.
    """
    path = root.joinpath(*parts)
    base = root.resolve()
    resolved = path.resolve()
    if base not in resolved.parents:
        raise PathEscape(
            f"{what} {'/'.join(parts)!r} leaves its folder {str(root)!r}",
            expected=f"a path inside {str(root)!r}",
            received=str(resolved),
            hint="a name or a symbolic link points outside the folder fogshift manages",
        )
    return path


def pipeline_folder(root: Path, pipeline: str) -> Path:
    """The folder ``root/<pipeline>`` of one pipeline's PEs, the name checked and the result
    inside ``root``.

    Raises:
        InvalidName: ``pipeline`` is not a valid name.
        PathEscape: The folder resolves outside ``root`` (a symbolic link).
    """
    return contained(root, check_name(pipeline, "pipeline name"), what="pipeline folder")


def pe_folder(root: Path, pipeline: str, pe: str) -> Path:
    """The folder ``root/<pipeline>/<pe>`` of one PE, both names checked and the result
    inside ``root``.

    Raises:
        InvalidName: ``pipeline`` or ``pe`` is not a valid name.
        PathEscape: The folder resolves outside ``root`` (a symbolic link).
    """
    check_name(pipeline, "pipeline name")
    check_name(pe, f"element name of pipeline {pipeline!r}")
    return contained(root, pipeline, pe, what=f"folder of {pipeline}/{pe}")
