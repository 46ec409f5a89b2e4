"""Split one generation into its phases: queue, load, prefill, decode, transport.

Pure: no I/O, no clock. Input is Ollama's final response object (a dict) and/or a
``RequestRecord`` from the recording proxy. Timing model (docs/architecture.md §3):

- decode ends at the final chunk and lasts ``eval_duration`` (first → last token);
- prefill ends where decode starts and lasts ``prompt_eval_duration`` (uncached tokens only);
- load starts at the request and lasts ``load_duration``;
- queue = total − load − prefill − decode (waiting for a slot, plus templating);
- transport = what the client saw beyond ``total_duration``.

Rates: prefill tok/s = (prompt_eval_count − cached) / prompt_eval_duration, because the
duration covers only the uncached suffix; decode tok/s = (eval_count − 1) / eval_duration,
because eval_count includes the first token and the duration spans first → last token.
Ollama's own formulas (count / duration, ``ollama run --verbose``) are kept beside ours.

Readings that cannot be true, or mean little, are flagged with stable short codes
(``flags``) plus human text with the numbers (``flag_text``); they are never hidden.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from analysis import prompt_fit
from analysis.model_names import is_cloud
from analysis.records import AGENT_ENDPOINTS, FinalMetrics, Outcome, RequestKind, RequestRecord

NS_PER_S = 1_000_000_000

# Anything beyond these is not a reading from a real server: reject (parser) or flag (records).
MAX_DURATION_NS = 7 * 24 * 3600 * NS_PER_S  # a week for one request
MAX_TOKEN_COUNT = 100_000_000  # far beyond any context window
# Rates above these need a datacenter beyond anything Ollama runs on; they come from tiny durations.
IMPLAUSIBLE_PREFILL_TOK_S = 1_000_000.0
IMPLAUSIBLE_DECODE_TOK_S = 20_000.0
# Clock tolerance between Ollama's durations and the proxy's monotonic clock.
CLOCK_SLACK_NS = 5_000_000

# Wire names of Ollama's final-chunk metrics → FinalMetrics field names.
_WIRE_FIELDS: dict[str, str] = {
    "total_duration": "total_duration_ns",
    "load_duration": "load_duration_ns",
    "prompt_eval_count": "prompt_eval_count",
    "prompt_eval_cached_count": "prompt_eval_cached_count",
    "prompt_eval_duration": "prompt_eval_duration_ns",
    "eval_count": "eval_count",
    "eval_duration": "eval_duration_ns",
}
_COUNT_FIELDS = {"prompt_eval_count", "prompt_eval_cached_count", "eval_count"}


def no_durations_route(endpoint: str | None) -> str:
    """How a sentence names a /v1 route that sends no durations: the agents' by their path (Anthropic's is no
    OpenAI route), the others as OpenAI-compatible."""
    return f"the {endpoint} route" if endpoint in AGENT_ENDPOINTS else "the OpenAI-compatible route"


class PhaseSource(StrEnum):
    """Where a phase's value came from (stored beside it; a value that is not known has no source)."""

    OLLAMA = "ollama"  # Ollama's final durations and counts
    USAGE = "usage"  # the OpenAI-compatible reply's ``usage`` counts
    STREAM = "stream"  # the proxy's timestamps of the streamed chunks
    COUNTED = "counted"  # chunks counted by the proxy (one token each)
    SLOTS = "slots"  # the runner's /slots readings
    LOG = "log"  # Ollama's log lines
    ACCESS = "access"  # Ollama's access line alone (a direct request it answered with an error before any runner task)
    ESTIMATE = "estimate"  # computed from a model of the hardware, not measured


class Flag(StrEnum):
    """Stable flag codes: stored (``requests.flags``), so a value never changes once released."""

    MISSING_METRICS = "missing_metrics"
    LOAD_ONLY = "load_only"
    MISSING_TOTAL = "missing_total"
    NO_PREFILL_DURATION = "no_prefill_duration"
    NO_OUTPUT = "no_output"
    ONE_TOKEN_REPLY = "one_token_reply"
    CACHE_HIT = "cache_hit"
    CACHE_UNKNOWN = "cache_unknown"
    CACHED_EXCEEDS_PROMPT = "cached_exceeds_prompt"
    NEGATIVE_QUEUE = "negative_queue"
    PHASES_EXCEED_REQUEST = "phases_exceed_request"
    NEGATIVE_TRANSPORT = "negative_transport"
    IMPLAUSIBLE_PREFILL_RATE = "implausible_prefill_rate"
    IMPLAUSIBLE_DECODE_RATE = "implausible_decode_rate"
    INVALID_METRICS = "invalid_metrics"
    CLAMPED = "clamped"
    NO_SERVER_TIMINGS = "no_server_timings"
    INVALID_TEXT = "invalid_text"
    PROMPT_TRUNCATED = "prompt_truncated"
    NUM_CTX_IGNORED = "num_ctx_ignored"
    CLOUD = "cloud"


