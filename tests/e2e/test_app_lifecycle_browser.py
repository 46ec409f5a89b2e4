"""The app's processes, seen from a real browser: demo mode is the server's, Leave demo ends it, Ctrl-C ends the rest.

- Demo mode survives a reload, a new tab and a deep link (``/why``) in a new browser profile: the
  truth is the running demo, not the browser session that pressed "Start demo".
- "Leave demo" ends every demo process (the demo, its simulator and its collector): checked by pid
  with psutil, the demo process included (the app reaps it: no zombie left).
- Ctrl-C (SIGINT) to ``streamlit run`` also ends the collector the app started for real recordings.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import Browser, Page

from collectors.demo import read_demo_lock, stop_demo
from collectors.lock import read_lock
from tests.e2e.support import REPO, START_TIMEOUT_S, UI_TIMEOUT_MS, screenshot, wait_ready, wait_until
from tests.support.ports import free_port

pytestmark = pytest.mark.browser

DEMO_BANNER = "Demo mode"
DOWN = "Ollama is not answering"


@contextlib.contextmanager
def streamlit_app(data_dir: Path, log_path: Path, env_extra: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``streamlit run app.py`` on a free port, with its process (the test sends it Ctrl-C itself)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
    env.update(PHASEWATCH_DATA=str(data_dir), PYTHONUNBUFFERED="1", **env_extra)
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
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-2000:]
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                return bool(r.status == 200)

        wait_until(healthy, START_TIMEOUT_S, "the Streamlit server")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)


def main_text(page: Page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def says_demo(page: Page) -> bool:
    text = main_text(page)
    return DEMO_BANNER in text and DOWN not in text


def gone(pid: int) -> bool:
    """The process has exited (a zombie has exited too, but someone still owes it a wait: not gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


def exited(pid: int) -> bool:
    """The process no longer runs (an orphan's exit status is its new parent's, init's, to collect)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def test_demo_is_the_servers_and_leave_demo_ends_every_demo_process(browser: Browser, tmp_path: Path) -> None:
    data_dir, demo_dir = tmp_path / "data", tmp_path / "data" / "demo"
    dead_ollama = f"127.0.0.1:{free_port()}"  # nothing listens: the app offers the demo
    try:
        with streamlit_app(data_dir, tmp_path / "app.log", {"OLLAMA_HOST": dead_ollama}) as (app, url):
            first = browser.new_context(viewport={"width": 1400, "height": 1600})
            page = first.new_page()
            page.goto(url)
            wait_ready(page)
            # The app started a collector for real recordings; it finds Ollama down.
            page.get_by_role("button", name="Start demo", exact=True).wait_for(timeout=UI_TIMEOUT_MS)
            real_collector = wait_until(
                lambda: (i := read_lock(data_dir)) is not None and i.pid, START_TIMEOUT_S, "the app's collector"
            )
            page.get_by_role("button", name="Start demo", exact=True).click()
            wait_until(lambda: says_demo(page), 60, "the demo banner after Start demo")
            demo = wait_until(lambda: (i := read_demo_lock(demo_dir)) is not None and i.pid and i, 60, "the demo's lock")
            wait_until(lambda: read_lock(demo_dir) is not None, 60, "the demo's collector")
            screenshot(page, "lifecycle-1-demo-started")

            page.reload()
            wait_ready(page)
            wait_until(lambda: says_demo(page), 30, "demo mode after a reload")
            screenshot(page, "lifecycle-2-after-reload")

            tab = first.new_page()  # a new tab: a new Streamlit session
            tab.goto(url)
            wait_ready(tab)
            wait_until(lambda: says_demo(tab), 30, "demo mode in a new tab")

            other = browser.new_context(viewport={"width": 1400, "height": 1600})  # another profile: nothing shared
            deep = other.new_page()
            deep.goto(url + "/why")
            wait_ready(deep)
            wait_until(
                lambda: deep.locator("h1").first.inner_text().strip() == "Why" and says_demo(deep),
                60,
                "demo mode on a deep link to /why",
            )
            screenshot(deep, "lifecycle-3-deep-link-why")

            # Every process of the demo, by pid: the demo itself, its simulator and its collector.
            demo_proc = psutil.Process(demo.pid)
            assert demo_proc.ppid() == app.pid  # started by this server, so it must reap it
            children = [p.pid for p in demo_proc.children(recursive=True)]
            assert len(children) >= 2, children  # simulator and collector
            demo_pids = [demo.pid, *children]

            page.locator('[data-testid="stSidebar"]').get_by_role("button", name="Leave demo").click()
            wait_until(lambda: DOWN in main_text(page), 60, "the real Ollama's state after Leave demo")
            wait_until(lambda: all(gone(p) for p in demo_pids), 30, "every demo process gone")
            assert read_demo_lock(demo_dir) is None and read_lock(demo_dir) is None
            assert [c.pid for c in psutil.Process(app.pid).children() if c.status() == psutil.STATUS_ZOMBIE] == []
            screenshot(page, "lifecycle-4-left-demo")
            # The other sessions follow (their sidebar looks every 5 s), and none starts the demo again.
            wait_until(lambda: DOWN in main_text(tab) and DEMO_BANNER not in main_text(tab), 30, "the other tab leaving too")
            deep.reload()
            wait_ready(deep)
            assert DEMO_BANNER not in main_text(deep)
            time.sleep(2)
            assert read_demo_lock(demo_dir) is None
            screenshot(deep, "lifecycle-5-deep-link-after-leaving")
            other.close()
            first.close()

            # Ctrl-C to the server: the collector it started for real recordings stops too.
            assert psutil.pid_exists(real_collector)
            app.send_signal(signal.SIGINT)
            app.wait(30)
            wait_until(lambda: exited(real_collector), 30, "the app's collector to stop after Ctrl-C")
            assert read_lock(data_dir) is None
    finally:
        assert stop_demo(demo_dir), "the demo did not stop"
