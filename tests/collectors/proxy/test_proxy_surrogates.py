"""Lone UTF-16 surrogates through the whole collector (proxy → store) are stored repaired, never dropped.

A JavaScript client cutting a string mid-emoji sends ``\\ud83d`` (JSON.stringify escapes the lone half);
an upstream can do the same in its reply. Python decodes it to a lone surrogate, which SQLite's UTF-8
cannot hold: before, the writer refused each such row ("surrogates not allowed") and the request was
lost. Now every text is stored with U+FFFD in its place and the row flagged ``invalid_text``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp

from analysis.phases import Flag
from collectors.config import load_settings
from collectors.service import CollectorService
from store.schema import db_path
from tests.support.scripted_upstream import REPLY_HEADER, start_scripted_upstream
from tests.support.sim_process import start_sim

CUT = "\ud83d"  # the first half of 😀, alone
MODEL = "qwen2.5:0.5b"

# What a JS client sends (json.dumps escapes a lone surrogate as JSON.stringify does): three requests, each
# with the cut somewhere else.
CLIENT_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/api/generate", {"model": f"{MODEL}{CUT}", "prompt": "hi", "stream": False}),  # in the model name
    (
        "/api/generate",
        {"model": MODEL, "prompt": f"why is the sky blue? {CUT}", "keep_alive": f"5m{CUT}", "options": {"num_predict": 4}},
    ),  # in keep_alive and the prompt
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": f"hi {CUT}"}]}], "max_tokens": 4},
    ),  # in /v1 content parts
]


async def _send(data: Path, upstream: str, requests: list[tuple[str, dict[str, Any], dict[str, str]]]) -> None:
    args = ["--ollama", upstream, "--listen", "127.0.0.1:0", "--data", str(data), "--interval", "0.5", "--record-text"]
    service = CollectorService(load_settings(args, {}))
    await service.start()
    try:
        async with aiohttp.ClientSession() as http:
            for path, body, headers in requests:
                async with http.post(f"http://{service.listen}{path}", data=json.dumps(body), headers=headers) as r:
                    await r.read()
    finally:
        await service.stop()  # finished requests reach the store before this returns


def _rows(data: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY started_at_unix_s")]
    finally:
        conn.close()


def test_three_client_requests_with_lone_surrogates_are_all_stored(tmp_path: Path) -> None:
    assert all(b"\\ud83d" in json.dumps(body).encode() for _, body in CLIENT_REQUESTS)  # escaped, as from JavaScript
    with start_sim("--hardware", "cpu") as sim:
        asyncio.run(_send(tmp_path, sim.base_url, [(p, b, {}) for p, b in CLIENT_REQUESTS]))
    rows = _rows(tmp_path)
    print(f"{len(rows)} of {len(CLIENT_REQUESTS)} requests with lone surrogates stored")
    assert len(rows) == len(CLIENT_REQUESTS)
    name, prompt, content = rows
    assert name["model"] == f"{MODEL}\ufffd" and name["outcome"] == "http_error"  # sim: no such model
    assert prompt["keep_alive"] == "5m\ufffd" and prompt["prompt_text"] == "why is the sky blue? \ufffd"
    assert content["prompt_text"] == "user: hi \ufffd" and content["outcome"] == "ok"
    for row in rows:
        assert Flag.INVALID_TEXT.value in json.loads(row["flags"]), row
        assert "U+FFFD" in json.loads(row["flag_text"])[Flag.INVALID_TEXT.value]


def test_an_upstream_reply_with_lone_surrogates_is_stored(tmp_path: Path) -> None:
    body = {"model": "scripted", "prompt": "hi"}
    replies = [("/api/generate", body, {REPLY_HEADER: "surrogates"}), ("/api/generate", body, {REPLY_HEADER: "surrogate-error"})]
    with start_scripted_upstream() as upstream:
        asyncio.run(_send(tmp_path, upstream.base_url, replies))
    rows = _rows(tmp_path)
    assert len(rows) == 2
    reply, error = rows
    assert reply["response_text"] == "cut mid-emoji: \ufffd end" and reply["done_reason"] == "stop\ufffd"
    assert error["outcome"] == "upstream_failed" and error["error"].endswith("the runner broke \ufffd")
    for row in rows:
        assert Flag.INVALID_TEXT.value in json.loads(row["flags"]), row
