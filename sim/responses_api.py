"""OpenAI's Responses API, ``POST /v1/responses``, as Ollama serves it to Codex (docs/ollama-api.md §9).

Ollama's ``openai`` package translates ``/api/chat``: a stream (only with ``"stream": true``) is SSE with an
``event:`` line per event, each carrying its ``type`` and a ``sequence_number`` -- ``response.created``,
``response.in_progress``, thinking as a reasoning item (``response.output_item.added``,
``response.reasoning_summary_text.delta``, ``.done``, ``response.output_item.done``), the answer as a message
item (``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta`` per token,
then ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``) and last
``response.completed``, whose ``response.usage`` has ``input_tokens`` and ``output_tokens`` (its cached and
reasoning details are a fixed 0 in Ollama). A whole reply is the ``response`` object. Errors are OpenAI's
``{"error": {"message", "type", "param", "code"}}``; a runner failing mid-stream writes nothing more.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sim.agent_request import block_text, chat_request, find_model, new_truth
from sim.backend import Done
from sim.http import BACKEND_KEY, ApiError, dumps, read_json
from sim.openai_api import oai_error
from sim.streaming import EventStream
from sim.truth import TruthRecord

ENDPOINT = "/v1/responses"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class ResponsesFormat:
    """The Responses API's events and whole replies for one request (a ``sim.streaming.WireFormat``)."""

    response_id: str
    item_id: str
    model_str: str
    truth: TruthRecord
    content_type: str = "text/event-stream"
    _seq: int = 0
    _reasoning_id: str | None = None  # the open reasoning item
    _output_index: int = 0
    _message_started: bool = False
    _thinking: list[str] = field(default_factory=list)
    _text: list[str] = field(default_factory=list)
    _items: list[dict[str, Any]] = field(default_factory=list)  # output items finished so far

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        data = {"type": name} | data | {"sequence_number": self._seq}
        self._seq += 1
        return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"

    def _response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": int(time.time()),
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "model": self.model_str,
            "output": output,
            "error": None,
            "usage": usage,
        }

    def _message_item(self, status: str) -> dict[str, Any]:
        content = [_text_part("".join(self._text))] if status == "completed" else []
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    def _finish_reasoning(self) -> bytes:
        if self._reasoning_id is None:
            return b""
        text = "".join(self._thinking)
        item = {"id": self._reasoning_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
        self._items.append(item | {"encrypted_content": text})
        where = {"item_id": self._reasoning_id, "output_index": self._output_index, "summary_index": 0}
        out = self._event("response.reasoning_summary_text.done", where | {"text": text})
        out += self._event("response.output_item.done", {"output_index": self._output_index, "item": self._items[-1]})
        self._reasoning_id = None
        self._output_index += 1
        return out

    def _begin(self) -> bytes:
        if self._seq:
            return b""
        created = self._response("in_progress", [], None)
        return self._event("response.created", {"response": created}) + self._event("response.in_progress", {"response": created})

    def _thinking_token(self, text: str) -> bytes:
        out = b""
        if self._reasoning_id is None:
            self._reasoning_id = f"rs_{random.randrange(999999)}"
            item = {"id": self._reasoning_id, "type": "reasoning", "summary": []}
            out += self._event("response.output_item.added", {"output_index": self._output_index, "item": item})
        self._thinking.append(text)
        where = {"item_id": self._reasoning_id, "output_index": self._output_index, "summary_index": 0}
        return out + self._event("response.reasoning_summary_text.delta", where | {"delta": text})

    def _answer_token(self, text: str) -> bytes:
        out = self._finish_reasoning()
        where = {"item_id": self.item_id, "output_index": self._output_index, "content_index": 0}
        if not self._message_started:
            self._message_started = True
            added = {"output_index": self._output_index, "item": self._message_item("in_progress")}
            out += self._event("response.output_item.added", added)
            out += self._event("response.content_part.added", where | {"part": _text_part("")})
        self._text.append(text)
        return out + self._event("response.output_text.delta", where | {"delta": text, "logprobs": []})

    def token(self, text: str, thinking: bool) -> bytes:
        return self._begin() + (self._thinking_token(text) if thinking else self._answer_token(text))

    def _usage(self, done: Done) -> dict[str, Any]:
        self.truth.reported = {"prompt_eval_count": done.prompt_eval_count, "eval_count": done.eval_count}
        return {
            "input_tokens": done.prompt_eval_count,
            "output_tokens": done.eval_count,
            "total_tokens": done.prompt_eval_count + done.eval_count,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }

    def final(self, done: Done, load_ns: int) -> bytes:
        out = self._begin() + self._finish_reasoning()
        if self._message_started:
            text = "".join(self._text)
            where = {"item_id": self.item_id, "output_index": self._output_index, "content_index": 0}
            out += self._event("response.output_text.done", where | {"text": text, "logprobs": []})
            out += self._event("response.content_part.done", where | {"part": _text_part(text)})
            self._items.append(self._message_item("completed"))
            out += self._event("response.output_item.done", {"output_index": self._output_index, "item": self._items[-1]})
        completed = self._response("completed", self._items, self._usage(done))
        return out + self._event("response.completed", {"response": completed})

    def whole(self, done: Done, load_ns: int, text: str, thinking: str) -> dict[str, Any]:
        self._text = [text]
        output: list[dict[str, Any]] = []
        if thinking:
            summary = [{"type": "summary_text", "text": thinking}]
            output.append(
                {"id": f"rs_{self.response_id}", "type": "reasoning", "summary": summary, "encrypted_content": thinking}
            )
        output.append(self._message_item("completed"))
        return self._response("completed", output, self._usage(done))

    def error(self, message: str) -> bytes:
        return b""

    def malformed(self) -> bytes:
        return b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":\n\n'


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` (a string, or message items whose text parts are joined) as chat messages."""
    out: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        out.append({"role": "system", "content": body["instructions"]})
    value = body.get("input")
    if isinstance(value, str):
        return [*out, {"role": "user", "content": value}]
    if not isinstance(value, list):
        raise ApiError(400, "input must be a string or array")
    for item in value:
        if not isinstance(item, dict):
            raise ApiError(400, "input item must be an object")
        kind = item.get("type", "message")
        if kind != "message":
            raise ApiError(400, f"unknown input item type: {kind!r}")
        out.append({"role": str(item.get("role") or "user"), "content": block_text(item.get("content"))})
    return out


def _think(body: dict[str, Any]) -> bool | str | None:
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort == "none":
        return False
    return effort if effort in ("low", "medium", "high") else None


async def responses_route(request: web.Request) -> web.StreamResponse:
    rid, t0, truth = new_truth(request, ENDPOINT)
    try:
        body = await read_json(request)
        messages = chat_messages(body)
        model = find_model(request, body.get("model"))
        max_tokens = body.get("max_output_tokens")
        stream = body.get("stream") is True
        truth.stream = stream
        req = chat_request(
            request,
            truth,
            model,
            messages,
            max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
            think=_think(body),
            temperature=body.get("temperature"),
        )
        ids = (f"resp_{random.randrange(999999)}", f"msg_{random.randrange(999999)}")
        fmt = ResponsesFormat(*ids, model_str=str(body.get("model")), truth=truth)
        events = EventStream(request, rid, truth, t0, fmt, stream=stream, faults=req.faults)
        return await events.run(request.app[BACKEND_KEY].generate(req))
    except ApiError as e:
        truth.status, truth.error, truth.done_ns = e.status, e.message, time.monotonic_ns()
        return oai_error(e.status, e.message, rid)


def add_routes(app: web.Application) -> None:
    app.router.add_post(ENDPOINT, responses_route)
