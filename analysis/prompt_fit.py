"""Prompts that did not fit the context, and where the context (num_ctx) came from (docs/ollama-api.md §12).

Ollama cuts a prompt longer than the context and answers 200 OK; its log says so in one line (its runner,
``llm/llama_server.go``), and the reply's ``prompt_eval_count`` is then the cut length::

    time=… level=WARN source=llama_server.go:314 msg="truncating input prompt" limit=1027 prompt=6000 keep=5 new=1027

A model whose runner cannot shift its context answers 400 instead ("the prompt is longer than the context
length …"). At start Ollama logs the settings it runs with::

    time=… level=INFO source=routes.go:1741 msg="server config" env="map[OLLAMA_CONTEXT_LENGTH:0 OLLAMA_NUM_PARALLEL:1 …]"
    time=… level=INFO source=types.go:42 msg="inference compute" id=GPU-… library=CUDA name=CUDA0 total="24.0 GiB" …
    time=… level=INFO source=routes.go:1914 msg="vram-based default context" total_vram="24.0 GiB" default_num_ctx=32768

Pure: the line parsers (each line split by ``analysis.log_grammar``, then its message, level and attributes in
their exact form; a line longer than ``MAX_LINE_CHARS`` is not one of these),
the cut Ollama makes, the context's source for one request, and the sentences the pages show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from analysis.log_grammar import MAX_LINE_CHARS, SlogLine, slog_line, slog_time_unix_s
from analysis.records import RequestRecord

MAX_ENV_VARS = 128
NUM_KEEP_DEFAULT = 4  # api.DefaultOptions().NumKeep
# The 400 a runner that cannot shift answers; the older Go runner's text for the same refusal.
TOO_LONG_TEXTS = ("prompt is longer than the context length", "input length exceeds the context length")
TOO_LONG_MESSAGE = (
    "the prompt is longer than the context length currently available to the model; shorten the prompt, adjust "
    "the context length in settings, or use a model with a longer context length"
)
# Without Ollama's line the prompt's size is estimated from its characters (English text: about 4 per token).
CHARS_PER_TOKEN_ESTIMATE = 4.0
ESTIMATE_MARGIN = 1.25  # an estimate must exceed the context by this much before it says "cut"
SIGNATURE_SLACK_TOKENS = 8  # prompt_eval_count this close to the cut length: the reply's signature of a cut

_COUNT = re.compile(r"[0-9]{1,9}")
_VRAM = re.compile(r"[0-9.]{1,12} ?[KMGT]?i?B")
_ENV_MAP = re.compile(r"map\[(?P<env>.{0,7000})\]")
_ENV_KEY = re.compile(r"(?:^| )(?P<key>[A-Z][A-Z0-9_]{0,63}):")
_TRUNCATING_KEYS = ("limit", "prompt", "keep", "new")
_COMPUTE_ATTR = re.compile(r"[a-z_]{1,32}")


class LineKind(StrEnum):
    TRUNCATED = "truncated"
    SERVER_CONFIG = "server_config"
    COMPUTE = "inference_compute"
    VRAM_DEFAULT = "vram_default"


@dataclass(frozen=True)
class FitLine:
    """One of Ollama's lines this module reads: a cut prompt, or a start line with the settings in force."""

    kind: LineKind
    limit: int | None = None  # truncated: the cut length, prompt: the tokens sent, keep: kept from the start, new: kept
    prompt: int | None = None
    keep: int | None = None
    new: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # server_config: OLLAMA_* as Ollama read them
    attrs: Mapping[str, str] = field(default_factory=dict)  # inference_compute: library, name, description, total, …
    default_num_ctx: int | None = None  # vram_default
    total_vram: str | None = None  # vram_default, as printed ("24.0 GiB")
    logged_unix_s: float | None = None  # the line's own time (Ollama's slog stamp)


def parse_env_map(text: str) -> dict[str, str]:
    """Go's ``fmt`` of a map[string]any: ``KEY:value KEY2:[a b] KEY3:`` (a value may hold spaces, as OLLAMA_ORIGINS)."""
    keys = list(_ENV_KEY.finditer(text))[:MAX_ENV_VARS]
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(text)
        out[m.group("key")] = text[m.end() : end].strip()[:512]
    return out


def parse_fit_line(line: str) -> FitLine | None:
    """The fact one log line carries, or None for any other line (cheap for the common case)."""
    if len(line) > MAX_LINE_CHARS or "msg=" not in line:
        return None
    slog = slog_line(line)
    return fit_of(slog) if slog is not None else None


