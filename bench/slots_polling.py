"""What polling llama-server's ``GET /slots`` at 4 Hz costs its decode speed, measured in one run.

    .venv/bin/python bench/slots_polling.py [--reps 8] [--tokens 128] [--hz 4] [--threads 2] [--gguf PATH]

Starts ``python -m sim --engine llama-server`` (Gemma 3 270M on the CPU) once, then runs the same greedy
generation (so the very same tokens) rep by rep, either with nobody reading the runner or with a poller
reading its ``/slots`` at ``--hz`` for the whole generation, in ABBA order so that drift in the machine's
load hits both alike. Decode speed is llama-server's own: (predicted_n - 1) / predicted_ms from its
timings. It prints every run, the medians, the mean of the paired ratios (polled / unpolled: the cost is
1 - ratio), and beside it the runner's CPU time per decoded token, which other load on a shared machine
blurs less than tokens/s; plus how long a ``/slots`` answer took.
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

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.engine_process import DEFAULT_GGUF, GREEDY, MODEL, words_prompt  # noqa: E402
from tests.support.sim_process import http_json, start_sim  # noqa: E402

TARGET_PCT = 1.0  # the target: polling costs under 1% of decode speed


class SlotsPoller:
    """GET /slots at a fixed rate in a thread, counting the answers and timing them."""

    def __init__(self, base_url: str, hz: float) -> None:
        self.url = base_url + "/slots"
        self.period_s = 1.0 / hz
        self.latencies_s: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    json.loads(r.read())  # read it as a collector would
                self.latencies_s.append(time.monotonic() - t0)
            except (OSError, ValueError):
                self.errors += 1
            next_t += self.period_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def __enter__(self) -> SlotsPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def one_run(engine_url: str, runner: psutil.Process, prompt: str, tokens: int, poller: SlotsPoller | None) -> dict[str, float]:
    body = {"model": MODEL, "prompt": prompt, "stream": False, "options": {**GREEDY, "num_predict": tokens}}
    cpu0 = runner.cpu_times()
    req = urllib.request.Request(engine_url + "/api/generate", data=json.dumps(body).encode(), method="POST")
    if poller is not None:
        with poller, urllib.request.urlopen(req, timeout=600) as r:
            final = json.loads(r.read())
    else:
        with urllib.request.urlopen(req, timeout=600) as r:
            final = json.loads(r.read())
    cpu1 = runner.cpu_times()
    assert final["eval_count"] == tokens, final
    decode_tok_s = (final["eval_count"] - 1) / (final["eval_duration"] / 1e9)
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {"decode_tok_s": decode_tok_s, "cpu_ms_per_token": 1e3 * cpu_s / final["eval_count"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=8, help="runs of each kind (ABBA order; default 8)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens decoded per run (default 128)")
    ap.add_argument("--hz", type=float, default=4.0, help="polling rate (default 4)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server CPU threads (default 2)")
    ap.add_argument("--gguf", default=str(DEFAULT_GGUF))
    args = ap.parse_args()
    prompt = words_prompt(40, seed=9)
    with start_sim("--engine", "llama-server", "--gguf", args.gguf, "--threads", str(args.threads)) as engine:
        # Load, and the first decode that touches every page; its prompt stays cached for the runs.
        status, _ = http_json(engine, "POST", "/api/generate",
                              {"model": MODEL, "prompt": prompt, "stream": False, "options": {**GREEDY, "num_predict": 8}},
                              timeout_s=600)  # fmt: skip
        assert status == 200
        state = http_json(engine, "GET", "/sim/engine")[1]["runner"]
        runner = psutil.Process(state["pid"])
        print(f"{MODEL} on llama-server (pid {state['pid']}, port {state['port']}), {args.threads} threads, "
              f"{args.tokens} tokens per run, /slots at {args.hz:g} Hz, {psutil.cpu_count()} cores, "
              f"load average {psutil.getloadavg()[0]:.1f}")
        order = [False, True, True, False] * ((args.reps + 1) // 2)
        plain: list[dict[str, float]] = []
        polled: list[dict[str, float]] = []
        latencies: list[float] = []
        for i, with_polling in enumerate(order[: 2 * args.reps]):
            poller = SlotsPoller(state["base_url"], args.hz) if with_polling else None
            r = one_run(engine.base_url, runner, prompt, args.tokens, poller)
            (polled if with_polling else plain).append(r)
            extra = ""
            if poller is not None:
                latencies += poller.latencies_s
                extra = f", {len(poller.latencies_s)} polls, {poller.errors} errors"
            print(f"run {i + 1:2d} {'polled  ' if with_polling else 'unpolled'}: {r['decode_tok_s']:6.2f} tok/s, "
                  f"{r['cpu_ms_per_token']:6.2f} ms CPU per token{extra}")
    pairs = list(zip(plain, polled, strict=False))
    ratios = [p["decode_tok_s"] / u["decode_tok_s"] for u, p in pairs]
    cpu_ratios = [p["cpu_ms_per_token"] / u["cpu_ms_per_token"] for u, p in pairs]
    med = statistics.median
    print(f"median decode: unpolled {med(r['decode_tok_s'] for r in plain):.2f} tok/s, "
          f"polled {med(r['decode_tok_s'] for r in polled):.2f} tok/s")
    mean_ratio = statistics.fmean(ratios)
    print(f"decode speed ratio polled/unpolled: mean of {len(ratios)} pairs {mean_ratio:.4f} "
          f"(median {med(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}); cost {100 * (1 - mean_ratio):+.2f}%")
    print(f"runner CPU per token ratio polled/unpolled: mean {statistics.fmean(cpu_ratios):.4f} (median {med(cpu_ratios):.4f})")
    spread_pct = 100 * statistics.pstdev(r["decode_tok_s"] for r in plain) / statistics.fmean(r["decode_tok_s"] for r in plain)
    if len(pairs) < 3:
        verdict = f"INCONCLUSIVE: {len(pairs)} pairs are too few (--reps 6 or more)"
    elif spread_pct > TARGET_PCT:
        verdict = f"INCONCLUSIVE: unpolled runs alone vary ±{spread_pct:.1f}%, more than the target (other load on the machine)"
    else:
        verdict = "OK" if 100 * (1 - mean_ratio) < TARGET_PCT else "OVER TARGET"
    cost_pct = 100 * (1 - mean_ratio)
    print(f"polling /slots at {args.hz:g} Hz costs {cost_pct:+.2f}% of decode speed (target < {TARGET_PCT:g}%): {verdict}")
    if latencies:
        print(f"/slots answered in {1e3 * med(latencies):.2f} ms median, {1e3 * max(latencies):.2f} ms max "
              f"({len(latencies)} polls)")


if __name__ == "__main__":
    main()
