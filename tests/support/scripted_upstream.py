"""An Ollama stand-in that never parses request bodies and answers as a request header tells it.

Run as its own process (``start_scripted_upstream()``; ``python -m tests.support.scripted_upstream --port N``).
Two uses:

* Timing the proxy alone: sim (Python) decodes every request body on its own event loop, so a 31 MB body
  would stall sim's other streams as long as it stalls the proxy's. Ollama (Go) decodes in the request's
  goroutine and stalls nobody; so does this server: it reads a body without decoding it and streams a
  steady NDJSON generation (``STEP_S`` per line) to every other client meanwhile.
* Hostile answers a real Ollama would rarely send, chosen by the ``X-Scripted-Reply`` request header:
  ``steady`` (the default; ``X-Scripted-Lines`` lines, or with none one plain answer), ``surrogates`` (a
  stream whose reply text and done_reason carry a lone UTF-16 surrogate, escaped as a JS upstream cutting
  mid-emoji writes it), ``surrogate-error`` (a token, then an ``{"error": ...}`` line carrying one),
  ``error:N`` (two tokens, then an ``{"error": ...}`` line of N characters, status 200).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.support.sim_process import REPO_ROOT, free_port

REPLY_HEADER = "X-Scripted-Reply"
LINES_HEADER = "X-Scripted-Lines"
STEP_S = 0.01  # between two lines of a steady stream (a fast GPU's decode step)
MODEL = "scripted"
LONE_SURROGATE = "\ud83d"  # the first half of 😀 (U+1F600), alone


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"  # ensure_ascii: a lone surrogate goes out escaped, as from JS


def _final(tokens: int, done_reason: str = "stop") -> dict[str, Any]:
    return {
        "model": MODEL,
        "created_at": "2026-01-01T00:00:00Z",
        "response": "",
        "done": True,
        "done_reason": done_reason,
        "total_duration": 10_000_000,
        "load_duration": 1_000,
        "prompt_eval_count": 4,
        "prompt_eval_duration": 1_000_000,
        "eval_count": tokens,
        "eval_duration": max(1, tokens) * int(STEP_S * 1e9),
    }


def _token(text: str) -> dict[str, Any]:
    return {"model": MODEL, "created_at": "2026-01-01T00:00:00Z", "response": text, "done": False}


async def _stream(request: web.Request, lines: list[dict[str, Any]], step_s: float) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    for obj in lines:
        await resp.write(_line(obj))
        await asyncio.sleep(step_s)
    await resp.write_eof()
    return resp


async def _generate(request: web.Request) -> web.StreamResponse:
    body_bytes = 0
    async for piece in request.content.iter_any():  # counted, never kept nor decoded: Ollama's decoding stalls no one
        body_bytes += len(piece)
    reply = request.headers.get(REPLY_HEADER, "steady")
    if reply == "steady":
        n = int(request.headers.get(LINES_HEADER, "0") or 0)
        if n == 0:  # a plain answer, whatever the body held (its size says it was read)
            return web.json_response({**_final(1), "response": f"read {body_bytes} bytes"})
        return await _stream(request, [*(_token(f"t{i} ") for i in range(n)), _final(n)], STEP_S)
    if reply == "surrogates":
        tokens = [_token("cut mid-emoji: "), _token(LONE_SURROGATE), _token(" end")]
        return await _stream(request, [*tokens, _final(3, done_reason=f"stop{LONE_SURROGATE}")], 0)
    if reply == "surrogate-error":
        return await _stream(request, [_token("a"), {"error": f"the runner broke {LONE_SURROGATE}"}], 0)
    if reply.startswith("error:"):
        chars = int(reply.partition(":")[2])
        return await _stream(request, [_token("a"), _token("b"), {"error": "E" * chars}], 0)
    return web.json_response({"error": f"unknown {REPLY_HEADER}: {reply!r}"}, status=400)


async def _root(_: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


def build_app() -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    for path in ("/api/generate", "/api/chat", "/api/embed", "/v1/chat/completions", "/v1/completions"):
        app.router.add_post(path, _generate)
    app.router.add_get("/", _root)
    return app


@dataclass
class ScriptedUpstream:
    base_url: str
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def start_scripted_upstream() -> Iterator[ScriptedUpstream]:
    port = free_port()
    cmd = [sys.executable, "-m", "tests.support.scripted_upstream", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"scripted upstream exited with {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("scripted upstream did not listen within 30 s")
            time.sleep(0.05)
        yield ScriptedUpstream(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    web.run_app(build_app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
