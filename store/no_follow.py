"""Open a file the collector writes without ever following a symbolic link at its path.

Whoever could place a link where the collector writes (its store, its -wal, its lock file) would make it
overwrite any file it can write. Where the OS offers ``O_NOFOLLOW`` (Linux, macOS) the kernel refuses the link in
the same step as the open. Where it does not (Windows), the path is looked at first (``lstat``) and the opened
file compared with what was looked at (device and inode, which Windows gives as volume and file index): a link
swapped in between is caught after the open, before a byte is written.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class SymlinkRefused(OSError):
    """The path is a symbolic link (or became one while it was opened)."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(errno.ELOOP, "a symbolic link, which the collector never writes through", str(path))


def open_no_follow(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags, mode)`` that never opens through a symbolic link: SymlinkRefused instead."""
    nofollow = getattr(os, "O_NOFOLLOW", None)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if nofollow is not None:
        try:
            return os.open(path, flags | nofollow, mode)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SymlinkRefused(path) from None
            raise
    return _open_checked(path, flags, mode)


def _open_checked(path: Path | str, flags: int, mode: int) -> int:
    """Without O_NOFOLLOW: refuse a link seen before the open, and a file that is not the one seen."""
    try:
        before: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        before = None
    if before is not None and stat.S_ISLNK(before.st_mode):
        raise SymlinkRefused(path)
    if before is None and flags & os.O_CREAT:
        flags |= os.O_EXCL  # it did not exist: create it ourselves, or fail if someone placed anything meanwhile
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        return _open_checked(path, flags & ~os.O_EXCL, mode)  # placed meanwhile: look again
    after = os.fstat(fd)
    now = os.lstat(path)
    if stat.S_ISLNK(now.st_mode) or (now.st_dev, now.st_ino) != (after.st_dev, after.st_ino):
        os.close(fd)
        raise SymlinkRefused(path)
    if before is not None and (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino):
        os.close(fd)
        raise SymlinkRefused(path)
    return fd
