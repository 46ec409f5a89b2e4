"""Models the simulator serves, with their real architecture facts.

Figures come from the models' GGUF headers as Ollama publishes them
(ollama.com/library). ``size_bytes`` is the GGUF file size, i.e. the weight
bytes streamed per decode step (W in docs/physics.md §1). Digests are synthetic
(sha256 of the name) because the simulator has no blobs; they have the same
shape as Ollama's: 64 hex characters, no prefix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from analysis.quantization import file_type_number
from analysis.roofline import kv_bytes_per_token


@dataclass(frozen=True)
class ModelFacts:
    name: str  # with tag, e.g. "llama3.1:8b"
    architecture: str  # general.architecture, prefix of model_info keys
    family: str
    parameter_count: int
    parameter_size: str  # as Ollama prints it, e.g. "8.0B"
    quantization: str
    size_bytes: int  # GGUF file bytes
    block_count: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    head_dim: int
    context_length: int
    feed_forward_length: int
    vocab_size: int
    rope_freq_base: float
    modified_at: str  # RFC3339, when it was "pulled"
    capabilities: tuple[str, ...] = ("completion", "tools")
    stop: tuple[str, ...] = field(default_factory=tuple)
    template: str = ""
    license: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(("phasewatch-sim:" + self.name).encode()).hexdigest()

    @property
    def kv_bytes_per_token(self) -> float:
        """F16 KV cache bytes per token of context (all layers)."""
        return kv_bytes_per_token(self.block_count, self.head_count_kv, self.head_dim)

    @property
    def think_levels(self) -> bool:
        """Takes ``think`` as a level (Ollama's harmony parser, gpt-oss); other thinking models only as a bool."""
        return self.family == "gptoss"

    @property
    def low_bit(self) -> bool:
        """4-6 bit weights: decode reaches a lower share of bandwidth (dequantization work)."""
        return self.quantization not in ("F16", "BF16", "Q8_0")

    def details(self) -> dict[str, object]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization,
        }

    def model_info(self) -> dict[str, object]:
        """GGUF key/values as /api/show reports them (arrays longer than 5 become [])."""
        a = self.architecture
        return {
            "general.architecture": a,
            "general.basename": self.name.split(":")[0],
            "general.file_type": file_type_number(self.quantization),
            "general.parameter_count": self.parameter_count,
            "general.quantization_version": 2,
            f"{a}.attention.head_count": self.head_count,
            f"{a}.attention.head_count_kv": self.head_count_kv,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attention.layer_norm_rms_epsilon": 1e-05 if a == "llama" else 1e-06,
            f"{a}.block_count": self.block_count,
            f"{a}.context_length": self.context_length,
            f"{a}.embedding_length": self.embedding_length,
            f"{a}.feed_forward_length": self.feed_forward_length,
            f"{a}.rope.freq_base": self.rope_freq_base,
            f"{a}.vocab_size": self.vocab_size,
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "llama-bpe" if a == "llama" else "qwen2",
            "tokenizer.ggml.tokens": [],
            "tokenizer.ggml.token_type": [],
            "tokenizer.ggml.merges": [],
        }


