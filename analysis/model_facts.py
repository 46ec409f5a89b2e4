"""Model facts from Ollama's ``/api/show`` JSON: the numbers the roofline needs.

``model_info`` holds the GGUF key/values under the ``general.architecture``
prefix (``llama.block_count``, ``qwen2.attention.head_count_kv``, ...), so the
prefix is read first and every other key is looked up under it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from analysis.quantization import bits_per_weight, file_type_name, is_high_precision
from analysis.roofline import KV_BYTES_PER_ELEMENT_F16

# Architectures whose layers alternate sliding-window and full attention: n where n − 1 of every n layers slide
# (llama.cpp's load_swa_pattern per architecture, unless the GGUF gives attention.sliding_window_pattern).
SWA_PATTERNS: dict[str, int] = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma-embedding": 6,
    "gemma3n": 5,
    "gpt-oss": 2,
    "cohere2": 4,
    "llama4": 4,
    "olmo2": 4,
    "exaone4": 4,
}


class ModelFactsError(ValueError):
    """The /api/show JSON lacks a key the roofline needs (the message names it)."""


@dataclass(frozen=True)
class ModelFacts:
    architecture: str  # general.architecture, e.g. "llama", "qwen2", "gemma3"
    params: float  # parameters used per token (MoE: the active ones)
    total_params: float  # all parameters (same as params for dense models)
    layers: int
    hidden: int
    heads: int
    kv_heads: float  # average over layers where the GGUF gives a per-layer list
    head_dim: int  # key head dimension
    value_head_dim: int
    context_length: int | None  # the model's trained maximum, not the loaded num_ctx
    quantization: str | None  # e.g. "Q4_K_M"
    weights_bytes: float  # bytes streamed per decode token (MoE: the active experts' share)
    weights_bytes_estimated: bool  # True when no size was given and bits-per-weight filled in
    experts: int | None = None
    experts_used: int | None = None
    sliding_window: int | None = None  # tokens a sliding-window layer attends over (None: every layer sees all)
    swa_layers: int = 0  # layers that attend over the sliding window only (the rest see the whole context)
    ffn_length: int | None = None  # feed_forward_length: the FFN's inner width (its activations fill the compute buffer)
    kv_bytes_per_element: float = KV_BYTES_PER_ELEMENT_F16  # the KV cache type's (f16 unless a what-if says otherwise)

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V cache bytes one token of context occupies, all layers (f16 unless the facts say otherwise)."""
        return self.layers * self.kv_heads * (self.head_dim + self.value_head_dim) * self.kv_bytes_per_element

    @property
    def high_precision(self) -> bool:
        """F16/BF16/Q8 weights: decode reaches more of the bandwidth than with 4-6 bit ones."""
        return is_high_precision(self.quantization)


