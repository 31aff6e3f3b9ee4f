"""Killing and restarting a test cluster's orchestrator, and stopping it at a named step.

The orchestrator is a process of its own (``fogshift up`` starts it in its own process
group); ``fogshift up`` on a cluster whose orchestrator died starts just that one again. A
test cluster's orchestrator reads the test hook file :attr:`Cluster.pause_file`
(``FOGSHIFT_TEST_PAUSE_FILE``) at every step of an operation: :func:`pause_at` writes
``<kind>:<phase>`` there, and the running orchestrator stops right after the journal recorded
that phase, so a test can SIGKILL it there deterministically.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, Cluster, group_alive, pgids_of


def orchestrator_log(cluster: Cluster) -> Path:
    return cluster.home / "logs" / "orchestrator.log"


def kill_orchestrator(cluster: Cluster) -> None:
    """SIGKILL the cluster's orchestrator (its whole process group) and wait until it is gone."""
    pgid = pgids_of(cluster.home)[0]
    os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while group_alive(pgid):
        assert time.monotonic() < deadline, "the orchestrator outlived SIGKILL"
        time.sleep(0.05)


def pause_at(cluster: Cluster, point: str) -> int:
    """Make the cluster's running orchestrator stop at ``point`` (``<kind>:<phase>``) of its
    next operation that reaches it; return where its log stands (for :func:`wait_logged`).
    A test that asks this must end with :func:`restart_orchestrator` (or
    :func:`release_pause`, which does it when needed)."""
    since = orchestrator_log(cluster).stat().st_size
    cluster.pause_file.write_text(point)
    return since


def release_pause(cluster: Cluster) -> None:
    """After a test: no stop asked for any more, and an orchestrator that stopped at one
    (the test failed before it killed it) replaced by one that recovers its operation."""
    if cluster.pause_file.exists():
        restart_orchestrator(cluster)


def restart_orchestrator(cluster: Cluster) -> int:
    """SIGKILL the orchestrator, wherever it is, and start a new one with `fogshift up`,
    asked to stop nowhere (its recovery goes through the same steps).

    Returns:
        Where the orchestrator log stood before the new one started (for :func:`wait_logged`).
    """
    cluster.pause_file.unlink(missing_ok=True)
    kill_orchestrator(cluster)
    since = orchestrator_log(cluster).stat().st_size
    cluster.up()  # the cluster's own `up`: it starts only what died
    return since


def start_cli(cluster: Cluster, *args: str, stderr_to: Path | None = None) -> subprocess.Popen[str]:
    """Run ``fogshift ARGS --home HOME`` in the background (e.g. an operation to interrupt).
    Its stderr goes to the file ``stderr_to`` if given (for a test to read what it said while
    it runs), else to a pipe like its stdout."""
    if stderr_to is None:
        return subprocess.Popen(
            [sys.executable, "-m", "fogshift.cli.main", *args, "--home", str(cluster.home)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
    with stderr_to.open("w") as err:  # (the child holds its own copy of the descriptor)
        return subprocess.Popen(
            [sys.executable, "-m", "fogshift.cli.main", *args, "--home", str(cluster.home)],
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
        )  # fmt: skip


def wait_logged(cluster: Cluster, text: str, since: int, timeout_s: float = 240) -> str:
    """Wait until the orchestrator log, past offset ``since``, holds ``text``; return that part."""
    deadline = time.monotonic() + timeout_s
    while True:
        logged = orchestrator_log(cluster).read_text(errors="replace")[since:]
        if text in logged:
            return logged
        assert time.monotonic() < deadline, f"the orchestrator never logged {text!r}:\n{logged}"
        time.sleep(0.1)
