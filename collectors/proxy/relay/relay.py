"""The relay that joins the two sides: it listens, admits client connections within their bounds (cutting an idle
or slow one to make room), keeps idle upstream connections for the next client connection, watches timeouts, and
stops."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

from collectors.beat import until_next_beat_s
from collectors.proxy.bind import BACKLOG, exclusive_socket
from collectors.proxy.limits import Limits, fd_soft_limit
from collectors.proxy.refusals import Refusals
from collectors.proxy.relay.client_side import ClientSide
from collectors.proxy.relay.exchange import Route, Target
from collectors.proxy.relay.upstream_side import UpstreamSide

MAX_IDLE_UPSTREAMS = 64  # kept-alive connections to Ollama waiting for the next client connection


def _victim(crowd: set[ClientSide]) -> ClientSide | None:
    """Whom to cut for a new connection: the longest-waiting idle one, else the oldest slow body, else none."""
    waiting = [c for c in crowd if c.evictable()]
    if waiting:
        return min(waiting, key=lambda c: c.waiting_since_ns)
    now_ns = time.monotonic_ns()
    oldest: ClientSide | None = None
    oldest_ns = now_ns
    for c in crowd:
        since_ns = c.slow_body_since_ns(now_ns)
        if since_ns is not None and since_ns <= oldest_ns:
            oldest, oldest_ns = c, since_ns
    return oldest


class Relay:
    """Listen on host:port and relay every request to where ``route`` says."""

    def __init__(self, route: Route, limits: Limits | None = None) -> None:
        self.route = route
        self.limits = limits or Limits()
        self.clients: set[ClientSide] = set()
        self.by_addr: dict[str, set[ClientSide]] = {}
        self.max_clients = self.limits.connection_cap(fd_soft_limit())
        self.kept_bytes = 0  # request body bytes kept for recording, of all bodies still arriving
        self.refusals = Refusals(self.limits.refusal_warnings_per_minute)
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: dict[Target, list[UpstreamSide]] = {}

    async def start(self, host: str, port: int) -> int:
        """Bind and serve; returns the port (``port`` 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        self.max_clients = self.limits.connection_cap(fd_soft_limit())
        sock = exclusive_socket(host, port)  # Windows: no second process may bind the port (collectors/proxy/bind.py)
        if sock is not None:
            self._server = await loop.create_server(lambda: ClientSide(self), sock=sock, backlog=BACKLOG)
        else:
            self._server = await loop.create_server(lambda: ClientSide(self), host, port, reuse_address=True, backlog=BACKLOG)
        self.spawn(self._watch_timeouts())
        return int(self._server.sockets[0].getsockname()[1])

    # -- connection bounds --------------------------------------------------------------------------

    def per_client_cap(self) -> int:
        """Connections one address may hold: never the whole cap, so other addresses always find room."""
        share = int(self.max_clients * self.limits.max_client_share)
        return max(1, min(self.limits.max_connections_per_client, share))

    def kept_room(self) -> int:
        """Bytes more that bodies still arriving may keep for recording, all together."""
        return max(0, self.limits.max_kept_bodies_bytes - self.kept_bytes)

    def admit(self, client: ClientSide) -> None:
        """Take a new client connection; at a bound, make room by closing the longest-waiting idle one, or
        else the one whose request body has been arriving the longest (``Limits.slow_body_s`` at least)."""
        same_addr = self.by_addr.setdefault(client.client_addr, set())
        for crowd, cap in ((same_addr, self.per_client_cap()), (self.clients, self.max_clients)):
            if len(crowd) >= cap:
                victim = _victim(crowd)
                if victim is None:  # every connection has a request running: this one cannot be served
                    whose = "this address's" if crowd is same_addr else "the proxy's"
                    client.refuse_at_bound(f"{len(crowd)} connections open ({whose} bound), each with a request running")
                    return
                self.forget(victim)
                victim.evict()
        self.clients.add(client)
        same_addr.add(client)

    def forget(self, client: ClientSide) -> None:
        self.clients.discard(client)
        same_addr = self.by_addr.get(client.client_addr)
        if same_addr is not None:
            same_addr.discard(client)
            if not same_addr:
                del self.by_addr[client.client_addr]

    async def _watch_timeouts(self) -> None:
        lim = self.limits
        shortest_s = min(lim.head_timeout_s, lim.body_timeout_s, lim.body_rate_window_s, lim.idle_timeout_s)
        interval_s = min(1.0, max(0.05, shortest_s / 4))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(until_next_beat_s(loop.time(), interval_s))  # with the collector's other periodic work
            now_ns = time.monotonic_ns()
            for client in list(self.clients):
                try:
                    client.check_timeouts(now_ns)
                except Exception as exc:  # a hook raised as a request timed out: that connection fails, not this watch
                    client.fail_internal(exc)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def busy(self) -> bool:
        return any(c.requests for c in self.clients)

    # -- idle upstream connections, shared by client connections ------------------------------------

    def put_idle(self, up: UpstreamSide) -> None:
        pool = self._idle.setdefault(up.target, [])
        if self.stopping or len(pool) >= MAX_IDLE_UPSTREAMS:
            up.abort()
        else:
            pool.append(up)

    def take_idle(self, target: Target) -> UpstreamSide | None:
        pool = self._idle.get(target, [])
        while pool:
            up = pool.pop()
            if up.reusable_for(target):
                return up
        return None

    def forget_idle(self, up: UpstreamSide) -> None:
        pool = self._idle.get(up.target)
        if pool and up in pool:
            pool.remove(up)

    async def stop(self, grace_s: float) -> None:
        """Stop listening, let running requests finish for ``grace_s``, then cut the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.stop(now=False)
        for pool in self._idle.values():
            for up in list(pool):
                up.abort()
        self._idle.clear()
        deadline = time.monotonic() + grace_s
        while self.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for client in list(self.clients):
            client.stop(now=True)
        deadline = time.monotonic() + 1.0
        while self.clients and time.monotonic() < deadline:  # connection_lost runs on a later loop turn
            await asyncio.sleep(0.01)
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
