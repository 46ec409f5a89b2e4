"""Ollama's HTTP API on aiohttp, in front of any ``sim.backend.Backend``.

Routes, shapes, status codes and error texts follow Ollama as
``docs/ollama-api.md`` describes it. Besides ``/api`` the simulator serves
``/sim/truth``, ``/sim/gpu`` and ``/sim/faults`` (see ``sim/README.md``).
Helpers shared with the OpenAI routes live in ``sim.http``; how a generation
is written and ended, in ``sim.streaming``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim import answers, anthropic_api, cloud, embed_api, ollama_log, openai_api, registry, responses_api
from sim.backend import Backend, Done, EngineError, GenRequest
from sim.catalog import ModelFacts
from sim.faults import FaultError, Faults
from sim.http import (
    BACKEND_KEY,
    CONFIG_KEY,
    FAULTS_KEY,
    NDJSON,
    TRUTH_KEY,
    ApiError,
    ServerConfig,
    dumps,
    error_response,
    model_or_404,
    prompt_ids_chat,
    prompt_ids_generate,
    read_json,
    seed_for,
)
from sim.ollama_time import FOREVER_S, format_go_duration, keep_alive_ns, rfc3339_from_unix_s, rfc3339nano
from sim.streaming import EventStream
from sim.truth import TruthLog, TruthRecord

# --- logging ----------------------------------------------------------------------

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SIM_ROUTES = "/sim/"  # sim's own routes: no Ollama route starts so


@web.middleware
async def gin_log(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Ollama's access line per request (``sim.ollama_log``), written when it completes. Not for sim's own routes
    (``/sim/...``: truth, its virtual GPU, its engine's log): Ollama has none, so its log never names them, and
    a demo collector reading ``/sim/gpu`` every second would otherwise find Ollama's log changed every second."""
    if request.path.startswith(SIM_ROUTES):
        return await handler(request)
    start_ns = time.monotonic_ns()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        elapsed_ns = time.monotonic_ns() - start_ns
        query = request.rel_url.raw_query_string
        path = request.path + ("?" + query if query else "")  # gin: URL.Path, then "?" and the raw query
        ollama_log.access(status, format_go_duration(elapsed_ns), request.remote or "-", request.method, path)


# --- request parsing ----------------------------------------------------------------


def _options(body: dict[str, Any]) -> dict[str, Any]:
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "json: cannot unmarshal options")
    for key in ("num_ctx", "num_predict", "num_batch", "seed"):
        if key in opts and (not isinstance(opts[key], int | float) or isinstance(opts[key], bool)):
            raise ApiError(500, f"option {key!r} must be of type integer")
    return opts


def _keep_alive(body: dict[str, Any]) -> int | None:
    try:
        return keep_alive_ns(body.get("keep_alive"))
    except ValueError as e:
        raise ApiError(400, str(e)) from None


THINK_LEVELS = ("low", "medium", "high", "max")

# Images sent to a model without vision: Ollama (llm/llama_server.go, 2026) hands the prompt and the images to its
# llama-server child, which refuses with this body (llama.cpp 0c1e570, measured: HTTP 400), and Ollama passes that
# body on whole, as the text of its own {"error": ...} with the same status.
NO_VISION_ERROR = (
    '{"error":{"code":400,"message":"Multimodal data provided, but model does not support multimodal requests.",'
    '"type":"invalid_request_error"}}'
)


def _refuse_what_the_model_lacks(model: ModelFacts, body: dict[str, Any], chat: bool) -> None:
    """Ollama's 400s for tools (a chat's) or images sent to a model without tools or vision."""
    if chat and body.get("tools") and "tools" not in model.capabilities:
        raise ApiError(400, f"{model.name} does not support tools")
    if _has_images(body, chat) and "vision" not in model.capabilities:
        raise ApiError(400, NO_VISION_ERROR)


def _has_images(body: dict[str, Any], chat: bool) -> bool:
    """Whether the request carries images: /api/generate's ``images``, or any chat message's."""
    if not chat:
        return bool(body.get("images"))
    messages = body.get("messages")
    return isinstance(messages, list) and any(isinstance(m, dict) and m.get("images") for m in messages)


