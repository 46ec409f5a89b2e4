"""Soak: the Live page open in headless Chromium for N minutes, the Streamlit server's memory sampled.

    .venv/bin/python bench/soak_live.py [--minutes 30] [--sample-s 10] [--page live|requests] [--pause]

Starts ``PHASEWATCH_DEMO=1 streamlit run app.py`` on a free loopback port with a temporary
data folder, opens the page in Debian's Chromium through Playwright, and every ``--sample-s``
seconds records the RSS of the Streamlit server process (alone), and separately of the demo's
collector, simulator and demo driver, and of Chromium. Prints a table over time and a summary:
RSS after the warm-up, at the end, growth in MB and per hour, against the target (growth under
50 MB over the soak); requests the demo recorded; whether the page still updated in the last
minute. Saves ``soak_<page>_end.png`` (and the samples as CSV) to ``$PHASEWATCH_ARTIFACTS``
(default ``artifacts/``). ``--page requests`` and ``--pause`` are the comparison runs for
finding where growth comes from (no 1 s fragment on the page / the fragment switched off).
Stops everything it started at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collectors.demo import read_demo_lock, stop_demo  # noqa: E402
from collectors.lock import read_lock  # noqa: E402
from pages.shared.settings import DEMO_SUBDIR  # noqa: E402
from store.schema import db_path  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]
MB = 1024 * 1024
START_TIMEOUT_S = 90.0
UI_TIMEOUT_MS = 60_000
UPDATED_LABEL = "Updated"  # the Live page's clock ("Updated HH:MM:SS"), rewritten by its cards fragment


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = check()
            if last:
                return last
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


def rss_bytes(pid: int | None) -> int | None:
    if not pid:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def sim_pid(demo_pid: int | None) -> int | None:
    """The simulator the demo started (``python -m sim``), a child of the demo process."""
    if not demo_pid:
        return None
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(demo_pid).children():
            cmd = _cmdline(child)
            if "-m" in cmd and "sim" in cmd:
                return int(child.pid)
    return None


def chromium_rss_bytes() -> int | None:
    """Chromium's processes (all of them: browser, renderer, GPU/utility), descendants of this script."""
    total = 0
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "chrom" in p.name().lower():
                    total += p.memory_info().rss
    return total or None


def count_requests(data_dir: Path) -> int | None:
    db = db_path(data_dir)
    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])
    except sqlite3.Error:
        return None


@dataclass
class Sample:
    t_s: float  # since the page first showed
    streamlit_rss_bytes: int | None
    collector_rss_bytes: int | None
    sim_rss_bytes: int | None
    demo_rss_bytes: int | None
    chromium_rss_bytes: int | None
    streamlit_threads: int | None
    requests: int | None
    updated: str | None  # the page's "Updated" metric at that moment
    lag_s: float | None  # how far that clock trails the wall clock (a slow fragment shows here)


def clock_lag_s(updated: str | None, now_unix_s: float) -> float | None:
    """Seconds by which the page's HH:MM:SS clock (local time, as ``pages.shared.fmt.clock``) trails ``now_unix_s``."""
    if not updated:
        return None
    try:
        shown = datetime.strptime(updated, "%H:%M:%S").time()
    except ValueError:
        return None
    now = datetime.fromtimestamp(now_unix_s)
    lag = (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6) - (
        shown.hour * 3600 + shown.minute * 60 + shown.second
    )
    return lag % 86400 if lag < -43200 else lag


def _mb(n: int | None) -> str:
    return "      -" if n is None else f"{n / MB:7.1f}"


def print_header() -> None:
    print(
        f"{'t':>7} {'streamlit':>9} {'Δ':>7} {'collector':>9} {'sim':>7} {'demo':>7} {'chromium':>8} {'thr':>4} "
        f"{'requests':>8}  updated   lag[s]",
        flush=True,
    )
    print(f"{'[min]':>7} {'[MB]':>9} {'[MB]':>7} {'[MB]':>9} {'[MB]':>7} {'[MB]':>7} {'[MB]':>8}", flush=True)


