"""The data folder's lock and the no-follow open where fcntl and O_NOFOLLOW are missing (issue 45)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from collectors import file_lock
from store.no_follow import SymlinkRefused, open_no_follow
from tests.support.stripped_python import stripped_env

REPO = Path(__file__).resolve().parents[2]

HOLD = r"""
import sys
from pathlib import Path
from collectors.file_lock import BACKEND
from collectors.lock import CollectorLock
lock = CollectorLock(Path(sys.argv[1]))
lock.acquire(listen="127.0.0.1:1", ollama_url="http://127.0.0.1:2")
print(BACKEND.name, flush=True)
sys.stdin.read()
"""

PROBE = r"""
import json, sys
from pathlib import Path
from collectors.lock import CollectorLock, LockHeldError, read_lock
info = read_lock(Path(sys.argv[1]))
try:
    CollectorLock(Path(sys.argv[1])).acquire(listen="x", ollama_url="y", retry_s=0.1)
    second = "acquired"
except LockHeldError:
    second = "refused"
print(json.dumps({"pid": info.pid if info else None, "second": second}))
"""


class _Missing:
    def __init__(self) -> None:
        raise ImportError("not on this OS")


def test_the_backend_is_chosen_by_what_this_python_has() -> None:
    assert file_lock.choose().name == "flock"  # this machine's full Python
    assert file_lock.choose(kinds=(_Missing, _Missing), has_lockf=True).name == "lockf"  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="can lock no file"):
        file_lock.choose(kinds=(_Missing,), has_lockf=False)  # type: ignore[arg-type]


def _probe(data: Path, env: dict[str, str]) -> dict[str, object]:
    run = subprocess.run([sys.executable, "-c", PROBE, str(data)], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got: dict[str, object] = json.loads(run.stdout)
    return got


def test_without_fcntl_one_collector_holds_the_folder_until_it_dies(tmp_path: Path) -> None:
    """In the stripped Python (lockf): a second process sees the holder and cannot take the lock; killed with
    SIGKILL, the holder's lock is gone with it (no stale lock file keeps the folder)."""
    env = stripped_env(tmp_path / "py")
    data = tmp_path / "data"
    data.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data)], env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "lockf"
        assert _probe(data, env) == {"pid": holder.pid, "second": "refused"}
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert _probe(data, env) == {"pid": None, "second": "acquired"}


def test_without_o_nofollow_a_link_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "O_NOFOLLOW")
    target = tmp_path / "precious"
    target.write_text("keep")
    link = tmp_path / "collector.lock"
    link.symlink_to(target)
    with pytest.raises(SymlinkRefused):
        open_no_follow(link, os.O_RDWR | os.O_CREAT)
    assert target.read_text() == "keep"
    fresh = tmp_path / "fresh"
    fd = open_no_follow(fresh, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"ok")
    os.close(fd)
    fd = open_no_follow(fresh, os.O_RDONLY)  # an existing regular file opens again
    assert os.read(fd, 10) == b"ok"
    os.close(fd)
