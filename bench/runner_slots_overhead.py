"""What reading a runner's /slots at 4 Hz costs it: llama-server's decode tokens/s with and without a poller, one run.

    .venv/bin/python bench/runner_slots_overhead.py [--reps 6] [--tokens 64] [--prompt-words 2000] [--threads 2]

Starts the real llama-server once (as Ollama starts it; Gemma 3 270M on the CPU), warms its prompt cache
with one long prompt (/slots detokenizes the whole prompt on every call, so a long one is the costly case),
then, rep by rep in ABBA order (so drift in the machine's load hits both alike), decodes the same greedy
tokens after that cached prompt either with no reader or with a thread polling GET /slots every 0.25 s, as
the collector does while a request runs. Decode speed is llama-server's own (timings.predicted_per_second).
Prints every run, the medians, the paired differences and the cost as a share of decode speed (target:
under 1%), beside what the engine spent answering /slots: its mean latency and that latency × 4 Hz as a
share of wall time (an upper bound on the time the engine's loop gave it, which other load does not blur).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.engine_process import DEFAULT_GGUF, words_prompt  # noqa: E402
from tests.support.runner_process import start_llama_server  # noqa: E402

POLL_INTERVAL_S = 0.25


def post(base: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        base + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=1200) as resp:
        return dict(json.loads(resp.read()))


class Poller(threading.Thread):
    """GET /slots every 0.25 s until stopped; keeps each call's latency."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.stop = threading.Event()
        self.latencies_s: list[float] = []

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(self.base + "/slots", timeout=10) as resp:
                resp.read()
            self.latencies_s.append(time.perf_counter() - t0)
            self.stop.wait(max(0.0, POLL_INTERVAL_S - (time.perf_counter() - t0)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=6, help="runs of each kind (ABBA order)")
    p.add_argument("--tokens", type=int, default=64, help="tokens decoded per run")
    p.add_argument("--prompt-words", type=int, default=2000, help="the cached prompt before the decode")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    args = p.parse_args()

    prompt = words_prompt(args.prompt_words, seed=5)
    body = {"prompt": prompt, "n_predict": args.tokens, "temperature": 0, "cache_prompt": True, "ignore_eos": True}
    with start_llama_server(args.gguf, ctx=8192, threads=args.threads) as runner:
        warm = post(runner.base_url, {**body, "n_predict": 1})
        print(f"warm-up: prompt {warm['timings']['prompt_n']} tokens in {warm['timings']['prompt_ms'] / 1e3:.1f} s")
        order = [False, True, True, False] * ((args.reps + 1) // 2)
        runs: list[tuple[bool, float, float]] = []  # (polled, decode tok/s, mean /slots latency s)
        for polled in order[: 2 * args.reps]:
            poller = Poller(runner.base_url) if polled else None
            if poller is not None:
                poller.start()
            out = post(runner.base_url, body)
            if poller is not None:
                poller.stop.set()
                poller.join()
            t = out["timings"]
            latency_s = statistics.mean(poller.latencies_s) if poller and poller.latencies_s else 0.0
            runs.append((polled, t["predicted_per_second"], latency_s))
            extra = f", {len(poller.latencies_s)} /slots calls, mean {latency_s * 1e3:.2f} ms" if poller else ""
            print(f"{'polled' if polled else 'plain '}: {t['predicted_per_second']:.2f} tok/s "
                  f"({t['predicted_n']} tokens, cache {t['cache_n']}){extra}")  # fmt: skip

    plain = [r[1] for r in runs if not r[0]]
    polled_rates = [r[1] for r in runs if r[0]]
    pairs = [(runs[i], runs[i + 1]) for i in range(0, len(runs) - 1, 2)]
    diffs = [(b[1] - a[1]) / a[1] if not a[0] else (a[1] - b[1]) / b[1] for a, b in pairs]
    latencies = [r[2] for r in runs if r[0]]
    cost = 1 - statistics.median(polled_rates) / statistics.median(plain)
    print(
        f"\nmedian decode: plain {statistics.median(plain):.2f} tok/s, polled at 4 Hz {statistics.median(polled_rates):.2f} tok/s"
    )
    print(f"cost of polling (median ratio): {cost:+.2%} (target: under 1%)")
    print(f"paired differences (polled vs plain, same pair): {', '.join(f'{d:+.1%}' for d in diffs)}")
    print(f"/slots latency: mean {statistics.mean(latencies) * 1e3:.2f} ms → at most "
          f"{statistics.mean(latencies) / POLL_INTERVAL_S:.2%} of the engine's time at 4 Hz")  # fmt: skip


if __name__ == "__main__":
    main()
