"""Start ``python -m sim`` on a free loopback port for a test, and stop it afterwards.

with start_sim("--hardware", "rtx-3090") as sim:
    client = ollama.Client(host=sim.base_url)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tests.support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0


@dataclass
class SimProcess:
    base_url: str  # "http://127.0.0.1:PORT"
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path  # the simulator's stderr (GIN lines)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class SimFactory(Protocol):
    """``start_sims`` (tests/conftest.py): starts a sim with these arguments, stopped after the module."""

    def __call__(self, *args: str) -> SimProcess: ...


@contextlib.contextmanager
def start_sim(*args: str, port: int | None = None) -> Iterator[SimProcess]:
    """Run ``python -m sim --port <port, else a free one> *args``; yield once ``GET /`` answers; terminate (then
    kill) on exit."""
    port = port or free_port()
    log = tempfile.NamedTemporaryFile(prefix="sim-", suffix=".log", delete=False)  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "sim", "--port", str(port), *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=log, env=env)
    sim = SimProcess(f"http://127.0.0.1:{port}", port, proc, Path(log.name))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sim exited with {proc.returncode}: {sim.log()[-2000:]}")
            try:
                with urllib.request.urlopen(sim.base_url + "/", timeout=1.0) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"sim did not answer within {START_TIMEOUT_S}s: {sim.log()[-2000:]}")
            time.sleep(0.05)
        yield sim
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)


# --- small HTTP helpers for tests (standard library only) ---------------------------


def http_json(sim: SimProcess, method: str, path: str, body: object | None = None, timeout_s: float = 30.0) -> tuple[int, Any]:
    """(status, parsed JSON body) of one request; error statuses are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(sim.base_url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def truth(sim: SimProcess) -> list[dict[str, Any]]:
    """All records of ``GET /sim/truth``."""
    status, body = http_json(sim, "GET", "/sim/truth")
    assert status == 200, body
    return list(body["requests"])


def truth_by_id(sim: SimProcess, request_id: str) -> dict[str, Any]:
    """The ``/sim/truth`` record of one request (its ``X-Sim-Request-Id``); KeyError if unknown."""
    status, body = http_json(sim, "GET", "/sim/truth?id=" + urllib.parse.quote(request_id))
    if status == 404:
        raise KeyError(request_id)
    assert status == 200, body
    return dict(body["requests"][0])