def think_level(think: object, model: ModelFacts, model_str: str) -> str | None:
    """The thinking level a request gets (None: no thinking), or ApiError with Ollama's text.

    Unset means on for thinking models; levels are for models that take them (gpt-oss), which always
    think (a bool leaves them at medium); ``true`` on a model that cannot think is a 400.
    """
    if think is not None and not isinstance(think, bool | str):
        raise ApiError(400, f"invalid think value: {json.dumps(think)}")
    if isinstance(think, str):
        if think not in THINK_LEVELS:
            raise ApiError(400, f'invalid think value: "{think}" (must be "high", "medium", "low", true, or false)')
        if not model.think_levels:
            raise ApiError(400, f'think value "{think}" is not supported for this model')
        return think
    if "thinking" not in model.capabilities:
        if think is True:
            raise ApiError(400, f'"{model_str}" does not support thinking')
        return None
    if model.think_levels:
        return "medium"
    return None if think is False else "medium"


# --- the simple routes ----------------------------------------------------------------


async def root(_: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": request.app[CONFIG_KEY].ollama_version})


async def tags(request: web.Request) -> web.Response:
    models = sorted(request.app[BACKEND_KEY].catalog(), key=lambda m: m.modified_at, reverse=True)
    out = []
    for m in models:
        details = m.details() | {"context_length": m.context_length, "embedding_length": m.embedding_length}
        out.append(
            {
                "name": m.name,
                "model": m.name,
                "modified_at": m.modified_at,
                "size": m.size_bytes,
                "digest": m.digest,
                "details": details,
                "capabilities": list(m.capabilities),
            }
        )
    out += [cloud.tags_entry(name) for name in request.app[CONFIG_KEY].cloud_models]
    return web.json_response({"models": out})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text with the queue gauge Ollama would serve with OLLAMA_METRICS (docs/ollama-api.md §13): per loaded
    model, the requests waiting for a slot."""
    lines = [
        "# HELP ollama_requests_queued Requests waiting for a slot of a loaded model.",
        "# TYPE ollama_requests_queued gauge",
    ]
    for model, n in sorted(request.app[BACKEND_KEY].queued().items()):
        name = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f'ollama_requests_queued{{model="{name}"}} {n}')
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")


async def ps(request: web.Request) -> web.Response:
    now = time.time()
    rows = []
    for info in request.app[BACKEND_KEY].loaded():
        exp = info.expires_at_unix_s if info.expires_at_unix_s is not None else now + FOREVER_S
        rows.append(
            (
                exp,
                {
                    "name": info.model.name,
                    "model": info.model.name,
                    "size": info.size_bytes,
                    "digest": info.model.digest,
                    "details": info.model.details(),
                    "expires_at": rfc3339_from_unix_s(exp),
                    "size_vram": info.size_vram_bytes,
                    "context_length": info.context_length,
                },
            )
        )
    rows.sort(key=lambda r: r[0], reverse=True)
    return web.json_response({"models": [r[1] for r in rows]})


async def show(request: web.Request) -> web.Response:
    try:
        body = await read_json(request)
        name = cloud.served(request.app[CONFIG_KEY].cloud_models, body.get("model") or body.get("name"))
        if name is not None:
            return web.json_response(cloud.show_body(name))
        model = model_or_404(body.get("model") or body.get("name"), request.app[BACKEND_KEY])
    except ApiError as e:
        return error_response(e.status, e.message)
    params = "\n".join(f'stop "{s}"' for s in model.stop)
    return web.json_response(
        {
            "license": model.license,
            "modelfile": f'# Modelfile generated by "ollama show"\nFROM {model.name}\nTEMPLATE """{model.template}"""\n',
            "parameters": params,
            "template": model.template,
            "details": model.details(),
            "model_info": model.model_info(),
            "tensors": [{"name": "token_embd.weight", "type": "Q6_K", "shape": [model.embedding_length, model.vocab_size]}],
            "capabilities": list(model.capabilities),
            "modified_at": model.modified_at,
        }
    )


# --- generation ----------------------------------------------------------------------


@dataclass
class OllamaFormat:
    """Ollama's NDJSON chunks for one /api/generate or /api/chat request (a ``sim.streaming.WireFormat``)."""

    chat: bool
    model_str: str  # echoed as the request spelled it ("llama3.2", not "llama3.2:latest")
    raw: bool
    cfg: ServerConfig
    received_ns: int  # Ollama's checkpointStart: total_duration counts from here
    truth: TruthRecord
    content_type: str = NDJSON
    # chat with tools: the answer is this call; its tokens are held back and sent as one tool_calls message.
    tool_calls: list[dict[str, Any]] | None = None

    def content(self, text: str, done: bool, thinking: str = "") -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.model_str, "created_at": rfc3339nano()}
        if self.chat:
            d["message"] = {"role": "assistant", "content": text} | ({"thinking": thinking} if thinking else {})
        else:
            d["response"] = text
            if thinking:
                d["thinking"] = thinking
        d["done"] = done
        return d

    def token(self, text: str, thinking: bool) -> bytes:
        if thinking:
            return dumps(self.content("", False, text)) + b"\n"
        if self.tool_calls is not None:
            return b""
        return dumps(self.content(text, False)) + b"\n"

    def _tool_message(self) -> dict[str, Any]:
        d = self.content("", False)
        d["message"]["tool_calls"] = self.tool_calls
        return d

    def final(self, done: Done, load_ns: int) -> bytes:
        calls = dumps(self._tool_message()) + b"\n" if self.tool_calls is not None else b""
        return calls + dumps(self.whole(done, load_ns, "", "")) + b"\n"

    def whole(self, done: Done, load_ns: int, text: str, thinking: str) -> dict[str, Any]:
        if self.tool_calls is not None:
            text = ""
        d = self.content(text, True, thinking)
        if self.tool_calls is not None and not self.truth.stream:
            d["message"]["tool_calls"] = self.tool_calls
        d["done_reason"] = done.done_reason
        if not self.chat and not self.raw:
            d["context"] = done.context_ids
        metrics: dict[str, int] = {
            "total_duration": time.monotonic_ns() - self.received_ns,
            "load_duration": load_ns,
            "prompt_eval_count": done.prompt_eval_count - done.prompt_eval_cached_count
            if self.cfg.counts_only_new_prompt_tokens
            else done.prompt_eval_count,
        }
        if self.cfg.reports_cached_count:
            metrics["prompt_eval_cached_count"] = done.prompt_eval_cached_count
        metrics |= {"prompt_eval_duration": done.prompt_eval_ns, "eval_count": done.eval_count, "eval_duration": done.eval_ns}
        for k, v in metrics.items():
            # omitempty; prompt_eval_cached_count is a pointer upstream, so it stays even when 0.
            if v or k == "prompt_eval_cached_count":
                d[k] = v
        self.truth.reported = {k: v for k, v in d.items() if k in metrics}
        return d

    def error(self, message: str) -> bytes:
        return dumps({"error": message}) + b"\n"

    def malformed(self) -> bytes:
        return b'{"model":"' + self.model_str.encode() + b'","created_at":\n'


