"""What if the settings changed: memory, fit and the rates the Why page's ceiling model predicts for them.

``predict`` takes a model's facts, a GPU, the settings and the user's calibrated efficiencies (the measured
fraction of the ceiling, :mod:`analysis.story`), and answers with the memory plan (``analysis.memory``) and
the rates of the same :class:`analysis.ceilings.CeilingModel` every other page asks. ``suggest`` tries the
changes one at a time and keeps those predicted to help by more than ``MIN_GAIN``, with their cost and the
Ollama setting that makes each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, replace
from typing import Any

from analysis import wording as w
from analysis.ceilings import CeilingModel, Ceilings, Efficiencies, starting_efficiencies
from analysis.command_line import ExitCode
from analysis.hardware import HardwareSpec, close_matches, resolve_spec
from analysis.memory import KV_TYPE_BYTES, KV_TYPES_NEEDING_FLASH_ATTN, MemoryPlan, RunnerSettings, SettingsError, plan_memory
from analysis.model_facts import ModelFacts
from analysis.quantization import bits_per_weight

MIN_GAIN = 0.10  # a suggestion must be predicted to help by more than this share
MIN_NUM_CTX = 2048  # never suggest a context below this (Ollama's long-standing default)
QUANT_LADDER = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M")  # each step down: smaller, lower quality


@dataclass(frozen=True)
class Workload:
    """The user's typical lengths: from their recorded requests where there are any."""

    prompt_tokens: int  # median prompt
    prompt_p90_tokens: int
    context_tokens: int  # median context a decode step attends over
    longest_prompt_tokens: int


@dataclass(frozen=True)
class Prediction:
    settings: RunnerSettings
    quantization: str | None
    memory: MemoryPlan
    at_median: Ceilings  # the median prompt, decoding at the median context
    at_p90: Ceilings

    @property
    def decode_tok_s(self) -> float:
        return self.at_median.decode_expected_tok_s

    @property
    def prefill_tok_s(self) -> float:
        return self.at_median.prefill_expected_tok_s

    def ttft_s(self, p90: bool = False) -> float:
        """Time to the first token: the prompt read at the expected prefill rate (no queue, no load)."""
        c = self.at_p90 if p90 else self.at_median
        return c.prompt_tokens / c.prefill_expected_tok_s

    @property
    def concurrent_tok_s(self) -> float:
        """All streams' tokens per second with num_parallel requests decoding at once."""
        return self.at_median.batched_decode_tok_s(self.settings.num_parallel)[0]


@dataclass(frozen=True)
class Suggestion:
    change: str  # "num_ctx 32,768 → 8,192"
    gain: float  # predicted decode (or time-to-first-token) speed-up, e.g. 2.9 for 2.9×
    what_improves: str
    cost: str
    how: str  # the Ollama setting that makes the change
    prediction: Prediction

    @property
    def sentence(self) -> str:
        return f"{self.change}: {self.what_improves}; {self.cost}. {self.how}"


def weights_for_quant(facts: ModelFacts, quant: str | None) -> tuple[ModelFacts, float]:
    """The facts with another quantization's weight bytes (per token and all), from bits per weight."""
    all_weights = facts.weights_bytes * facts.total_params / facts.params
    if quant is None or quant.upper() == (facts.quantization or "").upper():
        return facts, all_weights
    bpw_new = bits_per_weight(quant)
    if bpw_new is None:
        raise ValueError(f"no bits per weight known for {quant!r}")
    bpw_now = bits_per_weight(facts.quantization)
    scale = bpw_new / bpw_now if bpw_now else (facts.total_params * bpw_new / 8.0) / all_weights
    return replace(facts, weights_bytes=facts.weights_bytes * scale, quantization=quant.upper()), all_weights * scale


