"""The app starts a collector for its data folder when none runs, and reuses the one that does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from bench.pages_fixture import status_rows
from collectors import launch
from collectors.demo import engine_problem
from collectors.lock import read_lock
from pages.shared.common import ENGINE_DEMO_LABEL
from pages.shared.settings import resolve_settings
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

APP = str(REPO / "app.py")


def wait_for_lock(data_dir: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = read_lock(data_dir)
        if info is not None and info.pid and info.listen:
            return info.pid
        time.sleep(0.2)
    raise AssertionError(f"no collector took {data_dir} within {timeout_s} s: {(data_dir / 'collector.log').read_text()[-2000:]}")


@pytest.mark.slow
def test_starts_one_collector_then_reuses_it(tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    with start_sim() as sim:
        first = launch.ensure_collector(tmp_path, sim.base_url, listen, allowed=True)
        assert first.state == "starting" and first.pid is not None
        # Asked again while it starts (every rerun of the app asks): no second process.
        again = launch.ensure_collector(tmp_path, sim.base_url, listen, allowed=True)
        assert again.pid == first.pid
        pid = wait_for_lock(tmp_path)
        try:
            assert pid == first.pid
            running = launch.ensure_collector(tmp_path, sim.base_url, listen, allowed=True)
            assert running.state == "running" and running.pid == pid and running.listen == listen
        finally:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while read_lock(tmp_path) is not None and time.monotonic() < deadline:
                time.sleep(0.1)
        assert read_lock(tmp_path) is None


def test_off_starts_nothing(tmp_path: Path) -> None:
    state = launch.ensure_collector(tmp_path, "http://127.0.0.1:9", "127.0.0.1:0", allowed=False)
    assert state.state == "off" and state.pid is None
    assert not (tmp_path / "collector.log").exists()


def test_a_collector_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    # An unusable listen address: the collector exits at once with a one-line error.
    state = launch.ensure_collector(tmp_path, "http://127.0.0.1:9", "not-an-address", allowed=True)
    assert state.state == "starting"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = launch.ensure_collector(tmp_path, "http://127.0.0.1:9", "not-an-address", allowed=True)
        if state.state == "failed":
            break
        time.sleep(0.2)
    assert state.state == "failed"
    assert "exited with code" in state.message and "listen" in state.message.lower()


# ---------------------------------------------------------------- the demo on the real engine


def test_phasewatch_demo_engine_picks_the_real_engine_and_its_own_folder(tmp_path: Path) -> None:
    engine = resolve_settings({"PHASEWATCH_DATA": str(tmp_path), "PHASEWATCH_DEMO": "engine"})
    assert engine.demo_at_start and engine.demo_engine_at_start
    assert engine.demo_engine_data_dir == tmp_path / "demo-engine" != engine.demo_data_dir
    simulated = resolve_settings({"PHASEWATCH_DATA": str(tmp_path), "PHASEWATCH_DEMO": "1"})
    assert simulated.demo_at_start and not simulated.demo_engine_at_start  # the simulator stays the default demo
    assert not resolve_settings({"PHASEWATCH_DATA": str(tmp_path)}).demo_at_start


def test_demo_cli_rejects_an_unknown_engine(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "collectors.demo", "--data", str(tmp_path), "--engine", "vllm"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--engine" in done.stderr and "llama-cpp" in done.stderr
    assert not (tmp_path / "demo.lock").exists()  # nothing started


def test_ollama_down_offers_the_real_engine_demo_only_when_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")  # the app starts nothing: the button's effect is read from the session
    for name in ("PHASEWATCH_DEMO", "OLLAMA_HOST", "PHASEWATCH_LISTEN"):
        monkeypatch.delenv(name, raising=False)
    w = StoreWriter(db_path(tmp_path))
    try:
        status_rows(w, time.time(), tmp_path, up=False)
    finally:
        w.close()
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    offered = [b for b in at.button if b.key == "pw_start_engine_demo"]
    if engine_problem() is not None:
        assert not offered  # llama-server or the model is missing: no button that cannot work
        return
    assert offered and offered[0].label == "Start demo on a real tiny model"
    at.button(key="pw_start_engine_demo").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["pw_demo"] is True and at.session_state["pw_demo_engine"] is True
    assert at.session_state["pw_ctx"].data_dir == tmp_path / "demo-engine"
    banners = [i.value for i in at.info if "Demo mode" in i.value]
    assert banners and ENGINE_DEMO_LABEL in banners[0] and "simulator" not in banners[0]
    at.switch_page("pages/requests/page.py").run()
    assert any(ENGINE_DEMO_LABEL in i.value for i in at.info)  # said on every page
