"""Claims on a folder: held by one process at a time, let go when the holder dies however it
dies (real processes)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fogshift.common.exceptions import AlreadyRunning
from fogshift.common.locks import claim, exclusive

ROOT = Path(__file__).resolve().parents[2]


def holder(path: Path) -> subprocess.Popen[str]:
    """Another process that takes the claim on ``path`` and keeps it until killed."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from fogshift.common.locks import claim\n"
        f"claim(Path({str(path)!r}), 'a test holder', hint='-')\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def tries(path: Path) -> int:
    """Exit code of another process that tries the claim on ``path``: 0 taken, 3 refused."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from fogshift.common.exceptions import AlreadyRunning\n"
        "from fogshift.common.locks import claim\n"
        "try:\n"
        f"    claim(Path({str(path)!r}), 'a test', hint='-')\n"
        "except AlreadyRunning:\n"
        "    sys.exit(3)\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode


@pytest.fixture
def lock(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "service.lock"


def test_a_claim_another_process_holds_is_refused_until_that_process_is_killed(
    lock: Path,
) -> None:
    other = holder(lock)
    try:
        with pytest.raises(AlreadyRunning) as err:
            claim(lock, "an orchestrator of the cluster under /x", hint="stop the other one")
        assert err.value.message.startswith("an orchestrator of the cluster under /x: ")
        assert str(lock) in err.value.message and err.value.hint == "stop the other one"
        # Which process holds it, as the kernel says, its command on one line.
        said = f"(pid {other.pid}: {Path(sys.executable).name} -c import sys, time from pathlib"
        assert said in err.value.message, err.value.message
        assert "\n" not in err.value.message
        assert err.value.received == f"{lock.name} locked by pid {other.pid}"
        assert err.value.expected and err.value.received
    finally:
        other.kill()  # SIGKILL: nothing of its own lets go; the kernel does
        other.wait()
    claim(lock, "an orchestrator", hint="-").release()
    assert lock.stat().st_mode & 0o777 == 0o600


def test_a_claim_is_taken_again_within_its_process_and_let_go_at_the_outer_end(
    lock: Path,
) -> None:
    # (`up` restarting nodes may call what takes the home's claim again.)
    with exclusive(lock, "a fogshift up", hint="-"):
        with exclusive(lock, "a fogshift down", hint="-"):
            pass
        assert tries(lock) == 3, "the inner end let go of the outer claim"
    assert tries(lock) == 0


def test_another_thread_is_refused_and_a_wait_outlasts_a_holder_that_lets_go(
    lock: Path,
) -> None:
    refused: list[BaseException] = []

    def other_thread() -> None:
        try:
            claim(lock, "a fogshift down", hint="-")
        except AlreadyRunning as exc:
            refused.append(exc)

    with exclusive(lock, "a fogshift up", hint="-"):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(30)
    assert len(refused) == 1, "another thread took a claim this one held"
    # A service started again while its predecessor still exits waits for it to let go.
    other = holder(lock)
    killer = threading.Timer(0.5, other.kill)
    killer.start()
    try:
        claim(lock, "node agent 'fog-a'", hint="-", wait_s=30).release()
    finally:
        killer.cancel()
        other.kill()
        other.wait()


def test_a_holders_command_is_said_as_typed() -> None:
    from fogshift.common.locks import _command

    run = ["/h/.venv/bin/python", "-m", "fogshift.cli.main", "up", "--home", "/h/c"]
    assert _command(run) == "fogshift up --home /h/c"
    assert _command(["/usr/bin/nats-server", "-js"]) == "nats-server -js"
    assert _command(["python", "-c", "x" * 300]).endswith("x…")
    assert len(_command(["python", "-c", "x" * 300])) == 200