def predict(
    facts: ModelFacts,
    spec: HardwareSpec,
    settings: RunnerSettings,
    workload: Workload,
    *,
    free_vram_bytes: float | None,
    efficiencies: Efficiencies | None = None,
    host_bandwidth_bytes_s: float | None = None,
    bandwidth_bytes_s: float | None = None,
    quant: str | None = None,
) -> Prediction:
    """Memory and rates under ``settings`` (and ``quant`` instead of the model's own quantization)."""
    settings.check()
    qfacts, all_weights = weights_for_quant(facts, quant)
    plan = plan_memory(qfacts, settings, free_vram_bytes, weights_bytes=all_weights)
    kv_facts = replace(qfacts, kv_bytes_per_element=KV_TYPE_BYTES[settings.kv_type])
    eff = efficiencies or starting_efficiencies(spec, qfacts.quantization)
    frac = 1.0 if free_vram_bytes is None else plan.vram_fraction
    model = CeilingModel(spec, kv_facts, eff, frac, host_bandwidth_bytes_s, bandwidth_bytes_s, settings.ubatch_tokens)
    return Prediction(
        settings=settings,
        quantization=qfacts.quantization,
        memory=plan,
        at_median=model.at(workload.prompt_tokens, workload.context_tokens),
        at_p90=model.at(workload.prompt_p90_tokens, workload.context_tokens),
    )


_Candidate = tuple[str, RunnerSettings, str | None, str, str]  # change, settings, quantization, cost, how


def _candidates(now: Prediction, workload: Workload) -> list[_Candidate]:
    """Each single change worth trying from ``now``."""
    s = now.settings
    out: list[_Candidate] = []
    need = max(workload.longest_prompt_tokens * 2, MIN_NUM_CTX)  # room for the longest prompt and a reply as long
    smaller = s.num_ctx // 2
    while smaller >= need and smaller >= MIN_NUM_CTX:
        out.append(
            (
                f"num_ctx {s.num_ctx:,} → {smaller:,}",
                replace(s, num_ctx=smaller),
                None,
                f"prompt and reply together at most {smaller:,} tokens (your longest prompt: {workload.longest_prompt_tokens:,})",
                f"Set it per model with `PARAMETER num_ctx {smaller}` in a Modelfile, per request with "
                f'`"options": {{"num_ctx": {smaller}}}`, or for all with `OLLAMA_CONTEXT_LENGTH={smaller}`.',
            )
        )
        smaller //= 2
    for kv in ("q8_0", "q4_0"):
        if KV_TYPE_BYTES[kv] < KV_TYPE_BYTES[s.kv_type]:
            fa = " OLLAMA_FLASH_ATTENTION=1" if kv in KV_TYPES_NEEDING_FLASH_ATTN and not s.flash_attn else ""
            out.append(
                (
                    f"KV cache {s.kv_type} → {kv}",
                    replace(s, kv_type=kv, flash_attn=True),
                    None,
                    "the cache is quantized: a small loss of quality, more at q4_0",
                    f"Set `OLLAMA_KV_CACHE_TYPE={kv}`{fa} in Ollama's environment and restart it.",
                )
            )
    if not s.flash_attn:
        out.append(
            (
                "flash attention on",
                replace(s, flash_attn=True),
                None,
                "none expected on current GPUs",
                "Set `OLLAMA_FLASH_ATTENTION=1` in Ollama's environment and restart it.",
            )
        )
    if s.num_parallel > 1:
        out.append(
            (
                f"num_parallel {s.num_parallel} → 1",
                replace(s, num_parallel=1),
                None,
                "one request at a time: others wait for it",
                "Set `OLLAMA_NUM_PARALLEL=1` and restart Ollama.",
            )
        )
    quant = (now.quantization or "").upper()
    if quant in QUANT_LADDER and QUANT_LADDER.index(quant) + 1 < len(QUANT_LADDER):
        lower = QUANT_LADDER[QUANT_LADDER.index(quant) + 1]
        pull = f"`ollama pull <model>:<tag>-{lower.lower()}` where the library has one"
        out.append(
            (
                f"quantization {quant} → {lower}",
                s,
                lower,
                "fewer bits per weight: some loss of quality",
                f"Pull a {lower} tag of the model ({pull}).",
            )
        )
    return out


