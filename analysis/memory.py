"""What a loaded model holds in memory, and how much of it fits in the GPU's (docs/physics.md §12).

The runner Ollama starts (llama.cpp's ``llama-server``) allocates, for one model:

- the weights (the GGUF's tensors);
- the KV cache: ``-c`` cells (``num_ctx × num_parallel``, padded to 256) for each layer that attends over the
  whole context, and for a sliding-window layer only its window plus one micro-batch per sequence (padded to
  256); K and V each ``kv_heads × head_dim`` elements per cell, of the cache type's size;
- the compute buffer: scratch for one micro-batch's graph (the FFN's and the hidden state's activations) plus
  the attention's scores over one sequence's cells (with flash attention only its f16 mask);
- the output buffer: one row of logits per sequence.

Every figure is bytes; nothing here does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.model_facts import ModelFacts

# Bytes per K or V element by llama.cpp cache type (block size and bytes per block from ggml's block structs).
KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
# A quantized V cache needs flash attention in llama.cpp ("V cache quantization requires flash_attn").
KV_TYPES_NEEDING_FLASH_ATTN = frozenset(KV_TYPE_BYTES) - {"f32", "f16", "bf16"}
CELL_PADDING = 256  # llama.cpp pads the context and the sliding-window cache to this many cells
F32_BYTES = 4
F16_BYTES = 2
DEFAULT_UBATCH_TOKENS = 512


class SettingsError(ValueError):
    """A combination the runner refuses (the message says which and why)."""


@dataclass(frozen=True)
class RunnerSettings:
    """The settings that decide a runner's memory: Ollama's names, llama-server's flags in the comments."""

    num_ctx: int  # context per sequence (Ollama's num_ctx; -c is num_ctx × num_parallel)
    num_parallel: int = 1  # sequences served at once (OLLAMA_NUM_PARALLEL; -np)
    kv_type: str = "f16"  # OLLAMA_KV_CACHE_TYPE (--cache-type-k/-v)
    flash_attn: bool = True  # OLLAMA_FLASH_ATTENTION (--flash-attn)
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS  # num_batch (-b/-ub)

    def check(self) -> None:
        if self.num_ctx < 1 or self.num_parallel < 1 or self.ubatch_tokens < 1:
            raise SettingsError("num_ctx, num_parallel and the batch size must be at least 1")
        if self.kv_type not in KV_TYPE_BYTES:
            raise SettingsError(f"unknown KV cache type {self.kv_type!r}; one of {', '.join(KV_TYPE_BYTES)}")
        if self.kv_type in KV_TYPES_NEEDING_FLASH_ATTN and not self.flash_attn:
            raise SettingsError(f"a {self.kv_type} KV cache needs flash attention (llama.cpp refuses it without)")


@dataclass(frozen=True)
class KvCache:
    full_cells: int  # cells of a full-attention layer, all sequences together
    swa_cells: int  # cells of a sliding-window layer, all sequences together
    full_bytes: float
    swa_bytes: float

    @property
    def bytes(self) -> float:
        return self.full_bytes + self.swa_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """A model's memory under some settings, and where it goes on a GPU with ``free_vram_bytes`` free."""

    settings: RunnerSettings
    weights_bytes: float
    kv: KvCache
    compute_bytes: float
    output_bytes: float
    free_vram_bytes: float | None  # None: no GPU (all in system memory)
    layers: int
    layers_on_gpu: int

    @property
    def kv_bytes(self) -> float:
        return self.kv.bytes

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv.bytes + self.compute_bytes + self.output_bytes

    @property
    def fits(self) -> bool | None:
        """Everything in GPU memory; None without a GPU."""
        return None if self.free_vram_bytes is None else self.layers_on_gpu == self.layers

    @property
    def gpu_bytes(self) -> float:
        if self.free_vram_bytes is None:
            return 0.0
        return self.compute_bytes + self.output_bytes + self.layers_on_gpu * self._per_layer_bytes

    @property
    def spill_bytes(self) -> float:
        """What goes to system memory (layers that do not fit); 0 when all fit, everything without a GPU."""
        return max(self.total_bytes - self.gpu_bytes, 0.0)

    @property
    def vram_fraction(self) -> float:
        """Share of the model's bytes in GPU memory (what /api/ps's size_vram ÷ size says)."""
        return self.gpu_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    @property
    def _per_layer_bytes(self) -> float:
        return (self.weights_bytes + self.kv.bytes) / self.layers


