"""analysis.model_names: one rule for "the same model", held by examples and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis.model_names import ModelName, parse_model_name, same_model, value_for_model

part = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,11}", fullmatch=True)
tag = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,11}", fullmatch=True)
host = st.builds(lambda h, p: h if p is None else f"{h}:{p}", part, st.none() | st.integers(1, 65535))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("llama3.2", "llama3.2:latest"),
        ("llama3.2", "library/llama3.2"),
        ("llama3.2", "registry.ollama.ai/library/llama3.2:latest"),
        ("localhost:5000/llama", "localhost:5000/llama:latest"),
        ("myhost:5000/me/llama:q4", "https://myhost:5000/me/llama:q4"),
        ("Llama3.2:Latest", "llama3.2"),
        ("qwen2.5:7b@sha256:abc", "qwen2.5:7b"),
    ],
)
def test_same_model(a: str, b: str) -> None:
    assert same_model(a, b) and same_model(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("llama3.2", "llama3.2:1b"),
        ("localhost:5000/llama", "llama"),
        ("me/llama", "llama"),
        ("a.io/me/llama", "b.io/me/llama"),
    ],
)
def test_not_the_same_model(a: str, b: str) -> None:
    assert not same_model(a, b)


def test_parts() -> None:
    assert parse_model_name("localhost:5000/llama") == ModelName("registry.ollama.ai", "localhost:5000", "llama", "latest")
    assert parse_model_name("h.io:1/ns/m:t") == ModelName("h.io:1", "ns", "m", "t")
    assert str(parse_model_name("m")) == "registry.ollama.ai/library/m:latest"


@given(host, part, part, tag)
def test_defaults_can_be_written_or_left_out(h: str, ns: str, m: str, t: str) -> None:
    full = f"{h}/{ns}/{m}:{t}"
    assert same_model(full, full.upper())
    assert parse_model_name(str(parse_model_name(full))) == parse_model_name(full)
    assert same_model(f"{h}/{ns}/{m}", f"{h}/{ns}/{m}:latest")
    assert same_model(f"registry.ollama.ai/library/{m}:latest", m)
    assert same_model(f"{ns}/{m}", f"registry.ollama.ai/{ns}/{m}:latest")


@given(host, part, part, tag, tag)
def test_a_different_tag_is_a_different_model(h: str, ns: str, m: str, t1: str, t2: str) -> None:
    assert same_model(f"{h}/{ns}/{m}:{t1}", f"{h}/{ns}/{m}:{t2}") == (t1 == t2)


def test_value_for_model_finds_any_spelling() -> None:
    by_name: dict[str, int | None] = {"qwen2.5:0.5b": None, "registry.ollama.ai/library/llama3.2:latest": 8192}
    assert value_for_model(by_name, "Llama3.2") == 8192
    assert value_for_model(by_name, "llama3.2:1b") is None
    assert value_for_model(by_name, "qwen2.5:0.5b") is None  # present, but its value unknown
    assert value_for_model({"m": None, "M:latest": 7}, "m") == 7  # an unknown value does not hide a known one
