"""Run a RecordingProxy on its own event loop in a background thread, for synchronous tests.

with run_proxy(sim.base_url) as proxy:
    client = ollama.Client(host=proxy.base_url)
    ...
    records = proxy.wait_records(1)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from analysis.records import RequestRecord
from collectors.proxy.recording import RecordingProxy

T = TypeVar("T")


class ProxyThread:
    def __init__(
        self,
        upstream_url: str,
        *,
        record_text: bool = False,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_begin: Callable[[], None] = lambda: None,
    ) -> None:
        self.records: list[RequestRecord] = []  # appended on the proxy's loop, read here (list ops are atomic)
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy-loop", daemon=True)
        self._extra = on_record
        self.proxy = RecordingProxy(upstream_url, self._on_record, record_text=record_text, on_begin=on_begin)

    def _on_record(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self._extra is not None:
            self._extra(record)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 15.0) -> T:
        """Run a coroutine on the proxy's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def in_flight(self) -> list[RequestRecord]:
        async def snap() -> list[RequestRecord]:
            return self.proxy.in_flight()

        return self.call(snap())

    def wait_records(self, n: int, timeout_s: float = 30.0) -> list[RequestRecord]:
        """Wait until at least n records arrived; return them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.records) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {n} records, got {len(self.records)}: {self.records}")
            time.sleep(0.01)
        return list(self.records)

    def wait_record(self, record_id: str, timeout_s: float = 30.0) -> RequestRecord:
        """The record with this id (from the X-Phasewatch-Request-Id response header), once it arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in list(self.records):
                if record.id == record_id:
                    return record
            time.sleep(0.01)
        raise TimeoutError(f"no record {record_id} within {timeout_s}s")

    def start(self) -> None:
        self._thread.start()
        self.call(self.proxy.start("127.0.0.1", 0))

    def stop(self) -> None:
        try:
            self.call(self.proxy.stop(), timeout_s=20.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
            if not self._thread.is_alive():
                self._loop.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # the loop the collector runs on where installed
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


@contextlib.contextmanager
def run_proxy(
    upstream_url: str,
    *,
    record_text: bool = False,
    on_record: Callable[[RequestRecord], None] | None = None,
    on_begin: Callable[[], None] = lambda: None,
) -> Iterator[ProxyThread]:
    proxy = ProxyThread(upstream_url, record_text=record_text, on_record=on_record, on_begin=on_begin)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def sim_truth(base_url: str, sim_id: str) -> dict[str, Any]:
    """sim's truth about one request (by its X-Sim-Request-Id)."""
    with urllib.request.urlopen(base_url + "/sim/truth", timeout=10) as r:
        truths = json.loads(r.read())["requests"]
    for truth in truths:
        if truth["id"] == sim_id:
            return dict(truth)
    raise KeyError(f"sim has no truth for request {sim_id}")
