"""Embeddings: ``/api/embed``, the older ``/api/embeddings`` and OpenAI's ``/v1/embeddings``.

An embed batch is prefill only: every input's tokens go through the model in the engine's batch loop
(``SimEngine.embed``), nothing is decoded. Ollama's reply carries ``total_duration`` and ``load_duration``
measured as for a generation (received -> model ready -> reply built) and ``prompt_eval_count`` (all inputs'
tokens), but no ``prompt_eval_duration``; ``/sim/truth`` has the prefill's start and end.
Each input is templated as ``BOS text EOS`` (the stand-in tokenizer's count plus 2). Vectors are
deterministic per model and text, L2-normalised as Ollama returns them, ``dimensions`` keeps the first N.
"""

from __future__ import annotations

import base64
import math
import random
import struct
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim import tokens
from sim.backend import Embedder, EmbedDone, EmbedRequest, EngineError
from sim.catalog import ModelFacts
from sim.http import BACKEND_KEY, BOS, EOT, TRUTH_KEY, ApiError, error_response, model_or_404, read_json
from sim.ollama_time import keep_alive_ns
from sim.truth import TruthRecord


def vector(model: ModelFacts, text: str, dimensions: int | None) -> list[float]:
    """A unit vector for ``text`` (the same in every run), its first ``dimensions`` entries renormalised."""
    rng = random.Random(zlib.crc32(f"{model.name}\0{text}".encode()))
    n = min(dimensions or model.embedding_length, model.embedding_length)
    v = [rng.gauss(0.0, 1.0) for _ in range(n)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [round(x / norm, 7) for x in v]


@dataclass
class EmbedResult:
    vectors: list[list[float]]
    done: EmbedDone
    truth: TruthRecord
    received_ns: int

    def metrics(self) -> dict[str, int]:
        """Ollama's duration fields (omitempty: zero is absent)."""
        m = {
            "total_duration": time.monotonic_ns() - self.received_ns,
            "load_duration": self.done.loaded_ns - self.received_ns,
            "prompt_eval_count": self.done.prompt_eval_count,
        }
        out = {k: v for k, v in m.items() if v}
        self.truth.reported = out
        return out


class _Embedding:
    """One embed request on any of the three routes: parse, run the batch, record the truth."""

    def __init__(self, request: web.Request, endpoint: str) -> None:
        self.request = request
        self.t0 = time.monotonic_ns()
        self.rid = uuid.uuid4().hex
        self.truth = TruthRecord(id=self.rid, endpoint=endpoint, model="", received_ns=self.t0, stream=False, kind="embed")
        request.app[TRUTH_KEY].add(self.truth)

    def fail(self, e: ApiError) -> None:
        self.truth.status, self.truth.error, self.truth.done_ns = e.status, e.message, time.monotonic_ns()

    async def run(
        self, model_name: object, texts: list[str], body: dict[str, Any], *, truncate: bool = True
    ) -> tuple[ModelFacts, EmbedResult]:
        backend = self.request.app[BACKEND_KEY]
        model = model_or_404(model_name, backend)
        self.truth.model = model.name
        self.truth.inputs = len(texts)
        opts = body.get("options") or {}
        if not isinstance(opts, dict):
            raise ApiError(400, "json: cannot unmarshal options")
        num_ctx = opts.get("num_ctx")
        num_ctx = int(num_ctx) if isinstance(num_ctx, int | float) and not isinstance(num_ctx, bool) and num_ctx > 0 else None
        try:
            ka = keep_alive_ns(body.get("keep_alive"))
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        dims = body.get("dimensions")
        if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 0):
            raise ApiError(400, "invalid dimensions")
        if not isinstance(backend, Embedder):
            raise ApiError(400, f'"{model_name}" does not support embeddings')
        limit = min(num_ctx or model.context_length, model.context_length)
        inputs: list[list[int]] = []
        for text in texts:
            ids = [BOS, *tokens.encode(text), EOT]
            if len(ids) > limit:
                if not truncate:
                    raise ApiError(400, "input exceeds maximum context length")
                ids = ids[:limit]
            inputs.append(ids)
        try:
            done = await backend.embed(EmbedRequest(model, inputs, self.truth, num_ctx, ka, texts=texts))
        except EngineError as e:
            raise ApiError(e.status, e.message) from None
        vectors = [vector(model, t, dims or None) for t in texts]
        self.truth.status = 200
        self.truth.done_ns = time.monotonic_ns()
        return model, EmbedResult(vectors, done, self.truth, self.t0)


def _texts(value: object, *, allow_none: bool) -> list[str]:
    if value is None and allow_none:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return list(value)
    raise ApiError(400, "invalid input type")


async def api_embed(request: web.Request) -> web.Response:
    """``POST /api/embed``: ``input`` a string or a list of them -> ``embeddings`` and the durations."""
    e = _Embedding(request, "/api/embed")
    try:
        body = await read_json(request)
        texts = _texts(body.get("input"), allow_none=True)
        _, res = await e.run(body.get("model"), texts, body, truncate=body.get("truncate", True) is not False)
    except ApiError as err:
        e.fail(err)
        return error_response(err.status, err.message, e.rid)
    reply = {"model": body.get("model"), "embeddings": res.vectors} | res.metrics()
    return web.json_response(reply, headers={"X-Sim-Request-Id": e.rid})


async def api_embeddings(request: web.Request) -> web.Response:
    """``POST /api/embeddings`` (the older route): ``prompt`` -> ``embedding``; an empty prompt only loads."""
    e = _Embedding(request, "/api/embeddings")
    try:
        body = await read_json(request)
        prompt = body.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise ApiError(400, "json: cannot unmarshal prompt")
        _, res = await e.run(body.get("model"), [prompt] if prompt else [], body)
    except ApiError as err:
        e.fail(err)
        return error_response(err.status, err.message, e.rid)
    res.metrics()
    return web.json_response({"embedding": res.vectors[0] if res.vectors else []}, headers={"X-Sim-Request-Id": e.rid})


_OAI_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


async def v1_embeddings(request: web.Request) -> web.Response:
    """``POST /v1/embeddings``: OpenAI's list of ``embedding`` objects and ``usage`` (no durations)."""
    e = _Embedding(request, "/v1/embeddings")
    try:
        body = await read_json(request)
        raw = body.get("input")
        if raw is None or raw == "" or raw == []:
            raise ApiError(400, "invalid input")
        texts = _texts(raw, allow_none=False)
        model_str = body.get("model")
        if not isinstance(model_str, str) or not model_str:
            raise ApiError(400, "model is required")
        _, res = await e.run(model_str, texts, body)
    except ApiError as err:
        e.fail(err)
        oai = {"message": err.message, "type": _OAI_ERROR_TYPES.get(err.status, "api_error"), "param": None, "code": None}
        return web.json_response({"error": oai}, status=err.status, headers={"X-Sim-Request-Id": e.rid})
    res.metrics()
    b64 = body.get("encoding_format") == "base64"
    data = [
        {"object": "embedding", "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if b64 else v, "index": i}
        for i, v in enumerate(res.vectors)
    ]
    n = res.done.prompt_eval_count
    reply = {"object": "list", "data": data, "model": model_str, "usage": {"prompt_tokens": n, "total_tokens": n}}
    return web.json_response(reply, headers={"X-Sim-Request-Id": e.rid})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/embed", api_embed)
    app.router.add_post("/api/embeddings", api_embeddings)
    app.router.add_post("/v1/embeddings", v1_embeddings)