# What each flag means. The per-reading text (with numbers) is in Phases.flag_text.
FLAG_CODES: dict[Flag, str] = {
    Flag.MISSING_METRICS: "no final metrics: the request did not finish normally, or the server sent none",
    Flag.LOAD_ONLY: "a load/unload reply: no prompt was evaluated",
    Flag.MISSING_TOTAL: "total_duration is absent, so queue time is unknown",
    Flag.NO_PREFILL_DURATION: "prompt tokens were reported but no prompt_eval_duration",
    Flag.NO_OUTPUT: "no output tokens",
    Flag.ONE_TOKEN_REPLY: "a one-token reply: there is no interval to time decode over",
    Flag.CACHE_HIT: "part of the prompt came from the KV cache; Ollama's prefill rate counts it and is inflated",
    Flag.CACHE_UNKNOWN: "the reply does not say how many prompt tokens were cached; the prefill rate may include cache hits",
    Flag.CACHED_EXCEEDS_PROMPT: "more cached tokens than prompt tokens: cannot be true",
    Flag.NEGATIVE_QUEUE: "load + prefill + decode is longer than total_duration: cannot be true",
    Flag.PHASES_EXCEED_REQUEST: "prefill + decode started before the proxy received the request: cannot be true",
    Flag.NEGATIVE_TRANSPORT: "Ollama's total_duration is longer than the request as the proxy saw it: cannot be true",
    Flag.IMPLAUSIBLE_PREFILL_RATE: "prefill rate beyond any hardware: the duration is too small to mean anything",
    Flag.IMPLAUSIBLE_DECODE_RATE: "decode rate beyond any hardware: the duration is too small to mean anything",
    Flag.INVALID_METRICS: "the final metrics hold negative or absurd values and were ignored",
    Flag.CLAMPED: "an integer did not fit in 64 bits and was stored clamped to the nearest one that does",
    Flag.NO_SERVER_TIMINGS: (
        "the reply carries no durations: load, queue and prefill are unknown; what is known comes from the stream"
    ),
    Flag.INVALID_TEXT: (
        "text that was not valid Unicode (a lone UTF-16 surrogate, as a client cutting a string mid-emoji sends) "
        "was stored with U+FFFD in its place"
    ),
    Flag.PROMPT_TRUNCATED: (
        "the prompt was longer than the context: Ollama cut it (and answered 200) or refused it (400); "
        "the model did not read all of it"
    ),
    Flag.NUM_CTX_IGNORED: "options.num_ctx was sent on a /v1 route, where Ollama ignores it",
    Flag.CLOUD: "a cloud model: it ran on ollama.com, so no phase of it ran here and no local ceiling applies",
}


class PhaseSplitError(ValueError):
    """The input is not an Ollama final response that can be split into phases."""


