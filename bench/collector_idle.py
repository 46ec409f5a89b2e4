"""How much CPU an idle collector uses while it samples at 1 Hz (target: under 0.5% of one core).

Starts ``python -m sim`` (writing Ollama's log to a file) and then, one after another,
collectors in four set-ups, each measured over the same window with no requests: Ollama
(the sim) up; demo mode (the sim's virtual GPU read over HTTP as well); demo mode reading
Ollama's log file too (everything an idle collector watches: the runner, the log, the GPU
source); Ollama down (the poller backing off). Prints each one's CPU time per second of
wall time as a percentage of one core, beside a plain sleeping Python process as the floor,
and last the one number to compare: the idle share of the collector watching everything.

``--before DIR`` measures the collector of another checkout (``git worktree add DIR main``)
in each set-up right after this one's, so that both see the same machine.

    .venv/bin/python bench/collector_idle.py [--seconds 30] [--warmup 5] [--before DIR]
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

from bench.proxy_overhead import wait_started_up  # noqa: E402
from collectors.lock import read_lock  # noqa: E402
from tests.support.sim_process import free_port, start_sim  # noqa: E402

TARGET_PCT = 0.5
WATCHING_ALL = "collector, demo mode + Ollama's log"


@contextlib.contextmanager
def process(cmd: list[str], data: Path | None = None, cwd: Path = REPO) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    t0 = _cpu_s(p)
    w0 = time.monotonic()
    time.sleep(seconds)
    t1 = _cpu_s(p)
    wall = time.monotonic() - w0
    return 100.0 * (t1 - t0) / wall


def _cpu_s(p: psutil.Process) -> float:
    """CPU seconds of the process and its children (work moved into a worker process still counts)."""
    total = 0.0
    for proc in [p, *p.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=30.0, help="measuring window per set-up (default 30)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds to settle before measuring (default 5)")
    ap.add_argument("--before", type=Path, help="another checkout whose collector is measured beside this one's")
    args = ap.parse_args()

    checkouts = [("", REPO)] + ([(" [before]", args.before.resolve())] if args.before is not None else [])
    results: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as log_dir:
        log_file = Path(log_dir) / "ollama.log"
        with start_sim("--hardware", "rtx-4090", "--log-file", str(log_file)) as sim:
            with process([sys.executable, "-c", "import time; time.sleep(3600)"]) as sleeper:
                results.append(("python sleeping (floor)", cpu_pct_of_one_core(sleeper.pid, args.warmup, args.seconds)))
            setups = [
                ("collector, Ollama (sim) up", ["--ollama", sim.base_url]),
                ("collector, demo mode (+ /sim/gpu)", ["--ollama", sim.base_url, "--demo"]),
                (WATCHING_ALL, ["--ollama", sim.base_url, "--demo", "--ollama-log", str(log_file)]),
                ("collector, Ollama down (backing off)", ["--ollama", f"127.0.0.1:{free_port()}"]),
            ]
            for label, extra in setups:
                for suffix, cwd in checkouts:
                    with tempfile.TemporaryDirectory() as tmp:
                        data = Path(tmp)
                        cmd = [sys.executable, "-m", "collectors", "--data", tmp, "--listen", "127.0.0.1:0"]
                        with process([*cmd, "--interval", "1", *extra], data, cwd) as proc:
                            wait_started_up(tmp, label + suffix)
                            results.append((label + suffix, cpu_pct_of_one_core(proc.pid, args.warmup, args.seconds)))

    print(f"idle CPU at 1 Hz sampling, {args.seconds:g} s window each, on {os.cpu_count()} cores (% of one core):")
    floor = results[0][1]
    for label, pct in results:
        ok = pct < TARGET_PCT
        verdict = "" if label.startswith("python") else (f"  OK (< {TARGET_PCT}%)" if ok else f"  OVER TARGET (>= {TARGET_PCT}%)")
        print(f"  {label:<50} {pct:6.2f} %   (floor + {pct - floor:5.2f}){verdict}")
    shares = {label: pct for label, pct in results if label.startswith(WATCHING_ALL)}
    figures = ", ".join(f"{v:.2f}%{k[len(WATCHING_ALL) :]}" for k, v in shares.items())
    print(
        f"idle share, watching the runner, the log and the GPU source: {figures} of one core "
        f"(target < {TARGET_PCT}%); load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
