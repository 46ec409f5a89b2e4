"""The real llama.cpp engine for tests: find it (or say why not) and run ``python -m sim --engine llama-cpp``.

Tests that need it are marked ``@pytest.mark.engine``. Without llama-cpp-python or the GGUF they
skip, unless ``PHASEWATCH_REQUIRE_ENGINE=1`` (CI sets it through scripts/test.sh): then they fail,
so a broken engine install can never pass as a skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.sim_process import SimProcess, http_json, start_sim

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_GGUF = REPO_ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
MODEL = "gemma3:270m"
THREADS = 2
# Greedy and no repeat penalty: deterministic text, and the cheapest sampling over Gemma's 262k-token vocabulary.
GREEDY: dict[str, Any] = {"temperature": 0, "repeat_penalty": 1.0, "seed": 7}


def gguf_path() -> Path:
    return Path(os.environ.get("PHASEWATCH_GGUF", str(DEFAULT_GGUF)))


def require_engine() -> Path:
    """The GGUF to serve; skips (or fails under PHASEWATCH_REQUIRE_ENGINE=1) when the engine is not installed."""
    problems: list[str] = []
    if importlib.util.find_spec("llama_cpp") is None:
        problems.append(
            'llama-cpp-python is missing (CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir -r requirements-engine.txt)'
        )
    path = gguf_path()
    if not path.is_file():
        problems.append(f"no GGUF at {path} (python scripts/get_gemma.py)")
    if problems:
        message = "engine tests need the real engine: " + "; ".join(problems)
        if os.environ.get("PHASEWATCH_REQUIRE_ENGINE") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


@contextlib.contextmanager
def start_engine(*args: str) -> Iterator[SimProcess]:
    """``python -m sim --engine llama-cpp`` on a free port, serving the Gemma GGUF."""
    path = require_engine()
    with start_sim("--engine", "llama-cpp", "--gguf", str(path), "--threads", str(THREADS), *args) as sim:
        yield sim


def engine_log(sim: SimProcess) -> dict[str, dict[str, Any]]:
    """``GET /sim/engine``: llama.cpp's own counters, by request id."""
    status, body = http_json(sim, "GET", "/sim/engine")
    assert status == 200, body
    return {r["id"]: r for r in body["requests"]}


def words_prompt(n_words: int, seed: int) -> str:
    """Plain English-like text; Gemma's tokenizer makes roughly one token per word of it."""
    import random

    rng = random.Random(seed)
    vocab = [
        "time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part", "child", "eye",
        "woman", "place", "work", "week", "case", "point", "government", "company", "number", "group", "problem",
        "fact", "river", "city", "house", "water", "light", "story", "music", "garden",
    ]  # fmt: skip
    return " ".join(rng.choice(vocab) for _ in range(n_words))
