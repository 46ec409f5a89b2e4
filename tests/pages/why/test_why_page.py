"""The Why page in AppTest over fixture stores written with the collector's own StoreWriter.

Requests of several prompt lengths and contexts, the model's /api/show answer (the
simulator's catalog, as the collector would have stored it), /api/ps snapshots and NVML
samples of an RTX 4090. The expected figures are computed here from the shapes written,
not read back from the page's own code.
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from streamlit.testing.v1 import AppTest

from analysis import wording as w
from analysis.records import GpuSample, HostBandwidth, LoadedModel, RequestRecord
from bench.pages_fixture import Shape, gpu_sample, make_request, status_rows
from sim.catalog import BY_NAME
from store.ops import PutGpuSamples, PutHostBandwidth, PutLoadedModels, PutModelInfo, PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
TIMEOUT_S = 60
MODEL = "llama3.2:latest"
BIG = "llama3.1:70b"
GIB = 1024**3
HOST_BW_BYTES_S = 41.5e9  # the stored "measurement" the page must quote


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    for k in ("PHASEWATCH_DEMO", "OLLAMA_HOST", "PHASEWATCH_LISTEN"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def show_json(name: str) -> dict[str, Any]:
    m = BY_NAME[name]
    return {"details": m.details(), "model_info": m.model_info(), "capabilities": list(m.capabilities), "template": m.template}


@dataclass(frozen=True)
class Req:
    shape: Shape
    offset_s: float  # start, seconds before now
    stall_at: int | None = None
    stall_ms: float = 0.0
    model: str = MODEL

    @property
    def prefill_tok_s(self) -> float:
        return (self.shape.prompt_tokens - (self.shape.cached_tokens or 0)) / (self.shape.prefill_ms / 1000)

    @property
    def decode_tok_s(self) -> float | None:
        n = self.shape.output_tokens
        if n < 2:
            return None
        step_ns = int(self.shape.decode_ms * 1e6 / (n - 1))
        return (n - 1) / (((n - 1) * step_ns + self.stall_ms * 1e6) / 1e9)


def _shape(prompt: int, prefill_ms: float, output: int, step_ms: float, cached: int = 0) -> Shape:
    return Shape(prompt_tokens=prompt, prefill_ms=prefill_ms, output_tokens=output, decode_ms=(output - 1) * step_ms,
                 cached_tokens=cached)  # fmt: skip


# Prompts from 200 to 8,000 tokens, replies 40-200 tokens: rates near what a 4090 gives a 3B Q4 model.
PLAIN = [
    Req(_shape(200, 10, 40, 4), 280),
    Req(_shape(600, 25, 60, 4), 250),
    Req(_shape(1200, 50, 120, 5), 220),
    Req(_shape(2400, 100, 80, 5), 190),
    Req(_shape(4800, 250, 200, 6), 160),
    Req(_shape(8000, 500, 150, 8), 130),
    Req(_shape(50, 5, 1, 4), 40),  # a one-token reply: a prefill point, no decode rate
    Req(_shape(3000, 20, 30, 4, cached=2900), 30),  # mostly from the prompt cache
]
# A long prompt arriving while another reply streams: the reply's gap 49 → 50 stretches by 300 ms.
VICTIM = Req(_shape(300, 10, 100, 5), 100, stall_at=50, stall_ms=300)
AGGRESSOR_DELAY_S = 0.27
AGGRESSOR = Req(_shape(5000, 250, 20, 5), 100 - AGGRESSOR_DELAY_S)
ALL = [*PLAIN, VICTIM, AGGRESSOR]


def write_requests(w_: StoreWriter, now: float, reqs: list[Req]) -> list[RequestRecord]:
    t0 = now - 600
    recs = [make_request(now - r.offset_s, t0, model=r.model, shape=r.shape, stall_at=r.stall_at, stall_ms=r.stall_ms)
            for r in reqs]  # fmt: skip
    w_.apply([PutRequest(r) for r in recs])
    return recs


def gpu_with_energy(ts: float, util: float, energy_j: float) -> GpuSample:
    return replace(gpu_sample(ts, util), mem_bus_width_bits=384, energy_j=energy_j, mem_clock_mhz=10251)


def build_store(data_dir: Path, now: float, *, reqs: list[Req] = ALL, show: bool = True, gpu: bool = True,
                loaded: list[LoadedModel] | None = None) -> list[RequestRecord]:  # fmt: skip
    w_ = StoreWriter(db_path(data_dir))
    try:
        # The collector's measurement of this machine's memory bandwidth, as it stores it.
        cpus, mem = os.cpu_count() or 1, int(psutil.virtual_memory().total)
        w_.write(PutHostBandwidth(HostBandwidth(HOST_BW_BYTES_S, now - 3600, 2**28, 2, 3, cpus, mem)))
        recs = write_requests(w_, now, reqs)
        busy = [(r.started_at_unix_s, r.wall_s(r.closed_ns or r.received_ns)) for r in recs]
        if gpu:
            energy = 1_000_000.0
            for ts_i in range(int(now - 600), int(now) + 1):
                util = 95.0 if any(a - 1 <= ts_i <= b + 1 for a, b in busy) else 2.0
                power = 60 + 3.5 * util
                energy += power
                w_.write(PutGpuSamples([gpu_with_energy(float(ts_i), util, energy)]))
        if show:
            for name in (MODEL, BIG):
                w_.write(PutModelInfo(BY_NAME[name].digest, name, show_json(name)))
        if loaded is None:
            loaded = [LoadedModel(now - 1, MODEL, MODEL, BY_NAME[MODEL].digest, int(2.6 * GIB), int(2.6 * GIB), 8192,
                                  now + 240, "3.2B", "Q4_K_M", "llama")]  # fmt: skip
        w_.write(PutLoadedModels(now - 1, loaded))
        status_rows(w_, now, data_dir, gpu_state="nvml" if gpu else "none")
    finally:
        w_.close()
    return recs


def open_why() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page("pages/why/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Why"
    return at


def figures(at: AppTest) -> dict[str, dict[str, Any]]:
    out = {}
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        out[str(spec["layout"]["title"]["text"]).split(":")[0]] = spec
    return out


def values(v: Any) -> list[Any]:
    """A trace's x or y as a list: Plotly sends numpy arrays as base64 typed arrays."""
    if isinstance(v, dict) and "bdata" in v:
        return list(np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist())
    return list(v or [])


