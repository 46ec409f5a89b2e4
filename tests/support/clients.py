"""A streaming client for tests that watch a request while it runs (in a thread, writing into ``out``)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from collectors.proxy.recording import RECORD_ID_HEADER


def stream_generate(base_url: str, body: dict[str, Any], out: dict[str, Any], timeout_s: float = 600) -> None:
    """POST /api/generate streamed; ``out`` gets ``started``, ``id`` (the proxy's record id, when through it),
    ``first_token`` (time.time() of the first chunk with text) and ``final`` (the done chunk)."""
    out["started"] = time.time()
    with httpx.Client(timeout=timeout_s) as client, client.stream("POST", base_url + "/api/generate", json=body) as r:
        out["id"] = r.headers.get(RECORD_ID_HEADER)
        for line in r.iter_lines():
            chunk = json.loads(line)
            if "first_token" not in out and chunk.get("response"):
                out["first_token"] = time.time()
            if chunk.get("done"):
                out["final"] = chunk
