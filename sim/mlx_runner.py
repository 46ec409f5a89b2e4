"""Sim playing Ollama's MLX runner (Apple Silicon's engine for safetensors models), which cannot run here.

``start_mlx_runner`` starts it as Ollama does: a child whose command line is ``ollama runner --mlx-engine --model
NAME --port N`` (so discovery finds it exactly as it finds the real one), its output copied line by line into
Ollama's log (``sim.ollama_log.line``), as Ollama copies its runner's. The child serves ``GET /v1/status``,
``GET /v1/models``, ``POST /v1/tokenize`` and ``POST /v1/completions``, one completion at a time, and writes, through
Go's slog text format, the four per-request lines ``collectors/ollama/mlx_log.py`` reads (docs/platforms.md)::

    msg="cache hit" total= matched= cached= left=      (a prefix cache of the previous prompt)
    msg="Prompt processing progress" processed= total=  (one per prefill chunk; total = tokens left after the cache)
    msg="peak memory" size=
    msg=ServeHTTP method=POST path=/v1/completions took= status=200

Times come from sim's roofline model (``sim.timing.step_seconds``) for a catalog model on an Apple profile.
The child is plain stdlib Python, so it runs under whatever interpreter started it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sim import ollama_log
from sim.catalog import MODELS, find_model
from sim.llama_server_engine import die_with
from sim.ollama_time import format_go_duration
from sim.profiles import PROFILES
from sim.timing import StepWork, step_seconds
from sim.tokens import encode, make_prompt

REPO_ROOT = Path(__file__).resolve().parents[1]
PREFILL_CHUNK_TOKENS = 256  # tokens per prefill step, one progress line each
HARDWARE = "m3-max"  # the Apple profile whose roofline times the steps
MAX_PROMPT_TOKENS = 131_072  # a longer prompt is refused (400), as past a model's context
MAX_OUTPUT_TOKENS = 4096
# The child's script, ``runner`` in a folder of its own (its cwd), which it removes once started: Python has read it.
_LAUNCHER = (
    "import os, shutil, sys; sys.path.insert(0, {root!r})\n"
    "shutil.rmtree(os.getcwd(), ignore_errors=True)\n"
    "from sim.mlx_runner import main; main(sys.argv[1:])\n"
)


def _go_bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


class _Runner:
    """The runner's state: the model, and the previous prompt's tokens (its prefix cache)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.facts = find_model(model) or MODELS[0]
        self.profile = PROFILES[HARDWARE]
        self.cached: list[int] = []
        self.busy = threading.Lock()  # one completion at a time, as the real runner serves them

    def _step_s(self, context: int, tokens: int, decode: bool) -> float:
        work = StepWork(decode_contexts=[context] if decode else [], prefill_chunks=[] if decode else [(context, tokens)])
        return step_seconds(self.facts, self.profile, 1.0, work)

    def complete(self, prompt: str, max_tokens: int, emit: Callable[[str], None] = lambda _t: None) -> dict[str, Any]:
        """One completion; ``emit`` gets each output token's text as it is sampled (a streamed reply's chunks)."""
        ids = encode(prompt)
        total = len(ids)
        matched = 0
        while matched < min(total, len(self.cached)) and ids[matched] == self.cached[matched]:
            matched += 1
        cached = min(matched, total - 1)  # at least one token is read: it yields the first output
        left = total - cached
        ollama_log.slog(
            "cache hit" if cached else "cache miss",
            source="prefix_cache.go:126",
            total=total,
            matched=matched,
            cached=cached,
            left=left,
        )
        processed = 0
        while processed < left - 1:  # the last token is read by the first decode step
            chunk = min(PREFILL_CHUNK_TOKENS, left - 1 - processed)
            time.sleep(self._step_s(cached + processed, chunk, decode=False))
            processed += chunk
            ollama_log.slog("Prompt processing progress", source="pipeline.go:204", processed=processed, total=left)
        out = max(1, min(max_tokens, MAX_OUTPUT_TOKENS))
        words = make_prompt(out, seed=total).split(" ")
        for i in range(out):
            time.sleep(self._step_s(total + i, 1, decode=True))
            emit((" " if i else "") + (words[i] if i < len(words) else "x"))
        peak = self.facts.size_bytes + (total + out) * 131_072
        ollama_log.slog("peak memory", source="pipeline.go:91", size=_go_bytes(peak))
        self.cached = ids
        text = " ".join(words[:out])
        usage = {
            "prompt_tokens": total,
            "completion_tokens": out,
            "total_tokens": total + out,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return {"object": "text_completion", "model": self.model, "choices": [{"text": text, "index": 0}], "usage": usage}


def _handler(runner: _Runner) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # the runner's own ServeHTTP line stands for it

        def _answer(self, started_ns: int, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self._served(started_ns, status)

        def _stream(self, started_ns: int, prompt: str, max_tokens: int) -> None:
            """A streamed completion: a ``data:`` line per token, then one with the usage; the connection closes."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()

            def emit(text: str) -> None:
                self.wfile.write(b"data: " + json.dumps({"choices": [{"text": text, "index": 0}]}).encode() + b"\n\n")
                self.wfile.flush()

            final = runner.complete(prompt, max_tokens, emit)
            final["choices"] = []
            emit_final = b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n"
            self.wfile.write(emit_final)
            self._served(started_ns, 200)

        def _served(self, started_ns: int, status: int) -> None:
            took = format_go_duration(time.monotonic_ns() - started_ns)
            path = self.path.split("?", 1)[0]
            ollama_log.slog("ServeHTTP", source="server.go:225", method=self.command, path=path, took=took, status=status)

        def do_GET(self) -> None:
            t0 = time.monotonic_ns()
            if self.path == "/v1/status":
                self._answer(t0, 200, {"status": "ok", "model": runner.model})
            elif self.path == "/v1/models":
                self._answer(t0, 200, {"object": "list", "data": [{"id": runner.model, "object": "model"}]})
            else:
                self._answer(t0, 404, {"error": "not found"})

        def do_POST(self) -> None:
            t0 = time.monotonic_ns()
            size = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(size) or b"{}")
                prompt = str(body.get("prompt", ""))
            except (ValueError, AttributeError):
                self._answer(t0, 400, {"error": "invalid JSON"})
                return
            if self.path == "/v1/tokenize":
                self._answer(t0, 200, {"tokens": encode(prompt)})
            elif self.path == "/v1/completions":
                if not 0 < len(encode(prompt)) <= MAX_PROMPT_TOKENS:
                    self._answer(t0, 400, {"error": "prompt empty or too long"})
                    return
                max_tokens = int(body.get("max_tokens") or 16)
                with runner.busy:
                    if body.get("stream"):
                        self._stream(t0, prompt, max_tokens)
                    else:
                        self._answer(t0, 200, runner.complete(prompt, max_tokens))
            else:
                self._answer(t0, 404, {"error": "not found"})

    return Handler


def main(argv: list[str]) -> None:
    """The child: ``runner --mlx-engine --model NAME --port N`` (argv after the interpreter's own)."""
    args = dict(itertools.pairwise(argv))
    model, port = args.get("--model", MODELS[0].name), int(args.get("--port", "0"))
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(_Runner(model)))
    ollama_log.slog("starting mlx runner", source="server.go:300", model=model, port=port)
    server.serve_forever()


def start_mlx_runner(model: str, port: int, on_line: Callable[[str], None] = ollama_log.line) -> subprocess.Popen[str]:
    """Start the runner as Ollama would: its command line reads ``ollama runner --mlx-engine --model NAME --port N``
    (argv[0] set to ``ollama``; the interpreter runs the ``runner`` launcher beside it), its lines copied to
    ``on_line`` (Ollama's log) by a thread."""
    home = Path(tempfile.mkdtemp(prefix="sim-mlx-"))
    (home / "runner").write_text(_LAUNCHER.format(root=str(REPO_ROOT)), encoding="utf-8")
    argv = ["ollama", "runner", "--mlx-engine", "--model", model, "--port", str(port)]
    # Run through a link named ``ollama`` where links can be made: the process is then named ``ollama`` too (its
    # comm), as Ollama's runner is, which is what a process table watch keys on; else the interpreter's own name.
    executable = home / "ollama"
    try:
        executable.symlink_to(sys.executable)
    except (OSError, NotImplementedError):
        executable = Path(sys.executable)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        argv,
        executable=executable,
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        preexec_fn=die_with(os.getpid()) if hasattr(os, "fork") else None,  # a sim that dies takes its runner
    )

    def copy() -> None:
        assert proc.stdout is not None
        for text in proc.stdout:
            on_line(text.rstrip("\n"))

    threading.Thread(target=copy, name="mlx-runner-log", daemon=True).start()
    return proc
