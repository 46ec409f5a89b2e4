"""A plain TCP relay on uvloop, no HTTP at all: the floor under any Python proxy's CPU per chunk.

    python bench/tcp_pipe.py UPSTREAM_HOST:PORT LISTEN_PORT

Each client connection gets its own upstream connection; bytes go through untouched.
``bench/proxy_overhead.py`` runs it next to the recording proxy and nginx.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

try:
    import uvloop
except ImportError:  # pragma: no cover - the bench wants uvloop, like the collector
    uvloop = None  # type: ignore[assignment]


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.pending: list[bytes] | None = []
        self.upstream: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(lambda: _Upstream(self.transport), self.host, self.port)
        self.upstream = cast(asyncio.Transport, upstream)
        for data in self.pending or []:
            self.upstream.write(data)
        self.pending = None

    def data_received(self, data: bytes) -> None:
        if self.pending is not None:
            self.pending.append(data)
        elif self.upstream is not None:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def _serve(host: str, port: int, listen_port: int) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: _Client(host, port), "127.0.0.1", listen_port)
    await asyncio.Event().wait()


def main() -> int:
    host, _, port = sys.argv[1].rpartition(":")
    coro = _serve(host, int(port), int(sys.argv[2]))
    if uvloop is not None:
        uvloop.run(coro)
    else:
        asyncio.run(coro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
