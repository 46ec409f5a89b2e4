"""How many lines the collector writes into Ollama's log, idle (target: at most one per 10 s, 360 an hour) and with
one generation running all the time.

Each HTTP request to Ollama is one access line in its log (``[GIN] ... | GET "/api/ps"``), in the journal the
user reads when something goes wrong. Starts ``python -m sim`` (which writes the same lines; ``--engine`` runs the
real llama-server runner under it, whose ``/slots`` the collector reads), loads a model (loaded and idle: the usual
state between uses), starts a collector from ``--repo`` (this checkout, or another one to compare: a ``git
archive`` of the code before), waits ``--warmup`` seconds, then counts the sim's access lines over ``--seconds``,
and prints them per path and per hour. ``--client proxy`` keeps one generation running all the time through the
collector's proxy (back to back, ``--tokens`` each); the client's own lines are not counted.

    .venv/bin/python bench/ollama_log_lines.py [--seconds 60] [--warmup 15] [--repo PATH] [--client none|proxy]
        [--engine GGUF]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.sim_process import free_port, http_json, start_sim  # noqa: E402

_ACCESS = re.compile(r'\[GIN\].*\|\s+(\w+)\s+"([^"]+)"')


CLIENT_LINES = {"POST /api/generate"}  # the benchmark's own client, not the collector's


def access_lines(log: str) -> list[str]:
    return [f"{m.group(1)} {m.group(2)}" for m in _ACCESS.finditer(log)]


def _generate_forever(proxy: str, model: str, tokens: int, stop: threading.Event, done: list[float]) -> None:
    """One generation at a time through the proxy, back to back, until ``stop``; ``done``: when each ended."""
    body = json.dumps({"model": model, "prompt": "Tell me a long story.", "options": {"num_predict": tokens}}).encode()
    while not stop.is_set():
        try:
            with urllib.request.urlopen(urllib.request.Request(f"http://{proxy}/api/generate", data=body), timeout=600) as r:
                r.read()
            done.append(time.monotonic())
        except (OSError, http.client.HTTPException):
            time.sleep(0.5)  # the proxy not up yet, or stopped at the end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="window counted (default 60)")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds after the collector starts, not counted")
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout whose collector runs (default this one)")
    ap.add_argument("--client", choices=("none", "proxy"), default="none", help="one generation at a time, or none")
    ap.add_argument("--tokens", type=int, default=400, help="with --client proxy: tokens per generation")
    ap.add_argument("--engine", type=Path, help="a GGUF: sim runs the real llama-server with it")
    args = ap.parse_args()
    sim_args = ["--engine", "llama-server", "--gguf", str(args.engine)] if args.engine else []
    model = "gemma3:270m" if args.engine else "qwen2.5:0.5b"
    with start_sim(*sim_args) as sim, tempfile.TemporaryDirectory() as data:
        status, body = http_json(sim, "POST", "/api/generate", {"model": model, "keep_alive": -1})
        assert status == 200, body
        proxy = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", proxy, "--data", data]
        collector = subprocess.Popen(cmd, cwd=args.repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop = threading.Event()
        done: list[float] = []
        client = threading.Thread(target=_generate_forever, args=(proxy, model, args.tokens, stop, done), daemon=True)
        if args.client == "proxy":
            client.start()
        try:
            time.sleep(args.warmup)
            before = len(access_lines(sim.log()))
            window_start = time.monotonic()
            time.sleep(args.seconds)
            generations = sum(1 for t in done if t >= window_start)
            lines = [line for line in access_lines(sim.log())[before:] if line not in CLIENT_LINES]
            assert collector.poll() is None, f"the collector exited with {collector.returncode}"
        finally:
            stop.set()
            collector.terminate()
            collector.wait(timeout=30)
    per_hour = len(lines) / args.seconds * 3600
    what = "idle" if args.client == "none" else f"one generation running all the time ({generations} ended in it)"
    print(
        f"collector from {args.repo} ({'llama-server runner' if args.engine else 'sim, no runner'}): {len(lines)} "
        f"access lines in {args.seconds:g} s {what} = {per_hour:,.0f} per hour ({per_hour * 24:,.0f} per day)"
    )
    for path, n in collections.Counter(lines).most_common():
        print(f"  {n:6d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
