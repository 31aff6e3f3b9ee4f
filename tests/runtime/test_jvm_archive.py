"""The JVM class archive: when sessions use it (unit). That a real driver JVM maps it:
``test_engine_lifecycle.py::test_the_driver_jvm_maps_the_class_archive``."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from fogshift.runtime.jvm_archive import archive_path, with_archive
from fogshift.runtime.jvm_classes import jar_path


def test_the_archive_belongs_to_the_environment_its_pyspark_and_fogshifts_jar() -> None:
    path = archive_path()
    assert path.is_relative_to(Path(sys.prefix))
    jar = jar_path()
    # The jar is on the classpath the archive is made for (`make setup` makes both).
    assert jar.is_file(), f"no {jar}: `make setup` compiles it"
    digest = jar.stem.rsplit("-", 1)[-1]
    assert path.name.startswith(f"spark-{version('pyspark')}-{digest}-")
    # And the JDK's build: one updated under the venv has its archive made anew (another
    # build's is ignored by the JVM: the faster start was lost for good).
    assert path.suffix == ".jsa" and len(path.stem.rsplit("-", 1)[-1]) == 8


def test_the_archive_is_named_by_the_jdk_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fogshift.runtime import jvm_archive

    names = []
    for build in ("17.0.15+6-1-deb12u1", "17.0.21.1+2-1-deb12u1"):
        jdk = tmp_path / build
        (jdk / "bin").mkdir(parents=True)
        (jdk / "bin" / "java").write_text("")
        (jdk / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_RUNTIME_VERSION="{build}"\n')
        monkeypatch.setenv("JAVA_HOME", str(jdk))
        names.append(jvm_archive.archive_path().name)
    assert names[0] != names[1]
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "none"))  # (no release file: as before)
    assert jvm_archive.archive_path().name.count("-") == names[0].count("-") - 1


def test_sessions_use_the_archive_only_if_it_exists(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    assert with_archive("-XX:+UseSerialGC", archive) == "-XX:+UseSerialGC"
    archive.write_bytes(b"made by the setup")
    assert with_archive("-XX:+UseSerialGC", archive) == (
        f"-XX:+UseSerialGC -XX:SharedArchiveFile={archive}"
    )
    assert with_archive("", archive) == f"-XX:SharedArchiveFile={archive}"


def test_options_that_decide_class_sharing_themselves_are_left_alone(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"made by the setup")
    for options in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa",
                    "-XX:ArchiveClassesAtExit=/new.jsa"):  # fmt: skip
        assert with_archive(options, archive) == options


def test_a_path_with_a_space_stays_one_word_of_the_java_options(tmp_path: Path) -> None:
    # Spark's launcher splits extraJavaOptions at spaces (reading double quotes and
    # backslashes as a shell does): the path's second half was a stray word the JVM took
    # for its main class, and `make demo` in a folder named "my work" started no session.
    import shlex

    from fogshift.runtime.jvm_classes import jvm_option

    folder = tmp_path / 'my work "x" \\ it\'s'
    folder.mkdir()
    archive = folder / "spark.jsa"
    archive.write_bytes(b"made by the setup")
    options = with_archive("-XX:+UseSerialGC", archive)
    assert shlex.split(options) == ["-XX:+UseSerialGC", f"-XX:SharedArchiveFile={archive}"]
    assert jvm_option("-Djava.io.tmpdir=", "/plain/path") == "-Djava.io.tmpdir=/plain/path"
