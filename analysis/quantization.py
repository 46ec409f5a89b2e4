"""Quantizations: what a GGUF's ``general.file_type`` is called, and what each costs per weight.

The number → name mapping is not ours: it is llama.cpp's ``llama_ftype`` (llama.h) as llama.cpp's own Python
package carries it, ``gguf.LlamaFileType`` (28 is ``MOSTLY_IQ2_S``, 30 ``MOSTLY_IQ4_XS``). The names are Ollama's
``quantization_level`` spellings of that enum: its name without the ``MOSTLY_``/``ALL_`` prefix
(``MOSTLY_Q4_K_M`` → ``Q4_K_M``), and ``MXFP4`` for ``MOSTLY_MXFP4_MOE``. ``QUANTIZATIONS`` holds the facts we
know per name, keyed by those names and nothing else.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# LlamaFileType names Ollama spells otherwise (the enum's name after the prefix is cut → Ollama's).
_OLLAMA_SPELLING = {"MXFP4_MOE": "MXFP4"}


@dataclass(frozen=True)
class Quantization:
    name: str  # Ollama's quantization_level, e.g. "Q4_K_M"
    # Whole-model bits per weight (docs/physics.md §9: Llama-3.1-8B figures; the block's where no whole-model one).
    bits_per_weight: float
    high_precision: bool = False  # F32/F16/BF16/Q8_0: decode reaches more of the bandwidth than with 4-6 bit weights


QUANTIZATIONS: dict[str, Quantization] = {
    q.name: q
    for q in (
        Quantization("F32", 32.0, high_precision=True),
        Quantization("F16", 16.0005, high_precision=True),
        Quantization("BF16", 16.0005, high_precision=True),
        Quantization("Q8_0", 8.5008, high_precision=True),
        Quantization("Q6_K", 6.5633),
        Quantization("Q5_K_M", 5.7036),
        Quantization("Q5_K_S", 5.5704),
        Quantization("Q5_0", 5.5),
        Quantization("Q5_1", 6.0),
        Quantization("Q4_K_M", 4.8944),
        Quantization("Q4_K_S", 4.6672),
        Quantization("Q4_0", 4.63),
        Quantization("Q4_1", 5.0),
        Quantization("Q3_K_L", 4.2979),
        Quantization("Q3_K_M", 3.91),
        Quantization("Q3_K_S", 3.6429),
        Quantization("Q2_K", 3.1593),
        Quantization("IQ4_NL", 4.6818),
        Quantization("IQ4_XS", 4.4597),
        Quantization("IQ3_S", 3.6606),
        Quantization("IQ3_XXS", 3.2548),
        Quantization("IQ2_S", 2.7403),
        Quantization("IQ2_XS", 2.5882),
        Quantization("IQ2_XXS", 2.3824),
        Quantization("IQ1_M", 2.1460),
        Quantization("IQ1_S", 2.0042),
        Quantization("MXFP4", 4.25),
    )
}


def bits_per_weight(name: str | None) -> float | None:
    """Whole-model bits per weight of a quantization (any case); None where we know no figure."""
    q = QUANTIZATIONS.get((name or "").upper())
    return q.bits_per_weight if q else None


def is_high_precision(name: str | None) -> bool:
    q = QUANTIZATIONS.get((name or "").upper())
    return q is not None and q.high_precision


def ollama_name(llama_file_type_name: str) -> str:
    """``MOSTLY_Q4_K_M`` → ``Q4_K_M``: a ``LlamaFileType`` member's name as Ollama's quantization_level."""
    short = llama_file_type_name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return _OLLAMA_SPELLING.get(short, short)


@functools.cache
def _names_by_number() -> dict[int, str]:
    # Imported on first use, not with this module: gguf loads numpy (about 0.1 s), which the collector and the
    # simulator would otherwise pay at every start without reading a GGUF.
    from gguf import LlamaFileType

    return {ft.value: ollama_name(ft.name) for ft in LlamaFileType if ft is not LlamaFileType.GUESSED}


def file_type_name(number: int) -> str | None:
    """A GGUF ``general.file_type`` as Ollama names it (28 → ``IQ2_S``); None for a number llama.cpp does not define."""
    return _names_by_number().get(number)


def file_type_number(name: str) -> int | None:
    """The ``general.file_type`` a GGUF of this quantization carries (``Q4_K_M`` → 15); None if there is none."""
    wanted = name.upper()
    return next((number for number, n in _names_by_number().items() if n == wanted), None)
