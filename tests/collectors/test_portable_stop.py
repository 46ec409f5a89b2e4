"""Stopping without SIGTERM (issue 45): the stop file, signal handlers where the loop takes none, new process
groups without setsid."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from collectors import stopping
from collectors.stopping import new_group_options, on_stop_signals, request_stop, watch_stop_file


def test_the_stop_file_is_obeyed_only_when_it_names_this_process(tmp_path: Path) -> None:
    path = tmp_path / stopping.STOP_FILE
    request_stop(path, os.getpid() + 1)  # left for another process
    stopped = threading.Event()
    watch_stop_file(path, stopped.set, poll_s=0.02)
    assert not stopped.wait(0.3)
    request_stop(path, os.getpid())
    assert stopped.wait(5)
    assert not path.exists()  # removed: the next collector of this folder does not read it


class _WindowsLikeLoop(asyncio.SelectorEventLoop):
    def add_signal_handler(self, sig: int, callback: object, *args: object) -> None:
        raise NotImplementedError


def test_signals_reach_the_loop_where_it_takes_no_handlers() -> None:
    loop = _WindowsLikeLoop()
    saved = {name: signal.getsignal(getattr(signal, name)) for name in stopping.STOP_SIGNALS if hasattr(signal, name)}
    try:
        stop = asyncio.Event()
        assert on_stop_signals(loop, stop.set) == ["SIGINT", "SIGTERM"]  # no SIGBREAK on this OS

        async def wait_for_it() -> bool:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stop.wait(), 5)
            return True

        assert loop.run_until_complete(wait_for_it())
    finally:
        for name, handler in saved.items():
            signal.signal(getattr(signal, name), handler)
        loop.close()


def test_a_new_process_group_without_setsid(monkeypatch: pytest.MonkeyPatch) -> None:
    assert new_group_options() == (True, 0)
    monkeypatch.delattr(os, "setsid")
    monkeypatch.setattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200, raising=False)
    assert new_group_options() == (False, 0x200)
