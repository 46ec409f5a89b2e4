"""Estimated prefill progress of running generations (``ProgressSource.ESTIMATE``), written each collector tick.

Ollama says nothing while it reads a prompt. Where the runner's own readings (/slots, the log) are missing,
the Live page still draws a progress bar from this estimate: the prompt's tokens ≈ the chat template's own
tokens + its characters (counted by the proxy) × the model's measured tokens per character, read at the
model's measured prefill rate for
prompts of that length (else the expected rate from the ceilings), from the moment the model was loaded.
The page marks it "estimated".
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from analysis.accelerator import resolve_hardware
from analysis.ceilings import ceilings_for
from analysis.model_facts import ModelFactsError, model_facts_from_show
from analysis.model_names import same_model, value_for_model
from analysis.records import GpuSample, ProgressSample, ProgressSource, RequestRecord
from store import queries
from store.queries import PromptHistoryRow

# Used until a model has finished requests with a known prompt size: about 4 characters per token in English.
DEFAULT_TOKENS_PER_CHAR = 0.25
HISTORY_MAX_AGE_S = 30.0  # a model's history is read again after this long
MIN_RATE_SAMPLES = 3  # prefill rates of prompts of a similar length before their median is used
# A fit of the template's own tokens needs prompts of different sizes: the longest at least this many times the
# shortest, in characters. With one size (a first request) the template's tokens cannot be told from the text's.
MIN_FIT_SPREAD = 2.0


@dataclass(frozen=True)
class PrefillModel:
    """What the estimate knows about one model: tokens per character and prefill rates by prompt length."""

    tokens_per_char: float
    tokens_per_char_measured: bool  # False: DEFAULT_TOKENS_PER_CHAR
    rates: tuple[tuple[int, float], ...]  # (computed prompt tokens, prefill tok/s) of finished requests
    expected_tok_s: Callable[[int], float | None] = lambda _tokens: None  # from the ceilings, when known
    # Tokens a prompt has beyond its text (the chat template's role and turn markers): 0 until prompts of
    # different sizes tell them apart from the text's tokens.
    template_tokens: float = 0.0

    def prompt_tokens(self, prompt_chars: int) -> int:
        """The estimated size of a prompt of this many characters."""
        return max(1, round(self.template_tokens + prompt_chars * self.tokens_per_char))

    def prefill_tok_s(self, prompt_tokens: int) -> float | None:
        """The median measured rate of prompts within a factor of 2 of this one; else the expected rate; else
        the median of all measured rates."""
        near = [r for n, r in self.rates if prompt_tokens / 2 <= n <= prompt_tokens * 2]
        if len(near) >= MIN_RATE_SAMPLES:
            return statistics.median(near)
        expected = self.expected_tok_s(prompt_tokens)
        if expected is not None:
            return expected
        return statistics.median(r for _, r in self.rates) if self.rates else None


def prefill_model(history: Sequence[PromptHistoryRow]) -> PrefillModel:
    """A model's tokens per character (prompt tokens ÷ characters over its requests) and measured rates."""
    sized = [(h.prompt_tokens, h.prompt_chars) for h in history if h.prompt_chars and h.prompt_tokens]
    chars = sum(c for _, c in sized)
    tokens = sum(t for t, _ in sized)
    fit = size_fit(sized)
    rates = tuple(
        (h.prompt_tokens - (h.cached_tokens or 0), h.prefill_tok_s)
        for h in history
        if h.prompt_tokens is not None and h.prefill_tok_s and h.prompt_tokens - (h.cached_tokens or 0) > 0
    )
    if fit is not None:
        template_tokens, per_char = fit
        return PrefillModel(per_char, True, rates, template_tokens=template_tokens)
    if chars > 0:
        return PrefillModel(tokens / chars, True, rates)
    return PrefillModel(DEFAULT_TOKENS_PER_CHAR, False, rates)


def size_fit(sized: Sequence[tuple[int, int]]) -> tuple[float, float] | None:
    """(template tokens, tokens per character) by least squares over (tokens, characters) of finished prompts.

    A prompt's tokens are its text's plus the template's fixed few; the ratio of the sums counts those few as
    text, so after short chats it put a long document at ~10% more tokens than it had. None (use that ratio)
    where the sizes are too alike to separate the two, or the fit says something impossible: template tokens
    below 0 or as many as the shortest prompt had, or no tokens per character.
    """
    if len(sized) < 2:
        return None
    chars = [float(c) for _, c in sized]
    if max(chars) < MIN_FIT_SPREAD * min(chars):
        return None
    tokens = [float(t) for t, _ in sized]
    slope, intercept = statistics.linear_regression(chars, tokens)
    if slope <= 0 or not 0 <= intercept < min(tokens):
        return None
    return intercept, slope


