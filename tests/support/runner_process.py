"""The test process as "the Ollama server": it listens on a loopback port (serving /api/version and /api/ps)
and starts runners as its own children, so ``collectors.ollama.discovery`` finds them the way it finds
Ollama's: the listener's pid, then its children named ``llama-server``.

    with OllamaStandIn(models) as ollama, start_llama_server(gguf) as runner: ...
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine_process import REPO_ROOT
from tests.support.ports import free_port

BATCH = 512  # Ollama's default num_batch: prompt progress moves in steps of this
START_TIMEOUT_S = 120.0


def require_llama_server() -> Path:
    """The llama-server binary (found as sim finds it); skips (fails under PHASEWATCH_REQUIRE_ENGINE=1) when it is not built."""
    from sim.gguf_model import EngineUnavailable
    from sim.llama_server_engine import find_llama_server

    try:
        return find_llama_server()
    except EngineUnavailable as exc:
        message = f"runner tests need llama-server: {exc}"
        if os.environ.get("PHASEWATCH_REQUIRE_ENGINE") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def ps_entry(name: str, digest: str, context_length: int = 4096) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "size": 300_000_000,
        "digest": digest,
        "size_vram": 0,
        "details": {"format": "gguf", "family": "gemma3"},
        "expires_at": "2099-01-01T00:00:00Z",
        "context_length": context_length,
    }


@dataclass
class OllamaStandIn:
    """A loopback HTTP server in this process answering /api/version and /api/ps (``models``)."""

    models: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> OllamaStandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/api/ps":
                    body = json.dumps({"models": stand_in.models}).encode()
                elif self.path == "/api/version":
                    body = b'{"version":"0.30.0"}'
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@dataclass
class Child:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _wait_ready(child: Child, path: str | None, timeout_s: float) -> None:
    if path is None:  # nothing to ask: give it a moment to start (or fail)
        time.sleep(0.5)
        if child.proc.poll() is not None:
            raise RuntimeError(f"runner exited with {child.proc.returncode}: {child.log()[-3000:]}")
        return
    deadline = time.monotonic() + timeout_s
    while True:
        if child.proc.poll() is not None:
            raise RuntimeError(f"runner exited with {child.proc.returncode}: {child.log()[-3000:]}")
        try:
            with urllib.request.urlopen(child.base_url + path, timeout=1.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"runner did not answer {path} within {timeout_s:g} s: {child.log()[-3000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def _child(argv: list[str], ready_path: str | None, timeout_s: float) -> Iterator[Child]:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="runner-", suffix=".log", delete=False)  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*argv, "--port", str(port)], stdout=log, stderr=log, cwd=REPO_ROOT)
    child = Child(proc, port, Path(log.name))
    try:
        _wait_ready(child, ready_path, timeout_s)
        yield child
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)


@contextlib.contextmanager
def start_llama_server(gguf: Path, *, ctx: int = 8192, threads: int = 2) -> Iterator[Child]:
    """The real llama-server, as Ollama starts it (flags of llm/llama_server.go), as a child of this process."""
    binary = require_llama_server()
    argv = [
        str(binary),
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--no-webui",
        "--offline",
        "-c",
        str(ctx),
        "-np",
        "1",
        "-b",
        str(BATCH),
        "-ub",
        str(BATCH),
        "-t",
        str(threads),
    ]
    with _child(argv, "/health", START_TIMEOUT_S) as child:
        yield child


@contextlib.contextmanager
def start_bad_runner(mode: str, model_path: Path, *extra: str) -> Iterator[Child]:
    """``slots_server.py`` under the name ``llama-server`` (a symlink to the system Python): a real child
    process that discovery takes for a runner, answering /slots with ``mode`` (404, 501, garbage, html, exit,
    and the hostile ones it lists); ``extra`` arguments follow (``-np 4``, ``--location URL``)."""
    python = sys.executable  # a real binary once resolved (not a launcher script such as pyenv's shim)
    folder = Path(tempfile.mkdtemp(prefix="fake-runner-"))
    link = folder / "llama-server"
    link.symlink_to(os.path.realpath(python))
    script = str(REPO_ROOT / "tests" / "support" / "slots_server.py")
    argv = [str(link), script, "--model", str(model_path), "--mode", mode, *extra]
    try:
        with _child(argv, None if mode == "closed" else "/health", 30.0) as child:
            yield child
    finally:
        shutil.rmtree(folder, ignore_errors=True)
