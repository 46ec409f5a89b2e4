"""Ollama's own /metrics (open PRs #16998/#18508, behind OLLAMA_METRICS): its queue gauge read with
prometheus_client's parser, by model; anything else (not Prometheus text, no such gauge) is "not served"."""

from __future__ import annotations

import asyncio

import aiohttp

from collectors.ollama.poller import OllamaPoller, parse_queue_gauge
from tests.support.poller_sink import RecordingSink
from tests.support.sim_process import start_sim


def test_the_gauge_by_model_and_without_a_label() -> None:
    text = (
        "# TYPE ollama_requests_queued gauge\n"
        'ollama_requests_queued{model="llama3.2:latest"} 3\n'
        'ollama_requests_queued{model="qwen2.5:0.5b"} 0\n'
        "# TYPE phasewatch_requests_total counter\nphasewatch_requests_total 7\n"
    )
    assert parse_queue_gauge(text) == {"llama3.2:latest": 3, "qwen2.5:0.5b": 0}
    assert parse_queue_gauge("# TYPE ollama_requests_queued gauge\nollama_requests_queued 2\n") == {"": 2}


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
