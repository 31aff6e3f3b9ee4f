"""Which nodes' node-level checkpoints count as failing or stopped (pure logic)."""

from __future__ import annotations

from fogshift.contracts import ElementInfo, Heartbeat, NodeCheckpoint, PEState
from fogshift.orchestrator.config import OrchestratorConfig, WarningLimits
from fogshift.orchestrator.deployment import node_warnings

NOW = 10_000.0
INTERVAL = 5.0
DEFAULTS = WarningLimits()
LIMIT = DEFAULTS.stall_intervals * INTERVAL + DEFAULTS.stall_slack_s


def _beat(
    age_s: float | None, *elements: ElementInfo, interval: float | None = INTERVAL
) -> Heartbeat:
    return Heartbeat(url="http://127.0.0.1:1", ready=True, elements=list(elements),
                     checkpoint_interval_s=interval, snapshots_age_s=age_s)  # fmt: skip


def _pe(last_batch: int, snapshot_batch: int | None, snapshot_age_s: float) -> ElementInfo:
    newest = (
        NodeCheckpoint(
            id="b1", batch=snapshot_batch, progress=0, created=NOW - snapshot_age_s, bytes=1
        )
        if snapshot_batch is not None
        else None
    )
    return ElementInfo(pipeline="p", element="agg", state=PEState.RUNNING, last_batch=last_batch,
                       node_checkpoint=newest)  # fmt: skip


def test_a_node_that_snapshots_on_time_has_no_warning() -> None:
    fresh = _pe(last_batch=40, snapshot_batch=38, snapshot_age_s=INTERVAL)
    idle = _pe(last_batch=7, snapshot_batch=7, snapshot_age_s=10 * LIMIT)  # nothing new
    assert node_warnings(_beat(1.0, fresh, idle), heard_s=0.5, now=NOW, limits=DEFAULTS) == []
    assert node_warnings(_beat(None), heard_s=0.5, now=NOW, limits=DEFAULTS) == []  # no round yet


def test_a_round_that_stopped_coming_counts_from_the_heartbeat_it_was_heard_in() -> None:
    # Within the limit by the node's report, beyond it by the time since it was heard.
    (warning,) = node_warnings(_beat(LIMIT - 1), heard_s=2.0, now=NOW, limits=DEFAULTS)
    assert warning == (
        f"node-level checkpoints stopped: the last round ended {LIMIT + 1:.0f} s ago "
        f"(one every {INTERVAL:g} s)"
    )
    assert node_warnings(_beat(LIMIT - 1), heard_s=0.5, now=NOW, limits=DEFAULTS) == []


def test_a_pe_whose_snapshots_fail_or_lag_its_batches_is_named() -> None:
    failing = _pe(last_batch=40, snapshot_batch=20, snapshot_age_s=1.0).model_copy(
        update={"snapshot_error": "OSError: [Errno 28] No space left on device"}
    )
    (warning,) = node_warnings(_beat(1.0, failing), heard_s=0.0, now=NOW, limits=DEFAULTS)
    assert (
        warning
        == "node-level checkpoint of p/agg failed: OSError: [Errno 28] No space left on device"
    )
    lagging = _pe(last_batch=40, snapshot_batch=20, snapshot_age_s=LIMIT + 5)
    (warning,) = node_warnings(_beat(1.0, lagging), heard_s=0.0, now=NOW, limits=DEFAULTS)
    assert warning.startswith(f"node-level checkpoint of p/agg is {LIMIT + 5:.0f} s old (batch 20)")
    assert warning.endswith("while it committed batch 40 (one every 5 s)")
    # A failed PE is not snapshotted: its state says what is wrong, not a lagging snapshot.
    failed = lagging.model_copy(update={"state": PEState.FAILED})
    assert node_warnings(_beat(1.0, failed), heard_s=0.0, now=NOW, limits=DEFAULTS) == []


def test_an_agent_that_does_not_say_its_interval_is_not_judged() -> None:
    lagging = _pe(last_batch=40, snapshot_batch=20, snapshot_age_s=10 * LIMIT)
    assert (
        node_warnings(
            _beat(10 * LIMIT, lagging, interval=None), heard_s=0.0, now=NOW, limits=DEFAULTS
        )
        == []
    )


def test_a_nearly_full_disk_is_told_before_checkpoints_fail() -> None:
    gib = 1 << 30
    low = WarningLimits(low_disk_bytes=gib)

    def disk(free: int, total: int) -> list[str]:
        beat = _beat(1.0).model_copy(update={"disk_free_bytes": free, "disk_total_bytes": total})
        return node_warnings(beat, heard_s=0.0, now=NOW, limits=low)

    assert disk(20 * gib, 100 * gib) == []
    (warning,) = disk(gib // 2, 100 * gib)  # under the bytes
    assert warning.startswith("disk nearly full: 0.5 GiB free of 100 GiB")
    assert disk(40 * gib, 1000 * gib)  # under 5 % of a large disk
    assert node_warnings(_beat(1.0), heard_s=0.0, now=NOW, limits=low) == []  # unknown


def test_a_small_disk_is_warned_of_when_it_fills_not_from_its_start() -> None:
    # A fog node on a 400 MiB disk was "nearly full" from its start (under 1 GiB free), and
    # full it looked the same: on a disk under 4 GiB the bytes' limit is a quarter of it.
    mib = 1 << 20
    low = WarningLimits(low_disk_bytes=1 << 30, low_disk_share=0.05)

    def disk(free: int, total: int) -> list[str]:
        beat = _beat(1.0).model_copy(update={"disk_free_bytes": free, "disk_total_bytes": total})
        return node_warnings(beat, heard_s=0.0, now=NOW, limits=low)

    assert disk(370 * mib, 400 * mib) == []
    assert disk(101 * mib, 400 * mib) == []
    (warning,) = disk(99 * mib, 400 * mib)
    assert warning.startswith("disk nearly full: 99 MiB free of 400 MiB ("), warning
    (warning,) = disk(0, 400 * mib)
    assert warning.startswith("disk nearly full: 0 MiB free of 400 MiB ("), warning
    (warning,) = disk(900 * mib, 8 * 1024 * mib)  # 1 GiB is under a quarter of 8 GiB
    assert warning.startswith("disk nearly full: 0.9 GiB free of 8 GiB")


def test_the_limits_are_the_orchestrators_settings() -> None:
    assert WarningLimits() == WarningLimits(
        **{f: OrchestratorConfig.default(f) for f in WarningLimits.model_fields}
    )
    lagging = _pe(last_batch=40, snapshot_batch=20, snapshot_age_s=40.0)
    assert node_warnings(_beat(1.0, lagging), heard_s=0.0, now=NOW, limits=DEFAULTS) == []
    strict = WarningLimits(stall_intervals=1, stall_slack_s=0)  # 5 s
    (warning,) = node_warnings(_beat(1.0, lagging), heard_s=0.0, now=NOW, limits=strict)
    assert "is 40 s old (batch 20)" in warning
    config = OrchestratorConfig(home="/tmp/x", port=1, token="t" * 16, broker_file="/tmp/b",
                                stall_slack_s=1, low_disk_share=0.5)  # fmt: skip
    assert config.warning_limits == WarningLimits(stall_slack_s=1, low_disk_share=0.5)
