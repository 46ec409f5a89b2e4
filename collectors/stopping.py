"""How a collector (or the demo) stops: asked from outside (``--stop``), or when the app that started it is gone.

``stop_collector`` asks the process that holds a data folder's lock to stop through a stop file in that folder
(``collector.stop``, naming the process), which the collector watches (``watch_stop_file``), and waits until the
lock is dropped and the process has exited. No signal is needed: on Windows ``os.kill`` is TerminateProcess,
which ends a process without letting it write what it holds; the folder is the user's own, so only they can ask.
``on_stop_signals`` also stops it on Ctrl-C (SIGINT, SIGBREAK where the OS has it) and SIGTERM, through the event
loop where it takes signal handlers, through ``signal.signal`` where it does not (Windows).
``follow_parent`` ends a process started by the Streamlit app once that app has exited, however it exited
(Ctrl-C, SIGTERM, SIGKILL): the parent is known by its pid and start time, so a pid reused is not it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from collectors.lock import open_no_follow, read_lock, read_no_follow, write_at_start

PARENT_POLL_S = 1.0
# How often a running process looks for its stop file. Each look wakes a thread, which costs about 0.2 ms of CPU
# on a small VM whatever it finds: at 5 a second that was an eighth of the idle collector's CPU (bench/README.md).
STOP_POLL_S = 1.0
STOP_FILE = "collector.stop"
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGBREAK")  # each where this OS has it (SIGBREAK: Ctrl-Break on Windows)


def request_stop(path: Path, pid: int) -> None:
    """Ask process ``pid`` (which watches ``path``) to stop."""
    fd = open_no_follow(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        write_at_start(fd, json.dumps({"pid": pid}).encode())
    finally:
        os.close(fd)


def _asks_me(path: Path) -> bool:
    try:
        fd = read_no_follow(path)
    except OSError:  # the folder is not one (a file, gone, not ours): nobody can ask; its own check says why
        return False
    if fd is None:
        return False
    try:
        return bool(json.loads(os.read(fd, 4096) or b"{}").get("pid") == os.getpid())
    except (ValueError, AttributeError):
        return False
    finally:
        os.close(fd)


def watch_stop_file(path: Path, on_stop: Callable[[], None], poll_s: float = STOP_POLL_S) -> threading.Thread:
    """Call ``on_stop`` once, from a daemon thread, when ``path`` names this process; the file is removed then. A
    stop file left for another process (one that had stopped before reading it) is never obeyed."""

    def watch() -> None:
        while not _asks_me(path):
            time.sleep(poll_s)
        with contextlib.suppress(OSError):
            path.unlink()
        on_stop()

    thread = threading.Thread(target=watch, name="stop-file", daemon=True)
    thread.start()
    return thread


def new_group_options() -> tuple[bool, int]:
    """``subprocess.Popen``'s (start_new_session, creationflags) that start a child in a process group of its own,
    so that Ctrl-C in the terminal reaches only the app, which the child then follows out: a new session where the
    OS has them (``os.setsid``), a new process group by creation flag where it does not (Windows)."""
    if hasattr(os, "setsid"):
        return True, 0
    return False, getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)


def on_stop_signals(loop: asyncio.AbstractEventLoop, on_stop: Callable[[], None]) -> list[str]:
    """Call ``on_stop`` on the loop at Ctrl-C or a termination signal; the names of the signals handled."""
    handled = []
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            loop.add_signal_handler(sig, on_stop)
        except NotImplementedError:  # Windows' loops take none: the interpreter's own handler, handed to the loop
            signal.signal(sig, lambda _signum, _frame: loop.call_soon_threadsafe(on_stop))
        handled.append(name)
    return handled


def stop_collector(data_dir: Path, timeout_s: float = 15.0) -> bool | None:
    """Stop the collector that records into ``data_dir``: True once it is gone, False if it would not stop,
    None when none ran."""
    info = read_lock(data_dir)
    if info is None:
        return None
    if info.pid is None:  # it is starting and has not written its details yet
        deadline = time.monotonic() + 5
        while info is not None and info.pid is None and time.monotonic() < deadline:
            time.sleep(0.1)
            info = read_lock(data_dir)
        if info is None:
            return True
        if info.pid is None:
            return False
    request_stop(Path(data_dir) / STOP_FILE, info.pid)  # the collector writes what it holds, then exits
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if read_lock(data_dir) is None and not _runs(info.pid):
            return True
        time.sleep(0.1)
    return False


def _runs(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _parent_gone(pid: int, started: float | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` (psutil's create time) has exited."""
    if os.getppid() != pid:
        return True  # handed to another parent (POSIX)
    try:
        proc = psutil.Process(pid)
        return proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) or (
            started is not None and proc.create_time() != started
        )
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def follow_parent(on_gone: Callable[[], None], poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Call ``on_gone`` once, from a daemon thread, when this process's parent has exited.

    The parent is known by its pid and start time: on POSIX an orphan is also handed to init (or a subreaper), so
    its parent pid changes; on Windows nothing is reparented and a pid may be reused, which the start time tells.
    Polling costs nothing measurable and, unlike Linux's parent-death signal, is not tied to the parent thread that
    started us (Streamlit starts children from short-lived script threads).
    """
    parent = os.getppid()
    try:
        started: float | None = psutil.Process(parent).create_time()
    except psutil.Error:
        started = None

    def watch() -> None:
        while not _parent_gone(parent, started):
            time.sleep(poll_s)
        on_gone()

    thread = threading.Thread(target=watch, name="follow-parent", daemon=True)
    thread.start()
    return thread
