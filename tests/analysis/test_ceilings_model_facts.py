"""Model facts from /api/show JSON shaped as Ollama sends it (docs/ollama-api.md §6)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.model_facts import ModelFactsError, model_facts_from_show

LLAMA32_SHOW: dict[str, Any] = {
    "license": "…",
    "parameters": 'stop "<|eot_id|>"',
    "details": {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "3.2B",
        "quantization_level": "Q4_K_M",
    },
    "model_info": {
        "general.architecture": "llama",
        "general.parameter_count": 3212749888,
        "general.file_type": 15,
        "llama.context_length": 131072,
        "llama.embedding_length": 3072,
        "llama.block_count": 28,
        "llama.attention.head_count": 24,
        "llama.attention.head_count_kv": 8,
        "llama.vocab_size": 128256,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [],
    },
    "capabilities": ["completion", "tools"],
}

# Gemma 3 gives key_length explicitly (256), which differs from hidden/heads (1152/4 = 288).
GEMMA3_1B_SHOW: dict[str, Any] = {
    "details": {"family": "gemma3", "quantization_level": "Q4_K_M"},
    "model_info": {
        "general.architecture": "gemma3",
        "general.parameter_count": 999885952,
        "gemma3.block_count": 26,
        "gemma3.embedding_length": 1152,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.context_length": 32768,
    },
}


def test_llama32_facts() -> None:
    f = model_facts_from_show(LLAMA32_SHOW, size_bytes=2019393189)
    assert f.architecture == "llama"
    assert (f.layers, f.hidden, f.heads, f.kv_heads, f.head_dim) == (28, 3072, 24, 8, 128)
    assert f.params == 3212749888 and f.total_params == f.params
    assert f.context_length == 131072
    assert f.quantization == "Q4_K_M"
    assert f.weights_bytes == 2019393189 and not f.weights_bytes_estimated
    assert f.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
    assert not f.high_precision


def test_gemma3_uses_key_length_not_hidden_over_heads() -> None:
    f = model_facts_from_show(GEMMA3_1B_SHOW, size_bytes=815_000_000)
    assert f.architecture == "gemma3"
    assert f.head_dim == 256
    assert f.kv_bytes_per_token == 26 * 1 * (256 + 256) * 2


def test_qwen2_prefix_and_estimated_weights() -> None:
    show = {
        "details": {"quantization_level": "F16"},
        "model_info": {
            "general.architecture": "qwen2",
            "general.parameter_count": 7_615_616_512,
            "qwen2.block_count": 28,
            "qwen2.embedding_length": 3584,
            "qwen2.attention.head_count": 28,
            "qwen2.attention.head_count_kv": 4,
            "qwen2.context_length": 32768,
        },
    }
    f = model_facts_from_show(show, size_bytes=None)
    assert f.head_dim == 128 and f.kv_heads == 4
    assert f.weights_bytes_estimated
    assert f.weights_bytes == pytest.approx(7_615_616_512 * 2, rel=1e-3)
    assert f.high_precision


def test_quantization_from_file_type_when_details_lack_it() -> None:
    show = copy.deepcopy(LLAMA32_SHOW)
    del show["details"]
    assert model_facts_from_show(show, 1).quantization == "Q4_K_M"


def test_missing_kv_heads_means_multi_head_attention() -> None:
    show = copy.deepcopy(LLAMA32_SHOW)
    del show["model_info"]["llama.attention.head_count_kv"]
    assert model_facts_from_show(show, 1).kv_heads == 24


def test_moe_active_params() -> None:
    # Mixtral-8x7B-like: 8 experts, 2 used, FFN 14336; about 12.9 B active of 46.7 B.
    show = {
        "details": {"quantization_level": "Q4_0"},
        "model_info": {
            "general.architecture": "llama",
            "general.parameter_count": 46_702_792_704,
            "llama.block_count": 32,
            "llama.embedding_length": 4096,
            "llama.attention.head_count": 32,
            "llama.attention.head_count_kv": 8,
            "llama.expert_count": 8,
            "llama.expert_used_count": 2,
            "llama.feed_forward_length": 14336,
        },
    }
    f = model_facts_from_show(show, size_bytes=26_400_000_000)
    assert f.params == pytest.approx(12.9e9, rel=0.02)
    assert f.weights_bytes == pytest.approx(26.4e9 * f.params / f.total_params)
    assert (f.experts, f.experts_used) == (8, 2)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.pop("model_info"), "model_info"),
        (lambda s: s["model_info"].pop("general.architecture"), "general.architecture"),
        (lambda s: s["model_info"].pop("llama.block_count"), "llama.block_count"),
        (lambda s: s["model_info"].pop("llama.embedding_length"), "llama.embedding_length"),
        (lambda s: s["model_info"].pop("llama.attention.head_count"), "llama.attention.head_count"),
        (lambda s: s["model_info"].pop("general.parameter_count"), "general.parameter_count"),
        (lambda s: s["model_info"].__setitem__("llama.block_count", "many"), "not a number"),
        (lambda s: s["model_info"].__setitem__("llama.block_count", 0), "positive integer"),
        (lambda s: s["model_info"].__setitem__("llama.attention.head_count_kv", []), "verbose"),
    ],
)
def test_clear_errors(mutate: Any, message: str) -> None:
    show = copy.deepcopy(LLAMA32_SHOW)
    mutate(show)
    with pytest.raises(ModelFactsError, match=message):
        model_facts_from_show(show, 1)


def test_no_size_and_unknown_quant_is_an_error() -> None:
    show = copy.deepcopy(LLAMA32_SHOW)
    show["details"]["quantization_level"] = "Q9_WEIRD"
    with pytest.raises(ModelFactsError, match="Q9_WEIRD"):
        model_facts_from_show(show, None)


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=True), st.text(max_size=8))
_json = st.recursive(
    _json_scalar, lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=8), ch, max_size=4), max_leaves=12
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([*list(LLAMA32_SHOW["model_info"]), "llama.attention.key_length"]), _json))
def test_free_form_model_info_gives_facts_or_model_facts_error(overrides: dict[str, Any]) -> None:
    show = copy.deepcopy(LLAMA32_SHOW)
    show["model_info"].update(overrides)
    try:
        f = model_facts_from_show(show, 2_000_000_000)
    except ModelFactsError:
        return
    assert f.layers > 0 and f.hidden > 0 and f.params > 0 and f.weights_bytes > 0
    assert f.kv_bytes_per_token >= 0


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(_json)
def test_any_json_gives_facts_or_model_facts_error(obj: Any) -> None:
    with contextlib.suppress(ModelFactsError):
        model_facts_from_show(obj, None)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("llama.attention.head_count", [0.4]),
        ("llama.attention.key_length", -3),
        ("llama.attention.head_count", 5000),
        ("general.file_type", float("inf")),
    ],
)
def test_degenerate_values(key: str, value: Any) -> None:
    show = copy.deepcopy(LLAMA32_SHOW)
    show["model_info"][key] = value
    if key == "general.file_type":
        del show["details"]
        assert model_facts_from_show(show, 1).quantization is None
        return
    with pytest.raises(ModelFactsError, match="attention"):
        model_facts_from_show(show, 1)
