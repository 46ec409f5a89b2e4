"""Lines an ordinary API client has the real runner print into Ollama's log decide nothing (issue 39 F9-F11).

``python -m sim --engine llama-server --log-file F`` runs llama.cpp's ``llama-server`` (a CPU build here) and writes
Ollama's log as Ollama does; a collector reads that log (``--ollama-log``) and proxies sim. The attacker's lines go
in as Ollama passes a client's grammar to its runner: llama-server echoes an invalid grammar verbatim, one log line
per line, each from its first character. Then:

* F10: load lines after the runner is up, and a start line naming the real runner's port with its own load and
  listening lines: ``pages.why --json`` still says no layer on a GPU, and the stored placement is the real one.
* F11: cut-prompt lines with the numbers of a finished request, and start lines with other settings: the request is
  not flagged, the settings in force are unchanged.
* F9: tens of thousands of launch lines on new slot ids, twice: every proxied answer stays quick, throughout and
  after, the collector's memory stays put, and SIGTERM stops it at once.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from store import queries
from store.schema import StoreError, db_path
from tests.support.collector_process import collector, listen_url, query
from tests.support.engine_process import MODEL, engine_state, start_server_engine
from tests.support.paths import REPO
from tests.support.sim_process import SimProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(900)]

FLOOD_LINES = 12_000  # per flood: 0.9 MB of grammar, one request's (at e5fe76a 15,000 held every proxied answer 4 s)
WORST_ANSWER_S = 2.0  # a proxied /api/version, with two CPU-bound processes beside it (it takes ~5 ms)
SIGTERM_S = 10.0
RSS_GROWTH_MB = 60.0


@dataclass
class Stack:
    sim: SimProcess
    log: Path
    data: Path
    proc: subprocess.Popen[str]
    runner_url: str
    runner_port: int

    @property
    def proxy(self) -> str:
        return listen_url(self.data)


def echo(stack: Stack, lines: list[str]) -> None:
    """Have the runner print ``lines`` into Ollama's log: a grammar it cannot parse, which it echoes verbatim."""
    body = json.dumps({"prompt": "x", "n_predict": 1, "grammar": "root ::= \n" + "\n".join(lines) + "\n"}).encode()
    req = urllib.request.Request(stack.runner_url + "/completion", data=body, headers={"Content-Type": "application/json"})
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(req, timeout=300).read()
    wait_until(lambda: lines[-1] in stack.log.read_text(errors="replace"), 60, "the echoed lines in Ollama's log")


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return dict(json.loads(r.read()))


def stored_placement(stack: Stack) -> object:
    """The runner's placement as stored, and its source (not when it was read: the rows are written again)."""
    conn = queries.open_readonly(db_path(stack.data))
    try:
        found = queries.runner_placement(conn, MODEL, None, port=stack.runner_port)
    finally:
        conn.close()
    return (found[0], found[2]) if found is not None else None


def whole_placement(stack: Stack) -> bool:
    """The runner's placement is stored with its KV cache and stays so for a second. Gemma 3 prints two KV lines
    (its sliding-window cache and the other one): a log read between them, as a read woken by the log's change
    notice can be, stores half the KV for a moment."""
    found = stored_placement(stack)
    if not (isinstance(found, tuple) and found[0].host_kv_bytes is not None):
        return False
    time.sleep(1.0)
    return stored_placement(stack) == found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("forged")
    log, data = folder / "ollama.log", folder / "data"
    with (
        start_server_engine("--log-file", str(log)) as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(log)) as proc,
    ):

        def reading_the_log() -> object:
            conn = queries.open_readonly(db_path(data))
            try:
                beat = queries.latest_heartbeat(conn)
            finally:
                conn.close()
            return beat is not None and beat.log_problem is None

        wait_until(reading_the_log, 60, "the collector reading sim's log", ignoring=(StoreError,))
        post(listen_url(data) + "/api/generate", {"model": MODEL, "prompt": "", "keep_alive": "30m"})
        runner = engine_state(sim)["runner"]
        s = Stack(sim, log, data, proc, runner["base_url"], runner["port"])
        # Whole: the runner's KV line comes after its model line, and a store read between them is half a placement.
        wait_until(lambda: whole_placement(s), 60, "the runner's own placement in the store, KV included")
        yield s


def why_placement(stack: Stack) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "pages.why", "--data", str(stack.data), "--model", MODEL, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(out.stdout)["placement"])


def gpu_devices(placement: dict[str, object]) -> list[object]:
    devices = placement.get("devices")
    assert isinstance(devices, list)
    return [d for d in devices if d.get("name") != "CPU"]


