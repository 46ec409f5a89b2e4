"""One export (issue 42): the Requests page's Download CSV, clicked in Debian's Chromium, is the file
``python -m store export --format csv`` writes for the same window (the page's default 5 min): the same columns,
the same rows, times in UTC with their zone. The requests are real (through the recording proxy to sim, into a real
store), with two older ones outside the window that neither may hold."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from store.export import EXPORT_KEYS
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import REPO, run_app, screenshot, wait_ready
from tests.support.proxy_thread import ProxyThread
from tests.support.records import make_record

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _generate(base_url: str, prompt: str) -> None:
    body = {"model": "qwen2.5:0.5b", "prompt": prompt, "stream": True, "options": {"num_predict": 3}}
    req = urllib.request.Request(base_url + "/api/generate", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def test_the_pages_csv_is_store_exports_file(proxy: ProxyThread, browser: Browser, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for prompt in ("one", "two words", "three words here"):
        _generate(proxy.base_url, prompt)
    records = proxy.wait_records(3)
    now = time.time()
    old = [make_record(f"old-{i}", now - age_s) for i, age_s in enumerate((1000.0, 3000.0))]  # outside 5 min
    writer = StoreWriter(db_path(data))
    try:
        writer.apply([PutRequest(r) for r in [*records, *old]])
    finally:
        writer.close()

    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        context = browser.new_context(viewport={"width": 1280, "height": 1400}, accept_downloads=True)
        page = context.new_page()
        try:
            page.goto(url + "/requests")
            wait_ready(page)
            with page.expect_download(timeout=60_000) as download:
                page.get_by_role("button", name="Download CSV").click()
            page_csv = Path(download.value.path()).read_text(encoding="utf-8")
            screenshot(page, "requests-export")
        finally:
            context.close()
    cli_csv = subprocess.run(
        [sys.executable, "-m", "store", "export", "--data", str(data), "--format", "csv", "--since", "5m"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout

    page_rows = list(csv.reader(io.StringIO(page_csv, newline="")))
    cli_rows = list(csv.reader(io.StringIO(cli_csv, newline="")))
    assert page_rows[0] == cli_rows[0] == list(EXPORT_KEYS)  # the same columns, in the same order
    assert page_rows[1:] == cli_rows[1:]  # the same rows, cell for cell
    by_id = [dict(zip(page_rows[0], row, strict=True)) for row in page_rows[1:]]
    assert sorted(r["id"] for r in by_id) == sorted(r.id for r in records)  # the window's three, not the old two
    assert all(r["started_at"].endswith("+00:00") for r in by_id)  # UTC, the zone said
