"""A tiny Ollama stand-in that records every request it reads, parsed by h11 (not llhttp, the relay's parser).

Each complete request is answered at once with a JSON body naming it (its sequence
number, method, target and body length), so a test can tell which request a client's
answer belongs to. Bytes h11 cannot parse are kept in ``errors``: the relay must never
send such bytes upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import h11


@dataclass
class Seen:
    seq: int
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes  # its first KEPT_BODY_BYTES
    body_len: int


KEPT_BODY_BYTES = 1 << 20  # floods send hundreds of MB: keep the start only


@dataclass
class RecordingUpstream:
    port: int = 0
    requests: list[Seen] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    incomplete: int = 0  # connections that ended inside a request (the relay dropped them: fine)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.errors.clear()
            self.incomplete = 0

    def targets(self) -> list[str]:
        with self._lock:
            return [r.target for r in self.requests]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        method = target = ""
        headers: list[tuple[str, str]] = []
        body: list[bytes] = []
        body_len = 0
        eof = False
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(1 << 16)
                    eof = not data
                    conn.receive_data(data)
                    if not data and conn.their_state is h11.IDLE:
                        break
                    continue
                if isinstance(event, h11.Request):
                    method, target = event.method.decode(), event.target.decode("latin-1")
                    headers = [(k.decode(), v.decode("latin-1")) for k, v in event.headers]
                    body, body_len = [], 0
                elif isinstance(event, h11.Data):
                    if body_len < KEPT_BODY_BYTES:
                        body.append(bytes(event.data))
                    body_len += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    with self._lock:
                        seq = len(self.requests)
                        self.requests.append(Seen(seq, method, target, headers, b"".join(body), body_len))
                    payload = json.dumps({"seq": seq, "method": method, "target": target, "body_len": body_len}).encode()
                    writer.write(
                        conn.send(
                            h11.Response(
                                status_code=200,
                                headers=[
                                    ("Content-Type", "application/json"),
                                    ("Content-Length", str(len(payload))),
                                    ("X-Upstream-Seq", str(seq)),
                                ],
                            )
                        )
                        or b""
                    )
                    writer.write(conn.send(h11.Data(data=payload)) or b"")
                    writer.write(conn.send(h11.EndOfMessage()) or b"")
                    await writer.drain()
                    if conn.our_state is h11.MUST_CLOSE:
                        break
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    break
        except h11.RemoteProtocolError as exc:
            with self._lock:
                if eof:  # the relay dropped the connection inside a request (its client left or broke off)
                    self.incomplete += 1
                else:
                    self.errors.append(str(exc))
        except (ConnectionError, h11.LocalProtocolError):
            pass
        finally:
            writer.close()


@contextlib.contextmanager
def recording_upstream() -> Iterator[RecordingUpstream]:
    up = RecordingUpstream()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(up._serve, "127.0.0.1", 0)

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    up.port = int(server.sockets[0].getsockname()[1])
    try:
        yield up
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
