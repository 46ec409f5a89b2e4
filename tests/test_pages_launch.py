"""The app starts a collector for its data folder when none runs, and reuses the one that does."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from collectors.lock import read_lock
from pages import launch
from tests.support.sim_process import free_port, start_sim


def wait_for_lock(data_dir: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = read_lock(data_dir)
        if info is not None and info.pid and info.listen:
            return info.pid
        time.sleep(0.2)
    raise AssertionError(f"no collector took {data_dir} within {timeout_s} s: {(data_dir / 'collector.log').read_text()[-2000:]}")


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