_LLAMA3_TEMPLATE = (
    "{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
    "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>{{ end }}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
_QWEN_TEMPLATE = (
    "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)
_QWEN3_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
    "{{- if and $.IsThinkSet (not $.Think) }}<think>\n\n</think>\n\n{{ end }}"
)
_LLAMA_STOP = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_QWEN_STOP = ("<|im_start|>", "<|im_end|>")

MODELS: tuple[ModelFacts, ...] = (
    ModelFacts(
        name="llama3.1:8b",
        architecture="llama",
        family="llama",
        parameter_count=8_030_261_312,
        parameter_size="8.0B",
        quantization="Q4_K_M",
        size_bytes=4_920_753_328,
        block_count=32,
        embedding_length=4096,
        head_count=32,
        head_count_kv=8,
        head_dim=128,
        context_length=131072,
        feed_forward_length=14336,
        vocab_size=128256,
        rope_freq_base=500000.0,
        modified_at="2026-07-30T09:12:44.318274913Z",
        stop=_LLAMA_STOP,
        template=_LLAMA3_TEMPLATE,
        license="LLAMA 3.1 COMMUNITY LICENSE AGREEMENT",
    ),
    ModelFacts(
        name="llama3.2:latest",
        architecture="llama",
        family="llama",
        parameter_count=3_212_749_888,
        parameter_size="3.2B",
        quantization="Q4_K_M",
        size_bytes=2_019_393_189,
        block_count=28,
        embedding_length=3072,
        head_count=24,
        head_count_kv=8,
        head_dim=128,
        context_length=131072,
        feed_forward_length=8192,
        vocab_size=128256,
        rope_freq_base=500000.0,
        modified_at="2026-08-01T09:00:00.5Z",
        stop=_LLAMA_STOP,
        template=_LLAMA3_TEMPLATE,
        license="LLAMA 3.2 COMMUNITY LICENSE AGREEMENT",
    ),
    ModelFacts(
        name="qwen2.5:0.5b",
        architecture="qwen2",
        family="qwen2",
        parameter_count=494_032_768,
        parameter_size="494.03M",
        quantization="Q4_K_M",
        size_bytes=397_821_319,
        block_count=24,
        embedding_length=896,
        head_count=14,
        head_count_kv=2,
        head_dim=64,
        context_length=32768,
        feed_forward_length=4864,
        vocab_size=151936,
        rope_freq_base=1000000.0,
        modified_at="2026-07-12T18:40:02.77Z",
        stop=_QWEN_STOP,
        template=_QWEN_TEMPLATE,
        license="Apache License 2.0",
    ),
    ModelFacts(
        name="llama3.1:70b",
        architecture="llama",
        family="llama",
        parameter_count=70_553_706_496,
        parameter_size="70.6B",
        quantization="Q4_K_M",
        size_bytes=42_520_412_561,
        block_count=80,
        embedding_length=8192,
        head_count=64,
        head_count_kv=8,
        head_dim=128,
        context_length=131072,
        feed_forward_length=28672,
        vocab_size=128256,
        rope_freq_base=500000.0,
        modified_at="2026-06-02T21:03:15.0041Z",
        stop=_LLAMA_STOP,
        template=_LLAMA3_TEMPLATE,
        license="LLAMA 3.1 COMMUNITY LICENSE AGREEMENT",
    ),
    # A reasoning model: streams its thinking before the answer (``think`` on by default, as in Ollama).
    ModelFacts(
        name="qwen3:0.6b",
        architecture="qwen3",
        family="qwen3",
        parameter_count=751_632_384,
        parameter_size="751.63M",
        quantization="Q4_K_M",
        size_bytes=522_653_767,
        block_count=28,
        embedding_length=1024,
        head_count=16,
        head_count_kv=8,
        head_dim=128,
        context_length=40960,
        feed_forward_length=3072,
        vocab_size=151936,
        rope_freq_base=1000000.0,
        modified_at="2026-07-20T11:30:00.25Z",
        capabilities=("completion", "tools", "thinking"),
        stop=_QWEN_STOP,
        template=_QWEN3_TEMPLATE,
        license="Apache License 2.0",
    ),
    # A reasoning model with think levels (Ollama's harmony models): "low" | "medium" | "high"; it always
    # thinks (true/false leave the level at medium). Its weights are a mixture of experts; sim times them
    # as a dense model of the same size.
    ModelFacts(
        name="gpt-oss:20b",
        architecture="gptoss",
        family="gptoss",
        parameter_count=20_914_757_184,
        parameter_size="20.9B",
        quantization="MXFP4",
        size_bytes=13_780_154_624,
        block_count=24,
        embedding_length=2880,
        head_count=64,
        head_count_kv=8,
        head_dim=64,
        context_length=131072,
        feed_forward_length=2880,
        vocab_size=201088,
        rope_freq_base=150000.0,
        modified_at="2026-08-06T17:02:41.9Z",
        capabilities=("completion", "tools", "thinking"),
        stop=("<|start|>", "<|end|>", "<|return|>", "<|call|>"),
        license="Apache License 2.0",
    ),
    # An embedding model: /api/embed only (generate and chat answer 400, as in Ollama).
    ModelFacts(
        name="nomic-embed-text:latest",
        architecture="nomic-bert",
        family="nomic-bert",
        parameter_count=136_727_040,
        parameter_size="137M",
        quantization="F16",
        size_bytes=274_302_450,
        block_count=12,
        embedding_length=768,
        head_count=12,
        head_count_kv=12,
        head_dim=64,
        context_length=2048,
        feed_forward_length=3072,
        vocab_size=30522,
        rope_freq_base=1000.0,
        modified_at="2026-05-04T08:15:10.5Z",
        capabilities=("embedding",),
        license="Apache License 2.0",
    ),
)

BY_NAME: dict[str, ModelFacts] = {m.name: m for m in MODELS}


def find_model(name: str) -> ModelFacts | None:
    """Resolve a request's model string as Ollama does: exact name, else with ``:latest``."""
    if name in BY_NAME:
        return BY_NAME[name]
    if ":" not in name:
        return BY_NAME.get(name + ":latest")
    return None
