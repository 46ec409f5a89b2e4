"""MlxEngine: sim's Ollama API in front of its stand-in MLX runner (``sim/mlx_runner.py``), as Ollama on a Mac runs a
safetensors model: ``python -m sim --engine mlx [--model-name NAME]``.

The first request (or an empty-prompt load) starts the runner child, ``ollama runner --mlx-engine --model NAME
--port N`` on a free loopback port, and waits for its ``/v1/status``; generate and chat are relayed to its streamed
``POST /v1/completions``, one at a time (it serves one), and the final chunk carries the counts from the runner's
``usage`` (prompt, cached, output) with the prefill time measured to its first chunk and the decode time from the
first to the last, as seen here. ``keep_alive: 0`` stops the child. The runner's lines go into Ollama's log.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from sim.backend import Done, EngineError, Event, GenRequest, Loaded, LoadedInfo, SlotAcquired, Token
from sim.catalog import MODELS, ModelFacts, find_model
from sim.llama_server_engine import free_loopback_port
from sim.mlx_runner import start_mlx_runner

START_TIMEOUT_S = 30.0  # the stand-in answers /v1/status within a second; a loaded Mac takes longer
STOP_TIMEOUT_S = 5.0


def _prompt_text(req: GenRequest) -> str:
    if req.prompt_text is not None:
        return ((req.system or "") + "\n" + req.prompt_text) if req.system else req.prompt_text
    return "\n".join(str(m.get("content") or "") for m in req.messages or [])


class MlxEngine:
    """One model, served by one MLX runner child while loaded."""

    def __init__(self, model_name: str = MODELS[0].name, default_keep_alive_ns: int = 300 * 10**9) -> None:
        self.model: ModelFacts = find_model(model_name) or MODELS[0]
        self.default_keep_alive_ns = default_keep_alive_ns
        self.child: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.expires_at_unix_s: float | None = None
        self._one = asyncio.Lock()  # the runner serves one request at a time; Ollama queues the rest
        self._waiting = 0

    def catalog(self) -> list[ModelFacts]:
        return [self.model]

    async def _start(self) -> int:
        if self.child is not None and self.child.poll() is None and self.port is not None:
            return self.port
        port = free_loopback_port()
        self.child, self.port = start_mlx_runner(self.model.name, port), port
        deadline = time.monotonic() + START_TIMEOUT_S
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/v1/status") as r:
                        if r.status == 200:
                            return port
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        await self.unload(self.model)
        raise EngineError(500, "the mlx runner did not answer /v1/status")

    def _keep(self, keep_alive_ns: int | None) -> None:
        ns = self.default_keep_alive_ns if keep_alive_ns is None else keep_alive_ns
        self.expires_at_unix_s = None if ns < 0 else time.time() + ns / 1e9

    async def generate(self, req: GenRequest) -> AsyncGenerator[Event, None]:
        truth = req.truth
        self._waiting += 1
        try:
            await self._one.acquire()
        finally:
            self._waiting -= 1
        try:
            port = await self._start()
            yield Loaded(time.monotonic_ns())
            truth.slot_acquired_ns = now = time.monotonic_ns()
            yield SlotAcquired(now, 0)  # the runner's cache match is known only at the end (its usage)
            async for ev in self._relay(req, port):
                yield ev
        finally:
            self._one.release()
            self._keep(req.keep_alive_ns)
            if self.expires_at_unix_s is not None and self.expires_at_unix_s <= time.time():
                await self.unload(self.model)

    async def _relay(self, req: GenRequest, port: int) -> AsyncGenerator[Event, None]:
        truth = req.truth
        max_tokens = req.num_predict if req.num_predict > 0 else 64
        body = {"prompt": _prompt_text(req), "max_tokens": max_tokens, "stream": True}
        sent = truth.prefill_start_ns = time.monotonic_ns()
        first: int | None = None
        last = sent
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r,
        ):
            if r.status != 200:
                raise EngineError(r.status, (await r.text())[:200])
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: {"):
                    continue
                chunk: dict[str, Any] = json.loads(line[6:])
                now = time.monotonic_ns()
                usage = chunk.get("usage")
                if usage is not None:
                    yield self._done(usage, sent, first, last, max_tokens)
                    return
                if first is None:
                    first = truth.prefill_end_ns = now
                last = now
                truth.token_sampled_ns.append(now)
                yield Token(str(chunk["choices"][0]["text"]), 0, now)
        raise EngineError(500, "the mlx runner ended the stream without its usage")

    def _done(self, usage: dict[str, Any], sent: int, first: int | None, last: int, max_tokens: int) -> Done:
        out = int(usage["completion_tokens"])
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        return Done(
            done_reason="length" if out >= max_tokens else "stop",
            prompt_eval_count=int(usage["prompt_tokens"]),
            prompt_eval_cached_count=cached,
            prompt_eval_ns=(first or last) - sent,
            eval_count=out,
            eval_ns=last - (first or last),
            context_ids=[],
        )

    async def load(self, model: ModelFacts, num_ctx: int | None, keep_alive_ns: int | None) -> None:
        async with self._one:
            await self._start()
            self._keep(keep_alive_ns)

    async def unload(self, model: ModelFacts) -> None:
        child, self.child, self.port = self.child, None, None
        if child is not None and child.poll() is None:
            child.terminate()
            await asyncio.to_thread(child.wait, STOP_TIMEOUT_S)

    async def close(self) -> None:
        """Sim stops: a stopped Ollama leaves no runner behind."""
        await self.unload(self.model)

    def queued(self) -> dict[str, int]:
        return {self.model.name: self._waiting} if self.child is not None else {}

    def loaded(self) -> list[LoadedInfo]:
        if self.child is None or self.child.poll() is not None:
            return []
        size = self.model.size_bytes
        return [LoadedInfo(self.model, size, size, self.model.context_length, self.expires_at_unix_s)]

    def gpu_state(self) -> dict[str, Any] | None:
        return None
