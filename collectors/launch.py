"""Start the collector (or the demo) in the background when none runs for a data folder.

The child runs in its own session, so Ctrl-C in the terminal reaches only the Streamlit
server; it keeps recording after the browser tab is closed, and stops by itself within a
second or two once the server that started it is gone (``--exit-with-parent``), however
the server ended. Only this module starts collector processes for the app (pages reach it
through ``collectors.api``); it opens no sockets itself: whether a collector runs is
answered by its lock file (``collectors.lock.read_lock``).

Demo mode belongs to the server, not to a browser session: a demo runs when its folder's
demo lock is held (``collectors.demo.read_demo_lock``) or this server started one that is
still starting, so every tab, reload and deep link sees the same. ``stop_demo`` ends it
and reaps the process this server started.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from collectors import demo as demo_process
from collectors.demo import read_demo_lock
from collectors.lock import read_lock
from collectors.stopping import new_group_options

REPO_ROOT = Path(__file__).resolve().parent.parent
RESPAWN_AFTER_S = 20.0  # give a starting child this long before trying again
STOP_TIMEOUT_S = 15.0  # the demo stops its simulator and collector (5 s each at worst) before it exits

_lock = threading.Lock()
_children: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
_demo_wanted: dict[str, str] = {}  # demo folder -> engine, for demos this server started and nobody left
_demo_at_start_done: set[str] = set()  # demo folders PHASEWATCH_DEMO already started once in this server


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
    new_session, creationflags = new_group_options()  # Ctrl-C goes to Streamlit, which the child then follows out
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
            creationflags=creationflags,
        )
    _children[key] = (child, time.monotonic())
    return child


def _reap() -> None:
    """Collect the exit status of every child that has exited, so none lingers as a zombie."""
    for child, _started in _children.values():
        child.poll()


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
    _reap()
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
        argv = [
            sys.executable,
            "-m",
            "collectors",
            "--ollama",
            ollama_url,
            "--listen",
            listen,
            "--data",
            str(data_dir),
            "--exit-with-parent",
        ]
        child = _spawn(key, argv, log_path)
    return LaunchState(LaunchStatus.STARTING, f"started the collector (process {child.pid})", child.pid)


def ensure_demo(demo_dir: Path, engine: str = "sim") -> LaunchState:
    """Reuse the demo (simulator + collector + traffic) of ``demo_dir``, or start one when it is wanted
    (``start_demo``): a demo someone just left is never started again by a page that saw it a moment before.

    ``engine="llama-cpp"`` starts it on the real llama.cpp engine (``collectors.demo --engine``).
    """
    _reap()
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
        if str(demo_dir) not in _demo_wanted:
            return LaunchState(LaunchStatus.OFF, "the demo has stopped")
        argv = [sys.executable, "-m", "collectors.demo", "--data", str(demo_dir), "--engine", engine, "--exit-with-parent"]
        child = _spawn(key, argv, log_path)
    return LaunchState(LaunchStatus.STARTING, f"started the demo (process {child.pid})", child.pid)


def demo_runs(demo_dir: Path) -> bool:
    """Whether a demo runs for ``demo_dir``: its lock is held, or this server started one that nobody left."""
    return read_demo_lock(demo_dir) is not None or str(demo_dir) in _demo_wanted


def start_demo(demo_dir: Path, engine: str = "sim") -> LaunchState:
    """Start the demo of ``demo_dir`` (or find it running), for every session of this server."""
    _demo_wanted[str(demo_dir)] = engine
    return ensure_demo(demo_dir, engine)


def start_demo_at_start(demo_dir: Path, engine: str = "sim") -> bool:
    """``PHASEWATCH_DEMO``: start the demo once per server, so that leaving it is not undone by the next page."""
    with _lock:
        if str(demo_dir) in _demo_at_start_done:
            return False
        _demo_at_start_done.add(str(demo_dir))
    start_demo(demo_dir, engine)
    return True


def stop_demo(demo_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """End the demo of ``demo_dir`` with its simulator, collector and users; True once every one is gone.

    Asks the demo process to stop (it stops and waits for its children), then waits for the one
    this server started, if any, so that it leaves no zombie behind.
    """
    _demo_wanted.pop(str(demo_dir), None)
    stopped = demo_process.stop_demo(demo_dir, timeout_s)
    with _lock:
        entry = _children.pop(f"demo:{demo_dir}", None)
    if entry is None:
        return stopped
    child = entry[0]
    if child.poll() is None:
        child.terminate()  # still starting (no lock yet): it stops its children on SIGTERM too
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout_s)
            return False
    return stopped


def started_here(data_dir: Path) -> bool:
    """Whether the collector recording into ``data_dir`` is the one this server started (the app may stop it for a
    moment: its next run starts it again), not one started elsewhere (a service, a terminal)."""
    info = read_lock(data_dir)
    entry = _children.get(f"collector:{data_dir}")
    return info is not None and entry is not None and entry[0].poll() is None and info.pid == entry[0].pid
