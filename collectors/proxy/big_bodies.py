"""Decode large response chunks and request bodies in a worker process, so the proxy's event loop never waits on them.

Decoding a 16 MB embeddings reply takes the stdlib decoder a second or more, holding the GIL: on the
event loop (or in a thread) every other client's stream would stop being relayed and timestamped for
that long. Chunks longer than ``Limits.big_body_bytes`` come here instead: one worker process, started
on first use, decodes them one at a time with ``analysis.chunks.decode_lean`` (long number arrays
dropped, so what comes back is small). At most ``Limits.max_big_bodies_waiting`` may wait; beyond that,
or when the worker fails or takes longer than ``Limits.big_parse_timeout_s``, the chunk comes back
marked malformed with the reason, so its record is still kept and says why it lacks the body's facts.
Request bodies go the same way (``call``, with ``collectors.proxy.request_facts.describe_body``): a
vision request carries its images base64 in a body of tens of MB. A body reaches the worker through
shared memory, copied a slice at a time, never pickled whole on the proxy's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from multiprocessing.shared_memory import SharedMemory
from typing import Any, TypeVar

from analysis.chunks import Chunk, Decoded, decode_lean, decoded_chunk
from collectors.proxy.limits import Limits

log = logging.getLogger(__name__)

_EXCERPT_BYTES = 80
SHARED_SLICE_BYTES = 256 << 10  # copied into shared memory between two turns of the event loop
T = TypeVar("T")


class NotParsed(Exception):
    """The worker did not run (or finish) a job; the message says why, for the record's notes."""


def _unparsed(chunk: Chunk, why: str) -> Chunk:
    head = chunk.raw[:_EXCERPT_BYTES]
    excerpt = repr(head) + ("…" if len(chunk.raw) > _EXCERPT_BYTES else "")
    # "kind: excerpt", as every problem reads: without --record-text only the kind is kept.
    return Chunk(chunk.t_ns, head, problem=f"not parsed ({why}), {len(chunk.raw)} bytes: {excerpt}")


async def _shared_copy(body: bytes) -> SharedMemory | None:
    """``body`` in a new shared memory block, copied a slice per turn of the event loop; None where none can be
    made (the body then goes pickled). Pickled whole, tens of MB would hold this process's GIL, and so every
    stream, for 0.1-0.25 s on a busy machine; one slice holds it well under a millisecond."""
    if not body:
        return None
    try:
        shared = SharedMemory(create=True, size=len(body))
    except OSError as exc:  # /dev/shm full or absent
        log.warning("no shared memory for a %d-byte body (%r): it goes to the parser process pickled", len(body), exc)
        return None
    try:
        view, buf = memoryview(body), shared.buf
        assert buf is not None  # None only once closed
        for start in range(0, len(body), SHARED_SLICE_BYTES):
            piece = view[start : start + SHARED_SLICE_BYTES]
            buf[start : start + len(piece)] = piece
            await asyncio.sleep(0)
    except BaseException:
        _release(shared)
        raise
    return shared


def _release(shared: SharedMemory | None) -> None:
    if shared is not None:
        with contextlib.suppress(OSError):
            shared.close()
            shared.unlink()


def _on_shared(fn: Callable[..., T], name: str, size: int, *args: Any, **kwargs: Any) -> T:
    """In the worker: ``fn`` over the body in shared memory block ``name``. Attaching registers the block with
    the resource tracker the proxy shares (a no-op: the proxy registered it); the proxy unlinks it."""
    shared = SharedMemory(name)
    try:
        assert shared.buf is not None  # None only once closed
        body = bytes(shared.buf[:size])
    finally:
        shared.close()
    return fn(body, *args, **kwargs)


