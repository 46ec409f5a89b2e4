"""The poller's installed models: ``/api/tags`` against the real sim into a real SQLite store, their ``/api/show``
answers (a bounded number per poll), a removed model disappearing, and bodies that are not /api/tags."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from analysis.model_facts import model_facts_from_show
from collectors.ollama.poller import OllamaPoller, PollError, parse_tags
from store import queries
from store.ops import Op
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.sim_process import SimProcess, http_json, start_sim

# The documented /api/tags example (one model).
TAGS_EXAMPLE = {
    "models": [
        {
            "name": "llama3.2:latest",
            "model": "llama3.2:latest",
            "modified_at": "2026-08-01T09:00:00.5-07:00",
            "size": 2019393189,
            "digest": "a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "llama",
                "families": ["llama"],
                "parameter_size": "3.2B",
                "quantization_level": "Q4_K_M",
                "context_length": 131072,
                "embedding_length": 3072,
            },
            "capabilities": ["completion", "tools"],
        }
    ]
}


class StoreSink:
    """The poller's sink writing straight into a real store (the collector's BackgroundWriter does it in batches)."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer
        self.ops: list[Op[Any]] = []

    def submit(self, op: Op[Any]) -> None:
        self.ops.append(op)
        self.writer.write(op)


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    with start_sim("--hardware", "rtx-4090") as s:
        yield s


@contextlib.contextmanager
def reader(path: Path) -> Iterator[sqlite3.Connection]:
    with queries.open_reader(path) as conn:
        assert conn is not None
        yield conn


def _installed(path: Path) -> list[str]:
    with reader(path) as conn:
        return [m.name for m in queries.installed_models(conn)]