def fit_of(slog: SlogLine) -> FitLine | None:
    """The fact one of Ollama's own lines, already split (``analysis.log_grammar``), carries: each in its exact form
    (its message, level and attributes, in Ollama's order); None for any other."""
    a = slog.attrs
    if slog.msg == "truncating input prompt":
        if slog.level != "WARN" or slog.keys != _TRUNCATING_KEYS or not all(_COUNT.fullmatch(v) for v in a.values()):
            return None
        limit, prompt, keep, new = (int(a[k]) for k in _TRUNCATING_KEYS)
        return FitLine(LineKind.TRUNCATED, limit=limit, prompt=prompt, keep=keep, new=new)
    if slog.level != "INFO":
        return None
    if slog.msg == "server config":
        m = _ENV_MAP.fullmatch(a.get("env", "")) if slog.keys == ("env",) else None
        if m is None:
            return None
        return FitLine(LineKind.SERVER_CONFIG, env=parse_env_map(m.group("env")), logged_unix_s=slog_time_unix_s(slog))
    if slog.msg == "vram-based default context":
        if slog.keys != ("total_vram", "default_num_ctx"):
            return None
        if not _VRAM.fullmatch(a["total_vram"]) or not _COUNT.fullmatch(a["default_num_ctx"]):
            return None
        return FitLine(LineKind.VRAM_DEFAULT, default_num_ctx=int(a["default_num_ctx"]), total_vram=a["total_vram"])
    if slog.msg == "inference compute":
        if not all(_COMPUTE_ATTR.fullmatch(k) for k in a):
            return None
        return FitLine(LineKind.COMPUTE, attrs={k: v[:256] for k, v in a.items()})
    return None


def is_too_long_error(text: str | None) -> bool:
    """A 400's body that says the prompt did not fit (a runner that cannot shift its context)."""
    return text is not None and any(t in text[:2000] for t in TOO_LONG_TEXTS)


# ---------------------------------------------------------------- the cut Ollama makes


