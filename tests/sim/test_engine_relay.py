"""sim's relay to its llama-server child tells a dead child from a connection the live child closed (issue 40 item 7).

The report: a chat and a background request arrived together at a one-slot runner and sim answered 500
"llama-server process has terminated: Can not write request body … /tokenize" while the child kept its pid. The
cause, found here: llama-server answers a streamed ``POST /completion`` with ``Keep-Alive: timeout=5, max=100`` and
then closes the connection (curl: "Connection 0 seems to be dead"). The request that waited for the slot starts the
moment the chat's stream ends, and its ``/tokenize`` takes that pooled connection before sim's loop has read the
close. Ollama's Go HTTP client sends a request a reused connection lost again; sim now does too, and says
"terminated" only when the child has exited.

The real child and ``LlamaServerEngine`` run in this process, on a loop the test drives: the background request
starts in the same step of the loop as the chat's stream ends, as the one waiting for the slot does in sim.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from sim.backend import Done, EngineError, Event, Failed, GenRequest
from sim.llama_server_engine import EXIT_REAP_S, LlamaServerEngine
from sim.truth import TruthRecord
from tests.support.engine_process import GREEDY, require_llama_server

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(300)]

ROUNDS = 3


def chat(engine: LlamaServerEngine, rid: str, text: str, num_predict: int) -> GenRequest:
    return GenRequest(
        model=engine.model,
        prompt_ids=[],
        truth=TruthRecord(rid, "/api/chat", engine.model.name, time.monotonic_ns()),
        num_predict=num_predict,
        num_ctx=2048,
        messages=[{"role": "user", "content": text}],
        options={**GREEDY, "num_predict": num_predict},
    )


async def outcome(events: AsyncGenerator[Event, None]) -> str:
    """How one generation ended, its events read to their end: "done", "failed: …" (after a chunk) or "500: …"."""
    ended = "ended without its final chunk"
    try:
        async for ev in events:
            if isinstance(ev, Done):
                ended = "done"
            elif isinstance(ev, Failed):
                ended = f"failed: {ev}"
    except EngineError as exc:
        return f"{exc.status}: {exc}"
    return ended


async def chat_then_background(engine: LlamaServerEngine, k: int) -> list[str]:
    """A streamed chat, and a background request (a title, as Open WebUI asks with each chat) that waited for the
    one slot: it starts as the chat's stream ends, in the same step of the loop."""
    first = await outcome(engine.generate(chat(engine, f"chat-{k}", "Tell me about the sea.", 12)))
    second = await outcome(engine.generate(chat(engine, f"title-{k}", "Write a short title for: the sea.", 4)))
    return [first, second]


def test_a_chat_and_a_background_request_on_one_slot_both_succeed() -> None:
    _, gguf = require_llama_server()
    loop = asyncio.new_event_loop()
    engine = LlamaServerEngine(gguf, num_parallel=1, n_threads=2)
    try:
        results = [loop.run_until_complete(chat_then_background(engine, k)) for k in range(ROUNDS)]
        retries: list[dict[str, Any]] = list(engine.connection_retries)
        print(f"\nresults {results}; retries {retries}")
        assert all(r == ["done", "done"] for r in results), (
            results
        )  # before: ["done", "500: llama-server process has terminated: …"]
        assert engine.runner is not None and not engine.runner.exited
        assert [r.runner_pid for r in engine.records] == [engine.runner.pid] * 2 * ROUNDS  # one child throughout
        # The closed connection was met (the report's very error) and the request sent again on a fresh one.
        assert any("Can not write request body" in r["error"] and r["path"] == "/tokenize" for r in retries), retries
        assert all(r["attempt"] == 1 for r in retries), retries
        # ...at once: the title's prompt went to the child well before a crash's exit could have been waited for
        # (it waited EXIT_REAP_S, 0.5 s, each time: Ollama's handoff of a free slot looked 0.4-0.65 s slow).
        records = list(engine.records)  # chat, title, chat, title, ...
        ends_ns = [r.final_ns for r in records[::2]]
        assert None not in ends_ns, ends_ns
        handoffs_s = [(b.sent_ns - (a or 0)) / 1e9 for a, b in zip(ends_ns, records[1::2], strict=True)]
        assert all(0 <= h < EXIT_REAP_S / 2 for h in handoffs_s), handoffs_s
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
