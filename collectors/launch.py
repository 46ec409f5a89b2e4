"""Start the collector (or the demo) in the background when none runs for a data folder.

The child is detached (its own session) so that it keeps recording after the
browser tab and even the Streamlit server are gone. Only this module starts
collector processes for the app (pages reach it through ``collectors.api``); it
opens no sockets itself: whether a collector runs is answered by its lock file
(``collectors.lock.read_lock``).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from collectors.demo import read_demo_lock
from collectors.lock import read_lock

REPO_ROOT = Path(__file__).resolve().parent.parent
RESPAWN_AFTER_S = 20.0  # give a starting child this long before trying again

_lock = threading.Lock()
_children: dict[str, tuple[subprocess.Popen[bytes], float]] = {}


class LaunchStatus(StrEnum):
    RUNNING = "running"  # a collector (or demo) holds the data folder
    STARTING = "starting"  # we started one; it has not taken the folder yet
    FAILED = "failed"  # the one we started exited, or never took the folder
    OFF = "off"  # none runs, and the app may not start one


@dataclass(frozen=True)
class LaunchState:
    state: LaunchStatus
    message: str
    pid: int | None = None
    listen: str | None = None


def _tail(path: Path, n_lines: int = 6) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n_lines:])


def _spawn(key: str, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the app, and Ctrl-C in its terminal
        )
    _children[key] = (child, time.monotonic())
    return child


def _child_state(key: str, log_path: Path, what: str) -> LaunchState | None:
    """State of a child we started ourselves, or None when we should (re)start one."""
    entry = _children.get(key)
    if entry is None:
        return None
    child, started = entry
    code = child.poll()
    if code is None:
        if time.monotonic() - started < RESPAWN_AFTER_S:
            return LaunchState(LaunchStatus.STARTING, f"{what} is starting (process {child.pid})", pid=child.pid)
        return LaunchState(
            LaunchStatus.FAILED, f"{what} (process {child.pid}) has not taken its data folder yet; see {log_path}", child.pid
        )
    if time.monotonic() - started < RESPAWN_AFTER_S:
        detail = _tail(log_path)
        return LaunchState(LaunchStatus.FAILED, f"{what} exited with code {code}. Last lines of {log_path}:\n{detail}", child.pid)
    return None


def ensure_collector(data_dir: Path, ollama_url: str, listen: str, allowed: bool) -> LaunchState:
    """Reuse the collector that records into ``data_dir``, or start one."""
    info = read_lock(data_dir)
    if info is not None:
        return LaunchState(LaunchStatus.RUNNING, f"collector running (process {info.pid})", info.pid, info.listen or None)
    if not allowed:
        return LaunchState(
            LaunchStatus.OFF, "no collector runs for this data folder (PHASEWATCH_COLLECTOR=off: the app starts none)"
        )
    key = f"collector:{data_dir}"
    log_path = data_dir / "collector.log"
    with _lock:
        state = _child_state(key, log_path, "the collector")
        if state is not None:
            return state
        argv = [sys.executable, "-m", "collectors", "--ollama", ollama_url, "--listen", listen, "--data", str(data_dir)]
        child = _spawn(key, argv, log_path)
    return LaunchState(LaunchStatus.STARTING, f"started the collector (process {child.pid})", child.pid)


def ensure_demo(demo_dir: Path, engine: str = "sim") -> LaunchState:
    """Reuse the demo (simulator + collector + traffic) of ``demo_dir``, or start one.

    ``engine="llama-cpp"`` starts it on the real llama.cpp engine (``collectors.demo --engine``).
    """
    demo = read_demo_lock(demo_dir)
    collector = read_lock(demo_dir)
    if demo is not None and collector is not None:
        return LaunchState(LaunchStatus.RUNNING, f"demo running (process {demo.pid})", demo.pid, collector.listen or None)
    if demo is not None:
        upstream = "engine" if engine == "llama-cpp" else "simulator"
        return LaunchState(LaunchStatus.STARTING, f"demo is starting its {upstream} and collector (process {demo.pid})", demo.pid)
    key = f"demo:{demo_dir}"
    log_path = demo_dir / "demo.log"
    with _lock:
        state = _child_state(key, log_path, "the demo")
        if state is not None:
            return state
        argv = [sys.executable, "-m", "collectors.demo", "--data", str(demo_dir), "--engine", engine]
        child = _spawn(key, argv, log_path)
    return LaunchState(LaunchStatus.STARTING, f"started the demo (process {child.pid})", child.pid)
