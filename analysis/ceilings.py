"""Ceilings and expected rates for one GPU and one model (docs/physics.md §2, §3 and §5).

decode ceiling  = bandwidth ÷ (W + KV(c)), bandwidth blended between GPU and
                  system memory by size_vram ÷ size when the model is partly offloaded
prefill ceiling = compute ÷ (2N + 2·L·d·P)
expected        = η × ceiling, η from docs/physics.md §5 until the user's own history
                  calibrates it (:func:`calibrate`); decode through a serving runner adds a fixed
                  cost per token: 1 ÷ expected = bytes ÷ (η × bandwidth) + t_fixed (§5).
Pure functions; SI units throughout.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from analysis import roofline
from analysis.hardware import BY_KEY, HardwareSpec
from analysis.model_facts import ModelFacts
from analysis.quantization import is_high_precision

# llama.cpp's default micro-batch: prefill reads the weights once per this many prompt tokens.
DEFAULT_UBATCH_TOKENS = 512
# Used for the offloaded part when the host's bandwidth was never measured.
FALLBACK_HOST_BANDWIDTH_BYTES_S = BY_KEY["cpu"].bandwidth_bytes_s
# A calibration needs this many measurements of a kind before it replaces the starting η.
MIN_CALIBRATION_SAMPLES = 5
# Measured/ceiling above this is not physical (prompt-cache hits, clock error): never calibrate on it.
MAX_PLAUSIBLE_FRACTION = 1.05

STARTING_SOURCE = "docs/physics.md §5 starting value"
# docs/physics.md §5: what a serving runner spends per output token beside reading the bytes (kernel launches and
# synchronisation per layer, the output head, sampling on the CPU), per layer of the model. Measured on an H200.
DECODE_FIXED_S_PER_LAYER = 100e-6
FIXED_STARTING_SOURCE = "docs/physics.md §5 starting value"
# Fitting bytes ÷ (η·BW) + t_fixed needs readings whose bytes per token differ by at least this factor.
FIXED_FIT_MIN_SPREAD = 1.3


@dataclass(frozen=True)
class Efficiencies:
    """Fraction of each ceiling that this hardware reaches in practice."""

    eta_bw: float  # decode
    eta_compute: float  # prefill
    source_bw: str = STARTING_SOURCE
    source_compute: str = STARTING_SOURCE
    decode_samples: int = 0  # measurements behind eta_bw when calibrated
    prefill_samples: int = 0
    # Decode's fixed cost per output token beside the bytes read (docs/physics.md §5); 0 for llama-bench's tg,
    # which runs decode steps back to back without sampling (the published rows of §3).
    fixed_s_per_token: float = 0.0
    source_fixed: str = ""

    def decode_expected_tok_s(self, ceiling_tok_s: float) -> float:
        """Expected decode rate at a bandwidth ceiling: 1 ÷ (1 ÷ (η × ceiling) + t_fixed)."""
        if not ceiling_tok_s > 0:
            return 0.0
        return 1.0 / (1.0 / (self.eta_bw * ceiling_tok_s) + self.fixed_s_per_token)

    def serving(self, layers: int) -> Efficiencies:
        """These with a serving runner's starting fixed cost per token (docs/physics.md §5), unless one is set."""
        if self.fixed_s_per_token > 0 or layers <= 0:
            return self
        return replace(self, fixed_s_per_token=DECODE_FIXED_S_PER_LAYER * layers, source_fixed=FIXED_STARTING_SOURCE)


def starting_efficiencies(spec: HardwareSpec | None, quantization: str | None) -> Efficiencies:
    """docs/physics.md §5 values: NVIDIA 0.70 quantized / 0.82 F16·Q8, Apple Max/Ultra 0.5 on 4-bit, η_c 0.45 / 0.7."""
    if spec is None:
        # Unknown hardware given as raw numbers: the NVIDIA values are the middle of the literature.
        return Efficiencies(0.82 if is_high_precision(quantization) else 0.70, 0.45)
    eta_bw = spec.eta_bw_f16 if is_high_precision(quantization) else spec.eta_bw_quant
    return Efficiencies(eta_bw, spec.eta_compute)