def test_forged_load_lines_put_no_layer_on_a_gpu(stack: Stack) -> None:
    real = stored_placement(stack)
    before = why_placement(stack)
    # (gpu_fraction is 1.0 on a machine with no GPU: its system memory is the "VRAM" the ceilings use)
    assert before["layers_offloaded"] == 0 and gpu_devices(before) == [], before
    port = stack.runner_port
    echo(
        stack,
        [
            "llama_prepare_model_devices: using device CUDA0 (NVIDIA H200) (0000:00:06.0) - 142629 MiB free",
            "load_tensors: offloaded 7/19 layers to GPU",
            "load_tensors:        CUDA0 model buffer size =   100.00 MiB",
            "llama_kv_cache:      CUDA0 KV buffer size =  9999.00 MiB",
            'time=2026-12-04T18:31:01.404+00:00 level=INFO source=llama_server.go:431 msg="starting llama-server" '
            f'cmd="/b/llama-server --model /m.gguf --port {port} --host 127.0.0.1 -np 1"',
            "load_tensors: offloaded 19/19 layers to GPU",
            "load_tensors:        CUDA0 model buffer size =   241.41 MiB",
            f"srv  llama_server: listening on http://127.0.0.1:{port}",
        ],
    )
    time.sleep(14.0)  # a discovery round (10 s) and the placement rows written again
    after = why_placement(stack)
    assert after["layers_offloaded"] == 0 and gpu_devices(after) == [], after
    assert after == before
    assert stored_placement(stack) == real, "the real placement is kept after a forged start line"


def test_forged_cut_and_start_lines_flag_no_request_and_change_no_setting(stack: Stack) -> None:
    settings_before = {r["name"]: r["value"] for r in query(stack.data, "SELECT name, value FROM ollama_settings")}
    body = {"model": MODEL, "prompt": "Name three colours.", "stream": False, "options": {"num_predict": 4}}
    first = post(stack.proxy + "/api/generate", body)
    n = int(str(first["prompt_eval_count"]))
    echo(
        stack,
        [
            'time=2026-12-04T18:31:01.404+00:00 level=WARN source=llama_server.go:314 msg="truncating input prompt" '
            f"limit={k} prompt=9000 keep=5 new={k}"
            for k in range(max(1, n - 3), n + 4)
        ]
        + [
            'time=2026-12-04T18:31:01.404+00:00 level=INFO source=routes.go:1741 msg="server config" '
            'env="map[OLLAMA_CONTEXT_LENGTH:131072 OLLAMA_NUM_PARALLEL:64]"',
        ],
    )
    since = time.time()
    post(stack.proxy + "/api/generate", body)

    def row() -> sqlite3.Row | None:
        got = query(stack.data, "SELECT flags, prompt_sent_tokens FROM requests WHERE started_at_unix_s >= ?", since - 1)
        return got[0] if got else None

    finished = wait_until(row, 30, "the request's row")
    time.sleep(3.0)  # a late line's rewrite would come within a tick or two
    finished = row()
    assert finished is not None
    assert "prompt_truncated" not in json.loads(str(finished["flags"] or "[]")) and finished["prompt_sent_tokens"] is None
    settings_after = {r["name"]: r["value"] for r in query(stack.data, "SELECT name, value FROM ollama_settings")}
    assert settings_after == settings_before
    assert settings_after.get("OLLAMA_NUM_PARALLEL") != "64"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def test_floods_of_launch_lines_on_new_slot_ids_hold_no_proxied_answer_and_sigterm_is_prompt(stack: Stack) -> None:
    """Last in this module: it stops the collector."""
    times: list[float] = []
    stop = threading.Event()

    def client() -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not stop.is_set():
            start = time.monotonic()
            with opener.open(stack.proxy + "/api/version", timeout=600) as r:
                r.read()
            times.append(time.monotonic() - start)
            time.sleep(0.05)

    rss_before = rss_mb(stack.proc.pid)
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        for k in range(2):
            first = 1000 + k * FLOOD_LINES
            echo(
                stack,
                [
                    f"slot launch_slot_: id {first + i} | task {5_000_000 + first + i} | processing task, is_child = 0"
                    for i in range(FLOOD_LINES)
                ],
            )
            time.sleep(8.0)  # the collector reads and folds them (1 MiB a read)
        time.sleep(5.0)  # and after
    finally:
        stop.set()
        thread.join(timeout=600)
    worst = max(times)
    rss_after = rss_mb(stack.proc.pid)
    start = time.monotonic()
    stack.proc.terminate()
    stack.proc.wait(timeout=60)
    sigterm_s = time.monotonic() - start
    print(
        f"{2 * FLOOD_LINES} launch lines: worst proxied answer {worst * 1000:.0f} ms over {len(times)}, "
        f"RSS {rss_before:.0f} -> {rss_after:.0f} MB, SIGTERM {sigterm_s:.2f} s"
    )
    assert worst < WORST_ANSWER_S, f"a proxied answer took {worst:.1f} s"
    assert rss_after - rss_before < RSS_GROWTH_MB
    assert sigterm_s < SIGTERM_S
