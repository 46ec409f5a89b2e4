"""The llama.cpp engine's pure parts (no model needed) and its refusal of bad settings."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.backend import GenRequest
from sim.catalog import MODELS
from sim.llama_engine import TRANSCRIPT_STOPS, StopFilter, gguf_value, human_number, render_prompt, sampling_kwargs
from sim.truth import TruthRecord
from tests.support.sim_process import REPO_ROOT


def test_human_number_is_ollamas_parameter_size() -> None:
    assert human_number(8_030_261_312) == "8.0B"
    assert human_number(494_032_768) == "494.03M"
    assert human_number(268_098_176) == "268.10M"
    assert human_number(7_000_000_000) == "7B"


def test_gguf_text_values_get_their_types_back() -> None:
    assert gguf_value("18") == 18 and gguf_value("0.000001") == 1e-6
    assert gguf_value("true") is True and gguf_value("gemma3") == "gemma3"


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
    d = sampling_kwargs({})
    assert d["temp"] == 0.8 and d["top_k"] == 40 and d["top_p"] == 0.9 and d["repeat_penalty"] == 1.1
    g = sampling_kwargs({"temperature": 0, "top_k": 5, "repeat_penalty": "x"})
    assert g["temp"] == 0.0 and g["top_k"] == 5 and g["repeat_penalty"] == 1.1  # wrong type: the default


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab,\n:", max_size=40),
    stops=st.lists(st.text(alphabet="ab,\n:", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
def test_stop_filter_sends_exactly_the_text_before_the_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    pieces = [text[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(text)], strict=True)]
    f = StopFilter(stops)
    sent = ""
    for piece in pieces:
        sent += f.feed(piece)
        if f.stopped:
            break
    if not f.stopped:
        sent += f.flush()
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        # The earliest stop string that completes while streaming; never any of its text.
        assert f.stopped
        assert text.startswith(sent) and not any(s in sent for s in stops)
        assert len(sent) <= min(hits) + max(len(s) for s in stops)
    else:
        assert not f.stopped and sent == text


def test_missing_gguf_is_a_clear_error() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "sim", "--engine", "llama-cpp", "--gguf", "/nonexistent/model.gguf", "--port", "0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    assert "no GGUF file at /nonexistent/model.gguf" in r.stderr or "llama-cpp-python is not installed" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "sim", "--engine", "llama-cpp"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "--gguf" in r.stderr