@dataclass(frozen=True)
class Ceilings:
    gpu_bandwidth_bytes_s: float
    host_bandwidth_bytes_s: float | None  # only when partly offloaded
    vram_fraction: float  # size_vram ÷ size; 1.0 = all on the GPU
    bandwidth_bytes_s: float  # effective, after blending
    peak_flops: float
    weights_bytes: float
    kv_bytes_per_tok: float
    context_tokens: int
    prompt_tokens: int
    decode_bytes_per_token: float
    decode_ceiling_tok_s: float
    decode_expected_tok_s: float
    full_gpu_decode_ceiling_tok_s: float  # same model entirely in VRAM
    prefill_flops_per_token: float
    prefill_ceiling_tok_s: float
    prefill_expected_tok_s: float
    ridge_point_flop_per_byte: float  # peak_flops ÷ bandwidth: above it work is compute-bound
    decode_intensity_flop_per_byte: float  # batch-1 decode FLOPs ÷ bytes read
    prefill_intensity_flop_per_byte: float  # one micro-batch of prompt FLOPs ÷ bytes read
    efficiencies: Efficiencies
    decode_flops_per_token: float = 0.0  # 2N + 4·L·c·d at this context
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS

    def batched_decode_tok_s(self, streams: int) -> tuple[float, float]:
        """(aggregate, per-stream) expected decode rate with ``streams`` sequences per step (docs/physics.md §7).

        One step reads the weights once for all streams plus each stream's KV cache, and does
        each stream's arithmetic: T(B) = max((W + B·KV(c)) ÷ (η·BW), B·FLOPs ÷ (η_c·F)).
        """
        b = max(streams, 1)
        kv = self.kv_bytes_per_tok * self.context_tokens
        t_mem = (self.weights_bytes + b * kv) / (self.efficiencies.eta_bw * self.bandwidth_bytes_s)
        t_compute = b * self.decode_flops_per_token / (self.efficiencies.eta_compute * self.peak_flops)
        step_s = max(t_mem, t_compute) + self.efficiencies.fixed_s_per_token
        return b / step_s, 1.0 / step_s

    @property
    def expected_ratio(self) -> float:
        """How many times faster prefill is expected to run than decode."""
        return self.prefill_expected_tok_s / self.decode_expected_tok_s

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compute_ceilings(
    *,
    bandwidth_bytes_s: float,
    peak_flops: float,
    weights_bytes: float,
    params: float,
    layers: int,
    hidden: int,
    kv_bytes_per_tok: float,
    context_tokens: int,
    prompt_tokens: int,
    efficiencies: Efficiencies,
    vram_fraction: float = 1.0,
    host_bandwidth_bytes_s: float | None = None,
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS,
) -> Ceilings:
    """Every ceiling from raw numbers (the command line's entry point).

    ``context_tokens`` is the context a decode step attends over (prompt + tokens so far);
    ``prompt_tokens`` the prompt evaluated in prefill. Raises ValueError on non-positive inputs.
    """
    for label, v in (
        ("bandwidth_bytes_s", bandwidth_bytes_s),
        ("peak_flops", peak_flops),
        ("weights_bytes", weights_bytes),
        ("params", params),
        ("layers", layers),
        ("hidden", hidden),
    ):
        if not v > 0:
            raise ValueError(f"{label} must be positive, got {v!r}")
    if kv_bytes_per_tok < 0 or context_tokens < 0 or prompt_tokens < 0:
        raise ValueError("kv_bytes_per_tok, context_tokens and prompt_tokens must not be negative")
    f = min(max(vram_fraction, 0.0), 1.0)
    host = None
    bw = bandwidth_bytes_s
    if f < 1.0:
        host = (
            host_bandwidth_bytes_s if host_bandwidth_bytes_s and host_bandwidth_bytes_s > 0 else FALLBACK_HOST_BANDWIDTH_BYTES_S
        )
        bw = roofline.blended_bandwidth_bytes_s(bandwidth_bytes_s, host, f)
    decode_bytes = roofline.decode_bytes_per_token(weights_bytes, kv_bytes_per_tok, context_tokens)
    decode_ceiling = bw / decode_bytes
    full_gpu = bandwidth_bytes_s / decode_bytes
    # Prefill stays on the GPU's compute: llama.cpp ships offloaded weights to the GPU for large batches.
    pp_flops = roofline.prefill_flops_per_token(params, layers, hidden, prompt_tokens)
    pp_compute_ceiling = peak_flops / pp_flops
    # A short prompt cannot amortise the weight read: below a few dozen tokens prefill is memory-bound too.
    pp_memory_ceiling = roofline.prefill_memory_ceiling_tok_s(bw, weights_bytes, prompt_tokens, ubatch_tokens)
    pp_ceiling = min(pp_compute_ceiling, pp_memory_ceiling)
    pp_expected = min(efficiencies.eta_compute * pp_compute_ceiling, efficiencies.eta_bw * pp_memory_ceiling)
    dec_flops = roofline.decode_flops_per_token(params, layers, hidden, context_tokens)
    ub = max(1, min(prompt_tokens, ubatch_tokens)) if prompt_tokens > 0 else ubatch_tokens
    prefill_bytes = weights_bytes + kv_bytes_per_tok * ub
    return Ceilings(
        gpu_bandwidth_bytes_s=bandwidth_bytes_s,
        host_bandwidth_bytes_s=host,
        vram_fraction=f,
        bandwidth_bytes_s=bw,
        peak_flops=peak_flops,
        weights_bytes=weights_bytes,
        kv_bytes_per_tok=kv_bytes_per_tok,
        context_tokens=context_tokens,
        prompt_tokens=prompt_tokens,
        decode_bytes_per_token=decode_bytes,
        decode_ceiling_tok_s=decode_ceiling,
        decode_expected_tok_s=efficiencies.decode_expected_tok_s(decode_ceiling),
        full_gpu_decode_ceiling_tok_s=full_gpu,
        prefill_flops_per_token=pp_flops,
        prefill_ceiling_tok_s=pp_ceiling,
        prefill_expected_tok_s=pp_expected,
        # At the effective bandwidth: with part of the model in system memory, the ridge moves up with it.
        ridge_point_flop_per_byte=roofline.ridge_point_flop_per_byte(peak_flops, bw),
        decode_intensity_flop_per_byte=dec_flops / decode_bytes,
        prefill_intensity_flop_per_byte=pp_flops * ub / prefill_bytes,
        efficiencies=efficiencies,
        decode_flops_per_token=dec_flops,
        ubatch_tokens=ubatch_tokens,
    )


