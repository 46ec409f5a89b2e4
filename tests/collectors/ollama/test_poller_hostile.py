"""The poller against a hostile upstream on loopback (an aiohttp server in the test), into a real store.

Issue 25 finding 6: /api/show answers were kept whole in memory (``Poller.shows``) and in ``model_info`` (1 MB each
x 5,000 tags: 5.5 GB RSS), /api/ps names were stored uncapped, and /api/ps sizes >= 2^63 lost the snapshot every
poll. Now what Ollama sends is clamped and capped, and only the /api/show fields Phasewatch uses are kept.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from analysis.model_facts import model_facts_from_show
from collectors.ollama.poller import MAX_ANSWER_BYTES, MAX_NAME_CHARS, SHOWS_HELD, OllamaPoller, slim_show
from sim.catalog import MODELS
from store.schema import db_path
from store.writer import BackgroundWriter

TAGS = 300  # installed models, each with its own digest and a 1 MB /api/show
JUNK_CHARS = 1_000_000
HUGE_NAME = "m" * 1_000_000


def _model_info(i: int) -> dict[str, Any]:
    return {
        "general.architecture": "llama",
        "general.parameter_count": 8_030_261_248,
        "general.file_type": 15,
        "llama.block_count": 32,
        "llama.embedding_length": 4096,
        "llama.attention.head_count": 32,
        "llama.attention.head_count_kv": 8,
        "llama.context_length": 131072,
        "tokenizer.ggml.merges": "x" * JUNK_CHARS,  # what a verbose show carries: never used
        "llama.rope.freq_base": 500000.0,
        f"junk.{i}": list(range(10_000)),
    }


def _app() -> web.Application:
    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.3" + "v" * 1_000_000})

    async def ps(_: web.Request) -> web.Response:
        model = {
            "name": HUGE_NAME,
            "model": HUGE_NAME,
            "digest": "d" * 100_000,
            "size": 2**64,
            "size_vram": 2**63,
            "context_length": 2**70,
            "details": {"family": "f" * 100_000, "quantization_level": "Q4_K_M"},
        }
        return web.json_response({"models": [model]})

    async def tags(_: web.Request) -> web.Response:
        models: list[dict[str, Any]] = [
            {
                "name": f"m{i}:latest",
                "model": f"m{i}:latest",
                "digest": f"sha256:{i:064d}",
                "size": 4_920_000_000,
                "capabilities": ["completion"],
            }
            for i in range(TAGS)
        ]
        models[0]["capabilities"] = ["completion", *("c" * 1000 for _ in range(1000))]
        models.append({"name": "huge:latest", "model": "huge:latest", "digest": "sha256:huge", "size": 1})
        return web.json_response({"models": models})

    async def show(request: web.Request) -> web.Response:
        name = (await request.json())["model"]
        if name == "huge:latest":  # past the answer cap: not read at all
            return web.Response(body=b"[" + b"1," * (MAX_ANSWER_BYTES // 2) + b"1]", content_type="application/json")
        i = int(name[1:].split(":")[0]) if name.startswith("m") and name[1:2].isdigit() else 0
        body = {
            "license": "L" * JUNK_CHARS,
            "modelfile": "M" * 1000,
            "details": {"family": "llama", "quantization_level": "Q4_K_M", "parameter_size": "8.0B"},
            "model_info": _model_info(i),
            "capabilities": ["completion", "tools"],
            "tensors": [{"name": "t" * 100} for _ in range(1000)],
        }
        return web.json_response(body)

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/ps", ps)
    app.router.add_get("/api/tags", tags)
    app.router.add_post("/api/show", show)
    return app


@pytest.mark.slow  # megabytes of hostile JSON parsed and slimmed: 6.7-17 s measured on the loaded 2-core machine
def test_what_a_hostile_ollama_sends_is_clamped_capped_and_slimmed(tmp_path: Path) -> None:
    shows_bytes, ups = asyncio.run(_poll(tmp_path))
    assert all(ups)  # every poll read Ollama as up
    conn = sqlite3.connect(db_path(tmp_path))
    try:
        columns = "name, model, digest, size_bytes, size_vram_bytes, context_length, family"
        loaded = conn.execute(f"SELECT {columns} FROM loaded_models").fetchall()
        infos = conn.execute("SELECT name, show_json FROM model_info").fetchall()
        both = "SELECT version FROM ollama_events UNION ALL SELECT version FROM ollama_last_poll"
        versions = [v for (v,) in conn.execute(both)]
        installed = conn.execute("SELECT name, capabilities FROM installed_models").fetchall()
    finally:
        conn.close()
    # Every /api/ps snapshot is stored (none lost to a size past SQLite's integers), clamped: sizes unknown, names cut.
    assert len(loaded) >= 3
    name, model, digest, size, size_vram, ctx, family = loaded[-1]
    assert len(name) == len(model) == MAX_NAME_CHARS and len(digest) <= 128 and len(family) <= 128
    assert (size, size_vram, ctx) == (0, 0, None)
    assert versions and all(len(v) <= 128 for v in versions)
    # Each /api/show is stored with what analysis.model_facts uses, and nothing else.
    assert len(infos) >= TAGS
    largest = max(len(js) for _, js in infos)
    print(f"largest model_info row {largest} bytes; poller holds {shows_bytes} bytes of /api/show answers")
    assert largest < 4_000
    facts = model_facts_from_show(json.loads(infos[0][1]), None)
    assert (facts.layers, facts.kv_heads, facts.quantization) == (32, 8.0, "Q4_K_M")
    assert "huge:latest" not in {n for n, _ in infos}  # its answer was past the cap
    assert max(len(caps) for _, caps in installed) < 8_000
    # In memory: the latest SHOWS_HELD answers, slimmed.
    assert shows_bytes < SHOWS_HELD * 4_000


async def _poll(data: Path) -> tuple[int, list[bool]]:
    runner = web.AppRunner(_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    writer = BackgroundWriter(db_path(data))
    try:
        async with aiohttp.ClientSession() as session:
            poller = OllamaPoller(f"http://127.0.0.1:{port}", session, writer)
            poller.shows_per_poll = 200  # through the 300 tags in two polls
            ups = [await poller.poll_once() for _ in range(3)]
        shows_bytes = sum(len(json.dumps(s)) for s in poller.shows.values())
        assert len(poller.shows) <= SHOWS_HELD
        assert writer.flush(30)
        assert writer.dropped_count == 0  # nothing the store refused
        return shows_bytes, ups
    finally:
        writer.close()
        await runner.cleanup()


def test_the_slimmed_show_gives_every_model_the_same_facts() -> None:
    """What slim_show keeps is all analysis.model_facts reads: the facts of each sim model (sliding windows, experts,
    per-layer lists included) are the same from the slimmed answer as from the whole one."""
    for model in MODELS:
        show = {
            "details": model.details(),
            "model_info": model.model_info(),
            "capabilities": list(model.capabilities),
            "license": model.license,
            "template": model.template,
        }
        slim = slim_show(show)
        assert model_facts_from_show(slim, None) == model_facts_from_show(show, None), model.name
        assert slim["capabilities"] == list(model.capabilities)


def test_per_layer_flags_are_kept() -> None:
    info = {"general.architecture": "gemma3", "gemma3.attention.sliding_window_pattern": [True, False] * 10}
    assert slim_show({"model_info": info})["model_info"] == info
