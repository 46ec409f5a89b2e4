"""A deterministic stand-in tokenizer: words and single punctuation marks.

Real tokenizers split text into sub-word pieces; for timing only the count
matters, so one word or one punctuation mark is one token here. Token ids are
a stable hash (crc32), so the same text gives the same ids in every process,
which is what the prompt cache compares.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterator

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_SYLLABLES = ("ka", "lo", "mi", "ra", "te", "su", "na", "vo", "pel", "dor", "ith", "an", "qua", "zen", "bri", "tol")
# 256 two-syllable and 64 three-syllable pseudo-words.
_WORDS: tuple[str, ...] = tuple(a + b for a in _SYLLABLES for b in _SYLLABLES) + tuple(
    a + b + c for a in _SYLLABLES[:4] for b in _SYLLABLES[4:8] for c in _SYLLABLES[8:12]
)
VOCAB_SIZE = 128_000
_SPECIAL_BASE = 128_000  # ids of template tokens (BOS, headers, EOT) live above the word ids


def tokenize(text: str) -> list[str]:
    """Split text into tokens: runs of word characters, or one punctuation mark."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """How many tokens the simulator counts for ``text``."""
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def token_id(token: str) -> int:
    """Stable id of one token (same in every process, unlike ``hash``)."""
    return zlib.crc32(token.encode("utf-8")) % VOCAB_SIZE


def encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    return [token_id(t) for t in _TOKEN_RE.findall(text)]


def special_id(n: int) -> int:
    """Id of the n-th template token (never produced by ``encode``)."""
    return _SPECIAL_BASE + n


def make_prompt(n_tokens: int, seed: int = 0) -> str:
    """Text of exactly ``n_tokens`` tokens (pseudo-words with some punctuation)."""
    if n_tokens < 0:
        raise ValueError("n_tokens must be >= 0")
    rng = random.Random(seed)
    parts: list[str] = []
    for i in range(n_tokens):
        # A punctuation mark now and then, never first, never two in a row.
        if i and parts[-1][-1].isalnum() and rng.random() < 0.08:
            parts.append(rng.choice(".,;:?!"))
        else:
            parts.append((" " if i else "") + rng.choice(_WORDS))
    return "".join(parts)


class TextStream:
    """Deterministic pseudo-words, one token per ``next()``; joined text re-counts to the same number."""

    def __init__(self, seed: int | str) -> None:
        self._rng = random.Random(seed)
        self._last_was_word = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._last_was_word and self._rng.random() < 0.1:
            self._last_was_word = False
            return self._rng.choice(".,")
        self._last_was_word = True
        return " " + self._rng.choice(_WORDS)

    def plausible_length(self) -> int:
        """How many tokens an answer "naturally" has when num_predict does not cap it."""
        return self._rng.randint(24, 160)