def ceilings_for(
    spec: HardwareSpec,
    facts: ModelFacts,
    *,
    context_tokens: int,
    prompt_tokens: int,
    vram_fraction: float = 1.0,
    host_bandwidth_bytes_s: float | None = None,
    efficiencies: Efficiencies | None = None,
    bandwidth_bytes_s: float | None = None,
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS,
) -> Ceilings:
    """Ceilings for a table GPU and a model from ``/api/show``.

    ``bandwidth_bytes_s`` overrides the table (e.g. :func:`analysis.hardware.choose_bandwidth`'s pick);
    ``vram_fraction`` is ``size_vram ÷ size`` from ``/api/ps``; ``ubatch_tokens`` the loaded model's
    micro-batch (:func:`ollama_num_batch`).
    """
    return compute_ceilings(
        bandwidth_bytes_s=bandwidth_bytes_s or spec.bandwidth_bytes_s,
        peak_flops=spec.fp16_flops,
        weights_bytes=facts.weights_bytes,
        params=facts.params,
        layers=facts.layers,
        hidden=facts.hidden,
        kv_bytes_per_tok=facts.kv_bytes_per_token,
        context_tokens=context_tokens,
        prompt_tokens=prompt_tokens,
        efficiencies=efficiencies or starting_efficiencies(spec, facts.quantization),
        vram_fraction=vram_fraction,
        host_bandwidth_bytes_s=host_bandwidth_bytes_s,
        ubatch_tokens=ubatch_tokens,
    )


@dataclass(frozen=True)
class CeilingModel:
    """The one ceiling model of a GPU and a model: every sentence, metric, chart and diagnosis asks it.

    ``at(prompt, context)`` gives the ceilings for a prompt of ``prompt`` tokens and a decode step
    over ``context`` tokens; the curves are the same function over a range of lengths.
    """

    spec: HardwareSpec
    facts: ModelFacts
    efficiencies: Efficiencies
    vram_fraction: float = 1.0
    host_bandwidth_bytes_s: float | None = None
    bandwidth_bytes_s: float | None = None
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS

    def at(self, prompt_tokens: int, context_tokens: int) -> Ceilings:
        return _model_at(self, max(int(prompt_tokens), 0), max(int(context_tokens), 0))

    def with_efficiencies(self, eff: Efficiencies) -> CeilingModel:
        return replace(self, efficiencies=eff)

    def prefill_curve(self, prompt_tokens: Iterable[int]) -> list[CurvePoint]:
        return [CurvePoint(p, (c := self.at(p, p)).prefill_ceiling_tok_s, c.prefill_expected_tok_s) for p in prompt_tokens]

    def decode_curve(self, context_tokens: Iterable[int], *, all_in_vram: bool = False) -> list[CurvePoint]:
        m = replace(self, vram_fraction=1.0) if all_in_vram else self
        return [CurvePoint(n, (c := m.at(0, n)).decode_ceiling_tok_s, c.decode_expected_tok_s) for n in context_tokens]


