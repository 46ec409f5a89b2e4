"""Page switches in a real browser: how long from a click in the sidebar to the page's first content.

    .venv/bin/python bench/page_switch.py [--store DIR] [--requests 100000] [--rounds 5] [--window "24 h"]

Fills a store like ``bench/pages_refresh.py`` (24 hours of 1 Hz GPU and host samples and 100,000
requests, through the collector's own writer) or reuses ``--store DIR``, starts ``streamlit run
app.py`` on it (``PHASEWATCH_COLLECTOR=off``: the app reads the store and starts nothing), opens it
in Debian's Chromium through Playwright, picks the time window, then clicks Requests, Why and Live
in turn, ``--rounds`` times. For each page it prints, as median and worst:

- first content: the page's title and its first piece of content from this run (Requests: the
  table; Why: a metric or a drawn chart; Live: a metric) are on screen;
- complete: the script has finished and nothing on the page is left stale.

The target is first content within 1 s (ratio < 1.00 meets it). Times are taken inside the page
(``performance.now()``, checked every animation frame), so Playwright's own round trips do not count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pages_refresh import fill
from store.schema import db_path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
TARGET_S = 1.0
WINDOWS = ("1 min", "5 min", "15 min", "1 h", "6 h", "24 h")
# What counts as a page's first content, beside its title.
FIRST_CONTENT = {
    "Requests": '[data-testid="stDataFrame"]',
    "Why": '[data-testid="stMetric"], [data-testid="stPlotlyChart"] .main-svg',
    "Live": '[data-testid="stMetric"]',
}

# Clicks the sidebar link, then checks every animation frame; resolves with seconds to first content and to complete.
SWITCH_JS = r"""async ([title, selector]) => {
  const main = () => document.querySelector('[data-testid="stMain"]');
  const fresh = (el) => !el.closest('[data-stale="true"]');  // drawn by this run, not left from the last page
  const shown = (el) => el.getBoundingClientRect().height > 0 && fresh(el);
  const titled = () => Array.from(main().querySelectorAll('h1')).some(h => h.innerText.trim() === title && shown(h));
  const content = () => Array.from(main().querySelectorAll(selector)).some(shown);
  const done = () => document.querySelector('[data-testid="stApp"]').getAttribute('data-test-script-state') === 'notRunning'
                     && !main().querySelector('[data-stale="true"]');
  const link = Array.from(document.querySelectorAll('[data-testid="stSidebarNav"] a'))
                    .find(a => a.innerText.trim().split(/\s+/).pop() === title);
  const t0 = performance.now();
  link.click();
  let first = null;
  await new Promise(r => requestAnimationFrame(r));  // the click's own rerun starts before "done" can mean anything
  while (performance.now() - t0 < 60000) {
    if (first === null && titled() && content()) first = performance.now() - t0;
    if (first !== null && done()) return [first / 1000, (performance.now() - t0) / 1000];
    await new Promise(r => requestAnimationFrame(r));
  }
  return [first === null ? null : first / 1000, null];
}"""


def start_app(data_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    from tests.support.sim_process import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
    env.update(PHASEWATCH_DATA=str(data_dir), PHASEWATCH_COLLECTOR="off", PYTHONUNBUFFERED="1")
    cmd = [
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
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"the app did not start: {log_path.read_text(errors='replace')[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--store", type=Path, help="data folder to fill (or reuse when it holds a store)")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", default="24 h", choices=WINDOWS, help="the sidebar's time window (default 24 h)")
    args = ap.parse_args()
    data_dir = args.store or Path(tempfile.mkdtemp(prefix="pw-switch-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    if not db_path(data_dir).exists():
        print(f"filling {db_path(data_dir)} ...", flush=True)
        fill(data_dir, args.requests, time.time())
    print(f"store: {db_path(data_dir)} ({db_path(data_dir).stat().st_size / 1e6:.0f} MB), window {args.window}", flush=True)

    from playwright.sync_api import sync_playwright

    proc, url = start_app(data_dir, data_dir / "page_switch_app.log")
    times: dict[str, list[tuple[float | None, float | None]]] = {title: [] for title in FIRST_CONTENT}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # The window is picked on Lab: on Live, a change made while a fragment redraws can be lost (seen here).
            page.goto(url + "/lab")
            ready = """() => document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state')
                       === 'notRunning' && document.querySelector('[data-testid="stSidebarNav"] a')"""
            page.wait_for_function(ready, polling=50, timeout=120_000)
            page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"] input').first.click()
            page.get_by_role("option", name=args.window, exact=True).click()
            page.wait_for_function(ready, polling=50, timeout=120_000)
            order = ["Requests", "Why", "Live"]
            page.evaluate(SWITCH_JS, ["Live", FIRST_CONTENT["Live"]])  # warm: imports and caches of a first visit
            for title in order[:-1]:
                page.evaluate(SWITCH_JS, [title, FIRST_CONTENT[title]])
            for _ in range(args.rounds):
                for title in order:
                    first, complete = page.evaluate(SWITCH_JS, [title, FIRST_CONTENT[title]])
                    times[title].append((first, complete))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(15)

    print(f"\npage switch, click → first content (target {TARGET_S:.1f} s) and → complete; {args.rounds} rounds:")
    for title, runs in times.items():
        firsts = [f for f, _ in runs if f is not None]
        completes = [c for _, c in runs if c is not None]
        if not firsts:
            print(f"  {title:<9} first content never shown")
            continue
        med = statistics.median(firsts)
        line = f"  {title:<9} first content {med * 1000:6.0f} ms (worst {max(firsts) * 1000:6.0f})"
        if completes:
            line += f"   complete {statistics.median(completes) * 1000:6.0f} ms (worst {max(completes) * 1000:6.0f})"
        print(line + f"   ratio {med / TARGET_S:4.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