def trace(fig: dict[str, Any], prefix: str) -> dict[str, Any]:
    t = dict(next(t for t in fig["data"] if str(t.get("name", "")).startswith(prefix)))
    return {**t, "x": values(t.get("x")), "y": values(t.get("y"))}


def readings(fig: dict[str, Any]) -> list[tuple[float, float]]:
    """Every measured point of a chart, counted, too short or impossible: (x, the rate in its hover)."""
    out = []
    for t in fig["data"]:
        if t.get("mode") == "markers":
            xs, extra = values(t.get("x")), t.get("customdata") or []
            out += [(x, float(c[1])) for x, c in zip(xs, extra, strict=True)]
    return sorted(out)


def unescape(md: str) -> str:
    """Our Markdown escapes every punctuation mark; read it back as the user sees it."""
    return md.replace("\\", "")


def page_text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [t.value for t in at.text]
    parts += [e.value for e in (*at.info, *at.warning, *at.success)]
    return unescape("\n".join(str(p) for p in parts))


def diagnoses(at: AppTest) -> dict[str, tuple[str, str]]:
    """What each diagnosis means → ("N of M" requests, the newest case's sentence)."""
    out = {}
    for m in at.markdown:
        head, _, sentence = unescape(m.value).partition("  \n")
        if head.startswith(":material/") and " · " in head:
            counts, what = head.split(" · ", 1)
            out[what] = (counts.split("**")[1], sentence)
    return out


def medians(reqs: list[Req]) -> tuple[float, float]:
    """Medians of the readings that count: timed over 32 tokens or more (none of the fixtures' is impossible)."""
    long_prompts = [r.prefill_tok_s for r in reqs if r.shape.prompt_tokens - (r.shape.cached_tokens or 0) >= 32]
    long_replies = [r.decode_tok_s for r in reqs if r.decode_tok_s and r.shape.output_tokens - 1 >= 32]
    return statistics.median(long_prompts), statistics.median([d for d in long_replies if d])


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
    big = [replace(r, model=BIG) for r in PLAIN[:6]]
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
        sim = replace(gpu_with_energy(now - 1, 50.0, 1.0), name="Simulated NVIDIA GeForce RTX 4090", simulated=True)
        w_.write(PutGpuSamples([sim]))
    finally:
        w_.close()
    at = open_why()
    assert any("Simulated data" in i.value for i in at.info) and any("Demo mode" in i.value for i in at.info)
    assert "Simulated NVIDIA GeForce RTX 4090" in page_text(at)
