"""The what-if's predicted ratios between settings against the real runner's, side by side.

Starts llama.cpp's ``llama-server`` (Gemma 3 270M, CPU) with flash attention on and then off, and for each
measures, by the server's own timings: prefill at two prompt lengths and decode at two contexts. Prints each
ratio (long ÷ short, on ÷ off) measured and as ``analysis.whatif`` predicts it from the ceiling model, and
how far apart they are. Not a test: run it on a quiet machine.

    .venv/bin/python bench/whatif_engine.py [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.hardware import BY_KEY  # noqa: E402
from analysis.memory import RunnerSettings  # noqa: E402
from analysis.whatif import Workload, predict  # noqa: E402
from tests.support.model_shapes import GEMMA_3_270M as GEMMA  # noqa: E402

BINARY = REPO / ".cache" / "llama-server" / "bin" / "llama-server"
GGUF = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
SHORT, LONG = 256, 2048  # prompt tokens (prefill), and the contexts decode runs at
DECODE_TOKENS = 64
NUM_CTX = 4096


def _post(port: int, body: dict[str, object]) -> dict[str, float]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        timings: dict[str, float] = json.loads(r.read())["timings"]
    return timings


def _measure(flash: bool, threads: int, reps: int) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            str(BINARY),
            "--model",
            str(GGUF),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--no-webui",
            "--offline",
            "-c",
            str(NUM_CTX),
            "-np",
            "1",
            "-t",
            str(threads),
            "--flash-attn",
            "on" if flash else "off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        out: dict[str, list[float]] = {"pp_short": [], "pp_long": [], "tg_short": [], "tg_long": []}
        for rep in range(reps):
            for n, tag in ((SHORT, "short"), (LONG, "long")):
                # A distinct token each rep keeps the prompt cache from serving it.
                prompt = [2] + [1000 + rep] + [4000 + (i % 3000) for i in range(n - 2)]
                t = _post(port, {"prompt": prompt, "n_predict": DECODE_TOKENS, "cache_prompt": False, "temperature": 0})
                out[f"pp_{tag}"].append(t["prompt_per_second"])
                out[f"tg_{tag}"].append(t["predicted_per_second"])
        return {k: statistics.median(v) for k, v in out.items()}
    finally:
        proc.terminate()
        proc.wait(30)


def _predicted(flash: bool) -> dict[str, float]:
    spec = BY_KEY["cpu"]
    got = {}
    for n, tag in ((SHORT, "short"), (LONG, "long")):
        work = Workload(n, n, n + DECODE_TOKENS // 2, n)
        p = predict(GEMMA, spec, RunnerSettings(NUM_CTX, flash_attn=flash), work, free_vram_bytes=None)
        got[f"pp_{tag}"], got[f"tg_{tag}"] = p.prefill_tok_s, p.decode_tok_s
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    on, off = _measure(True, args.threads, args.reps), _measure(False, args.threads, args.reps)
    p_on, p_off = _predicted(True), _predicted(False)
    rows = [
        ("prefill 2,048 ÷ 256 tokens (FA on)", on["pp_long"] / on["pp_short"], p_on["pp_long"] / p_on["pp_short"]),
        ("decode at 2,080 ÷ 288 context (FA on)", on["tg_long"] / on["tg_short"], p_on["tg_long"] / p_on["tg_short"]),
        ("prefill 2,048 tokens, FA on ÷ off", on["pp_long"] / off["pp_long"], p_on["pp_long"] / p_off["pp_long"]),
        ("decode at 2,080, FA on ÷ off", on["tg_long"] / off["tg_long"], p_on["tg_long"] / p_off["tg_long"]),
    ]
    print(f"measured (median of {args.reps}): FA on {json.dumps({k: round(v, 1) for k, v in on.items()})}")
    print(f"                       FA off {json.dumps({k: round(v, 1) for k, v in off.items()})}")
    print(f"{'ratio':42} {'measured':>9} {'predicted':>9} {'pred/meas':>9}")
    for label, measured, predicted in rows:
        print(f"{label:42} {measured:9.3f} {predicted:9.3f} {predicted / measured:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
