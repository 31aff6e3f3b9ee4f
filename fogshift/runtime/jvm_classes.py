"""fogshift's own JVM classes: compiled once per environment, put on every node's driver
classpath.

Two classes. ``java/WindowAggregate.java`` is ``window-aggregate``'s JVM engine (``engine: jvm``,
:func:`fogshift.runtime.engine.start_query`). ``java/NioLocalFileSystem.java`` is the sessions'
local file system: Hadoop's
local file system sets the permissions of each file it creates by starting a ``chmod``
process when Hadoop's native library is missing, and no build of that library is published
for this platform (PyPI and Debian have none). A streaming query writes its offsets, its
commit and its state changelog every micro-batch, each with a checksum file: measured on the
2-core machine, a ``window-aggregate`` query started 4 to 8 such processes a batch, each
2.5-3.0 ms of wall time on the batch's path and 2.7-3.3 ms of CPU (0.03 ms through
``java.nio``, ``scripts/set_permission_cost.py``). This file system sets the same
permissions through ``java.nio``: a batch's offsets-log write and commit took 1-2 ms each
instead of 8-9.5 ms.

``python -m fogshift.runtime.jvm_archive`` (``make setup``) compiles both with the JDK's
``javac`` against the jars in the pyspark wheel, before it makes the class archive. Without a
``javac`` there is no jar: sessions use Hadoop's own file system (more CPU per batch, the
same results), and a PE with ``engine: jvm`` is refused where it would start.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from filelock import FileLock


def jvm_option(flag: str, value: str | Path) -> str:
    """``flag`` and ``value`` as one word of ``spark.driver.extraJavaOptions``, which Spark's
    launcher splits at spaces and reads double quotes and backslashes in (a path holding a
    space, quoted not, gave the JVM a stray word it took for its main class: no session,
    ``make demo`` failed in a folder named so)."""
    text = str(value)
    if not any(c.isspace() or c in "\"'\\" for c in text):
        return f"{flag}{text}"
    return '"' + flag + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


#: The Java sources, compiled into one jar.
SOURCES = tuple(
    Path(__file__).with_name("java") / name
    for name in ("NioLocalFileSystem.java", "PyText.java", "WindowAggregate.java")
)
#: Hadoop's ``fs.file.impl`` of every session when the jar is there.
LOCAL_FILE_SYSTEM = "fogshift.hadoop.NioLocalFileSystem"


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jar_path() -> Path:
    """Where this environment's jar lives: beside its interpreter, named by what it is made
    of (the sources and the jars they are compiled against), so a change makes a new one."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    for jar in sorted(_pyspark_jars().glob("*.jar")):
        digest.update(jar.name.encode())
    return Path(sys.prefix) / "share" / "fogshift" / f"fogshift-jvm-{digest.hexdigest()[:12]}.jar"


def session_configs(jar: Path | None = None) -> dict[str, str]:
    """The Spark settings that put the jar to use; none if it was not made."""
    jar = jar_path() if jar is None else jar
    if not jar.is_file():
        return {}
    return {"spark.driver.extraClassPath": str(jar), "spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM}


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "javac", os.X_OK):
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def ensure(jar: Path | None = None, timeout_s: float = 300) -> bool:
    """Compile the jar unless it exists (one process at a time). True if it exists after.

    A failure is reported on stderr and leaves no file: sessions then run without it.
    """
    jar = jar_path() if jar is None else jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(jar) + ".lock"):
        if jar.is_file():
            return True
        javac = _javac()
        if javac is None:
            print(
                "fogshift: no javac, so no fogshift JVM classes (sessions run with Hadoop's own "
                "local file system, which starts a chmod process per file it writes).\n"
                "  expected: a JDK 17 (`javac` on the PATH or in $JAVA_HOME/bin)\n"
                "  hint: sudo apt-get install openjdk-17-jdk-headless",
                file=sys.stderr,
            )
            return False
        started = time.monotonic()
        classpath = os.pathsep.join(str(j) for j in sorted(_pyspark_jars().glob("*.jar")))
        with tempfile.TemporaryDirectory(prefix="fogshift-javac-") as work:
            classes = Path(work) / "classes"
            proc = subprocess.run(
                [javac, "--release", "17", "-nowarn", "-cp", classpath, "-d", str(classes),
                 *map(str, SOURCES)],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
                print(f"fogshift: the JVM classes did not compile:\n{tail}", file=sys.stderr)
                return False
            part = jar.with_name(jar.name + ".part")
            with contextlib.suppress(FileNotFoundError):
                part.unlink()  # a previous attempt's, cut off
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(classes.rglob("*.class")):
                    archive.write(path, path.relative_to(classes).as_posix())
            os.replace(part, jar)
        print(f"fogshift: JVM classes {jar} compiled in {time.monotonic() - started:.1f} s")
        return True


if __name__ == "__main__":
    sys.exit(0 if ensure() else 1)