def suggest(
    now: Prediction,
    facts: ModelFacts,
    spec: HardwareSpec,
    workload: Workload,
    *,
    free_vram_bytes: float | None,
    efficiencies: Efficiencies | None = None,
    host_bandwidth_bytes_s: float | None = None,
    bandwidth_bytes_s: float | None = None,
) -> list[Suggestion]:
    """Single changes predicted to speed decode or the first token by more than MIN_GAIN, best first."""
    found: list[Suggestion] = []
    for change, settings, quant, cost, how in _candidates(now, workload):
        p = predict(
            facts,
            spec,
            settings,
            workload,
            free_vram_bytes=free_vram_bytes,
            efficiencies=efficiencies,
            host_bandwidth_bytes_s=host_bandwidth_bytes_s,
            bandwidth_bytes_s=bandwidth_bytes_s,
            quant=quant or now.quantization,
        )
        decode_gain = p.decode_tok_s / now.decode_tok_s
        ttft_gain = now.ttft_s() / p.ttft_s()
        if max(decode_gain, ttft_gain) <= 1.0 + MIN_GAIN:
            continue
        parts = []
        if p.memory.fits and not now.memory.fits:
            parts.append(f"keeps the model in GPU memory ({w.gb(p.memory.total_bytes)} of {w.gb(free_vram_bytes or 0)})")
        if decode_gain > 1.0 + MIN_GAIN:
            rates = f"{w.num(now.decode_tok_s)} → {w.num(p.decode_tok_s)} tok/s"
            parts.append(f"decode about {w.times(decode_gain)} faster ({rates})")
        if ttft_gain > 1.0 + MIN_GAIN:
            parts.append(f"first token about {w.times(ttft_gain)} sooner for your median prompt")
        found.append(Suggestion(change, max(decode_gain, ttft_gain), ", ".join(parts), cost, how, p))
    return sorted(found, key=lambda s: s.gain, reverse=True)


