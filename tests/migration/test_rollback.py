"""A migration's rollback never raises: whatever a step fails with, it reports it (stand-in
agents over real HTTP)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fogshift.common.http import ServiceClient
from fogshift.migration.procedure import roll_back
from fogshift.spec.models import ElementSpec
from tests.orchestrator.standin import standins

HERE = "/pipelines/p/elements/aggregate"
ELEMENT = ElementSpec.model_validate({
    "id": "aggregate", "kind": "window-aggregate", "node": "fog-a", "inputs": ["source"],
    "options": {"field": "value", "window": 3}})  # fmt: skip


def _broker_refuses() -> int:
    # What nats-py raised from a fence while JetStream answered 503 (a broker restart).
    from nats.js.errors import ServiceUnavailableError

    raise ServiceUnavailableError(code=503, description="JetStream not ready")


def _bug() -> int:
    raise KeyError("epoch")


@pytest.mark.parametrize("fence", [_broker_refuses, _bug])
def test_a_fence_that_raises_anything_is_reported_not_raised(fence: Callable[[], int]) -> None:
    with standins("fog-a", "fog-b") as agents:
        agents["fog-b"].fail("DELETE", HERE)  # the target may still write: fence
        clients = {n: ServiceClient(a.url, "t" * 32, n) for n, a in agents.items()}
        undone = roll_back("p", ELEMENT, ("fog-a", clients["fog-a"]),
                           ("fog-b", clients["fog-b"]), 1, fence)  # fmt: skip
    assert undone.resumed is False and undone.epoch == 1
    assert any("running the origin on fog-a again failed" in n for n in undone.notes), undone
    # Never resumed at the old epoch while the target may write.
    assert agents["fog-a"].received("POST", HERE + "/resume") == []
