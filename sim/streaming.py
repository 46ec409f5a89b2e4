"""Writing one generation to the client: the same ending on every route, whatever goes wrong.

``sim.server`` (NDJSON) and ``sim.openai_api`` (SSE) differ only in their bytes, a ``WireFormat``;
``EventStream`` consumes the backend's events, applies the one-shot stream faults, records the truth and
ends the request the way Ollama does (docs/ollama-api.md §3 and §8):

* an error before the first byte is an ``ApiError`` (the route answers it with its error shape);
* a ``Failed`` event or an unexpected exception from the backend after the stream started is a final
  error line (status stays 200) -- an unexpected exception is logged with its traceback, as a crashed
  runner would be;
* a client that goes away ends the request, marked ``cancelled``; the backend's generator is closed, so
  the slot is free at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import traceback
from collections.abc import AsyncGenerator
from typing import Any, Protocol

from aiohttp import web

from sim.backend import Done, EngineError, Event, Failed, Loaded, Token
from sim.http import RUNNER_STOPPED, ApiError
from sim.truth import TruthRecord


class WireFormat(Protocol):
    """The bytes of one route's answers."""

    content_type: str

    def token(self, text: str, thinking: bool) -> bytes:
        """One content (or thinking) chunk; empty when the format holds it back (a tool call being parsed)."""
        ...

    def final(self, done: Done, load_ns: int) -> bytes:
        """Everything a stream sends after its last content chunk."""
        ...

    def whole(self, done: Done, load_ns: int, text: str, thinking: str) -> dict[str, Any]:
        """The single JSON object of a ``stream: false`` answer."""
        ...

    def error(self, message: str) -> bytes:
        """The error line that ends a stream already started (status stays 200)."""
        ...

    def malformed(self) -> bytes:
        """A broken chunk (the ``malformed_after_tokens`` fault)."""
        ...


class EventStream:
    """Writes one backend generation to ``request`` in ``fmt``; ``run`` returns the response it sent."""

    def __init__(
        self,
        request: web.Request,
        request_id: str,
        truth: TruthRecord,
        received_ns: int,
        fmt: WireFormat,
        *,
        stream: bool,
        faults: dict[str, Any],
    ) -> None:
        self.request = request
        self.request_id = request_id
        self.truth = truth
        self.received_ns = received_ns
        self.fmt = fmt
        self.stream = stream
        self.faults = faults
        self.resp: web.StreamResponse | None = None

    async def run(self, gen: AsyncGenerator[Event, None]) -> web.StreamResponse:
        try:
            async with contextlib.aclosing(gen):
                return await self._consume(gen)
        except EngineError as e:
            raise ApiError(e.status, e.message) from None
        except ApiError:
            raise
        except asyncio.CancelledError:
            # The client went away (aiohttp cancels the handler): the generator is closed, the slot freed.
            self.truth.cancelled = True
            self.done(None, "client disconnected")
            raise
        except ConnectionError as e:
            self.truth.cancelled = True
            self.done(None, f"client disconnected: {e}")
            return self.resp or web.Response(status=499)
        except Exception as e:  # a backend bug: fail like a crashed runner
            traceback.print_exc(file=sys.stderr)
            return await self._fail(f"{type(e).__name__}: {e}")

    async def _consume(self, gen: AsyncGenerator[Event, None]) -> web.StreamResponse:
        load_ns = 0
        texts: list[str] = []
        thoughts: list[str] = []
        n_written = 0
        async for ev in gen:
            if isinstance(ev, Loaded):
                load_ns = ev.at_ns - self.received_ns
            elif isinstance(ev, Token):
                if ev.eos:
                    continue
                if not self.stream:
                    (thoughts if ev.thinking else texts).append(ev.text)
                    continue
                chunk = self.fmt.token(ev.text, ev.thinking)
                if not chunk:
                    continue
                resp = await self._prepared()
                if self.faults and self.faults.get("cut_inside_token_after_tokens") == n_written:
                    # A runner dying mid-write: the text went out, the chunk never ends.
                    await resp.write(chunk[: len(chunk.rstrip()) - 3])
                    self.done(200, "fault: cut inside a token")
                    if self.request.transport is not None:
                        self.request.transport.close()
                    return resp
                await resp.write(chunk)
                n_written += 1
                self.truth.token_written_ns.append(time.monotonic_ns())
                if self.faults and await self._apply_stream_fault(resp, n_written):
                    return resp
            elif isinstance(ev, Done):
                if not self.stream:
                    body = self.fmt.whole(ev, load_ns, "".join(texts), "".join(thoughts))
                    self.done(200)
                    return web.json_response(body, headers={"X-Sim-Request-Id": self.request_id})
                resp = await self._prepared()
                await resp.write(self.fmt.final(ev, load_ns))
                await resp.write_eof()
                self.done(200)
                return resp
            elif isinstance(ev, Failed):
                return await self._fail(ev.message)
        raise ApiError(500, RUNNER_STOPPED)  # the backend ended without Done or Failed

    async def _fail(self, why: str) -> web.StreamResponse:
        """A runner that stopped: a 500 before the first byte, else a final error line."""
        if self.resp is None:
            raise ApiError(500, RUNNER_STOPPED)
        with contextlib.suppress(ConnectionError):
            await self.resp.write(self.fmt.error(RUNNER_STOPPED))
            await self.resp.write_eof()
        self.done(200, why)
        return self.resp

    async def _prepared(self) -> web.StreamResponse:
        if self.resp is None:
            resp = web.StreamResponse(
                status=200, headers={"Content-Type": self.fmt.content_type, "X-Sim-Request-Id": self.request_id}
            )
            await resp.prepare(self.request)
            self.resp = resp
        return self.resp

    async def _apply_stream_fault(self, resp: web.StreamResponse, n: int) -> bool:
        """True when a fault ended the stream after content chunk ``n``."""
        if self.faults.get("cut_after_tokens") == n:
            self.done(200, "fault: cut")
            if self.request.transport is not None:
                self.request.transport.close()
            return True
        if self.faults.get("malformed_after_tokens") == n:
            await resp.write(self.fmt.malformed())
            await resp.write_eof()
            self.done(200, "fault: malformed")
            return True
        if self.faults.get("error_after_tokens") == n:
            await resp.write(self.fmt.error(RUNNER_STOPPED))
            await resp.write_eof()
            self.done(200, RUNNER_STOPPED)
            return True
        return False

    def done(self, status: int | None, error: str | None = None) -> None:
        """Record how the request ended."""
        self.truth.status = status
        self.truth.error = error
        self.truth.done_ns = time.monotonic_ns()