class _Generation:
    """Runs one /api/generate or /api/chat request: load-only, streaming or not."""

    def __init__(self, request: web.Request, endpoint: str) -> None:
        self.request = request
        self.app = request.app
        self.endpoint = endpoint
        self.cfg = request.app[CONFIG_KEY]
        self.backend = request.app[BACKEND_KEY]
        self.t0 = time.monotonic_ns()  # Ollama's checkpointStart: before the body is decoded
        self.rid = uuid.uuid4().hex
        self.truth = TruthRecord(id=self.rid, endpoint=endpoint, model="", received_ns=self.t0)
        request.app[TRUTH_KEY].add(self.truth)

    async def run(self) -> web.StreamResponse:
        try:
            return await self._run()
        except ApiError as e:
            self.truth.status, self.truth.error = e.status, e.message
            self.truth.done_ns = time.monotonic_ns()
            return error_response(e.status, e.message, self.rid)

    async def _run(self) -> web.StreamResponse:
        body = await read_json(self.request)
        cloud_name = cloud.served(self.cfg.cloud_models, body.get("model"))
        if cloud_name is None:
            return await self._local(body)
        # ollama.com answers it: no runner, no load (sim.cloud)
        return await cloud.answer(
            self.request,
            body,
            cloud_name,
            chat=self.endpoint == "/api/chat",
            truth=self.truth,
            received_ns=self.t0,
            request_id=self.rid,
            faults=self.app[FAULTS_KEY].take_generation(),
        )

    async def _local(self, body: dict[str, Any]) -> web.StreamResponse:
        """A request to a model served here, by the backend."""
        chat = self.endpoint == "/api/chat"
        model_field = body.get("model")
        if chat and not model_field:
            raise ApiError(400, "model is required")
        model = model_or_404(model_field, self.backend)
        model_str = str(model_field)
        self.truth.model = model.name
        opts = _options(body)
        ka = _keep_alive(body)
        think = think_level(body.get("think"), model, model_str)
        if chat:
            messages = body.get("messages") or []
            if not isinstance(messages, list):
                raise ApiError(400, "json: cannot unmarshal messages")
            empty = len(messages) == 0
        else:
            if body.get("raw") and (body.get("template") or body.get("system") or body.get("context")):
                raise ApiError(400, "raw mode does not support template, system, or context")
            empty = not body.get("prompt")
        fmt = OllamaFormat(chat, model_str, bool(body.get("raw")), self.cfg, self.t0, self.truth)
        if empty and ka == 0:
            return await self._load_or_unload(model, fmt, opts, ka)
        if "completion" not in model.capabilities:
            raise ApiError(400, f'"{model_str}" does not support {"chat" if chat else "generate"}')
        if empty:
            return await self._load_or_unload(model, fmt, opts, ka)
        prompt_ids = prompt_ids_chat(messages) if chat else prompt_ids_generate(body)
        if not chat and isinstance(body.get("context"), list):
            prompt_ids = [int(x) for x in body["context"] if isinstance(x, int)] + prompt_ids
        stream = body.get("stream", True) is not False
        self.truth.stream = stream
        self.truth.prompt_tokens = len(prompt_ids)
        seed = seed_for(self.cfg, opts, prompt_ids)
        pieces = answers.format_answer(body.get("format"), seed)
        tools = body.get("tools") if chat else None
        _refuse_what_the_model_lacks(model, body, chat)
        call = answers.tool_call(tools, messages, seed) if chat else None
        if call is not None:
            fmt.tool_calls = [{"id": answers.call_id(seed), "function": {"index": 0, **call}}]
            pieces = answers.pieces(dumps(call).decode())
        req = GenRequest(
            model=model,
            prompt_ids=prompt_ids,
            truth=self.truth,
            num_predict=int(opts.get("num_predict", -1)),
            num_ctx=int(opts["num_ctx"]) if "num_ctx" in opts else None,
            num_batch=int(opts["num_batch"]) if "num_batch" in opts else None,
            keep_alive_ns=ka,
            seed=seed,
            faults=self.app[FAULTS_KEY].take_generation(),
            prompt_text=None if chat else str(body.get("prompt") or ""),
            system=None if chat or not body.get("system") else str(body["system"]),
            messages=messages if chat else None,
            raw=bool(body.get("raw")),
            options=opts,
            shift=body.get("shift") is not False,
            think=think,
            answer_pieces=pieces,
        )
        events = EventStream(self.request, self.rid, self.truth, self.t0, fmt, stream=stream, faults=req.faults)
        return await events.run(self.backend.generate(req))

    async def _load_or_unload(self, model: ModelFacts, fmt: OllamaFormat, opts: dict[str, Any], ka: int | None) -> web.Response:
        if ka == 0:
            self.truth.kind = "unload"
            await self.backend.unload(model)
            reason = "unload"
        else:
            self.truth.kind = "load"
            # A load happens when the model is not loaded yet (a reload for changed options is not told apart).
            cold = all(info.model.name != model.name for info in self.backend.loaded())
            start_ns = time.monotonic_ns()
            try:
                await self.backend.load(model, int(opts["num_ctx"]) if "num_ctx" in opts else None, ka)
            except EngineError as e:
                raise ApiError(e.status, e.message) from None
            if cold:
                self.truth.load_start_ns, self.truth.load_end_ns = start_ns, time.monotonic_ns()
            reason = "load"
        d = fmt.content("", True)
        d["done_reason"] = reason
        self.truth.status = 200
        self.truth.done_ns = time.monotonic_ns()
        return web.json_response(d, headers={"X-Sim-Request-Id": self.rid})


