"""Liveness of processes and groups: a zombie counts as gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from fogshift.common.processes import StoppedWatch, alive, group_alive, leads, started_at
from fogshift.common.waiting import wait_until


def _zombie() -> subprocess.Popen[bytes]:
    """A child in a session (and group) of its own that has exited and is not reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    wait_until(
        lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE,
        30,
        describe="the child to exit",
    )
    return proc


def test_this_process_and_its_group_are_alive() -> None:
    assert alive(os.getpid())
    assert group_alive(os.getpgid(0))
    assert leads(os.getpid(), os.getpgid(0))


def test_a_zombie_and_its_group_are_gone_and_so_after_reaping() -> None:
    proc = _zombie()
    try:
        assert not alive(proc.pid)
        assert not group_alive(proc.pid)
    finally:
        proc.wait()
    assert not alive(proc.pid)
    assert not group_alive(proc.pid)


def test_a_running_child_group_is_alive() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        assert alive(proc.pid)
        assert group_alive(proc.pid)
        assert leads(proc.pid, proc.pid)
        # The same pid recorded with another group: a process that got a dead one's pid.
        assert not leads(proc.pid, os.getpgid(0))
    finally:
        proc.kill()
        proc.wait()
    assert not leads(proc.pid, proc.pid)


def test_a_stopped_process_is_called_silent_only_once_stopped_for_a_while() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)  # fmt: skip
    try:
        watch = StoppedWatch(proc.pid, proc.pid, started_at(proc.pid), for_s=0.5)
        assert watch() is None  # running
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, 30,
                   describe="the child to stop")  # fmt: skip
        assert watch() is None  # stopped, not yet for long
        time.sleep(0.6)
        assert f"(pid {proc.pid}) is stopped" in (watch() or "")
        os.kill(proc.pid, signal.SIGCONT)
        wait_until(lambda: psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED, 30,
                   describe="the child to continue")  # fmt: skip
        assert watch() is None  # continued: the count starts again
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, 30,
                   describe="the child to stop again")  # fmt: skip
        assert watch() is None
        time.sleep(0.6)
        assert watch() is not None
        # Unwatched for longer than its time and a second (between two requests), it may
        # have run meanwhile: a stop seen then is counted from then, not from the last one.
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(1.6)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, 30,
                   describe="the child to stop a third time")  # fmt: skip
        assert watch() is None
        # Another process that took the recorded pid's place is not the service.
        other = StoppedWatch(proc.pid, proc.pid, (started_at(proc.pid) or 0) - 60, for_s=0)
        assert other() is None
    finally:
        proc.kill()
        proc.wait()
