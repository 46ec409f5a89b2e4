"""The real engine for tests: find it (or say why not) and run ``python -m sim --engine llama-server``
(llama.cpp's server as a child process, as Ollama runs it).

Tests that need it are marked ``@pytest.mark.engine``. Without the llama-server binary or the GGUF they
skip, unless ``PHASEWATCH_REQUIRE_ENGINE=1`` (CI sets it through scripts/test.sh): then they fail, so a
broken engine build can never pass as a skip.
"""

from __future__ import annotations

import contextlib
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


def _missing(problems: list[str]) -> None:
    if problems:
        message = "engine tests need the real engine: " + "; ".join(problems)
        if os.environ.get("PHASEWATCH_REQUIRE_ENGINE") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def require_llama_server() -> tuple[Path, Path]:
    """(llama-server binary, GGUF); skips (or fails under PHASEWATCH_REQUIRE_ENGINE=1) when either is missing."""
    from sim.gguf_model import EngineUnavailable
    from sim.llama_server_engine import find_llama_server

    problems: list[str] = []
    binary = Path()
    try:
        binary = find_llama_server()
    except EngineUnavailable as exc:
        problems.append(str(exc))
    path = gguf_path()
    if not path.is_file():
        problems.append(f"no GGUF at {path} (python scripts/get_gemma.py)")
    _missing(problems)
    return binary, path


@contextlib.contextmanager
def start_server_engine(*args: str) -> Iterator[SimProcess]:
    """``python -m sim --engine llama-server`` on a free port, serving the Gemma GGUF (the child starts on first use)."""
    _, path = require_llama_server()
    with start_sim("--engine", "llama-server", "--gguf", str(path), "--threads", str(THREADS), *args) as sim:
        yield sim


def engine_state(sim: SimProcess) -> dict[str, Any]:
    """``GET /sim/engine`` as a whole (the llama-server engine adds ``runner``: pid, port, argv)."""
    status, body = http_json(sim, "GET", "/sim/engine")
    assert status == 200, body
    return dict(body)


def engine_log(sim: SimProcess) -> dict[str, dict[str, Any]]:
    """``GET /sim/engine``: the engine's own account of each request (llama-server's timings), by request id."""
    status, body = http_json(sim, "GET", "/sim/engine")
    assert status == 200, body
    return {r["id"]: r for r in body["requests"]}


def words_prompt(n_words: int, seed: int) -> str:
    """Plain English-like text; Gemma's tokenizer makes roughly one token per word of it."""
    import random

    rng = random.Random(seed)
    vocab = [
        "time",
        "person",
        "year",
        "way",
        "day",
        "thing",
        "man",
        "world",
        "life",
        "hand",
        "part",
        "child",
        "eye",
        "woman",
        "place",
        "work",
        "week",
        "case",
        "point",
        "government",
        "company",
        "number",
        "group",
        "problem",
        "fact",
        "river",
        "city",
        "house",
        "water",
        "light",
        "story",
        "music",
        "garden",
    ]
    return " ".join(rng.choice(vocab) for _ in range(n_words))
