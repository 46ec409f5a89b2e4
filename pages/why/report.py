"""A report to paste: a short plain-text diagnosis built from the Why page's own view-model (no Streamlit).

Ollama's version and the settings in force with their sources, the GPU and where each model sits, rates against
their ceilings, the loads and their causes, and the flags seen with counts and their fixes. Nothing in it
identifies the user: no prompt or reply text, no path but the data folder's name, no address but loopback ones
(others are counted), never the runner's model path. ``python -m pages.report`` prints it; the Why page offers
it as a block to copy.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from analysis import wording as w
from analysis.diagnose import CODES, DiagnosisCode
from analysis.loopback import is_loopback
from analysis.model_names import ModelName, parse_model_name
from analysis.phases import FLAG_CODES, Flag
from analysis.printable import printable
from analysis.records import LoadedModel, OllamaStatus, RunnerFlags
from analysis.reloads import QUEUE_FULL, Cause, Load, LoadInput, PsRow, describe_load, find_churn, is_queue_full, reloads
from pages.why.view import WhyModel, build_why, hardware_line, placement_words
from pages.why.whatif import STARTED_WITH
from store import queries
from store.schema import db_path
from store.tables import OllamaSettingRow

DEFAULT_SINCE_S = 24 * 3600.0
MAX_LOAD_LINES = 8  # the newest loads that are not a first use, one line each
MAX_PROGRAMS_NAMED = 5  # programs the report names (most requests first); the rest are counted

# What to change for each diagnosis the Why page groups (analysis.diagnose.CODES says what each means): every code,
# None where there is nothing to change (a reading to doubt, not a cost) or its sentence already names what changes it.
DIAGNOSIS_FIXES: dict[DiagnosisCode, str | None] = {
    DiagnosisCode.PARTIAL_OFFLOAD: "a smaller quantization or num_ctx, or fewer models loaded at once, so it fits in GPU memory",
    DiagnosisCode.MEMORY_CLOCK_LOW: "check the GPU's power-management mode (persistence mode, a fixed P-state)",
    DiagnosisCode.POWER_CAPPED: "raise the GPU's power limit, or improve its cooling",
    DiagnosisCode.TTFT_LOAD: "keep the model loaded: OLLAMA_KEEP_ALIVE, and the same options from every client",
    DiagnosisCode.TTFT_PROMPT: "shorter prompts, or reuse a prefix the prompt cache keeps",
    DiagnosisCode.TTFT_QUEUE: "more slots (OLLAMA_NUM_PARALLEL) or fewer requests at once",
    DiagnosisCode.INTERFERENCE: (
        "fewer parallel slots (OLLAMA_NUM_PARALLEL), a smaller batch (-b/-ub, num_batch: chunked prefill trades the long "
        "prompt's speed for its neighbours'), or a separate runner for long documents"
    ),
    DiagnosisCode.DECODE_SLOW: "look at the GPU's clocks, power and other work on it during these requests",
    DiagnosisCode.PROMPT_TRUNCATED: (
        "a larger num_ctx for that client: options.num_ctx on the /api routes, OLLAMA_CONTEXT_LENGTH (the app's context "
        "slider) for /v1, which ignores options"
    ),
    DiagnosisCode.NUM_CTX_IGNORED: (
        "set OLLAMA_CONTEXT_LENGTH, or use a model created with PARAMETER num_ctx: /v1 ignores options"
    ),
    DiagnosisCode.CACHE_HIT: None,
    DiagnosisCode.CACHE_SUSPECTED: None,
    DiagnosisCode.ONE_TOKEN_REPLY: None,
    DiagnosisCode.TTFT_RUNNER_WAIT: None,
    DiagnosisCode.TTFT_WAIT_UNEXPLAINED: None,
    DiagnosisCode.DECODE_ABOVE_CEILING: None,
    DiagnosisCode.DECODE_SPECULATIVE: None,
    DiagnosisCode.PREFILL_ABOVE_CEILING: None,
}
NO_CEILING = " (no ceiling: GPU or model unknown)"
QUEUE_FULL_FIX = "raise OLLAMA_MAX_QUEUE, or send fewer requests that need a load at the same time"


def _safe_client(client: str | None) -> str | None:
    """A loopback address as it is; any other as 'a client on another machine'."""
    if client is None:
        return None
    return client if is_loopback(client) else "a client on another machine"


def _ollama_where(base_url: str) -> str:
    url = urlsplit(base_url)
    if is_loopback(url.hostname):
        return f"at {url.hostname}:{url.port}" if url.port else f"at {url.hostname}"
    return "on another machine"


def _runner_settings(r: RunnerFlags) -> str:
    parts = []
    if r.ctx_size_tokens is not None:
        per_slot = f" ({w.count(r.ctx_size_tokens // r.parallel)} per slot)" if r.parallel else ""
        parts.append(f"context {w.count(r.ctx_size_tokens)}{per_slot}")
    for name, value in (
        ("parallel", r.parallel),
        ("batch", r.batch_tokens),
        ("ubatch", r.ubatch_tokens),
        ("KV cache K", r.cache_type_k),
        ("KV cache V", r.cache_type_v),
        ("flash attention", r.flash_attn),
        ("GPU layers", r.gpu_layers),
        ("threads", r.threads),
    ):
        if value is not None:
            parts.append(f"{name} {value}")
    return ", ".join(parts) if parts else "no settings on its command line (its defaults hold)"


def _rates(m: WhyModel) -> list[str]:
    c = m.ceilings
    out = []
    for phase, median, ceiling in (
        ("prefill", m.prefill_median_tok_s, c.prefill_ceiling_tok_s if c else None),
        ("decode", m.decode_median_tok_s, c.decode_ceiling_tok_s if c else None),
    ):
        if median is None:
            continue
        against = f" of a {w.tok_s(ceiling)} ceiling ({w.pct(median / ceiling)})" if ceiling else NO_CEILING
        out.append(f"{phase} median {w.tok_s(median)}{against}")
    return out


def _load_line(load: Load) -> str:
    when = datetime.fromtimestamp(load.at_unix_s, UTC).strftime("%H:%M:%S")
    return f"{when} {describe_load(load)}"


@dataclass(frozen=True)
class _Reads:
    status: OllamaStatus | None
    models: list[str]
    runners: list[RunnerFlags]
    loaded: list[LoadedModel]
    inputs: list[LoadInput]
    ps: list[PsRow]
    snapshot_ts: list[float]
    flags: dict[str, int]
    started_with: list[OllamaSettingRow]  # Ollama's start lines, as stored (its log)
    installed: list[str]  # the names /api/tags last listed
    programs: queries.ProgramCounts  # finished requests per program (User-Agent product)


def _vouched(r: _Reads) -> set[ModelName]:
    """The models Ollama itself named or served: listed by /api/ps or /api/tags, or answered with a 2xx. Any other
    name is one a client chose (Ollama's 404 echoes it): it may hold an address, a path or a forged line, so the
    report counts such names and never prints them."""
    names = [p.model for p in r.ps] + [m.name for m in r.loaded] + r.installed
    names += [i.model for i in r.inputs if i.status_code is not None and 200 <= i.status_code < 300]
    return {parse_model_name(n) for n in names}


def _window_words(since_s: float) -> str:
    return w.secs(since_s) if since_s < 3600 else f"{since_s / 3600:g} h"


def _ollama_lines(r: _Reads) -> list[str]:
    if r.status is None:
        out = ["Ollama: never polled"]
    else:
        state = "up" if r.status.up else "down"
        where = _ollama_where(r.status.base_url)
        out = [f"Ollama: version {r.status.version or 'unknown'} {where}, {state} at the last poll"]
    out.append("Settings in force:")
    if not r.loaded and not r.runners:
        out.append("  none read (no model loaded, no runner's command line read)")
    for lm in r.loaded:
        ctx = f"context {w.count(lm.context_length)}" if lm.context_length else "context unknown"
        out.append(f"  {lm.name}: {ctx} (Ollama's /api/ps)")
    for rf in r.runners:
        out.append(f"  runner for {rf.model or 'an unmatched model'}: {_runner_settings(rf)} (the runner's command line)")
    # Ollama's start lines: only the settings that decide a load (no paths, no addresses: OLLAMA_MODELS, OLLAMA_HOST).
    by_name = {s.name: s for s in r.started_with}
    for name in STARTED_WITH:
        if (s := by_name.get(name)) is not None:
            out.append(f"  {name}: {s.value or '(unset)'} ({s.source})")
    return out


def _model_lines(views: list[WhyModel], unnamed: Counter[str]) -> list[str]:
    out = [f"GPU: {hardware_line(views[0].hardware)}"] if views else []
    out.append("Models:")
    if not views and not unnamed:
        out.append("  no requests in this window")
    for m in views:
        if m.placement is not None and m.placement.from_runner and m.placement.runner is not None:
            where = placement_words(m.placement)
        elif m.loaded is not None and m.loaded.size_bytes > 0:
            where = f"{w.pct(m.loaded.size_vram_bytes / m.loaded.size_bytes)} in GPU memory (Ollama's /api/ps)"
        else:
            where = "not loaded now"
        rates = "; ".join(_rates(m)) or "no rates yet"
        out.append(f"  {m.model}: {m.window_requests} request{'' if m.window_requests == 1 else 's'}; {where}; {rates}")
    if unnamed:
        n = sum(unnamed.values())
        out.append(
            f"  {w.count(len(unnamed))} other name{'' if len(unnamed) == 1 else 's'} in {w.count(n)} request"
            f"{'' if n == 1 else 's'}, not shown: names a client chose that Ollama neither lists nor served"
        )
    return out


def _client_words(inputs: list[LoadInput]) -> str:
    """Who sent the requests, counted as listed: loopback addresses by name, others counted, and the requests
    with no client address (seen only in Ollama's log) apart."""
    by_client = Counter(i.client for i in inputs)
    direct = by_client.pop(None, 0)
    loopback = sorted(c for c in by_client if c is not None and is_loopback(c))
    others = len(by_client) - len(loopback)
    named = [*loopback, *([f"{others} on other machine{'' if others == 1 else 's'}"] if others else [])]
    parts = []
    if by_client:
        n = len(by_client)
        parts.append(f"from {n} client address{'' if n == 1 else 'es'}: {', '.join(named)}")
    if direct:
        parts.append(f"{w.count(direct)} with no client address (seen only in Ollama's log)")
    return "; ".join(parts)


def _program_words(programs: queries.ProgramCounts) -> str:
    """Which programs sent them, as their User-Agents name themselves (the client's text, escaped with the report):
    the most frequent by name, the rest and those naming none counted."""
    parts = [f"{name} × {w.count(n)}" for name, n in programs.named]
    if programs.others:
        parts.append(
            f"{w.count(programs.others)} other program{'' if programs.others == 1 else 's'} × {w.count(programs.others_requests)}"
        )
    if programs.unknown_requests:
        parts.append(f"{w.count(programs.unknown_requests)} naming no program")
    return f"by program (User-Agent): {', '.join(parts)}" if parts else ""


def _request_lines(inputs: list[LoadInput], loads: list[Load], programs: queries.ProgramCounts) -> list[str]:
    who = "; ".join(words for words in (_client_words(inputs), _program_words(programs)) if words)
    out = [f"Requests: {w.count(len(inputs))} finished" + (f", {who}" if who else "")]
    by_cause = Counter(ld.cause.value.replace("_", " ") for ld in loads)
    out.append(
        f"Loads: {len(loads)}"
        + (f" ({', '.join(f'{n} {c}' for c, n in by_cause.most_common())})" if by_cause else "")
        + (f", {w.secs(sum(ld.load_s for ld in loads))} in all" if loads else "")
    )
    reloaded = [ld for ld in loads if ld.cause is not Cause.FIRST_USE]
    out.extend(f"  {_load_line(ld)}" for ld in reloaded[-MAX_LOAD_LINES:])
    return out


def _flag_lines(loads: list[Load], inputs: list[LoadInput], views: list[WhyModel], flags: dict[str, int]) -> list[str]:
    out = ["Flags seen:"]
    out.extend(f"  {c.code} × 1: {c.sentence} Fix: {c.fix}." for c in find_churn(loads))
    rejected = Counter(i.model for i in inputs if is_queue_full(i.status_code, i.error))
    if rejected:
        per = ", ".join(f"{n} for {model}" for model, n in rejected.most_common())
        out.append(
            f"  {QUEUE_FULL} × {sum(rejected.values())}: Ollama answered 503, more than OLLAMA_MAX_QUEUE requests "
            f"waited for a load ({per}). Fix: {QUEUE_FULL_FIX}."
        )
    diagnosed: Counter[DiagnosisCode] = Counter()
    for m in views:
        for g in m.diagnoses:
            diagnosed[g.code] += g.requests
    for code, n in diagnosed.most_common():
        fix = DIAGNOSIS_FIXES[code]
        out.append(f"  {code} × {n}: {CODES[code]}." + (f" Fix: {fix}." if fix else ""))
    for flag_code, n in flags.items():
        if flag_code in diagnosed:  # the diagnosis above says it in the page's words
            continue
        meaning = FLAG_CODES.get(Flag(flag_code)) if flag_code in {f.value for f in Flag} else None
        out.append(f"  {flag_code} × {n}" + (f": {meaning}." if meaning else ""))
    return out if len(out) > 1 else [*out, "  none"]


def build_report(data_dir: Path, now_unix_s: float | None = None, since_s: float = DEFAULT_SINCE_S) -> str | None:
    """The report's text; None when the folder holds no store."""
    now = time.time() if now_unix_s is None else now_unix_s
    since = now - since_s
    db = db_path(data_dir)
    with queries.open_reader(db) as conn:
        if conn is None:
            return None
        ps, snapshot_ts = queries.ps_history(conn, since)
        r = _Reads(
            queries.latest_ollama_status(conn),
            queries.request_models(conn, since),
            queries.runners(conn),
            queries.latest_loaded_models(conn),
            queries.load_inputs(conn, since),
            ps,
            snapshot_ts,
            queries.flag_counts(conn, since),
            queries.ollama_settings(conn),
            [m.name for m in queries.installed_models(conn)],
            queries.program_counts(conn, since, MAX_PROGRAMS_NAMED),
        )
    # Clients on other machines are never named: their loads read "a client on another machine".
    loads = [Load(**{**ld.__dict__, "client": _safe_client(ld.client)}) for ld in reloads(r.inputs, r.ps, r.snapshot_ts).loads]
    vouched = _vouched(r)
    named = [model for model in r.models if parse_model_name(model) in vouched]
    unnamed = Counter(i.model for i in r.inputs if parse_model_name(i.model) not in vouched)
    views = [v for model in named if (v := build_why(db, model, now, since_s)) is not None]
    when = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M")
    lines = [f"Phasewatch report: data folder {data_dir.name!r}, the last {_window_words(since_s)} to {when} UTC"]
    lines += _ollama_lines(r)
    lines += _model_lines(views, unnamed)
    lines += _request_lines(r.inputs, loads, r.programs)
    lines += _flag_lines(loads, r.inputs, views, r.flags)
    # Whatever a client, Ollama, a runner's line or a driver put in a name is written escaped: one line stays one.
    return "\n".join(printable(line) for line in lines) + "\n"
