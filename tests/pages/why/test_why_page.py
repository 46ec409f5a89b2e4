"""The Why page in AppTest over fixture stores written with the collector's own StoreWriter.

Requests of several prompt lengths and contexts, the model's /api/show answer (the
simulator's catalog, as the collector would have stored it), /api/ps snapshots and NVML
samples of an RTX 4090. The expected figures are computed here from the shapes written,
not read back from the page's own code.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from analysis import wording as w
from analysis.records import LoadedModel
from bench.pages_fixture import status_rows
from sim.catalog import BY_NAME
from store.ops import PutGpuSamples
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.why_page import (
    ALL,
    BIG,
    GIB,
    HOST_BW_BYTES_S,
    MODEL,
    PLAIN,
    build_store,
    diagnoses,
    figures,
    gpu_with_energy,
    medians,
    open_why,
    page_text,
    readings,
    trace,
    unescape,
)

# ---------------------------------------------------------------- the full page


def test_why_page_charts_ratio_and_explanation_from_the_store(data_dir: Path) -> None:
    now = time.time()
    build_store(data_dir, now)
    at = open_why()
    assert at.selectbox(key="why_model").value == MODEL
    figs = figures(at)
    prefill, decode = figs["Prefill"], figs["Decode"]

    # Chart 1: one point per request at its computed prompt length, with ceiling and expected lines.
    want = sorted((r.shape.prompt_tokens - (r.shape.cached_tokens or 0), r.prefill_tok_s) for r in ALL)
    got = readings(prefill)
    assert [x for x, _ in got] == [x for x, _ in want]
    assert [y for _, y in got] == pytest.approx([y for _, y in want], rel=1e-3)
    ceiling, expected = trace(prefill, "ceiling"), trace(prefill, "expected")
    assert len(ceiling["x"]) >= 20 and ceiling["x"] == expected["x"]
    assert all(c > e > 0 for c, e in zip(ceiling["y"], expected["y"], strict=True))
    peak = max(ceiling["y"])
    assert ceiling["y"][0] < peak and ceiling["y"][-1] < peak  # memory-bound short prompts; attention work at long ones
    assert prefill["layout"]["xaxis"]["title"]["text"].startswith("prompt length")
    assert "tok/s" in prefill["layout"]["yaxis"]["title"]["text"]
    # Ten requests with long enough prompts and replies: the expected line is calibrated on them.
    assert "median of" in expected["name"] and "of your requests" in expected["name"]

    # Chart 2: decode against context (prompt + half the reply), ceiling falling as the KV cache grows.
    want_d = sorted((round(r.shape.prompt_tokens + r.shape.output_tokens / 2), r.decode_tok_s) for r in ALL if r.decode_tok_s)
    got_d = readings(decode)
    assert [x for x, _ in got_d] == pytest.approx([x for x, _ in want_d])
    assert [y for _, y in got_d] == pytest.approx([y for _, y in want_d], rel=1e-3)
    ceiling, expected = trace(decode, "ceiling"), trace(decode, "expected")
    assert ceiling["y"][0] > ceiling["y"][-1] and all(c > e for c, e in zip(ceiling["y"], expected["y"], strict=True))
    # A 1,008 GB/s card and about 2 GB of weights: a few hundred tokens per second at most.
    assert 300 < ceiling["y"][0] < 700
    assert not any(str(t.get("name")).startswith("ceiling if") for t in decode["data"])  # all in VRAM: no offload line

    # The ratio and why, in the store's numbers.
    pp, tg = medians(ALL)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Prefill ÷ decode"] == w.times(pp / tg)
    text = page_text(at)
    ratio = next(line for line in text.splitlines() if "faster than decode" in line and "On your" in line)
    assert w.tok_s(pp) in ratio and w.tok_s(tg) in ratio and w.times(pp / tg) in ratio and MODEL in ratio
    assert "NVIDIA GeForce RTX 4090" in ratio
    # The plain explanation carries this model's and this GPU's figures.
    assert "one token at a time" in text and "1,008 GB/s" in text
    assert "time to first token" in text.lower() and "Several users at once" in text and "in chunks of up to" in text
    # The overlapping pair: the reply's 300 ms stall is measured and charged to the other request's prompt.
    assert "Measured here:" in text and "5,000-token prompt" in text

    # The hardware: table row, NVML's bandwidth, the memory clock now.
    assert "table row rtx-4090" in text and "2 × 10,501 MHz × 384 bit" in text and "memory clock now 10,251 of 10,501 MHz" in text
    assert "25.8 GB of memory" in text
    assert "llama3.2:latest: llama" in text and "28 layers" in text and "Q4_K_M" in text

    # Diagnoses grouped with counts; energy per token from the counter.
    n_diagnosed = sum(1 for r in ALL if r.offset_s <= 300)  # the sidebar's 5-minute window
    groups = diagnoses(at)
    assert groups["a one-token reply: no interval to time decode over"][0] == f"1 of {n_diagnosed}"
    cache_hit = groups["prompt-cache hits inflate Ollama's own prefill rate"]
    assert cache_hit[0] == f"1 of {n_diagnosed}" and "2,900 of the 3,000 prompt tokens" in cache_hit[1]
    assert metrics["Per prompt token"].endswith(" J") and metrics["Per output token"].endswith(" J")
    assert "J per token" in text


def test_few_requests_keep_the_starting_efficiency_and_say_so(data_dir: Path) -> None:
    build_store(data_dir, time.time(), reqs=PLAIN[:3])
    figs = figures(open_why())
    assert "docs/physics.md" in trace(figs["Prefill"], "expected")["name"]
    assert "docs/physics.md" in trace(figs["Decode"], "expected")["name"]


def test_partly_offloaded_model_gets_a_blended_ceiling_and_a_diagnosis(data_dir: Path) -> None:
    now = time.time()
    # At rates a 70B model half in system memory can reach: readings above every ceiling would make the page doubt
    # the placement instead (analysis.doubt).
    slow = [
        replace(r.shape, prefill_ms=r.shape.prompt_tokens * 2.0, decode_ms=(r.shape.output_tokens - 1) * 700.0) for r in PLAIN[:6]
    ]
    big = [replace(r, model=BIG, shape=shape) for r, shape in zip(PLAIN[:6], slow, strict=True)]
    half = LoadedModel(now - 1, BIG, BIG, BY_NAME[BIG].digest, 42 * GIB, 21 * GIB, 4096, now + 90, "70.6B", "Q4_K_M", "llama")
    build_store(data_dir, now, reqs=big, loaded=[half])
    at = open_why()
    assert at.selectbox(key="why_model").value == BIG
    decode = figures(at)["Decode"]
    blended, full = trace(decode, "ceiling (memory bandwidth blended"), trace(decode, "ceiling if the model were all in VRAM")
    assert all(f > 2 * b for f, b in zip(full["y"], blended["y"], strict=True))
    text = page_text(at)
    assert "50% (22.5 GB) in system memory" in text
    counts, sentence = diagnoses(at)["part of the model sits in system memory, so decode reads it at system-memory speed"]
    assert counts == "6 of 6"
    assert w.gb_s(HOST_BW_BYTES_S) in sentence  # the cached host measurement


# ---------------------------------------------------------------- empty and partial states


def test_no_store_says_what_to_do(data_dir: Path) -> None:
    at = open_why()
    assert any("Nothing recorded yet" in i.value for i in at.info)
    assert not at.get("plotly_chart")


def test_store_without_requests_says_how_to_make_some(data_dir: Path) -> None:
    w_ = StoreWriter(db_path(data_dir))
    try:
        status_rows(w_, time.time(), data_dir)
    finally:
        w_.close()
    at = open_why()
    assert any("No requests recorded yet" in i.value for i in at.info)
    assert "OLLAMA_HOST=127.0.0.1:11435" in [c.value for c in at.code]
    assert "Until Ollama lists an installed model, the ceilings are for a typical 8B model" in page_text(at)


def test_loaded_model_without_requests_shows_its_lines_and_how_to_measure(data_dir: Path) -> None:
    build_store(data_dir, time.time(), reqs=[])
    at = open_why()
    assert any(f"No requests for {MODEL} recorded yet" in unescape(i.value) for i in at.info)
    figs = figures(at)
    assert trace(figs["Prefill"], "measured")["x"] == []
    assert len(trace(figs["Prefill"], "ceiling")["y"]) > 10 and len(trace(figs["Decode"], "expected")["y"]) > 10
    assert "should read a 512-token prompt at about" in page_text(at)  # expected rates stand in for measured ones


def test_requests_without_model_info_say_when_it_appears(data_dir: Path) -> None:
    build_store(data_dir, time.time(), reqs=PLAIN[:3], show=False)
    at = open_why()
    assert any("appear once the collector has asked Ollama about it" in unescape(i.value) for i in at.info)
    prefill = figures(at)["Prefill"]
    assert len(trace(prefill, "measured")["x"]) == 3
    assert not any(str(t.get("name")).startswith("ceiling") for t in prefill["data"])


def test_no_gpu_uses_the_cpu_and_the_measured_host_bandwidth(data_dir: Path) -> None:
    build_store(data_dir, time.time(), reqs=PLAIN[:3], gpu=False)
    at = open_why()
    text = page_text(at)
    assert "this computer's CPU" in text and f"{w.gb_s(HOST_BW_BYTES_S)} (measured on this machine)" in text
    assert "No GPU was found" in text
    assert trace(figures(at)["Decode"], "ceiling")["y"]


def test_demo_data_is_labelled_simulated(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_DEMO", "1")
    now = time.time()
    demo_dir = data_dir / "demo"
    demo_dir.mkdir()
    build_store(demo_dir, now, reqs=PLAIN[:3], gpu=False)
    w_ = StoreWriter(db_path(demo_dir))
    try:
        # Sampled before the requests ran: the readings are judged against the GPU of their time.
        sim = replace(gpu_with_energy(now - 600, 50.0, 1.0), name="Simulated NVIDIA GeForce RTX 4090", simulated=True)
        w_.write(PutGpuSamples([sim]))
    finally:
        w_.close()
    at = open_why()
    assert any("Simulated data" in i.value for i in at.info) and any("Demo mode" in i.value for i in at.info)
    assert "Simulated NVIDIA GeForce RTX 4090" in page_text(at)
