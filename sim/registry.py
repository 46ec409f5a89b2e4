"""The local model store: ``/api/pull``, ``/api/push``, ``/api/create``, ``/api/copy``, ``/api/delete``,
and OpenAI's ``/v1/models`` and ``/v1/models/{id}``.

``ModelStore`` wraps any backend: its catalog is the backend's minus deleted models plus created or copied
ones (a copy is the same model under another name, so it runs with the same timing). Pulling a model the
backend can serve puts it back; anything else is not in the "library". Progress streams are NDJSON as
Ollama writes them (``stream: false``: only the last status, or the error with its status code).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import datetime
from typing import Any

from aiohttp import web

from sim.backend import Backend, Embedder, EmbedDone, EmbedRequest, EngineError, Event, GenRequest, LoadedInfo
from sim.catalog import ModelFacts
from sim.http import BACKEND_KEY, NDJSON, ApiError, dumps, error_response, lookup_model, read_json
from sim.ollama_time import rfc3339nano

PULL_MISSING = "pull model manifest: file does not exist"
INVALID_NAME = "invalid model name"
NEITHER_FROM_OR_FILES = "neither 'from' or 'files' was specified"
# namespace/model:tag, as Ollama's model.ParseName accepts them (host and namespace optional)
_NAME_RE = re.compile(r"^(?:[\w.-]+/){0,2}[\w][\w.-]{0,79}(?::[\w][\w.-]{0,79})?$")
PROGRESS_STEP_S = 0.002  # between progress lines, so a client sees a stream


def full_name(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(_NAME_RE.match(name))


class ModelStore:
    """A ``Backend`` whose catalog can change: deleted, copied and created models (see module docstring)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.deleted: set[str] = set()
        self.added: dict[str, ModelFacts] = {}

    def library(self) -> list[ModelFacts]:
        """What a pull can fetch: the models the backend itself serves."""
        return self.backend.catalog()

    def catalog(self) -> list[ModelFacts]:
        base = [m for m in self.backend.catalog() if m.name not in self.deleted and m.name not in self.added]
        return base + list(self.added.values())

    def add(self, model: ModelFacts) -> None:
        self.deleted.discard(model.name)
        if model in self.library():
            self.added.pop(model.name, None)
        else:
            self.added[model.name] = model

    def remove(self, name: str) -> None:
        self.added.pop(name, None)
        if any(m.name == name for m in self.library()):
            self.deleted.add(name)

    # --- the Backend protocol, delegated -------------------------------------------
    def generate(self, req: GenRequest) -> AsyncGenerator[Event, None]:
        return self.backend.generate(req)

    async def embed(self, req: EmbedRequest) -> EmbedDone:
        if not isinstance(self.backend, Embedder):
            raise EngineError(400, f'"{req.model.name}" does not support embeddings')
        return await self.backend.embed(req)

    async def load(self, model: ModelFacts, num_ctx: int | None, keep_alive_ns: int | None) -> None:
        await self.backend.load(model, num_ctx, keep_alive_ns)

    async def unload(self, model: ModelFacts) -> None:
        await self.backend.unload(model)

    def loaded(self) -> list[LoadedInfo]:
        return self.backend.loaded()

    def queued(self) -> dict[str, int]:
        return self.backend.queued()

    def gpu_state(self) -> dict[str, Any] | None:
        return self.backend.gpu_state()

    async def close(self) -> None:
        await self.backend.close()


def _store(request: web.Request) -> ModelStore:
    backend = request.app[BACKEND_KEY]
    assert isinstance(backend, ModelStore), "build_app wraps the backend in a ModelStore"
    return backend


def _layers(model: ModelFacts) -> list[tuple[str, int]]:
    """(digest, bytes) of a model's blobs: weights, template, license, params."""
    parts = [
        ("model", model.size_bytes),
        ("template", len(model.template.encode()) or 1),
        ("license", len(model.license.encode()) or 1),
        ("params", 30 + 20 * len(model.stop)),
    ]
    return [(hashlib.sha256(f"{model.digest}:{kind}".encode()).hexdigest(), size) for kind, size in parts]


class _Progress(Exception):
    """An error that ends a progress stream: (status for a reply not yet started, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _progress_reply(request: web.Request, body: dict[str, Any], steps: AsyncIterator[dict[str, Any]]) -> web.StreamResponse:
    """Ollama's streamResponse / waitForStream: NDJSON lines, or the last one; an error as Ollama ends it."""
    stream = body.get("stream", True) is not False
    resp: web.StreamResponse | None = None
    last: dict[str, Any] = {}
    try:
        async for step in steps:
            last = step
            if not stream:
                continue
            if resp is None:
                resp = web.StreamResponse(status=200, headers={"Content-Type": NDJSON})
                await resp.prepare(request)
            await resp.write(dumps(step) + b"\n")
            await asyncio.sleep(PROGRESS_STEP_S)
    except _Progress as e:
        if resp is None:
            return error_response(e.status, e.message)
        await resp.write(dumps({"error": e.message}) + b"\n")
        await resp.write_eof()
        return resp
    if resp is None:
        return web.json_response(last)
    await resp.write_eof()
    return resp


def _transfer(verb: str, model: ModelFacts) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for digest, total in _layers(model):
        status = f"{verb} {digest[:12]}"
        lines.append({"status": status, "digest": "sha256:" + digest, "total": total})
        for share in (0.25, 0.5, 0.75, 1.0):
            lines.append({"status": status, "digest": "sha256:" + digest, "total": total, "completed": int(total * share)})
    return lines