@functools.lru_cache(maxsize=8192)
def _model_at(m: CeilingModel, prompt_tokens: int, context_tokens: int) -> Ceilings:
    # Cached: a page asks for the same lengths again and again (one reading per request, then the lines).
    return ceilings_for(
        m.spec,
        m.facts,
        context_tokens=context_tokens,
        prompt_tokens=prompt_tokens,
        vram_fraction=m.vram_fraction,
        host_bandwidth_bytes_s=m.host_bandwidth_bytes_s,
        efficiencies=m.efficiencies,
        bandwidth_bytes_s=m.bandwidth_bytes_s,
        ubatch_tokens=m.ubatch_tokens,
    )


def ollama_num_batch(num_ctx: int | None) -> int:
    """The micro-batch Ollama passes its runner for a model loaded with ``num_ctx`` of context (docs/ollama-api.md §7).

    512, 1024 above 4K of context, 2048 above 32K; 512 (llama.cpp's default) when the context is unknown.
    """
    if num_ctx is None or num_ctx <= 4096:
        return DEFAULT_UBATCH_TOKENS
    return 1024 if num_ctx <= 32768 else 2048


def vram_fraction(size_bytes: int | float | None, size_vram_bytes: int | float | None) -> float:
    """size_vram ÷ size from /api/ps, clamped to [0, 1]; 1.0 when unknown."""
    if not size_bytes or size_vram_bytes is None or size_bytes <= 0:
        return 1.0
    return min(max(size_vram_bytes / size_bytes, 0.0), 1.0)


# ---------------------------------------------------------------------------------------------
# Measured against ceiling


@dataclass(frozen=True)
class RateVerdict:
    measured_tok_s: float
    ceiling_tok_s: float
    expected_tok_s: float
    fraction_of_ceiling: float
    fraction_of_expected: float
    above_ceiling: bool  # a reading that cannot be true: flag it, never hide it


def judge_rate(measured_tok_s: float, ceiling_tok_s: float, expected_tok_s: float) -> RateVerdict:
    """A measured rate set against its ceiling and the expected rate."""
    if not ceiling_tok_s > 0 or not expected_tok_s > 0:
        raise ValueError("ceiling and expected rates must be positive")
    frac = measured_tok_s / ceiling_tok_s
    return RateVerdict(measured_tok_s, ceiling_tok_s, expected_tok_s, frac, measured_tok_s / expected_tok_s, frac > 1.0)


def judge_decode(measured_tok_s: float, c: Ceilings, tokens_per_step: float = 1.0) -> RateVerdict:
    """Decode against its ceiling; with speculative decoding each weight read yields ``tokens_per_step`` tokens
    (``analysis.speculative``), so the ceiling and the expected rate are that many times the one-token ones (the
    draft's own time is left out: the expected rate is then a best case)."""
    return judge_rate(
        measured_tok_s,
        roofline.speculative_decode_ceiling_tok_s(c.decode_ceiling_tok_s, tokens_per_step),
        roofline.speculative_decode_ceiling_tok_s(c.decode_expected_tok_s, tokens_per_step),
    )


def judge_prefill(measured_tok_s: float, c: Ceilings) -> RateVerdict:
    return judge_rate(measured_tok_s, c.prefill_ceiling_tok_s, c.prefill_expected_tok_s)


# ---------------------------------------------------------------------------------------------
# Calibration from the user's own history


@dataclass(frozen=True)
class CalibrationPoint:
    """One measured rate and the ceiling it had (same GPU, same model or quantization class)."""

    kind: Literal["decode", "prefill"]
    measured_tok_s: float
    ceiling_tok_s: float


