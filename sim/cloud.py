"""A cloud model (``gpt-oss:120b-cloud``, ``glm-4.6:cloud``) played as Ollama serves one (docs/ollama-api.md §15).

Ollama hands such a request to ollama.com, the ``:cloud`` / ``-cloud`` suffix taken off, and copies its answer
back as it arrives: the chunks name the remote model (``gpt-oss:120b``), and the final chunk carries
``total_duration``, ``prompt_eval_count`` and ``eval_count`` but no ``load_duration``, ``prompt_eval_duration`` or
``eval_duration``. No runner is started for it: nothing in ``/api/ps``, no llama-server, no ``/slots``; Ollama's
log has its access line only (``sim.server.gin_log`` writes it). ``/api/tags`` lists a pulled cloud model with
``remote_model`` and ``remote_host``, its size that of its manifest.

``python -m sim --cloud-model NAME`` serves NAME so on ``/api/generate``, ``/api/chat`` and ``/v1/chat/completions``
(``sim.openai_api``). The timing is a datacenter's seen from here, not this machine's roofline: a round trip and
ollama.com's queue and prefill before the first token, then tokens at a steady rate. ``/sim/truth`` records each
request with ``kind: "cloud"``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from analysis.model_names import is_cloud
from sim.backend import Done, Event, Token
from sim.catalog import find_model
from sim.http import NDJSON, ApiError, dumps, prompt_ids_chat, prompt_ids_generate
from sim.ollama_time import rfc3339nano
from sim.streaming import EventStream
from sim.tokens import TextStream, token_id
from sim.truth import TruthRecord

REMOTE_HOST = "https://ollama.com:443"  # what Ollama lists as a cloud model's remote_host
MANIFEST_BYTES = 384  # a pulled cloud model is a manifest only: its size in /api/tags
MODIFIED_AT = "2026-09-01T10:00:00.000000000Z"

# How ollama.com's answer looks from here (a round trip, its queue and prefill, then decoding on its GPUs). Chosen
# so a test sees a first token well apart from the request and gaps well above a busy machine's scheduling noise.
ROUND_TRIP_S = 0.060  # to ollama.com and back: before its first byte, and half of it before it starts timing
FIRST_TOKEN_S = 0.250  # its queue and the start of prefill
PREFILL_TOKENS_PER_S = 20_000.0  # its prefill rate: a long prompt delays the first token
DECODE_TOKENS_PER_S = 80.0  # one chunk every 12.5 ms


def remote_name(name: str) -> str:
    """The model ollama.com runs for ``name``: ``gpt-oss:120b-cloud`` → ``gpt-oss:120b``, ``glm-4.6:cloud`` →
    ``glm-4.6`` (Ollama takes the suffix off before it sends the request on)."""
    base, _, tag = name.rpartition(":")
    if tag.lower() == "cloud":
        return base
    return name[: -len("-cloud")]


def check_names(names: list[str]) -> None:
    """ValueError for a name that is not a cloud model's (``--cloud-model`` takes only ``:cloud`` / ``-cloud``)."""
    for name in names:
        if not is_cloud(name):
            raise ValueError(f"{name!r} is not a cloud model's name (its tag must be 'cloud' or end in '-cloud')")


def served(names: tuple[str, ...], model: object) -> str | None:
    """The cloud model ``model`` names among ``names`` (as listed), or None."""
    if not isinstance(model, str) or not is_cloud(model):
        return None
    return next((n for n in names if n.lower() == model.strip().lower()), None)


def digest(name: str) -> str:
    return hashlib.sha256(("phasewatch-sim-cloud:" + name).encode()).hexdigest()


def _details(name: str) -> dict[str, Any]:
    """A cloud model's details: those of the library model it runs where sim's catalog has it (``qwen2.5:0.5b-cloud``
    → ``qwen2.5:0.5b``'s), else empty (its manifest says nothing of a local file)."""
    remote = find_model(remote_name(name))
    if remote is not None:
        return remote.details() | {"format": ""}
    return {"parent_model": "", "format": "", "family": "", "families": None, "parameter_size": "", "quantization_level": ""}


def tags_entry(name: str) -> dict[str, Any]:
    """The model's row in ``/api/tags``."""
    return {
        "name": name,
        "model": name,
        "remote_model": remote_name(name),
        "remote_host": REMOTE_HOST,
        "modified_at": MODIFIED_AT,
        "size": MANIFEST_BYTES,
        "digest": digest(name),
        "details": _details(name),
        "capabilities": ["completion"],
    }


