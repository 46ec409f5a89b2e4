"""Why before any request, with models installed (/api/tags) but none loaded: the preview explains the user's own
models, through the same ``build_why`` as every other view, and the Model selectbox switches between them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from analysis.model_facts import TYPICAL_8B_Q4_K_M, TYPICAL_MODEL_NAME, is_embedding_model
from analysis.records import InstalledModel
from bench.pages_fixture import gpu_sample, status_rows
from pages.why.view import build_why, default_preview_model, preview_choices
from sim.catalog import BY_NAME
from store.ops import PutGpuSamples, PutInstalledModels, PutLoadedModels, PutModelInfo
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.why_page import open_why, page_text, show_json

GIB = 1024**3
INSTALLED = ["llama3.1:8b", "gpt-oss:20b", "llama3.1:70b", "llama3.2:latest", "nomic-embed-text:latest"]


def installed(name: str, ts: float, modified: float, caps: tuple[str, ...] | None = None) -> InstalledModel:
    m = BY_NAME[name]
    return InstalledModel(
        ts,
        name,
        name,
        m.digest,
        m.size_bytes,
        m.parameter_size,
        m.quantization,
        m.family,
        modified,
        m.capabilities if caps is None else caps,
    )


def build(data_dir: Path, now: float, *, shows: bool = True) -> None:
    w_ = StoreWriter(db_path(data_dir))
    try:
        w_.write(PutGpuSamples([gpu_sample(now - i, 2.0) for i in range(5)]))  # an RTX 4090: 24 GiB
        # Newest first as Ollama lists them; the embedding model without capabilities (older Ollama): its family tells.
        w_.write(
            PutInstalledModels([installed(n, now, now - 100 * i, () if "embed" in n else None) for i, n in enumerate(INSTALLED)])
        )
        if shows:
            for n in INSTALLED:
                w_.write(PutModelInfo(BY_NAME[n].digest, n, show_json(n)))
        w_.write(PutLoadedModels(now - 1, []))
        status_rows(w_, now, data_dir)
    finally:
        w_.close()


def sentence_with(sentences: list[str], what: str) -> str:
    return next(s for s in sentences if what in s)


def test_the_preview_explains_an_installed_model_and_switches(data_dir: Path) -> None:
    now = time.time()
    build(data_dir, now)
    db = db_path(data_dir)
    at = open_why()
    box = at.selectbox(key="why_preview_model")
    # Embedding models are not offered; the largest model that fits the GPU's 24 GiB is chosen (not the 70B).
    assert box.options[0] == "llama3.1:8b · 8.0B · Q4_K_M · 4.92 GB"  # name, size class, quantization, file size
    assert [o.split(" · ")[0] for o in box.options] == ["llama3.1:8b", "gpt-oss:20b", "llama3.1:70b", "llama3.2:latest"]
    assert box.value == "gpt-oss:20b"
    text = page_text(at)
    assert "Ceilings for gpt-oss:20b, installed but not loaded" in text and "(/api/show, read " in text
    assert "Left out: nomic-embed-text:latest (embedding" in text
    assert TYPICAL_MODEL_NAME not in text
    # One story: the page shows what build_why says for that model, from its stored /api/show.
    mine = build_why(db, "gpt-oss:20b", now, preview=(None, None))
    typical = build_why(db, TYPICAL_MODEL_NAME, now, preview=(None, TYPICAL_8B_Q4_K_M))
    assert mine is not None and typical is not None and mine.facts is not None and mine.ceilings is not None
    assert mine.facts.architecture == "gptoss" and mine.facts_read_at_unix_s is not None
    assert mine.sentences and all(s in text for s in mine.sentences)
    assert "gpt-oss:20b: gptoss" in text  # the facts line
    assert mine.ceilings.decode_ceiling_tok_s != pytest.approx(typical.ceilings.decode_ceiling_tok_s if typical.ceilings else 0)

    box.select("llama3.1:70b").run()
    assert not at.exception, [e.value for e in at.exception]
    big = build_why(db, "llama3.1:70b", now, preview=(None, None))
    assert big is not None and big.ceilings is not None and big.facts is not None and big.facts.layers == 80
    text_70b = page_text(at)
    assert "Ceilings for llama3.1:70b, installed but not loaded" in text_70b
    assert all(s in text_70b for s in big.sentences)
    # The ceiling sentences changed with the model: 70B parameters' weights are read per token instead of 21B.
    decode_20b, decode_70b = sentence_with(mine.sentences, "decode"), sentence_with(big.sentences, "decode")
    assert decode_20b != decode_70b and decode_20b not in text_70b
    assert big.ceilings.decode_ceiling_tok_s < mine.ceilings.decode_ceiling_tok_s
    assert "llama3.1:70b is not loaded right now" in text_70b


def test_a_model_whose_description_is_not_read_yet_says_so(data_dir: Path) -> None:
    build(data_dir, time.time(), shows=False)
    at = open_why()
    assert at.selectbox(key="why_preview_model").value == "gpt-oss:20b"
    assert any("No model facts for gpt-oss:20b yet" in i.value.replace("\\", "") for i in at.info)
    assert not at.exception


def test_preview_choices_and_the_default() -> None:
    def m(name: str, size: int | None) -> InstalledModel:
        return InstalledModel(0.0, name, name, "d", size, None, None, "llama", None)

    offered = [m("a", 30 * GIB), m("b", 5 * GIB), m("c", 12 * GIB), m("d", None)]
    assert default_preview_model(offered, ["d:latest"], 24 * GIB) == "d"  # the loaded one first
    assert default_preview_model(offered, [], 24 * GIB) == "c"  # the largest that fits
    assert default_preview_model(offered, [], 1 * GIB) == "a"  # none fits: the first
    assert default_preview_model(offered, [], None) == "a"  # memory unknown: the first
    assert default_preview_model([], [], 24 * GIB) is None
    assert is_embedding_model("nomic-bert", ()) and is_embedding_model("bert", ("completion",))
    assert is_embedding_model("qwen3", ("embedding",)) and not is_embedding_model("qwen3", ("embedding", "completion"))
    assert not is_embedding_model("llama", ()) and not is_embedding_model(None, ())


def test_preview_choices_read_the_store(data_dir: Path) -> None:
    now = time.time()
    assert preview_choices(db_path(data_dir), None, now) is None  # no store yet
    build(data_dir, now)
    choices = preview_choices(db_path(data_dir), None, now)
    assert choices is not None
    assert [x.name for x in choices.offered] == INSTALLED[:4] and choices.embedding == ["nomic-embed-text:latest"]
    assert (choices.default, choices.memory_bytes) == ("gpt-oss:20b", 24 * GIB)


def test_an_embedding_model_known_only_from_its_show_is_left_out(data_dir: Path) -> None:
    now = time.time()
    w_ = StoreWriter(db_path(data_dir))
    try:
        # Older Ollama: no capabilities in /api/tags, a family that does not say it; /api/show says "embedding".
        emb = InstalledModel(
            now, "qwen3-embedding:0.6b", "qwen3-embedding:0.6b", "e" * 64, 639_000_000, "595.78M", "Q8_0", "qwen3", now, ()
        )
        w_.write(PutInstalledModels([emb, installed("llama3.2:latest", now, now - 10, ())]))
        w_.write(PutModelInfo("e" * 64, emb.name, {"capabilities": ["embedding"], "model_info": {}}))
    finally:
        w_.close()
    choices = preview_choices(db_path(data_dir), None, now)
    assert choices is not None
    assert [m.name for m in choices.offered] == ["llama3.2:latest"] and choices.embedding == ["qwen3-embedding:0.6b"]
    assert choices.memory_bytes is None and choices.default == "llama3.2:latest"  # no GPU sample: the first
