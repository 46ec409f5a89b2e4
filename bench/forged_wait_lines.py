"""The collector while a client floods Ollama's log with runner launch lines on new slot ids (issue 39, finding F9).

Starts ``python -m sim --engine llama-server --log-file F`` (the real llama.cpp runner, its output in Ollama's log
as Ollama writes it), a collector from ``--repo`` (this checkout, or another to compare: ``git archive <commit> |
tar -x -C /tmp/before`` then ``--repo /tmp/before``) proxying it with ``--ollama-log F``, and a client asking ``GET
/api/version`` through the proxy back to back. The attack is an ordinary request: a grammar of ``--lines`` launch
lines, each on a new slot id, sent to the runner's ``/completion``; llama-server echoes the invalid grammar into the
log verbatim, one line per line. Twice, each followed by ``--window`` seconds; then the worst and median proxied
answer in each window and after, the collector's memory (VmRSS) before and after; then a third flood and, a second
after it, SIGTERM: how long the collector takes to exit. Then
``import-log`` of the same log into a fresh folder, timed.

    .venv/bin/python bench/forged_wait_lines.py [--lines 15000] [--window 20] [--repo PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.hostile_log_stall import Client, row, rss_mb  # noqa: E402
from tests.support.engine_process import MODEL, engine_state, start_server_engine  # noqa: E402
from tests.support.sim_process import free_port  # noqa: E402


def flood(runner_url: str, first_slot: int, n: int) -> tuple[int, float]:
    """Have the runner echo ``n`` launch lines on new slot ids into the log; (bytes sent, seconds it took)."""
    lines = [
        f"slot launch_slot_: id {first_slot + i} | task {5_000_000 + first_slot + i} | processing task, is_child = 0"
        for i in range(n)
    ]
    body = json.dumps({"prompt": "x", "n_predict": 1, "grammar": "root ::= \n" + "\n".join(lines) + "\n"}).encode()
    req = urllib.request.Request(runner_url + "/completion", data=body, headers={"Content-Type": "application/json"})
    start = time.monotonic()
    with contextlib.suppress(urllib.error.HTTPError):  # the grammar is refused (400): it was printed first
        urllib.request.urlopen(req, timeout=300).read()
    return len(body), time.monotonic() - start


def wait_answered(url: str, collector: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/api/version", timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline or collector.poll() is not None:
                raise RuntimeError("the collector did not answer") from None
            time.sleep(0.2)


def import_seconds(repo: Path, log: Path) -> tuple[float, str]:
    with tempfile.TemporaryDirectory(prefix="pw-import-") as folder:
        start = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "collectors.import_log", "--data", folder, str(log)],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        said = out.stdout.strip().splitlines() or out.stderr.strip().splitlines()  # the summary, else why not
        return time.monotonic() - start, said[-1] if said else f"exit {out.returncode}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=15_000, help="launch lines per flood (default 15000)")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured after each flood (default 20)")
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout whose collector runs (default this one)")
    ap.add_argument("--no-import", action="store_true", help="skip the import-log timing")
    args = ap.parse_args()
    print(f"collector from {args.repo}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="pw-f9-") as folder:
        log = Path(folder) / "ollama.log"
        with start_server_engine("--log-file", str(log)) as sim:
            listen = f"127.0.0.1:{free_port()}"
            cmd = [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", listen]
            cmd += ["--data", str(Path(folder) / "data"), "--ollama-log", str(log)]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PHASEWATCH_", "OLLAMA_"))}
            collector = subprocess.Popen(cmd, cwd=args.repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"http://{listen}"
            client = Client(url)
            sigterm_s = float("nan")
            try:
                wait_answered(url, collector)
                urllib.request.urlopen(  # the runner starts, and the collector finds it
                    urllib.request.Request(
                        url + "/api/generate",
                        data=json.dumps({"model": MODEL, "prompt": "", "keep_alive": "10m"}).encode(),
                        headers={"Content-Type": "application/json"},
                    ),
                    timeout=120,
                ).read()
                runner = engine_state(sim)["runner"]["base_url"]
                time.sleep(12.0)  # a discovery round: the runner is known, its -np read
                rss_before = rss_mb(collector.pid)
                client.start()
                base = time.monotonic()
                time.sleep(5.0)
                print(f"{'window':<34} {'worst answer':>14} {'median':>10} {'answers':>8}", flush=True)
                row("baseline", *client.worst_s(base, time.monotonic()))
                for k in range(2):
                    start = time.monotonic()
                    size, took = flood(runner, 1000 + k * args.lines, args.lines)
                    print(f"flood {k + 1}: {args.lines} lines, {size / 1e6:.2f} MB, the runner took {took:.1f} s", flush=True)
                    time.sleep(args.window)
                    end = time.monotonic()
                    while not any(s > end for s, _ in client.times):  # the request in flight has answered
                        time.sleep(0.1)
                    row(f"flood {k + 1} and {args.window:g} s after", *client.worst_s(start, end))
                after = time.monotonic()
                time.sleep(10.0)
                row("the 10 s after", *client.worst_s(after, time.monotonic()))
                client.stop.set()
                client.join()
                rss_after = rss_mb(collector.pid)
                print(f"collector RSS: {rss_before:.0f} MB before, {rss_after:.0f} MB after", flush=True)
                flood(runner, 1000 + 2 * args.lines, args.lines)  # a third, and SIGTERM while it is read
                time.sleep(1.0)
            finally:
                client.stop.set()
                start = time.monotonic()
                collector.terminate()
                try:
                    collector.wait(timeout=60)
                    sigterm_s = time.monotonic() - start
                except subprocess.TimeoutExpired:
                    collector.kill()
                    collector.wait()
            took = f"{sigterm_s:.2f} s" if sigterm_s == sigterm_s else "did not exit within 60 s (killed)"
            print(f"SIGTERM 1 s after a third flood, to exit: {took}; client errors: {client.errors}", flush=True)
        if args.no_import:
            return 0
        took_s, summary = import_seconds(args.repo, log)
        print(f"import-log of that log ({log.stat().st_size / 1e6:.2f} MB) into a fresh folder: {took_s:.1f} s; {summary}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
