"""One client streams a generation through the proxy while another sends a ~31 MB request body.

Used by ``tests/collectors/proxy/test_proxy_request_body_stall.py`` (asserts the stream never waits on the
body's decoding) and ``bench/request_body_stall.py`` (prints the stall with the decoding on the event
loop and off it). The upstream is ``tests.support.scripted_upstream`` (it never decodes a body, as Ollama
stalls no other client while it decodes one); the proxy runs in its own process; the clients are plain
``http.client`` in threads that only read and stamp.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from collectors.proxy.recording import RECORD_ID_HEADER
from tests.support.scripted_upstream import LINES_HEADER, STEP_S

BODY_BYTES = 31 << 20  # under Limits.max_kept_body_bytes (32 MiB): the body is kept and decoded whole
STREAM_LINES = 500  # ~5 s at the upstream's 10 ms step, plus three parse times (lines_for): the stream outlasts the body
LINES_BEFORE_BODY = 20  # the big request starts once the stream is flowing


def _filled(template: dict[str, Any], key: str, item: Any) -> dict[str, Any]:
    """``template`` with ``key`` a list of ``item`` long enough to make the body ~BODY_BYTES."""
    one = len(json.dumps(item)) + 2
    return {**template, key: [item] * (BODY_BYTES // one)}


def vision_body() -> tuple[str, bytes]:
    """/api/generate with one image, base64 in the body, as Ollama's vision clients send it."""
    image = base64.b64encode(random.Random(1).randbytes(BODY_BYTES * 3 // 4 - 1024)).decode()
    return "/api/generate", json.dumps({"model": "llava", "prompt": "What is in this picture?", "images": [image]}).encode()


def context_body() -> tuple[str, bytes]:
    """/api/generate continuing from a long ``context`` (token ids): one long array of numbers."""
    body = _filled({"model": "llama3.1:8b", "prompt": "go on"}, "context", 12345)
    return "/api/generate", json.dumps(body).encode()


def nested_body() -> tuple[str, bytes]:
    """/api/chat with a long history of small message objects (the slowest shape to decode per byte)."""
    body = _filled({"model": "llama3.1:8b"}, "messages", {"role": "user", "content": "hi there"})
    return "/api/chat", json.dumps(body).encode()


BODIES = {"image": vision_body, "context": context_body, "nested objects": nested_body}


@dataclass
class BigRequestRun:
    chunk_s: list[float] = field(default_factory=list)  # monotonic arrival of each streamed line
    body_sent_s: float | None = None  # the big request's first byte written
    body_done_s: float | None = None  # its whole body written (the proxy decodes it from then on)
    big_record_id: str = ""
    big_reply: bytes = b""
    errors: list[str] = field(default_factory=list)

    def max_gap_s(self, start_s: float, end_s: float) -> float:
        """The longest wait between consecutive stream lines, counting gaps that overlap [start_s, end_s]."""
        gaps = [b - a for a, b in zip(self.chunk_s, self.chunk_s[1:], strict=False) if b >= start_s and a <= end_s]
        return max(gaps, default=0.0)


def _connection(base_url: str) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)


def run(base_url: str, path: str, body: bytes | None, *, lines: int = STREAM_LINES) -> BigRequestRun:
    """Stream ``lines`` lines; with a ``body``, POST it to ``path`` while they flow."""
    out = BigRequestRun()
    flowing = threading.Event()

    def stream() -> None:
        conn = _connection(base_url)
        try:
            conn.request("POST", "/api/generate", b'{"model": "scripted", "prompt": "hi"}', {LINES_HEADER: str(lines)})
            r = conn.getresponse()
            while r.readline():
                out.chunk_s.append(time.monotonic())
                if len(out.chunk_s) == LINES_BEFORE_BODY:
                    flowing.set()
        except Exception as exc:  # reported by the caller's assertions
            out.errors.append(f"stream: {exc!r}")
        finally:
            flowing.set()
            conn.close()

    def send_big() -> None:
        assert body is not None
        flowing.wait(60)
        conn = _connection(base_url)
        try:
            conn.putrequest("POST", path)
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            out.body_sent_s = time.monotonic()
            conn.send(body)
            out.body_done_s = time.monotonic()
            r = conn.getresponse()
            out.big_record_id = r.getheader(RECORD_ID_HEADER) or ""
            out.big_reply = r.read()
            if r.status != 200:
                out.errors.append(f"big request: HTTP {r.status}: {out.big_reply[:200]!r}")
        except Exception as exc:
            out.errors.append(f"big request: {exc!r}")
        finally:
            conn.close()

    threads = [threading.Thread(target=stream, name="big-request-stream")]
    if body is not None:
        threads.append(threading.Thread(target=send_big, name="big-request-body"))
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return out


def lines_for(parse_s: float) -> int:
    """Stream lines that outlast sending the body and twice its decoding, with room to spare."""
    return STREAM_LINES + int(3 * parse_s / STEP_S)


def parse_s(body: bytes) -> float:
    """How long the stdlib decoder takes over ``body`` here and now: what the proxy's loop would stall for."""
    t0 = time.perf_counter()
    json.loads(body)
    return time.perf_counter() - t0
