"""Stopping a collector: ``python -m collectors --stop``, and ``--exit-with-parent`` once its starter is gone.

Real processes: a collector in front of the simulator, started as the app starts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from collectors.lock import read_lock
from tests.support.ports import free_port
from tests.support.sim_process import REPO_ROOT, start_sim
from tests.support.waiting import wait_until

START_S = 60.0


def exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def collectors_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collectors", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.slow
def test_stop_ends_the_collector_of_a_data_folder(tmp_path: Path) -> None:
    with start_sim() as sim:
        listen = f"127.0.0.1:{free_port()}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", listen, "--data", str(tmp_path)],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            info = wait_until(lambda: (i := read_lock(tmp_path)) is not None and i.listen and i, START_S, "the collector's lock")
            assert info.pid == proc.pid
            done = collectors_cli("--stop", "--data", str(tmp_path))
            assert done.returncode == 0, done.stderr
            assert "stopped the collector" in done.stdout
            assert proc.wait(5) == 0  # it wrote what it held and exited cleanly (SIGTERM)
            assert read_lock(tmp_path) is None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Nothing runs now: saying so is not an error.
    again = collectors_cli("--stop", "--data", str(tmp_path))
    assert again.returncode == 0 and "no collector" in again.stdout


def test_stop_reads_the_data_folder_from_the_environment(tmp_path: Path) -> None:
    env = {**os.environ, "PHASEWATCH_DATA": str(tmp_path)}
    done = collectors_cli("--stop", env=env)
    assert done.returncode == 0 and str(tmp_path) in done.stdout


@pytest.mark.slow
def test_exit_with_parent_stops_when_its_starter_is_killed(tmp_path: Path) -> None:
    """The app's collector follows the app out, even when the app dies by SIGKILL (no handler of its own runs)."""
    with start_sim() as sim:
        listen = f"127.0.0.1:{free_port()}"
        # A stand-in for the Streamlit server: starts the collector in its own session, as collectors.launch does.
        starter = textwrap.dedent(f"""
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-m", "collectors", "--ollama", {sim.base_url!r}, "--listen", {listen!r},
                              "--data", {str(tmp_path)!r}, "--exit-with-parent"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(600)
        """)
        parent = subprocess.Popen([sys.executable, "-c", starter], cwd=REPO_ROOT)
        try:
            info = wait_until(lambda: (i := read_lock(tmp_path)) is not None and i.listen and i, START_S, "the collector's lock")
            assert info.pid is not None and psutil.Process(info.pid).ppid() == parent.pid
            time.sleep(1.5)
            assert not exited(info.pid)  # it keeps running while its starter lives
            parent.send_signal(signal.SIGKILL)
            parent.wait(10)
            wait_until(lambda: exited(info.pid), 20, "the collector to follow its starter out")
            wait_until(lambda: read_lock(tmp_path) is None, 5, "the lock to be dropped")
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
            held = read_lock(tmp_path)
            if held is not None and held.pid:
                os.kill(held.pid, signal.SIGKILL)
