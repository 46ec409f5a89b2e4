"""Ollama's HTTP API on aiohttp, in front of any ``sim.backend.Backend``.

Routes, shapes, status codes and error texts follow
``shared/reference/ollama-api.md`` (§1-§6 and its "Spec for a faithful test
double"). Besides ``/api`` the simulator serves ``/sim/truth``, ``/sim/gpu``
and ``/sim/faults`` (see ``sim/README.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import traceback
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim import tokens
from sim.backend import Backend, Done, EngineError, Event, Failed, GenRequest, Loaded, Token
from sim.catalog import ModelFacts, find_model
from sim.faults import FaultError, Faults
from sim.ollama_time import FOREVER_S, format_go_duration, keep_alive_ns, rfc3339_from_unix_s, rfc3339nano
from sim.truth import TruthLog, TruthRecord

NDJSON = "application/x-ndjson"
RUNNER_STOPPED = (
    "model runner has unexpectedly stopped, this may be due to resource limitations or an internal error, "
    "check ollama server logs for details"
)
_BOS, _HEADER, _EOT = tokens.special_id(0), tokens.special_id(1), tokens.special_id(2)

BACKEND_KEY = web.AppKey("backend", Backend)


@dataclass(frozen=True)
class ServerConfig:
    ollama_version: str = "0.33.3"
    seed: int = 0

    @property
    def counts_only_new_prompt_tokens(self) -> bool:
        """Ollama 0.30.0 reported only the uncached tokens in ``prompt_eval_count`` (#16414; fixed in 0.30.1)."""
        return (0, 30, 0) <= _version_tuple(self.ollama_version) < (0, 30, 1)

    @property
    def reports_cached_count(self) -> bool:
        """``prompt_eval_cached_count`` exists from Ollama 0.33.3 on."""
        return _version_tuple(self.ollama_version) >= (0, 33, 3)


CONFIG_KEY = web.AppKey("config", ServerConfig)
TRUTH_KEY = web.AppKey("truth", TruthLog)
FAULTS_KEY = web.AppKey("faults", Faults)


def _version_tuple(v: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in v.split("-")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str, request_id: str | None = None) -> web.Response:
    headers = {"X-Sim-Request-Id": request_id} if request_id else None
    return web.json_response({"error": message}, status=status, headers=headers)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _go_json_error(text: str, err: json.JSONDecodeError) -> str:
    """Go encoding/json's wording for the common cases."""
    if err.pos >= len(text.rstrip()):
        return "unexpected EOF"
    return f"invalid character {text[err.pos]!r} looking for beginning of value"


async def _read_json(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        raise ApiError(400, "missing request body")
    text = raw.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, _go_json_error(text, e)) from None
    if not isinstance(body, dict):
        raise ApiError(400, f"json: cannot unmarshal {type(body).__name__} into Go value of type api.Request")
    return body


# --- logging ----------------------------------------------------------------------

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def gin_log(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """One GIN-style line per request on stderr, written when it completes."""
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
        stamp = time.strftime("%Y/%m/%d - %H:%M:%S")
        dur = format_go_duration(elapsed_ns)
        peer = request.remote or "-"
        line = f'[GIN] {stamp} | {status:3d} | {dur:>13} | {peer:>15} | {request.method:<8} "{request.path}"'
        print(line, file=sys.stderr, flush=True)


# --- request parsing ----------------------------------------------------------------


def lookup_model(backend: Backend, name: str) -> ModelFacts | None:
    """Resolve a model string against the backend's catalog as Ollama does: exact name, else with ``:latest``."""
    by_name = {m.name: m for m in backend.catalog()}
    return by_name.get(name) or (by_name.get(name + ":latest") if ":" not in name else None)


def _model_or_404(name: object, backend: Backend | None = None) -> ModelFacts:
    if backend is not None:
        model = lookup_model(backend, name) if isinstance(name, str) else None
    else:
        model = find_model(name) if isinstance(name, str) else None
    if model is None:
        raise ApiError(404, f"model '{name if isinstance(name, str) else ''}' not found")
    return model


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


def _turn(role: str, content: str) -> list[int]:
    """One templated message: header, role, content, end-of-turn (a Llama 3 style template)."""
    return [_HEADER, tokens.token_id(role), *tokens.encode(content), _EOT]


# The assistant header that ends every templated prompt. A reply sent back in a later chat turn then
# extends the slot's cache (prompt + generated tokens) exactly, as it does with a real template.
_ASSISTANT_HEADER = [_HEADER, tokens.token_id("assistant")]


def _prompt_ids_generate(body: dict[str, Any]) -> list[int]:
    prompt = str(body.get("prompt") or "")
    system = body.get("system")
    if body.get("raw"):
        return tokens.encode(prompt)
    ids = [_BOS]
    if system:
        ids += _turn("system", str(system))
    return ids + _turn("user", prompt) + _ASSISTANT_HEADER


def _prompt_ids_chat(messages: list[Any]) -> list[int]:
    ids = [_BOS]
    for m in messages:
        if not isinstance(m, dict):
            raise ApiError(400, "json: cannot unmarshal message")
        ids += _turn(str(m.get("role") or "user"), str(m.get("content") or ""))
    return ids + _ASSISTANT_HEADER


def _seed_for(cfg: ServerConfig, opts: dict[str, Any], prompt_ids: list[int]) -> str:
    req_seed = int(opts.get("seed", -1))
    # Ints hash the same in every process, so the text is reproducible for a given --seed and prompt.
    return f"{cfg.seed}:{req_seed if req_seed >= 0 else 'auto'}:{hash(tuple(prompt_ids[-64:]))}"


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
        out.append({
            "name": m.name, "model": m.name, "modified_at": m.modified_at, "size": m.size_bytes,
            "digest": m.digest, "details": details, "capabilities": list(m.capabilities),
        })
    return web.json_response({"models": out})


async def ps(request: web.Request) -> web.Response:
    now = time.time()
    rows = []
    for info in request.app[BACKEND_KEY].loaded():
        exp = info.expires_at_unix_s if info.expires_at_unix_s is not None else now + FOREVER_S
        rows.append((exp, {
            "name": info.model.name, "model": info.model.name, "size": info.size_bytes, "digest": info.model.digest,
            "details": info.model.details(), "expires_at": rfc3339_from_unix_s(exp),
            "size_vram": info.size_vram_bytes, "context_length": info.context_length,
        }))
    rows.sort(key=lambda r: r[0], reverse=True)
    return web.json_response({"models": [r[1] for r in rows]})


async def show(request: web.Request) -> web.Response:
    try:
        body = await _read_json(request)
        model = _model_or_404(body.get("model") or body.get("name"), request.app[BACKEND_KEY])
    except ApiError as e:
        return _error(e.status, e.message)
    params = "\n".join(f'stop "{s}"' for s in model.stop)
    return web.json_response({
        "license": model.license,
        "modelfile": f'# Modelfile generated by "ollama show"\nFROM {model.name}\nTEMPLATE """{model.template}"""\n',
        "parameters": params,
        "template": model.template,
        "details": model.details(),
        "model_info": model.model_info(),
        "tensors": [{"name": "token_embd.weight", "type": "Q6_K", "shape": [model.embedding_length, model.vocab_size]}],
        "capabilities": list(model.capabilities),
        "modified_at": model.modified_at,
    })


# --- generation ----------------------------------------------------------------------


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

    def _base(self, model_str: str) -> dict[str, Any]:
        return {"model": model_str, "created_at": rfc3339nano()}

    def _content(self, model_str: str, text: str, done: bool) -> dict[str, Any]:
        d = self._base(model_str)
        if self.endpoint == "/api/chat":
            d["message"] = {"role": "assistant", "content": text}
        else:
            d["response"] = text
        d["done"] = done
        return d

    def _final(self, model_str: str, ev: Done, load_ns: int, text: str, raw: bool) -> dict[str, Any]:
        d = self._content(model_str, text, True)
        d["done_reason"] = ev.done_reason
        if self.endpoint == "/api/generate" and not raw:
            d["context"] = ev.context_ids
        metrics: dict[str, int] = {
            "total_duration": time.monotonic_ns() - self.t0,
            "load_duration": load_ns,
            "prompt_eval_count": ev.prompt_eval_count - ev.prompt_eval_cached_count
            if self.cfg.counts_only_new_prompt_tokens
            else ev.prompt_eval_count,
        }
        if self.cfg.reports_cached_count:
            metrics["prompt_eval_cached_count"] = ev.prompt_eval_cached_count
        metrics |= {"prompt_eval_duration": ev.prompt_eval_ns, "eval_count": ev.eval_count, "eval_duration": ev.eval_ns}
        for k, v in metrics.items():
            # omitempty; prompt_eval_cached_count is a pointer upstream, so it stays even when 0.
            if v or k == "prompt_eval_cached_count":
                d[k] = v
        self.truth.reported = {k: v for k, v in d.items() if k in metrics}
        return d

    async def run(self) -> web.StreamResponse:
        try:
            return await self._run()
        except ApiError as e:
            self.truth.status, self.truth.error = e.status, e.message
            self.truth.done_ns = time.monotonic_ns()
            return _error(e.status, e.message, self.rid)

    async def _run(self) -> web.StreamResponse:
        body = await _read_json(self.request)
        chat = self.endpoint == "/api/chat"
        model_field = body.get("model")
        if chat and not model_field:
            raise ApiError(400, "model is required")
        model = _model_or_404(model_field, self.backend)
        model_str = str(model_field)
        self.truth.model = model.name
        opts = _options(body)
        ka = _keep_alive(body)
        think = body.get("think")
        if think is not None and think is not False and "thinking" not in model.capabilities:
            raise ApiError(400, f'"{model_str}" does not support thinking')
        if chat:
            messages = body.get("messages") or []
            if not isinstance(messages, list):
                raise ApiError(400, "json: cannot unmarshal messages")
            empty = len(messages) == 0
        else:
            if body.get("raw") and (body.get("template") or body.get("system") or body.get("context")):
                raise ApiError(400, "raw mode does not support template, system, or context")
            empty = not body.get("prompt")
        if empty:
            return await self._load_or_unload(model, model_str, opts, ka)
        prompt_ids = _prompt_ids_chat(messages) if chat else _prompt_ids_generate(body)
        if not chat and isinstance(body.get("context"), list):
            prompt_ids = [int(x) for x in body["context"] if isinstance(x, int)] + prompt_ids
        stream = body.get("stream", True) is not False
        self.truth.stream = stream
        self.truth.prompt_tokens = len(prompt_ids)
        req = GenRequest(
            model=model, prompt_ids=prompt_ids, truth=self.truth,
            num_predict=int(opts.get("num_predict", -1)),
            num_ctx=int(opts["num_ctx"]) if "num_ctx" in opts else None,
            num_batch=int(opts["num_batch"]) if "num_batch" in opts else None,
            keep_alive_ns=ka, seed=_seed_for(self.cfg, opts, prompt_ids),
            faults=self.app[FAULTS_KEY].take_generation(),
            prompt_text=None if chat else str(body.get("prompt") or ""),
            system=None if chat or not body.get("system") else str(body["system"]),
            messages=messages if chat else None,
            raw=bool(body.get("raw")),
            options=opts,
        )
        return await self._stream(req, model_str, stream, bool(body.get("raw")))

    async def _load_or_unload(self, model: ModelFacts, model_str: str, opts: dict[str, Any], ka: int | None) -> web.Response:
        if ka == 0:
            await self.backend.unload(model)
            reason = "unload"
        else:
            try:
                self.truth.load_start_ns = None
                await self.backend.load(model, int(opts["num_ctx"]) if "num_ctx" in opts else None, ka)
            except EngineError as e:
                raise ApiError(e.status, e.message) from None
            reason = "load"
        d = self._content(model_str, "", True)
        d["done_reason"] = reason
        self.truth.status = 200
        self.truth.done_ns = time.monotonic_ns()
        return web.json_response(d, headers={"X-Sim-Request-Id": self.rid})

    async def _stream(self, req: GenRequest, model_str: str, stream: bool, raw: bool) -> web.StreamResponse:
        self._resp: web.StreamResponse | None = None
        gen = self.backend.generate(req)
        try:
            async with contextlib.aclosing(gen):
                return await self._consume(gen, req.faults, model_str, stream, raw)
        except EngineError as e:
            raise ApiError(e.status, e.message) from None
        except ApiError:
            raise
        except asyncio.CancelledError:
            # The client went away (aiohttp cancels the handler): the generator is closed, the slot freed.
            self.truth.cancelled = True
            self._done(None, "client disconnected")
            raise
        except ConnectionError as e:
            self.truth.cancelled = True
            self._done(None, f"client disconnected: {e}")
            return self._resp or web.Response(status=499)
        except Exception as e:  # a backend bug: fail like a crashed runner
            traceback.print_exc(file=sys.stderr)
            if self._resp is None:
                raise ApiError(500, RUNNER_STOPPED) from None
            with contextlib.suppress(ConnectionError):
                await self._resp.write(_dumps({"error": RUNNER_STOPPED}) + b"\n")
                await self._resp.write_eof()
            self._done(200, f"{type(e).__name__}: {e}")
            return self._resp

    async def _consume(
        self, gen: AsyncGenerator[Event, None], faults: dict[str, Any], model_str: str, stream: bool, raw: bool
    ) -> web.StreamResponse:
        load_ns = 0
        texts: list[str] = []
        n_written = 0
        async for ev in gen:
            if isinstance(ev, Loaded):
                load_ns = ev.at_ns - self.t0
            elif isinstance(ev, Token):
                if ev.eos:
                    continue
                if not stream:
                    texts.append(ev.text)
                    continue
                resp = self._resp or await self._prepare()
                line = _dumps(self._content(model_str, ev.text, False)) + b"\n"
                if faults and faults.get("cut_inside_token_after_tokens") == n_written:
                    await resp.write(line[: line.rindex(b',"done"')])  # the text went out, the line never ends
                    self._done(200, "fault: cut inside a token")
                    if self.request.transport is not None:
                        self.request.transport.close()
                    return resp
                await resp.write(line)
                n_written += 1
                self.truth.token_written_ns.append(time.monotonic_ns())
                if faults and await self._apply_stream_fault(resp, faults, n_written, model_str):
                    return resp
            elif isinstance(ev, Done):
                final = self._final(model_str, ev, load_ns, "" if stream else "".join(texts), raw)
                if not stream:
                    self._done(200)
                    return web.json_response(final, headers={"X-Sim-Request-Id": self.rid})
                resp = self._resp or await self._prepare()
                await resp.write(_dumps(final) + b"\n")
                await resp.write_eof()
                self._done(200)
                return resp
            elif isinstance(ev, Failed):
                if self._resp is None:
                    raise ApiError(500, RUNNER_STOPPED)
                await self._resp.write(_dumps({"error": RUNNER_STOPPED}) + b"\n")
                await self._resp.write_eof()
                self._done(200, ev.message)
                return self._resp
        raise ApiError(500, RUNNER_STOPPED)  # the backend ended without Done or Failed

    async def _prepare(self) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": NDJSON, "X-Sim-Request-Id": self.rid})
        await resp.prepare(self.request)
        self._resp = resp
        return resp

    async def _apply_stream_fault(self, resp: web.StreamResponse, faults: dict[str, Any], n: int, model_str: str) -> bool:
        if faults.get("cut_after_tokens") == n:
            self._done(200, "fault: cut")
            if self.request.transport is not None:
                self.request.transport.close()
            return True
        if faults.get("malformed_after_tokens") == n:
            await resp.write(b'{"model":"' + model_str.encode() + b'","created_at":\n')
            await resp.write_eof()
            self._done(200, "fault: malformed")
            return True
        if faults.get("error_after_tokens") == n:
            await resp.write(_dumps({"error": RUNNER_STOPPED}) + b"\n")
            await resp.write_eof()
            self._done(200, RUNNER_STOPPED)
            return True
        return False

    def _done(self, status: int | None, error: str | None = None) -> None:
        self.truth.status = status
        self.truth.error = error
        self.truth.done_ns = time.monotonic_ns()


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
            return _error(404, f"no request with id {request.query['id']!r}")
    if "after_ns" in request.query:
        try:
            after_ns = int(request.query["after_ns"])
        except ValueError:
            return _error(400, "after_ns must be an integer (time.monotonic_ns)")
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
        body = await _read_json(request)
        request.app[FAULTS_KEY].set(body)
    except ApiError as e:
        return _error(e.status, e.message)
    except FaultError as e:
        return _error(400, str(e))
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
    app[BACKEND_KEY] = backend
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
    r.add_get("/sim/truth", get_truth)
    r.add_delete("/sim/truth", delete_truth)
    r.add_get("/sim/gpu", get_gpu)
    r.add_get("/sim/faults", get_faults)
    r.add_post("/sim/faults", post_faults)
    r.add_delete("/sim/faults", delete_faults)
    from sim import openai_api  # imports this module's helpers, so it is imported late

    openai_api.add_routes(app)
    async def _close(_: web.Application) -> None:
        await backend.close()

    app.on_cleanup.append(_close)
    return app
