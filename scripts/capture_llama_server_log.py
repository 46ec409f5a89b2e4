"""Capture what llama-server writes while it serves one long prompt, as Ollama's log would carry it.

Runs ``python -m sim --engine llama-server`` (which starts the child with Ollama's flags and passes its
output through to sim's stderr), sends one streamed /api/generate of about N tokens with the given
``num_batch``, and writes the child's lines (sim's own lines dropped) to OUT, together with a JSON file
beside it holding the request's raw ``timings`` from ``/sim/engine`` (what the lines should add up to).

    .venv/bin/python scripts/capture_llama_server_log.py --words 4000 --batch 512 \\
        --out tests/data/llama_server_logs/prompt4k_batch512.log
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ollama

from tests.support.engine_process import GREEDY, MODEL, engine_log, start_server_engine, words_prompt

SIM_LINE_PREFIXES = ("[GIN]", "sim: ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=4000, help="prompt length in words (about one token each)")
    ap.add_argument("--batch", type=int, default=512, help="num_batch (llama-server's -b/-ub)")
    ap.add_argument("--ctx", type=int, default=8192, help="num_ctx")
    ap.add_argument("--predict", type=int, default=8, help="num_predict")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    with start_server_engine() as sim:
        client = ollama.Client(host=sim.base_url, timeout=900)
        opts = {**GREEDY, "num_ctx": args.ctx, "num_batch": args.batch, "num_predict": args.predict}
        final = None
        for chunk in client.generate(MODEL, words_prompt(args.words, seed=4000), stream=True, options=opts):
            final = chunk
        assert final is not None and final.done
        record = list(engine_log(sim).values())[-1]
        log = sim.log()
    lines = [ln for ln in log.splitlines() if not ln.startswith(SIM_LINE_PREFIXES)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    meta = {
        "num_batch": args.batch,
        "num_ctx": args.ctx,
        "num_predict": args.predict,
        "runner_argv_flags": "--log-verbosity 4 --no-log-prefix --no-log-timestamps (as Ollama)",
        "timings": record["timings"],
        "stop_type": record["stop_type"],
        "reported": {k: getattr(final, k) for k in ("prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration")},
    }
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    t = record["timings"]
    print(f"{args.out}: {len(lines)} lines; prompt {t['prompt_n']} tokens in {t['prompt_ms']:.0f} ms")


if __name__ == "__main__":
    main()
