"""The data folder and the files the collector writes there: another local user cannot aim them at our files.

Issue 25 finding 10: the lock file was opened through a symbolic link (then truncated and written), and a data
folder another user owns (mode 777, in a shared temporary folder) was accepted. Uses a real other OS user
(``nobody``; CI runs as root) and real symbolic links.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.config import SettingsError, prepare_data_dir
from collectors.lock import CollectorLock, UnsafeFileError, lock_path
from store.schema import StoreError, db_path
from store.writer import StoreWriter

OTHER_USER = "nobody"
PRECIOUS = b"a file of ours that nobody else may change\n"


def _victim(folder: Path) -> Path:
    victim = folder / "precious.txt"
    victim.write_bytes(PRECIOUS)
    return victim


def test_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    lock_path(data).symlink_to(victim)
    lock = CollectorLock(data)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        lock.acquire(listen="", ollama_url="http://127.0.0.1:11434")
    lock.release()
    assert victim.read_bytes() == PRECIOUS


def test_store_file_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    for suffix in ("", "-wal"):
        empty = tmp_path / f"empty{suffix}"
        empty.write_bytes(b"")  # SQLite would make a store of an empty file
        link = Path(f"{db_path(data)}{suffix}")
        link.symlink_to(empty)
        with pytest.raises(StoreError, match="symbolic link"):
            StoreWriter(db_path(data))
        assert empty.read_bytes() == b""
        link.unlink()
    assert not db_path(data).is_symlink()


def test_a_folder_every_user_can_write_is_refused_with_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    with pytest.raises(SettingsError, match=r"written by every user.*chmod go-w"):
        prepare_data_dir(data)
    data.chmod(0o755)
    prepare_data_dir(data)  # ours, written only by us


def test_a_new_data_folder_is_private(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"
    prepare_data_dir(data)
    assert data.stat().st_mode & 0o077 == 0


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp (sticky, everyone may write) that the other user can reach."""
    folder = Path(tempfile.mkdtemp(prefix="pw-shared-"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_other_user(script: str, *args: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("making files as another user needs root (CI runs the tests as root)")
    other = pwd.getpwnam(OTHER_USER)
    subprocess.run(
        ["/bin/sh", "-c", script, *args], user=other.pw_uid, group=other.pw_gid, extra_groups=[], check=True, timeout=30, cwd="/"
    )


PLANT = 'mkdir -m 777 "$0" && ln -s "$1" "$0/collector.lock"'  # sh: our Python may be out of the user's reach


def test_a_data_folder_another_user_made_is_refused_and_our_file_untouched(shared_tmp: Path, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    data = shared_tmp / "phasewatch"
    _as_other_user(PLANT, str(data), str(victim))  # the other user plants the folder and a link in it
    assert data.stat().st_uid == pwd.getpwnam(OTHER_USER).pw_uid
    with pytest.raises(SettingsError, match=f"belongs to '{OTHER_USER}'.*folder of your own"):
        prepare_data_dir(data)
    assert victim.read_bytes() == PRECIOUS


def test_a_group_writable_folder_of_a_shared_group_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another group needs root (CI runs the tests as root)")
    data = tmp_path / "data"
    data.mkdir(mode=0o770)
    data.chmod(0o770)
    os.chown(data, -1, pwd.getpwnam(OTHER_USER).pw_gid)  # a group that is not ours
    with pytest.raises(SettingsError, match="written by the group"):
        prepare_data_dir(data)
