"""How a collector (or the demo) stops: asked from outside (``--stop``), or when the app that started it is gone.

``stop_collector`` sends SIGTERM to the process that holds a data folder's lock and waits until
the lock is dropped and the process has exited.
``follow_parent`` ends a process started by the Streamlit app once that app has exited, however
it exited (Ctrl-C, SIGTERM, SIGKILL): the child notices that it was handed to another parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from collectors.lock import read_lock

PARENT_POLL_S = 1.0


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
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGTERM)  # the collector writes what it holds, then exits
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


def follow_parent(on_gone: Callable[[], None], poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Call ``on_gone`` once, from a daemon thread, when this process's parent has exited.

    An orphan is handed to init (or a subreaper), so its parent pid changes; polling that
    costs nothing measurable and, unlike Linux's parent-death signal, is not tied to the
    parent thread that started us (Streamlit starts children from short-lived script threads).
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        on_gone()

    thread = threading.Thread(target=watch, name="follow-parent", daemon=True)
    thread.start()
    return thread
