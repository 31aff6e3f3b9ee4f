"""Liveness of processes and groups: a zombie counts as gone."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from fogshift.common.processes import alive, group_alive, leads
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
