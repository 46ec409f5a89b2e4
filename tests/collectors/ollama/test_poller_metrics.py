"""Ollama's own /metrics (open PRs #16998/#18508, behind OLLAMA_METRICS): its queue gauge read with
prometheus_client's parser, by model; anything else (not Prometheus text, no such gauge) is "not served"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from collectors.ollama.poller import MAX_QUEUED_REQUESTS, OllamaPoller, parse_queue_gauge
from tests.support.poller_sink import RecordingSink
from tests.support.sim_process import start_sim


def test_the_gauge_by_model_and_without_a_label() -> None:
    text = (
        "# TYPE ollama_requests_queued gauge\n"
        'ollama_requests_queued{model="llama3.2:latest"} 3\n'
        'ollama_requests_queued{model="qwen2.5:0.5b"} 0\n'
        "# TYPE phasewatch_requests_total counter\nphasewatch_requests_total 7\n"
    )
    assert parse_queue_gauge(text) == ({"llama3.2:latest": 3, "qwen2.5:0.5b": 0}, 0)
    assert parse_queue_gauge("# TYPE ollama_requests_queued gauge\nollama_requests_queued 2\n") == ({"": 2}, 0)


def test_not_prometheus_or_no_gauge_is_not_served() -> None:
    assert parse_queue_gauge("404 page not found") is None
    assert parse_queue_gauge("<html><body>hi</body></html>") is None
    assert parse_queue_gauge("# TYPE go_goroutines gauge\ngo_goroutines 12\n") is None


def test_the_poller_reads_it_only_where_it_is_served() -> None:
    async def poll(url: str) -> dict[str, int] | None:
        async with aiohttp.ClientSession() as session:
            poller = OllamaPoller(url, session, RecordingSink())
            assert await poller.poll_once()
            return poller.state.queued

    with start_sim() as plain:  # today's Ollama: /metrics is a 404
        assert asyncio.run(poll(plain.base_url)) is None
    with start_sim("--metrics") as served:  # nothing loaded yet: an empty gauge, but served
        assert asyncio.run(poll(served.base_url)) == {}


HOSTILE_GAUGE = (
    "# TYPE ollama_requests_queued gauge\n"
    'ollama_requests_queued{model="a"} 1e308\n'  # 309 digits as an int
    'ollama_requests_queued{model="g"} ' + "9" * 400 + "\n"  # an integer past any float
    'ollama_requests_queued{model="b"} +Inf\n'
    'ollama_requests_queued{model="c"} NaN\n'
    'ollama_requests_queued{model="d"} 2.5\n'
    'ollama_requests_queued{model="e"} -3\n'
    f'ollama_requests_queued{{model="f"}} {MAX_QUEUED_REQUESTS}\n'
    'ollama_requests_queued{model="f"} 1\n'  # a second sample past the bound in total
    'ollama_requests_queued{model="ok"} 4\n'
)


def test_numbers_that_are_no_count_are_refused() -> None:
    assert parse_queue_gauge(HOSTILE_GAUGE) == ({"f": MAX_QUEUED_REQUESTS, "ok": 4}, 7)


def test_a_hostile_ollamas_metrics_never_reach_the_state(caplog: pytest.LogCaptureFixture) -> None:
    """An Ollama on loopback whose /metrics says 1e308 requests wait: the poller keeps the sane samples, counts the
    refused ones and warns once, not every poll."""

    async def run() -> list[tuple[dict[str, int] | None, int]]:
        app = web.Application()
        app.router.add_get("/api/version", _answer(web.json_response({"version": "0.33.0"})))
        app.router.add_get("/api/ps", _answer(web.json_response({"models": []})))
        app.router.add_get("/api/tags", _answer(web.json_response({"models": []})))
        app.router.add_get("/metrics", _answer(web.Response(text=HOSTILE_GAUGE, content_type="text/plain")))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                poller = OllamaPoller(f"http://127.0.0.1:{port}", session, RecordingSink())
                seen = []
                for _ in range(3):
                    assert await poller.poll_once()
                    seen.append((poller.state.queued, poller.state.queued_refused))
                return seen
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.WARNING, logger="collectors.ollama.poller"):
        seen = asyncio.run(run())
    assert seen == [({"f": MAX_QUEUED_REQUESTS, "ok": 4}, 7)] * 3
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


def _answer(make: web.Response) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler answering a fresh copy of ``make`` (a response object is sent once)."""
    status, body, content_type = make.status, make.body, make.content_type

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, content_type=content_type)

    return handler


def test_tags_again_when_ps_lists_a_model_tags_did_not_once_per_name() -> None:
    """/api/tags every TAGS_INTERVAL_S (5 min), at start, and at once when /api/ps lists a model the last /api/tags
    did not (a pull since), once per name: an Ollama on loopback whose /api/tags never lists it."""
    hits: dict[str, int] = {}

    def counted(path: str, body: object) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_request: web.Request) -> web.Response:
            hits[path] = hits.get(path, 0) + 1
            return web.json_response(body)

        return handler

    loaded = {"name": "new:latest", "model": "new:latest", "digest": "d1", "size": 1, "size_vram": 1}

    async def run() -> list[int]:
        app = web.Application()
        app.router.add_get("/api/version", counted("version", {"version": "0.33.0"}))
        app.router.add_get("/api/ps", counted("ps", {"models": [loaded]}))
        app.router.add_get("/api/tags", counted("tags", {"models": []}))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                poller = OllamaPoller(f"http://127.0.0.1:{port}", session, RecordingSink())
                seen = []
                for _ in range(4):
                    assert await poller.poll_once()
                    seen.append(hits.get("tags", 0))
                return seen
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) == [1, 2, 2, 2]  # at start; once for the new name; not again
