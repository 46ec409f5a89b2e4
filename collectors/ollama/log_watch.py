"""Told when Ollama's log file changes, so a quiet collector need not look at it four times a second.

The runner reader stamps each log line with the time it was read, and direct generations' times rest on that stamp
being at most one busy step (0.25 s) late. Looking four times a second keeps that bound, at a wake-up of the event
loop each time: on these machines a wake-up costs ~0.3 ms whatever it does, the largest part of an idle collector
(bench/README.md, issue 44). With the kernel's change notification (inotify) the loop sleeps until the log is
written and the line is read at once, so the bound holds with no look at all.

Chosen by capability, not by platform name: ``inotify_simple`` wraps Linux's inotify with ctypes; where libc has no
``inotify_init1`` (macOS, the BSDs) creating one raises ``AttributeError``, where there is no ``termios`` (Windows)
the import fails. Either way ``open_log_watch`` returns None and the reader looks every step, as before.

The folder is watched, not the file, so a rotated or re-created log (Ollama's app keeps ``server-1.log`` ...) is
seen too. Some file systems never notify (a host folder mounted into a container through a virtual machine's
share, network file systems): the runner reader checks a watch against the file now and then and stops trusting
one that stayed silent while the file changed (collectors/ollama/runner_log.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

try:
    from inotify_simple import INotify, flags, parse_events
except ImportError:  # no termios or fcntl: Windows
    INotify = None

if INotify is not None:
    # The file written, its mode or owner changed, or a file of its name moved in, out, created or deleted.
    _FILE_EVENTS = (
        flags.MODIFY | flags.ATTRIB | flags.CLOSE_WRITE | flags.CREATE | flags.DELETE | flags.MOVED_FROM | flags.MOVED_TO
    )
    # The folder itself went, its file system was unmounted, or the kernel's queue overflowed (events were lost).
    _GONE = flags.DELETE_SELF | flags.MOVE_SELF | flags.UNMOUNT | flags.IGNORED
    _OVERFLOW = flags.Q_OVERFLOW

MAX_EVENTS_READ_BYTES = 64 * 1024  # per drain: a flood of events is read over several; each counts as a change


class LogWatch:
    """An inotify watch on the folder of ``path``; ``fileno()`` turns readable when something happened there.

    ``changed()`` drains what the kernel queued (never blocks) and says whether any of it concerns the log.
    ``problem`` is set, and stays, once the watch can tell nothing more (the folder went): its owner closes it.
    """

    def __init__(self, path: Path) -> None:
        assert INotify is not None
        self.path = path
        self.problem: str | None = None
        self._inotify = INotify(nonblocking=True)
        try:
            self._inotify.add_watch(path.parent, _FILE_EVENTS | _GONE)
        except BaseException:
            self._inotify.close()
            raise

    def fileno(self) -> int:
        return self._inotify.fileno()

    def changed(self) -> bool:
        try:
            data = os.read(self.fileno(), MAX_EVENTS_READ_BYTES)
        except BlockingIOError:
            return False
        except OSError as exc:
            self.problem = f"the change watch on {self.path.parent} failed: {exc.strerror or exc}"
            return True
        mine = False
        for event in parse_events(data):
            if event.mask & _GONE:
                self.problem = f"{self.path.parent} was removed or unmounted: its log is looked at every step"
                mine = True
            elif event.mask & _OVERFLOW or event.name == self.path.name:
                mine = True
        return mine

    def close(self) -> None:
        self._inotify.close()


def open_log_watch(path: Path) -> LogWatch | None:
    """A change watch on ``path``'s folder, or None where this system or that folder offers none (then look)."""
    if INotify is None:
        return None
    try:
        return LogWatch(path.resolve())  # a link's target folder: that is where its writes are told
    except AttributeError:  # libc without inotify_init1: macOS, the BSDs
        return None
    except OSError as exc:  # the folder missing or unreadable, or the user's watch limit reached
        # debug: retried every REOPEN_EVERY_S while the folder is missing, and looking instead loses nothing
        log.debug("no change watch on %s (%s): its log is looked at every step", path.parent, exc.strerror or exc)
        return None


class LogNotices:
    """The runner reader's use of a ``LogWatch``: wakes it when its log is written, and stops trusting a watch that
    stayed silent while lines came (``missed``); where no watch works it says so (``working`` False) and the reader
    looks every step."""

    REOPEN_EVERY_S = 10.0  # no watch (the folder not there yet): try again this often

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.watch: LogWatch | None = None
        self.missed = 0  # reads that found lines no notice told of: the watch is then dropped for good
        self.last_s = float("-inf")  # monotonic time of the latest notice concerning the log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: Callable[[], None] = lambda: None
        self._next_open_s = 0.0

    @property
    def working(self) -> bool:
        return self.watch is not None

    def start(self, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]) -> None:
        self._loop, self._wake = loop, wake
        self.keep_open()

    def keep_open(self) -> None:
        """Open the watch where there is none, at most every REOPEN_EVERY_S (cheap to call every step)."""
        now = time.monotonic()
        if self.watch is not None or self.path is None or self.missed or self._loop is None or now < self._next_open_s:
            return
        self._next_open_s = now + self.REOPEN_EVERY_S
        self.watch = open_log_watch(self.path)
        if self.watch is not None:
            self._loop.add_reader(self.watch.fileno(), self._on_ready)

    def _on_ready(self) -> None:
        if self.drain():
            self._wake()

    def drain(self) -> bool:
        """Take what the kernel queued now (on the loop); True when it concerned the log."""
        if self.watch is None:
            return False
        mine = self.watch.changed()
        if mine:
            self.last_s = time.monotonic()
        if self.watch.problem is not None:
            log.info("%s", self.watch.problem)
            self.close()
        return mine

    def check_read(self, began_after_s: float, lines: bool) -> None:
        """A read found ``lines``, and the read before it, begun at ``began_after_s``, had read the file to its end:
        those lines were written since, and a notice must have come since. None came: this file system does not
        notify (a folder shared into a container, a network mount), and the watch is dropped for good."""
        self.drain()
        if self.watch is None or not lines or self.last_s >= began_after_s:
            return
        self.missed += 1
        log.warning("%s was written with no change notice: it is looked at every step from now on", self.path)
        self.close()

    def close(self) -> None:
        if self.watch is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.watch.fileno())
        self.watch.close()
        self.watch = None