def _pad(cells: float) -> int:
    return int(math.ceil(cells / CELL_PADDING) * CELL_PADDING)


def kv_cache(facts: ModelFacts, s: RunnerSettings) -> KvCache:
    """The KV cache llama-server allocates (llama_kv_cache / llama_kv_cache_iswa)."""
    s.check()
    n_ctx = _pad(s.num_ctx * s.num_parallel)
    per_seq = n_ctx // s.num_parallel
    bytes_per_cell_layer = facts.kv_heads * (facts.head_dim + facts.value_head_dim) * KV_TYPE_BYTES[s.kv_type]
    full_layers = facts.layers - facts.swa_layers
    swa_cells = 0
    if facts.sliding_window and facts.swa_layers:
        # Each sequence's own window plus one micro-batch, never more than its share of the context.
        swa_cells = _pad(min(per_seq, facts.sliding_window + s.ubatch_tokens)) * s.num_parallel
    return KvCache(
        full_cells=n_ctx,
        swa_cells=swa_cells,
        full_bytes=n_ctx * full_layers * bytes_per_cell_layer,
        swa_bytes=swa_cells * facts.swa_layers * bytes_per_cell_layer,
    )


def compute_buffer_bytes(facts: ModelFacts, s: RunnerSettings) -> float:
    """Scratch for one micro-batch: its activations, plus the attention over one sequence's cells.

    The attention term follows llama.cpp's graph: with flash attention only the f16 mask (cells × ubatch);
    without it the f32 scores of every head and an f32 mask. The activations term counts the largest tensors
    alive at once (the FFN's gate, up and output, and a few copies of the hidden state); checked against
    llama-server's own figure for one model only (docs/physics.md §12), so it is an estimate.
    """
    s.check()
    per_seq_cells = _pad(s.num_ctx * s.num_parallel) // s.num_parallel
    ub = s.ubatch_tokens
    ffn = facts.ffn_length or 4 * facts.hidden  # 4 × hidden: the classic transformer's FFN where unknown
    if s.flash_attn:
        attention = per_seq_cells * ub * F16_BYTES
        activations = ub * F32_BYTES * (3 * ffn + 5 * facts.hidden)
    else:
        attention = per_seq_cells * ub * (facts.heads * F32_BYTES + F32_BYTES)
        activations = ub * F32_BYTES * (ffn + 5 * facts.hidden)
    return float(attention + activations)


def plan_memory(
    facts: ModelFacts,
    s: RunnerSettings,
    free_vram_bytes: float | None,
    *,
    weights_bytes: float | None = None,
    vocab_size: int | None = None,
) -> MemoryPlan:
    """The model's memory under ``s`` and how many of its layers fit in ``free_vram_bytes`` (None: no GPU).

    ``weights_bytes`` overrides the facts' (all weights, e.g. another quantization's); ``vocab_size`` sizes the
    output buffer (one f32 row of logits per sequence), left out when unknown.
    """
    weights = facts.weights_bytes if weights_bytes is None else weights_bytes
    if facts.params < facts.total_params and weights_bytes is None:
        weights = facts.weights_bytes * facts.total_params / facts.params  # every expert is held, not just the active
    kv = kv_cache(facts, s)
    compute = compute_buffer_bytes(facts, s)
    output = float(vocab_size * F32_BYTES * s.num_parallel) if vocab_size else 0.0
    plan = MemoryPlan(s, weights, kv, compute, output, free_vram_bytes, facts.layers, 0)
    if free_vram_bytes is None:
        return plan
    room = free_vram_bytes - compute - output
    per_layer = (weights + kv.bytes) / facts.layers
    on_gpu = max(0, min(facts.layers, int(room // per_layer))) if room > 0 else 0
    return MemoryPlan(s, weights, kv, compute, output, free_vram_bytes, facts.layers, on_gpu)
