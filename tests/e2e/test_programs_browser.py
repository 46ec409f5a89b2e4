"""Which program sent each request, in Debian's Chromium: the official ``ollama`` client (this process) and a second
program with its own User-Agent (urllib, another process) through the proxy in front of sim. On Requests the Program
filter keeps one and the Download CSV holds only its rows with its program and process; on Live each running card
names its program and process.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import ollama
import pytest
from playwright.sync_api import Browser

from analysis.records import Outcome
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import page_report, run_app, screenshot, wait_ready, wait_until
from tests.support.proxy_thread import ProxyThread
from tests.support.record_checks import MODEL

# Requests of ~0.6 s (the "cpu" profile): each client's socket is open while the collector looks its process up.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.sim_args("--hardware", "cpu")]

_BOT = """
import json, os, sys, urllib.request
print(os.getpid(), flush=True)
body = json.dumps({"model": sys.argv[2], "prompt": "hi from the bot", "stream": False, "options": {"num_predict": 64}})
req = urllib.request.Request(sys.argv[1] + "/api/generate", data=body.encode(), headers={"User-Agent": "report-bot/2.1"})
with urllib.request.urlopen(req, timeout=60) as r:
    r.read()
"""


def test_requests_and_live_tell_two_programs_apart(proxy: ProxyThread, browser: Browser, tmp_path: Path) -> None:
    ollama.Client(host=proxy.base_url, timeout=60).generate(model=MODEL, prompt="hi", options={"num_predict": 64})
    bot = subprocess.run([sys.executable, "-c", _BOT, proxy.base_url, MODEL], capture_output=True, text=True, timeout=60)
    assert bot.returncode == 0, bot.stderr
    bot_pid = int(bot.stdout.split()[0])
    records = proxy.wait_records(2)
    data = tmp_path / "data"
    data.mkdir()
    writer = StoreWriter(db_path(data))
    try:
        writer.apply([PutRequest(r) for r in records])
    finally:
        writer.close()

    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        context = browser.new_context(viewport={"width": 1600, "height": 1400}, accept_downloads=True)
        page = context.new_page()
        try:
            page.goto(url + "/requests")
            wait_ready(page)
            screenshot(page, "requests-programs")
            page.get_by_role("combobox", name="Program").click()
            page.get_by_role("option", name="report-bot").click()
            wait_ready(page)
            with page.expect_download(timeout=60_000) as download:
                page.get_by_role("button", name="Download CSV").click()
            rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
            screenshot(page, "requests-programs-filtered")

            # Live: a running copy of each request, written now (Live shows what runs, and what ended in the last 8 s).
            now = time.time()
            running = [
                replace(r, id=f"run-{r.id}", started_at_unix_s=now - 1, outcome=Outcome.IN_FLIGHT, final_chunk_ns=None)
                for r in records
            ]
            writer = StoreWriter(db_path(data))
            try:
                writer.apply([PutRequest(r) for r in running])
            finally:
                writer.close()
            page.goto(url + "/")
            wait_ready(page)
            cards = page.locator('[class*="st-key-card_run-"]')
            wait_until(lambda: cards.count() == 2, 30, "two running cards\n" + page_report(page))
            texts = cards.all_inner_texts()
            screenshot(page, "live-programs")
        finally:
            context.close()

    assert [(r["client_program"], r["client_program_version"], r["client_pid"]) for r in rows] == [
        ("report-bot", "2.1", str(bot_pid))
    ]
    assert any(f"report-bot 2.1 · python (pid {bot_pid}" in t for t in texts), texts
    assert any("ollama-python" in t for t in texts), texts
