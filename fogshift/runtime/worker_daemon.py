"""The daemon Spark forks its Python workers from, with their imports done once.

Spark starts one daemon per kind of Python worker (``python -m pyspark.daemon MODULE``) and
forks a child from it for each piece of work. For a Python data source that includes
planning: every micro-batch of every query forks a fresh child to plan the read
(``plan_data_source_read``) and one to plan the write (``write_into_data_source``), and
those children are not kept. Spark's daemon imports nothing before it forks, so each such
child imported pyarrow, numpy, nats and fogshift anew: measured on a 2-core node, ~0.9 s of
CPU per micro-batch went to Python workers for a filter of a few dozen events — the most
expensive part of every batch, whatever its size.

This daemon imports what the children need before it forks, so a child starts with it
loaded (copy-on-write). Spark's daemon avoids that because pandas and pyarrow start threads
on import, and a fork copies only the calling thread: a lock held by another thread at the
fork stays held in the child forever. The two threads they start are switched off here,
before the imports (OpenBLAS's pool through ``OPENBLAS_NUM_THREADS``, jemalloc's background
thread through ``JE_ARROW_MALLOC_CONF``; neither does anything a worker needs), and
:func:`main` checks that the process still has a single thread before it serves: if an
import started one anyway, it says which and runs Spark's own daemon instead.

Spark's ``spark.python.daemon.module`` reaches only the task workers' daemon (the planners'
daemons are started as ``pyspark.daemon`` whatever it says), so the interpreter wrapper
Spark starts every daemon with (:mod:`fogshift.runtime.session`) runs this module in place
of ``pyspark.daemon``, with the same arguments: the worker module first.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import traceback
from typing import Any

#: Environment that keeps the preloaded libraries single-threaded (set before they load).
SINGLE_THREADED = {
    "OPENBLAS_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}

#: What every kind of worker imports: Arrow (the planners and the workers exchange Arrow
#: batches) and the fogshift modules its data sources are pickled by reference from.
COMMON = (
    "numpy",
    "pyarrow",
    "nats",
    "fogshift.broker.datasource",
    "fogshift.runtime.csv_io",
)

#: What the task workers (``pyspark.worker``: mapInPandas, transformWithStateInPandas, the
#: data source readers and writers) import besides.
TASK_WORKER = (
    "pandas",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.streaming.stateful_processor",
    "fogshift.runtime.engine",
    "fogshift.runtime.kinds",
)


def modules_for(worker_module: str) -> tuple[str, ...]:
    """What a daemon serving ``worker_module`` preloads: the module itself, first."""
    extra = TASK_WORKER if worker_module == "pyspark.worker" else ()
    return (worker_module, *COMMON, *extra)


def threads() -> list[str]:
    """The names of this process's threads, native ones included (Linux)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # not Linux: nothing to check
        return ["main"]
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as handle:
                names.append(handle.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return names


def preload(modules: tuple[str, ...]) -> list[str]:
    """Import ``modules`` single-threaded; the ones that could not be imported.

    A module that fails to import is left to the worker that needs it (which then reports
    the error as Spark's own daemon would); preloading is an optimisation only.
    """
    for name, value in SINGLE_THREADED.items():
        os.environ.setdefault(name, value)
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            missing.append(name)
    return missing


#: The kernel's OOM killer takes the process with the highest score first; at the maximum,
#: a worker goes before the node's JVM, agent or broker (see :func:`prefer_oom_kill`).
OOM_SCORE_ADJ = 1000


def prefer_oom_kill() -> bool:
    """Have the kernel's OOM killer take this process and its children (the workers) first.

    One event can make its worker take all the memory (nothing bounds an event's memory).
    Left to itself, the OOM killer may take the node's JVM instead, which stops the node:
    its PEs are restored elsewhere, where the same event does the same. A worker killed
    instead is a crashed worker, and :mod:`fogshift.runtime.crashes` dead-letters an event
    that its worker died in twice. Raising one's own score needs no privilege.

    Returns:
        Whether the score was set (not on a system without ``/proc``).
    """
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write(str(OOM_SCORE_ADJ))
    except OSError:
        return False
    return True


#: What a forked worker's socket raises once Spark closed it: the task it served was
#: killed (its query stopped mid-batch, as a stop, a pause or a migration's origin does).
CLOSED_BY_SPARK = (BrokenPipeError, ConnectionResetError)


class QuietTraceback:
    """Spark's daemon's ``traceback`` module without the trace of a worker whose socket
    Spark closed: the daemon printed it (before the worker exits 1, as it still does), and
    in the node's log it read as a failure after every such stop. Any other trace stays."""

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)

    def print_exc(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(sys.exc_info()[1], CLOSED_BY_SPARK):
            return
        traceback.print_exc(*args, **kwargs)


def main() -> None:
    """Preload what the worker module (first argument) needs, check there is still one
    thread, then run Spark's daemon."""
    worker_module = sys.argv[1] if len(sys.argv) > 1 else "pyspark.worker"
    prefer_oom_kill()  # (first: it holds for Spark's own daemon below too, across the exec)
    modules = modules_for(worker_module)
    preload(modules)
    running = threads()
    if len(running) > 1:
        # Spark's own daemon then, as if this one had never run: slower, never unsafe.
        sys.stderr.write(
            f"fogshift worker daemon: importing {', '.join(modules)} started threads "
            f"{running}, and forking workers from it could deadlock them; running Spark's "
            "own daemon instead\n"
        )
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    # Spark's daemon runs a full ``gc.collect()`` in a reused worker after every task; with
    # pandas, pyarrow and pyspark preloaded that walks ~100,000 objects, 40-150 ms of CPU a
    # time, several times per micro-batch (it was most of the workers' CPU). What is loaded
    # now lives as long as the process: frozen, a collection skips it (and the children's
    # copy-on-write pages stay shared, since a collection no longer touches them).
    gc.freeze()
    daemon.traceback = QuietTraceback()  # type: ignore[assignment]
    daemon.manager()


if __name__ == "__main__":
    main()