def _number(info: Mapping[str, Any], key: str, *, required: bool = True) -> float | None:
    if key not in info or info[key] is None:
        if required:
            raise ModelFactsError(f"/api/show model_info has no {key!r}")
        return None
    value = info[key]
    if isinstance(value, bool):
        raise ModelFactsError(f"/api/show model_info {key!r} is {value!r}, not a number")
    if isinstance(value, list):
        # Per-layer values (e.g. head_count_kv on models with mixed attention layers).
        nums = [v for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
        if not nums:
            raise ModelFactsError(
                f"/api/show model_info {key!r} is a per-layer list that came back empty or not numeric; "
                'Ollama shortens arrays longer than 5 items unless asked with "verbose": true'
            )
        if not all(math.isfinite(v) for v in nums):
            raise ModelFactsError(f"/api/show model_info {key!r} holds a non-finite number")
        return float(sum(nums)) / len(nums)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelFactsError(f"/api/show model_info {key!r} is {value!r}, not a number") from None
    if not math.isfinite(number):
        raise ModelFactsError(f"/api/show model_info {key!r} is {value!r}, not a finite number")
    return number


def _positive_int(info: Mapping[str, Any], key: str) -> int:
    v = _number(info, key)
    assert v is not None
    if v <= 0 or v != int(v):
        raise ModelFactsError(f"/api/show model_info {key!r} is {info[key]!r}; expected a positive integer")
    return int(v)


def model_facts_from_show(show: Mapping[str, Any], size_bytes: int | None) -> ModelFacts:
    """Roofline facts from an ``/api/show`` reply.

    ``size_bytes`` is the model's size as ``/api/tags`` lists it (the GGUF file, i.e. the
    weights; not ``/api/ps``'s size, which adds KV cache and buffers). Without it the
    weight bytes are estimated from the parameter count and the quantization's bits per weight.
    Raises :class:`ModelFactsError` naming any key that is missing or malformed.
    """
    if not isinstance(show, Mapping):
        raise ModelFactsError(f"/api/show reply is {type(show).__name__}, not a JSON object")
    info = show.get("model_info", show.get("modelinfo"))
    if not isinstance(info, Mapping):
        raise ModelFactsError("/api/show reply has no 'model_info' object")
    arch = info.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFactsError("/api/show model_info has no 'general.architecture'")

    def k(name: str) -> str:
        return f"{arch}.{name}"

    layers = _positive_int(info, k("block_count"))
    hidden = _positive_int(info, k("embedding_length"))
    heads, kv_heads, head_dim, value_head_dim = _attention_shape(info, k, hidden)
    ctx = _number(info, k("context_length"), required=False)
    quant = _quantization(show, info)
    total_params = _number(info, "general.parameter_count")
    assert total_params is not None
    if total_params <= 0:
        raise ModelFactsError("/api/show model_info 'general.parameter_count' must be positive")
    experts = _number(info, k("expert_count"), required=False)
    experts_used = _number(info, k("expert_used_count"), required=False)
    window, swa_layers = _sliding_window(info, k, arch, layers)
    ffn = _number(info, k("feed_forward_length"), required=False)
    active_params = _active_params(info, k, total_params, layers, hidden)
    total_weight_bytes, estimated = _weight_bytes(size_bytes, total_params, quant)
    weights_bytes = total_weight_bytes * active_params / total_params

    return ModelFacts(
        architecture=arch,
        params=active_params,
        total_params=total_params,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        value_head_dim=value_head_dim,
        context_length=int(ctx) if ctx else None,
        quantization=quant,
        weights_bytes=weights_bytes,
        weights_bytes_estimated=estimated,
        experts=int(experts) if experts else None,
        experts_used=int(experts_used) if experts_used else None,
        sliding_window=window,
        swa_layers=swa_layers,
        ffn_length=int(ffn) if ffn and ffn > 0 else None,
    )


def is_embedding_model(family: str | None, capabilities: Collection[str]) -> bool:
    """An embedding model (BERT family, or Ollama says it embeds and does not complete): it reads a prompt and
    writes nothing, so the prefill-against-decode story does not apply to it."""
    caps = {c.lower() for c in capabilities}
    return (family or "").lower().endswith("bert") or ("embedding" in caps and "completion" not in caps)


# Before Ollama has told us about any model: a typical 8B model at Q4_K_M (Llama 3.1 8B's shape and GGUF size).
TYPICAL_MODEL_NAME = "a typical 8B model (Q4_K_M)"
TYPICAL_8B_Q4_K_M = ModelFacts(
    architecture="llama",
    params=8.03e9,
    total_params=8.03e9,
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    value_head_dim=128,
    context_length=131072,
    quantization="Q4_K_M",
    weights_bytes=4.92e9,
    weights_bytes_estimated=False,
)


def _attention_shape(info: Mapping[str, Any], k: Callable[[str], str], hidden: int) -> tuple[int, float, int, int]:
    """Heads, KV heads, key and value head dimensions (llama.cpp's defaults where a key is absent)."""
    heads_f = _number(info, k("attention.head_count"))
    assert heads_f is not None
    if heads_f <= 0:
        raise ModelFactsError(f"/api/show model_info {k('attention.head_count')!r} must be positive")
    heads = round(heads_f)
    if heads < 1:
        raise ModelFactsError(f"/api/show model_info {k('attention.head_count')!r} is {heads_f!r}; expected at least 1")
    # llama.cpp defaults the KV head count to the head count (plain multi-head attention).
    kv_heads = _number(info, k("attention.head_count_kv"), required=False)
    if kv_heads is None:
        kv_heads = float(heads)
    if kv_heads < 0:
        raise ModelFactsError(f"/api/show model_info {k('attention.head_count_kv')!r} is negative")
    key_len = _number(info, k("attention.key_length"), required=False)
    head_dim = int(key_len) if key_len else hidden // heads
    value_len = _number(info, k("attention.value_length"), required=False)
    value_head_dim = int(value_len) if value_len else head_dim
    if head_dim < 1 or value_head_dim < 1:
        raise ModelFactsError(
            f"/api/show model_info gives a head dimension of {head_dim} (key) / {value_head_dim} (value); "
            f"check {k('attention.key_length')!r}, {k('embedding_length')!r} and {k('attention.head_count')!r}"
        )
    return heads, kv_heads, head_dim, value_head_dim


def _quantization(show: Mapping[str, Any], info: Mapping[str, Any]) -> str | None:
    """The quantization Ollama names in ``details``, else the GGUF's ``general.file_type``; upper case."""
    details = show.get("details") if isinstance(show.get("details"), Mapping) else {}
    assert isinstance(details, Mapping)
    quant = details.get("quantization_level") or None
    if quant is None:
        ft = info.get("general.file_type")
        if isinstance(ft, int | float) and not isinstance(ft, bool) and math.isfinite(ft):
            quant = file_type_name(int(ft))
    return str(quant).upper() if quant else None


def _active_params(info: Mapping[str, Any], k: Callable[[str], str], total_params: float, layers: int, hidden: int) -> float:
    """Parameters read per token: mixture of experts runs only expert_used_count of expert_count FFNs."""
    experts = _number(info, k("expert_count"), required=False)
    experts_used = _number(info, k("expert_used_count"), required=False)
    if not (experts and experts_used and experts > experts_used):
        return total_params
    ffn = _number(info, k("expert_feed_forward_length"), required=False)
    ffn = ffn or _number(info, k("feed_forward_length"), required=False)
    if not ffn:
        return total_params * experts_used / experts
    # Three matrices (gate, up, down) of d × ffn per expert per layer.
    idle = layers * (experts - experts_used) * 3.0 * hidden * ffn
    return max(total_params - idle, total_params * experts_used / experts)


def _weight_bytes(size_bytes: int | None, total_params: float, quant: str | None) -> tuple[float, bool]:
    """All weights' bytes: the GGUF's size where known, else parameters × the quantization's bits per weight
    (and True: estimated)."""
    if size_bytes is not None and size_bytes > 0:
        return float(size_bytes), False
    bpw = bits_per_weight(quant)
    if bpw is None:
        raise ModelFactsError(
            f"no model size given and no bits-per-weight known for quantization {quant!r}; pass the size from /api/tags"
        )
    return total_params * bpw / 8.0, True


def _sliding_window(info: Mapping[str, Any], k: Callable[[str], str], arch: str, layers: int) -> tuple[int | None, int]:
    """The sliding window and how many layers use it: n − 1 of every n layers, n from the GGUF or the
    architecture (llama.cpp's set_swa_pattern); (None, 0) for a model whose every layer sees the whole context."""
    window = _number(info, k("attention.sliding_window"), required=False)
    if not window or window <= 0:
        return None, 0
    given = info.get(k("attention.sliding_window_pattern"))
    if isinstance(given, list) and given and all(isinstance(v, bool) for v in given):
        return int(window), sum(given)  # one flag per layer (the GGUF's own pattern)
    n = given if isinstance(given, int) and not isinstance(given, bool) and given >= 1 else SWA_PATTERNS.get(arch)
    if n is None:
        return None, 0
    return int(window), sum(1 for il in range(layers) if il % n < n - 1)
