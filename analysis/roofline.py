"""Roofline formulas for LLM inference (docs/physics.md §2 to §4). Pure functions, SI units.

Decode, one token per step, must stream all weights plus the KV cache:
    bytes/token = W + KV(c),   KV(c) = 2 · L · h_kv · d_h · c · s
Prefill of P tokens does matrix work on all of them at once:
    FLOPs/token ≈ 2N + 2·L·d·P   (causal attention at average context P/2)
"""

from __future__ import annotations

KV_BYTES_PER_ELEMENT_F16 = 2.0


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float = KV_BYTES_PER_ELEMENT_F16) -> float:
    """Bytes of K and V cache that one token of context occupies (all layers)."""
    return 2.0 * layers * kv_heads * head_dim * bytes_per_element


def decode_bytes_per_token(weights_bytes: float, kv_bytes_per_tok: float, context_tokens: int) -> float:
    """Bytes one decode step reads for a single sequence: the weights plus its KV cache."""
    return weights_bytes + kv_bytes_per_tok * max(context_tokens, 0)


def decode_ceiling_tok_s(bandwidth_bytes_s: float, weights_bytes: float, kv_bytes_per_tok: float, context_tokens: int) -> float:
    """Upper bound on batch-1 decode speed: bandwidth over bytes read per token."""
    return bandwidth_bytes_s / decode_bytes_per_token(weights_bytes, kv_bytes_per_tok, context_tokens)


def speculative_decode_ceiling_tok_s(plain_ceiling_tok_s: float, tokens_per_step: float) -> float:
    """Upper bound on decode when each read of the weights verifies a draft and yields ``tokens_per_step`` tokens on
    average (the accepted ones plus the model's own): the one-token ceiling that many times. The draft's own reads
    only lower it, so it stays a bound."""
    return plain_ceiling_tok_s * max(tokens_per_step, 1.0)


def decode_flops_per_token(params: float, layers: int, hidden: int, context_tokens: int) -> float:
    """FLOPs for one decode token: 2N for the matmuls plus 4·L·c·d for attention."""
    return 2.0 * params + 4.0 * layers * max(context_tokens, 0) * hidden


def prefill_flops_per_token(params: float, layers: int, hidden: int, prompt_tokens: int) -> float:
    """Average FLOPs per prompt token when P tokens are evaluated together."""
    return 2.0 * params + 2.0 * layers * hidden * max(prompt_tokens, 0)


def prefill_ceiling_tok_s(peak_flops: float, params: float, layers: int, hidden: int, prompt_tokens: int) -> float:
    """Upper bound on prefill speed: compute over FLOPs per prompt token."""
    return peak_flops / prefill_flops_per_token(params, layers, hidden, prompt_tokens)


def prefill_memory_ceiling_tok_s(
    bandwidth_bytes_s: float, weights_bytes: float, prompt_tokens: int, ubatch_tokens: int = 512
) -> float:
    """Upper bound on prefill speed from memory: each micro-batch of up to ``ubatch_tokens`` reads all weights once.

    It only binds for short prompts (a few dozen tokens), where prefill is memory-bound like decode.
    """
    tokens_per_weight_pass = max(1, min(max(prompt_tokens, 1), ubatch_tokens))
    return bandwidth_bytes_s * tokens_per_weight_pass / weights_bytes


def blended_bandwidth_bytes_s(gpu_bandwidth_bytes_s: float, host_bandwidth_bytes_s: float, vram_fraction: float) -> float:
    """Effective bandwidth when a fraction of the weights sits in system memory.

    Layers run one after another, so times add: t = f/BW_gpu + (1-f)/BW_host per byte.
    """
    f = min(max(vram_fraction, 0.0), 1.0)
    if f >= 1.0:
        return gpu_bandwidth_bytes_s
    if f <= 0.0:
        return host_bandwidth_bytes_s
    return 1.0 / (f / gpu_bandwidth_bytes_s + (1.0 - f) / host_bandwidth_bytes_s)


def ridge_point_flop_per_byte(peak_flops: float, bandwidth_bytes_s: float) -> float:
    """Arithmetic intensity above which work is compute-bound."""
    return peak_flops / bandwidth_bytes_s


if __name__ == "__main__":  # the command line is its own module, so that this one imports nothing
    raise SystemExit("the command moved: python -m analysis.roofline_cli --help")
