"""OpenAI-compatible routes: ``/v1/chat/completions`` and ``/v1/completions`` (ollama-api.md §6).

No timing fields; ``usage`` from prompt_eval_count / eval_count, always in
non-streaming replies, in SSE streams only with
``stream_options.include_usage`` (an extra chunk with empty ``choices``
after the finish chunk), then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

from aiohttp import web

from sim import tokens
from sim.backend import Done, EngineError, Failed, GenRequest, Loaded, Token
from sim.server import (
    BACKEND_KEY,
    CONFIG_KEY,
    FAULTS_KEY,
    RUNNER_STOPPED,
    TRUTH_KEY,
    ApiError,
    _prompt_ids_chat,
    _prompt_ids_generate,
    _read_json,
    _seed_for,
)
from sim.truth import TruthRecord

_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def _oai_error(status: int, message: str, request_id: str) -> web.Response:
    err = {"message": message, "type": _ERROR_TYPES.get(status, "api_error"), "param": None, "code": None}
    return web.json_response({"error": err}, status=status, headers={"X-Sim-Request-Id": request_id})


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class _OpenAiGeneration:
    def __init__(self, request: web.Request, chat: bool) -> None:
        self.request = request
        self.chat = chat
        self.endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        self.t0 = time.monotonic_ns()
        self.rid = uuid.uuid4().hex
        self.truth = TruthRecord(id=self.rid, endpoint=self.endpoint, model="", received_ns=self.t0)
        request.app[TRUTH_KEY].add(self.truth)
        self.oai_id = ("chatcmpl-" if chat else "cmpl-") + str(uuid.uuid4().int % 1000)
        self.created = int(time.time())

    def _chunk(self, model: str, text: str | None, finish: str | None) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": text or ""}, "finish_reason": finish}
        else:
            choice = {"text": text or "", "index": 0, "finish_reason": finish}
        return {"id": self.oai_id, "object": obj, "created": self.created, "model": model,
                "system_fingerprint": "fp_ollama", "choices": [choice]}

    async def run(self) -> web.StreamResponse:
        try:
            return await self._run()
        except ApiError as e:
            self.truth.status, self.truth.error, self.truth.done_ns = e.status, e.message, time.monotonic_ns()
            return _oai_error(e.status, e.message, self.rid)

    async def _run(self) -> web.StreamResponse:
        from sim.server import lookup_model

        body = await _read_json(self.request)
        model_str = body.get("model")
        if not isinstance(model_str, str) or not model_str:
            raise ApiError(400, "model is required")
        model = lookup_model(self.request.app[BACKEND_KEY], model_str)
        if model is None:
            raise ApiError(404, f"model '{model_str}' not found")
        self.truth.model = model.name
        if self.chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "invalid message format")
            prompt_ids = _prompt_ids_chat(messages)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise ApiError(400, "invalid type for 'prompt' field")
            prompt_ids = _prompt_ids_generate({"prompt": prompt, "raw": True}) or [tokens.special_id(0)]
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        opts: dict[str, Any] = {}
        if isinstance(body.get("seed"), int):
            opts["seed"] = body["seed"]
        stream = bool(body.get("stream", False))
        include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        self.truth.stream = stream
        self.truth.prompt_tokens = len(prompt_ids)
        cfg = self.request.app[CONFIG_KEY]
        req = GenRequest(
            model=model, prompt_ids=prompt_ids, truth=self.truth,
            num_predict=int(max_tokens) if isinstance(max_tokens, int) else -1,
            seed=_seed_for(cfg, opts, prompt_ids), faults=self.request.app[FAULTS_KEY].take_generation(),
            prompt_text=None if self.chat else prompt, messages=messages if self.chat else None, raw=True,
            options=opts | ({"temperature": body["temperature"]} if isinstance(body.get("temperature"), int | float) else {}),
        )
        return await self._consume(req, model_str, stream, include_usage)

    async def _consume(self, req: GenRequest, model_str: str, stream: bool, include_usage: bool) -> web.StreamResponse:
        resp: web.StreamResponse | None = None
        texts: list[str] = []
        gen = self.request.app[BACKEND_KEY].generate(req)
        try:
            async with contextlib.aclosing(gen):
                async for ev in gen:
                    if isinstance(ev, Loaded):
                        continue
                    if isinstance(ev, Token):
                        if ev.eos:
                            continue
                        if not stream:
                            texts.append(ev.text)
                            continue
                        if resp is None:
                            resp = await self._prepare()
                        await resp.write(_sse(self._chunk(model_str, ev.text, None)))
                        self.truth.token_written_ns.append(time.monotonic_ns())
                    elif isinstance(ev, Done):
                        usage = {"prompt_tokens": ev.prompt_eval_count, "completion_tokens": ev.eval_count,
                                 "total_tokens": ev.prompt_eval_count + ev.eval_count}
                        self.truth.reported = {"prompt_eval_count": ev.prompt_eval_count, "eval_count": ev.eval_count}
                        if not stream:
                            return self._whole(model_str, "".join(texts), ev.done_reason, usage)
                        if resp is None:
                            resp = await self._prepare()
                        await resp.write(_sse(self._chunk(model_str, "", ev.done_reason)))
                        if include_usage:
                            last = self._chunk(model_str, None, None)
                            last["choices"] = []
                            last["usage"] = usage
                            await resp.write(_sse(last))
                        await resp.write(b"data: [DONE]\n\n")
                        await resp.write_eof()
                        self._done(200)
                        return resp
                    elif isinstance(ev, Failed):
                        if resp is None:
                            raise ApiError(500, RUNNER_STOPPED)
                        err = {"message": RUNNER_STOPPED, "type": "api_error", "param": None, "code": None}
                        await resp.write(_sse({"error": err}))
                        await resp.write_eof()
                        self._done(200, ev.message)
                        return resp
        except EngineError as e:
            raise ApiError(e.status, e.message) from None
        except ApiError:
            raise
        except asyncio.CancelledError:
            self.truth.cancelled = True
            self._done(None, "client disconnected")
            raise
        except ConnectionError as e:
            self.truth.cancelled = True
            self._done(None, f"client disconnected: {e}")
            return resp or web.Response(status=499)
        raise ApiError(500, RUNNER_STOPPED)

    def _whole(self, model_str: str, text: str, reason: str, usage: dict[str, int]) -> web.Response:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"text": text, "index": 0, "finish_reason": reason}
            obj = "text_completion"
        self._done(200)
        return web.json_response(
            {"id": self.oai_id, "object": obj, "created": self.created, "model": model_str,
             "system_fingerprint": "fp_ollama", "choices": [choice], "usage": usage},
            headers={"X-Sim-Request-Id": self.rid},
        )

    async def _prepare(self) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "X-Sim-Request-Id": self.rid})
        await resp.prepare(self.request)
        return resp

    def _done(self, status: int | None, error: str | None = None) -> None:
        self.truth.status, self.truth.error, self.truth.done_ns = status, error, time.monotonic_ns()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _OpenAiGeneration(request, chat=True).run()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _OpenAiGeneration(request, chat=False).run()


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
