"""The JVM class archive: when sessions use it (unit). That a real driver JVM maps it:
``test_engine_lifecycle.py::test_the_driver_jvm_maps_the_class_archive``."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

from fogshift.runtime.jvm_archive import archive_path, with_archive
from fogshift.runtime.jvm_classes import jar_path


def test_the_archive_belongs_to_the_environment_its_pyspark_and_fogshifts_jar() -> None:
    path = archive_path()
    assert path.is_relative_to(Path(sys.prefix))
    jar = jar_path()
    # The jar is on the classpath the archive is made for (`make setup` makes both).
    assert jar.is_file(), f"no {jar}: `make setup` compiles it"
    digest = jar.stem.rsplit("-", 1)[-1]
    assert path.name == f"spark-{version('pyspark')}-{digest}.jsa"


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
