"""The lock: `make setup` installs what constraints.txt names, which pyproject.toml admits."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, pinned = line.partition("==")
        assert sep and pinned, f"constraints.txt: {line!r} is not NAME==VERSION"
        pins[canonicalize_name(name)] = pinned
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        named.extend(extra)
    return [Requirement(r) for r in named]


def test_every_requirement_is_pinned_within_its_range() -> None:
    pins = _pins()
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is required by pyproject.toml but not in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}"
        )


def test_the_venv_is_the_lock() -> None:
    """What the suite runs on is what a fresh `make setup` installs (pip itself aside)."""
    drifted = []
    for name, pinned in _pins().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            drifted.append(f"{name}: not installed")
            continue
        if Version(installed) != Version(pinned):
            drifted.append(f"{name}: {installed} installed, {pinned} pinned")
    assert not drifted, "; ".join(drifted)
