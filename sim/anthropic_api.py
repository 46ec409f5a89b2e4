"""Anthropic's Messages API, ``POST /v1/messages``, as Ollama serves it to Claude Code (docs/ollama-api.md §9).

Ollama's ``anthropic`` package translates ``/api/chat``: a stream is SSE with an ``event:`` line per event --
``message_start`` (usage: an estimate of the prompt, 0 output), then per block ``content_block_start``,
``content_block_delta`` (``thinking_delta`` for thinking, ``text_delta`` for the answer), ``content_block_stop``,
and at the end ``message_delta`` (``stop_reason``; ``usage`` with the runner's ``input_tokens`` and
``output_tokens``) and ``message_stop``. A whole reply is one ``message`` object. Errors are
``{"type": "error", "error": {"type", "message"}, "request_id"}``. A runner failing mid-stream writes nothing
more: the stream just ends (Ollama's writer finds no chat response in the error line).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sim.agent_request import block_text, chat_request, find_model, new_truth
from sim.backend import Done
from sim.http import BACKEND_KEY, ApiError, dumps, read_json
from sim.streaming import EventStream
from sim.truth import TruthRecord

ENDPOINT = "/v1/messages"
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}  # anything else Ollama calls "stop_sequence"


def error_body(status: int, message: str) -> dict[str, Any]:
    err = {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}
    return {"type": "error", "error": err, "request_id": "req_" + uuid.uuid4().hex[:24]}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps({"type": name} | data) + b"\n\n"


def stop_reason(done_reason: str) -> str:
    return _STOP_REASONS.get(done_reason, "stop_sequence" if done_reason else "")


@dataclass
class MessagesFormat:
    """Anthropic's events and whole replies for one request (a ``sim.streaming.WireFormat``)."""

    msg_id: str
    model_str: str
    estimated_input_tokens: int
    truth: TruthRecord
    content_type: str = "text/event-stream"
    _started: bool = False
    _block: str | None = None  # the open content block: "thinking" | "text"
    _index: int = 0
    _done: list[str] = field(default_factory=list)

    def _message(self, content: list[dict[str, Any]], usage: dict[str, int], reason: str | None) -> dict[str, Any]:
        msg: dict[str, Any] = {"id": self.msg_id, "type": "message", "role": "assistant", "model": self.model_str}
        msg["content"] = content
        if reason:
            msg["stop_reason"] = reason
        return msg | {"usage": usage}

    def _close_block(self) -> bytes:
        if self._block is None:
            return b""
        out = _event("content_block_stop", {"index": self._index})
        self._index += 1
        self._block = None
        return out

    def token(self, text: str, thinking: bool) -> bytes:
        out = b""
        if not self._started:
            self._started = True
            usage = {"input_tokens": self.estimated_input_tokens, "output_tokens": 0}
            out += _event("message_start", {"message": self._message([], usage, None)})
        kind = "thinking" if thinking else "text"
        if self._block != kind:
            out += self._close_block()
            self._block = kind
            out += _event("content_block_start", {"index": self._index, "content_block": {"type": kind, kind: ""}})
        delta = {"type": "thinking_delta", "thinking": text} if thinking else {"type": "text_delta", "text": text}
        return out + _event("content_block_delta", {"index": self._index, "delta": delta})

    def _usage(self, done: Done) -> dict[str, int]:
        self.truth.reported = {"prompt_eval_count": done.prompt_eval_count, "eval_count": done.eval_count}
        return {"input_tokens": done.prompt_eval_count, "output_tokens": done.eval_count}

    def final(self, done: Done, load_ns: int) -> bytes:
        out = self._close_block()
        delta = {"stop_reason": stop_reason(done.done_reason)}
        out += _event("message_delta", {"delta": delta, "usage": self._usage(done)})
        return out + _event("message_stop", {})

    def whole(self, done: Done, load_ns: int, text: str, thinking: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "thinking", "thinking": thinking}] if thinking else []
        if text:
            content.append({"type": "text", "text": text})
        return self._message(content, self._usage(done), stop_reason(done.done_reason))

    def error(self, message: str) -> bytes:
        return b""

    def malformed(self) -> bytes:
        return b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":\n\n'


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The body's ``system`` and ``messages`` as plain chat messages (text blocks joined); Ollama's 400s."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages is required")
    out: list[dict[str, Any]] = []
    system = block_text(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, "invalid message format")
        out.append({"role": m["role"], "content": block_text(m.get("content"))})
    return out


def _think(body: dict[str, Any]) -> bool | str | None:
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind in ("enabled", "disabled"):
        return kind == "enabled"
    effort = (body.get("output_config") or {}).get("effort") if isinstance(body.get("output_config"), dict) else None
    return effort if effort in ("low", "medium", "high") else None


async def messages_route(request: web.Request) -> web.StreamResponse:
    rid, t0, truth = new_truth(request, ENDPOINT)
    try:
        body = await read_json(request)
        model_str = body.get("model")
        if not isinstance(model_str, str) or not model_str:
            raise ApiError(400, "model is required")
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
            raise ApiError(400, "max_tokens is required and must be positive")
        messages = chat_messages(body)
        model = find_model(request, model_str)
        stream = body.get("stream") is True
        truth.stream = stream
        req = chat_request(
            request, truth, model, messages, max_tokens=max_tokens, think=_think(body), temperature=body.get("temperature")
        )
        # Ollama's message_start carries an estimate of the prompt (its count comes with the end): ours is chars/4.
        estimate = sum(len(m["content"]) for m in messages) // 4
        fmt = MessagesFormat("msg_" + uuid.uuid4().hex[:24], model_str, estimate, truth)
        events = EventStream(request, rid, truth, t0, fmt, stream=stream, faults=req.faults)
        return await events.run(request.app[BACKEND_KEY].generate(req))
    except ApiError as e:
        truth.status, truth.error = e.status, e.message
        truth.done_ns = time.monotonic_ns()
        return web.json_response(error_body(e.status, e.message), status=e.status, headers={"X-Sim-Request-Id": rid})


def add_routes(app: web.Application) -> None:
    app.router.add_post(ENDPOINT, messages_route)
