"""An exclusive lock on an open file that the OS drops when its process dies (even killed), on every OS.

Chosen by what this Python can do, never by the platform's name:

* ``fcntl`` (Linux, macOS): ``flock`` on the whole file; a folder can be locked too, and a probe takes a
  shared lock for an instant;
* ``msvcrt`` (Windows): ``locking`` of one byte far past the file's end, so that readers of the details at
  its start are never blocked by Windows' mandatory locks; a probe tries that byte and gives it back;
* else ``os.lockf`` (a POSIX Python without ``fcntl``): a record lock on that byte; a probe asks whether
  another process holds it (``F_TEST``). Record locks belong to the process and go with any of its
  descriptors of the file, so the holder never opens the file a second time (only other processes read it).
"""

from __future__ import annotations

import errno
import os
from typing import Any, Protocol

LOCK_OFFSET = 1 << 30  # the byte locked where a lock covers a range (never written, never read)
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES, errno.EDEADLK)


class Backend(Protocol):
    name: str
    locks_folders: bool

    def try_exclusive(self, fd: int) -> bool: ...
    def held_by_other(self, fd: int) -> bool: ...
    def unlock(self, fd: int) -> None: ...


class FlockBackend:
    name = "flock"
    locks_folders = True

    def __init__(self) -> None:
        import fcntl

        self._fcntl = fcntl

    def try_exclusive(self, fd: int) -> bool:
        try:
            self._fcntl.flock(fd, self._fcntl.LOCK_EX | self._fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise
            return False

    def held_by_other(self, fd: int) -> bool:
        try:
            self._fcntl.flock(fd, self._fcntl.LOCK_SH | self._fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        self._fcntl.flock(fd, self._fcntl.LOCK_UN)
        return False

    def unlock(self, fd: int) -> None:
        self._fcntl.flock(fd, self._fcntl.LOCK_UN)


class MsvcrtBackend:
    name = "msvcrt"
    locks_folders = False  # Windows opens no folder as a file; a locked file there cannot be deleted either

    def __init__(self) -> None:
        import msvcrt  # type: ignore[import-not-found,unused-ignore]

        self._msvcrt: Any = msvcrt  # Windows' module: typeshed describes it only there

    def _at_byte(self, fd: int, mode: int) -> None:
        os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
        try:
            self._msvcrt.locking(fd, mode, 1)
        finally:
            os.lseek(fd, 0, os.SEEK_SET)

    def try_exclusive(self, fd: int) -> bool:
        try:
            self._at_byte(fd, self._msvcrt.LK_NBLCK)
            return True
        except OSError:
            return False

    def held_by_other(self, fd: int) -> bool:
        if not self.try_exclusive(fd):
            return True
        self.unlock(fd)
        return False

    def unlock(self, fd: int) -> None:
        self._at_byte(fd, self._msvcrt.LK_UNLCK)


class LockfBackend:
    name = "lockf"
    locks_folders = False  # a record lock needs a descriptor open for writing, which a folder never is

    def _at_byte(self, fd: int, command: int) -> None:
        os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
        try:
            os.lockf(fd, command, 1)
        finally:
            os.lseek(fd, 0, os.SEEK_SET)

    def try_exclusive(self, fd: int) -> bool:
        try:
            self._at_byte(fd, os.F_TLOCK)
            return True
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise
            return False

    def held_by_other(self, fd: int) -> bool:
        try:
            self._at_byte(fd, os.F_TEST)
            return False
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise
            return True

    def unlock(self, fd: int) -> None:
        self._at_byte(fd, os.F_ULOCK)


def choose(kinds: tuple[type[Backend], ...] = (FlockBackend, MsvcrtBackend), has_lockf: bool | None = None) -> Backend:
    """The first backend this Python can run: flock, then msvcrt (each imports its module, ImportError where
    absent), then lockf (RuntimeError when none)."""
    for kind in kinds:
        try:
            return kind()
        except ImportError:
            continue
    if hasattr(os, "lockf") if has_lockf is None else has_lockf:
        return LockfBackend()
    raise RuntimeError("this Python can lock no file (no fcntl, msvcrt or os.lockf)")


BACKEND: Backend = choose()
