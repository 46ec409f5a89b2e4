"""Through the whole collector (proxy → store → export and metrics), against sim on loopback: every kind of
call is stored with its kind, stream flag and sources; what is not known stays empty, never 0; a whole
body feeds no client first-token metric; a thinking reply feeds the first-answer metric."""

from __future__ import annotations

import asyncio
import csv
import io
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import ollama
import openai
import pytest

from collectors.config import load_settings
from collectors.service import CollectorService
from store.export import EXPORT_KEYS, export_rows, write_csv
from store.schema import db_path
from tests.support.exposition import parse_exposition
from tests.support.fake_pynvml import FakeNvml
from tests.support.sim_process import SimProcess, start_sim, truth

MODEL = "qwen2.5:0.5b"
THINKER = "qwen3:0.6b"
PHASES = ("load", "queue", "prefill", "decode")


async def _until(cond: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def _export(data: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    try:
        return list(export_rows(conn))
    finally:
        conn.close()


@pytest.mark.slow
def test_every_kind_of_call_is_stored_and_exported_with_its_sources(tmp_path: Path) -> None:
    with start_sim("--hardware", "cpu") as sim:
        asyncio.run(_every_kind(sim, tmp_path))


async def _every_kind(sim: SimProcess, data: Path) -> None:
    settings = load_settings(["--ollama", sim.base_url, "--listen", "127.0.0.1:0", "--data", str(data), "--interval", "0.2"], {})
    service = CollectorService(settings, nvml=FakeNvml([]))
    await service.start()
    try:
        host = f"http://{service.listen}"
        client = ollama.AsyncClient(host=host)
        oai = openai.AsyncOpenAI(base_url=host + "/v1", api_key="ollama", max_retries=0)
        await client.generate(model=MODEL, prompt="")  # load
        await client.generate(model=MODEL, prompt="not streamed", options={"num_predict": 8})
        chunks = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        async for _ in chunks:
            pass
        await client.embed(model=MODEL, input=["a text", "another"])
        parts = [p async for p in await client.generate(model=THINKER, prompt="why", stream=True, options={"num_predict": 160})]
        assert parts[-1].done
        await client.generate(model=MODEL, keep_alive=0)  # unload
        rows = await _until(lambda: (r := _export(data)) and len(r) == 6 and all(x["status"] == "ok" for x in r) and r)

        assert list(rows[0]) == list(EXPORT_KEYS)
        by_kind = [(r["kind"], r["endpoint"], r["stream"]) for r in rows]
        assert by_kind == [
            ("load", "/api/generate", False),  # the Python client sends stream: false unless told
            ("generate", "/api/generate", False),
            ("generate", "/v1/chat/completions", True),
            ("embed", "/api/embed", False),
            ("generate", "/api/generate", True),
            ("unload", "/api/generate", False),
        ]
        for row in rows:  # a value without a source is unknown: empty, never 0
            for phase in PHASES:
                assert (row[f"{phase}_s"] is None) == (row[f"{phase}_source"] is None), (row["kind"], phase)
        load, whole, v1, embed, thinking, unload = rows
        assert load["load_source"] == "stream" and load["load_s"] > 0 and load["prefill_s"] is None
        assert whole["ttft_s"] is None and whole["server_ttft_s"] > 0 and whole["load_source"] == "ollama"
        assert v1["load_s"] is None and v1["prefill_s"] is None and v1["decode_source"] == "stream"
        assert v1["output_tokens_source"] == "counted" and "no_server_timings" in v1["flags"]
        assert embed["batch_size"] == 2 and embed["prefill_source"] == "ollama" and embed["decode_s"] is None
        assert unload["load_s"] is None and unload["client_s"] > 0
        (t,) = [x for x in truth(sim) if x["model"] == THINKER]
        assert thinking["thinking_tokens"] == t["thinking_tokens"] > 0 and thinking["thinking_source"] == "counted"
        assert thinking["answer_tokens"] == len(t["token_written_ns"]) - t["thinking_tokens"]
        assert thinking["ttfa_s"] > thinking["ttft_s"]

        # CSV: unknown is an empty cell, never 0.
        out = io.StringIO()
        write_csv(iter(rows), out)
        cells = list(csv.DictReader(io.StringIO(out.getvalue())))
        assert cells[3]["decode_s"] == "" and cells[3]["kind"] == "embed" and cells[1]["stream"] == "False"

        # Metrics: the client's first token only for streams (the chat, the thinking reply); the first answer
        # and thinking tokens of the thinking reply.
        async with aiohttp.ClientSession() as session, session.get(f"{host}/phasewatch/metrics") as resp:
            metrics = parse_exposition(await resp.text())

        def total(name: str) -> float:  # over every label set
            return sum(v for (n, _), v in metrics.items() if n == name)

        assert total("gen_ai_server_time_to_first_token_seconds_count") == 2
        assert total("phasewatch_request_time_to_first_answer_token_seconds_count") == 1
        assert total("phasewatch_thinking_tokens_total") == t["thinking_tokens"]
        assert total("phasewatch_request_thinking_time_seconds_count") == 1
    finally:
        await service.stop()
