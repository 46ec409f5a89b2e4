"""One collector per data folder: a lock on ``<data>/collector.lock`` and, where the OS can lock a folder
(``flock``), on the folder itself (collectors/file_lock.py chooses how).

The folder's lock is what keeps a second collector out where it can be taken: a user (or a cleanup script) can
delete the lock file, never the folder while it holds the store (on Windows an open file cannot be deleted).
The holder writes who it is (JSON: pid, listen address, Ollama URL, start time) into the file. ``read_lock`` lets
the Streamlit app find a running collector without opening a socket: the kernel drops a
flock when its process dies, even by SIGKILL, so a lock file left behind by a dead collector reads as "nobody".
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from collectors.file_lock import BACKEND
from store.no_follow import SymlinkRefused
from store.no_follow import open_no_follow as _open_no_follow

LOCK_NAME = "collector.lock"


@dataclass(frozen=True)
class LockInfo:
    """Who holds a data folder. ``pid`` is None if the holder had not yet written its details."""

    pid: int | None
    listen: str  # the proxy's address, e.g. "127.0.0.1:11435"
    ollama_url: str
    started_at_unix_s: float
    data_dir: str
    demo: bool = False
    ollama_log: str = ""  # the Ollama log it reads: a file's path, "the journal of UNIT", or "" for none


class LockHeldError(RuntimeError):
    """Another process holds the data folder; ``holder`` says which, when known."""

    def __init__(self, lock_path: Path, holder: LockInfo | None) -> None:
        self.lock_path = lock_path
        self.holder = holder
        if holder is not None and holder.pid is not None:
            who = f"process {holder.pid} (listening on {holder.listen}, watching {holder.ollama_url})"
        else:
            who = "another process"
        super().__init__(
            f"another collector already records into this data folder: {who} holds {lock_path}; "
            "stop it first, or give a different --data folder"
        )


class UnsafeFileError(RuntimeError):
    """A file the collector writes is a symbolic link (someone could aim it at any of our files)."""


def open_no_follow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a symbolic link at ``path``: UnsafeFileError instead."""
    try:
        return _open_no_follow(path, flags, mode)
    except SymlinkRefused:
        raise UnsafeFileError(
            f"{path} is a symbolic link, which the collector never writes through; delete it (check who made it) and start again"
        ) from None


def write_at_start(fd: int, payload: bytes) -> None:
    """Replace the file's content with ``payload`` (one small write: readers see all of it or nothing)."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, payload)


def read_no_follow(path: Path) -> int | None:
    """A read-only descriptor of ``path``, or None when it is missing or a symbolic link (not our file)."""
    try:
        return _open_no_follow(path, os.O_RDONLY)
    except (FileNotFoundError, SymlinkRefused):
        return None


def lock_path(data_dir: Path | str) -> Path:
    return Path(data_dir) / LOCK_NAME


def _parse(text: str) -> LockInfo | None:
    try:
        raw = json.loads(text)
        return LockInfo(
            pid=int(raw["pid"]),
            listen=str(raw["listen"]),
            ollama_url=str(raw["ollama_url"]),
            started_at_unix_s=float(raw["started_at_unix_s"]),
            data_dir=str(raw["data_dir"]),
            demo=bool(raw.get("demo", False)),
            ollama_log=str(raw.get("ollama_log", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _held_by_other(fd: int) -> bool:
    """Whether another process holds the lock on ``fd``'s file (asked without keeping anything)."""
    return BACKEND.held_by_other(fd)


def _folder_held(data_dir: Path | str) -> bool:
    if not BACKEND.locks_folders:
        return False
    try:
        fd = os.open(data_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return False
    try:
        return _held_by_other(fd)
    finally:
        os.close(fd)


def read_lock(data_dir: Path | str) -> LockInfo | None:
    """The running collector of ``data_dir``, or None when no live process holds the lock.

    Opens no socket and never blocks. Takes a shared lock for an instant to ask the
    kernel whether an exclusive one is held; ``CollectorLock.acquire`` retries briefly
    so that this probe can never make a starting collector fail. A holder whose lock
    file was deleted is still found (through the folder's lock), without its details.
    """
    path = lock_path(data_dir)
    unknown = LockInfo(None, "", "", 0.0, str(data_dir))
    fd = read_no_follow(path)
    if fd is None:
        return unknown if _folder_held(data_dir) else None
    try:
        if not _held_by_other(fd):
            return unknown if _folder_held(data_dir) else None
        # The holder writes its details right after locking; give it a moment.
        deadline = time.monotonic() + 0.5
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            info = _parse(os.read(fd, 65536).decode("utf-8", "replace"))
            if info is not None or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return info or unknown
    finally:
        os.close(fd)


def _lock_exclusive(fd: int, retry_s: float) -> bool:
    """Take the exclusive lock, retrying for ``retry_s`` (a reader's momentary probe may also block it)."""
    deadline = time.monotonic() + retry_s
    while not BACKEND.try_exclusive(fd):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class CollectorLock:
    """The exclusive lock of one data folder, held for the life of the collector."""

    def __init__(self, data_dir: Path) -> None:
        self.path = lock_path(data_dir)
        self._data_dir = data_dir
        self._fd: int | None = None
        self._dir_fd: int | None = None
        self._started_at_unix_s = 0.0

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(
        self, *, listen: str, ollama_url: str, demo: bool = False, retry_s: float = 0.5, ollama_log: str = ""
    ) -> LockInfo:
        """Take the lock and write our details; LockHeldError if another process has it, UnsafeFileError if the
        lock file is a symbolic link."""
        # Both fds are O_CLOEXEC by default: children don't inherit the locks.
        dir_fd = os.open(self._data_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if BACKEND.locks_folders else -1
        fd = -1
        try:
            if dir_fd >= 0 and not _lock_exclusive(dir_fd, retry_s):
                raise LockHeldError(self.path, read_lock(self._data_dir))
            fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
            if not _lock_exclusive(fd, retry_s):
                raise LockHeldError(self.path, read_lock(self._data_dir))
        except BaseException:
            if fd >= 0:
                os.close(fd)
            if dir_fd >= 0:
                os.close(dir_fd)
            raise
        self._fd, self._dir_fd = fd, (dir_fd if dir_fd >= 0 else None)
        self._started_at_unix_s = time.time()
        return self.update(listen=listen, ollama_url=ollama_url, demo=demo, ollama_log=ollama_log)

    def update(self, *, listen: str, ollama_url: str, demo: bool = False, ollama_log: str = "") -> LockInfo:
        """Rewrite our details (e.g. once the real listening port is known)."""
        if self._fd is None:
            raise RuntimeError("lock not held")
        info = LockInfo(
            pid=os.getpid(),
            listen=listen,
            ollama_url=ollama_url,
            started_at_unix_s=self._started_at_unix_s,
            data_dir=str(self._data_dir),
            demo=demo,
            ollama_log=ollama_log,
        )
        write_at_start(self._fd, json.dumps(asdict(info)).encode())
        return info

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a clean stop leaves an empty file: nobody is running
        BACKEND.unlock(fd)
        os.close(fd)
        if self._dir_fd is not None:
            dir_fd, self._dir_fd = self._dir_fd, None
            os.close(dir_fd)  # closing drops the folder's lock

    def __enter__(self) -> CollectorLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
