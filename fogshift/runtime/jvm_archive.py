"""A class-data-sharing archive of the Spark driver JVM's classes, made once per environment.

A node's Spark session starts a JVM that loads and verifies some 15,000 classes from Spark's
jars before it can run anything; a query of a new kind (a Python data source, a
``transformWithStateInPandas`` operator, the RocksDB state store) loads thousands more. Java 17
can map classes already parsed and verified from an archive instead (AppCDS). Measured on
this 2-core machine, quiet: a session with a small stateful query started in 7.3 to 9.4 s
instead of 13.3 to 15.9 s, its JVM using 10 to 12 s of CPU instead of 17 to 20 s; `fogshift
up` of four nodes took 46 to 47 s instead of 68 to 72 s. Every node start, node restart and
cluster start gains that.

``python -m fogshift.runtime.jvm_archive`` (run by ``make setup``) compiles fogshift's own
classes (:mod:`fogshift.runtime.jvm_classes`), then makes the archive if it is missing: it
starts a session that dumps the classes it loaded at exit (``-XX:ArchiveClassesAtExit``) after
running the kinds of query fogshift runs. Sessions use it through :func:`with_archive`. An
archive the JVM cannot use (another Java, other jars) is ignored by the JVM (``-Xshare:auto``,
its default): a slower start, never a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from fogshift.runtime import jvm_classes

#: Options that already decide class data sharing: then fogshift adds nothing.
_SHARING_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")


def archive_path() -> Path:
    """Where this environment's archive lives: beside its interpreter, named by the pyspark
    version, fogshift's own jar, if made (the classpath the archive depends on: a JVM
    started with another one ignores it), and the JDK's build (an archive of another build
    is ignored too: a JDK updated under the venv lost the faster start for good, silently,
    its archive never made again)."""
    from importlib.metadata import version

    jar = jvm_classes.jar_path()
    extra = f"-{jar.stem.rsplit('-', 1)[-1]}" if jar.is_file() else ""
    jdk = _jdk_build()
    extra += f"-{jdk}" if jdk else ""
    return Path(sys.prefix) / "share" / "fogshift" / f"spark-{version('pyspark')}{extra}.jsa"


def _jdk_build() -> str:
    """A short digest of the build of the JDK Spark starts (``$JAVA_HOME``'s, else the
    ``java`` on the PATH): its ``release`` file's runtime version, read without starting
    it; ``""`` if it cannot be told."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    if java is None:
        return ""
    release = Path(os.path.realpath(java)).parent.parent / "release"
    try:
        text = release.read_text(errors="replace")
    except OSError:
        return ""
    found = [line for line in text.splitlines() if line.startswith("JAVA_RUNTIME_VERSION=")]
    return hashlib.sha256(found[0].encode()).hexdigest()[:8] if found else ""


def with_archive(java_options: str, archive: Path | None = None) -> str:
    """``java_options`` plus the archive's ``-XX:SharedArchiveFile``, if it exists and the
    options do not decide class data sharing themselves."""
    archive = archive_path() if archive is None else archive
    if not archive.is_file() or any(word in java_options for word in _SHARING_OPTIONS):
        return java_options
    return f"{java_options} {jvm_classes.jvm_option('-XX:SharedArchiveFile=', archive)}".strip()


def ensure(archive: Path | None = None, timeout_s: float = 600) -> bool:
    """Make the archive unless it exists (one process at a time). True if it exists after.

    A failure to make it is reported on stderr and leaves no file: sessions then start
    without it.
    """
    archive = archive_path() if archive is None else archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(archive) + ".lock"):
        if archive.is_file():
            return True
        started = time.monotonic()
        # Under the lock the name is ours; the JVM writes it at exit, then it is renamed.
        tmp = str(archive.with_name(archive.name + ".part"))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a previous attempt's, cut off
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "fogshift.runtime.jvm_archive", "--dump-to", tmp],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
            if proc.returncode != 0 or not Path(tmp).is_file():
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
                print(f"fogshift: no JVM class archive (sessions start without it):\n{tail}",
                      file=sys.stderr)  # fmt: skip
                return False
            os.replace(tmp, archive)
            # Another build's or classpath's (~180 MB each: a JDK update or fogshift's jar
            # changed made this one): no JVM here takes it any more (one running keeps its
            # mapping).
            for old in archive.parent.glob("spark-*.jsa"):
                if old != archive:
                    old.unlink(missing_ok=True)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        print(f"fogshift: JVM class archive {archive} made in {time.monotonic() - started:.0f} s")
        return True


def _dump(target: str) -> None:
    """Start a session whose JVM writes its loaded classes to ``target`` at exit, after
    running the kinds of query a node runs: the node's warm-up (a Python streaming source,
    ``transformWithStateInPandas`` on RocksDB, a Python streaming sink, mapInPandas)."""
    from fogshift.runtime.session import JAVA_OPTIONS, build_session
    from fogshift.runtime.warm_up import warm_up

    with tempfile.TemporaryDirectory(prefix="fogshift-jsa-") as work:
        folder = Path(work)
        spark = build_session(
            "jvm-archive", "local[*]", str(folder / "local"),
            f"{JAVA_OPTIONS} {jvm_classes.jvm_option('-XX:ArchiveClassesAtExit=', target)}",
        )  # fmt: skip
        try:
            warm_up(spark, folder / "warm-up")
        except RuntimeError as exc:
            raise SystemExit(f"the archive's query failed: {exc}") from exc
        finally:
            spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump_to:
        _dump(args.dump_to)
        return
    # The jar first: it is on the classpath the archive is made for.
    jvm_classes.ensure()
    ensure()


if __name__ == "__main__":
    main()
