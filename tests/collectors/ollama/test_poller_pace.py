"""The poller's own lines in Ollama's log: /api/version at start and after Ollama comes back, /api/ps every
interval only while something runs or a runner process appears or goes, seldom when idle. Counted in sim's
access log, which writes a line per request as Ollama does."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp

from collectors.ollama.poller import OllamaPoller, ps_at_interval
from tests.support.poller_sink import RecordingSink, sim_on
from tests.support.ports import free_port
from tests.support.sim_process import SimProcess, start_sim
from tests.support.waiting import wait_until_async

INTERVAL_S = 0.05  # the poller's tick: unpaced, /api/version and /api/ps 20 times a second each
IDLE_S = 1.0


def count(sim: SimProcess, path: str) -> int:
    return len(re.findall(rf'GET\s+"{re.escape(path)}"', sim.log()))


def test_idle_polls_are_seldom_and_activity_polls_every_interval() -> None:
    with start_sim() as sim:
        asyncio.run(_pace(sim))


async def _pace(sim: SimProcess) -> None:
    busy = False
    changed = False

    def processes_changed() -> bool:
        nonlocal changed
        was, changed = changed, False
        return was

    sink = RecordingSink()
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        poller = OllamaPoller(
            sim.base_url,
            session,
            sink,
            interval_s=INTERVAL_S,
            idle_interval_s=IDLE_S,
            busy=lambda: busy,
            processes_changed=processes_changed,
        )
        task = asyncio.create_task(poller.run(stop))
        try:
            await wait_until_async(lambda: bool(sink.statuses) and sink.statuses[-1].up)
            t0, ps0 = time.monotonic(), count(sim, "/api/ps")
            await asyncio.sleep(3.0)
            idle_ps = count(sim, "/api/ps") - ps0
            idle_s = time.monotonic() - t0
            # Idle: one /api/ps a second (60 unpaced); a busy machine only makes it fewer.
            assert 1 <= idle_ps <= idle_s / IDLE_S + 1, (idle_ps, idle_s)

            busy = True  # a request in flight: every interval, so loads and unloads are seen as they happen
            ps1 = count(sim, "/api/ps")
            await asyncio.sleep(1.0)
            assert count(sim, "/api/ps") - ps1 >= 5
            busy = False

            await asyncio.sleep(0.3)  # the last busy poll done
            ps2 = count(sim, "/api/ps")
            changed = True  # a runner process appeared: one /api/ps at once, not at the idle pace
            await wait_until_async(lambda: count(sim, "/api/ps") > ps2, timeout_s=IDLE_S * 0.8)
            assert count(sim, "/api/version") == 1  # only at start: Ollama never went away
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
    assert task.exception() is None


def test_version_is_asked_again_after_ollama_comes_back() -> None:
    asyncio.run(_comes_back())


async def _comes_back() -> None:
    port = free_port()
    sink = RecordingSink()
    stop = asyncio.Event()
    asked: list[str] = []  # the path of every request the poller sends

    async def on_request_start(_s: object, _c: object, params: aiohttp.TraceRequestStartParams) -> None:
        asked.append(params.url.path)

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        poller = OllamaPoller(
            f"http://127.0.0.1:{port}", session, sink, interval_s=INTERVAL_S, max_backoff_s=0.2, idle_interval_s=0.2
        )
        task = asyncio.create_task(poller.run(stop))
        try:
            for _ in range(2):
                with sim_on(port):
                    await wait_until_async(lambda: bool(sink.statuses) and sink.statuses[-1].up)
                    mark, polls = len(asked), len(sink.statuses)
                    await wait_until_async(lambda n=polls: len(sink.statuses) >= n + 3)  # three idle polls more
                    # (a poll's /api/ps may have been sent before the mark, its status read after it)
                    assert "/api/version" not in asked[mark:] and asked[mark:].count("/api/ps") >= 2
                    assert all(s.up and s.version == "0.33.3" for s in sink.statuses[polls - 1 :])
                await wait_until_async(lambda: not sink.statuses[-1].up)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
    assert task.exception() is None


def test_ps_at_one_hertz_only_while_slots_cannot_tell() -> None:
    """Issue 42: /api/ps every interval only while what it says can change and nothing else shows it."""

    def at_interval(running: list[str], shown: list[str], *, finished: bool = False, unmatched: bool = False) -> bool:
        return ps_at_interval(finished=finished, unmatched=unmatched, running_models=running, slots_models=shown)

    served = ["llama3.2:latest"]
    assert not at_interval([], served)  # nothing runs: the idle pace
    assert not at_interval(["llama3.2"], served), "its runner's /slots shows it: /api/ps cannot change before it ends"
    assert at_interval(["llama3.2"], []), "no runner read (a container, another machine): /api/ps is all there is"
    assert at_interval(["llama3.2", "qwen2.5:0.5b"], served), "a request no runner shows"
    assert at_interval([], served, finished=True), "a request ended: its model's expires_at moved"
    assert at_interval([], served, unmatched=True), "a runner /api/ps has not named yet"
