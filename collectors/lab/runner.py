"""Run one experiment against one Ollama URL, with a time limit and a cancel switch."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from analysis.model_names import same_model
from collectors.lab.client import LabClient, LabError, UnknownModel
from collectors.lab.context import LabContext
from collectors.lab.experiments import EXPERIMENTS, make_params
from collectors.lab.results import CANCELLED, DONE, FAILED, TIMED_OUT, ExperimentResult

DEFAULT_TIMEOUT_S = 600.0


def model_facts(show: dict[str, Any], tag: dict[str, Any] | None) -> dict[str, Any]:
    """The architecture facts the ceilings need, from /api/show's model_info and /api/tags's size."""
    info = show.get("model_info") or {}
    arch = info.get("general.architecture")
    details = show.get("details") or {}

    def k(name: str) -> Any:
        return info.get(f"{arch}.{name}") if arch else None

    heads, hidden = k("attention.head_count"), k("embedding_length")
    head_dim = k("attention.key_length")
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head_dim = hidden // heads
    return {
        "architecture": arch,
        "parameter_count": info.get("general.parameter_count"),
        "layers": k("block_count"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": k("attention.head_count_kv"),
        "head_dim": head_dim,
        "context_length": k("context_length"),
        "quantization_level": details.get("quantization_level"),
        "parameter_size": details.get("parameter_size"),
        "family": details.get("family"),
        "model_bytes": (tag or {}).get("size"),
        # What analysis.model_facts.model_facts_from_show needs, for the ceilings drawn with the results.
        "show": {"model_info": {k: v for k, v in info.items() if not isinstance(v, list | dict)}, "details": details},
    }


async def preflight(client: LabClient, model: str) -> tuple[str, dict[str, Any]]:
    """Server version and model facts; raises OllamaUnreachable / UnknownModel with a clear message."""
    version = await client.version()
    tags = await client.tags()
    tag = next((t for t in tags if same_model(str(t.get("name") or t.get("model")), model)), None)
    if tag is None:
        names = ", ".join(sorted(str(t.get("name") or t.get("model")) for t in tags)) or "none"
        raise UnknownModel(f"model {model!r} not found at {client.base_url} (it has: {names})")
    return version, model_facts(await client.show(model), tag)


async def run_experiment(
    name: str,
    ollama_url: str,
    model: str,
    params: dict[str, Any] | None = None,
    *,
    num_ctx: int | None = None,
    seed: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    cancel: asyncio.Event | None = None,
    on_update: Callable[[ExperimentResult], None] | None = None,
    run_id: str | None = None,
) -> ExperimentResult:
    """Run ``name`` and return its result, ``state`` done, cancelled, timed_out or failed.

    Setting ``cancel`` (or cancelling this coroutine) cancels the experiment's requests at once:
    their streams are closed, which is what makes Ollama free the slots. Unreachable server
    or unknown model raise before anything is sent (LabError).
    """
    spec = EXPERIMENTS[name]
    p = make_params(name, params)
    async with LabClient(ollama_url) as client:
        version, facts = await preflight(client, model)
        result = ExperimentResult(
            name=name,
            run_id=run_id or uuid.uuid4().hex[:12],
            model=model,
            ollama_url=client.base_url,
            parameters={**dataclasses.asdict(p), "num_ctx": num_ctx, "seed": seed, "timeout_s": timeout_s},
            started_at_unix_s=time.time(),
            server_version=version,
            model_facts=facts,
            pid=os.getpid(),
        )
        ctx = LabContext(client, model, result, random.Random(seed), num_ctx=num_ctx, on_update=on_update)
        ctx.notify()
        body: asyncio.Task[None] = asyncio.ensure_future(spec.run(ctx, p))
        waiters: set[asyncio.Future[Any]] = {body}
        cancel_wait = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
        if cancel_wait is not None:
            waiters.add(cancel_wait)
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if cancel_wait is not None:
                cancel_wait.cancel()
            if not body.done():
                body.cancel()  # also when we ourselves are cancelled: close the streams, then propagate
                await asyncio.gather(body, return_exceptions=True)
        if body in done and not body.cancelled():
            exc = body.exception()
            if exc is None:
                result.state = DONE
            else:
                result.state = FAILED
                result.error = str(exc) if isinstance(exc, LabError) else f"{type(exc).__name__}: {exc}"
        elif done:
            result.state = CANCELLED
        else:
            result.state = TIMED_OUT
            result.error = f"stopped after the {timeout_s:.0f} s limit"
        _conclude(spec.conclude, ctx)
        result.finished_at_unix_s = time.time()
        ctx.notify()
        return result


def _conclude(conclude: Callable[[LabContext], tuple[dict[str, Any], str]], ctx: LabContext) -> None:
    r = ctx.result
    try:
        summary, text = conclude(ctx)
    except (ArithmeticError, KeyError, TypeError, ValueError) as exc:  # a partial run may lack what a figure needs
        summary, text = {}, f"No conclusion: {type(exc).__name__}: {exc}"
    r.summary.update(summary)
    prefix = {
        CANCELLED: "Cancelled: partial results. ",
        TIMED_OUT: "Stopped at the time limit: partial results. ",
        FAILED: f"Failed ({r.error}). ",
    }.get(r.state, "")
    r.conclusion = prefix + text
