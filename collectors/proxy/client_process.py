"""The local process behind a loopback client's socket: its name, pid and user, where this machine lets us see it.

A client on this machine connects from a socket some process owns; the OS's table of connections maps the
client's (address, port) to that process (psutil.net_connections, as ``otop`` does). What that shows depends on
the OS and our rights, so it is chosen by what works, not by the platform's name: where psutil has no
``net_connections`` or the call is refused (macOS without root), nothing is looked up again; where a socket's
owner is hidden (Linux: another user's process, for a collector not run as root), that client's process stays
unknown. Unknown is None, never "" or 0.

Cost: one scan of the table reads every socket and, on Linux, every process's open files (12-60 ms with ~130
sockets on the shared development machine, quiet to busy; ``tests/collectors/proxy/test_client_process.py`` prints
it), so it never runs on the event loop: a single worker thread scans once for every connection waiting, and each
connection is looked up once, its answer kept for its later requests. Both are bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil

from analysis.loopback import is_loopback
from collectors.os_users import user_name

log = logging.getLogger(__name__)

MAX_WAITING_LOOKUPS = 256  # connections waiting for the next scan; a newer one beyond is left unknown
MAX_KEPT_CONNECTIONS = 4096  # answers kept for later requests on the same connection (oldest dropped first)

Address = tuple[str, int]


@dataclass(frozen=True)
class ClientProcess:
    pid: int
    name: str | None  # None: the process ended before its name was read, or it is hidden from us
    user: str | None  # login name (or "uid N"); None: not known


Found = Callable[[ClientProcess | None], None]


def _same(a: Any, b: Address) -> bool:
    """psutil's address tuple (ip, port) against ours; "::ffff:127.0.0.1" and "127.0.0.1" are one socket's two names."""
    if not a or a[1] != b[1]:
        return False
    return bool(a[0] == b[0] or a[0].removeprefix("::ffff:") == b[0].removeprefix("::ffff:"))


def _user_of(proc: psutil.Process) -> str | None:
    uids = getattr(proc, "uids", None)  # POSIX; Windows has username() only
    try:
        if uids is not None:
            return user_name(uids().real)
        return str(proc.username())
    except (psutil.Error, OSError):
        return None


def process_of(pid: int) -> ClientProcess:
    """The pid's name and user, each None where it cannot be read (the process ended, or it is hidden from us)."""
    try:
        proc = psutil.Process(pid)
    except (psutil.Error, OSError):
        return ClientProcess(pid, None, None)
    try:
        name: str | None = proc.name()
    except (psutil.Error, OSError):
        name = None
    return ClientProcess(pid, name, _user_of(proc))


Scan = Callable[[], list[Any]]


def _scan_tcp() -> list[Any]:
    return list(psutil.net_connections(kind="tcp"))


class ClientProcesses:
    """Looks up, once per connection and off the event loop, the process behind each loopback client."""

    def __init__(self, scan: Scan | None = None) -> None:
        self._scan = scan if scan is not None else (_scan_tcp if hasattr(psutil, "net_connections") else None)
        self.unavailable: str | None = None if self._scan is not None else "psutil has no net_connections here"
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[Address, Address]] = {}  # connection → (client's address, ours)
        self._scanning = False
        self._answers: OrderedDict[int, ClientProcess | None] = OrderedDict()  # connection → its process
        self._callbacks: dict[int, list[Found]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None

    def find(self, connection: int, peer: Address | None, ours: Address | None, found: Found) -> bool:
        """Call ``found`` (on this event loop) with the process behind ``peer``, or None where it cannot be known.

        False, and ``found`` never called, when no lookup is made (not a loopback client, lookups unavailable, too
        many waiting): the request's process stays unknown. Never blocks.
        """
        if connection in self._answers:
            self._answers.move_to_end(connection)
            found(self._answers[connection])
            return True
        if connection in self._callbacks:  # asked already: the scan is on its way
            self._callbacks[connection].append(found)
            return True
        if self.unavailable is not None or peer is None or ours is None or not is_loopback(peer[0]):
            return False
        with self._lock:
            if len(self._waiting) >= MAX_WAITING_LOOKUPS:
                return False
            self._waiting[connection] = (peer, ours)
            start = not self._scanning
            self._scanning = True
        self._callbacks[connection] = [found]
        if start:
            self._loop = asyncio.get_running_loop()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="client-process")
            self._pool.submit(self._scan_waiting)
        return True

    def _scan_waiting(self) -> None:
        """Worker thread: one scan for every connection waiting, until none waits."""
        while True:
            with self._lock:
                waiting, self._waiting = self._waiting, {}
                if not waiting:
                    self._scanning = False
                    return
            answers = self._look_up(waiting)
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: no one is waiting
                self._loop.call_soon_threadsafe(self._answer, answers)

    def _look_up(self, waiting: dict[int, tuple[Address, Address]]) -> dict[int, ClientProcess | None]:
        answers: dict[int, ClientProcess | None] = dict.fromkeys(waiting)
        if self.unavailable is not None or self._scan is None:
            return answers
        try:
            table = self._scan()
        except (psutil.AccessDenied, PermissionError) as exc:  # macOS without root: never allowed, stop asking
            self.unavailable = f"the OS refused the table of connections ({exc.__class__.__name__})"
            log.info("client processes are not looked up: %s", self.unavailable)
            return answers
        except (psutil.Error, OSError) as exc:  # a passing failure: these stay unknown, the next may work
            log.debug("the table of connections could not be read: %s", exc)
            return answers
        for connection, (peer, ours) in waiting.items():
            for conn in table:
                if _same(conn.laddr, peer) and _same(conn.raddr, ours):
                    answers[connection] = process_of(conn.pid) if conn.pid else None
                    break
        return answers

    def _answer(self, answers: dict[int, ClientProcess | None]) -> None:
        """On the event loop: keep each answer (bounded) and tell those waiting for it."""
        for connection, process in answers.items():
            self._answers[connection] = process
            while len(self._answers) > MAX_KEPT_CONNECTIONS:
                self._answers.popitem(last=False)
            for found in self._callbacks.pop(connection, []):
                try:
                    found(process)
                except Exception:  # a recording hook failed: the other requests still get theirs
                    log.exception("recording a client's process failed")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
