"""Upstream servers for proxy tests, run on an event loop in a background thread: an aiohttp app with any
handler (over TLS if asked), or a raw socket that answers fixed bytes, to misbehave on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trustme
from aiohttp import web


class LoopThread:
    """An event loop in a background thread, for upstream servers that misbehave on purpose."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[Any], timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@contextlib.contextmanager
def aiohttp_upstream(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]], ca: trustme.CA | None = None, **server_kw: Any
) -> Iterator[int]:
    """A real aiohttp server answering every route with ``handler`` (over TLS with a cert from ``ca``); yields its port."""
    lt = LoopThread()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, **server_kw)
    tls = None
    if ca is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(tls)

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        return int(runner.addresses[0][1])

    try:
        yield lt.run(start())
    finally:
        lt.run(runner.cleanup())
        lt.close()


@contextlib.contextmanager
def raw_upstream(reply: bytes) -> Iterator[int]:
    """A server that reads a request head and answers ``reply`` verbatim, then closes."""
    lt = LoopThread()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(serve, "127.0.0.1", 0)

    server = lt.run(start())
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        lt.close()