async def generate(request: web.Request) -> web.StreamResponse:
    return await _Generation(request, "/api/generate").run()


async def chat(request: web.Request) -> web.StreamResponse:
    return await _Generation(request, "/api/chat").run()


# --- /sim routes ---------------------------------------------------------------------


async def get_truth(request: web.Request) -> web.Response:
    """All records, or ``?id=`` one request (404 if unknown), or ``?after_ns=`` those received later."""
    records = request.app[TRUTH_KEY].all()
    if "id" in request.query:
        records = [r for r in records if r.id == request.query["id"]]
        if not records:
            return error_response(404, f"no request with id {request.query['id']!r}")
    if "after_ns" in request.query:
        try:
            after_ns = int(request.query["after_ns"])
        except ValueError:
            return error_response(400, "after_ns must be an integer (time.monotonic_ns)")
        records = [r for r in records if r.received_ns > after_ns]
    return web.json_response({"requests": [r.to_json() for r in records]})


async def delete_truth(request: web.Request) -> web.Response:
    request.app[TRUTH_KEY].clear()
    return web.json_response({"cleared": True})


async def get_gpu(request: web.Request) -> web.Response:
    state = request.app[BACKEND_KEY].gpu_state()
    return web.json_response({"simulated": True, "gpus": [state] if state else []})


