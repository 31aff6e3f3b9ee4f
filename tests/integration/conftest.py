"""Integration tests: every input feeder a test started stops with the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.helpers import stop_feeders


@pytest.fixture(autouse=True)
def _stop_feeders() -> Iterator[None]:
    yield
    stop_feeders()
