"""A cloud model's running request on the Live page, in Chromium (issue 41): sim plays the cloud model, a long chat
goes through the collector's proxy, and its card writes tokens with no ceiling of this machine, saying why, and never
says Ollama is loading it. Screenshot ``live_cloud.png`` goes to ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page

from collectors.lock import read_lock
from store.schema import db_path
from tests.e2e.support import REPO, START_TIMEOUT_S, _stop, cards_state, page_report, run_app, screenshot, wait_ready, wait_until
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CLOUD = "gpt-oss:120b-cloud"
NUM_PREDICT = 4000  # at sim's 80 tokens/s for ollama.com: under a minute of writing, longer than the page needs


def chat(proxy: str) -> None:
    body = {"model": CLOUD, "messages": [{"role": "user", "content": "a long story"}], "options": {"num_predict": NUM_PREDICT}}
    req = urllib.request.Request(f"http://{proxy}/api/chat", data=json.dumps(body).encode(), method="POST")
    with contextlib.suppress(OSError, http.client.HTTPException), urllib.request.urlopen(req, timeout=300) as r:
        while r.read(65536):  # cut short when sim stops after the test
            pass


def test_a_cloud_request_writing_says_no_local_ceiling_applies(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with start_sim("--hardware", "rtx-4090", "--cloud-model", CLOUD) as sim:
        proxy = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", proxy, "--data", str(data), "--demo"]
        with open(tmp_path / "collector.log", "wb") as log:
            collector = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: (i := read_lock(data)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector")
            wait_until(lambda: db_path(data).exists(), START_TIMEOUT_S, "the store")
            app_log = tmp_path / "app.log"
            with run_app(data, app_log, {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}) as url:
                threading.Thread(target=chat, args=(proxy,), daemon=True).start()
                page.goto(url)
                wait_ready(page)

                def writing() -> bool:
                    text = str(cards_state(page)["text"])
                    return CLOUD in text and "tokens so far" in text and "runs on ollama.com" in text

                try:
                    wait_until(writing, 90, "the cloud card writing, its caption saying why it has no ceiling")
                except AssertionError as e:
                    raise AssertionError(f"{e}\n{page_report(page, app_log)}") from None
                text = str(cards_state(page)["text"])
                assert "dashed: the decode ceiling" not in text and "loading" not in text.lower(), text
                screenshot(page, "live_cloud")
        finally:
            _stop(collector)
