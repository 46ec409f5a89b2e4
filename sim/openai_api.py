"""OpenAI-compatible routes: ``/v1/chat/completions`` and ``/v1/completions`` (docs/ollama-api.md §9).

No timing fields; ``usage`` from prompt_eval_count / eval_count, always in
non-streaming replies, in SSE streams only with
``stream_options.include_usage`` (an extra chunk with empty ``choices``
after the finish chunk), then ``data: [DONE]``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim import answers, cloud, tokens
from sim.backend import Done, GenRequest
from sim.http import (
    BACKEND_KEY,
    CONFIG_KEY,
    FAULTS_KEY,
    TRUTH_KEY,
    ApiError,
    dumps,
    lookup_model,
    prompt_ids_chat,
    prompt_ids_generate,
    read_json,
    seed_for,
)
from sim.streaming import EventStream
from sim.truth import TruthRecord

_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def oai_error(status: int, message: str, request_id: str) -> web.Response:
    err = {"message": message, "type": _ERROR_TYPES.get(status, "api_error"), "param": None, "code": None}
    return web.json_response({"error": err}, status=status, headers={"X-Sim-Request-Id": request_id})


def _sse(obj: object) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


@dataclass
class OpenAiFormat:
    """OpenAI's SSE chunks and whole replies for one request (a ``sim.streaming.WireFormat``)."""

    chat: bool
    oai_id: str  # "chatcmpl-N" / "cmpl-N", the same in every chunk of a reply
    created_unix_s: int
    model_str: str
    include_usage: bool
    truth: TruthRecord
    content_type: str = "text/event-stream"
    # chat with tools: the answer is this call (held back, then one delta with OpenAI's tool_calls)
    tool_calls: list[dict[str, Any]] | None = None

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.oai_id,
            "object": obj,
            "created": self.created_unix_s,
            "model": self.model_str,
            "system_fingerprint": "fp_ollama",
            "choices": choices,
        }

    def _chunk(self, text: str, finish: str | None, reasoning: str = "") -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": text} | ({"reasoning": reasoning} if reasoning else {})
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope("text_completion", [{"text": text, "index": 0, "finish_reason": finish}])

    def _usage(self, done: Done) -> dict[str, int]:
        self.truth.reported = {"prompt_eval_count": done.prompt_eval_count, "eval_count": done.eval_count}
        return {
            "prompt_tokens": done.prompt_eval_count,
            "completion_tokens": done.eval_count,
            "total_tokens": done.prompt_eval_count + done.eval_count,
        }

    def token(self, text: str, thinking: bool) -> bytes:
        if thinking and not self.chat:
            return b""  # /v1/completions has no place for reasoning
        if self.tool_calls is not None and not thinking:
            return b""
        return _sse(self._chunk("", None, text) if thinking else self._chunk(text, None))

    def _finish_reason(self, done: Done) -> str:
        return "tool_calls" if self.tool_calls is not None else done.done_reason

    def final(self, done: Done, load_ns: int) -> bytes:
        out = b""
        if self.tool_calls is not None:
            calls = self._chunk("", None)
            calls["choices"][0]["delta"]["tool_calls"] = self.tool_calls
            out += _sse(calls)
        out += _sse(self._chunk("", self._finish_reason(done)))
        usage = self._usage(done)
        if self.include_usage:
            last = self._envelope(self._chunk("", None)["object"], [])
            last["usage"] = usage
            out += _sse(last)
        return out + b"data: [DONE]\n\n"

    def whole(self, done: Done, load_ns: int, text: str, thinking: str) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text} | ({"reasoning": thinking} if thinking else {})
            if self.tool_calls is not None:
                message |= {"content": "", "tool_calls": self.tool_calls}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self._finish_reason(done)}
            body = self._envelope("chat.completion", [choice])
        else:
            body = self._envelope("text_completion", [{"text": text, "index": 0, "finish_reason": done.done_reason}])
        body["usage"] = self._usage(done)
        return body

    def error(self, message: str) -> bytes:
        return _sse({"error": {"message": message, "type": "api_error", "param": None, "code": None}})

    def malformed(self) -> bytes:
        return b'data: {"id":"' + self.oai_id.encode() + b'","object":\n\n'