def calibrate(
    history: Iterable[CalibrationPoint],
    start: Efficiencies,
    min_samples: int = MIN_CALIBRATION_SAMPLES,
) -> Efficiencies:
    """Replace each starting η by the median measured/ceiling once there are ``min_samples`` of that kind.

    Ratios above the ceiling (impossible readings: prompt-cache hits, clock errors) and
    non-positive ones are left out. A kind with too few points keeps its starting value.
    """
    ratios: dict[str, list[float]] = {"decode": [], "prefill": []}
    decoded: list[CalibrationPoint] = []
    for p in history:
        if p.ceiling_tok_s > 0 and p.measured_tok_s > 0:
            r = p.measured_tok_s / p.ceiling_tok_s
            if r <= MAX_PLAUSIBLE_FRACTION:
                ratios[p.kind].append(r)
                if p.kind == "decode":
                    decoded.append(p)
    out = start
    dec, pre = ratios["decode"], ratios["prefill"]
    if len(dec) >= min_samples and start.fixed_s_per_token > 0:
        out = _fit_decode(decoded, start)
    elif len(dec) >= min_samples:
        out = replace(
            out, eta_bw=statistics.median(dec), source_bw=f"median of {len(dec)} of your requests", decode_samples=len(dec)
        )
    if len(pre) >= min_samples:
        out = replace(
            out,
            eta_compute=statistics.median(pre),
            source_compute=f"median of {len(pre)} of your requests",
            prefill_samples=len(pre),
        )
    return out


def _fit_decode(points: list[CalibrationPoint], start: Efficiencies) -> Efficiencies:
    """η and the fixed cost per token from the user's decode readings (docs/physics.md §5).

    Each reading's time per token is 1 ÷ measured; its bytes ÷ bandwidth is 1 ÷ ceiling. A least-squares line through
    (1 ÷ ceiling, 1 ÷ measured) has slope 1 ÷ η and intercept t_fixed, when the readings' bytes per token differ
    enough to tell them apart and the line is physical (0 < η ≤ 1.05, t_fixed ≥ 0). Otherwise η keeps its starting
    value and t_fixed is the median of what the readings leave over; where that is negative (readings faster than
    the starting η allows) t_fixed is 0 and η the median measured ÷ ceiling, as without a fixed cost.
    """
    n = len(points)
    xs = [1.0 / p.ceiling_tok_s for p in points]
    ys = [1.0 / p.measured_tok_s for p in points]
    source = f"fitted to {n} of your requests"
    if max(xs) >= FIXED_FIT_MIN_SPREAD * min(xs):
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        intercept = my - slope * mx
        if slope > 0 and 1.0 / slope <= MAX_PLAUSIBLE_FRACTION and intercept >= 0:
            return replace(
                start, eta_bw=1.0 / slope, fixed_s_per_token=intercept, source_bw=source, source_fixed=source, decode_samples=n
            )
    left = statistics.median(y - x / start.eta_bw for x, y in zip(xs, ys, strict=True))
    if left >= 0:
        return replace(start, fixed_s_per_token=left, source_fixed=f"median of {n} of your requests", decode_samples=n)
    ratios = [p.measured_tok_s / p.ceiling_tok_s for p in points]
    return replace(
        start,
        eta_bw=statistics.median(ratios),
        fixed_s_per_token=0.0,
        source_bw=f"median of {n} of your requests",
        source_fixed=f"none: {n} of your requests ran faster than the starting η allows with one",
        decode_samples=n,
    )


def ceilings_for_request(
    spec: HardwareSpec,
    facts: ModelFacts,
    *,
    prompt_tokens: int | None,
    output_tokens: int | None,
    vram_fraction: float = 1.0,
    host_bandwidth_bytes_s: float | None = None,
    efficiencies: Efficiencies | None = None,
    bandwidth_bytes_s: float | None = None,
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS,
) -> Ceilings:
    """Ceilings for one request: decode attends over the prompt plus, on average, half the reply."""
    p = max(prompt_tokens or 0, 0)
    n = max(output_tokens or 0, 0)
    return ceilings_for(
        spec,
        facts,
        context_tokens=p + n // 2,
        prompt_tokens=p,
        vram_fraction=vram_fraction,
        host_bandwidth_bytes_s=host_bandwidth_bytes_s,
        efficiencies=efficiencies,
        bandwidth_bytes_s=bandwidth_bytes_s,
        ubatch_tokens=ubatch_tokens,
    )