def _shows_stored(path: Path) -> int:
    with reader(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM model_info").fetchone()[0])


def _shows_asked(sim: SimProcess) -> int:
    return len(re.findall(r'POST\s+"/api/show"', sim.log()))


# -- pure parts ----------------------------------------------------------------------


def test_parse_tags_reads_the_documented_example() -> None:
    (m,), skipped = parse_tags(TAGS_EXAMPLE, 7.0)
    assert skipped == 0
    assert (m.ts_unix_s, m.name, m.model, m.digest, m.size_bytes) == (
        7.0,
        "llama3.2:latest",
        "llama3.2:latest",
        TAGS_EXAMPLE["models"][0]["digest"],
        2019393189,
    )
    assert (m.parameter_size, m.quantization_level, m.family) == ("3.2B", "Q4_K_M", "llama")
    assert m.modified_at_unix_s == pytest.approx(1785600000.5)  # 16:00:00.5 UTC
    assert m.capabilities == ("completion", "tools")


def test_parse_tags_skips_and_counts_bad_entries_and_never_stores_zero() -> None:
    body = {
        "models": [
            "not an object",
            {"size": 5},
            {"name": "a:latest", "size": 0, "modified_at": "0001-01-01T00:00:00Z"},
            {"name": "a:latest", "size": 9},
            {"model": "b:1b", "size": True, "details": "x", "capabilities": "completion"},
        ]
    }
    models, skipped = parse_tags(body, 0)
    assert skipped == 3  # not an object, no name, a name listed twice
    a, b = models
    assert (a.name, a.size_bytes, a.modified_at_unix_s, a.digest) == ("a:latest", None, None, "")
    assert (b.name, b.model, b.size_bytes, b.family, b.capabilities) == ("b:1b", "b:1b", None, None, ())
    assert parse_tags({"models": []}, 0) == ([], 0) and parse_tags({"models": None}, 0) == ([], 0)
    bad_bodies: list[object] = [[], {"models": 3}, {"models": "x"}, {}, {"error": "x"}, "text", None]
    for bad in bad_bodies:
        with pytest.raises(PollError, match="/api/tags"):
            parse_tags(bad, 0)


# -- against the sim, into a real store ------------------------------------------------------


def test_installed_models_and_their_shows_are_stored_a_few_per_poll(sim: SimProcess, tmp_path: Path) -> None:
    asyncio.run(_installed_and_shows(sim, tmp_path))


async def _installed_and_shows(sim: SimProcess, tmp_path: Path) -> None:
    path = db_path(tmp_path)
    writer = StoreWriter(path)
    _, tags = http_json(sim, "GET", "/api/tags")
    names = [m["name"] for m in tags["models"]]
    assert len(names) >= 5  # enough to see the bound work
    try:
        async with aiohttp.ClientSession() as session:
            poller = OllamaPoller(sim.base_url, session, StoreSink(writer), tags_interval_s=3600)
            poller.shows_per_poll = 2
            shown_per_poll = []
            for _ in range(len(names)):
                before = _shows_stored(path)
                assert await poller.poll_once() is True
                shown_per_poll.append(_shows_stored(path) - before)
            # Never more than the bound per poll, each installed model asked about once, then no more.
            assert shown_per_poll[: (len(names) + 1) // 2] == [2] * (len(names) // 2) + [1] * (len(names) % 2)
            assert sum(shown_per_poll) == len(names)
            # The sim saw exactly one /api/show per model (its log line follows the reply: give it a moment).
            deadline = time.monotonic() + 10
            while _shows_asked(sim) < len(names) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _shows_asked(sim) == len(names)
            assert _installed(path) == names  # newest first, as Ollama lists them

            with reader(path) as conn:
                rows = {m.name: m for m in queries.installed_models(conn)}
                big = rows["llama3.1:70b"]
                assert big.size_bytes == next(m["size"] for m in tags["models"] if m["name"] == "llama3.1:70b")
                assert (big.parameter_size, big.quantization_level, big.family) == ("70.6B", "Q4_K_M", "llama")
                # An installed model's facts read exactly as a loaded one's: its stored /api/show.
                info = queries.model_info(conn, "llama3.1:70b")
                assert info is not None and info.digest == big.digest
                facts = model_facts_from_show(info.show, None)
                assert facts.layers == 80 and facts.params > 70e9
                assert "nomic-embed-text:latest" in rows and rows["nomic-embed-text:latest"].capabilities == ("embedding",)

            # Removed from Ollama: still listed until /api/tags is due again (it is not polled every interval) ...
            status, _ = http_json(sim, "DELETE", "/api/delete", {"model": "qwen2.5:0.5b"})
            assert status == 200
            assert await poller.poll_once() is True
            assert "qwen2.5:0.5b" in _installed(path)
            # ... and gone from the store at the next /api/tags.
            poller._tags_due_at = 0.0  # due now, without waiting an hour
            assert await poller.poll_once() is True
            assert _installed(path) == [n for n in names if n != "qwen2.5:0.5b"]
    finally:
        writer.close()


def test_tags_are_read_at_start_and_again_after_the_interval(sim: SimProcess, tmp_path: Path) -> None:
    asyncio.run(_tags_interval(sim, tmp_path))


async def _tags_interval(sim: SimProcess, tmp_path: Path) -> None:
    path = db_path(tmp_path)
    writer = StoreWriter(path)
    try:
        async with aiohttp.ClientSession() as session:
            sink = StoreSink(writer)
            poller = OllamaPoller(sim.base_url, session, sink, interval_s=0.05, tags_interval_s=1.5, idle_interval_s=0.05)
            stop = asyncio.Event()
            task = asyncio.create_task(poller.run(stop))
            t0 = time.monotonic()
            while len(re.findall(r'GET\s+"/api/tags"', sim.log())) < 2:
                assert time.monotonic() - t0 < 30, "no second /api/tags"
                await asyncio.sleep(0.05)
            elapsed = time.monotonic() - t0
            n_ps = len(re.findall(r'GET\s+"/api/ps"', sim.log()))
            stop.set()
            await asyncio.wait_for(task, 10)
        assert elapsed >= 1.5  # the second read waited for the interval
        assert n_ps >= 3  # while /api/ps was polled every interval
        assert _installed(path)
    finally:
        writer.close()


# -- Ollama answers, but /api/tags does not ---------------------------------------------------


@pytest.mark.parametrize(
    ("tags_status", "tags_body", "error"),
    [
        (200, '{"models": 3}', '/api/tags did not return {"models": [...]}'),
        (200, "<html>no</html>", "/api/tags did not return JSON"),
        (404, "404 page not found", "/api/tags answered HTTP 404"),
    ],
)
def test_tags_that_fail_keep_ollama_up_and_store_nothing(tags_status: int, tags_body: str, error: str, tmp_path: Path) -> None:
    asyncio.run(_bad_tags(tags_status, tags_body, error, tmp_path))


async def _bad_tags(tags_status: int, tags_body: str, error: str, tmp_path: Path) -> None:
    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.3"})

    async def ps(_: web.Request) -> web.Response:
        return web.json_response({"models": []})

    async def tags(_: web.Request) -> web.Response:
        return web.Response(status=tags_status, text=tags_body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/ps", ps)
    app.router.add_get("/api/tags", tags)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    path = db_path(tmp_path)
    writer = StoreWriter(path)
    try:
        async with aiohttp.ClientSession() as session:
            poller = OllamaPoller(f"http://127.0.0.1:{port}", session, StoreSink(writer))
            assert await poller.poll_once() is True  # /api/version and /api/ps answered: Ollama is up
            assert await poller.poll_once() is True
        assert poller.state.tags_error is not None and error in poller.state.tags_error
        assert poller.state.installed is None
        with reader(path) as conn:
            assert queries.installed_models(conn) == []
            status = queries.latest_ollama_status(conn)
            assert status is not None and status.up
    finally:
        writer.close()
        await runner.cleanup()