def print_row(s: Sample, base_bytes: int | None) -> None:
    delta = (
        f"{(s.streamlit_rss_bytes - base_bytes) / MB:+7.1f}"
        if s.streamlit_rss_bytes is not None and base_bytes is not None
        else "      -"
    )
    thr = "-" if s.streamlit_threads is None else str(s.streamlit_threads)
    req = "-" if s.requests is None else str(s.requests)
    lag = "-" if s.lag_s is None else f"{s.lag_s:5.1f}"
    print(
        f"{s.t_s / 60:7.2f} {_mb(s.streamlit_rss_bytes):>9} {delta} {_mb(s.collector_rss_bytes):>9} {_mb(s.sim_rss_bytes)} "
        f"{_mb(s.demo_rss_bytes)} {_mb(s.chromium_rss_bytes):>8} {thr:>4} {req:>8}  {s.updated or '-':8}  {lag}",
        flush=True,
    )


def slope_mb_per_h(points: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of RSS over time (MB/h); steadier than two end points."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / den / MB * 3600


@contextlib.contextmanager
def streamlit_app(data_dir: Path, log_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``PHASEWATCH_DEMO=1 streamlit run app.py``; stops the demo it launched and then the server."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
    env.update(PHASEWATCH_DEMO="1", PHASEWATCH_DATA=str(data_dir), PYTHONUNBUFFERED="1")
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
        # Own process group: a Ctrl-C in the terminal reaches only this script, which then stops things in order.
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError("streamlit exited: " + log_path.read_text(errors="replace")[-2000:])
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                return bool(r.status == 200)

        deadline = time.monotonic() + START_TIMEOUT_S
        while not _quiet(healthy):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the Streamlit server did not answer /_stcore/health: " + log_path.read_text(errors="replace")[-2000:]
                )
            time.sleep(0.25)
        yield url, proc
    finally:
        demo_dir = data_dir / DEMO_SUBDIR
        if not stop_demo(demo_dir, timeout_s=15):
            print(f"warning: the demo of {demo_dir} did not stop within 15 s", file=sys.stderr)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _quiet(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except RuntimeError:
        raise
    except Exception:
        return False


def leftovers(data_dir: Path) -> list[psutil.Process]:
    """Processes still running with our temporary data folder on their command line (none expected)."""
    marker = str(data_dir)
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if p.pid != os.getpid() and any(marker in part for part in cmd):
            found.append(p)
    return found


def read_updated(page: Any) -> str | None:
    """The Live page's clock ("Updated HH:MM:SS" under its "now" strip), or an "Updated" metric (other pages)."""
    text: str | None = page.evaluate("""() => document.querySelector('[class*="st-key-live_updated"]')?.innerText.trim()""")
    if text and text.startswith(UPDATED_LABEL + " "):
        return text[len(UPDATED_LABEL) + 1 :]
    values: dict[str, str] = page.evaluate("""() => Object.fromEntries(
        Array.from(document.querySelectorAll('[data-testid="stMetric"]')).map(m => [
            m.querySelector('[data-testid="stMetricLabel"]')?.innerText.trim(),
            m.querySelector('[data-testid="stMetricValue"]')?.innerText.trim()]))""")
    return values.get(UPDATED_LABEL)


def wait_ready(page: Any) -> None:
    page.wait_for_selector('[data-testid="stApp"][data-test-connection-state="CONNECTED"]', timeout=UI_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=UI_TIMEOUT_MS)


def settled_screenshot(page: Any, path: Path, tries: int = 10) -> None:
    """A screenshot taken between two fragment runs (one taken mid-run shows a half-redrawn page)."""
    idle = '[data-testid="stApp"][data-test-script-state="notRunning"]'
    for _ in range(tries):
        wait_ready(page)
        page.wait_for_timeout(300)  # let Plotly finish drawing
        if page.locator(idle).count() == 0:
            continue
        page.screenshot(path=str(path), full_page=True)
        if page.locator(idle).count() == 1:
            return
    print("warning: the page never sat still; the screenshot may show a fragment mid-redraw", file=sys.stderr)


def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def soak(args: argparse.Namespace) -> int:
    from playwright.sync_api import sync_playwright

    artifacts = Path(os.environ.get("PHASEWATCH_ARTIFACTS", REPO / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    tag = args.page + ("_paused" if args.pause else "")
    samples: list[Sample] = []
    page_errors: list[str] = []
    interrupted = False
    first: str | None = None
    second: str | None = None
    with tempfile.TemporaryDirectory(prefix="phasewatch-soak-") as tmp:
        data_dir = Path(tmp) / "data"
        demo_dir = data_dir / DEMO_SUBDIR
        log_path = artifacts / f"soak_{tag}_streamlit.log"
        try:
            with streamlit_app(data_dir, log_path) as (url, proc), sync_playwright() as pw:
                print(f"streamlit pid {proc.pid} at {url}; data {data_dir}; log {log_path}", flush=True)
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_context(viewport={"width": 1400, "height": 2600}).new_page()
                    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
                    page.goto(url + ("/" if args.page == "live" else "/requests"), timeout=UI_TIMEOUT_MS)
                    wait_ready(page)
                    demo = wait_until(
                        lambda: (d := read_demo_lock(demo_dir)) is not None and d.pid > 0 and d, START_TIMEOUT_S, "the demo"
                    )
                    wait_until(lambda: read_lock(demo_dir) is not None, START_TIMEOUT_S, "the demo's collector")
                    if args.pause:
                        page.get_by_text("Pause live updates").click()
                        wait_ready(page)
                    print(
                        f"demo pid {demo.pid}, simulator {demo.sim_url}; soaking {args.minutes:g} min, "
                        f"sample every {args.sample_s:g} s, page {args.page}{' (paused)' if args.pause else ''}",
                        flush=True,
                    )
                    print_header()
                    server = psutil.Process(proc.pid)
                    t0 = time.monotonic()
                    end = t0 + args.minutes * 60
                    next_t = t0
                    while True:
                        if proc.poll() is not None:
                            raise RuntimeError(f"streamlit exited with code {proc.returncode}; see {log_path}")
                        lock = read_lock(demo_dir)
                        demo_info = read_demo_lock(demo_dir)
                        demo_pid = demo_info.pid if demo_info else None
                        threads = None
                        with contextlib.suppress(psutil.Error):
                            threads = server.num_threads()
                        s = Sample(
                            t_s=time.monotonic() - t0,
                            streamlit_rss_bytes=rss_bytes(proc.pid),
                            collector_rss_bytes=rss_bytes(lock.pid if lock else None),
                            sim_rss_bytes=rss_bytes(sim_pid(demo_pid)),
                            demo_rss_bytes=rss_bytes(demo_pid),
                            chromium_rss_bytes=chromium_rss_bytes(),
                            streamlit_threads=threads,
                            requests=count_requests(demo_dir),
                            updated=(updated := _quiet_str(lambda: read_updated(page))),
                            lag_s=clock_lag_s(updated, time.time()),
                        )
                        samples.append(s)
                        print_row(s, samples[0].streamlit_rss_bytes)
                        if time.monotonic() >= end:
                            break
                        next_t += args.sample_s
                        # Playwright's own wait keeps the driver's event loop serviced while we idle.
                        page.wait_for_timeout(max(0.0, min(next_t, end) - time.monotonic()) * 1000)
                        if next_t > end:
                            next_t = end
                    # Does the page still follow? The clock metric must move within a few seconds.
                    first = _quiet_str(lambda: read_updated(page))
                    page.wait_for_timeout(3000)
                    second = _quiet_str(lambda: read_updated(page))
                    shot = artifacts / f"soak_{tag}_end.png"
                    settled_screenshot(page, shot)
                    print(f"screenshot {shot}", flush=True)
                finally:
                    browser.close()
        except KeyboardInterrupt:
            interrupted = True
            first = second = None
            print("\ninterrupted: stopping the app, the demo and the browser", file=sys.stderr, flush=True)
        left = leftovers(data_dir)
        for p in left:  # only processes carrying our own temporary folder
            with contextlib.suppress(psutil.Error):
                p.terminate()
        psutil.wait_procs(left, timeout=10)
        still = leftovers(data_dir)
        for p in still:
            with contextlib.suppress(psutil.Error):
                p.kill()
    write_csv(artifacts / f"soak_{tag}_samples.csv", samples)
    ok = summarise(args, samples, first, second, page_errors, left)
    return 130 if interrupted else (0 if ok else 1)


def _quiet_str(read: Callable[[], str | None]) -> str | None:
    try:
        return read()
    except Exception:
        return None


def write_csv(path: Path, samples: list[Sample]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([fl.name for fl in fields(Sample)])
        for s in samples:
            w.writerow([getattr(s, fl.name) for fl in fields(Sample)])
    print(f"samples {path}", flush=True)


def summarise(
    args: argparse.Namespace,
    samples: list[Sample],
    first: str | None,
    second: str | None,
    page_errors: list[str],
    left: list[psutil.Process],
) -> bool:
    print("\n== summary ==")
    rss = [(s.t_s, s.streamlit_rss_bytes) for s in samples if s.streamlit_rss_bytes is not None]
    if len(rss) < 2:
        print("too few samples for a summary")
        return False
    warm_s = min(args.warmup_min * 60, rss[-1][0] / 2)
    t_w, v_w = min(rss, key=lambda p: abs(p[0] - warm_s))
    t_e, v_e = rss[-1]
    growth_mb = (v_e - v_w) / MB
    span_h = (t_e - t_w) / 3600
    per_h = growth_mb / span_h if span_h > 0 else float("nan")
    fit = slope_mb_per_h([(t, v) for t, v in rss if t >= t_w])
    peak_mb = max(v for _, v in rss) / MB
    print(f"streamlit server RSS at {t_w / 60:.1f} min (after warm-up): {v_w / MB:.1f} MB")
    print(
        f"streamlit server RSS at the end ({t_e / 60:.1f} min):     {v_e / MB:.1f} MB (peak {peak_mb:.1f} MB, "
        f"first sample {rss[0][1] / MB:.1f} MB)"
    )
    print(
        f"growth after warm-up: {growth_mb:+.1f} MB over {(t_e - t_w) / 60:.1f} min = {per_h:+.1f} MB/h by end points"
        + ("" if fit is None else f", {fit:+.1f} MB/h by least squares")
    )
    under = growth_mb < args.target_mb
    print(f"target: growth under {args.target_mb:g} MB over the soak -> {'PASS' if under else 'FAIL'}")
    for label, get in (
        ("collector", lambda s: s.collector_rss_bytes),
        ("sim", lambda s: s.sim_rss_bytes),
        ("demo driver", lambda s: s.demo_rss_bytes),
        ("chromium", lambda s: s.chromium_rss_bytes),
    ):
        vals = [(s.t_s, get(s)) for s in samples if get(s) is not None and s.t_s >= t_w]
        if vals:
            print(f"{label:>12} RSS: {vals[0][1] / MB:.1f} -> {vals[-1][1] / MB:.1f} MB ({(vals[-1][1] - vals[0][1]) / MB:+.1f})")
    reqs = [s.requests for s in samples if s.requests is not None]
    print(
        f"requests recorded by the demo: {reqs[-1] if reqs else 'none'}"
        + (f" ({reqs[-1] - reqs[0]} during the soak)" if reqs else "")
    )
    last_min = {s.updated for s in samples if s.t_s >= samples[-1].t_s - 60 and s.updated}
    following = args.page != "live" or args.pause or (len(last_min) > 1 and first is not None and first != second)
    if args.page == "live" and not args.pause:
        print(
            f"page still updating at the end: {'yes' if following else 'NO'} ({len(last_min)} distinct "
            f"'{UPDATED_LABEL}' values in the last minute; {first} -> {second} over 3 s)"
        )
    lags = sorted(s.lag_s for s in samples if s.lag_s is not None and s.t_s >= t_w)
    if lags:
        print(
            f"'{UPDATED_LABEL}' clock behind the wall clock: median {lags[len(lags) // 2]:.1f} s, max {lags[-1]:.1f} s "
            "(the 1 s fragment's round trip on this machine)"
        )
    if page_errors:
        print(f"JavaScript errors in the page: {len(page_errors)}; first: {page_errors[0][:300]}")
    print(
        f"processes left with the soak's data folder after shutdown: {len(left)}"
        + ("" if not left else " (terminated them: " + ", ".join(str(p.pid) for p in left) + ")")
    )
    return under and following and not page_errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the page stays open (default 30)")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between memory samples (default 10)")
    parser.add_argument("--warmup-min", type=float, default=2.0, help="growth is measured from here (default 2)")
    parser.add_argument("--target-mb", type=float, default=50.0, help="allowed growth of the server's RSS (default 50)")
    parser.add_argument("--page", choices=("live", "requests"), default="live", help="page to keep open (default live)")
    parser.add_argument("--pause", action="store_true", help="switch 'Pause live updates' on (comparison run)")
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return soak(args)
    except RuntimeError as exc:
        print(f"soak failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
