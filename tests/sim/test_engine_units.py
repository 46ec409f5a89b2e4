"""The real engine's pure parts (no model needed): the GGUF header, prompts, sampling, stop strings, bad settings."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

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


def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_gguf(path: Path, kvs: bytes, n_kv: int, tensors: list[tuple[str, list[int]]]) -> None:
    """A GGUF v3 header as llama.cpp writes one: magic, version, counts, key/values, tensor infos (no data needed)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + kvs
    for name, dims in tensors:
        out += _gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", 12, 0)  # type Q4_K, offset
    path.write_bytes(out)


def test_gguf_header_is_read_with_its_types(tmp_path: Path) -> None:
    kvs = (
        _gguf_string("general.architecture")
        + struct.pack("<I", 8)
        + _gguf_string("gemma3")
        + _gguf_string("general.name")
        + struct.pack("<I", 8)
        + _gguf_string("Tiny")
        + _gguf_string("gemma3.block_count")
        + struct.pack("<II", 4, 18)
        + _gguf_string("gemma3.attention.layer_norm_rms_epsilon")
        + struct.pack("<If", 6, 1e-6)
        + _gguf_string("tokenizer.ggml.add_bos_token")
        + struct.pack("<I?", 7, True)
        + _gguf_string("general.tags")
        + struct.pack("<IIQ", 9, 8, 2)
        + _gguf_string("a")
        + _gguf_string("b")
        + _gguf_string("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", 9, 8, 7)
        + b"".join(_gguf_string(str(i)) for i in range(7))
        + _gguf_string("tokenizer.ggml.scores")
        + struct.pack("<IIQ", 9, 6, 7)
        + struct.pack("<7f", *range(7))
        + _gguf_string("general.file_type")
        + struct.pack("<II", 4, 15)
    )
    path = tmp_path / "tiny.gguf"
    write_gguf(path, kvs, 9, [("token_embd.weight", [640, 7]), ("blk.0.attn_q.weight", [640, 1024])])
    h = read_gguf_header(path)
    assert h.metadata["gemma3.block_count"] == 18 and h.metadata["tokenizer.ggml.add_bos_token"] is True
    assert h.metadata["gemma3.attention.layer_norm_rms_epsilon"] == 1e-6  # float32's shortest decimal, as Go prints it
    assert h.metadata["general.tags"] == ["a", "b"]
    assert h.metadata["tokenizer.ggml.tokens"] == [] and h.metadata["tokenizer.ggml.scores"] == []  # > 5 items
    assert h.array_lengths["tokenizer.ggml.tokens"] == 7
    assert h.parameter_count == 640 * 7 + 640 * 1024
    facts = read_model_facts(path, "tiny:1")
    assert facts.quantization == "Q4_K_M" and facts.vocab_size == 7 and facts.block_count == 18
    assert "general.name" not in facts.model_info() and facts.model_info()["general.parameter_count"] == h.parameter_count
    assert len(facts.digest) == 64


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    try:
        read_model_facts(bad)
    except EngineUnavailable as exc:
        assert "bad magic" in str(exc)
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