@dataclass(frozen=True)
class Phases:
    """Phases, token counts and rates of one generation. None = not known."""

    total_s: float | None = None
    load_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    queue_s: float | None = None  # slot wait + templating; negative is kept (and flagged)
    transport_s: float | None = None  # client-side time beyond total_duration
    ttft_s: float | None = None  # client side: request received → first token chunk (streamed replies only)
    client_s: float | None = None  # client side: request received → final chunk (or close)
    # Server side: queue + load + prefill from Ollama's durations (a non-streamed reply has no client TTFT).
    server_ttft_s: float | None = None
    ttfa_s: float | None = None  # client side: request received → first answer chunk (after any thinking)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None: the server did not say
    output_tokens: int | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    ollama_prefill_tok_s: float | None = None
    ollama_decode_tok_s: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_max_ms: float | None = None
    token_chunks: int = 0  # chunks with content seen by the proxy (tokens so far, while in flight)
    # Thinking models: decode split at the first answer chunk (tokens counted from the stream).
    thinking_tokens: int | None = None
    thinking_s: float | None = None  # first token → first answer token (all thinking when no answer came)
    thinking_tok_s: float | None = None
    answer_tokens: int | None = None
    answer_s: float | None = None  # first answer token → last token
    answer_tok_s: float | None = None
    # Where each value came from (PhaseSource); None where the value is not known.
    load_source: PhaseSource | None = None
    queue_source: PhaseSource | None = None
    prefill_source: PhaseSource | None = None
    decode_source: PhaseSource | None = None
    prompt_tokens_source: PhaseSource | None = None
    output_tokens_source: PhaseSource | None = None
    thinking_source: PhaseSource | None = None
    # Phase boundaries on the record's monotonic clock (ns); None without proxy timestamps.
    load_start_ns: int | None = None
    load_end_ns: int | None = None
    prefill_start_ns: int | None = None
    decode_start_ns: int | None = None  # = prefill end
    decode_end_ns: int | None = None
    done_reason: str | None = None
    flags: list[Flag] = field(default_factory=list)
    flag_text: dict[Flag, str] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output (the CLI and the store's export)."""
        return asdict(self)


# ---------------------------------------------------------------- parsing the wire object


def _check_int(name: str, value: object) -> int:
    """One metric value: a non-negative integer within reason."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PhaseSplitError(f"{name} must be an integer, got {type(value).__name__} {value!r}"[:200])
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise PhaseSplitError(f"{name} must be an integer, got {value!r}")
        value = int(value)
    if value < 0:
        raise PhaseSplitError(f"{name} is negative ({value})")
    limit = MAX_TOKEN_COUNT if name in _COUNT_FIELDS else MAX_DURATION_NS
    if value > limit:
        raise PhaseSplitError(f"{name} = {value} is absurd (limit {limit})")
    return value


def metrics_from_response(obj: object) -> FinalMetrics:
    """Validate Ollama's final response object and pull out its metrics.

    Raises PhaseSplitError when ``obj`` is not a final chunk (``done`` is not true), is an
    error object, or holds negative, non-integer or absurd values.
    """
    if not isinstance(obj, Mapping):
        raise PhaseSplitError(f"expected a JSON object, got {type(obj).__name__}")
    if "error" in obj:
        raise PhaseSplitError(f"the server sent an error, not a result: {str(obj['error'])[:200]}")
    if obj.get("done") is not True:
        raise PhaseSplitError('not a final chunk: "done" is not true')
    values: dict[str, Any] = {}
    for wire, attr in _WIRE_FIELDS.items():
        if wire in obj and obj[wire] is not None:
            values[attr] = _check_int(wire, obj[wire])
    reason = obj.get("done_reason")
    if reason is not None and not isinstance(reason, str):
        raise PhaseSplitError(f"done_reason must be a string, got {type(reason).__name__}")
    metrics = FinalMetrics(done_reason=reason, **values)
    problem = _impossible(metrics)
    if problem:
        raise PhaseSplitError(problem)
    return metrics


def _impossible(m: FinalMetrics) -> str | None:
    """A reason the metrics cannot come from a real server, or None."""
    for attr in ("total_duration_ns", "load_duration_ns", "prompt_eval_duration_ns", "eval_duration_ns"):
        v = getattr(m, attr)
        if v is not None and not 0 <= v <= MAX_DURATION_NS:
            return f"{attr} = {v} is negative or absurd"
    for attr in ("prompt_eval_count", "prompt_eval_cached_count", "eval_count"):
        v = getattr(m, attr)
        if v is not None and not 0 <= v <= MAX_TOKEN_COUNT:
            return f"{attr} = {v} is negative or absurd"
    return None


# ---------------------------------------------------------------- the split


def _s(ns: int | None) -> float | None:
    return None if ns is None else ns / NS_PER_S


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an already sorted, non-empty sequence."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    pos = (len(sorted_values) - 1) * min(max(q, 0.0), 100.0) / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def token_gaps_ns(token_chunk_ns: Sequence[int]) -> list[int]:
    """Gaps between consecutive token chunks (ns), in arrival order."""
    return [b - a for a, b in itertools.pairwise(token_chunk_ns)]


class _Flags:
    def __init__(self) -> None:
        self.codes: list[Flag] = []
        self.text: dict[Flag, str] = {}

    def add(self, code: Flag, text: str) -> None:
        if code not in self.text:
            self.codes.append(code)
            self.text[code] = text


def _split_server(m: FinalMetrics, flags: _Flags, *, kind: RequestKind = RequestKind.GENERATE) -> dict[str, Any]:
    """Phases and rates from Ollama's numbers alone."""
    out: dict[str, Any] = {"done_reason": m.done_reason}
    prompt = m.prompt_eval_count
    cached = m.prompt_eval_cached_count
    output = m.eval_count
    out.update(prompt_tokens=prompt, cached_tokens=cached, output_tokens=output, total_s=_s(m.total_duration_ns))
    out.update(prompt_tokens_source=_src(prompt), output_tokens_source=_src(output))

    if m.done_reason in ("load", "unload"):
        flags.add(Flag.LOAD_ONLY, f"done_reason {m.done_reason!r}: the model was {m.done_reason}ed, nothing was generated")
    has_numbers = any(
        v is not None
        for v in (m.total_duration_ns, m.prompt_eval_count, m.eval_count, m.prompt_eval_duration_ns, m.eval_duration_ns)
    )
    if not has_numbers:
        if m.load_duration_ns is not None:
            out.update(load_s=_s(m.load_duration_ns), load_source=PhaseSource.OLLAMA)
        if kind is RequestKind.GENERATE:
            flags.add(Flag.MISSING_METRICS, "the final chunk carries no durations or counts")
        return out  # nothing says which durations were zero: all unknown, never 0
    if kind is RequestKind.EMBED:
        return _split_embed(m, out, flags)
    # A final chunk with numbers leaves out the zero ones (omitempty): absent means 0 here.
    load_ns = m.load_duration_ns or 0
    prefill_ns = m.prompt_eval_duration_ns or 0
    decode_ns = m.eval_duration_ns or 0
    out.update(load_s=_s(load_ns), prefill_s=_s(prefill_ns), decode_s=_s(decode_ns))
    out.update(load_source=PhaseSource.OLLAMA, prefill_source=PhaseSource.OLLAMA, decode_source=PhaseSource.OLLAMA)

    _split_queue(m, load_ns, prefill_ns, decode_ns, out, flags)
    _prefill_rate(prompt, cached, prefill_ns, out, flags)
    _decode_rate(output, decode_ns, out, flags)
    return out


def _split_queue(m: FinalMetrics, load_ns: int, prefill_ns: int, decode_ns: int, out: dict[str, Any], flags: _Flags) -> None:
    """Queue (waiting for a slot, templating): what total_duration leaves after load, prefill and decode."""
    if m.total_duration_ns is None:
        flags.add(Flag.MISSING_TOTAL, "total_duration is absent, so queue time is unknown")
        out["server_ttft_s"] = _s(load_ns + prefill_ns)
    else:
        queue_ns = m.total_duration_ns - load_ns - prefill_ns - decode_ns
        out["queue_s"] = _s(queue_ns)
        out["queue_source"] = PhaseSource.OLLAMA
        out["server_ttft_s"] = _s(m.total_duration_ns - decode_ns)
        if queue_ns < 0:
            flags.add(
                Flag.NEGATIVE_QUEUE,
                f"load + prefill + decode = {(load_ns + prefill_ns + decode_ns) / 1e6:.1f} ms is longer than "
                f"total_duration = {m.total_duration_ns / 1e6:.1f} ms",
            )


def _prefill_rate(prompt: int | None, cached: int | None, prefill_ns: int, out: dict[str, Any], flags: _Flags) -> None:
    """Prefill tok/s, cache-aware when the server reports cached tokens; Ollama's own formula beside it."""
    if prompt is None or prompt <= 0:
        return
    if cached is not None and cached > prompt:
        flags.add(Flag.CACHED_EXCEEDS_PROMPT, f"{cached} cached tokens but only {prompt} prompt tokens")
    elif cached is not None and cached > 0:
        flags.add(
            Flag.CACHE_HIT,
            f"{cached} of {prompt} prompt tokens came from the KV cache; only {prompt - cached} were computed, "
            "so Ollama's count/duration overstates prefill speed",
        )
    elif cached is None:
        flags.add(
            Flag.CACHE_UNKNOWN,
            "the final chunk has no prompt_eval_cached_count, so how many of the "
            f"{prompt} prompt tokens came from the KV cache is unknown; the prefill rate counts them all",
        )
    if prefill_ns > 0:
        out["ollama_prefill_tok_s"] = prompt / (prefill_ns / NS_PER_S)
        if cached is None or cached <= prompt:
            out["prefill_tok_s"] = (prompt - (cached or 0)) / (prefill_ns / NS_PER_S)
            if out["prefill_tok_s"] > IMPLAUSIBLE_PREFILL_TOK_S:
                flags.add(
                    Flag.IMPLAUSIBLE_PREFILL_RATE,
                    f"{out['prefill_tok_s']:.0f} prompt tokens/s over {prefill_ns / 1e3:.0f} µs",
                )
    elif prompt - (cached or 0) > 0:
        flags.add(Flag.NO_PREFILL_DURATION, f"{prompt} prompt tokens but no prompt_eval_duration")


def _decode_rate(output: int | None, decode_ns: int, out: dict[str, Any], flags: _Flags) -> None:
    """Decode tok/s: n tokens over n − 1 intervals (eval_duration spans first to last token)."""
    if not output:
        flags.add(Flag.NO_OUTPUT, "the reply has no output tokens")
    if output is not None and output > 0 and decode_ns > 0:
        out["ollama_decode_tok_s"] = output / (decode_ns / NS_PER_S)
    if output == 1:
        flags.add(Flag.ONE_TOKEN_REPLY, "one output token: a decode rate over zero intervals means nothing")
    elif output is not None and output > 1 and decode_ns > 0:
        out["decode_tok_s"] = (output - 1) / (decode_ns / NS_PER_S)
        if out["decode_tok_s"] > IMPLAUSIBLE_DECODE_TOK_S:
            flags.add(
                Flag.IMPLAUSIBLE_DECODE_RATE,
                f"{out['decode_tok_s']:.0f} output tokens/s over {decode_ns / 1e3:.0f} µs",
            )


def _src(value: object, source: PhaseSource = PhaseSource.OLLAMA) -> PhaseSource | None:
    return None if value is None else source


def _split_embed(m: FinalMetrics, out: dict[str, Any], flags: _Flags) -> dict[str, Any]:
    """An embed reply: load, then the prompt evaluated (prefill only, nothing decoded).

    Ollama sends total_duration, load_duration and prompt_eval_count but no prompt_eval_duration: prefill is
    total − load (tokenising and any wait for the one slot included).
    """
    load_ns = m.load_duration_ns or 0
    out.update(load_s=_s(load_ns), load_source=PhaseSource.OLLAMA)
    out["output_tokens"] = out["output_tokens_source"] = None
    if m.total_duration_ns is None:
        flags.add(Flag.MISSING_TOTAL, "total_duration is absent, so the embedding time is unknown")
        return out
    prefill_ns = m.total_duration_ns - load_ns
    out.update(prefill_s=_s(prefill_ns), prefill_source=PhaseSource.OLLAMA, server_ttft_s=_s(m.total_duration_ns))
    if prefill_ns < 0:
        flags.add(Flag.NEGATIVE_QUEUE, f"load_duration {load_ns / 1e6:.1f} ms is longer than total_duration")
    elif prefill_ns > 0 and m.prompt_eval_count:
        out["prefill_tok_s"] = out["ollama_prefill_tok_s"] = m.prompt_eval_count / (prefill_ns / NS_PER_S)
    return out


def _result(values: dict[str, Any], flags: _Flags) -> Phases:
    return Phases(**values, flags=flags.codes, flag_text=flags.text)


def split_metrics(metrics: FinalMetrics) -> Phases:
    """Phases from Ollama's final metrics alone (no proxy timestamps)."""
    flags = _Flags()
    problem = _impossible(metrics)
    if problem:
        raise PhaseSplitError(problem)
    return _result(_split_server(metrics, flags), flags)


def split_response(obj: object) -> Phases:
    """Phases from Ollama's final response object (a parsed JSON dict). Raises PhaseSplitError."""
    return split_metrics(metrics_from_response(obj))


def split_record(rec: RequestRecord, sorted_gaps_ns: Sequence[int] | None = None) -> Phases:
    """Phases of a recorded request: Ollama's numbers placed on the proxy's clock, the stream's timing where
    Ollama sends no numbers (the OpenAI-compatible routes), each value with its source.

    ``sorted_gaps_ns``: the gaps between its token chunks, sorted, where the caller keeps them as they grow
    (``analysis.running_gaps``); None: sorted here.

    Never raises for a record's content: metrics that cannot be real are ignored and
    flagged ``invalid_metrics``; an in-flight or failed request gets what the proxy saw.
    """
    flags = _Flags()
    kind = RequestKind(rec.kind)
    openai, cloud = _counts_only(rec)
    counts_only = openai or cloud
    m = rec.metrics
    values: dict[str, Any] = {}
    if m is not None:
        problem = _impossible(m)
        if problem:
            flags.add(Flag.INVALID_METRICS, problem)
            m = None
    if m is not None and counts_only:
        values = _split_usage(m, kind, PhaseSource.USAGE if openai else PhaseSource.OLLAMA)
    elif m is not None:
        values = _split_server(m, flags, kind=kind)
    elif (
        Flag.INVALID_METRICS not in flags.text
        and kind is not RequestKind.UNLOAD
        and not (counts_only and rec.outcome is Outcome.OK)
    ):
        why = "still running" if rec.outcome == Outcome.IN_FLIGHT else f"the request ended as {rec.outcome}"
        flags.add(Flag.MISSING_METRICS, f"no final metrics: {why}")
    _counts_only_flags(rec, flags, cloud=cloud, openai=openai)

    chunks = rec.token_chunk_ns  # read, never changed: no copy (a running reply's may hold 30,000 times)
    values["token_chunks"] = len(chunks)
    # Only a streamed reply shows the client a first token; a whole JSON body has none.
    if rec.first_token_ns is not None and rec.stream:
        values["ttft_s"] = (rec.first_token_ns - rec.received_ns) / NS_PER_S
    end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
    if end_ns is not None:
        values["client_s"] = (end_ns - rec.received_ns) / NS_PER_S
    gaps = sorted(token_gaps_ns(chunks)) if sorted_gaps_ns is None else sorted_gaps_ns
    if gaps:
        values["itl_p50_ms"] = percentile(gaps, 50) / 1e6
        values["itl_p99_ms"] = percentile(gaps, 99) / 1e6
        values["itl_max_ms"] = gaps[-1] / 1e6

    if kind in (RequestKind.LOAD, RequestKind.UNLOAD):
        _place_load(rec, values)
    elif m is not None and rec.final_chunk_ns is not None and not counts_only:
        _place_server(rec, m, values, flags, kind)
    if kind is RequestKind.GENERATE and rec.stream and chunks and counts_only:  # no durations: the stream times decode
        _decode_from_stream(chunks, values, flags)
    if kind is RequestKind.GENERATE and rec.stream:
        _split_thinking(rec, chunks, values)
    if rec.direct:
        _as_direct(rec, values)
    _fit_flags(rec, flags)
    return _result(values, flags)


def _counts_only(rec: RequestRecord) -> tuple[bool, bool]:
    """(an OpenAI-compatible route's reply, a cloud model's): replies whose counts alone are this machine's. A /v1
    reply sends no durations; a cloud model ran on ollama.com, so the durations in its reply are not this machine's
    phases. A direct record's figures are the runner's: neither."""
    if rec.direct:
        return False, False
    return (rec.endpoint or "").startswith("/v1/"), is_cloud(rec.model)


def _counts_only_flags(rec: RequestRecord, flags: _Flags, *, cloud: bool, openai: bool) -> None:
    """Why a reply's durations are not this machine's phases: a cloud model's, or a /v1 route that sends none."""
    if cloud:
        flags.add(
            Flag.CLOUD,
            "a cloud model: it ran on ollama.com, not here; its tokens are Ollama's count and its times the client's"
            + (" (decode from the stream's first to last content chunk)" if rec.stream else "")
            + "; load, queue and prefill did not happen on this machine, and no local ceiling applies",
        )
    elif openai:
        flags.add(
            Flag.NO_SERVER_TIMINGS,
            f"{no_durations_route(rec.endpoint)} sends no durations: load, queue and prefill are unknown"
            + ("; decode is timed from the stream's first to last content chunk" if rec.stream else ""),
        )


def _fit_flags(rec: RequestRecord, flags: _Flags) -> None:
    """A prompt that did not fit the context, and a /v1 request's options.num_ctx that Ollama ignored."""
    fit = prompt_fit.verdict(rec)
    if fit.truncated is not None:
        flags.add(Flag.PROMPT_TRUNCATED, fit.truncated)
    if fit.ignored is not None:
        flags.add(Flag.NUM_CTX_IGNORED, fit.ignored)


def _as_direct(rec: RequestRecord, values: dict[str, Any]) -> None:
    """A generation seen from the runner: its figures are the runner's (its log, else /slots readings), not a
    reply's; it has no client side (no proxy saw it), so nothing is measured there."""
    source = PhaseSource.LOG if rec.runner_source == PhaseSource.LOG else PhaseSource.SLOTS
    for key in ("prefill_source", "decode_source", "prompt_tokens_source", "output_tokens_source"):
        if values.get(key) is not None:
            values[key] = source
    if rec.metrics is not None and rec.metrics.load_duration_ns is None and source is PhaseSource.SLOTS:
        values.update(load_s=None, load_source=None)  # /slots does not tell whether a load came first: not known
    elif values.get("load_source") is not None:
        values["load_source"] = PhaseSource.LOG  # the log tells each load ("llama-server started in X seconds"), or none
    client_s = values.get("client_s")
    for key in ("transport_s", "ttft_s", "client_s"):
        values.pop(key, None)
    if rec.runner_source == PhaseSource.ACCESS and client_s is not None:
        values["total_s"] = client_s  # failed before any runner task: its span is the access line's latency, all it has


def _split_usage(m: FinalMetrics, kind: RequestKind, source: PhaseSource = PhaseSource.USAGE) -> dict[str, Any]:
    """A reply whose counts alone are this machine's: an OpenAI-compatible one (``usage``), or a cloud model's."""
    output = None if kind is RequestKind.EMBED else m.eval_count
    return {
        "done_reason": m.done_reason,
        "prompt_tokens": m.prompt_eval_count,
        "cached_tokens": m.prompt_eval_cached_count,
        "output_tokens": output,
        "prompt_tokens_source": _src(m.prompt_eval_count, source),
        "output_tokens_source": _src(output, source),
    }


def _place_server(rec: RequestRecord, m: FinalMetrics, values: dict[str, Any], flags: _Flags, kind: RequestKind) -> None:
    """Ollama's durations placed on the proxy's clock: decode ends at the final chunk, load starts on forwarding."""
    assert rec.final_chunk_ns is not None
    total_ns = m.total_duration_ns
    client_ns = rec.final_chunk_ns - rec.received_ns
    if total_ns is not None and not rec.direct:  # a direct record has no client side to compare with
        transport_ns = client_ns - total_ns
        values["transport_s"] = transport_ns / NS_PER_S
        if transport_ns < -CLOCK_SLACK_NS:
            flags.add(
                Flag.NEGATIVE_TRANSPORT,
                f"total_duration = {total_ns / 1e6:.1f} ms but the proxy saw the request take {client_ns / 1e6:.1f} ms",
            )
    if values.get("load_s") is None or values.get("prefill_s") is None:
        return  # no durations to place
    decode_end = rec.final_chunk_ns
    if kind is RequestKind.EMBED:  # prefill ends where the reply is sent; nothing is decoded
        decode_start = decode_end
        prefill_start = decode_end - round(values["prefill_s"] * NS_PER_S)
    else:
        decode_start = decode_end - (m.eval_duration_ns or 0)
        prefill_start = decode_start - (m.prompt_eval_duration_ns or 0)
    # Ollama's clock starts when it reads the request, i.e. once we forwarded it.
    load_start = rec.forwarded_ns if rec.forwarded_ns is not None else rec.received_ns
    load_end = load_start + (m.load_duration_ns or 0)
    values.update(
        load_start_ns=load_start,
        load_end_ns=load_end,
        prefill_start_ns=prefill_start,
        decode_start_ns=decode_start,
        decode_end_ns=decode_end,
    )
    if prefill_start < rec.received_ns - CLOCK_SLACK_NS:
        flags.add(
            Flag.PHASES_EXCEED_REQUEST,
            f"prefill + decode = {(decode_end - prefill_start) / 1e6:.1f} ms is longer than the "
            f"{client_ns / 1e6:.1f} ms the proxy saw",
        )


def _place_load(rec: RequestRecord, values: dict[str, Any]) -> None:
    """A load (or unload) reply: Ollama answers once the model is ready, and sends no durations.

    load_duration when the reply has it; else, for a load, the time from forwarding to the reply (the stream's
    timing). An unload answers at once and loads nothing: its load is unknown unless Ollama says.
    """
    start = rec.forwarded_ns if rec.forwarded_ns is not None else rec.received_ns
    if values.get("load_s") is None and rec.kind == RequestKind.LOAD and rec.final_chunk_ns is not None:
        values.update(load_s=(rec.final_chunk_ns - start) / NS_PER_S, load_source=PhaseSource.STREAM)
    if values.get("load_s") is not None:
        values.update(load_start_ns=start, load_end_ns=start + round(values["load_s"] * NS_PER_S))


def _decode_from_stream(chunks: Sequence[int], values: dict[str, Any], flags: _Flags) -> None:
    """Decode timed from the first to the last content chunk; tokens counted where the reply gave no count."""
    if values.get("output_tokens") is None:
        values.update(output_tokens=len(chunks), output_tokens_source=PhaseSource.COUNTED)
    values.update(decode_start_ns=chunks[0], decode_end_ns=chunks[-1])
    if len(chunks) < 2:
        flags.add(Flag.ONE_TOKEN_REPLY, "one content chunk: a decode rate over zero intervals means nothing")
        return
    decode_ns = chunks[-1] - chunks[0]
    values.update(decode_s=decode_ns / NS_PER_S, decode_source=PhaseSource.STREAM)
    if decode_ns > 0:
        values["decode_tok_s"] = (len(chunks) - 1) / (decode_ns / NS_PER_S)


def _split_thinking(rec: RequestRecord, chunks: Sequence[int], values: dict[str, Any]) -> None:
    """Decode split at the first answer chunk: thinking before it, the answer from it on (counted from the stream)."""
    if rec.first_answer_ns is not None:
        values["ttfa_s"] = (rec.first_answer_ns - rec.received_ns) / NS_PER_S
    thinking = rec.thinking_chunks
    if thinking is None or not chunks:
        return  # recorded before thinking was kept apart, or nothing streamed
    answer = len(chunks) - thinking
    values.update(thinking_tokens=thinking, answer_tokens=answer, thinking_source=PhaseSource.COUNTED)
    first = chunks[0]
    if thinking == 0:
        answer_start = first
    elif rec.first_answer_ns is not None:
        answer_start = rec.first_answer_ns
        thinking_ns = answer_start - first  # one interval per thinking token: the last one leads to the answer
        values.update(thinking_s=thinking_ns / NS_PER_S)
        if thinking_ns > 0:
            values["thinking_tok_s"] = thinking / (thinking_ns / NS_PER_S)
    else:  # thinking only (cut, or the budget ran out)
        last = rec.last_thinking_ns if rec.last_thinking_ns is not None else chunks[-1]
        values.update(thinking_s=(last - first) / NS_PER_S)
        if last > first:
            values["thinking_tok_s"] = (thinking - 1) / ((last - first) / NS_PER_S)
        return
    if answer > 0:
        answer_ns = chunks[-1] - answer_start
        values["answer_s"] = answer_ns / NS_PER_S
        if answer > 1 and answer_ns > 0:
            values["answer_tok_s"] = (answer - 1) / (answer_ns / NS_PER_S)


# ---------------------------------------------------------------- command line

CLI_KEYS = (
    "total_s",
    "load_s",
    "prefill_s",
    "decode_s",
    "queue_s",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "prefill_tok_s",
    "decode_tok_s",
    "ollama_prefill_tok_s",
    "ollama_decode_tok_s",
    "done_reason",
    "flags",
    "flag_text",
)


def parse_final_json(text: str) -> Phases:
    """Split the final response given as JSON text; an NDJSON stream is read up to its last line."""
    import json

    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise PhaseSplitError(f"not JSON: {exc}") from None
        try:
            obj = json.loads(lines[-1])
        except (ValueError, RecursionError):
            raise PhaseSplitError(f"not JSON: {exc}") from None
    try:
        return split_response(obj)
    except RecursionError:
        raise PhaseSplitError("input nested too deeply") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m analysis.phases``: one final response JSON on stdin → phases JSON on stdout."""
    import argparse
    import json
    import sys

    from analysis.command_line import ExitCode

    parser = argparse.ArgumentParser(
        prog="python -m analysis.phases",
        description="Read one Ollama final response object (JSON) on stdin; print its phases and rates as JSON.",
    )
    parser.add_argument("--all", action="store_true", help="print every field, not only the summary keys")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"error: input is not UTF-8 text: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        phases = parse_final_json(text)
    except PhaseSplitError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return ExitCode.USAGE
    full = phases.to_json_dict()
    out = full if args.all else {k: full[k] for k in CLI_KEYS}
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
