"""The sidebar, in Debian's Chromium, on the official Linux layout: "Ollama" (``python -m sim --engine
llama-server``) runs as pw_ollama, the real collector as pw_desk. The sidebar says how the runner was found
(by command line + listening sockets) and why Ollama's log is not read (pw_ollama's file, mode 600), with the
command that fixes it. Screenshot: ``sidebar-two-users.png`` under ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page

from collectors.ollama.discovery import FOUND_OTHER_USER
from store import queries
from store.schema import db_path
from tests.e2e.support import START_TIMEOUT_S, _stop, run_app, screenshot, wait_ready, wait_until
from tests.support.engine_process import MODEL, require_llama_server
from tests.support.os_users import ensure_user, popen_as, python_for, require_root, sim_as
from tests.support.sim_process import free_port

pytestmark = [pytest.mark.browser, pytest.mark.engine]
OLLAMA_USER, DESK_USER = "pw_ollama", "pw_desk"


def _runners_found(data: Path) -> str | None:
    with queries.open_reader(db_path(data)) as conn:
        hb = queries.latest_heartbeat(conn) if conn is not None else None
    return hb.runners_found if hb is not None else None


def test_sidebar_says_how_another_users_runner_was_found_and_why_the_log_is_not_read(page: Page, tmp_path: Path) -> None:
    require_root()
    _, gguf = require_llama_server()
    ollama, desk = ensure_user(OLLAMA_USER), ensure_user(DESK_USER)
    # Folders under /tmp: pytest's own (mode 700, root's) cannot be entered by the two users.
    data = Path(tempfile.mkdtemp(prefix="pw-desk-data-"))
    os.chown(data, desk.pw_uid, desk.pw_gid)
    log_dir = Path(tempfile.mkdtemp(prefix="pw-ollama-log-"))
    log_dir.chmod(0o755)
    ollama_log = log_dir / "server.log"
    ollama_log.write_text("")
    os.chown(ollama_log, ollama.pw_uid, ollama.pw_gid)
    ollama_log.chmod(0o600)  # as Ollama's own log: its user's alone
    try:
        with sim_as(OLLAMA_USER, "--engine", "llama-server", "--gguf", str(gguf), "--threads", "2") as (url, _):
            body = json.dumps({"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}).encode()
            with urllib.request.urlopen(urllib.request.Request(url + "/api/generate", data=body), timeout=300):
                pass  # the runner is loaded
            py, env = python_for(DESK_USER)
            proxy = f"127.0.0.1:{free_port()}"
            with open(tmp_path / "collector.log", "wb") as out:
                collector = popen_as(
                    DESK_USER,
                    [
                        *py,
                        "-m",
                        "collectors",
                        "--ollama",
                        url,
                        "--listen",
                        proxy,
                        "--data",
                        str(data),
                        "--ollama-log",
                        str(ollama_log),
                    ],
                    env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                found = wait_until(lambda: _runners_found(data), START_TIMEOUT_S * 2, "the heartbeat naming the runner")
                assert found == f"1 runner found {FOUND_OTHER_USER}"
                with run_app(data, tmp_path / "app.log", {"OLLAMA_HOST": url, "PHASEWATCH_LISTEN": proxy}) as app_url:
                    page.goto(app_url)
                    wait_ready(page)
                    sidebar = page.locator('[data-testid="stSidebar"]')
                    wait_until(lambda: f"Runners: {found}" in sidebar.inner_text(), 60, "the sidebar's runner line")
                    text = sidebar.inner_text()
                    assert f"Ollama's log: not read. cannot read {ollama_log}: Permission denied" in text
                    assert f"sudo chmod g+r {ollama_log}" in text and "o+r" not in text  # a group, never every user
                    assert "recording goes on from the runners' /slots" in text
                    screenshot(page, "sidebar-two-users")
            finally:
                _stop(collector)
                assert collector.returncode == 0, (tmp_path / "collector.log").read_text()[-2000:]
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)
