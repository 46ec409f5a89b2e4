"""sim's real engine serves an embedding GGUF as Ollama does (issue 41): a GGUF that declares
``<arch>.pooling_type`` is an embedding model (its capability, what /api/show says) and its runner is started with
``--embedding``; a generator's is not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sim.gguf_model import read_model_facts
from sim.llama_server_engine import ServerChild
from tests.support.engine_process import gguf_path


def engine_like(model: Any) -> Any:
    """What a runner reads of its engine (a real one needs a binary to start)."""
    return SimpleNamespace(
        binary="/bin/false",
        model=model,
        num_parallel=1,
        n_threads=2,
        flash_attn="auto",
        kv_cache_type="f16",
        default_keep_alive_ns=5 * 60 * 10**9,
        draft_gguf=None,  # no draft model: no speculative decoding
        draft_max_tokens=None,
    )


def test_a_pooling_gguf_is_an_embedding_model_and_its_runner_embeds(embed_gguf: Path) -> None:
    embed = read_model_facts(embed_gguf, "embedgemma:270m")
    plain = read_model_facts(gguf_path(), "gemma3:270m")
    assert embed.pooling_type == 1 and embed.capabilities == ("embedding",)
    assert embed.model_info()["gemma3.pooling_type"] == 1
    assert plain.pooling_type is None and plain.capabilities == ("completion",)
    assert "--embedding" in ServerChild(engine_like(embed), 2048, 512).argv
    assert "--embedding" not in ServerChild(engine_like(plain), 2048, 512).argv
