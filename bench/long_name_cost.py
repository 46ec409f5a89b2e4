"""What one long model name costs the Streamlit server with a Live tab open, this checkout beside another.

    .venv/bin/python bench/long_name_cost.py [--name-mb 1] [--text-mb 30] [--measure-s 15] [--compare DIR]

Fills a store with the page fixture (about 20 requests over 10 minutes, one still decoding, so the Live page
refreshes every second) plus one request whose model is named ``--name-mb`` MB long (and loaded), with
``--text-mb`` MB of prompt and as much reply recorded. For this checkout (and ``--compare DIR``, e.g. a worktree
of main, after it): starts ``streamlit run app.py`` on that store, opens the Live tab in headless Chromium and measures the server
process's CPU time (user + system, psutil) over ``--measure-s`` and its peak RSS; then times opening Requests on
the long request (``?request=``) until the page settles. A thread writes GPU and host samples and the
heartbeat each second meanwhile, as a collector would. Screenshots go to artifacts/ (``$PHASEWATCH_ARTIFACTS``).
Issue 25 #7's target: the Live tab with a 1 MB name costs what it does without one (≤ 15% of a core here).
"""

from __future__ import annotations

import argparse
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

from analysis.records import HostSample, LoadedModel
from bench.pages_fixture import GIB, Shape, build_fixture_store, gpu_sample, make_request, status_rows
from store.ops import PutGpuSamples, PutHostSample, PutLoadedModels, PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS, screenshot, wait_ready, wait_until
from tests.support.sim_process import free_port

LIVE_TARGET_PCT = 15.0
SETTLE_S = 5.0
LONG_ID = "long-name-request"


def fill(data_dir: Path, name_mb: float, text_mb: float) -> None:
    now = time.time()
    build_fixture_store(data_dir, now)
    text = "t" * int(text_mb * 1e6) if text_mb else None
    long = make_request(
        now - 50,
        now - 600,
        model="m" * int(name_mb * 1e6) + ":latest",
        shape=Shape(output_tokens=40),
        prompt_text=text,
        response_text=text,
        request_id=LONG_ID,
    )
    w = StoreWriter(db_path(data_dir))
    try:
        w.write(PutRequest(long))
        # Loaded too (issue 25 #7: a 10 MB loaded name hung the browser tab).
        w.write(
            PutLoadedModels(
                now - 1,
                [
                    LoadedModel(
                        now - 1, long.model, long.model, "c" * 64, 2 * GIB, 2 * GIB, 8192, now + 3600, "3.2B", "Q4_K_M", "llama"
                    )
                ],
            )
        )
    finally:
        w.close()


class Sampler(threading.Thread):
    """Writes what a collector would each second (GPU and host samples, its heartbeat), so the page stays live."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(daemon=True)
        self.data_dir, self.stop = data_dir, threading.Event()

    def run(self) -> None:
        w = StoreWriter(db_path(self.data_dir))
        try:
            while not self.stop.wait(1.0):
                now = time.time()
                w.write(PutGpuSamples([gpu_sample(now, 40.0)]))
                w.write(PutHostSample(HostSample(now, 25.0, int(12 * GIB), int(32 * GIB), 8.0, int(1.5 * GIB))))
                status_rows(w, now, self.data_dir)
        finally:
            w.close()


class PeakRss(threading.Thread):
    def __init__(self, proc: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.proc, self.peak, self.stop = proc, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.2)


def measure(app_dir: Path, args: argparse.Namespace, shot: str) -> tuple[float, int, float | None]:
    """(server CPU % of one core with the Live tab open, peak server RSS in bytes, s to open Requests on it), on a
    store filled just before (its times are relative to now)."""
    data_dir = Path(tempfile.mkdtemp(prefix="phasewatch-long-name-"))
    fill(data_dir, args.name_mb, args.text_mb)
    measure_s = args.measure_s
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
    env.update(PHASEWATCH_DATA=str(data_dir), PHASEWATCH_COLLECTOR="off")
    app = subprocess.Popen(
        [
            sys.executable,
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
    sampler = Sampler(data_dir)
    sampler.start()
    server = psutil.Process(app.pid)
    rss = PeakRss(server)
    rss.start()
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200, 60, "Streamlit")
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(url)
            page.wait_for_selector('[data-testid="stApp"][data-test-connection-state="CONNECTED"]', timeout=UI_TIMEOUT_MS)
            time.sleep(SETTLE_S)  # the page's first run and the browser's first drawing
            t0, w0 = server.cpu_times(), time.monotonic()
            time.sleep(measure_s)
            t1 = server.cpu_times()
            pct = 100 * ((t1.user - t0.user) + (t1.system - t0.system)) / (time.monotonic() - w0)
            try:
                screenshot(page, f"long_name_{shot}_live")  # once every chart is drawn (up to 20 s)
            except Exception as exc:  # a tab too busy to draw is a result, said as such
                print(f"  no Live screenshot (the tab did not draw): {type(exc).__name__}", flush=True)
            opened_s: float | None = None
            started, cpu0 = time.monotonic(), server.cpu_times()
            try:
                page.goto(f"{url}/requests?request={LONG_ID}", timeout=120_000)
                page.get_by_text("Prompt and reply text").first.wait_for(timeout=120_000)
                wait_ready(page)
                opened_s = time.monotonic() - started
                cpu1 = server.cpu_times()
                print(
                    f"  {shot}: Requests opened in {opened_s:.1f} s, "
                    f"{(cpu1.user - cpu0.user) + (cpu1.system - cpu0.system):.1f} s of it server CPU",
                    flush=True,
                )
                screenshot(page, f"long_name_{shot}_requests")
            except Exception as exc:  # a page that never settles is a result, said as such
                print(f"  Requests did not settle: {type(exc).__name__}", flush=True)
            browser.close()
        return pct, rss.peak, opened_s
    finally:
        rss.stop.set()
        sampler.stop.set()
        app.terminate()
        try:
            app.wait(10)
        except subprocess.TimeoutExpired:
            app.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name-mb", type=float, default=1.0)
    ap.add_argument("--text-mb", type=float, default=30.0)
    ap.add_argument("--measure-s", type=float, default=15.0)
    ap.add_argument("--compare", type=Path, help="another checkout to measure after this one (e.g. a worktree of main)")
    args = ap.parse_args()
    checkouts = [("this", Path(__file__).resolve().parents[1])]
    if args.compare:
        checkouts.append(("compare", args.compare.resolve()))
    results = []
    for label, app_dir in checkouts:
        print(f"{label}: {app_dir}", flush=True)
        results.append((label, app_dir, *measure(app_dir, args, label)))
    print(
        f"\nOne request named {args.name_mb:g} MB among ~20, {args.text_mb:g} MB prompt + reply; Live tab open "
        f"{args.measure_s:.0f} s:"
    )
    print(f"  {'checkout':<9} {'server CPU':>11} {'target':>7} {'ratio':>6} {'peak RSS':>9} {'Requests opens in':>18}")
    for label, _, pct, peak, opened in results:
        opened_text = "never" if opened is None else f"{opened:.1f} s"
        print(f"  {label:<9} {pct:>10.1f}% {'≤ 15%':>7} {pct / LIVE_TARGET_PCT:>6.2f} {peak / 1e9:>7.2f} GB {opened_text:>18}")
    print(f"  (screenshots: {ARTIFACTS}/long_name_*_live.png, long_name_*_requests.png)")


if __name__ == "__main__":
    main()
