"""fogshift's JVM classes: compiled by the JDK, used by sessions only when made. That a real
session's local file system is this one: ``test_engine_lifecycle.py``."""

from __future__ import annotations

import zipfile
from pathlib import Path

from fogshift.runtime.jvm_classes import LOCAL_FILE_SYSTEM, ensure, jar_path, session_configs


def test_the_jar_is_compiled_with_the_file_system_in_it(tmp_path: Path) -> None:
    jar = tmp_path / "fogshift.jar"
    assert ensure(jar)
    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
    main = LOCAL_FILE_SYSTEM.replace(".", "/")
    assert {f"{main}.class", f"{main}$Raw.class"} <= names
    assert not jar.with_name(jar.name + ".part").exists()
    modified = jar.stat().st_mtime_ns
    assert ensure(jar) and jar.stat().st_mtime_ns == modified  # made once


def test_sessions_use_the_jar_only_if_it_exists(tmp_path: Path) -> None:
    jar = tmp_path / "fogshift.jar"
    assert session_configs(jar) == {}
    jar.write_bytes(b"made by the setup")
    assert session_configs(jar) == {
        "spark.driver.extraClassPath": str(jar),
        "spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM,
    }


def test_the_jar_is_named_by_what_it_is_made_of() -> None:
    assert jar_path() == jar_path()
    assert jar_path().name.startswith("fogshift-jvm-") and jar_path().suffix == ".jar"