# ---------------------------------------------------------------------------------------------
# For charts and calibration: lines over prompt / context length, points from measured requests


@dataclass(frozen=True)
class CurvePoint:
    tokens: int  # prompt length (prefill) or context length (decode)
    ceiling_tok_s: float
    expected_tok_s: float


def curve_tokens(max_tokens: int, points: int = 40, min_tokens: int = 1) -> list[int]:
    """Log-spaced token counts from ``min_tokens`` to ``max_tokens`` (distinct, ascending) for a chart's x axis."""
    if max_tokens < min_tokens:
        return [max(min_tokens, 0)]
    lo, hi = math.log(max(min_tokens, 1)), math.log(max_tokens)
    raw = {round(math.exp(lo + (hi - lo) * k / max(points - 1, 1))) for k in range(points)}
    return sorted(raw | {max_tokens})


def prefill_curve(
    spec: HardwareSpec,
    facts: ModelFacts,
    prompt_tokens: Iterable[int],
    *,
    efficiencies: Efficiencies | None = None,
    vram_fraction: float = 1.0,
    host_bandwidth_bytes_s: float | None = None,
    bandwidth_bytes_s: float | None = None,
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS,
) -> list[CurvePoint]:
    """Prefill ceiling and expected rate at each prompt length, from :func:`ceilings_for` (the same numbers as
    every sentence). Short prompts are memory-bound (one weight read shared by few tokens), long ones
    compute-bound, and attention work per token grows with the prompt."""
    out = []
    for p in prompt_tokens:
        c = ceilings_for(
            spec,
            facts,
            context_tokens=p,
            prompt_tokens=p,
            vram_fraction=vram_fraction,
            host_bandwidth_bytes_s=host_bandwidth_bytes_s,
            efficiencies=efficiencies,
            bandwidth_bytes_s=bandwidth_bytes_s,
            ubatch_tokens=ubatch_tokens,
        )
        out.append(CurvePoint(p, c.prefill_ceiling_tok_s, c.prefill_expected_tok_s))
    return out


def decode_curve(
    spec: HardwareSpec,
    facts: ModelFacts,
    context_tokens: Iterable[int],
    *,
    vram_fraction: float = 1.0,
    host_bandwidth_bytes_s: float | None = None,
    efficiencies: Efficiencies | None = None,
    bandwidth_bytes_s: float | None = None,
) -> list[CurvePoint]:
    """Decode ceiling and expected rate at each context length: the KV cache read grows with it."""
    out = []
    for c in context_tokens:
        ceil = ceilings_for(
            spec,
            facts,
            context_tokens=c,
            prompt_tokens=0,
            vram_fraction=vram_fraction,
            host_bandwidth_bytes_s=host_bandwidth_bytes_s,
            efficiencies=efficiencies,
            bandwidth_bytes_s=bandwidth_bytes_s,
        )
        out.append(CurvePoint(c, ceil.decode_ceiling_tok_s, ceil.decode_expected_tok_s))
    return out


# A rate timed over fewer tokens than this (prompt tokens computed, or decode intervals) is too short to
# time well: it is shown, but kept out of medians and calibration.
MIN_RATE_TOKENS = 32
MIN_DECODE_INTERVALS_FOR_CALIBRATION = MIN_RATE_TOKENS
MIN_PROMPT_TOKENS_FOR_CALIBRATION = MIN_RATE_TOKENS


def calibration_points(
    decode_tok_s: float | None,
    output_tokens: int | None,
    prefill_tok_s: float | None,
    computed_prompt_tokens: int | None,
    c: Ceilings,
) -> list[CalibrationPoint]:
    """The calibration points one measured request gives (none when it is too short to time well).

    ``computed_prompt_tokens`` excludes cache hits, whose inflated rate would mislead.
    """
    out = []
    if decode_tok_s and output_tokens and output_tokens - 1 >= MIN_DECODE_INTERVALS_FOR_CALIBRATION:
        out.append(CalibrationPoint("decode", decode_tok_s, c.decode_ceiling_tok_s))
    if prefill_tok_s and computed_prompt_tokens and computed_prompt_tokens >= MIN_PROMPT_TOKENS_FOR_CALIBRATION:
        out.append(CalibrationPoint("prefill", prefill_tok_s, c.prefill_ceiling_tok_s))
    return out
