"""A process that looks like Ollama to discovery, with a child that looks like its runner (standard library only).

    ollama serve --listen HOST:PORT --model PATH --digest D --mode MODE [-np N] [--location URL]

Started through a symlink named ``ollama`` (to a Python) as ``ollama serve``, from a folder holding this file as
``serve`` and ``slots_server.py``, and a symlink ``llama-server`` (to the same Python), so its name and command
line are Ollama's: ``ollama serve``, with a child ``llama-server --port P --model PATH``. It listens on HOST:PORT
(answering ``/``, ``/api/version``, ``/api/ps`` with the model's digest, ``/api/tags``), starts the runner on a
free 127.0.0.1 port (``slots_server.py --mode MODE``), prints ``{"runner_pid", "runner_port"}`` once the runner
answers, and stops it when stopped. Whoever runs it, it is what any local user can start: issue 29's fake
Ollama on 127.0.0.2, or a stand-in for the real one (run as "Ollama's user").
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

READY_TIMEOUT_S = 30.0


def main() -> None:
    p = argparse.ArgumentParser(prog="ollama serve")
    p.add_argument("--listen", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--digest", required=True)
    p.add_argument("--mode", default="good")
    p.add_argument("-np", default="1")
    p.add_argument("--location", default="")
    p.add_argument("--runner-name", default="llama-server")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")

    ps = {
        "models": [
            {
                "name": "gemma3:270m",
                "model": "gemma3:270m",
                "size": 300_000_000,
                "digest": args.digest,
                "details": {"format": "gguf", "family": "gemma3"},
                "expires_at": "2099-01-01T00:00:00Z",
                "context_length": 4096,
            }
        ]
    }
    bodies = {
        "/": (b"Ollama is running", "text/plain"),
        "/api/version": (b'{"version":"0.33.3"}', "application/json"),
        "/api/ps": (json.dumps(ps).encode(), "application/json"),
        "/api/tags": (b'{"models":[]}', "application/json"),
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            body, ctype = bodies.get(self.path, (b"404 page not found", "text/plain"))
            self.send_response(200 if self.path in bodies else 404)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, int(port)), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        runner_port = s.getsockname()[1]
    here = Path(__file__).resolve().parent
    argv = [str(here / args.runner_name), str(here / "slots_server.py"), "--port", str(runner_port), "--model", args.model]
    runner = subprocess.Popen([*argv, "--mode", args.mode, "-np", args.np, "--location", args.location], stdin=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while args.mode != "closed":
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{runner_port}/health", timeout=1.0):
                    break
            except (urllib.error.URLError, OSError):
                if runner.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the runner did not start (exit {runner.poll()})")
                time.sleep(0.05)
        print(json.dumps({"runner_pid": runner.pid, "runner_port": runner_port}), flush=True)
        threading.Event().wait()
    finally:
        runner.terminate()
        runner.wait(timeout=10)


if __name__ == "__main__":
    main()
