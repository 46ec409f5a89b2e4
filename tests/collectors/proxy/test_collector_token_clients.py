"""Phasewatch's own clients of a collector that needs PHASEWATCH_TOKEN: the Lab and the demo's users send it
(``Authorization: Bearer``) when it is set and are answered; without it they get 401 and nothing is recorded.
The standalone ``python -m collectors.proxy`` follows the collector's rule.

A token is needed beyond loopback; here it is set explicitly on a loopback collector (the same check).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest

from collectors.config import client_auth_headers
from collectors.demo import Traffic
from collectors.lock import read_lock
from store.schema import db_path
from tests.support.collector_process import wait_for_ticks
from tests.support.ports import free_port
from tests.support.sim_process import REPO_ROOT, SimProcess
from tests.support.waiting import wait_until

TOKEN = "a-long-enough-test-token-42"
MODEL = "qwen2.5:0.5b"

pytestmark = pytest.mark.sim_args("--hardware", "rtx-3090", "--num-parallel", "2")


def _env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
    if token is not None:
        env["PHASEWATCH_TOKEN"] = token
    return env


def _stored(data: Path, where: str = "1") -> int:
    if not db_path(data).exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True) as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM requests WHERE {where}").fetchone()[0])
    except sqlite3.OperationalError:  # the store is being created
        return 0


def _sim_requests(sim: SimProcess) -> int:
    with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=10) as r:
        return len(json.load(r)["requests"])


@pytest.fixture
def protected(sim: SimProcess, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``python -m collectors`` with PHASEWATCH_TOKEN set, in front of sim: (its URL, its data folder)."""
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectors",
            "--ollama",
            sim.base_url,
            "--listen",
            "127.0.0.1:0",
            "--data",
            str(data),
            "--interval",
            "0.2",
        ],
        cwd=REPO_ROOT,
        env=_env(TOKEN),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: (i := read_lock(data)) is not None and i.pid == proc.pid and i.listen, 30, "the collector")
        info = read_lock(data)
        assert info is not None
        yield f"http://{info.listen}", data
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _lab(proxy: str, token: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collectors.lab", "cold-warm", "--ollama", proxy, "--model", MODEL, "--json"],
        cwd=REPO_ROOT,
        env=_env(token),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_client_headers_carry_the_token_only_when_set() -> None:
    assert client_auth_headers({"PHASEWATCH_TOKEN": f" {TOKEN} "}) == {"Authorization": f"Bearer {TOKEN}"}
    assert client_auth_headers({}) == {} and client_auth_headers({"PHASEWATCH_TOKEN": "  "}) == {}


@pytest.mark.slow
def test_lab_through_a_protected_collector(sim: SimProcess, protected: tuple[str, Path]) -> None:
    proxy, data = protected
    before = _sim_requests(sim)
    refused = _lab(proxy, None)
    assert refused.returncode == 2 and "401" in refused.stderr, refused.stderr
    assert _sim_requests(sim) == before and _stored(data) == 0  # nothing reached Ollama, nothing recorded

    done = _lab(proxy, TOKEN)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["state"] == "done" and doc["points"], doc
    sent = _sim_requests(sim) - before  # the generations the Lab sent, as Ollama saw them
    wait_until(lambda: _stored(data, "endpoint = '/api/generate' AND outcome = 'ok'") >= 1, 30, "the Lab's requests stored")
    wait_for_ticks(data)  # the last rows are written
    assert 1 <= _stored(data, "endpoint = '/api/generate' AND outcome = 'ok'") <= sent


@pytest.mark.slow
def test_demo_users_through_a_protected_collector(
    sim: SimProcess, protected: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, data = protected
    monkeypatch.delenv("PHASEWATCH_TOKEN", raising=False)
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)  # the official client would send it as a Bearer token too
    stop = threading.Event()
    with pytest.raises(ollama.ResponseError) as refused:
        Traffic(proxy, stop)._chat_turn([{"role": "user", "content": "hello"}])
    assert refused.value.status_code == 401
    assert _stored(data) == 0

    monkeypatch.setenv("PHASEWATCH_TOKEN", TOKEN)
    messages = [{"role": "user", "content": "hello"}]
    Traffic(proxy, stop)._chat_turn(messages)
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"]
    wait_until(lambda: _stored(data, "endpoint = '/api/chat' AND outcome = 'ok'") == 1, 30, "the demo user's chat in the store")
    assert _stored(data) == 1


@pytest.mark.slow
def test_the_demo_with_a_token_records_its_traffic(tmp_path: Path) -> None:
    """``python -m collectors.demo`` with PHASEWATCH_TOKEN set: its collector needs the token, its users send it."""
    data = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "collectors.demo", "--data", str(data)],
        cwd=REPO_ROOT,
        env=_env(TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _stored(data, "outcome = 'ok'") >= 1 or proc.poll() is not None, 90, "a recorded demo request")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert _stored(data, "outcome = 'ok'") >= 1, err
    assert "failed" not in err, err  # no demo user was turned away (401)


@pytest.mark.slow
def test_standalone_proxy_needs_the_token_as_the_collector_does(sim: SimProcess) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "collectors.proxy", "--upstream", sim.base_url, "--listen", "0.0.0.0:0"],
        cwd=REPO_ROOT,
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "PHASEWATCH_TOKEN" in refused.stderr, refused.stderr

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectors.proxy",
            "--upstream",
            sim.base_url,
            "--listen",
            f"127.0.0.1:{port}",
            "--print-records",
        ],
        cwd=REPO_ROOT,
        env=_env(TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/api/generate"
    body = json.dumps({"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 3}}).encode()
    try:

        def answers() -> bool:
            try:
                urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/api/version"), timeout=2)
            except urllib.error.HTTPError as exc:
                return exc.code == 401
            except OSError:
                return False
            return False

        wait_until(answers, 30, "the standalone proxy")
        before = _sim_requests(sim)
        with pytest.raises(urllib.error.HTTPError) as no_token:
            urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30)
        assert no_token.value.code == 401
        assert _sim_requests(sim) == before
        good = urllib.request.Request(url, data=body, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(good, timeout=30) as r:
            assert r.status == 200 and json.load(r)["done"]
        assert _sim_requests(sim) == before + 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(records) == 1 and records[0]["outcome"] == "ok", (records, err)  # the refused one was not recorded
