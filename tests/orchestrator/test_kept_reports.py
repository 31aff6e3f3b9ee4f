"""Each PE's last migration and restore report outlives its orchestrator: one started again
(a crash, `up` after `down`) showed none."""

from __future__ import annotations

from pathlib import Path

from fogshift.contracts import (
    MigrationMode,
    MigrationReport,
    MigrationStatus,
    PipelineState,
    RestoreReport,
    RestoreStatus,
)
from fogshift.orchestrator.service import Orchestrator
from fogshift.spec import parse_spec
from tests.orchestrator.standin import SPEC, offline_config


def orchestrator(home: Path) -> Orchestrator:
    return Orchestrator(offline_config(home))


def test_reports_outlive_the_orchestrator_and_go_with_a_deploy_again(tmp_path: Path) -> None:
    first = orchestrator(tmp_path)
    first.registry.put_pipeline(parse_spec(SPEC, tmp_path), PipelineState.RUNNING)
    restored = RestoreReport(pipeline="p", element="aggregate", target="cloud", epoch=2,
                             status=RestoreStatus.RESTORED, reprocessed_events=142)  # fmt: skip
    moved = MigrationReport(pipeline="p", element="source", origin="cloud", target="fog-b",
                            mode=MigrationMode.PRECOPY, status=MigrationStatus.MIGRATED,
                            downtime_ms=812.5, epoch=3)  # fmt: skip
    first.last_restore[("p", "aggregate")] = restored
    first.last_migration[("p", "source")] = moved
    first.last_restore[("gone", "x")] = restored  # of no pipeline: not kept
    first.close()

    again = orchestrator(tmp_path)
    assert dict(again.last_restore) == {("p", "aggregate"): restored}
    (kept,) = again.last_migration.items()  # (its trace's clock is the new process's)
    assert kept[0] == ("p", "source") and kept[1].model_dump() == moved.model_dump()
    # A deploy of the name again starts without them, in the registry too.
    again._forget_runs("p")
    again.close()
    third = orchestrator(tmp_path)
    assert dict(third.last_restore) == {} and dict(third.last_migration) == {}
    third.close()
