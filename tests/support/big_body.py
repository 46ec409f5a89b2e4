"""One client streams a generation through the proxy while another gets a ~16 MB embeddings reply.

Used by ``tests/collectors/proxy/test_proxy_big_body.py`` (asserts the stream never waits on the big reply's parsing)
and ``bench/big_body_stall.py`` (prints the stall with the parse on the event loop and off it).
Plain ``http.client`` in threads: the clients do nothing but read and stamp, so they take little of
this process's GIL, and the proxy runs in its own process (``start_proxy_process``).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from collectors.proxy.recording import RECORD_ID_HEADER

GEN_MODEL = "llama3.1:8b"
EMBED_MODEL = "nomic-embed-text"
EMBED_INPUTS = 1800  # 768-dim vectors: ~15.7 MB of JSON, just under Limits.max_line_bytes (16 MiB)
STREAM_TOKENS = 600  # ~9 s on sim's rtx-3060: the stream outlasts the embed reply and its parsing
CHUNKS_BEFORE_EMBED = 20  # the embed request starts once the stream is flowing


@dataclass
class BigBodyRun:
    chunk_s: list[float] = field(default_factory=list)  # monotonic arrival of each streamed line
    gen_final: dict[str, Any] = field(default_factory=dict)  # the stream's done:true line
    gen_content_chunks: int = 0
    gen_record_id: str = ""
    embed_sent_s: float | None = None
    embed_done_s: float | None = None  # the reply's last byte read
    embed_body: bytes = b""
    embed_record_id: str = ""
    errors: list[str] = field(default_factory=list)

    def max_gap_s(self, start_s: float, end_s: float) -> float:
        """The longest wait between consecutive stream chunks, counting gaps that overlap [start_s, end_s]."""
        gaps = [b - a for a, b in zip(self.chunk_s, self.chunk_s[1:], strict=False) if b >= start_s and a <= end_s]
        return max(gaps, default=0.0)


def _connection(base_url: str) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)


def _post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> http.client.HTTPResponse:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()


def warm_up(base_url: str) -> None:
    """Load both models, so load time and first-use costs stay out of the measured run."""
    conn = _connection(base_url)
    try:
        for path, body in (
            ("/api/generate", {"model": GEN_MODEL, "prompt": "warm up", "stream": False, "options": {"num_predict": 2}}),
            ("/api/embed", {"model": EMBED_MODEL, "input": ["warm up"]}),
        ):
            r = _post(conn, path, body)
            r.read()
            assert r.status == 200, (path, r.status)
    finally:
        conn.close()


def run(base_url: str, *, embed: bool = True, inputs: int = EMBED_INPUTS, tokens: int = STREAM_TOKENS) -> BigBodyRun:
    """Stream one generation; with ``embed``, fetch the big embeddings reply while it streams."""
    out = BigBodyRun()
    flowing = threading.Event()

    def stream() -> None:
        conn = _connection(base_url)
        try:
            body = {"model": GEN_MODEL, "prompt": "Why is the sky blue?", "options": {"num_predict": tokens, "num_ctx": 2048}}
            r = _post(conn, "/api/generate", body)
            out.gen_record_id = r.getheader(RECORD_ID_HEADER) or ""
            while line := r.readline():
                out.chunk_s.append(time.monotonic())
                obj = json.loads(line)
                out.gen_content_chunks += bool(obj.get("response"))
                if obj.get("done"):
                    out.gen_final = obj
                if len(out.chunk_s) == CHUNKS_BEFORE_EMBED:
                    flowing.set()
        except Exception as exc:  # reported by the caller's assertions
            out.errors.append(f"stream: {exc!r}")
        finally:
            flowing.set()
            conn.close()

    def fetch_embeddings() -> None:
        flowing.wait(60)
        conn = _connection(base_url)
        try:
            texts = [f"passage number {i} about the colour of the sky" for i in range(inputs)]
            out.embed_sent_s = time.monotonic()
            r = _post(conn, "/api/embed", {"model": EMBED_MODEL, "input": texts})
            out.embed_record_id = r.getheader(RECORD_ID_HEADER) or ""
            out.embed_body = r.read()  # raw bytes: decoding here would take this process's GIL
            out.embed_done_s = time.monotonic()
            if r.status != 200:
                out.errors.append(f"embed: HTTP {r.status}: {out.embed_body[:200]!r}")
        except Exception as exc:
            out.errors.append(f"embed: {exc!r}")
        finally:
            conn.close()

    threads = [threading.Thread(target=stream, name="big-body-stream")]
    if embed:
        threads.append(threading.Thread(target=fetch_embeddings, name="big-body-embed"))
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return out


def parse_s(body: bytes) -> float:
    """How long the stdlib decoder takes over ``body`` here and now: what the proxy's loop would stall for."""
    t0 = time.perf_counter()
    json.loads(body)
    return time.perf_counter() - t0
