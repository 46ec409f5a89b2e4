"""The single-instance lock, across real processes (the kernel's flock is per open file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.lock import CollectorLock, LockHeldError, lock_path, read_lock
from tests.support.paths import REPO

HOLDER = """
import sys, time
from pathlib import Path
from collectors.lock import CollectorLock
lock = CollectorLock(Path(sys.argv[1]))
lock.acquire(listen="127.0.0.1:5555", ollama_url="http://127.0.0.1:11434", demo=True)
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_no_lock_file_means_nobody(tmp_path: Path) -> None:
    assert read_lock(tmp_path) is None


def test_read_lock_names_the_holder(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    info = read_lock(tmp_path)
    assert info is not None
    assert (info.pid, info.listen, info.ollama_url, info.demo) == (holder.pid, "127.0.0.1:5555", "http://127.0.0.1:11434", True)
    assert abs(info.started_at_unix_s - time.time()) < 60
    assert json.loads(lock_path(tmp_path).read_text())["pid"] == holder.pid


def test_second_acquire_fails_naming_the_holder(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    with pytest.raises(LockHeldError) as err:
        CollectorLock(tmp_path).acquire(listen="x:1", ollama_url="http://y", retry_s=0.1)
    assert err.value.holder is not None and err.value.holder.pid == holder.pid
    assert f"process {holder.pid}" in str(err.value)
    assert "--data" in str(err.value)


def test_sigkilled_holder_leaves_a_free_lock(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    assert lock_path(tmp_path).read_text()  # the stale details are still in the file...
    assert read_lock(tmp_path) is None  # ...but nobody holds the lock
    lock = CollectorLock(tmp_path)
    info = lock.acquire(listen="127.0.0.1:1", ollama_url="http://z")
    try:
        assert info.pid == os.getpid()
        assert read_lock(tmp_path) is not None  # another open file of ours still sees the exclusive lock
    finally:
        lock.release()
    assert read_lock(tmp_path) is None
    assert lock_path(tmp_path).read_text() == ""


def test_update_rewrites_the_details(tmp_path: Path) -> None:
    with CollectorLock(tmp_path) as lock:
        first = lock.acquire(listen="127.0.0.1:0", ollama_url="http://a")
        second = lock.update(listen="127.0.0.1:43210", ollama_url="http://a")
        assert second.started_at_unix_s == first.started_at_unix_s
        info = read_lock(tmp_path)
        assert info is not None and info.listen == "127.0.0.1:43210"
    assert not lock.held


def test_a_deleted_lock_file_does_not_let_a_second_collector_in(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    lock_path(tmp_path).unlink()  # a user or a cleanup script removes the file under a running collector
    info = read_lock(tmp_path)
    assert info is not None and info.pid is None  # still held (by the folder's lock), details unknown
    with pytest.raises(LockHeldError):
        CollectorLock(tmp_path).acquire(listen="x:1", ollama_url="http://y", retry_s=0.1)
    holder.kill()
    holder.wait(timeout=10)
    assert read_lock(tmp_path) is None  # the holder's death frees the folder too
    with CollectorLock(tmp_path) as lock:
        assert lock.acquire(listen="x:1", ollama_url="http://y").pid == os.getpid()
