"""Diagnoses of one request: what held it back, each in a sentence with its numbers.

Input is a ``RequestRecord``, its ``Phases`` (analysis.phases.split_record) and,
when known, GPU samples, the /api/ps snapshot of the model, model facts and the
hardware spec. Each check stays silent unless its evidence is present, so a clean
request gets an empty list. Pure: no I/O, no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from analysis import roofline
from analysis import wording as w
from analysis.ceilings import DEFAULT_UBATCH_TOKENS, MAX_PLAUSIBLE_FRACTION, Ceilings, Efficiencies, ceilings_for, vram_fraction
from analysis.hardware import HardwareSpec
from analysis.model_facts import ModelFacts
from analysis.model_names import is_cloud
from analysis.phases import Flag, Phases
from analysis.records import GpuSample, LoadedModel, RequestKind, RequestRecord
from analysis.runner_wait_tasks import TaskWaits, WaitKind
from analysis.runner_wait_words import part_words, what_changes
from analysis.speculative import DraftAcceptance, Speculation, TokensPerStep, is_speculating, tokens_per_step
from analysis.wait_split import Busy, Hit, WaitSplit


class Severity(StrEnum):
    INFO = "info"  # worth knowing; nothing to fix
    WARNING = "warning"  # costs speed, and there is something to do about it


class DiagnosisCode(StrEnum):
    """What a diagnosis found. The values are stored and exported (the Why page's JSON, the report): never change one.

    Every table keyed by these (CODES below, the Why report's fixes, analysis.doubt.ADVICE_FROM) names only members,
    and CODES and the fixes name every one (tests/analysis/test_diagnosis_codes.py).
    """

    PARTIAL_OFFLOAD = "partial_offload"
    MEMORY_CLOCK_LOW = "memory_clock_low"
    POWER_CAPPED = "power_capped"
    CACHE_HIT = "cache_hit"
    CACHE_SUSPECTED = "cache_suspected"
    ONE_TOKEN_REPLY = "one_token_reply"
    TTFT_LOAD = "ttft_load"
    TTFT_PROMPT = "ttft_prompt"
    TTFT_QUEUE = "ttft_queue"
    TTFT_RUNNER_WAIT = "ttft_runner_wait"
    INTERFERENCE = "interference"
    TTFT_WAIT_UNEXPLAINED = "ttft_wait_unexplained"
    DECODE_ABOVE_CEILING = "decode_above_ceiling"
    DECODE_SLOW = "decode_slow"
    DECODE_SPECULATIVE = "decode_speculative"
    PREFILL_ABOVE_CEILING = "prefill_above_ceiling"
    PROMPT_TRUNCATED = "prompt_truncated"
    NUM_CTX_IGNORED = "num_ctx_ignored"


@dataclass(frozen=True)
class Diagnosis:
    code: DiagnosisCode
    severity: Severity
    sentence: str
    numbers: dict[str, float] = field(default_factory=dict)  # the figures the sentence quotes, unformatted

    def __post_init__(self) -> None:
        DiagnosisCode(self.code)  # a ValueError for a code outside the vocabulary, wherever it was typed


# What each code means, in the page's words.
CODES: dict[DiagnosisCode, str] = {
    DiagnosisCode.PARTIAL_OFFLOAD: "part of the model sits in system memory, so decode reads it at system-memory speed",
    DiagnosisCode.MEMORY_CLOCK_LOW: "the GPU memory clock ran below its maximum (a lower P-state), lowering bandwidth",
    DiagnosisCode.POWER_CAPPED: "the GPU ran at its power limit, or NVML reported power-cap throttling",
    DiagnosisCode.CACHE_HIT: "prompt-cache hits inflate Ollama's own prefill rate",
    DiagnosisCode.CACHE_SUSPECTED: "Ollama's prefill rate is above the hardware ceiling: cache hits this server does not report",
    DiagnosisCode.ONE_TOKEN_REPLY: "a one-token reply: no interval to time decode over",
    DiagnosisCode.TTFT_LOAD: "time to first token went mostly to loading the model",
    DiagnosisCode.TTFT_PROMPT: "time to first token went mostly to reading a long prompt",
    DiagnosisCode.TTFT_QUEUE: "time to first token went mostly to waiting for a free slot: every slot was busy",
    DiagnosisCode.TTFT_RUNNER_WAIT: (
        "time to first token went mostly to the runner's own work before it read the prompt (prompt-cache saves and "
        "loads, context checkpoints, a re-processing forced by a lost cache), named from its own log lines"
    ),
    DiagnosisCode.INTERFERENCE: (
        "another request's prompt was read on the same runner during this request's wait, prefill or decode, and "
        "cost it time (measured from the overlap of their intervals)"
    ),
    DiagnosisCode.TTFT_WAIT_UNEXPLAINED: (
        "time to first token went mostly to a wait before the prompt was read that nothing explains"
    ),
    DiagnosisCode.DECODE_ABOVE_CEILING: "a decode rate above what the hardware allows: a reading that cannot be true",
    DiagnosisCode.DECODE_SLOW: "decode well below the expected rate, with no other cause found",
    DiagnosisCode.DECODE_SPECULATIVE: (
        "decode above the one-token-per-weight-read ceiling on a runner that drafts (speculative decoding): each read "
        "of the weights checks several proposed tokens, so the reading can be true"
    ),
    DiagnosisCode.PREFILL_ABOVE_CEILING: (
        "a prefill rate (cache hits excluded) above what the hardware allows: a reading that cannot be true"
    ),
    DiagnosisCode.PROMPT_TRUNCATED: "the prompt was longer than the context: Ollama cut it, and the model did not read all of it",
    DiagnosisCode.NUM_CTX_IGNORED: "options.num_ctx was sent on a /v1 route, where Ollama ignores it",
}

# A part that is this close to fully in VRAM counts as fully on the GPU (Ollama rounds).
OFFLOAD_MIN_FRACTION_IN_RAM = 0.02
MEM_CLOCK_LOW_FRACTION = 0.95
POWER_CAP_FRACTION = 0.97
# NVML clock-event (throttle) reasons: software power cap, hardware power brake.
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_POWER_BRAKE = 0x80
TTFT_MIN_S = 1.0  # below this nobody waits long enough to ask why
TTFT_DOMINANT_FRACTION = 0.5
DECODE_SLOW_FRACTION_OF_EXPECTED = 0.5
CEILING_SLACK = MAX_PLAUSIBLE_FRACTION  # above this share of its ceiling a reading cannot be true
BUSY_UTIL_PCT = 10.0
# A cache hit is worth a sentence only when it moves Ollama's prefill rate by more than this share:
# Ollama divides all prompt tokens by the time of the computed ones, prompt ÷ computed times too high.
CACHE_MATERIAL_RATE_CHANGE = 0.10


def request_window_unix_s(record: RequestRecord, phases: Phases) -> tuple[float, float] | None:
    """Wall-clock span of the request's work (prefill start → decode end), or request → final chunk."""
    start_ns = phases.prefill_start_ns if phases.prefill_start_ns is not None else record.received_ns
    end_ns = phases.decode_end_ns if phases.decode_end_ns is not None else record.final_chunk_ns
    if end_ns is None:
        return None
    return record.wall_s(start_ns), record.wall_s(end_ns)


def samples_in(samples: Sequence[GpuSample], window: tuple[float, float] | None) -> list[GpuSample]:
    if window is None:
        return []
    t0, t1 = window
    return [s for s in samples if t0 <= s.ts_unix_s <= t1]


# NVML's memory-controller use below this share of the time while decoding: decode is not waiting on memory.
MEMORY_BOUND_UTIL_PCT = 50.0


@dataclass(frozen=True)
class DecodeUse:
    """NVML's utilization while a model decoded: direct evidence of what decode waits on (docs/physics.md §5)."""

    mem_pct: float  # median share of the time device memory was read or written
    sm_pct: float | None  # median share of the time a kernel ran
    samples: int
    requests: int


def decode_use(pairs: Sequence[tuple[RequestRecord, Phases]], samples_by_id: dict[str, list[GpuSample]]) -> DecodeUse | None:
    """The medians of NVML's memory-controller and SM use over the samples taken while these requests decoded."""
    mem: list[float] = []
    sm: list[float] = []
    used = 0
    for rec, ph in pairs:
        if ph.decode_start_ns is None or ph.decode_end_ns is None:
            continue
        t0, t1 = rec.wall_s(ph.decode_start_ns), rec.wall_s(ph.decode_end_ns)
        inside = [s for s in samples_by_id.get(rec.id, []) if t0 <= s.ts_unix_s <= t1 and s.util_mem_pct is not None]
        used += bool(inside)
        mem += [s.util_mem_pct for s in inside if s.util_mem_pct is not None]
        sm += [s.util_gpu_pct for s in inside if s.util_gpu_pct is not None]
    if not mem:
        return None
    return DecodeUse(statistics.median(mem), statistics.median(sm) if sm else None, len(mem), used)


def explain_decode_use(use: DecodeUse, eff: Efficiencies | None) -> str:
    """One sentence on what NVML saw while decoding, set beside the decode model."""
    sm = f" and the SMs {use.sm_pct:.0f}%" if use.sm_pct is not None else ""
    text = (
        f"While it decoded, NVML saw the memory controller busy {use.mem_pct:.0f}% of the time{sm} (median of "
        f"{w.count(use.samples)} samples over {w.count(use.requests)} requests): "
    )
    if use.mem_pct < MEMORY_BOUND_UTIL_PCT:
        fixed = f" ({w.secs(eff.fixed_s_per_token)} here)" if eff is not None and eff.fixed_s_per_token > 0 else ""
        return text + f"decode is not waiting on memory, but on the fixed cost of each token{fixed}."
    return text + "decode is waiting on memory, as the bandwidth ceiling assumes."


def _request_ceilings(
    phases: Phases,
    spec: HardwareSpec,
    facts: ModelFacts,
    *,
    vram_fraction: float,
    host_bandwidth_bytes_s: float | None,
    efficiencies: Efficiencies | None,
    bandwidth_bytes_s: float | None,
    ubatch_tokens: int,
) -> Ceilings:
    """The prefill ceiling at the prompt tokens computed (the rate's own), the decode one at its context."""
    prompt, cached = phases.prompt_tokens or 0, phases.cached_tokens or 0
    return ceilings_for(
        spec,
        facts,
        prompt_tokens=max(prompt - cached, 0) if cached <= prompt else prompt,
        context_tokens=prompt + (phases.output_tokens or 0) // 2,
        vram_fraction=vram_fraction,
        host_bandwidth_bytes_s=host_bandwidth_bytes_s,
        efficiencies=efficiencies,
        bandwidth_bytes_s=bandwidth_bytes_s,
        ubatch_tokens=ubatch_tokens,
    )


def _vram_share(gpu_fraction: float | None, loaded: LoadedModel | None) -> float:
    """The share of the model on the GPU: the runner's own word when given, else /api/ps's, else all of it."""
    if gpu_fraction is not None:
        return gpu_fraction
    return vram_fraction(loaded.size_bytes, loaded.size_vram_bytes) if loaded else 1.0


def diagnose_request(
    record: RequestRecord,
    phases: Phases,
    *,
    gpu_samples: Sequence[GpuSample] = (),
    loaded: LoadedModel | None = None,
    facts: ModelFacts | None = None,
    spec: HardwareSpec | None = None,
    host_bandwidth_bytes_s: float | None = None,
    efficiencies: Efficiencies | None = None,
    ceilings: Ceilings | None = None,
    bandwidth_bytes_s: float | None = None,
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS,
    gpu_fraction: float | None = None,
    waits: TaskWaits | None = None,
    all_slots_busy: bool | None = None,
    split: WaitSplit | None = None,
    speculation: Speculation | None = None,
    draft: DraftAcceptance | None = None,
) -> list[Diagnosis]:
    """Every diagnosis that applies to this request, most costly first; [] for a clean one.

    ``waits``: what the runner said it did for this request's task besides reading its prompt (its log lines,
    ``analysis.runner_wait_fold``); None when its log was not read. ``all_slots_busy``: whether every slot of the runner
    was taken by other requests when this one arrived (None: not known).

    ``gpu_fraction``: the share of the model on the GPU when a better source than /api/ps said it (the runner's own
    load lines, ``analysis.runner_load_words.placement_in_use``); else /api/ps's size_vram ÷ size.

    ``split``: this request's time among queue, the runner's own wait and other requests' prefills
    (``analysis.wait_split``); when given it decides the wait before prefill (``all_slots_busy`` is then unused).

    ``speculation``: the runner's drafting settings (its command line); ``draft``: what its timing line said this
    task accepted (``analysis.speculative``). With either, decode may beat the one-token ceiling.

    A cloud model's request ran on ollama.com: no diagnosis of this machine (its GPU, ceilings, slots) applies."""
    if is_cloud(record.model):
        return []
    if ceilings is None and spec is not None and facts is not None:
        ceilings = _request_ceilings(
            phases,
            spec,
            facts,
            vram_fraction=_vram_share(gpu_fraction, loaded),
            host_bandwidth_bytes_s=host_bandwidth_bytes_s,
            efficiencies=efficiencies,
            bandwidth_bytes_s=bandwidth_bytes_s,
            ubatch_tokens=ubatch_tokens,
        )
    out: list[Diagnosis] = []
    # An embedding is prefill only: no prompt cache, no tokens out, no first token to wait for.
    generation = record.kind is not RequestKind.EMBED
    for d in (
        _partial_offload(record, phases, loaded, ceilings, gpu_fraction),
        _memory_clock(record, phases, gpu_samples),
        _power_cap(record, phases, gpu_samples),
        _cache(phases, ceilings) if generation else None,
        _one_token(phases) if generation else None,
        _interference(phases, split) if generation else None,
        _ttft(record, phases, waits, all_slots_busy, split) if generation else None,
        _decode_vs_ceiling(phases, ceilings, speculation, draft) if generation else None,
        _prefill_vs_ceiling(phases, ceilings),
        *_prompt_fit(phases),
    ):
        if d is not None:
            out.append(d)
    if _decode_explained(out):
        out = [d for d in out if d.code != DiagnosisCode.DECODE_SLOW]
    out.sort(key=lambda d: 0 if d.severity is Severity.WARNING else 1)
    return out


def _decode_explained(found: Sequence[Diagnosis]) -> bool:
    """ "decode_slow" is the fallback explanation: another diagnosis explains a slow decode when it names the
    placement, the memory clock, the power cap, or another request's prompt read while this one decoded."""
    return any(
        d.code in (DiagnosisCode.PARTIAL_OFFLOAD, DiagnosisCode.MEMORY_CLOCK_LOW, DiagnosisCode.POWER_CAPPED)
        or (d.code == INTERFERENCE and d.numbers.get("decode_overlap_s", 0.0) > 0)
        for d in found
    )


def _partial_offload(
    record: RequestRecord, phases: Phases, loaded: LoadedModel | None, c: Ceilings | None, gpu_fraction: float | None = None
) -> Diagnosis | None:
    if loaded is None or loaded.size_bytes <= 0:
        return None
    in_ram = loaded.size_bytes - loaded.size_vram_bytes
    if gpu_fraction is not None:  # the runner's own figures: the share of its layers left in system memory
        in_ram = round(loaded.size_bytes * (1.0 - gpu_fraction))
    frac_ram = in_ram / loaded.size_bytes
    if frac_ram < OFFLOAD_MIN_FRACTION_IN_RAM:
        return None
    nums: dict[str, float] = {"fraction_in_system_memory": frac_ram, "bytes_in_system_memory": float(in_ram)}
    text = (
        f"{w.pct(frac_ram)} of {loaded.name} ({w.gb(in_ram)} of {w.gb(loaded.size_bytes)}) sits in system memory, "
        "so every output token also reads that part over the CPU's memory bus"
    )
    if c is not None and c.host_bandwidth_bytes_s is not None:
        full_expected = c.efficiencies.decode_expected_tok_s(c.full_gpu_decode_ceiling_tok_s)
        nums.update(
            host_bandwidth_bytes_s=c.host_bandwidth_bytes_s,
            gpu_bandwidth_bytes_s=c.gpu_bandwidth_bytes_s,
            full_gpu_expected_tok_s=full_expected,
            expected_tok_s=c.decode_expected_tok_s,
        )
        text += f" at {w.gb_s(c.host_bandwidth_bytes_s)} instead of the GPU's {w.gb_s(c.gpu_bandwidth_bytes_s)}"
        measured = phases.decode_tok_s
        if measured:
            nums["measured_tok_s"] = measured
            text += (
                f"; decode ran at {w.tok_s(measured)}, and fully on the GPU about {w.tok_s(full_expected)} "
                f"could be expected at its {w.count(c.context_tokens)} tokens of context "
                f"({w.times(full_expected / measured)} faster)"
            )
        else:
            text += (
                f"; expect about {w.tok_s(c.decode_expected_tok_s)} instead of {w.tok_s(full_expected)} fully on the GPU "
                f"({w.times(full_expected / c.decode_expected_tok_s)} faster)"
            )
    text += ". A smaller quantization, a shorter context (num_ctx) or closing other GPU programs lets it fit."
    return Diagnosis(DiagnosisCode.PARTIAL_OFFLOAD, Severity.WARNING, text, nums)


def _memory_clock(record: RequestRecord, phases: Phases, samples: Sequence[GpuSample]) -> Diagnosis | None:
    # An idle GPU parks its memory clock low (P8): only samples where a kernel ran say anything.
    during = [
        s
        for s in samples_in(samples, request_window_unix_s(record, phases))
        if s.mem_clock_mhz is not None and s.mem_clock_max_mhz and (s.util_gpu_pct is None or s.util_gpu_pct >= BUSY_UTIL_PCT)
    ]
    if not during:
        return None
    clock = statistics.median(float(s.mem_clock_mhz) for s in during if s.mem_clock_mhz is not None)
    max_clock = max(float(s.mem_clock_max_mhz) for s in during if s.mem_clock_max_mhz)
    if clock >= MEM_CLOCK_LOW_FRACTION * max_clock:
        return None
    pstates = sorted({s.pstate for s in during if s.pstate is not None})
    pstate = f" (P-state P{pstates[0]})" if len(pstates) == 1 else ""
    frac = clock / max_clock
    text = (
        f"The GPU's memory clock ran at {clock:.0f} MHz during this request{pstate}, {w.pct(1 - frac)} below its "
        f"{max_clock:.0f} MHz maximum, and decode speed falls with it: memory bandwidth scales with that clock."
    )
    nums = {"mem_clock_mhz": clock, "mem_clock_max_mhz": max_clock, "fraction_of_max": frac}
    if during[0].mem_bus_width_bits:
        bw_now = 2 * clock * 1e6 * during[0].mem_bus_width_bits / 8
        bw_max = 2 * max_clock * 1e6 * during[0].mem_bus_width_bits / 8
        nums.update(bandwidth_bytes_s=bw_now, max_bandwidth_bytes_s=bw_max)
        text = text[:-1] + f" ({w.gb_s(bw_now)} instead of {w.gb_s(bw_max)})."
    return Diagnosis(DiagnosisCode.MEMORY_CLOCK_LOW, Severity.WARNING if frac < 0.9 else Severity.INFO, text, nums)


def _power_cap(record: RequestRecord, phases: Phases, samples: Sequence[GpuSample]) -> Diagnosis | None:
    during = samples_in(samples, request_window_unix_s(record, phases))
    at_cap = [
        s
        for s in during
        if (s.power_w is not None and s.power_limit_w and s.power_w >= POWER_CAP_FRACTION * s.power_limit_w)
        or (s.throttle_reasons is not None and s.throttle_reasons & (THROTTLE_SW_POWER_CAP | THROTTLE_HW_POWER_BRAKE))
    ]
    if not at_cap:
        return None
    peak = max((s.power_w for s in at_cap if s.power_w is not None), default=None)
    limit = max((s.power_limit_w for s in at_cap if s.power_limit_w), default=None)
    share = len(at_cap) / len(during)
    nums: dict[str, float] = {"samples_at_cap": float(len(at_cap)), "samples": float(len(during))}
    if peak is not None and limit is not None:
        nums.update(power_w=peak, power_limit_w=limit)
        drew = f"drew up to {peak:.0f} W of its {limit:.0f} W limit"
    else:
        drew = "reported power-cap throttling"
    text = (
        f"The GPU {drew} in {len(at_cap)} of {len(during)} samples ({w.pct(share)}) during this request, "
        "so its clocks were held down; prefill, which is limited by compute, suffers most."
    )
    return Diagnosis(DiagnosisCode.POWER_CAPPED, Severity.WARNING, text, nums)


def _cache(phases: Phases, c: Ceilings | None) -> Diagnosis | None:
    prompt, cached = phases.prompt_tokens, phases.cached_tokens
    # A few template tokens served from the cache barely move the rate: not worth a sentence.
    computed = (prompt or 0) - (cached or 0)
    if prompt and cached and cached <= prompt and prompt > (1 + CACHE_MATERIAL_RATE_CHANGE) * max(computed, 0):
        nums: dict[str, float] = {"prompt_tokens": float(prompt), "cached_tokens": float(cached)}
        text = f"{w.count(cached)} of the {w.count(prompt)} prompt tokens came from the prompt cache"
        if phases.ollama_prefill_tok_s:
            nums["ollama_prefill_tok_s"] = phases.ollama_prefill_tok_s
            text += f"; Ollama's own prefill rate ({w.tok_s(phases.ollama_prefill_tok_s)}) counts them as if computed"
        if phases.prefill_tok_s:
            nums["prefill_tok_s"] = phases.prefill_tok_s
            were = "was" if computed == 1 else "were"
            text += f", but only {w.count(computed)} {were}, at {w.tok_s(phases.prefill_tok_s)}"
        return Diagnosis(DiagnosisCode.CACHE_HIT, Severity.INFO, text + ".", nums)
    # Older servers do not report cached tokens: a rate above the ceiling gives the hits away.
    rate = phases.ollama_prefill_tok_s
    if cached is None and c is not None and rate and prompt and rate > CEILING_SLACK * c.prefill_ceiling_tok_s:
        nums = {"ollama_prefill_tok_s": rate, "prefill_ceiling_tok_s": c.prefill_ceiling_tok_s}
        text = (
            f"Ollama reports reading the {w.count(prompt)}-token prompt at {w.tok_s(rate)}, above the "
            f"{w.tok_s(c.prefill_ceiling_tok_s)} this hardware allows for this model at that length: most of the "
            "prompt must have come from the prompt cache, which this Ollama version does not report, so that rate is inflated."
        )
        return Diagnosis(DiagnosisCode.CACHE_SUSPECTED, Severity.INFO, text, nums)
    return None


def _prompt_fit(phases: Phases) -> list[Diagnosis | None]:
    """A cut prompt (its sizes, the context, who set it, the fix: analysis.prompt_fit), and an option /v1 ignored."""
    cut = phases.flag_text.get(Flag.PROMPT_TRUNCATED)
    ignored = phases.flag_text.get(Flag.NUM_CTX_IGNORED)
    return [
        Diagnosis(DiagnosisCode.PROMPT_TRUNCATED, Severity.WARNING, cut[0].upper() + cut[1:]) if cut else None,
        Diagnosis(DiagnosisCode.NUM_CTX_IGNORED, Severity.INFO, ignored[0].upper() + ignored[1:]) if ignored else None,
    ]


def _one_token(phases: Phases) -> Diagnosis | None:
    if phases.output_tokens != 1:
        return None
    text = (
        "The reply was a single token, so there is no interval between tokens to time: "
        "any decode rate shown for it means nothing."
    )
    if phases.ollama_decode_tok_s:
        text = text[:-1] + f" (Ollama's formula gives {w.tok_s(phases.ollama_decode_tok_s)})."
    return Diagnosis(DiagnosisCode.ONE_TOKEN_REPLY, Severity.INFO, text, {"output_tokens": 1.0})


INTERFERENCE = DiagnosisCode.INTERFERENCE  # a request slowed by another request's prefill
# Another request's prefill is worth a verdict when it cost this request at least this long, and this share of it.
INTERFERENCE_MIN_S = 0.5
INTERFERENCE_MIN_FRACTION = 0.10
INTERFERENCE_FIX = (
    "fewer parallel slots (OLLAMA_NUM_PARALLEL); a smaller batch (-b/-ub, Ollama's num_batch: chunked prefill trades "
    "the long prompt's speed for its neighbours'); or a separate runner for long documents"
)


def who(o: Busy) -> str:
    """Another request in words: its model, its prompt's size, its client."""
    size = f"{w.count(o.prompt_tokens)}-token prompt" if o.prompt_tokens else "prompt of unknown size"
    client = f", from {o.client}" if o.client else ""
    return f"a {o.model} request ({size}{client})"


def _hit_words(h: Hit) -> str:
    parts = []
    if h.batch_wait_s > 0:
        parts.append(f"{w.secs(h.batch_wait_s)} waiting, a slot free, for its batches to finish before its own prompt")
    if h.prefill_lost_s > 0:
        parts.append(f"{w.secs(h.prefill_lost_s)} more reading its own prompt in the same batches")
    if h.decode_lost_s:
        parts.append(f"{w.secs(h.decode_lost_s)} of longer gaps between its tokens while decoding beside it")
    elif h.decode_overlap_s > 0 and h.decode_lost_s is None:
        parts.append(f"{w.secs(h.decode_overlap_s)} of decoding beside it (its loss not measured: no token times)")
    return "; ".join(parts)


def _interference(phases: Phases, split: WaitSplit | None) -> Diagnosis | None:
    """Another request's prefill on the same runner cost this one time: named, measured, with what changes it."""
    if split is None or not split.hits:
        return None
    lost = split.interference_s
    whole = phases.client_s or phases.total_s or 0.0
    if lost < INTERFERENCE_MIN_S or lost < INTERFERENCE_MIN_FRACTION * whole:
        return None
    worst = split.hits[0]
    nums = {
        "lost_s": lost,
        "batch_wait_s": split.batch_wait_s,
        "other_prompt_tokens": float(worst.other.prompt_tokens or 0),
        "decode_overlap_s": sum(h.decode_overlap_s for h in split.hits),
    }
    costly = [h for h in split.hits if h.lost_s > 0]
    if len(costly) == 1:
        said = f"{who(costly[0].other)}: {_hit_words(costly[0])}"
    else:
        # The two costliest in full, the rest counted: a sentence a page shows whole (fmt.SENTENCE_MAX_CHARS).
        said = "; ".join(f"{who(h.other)}, {w.secs(h.lost_s)} ({_hit_words(h)})" for h in costly[:2])
        if len(costly) > 2:
            said += f"; and {len(costly) - 2} more, {w.secs(sum(h.lost_s for h in costly[2:]))} together"
    text = (
        f"Another request's prompt, read on the same runner, cost this one {w.secs(lost)}: {said}. "
        f"What changes it: {INTERFERENCE_FIX}."
    )
    return Diagnosis(INTERFERENCE, Severity.WARNING, text, nums)


def _ttft(
    record: RequestRecord,
    phases: Phases,
    waits: TaskWaits | None = None,
    all_slots_busy: bool | None = None,
    split: WaitSplit | None = None,
) -> Diagnosis | None:
    if split is not None:
        return _ttft_split(record, phases, waits, split)
    parts = {"load": phases.load_s or 0.0, "queue": max(phases.queue_s or 0.0, 0.0), "prompt": phases.prefill_s or 0.0}
    ttft = phases.ttft_s if phases.ttft_s is not None else sum(parts.values())
    if ttft < TTFT_MIN_S:
        return None
    name, part_s = max(parts.items(), key=lambda kv: kv[1])
    if part_s < TTFT_DOMINANT_FRACTION * ttft:
        return None
    nums = {"ttft_s": ttft, f"{name}_s": part_s}
    lead = f"{w.secs(part_s)} of the {w.secs(ttft)} before the first token"
    if name == "load":
        return _load(record, lead, nums)
    if name == "queue":
        return _wait_before_prefill(lead, nums, waits, all_slots_busy)
    return _prompt(phases, lead, nums)


def _ttft_split(record: RequestRecord, phases: Phases, waits: TaskWaits | None, split: WaitSplit) -> Diagnosis | None:
    """The time to first token, each part as the split measured it; the part another request's prefill cost is
    the interference verdict's, never told here as the request's own."""
    prefill_lost = sum(h.prefill_lost_s for h in split.hits)
    parts = {
        "load": phases.load_s or 0.0,
        "queue": split.queue_s or 0.0,
        "runner": split.runner_wait_s,
        "interference": split.batch_wait_s + prefill_lost,
        "prompt": max((phases.prefill_s or 0.0) - prefill_lost, 0.0),
        "unexplained": split.unexplained_s,
    }
    ttft = phases.ttft_s if phases.ttft_s is not None else sum(parts.values())
    if ttft < TTFT_MIN_S:
        return None
    name, part_s = max(parts.items(), key=lambda kv: kv[1])
    if part_s < TTFT_DOMINANT_FRACTION * ttft or name == "interference":
        return None
    key = {"runner": "runner_wait", "unexplained": "wait"}.get(name, name)
    nums = {"ttft_s": ttft, f"{key}_s": part_s}
    lead = f"{w.secs(part_s)} of the {w.secs(ttft)} before the first token"
    if name == "load":
        return _load(record, lead, nums)
    if name == "prompt":
        return _prompt(phases, lead, nums)
    if name == "queue":
        return _queue(lead, nums, split)
    if name == "runner":
        return _wait_before_prefill(lead, nums, waits, False)
    # Unexplained: the runner named no work of its own for it (or its lines span less than the wait).
    unnamed = waits if waits is not None and not waits.before_prefill() else None
    return _wait_before_prefill(lead, nums, unnamed, None if split.queue_s is None else False)


def _queue(lead: str, nums: dict[str, float], split: WaitSplit) -> Diagnosis:
    """Waiting for a slot every one of which held another request's task, with who held it."""
    nums["holders"] = float(len(split.holders))
    held = "; ".join(who(o) for o in split.holders[:3])
    more = f" and {len(split.holders) - 3} more" if len(split.holders) > 3 else ""
    text = (
        f"{lead} was spent waiting for a free slot: every slot of the runner held another request's task ({held}{more}). "
        "Ollama serves OLLAMA_NUM_PARALLEL requests per model at a time; raising it (memory allowing) shortens the queue."
    )
    return Diagnosis(DiagnosisCode.TTFT_QUEUE, Severity.WARNING, text, nums)


def _load(record: RequestRecord, lead: str, nums: dict[str, float]) -> Diagnosis:
    text = (
        f"{lead} went to loading {record.model} into memory: it was not loaded, or a changed option (such as num_ctx) "
        "forced a reload. A longer keep_alive keeps it loaded between requests."
    )
    return Diagnosis(DiagnosisCode.TTFT_LOAD, Severity.INFO, text, nums)


def _prompt(phases: Phases, lead: str, nums: dict[str, float]) -> Diagnosis:
    computed = (phases.prompt_tokens or 0) - (phases.cached_tokens or 0)
    rate = f" at {w.tok_s(phases.prefill_tok_s)}" if phases.prefill_tok_s else ""
    nums["prompt_tokens"] = float(computed)
    text = (
        f"{lead} went to reading the {w.count(computed)}-token prompt{rate}; a shorter prompt, or one that repeats an "
        "earlier prefix so the prompt cache can serve it, starts answering sooner."
    )
    return Diagnosis(DiagnosisCode.TTFT_PROMPT, Severity.INFO, text, nums)


def _wait_before_prefill(lead: str, nums: dict[str, float], waits: TaskWaits | None, all_slots_busy: bool | None) -> Diagnosis:
    """The time between the request and its prefill: the runner's own named work, a queue for a slot (only when every
    slot was busy), or a wait nothing recorded explains."""
    named = waits.before_prefill() if waits is not None else []
    if named:
        for x in named:
            nums[f"{x.kind}_count"] = float(x.count)
            if x.size_bytes:
                nums[f"{x.kind}_mib"] = x.size_bytes / (1024 * 1024)
        said = []
        for x in named:
            if x.kind is WaitKind.PROMPT_CACHE_SAVE:
                tokens = f" ({w.count(x.tokens)} tokens)" if x.tokens else ""
                whose = "another conversation's state" if x.count == 1 else f"{x.count} conversations' states"
                said.append(
                    f"it copied {whose}{tokens}, {w.mib(x.size_bytes)}, from its slot into its prompt cache in system memory"
                )
            else:
                said.append(part_words(x))
        busy = " while a slot was free" if all_slots_busy is False else ""
        text = (
            f"{lead} went to the runner's own work before it read the prompt{busy}, in its own words: "
            + "; ".join(said)
            + f". What changes it: {what_changes(waits)}."  # type: ignore[arg-type]  # named implies waits
        )
        return Diagnosis(DiagnosisCode.TTFT_RUNNER_WAIT, Severity.WARNING, text, nums)
    if all_slots_busy:
        text = (
            f"{lead} was spent waiting for a free slot: every slot of the runner was serving another request. "
            "Ollama serves OLLAMA_NUM_PARALLEL requests per model at a time; raising it (memory allowing) shortens the queue."
        )
        return Diagnosis(DiagnosisCode.TTFT_QUEUE, Severity.WARNING, text, nums)
    free = "while a slot was free" if all_slots_busy is False else "(whether every slot was busy is not known)"
    source = (
        "the runner's log lines for it name no prompt-cache or checkpoint work"
        if waits is not None
        else "the runner's /slots do not say why, and its log (--ollama-log, which names prompt-cache saves and "
        "context checkpoints) was not read for it"
    )
    text = f"{lead} passed before the prompt was read {free}; this wait is unexplained: {source}."
    return Diagnosis(DiagnosisCode.TTFT_WAIT_UNEXPLAINED, Severity.INFO, text, nums)


def _decode_vs_ceiling(
    phases: Phases, c: Ceilings | None, spec: Speculation | None = None, said: DraftAcceptance | None = None
) -> Diagnosis | None:
    measured = phases.decode_tok_s
    if c is None or not measured or (phases.output_tokens or 0) < 2:
        return None
    if is_speculating(spec, said):
        return _speculative_decode(measured, c, spec, said)
    nums = {"measured_tok_s": measured, "ceiling_tok_s": c.decode_ceiling_tok_s, "expected_tok_s": c.decode_expected_tok_s}
    if measured > CEILING_SLACK * c.decode_ceiling_tok_s:
        text = (
            f"Decode at {w.tok_s(measured)} is above the {w.tok_s(c.decode_ceiling_tok_s)} that "
            f"{w.gb_s(c.bandwidth_bytes_s)} allows for {w.gb(c.decode_bytes_per_token)} read per token at "
            f"{w.count(c.context_tokens)} tokens of context: this reading cannot "
            "be true (check the GPU and model this request was matched to)."
        )
        return Diagnosis(DiagnosisCode.DECODE_ABOVE_CEILING, Severity.WARNING, text, nums)
    if measured < DECODE_SLOW_FRACTION_OF_EXPECTED * c.decode_expected_tok_s:
        text = (
            f"Decode ran at {w.tok_s(measured)}, {w.pct(measured / c.decode_expected_tok_s)} of the "
            f"{w.tok_s(c.decode_expected_tok_s)} expected here at {w.count(c.context_tokens)} tokens of context "
            f"({w.pct(measured / c.decode_ceiling_tok_s)} of the {w.tok_s(c.decode_ceiling_tok_s)} ceiling). "
            "That usually means partial CPU offload, a low memory clock or a power cap; other requests running at the same "
            "time also share the bandwidth."
        )
        return Diagnosis(DiagnosisCode.DECODE_SLOW, Severity.INFO, text, nums)
    return None


def _speculative_decode(measured: float, c: Ceilings, spec: Speculation | None, said: DraftAcceptance | None) -> Diagnosis | None:
    """A drafting runner's decode: above the one-token ceiling it is explained, up to the tokens a step yields
    (measured, or the most the settings allow); beyond that it still cannot be true. Below the one-token ceiling
    nothing is said: the expected rate assumes one token a step, and the draft's own cost is not modelled."""
    plain = c.decode_ceiling_tok_s
    if measured <= CEILING_SLACK * plain:
        return None
    per_step = tokens_per_step(spec, said)
    nums = {"measured_tok_s": measured, "ceiling_tok_s": plain, "expected_tok_s": c.decode_expected_tok_s}
    how = _drafting_words(spec, said, per_step)
    reads = f"{w.gb_s(c.bandwidth_bytes_s)} over {w.gb(c.decode_bytes_per_token)} a step"
    lead = f"{how[0].upper()}{how[1:]}; measured {w.tok_s(measured)} is above the one-token-per-weight-read ceiling"
    if per_step is None:
        needed = measured / plain
        text = (
            f"{lead} {w.tok_s(plain)} ({reads}), which a draft allows: it needs {needed:.2f} tokens a step. How many "
            "the runner accepts is not known here."
        )
        return Diagnosis(DiagnosisCode.DECODE_SPECULATIVE, Severity.INFO, text, {**nums, "tokens_per_step_needed": needed})
    bound = roofline.speculative_decode_ceiling_tok_s(plain, per_step.tokens)
    nums |= {"tokens_per_step": per_step.tokens, "speculative_ceiling_tok_s": bound}
    if measured > CEILING_SLACK * bound:
        text = (
            f"Decode at {w.tok_s(measured)} is above even the {w.tok_s(bound)} that {per_step.tokens:.2f} tokens per "
            f"read of the weights allow ({how}; one token a step: {w.tok_s(plain)}): this reading cannot be true "
            "(check the GPU and model this request was matched to)."
        )
        return Diagnosis(DiagnosisCode.DECODE_ABOVE_CEILING, Severity.WARNING, text, nums)
    text = f"{lead} {w.tok_s(plain)} ({reads}), within the {w.tok_s(bound)} that {per_step.tokens:.2f} tokens a step allow."
    return Diagnosis(DiagnosisCode.DECODE_SPECULATIVE, Severity.INFO, text, nums)


def _drafting_words(spec: Speculation | None, said: DraftAcceptance | None, per_step: TokensPerStep | None) -> str:
    """ "the runner drafts (a draft model (d.gguf), up to 3 drafted tokens a step): it proposes tokens the main model
    checks 2.25 at a time on average (the runner's own count: 50 of 80 drafted tokens accepted)"."""
    setting = spec.describe() if spec is not None and spec.active else "a draft"
    checks = "several at a time"
    if per_step is not None:
        checks = f"{per_step.tokens:.2f} at a time on average" if per_step.measured else f"up to {per_step.tokens:.0f} at a time"
    text = f"the runner drafts ({setting}): it proposes tokens the main model checks {checks}"
    if said is not None and said.drafted_tokens > 0:
        text += (
            f" (the runner's own count: {w.count(said.accepted_tokens)} of {w.count(said.drafted_tokens)} drafted tokens "
            "accepted)"
        )
    return text


def _prefill_vs_ceiling(phases: Phases, c: Ceilings | None) -> Diagnosis | None:
    # Only when the server reported its cache hits: otherwise _cache explains a high rate.
    measured = phases.prefill_tok_s
    if c is None or not measured or phases.cached_tokens is None or measured <= CEILING_SLACK * c.prefill_ceiling_tok_s:
        return None
    computed = (phases.prompt_tokens or 0) - phases.cached_tokens
    compute_bound = c.prefill_intensity_flop_per_byte >= c.ridge_point_flop_per_byte
    limit = (
        f"that {w.tflops(c.peak_flops)} of compute allows"
        if compute_bound
        else f"that {w.gb_s(c.bandwidth_bytes_s)} allows when every micro-batch reads the weights once"
    )
    text = (
        f"Prefill of {w.count(computed)} uncached prompt tokens at {w.tok_s(measured)} is above the "
        f"{w.tok_s(c.prefill_ceiling_tok_s)} {limit} for this model at {w.count(c.prompt_tokens)} prompt tokens: "
        "this reading cannot be true, so it is kept out of medians and calibration."
    )
    nums = {"measured_tok_s": measured, "ceiling_tok_s": c.prefill_ceiling_tok_s}
    return Diagnosis(DiagnosisCode.PREFILL_ABOVE_CEILING, Severity.WARNING, text, nums)
