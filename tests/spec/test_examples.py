"""Where the examples are found: the checkout's ``examples/`` or the copy a wheel installs."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest

from fogshift.spec import examples, load_spec
from fogshift.spec.examples import example_path
from fogshift.spec.exceptions import ExampleNotFound

ROOT = Path(__file__).resolve().parents[2]


def test_the_case1_example_is_found_from_any_directory() -> None:
    # Another cwd, in a process of its own: nothing relative to the checkout can help.
    found = subprocess.run(
        [sys.executable, "-c", "from fogshift.spec.examples import example_path; "
         "print(example_path('case1', 'case1.yaml'))"],
        cwd="/tmp", capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(found) == ROOT / "examples" / "case1" / "case1.yaml"
    spec = load_spec(found)
    assert spec.pipeline == "case1"
    assert Path(spec.element("source").options["path"]).is_file()


class _Installed:
    """A distribution whose RECORD lists the examples under ``<prefix>/share``."""

    def __init__(self, site: Path, files: list[str]) -> None:
        self.site = site
        self.files = [PurePosixPath(f) for f in files]

    def locate_file(self, path: PurePosixPath) -> Path:
        return self.site / path


def test_an_installed_copy_is_found_through_the_distributions_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "venv"
    site = prefix / "lib" / "python3.11" / "site-packages"
    spec = prefix / "share" / "fogshift" / "examples" / "case1" / "case1.yaml"
    spec.parent.mkdir(parents=True)
    site.mkdir(parents=True)
    spec.write_text("pipeline: case1\n")
    record = ["fogshift/__init__.py", "../../../share/fogshift/examples/case1/case1.yaml"]
    monkeypatch.setattr(examples, "_checkout_examples", lambda: None)
    monkeypatch.setattr(metadata, "distribution", lambda name: _Installed(site, record))
    assert example_path("case1", "case1.yaml").resolve() == spec.resolve()


def test_missing_examples_are_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ExampleNotFound) as err:
        example_path("case9", "case9.yaml")
    assert "case1" in (err.value.expected or "") and err.value.received == "'case9/case9.yaml'"

    def absent(name: str) -> None:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(examples, "_checkout_examples", lambda: None)
    monkeypatch.setattr(metadata, "distribution", absent)
    with pytest.raises(ExampleNotFound, match="neither in a checkout nor installed"):
        example_path("case1")
