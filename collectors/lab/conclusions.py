"""Key figures and a plain-words conclusion from an experiment's points. Pure: no I/O, no clock.

Each function takes the points (as stored in the result document) and returns
``(summary, conclusion)``. They tolerate partial runs (cancelled, timed out):
with too few points they say so instead of guessing.
"""

from __future__ import annotations

import statistics
from typing import Any

Point = dict[str, Any]
FLAT_WITHIN = 0.15  # a rate within 15% of its peak counts as "flat"


def _num(p: Point, key: str) -> float | None:
    v = p.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _fmt_s(s: float) -> str:
    if s < 0.01:
        return f"{s * 1000:.1f} ms"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def prompt_length(points: list[Point]) -> tuple[dict[str, Any], str]:
    pts = sorted((p for p in points if _num(p, "prefill_tok_s") and _num(p, "prompt_tokens")), key=lambda p: p["prompt_tokens"])
    if len(pts) < 2:
        return {}, "Too few prompts finished to draw a curve."
    rates = [float(p["prefill_tok_s"]) for p in pts]
    peak = max(rates)
    flat_from = next(p["prompt_tokens"] for p, r in zip(pts, rates, strict=True) if r >= (1 - FLAT_WITHIN) * peak)
    ttft0, ttft1 = _num(pts[0], "ttft_s"), _num(pts[-1], "ttft_s")
    rise = peak / rates[0]
    summary = {
        "first_prompt_tokens": pts[0]["prompt_tokens"],
        "first_prefill_tok_s": rates[0],
        "peak_prefill_tok_s": peak,
        "last_prefill_tok_s": rates[-1],
        "rise_factor": rise,
        "flat_from_prompt_tokens": flat_from,
        "first_ttft_s": ttft0,
        "last_ttft_s": ttft1,
        "last_prompt_tokens": pts[-1]["prompt_tokens"],
    }
    if rise >= 1.3:
        text = (
            f"Prefill ran at {rates[0]:,.0f} tok/s on a {pts[0]['prompt_tokens']:,}-token prompt and reached "
            f"{peak:,.0f} tok/s ({rise:.1f}×); from about {flat_from:,} tokens on it stayed within "
            f"{FLAT_WITHIN:.0%} of that peak. A short prompt leaves the GPU's arithmetic units waiting on memory; "
            f"a long one gives every pass over the weights enough work, until compute is the limit."
        )
    else:
        text = (
            f"Prefill speed hardly changed with prompt length ({min(rates):,.0f}–{peak:,.0f} tok/s): even the "
            f"shortest prompt kept the compute busy, as on a CPU or with a very small model."
        )
    if ttft0 is not None and ttft1 is not None:
        text += (
            f" Time to first token grew from {_fmt_s(ttft0)} to {_fmt_s(ttft1)} for {pts[-1]['prompt_tokens']:,} "
            f"tokens: once prefill runs at full speed, waiting grows in proportion to the prompt."
        )
    return summary, text


def context_depth(points: list[Point]) -> tuple[dict[str, Any], str]:
    pts = sorted((p for p in points if _num(p, "decode_tok_s") and _num(p, "context_tokens")), key=lambda p: p["context_tokens"])
    if len(pts) < 2:
        return {}, "Too few turns finished to draw a curve."
    first, last = pts[0], pts[-1]
    d0, d1 = float(first["decode_tok_s"]), float(last["decode_tok_s"])
    c0, c1 = int(first["context_tokens"]), int(last["context_tokens"])
    drop = 1 - d1 / d0
    per_1k = drop / max((c1 - c0) / 1000, 1e-9)
    summary = {
        "first_context_tokens": c0,
        "first_decode_tok_s": d0,
        "last_context_tokens": c1,
        "last_decode_tok_s": d1,
        "drop_fraction": drop,
        "drop_fraction_per_1k_tokens": per_1k,
    }
    if drop >= 0.03:
        text = (
            f"Decode slowed from {d0:,.1f} tok/s at {c0:,} tokens of context to {d1:,.1f} tok/s at {c1:,} "
            f"({drop:.0%} slower, about {per_1k:.1%} per 1,000 tokens). Every new token reads the whole KV cache "
            f"of the conversation besides the weights, and that cache grows with every turn."
        )
    elif drop <= -0.03:
        text = (
            f"Decode did not slow with context ({d0:,.1f} tok/s at {c0:,} tokens, {d1:,.1f} at {c1:,}); "
            f"the differences are noise larger than the KV cache's cost at this depth."
        )
    else:
        text = (
            f"Decode hardly changed from {c0:,} to {c1:,} tokens of context ({d0:,.1f} → {d1:,.1f} tok/s): at this "
            f"depth the KV cache is small next to the weights each token must read."
        )
    return summary, text


