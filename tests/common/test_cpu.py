"""CPU time of process groups, from /proc."""

from __future__ import annotations

import os
import time

from fogshift.common.cpu import TICKS, group_ticks


def test_own_group_accumulates_cpu_and_an_absent_group_counts_zero() -> None:
    me = os.getpgid(0)
    before = group_ticks([me, 999_999_999])
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn CPU in this process
        pass
    after = group_ticks([me])
    assert (after[me] - before[me]) / TICKS >= 0.2
    assert before[999_999_999] == 0
