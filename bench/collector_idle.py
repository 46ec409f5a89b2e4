"""How much CPU an idle collector uses while it samples at 1 Hz (target: under 1% of one core).

Starts ``python -m sim`` and then, one after another, collectors in three set-ups, each
measured over the same window with no requests: Ollama (the sim) up; demo mode (the
sim's virtual GPU read over HTTP as well); Ollama down (the poller backing off). Prints
each one's CPU time per second of wall time as a percentage of one core, beside a plain
sleeping Python process as the floor.

    .venv/bin/python bench/collector_idle.py [--seconds 30] [--warmup 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collectors.lock import read_lock  # noqa: E402
from tests.support.sim_process import free_port, start_sim  # noqa: E402


@contextlib.contextmanager
def process(cmd: list[str], data: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if data is not None:
            deadline = time.monotonic() + 30
            while not ((info := read_lock(data)) is not None and info.pid == proc.pid and info.listen):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"collector did not start: {cmd}")
                time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_pct_of_one_core(pid: int, warmup_s: float, seconds: float) -> float:
    p = psutil.Process(pid)
    time.sleep(warmup_s)
    t0 = p.cpu_times()
    w0 = time.monotonic()
    time.sleep(seconds)
    t1 = p.cpu_times()
    wall = time.monotonic() - w0
    return 100.0 * ((t1.user - t0.user) + (t1.system - t0.system)) / wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=30.0, help="measuring window per set-up (default 30)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds to settle before measuring (default 5)")
    args = ap.parse_args()

    results: list[tuple[str, float]] = []
    with start_sim("--hardware", "rtx-4090") as sim:
        with process([sys.executable, "-c", "import time; time.sleep(3600)"]) as sleeper:
            results.append(("python sleeping (floor)", cpu_pct_of_one_core(sleeper.pid, args.warmup, args.seconds)))
        setups = [
            ("collector, Ollama (sim) up", ["--ollama", sim.base_url]),
            ("collector, demo mode (+ /sim/gpu)", ["--ollama", sim.base_url, "--demo"]),
            ("collector, Ollama down (backing off)", ["--ollama", f"127.0.0.1:{free_port()}"]),
        ]
        for label, extra in setups:
            with tempfile.TemporaryDirectory() as tmp:
                data = Path(tmp)
                cmd = [sys.executable, "-m", "collectors", "--data", tmp, "--listen", "127.0.0.1:0", "--interval", "1", *extra]
                with process(cmd, data) as proc:
                    results.append((label, cpu_pct_of_one_core(proc.pid, args.warmup, args.seconds)))

    print(f"idle CPU at 1 Hz sampling, {args.seconds:g} s window each, on {os.cpu_count()} cores (% of one core):")
    floor = results[0][1]
    for label, pct in results:
        verdict = "" if label.startswith("python") else ("  OK (< 1%)" if pct < 1.0 else "  OVER TARGET (>= 1%)")
        print(f"  {label:<40} {pct:6.2f} %   (floor + {pct - floor:5.2f}){verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
