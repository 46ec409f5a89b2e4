"""Models as their GGUFs describe them, for the memory and what-if checks."""

from analysis.model_facts import ModelFacts

# Gemma 3 270M (llama-server's print_info): 18 layers, 15 of them sliding over 512 tokens; the engine tests' model.
GEMMA_3_270M = ModelFacts(
    architecture="gemma3",
    params=2.68e8,
    total_params=2.68e8,
    layers=18,
    hidden=640,
    heads=4,
    kv_heads=1,
    head_dim=256,
    value_head_dim=256,
    context_length=32768,
    quantization="Q4_K_M",
    weights_bytes=253e6,
    weights_bytes_estimated=False,
    sliding_window=512,
    swa_layers=15,
    ffn_length=2048,
)