def estimate(
    rec: RequestRecord, model: PrefillModel, prefill_start_unix_s: float, now_unix_s: float, n_ctx: int | None
) -> ProgressSample | None:
    """The estimated reading of one request that has no first token yet (None: no prompt size, or no rate).

    Progress stops one token short of the prompt: only the first token says that prefill ended.
    """
    if rec.prompt_chars is None or rec.first_token_ns is not None or rec.token_chunk_ns:
        return None
    prompt_tokens = model.prompt_tokens(rec.prompt_chars)
    rate = model.prefill_tok_s(prompt_tokens)
    if rate is None or rate <= 0:
        return None
    elapsed_s = max(0.0, now_unix_s - prefill_start_unix_s)
    processed = min(int(rate * elapsed_s), prompt_tokens - 1)
    return ProgressSample(
        request_id=rec.id,
        ts_unix_s=now_unix_s,
        source=ProgressSource.ESTIMATE,
        processed_tokens=max(processed, 0),
        prompt_tokens=prompt_tokens,
        n_ctx=n_ctx,
    )


@dataclass
class ProgressEstimator:
    """Keeps each model's history fresh (read from the store at most every ``HISTORY_MAX_AGE_S``) and when each
    running request's prefill could start (the first tick its model was loaded)."""

    db_path: Path
    clock: Callable[[], float] = time.time
    _models: dict[str, tuple[float, PrefillModel]] = field(default_factory=dict)
    _prefill_start: dict[str, float] = field(default_factory=dict)
    _loading: set[str] = field(default_factory=set)

    def samples(
        self, running: Iterable[RequestRecord], loaded: dict[str, int | None], gpus: Sequence[GpuSample]
    ) -> list[ProgressSample]:
        """Blocking (reads the store): call it off the event loop. ``loaded``: loaded model name → its context."""
        now = self.clock()
        out: list[ProgressSample] = []
        alive: set[str] = set()
        for rec in running:
            alive.add(rec.id)
            if rec.id not in self._prefill_start:
                if not any(same_model(rec.model, n) for n in loaded):
                    self._loading.add(rec.id)
                    continue  # the model is loading: prefill has not started
                # Loaded when it arrived: prefill starts once forwarded; loaded since: about now.
                self._prefill_start[rec.id] = now if rec.id in self._loading else rec.wall_s(rec.forwarded_ns or rec.received_ns)
            n_ctx = rec.num_ctx or value_for_model(loaded, rec.model)
            sample = estimate(rec, self._model(rec.model, rec.num_ctx, gpus), self._prefill_start[rec.id], now, n_ctx)
            if sample is not None:
                out.append(sample)
        for gone in set(self._prefill_start) - alive:
            del self._prefill_start[gone]
        self._loading &= alive
        return out

    def _model(self, name: str, num_ctx: int | None, gpus: Sequence[GpuSample]) -> PrefillModel:
        now = self.clock()
        cached = self._models.get(name)
        if cached is not None and now - cached[0] < HISTORY_MAX_AGE_S:
            return cached[1]
        with queries.open_reader(self.db_path) as conn:
            history = [] if conn is None else queries.prompt_history(conn, name)
            info = None if conn is None else queries.model_info(conn, name)
        model = prefill_model(history)
        expected = _expected_rate(info.show if info is not None else None, gpus[0] if gpus else None)
        if expected is not None:
            model = dataclasses.replace(model, expected_tok_s=expected)
        if model.rates or expected is not None:
            # Kept a while; a model with nothing measured yet is read again next tick, so the first request that
            # finishes (often the one that loaded it) gives the next prompt its estimate at once.
            self._models[name] = (now, model)
        return model


def _expected_rate(show: dict[str, object] | None, gpu: GpuSample | None) -> Callable[[int], float | None] | None:
    """The ceilings' expected prefill rate for a prompt length, on this GPU, for this model (None: unknown)."""
    if show is None or gpu is None:
        return None
    hw = resolve_hardware(gpu)
    if hw.spec is None:
        return None
    try:
        facts = model_facts_from_show(show, None)
    except ModelFactsError:
        return None
    spec, bw = hw.spec, hw.bandwidth_bytes_s

    def rate(prompt_tokens: int) -> float | None:
        c = ceilings_for(spec, facts, context_tokens=prompt_tokens, prompt_tokens=prompt_tokens, bandwidth_bytes_s=bw)
        return c.prefill_expected_tok_s

    return rate
