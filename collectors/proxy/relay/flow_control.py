"""When the two sides of one client connection read: every pause and resume of either transport is decided here
(as in uvicorn's protocols/http/flow_control.py), from the flags the two sides' events set."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Protocol

from collectors.proxy.limits import Limits
from collectors.proxy.relay.exchange import RelayedRequest
from collectors.proxy.relay.states import ABORTED, CLOSED, ClientState, UpstreamState


class ReadClient(Protocol):
    """What flow control reads of a client connection (``collectors.proxy.relay.client_side.ClientSide``)."""

    limits: Limits
    state: ClientState
    requests: deque[RelayedRequest]
    queued_bytes: int
    transport: asyncio.Transport | None

    def reading_resumed(self, now_ns: int, paused_ns: int) -> None: ...


class ReadUpstream(Protocol):
    """What flow control reads of an upstream connection (``collectors.proxy.relay.upstream_side.UpstreamSide``)."""

    transport: asyncio.Transport | None
    state: UpstreamState
    reading: bool


class FlowControl:
    """The client is read while there is room for what it sends: its connection still parses, Ollama takes
    the request body as fast as it comes, and nothing waits beyond the pipelining bounds. Ollama is read
    while the client takes the response as fast as it comes and the recording keeps up with it.
    """

    __slots__ = ("backlogged", "client", "client_full", "client_paused", "paused_at_ns", "upstream_full")

    def __init__(self, client: ReadClient) -> None:
        self.client = client
        self.upstream_full = False  # Ollama reads the request body slower than the client sends it
        self.client_full = False  # the client reads the response slower than Ollama sends it
        self.backlogged = False  # over Limits.max_unparsed_bytes of response went to the recording unparsed
        self.client_paused = False
        self.paused_at_ns = 0

    def update_client(self) -> None:
        c = self.client
        bound = c.limits.max_pipelined_bytes
        pause = (
            c.state is ClientState.STOPPED
            or self.upstream_full
            or len(c.requests) > 1  # a pipelined request waits: read no further until it is answered
            or c.queued_bytes > bound
            or (bool(c.requests) and c.requests[0].pending_bytes > bound)
        )
        transport = c.transport
        if pause == self.client_paused or transport is None or transport.is_closing():
            return
        self.client_paused = pause
        now_ns = time.monotonic_ns()
        if pause:
            self.paused_at_ns = now_ns
            transport.pause_reading()
        else:
            c.reading_resumed(now_ns, now_ns - self.paused_at_ns)
            transport.resume_reading()

    def update_upstream(self, up: ReadUpstream) -> None:
        reading = not (self.client_full or self.backlogged)
        if up.transport is None or reading == up.reading or up.state is ABORTED or up.state is CLOSED:
            return
        up.reading = reading
        if reading:
            up.transport.resume_reading()
        else:
            up.transport.pause_reading()
