"""Two OS users, neither root, as on the official Linux install: "Ollama" (``python -m sim --engine llama-server``,
the real llama-server as its child) runs as pw_ollama, the collector's discovery and /slots reader as pw_desk.
pw_desk cannot list pw_ollama's sockets per process; it finds the runner by command line and the system-wide
socket table, reads a long prompt's progress from its /slots, and does not adopt it for another Ollama.

The test process (root) only creates the users, starts the processes as them and talks to sim as a client.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from collectors.ollama.discovery import FOUND_OTHER_USER
from tests.support.engine_process import MODEL, require_llama_server, words_prompt
from tests.support.os_users import ensure_user, popen_as, python_for, require_root, sim_as

pytestmark = pytest.mark.engine
OLLAMA_USER, DESK_USER = "pw_ollama", "pw_desk"
PROMPT_WORDS = 2500  # about as many tokens: prefill lasts about a second on two quiet cores, several readings
# pw_desk reads the runner the way the collector does (discovery, then /slots), as fast as it can.
WATCH = """
import json, sys, urllib.request
from collectors.ollama.discovery import discover
from collectors.ollama.runner_slots import classify_slots_answer
while True:
    found = discover(sys.argv[1])
    for runner in found.runners:
        with urllib.request.urlopen(runner.base_url + "/slots", timeout=5) as resp:
            slots, problem = classify_slots_answer(resp.status, resp.read())
        print(json.dumps({"found_by": found.found_by, "pid": runner.pid, "problem": problem,
                          "slots": [s.__dict__ for s in slots or []]}), flush=True)
"""


def post(url: str, path: str, body: dict[str, Any], timeout_s: float = 300.0) -> Any:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def cli_as(user: str, url: str, *extra: str) -> str:
    py, env = python_for(user)
    proc = popen_as(
        user, [*py, "-m", "collectors.ollama", "--ollama", url, *extra], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.fixture(scope="module")
def users() -> None:
    require_root()
    require_llama_server()
    ensure_user(OLLAMA_USER)
    ensure_user(DESK_USER)


def test_another_users_runner_is_found_and_its_progress_read(users: None) -> None:
    _, gguf = require_llama_server()
    with sim_as(OLLAMA_USER, "--engine", "llama-server", "--gguf", str(gguf), "--threads", "2") as (url, _sim):
        post(url, "/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}})
        with urllib.request.urlopen(url + "/sim/engine", timeout=10) as r:
            child = json.loads(r.read())["runner"]

        # The CLI, as the other user: the runner, how it was found, its model and slots.
        found = json.loads(cli_as(DESK_USER, url.removeprefix("http://"), "--json"))
        assert found["problem"] is None, found
        assert found["found_by"] == FOUND_OTHER_USER
        [runner] = found["runners"]
        assert (runner["pid"], runner["port"], runner["model"], runner["problem"]) == (child["pid"], child["port"], MODEL, None)
        assert runner["slots"] and runner["slots"][0]["n_ctx"] > 0
        assert f"found {FOUND_OTHER_USER}" in cli_as(DESK_USER, url)

        # A long prompt sent straight to "Ollama": the other user reads its prefill progress from /slots.
        py, env = python_for(DESK_USER)
        watcher = popen_as(DESK_USER, [*py, "-c", WATCH, url], env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        readings: list[dict[str, Any]] = []
        found_as: set[tuple[str, int]] = set()

        def collect() -> None:
            assert watcher.stdout is not None
            for line in watcher.stdout:
                reading = json.loads(line)
                found_as.add((reading["found_by"], reading["pid"]))
                readings.extend(s for s in reading["slots"] if s["is_processing"])

        reader = threading.Thread(target=collect, daemon=True)
        reader.start()
        try:
            time.sleep(2.0)  # the watcher's interpreter starts
            done = post(
                url,
                "/api/generate",
                {
                    "model": MODEL,
                    "prompt": words_prompt(PROMPT_WORDS, seed=24),
                    "stream": False,
                    "options": {"num_predict": 4, "temperature": 0},
                },
            )
        finally:
            watcher.terminate()
            watcher.wait(timeout=10)
            reader.join(timeout=10)
    assert found_as == {(FOUND_OTHER_USER, child["pid"])}
    prompt_tokens = done["prompt_eval_count"]
    assert prompt_tokens > 1500, done
    prefill = [s["processed_tokens"] for s in readings if not s["decoded_tokens"] and s["processed_tokens"]]
    assert prefill, f"no prefill reading among {len(readings)} busy readings"
    assert max(prefill) <= prompt_tokens
    assert len(set(prefill)) >= 2 or any(s["decoded_tokens"] for s in readings), "progress did not move"


def test_a_runner_is_not_adopted_for_another_ollama_of_that_user(users: None) -> None:
    _, gguf = require_llama_server()
    with (
        sim_as(OLLAMA_USER, "--engine", "llama-server", "--gguf", str(gguf), "--threads", "2") as (url, _),
        sim_as(OLLAMA_USER) as (other_url, _),
    ):
        post(url, "/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}})
        assert json.loads(cli_as(DESK_USER, url, "--json"))["runners"], "the runner of the first is found"
        found = json.loads(cli_as(DESK_USER, other_url, "--json"))
    assert found["runners"] == [] and found["found_by"] is None
    port = url.rsplit(":", 1)[1]
    assert f"serves port {port}: another Ollama" in found["problem"]
