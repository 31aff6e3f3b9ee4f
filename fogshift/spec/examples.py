"""Where the example specs and data are, in a checkout or in an installed package.

The examples live in the repository's top-level ``examples/`` folder (tests and docs name
them there). A wheel ships the same files as data files under
``<prefix>/share/fogshift/examples`` (``pyproject.toml``, ``[tool.setuptools.data-files]``),
so ``fogshift demo`` finds Case 1 from any directory. :func:`example_path` is the one place
that decides which copy is used.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path, PurePosixPath

from fogshift.spec.exceptions import ExampleNotFound

#: Where the data files of an installed wheel put the examples, relative to the prefix.
INSTALLED_PREFIX = PurePosixPath("share", "fogshift", "examples")


def _checkout_examples() -> Path | None:
    """The ``examples/`` folder of the checkout this package is imported from, if any.

    ``pyproject.toml`` beside it tells a checkout from a site-packages folder that happens
    to hold an unrelated ``examples`` directory.
    """
    root = Path(__file__).resolve().parents[2]
    folder = root / "examples"
    if folder.is_dir() and (root / "pyproject.toml").is_file():
        return folder
    return None


def _installed_examples(distribution: str = "fogshift") -> Path | None:
    """The examples folder an installed wheel put under its prefix, found through the
    distribution's list of installed files (right whatever the install scheme: venv,
    ``--user``, ``--prefix``)."""
    try:
        files = metadata.distribution(distribution).files or []
    except metadata.PackageNotFoundError:
        return None
    marker = len(INSTALLED_PREFIX.parts)
    for file in files:
        parts = PurePosixPath(str(file)).parts
        for start in range(len(parts) - marker):
            if parts[start : start + marker] == INSTALLED_PREFIX.parts:
                located = Path(str(metadata.distribution(distribution).locate_file(file)))
                # ``located`` is <prefix>/share/fogshift/examples/<rest>: climb back to the
                # examples folder itself.
                folder = located.parents[len(parts) - start - marker - 1]
                return folder.resolve() if folder.is_dir() else None
    return None


def examples_root() -> Path:
    """The examples folder: the checkout's if running from one, else the installed copy.

    Raises:
        ExampleNotFound: Neither exists (a broken install).
    """
    found = _checkout_examples() or _installed_examples()
    if found is None:
        raise ExampleNotFound(
            "the fogshift examples are neither in a checkout nor installed with the package",
            expected=f"<checkout>/examples or <prefix>/{INSTALLED_PREFIX}",
            received="neither",
            hint="reinstall fogshift (`pip install .` from the repository)",
        )
    return found


def example_path(*parts: str) -> Path:
    """The path of an example file or folder, e.g. ``example_path("case1", "case1.yaml")``.

    Raises:
        ExampleNotFound: No examples folder, or it has no such entry.
    """
    root = examples_root()
    path = root.joinpath(*parts)
    if not path.exists():
        available = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise ExampleNotFound(
            f"example {'/'.join(parts)!r} does not exist in {str(root)!r}",
            expected="one of " + ", ".join(available),
            received=repr("/".join(parts)),
        )
    return path
