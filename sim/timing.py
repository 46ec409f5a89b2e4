"""How long one continuous-batching step takes (docs/physics.md §7). Pure functions.

A step reads the weights once, plus the KV cache of every sequence in it, and
does 2N FLOPs per token plus attention. On each device the step is bound by
memory or by compute, whichever is slower; layers in system memory run after
those in VRAM, so the two devices' times add.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analysis import roofline
from sim.catalog import ModelFacts
from sim.profiles import SimProfile

HOST_ETA_BW = 0.65  # share of RAM bandwidth a CPU matmul reaches
HOST_ETA_COMPUTE = 0.5
GPU_OFFLOAD_MIN_BATCH = 32  # llama.cpp copies offloaded weights to the GPU for batches this large


@dataclass(frozen=True)
class StepWork:
    decode_contexts: Sequence[int]  # context length of each decoding slot
    prefill_chunks: Sequence[tuple[int, int]]  # (tokens already in context, chunk tokens) per prefilling slot

    @property
    def tokens(self) -> int:
        return len(self.decode_contexts) + sum(n for _, n in self.prefill_chunks)


def step_flops(model: ModelFacts, work: StepWork) -> float:
    n, layers, d = model.parameter_count, model.block_count, model.embedding_length
    flops = sum(roofline.decode_flops_per_token(n, layers, d, c) for c in work.decode_contexts)
    for offset, chunk in work.prefill_chunks:
        # Each chunk token attends to the context before it: average offset + chunk/2.
        flops += chunk * (2.0 * n + 4.0 * layers * d * (offset + chunk / 2.0))
    return flops


def step_bytes(model: ModelFacts, work: StepWork) -> tuple[float, float]:
    """(weight bytes, KV bytes) read by one step."""
    kv_tok = model.kv_bytes_per_token
    kv = sum(kv_tok * c for c in work.decode_contexts) + sum(kv_tok * (o + n) for o, n in work.prefill_chunks)
    return float(model.size_bytes), kv


def _device_seconds(model: ModelFacts, profile: SimProfile, vram_fraction: float, work: StepWork, *, ideal: bool) -> float:
    """Time on the GPU plus time of the offloaded layers, each device bound by its bytes or its FLOPs.

    ``ideal``: at full bandwidth and compute (the roofline's ceilings) instead of the efficiency
    factors real engines reach. The fixed per-step overhead is not included.
    """
    spec = profile.spec
    f = min(max(vram_fraction, 0.0), 1.0)
    weights, kv = step_bytes(model, work)
    flops = step_flops(model, work)
    eta_bw = 1.0 if ideal else spec.eta_bw_quant if model.low_bit else spec.eta_bw_f16
    eta_c = 1.0 if ideal else spec.eta_compute
    host_eta_bw, host_eta_c = (1.0, 1.0) if ideal else (HOST_ETA_BW, HOST_ETA_COMPUTE)
    gpu_s = 0.0
    if f > 0:
        gpu_s = max(f * (weights + kv) / (eta_bw * spec.bandwidth_bytes_s), f * flops / (eta_c * spec.fp16_flops))
    host_s = 0.0
    if f < 1:
        if f > 0 and work.tokens >= GPU_OFFLOAD_MIN_BATCH:
            # Big batches: offloaded weights cross PCIe and the GPU does the math.
            host_s = max((1 - f) * weights / profile.pcie_bytes_s, (1 - f) * flops / (eta_c * spec.fp16_flops))
        else:
            host_s = max(
                (1 - f) * (weights + kv) / (host_eta_bw * profile.host_bandwidth_bytes_s),
                (1 - f) * flops / (host_eta_c * profile.host_flops),
            )
    return gpu_s + host_s


def step_seconds(model: ModelFacts, profile: SimProfile, vram_fraction: float, work: StepWork) -> float:
    """Wall time of one batch step at the hardware's efficiency factors, fixed overhead included."""
    if work.tokens == 0:
        return 0.0
    return _device_seconds(model, profile, vram_fraction, work, ideal=False) + profile.step_overhead_s


def floor_seconds(model: ModelFacts, profile: SimProfile, vram_fraction: float, work: StepWork) -> float:
    """The physical minimum of one step: the same bytes and FLOPs at full bandwidth and compute, no overhead.

    The engine may shorten a step to catch up with its timeline, but never below this, so no prefill
    is faster than one read of the weights per micro-batch and no decode faster than its bytes allow
    (docs/physics.md §7).
    """
    if work.tokens == 0:
        return 0.0
    return _device_seconds(model, profile, vram_fraction, work, ideal=True)


def load_seconds(model: ModelFacts, profile: SimProfile) -> float:
    """Reading the GGUF from disk dominates a cold load."""
    return model.size_bytes / profile.disk_read_bytes_s


def default_num_batch(num_ctx: int) -> int:
    """llama-server's automatic batch size for Ollama (docs/ollama-api.md §7)."""
    if num_ctx > 32768:
        return 2048
    if num_ctx > 4096:
        return 1024
    return 512