def show_body(name: str) -> dict[str, Any]:
    """``/api/show`` of the model: what ollama.com says of it (the library model's architecture, where sim's catalog
    has it), with where it runs."""
    remote = find_model(remote_name(name))
    return {
        "details": _details(name),
        "remote_model": remote_name(name),
        "remote_host": REMOTE_HOST,
        "model_info": remote.model_info() if remote is not None else {},
        "capabilities": ["completion"],
        "modified_at": MODIFIED_AT,
    }


@dataclass
class CloudFormat:
    """ollama.com's NDJSON as Ollama passes it on (a ``sim.streaming.WireFormat``): the remote model's name, and
    a final chunk with the total and the counts only."""

    chat: bool
    remote_model: str
    started_ns: int  # when ollama.com began timing the request (half a round trip after Ollama received it)
    truth: TruthRecord
    content_type: str = NDJSON

    def _content(self, text: str, done: bool) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.remote_model, "created_at": rfc3339nano()}
        if self.chat:
            d["message"] = {"role": "assistant", "content": text}
        else:
            d["response"] = text
        d["done"] = done
        return d

    def token(self, text: str, thinking: bool) -> bytes:
        return dumps(self._content(text, False)) + b"\n"

    def final(self, done: Done, load_ns: int) -> bytes:
        return dumps(self.whole(done, load_ns, "", "")) + b"\n"

    def whole(self, done: Done, load_ns: int, text: str, thinking: str) -> dict[str, Any]:
        d = self._content(text, True)
        d["done_reason"] = done.done_reason
        metrics = {
            "total_duration": time.monotonic_ns() - self.started_ns,
            "prompt_eval_count": done.prompt_eval_count,
            "eval_count": done.eval_count,
        }
        d |= metrics
        self.truth.reported = metrics
        return d

    def error(self, message: str) -> bytes:
        return dumps({"error": message}) + b"\n"

    def malformed(self) -> bytes:
        return b'{"model":"' + self.remote_model.encode() + b'","created_at":\n'


async def _tokens(prompt_tokens: int, num_predict: int, seed: str, truth: TruthRecord) -> AsyncGenerator[Event, None]:
    """ollama.com's answer as events: the first token after the round trip, its queue and prefill, then one token
    per decode step; ``Done`` with the counts (no duration of ollama.com's is sent on)."""
    words = TextStream(seed)
    n = num_predict if num_predict > 0 else words.plausible_length()
    await asyncio.sleep(ROUND_TRIP_S + FIRST_TOKEN_S + prompt_tokens / PREFILL_TOKENS_PER_S)
    for i in range(n):
        if i:
            await asyncio.sleep(1.0 / DECODE_TOKENS_PER_S)
        text = next(words)
        at_ns = time.monotonic_ns()
        truth.token_sampled_ns.append(at_ns)
        yield Token(text, token_id(text.strip()), at_ns)
    reason = "length" if num_predict > 0 else "stop"
    yield Done(reason, prompt_tokens, 0, 0, n, 0, [])


async def answer(
    request: web.Request,
    body: dict[str, Any],
    name: str,
    *,
    chat: bool,
    truth: TruthRecord,
    received_ns: int,
    request_id: str,
    faults: dict[str, Any],
) -> web.StreamResponse:
    """Answer a generate or chat request to the cloud model ``name`` as Ollama passes on ollama.com's answer."""
    messages = body.get("messages") or []
    if chat and not isinstance(messages, list):
        raise ApiError(400, "json: cannot unmarshal messages")
    prompt_ids = prompt_ids_chat(messages) if chat else prompt_ids_generate(body)
    opts = body.get("options")
    num_predict = opts.get("num_predict", -1) if isinstance(opts, dict) else -1
    if not isinstance(num_predict, int) or isinstance(num_predict, bool):
        raise ApiError(500, "option 'num_predict' must be of type integer")
    stream = body.get("stream", True) is not False
    fmt = CloudFormat(chat, remote_name(name), received_ns + int(ROUND_TRIP_S / 2 * 1e9), truth)
    events = EventStream(request, request_id, truth, received_ns, fmt, stream=stream, faults=faults)
    return await play(events, name, prompt_ids, num_predict)


async def play(events: EventStream, name: str, prompt_ids: list[int], num_predict: int) -> web.StreamResponse:
    """ollama.com's answer to ``prompt_ids`` written by ``events`` (its route's format), recorded as a cloud request."""
    truth = events.truth
    truth.kind, truth.model, truth.stream, truth.prompt_tokens = "cloud", name, events.stream, len(prompt_ids)
    seed = f"cloud:{hash(tuple(prompt_ids[-64:]))}"
    return await events.run(_tokens(len(prompt_ids), num_predict, seed, truth))