async def pull(request: web.Request) -> web.StreamResponse:
    try:
        body = await read_json(request)
    except ApiError as e:
        return error_response(e.status, e.message)
    name = body.get("model") or body.get("name")
    if not valid_name(name):
        return error_response(400, INVALID_NAME)
    store = _store(request)

    async def steps() -> AsyncIterator[dict[str, Any]]:
        yield {"status": "pulling manifest"}
        model = next((m for m in store.library() if m.name == full_name(str(name))), None)
        if model is None:
            raise _Progress(500, PULL_MISSING)
        for line in _transfer("pulling", model):
            yield line
        yield {"status": "verifying sha256 digest"}
        yield {"status": "writing manifest"}
        store.add(model)
        yield {"status": "success"}

    return await _progress_reply(request, body, steps())


async def push(request: web.Request) -> web.StreamResponse:
    try:
        body = await read_json(request)
    except ApiError as e:
        return error_response(e.status, e.message)
    name = body.get("model") or body.get("name")
    if not valid_name(name):
        return error_response(400, INVALID_NAME)
    model = lookup_model(_store(request), str(name))

    async def steps() -> AsyncIterator[dict[str, Any]]:
        yield {"status": "retrieving manifest"}
        if model is None:
            raise _Progress(404, f"model '{name}' not found")
        for line in _transfer("pushing", model):
            yield line
        yield {"status": "pushing manifest"}
        yield {"status": "success"}

    return await _progress_reply(request, body, steps())


async def create(request: web.Request) -> web.StreamResponse:
    try:
        body = await read_json(request)
    except ApiError as e:
        return error_response(e.status, e.message)
    name = body.get("model") or body.get("name")
    if not valid_name(name):
        return error_response(400, INVALID_NAME)
    store = _store(request)
    src = body.get("from")

    async def steps() -> AsyncIterator[dict[str, Any]]:
        if not src:
            if body.get("files"):
                raise _Progress(400, "supplied file was not in GGUF format")  # sim keeps no blobs
            raise _Progress(400, NEITHER_FROM_OR_FILES)
        if not valid_name(src):
            raise _Progress(400, INVALID_NAME)
        base = lookup_model(store, str(src))
        if base is None:
            yield {"status": "pulling manifest"}
            raise _Progress(500, PULL_MISSING)
        quantize = body.get("quantize") or body.get("quantization")
        if quantize and base.quantization not in ("F16", "F32"):
            raise _Progress(500, "quantization is only supported for F16 and F32 models")
        changes: dict[str, Any] = {"name": full_name(str(name)), "modified_at": rfc3339nano()}
        for digest, _ in _layers(base):
            yield {"status": f"using existing layer sha256:{digest}"}
        for key in ("template", "system", "parameters", "license", "messages"):
            if body.get(key):
                digest = hashlib.sha256(dumps(body[key])).hexdigest()
                yield {"status": f"creating new layer sha256:{digest}"}
        if isinstance(body.get("template"), str):
            changes["template"] = body["template"]
        if isinstance(body.get("license"), str):
            changes["license"] = body["license"]
        yield {"status": "writing manifest"}
        store.add(dataclasses.replace(base, **changes))
        yield {"status": "success"}

    return await _progress_reply(request, body, steps())


async def copy(request: web.Request) -> web.Response:
    try:
        body = await read_json(request)
    except ApiError as e:
        return error_response(e.status, e.message)
    src, dst = body.get("source"), body.get("destination")
    if not valid_name(src):
        return error_response(400, f'source "{src or ""}" is invalid')
    if not valid_name(dst):
        return error_response(400, f'destination "{dst or ""}" is invalid')
    store = _store(request)
    model = lookup_model(store, str(src))
    if model is None:
        return error_response(404, f'model "{src}" not found')
    store.add(dataclasses.replace(model, name=full_name(str(dst)), modified_at=rfc3339nano()))
    return web.Response(status=200)


async def delete(request: web.Request) -> web.Response:
    try:
        body = await read_json(request)
    except ApiError as e:
        return error_response(e.status, e.message)
    name = body.get("model") or body.get("name")
    if not valid_name(name):
        return error_response(400, INVALID_NAME)
    store = _store(request)
    model = lookup_model(store, str(name))
    if model is None:
        return error_response(404, f"model '{name}' not found")
    await store.unload(model)
    store.remove(model.name)
    return web.Response(status=200)


# --- OpenAI's model list ------------------------------------------------------------


def _created_unix_s(model: ModelFacts) -> int:
    try:
        return int(datetime.fromisoformat(model.modified_at.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return int(time.time())


def _oai_model(model: ModelFacts) -> dict[str, Any]:
    return {"id": model.name, "object": "model", "created": _created_unix_s(model), "owned_by": "library"}


async def v1_models(request: web.Request) -> web.Response:
    models = sorted(_store(request).catalog(), key=lambda m: m.modified_at, reverse=True)
    return web.json_response({"object": "list", "data": [_oai_model(m) for m in models]})


async def v1_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    model = lookup_model(_store(request), name)
    if model is None:
        err = {"message": f"model '{name}' not found", "type": "not_found_error", "param": None, "code": None}
        return web.json_response({"error": err}, status=404)
    return web.json_response(_oai_model(model) | {"id": name})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/pull", pull)
    r.add_post("/api/push", push)
    r.add_post("/api/create", create)
    r.add_post("/api/copy", copy)
    r.add_delete("/api/delete", delete)
    r.add_get("/v1/models", v1_models)
    r.add_get("/v1/models/{model:.+}", v1_model)
