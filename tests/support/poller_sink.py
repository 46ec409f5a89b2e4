"""For tests of the Ollama poller: a sink that keeps what the poller reports, and sim on a chosen port (so a
test can stop it and start it again where the poller looks)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from analysis.records import LoadedModel, OllamaStatus
from store.ops import Op, PutInstalledModels, PutLoadedModels, PutModelInfo, PutOllamaStatus
from tests.support.paths import REPO


class RecordingSink:
    """Keeps what the poller submits, in order."""

    def __init__(self) -> None:
        self.statuses: list[OllamaStatus] = []
        self.snapshots: list[tuple[float, list[LoadedModel]]] = []
        self.shows: list[tuple[str, str, Mapping[str, Any]]] = []
        self.installed: list[list[str]] = []  # the names of each /api/tags list

    def submit(self, op: Op[Any]) -> None:
        if isinstance(op, PutOllamaStatus):
            self.statuses.append(op.status)
        elif isinstance(op, PutLoadedModels):
            self.snapshots.append((op.ts_unix_s, list(op.rows)))
        elif isinstance(op, PutModelInfo):
            self.shows.append((op.digest, op.name, op.show))
        elif isinstance(op, PutInstalledModels):
            self.installed.append([m.name for m in op.rows])
        else:
            raise AssertionError(f"the poller submitted {op!r}")


@contextlib.contextmanager
def sim_on(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m sim`` on a given port (the poller must find it again at the same address)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "--port", str(port), "--hardware", "rtx-4090"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "sim exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "sim did not start"
                time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