async def get_faults(request: web.Request) -> web.Response:
    return web.json_response(request.app[FAULTS_KEY].snapshot())


async def post_faults(request: web.Request) -> web.Response:
    try:
        body = await read_json(request)
        request.app[FAULTS_KEY].set(body)
    except ApiError as e:
        return error_response(e.status, e.message)
    except FaultError as e:
        return error_response(400, str(e))
    return web.json_response(request.app[FAULTS_KEY].snapshot())


async def delete_faults(request: web.Request) -> web.Response:
    request.app[FAULTS_KEY].clear()
    return web.json_response({})


# --- errors for unknown routes -------------------------------------------------------


@web.middleware
async def go_style_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Gin answers unknown routes with plain text and wrong methods with 405."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.Response(status=404, text="404 page not found")
    except web.HTTPMethodNotAllowed:
        return web.Response(status=405, text="405 method not allowed")


def build_app(backend: Backend, config: ServerConfig, faults: Faults) -> web.Application:
    app = web.Application(middlewares=[gin_log, go_style_errors], client_max_size=64 * 1024**2)
    app[BACKEND_KEY] = registry.ModelStore(backend)  # pull, create, copy and delete change what it lists
    app[CONFIG_KEY] = config
    app[TRUTH_KEY] = TruthLog()
    app[FAULTS_KEY] = faults
    r = app.router
    r.add_get("/", root)  # aiohttp adds HEAD for GET
    r.add_get("/api/version", version)
    r.add_get("/api/tags", tags)
    r.add_get("/api/ps", ps)
    r.add_post("/api/show", show)
    r.add_post("/api/generate", generate)
    r.add_post("/api/chat", chat)
    if config.metrics:
        r.add_get("/metrics", metrics)
    r.add_get("/sim/truth", get_truth)
    r.add_delete("/sim/truth", delete_truth)
    r.add_get("/sim/gpu", get_gpu)
    r.add_get("/sim/faults", get_faults)
    r.add_post("/sim/faults", post_faults)
    r.add_delete("/sim/faults", delete_faults)
    openai_api.add_routes(app)
    anthropic_api.add_routes(app)
    responses_api.add_routes(app)
    embed_api.add_routes(app)
    registry.add_routes(app)

    async def _close(_: web.Application) -> None:
        await backend.close()

    app.on_cleanup.append(_close)
    return app
