"""An MLX runner (Apple Silicon's engine, issue 45) is never asked for /slots, which it lacks: the reader says what
it is instead of "an older runner?", and asked its /v1/status instead (the channel that confirms it runs, so its lines
in Ollama's log are believed). A real listener stands on its port and counts what it is asked."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp

from collectors.ollama.discovery import MLX_RUNNER, Runner
from collectors.ollama.runners import MLX_NO_SLOTS, RunnerReader


def test_an_mlx_runner_is_not_asked_for_slots() -> None:
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    async def fetch(kind: str) -> tuple[object, str | None]:
        async with aiohttp.ClientSession() as session:
            reader = RunnerReader("http://127.0.0.1:9", session, in_flight=list, loaded_models=list)
            return await reader._fetch(Runner(pid=1, port=port, model_path="qwen3:8b-mlx", kind=kind))

    try:
        readings, why = asyncio.run(fetch(MLX_RUNNER))
        assert readings is None and why is not None and why.startswith(MLX_NO_SLOTS) and "HTTP 404" in why
        assert asked == ["/v1/status"]
        readings, why = asyncio.run(fetch("llama-server"))  # the same port as a llama-server: asked, and 404 said
        assert readings is None and why is not None and "HTTP 404" in why and asked == ["/v1/status", "/slots"]
    finally:
        server.shutdown()
