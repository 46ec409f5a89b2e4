"""The collector's worst proxied answer time while it reads a hostile line in Ollama's log (issue 29, finding 1).

Starts ``python -m sim``, a collector from ``--repo`` (this checkout, or another to compare:
``git archive <commit> | tar -x -C /tmp/before`` then ``--repo /tmp/before``) proxying it with
``--ollama-log`` on a file, and a client asking ``GET /api/version`` through the proxy back to back. After a
quiet baseline, each ``--sizes`` line (KB) of one repeated fragment is appended to the log, and the client's
answer times are kept for ``--window`` seconds after it (and until the request in flight then answers, however
long it takes). ``--shapes``: the fragments alone, or after a runner line's own prefix. Then the collector's
memory (VmRSS) and its CPU over ``--idle`` quiet seconds.

    .venv/bin/python bench/hostile_log_stall.py [--sizes 14,28] [--window 15] [--repo PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.sim_process import free_port, start_sim  # noqa: E402

# The fragment the campaign used: a task line's words, again and again, in one line.
FRAGMENT = "id 0 | task 0 | new prompt, "
# The same inside a line that starts as a real slot line does (the runner's own prefix, then the fragments).
SLOT_PREFIX = "slot   operator(): id  0 | task 1 | "


class Client(threading.Thread):
    """GET /api/version through the proxy, back to back; (start, answer time) of each."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.times: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                with opener.open(self.url + "/api/version", timeout=600) as resp:
                    resp.read()
            except OSError:
                self.errors += 1
            self.times.append((start, time.monotonic() - start))
            time.sleep(0.02)

    def worst_s(self, since: float, until: float) -> tuple[float, float, int]:
        """(worst, median, count) of the answers to requests started in [since, until]."""
        took = [t for s, t in self.times if since <= s <= until]
        return (max(took), statistics.median(took), len(took)) if took else (float("nan"), float("nan"), 0)


def row(name: str, worst_s: float, median_s: float, n: int) -> None:
    print(f"{name:<34} {worst_s * 1000:>11.1f} ms {median_s * 1000:>7.1f} ms {n:>8}", flush=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="14,28", help="hostile line sizes in KB, comma-separated (default 14,28)")
    ap.add_argument("--window", type=float, default=15.0, help="seconds measured after each line (default 15)")
    ap.add_argument("--idle", type=float, default=10.0, help="quiet seconds for the idle CPU at the end (default 10)")
    ap.add_argument("--shapes", default="bare,slot", help="bare (the fragments alone), slot (after a runner's prefix)")
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout whose collector runs (default this one)")
    args = ap.parse_args()
    sizes_kb = [int(s) for s in args.sizes.split(",") if s]
    shapes = [(name, prefix) for name, prefix in (("bare", ""), ("slot", SLOT_PREFIX)) if name in args.shapes.split(",")]
    print(f"collector from {args.repo}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with start_sim() as sim, tempfile.TemporaryDirectory(prefix="pw-hostile-") as folder:
        log = Path(folder) / "ollama.log"
        log.write_text("")
        listen = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", listen]
        cmd += ["--data", str(Path(folder) / "data"), "--ollama-log", str(log)]
        env = {k: v for k, v in os.environ.items() if k != "PHASEWATCH_TOKEN"}
        collector = subprocess.Popen(cmd, cwd=args.repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = Client(f"http://{listen}")
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://{listen}/api/version", timeout=2).read()
                    break
                except OSError:
                    if time.monotonic() > deadline or collector.poll() is not None:
                        raise RuntimeError("the collector did not answer") from None
                    time.sleep(0.2)
            time.sleep(3.0)  # the log tail has started (at the file's end)
            client.start()
            base_start = time.monotonic()
            time.sleep(args.window)
            print(f"{'while the log held':<34} {'worst answer':>14} {'median':>10} {'answers':>8}", flush=True)
            row("baseline (no hostile line)", *client.worst_s(base_start, time.monotonic()))
            for kb in sizes_kb:
                for name, prefix in shapes:
                    line = (prefix + FRAGMENT * (kb * 1024 // len(FRAGMENT) + 1))[: kb * 1024]
                    start = time.monotonic()
                    with log.open("a") as f:
                        f.write(line + "\n")
                    time.sleep(args.window)
                    end = time.monotonic()
                    while not any(s > end for s, _ in client.times):  # the request in flight has answered
                        time.sleep(0.1)
                    row(f"{kb} KB line, {name}", *client.worst_s(start, end))
            client.stop.set()
            client.join()
            rss = rss_mb(collector.pid)
            cpu0 = cpu_s(collector.pid)
            time.sleep(args.idle)
            idle_pct = (cpu_s(collector.pid) - cpu0) / args.idle * 100
            assert collector.poll() is None, f"the collector exited with {collector.returncode}"
        finally:
            client.stop.set()
            collector.terminate()
            try:
                collector.wait(timeout=30)
            except subprocess.TimeoutExpired:  # its loop is held (the code before): SIGTERM waits for it
                collector.kill()
                collector.wait()
    print(
        f"client errors: {client.errors}; collector afterwards: RSS {rss:.0f} MB, idle CPU {idle_pct:.1f}% over {args.idle:g} s"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
