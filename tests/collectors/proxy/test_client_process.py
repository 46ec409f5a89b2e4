"""``collectors.proxy.client_process``: the local process behind a loopback client's socket, over real sockets.

The OS's real table of connections (psutil) throughout; only where a machine would refuse it (macOS without root,
which cannot exist here) a scan raises psutil's own ``AccessDenied``, as psutil does there.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psutil

from collectors.os_users import user_name
from collectors.proxy.client_process import (
    MAX_WAITING_LOOKUPS,
    ClientProcess,
    ClientProcesses,
    _scan_tcp,
)


@asynccontextmanager
async def _listener() -> AsyncIterator[tuple[str, int]]:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        server.close()


def _counting(scan: Callable[[], list[Any]], scans: list[float]) -> Callable[[], list[Any]]:
    """The real scan, counted and timed."""

    def counted() -> list[Any]:
        t0 = time.perf_counter()
        try:
            return scan()
        finally:
            scans.append(time.perf_counter() - t0)

    return counted


async def _ask(finder: ClientProcesses, connection: int, peer: Any, ours: Any) -> ClientProcess | None:
    answer: asyncio.Future[ClientProcess | None] = asyncio.get_running_loop().create_future()
    assert finder.find(connection, peer, ours, answer.set_result)
    return await asyncio.wait_for(answer, 30)


def test_finds_this_process_and_another_once_per_connection() -> None:
    scans: list[float] = []

    async def main() -> None:
        finder = ClientProcesses(_counting(_scan_tcp, scans))
        async with _listener() as ours:
            mine = socket.create_connection(ours)
            other = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"import socket,sys; s=socket.create_connection({ours!r}); "
                    "print(s.getsockname()[1], flush=True); sys.stdin.read()",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert other.stdout is not None
                other_port = int(await asyncio.to_thread(other.stdout.readline))
                me = await _ask(finder, 1, mine.getsockname()[:2], ours)
                them = await _ask(finder, 2, ("127.0.0.1", other_port), ours)
                again = await _ask(finder, 1, mine.getsockname()[:2], ours)  # a later request on connection 1
            finally:
                other.kill()
                other.wait()
                mine.close()
            finder.close()
        user = user_name(os.getuid())
        assert me == again == ClientProcess(os.getpid(), psutil.Process().name(), user)
        assert them == ClientProcess(other.pid, psutil.Process().name(), user)
        assert len(scans) == 2  # connection 1 was looked up once, not per request

    asyncio.run(main())
    print(f"scan of the connection table: {min(scans) * 1e3:.1f} ms at best, {max(scans) * 1e3:.1f} ms at worst")


def test_only_loopback_clients_are_looked_up() -> None:
    async def main() -> None:
        finder = ClientProcesses()
        assert not finder.find(1, ("192.0.2.7", 40000), ("192.0.2.1", 11435), print)
        assert not finder.find(2, None, ("127.0.0.1", 11435), print)

    asyncio.run(main())


def test_a_socket_no_process_owns_now_is_unknown() -> None:
    async def main() -> None:
        finder = ClientProcesses()
        async with _listener() as ours:
            assert await _ask(finder, 1, ("127.0.0.1", 1), ours) is None  # no such connection in the table

    asyncio.run(main())


def test_refused_table_stops_asking() -> None:
    """macOS without root: psutil.net_connections raises AccessDenied; one refusal and lookups stop, never retried."""
    scans: list[float] = []

    def refused() -> list[Any]:
        raise psutil.AccessDenied(pid=None, name=None, msg="net_connections needs root on macOS")

    async def main() -> None:
        finder = ClientProcesses(_counting(refused, scans))
        async with _listener() as ours:
            assert await _ask(finder, 1, ("127.0.0.1", 5), ours) is None
            assert finder.unavailable is not None and "AccessDenied" in finder.unavailable
            assert not finder.find(2, ("127.0.0.1", 6), ours, print)
        finder.close()

    asyncio.run(main())
    assert len(scans) == 1


def test_waiting_lookups_are_bounded() -> None:
    """Connections flooding in while a scan runs: at most MAX_WAITING_LOOKUPS wait; the rest are left unknown."""
    release = asyncio.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def slow_scan() -> list[Any]:  # the real table, read once the flood is in
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result(30)
            return _scan_tcp()

        finder = ClientProcesses(slow_scan)
        ours = ("127.0.0.1", 9)
        asked = [finder.find(n, ("127.0.0.1", 20000 + n), ours, lambda p: None) for n in range(MAX_WAITING_LOOKUPS + 10)]
        # The first starts the scan; behind it MAX_WAITING_LOOKUPS wait at most (the first is taken already or not).
        assert MAX_WAITING_LOOKUPS <= sum(asked) <= MAX_WAITING_LOOKUPS + 1
        assert not asked[-1]
        release.set()
        finder.close()

    asyncio.run(main())


def test_find_never_blocks_the_loop() -> None:
    """``find`` returns at once while a scan runs (it only queues)."""
    gate = threading.Event()

    def blocked_scan() -> list[Any]:
        gate.wait(30)
        return []

    async def main() -> None:
        finder = ClientProcesses(blocked_scan)
        t0 = time.perf_counter()
        for n in range(50):
            finder.find(n, ("127.0.0.1", 5 + n), ("127.0.0.1", 9), lambda p: None)
        took_s = time.perf_counter() - t0
        gate.set()
        finder.close()
        assert took_s < 0.5  # 50 calls while the scan is held: microseconds each; 0.5 s holds on a busy machine

    asyncio.run(main())
