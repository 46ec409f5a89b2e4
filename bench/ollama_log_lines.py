"""How many lines an idle collector writes into Ollama's log (target: at most one per 10 s, 360 an hour).

Each HTTP request to Ollama is one access line in its log (``[GIN] ... | GET "/api/ps"``), in the journal the
user reads when something goes wrong. Starts ``python -m sim`` (which writes the same lines), loads a model
(loaded and idle: the usual state between uses), starts a collector from ``--repo`` (this checkout, or another
one to compare: ``--repo /work/main`` for the code before), waits ``--warmup`` seconds, then counts the sim's
access lines over ``--seconds`` with no client at all, and prints them per path and per hour.

    .venv/bin/python bench/ollama_log_lines.py [--seconds 60] [--warmup 15] [--repo PATH]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.sim_process import free_port, http_json, start_sim  # noqa: E402

_ACCESS = re.compile(r'\[GIN\].*\|\s+(\w+)\s+"([^"]+)"')


def access_lines(log: str) -> list[str]:
    return [f"{m.group(1)} {m.group(2)}" for m in _ACCESS.finditer(log)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle window counted (default 60)")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds after the collector starts, not counted")
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout whose collector runs (default this one)")
    args = ap.parse_args()
    with start_sim() as sim, tempfile.TemporaryDirectory() as data:
        status, body = http_json(sim, "POST", "/api/generate", {"model": "qwen2.5:0.5b", "keep_alive": -1})
        assert status == 200, body
        cmd = [
            sys.executable,
            "-m",
            "collectors",
            "--ollama",
            sim.base_url,
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--data",
            data,
        ]
        collector = subprocess.Popen(cmd, cwd=args.repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(args.warmup)
            before = len(access_lines(sim.log()))
            time.sleep(args.seconds)
            lines = access_lines(sim.log())[before:]
            assert collector.poll() is None, f"the collector exited with {collector.returncode}"
        finally:
            collector.terminate()
            collector.wait(timeout=30)
    per_hour = len(lines) / args.seconds * 3600
    print(
        f"collector from {args.repo}: {len(lines)} access lines in {args.seconds:g} s idle "
        f"= {per_hour:,.0f} per hour ({per_hour * 24:,.0f} per day)"
    )
    for path, n in collections.Counter(lines).most_common():
        print(f"  {n:6d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
