"""CPU time of process groups."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from fogshift.common.cpu import TICKS, group_cpu_seconds, group_ticks
from fogshift.common.waiting import wait_until


def test_own_group_accumulates_cpu_and_an_absent_group_counts_zero() -> None:
    me = os.getpgid(0)
    before = group_ticks([me, 999_999_999])
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn CPU in this process
        pass
    after = group_ticks([me])
    assert (after[me] - before[me]) / TICKS >= 0.2
    assert before[999_999_999] == 0


def test_cpu_seconds_count_a_child_group_and_its_reaped_children() -> None:
    # The child burns CPU in a grandchild it reaps: its group's total includes that time.
    code = (
        "import subprocess, sys, time\n"
        "subprocess.run([sys.executable, '-c', "
        "'import time\\nt = time.process_time() + 0.3\\nwhile time.process_time() < t: pass'])\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        child = psutil.Process(proc.pid)

        def reaped_and_counted() -> bool:
            # While the grandchild runs it counts as a member; once it has ended it counts
            # only when reaped (a zombie drops out of the sum: a suite run caught 2 ticks).
            return not child.children() and group_cpu_seconds([proc.pid])[proc.pid] >= 0.3

        assert wait_until(reaped_and_counted, 30, describe="the child group's CPU time")
        assert group_ticks([proc.pid])[proc.pid] >= 0.3 * TICKS
    finally:
        proc.kill()
        proc.wait()
