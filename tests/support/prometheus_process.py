"""Start Debian's ``prometheus`` binary for a test: loopback, a temporary config and data folder.

Never the system's Prometheus service: this one listens on a free port and keeps its data in a temporary
folder. Without the binary a test skips locally and fails under CI (``scripts/test.sh`` installs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port

START_TIMEOUT_S = 60.0


def require_tool(name: str) -> str:
    """The path of ``name`` (prometheus, promtool); a failure under CI, a skip elsewhere, when it is missing."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        message = f"{name} is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must run these tests, never skip them
        pytest.skip(message)
    return path


@dataclass
class Prometheus:
    url: str  # "http://127.0.0.1:PORT"
    proc: subprocess.Popen[bytes]
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {...}, "value": [ts, "text"]}, ...]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])


@contextlib.contextmanager
def start_prometheus(config_dir: Path) -> Iterator[Prometheus]:
    """Run prometheus on ``config_dir/prometheus.yml``; yield once it is ready; stop it afterwards."""
    binary = require_tool("prometheus")
    port = free_port()
    log_path = config_dir / "prometheus.log"
    cmd = [
        binary,
        f"--config.file={config_dir / 'prometheus.yml'}",
        f"--storage.tsdb.path={config_dir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=config_dir, stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(prom.url + "/-/ready", timeout=1) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready in {START_TIMEOUT_S} s: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield prom
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
