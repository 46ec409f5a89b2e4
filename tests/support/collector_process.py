"""``python -m collectors`` as a real subprocess for a test: start it on a free port, wait for its lock,
read its store, stop it.

    with collector(data, "--ollama", sim.base_url) as proc:
        post(listen_url(data) + "/api/chat", ...)
        rows = query(data, "SELECT outcome FROM requests")
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

from collectors.lock import LockInfo, read_lock
from store import queries
from store.schema import db_path
from tests.support.paths import REPO
from tests.support.waiting import wait_until

MODEL = "qwen2.5:0.5b"  # the small model the collector tests chat with
PROMPT_PAD = "x" * 1500  # ``drive``'s prompts, recorded (--record-text): each request row a few KB, so the store fills quickly


@contextlib.contextmanager
def collector(
    data: Path, *args: str, wait: bool = True, env_extra: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """Run ``python -m collectors --data DATA --listen 127.0.0.1:0 ARGS``; kill it if the test did not stop it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))} | (env_extra or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "collectors", "--data", str(data), "--listen", "127.0.0.1:0", "--interval", "0.2", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if wait:
            wait_ready(data, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def wait_ready(data: Path, proc: subprocess.Popen[str], timeout_s: float = 30.0) -> LockInfo:
    deadline = time.monotonic() + timeout_s
    while True:
        info = read_lock(data)
        if info is not None and info.pid == proc.pid and info.listen:
            return info
        if proc.poll() is not None:
            raise AssertionError(f"collector exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, "collector did not get ready"
        time.sleep(0.05)


def listen_url(data: Path) -> str:
    info = read_lock(data)
    assert info is not None
    return f"http://{info.listen}"


def stopped_accepting(base_url: str) -> bool:
    """Whether a fresh connection to ``base_url`` finds no listener: refused, or reset (a probe that connected just
    before the listener closed is reset while it sends or reads, not refused). Both mean "not accepting"; an answer
    means it still accepts; anything else (a timeout) is raised."""
    try:
        urllib.request.urlopen(base_url + "/api/version", timeout=5).close()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionError):  # refused, or reset while the request went out
            return True
        raise
    except ConnectionError:  # reset (or closed without an answer) while reading the status line
        return True
    return False


def query(data: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str]:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


def drive(
    base_url: str, seconds: float, clients: int, on_answer: Callable[[str], None], per_client_interval_s: float = 0.0
) -> int:
    """``clients`` concurrent non-streamed chats, back to back (or each client at most one per
    ``per_client_interval_s``), for ``seconds``; returns how many were answered."""

    async def one(session: aiohttp.ClientSession, worker: int, stop_at: float) -> int:
        n = 0
        next_at = time.monotonic()
        while time.monotonic() < stop_at:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += per_client_interval_s
            prompt = f"request {worker}-{n} {PROMPT_PAD}"
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "stream": False,
                "options": {"num_predict": 2},
            }
            try:
                async with session.post(base_url + "/api/chat", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        return n
            except aiohttp.ClientError:
                return n  # the collector is gone
            on_answer(prompt)
            n += 1
        return n

    async def main() -> int:
        stop_at = time.monotonic() + seconds
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            counts = await asyncio.gather(*(one(session, w, stop_at) for w in range(clients)))
        return sum(counts)

    return asyncio.run(main())


def heartbeat_unix_s(data: Path) -> float | None:
    """When the collector of ``data`` last wrote its heartbeat, at the end of a tick (None: not yet)."""
    with queries.open_reader(db_path(data)) as conn:
        beat = queries.latest_heartbeat(conn) if conn is not None else None
    return None if beat is None else beat.ts_unix_s


def wait_for_ticks(data: Path, timeout_s: float = 30.0) -> None:
    """Wait until the collector has run a whole tick that began after this call: what it had read by now
    (runner readings, log lines, finished requests) is then in the store, as the writer keeps the order
    of what it is given and a tick writes its heartbeat last."""
    since = time.time()
    first = wait_until(lambda: (t := heartbeat_unix_s(data)) is not None and t > since and t, timeout_s, "a heartbeat")
    wait_until(lambda: (t := heartbeat_unix_s(data)) is not None and t > first, timeout_s, "the next tick's heartbeat")