def concurrency(points: list[Point]) -> tuple[dict[str, Any], str]:
    pts = sorted((p for p in points if _num(p, "total_tok_s") and _num(p, "streams")), key=lambda p: p["streams"])
    if not pts or pts[0]["streams"] != 1 or len(pts) < 2:
        return {}, "Too few levels finished to compare one stream with several."
    one, top = pts[0], pts[-1]
    t1, tn = float(one["total_tok_s"]), float(top["total_tok_s"])
    s1 = _num(one, "per_stream_tok_s") or t1
    sn = _num(top, "per_stream_tok_s") or tn / top["streams"]
    active = _num(top, "mean_active_streams") or 1.0
    n = int(top["streams"])
    # One at a time: the generations never overlap, so throughput cannot grow with the number of streams.
    serial = active < 1.25 and tn < 1.3 * t1
    summary = {
        "streams": n,
        "one_stream_tok_s": t1,
        "total_tok_s": tn,
        "throughput_gain": tn / t1,
        "per_stream_tok_s": sn,
        "per_stream_fraction": sn / s1,
        "mean_active_streams": active,
        "served_serially": serial,
    }
    if serial:
        gens = _num(top, "ttft_s_max")
        # The last stream waited for the others' generations at that level (on a busy machine those run
        # slower than the lone stream did, so the lone one is not the yardstick).
        gen_s = _num(top, "generation_s") or _num(one, "generation_s")
        waits = f" The last stream's first token came after {_fmt_s(gens)}" if gens is not None else ""
        if gens is not None and gen_s:
            waits += f", about {gens / gen_s:.1f} whole generations"
        text = (
            f"The server ran one stream at a time: with {n} requests at once their generations did not overlap "
            f"(on average {active:.2f} streams active) and total output stayed at {tn:,.0f} tok/s "
            f"({tn / t1:.1f}× one stream).{waits + '.' if waits else ''} OLLAMA_NUM_PARALLEL is probably 1 for this "
            f"model; raise it to serve several streams together."
        )
        summary["waited_generations"] = (gens / gen_s) if gens is not None and gen_s else None
    else:
        text = (
            f"With {n} streams at once the server produced {tn:,.0f} tok/s in total, {tn / t1:.1f}× one stream, "
            f"while each stream ran at {sn:,.1f} tok/s ({sn / s1:.0%} of a lone stream's {s1:,.1f}). Decode is "
            f"bound by memory: one pass over the weights serves every stream in the batch, so adding streams costs "
            f"each of them little until the KV cache or compute takes over."
        )
    return summary, text


