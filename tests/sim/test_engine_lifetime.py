"""sim's llama-server child lives no longer than sim, as Ollama's runners live no longer than Ollama: stopped
(SIGTERM) or killed (SIGKILL) in the middle of a generation, sim takes its busy child with it."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.request

import psutil
import pytest

from tests.support.engine_process import MODEL, engine_state, start_server_engine, words_prompt
from tests.support.sim_process import SimProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(300)]

SIM_EXIT_S = 30.0  # SIGTERM: sim stops its child first, then exits (a busy machine: wide)
CHILD_GONE_S = 30.0


def long_generation(sim: SimProcess) -> None:
    body = {"model": MODEL, "prompt": words_prompt(40, 1), "stream": True, "options": {"num_predict": 4000, "temperature": 0}}
    req = urllib.request.Request(sim.base_url + "/api/generate", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=240) as r:
            for _ in r:
                pass
    except OSError:
        pass  # sim went away mid-stream: that is the test


def busy_child(sim: SimProcess) -> psutil.Process:
    threading.Thread(target=long_generation, args=(sim,), daemon=True).start()

    def decoding() -> psutil.Process | None:
        runner = engine_state(sim).get("runner") or {}
        if not runner.get("pid"):
            return None
        with urllib.request.urlopen(runner["base_url"] + "/slots", timeout=5) as r:
            slots = json.load(r)
        return psutil.Process(runner["pid"]) if any(s.get("is_processing") for s in slots) else None

    child: psutil.Process = wait_until(decoding, 120, "the child busy with a generation")
    return child


def gone(child: psutil.Process) -> bool:
    try:
        return child.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_busy_child_does_not_outlive_sim(sig: signal.Signals) -> None:
    with start_server_engine() as sim:
        child = busy_child(sim)
        began = time.monotonic()
        sim.proc.send_signal(sig)
        try:
            sim.proc.wait(timeout=SIM_EXIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"sim did not exit within {SIM_EXIT_S:g} s of {sig.name} with its child busy")
        try:
            wait_until(lambda: gone(child), CHILD_GONE_S, "the child gone")
        finally:
            if not gone(child):
                child.kill()
        print(f"{sig.name}: sim and its child gone in {time.monotonic() - began:.1f} s")
