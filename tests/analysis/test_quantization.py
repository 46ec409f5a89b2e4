"""One table of quantizations, keyed by llama.cpp's own file-type names (the ``gguf`` package's ``LlamaFileType``)."""

from __future__ import annotations

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from analysis.quantization import (
    QUANTIZATIONS,
    bits_per_weight,
    file_type_name,
    file_type_number,
    is_high_precision,
    ollama_name,
)


@pytest.mark.parametrize(
    ("number", "name"),
    [(0, "F32"), (1, "F16"), (15, "Q4_K_M"), (28, "IQ2_S"), (29, "IQ2_M"), (30, "IQ4_XS"), (32, "BF16"), (38, "MXFP4")],
)
def test_file_types_are_llama_hs(number: int, name: str) -> None:
    assert file_type_name(number) == name
    assert file_type_number(name) == number and file_type_number(name.lower()) == number


def test_numbers_llama_cpp_does_not_define_have_no_name() -> None:
    assert file_type_name(4) is None  # Q4_1_SOME_F16, removed from llama.h
    assert file_type_name(LlamaFileType.GUESSED.value) is None  # "not specified in the model file"
    assert file_type_number("Q4_K") is None  # a tensor type, not a file type


def test_every_row_is_a_file_type_and_every_file_type_one_name() -> None:
    names = {ollama_name(ft.name) for ft in LlamaFileType if ft is not LlamaFileType.GUESSED}
    assert set(QUANTIZATIONS) <= names
    assert len(names) == len(LlamaFileType) - 1  # no two file types share a name
    for name in QUANTIZATIONS:
        number = file_type_number(name)
        assert number is not None and file_type_name(number) == name


@pytest.mark.parametrize(
    ("name", "block_type"),
    [
        ("Q5_0", GGMLQuantizationType.Q5_0),
        ("Q5_1", GGMLQuantizationType.Q5_1),
        ("Q4_1", GGMLQuantizationType.Q4_1),
        ("MXFP4", GGMLQuantizationType.MXFP4),
    ],
)
def test_block_figures_are_ggmls_block_layouts(name: str, block_type: GGMLQuantizationType) -> None:
    """Where no whole-model figure is published, the row holds the block's (docs/physics.md §9)."""
    weights_per_block, bytes_per_block = GGML_QUANT_SIZES[block_type]
    assert bits_per_weight(name) == pytest.approx(bytes_per_block * 8 / weights_per_block)


def test_whole_model_figures_lie_above_their_main_blocks() -> None:
    """Some tensors stay at higher precision, so a whole file costs more than its main block layout."""
    for name, block_type in (("Q4_K_M", GGMLQuantizationType.Q4_K), ("Q8_0", GGMLQuantizationType.Q8_0)):
        weights_per_block, bytes_per_block = GGML_QUANT_SIZES[block_type]
        assert (bits_per_weight(name) or 0) > bytes_per_block * 8 / weights_per_block


def test_lookups_ignore_case_and_say_unknown() -> None:
    assert bits_per_weight("q4_k_m") == QUANTIZATIONS["Q4_K_M"].bits_per_weight
    assert bits_per_weight("IQ3_M") is None and bits_per_weight(None) is None  # a file type we know no figure for
    assert is_high_precision("bf16") and is_high_precision("Q8_0") and not is_high_precision("Q6_K")
    assert not is_high_precision(None)
