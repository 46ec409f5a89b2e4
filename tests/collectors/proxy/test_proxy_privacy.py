"""With text recording off no prompt or reply text reaches the store or its export, even when a stream breaks.

A real collector (in-process) in front of sim, a real SQLite store, ``python -m store export``. Sim's fault
switches break the streams: a reply line cut inside a token (its text sent, the JSON unfinished), a
malformed line, a failed load (HTTP 500 with an error body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from collectors.config import load_settings
from collectors.service import CollectorService
from store.schema import db_path
from tests.support.paths import REPO
from tests.support.sim_process import start_sim

MODEL = "qwen2.5:0.5b"
PROMPT = "tell me about zebras quietly"


def _reply_words(raw: bytes) -> set[str]:
    """The words of every reply text in a raw NDJSON stream, the unfinished last line included."""
    texts: list[str] = []
    for line in raw.split(b"\n"):
        if not line:
            continue
        try:
            texts.append(json.loads(line).get("response", ""))
        except ValueError:  # the line cut inside its token: ...,"response":"<text>"
            texts.append(line.rpartition(b'"response":"')[2].decode().rstrip('"'))
    return {w for t in texts for w in t.split() if len(w) >= 3 and w.isalpha()}


async def _session(sim_url: str, data: Path, record_text: bool) -> tuple[set[str], list[str]]:
    """Send the broken streams through a collector; the reply words its client saw, the errors it recorded."""
    args = ["--ollama", sim_url, "--listen", "127.0.0.1:0", "--data", str(data), "--interval", "0.5"]
    service = CollectorService(load_settings([*args, *(["--record-text"] if record_text else [])], {}))
    await service.start()
    words: set[str] = set()
    try:
        async with aiohttp.ClientSession() as http:

            async def fault(**switches: Any) -> None:
                async with http.post(f"{sim_url}/sim/faults", json=switches) as r:
                    assert r.status == 200, await r.text()

            async def generate(model: str = MODEL) -> bytes:
                body = {"model": model, "prompt": PROMPT, "options": {"num_predict": 30}}
                got = b""
                async with http.post(f"http://{service.listen}/api/generate", json=body) as r:
                    with contextlib.suppress(aiohttp.ClientPayloadError):  # the cut: keep what arrived
                        async for data in r.content.iter_any():
                            got += data
                return got

            await fault(cut_inside_token_after_tokens=3)
            cut = await generate()
            await fault(malformed_after_tokens=2)
            malformed = await generate()
            await fault(fail_next_load="the runner died")
            failed = await generate("llama3.2")
            words = _reply_words(cut) | _reply_words(malformed) | _reply_words(failed)
            deadline = time.monotonic() + 20
            while sum(service.stats.counts.values()) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    finally:
        await service.stop()
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    try:
        errors = [r[0] for r in conn.execute("SELECT error FROM requests ORDER BY started_at_unix_s")]
    finally:
        conn.close()
    return words, errors


def _stored_text(data: Path) -> str:
    """Every text cell of the requests table, and both export formats."""
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    try:
        cells = [str(v) for row in conn.execute("SELECT * FROM requests") for v in row if isinstance(v, str | bytes)]
    finally:
        conn.close()
    for fmt in ("csv", "jsonl"):
        proc = subprocess.run(
            [sys.executable, "-m", "store", "export", "--data", str(data), "--format", fmt],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            check=True,
        )
        cells.append(proc.stdout)
    return "\n".join(cells)


@pytest.mark.slow
def test_no_reply_text_in_store_or_export_with_text_recording_off(tmp_path: Path) -> None:
    with start_sim("--hardware", "rtx-4090") as sim:
        words, errors = asyncio.run(_session(sim.base_url, tmp_path / "off", record_text=False))
        words_on, errors_on = asyncio.run(_session(sim.base_url, tmp_path / "on", record_text=True))

    assert len(words) >= 3, words  # the client did get reply text, the cut token's included
    stored = _stored_text(tmp_path / "off")
    assert not [w for w in words if w in stored]
    assert PROMPT not in stored and "zebras" not in stored
    # The kind of each failure is kept.
    cut, malformed, failed = errors
    assert cut is not None and "malformed upstream chunk" in cut and "not JSON" in cut
    assert "created_at" not in cut  # no excerpt of the cut line (it runs on into the reply text)
    assert malformed is not None and "not JSON" in malformed
    assert failed == "upstream HTTP 500: the runner died"

    # With text recording on the same scan finds the reply: the checks above can fail.
    stored_on = _stored_text(tmp_path / "on")
    assert any(w in stored_on for w in words_on) and PROMPT in stored_on
    assert errors_on[0] is not None and '"created_at"' in errors_on[0]  # the cut line's excerpt, as before
    assert errors_on[2] is not None and json.loads(errors_on[2]) == {"error": "the runner died"}  # the raw body, as before
