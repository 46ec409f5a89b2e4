"""The real engine (llama-server behind sim) with a collector and the app in front of it, for the browser tests
of live progress: the ``engine_stack`` fixture (one per module that imports it) and a streamed generate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors.lock import read_lock
from collectors.proxy.recording import RECORD_ID_HEADER
from store.schema import db_path
from tests.e2e.support import (
    REPO,
    START_TIMEOUT_S,
    _stop,
    run_app,
    wait_until,
)
from tests.support.engine_process import GREEDY, MODEL, start_server_engine, words_prompt
from tests.support.ports import free_port

OPTIONS = {**GREEDY, "num_ctx": 8192}  # the same context for both requests: no reload between them


def generate(proxy: str, prompt: str, num_predict: int, out: dict[str, Any]) -> None:
    body = {"model": MODEL, "prompt": prompt, "stream": True, "options": {**OPTIONS, "num_predict": num_predict}}
    req = urllib.request.Request(f"http://{proxy}/api/generate", data=json.dumps(body).encode(), method="POST")
    out["sent"] = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        out["id"] = r.headers.get(RECORD_ID_HEADER)
        for line in r:
            chunk = json.loads(line)
            if "first_token" not in out and chunk.get("response"):
                out["first_token"] = time.time()
            if chunk.get("done"):
                out["final"] = chunk


@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    data_dir = tmp_path_factory.mktemp("phasewatch-live-engine")
    logs = tmp_path_factory.mktemp("logs")
    with start_server_engine() as sim:
        proxy = f"127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
        with open(logs / "collector.log", "wb") as log:
            collector = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "collectors",
                    "--ollama",
                    sim.base_url,
                    "--listen",
                    proxy,
                    "--data",
                    str(data_dir),
                    "--ollama-log",
                    str(sim.log_path),
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector")
            wait_until(lambda: db_path(data_dir).exists(), START_TIMEOUT_S, "the store")
            warm: dict[str, Any] = {}
            generate(proxy, words_prompt(20, seed=1), 2, warm)  # starts the runner (sim starts it on first use)
            assert "final" in warm
            with run_app(data_dir, logs / "app.log", {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}) as url:
                yield url, proxy, data_dir
        finally:
            _stop(collector)
