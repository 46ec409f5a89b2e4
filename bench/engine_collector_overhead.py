"""What the collector costs a real engine: llama-server's decode tokens/s with and without it, in one run.

    .venv/bin/python bench/engine_collector_overhead.py [--reps 6] [--tokens 96] [--threads 2] [--gguf PATH]

Starts the real runner (``python -m sim --engine llama-server``, Gemma 3 270M on the CPU) once.
Then, rep by rep, the same greedy generation (so the very same tokens) runs either straight to the
engine with no collector process at all, or through a freshly started collector process
(``python -m collectors``: recording proxy, Ollama poller, host sampler, store writer, at 1 Hz),
in ABBA order so that drift in the machine's load hits both alike. Decode speed is the engine's own
(eval_count - 1) / eval_duration from the final chunk. It prints every run, the medians, the paired
differences, and the collector's cost as a share of decode speed (target: under 2%), beside the
collector's CPU time as a share of the engine's (which other load on a shared machine does not blur,
while tokens/s on a busy 2-core machine swings by tens of percent); then how much
decode speed Ollama's default sampling gives up against greedy sampling.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collectors.lock import read_lock  # noqa: E402
from tests.support.engine_process import DEFAULT_GGUF, GREEDY, MODEL, words_prompt  # noqa: E402
from tests.support.sim_process import http_json, start_sim  # noqa: E402

TARGET_PCT = 2.0


@contextlib.contextmanager
def collector(upstream: str, interval_s: float) -> Iterator[tuple[str, psutil.Process]]:
    """A collector process in front of ``upstream``; yields (its proxy URL, the process)."""
    with tempfile.TemporaryDirectory(prefix="pw-bench-") as tmp:
        data = Path(tmp)
        cmd = [
            sys.executable,
            "-m",
            "collectors",
            "--ollama",
            upstream,
            "--listen",
            "127.0.0.1:0",
            "--data",
            tmp,
            "--interval",
            f"{interval_s:g}",
        ]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not ((info := read_lock(data)) is not None and info.pid == proc.pid and info.listen):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"collector did not start: {' '.join(cmd)}")
                time.sleep(0.05)
            yield f"http://{info.listen}", psutil.Process(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def generate(base_url: str, prompt: str, tokens: int, options: dict[str, object] | None = None) -> dict[str, int]:
    """One streamed generation (as chat front-ends do); the final chunk's metrics."""
    opts = GREEDY if options is None else options
    body = {"model": MODEL, "prompt": prompt, "stream": True, "options": {**opts, "num_predict": tokens}}
    final: dict[str, int] = {}
    with httpx.Client(timeout=600) as client, client.stream("POST", base_url + "/api/generate", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            chunk = json.loads(line)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("done"):
                final = chunk
    return final


def decode_tok_s(final: dict[str, int]) -> float:
    return (final["eval_count"] - 1) / (final["eval_duration"] / 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reps", type=int, default=6, help="runs per set-up (default 6)")
    ap.add_argument("--tokens", type=int, default=96, help="tokens generated per run (default 96)")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp CPU threads (default 2)")
    ap.add_argument("--interval", type=float, default=1.0, help="collector sampling interval, s (default 1)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds a new collector settles before a run (default 2)")
    ap.add_argument("--gguf", default=str(DEFAULT_GGUF), help="model file (python scripts/get_gemma.py writes it)")
    args = ap.parse_args()
    if not Path(args.gguf).is_file():
        print(f"no GGUF at {args.gguf}: run python scripts/get_gemma.py first", file=sys.stderr)
        return 2

    prompt = words_prompt(40, seed=5)
    runs: dict[str, list[float]] = {"direct": [], "collector": []}
    pairs: list[float] = []
    collector_cpu_s = 0.0
    collector_wall_s = 0.0
    engine_cpu_s = 0.0  # the engine's CPU time during the same runs
    with start_sim("--engine", "llama-server", "--gguf", args.gguf, "--threads", str(args.threads)) as engine:
        generate(engine.base_url, prompt, 8)  # load and warm up
        engine_proc = psutil.Process(http_json(engine, "GET", "/sim/engine")[1]["runner"]["pid"])  # the child computes
        print(
            f"{MODEL} on llama-server, {args.threads} threads, {args.tokens} tokens per run, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at start"
        )
        for rep in range(args.reps):
            order = ["direct", "collector"] if rep % 2 == 0 else ["collector", "direct"]
            got: dict[str, float] = {}
            for mode in order:
                if mode == "direct":
                    got[mode] = decode_tok_s(generate(engine.base_url, prompt, args.tokens))
                else:
                    with collector(engine.base_url, args.interval) as (url, proc):
                        time.sleep(args.settle)
                        c0, e0, w0 = proc.cpu_times(), engine_proc.cpu_times(), time.monotonic()
                        got[mode] = decode_tok_s(generate(url, prompt, args.tokens))
                        c1, e1 = proc.cpu_times(), engine_proc.cpu_times()
                        collector_cpu_s += (c1.user - c0.user) + (c1.system - c0.system)
                        engine_cpu_s += (e1.user - e0.user) + (e1.system - e0.system)
                        collector_wall_s += time.monotonic() - w0
                runs[mode].append(got[mode])
            pairs.append(100.0 * (1.0 - got["collector"] / got["direct"]))
            print(
                f"  rep {rep + 1}: direct {got['direct']:6.2f} tok/s   through collector {got['collector']:6.2f} tok/s   "
                f"cost {pairs[-1]:+5.2f}%",
                flush=True,
            )

        # Beside it: what Ollama's default sampling (repeat penalty, top-k/top-p over 262k tokens) costs against greedy.
        sampling: list[tuple[str, float]] = []
        for label, opts in (("greedy, no repeat penalty", GREEDY), ("Ollama's default sampling", {})):
            final = generate(engine.base_url, prompt, args.tokens, {**opts, "seed": 3})
            sampling.append((label, decode_tok_s(final)))

    med_direct = statistics.median(runs["direct"])
    med_coll = statistics.median(runs["collector"])
    cost_pct = 100.0 * (1.0 - med_coll / med_direct)
    spread = statistics.pstdev(runs["direct"]) / statistics.mean(runs["direct"]) * 100.0
    print(
        f"median decode: direct {med_direct:.2f} tok/s, with the collector {med_coll:.2f} tok/s "
        f"(run-to-run spread of direct runs ±{spread:.1f}%)"
    )
    print(f"paired cost per rep: median {statistics.median(pairs):+.2f}%, mean {statistics.mean(pairs):+.2f}%")
    print(
        f"collector process CPU while a run streamed: {100.0 * collector_cpu_s / collector_wall_s:.2f}% of one core, "
        f"{100.0 * collector_cpu_s / engine_cpu_s:.2f}% of the engine's CPU time (a bound that other load does not blur)"
    )
    for label, tok_s in sampling:
        print(f"decode with {label}: {tok_s:.2f} tok/s")
    if spread > TARGET_PCT:
        verdict = f"INCONCLUSIVE: direct runs alone vary ±{spread:.1f}%, more than the target (other load on the machine)"
    else:
        verdict = "OK" if cost_pct < TARGET_PCT else "OVER TARGET"
    print(f"collector costs {cost_pct:+.2f}% of decode speed (target < {TARGET_PCT:g}%): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
