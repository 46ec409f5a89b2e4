"""The recording proxy in its own process, a burst of concurrent streams through it, and its stamps against sim's truth.

Used by ``tests/collectors/proxy/test_proxy_concurrency.py`` (which asserts what holds on a busy machine) and
``bench/proxy_accuracy.py`` (which prints the percentiles against issue 3's 2 ms target).
The proxy runs as ``python -m collectors.proxy --print-records``, as in production (the collector
process), so the client never competes with it for the GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord, SeenFrom
from collectors.proxy.recording import RECORD_ID_HEADER
from tests.support.ports import free_port
from tests.support.sim_process import REPO_ROOT


@dataclass
class ProxyProcess:
    base_url: str
    proc: subprocess.Popen[bytes]
    records_path: Path

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM, then the records it printed (one JSON object per line)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        lines = self.records_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def _env() -> dict[str, str]:
    """This environment without PHASEWATCH_TOKEN: a token in the developer's shell would make the proxy answer 401."""
    return {k: v for k, v in os.environ.items() if k != "PHASEWATCH_TOKEN"}


@contextlib.contextmanager
def start_proxy_process(
    upstream: str, folder: Path, env: dict[str, str] | None = None, fd_limit: int | None = None
) -> Iterator[ProxyProcess]:
    """``env``: extra variables for the proxy (``PHASEWATCH_<LIMIT>`` settings); ``fd_limit``: its open-file limit,
    soft and hard (as ``ulimit -n`` in its shell)."""
    port = free_port()
    cmd = [sys.executable, "-m", "collectors.proxy", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--print-records"]
    records_path = folder / "records.jsonl"
    # A file, not a pipe: a pipe nobody reads until the end would fill up and stall the proxy's loop.
    with records_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.DEVNULL,
            env=_env() | (env or {}),
            preexec_fn=None if fd_limit is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit)),
        )
    proxy = ProxyProcess(f"http://127.0.0.1:{port}", proc, records_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("proxy did not listen within 30 s")
            time.sleep(0.05)
        yield proxy
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


async def _one(
    session: aiohttp.ClientSession, url: str, i: int, options: dict[str, int], stagger_s: float, model: str
) -> tuple[str, str]:
    await asyncio.sleep(i * stagger_s)
    body = {"model": model, "prompt": f"Question {i}: why is the sky blue?", "options": options}
    async with session.post(url + "/api/generate", json=body) as r:
        assert r.status == 200
        async for _ in r.content.iter_any():
            pass
        return r.headers["X-Sim-Request-Id"], r.headers[RECORD_ID_HEADER]


def burst(url: str, *, streams: int, model: str, tokens: int, num_ctx: int, stagger_s: float) -> list[tuple[str, str]]:
    """``streams`` concurrent generations, started ``stagger_s`` apart; (sim id, record id) of each.

    ``num_ctx`` sizes the KV cache Ollama reserves for every slot (num_ctx x streams): at Ollama's default
    for a big GPU the model would spill out of its memory and every step take many times longer.
    """
    options = {"num_predict": tokens, "num_ctx": num_ctx}

    async def run() -> list[tuple[str, str]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            return await asyncio.gather(*(_one(session, url, i, options, stagger_s, model) for i in range(streams)))

    return asyncio.run(run())


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


@dataclass
class StampErrors:
    """How the proxy's stamps differ from sim's truth, in ms (all from one run)."""

    ttft_err_ms: list[float] = field(default_factory=list)  # |recorded TTFT - true TTFT| per stream
    gap_err_ms: list[float] = field(default_factory=list)  # |recorded gap - true gap| per pair of tokens
    lag_ms: list[float] = field(default_factory=list)  # our stamp - sim's write stamp, per token
    true_gap_ms: list[float] = field(default_factory=list)  # sim's own gaps between written tokens
    hop_ms: list[float] = field(default_factory=list)  # proxy received -> sim received, per stream

    def add(self, rec: dict[str, Any], truth: dict[str, Any]) -> None:
        ours, theirs = rec["token_chunk_ns"], truth["token_written_ns"]
        assert len(ours) == len(theirs)
        self.ttft_err_ms.append(abs((ours[0] - rec["received_ns"]) - (theirs[0] - truth["received_ns"])) / 1e6)
        self.hop_ms.append((truth["received_ns"] - rec["received_ns"]) / 1e6)
        for i in range(1, len(ours)):
            self.gap_err_ms.append(abs((ours[i] - ours[i - 1]) - (theirs[i] - theirs[i - 1])) / 1e6)
            self.true_gap_ms.append((theirs[i] - theirs[i - 1]) / 1e6)
        self.lag_ms += [(a - b) / 1e6 for a, b in zip(ours, theirs, strict=True)]

    def summary(self) -> str:
        return (
            f"TTFT error p50 {statistics.median(self.ttft_err_ms):.3f} / p99 {p99(self.ttft_err_ms):.3f} ms "
            f"(max {max(self.ttft_err_ms):.3f}; proxy->sim hop p50 {statistics.median(self.hop_ms):.3f}); "
            f"gap error p50 {statistics.median(self.gap_err_ms):.3f} / p90 {statistics.quantiles(self.gap_err_ms, n=10)[8]:.3f} "
            f"/ p99 {p99(self.gap_err_ms):.3f} ms (max {max(self.gap_err_ms):.3f}); "
            f"true gap p50 {statistics.median(self.true_gap_ms):.3f} ms; "
            f"token lag behind sim p50 {statistics.median(self.lag_ms):.3f} / p99 {p99(self.lag_ms):.3f} ms "
            f"(min {min(self.lag_ms):.3f}, max {max(self.lag_ms):.3f})"
        )


class ProxyChild:
    """The proxy in its own process, read as a ``ProxyThread`` is (``base_url``, ``records``, ``wait_records``,
    ``wait_record``), for tests that compare its stamps with sim's: a proxy in a thread of the test process shares
    the GIL with the client, and on a loaded machine its stamps wait for the client's thread to let go of it (seen:
    a stream's decode recorded at 1.5 s for sim's 0.7 s). In its own process, as in production, it stamps when the
    bytes arrive."""

    def __init__(self, process: ProxyProcess) -> None:
        self.base_url = process.base_url
        self._path = process.records_path
        self._read_bytes = 0
        self._records: list[RequestRecord] = []

    @property
    def records(self) -> list[RequestRecord]:
        """Every record the child printed so far (a complete line each; a line being written waits)."""
        with self._path.open("rb") as f:
            f.seek(self._read_bytes)
            text = f.read()
        done = text[: text.rfind(b"\n") + 1]
        self._read_bytes += len(done)
        self._records.extend(record_from_json(json.loads(line)) for line in done.splitlines() if line.strip())
        return list(self._records)

    def wait_records(self, n: int, timeout_s: float = 30.0) -> list[RequestRecord]:
        """Wait until at least n records arrived; return them all."""
        deadline = time.monotonic() + timeout_s
        while len(records := self.records) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {n} records, got {len(records)}: {records}")
            time.sleep(0.01)
        return records

    def wait_record(self, record_id: str, timeout_s: float = 30.0) -> RequestRecord:
        """The record with this id (from the X-Phasewatch-Request-Id response header), once it arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in self.records:
                if record.id == record_id:
                    return record
            time.sleep(0.01)
        raise TimeoutError(f"no record {record_id} within {timeout_s}s")


def record_from_json(d: dict[str, Any]) -> RequestRecord:
    """A record as ``--print-records`` printed it (``dataclasses.asdict``), back as a RequestRecord."""
    metrics = d["metrics"]
    return RequestRecord(
        **(d | {"metrics": None if metrics is None else FinalMetrics(**metrics)})
        | {"outcome": Outcome(d["outcome"]), "kind": RequestKind(d["kind"]), "seen_from": SeenFrom(d["seen_from"])}
    )


@contextlib.contextmanager
def run_proxy_child(upstream: str, folder: Path) -> Iterator[ProxyChild]:
    with start_proxy_process(upstream, folder) as process:
        yield ProxyChild(process)
