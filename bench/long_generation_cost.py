"""What recording one long generation costs the collector per second, at its start and at its end.

    .venv/bin/python bench/long_generation_cost.py [--tokens 30000] [--window-s 10] [--before DIR]

One sim (``--hardware m3-max``, ``qwen2.5:0.5b``, a q4_0 KV cache so that the steps slow little as the context
grows: about 300 tokens a second, a reasoning model's pace on a fast machine) serves one streamed generation of
``--tokens`` tokens through the collector (``python -m collectors``, as users run it). While it runs, the
collector's CPU time (schedstat, all its threads and worker processes) and the lines the client has read are sampled
every 0.2 s. Over the first ``--window-s`` seconds after the first token and the last ``--window-s`` before the
final line it prints the collector's CPU per second of the generation and per token, and each at the end over the
same at the start. A collector that rewrites a running request's whole token list every second costs more each
second the longer the reply (the issue's target: within 1.5x per second).

The sim's steps still slow as the context grows, so fewer tokens arrive per second at the end: the relay's own
cost per second falls with them. CPU per token is printed beside CPU per second so that this cannot hide a write
that grows. ``--before DIR`` runs another checkout's collector (``git worktree add DIR stage``) through the same
generation first, in the same run, so the two are compared under the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proxy_overhead import Path_, start_python, start_sim, wait_started_up

MODEL = "qwen2.5:0.5b"
SAMPLE_S = 0.2
TARGET_RATIO = 1.5


@dataclass
class Trace:
    """(monotonic s, collector CPU s, lines read) every SAMPLE_S, and when the first and last lines came."""

    samples: list[tuple[float, float, int]] = field(default_factory=list)
    first_s: float = 0.0
    last_s: float = 0.0
    lines: int = 0


@dataclass
class Window:
    seconds: float
    cpu_s: float
    tokens: int

    @property
    def cpu_ms_per_s(self) -> float:
        return self.cpu_s / self.seconds * 1e3

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s / max(self.tokens, 1) * 1e6


def _generate(path: Path_, tokens: int) -> Trace:
    trace, done = Trace(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            trace.samples.append((time.monotonic(), path.cpu_s(), trace.lines))
            done.wait(SAMPLE_S)

    body = {"model": MODEL, "prompt": "reason at length", "options": {"num_predict": tokens, "num_ctx": tokens + 512}}
    req = urllib.request.Request(f"{path.base_url}/api/generate", data=json.dumps(body).encode())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with urllib.request.urlopen(req, timeout=900) as reply:
        for _ in reply:
            trace.lines += 1
            if trace.lines == 1:
                trace.first_s = time.monotonic()
    trace.last_s = time.monotonic()
    done.set()
    sampler.join()
    return trace


def _window(trace: Trace, t0: float, t1: float) -> Window:
    """The samples closest inside [t0, t1]."""
    inside = [s for s in trace.samples if t0 <= s[0] <= t1]
    (a_t, a_cpu, a_lines), (b_t, b_cpu, b_lines) = inside[0], inside[-1]
    return Window(b_t - a_t, b_cpu - a_cpu, b_lines - a_lines)


def _report(name: str, trace: Trace, window_s: float) -> float:
    start = _window(trace, trace.first_s, trace.first_s + window_s)
    end = _window(trace, trace.last_s - window_s, trace.last_s)
    per_s, per_token = end.cpu_ms_per_s / start.cpu_ms_per_s, end.cpu_us_per_token / start.cpu_us_per_token
    print(
        f"{name}: {trace.lines} lines in {trace.last_s - trace.first_s:.1f} s\n"
        f"  start: {start.cpu_ms_per_s:6.2f} ms of CPU per second, {start.cpu_us_per_token:6.1f} µs per token "
        f"({start.tokens / start.seconds:.0f} tokens/s)\n"
        f"  end:   {end.cpu_ms_per_s:6.2f} ms of CPU per second, {end.cpu_us_per_token:6.1f} µs per token "
        f"({end.tokens / end.seconds:.0f} tokens/s)\n"
        f"  end ÷ start: {per_s:.2f}x per second ({'ok' if per_s <= TARGET_RATIO else 'MISSED'}: target <= "
        f"{TARGET_RATIO}x), {per_token:.2f}x per token; load average {os.getloadavg()[0]:.2f}"
    )
    return per_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=30_000, help="tokens in the generation")
    ap.add_argument("--window-s", type=float, default=10.0, help="length of the start and end windows")
    ap.add_argument("--hardware", default="m3-max", help="sim hardware profile (rtx-5090: ~900 tokens/s)")
    ap.add_argument("--before", type=Path, help="another checkout whose collector runs the same generation first")
    args = ap.parse_args()
    sim_args = ["--hardware", args.hardware, "--kv-cache-type", "q4_0", "--disk-gbs", "20"]
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(start_sim(*sim_args))
        paths: list[Path_] = []
        for name, cwd in (("collector-before", args.before), ("collector", Path.cwd())):
            if cwd is None:
                continue
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pw-long-"))
            argv = ["-m", "collectors", "--ollama", sim.base_url, "--listen", "127.0.0.1:{port}", "--data", data_dir]
            paths.append(stack.enter_context(start_python(name, argv, cwd=cwd.resolve())))
            wait_started_up(data_dir, name)
        print(f"sim {' '.join(sim_args)}, {MODEL}, {args.tokens} tokens; load average {os.getloadavg()[0]:.2f}")
        for p in paths:
            _generate(p, 8)  # loads the model: the generation measured starts warm
            _report(p.name, _generate(p, args.tokens), args.window_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
