"""``python -m collectors`` as a real process: settings, the lock, SIGTERM, and the faults of issue 3.

Each collector here is a subprocess on a free port over a sim on another, recording
into a real SQLite store in tmp_path; every process started is stopped by the test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import ollama
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.__main__ import main as collector_main
from collectors.lock import read_lock
from store.schema import db_path
from tests.support.collector_process import collector, listen_url, query, stop, stopped_accepting, wait_for_ticks
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.sim_process import start_sim
from tests.support.waiting import wait_until

MODEL = "qwen2.5:0.5b"
WRITER_FLUSH_S = 0.2  # store.writer.BackgroundWriter's batch interval
KILL_MARGIN_S = (
    WRITER_FLUSH_S + 0.3
)  # "finished before the kill": final chunk at least one flush (plus slack for a busy CI) earlier


# -- settings and the lock -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--interval", "soon"], "--interval 'soon' is not a number"),
        (["--listen", "11435"], "--listen/PHASEWATCH_LISTEN '11435' is not HOST:PORT"),
        (["--ollama", "ftp://x"], "scheme 'ftp' is not supported"),
        (["--nonsense"], "unrecognized arguments: --nonsense"),
    ],
)
def test_wrong_settings_exit_2_with_one_clear_line(
    tmp_path: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In this process: main() decides the exit code and the line before anything starts. The two tests below run
    # `python -m collectors` itself, so the process's exit code and its stderr of one line stay covered.
    for name in [n for n in os.environ if n.startswith("PHASEWATCH_") or n == "OLLAMA_HOST"]:
        monkeypatch.delenv(name)
    assert collector_main(["--data", str(tmp_path), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("phasewatch collector: ")
    assert read_lock(tmp_path) is None


def test_a_data_folder_that_is_a_file_exits_2(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    r = subprocess.run(
        [sys.executable, "-m", "collectors", "--data", str(not_a_folder)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "--data/PHASEWATCH_DATA" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_port_in_use_exits_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "collectors",
                "--data",
                str(tmp_path),
                "--listen",
                f"127.0.0.1:{port}",
                "--ollama",
                "127.0.0.1:9",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert f"cannot listen on 127.0.0.1:{port}" in last and "choose another --listen" in last
    assert read_lock(tmp_path) is None  # released on the way out


def test_second_instance_names_the_holder_and_exits_nonzero(tmp_path: Path) -> None:
    with collector(tmp_path, "--ollama", "127.0.0.1:9") as first:
        with collector(tmp_path, "--ollama", "127.0.0.1:9", wait=False) as second:
            _, err = second.communicate(timeout=60)
            assert second.returncode == 3
            assert f"process {first.pid}" in err and "--data" in err
        assert first.poll() is None  # the first one is untouched
        code, _ = stop(first)
        assert code == 0
    assert read_lock(tmp_path) is None


# -- SIGTERM and the faults of issue 3 --------------------------------------------------------


def test_sigterm_stops_accepting_lets_a_running_stream_finish_writes_it_and_exits_0(tmp_path: Path) -> None:
    with start_sim("--hardware", "cpu") as sim, collector(tmp_path, "--ollama", sim.base_url) as proc:
        base = listen_url(tmp_path)
        client = ollama.Client(host=base)
        # 50 tokens: a few hundred ms here, well inside the proxy's 2 s grace even on a loaded machine.
        stream = iter(client.generate(model=MODEL, prompt="a story", stream=True, options={"num_predict": 50}))
        first = next(stream)  # the request is running
        assert not first.done
        proc.send_signal(signal.SIGTERM)
        # New connections are refused (or reset) at once...
        wait_until(lambda: stopped_accepting(base), 5, "no new connection accepted after SIGTERM", interval_s=0.02)
        rest = list(stream)  # ...while the running stream may finish (the proxy's grace period)
        assert rest[-1].done and rest[-1].eval_count == 50
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    rows = query(tmp_path, "SELECT outcome, eval_count FROM requests")
    assert [(r["outcome"], r["eval_count"]) for r in rows] == [("ok", 50)]
    assert read_lock(tmp_path) is None


def test_a_malformed_request_gets_the_clients_400_one_warning_and_the_counter_at_1(tmp_path: Path) -> None:
    """Issue 30: a request the proxy refuses itself (not Ollama) leaves a trace: the log, the counter, the sidebar."""
    with collector(tmp_path, "--ollama", f"127.0.0.1:{free_port()}") as proc:
        base = listen_url(tmp_path)
        host, port = base.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GARBAGE /api/chat HTTP/1.1\r\nHost: localhost\r\n\r\n")
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n"), reply
        assert b"malformed HTTP request" in reply
        with urllib.request.urlopen(base + "/phasewatch/metrics", timeout=10) as r:
            exposition = r.read().decode()
        refused = {
            tuple(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(exposition)
            if family.name == "phasewatch_proxy_refused"
            for sample in family.samples
            if sample.name == "phasewatch_proxy_refused_total"
        }
        assert refused == {(("reason", "malformed"), ("status", "400")): 1.0}, exposition
        wait_for_ticks(tmp_path)  # the sidebar reads the refusals of the last hour from the heartbeat
        (beat,) = query(tmp_path, "SELECT proxy_refused FROM collector_heartbeat")
        assert beat["proxy_refused"] == "1 × 400 malformed"
        code, err = stop(proc)
        assert code == 0, err
    lines = [line for line in err.splitlines() if "refused a request" in line]
    assert len(lines) == 1, err
    assert " WARNING collectors.proxy.refusals: refused a request from 127.0.0.1 (malformed, answered 400)" in lines[0]


def test_ollama_down_when_a_request_arrives(tmp_path: Path) -> None:
    nobody = free_port()
    with collector(tmp_path, "--ollama", f"127.0.0.1:{nobody}") as proc:
        req = urllib.request.Request(
            listen_url(tmp_path) + "/api/chat",
            data=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 502
        assert err.value.headers["Content-Type"].startswith("application/json")
        body = json.loads(err.value.read())
        assert f"127.0.0.1:{nobody}" in body["error"]
        # The official client sees Ollama's own error shape.
        with pytest.raises(ollama.ResponseError) as client_err:
            ollama.Client(host=listen_url(tmp_path)).generate(model=MODEL, prompt="hi")
        assert client_err.value.status_code == 502
        code, _ = stop(proc)
        assert code == 0
    rows = query(tmp_path, "SELECT endpoint, outcome, status_code, error FROM requests ORDER BY started_at_unix_s")
    assert [(r["endpoint"], r["outcome"], r["status_code"]) for r in rows] == [
        ("/api/chat", "upstream_failed", 502),
        ("/api/generate", "upstream_failed", 502),
    ]
    assert all(f"127.0.0.1:{nobody}" in r["error"] for r in rows)
    events = query(tmp_path, "SELECT up, error FROM ollama_events")
    assert events and events[0]["up"] == 0 and events[0]["error"]


@pytest.mark.slow
def test_sigkill_during_load_loses_nothing_that_finished(tmp_path: Path) -> None:
    """A stream of requests through the collector; kill -9; the store is intact and complete.

    "Finished" = the client had the final chunk at least KILL_MARGIN_S before the kill.
    """
    finished_at: dict[str, float] = {}  # prompt → client monotonic time of its final chunk
    lock = threading.Lock()
    halt = threading.Event()

    def client_loop(worker: int, base_url: str) -> None:
        client = ollama.Client(host=base_url, timeout=30)
        for i in range(100_000):
            if halt.is_set():
                return
            prompt = f"request {worker}-{i}"
            try:
                for part in client.chat(
                    model=MODEL, messages=[{"role": "user", "content": prompt}], stream=True, options={"num_predict": 6}
                ):
                    if part.done:
                        with lock:
                            finished_at[prompt] = time.monotonic()
            except Exception:
                return  # the collector is gone

    with start_sim("--hardware", "rtx-4090", "--num-parallel", "4") as sim:
        with collector(tmp_path, "--ollama", sim.base_url, "--record-text") as proc:
            base = listen_url(tmp_path)
            workers = [threading.Thread(target=client_loop, args=(w, base), daemon=True) for w in range(4)]
            for w in workers:
                w.start()
            deadline = time.monotonic() + 30
            while len(finished_at) < 20:  # the load is running...
                assert time.monotonic() < deadline, "too few requests finished"
                time.sleep(0.05)
            time.sleep(1.5)  # ...and keeps running: kill it in the middle
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            proc.wait(timeout=10)
            halt.set()
            for w in workers:
                w.join(timeout=30)
        assert proc.returncode == -signal.SIGKILL

        conn = sqlite3.connect(db_path(tmp_path))
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            stored = dict(conn.execute("SELECT prompt_text, outcome FROM requests").fetchall())
        finally:
            conn.close()
        with lock:
            must_have = [p for p, t in finished_at.items() if t <= killed_at - KILL_MARGIN_S]
        assert len(must_have) >= 20
        missing = [p for p in must_have if f"user: {p}" not in stored]
        assert missing == [], f"{len(missing)} of {len(must_have)} finished requests lost"
        assert all(stored[f"user: {p}"] == "ok" for p in must_have)

        # The next collector on this folder settles what the killed one left in flight.
        with collector(tmp_path, "--ollama", sim.base_url) as again:
            code, _ = stop(again)
            assert code == 0
        assert query(tmp_path, "SELECT COUNT(*) AS n FROM requests WHERE outcome = 'in_flight'")[0]["n"] == 0
