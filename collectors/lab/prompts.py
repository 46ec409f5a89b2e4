"""Prompts of a chosen length without the server's tokenizer.

Common short English words are one token each in the tokenizers of the usual
models (Llama 3, Qwen 2.5, Gemma), so a prompt of n such words is about n
tokens. The estimate is only a target: every experiment reports the server's
own ``prompt_eval_count`` as the truth, and :class:`TokenEstimator` learns the
real ratio from it as the run goes.
"""

from __future__ import annotations

import random

_WORD_TEXT = """
    the of and to in is was for on that with as by at from his her they this had have are not but
    one all were when we there can an which their said if do will each about how up out them then she
    many some so these would other into has more two like him see time could no make than first been
    its who now people my made over did down only way find use may water long little very after words
    called just where most know get through back much before go good new write our used me man too any
    day same right look think also around another came come work three word must because does part even
    place well such here take why help put different away again off went old number great tell men say
    small every found still between name should home big give air line set own under read last never us
    left end along while might next sound below saw something thought both few those always show large
    often together asked house world going want school important until form food keep children feet land
    side without boy once animal life enough took four head above kind began almost live page got earth
    need far hand high year mother light country father let night picture being study second soon story
    since white ever paper hard near sentence better best across during today however sure knew try told
    young sun thing whole hear example heard several change answer room sea against top turned learn point
    city play toward five himself usually money seen car morning river stone cloud green table window
    """
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class TokenEstimator:
    """Words per token, learned from what the server counted."""

    def __init__(self, tokens_per_word: float = 1.0) -> None:
        self.tokens_per_word = tokens_per_word

    def words_for(self, n_tokens: int) -> int:
        return max(1, round(n_tokens / self.tokens_per_word))

    def learn(self, n_words: int, counted_tokens: int | None, overhead_tokens: int = 0) -> None:
        """Update from one prompt of ``n_words`` that the server counted as ``counted_tokens``."""
        if counted_tokens is None or n_words < 32:
            return  # too short to tell the words from the template's own tokens
        ratio = (counted_tokens - overhead_tokens) / n_words
        if 0.5 <= ratio <= 3.0:
            self.tokens_per_word = ratio


def random_words(n_words: int, rng: random.Random) -> str:
    """``n_words`` random common words, in sentences, so the text is unique from its first word."""
    parts: list[str] = []
    for i in range(n_words):
        w = rng.choice(WORDS)
        if i % 12 == 0:
            w = w.capitalize()
        parts.append(w + ("." if i % 12 == 11 else ""))
    return " ".join(parts)


def prompt_of(n_tokens: int, rng: random.Random, estimator: TokenEstimator) -> tuple[str, int]:
    """A fresh prompt of about ``n_tokens`` tokens; returns (text, words)."""
    n_words = estimator.words_for(n_tokens)
    return random_words(n_words, rng), n_words
