"""The real engine's pure parts (no model needed): the GGUF header, prompts, sampling, stop strings, bad settings."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from analysis.model_facts import model_facts_from_show
from sim.backend import GenRequest
from sim.catalog import MODELS
from sim.gguf_model import (
    TRANSCRIPT_STOPS,
    EngineUnavailable,
    human_number,
    ollama_sampling,
    read_gguf_header,
    read_model_facts,
    render_prompt,
    stop_strings,
)
from sim.truth import TruthRecord
from tests.support.sim_process import REPO_ROOT


def test_human_number_is_ollamas_parameter_size() -> None:
    assert human_number(8_030_261_312) == "8.0B"
    assert human_number(494_032_768) == "494.03M"
    assert human_number(268_098_176) == "268.10M"
    assert human_number(7_000_000_000) == "7B"


def write_gguf(path: Path, file_type: int = 15, n_vocab: int = 7, big_endian: bool = False) -> None:
    """A small real GGUF v3, written by llama.cpp's own writer: key/values of each type, two F32 tensors."""
    w = gguf.GGUFWriter(path, "gemma3", endianess=gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE)
    w.add_name("Tiny")
    w.add_block_count(18)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_add_bos_token(True)
    w.add_array("general.tags", ["a", "b"])
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_context_length(2048)
    w.add_array("tiny.floats", [1e-6, 0.1])  # a short float32 array
    w.add_token_list([str(i) for i in range(n_vocab)])
    w.add_token_scores([float(i) for i in range(n_vocab)])
    w.add_file_type(file_type)
    w.add_tensor("token_embd.weight", np.zeros((n_vocab, 64), dtype=np.float32))  # GGUF dims [64, n_vocab]
    w.add_tensor("blk.0.attn_q.weight", np.zeros((128, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_header_is_read_with_its_types(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    h = read_gguf_header(path)
    assert h.metadata["gemma3.block_count"] == 18 and h.metadata["tokenizer.ggml.add_bos_token"] is True
    assert h.metadata["gemma3.attention.layer_norm_rms_epsilon"] == 1e-6  # float32's shortest decimal, as Go prints it
    assert h.metadata["tiny.floats"] == [1e-6, 0.1]
    assert h.metadata["general.tags"] == ["a", "b"]
    assert h.metadata["tokenizer.ggml.tokens"] == [] and h.metadata["tokenizer.ggml.scores"] == []  # > 5 items
    assert h.array_lengths["tokenizer.ggml.tokens"] == 7 and h.array_lengths["general.tags"] == 2
    assert h.parameter_count == 64 * 7 + 64 * 128
    facts = read_model_facts(path, "tiny:1")
    assert facts.quantization == "Q4_K_M" and facts.vocab_size == 7 and facts.block_count == 18
    assert "general.name" not in facts.model_info() and facts.model_info()["general.parameter_count"] == h.parameter_count
    assert len(facts.digest) == 64


def test_a_long_vocabulary_is_counted_not_read(tmp_path: Path) -> None:
    """The reader steps over a long string array (gguf's own reader builds two numpy views per string)."""
    for big_endian in (False, True):
        path = tmp_path / f"vocab_{big_endian}.gguf"
        write_gguf(path, n_vocab=50_000, big_endian=big_endian)
        h = read_gguf_header(path)
        assert h.array_lengths["tokenizer.ggml.tokens"] == 50_000 and h.metadata["tokenizer.ggml.tokens"] == []
        assert h.metadata["general.file_type"] == 15  # the key after the vocabulary: read from the right place
        assert h.parameter_count == 64 * 50_000 + 64 * 128


def test_file_type_28_is_iq2_s_to_the_simulator_and_to_analysis(tmp_path: Path) -> None:
    """llama.h: 28 is IQ2_S, 30 IQ4_XS. The simulator names it from the GGUF; analysis from /api/show."""
    for file_type, name in ((28, "IQ2_S"), (30, "IQ4_XS")):
        path = tmp_path / f"ft{file_type}.gguf"
        write_gguf(path, file_type=file_type)
        facts = read_model_facts(path, "tiny:1")
        assert facts.quantization == name
        show = {"details": facts.details(), "model_info": facts.model_info()}  # as sim/server.py's /api/show sends
        assert model_facts_from_show(show, None).quantization == name
        del show["details"]  # no quantization_level: analysis reads general.file_type itself
        assert model_facts_from_show(show, None).quantization == name


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    try:
        read_model_facts(bad)
    except EngineUnavailable as exc:
        assert "magic" in str(exc)
    else:
        raise AssertionError("read a file that is not GGUF")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 5))
    try:
        read_model_facts(truncated)
    except EngineUnavailable as exc:
        assert "cannot read the GGUF header" in str(exc)
    else:
        raise AssertionError("read a truncated GGUF")
    cut_vocab = tmp_path / "cut_vocab.gguf"
    write_gguf(cut_vocab, n_vocab=1000)
    cut_vocab.write_bytes(cut_vocab.read_bytes()[:2000])  # inside the vocabulary
    try:
        read_model_facts(cut_vocab)
    except EngineUnavailable as exc:
        assert "cannot read the GGUF header" in str(exc)
    else:
        raise AssertionError("read a GGUF cut inside its vocabulary")


def _req(**kw: object) -> GenRequest:
    return GenRequest(model=MODELS[0], prompt_ids=[], truth=TruthRecord("id", "/api/generate", "m", 0), **kw)  # type: ignore[arg-type]


def test_prompts_are_plain_text_for_a_base_model() -> None:
    assert render_prompt(_req(prompt_text="Once upon")) == "Once upon"
    assert render_prompt(_req(prompt_text="Q", system="Be brief.")) == "Be brief.\n\nQ"
    assert render_prompt(_req(prompt_text="Q", system="S", raw=True)) == "Q"
    chat = render_prompt(_req(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]))
    assert chat == "system: S\nuser: Hi\nassistant:"
    assert all(s.startswith("\n") for s in TRANSCRIPT_STOPS)


def test_sampling_options_default_to_ollamas() -> None:
    d = ollama_sampling({})
    assert d["temperature"] == 0.8 and d["top_k"] == 40 and d["top_p"] == 0.9 and d["repeat_penalty"] == 1.1
    g = ollama_sampling({"temperature": 0, "top_k": 5, "repeat_penalty": "x", "top_p": True})
    assert g["temperature"] == 0.0 and g["top_k"] == 5 and g["repeat_penalty"] == 1.1 and g["top_p"] == 0.9


def test_chat_stops_at_the_next_turn_unless_told_otherwise() -> None:
    chat = _req(messages=[{"role": "user", "content": "Hi"}])
    assert stop_strings(chat) == list(TRANSCRIPT_STOPS)
    assert stop_strings(_req(messages=[], options={"stop": "END"})) == ["END"]
    assert stop_strings(_req(prompt_text="x")) == [] and stop_strings(_req(prompt_text="x", options={"stop": ["", "a"]})) == ["a"]


@pytest.mark.slow
def test_missing_gguf_is_a_clear_error(tmp_path: Path) -> None:
    fake_binary = tmp_path / "llama-server"
    fake_binary.write_text("#!/bin/sh\nexit 1\n")
    fake_binary.chmod(0o755)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "--engine",
            "llama-server",
            "--gguf",
            "/nonexistent/model.gguf",
            "--port",
            "0",
            "--llama-server",
            str(fake_binary),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no GGUF file at /nonexistent/model.gguf" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "sim", "--engine", "llama-server"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "--gguf" in r.stderr


def test_missing_llama_server_is_a_clear_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "--engine",
            "llama-server",
            "--gguf",
            "/nonexistent/model.gguf",
            "--port",
            "0",
            "--llama-server",
            str(tmp_path / "llama-server"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and f"no executable llama-server at {tmp_path / 'llama-server'}" in r.stderr


def test_engine_tests_fail_rather_than_skip_when_required(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.support.engine_process import require_llama_server

    monkeypatch.setenv("PHASEWATCH_LLAMA_SERVER", str(tmp_path / "missing"))
    monkeypatch.setenv("PHASEWATCH_REQUIRE_ENGINE", "1")
    with pytest.raises(pytest.fail.Exception, match="no executable llama-server"):
        require_llama_server()
    monkeypatch.setenv("PHASEWATCH_REQUIRE_ENGINE", "0")
    with pytest.raises(pytest.skip.Exception):
        require_llama_server()