class BigBodyDecoder:
    """One lazily started worker process and a bounded queue in front of it. Use it on one event loop."""

    def __init__(self, limits: Limits, decode: Callable[[bytes], Decoded] = decode_lean) -> None:
        self._limits = limits
        self._decode = decode  # module-level, so the worker can unpickle it
        self._pool: ProcessPoolExecutor | None = None
        self._waiting = 0  # submitted and not finished in the worker (a timed-out one still counts)
        self._closed = False
        self._inline = False  # no worker could be started here: decode on the caller's thread, as before
        self._futures: set[asyncio.Future[Any]] = set()  # submitted, not finished: close() gives up on them

    @property
    def waiting(self) -> int:
        return self._waiting

    async def decode(self, chunk: Chunk) -> Chunk:
        """``chunk`` (a deferred one) decoded, or marked malformed saying why not. Never raises but on cancellation."""
        try:
            return decoded_chunk(chunk.t_ns, chunk.raw, await self.call(self._decode, chunk.raw))
        except NotParsed as why:
            return _unparsed(chunk, str(why))

    async def call(self, fn: Callable[..., T], body: bytes, *args: Any, **kwargs: Any) -> T:
        """``fn(body, *args, **kwargs)`` in the worker (``fn`` module-level, so the worker can unpickle it), or on
        the caller's thread where no worker can start. Raises ``NotParsed`` saying why it was not run."""
        if self._inline:
            return fn(body, *args, **kwargs)
        if self._closed:
            raise NotParsed("the proxy was stopping")
        if self._waiting >= self._limits.max_big_bodies_waiting:
            raise NotParsed(f"{self._waiting} large bodies already waiting to be parsed (max_big_bodies_waiting)")
        pool = self._pool or self._start()
        if pool is None:
            return fn(body, *args, **kwargs)
        future: asyncio.Future[T] = await self._submit(pool, fn, body, args, kwargs)
        # asyncio.wait neither raises the future's error nor cancels it on timeout: the worker finishes it
        # and only then frees its place in the queue.
        done, _ = await asyncio.wait({future}, timeout=self._limits.big_parse_timeout_s)
        if not done:
            raise NotParsed(f"the parser process took over {self._limits.big_parse_timeout_s:g} s")
        if future.cancelled():
            raise NotParsed("the proxy was stopping")
        exc = future.exception()
        if exc is not None:
            if isinstance(exc, BrokenExecutor):
                self._drop_pool(pool)
            log.warning("the parser process failed on a %d-byte body: %r", len(body), exc)
            raise NotParsed(f"the parser process failed ({type(exc).__name__})")
        return future.result()

    async def _submit(
        self, pool: ProcessPoolExecutor, fn: Callable[..., T], body: bytes, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[T]:
        """Hand ``fn`` and ``body`` to the worker; the body through shared memory where there is some."""
        self._waiting += 1  # the place in the queue is taken while the body is copied
        shared = None
        try:
            shared = await _shared_copy(body)
            if self._closed:
                raise NotParsed("the proxy was stopping")
            job = (fn, body) if shared is None else (_on_shared, fn, shared.name, len(body))
            future: asyncio.Future[T] = asyncio.wrap_future(pool.submit(*job, *args, **kwargs))
        except BaseException as exc:
            self._waiting -= 1
            _release(shared)
            if isinstance(exc, BrokenExecutor | RuntimeError):  # RuntimeError: shut down meanwhile
                self._drop_pool(pool)
                raise NotParsed(f"the parser process failed ({type(exc).__name__})") from None
            raise
        self._futures.add(future)
        future.add_done_callback(self._finished)
        if shared is not None:  # the worker has read it (or never will); unmapping tens of MB takes a while: a thread
            future.add_done_callback(lambda _: asyncio.get_running_loop().run_in_executor(None, _release, shared))
        return future

    def close(self) -> None:
        """Stop the worker after the chunk it is on; chunks still queued come back 'not parsed'."""
        self._closed = True
        for future in list(self._futures):
            future.cancel()  # their callers get "not parsed"; the worker finishes the one it is on
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _finished(self, future: asyncio.Future[Any]) -> None:
        self._futures.discard(future)
        self._waiting -= 1

    def _start(self) -> ProcessPoolExecutor | None:
        # spawn, not fork: the proxy's process has threads (store writer, samplers), and a forked child
        # could inherit a lock held mid-operation.
        try:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        except (OSError, ImportError, NotImplementedError) as exc:  # no process semaphores on this platform
            log.warning("cannot start a parser process (%r): large bodies are parsed on the event loop", exc)
            self._inline = True
            return None
        return self._pool

    def _drop_pool(self, pool: ProcessPoolExecutor) -> None:
        """A broken pool stays broken: the next large chunk starts a fresh one."""
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)
