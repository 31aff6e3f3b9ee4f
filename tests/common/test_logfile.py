"""Log files kept bounded (fogshift.common.logfile): rotated under a live writer without a hole
or a line out of order, copies kept and modes kept, and a real orchestrator keeping its own
log and its broker's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fogshift.broker.server import BrokerProcess, free_port
from fogshift.common import logfile
from fogshift.common.http import ServiceClient
from fogshift.common.logfile import LogKeeper, copy_name, rotate_if_large
from fogshift.common.waiting import wait_until
from fogshift.exceptions import Unavailable
from tests.conftest import ROOT

#: A writer as `up` starts a service: its output appended to a file, a numbered line at a time.
WRITER = """
import sys, time
for n in range(int(sys.argv[1])):
    sys.stdout.write(f"line {n:06d} " + "x" * 40 + "\\n")
    sys.stdout.flush()
    if n % 50 == 0:
        time.sleep(0.001)
"""


def test_a_large_file_is_copied_aside_and_emptied_and_old_copies_dropped(tmp_path: Path) -> None:
    log = tmp_path / "node-fog-a.log"
    assert rotate_if_large(log, 10) is None  # not there: nothing to do
    log.write_text("a\n" * 5)
    os.chmod(log, 0o600)
    assert rotate_if_large(log, 10) is None  # not over the limit
    log.write_text("a\n" * 6)
    assert rotate_if_large(log, 0) is None  # 0: never
    for text in ("b\n" * 6, "c\n" * 6, "d\n" * 6):
        log.write_text(text)
        assert rotate_if_large(log, 10) is True
        assert log.read_text() == "" and copy_name(log, 1).read_text() == text
    # Two copies kept (FILE.1 the newest), the oldest dropped; their modes the file's.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "node-fog-a.log",
        "node-fog-a.log.1",
        "node-fog-a.log.2",
    ]
    assert copy_name(log, 2).read_text() == "c\n" * 6
    assert {os.stat(p).st_mode & 0o777 for p in tmp_path.iterdir()} == {0o600}
    # Found far past the limit (an upgrade's log): its newest whole lines within it only.
    log.write_text("".join(f"{n:03d}\n" for n in range(100)))
    assert rotate_if_large(log, 10) is True
    assert copy_name(log, 1).read_text() == "098\n099\n"


def test_a_copy_the_disk_has_no_room_for_is_not_made_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "orchestrator.log"
    log.write_text("x\n" * 100)
    copy_name(log, 1).write_text("older\n")
    usage = logfile.shutil.disk_usage(tmp_path)
    # A full disk: emptied without a copy (the older copy stays), and told.
    monkeypatch.setattr(logfile.shutil, "disk_usage", lambda path: usage._replace(free=0))
    keeper = LogKeeper(lambda: [log], max_bytes=10)
    assert keeper.check() == [log]
    assert log.read_text() == "" and copy_name(log, 1).read_text() == "older\n"
    monkeypatch.undo()
    # A copy that fails midway (its disk filled meanwhile) leaves no partial copy; the
    # file is kept whole for the next look, and the keeper goes on.
    log.write_text("y\n" * 100)

    def full(source: object, copy: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(logfile, "_copy_to_end", full)
    assert keeper.check() == []
    assert log.read_text() == "y\n" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orchestrator.log", "orchestrator.log.1"]
    assert copy_name(log, 1).read_text() == "older\n"  # the copies as they were


def test_a_file_rotated_under_its_writer_has_no_hole_and_no_line_out_of_order(
    tmp_path: Path,
) -> None:
    log = tmp_path / "orchestrator.log"
    lines = 20_000
    with open(log, "ab") as out:  # (as `up` opens a service's log)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(lines)], stdout=out)
    # Looked at from here only (no thread of its own): every rotation is counted.
    keeper = LogKeeper(lambda: [log], max_bytes=64 * 1024)
    rotated: list[Path] = []
    try:
        while writer.poll() is None:
            rotated += keeper.check()
            time.sleep(0.002)
    finally:
        writer.wait()
    assert len(rotated) >= 3, "the writer outran no limit: nothing was tested"
    numbers = []
    for path in (copy_name(log, 2), copy_name(log, 1), log):
        data = path.read_bytes()
        # Emptied under a writer at its own offset, the file would start with zeros.
        assert b"\0" not in data, path
        found = [int(n) for n in re.findall(rb"^line (\d{6}) x{40}$", data, re.MULTILINE)]
        assert len(found) == data.count(b"\n"), f"{path}: a torn line"
        numbers += found
    # In order across the copies and the file; the last line written is there.
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert numbers[-1] == lines - 1


def test_a_process_knows_the_file_its_output_appends_to(tmp_path: Path) -> None:
    probe = "from fogshift.common.logfile import output_file; print(output_file(), file=sys.stderr)"

    def seen(mode: str | None) -> str:
        target = tmp_path / f"out-{mode}.log"
        with open(target, mode) if mode else open(os.devnull, "wb") as out:
            done = subprocess.run(
                [sys.executable, "-c", f"import sys; {probe}"],
                stdout=out if mode else subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                check=True,
            )
        return done.stderr.strip()

    assert seen("ab") == str(tmp_path / "out-ab.log")
    assert seen("wb") == "None"  # written at its own offset: emptying it would leave a hole
    assert seen(None) == "None"  # a pipe


@pytest.mark.integration  # a real nats-server and a real orchestrator process
def test_the_orchestrator_keeps_its_log_and_its_brokers(
    tmp_path: Path, nats_server: BrokerProcess
) -> None:
    # Its log and the broker's, grown past the limit before it starts (a crash loop's): it
    # copies both aside at its start; the broker's store failure, logged before the copy,
    # is still told by `GET /health`.
    logs = tmp_path / "logs"
    logs.mkdir()
    own = logs / "orchestrator.log"
    own.write_text("an earlier run's line\n" * 150)  # (past the limit, not twice: all copied)
    broker = tmp_path / "broker"
    broker.mkdir()
    failed = "[1] [ERR] JetStream out of File resources, will be DISABLED"
    broker_log = broker / "nats.log"
    broker_log.write_text(f"[1] [INF] Starting nats-server\n{failed}\n" + "[1] [ERR] x\n" * 250)
    before = {path: path.read_text() for path in (own, broker_log)}
    token = tmp_path / "token"
    token.write_text("o" * 32)
    port = free_port()
    with open(own, "ab") as out:
        orchestrator = subprocess.Popen(
            [sys.executable, "-m", "fogshift.cli.main", "serve-orchestrator",
             "--home", str(tmp_path), "--port", str(port), "--token-file", str(token),
             "--broker-file", str(nats_server.address.save(tmp_path / "broker.json")),
             "--broker-config", str(broker / "nats.conf")],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**os.environ, "FOGSHIFT_LOG_MAX_BYTES": "2048"},
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        with ServiceClient(url, "o" * 32, "the orchestrator", timeout_s=5) as client:
            health = wait_until(lambda: _health(client), 60, describe="the orchestrator's health")
        for path, text in before.items():
            assert copy_name(path, 1).read_text() == text, path
            assert "an earlier run's line" not in path.read_text()
        said = own.read_text()
        assert "orchestrator started: pid" in said
        for path in (own, broker_log):
            assert f"log {path} was over 2048 bytes: copied to {path.name}.1" in said, said
        assert any(failed in warning for warning in health["warnings"]), health
    finally:
        os.killpg(orchestrator.pid, 9)
        orchestrator.wait()


def _health(client: ServiceClient) -> dict | None:
    """``GET /health``, or ``None`` while the orchestrator does not answer yet."""
    try:
        return dict(client.get("/health"))
    except Unavailable:
        return None