# -- python -m analysis.whatif ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.whatif",
        description="Memory, fit and predicted rates of one model on one GPU under Ollama's settings, with suggestions.",
    )
    p.add_argument("--gpu", required=True, help="GPU name as NVML/the OS reports it, or a table key (e.g. rtx-4090)")
    p.add_argument("--vram-gb", type=float, help="GPU memory free for this model, GB (default: the GPU's whole memory)")
    p.add_argument("--weights-bytes", type=float, required=True, help="bytes of all weights (GGUF size)")
    p.add_argument("--params", type=float, required=True, help="parameters")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True, help="embedding length d")
    p.add_argument("--heads", type=int, help="attention heads (default: hidden ÷ head dim)")
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--ffn", type=int, help="feed-forward width (default 4 × hidden)")
    p.add_argument("--sliding-window", type=int, help="tokens a sliding-window layer attends over")
    p.add_argument("--swa-layers", type=int, default=0, help="how many layers use the sliding window")
    p.add_argument("--quant", default=None, help="the model's quantization, e.g. Q4_K_M")
    p.add_argument("--as-quant", default=None, help="predict for another quantization of the same model")
    p.add_argument("--num-ctx", type=int, default=4096, help="context per request (Ollama's num_ctx)")
    p.add_argument("--kv-type", default="f16", choices=sorted(KV_TYPE_BYTES), help="KV cache type (OLLAMA_KV_CACHE_TYPE)")
    p.add_argument("--flash-attn", choices=("on", "off"), default="on", help="flash attention (OLLAMA_FLASH_ATTENTION)")
    p.add_argument("--num-parallel", type=int, default=1, help="requests served at once (OLLAMA_NUM_PARALLEL)")
    p.add_argument("--num-batch", type=int, default=512, help="micro-batch (num_batch)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="typical (median) prompt")
    p.add_argument("--prompt-p90-tokens", type=int, help="a long (p90) prompt (default 4 × the median)")
    p.add_argument("--context", type=int, help="context a decode step attends over (default: prompt + 256)")
    p.add_argument("--host-bandwidth-gbs", type=float, help="system memory bandwidth for a part that spills")
    p.add_argument("--eta-bw", type=float, help="your decode efficiency (fraction of the bandwidth ceiling)")
    p.add_argument("--eta-compute", type=float, help="your prefill efficiency (fraction of the compute ceiling)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _as_json(p: Prediction, suggestions: list[Suggestion]) -> dict[str, Any]:
    m = p.memory
    return {
        "settings": dataclasses.asdict(p.settings),
        "quantization": p.quantization,
        "weights_bytes": m.weights_bytes,
        "kv_bytes": m.kv_bytes,
        "compute_bytes": m.compute_bytes,
        "total_bytes": m.total_bytes,
        "free_vram_bytes": m.free_vram_bytes,
        "fits": m.fits,
        "spill_bytes": m.spill_bytes,
        "layers_on_gpu": m.layers_on_gpu,
        "layers": m.layers,
        "vram_fraction": m.vram_fraction,
        "prefill_tok_s": p.prefill_tok_s,
        "decode_tok_s": p.decode_tok_s,
        "ttft_s": p.ttft_s(),
        "ttft_p90_s": p.ttft_s(p90=True),
        "concurrent_tok_s": p.concurrent_tok_s,
        "suggestions": [
            {
                "change": s.change,
                "gain": s.gain,
                "sentence": s.sentence,
                "decode_tok_s": s.prediction.decode_tok_s,
                "fits": s.prediction.memory.fits,
                "how": s.how,
            }
            for s in suggestions
        ],
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spec = resolve_spec(args.gpu)
    if spec is None:
        near = close_matches(args.gpu)
        print(f"error: unknown GPU {args.gpu!r}" + (f"; close matches: {', '.join(near)}" if near else ""), file=sys.stderr)
        return ExitCode.USAGE
    facts = ModelFacts(
        architecture="given",
        params=args.params,
        total_params=args.params,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads or max(args.hidden // args.head_dim, 1),
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        value_head_dim=args.head_dim,
        context_length=None,
        quantization=args.quant.upper() if args.quant else None,
        weights_bytes=args.weights_bytes,
        weights_bytes_estimated=False,
        sliding_window=args.sliding_window,
        swa_layers=args.swa_layers if args.sliding_window else 0,
        ffn_length=args.ffn,
    )
    settings = RunnerSettings(args.num_ctx, args.num_parallel, args.kv_type, args.flash_attn == "on", args.num_batch)
    prompt = args.prompt_tokens
    p90 = args.prompt_p90_tokens or 4 * prompt
    work = Workload(prompt, p90, args.context or prompt + 256, p90)
    eff = starting_efficiencies(spec, args.as_quant or facts.quantization)
    if args.eta_bw is not None:
        eff = replace(eff, eta_bw=args.eta_bw, source_bw="given on the command line")
    if args.eta_compute is not None:
        eff = replace(eff, eta_compute=args.eta_compute, source_compute="given on the command line")
    vram = args.vram_gb * 1e9 if args.vram_gb is not None else spec.memory_bytes
    host = args.host_bandwidth_gbs * 1e9 if args.host_bandwidth_gbs else None
    try:
        now = predict(
            facts, spec, settings, work, free_vram_bytes=vram, efficiencies=eff, host_bandwidth_bytes_s=host, quant=args.as_quant
        )
        found = suggest(now, facts, spec, work, free_vram_bytes=vram, efficiencies=eff, host_bandwidth_bytes_s=host)
    except (ValueError, SettingsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    if args.json:
        print(json.dumps(_as_json(now, found), indent=2, sort_keys=True))
        return ExitCode.OK
    m = now.memory
    fit = "fits" if m.fits else f"does not fit: {w.gb(m.spill_bytes)} spills to system memory"
    parts = f"weights {w.gb(m.weights_bytes)} + KV cache {w.gb(m.kv_bytes)} + compute {w.gb(m.compute_bytes)}"
    print(
        f"{spec.name}, {w.gb(vram)} free: {parts} = {w.gb(m.total_bytes)}: {fit} "
        f"({m.layers_on_gpu} of {m.layers} layers on the GPU)"
    )
    print(
        f"prefill {w.num(now.prefill_tok_s)} tok/s at {prompt:,} tokens; decode {w.num(now.decode_tok_s)} tok/s at "
        f"{work.context_tokens:,}; first token in {now.ttft_s():.2f} s (p90 prompt {now.ttft_s(p90=True):.2f} s); "
        f"{w.num(now.concurrent_tok_s)} tok/s over {settings.num_parallel} stream(s)"
    )
    for s in found:
        print(f"- {s.sentence}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
