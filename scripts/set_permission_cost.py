"""What setting one file's mode costs a node's Spark JVM: Hadoop's local file system (a
``chmod`` process without Hadoop's native library) beside fogshift's (``java.nio``).

A real local session with fogshift's jar (``make setup``). Run it on a quiet machine:

    .venv/bin/python scripts/set_permission_cost.py
"""

from __future__ import annotations

import os
import tempfile
import time

from fogshift.runtime.session import build_session

CALLS = 300


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:8]]
    return (sum(fields[:3]) + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    work = tempfile.mkdtemp(prefix="set-permission-")
    spark = build_session("set-permission", "local[1]", f"{work}/local")
    jvm = spark._jvm  # type: ignore[attr-defined]
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    mode = jvm.org.apache.hadoop.fs.permission.FsPermission(0o644)
    systems = {
        "hadoop (chmod process)": jvm.org.apache.hadoop.fs.RawLocalFileSystem(),
        "fogshift (java.nio)": jvm.fogshift.hadoop.NioLocalFileSystem.Raw(),
    }
    for name, fs in systems.items():
        fs.initialize(jvm.java.net.URI("file:///"), conf)
        path = jvm.org.apache.hadoop.fs.Path(f"{work}/{len(name)}")
        fs.create(path, True).close()
        for _ in range(20):  # warm
            fs.setPermission(path, mode)
        busy, started = machine_busy_s(), time.perf_counter()
        for _ in range(CALLS):
            fs.setPermission(path, mode)
        wall, busy = time.perf_counter() - started, machine_busy_s() - busy
        print(f"{name}: {1000 * wall / CALLS:.2f} ms wall, "
              f"{1000 * busy / CALLS:.2f} ms machine CPU per setPermission")  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
