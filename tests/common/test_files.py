"""Secret files are 0600 from the moment they exist."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fogshift.broker.client import BrokerAddress
from fogshift.common.files import make_private_dir, write_private


@pytest.fixture
def created(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every file created through ``os.open``, with its mode right after creation; the
    umask is 0 meanwhile, so nothing but the creator's own mode narrows it."""
    seen: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path: str | os.PathLike[str], flags: int, mode: int = 0o777, **kw: object) -> int:
        fd = real_open(path, flags, mode, **kw)  # type: ignore[arg-type]
        if flags & os.O_CREAT:
            seen.append((os.fspath(path), stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    monkeypatch.setattr(os, "open", spy)
    old = os.umask(0)
    try:
        yield seen
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_private_creates_0600_and_replaces_a_wider_file(
    tmp_path: Path, created: list[tuple[str, int]]
) -> None:
    target = tmp_path / "sub" / "token"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o644)
    write_private(target, "s3cret")
    assert target.read_text() == "s3cret" and mode(target) == 0o600
    assert created and all(m == 0o600 for _, m in created), created
    assert sorted(p.name for p in target.parent.iterdir()) == ["token"]  # no temp file left


def test_write_private_refuses_to_follow_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    write_private(tmp_path / "token", "s3cret")
    # The temporary name is random and opened O_EXCL: a link planted under the final name
    # is replaced, not written through.
    (tmp_path / "token").unlink()
    (tmp_path / "token").symlink_to(victim)
    write_private(tmp_path / "token", "s3cret")
    assert victim.read_text() == "untouched"
    assert not (tmp_path / "token").is_symlink() and mode(tmp_path / "token") == 0o600


def test_the_broker_address_file_is_0600_from_the_start(
    tmp_path: Path, created: list[tuple[str, int]]
) -> None:
    path = BrokerAddress("nats://h:1", "u", "pw").save(tmp_path / "broker.json")
    assert mode(path) == 0o600 and BrokerAddress.load(path).password == "pw"
    assert created and all(m == 0o600 for _, m in created), created


def test_a_home_is_made_or_narrowed_to_its_owner_alone(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = make_private_dir(tmp_path / "a" / "home")
        assert stat.S_IMODE(made.stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o755  # (its parents: umask)
        wide = tmp_path / "older"
        wide.mkdir(mode=0o755)
        assert stat.S_IMODE(make_private_dir(wide).stat().st_mode) == 0o700
    finally:
        os.umask(old)


def test_a_home_that_is_a_file_is_refused_with_what_was_expected(tmp_path: Path) -> None:
    # `up --home FILE` (or FILE/sub) ended in a traceback.
    from fogshift.exceptions import InvalidInput

    afile = tmp_path / "afile"
    afile.write_text("")
    for path in (afile, afile / "sub"):
        with pytest.raises(InvalidInput) as refused:
            make_private_dir(path)
        assert refused.value.message.startswith(f"cannot use {str(path)!r} as a folder")
        assert refused.value.received == f"{afile} is a file"
        assert refused.value.hint == "give another --home, or move that file away"


def test_a_home_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Left as it was (say 0777, made by someone else in /tmp): its owner could replace the
    # cluster file written in it, and the next `fogshift status` sent the operator's token
    # to the orchestrator URL it named.
    from fogshift.common import files
    from fogshift.exceptions import InvalidInput

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chmod(theirs, 0o777)
    monkeypatch.setattr(files.os, "geteuid", lambda: os.getuid() + 1)  # (not the owner)
    with pytest.raises(InvalidInput) as refused:
        make_private_dir(theirs)
    assert "belongs to another user" in refused.value.message
    assert refused.value.received == f"a folder of uid {os.getuid()}, mode 777"
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o777  # (nothing changed)


def test_a_home_below_a_folder_others_can_change_is_refused(tmp_path: Path) -> None:
    # /tmp/theirs/sub, theirs 0777 (or another user's): the home was made 0700 and taken,
    # yet whoever can write `theirs` can move `sub` away and put their own in its place.
    from fogshift.exceptions import InvalidInput

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(InvalidInput) as refused:
        make_private_dir(shared / "sub" / "home")
    assert f"the folder {str(shared)!r} above it is writable by others" in refused.value.message
    assert refused.value.received == f"{shared}: uid {os.geteuid()}, gid {os.getegid()}, mode 777"
    assert list(shared.iterdir()) == []  # (refused before anything was made there)
    os.chmod(shared, 0o1777)  # sticky, as /tmp: nobody renames what is not theirs
    assert make_private_dir(shared / "mine").is_dir()
    # Its group may write it: fine when that group is this user's own (umask 002 and a user
    # private group make every folder so), refused when it is another group.
    grouped = tmp_path / "grouped"
    grouped.mkdir()
    os.chmod(grouped, 0o775)
    assert make_private_dir(grouped / "home").is_dir()
    os.chown(grouped, -1, 4242)  # (the suite runs as root)
    with pytest.raises(InvalidInput, match="writable by others"):
        make_private_dir(grouped / "other")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 4242, -1)  # (the suite runs as root)
    with pytest.raises(InvalidInput) as refused:
        make_private_dir(theirs / "home")
    assert f"the folder {str(theirs)!r} above it is another user's" in refused.value.message