def truncation_limit(num_ctx: int, num_keep: int = NUM_KEEP_DEFAULT, *, adds_bos: bool = True) -> int:
    """How many tokens Ollama keeps of a prompt longer than ``num_ctx`` - 1: ``num_keep`` (+ BOS) from the start,
    then the end, leaving about half the context free for the reply (``contextShiftPromptLimit``)."""
    if num_ctx <= 1:
        return 0
    keep = max(0, min(num_keep + (1 if adds_bos else 0), num_ctx - 1))
    return num_ctx - max((num_ctx - keep) // 2, 1)


def is_cut_for(line: FitLine, num_ctx: int | None, kept_tokens: int | None) -> bool:
    """Whether a ``truncating input prompt`` line is Ollama's own cut of a prompt that ran at ``num_ctx`` and was kept
    at ``kept_tokens`` (the reply's prompt_eval_count): the prompt longer than the context, the kept count the cut
    length for that context and the line's keep, and the reply's count. Anyone can have such a line printed into the
    log; one whose numbers are not Ollama's cut of this request is not about it."""
    if num_ctx is None or num_ctx <= 1 or kept_tokens is None or None in (line.limit, line.prompt, line.keep, line.new):
        return False
    assert line.limit is not None and line.prompt is not None and line.keep is not None
    if line.new != kept_tokens or line.new != line.limit or line.prompt <= num_ctx - 1 or line.keep >= num_ctx:
        return False
    return line.limit == num_ctx - max((num_ctx - line.keep) // 2, 1)


def truncate(
    ids: list[int], num_ctx: int, num_keep: int = NUM_KEEP_DEFAULT, *, adds_bos: bool = True
) -> tuple[list[int], FitLine | None]:
    """The prompt Ollama sends its runner, and the line it logs when it cut it (None when it fits)."""
    if num_ctx <= 1 or len(ids) <= num_ctx - 1:
        return ids, None
    keep = max(0, min(num_keep + (1 if adds_bos else 0), num_ctx - 1))
    limit = truncation_limit(num_ctx, num_keep, adds_bos=adds_bos)
    discard = len(ids) - limit
    kept = ids[:keep] + ids[keep + discard :]
    return kept, FitLine(LineKind.TRUNCATED, limit=limit, prompt=len(ids), keep=keep, new=len(kept))


def truncation_message(line: FitLine) -> str:
    """The WARN line's attributes as Ollama logs them (sim writes them with ``sim.ollama_log.slog``)."""
    return f"limit={line.limit} prompt={line.prompt} keep={line.keep} new={line.new}"


# ---------------------------------------------------------------- where num_ctx came from


class CtxSource(StrEnum):
    """Where the context a request ran with was set (stored as ``requests.num_ctx_source``)."""

    REQUEST = "request"  # the request's options.num_ctx (native routes only)
    ENV = "env"  # OLLAMA_CONTEXT_LENGTH (the desktop app's context slider sets it)
    VRAM_DEFAULT = "vram_default"  # Ollama's default from the GPU's memory, read from its start line
    LOADED = "loaded"  # /api/ps's context_length: how it was chosen was not read
    RUNNER = "runner"  # the runner's own figures (a direct request: n_ctx_slot)


CTX_SOURCE_WORDS: dict[str, str] = {
    CtxSource.REQUEST: "set by the request's options.num_ctx",
    CtxSource.ENV: "set by OLLAMA_CONTEXT_LENGTH (the desktop app's context slider sets it)",
    CtxSource.VRAM_DEFAULT: "Ollama's default for this GPU's memory (vram-based default context)",
    CtxSource.LOADED: "as the loaded model reports it in /api/ps; Ollama's log was not read to say who set it",
    CtxSource.RUNNER: "as the runner reports it",
}


@dataclass(frozen=True)
class ServerSettings:
    """What Ollama's start lines said: its environment as it read it, its GPUs, its default context."""

    env: Mapping[str, str] = field(default_factory=dict)
    vram_default_num_ctx: int | None = None
    total_vram: str | None = None
    compute: tuple[Mapping[str, str], ...] = ()
    read_unix_s: float | None = None

    @property
    def env_context_length(self) -> int | None:
        """OLLAMA_CONTEXT_LENGTH when set (0 or empty: unset, the VRAM-based default holds)."""
        value = self.env.get("OLLAMA_CONTEXT_LENGTH", "")
        return int(value) if value.isdigit() and int(value) > 0 else None

    def fold(self, line: FitLine, read_unix_s: float) -> ServerSettings:
        """These settings with one more start line; a server config line starts a new set (Ollama restarted)."""
        if line.kind is LineKind.SERVER_CONFIG:
            return ServerSettings(env=dict(line.env), read_unix_s=read_unix_s)
        if line.kind is LineKind.VRAM_DEFAULT:
            return ServerSettings(self.env, line.default_num_ctx, line.total_vram, self.compute, read_unix_s)
        if line.kind is LineKind.COMPUTE:
            compute = (*self.compute, dict(line.attrs))[:16]
            return ServerSettings(self.env, self.vram_default_num_ctx, self.total_vram, compute, read_unix_s)
        return self


def is_openai_route(endpoint: str | None) -> bool:
    return bool(endpoint) and str(endpoint).startswith("/v1/")


def num_ctx_in_force(
    endpoint: str | None, requested: int | None, loaded_ctx: int | None, settings: ServerSettings | None
) -> tuple[int | None, CtxSource | None]:
    """The context a request ran with and who set it. Ollama loads (or reloads) the model with the request's own
    options.num_ctx on a native route, else OLLAMA_CONTEXT_LENGTH, else its VRAM-based default; /api/ps's figure
    (which may still be the previous load's when the request reloaded) only where none of those is known."""
    if requested is not None and requested > 0 and not is_openai_route(endpoint):  # /v1 drops options
        return requested, CtxSource.REQUEST
    if settings is not None and settings.env_context_length is not None:
        return settings.env_context_length, CtxSource.ENV
    if settings is not None and settings.vram_default_num_ctx:
        return settings.vram_default_num_ctx, CtxSource.VRAM_DEFAULT
    if loaded_ctx is not None and loaded_ctx > 0:
        return loaded_ctx, CtxSource.LOADED
    return None, None


def suggested_num_ctx(prompt_tokens: int) -> int:
    """A context that holds the prompt and room for a reply: the next power of two above 1.25 × the prompt."""
    need = max(int(prompt_tokens * 1.25), 2048)
    return 1 << (need - 1).bit_length()


def fix_for(endpoint: str | None, source: str | None, prompt_tokens: int | None) -> str:
    """The setting that fixes it for that route and client."""
    n = f"{suggested_num_ctx(prompt_tokens):,}" if prompt_tokens else "a larger value"
    env = f"set OLLAMA_CONTEXT_LENGTH={n.replace(',', '')} for the server (the desktop app's context slider)"
    if is_openai_route(endpoint):
        return (
            f"Fix: /v1 routes ignore options.num_ctx, so {env}, or create a model with PARAMETER num_ctx "
            f"{n.replace(',', '')} and use that name"
        )
    if endpoint is None:  # a direct request: the route is not known
        return f"Fix: send options.num_ctx of {n} with the request (native /api routes), or {env}"
    if source == CtxSource.REQUEST:
        return f"Fix: raise options.num_ctx to {n} in this client's requests"
    return f"Fix: send options.num_ctx of {n} with this client's requests, or {env}"


# ---------------------------------------------------------------- one request's verdict


def cut_sentence(sent: int | None, kept: int | None, num_ctx: int | None, source: str | None, *, refused: bool = False) -> str:
    """The short form the Live card shows: "your N-token prompt was cut to M tokens: num_ctx is K (set by …)"."""
    size = f"your {sent:,}-token prompt" if sent else "your prompt"
    what = "was refused (400): longer than the context" if refused else f"was cut to {kept:,} tokens" if kept else "was cut"
    ctx = (
        f"num_ctx is {num_ctx:,} ({CTX_SOURCE_WORDS.get(source or '', 'its origin not known')})"
        if num_ctx
        else "num_ctx is not known"
    )
    return f"{size} {what}: {ctx}"


@dataclass(frozen=True)
class FitVerdict:
    truncated: str | None = None  # the prompt_truncated sentence, None when the prompt fit (or it is not known)
    ignored: str | None = None  # the num_ctx_ignored note, None unless a /v1 request carried options.num_ctx


def _sent_words(rec: RequestRecord) -> tuple[int | None, str]:
    sent, source = rec.prompt_sent_tokens, rec.prompt_sent_source
    if sent is None and rec.prompt_chars:
        return round(rec.prompt_chars / CHARS_PER_TOKEN_ESTIMATE), "estimated from its characters"
    words = {"log": "Ollama's log", "tokenize": "counted by the runner's /tokenize", "estimate": "estimated from its characters"}
    return sent, words.get(source or "", "")


def _ctx_words(rec: RequestRecord) -> str:
    if rec.num_ctx_in_force is None:
        return "num_ctx is not known"
    return f"num_ctx is {rec.num_ctx_in_force:,} ({CTX_SOURCE_WORDS.get(rec.num_ctx_source or '', 'its origin not known')})"


def verdict(rec: RequestRecord) -> FitVerdict:
    """Whether the prompt was cut (or refused for its length), in a sentence with its numbers and the fix."""
    ignored = None
    if is_openai_route(rec.endpoint) and not rec.direct and rec.num_ctx is not None:
        ignored = f"the request carried options.num_ctx {rec.num_ctx:,}, which Ollama ignores on /v1 routes: " + (
            _ctx_words(rec) if rec.num_ctx_in_force is not None else "the model ran with the server's context"
        )
    return FitVerdict(_truncated(rec), ignored)


def _truncated(rec: RequestRecord) -> str | None:
    sent, how = _sent_words(rec)
    fix = fix_for(rec.endpoint, rec.num_ctx_source, sent)
    if rec.status_code == 400 and is_too_long_error(rec.error):
        size = f"your {sent:,}-token prompt ({how})" if sent else "your prompt"
        refused = "is longer than the context and this model cannot shift it: Ollama refused it (400)"
        return f"{size} {refused}; {_ctx_words(rec)}. {fix}"
    kept = rec.prompt_kept_tokens
    if kept is None and rec.metrics is not None:
        kept = rec.metrics.prompt_eval_count
    if sent is None or kept is None or kept >= sent:
        return None
    if rec.prompt_sent_source != "log":  # no line from Ollama: the reply's signature, the context known
        ctx = rec.num_ctx_in_force
        if ctx is None or kept > ctx:
            return None
        at_cut = abs(kept - truncation_limit(ctx)) <= SIGNATURE_SLACK_TOKENS or kept >= ctx - SIGNATURE_SLACK_TOKENS
        margin = ESTIMATE_MARGIN if rec.prompt_sent_source != "tokenize" else 1.0
        if not at_cut or sent < ctx * margin:
            return None
    return f"your {sent:,}-token prompt ({how}) was cut to {kept:,} tokens: {_ctx_words(rec)}. {fix}"
