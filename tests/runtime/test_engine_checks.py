"""What no event does: a PE that cannot be built fails its start with a clear error."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from fogshift.events import DEFAULT_MAX_RECORD_BYTES, Event
from fogshift.runtime.api import Processor, state
from fogshift.runtime.engine import QueryPlan, check_processor
from fogshift.runtime.exceptions import ElementError
from fogshift.spec.models import ElementSpec


class Strict(Processor):
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        factor: int

    options_model = Options

    def process(self, event: Event) -> dict:
        return {"x": self.config.factor}


#: Released at the end of the test that builds a :class:`Hangs` (its thread then ends).
RELEASE = threading.Event()


class Hangs(Processor):
    """A constructor that waits for a network share that never answers."""

    def __init__(self, options: dict, element_id: str = "") -> None:
        RELEASE.wait()

    def process(self, event: Event) -> None:
        return None


class Explodes(Processor):
    def __init__(self, options: dict, element_id: str = "") -> None:
        raise RuntimeError("no constructor today")

    def process(self, event: Event) -> None:
        return None


class Exits(Processor):
    """sys.exit() in a constructor: it escaped the check (``except Exception``) and ended
    the agent's monitor thread where a restart built it."""

    def __init__(self, options: dict, element_id: str = "") -> None:
        raise SystemExit(3)

    def process(self, event: Event) -> None:
        return None


class Tally(Processor):
    """A defaultdict for state compares equal to its text read back, a plain dict: once
    rebuilt (after a dead letter) its first new key raised KeyError."""

    counts: dict = state(default_factory=lambda: defaultdict(int))

    def process(self, event: Event) -> None:
        return None


class Lazy(Processor):
    """A user's typo: ``proces``. Accepted, it dead-lettered every event."""

    def proces(self, event: Event) -> None:
        return None


def plan(tmp_path: Path, options: dict, key_by: str | None = None) -> QueryPlan:
    element = ElementSpec(
        id="pe1", kind="custom", node="n", inputs=("s",), options=options, key_by=key_by
    )
    return QueryPlan("pl", element, str(tmp_path / "b.json"), str(tmp_path / "cp"))


def test_the_record_limit_has_one_default(tmp_path: Path) -> None:
    assert plan(tmp_path, {"class": "x:Y"}).max_record_bytes == DEFAULT_MAX_RECORD_BYTES


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"class": "no_such_module_here:Missing"},
            "PE 'pe1' of pipeline 'pl': cannot import processor class "
            "'no_such_module_here:Missing': ModuleNotFoundError",
        ),
        (
            {"class": "bad_syntax:Thing", "path": "SYNTAX"},
            "cannot import processor class 'bad_syntax:Thing': SyntaxError",
        ),
        (
            {"class": "tests.runtime.test_engine_checks:Strict", "options": {"factr": 2}},
            "processor 'pe1' (Strict) of pipeline 'pl' cannot be built with its options: "
            "ValidationError",
        ),
        (
            {"class": "tests.runtime.test_engine_checks:Lazy"},
            "processor class 'tests.runtime.test_engine_checks:Lazy' has no process() method",
        ),
        (
            {"class": "tests.runtime.test_engine_checks:Missing"},
            "module 'tests.runtime.test_engine_checks' has no class 'Missing'",
        ),
        (
            {"class": "tests.runtime.test_engine_checks:Exits"},
            "processor 'pe1' (Exits) of pipeline 'pl' cannot be built with its options: SystemExit",
        ),
        (
            {"class": "tests.runtime.test_engine_checks:Tally"},
            "processor 'pe1' (Tally) of pipeline 'pl': its state field 'counts' cannot be "
            "stored as it is: its value is of type defaultdict, which reads back as a plain "
            "dict",
        ),
        (
            {"class": "tests.runtime.test_engine_checks:Explodes"},
            "processor 'pe1' (Explodes) of pipeline 'pl' cannot be built with its options: "
            "RuntimeError: no constructor today",
        ),
    ],
)
def test_a_processor_that_cannot_be_built_fails_its_start(
    tmp_path: Path, options: dict, message: str
) -> None:
    if options.get("path") == "SYNTAX":
        (tmp_path / "bad_syntax.py").write_text("def broken(:\n")
        options = {**options, "path": str(tmp_path)}
    with pytest.raises(ElementError) as err:
        check_processor(plan(tmp_path, options))
    assert message in err.value.message


def test_a_processor_that_can_be_built_passes(tmp_path: Path) -> None:
    options = {"class": "tests.runtime.test_engine_checks:Strict", "options": {"factor": 2}}
    assert check_processor(plan(tmp_path, options)).__qualname__ == "Strict"


def test_a_keyed_processor_must_have_state(tmp_path: Path) -> None:
    options = {"class": "tests.runtime.test_engine_checks:Strict", "options": {"factor": 2}}
    with pytest.raises(ElementError) as err:
        check_processor(plan(tmp_path, options, key_by="patient"))
    assert "has key_by: patient but its processor Strict declares no state" in err.value.message
    assert err.value.hint == "remove key_by, or declare the state to keep per key"


def test_a_processor_whose_constructor_never_returns_fails_its_start_in_bounded_time(
    tmp_path: Path,
) -> None:
    # Before, the check waited for it for good on the agent's only Spark thread, under the
    # agent's lock: no other PE of the node was supervised, deployed or removed again.
    options = {"class": "tests.runtime.test_engine_checks:Hangs"}
    started = time.monotonic()
    try:
        with pytest.raises(ElementError) as err:
            check_processor(plan(tmp_path, options), timeout_s=0.5)
    finally:
        RELEASE.set()
    assert time.monotonic() - started < 5
    assert err.value.message == (
        "processor 'pe1' of pipeline 'pl': importing and building it did not return within 0.5 s"
    )
    assert err.value.hint and "on_assign()" in err.value.hint


def test_a_missing_process_method_or_class_is_refused_with_what_to_name(tmp_path: Path) -> None:
    with pytest.raises(ElementError) as lazy:
        check_processor(plan(tmp_path, {"class": "tests.runtime.test_engine_checks:Lazy"}))
    assert lazy.value.hint == "did you mean to name 'proces' process?"
    assert lazy.value.received == "methods proces of its own"
    with pytest.raises(ElementError) as missing:
        check_processor(plan(tmp_path, {"class": "tests.runtime.test_engine_checks:Explode"}))
    assert missing.value.hint == "did you mean 'Explodes'?"
    assert missing.value.expected is not None and "Explodes, Hangs" in missing.value.expected


def test_a_class_that_cannot_be_imported_says_what_was_expected_and_received(
    tmp_path: Path,
) -> None:
    with pytest.raises(ElementError) as err:
        check_processor(plan(tmp_path, {"class": "no_such_module_here:Missing"}))
    assert err.value.expected is not None and "'no_such_module_here'" in err.value.expected
    assert err.value.received == (
        "ModuleNotFoundError importing 'no_such_module_here' (no `path` in the options)"
    )
    assert err.value.hint is not None