def interference(points: list[Point], facts: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``facts``: the long prompt's figures and timing windows measured by the experiment."""
    before = [float(p["gap_ms"]) for p in points if p.get("phase") == "before"]
    during = [float(p["gap_ms"]) for p in points if p.get("phase") == "during"]
    summary: dict[str, Any] = dict(facts)
    if facts.get("served_serially"):
        wait = facts.get("long_prompt_wait_s")
        how = (
            "had not started while the chat kept streaming without a stall, so the Lab stopped the chat to let it run"
            if facts.get("chat_stopped_to_unblock")
            else "waited for the chat to finish instead of joining it, so the chat never stalled"
        )
        text = (
            f"The long prompt {how}"
            + (f"; it waited {_fmt_s(float(wait))} before its prefill began" if wait is not None else "")
            + ". The server runs one request at a time (OLLAMA_NUM_PARALLEL=1): a long prompt delays everyone "
            "behind it instead of stalling them."
        )
        return summary, text
    if len(before) < 3 or not during:
        return summary, "The chat did not stream long enough around the long prompt's prefill to measure a stall."
    base = statistics.median(before)
    peak = max(during)
    stall_ms = peak - base
    over = sum(1 for g in during if g > 3 * base)
    stalled = [g for g in during if g > 3 * base]
    summary.update(
        # Each batch of the long prompt holds the chat once: the typical stalled gap is one batch's time.
        typical_stall_ms=statistics.median(stalled) if stalled else None,
        baseline_gap_ms=base,
        max_gap_ms=peak,
        stall_ms=stall_ms,
        stall_ratio=peak / base if base else None,
        gaps_over_3x_during_prefill=over,
    )
    rate = facts.get("long_prefill_tok_s")
    chunk = stall_ms / 1000 * float(rate) if rate else None
    summary["stall_prompt_tokens"] = chunk
    text = (
        f"While a {int(facts.get('long_prompt_tokens') or 0):,}-token prompt prefilled"
        f" ({_fmt_s(float(facts.get('long_prefill_s') or 0))}"
        + (f" at {float(rate):,.0f} tok/s" if rate else "")
        + f"), the chat's largest gap between tokens grew to {peak:,.0f} ms from its usual {base:,.1f} ms "
        f"({peak / base:,.0f}×)."
    )
    if chunk:
        text += (
            f" That stall is the time to prefill about {chunk:,.0f} prompt tokens: the server feeds a long prompt in "
            f"batches, and each batch holds up every other stream's next token."
        )
    text += f" {over} of the chat's gaps during the prefill were over 3× the usual."
    return summary, text


def cold_warm(points: list[Point], model_bytes: int | None) -> tuple[dict[str, Any], str]:
    cold = next((p for p in points if p.get("state") == "cold"), None)
    warm = next((p for p in points if p.get("state") == "warm"), None)
    if cold is None or warm is None:
        return {}, "The cold and warm requests did not both finish."
    cl, wl = float(cold["load_s"]), float(warm["load_s"])
    ct, wt = _num(cold, "ttft_s"), _num(warm, "ttft_s")
    read_bytes_s = model_bytes / cl if model_bytes and cl > 0 else None
    summary = {
        "cold_load_s": cl,
        "warm_load_s": wl,
        "cold_ttft_s": ct,
        "warm_ttft_s": wt,
        "model_bytes": model_bytes,
        "load_read_bytes_s": read_bytes_s,
        "saved_s": (ct - wt) if ct is not None and wt is not None else None,
    }
    text = f"Cold, loading the model took {_fmt_s(cl)}"
    if model_bytes and read_bytes_s:
        text += f" for {model_bytes / 1e9:.2f} GB, {read_bytes_s / 1e9:.2f} GB/s from disk (or the OS's file cache)"
    if ct is not None:
        text += f", and the first token came after {_fmt_s(ct)}"
    text += f". Warm, the load step took {_fmt_s(wl)}"
    if wt is not None:
        text += f" and the first token came after {_fmt_s(wt)}"
    text += "."
    if ct is not None and wt is not None:
        text += f" Keeping the model loaded (keep_alive) saves {_fmt_s(ct - wt)} on every request that would find it unloaded."
    return summary, text


def prompt_cache(points: list[Point]) -> tuple[dict[str, Any], str]:
    first = next((p for p in points if p.get("attempt") == 1), None)
    second = next((p for p in points if p.get("attempt") == 2), None)
    if first is None or second is None:
        return {}, "The two requests did not both finish."
    p1, p2 = _num(first, "prefill_s"), _num(second, "prefill_s")
    if not p1 or p2 is None:
        return {}, "The server sent no prefill durations."
    saved = p1 - p2
    reported = second.get("cached_tokens")
    rate1 = _num(first, "prefill_tok_s")
    inferred = None
    if reported is None and rate1:
        # Not reported: tokens the second request did not have to evaluate, at the first one's speed.
        inferred = max(0.0, float(second["prompt_tokens"]) - p2 * rate1)
    summary = {
        "prefix_tokens": first.get("prefix_tokens"),
        "first_prefill_s": p1,
        "second_prefill_s": p2,
        "saved_s": saved,
        "saved_fraction": saved / p1,
        "cached_tokens_reported": reported,
        "cached_tokens_inferred": inferred,
        "first_ttft_s": _num(first, "ttft_s"),
        "second_ttft_s": _num(second, "ttft_s"),
    }
    text = (
        f"The second request shared a {int(first.get('prefix_tokens') or 0):,}-token prefix with the first; its prefill "
        f"took {_fmt_s(p2)} instead of {_fmt_s(p1)} ({saved / p1:.0%} less)."
    )
    if reported is not None:
        text += f" The server reported {int(reported):,} of its {int(second['prompt_tokens']):,} prompt tokens as cached."
    elif inferred is not None:
        text += (
            f" This server does not report cached tokens (prompt_eval_cached_count came with Ollama 0.33.3); at the first "
            f"request's speed, about {inferred:,.0f} tokens were not evaluated again, yet prompt_eval_count still counts them, "
            f"so prompt tokens/s computed from it overstates the speed of the second request."
        )
    return summary, text
