"""PHASEWATCH_TOKEN: beyond loopback the collector needs one; without it a request gets 401 and nothing is recorded."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from collectors.config import TOKEN_MIN_CHARS, SettingsError, load_settings
from collectors.service import CollectorService
from store.schema import db_path
from tests.support.sim_process import REPO_ROOT, start_sim

TOKEN = "a-long-enough-test-token-42"


def test_listening_beyond_loopback_without_a_token_is_refused() -> None:
    for listen in ("0.0.0.0:11435", "192.168.1.20:11435", "[::]:11435"):
        with pytest.raises(SettingsError, match="PHASEWATCH_TOKEN"):
            load_settings(["--listen", listen], {})
        assert load_settings(["--listen", listen], {"PHASEWATCH_TOKEN": TOKEN}).token == TOKEN
    for listen in ("127.0.0.1:11435", "[::1]:11435", "localhost:11435"):
        assert load_settings(["--listen", listen], {}).token is None  # loopback: no token needed
    with pytest.raises(SettingsError, match=f"at least {TOKEN_MIN_CHARS}"):
        load_settings(["--listen", "0.0.0.0:11435"], {"PHASEWATCH_TOKEN": "short"})
    assert TOKEN not in repr(load_settings([], {"PHASEWATCH_TOKEN": TOKEN}))  # never in logs


@pytest.mark.slow
def test_the_collector_process_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "collectors", "--listen", "0.0.0.0:0", "--data", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "PHASEWATCH_TOKEN" in proc.stderr
    assert not db_path(tmp_path).exists()  # refused before opening anything


def _stored_requests(data: Path) -> int:
    with sqlite3.connect(db_path(data)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])


def _sim_requests(sim_url: str) -> int:
    with urllib.request.urlopen(sim_url + "/sim/truth", timeout=10) as r:
        return len(json.load(r)["requests"])


@pytest.mark.slow
def test_requests_without_the_token_get_401_and_are_not_recorded(tmp_path: Path) -> None:
    with start_sim("--hardware", "rtx-3090") as sim:
        asyncio.run(_token_cases(sim.base_url, tmp_path))
        assert _sim_requests(sim.base_url) == 1  # only the request with the token reached Ollama


async def _token_cases(sim_url: str, data: Path) -> None:
    # Beyond loopback (all interfaces), reached here through loopback.
    settings = load_settings(["--ollama", sim_url, "--listen", "0.0.0.0:0", "--data", str(data)], {"PHASEWATCH_TOKEN": TOKEN})
    service = CollectorService(settings, host_bandwidth=None)
    await service.start()
    base = f"http://127.0.0.1:{service.listen.rsplit(':', 1)[1]}"
    body = {"model": "llama3.2:latest", "prompt": "hi", "stream": False, "options": {"num_predict": 5}}
    try:
        async with aiohttp.ClientSession() as session:
            for auth in (
                {},
                {"Authorization": "Bearer wrong-token-wrong-token"},
                {"Authorization": TOKEN},
                {"Authorization": "Basic " + TOKEN},
            ):
                async with session.post(f"{base}/api/generate", json=body, headers=auth) as resp:
                    assert resp.status == 401, auth
                for method, path in (
                    ("GET", "/phasewatch/metrics"),
                    ("GET", "/api/tags"),
                    ("GET", "/api/ps"),
                    ("POST", "/api/chat"),
                    ("POST", "/v1/chat/completions"),
                ):
                    async with session.request(method, base + path, headers=auth) as resp:
                        assert resp.status == 401, (method, path, auth)
            good = {"Authorization": f"Bearer {TOKEN}"}
            async with session.get(f"{base}/phasewatch/metrics", headers=good) as resp:
                assert resp.status == 200
            async with session.post(f"{base}/api/generate", json=body, headers=good) as resp:
                assert resp.status == 200
                await resp.read()
            deadline = time.monotonic() + 30
            while sum(service.stats.counts.values()) < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            async with session.get(f"{base}/phasewatch/metrics", headers=good) as resp:
                text = await resp.text()
    finally:
        await service.stop()
    assert sum(service.stats.counts.values()) == 1
    assert _stored_requests(data) == 1  # the refused ones left no row
    assert 'phasewatch_requests_total{endpoint="/api/generate",model="llama3.2:latest",outcome="ok",source="proxy"} 1.0' in text