def _format_of(response_format: object) -> object:
    """OpenAI's ``response_format`` as Ollama's ``format``: json_object -> "json", json_schema -> its schema."""
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_object":
        return "json"
    if response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        return spec.get("schema") if isinstance(spec, dict) else None
    return None


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

    async def run(self) -> web.StreamResponse:
        try:
            return await self._run()
        except ApiError as e:
            self.truth.status, self.truth.error, self.truth.done_ns = e.status, e.message, time.monotonic_ns()
            return oai_error(e.status, e.message, self.rid)

    async def _run(self) -> web.StreamResponse:
        body = await read_json(self.request)
        name = cloud.served(self.request.app[CONFIG_KEY].cloud_models, body.get("model"))
        if name is not None and self.chat:
            return await self._cloud(body, name)
        return await self._local(body)

    async def _cloud(self, body: dict[str, Any], name: str) -> web.StreamResponse:
        """A chat to a cloud model: ollama.com's own /v1 answer, passed on by Ollama (sim.cloud), the chunks naming
        the remote model, usage its counts."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "invalid message format")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        stream = bool(body.get("stream", False))
        include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        fmt = OpenAiFormat(True, self.oai_id, self.created, cloud.remote_name(name), include_usage, self.truth)
        faults = self.request.app[FAULTS_KEY].take_generation()
        events = EventStream(self.request, self.rid, self.truth, self.t0, fmt, stream=stream, faults=faults)
        return await cloud.play(events, name, prompt_ids_chat(messages), max_tokens if isinstance(max_tokens, int) else -1)

    async def _local(self, body: dict[str, Any]) -> web.StreamResponse:
        """A request to a model served here, by the backend."""
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
            prompt_ids = prompt_ids_chat(messages)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise ApiError(400, "invalid type for 'prompt' field")
            prompt_ids = prompt_ids_generate({"prompt": prompt, "raw": True}) or [tokens.special_id(0)]
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        opts: dict[str, Any] = {}
        if isinstance(body.get("seed"), int):
            opts["seed"] = body["seed"]
        stream = bool(body.get("stream", False))
        include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        self.truth.stream = stream
        self.truth.prompt_tokens = len(prompt_ids)
        cfg = self.request.app[CONFIG_KEY]
        if "completion" not in model.capabilities:
            raise ApiError(400, f'"{model_str}" does not support {"chat" if self.chat else "generate"}')
        effort = body.get("reasoning_effort")
        think: str | None = None
        if "thinking" in model.capabilities and effort != "none":
            think = effort if model.think_levels and effort in ("low", "medium", "high") else "medium"
        seed = seed_for(cfg, opts, prompt_ids)
        pieces = answers.format_answer(_format_of(body.get("response_format")), seed)
        call = answers.tool_call(body.get("tools"), messages or [], seed) if self.chat else None
        tool_calls = None
        if call is not None:
            fn = {"name": call["name"], "arguments": dumps(call["arguments"]).decode()}
            tool_calls = [{"id": answers.call_id(seed), "index": 0, "type": "function", "function": fn}]
            pieces = answers.pieces(dumps(call).decode())
        req = GenRequest(
            model=model,
            prompt_ids=prompt_ids,
            truth=self.truth,
            num_predict=int(max_tokens) if isinstance(max_tokens, int) else -1,
            seed=seed,
            faults=self.request.app[FAULTS_KEY].take_generation(),
            prompt_text=None if self.chat else prompt,
            messages=messages if self.chat else None,
            raw=True,
            options=opts | ({"temperature": body["temperature"]} if isinstance(body.get("temperature"), int | float) else {}),
            think=think,
            answer_pieces=pieces,
        )
        return await self._consume(req, model_str, stream, include_usage, tool_calls)

    async def _consume(
        self, req: GenRequest, model_str: str, stream: bool, include_usage: bool, tool_calls: list[dict[str, Any]] | None
    ) -> web.StreamResponse:
        fmt = OpenAiFormat(self.chat, self.oai_id, self.created, model_str, include_usage, self.truth, tool_calls=tool_calls)
        events = EventStream(self.request, self.rid, self.truth, self.t0, fmt, stream=stream, faults=req.faults)
        return await events.run(self.request.app[BACKEND_KEY].generate(req))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _OpenAiGeneration(request, chat=True).run()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _OpenAiGeneration(request, chat=False).run()


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
