"""What one open Live tab costs the Streamlit server, side by side: no tab, one idle tab, one tab with 4 streams.

    .venv/bin/python bench/live_cost.py [--measure-s 30] [--app-dir DIR]

Starts the simulator (RTX 4090, 4 slots), the collector in front of it and ``streamlit run app.py`` (from
``--app-dir``, default this checkout: point it at another checkout to compare), all on free loopback ports.
Then measures the Streamlit server process's CPU time (user + system, psutil) over ``--measure-s`` in three
conditions, one after another in the same run:

- no tab open;
- one Live tab in Chromium, nothing running (measured once the page has had time to notice it is idle);
- the same tab while 4 generations stream through the proxy (each restarted when it ends).

Prints each as % of one core beside its target (idle ≤ 5%, streaming ≤ 15%) and their ratio (< 1.00 meets it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.support import CHROMIUM, CHROMIUM_ARGS, wait_ready, wait_until
from tests.support.sim_process import free_port, start_sim

IDLE_TARGET_PCT = 5.0
STREAMING_TARGET_PCT = 15.0
SETTLE_S = 40.0  # the Live page slows down after 30 s with nothing running
MODEL = "llama3.2:latest"


def cpu_pct(proc: psutil.Process, seconds: float) -> float:
    """CPU time the process used over ``seconds`` of wall time, as % of one core."""
    t0 = proc.cpu_times()
    w0 = time.monotonic()
    time.sleep(seconds)
    t1 = proc.cpu_times()
    return 100 * ((t1.user - t0.user) + (t1.system - t0.system)) / (time.monotonic() - w0)


def stream_forever(proxy: str, stop: threading.Event, seed: int) -> None:
    """One client: long streamed generations, one after another, until ``stop``."""
    while not stop.is_set():
        body = {
            "model": MODEL,
            "prompt": f"Tell a long story number {seed}.",
            "stream": True,
            "options": {"num_predict": 4000, "seed": seed},
        }
        req = urllib.request.Request(f"http://{proxy}/api/generate", data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                while not stop.is_set() and r.readline():
                    pass
        except OSError:
            time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure-s", type=float, default=30.0)
    ap.add_argument("--app-dir", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args()
    app_dir = args.app_dir.resolve()
    python = sys.executable
    data_dir = Path(tempfile.mkdtemp(prefix="phasewatch-live-cost-"))
    with start_sim("--hardware", "rtx-4090", "--num-parallel", "4") as sim:
        proxy = f"127.0.0.1:{free_port()}"
        collector = subprocess.Popen(
            [python, "-m", "collectors", "--ollama", sim.base_url, "--listen", proxy, "--data", str(data_dir), "--demo"],
            cwd=app_dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
        env.update(PHASEWATCH_DATA=str(data_dir), OLLAMA_HOST=sim.base_url, PHASEWATCH_LISTEN=proxy, PHASEWATCH_COLLECTOR="off")
        app = subprocess.Popen(
            [
                python,
                "-m",
                "streamlit",
                "run",
                "app.py",
                "--server.port",
                str(port),
                "--server.address",
                "127.0.0.1",
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
            ],
            cwd=app_dir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200, 60, "Streamlit")
            # Load the model once so that every condition sees it loaded.
            warm = {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 4}}
            urllib.request.urlopen(
                urllib.request.Request(f"http://{proxy}/api/generate", data=json.dumps(warm).encode()), timeout=60
            ).read()
            server = psutil.Process(app.pid)
            print(f"app: {app_dir}; measuring {args.measure_s:.0f} s per condition", flush=True)
            results: list[tuple[str, float, float | None]] = []
            time.sleep(3)
            results.append(("no tab open", cpu_pct(server, args.measure_s), None))
            print(f"  no tab: {results[-1][1]:.1f}%", flush=True)

            from playwright.sync_api import sync_playwright

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1800})
                page.goto(url)
                wait_ready(page)
                time.sleep(SETTLE_S)
                results.append(("one Live tab, idle", cpu_pct(server, args.measure_s), IDLE_TARGET_PCT))
                print(f"  one tab, idle: {results[-1][1]:.1f}%", flush=True)
                stop = threading.Event()
                clients = [threading.Thread(target=stream_forever, args=(proxy, stop, i), daemon=True) for i in range(4)]
                for c in clients:
                    c.start()
                time.sleep(5)  # the page notices and speeds up
                results.append(("one Live tab, 4 streaming", cpu_pct(server, args.measure_s), STREAMING_TARGET_PCT))
                stop.set()
                page.screenshot(path=str(data_dir / "live_cost_streaming.png"), full_page=True)
                browser.close()
            print(f"\nStreamlit server CPU, % of one core, {args.measure_s:.0f} s each ({app_dir}):")
            print(f"  {'condition':<28} {'measured':>9} {'target':>7} {'ratio':>6}")
            for label, pct, target in results:
                t = "—" if target is None else f"≤ {target:.0f}%"
                r = "" if target is None else f"{pct / target:.2f}"
                print(f"  {label:<28} {pct:>8.1f}% {t:>7} {r:>6}")
            print(f"  (screenshot while streaming: {data_dir / 'live_cost_streaming.png'})")
        finally:
            for p in (app, collector):
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
