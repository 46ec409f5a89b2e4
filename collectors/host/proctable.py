"""Every process's name and owner, read once per process instead of once per scan.

A scan of the process table by name (which are Ollama's, which are runners) used to read every process's
``/proc/PID/stat`` and ``status`` each time; most processes live for hours. ``ProcessNames.refresh()`` lists
``/proc`` (one directory read) and reads only the processes it has not seen before, and a young one again until
its name settles: a forked child shows its parent's name until it execs.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

NAME_SETTLE_S = 5.0  # a new process's name is read again this long (a forked child execs soon after)
Owner = int | str  # who runs a process: its real uid where the OS has uids, else its user name (Windows)


def owner_of(proc: psutil.Process) -> Owner:
    """``proc``'s real uid where psutil has uids (POSIX), else its user name (``username()``, every OS)."""
    uids = getattr(proc, "uids", None)
    return uids().real if uids is not None else proc.username()


def bare_name(name: str) -> str:
    """A program's name without Windows' ``.exe`` (``llama-server.exe`` is ``llama-server``)."""
    return name[:-4] if name.lower().endswith(".exe") else name


@dataclass(frozen=True)
class Named:
    """What was read of one process: its name, real uid (None: unreadable) and start time (with the pid, which
    process it is; 0.0 when it could not be read)."""

    name: str
    uid: Owner | None  # read only by a table made with owners=True
    create_time: float
    first_seen_s: float  # on the table's clock


class ProcessNames:
    """pid → ``Named`` for every process now; ``reads`` counts the processes read (what a refresh cost).

    A pid that ends and is given to a new process between two refreshes would keep the old one's name. Refreshed
    every second (the process watch) that takes a whole wrap of the pids within one second; refreshed seldom
    (discovery, only when a runner came or went), ``owners=True`` also looks at when each ``/proc/PID`` entry was
    made (one ``stat`` per process, no file read): a new process under an old pid has a new entry."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, settle_s: float = NAME_SETTLE_S, *, owners: bool = False
    ) -> None:
        self._known: dict[int, Named] = {}
        self._entries: dict[int, int] = {}  # pid → its /proc entry's ctime (ns), with owners=True on Linux
        self._clock = clock
        self._settle_s = settle_s
        self._owners = owners
        self._check_entries = owners and os.path.isdir("/proc/self")
        self.reads = 0
        self.generation = 0  # changes whenever a refresh found a process come, go or read differently

    def refresh(self) -> dict[int, Named]:
        now_s = self._clock()
        pids = set(psutil.pids())
        for pid in self._known.keys() - pids:
            del self._known[pid]
            self._entries.pop(pid, None)
            self.generation += 1
        for pid in pids:
            known = self._known.get(pid)
            if known is not None and self._check_entries and self._entry_changed(pid):
                known = None  # another process under the same pid
            if known is None or now_s - known.first_seen_s < self._settle_s:
                named = self._read(pid, known.first_seen_s if known else now_s)
                if named != known:
                    self.generation += 1
                self._known[pid] = named
        return dict(self._known)

    def _entry_changed(self, pid: int) -> bool:
        try:
            ctime_ns = os.stat(f"/proc/{pid}").st_ctime_ns
        except OSError:
            return True
        return self._entries.get(pid) != ctime_ns

    def _read(self, pid: int, first_seen_s: float) -> Named:
        self.reads += 1
        if self._check_entries:
            with contextlib.suppress(OSError):
                self._entries[pid] = os.stat(f"/proc/{pid}").st_ctime_ns
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                name = proc.name()
                uid: Owner | None = None
                if self._owners:
                    with contextlib.suppress(psutil.Error, OSError):
                        uid = owner_of(proc)
                return Named(name, uid, proc.create_time(), first_seen_s)
        except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
            return Named("", None, 0.0, first_seen_s)
