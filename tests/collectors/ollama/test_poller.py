"""Ollama poller against the real sim on a loopback port: up, down, back up; /api/ps and /api/show."""

from __future__ import annotations

import asyncio
import calendar
import os
import signal

import aiohttp
import pytest
from aiohttp import web

from analysis.records import LoadedModel
from collectors.ollama.poller import OllamaPoller, PollError, parse_ps, parse_time
from tests.support.poller_sink import RecordingSink, sim_on
from tests.support.ports import free_port
from tests.support.waiting import wait_until_async

# -- pure parts ----------------------------------------------------------------------

PS_EXAMPLE = {
    "models": [
        {
            "name": "llama3.2:latest",
            "model": "llama3.2:latest",
            "size": 3612345678,
            "digest": "a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "llama",
                "families": None,
                "parameter_size": "3.2B",
                "quantization_level": "Q4_K_M",
            },
            "expires_at": "2026-08-21T10:05:00.123456789-07:00",
            "size_vram": 3612345678,
            "context_length": 4096,
        }
    ]
}


def test_parse_ps_reads_the_documented_example() -> None:
    (m,) = parse_ps(PS_EXAMPLE, 5.0)
    assert m == LoadedModel(
        ts_unix_s=5.0,
        name="llama3.2:latest",
        model="llama3.2:latest",
        digest="a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
        size_bytes=3612345678,
        size_vram_bytes=3612345678,
        context_length=4096,
        expires_at_unix_s=pytest.approx(1787331900.123456),  # type: ignore[arg-type]
        parameter_size="3.2B",
        quantization_level="Q4_K_M",
        family="llama",
    )


def test_parse_ps_edge_cases() -> None:
    assert parse_ps({"models": []}, 0) == []
    assert parse_ps({"models": None}, 0) == []
    (m,) = parse_ps({"models": [{"name": "x", "size": 10}]}, 0)  # size_vram omitted when 0 (omitempty)
    assert (m.size_vram_bytes, m.context_length, m.expires_at_unix_s, m.digest) == (0, None, None, "")
    bad_bodies: list[object] = [[], {"models": 3}, {"models": ["x"]}, "text"]
    for bad in bad_bodies:
        with pytest.raises(PollError):
            parse_ps(bad, 0)


def test_parse_time() -> None:
    assert parse_time("2026-08-21T17:05:00Z") == 1787331900.0
    assert parse_time("0001-01-01T00:00:00Z") is None  # Go's zero time
    assert parse_time("2318-01-01T00:00:00Z") == calendar.timegm((2318, 1, 1, 0, 0, 0))  # keep_alive -1: centuries ahead
    assert parse_time("soon") is None and parse_time(None) is None and parse_time("") is None


def test_backoff_doubles_to_the_cap() -> None:
    poller = OllamaPoller("http://127.0.0.1:1", None, RecordingSink(), interval_s=1.0)  # type: ignore[arg-type]
    delays = []
    for failures in range(8):
        poller.state.consecutive_failures = failures
        delays.append(poller.next_delay_s())
    assert delays == [1, 1, 2, 4, 8, 16, 30, 30]


# -- against real servers ------------------------------------------------------------


@pytest.mark.slow
def test_down_up_down_up_against_the_sim() -> None:
    asyncio.run(_down_up_down_up())


async def _down_up_down_up() -> None:
    port = free_port()
    sink = RecordingSink()
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        # /api/ps every interval even while idle: this test is about down and up (the pace: test_poller_pace.py).
        poller = OllamaPoller(f"http://127.0.0.1:{port}", session, sink, interval_s=0.1, max_backoff_s=0.4, idle_interval_s=0.1)
        task = asyncio.create_task(poller.run(stop))
        try:
            # Nobody listens yet: recorded as down, with the reason, and the loop keeps going.
            await wait_until_async(lambda: len(sink.statuses) >= 3)
            first = sink.statuses[0]
            assert first.up is False and first.error is not None and "cannot connect" in first.error
            assert first.base_url == f"http://127.0.0.1:{port}"
            assert poller.state.consecutive_failures >= 3 and not task.done()

            with sim_on(port):
                await wait_until_async(lambda: sink.statuses[-1].up)
                assert sink.statuses[-1].version == "0.33.3"
                # Load a model through the API: /api/ps lists it, /api/show is stored once for its digest.
                async with session.post(f"http://127.0.0.1:{port}/api/generate", json={"model": "qwen2.5:0.5b"}) as r:
                    assert (await r.json())["done_reason"] == "load"
                await wait_until_async(lambda: bool(sink.snapshots and sink.snapshots[-1][1]))
                (loaded,) = sink.snapshots[-1][1]
                assert loaded.name == "qwen2.5:0.5b" and len(loaded.digest) == 64
                assert loaded.size_vram_bytes > 0 and loaded.context_length and loaded.expires_at_unix_s
                n_polls = len(sink.snapshots)
                await wait_until_async(lambda: len(sink.snapshots) >= n_polls + 5)
                # Installed models are asked about too (test_poller_tags.py); each digest once.
                assert [n for d, n, _ in sink.shows if d == loaded.digest] == ["qwen2.5:0.5b"]
                assert len({d for d, _, _ in sink.shows}) == len(sink.shows)
                show = next(s for d, _, s in sink.shows if d == loaded.digest)
                assert show["model_info"]["general.architecture"] == "qwen2"
            # The sim is gone (terminated): down again.
            await wait_until_async(lambda: not sink.statuses[-1].up)
            assert poller.state.models == []

            with sim_on(port) as sim:
                await wait_until_async(lambda: sink.statuses[-1].up)
                os.kill(sim.pid, signal.SIGKILL)  # killed outright this time
                sim.wait(timeout=10)
                await wait_until_async(lambda: not sink.statuses[-1].up)
            with sim_on(port):
                await wait_until_async(lambda: sink.statuses[-1].up)
                stop.set()  # before this sim goes away, or its exit would be one more "down"
                await asyncio.wait_for(task, 5)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
    assert task.exception() is None
    ups = [s.up for s in sink.statuses]
    # Collapse runs: down, up, down, up, down, up.
    runs = [u for i, u in enumerate(ups) if i == 0 or ups[i - 1] != u]
    assert runs == [False, True, False, True, False, True]


def test_a_server_that_is_not_ollama_is_down_with_a_reason() -> None:
    asyncio.run(_not_ollama())


async def _not_ollama() -> None:
    async def html(_: web.Request) -> web.Response:
        return web.Response(text="<html>router login</html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", html)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    sink = RecordingSink()
    try:
        async with aiohttp.ClientSession() as session:
            poller = OllamaPoller(f"http://127.0.0.1:{port}", session, sink)
            assert await poller.poll_once() is False
    finally:
        await runner.cleanup()
    (status,) = sink.statuses
    assert status.up is False and status.error is not None and "/api/version did not return JSON" in status.error
    assert sink.snapshots == []
